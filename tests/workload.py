"""A deterministic synthetic workload for projection tests and benchmarks.

Commands for a few clusters (nodes of several GPU models, pods of several
tenants and shapes, releases, cordons, failures, rejected commands) are folded
with the real ``processor.core.fold.decide``, so the events are exactly what the
processor would publish. Event time advances a fixed step per command, so the
usage hours seal as the workload goes on.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from processor.core.fold import decide
from processor.core.state import PartitionState
from schemas import EVENT, registry
from schemas.commands import AddNode, Command, CordonNode, MarkNodeFailed, Release, SetPolicy, SubmitPod, UncordonNode
from schemas.events import Event

MODELS = ("A10", "T4", "V100M32")
TENANTS = ("acme", "globex", "initech", "umbrella")
SHAPES = ((1, 1000), (1, 500), (1, 250), (2, 1000), (4, 1000), (0, 0), (8, 1000))
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def commands(
    count: int,
    *,
    cluster: str = "c1",
    nodes: int = 40,
    seed: int = 7,
    step_ms: int = 7_000,
    start_ms: int = START_MS,
    release_ratio: float = 0.45,
) -> Iterator[Command]:
    """``count`` commands for one cluster: nodes first, then a mix of submissions and releases."""
    rng = random.Random(seed)
    t = start_ms
    issued = 0

    def command(payload: object) -> Command:
        nonlocal t, issued
        issued += 1
        t += step_ms
        return Command(f"{cluster}-cmd-{issued}", cluster, t, payload)  # type: ignore[arg-type]

    for i in range(min(nodes, count)):
        model = MODELS[i % len(MODELS)]
        yield command(AddNode(f"node-{i:04d}", 64_000, 262_144, model, 8 if i % 5 else 4, {"zone": f"z{i % 3}"}))
    running: list[str] = []
    pod = 0
    for _ in range(count - min(nodes, count)):
        roll = rng.random()
        if running and roll < release_ratio:
            victim = running.pop(rng.randrange(len(running)))
            yield command(Release(victim, "completed"))
        elif roll < 0.47:
            yield command(SetPolicy(rng.choice(("best-fit", "first-fit", "spread"))))
        elif roll < 0.48:
            yield command(Release(f"never-{pod}"))  # rejected: UNKNOWN_POD
        elif roll < 0.485:
            node = f"node-{rng.randrange(nodes):04d}"
            yield command(CordonNode(node))
            yield command(UncordonNode(node))
        elif roll < 0.4855:
            yield command(MarkNodeFailed(f"node-{rng.randrange(nodes):04d}", "xid 79"))
        else:
            pod += 1
            num_gpu, milli = rng.choice(SHAPES)
            pod_id = f"pod-{pod:07d}"
            running.append(pod_id)
            yield command(
                SubmitPod(
                    pod_id,
                    rng.choice(TENANTS),
                    rng.choice((0, 0, 0, 10)),
                    num_gpu,
                    milli,
                    rng.choice((500, 1000, 4000)),
                    rng.choice((1024, 4096, 16384)),
                )
            )


def fold(cmds: Iterator[Command] | list[Command], partition: int = 0) -> list[Event]:
    """The events the processor publishes for these commands (one partition, offsets from 0)."""
    state = PartitionState(partition=partition)
    events: list[Event] = []
    for offset, cmd in enumerate(cmds):
        events.extend(decide(state, cmd, offset))
    return events


def encode(events: list[Event]) -> list[bytes]:
    """Event frames as they are stored in the events topic."""
    codec = registry().codec(EVENT)
    return [codec.encode(event.to_avro()) for event in events]
