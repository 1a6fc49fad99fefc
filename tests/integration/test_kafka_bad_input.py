"""Bad records on the real commands topic become dead letters or rejections; the processor keeps going."""

from __future__ import annotations

import random

import pytest
from kafka_support import BackgroundProcessor, check_exactly_once, dead_letter, kafka_config, new_topics, read_topic

from producers.outcomes import OutcomeWaiter
from producers.publisher import CommandPublisher
from schemas import COMMAND, registry
from schemas.commands import Command, SubmitPod

pytestmark = pytest.mark.integration


def test_garbage_and_invalid_commands_do_not_stop_the_processor(kafka_bootstrap: str) -> None:
    """Random bytes, an unknown fingerprint and a tombstone are dead-lettered, invalid commands rejected."""
    topics = new_topics(kafka_bootstrap, "bad", 1)
    config = kafka_config(kafka_bootstrap)
    encode = registry().codec(COMMAND).encode
    valid = encode(Command("c-ok", "lab", 1, SubmitPod("p1", cpu_milli=1_000), "test").to_avro())
    garbage = [
        random.Random(3).randbytes(64),  # not Avro at all
        b"\xc3\x01" + b"\xee" * 8 + valid[10:],  # single-object encoding with an unknown fingerprint
        valid[:-3],  # truncated body
        None,  # a tombstone
    ]
    invalid = [
        Command("c bad id", "lab", 2, SubmitPod("p2", cpu_milli=1_000), "test"),  # space in the id
        Command("c-shape", "lab", 3, SubmitPod("p3", num_gpu=2, gpu_milli=500), "test"),  # impossible shape
    ]
    with OutcomeWaiter(config, topics.events) as waiter:
        with CommandPublisher(config, topics.commands) as publisher:
            for value in garbage:
                publisher.send(b"lab", value)  # type: ignore[arg-type]
            for command in invalid:
                publisher.send(b"lab", encode(command.to_avro()))  # bypasses client-side validation on purpose
            publisher.send(b"lab", valid)
        with BackgroundProcessor(kafka_bootstrap, topics, instance_id="bad", stop_when_idle=0):
            assert waiter.wait("c-ok", 60).kind == "PodQueued"
            assert waiter.wait("c bad id", 5).events[0].payload.code == "INVALID_COMMAND"  # type: ignore[union-attr]
            assert waiter.wait("c-shape", 5).events[0].payload.code == "INVALID_RESOURCES"  # type: ignore[union-attr]
    letters = [dead_letter(record.value) for record in read_topic(kafka_bootstrap, topics.dead_letters)[0]]
    assert [letter["offset"] for letter in letters] == [0, 1, 2, 3]
    assert letters[0]["value"] == garbage[0]
    assert "unknown schema fingerprint" in letters[1]["error"]
    assert all(letter["topic"] == topics.commands and letter["key"] == b"lab" for letter in letters)
    check_exactly_once(kafka_bootstrap, topics)
