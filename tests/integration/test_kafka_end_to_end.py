"""End to end on the real broker: publish commands, receive their outcomes, compare with a local re-fold."""

from __future__ import annotations

import pytest
from kafka_support import BackgroundProcessor, check_exactly_once, command_stream, kafka_config, new_topics, publish

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
