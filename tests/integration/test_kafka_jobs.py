"""Gangs, time limits and ticks on the real broker: one transaction per outcome, deadlines on time."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka_support import (
    BackgroundProcessor,
    check_exactly_once,
    decode_events,
    fold_through_sigkills,
    kafka_config,
    new_topics,
    publish,
    read_topic,
)

from producers.publisher import CommandPublisher
from schemas.commands import AddNode, Command, GangMember, Release, ReleaseGang, SetPolicy, SubmitGang, SubmitPod, Tick

pytestmark = pytest.mark.integration

PARTITIONS = 2


def job_stream(count: int, seed: int = 5) -> list[Command]:
    """Two clusters of 16 racked 8-GPU nodes; 4-member gangs, time-limited pods, releases and ticks."""
    rng = random.Random(seed)
    commands: list[Command] = []
    t = 0

    def add(cluster: str, payload: object) -> None:
        nonlocal t
        t += rng.choice((0, 500, 2_000))
        commands.append(Command(f"{cluster}-{len(commands)}", cluster, t, payload, "test"))  # type: ignore[arg-type]

    clusters = ("ga", "gb")
    for cluster in clusters:
        add(cluster, SetPolicy("first-fit", reserve_after_ms=20_000))
        for i in range(16):
            add(cluster, AddNode(f"n{i}", 64_000, 256_000, "H100", 8, {"topology/rack": f"r{i // 4}"}))
    live: dict[str, list[str]] = {c: [] for c in clusters}
    serial = 0
    while len(commands) < count:
        cluster = rng.choice(clusters)
        roll = rng.random()
        serial += 1
        if roll < 0.25:
            members = tuple(GangMember(f"j{serial}-{i}", 8, 1000, 8_000, 32_000) for i in range(4))
            add(cluster, SubmitGang(f"j{serial}", members=members, topology_required="topology/rack",
                                    time_limit_ms=rng.choice((None, 30_000))))  # fmt: skip
            live[cluster].append(f"j{serial}")
        elif roll < 0.6:
            add(cluster, SubmitPod(f"p{serial}", num_gpu=rng.choice((1, 2)), gpu_milli=1000, cpu_milli=1000,
                                   time_limit_ms=rng.choice((5_000, 60_000, None))))  # fmt: skip
            live[cluster].append(f"p{serial}")
        elif roll < 0.9 and live[cluster]:
            job = live[cluster].pop(rng.randrange(len(live[cluster])))
            add(cluster, ReleaseGang(job) if job.startswith("j") else Release(job))
        else:
            add(cluster, Tick())
    return commands[:count]


def test_gang_outcomes_commit_in_one_transaction_across_sigkills(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Three SIGKILLs during a gang workload: every GangScheduled is followed by all its members' PodScheduled,
    every command has exactly one outcome, and the events equal a local re-fold byte for byte."""
    rng = random.Random(20261201)
    commands = job_stream(6_000)
    topics = new_topics(kafka_bootstrap, "gangs", PARTITIONS)
    publish(kafka_bootstrap, topics, commands)
    group = topics.commands + ".group"
    options = ["--group", group, "--instance-id", "gangs", "--snapshot-every", "700", "--batch-size", "150"]
    options += ["--transaction-timeout-ms", "10000"]
    log = tmp_path / "processor.log"
    points = sorted(rng.sample(range(500, 5_000), 3))
    fold_through_sigkills(kafka_bootstrap, topics, PARTITIONS, options, len(commands), points, rng, log)
    check_exactly_once(kafka_bootstrap, topics)
    gangs = 0
    for records in read_topic(kafka_bootstrap, topics.events).values():
        events = decode_events([record.value for record in records])  # type: ignore[misc]
        for index, event in enumerate(events):
            if event.type_name != "GangScheduled":
                continue
            gangs += 1
            members = [m.pod_id for m in event.payload.members]  # type: ignore[union-attr]
            following = events[index + 1 : index + 1 + len(members)]
            assert [e.type_name for e in following] == ["PodScheduled"] * len(members)
            assert [e.payload.pod.pod_id for e in following] == members  # type: ignore[union-attr]
            assert {e.command_offset for e in following} == {event.command_offset}
    assert gangs > 50


def test_ticks_fire_a_time_limit_when_no_other_command_arrives(kafka_bootstrap: str) -> None:
    """With --tick-interval the processor publishes Ticks itself; a pod's time limit passes and it is released,
    and the ticks being ordinary commands, a re-fold of the log gives the same events."""
    topics = new_topics(kafka_bootstrap, "ticks", PARTITIONS)
    config = kafka_config(kafka_bootstrap)
    with BackgroundProcessor(kafka_bootstrap, topics, instance_id="ticks", tick_interval=0.2):
        with CommandPublisher(config, topics.commands, source="test") as publisher:
            publisher.add_node("lab", "n1", cpu_milli=8_000, memory_mib=16_384, gpu_model="A100", gpu_count=1)
            publisher.submit_pod("lab", "short", num_gpu=1, cpu_milli=1_000, time_limit_ms=1_000)
        consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "ticks-reader",
                             "isolation.level": "read_committed", "enable.auto.commit": False})  # fmt: skip
        consumer.assign([TopicPartition(topics.events, p, 0) for p in range(PARTITIONS)])
        seen: list[str] = []
        deadline = time.monotonic() + 60
        try:
            while not {"PodTimeLimitReached", "Ticked"} <= set(seen) and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None and not message.error():
                    seen.append(decode_events([message.value()])[0].type_name)
        finally:
            consumer.close()
        assert "PodTimeLimitReached" in seen and "Ticked" in seen
    # The last ticks may have been published after the last fold: let a tick-less processor fold them.
    with BackgroundProcessor(kafka_bootstrap, topics, instance_id="ticks", stop_when_idle=2.0) as drain:
        assert drain.wait() == 0
    ticks = [r for records in read_topic(kafka_bootstrap, topics.commands).values() for r in records]
    assert len(ticks) > 2  # the two published commands and the processor's ticks
    check_exactly_once(kafka_bootstrap, topics)
