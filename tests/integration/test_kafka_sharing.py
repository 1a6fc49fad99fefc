"""Quotas, preemption and defragmentation on the real broker: each preemption is one transaction; exactly once."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from kafka_support import (
    check_exactly_once,
    decode_events,
    fold_through_sigkills,
    new_topics,
    publish,
    read_topic,
)

from schemas.commands import AddNode, Command, Defragment, Release, SetPolicy, SetQuota, SubmitPod, Tick

pytestmark = pytest.mark.integration

PARTITIONS = 2


def sharing_stream(count: int, seed: int = 11) -> list[Command]:
    """Two clusters of 12 8-GPU nodes; three tenants in a cohort; pods of priorities 0-10 (shares, movable
    ones), releases, ticks and Defragment: preemptions and reclaims happen all the time."""
    rng = random.Random(seed)
    commands: list[Command] = []
    t = 0

    def add(cluster: str, payload: object) -> None:
        nonlocal t
        t += rng.choice((0, 500, 2_000))
        commands.append(Command(f"{cluster}-{len(commands)}", cluster, t, payload, "test"))  # type: ignore[arg-type]

    clusters = ("sa", "sb")
    for cluster in clusters:
        add(cluster, SetPolicy("best-fit", reserve_after_ms=-1))
        for i in range(12):
            add(cluster, AddNode(f"n{i}", 64_000, 256_000, "H100", 8))
        for tenant, nominal in (("a", 32), ("b", 32), ("c", 32)):
            add(cluster, SetQuota(tenant, "lab", {"H100": nominal}, weight=2 if tenant == "c" else 1))
    live: dict[str, list[str]] = {c: [] for c in clusters}
    serial = 0
    while len(commands) < count:
        cluster = rng.choice(clusters)
        roll = rng.random()
        serial += 1
        if roll < 0.6:
            gpus, milli = rng.choice(((1, 1000), (2, 1000), (4, 1000), (1, 500), (1, 250)))
            pod = SubmitPod(f"p{serial}", rng.choice("abc"), rng.choice((0, 0, 3, 10)), gpus, milli, 1000, 4_096,
                            movable=rng.random() < 0.5)  # fmt: skip
            add(cluster, pod)
            live[cluster].append(pod.pod_id)
        elif roll < 0.9 and live[cluster]:
            add(cluster, Release(live[cluster].pop(rng.randrange(len(live[cluster])))))
        elif roll < 0.95:
            add(cluster, Defragment(rng.choice((2, 8))))
        else:
            add(cluster, Tick())
    return commands[:count]


def test_preemptions_commit_in_one_transaction_across_sigkills(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Three SIGKILLs during a stream full of preemptions: every preemptor's victims (PodPreempted, PodEvicted)
    and its PodScheduled come from one command, every command has exactly one outcome, and the events equal
    a local re-fold byte for byte."""
    rng = random.Random(20261202)
    commands = sharing_stream(5_000)
    topics = new_topics(kafka_bootstrap, "sharing", PARTITIONS)
    publish(kafka_bootstrap, topics, commands)
    group = topics.commands + ".group"
    options = ["--group", group, "--instance-id", "sharing", "--snapshot-every", "600", "--batch-size", "150"]
    options += ["--transaction-timeout-ms", "10000"]
    log = tmp_path / "processor.log"
    points = sorted(rng.sample(range(500, 4_200), 3))
    fold_through_sigkills(kafka_bootstrap, topics, PARTITIONS, options, len(commands), points, rng, log)
    check_exactly_once(kafka_bootstrap, topics)
    preemptions = reclaims = migrations = 0
    for records in read_topic(kafka_bootstrap, topics.events).values():
        events = decode_events([record.value for record in records])  # type: ignore[misc]
        by_offset: dict[int, list] = {}
        for event in events:
            by_offset.setdefault(event.command_offset, []).append(event)
        for group_events in by_offset.values():
            for index, event in enumerate(group_events):
                if event.type_name != "PodPreempted":
                    continue
                payload = event.payload
                preemptions += payload.reason == "priority"  # type: ignore[union-attr]
                reclaims += payload.reason == "reclaim"  # type: ignore[union-attr]
                placed = next(  # the preemptor's placement follows its victims, in the same command
                    (
                        e.payload
                        for e in group_events[index:]
                        if e.type_name in ("PodScheduled", "GangScheduled")
                        and (getattr(e.payload, "gang_id", None) or e.payload.pod.pod_id) == payload.by  # type: ignore[union-attr]
                    ),
                    None,
                )
                assert placed is not None, f"{payload} without its preemptor's placement in the same command"
                assert payload.pod_id in placed.preempted  # type: ignore[union-attr]
            migrations += sum(e.type_name == "PodMigrated" for e in group_events)
    assert preemptions > 20 and reclaims > 5 and migrations > 0
