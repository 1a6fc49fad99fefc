"""The what-if fork: folding a command on it gives the live fold's events, byte for byte, and never
touches the live state; gangs, time limits, dependencies, reservations and timers included."""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
from sortedcontainers import SortedList

from processor.core.capacity import NodeGroup
from processor.core.fold import decide
from processor.core.resources import Held
from processor.core.snapshot import state_hash
from processor.core.state import Node, PartitionState
from processor.runtime.whatif import _copy_node, _slots, fork
from schemas.commands import (
    AddNode,
    Command,
    DrainNode,
    GangMember,
    Release,
    ReleaseGang,
    SetPolicy,
    SubmitGang,
    SubmitPod,
    Taint,
    Tick,
    UncordonNode,
)
from schemas.fastcodec import encode_event

CLUSTERS = ("east", "west")  # one partition: a command on one can fire the other's timers


def stream(seed: int, count: int) -> list[Command]:
    rng = random.Random(seed)
    t = 1_767_225_600_000
    commands: list[Command] = []
    jobs: dict[str, list[str]] = {c: [] for c in CLUSTERS}
    gangs: dict[str, list[str]] = {c: [] for c in CLUSTERS}

    def add(cluster: str, payload: object) -> None:
        nonlocal t
        t += rng.choice((1_000, 30_000, 120_000))
        commands.append(Command(f"{cluster}-{len(commands)}", cluster, t, payload))  # type: ignore[arg-type]

    for cluster in CLUSTERS:
        add(cluster, SetPolicy(rng.choice(("fgd-plus", "best-fit")), reserve_after_ms=60_000))
        for i in range(8):
            add(cluster, AddNode(f"n{i}", 32_000, 131_072, ("A100", "T4")[i % 2], 4, {"zone": f"z{i % 3}"}))
    while len(commands) < count:
        cluster = rng.choice(CLUSTERS)
        roll = rng.random()
        if roll < 0.35:
            pod = f"p{len(commands)}"
            depends = (rng.choice(jobs[cluster]),) if jobs[cluster] and rng.random() < 0.15 else ()
            num_gpu, milli = rng.choice(((1, 1000), (1, 500), (2, 1000), (4, 1000), (1, 250)))
            limit = rng.choice((None, 300_000, 900_000))
            add(cluster, SubmitPod(pod, "t", rng.choice((0, 5)), num_gpu, milli, 1_000, 1_024,
                                   time_limit_ms=limit, depends_on=depends))  # fmt: skip
            jobs[cluster].append(pod)
        elif roll < 0.45:
            gang = f"g{len(commands)}"
            members = tuple(GangMember(f"{gang}-{m}", 1, 1000, 1_000, 1_024) for m in range(rng.choice((2, 3, 6))))
            add(cluster, SubmitGang(gang, "t", 0, members, topology_required=rng.choice((None, "zone")),
                                    timeout_ms=rng.choice((None, 600_000)), time_limit_ms=600_000))  # fmt: skip
            gangs[cluster].append(gang)
        elif roll < 0.7 and jobs[cluster]:
            add(cluster, Release(jobs[cluster].pop(rng.randrange(len(jobs[cluster])))))
        elif roll < 0.78 and gangs[cluster]:
            add(cluster, ReleaseGang(gangs[cluster].pop(rng.randrange(len(gangs[cluster])))))
        elif roll < 0.85:
            add(cluster, Tick())
        elif roll < 0.9:
            node = f"n{rng.randrange(8)}"
            add(cluster, DrainNode(node))
            add(cluster, UncordonNode(node))
        else:
            add(cluster, SubmitPod(f"x{len(commands)}", "t", 9, 4, 1000, 1_000, 1_024))  # a whole node: waits, reserves
    return commands


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fork_decides_like_the_live_state(seed: int) -> None:
    """Before every command: the fork's events for it equal the live fold's, and the live state is unchanged."""
    live = PartitionState()
    kinds: set[str] = set()
    for offset, command in enumerate(stream(seed, 400)):
        before = state_hash(live) if offset % 25 == 0 else None
        twin = fork(live)
        asked = [encode_event(e) for e in decide(twin, command, offset)]
        if before is not None:
            assert state_hash(live) == before, f"command {offset}: the fork changed the live state"
        twin_hash = state_hash(twin) if offset % 50 == 0 else None  # a fork is valid until the live state moves
        events = decide(live, command, offset)
        assert [encode_event(e) for e in events] == asked, f"command {offset} ({command.type_name}) differs"
        kinds.update(type(e.payload).__name__ for e in events)
        if twin_hash is not None:
            assert twin_hash == state_hash(live)
    # The stream really exercises what the fork must copy.
    assert {"GangScheduled", "PodTimeLimitReached", "PodQueued", "PodEvicted", "NodesReserved"} <= kinds, kinds


def test_fork_keeps_the_idempotency_window_like_the_live_state() -> None:
    """With a small window that overflows and repeated command ids, the fork's window behaves as the live one."""
    live = PartitionState(seen_window=30)
    commands = stream(4, 300)
    repeated = [
        dataclasses.replace(c, command_id=commands[max(0, i - rng)].command_id) if i % 7 == 0 else c
        for i, c in enumerate(commands)
        for rng in [(i * 13) % 50]
    ]
    rejected = 0
    for offset, command in enumerate(repeated):
        twin = fork(live)
        asked = [encode_event(e) for e in decide(twin, command, offset)]
        twin_window = list(twin.seen)
        events = decide(live, command, offset)
        assert [encode_event(e) for e in events] == asked, f"command {offset} differs"
        assert twin_window == list(live.seen) and len(twin_window) <= 30
        rejected += any(getattr(e.payload, "code", "") == "DUPLICATE_COMMAND" for e in events)
    assert rejected > 5


def test_copying_a_node_or_a_node_group_keeps_every_attribute() -> None:
    """Node and NodeGroup copy themselves (``__copy__``, for the compiled build): no attribute may be left out."""
    node = Node("n1", "A100", 2, 8000, 16384, {"zone": "a"}, (Taint("k", "v", "NoSchedule"),))
    node.reserved_for, node.cordoned, node.failed = "gang-1", True, True
    node.gpu_free, node.cpu_free, node.memory_free = [500, 0], 100, 200
    node.pods, node.by_priority = {"p1": None}, {3: Held([3], 1, 2, 4, 1, {5: 6}, 6, 5)}
    node.node_class = (node.base_class[0], ())
    group = NodeGroup(node.signature())
    group.add("n1")
    for original in (node, group):
        twin = copy.copy(original)
        assert type(twin) is type(original)
        names = _slots(type(original))
        assert names, "no attribute list found"
        assert [name for name in names if getattr(twin, name) != getattr(original, name)] == []
        # shared, not copied, as copy.copy does (compiled, ints and tuples are re-boxed on read: compare those by value)
        shared = [name for name in names if isinstance(getattr(original, name), (list, dict, set, SortedList))]
        assert [name for name in shared if getattr(twin, name) is not getattr(original, name)] == []
        assert {"gpu_free", "pods", "by_priority", "labels"} <= set(shared) or type(original) is NodeGroup


def test_a_forked_node_holds_its_own_per_priority_sums() -> None:
    """allocate/free change a node's Held records in place: a what-if fork's node must not share them."""
    node = Node("n1", "A100", 2, 8000, 16384, {}, ())
    node.by_priority = {3: Held([300, 0], 1, 2, 1, 1, {300: 6}, 6, 300)}
    twin = _copy_node(node)
    held, copied = node.by_priority[3], twin.by_priority[3]
    assert copied == held and copied is not held
    assert copied.gpu_milli is not held.gpu_milli and copied.latest_starts is not held.latest_starts
    copied.gpu_milli[1] += 500
    copied.latest_starts[500] = 9
    copied.pods += 1
    assert held == Held([300, 0], 1, 2, 1, 1, {300: 6}, 6, 300)
