"""Fencing on the real broker: a second instance with the same id takes over; the first cannot publish."""

from __future__ import annotations

import pytest
from kafka_support import CommittedWatcher, check_exactly_once, command_stream, kafka_config, new_topics, publish

from logs.kafka import KafkaCommandLog, KafkaFatalError
from logs.port import OutputRecord
from processor.runtime.loop import Processor

pytestmark = pytest.mark.integration

COMMANDS = 2_000


def _processor(bootstrap: str, topics, group: str) -> tuple[KafkaCommandLog, Processor]:  # type: ignore[no-untyped-def]
    log = KafkaCommandLog(
        kafka_config(bootstrap), topics, group_id=group, instance_id="same", transaction_timeout_ms=10_000
    )
    processor = Processor(log, snapshot_every=500, batch_size=200)
    log.on_revoked = lambda partitions: [processor.forget(p) for p in partitions]  # type: ignore[func-returns-value]
    return log.start(), processor


def test_a_zombie_is_fenced_and_publishes_nothing(kafka_bootstrap: str) -> None:
    """The stalled first instance's commit is fenced after a newer instance starts; no event is duplicated."""
    topics = new_topics(kafka_bootstrap, "zombie", 2)
    publish(kafka_bootstrap, topics, command_stream(COMMANDS, clusters=4))
    group = topics.commands + ".group"
    zombie_log, zombie = _processor(kafka_bootstrap, topics, group)
    committed = 0
    while committed < 400:  # the first instance does some real work first
        committed += zombie.run_batch(1.0)
    # It polls and folds one more batch, then stalls (a long GC pause) before committing it.
    records = []
    while not records:
        records = zombie_log.poll(200, 1.0)
    outputs: list[OutputRecord] = []
    positions = {}
    for record in records:
        folder = zombie.folder(record.partition)
        folder.fold(record, outputs)
        positions[record.partition] = folder.state.next_offset
    assert outputs
    # Meanwhile the instance is restarted elsewhere with the same id: init_transactions fences the zombie.
    successor_log, successor = _processor(kafka_bootstrap, topics, group)
    with pytest.raises(KafkaFatalError, match=r"(?i)fenced"):
        zombie_log.commit(outputs, positions)
    zombie_log.close()
    watcher = CommittedWatcher(kafka_bootstrap, topics, group, 2)
    try:
        while watcher.total() < COMMANDS:
            successor.run_batch(1.0)
    finally:
        watcher.close()
        successor_log.close()
    check_exactly_once(kafka_bootstrap, topics)
