"""Backlogs on several partitions are folded side by side, not one partition after another (issue 14)."""

from __future__ import annotations

from collections import Counter

import pytest
from kafka_support import check_exactly_once, command_stream, kafka_config, new_topics, publish

from logs.kafka import KafkaCommandLog
from logs.port import OutputRecord
from processor.runtime.loop import Processor
from schemas.partitioner import partition_for

pytestmark = pytest.mark.integration

PARTITIONS = 3
BATCH = 150
PRIMER = 100
BACKLOG = 2_400


def test_every_partition_gets_its_first_outcome_within_one_batch(kafka_bootstrap: str) -> None:
    """After a restart with a backlog on every partition, no partition waits for another's backlog.

    Each backlog is published in one burst (whole producer batches of ~800 records per partition: what made the
    client hand one partition's records over first). Before the fix the last partition's first record came after
    the other two backlogs (~1,500 records); now every partition's first record is folded within one batch.
    """
    topics = new_topics(kafka_bootstrap, "fair", PARTITIONS)
    commands = command_stream(PRIMER + BACKLOG, clusters=9)
    backlogs = Counter(partition_for(command.cluster.encode(), PARTITIONS) for command in commands[PRIMER:])
    assert min(backlogs[p] for p in range(PARTITIONS)) > 3 * BATCH, backlogs  # a backlog on every partition
    group = topics.commands + ".group"

    def processor() -> tuple[KafkaCommandLog, Processor]:
        log = KafkaCommandLog(kafka_config(kafka_bootstrap), topics, group_id=group, instance_id="fair")
        return log.start(), Processor(log, snapshot_every=1_000, batch_size=BATCH)

    publish(kafka_bootstrap, topics, commands[:PRIMER])  # a first run commits offsets on every partition
    log, first = processor()
    try:
        while first.processed < PRIMER:
            first.run_batch(1.0)
    finally:
        log.close()
    publish(kafka_bootstrap, topics, commands[PRIMER:])  # the backlog that builds up while it is down

    log, restarted = processor()
    folded_before: dict[int, int] = {}  # partition -> records folded before its first one
    folded = 0
    try:
        while folded < BACKLOG:
            records = log.poll(BATCH, 5.0)
            assert records, f"nothing more to fold after {folded} of {BACKLOG}"
            assert len(records) <= BATCH
            for partition in Counter(record.partition for record in records):
                folded_before.setdefault(partition, folded)
            outputs: list[OutputRecord] = []
            positions: dict[int, int] = {}
            for record in records:
                folder = restarted.folder(record.partition)
                folder.fold(record, outputs)
                positions[record.partition] = folder.state.next_offset
            log.commit(outputs, positions)
            folded += len(records)
    finally:
        log.close()
    assert sorted(folded_before) == list(range(PARTITIONS))
    assert max(folded_before.values()) <= BATCH, f"records folded before each partition's first: {folded_before}"
    check_exactly_once(kafka_bootstrap, topics)
