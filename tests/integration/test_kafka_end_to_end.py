"""End to end on the real broker: publish commands, receive their outcomes, compare with a local re-fold."""

from __future__ import annotations

import logging

import pytest
from kafka_support import (
    BackgroundProcessor,
    check_exactly_once,
    command_stream,
    kafka_config,
    new_topics,
    publish,
    read_topic,
)

from producers.outcomes import OutcomeWaiter
from producers.publisher import CommandPublisher

pytestmark = pytest.mark.integration


def test_published_commands_get_their_outcomes(kafka_bootstrap: str) -> None:
    """Typed commands sent by the publisher come back as the expected events, found by command_id."""
    topics = new_topics(kafka_bootstrap, "e2e")
    config = kafka_config(kafka_bootstrap)
    with (
        BackgroundProcessor(kafka_bootstrap, topics, instance_id="e2e", stop_when_idle=0),
        OutcomeWaiter(config, topics.events) as waiter,
        CommandPublisher(config, topics.commands, source="test") as publisher,
    ):
        added = publisher.add_node("lab", "n1", cpu_milli=32_000, memory_mib=128_000, gpu_model="A100", gpu_count=2)
        placed = publisher.submit_pod("lab", "p1", num_gpu=2, cpu_milli=1_000, command_id="lab-p1")
        queued = publisher.submit_pod("lab", "p2", num_gpu=1, gpu_milli=500, cpu_milli=1_000)
        unknown = publisher.release("lab", "nope")
        publisher.flush()
        assert placed == "lab-p1"
        assert waiter.wait(added, 60).kind == "NodeAdded"
        assert waiter.wait(placed, 30).kind == "PodScheduled"
        assert waiter.wait(queued, 30).kind == "PodQueued"
        rejection = waiter.wait(unknown, 30)
        assert rejection.rejected
        assert rejection.events[0].payload.code == "UNKNOWN_POD"  # type: ignore[union-attr]
        released = publisher.release("lab", "p1")
        publisher.flush()
        outcome = waiter.wait(released, 30)
        # Releasing p1 frees both GPUs, so the queued p2 is placed by the same command.
        assert [type(event.payload).__name__ for event in outcome.events] == ["PodReleased", "PodScheduled"]
    check_exactly_once(kafka_bootstrap, topics)


def test_events_on_kafka_equal_a_local_refold(kafka_bootstrap: str) -> None:
    """A stream of 3,000 commands yields on Kafka exactly the event bytes a local re-fold derives."""
    topics = new_topics(kafka_bootstrap, "refold")
    publish(kafka_bootstrap, topics, command_stream(3_000))
    with BackgroundProcessor(
        kafka_bootstrap, topics, instance_id="refold", stop_when_idle=2.0, snapshot_every=500, batch_size=300
    ) as processor:
        assert processor.wait() == 0
    expected = check_exactly_once(kafka_bootstrap, topics)
    assert sum(len(values) for values in expected.events.values()) >= 3_000


def test_traced_batches_cover_every_command_with_ordered_stage_times(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With trace_batches, each committed batch logs its positions and stage times; the last positions are the
    partitions' ends and each batch's stages happen in order (what bench --stages relies on)."""
    topics = new_topics(kafka_bootstrap, "trace")
    commands = command_stream(600)
    publish(kafka_bootstrap, topics, commands)
    caplog.set_level(logging.INFO, logger="gpufold.processor")
    with BackgroundProcessor(
        kafka_bootstrap, topics, instance_id="trace", stop_when_idle=2.0, batch_size=100, trace_batches=True
    ) as processor:
        assert processor.wait() == 0
    batches = [record.fields for record in caplog.records if record.getMessage() == "batch"]  # type: ignore[attr-defined]
    assert sum(batch["records"] for batch in batches) == len(commands)
    ends: dict[int, int] = {}
    # folded: the batch folded (then its transaction waits for the previous one's, pipelined); txn: it began
    stages = ("poll", "first", "polled", "folded", "commit", "txn", "produced", "offsets_sent", "committed")
    for batch in batches:
        marks = batch["marks"]
        assert [marks[stage] for stage in stages] == sorted(marks[stage] for stage in stages), marks
        for partition, position in batch["positions"].items():
            assert position > ends.get(partition, -1)
            ends[partition] = position
    on_kafka = read_topic(kafka_bootstrap, topics.commands)
    assert ends == {partition: len(records) for partition, records in on_kafka.items() if records}
