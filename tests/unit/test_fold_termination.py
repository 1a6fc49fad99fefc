"""Every command ends: no recursion (long cascades run on the worklist), and reclaim and priority preemption
cannot chase each other (Kueue's rule; and, whatever the contract, a pod is evicted at most once per command)."""

from __future__ import annotations

import sys
from collections import Counter

from processor.core.fold import decide
from processor.core.state import PartitionState
from schemas.commands import (
    AddNode,
    Command,
    GangMember,
    MarkNodeFailed,
    Release,
    SetPolicy,
    SetQuota,
    SubmitGang,
    SubmitPod,
    V2Command,
)
from schemas.events import Event
from tests.strategies import types


def chase(kind: type[Command]) -> list[Command]:
    """A lender's pod inside its nominal quota reclaims from a borrowing gang of higher priority, which would
    re-place itself by preempting that pod (which would reclaim again, and so on: main crashed here)."""
    payloads = [
        SetPolicy("first-fit", reserve_after_ms=-1),
        AddNode("n0", 64_000, 262_144, "A100", 4),
        AddNode("n1", 64_000, 262_144, "A100", 4),
        SetQuota("lender", cohort="lab", nominal_gpus={"A100": 4}),
        SetQuota("borrower", cohort="lab", nominal_gpus={"A100": 4}),
        SubmitGang(
            "g", tenant="borrower", priority=10, members=(GangMember("g-0", 4, 1000, 1000), GangMember("g-1", 4, 1000))
        ),
        SubmitPod("a", tenant="lender", priority=0, num_gpu=4, gpu_milli=1000, cpu_milli=1000),
    ]
    return [kind(f"c{i}", "c", 1000 * (i + 1), payload) for i, payload in enumerate(payloads)]


def last_command(stream: list[Command]) -> list[Event]:
    state = PartitionState()
    for command in stream[:-1]:
        decide(state, command)
    return decide(state, stream[-1])


def evictions(events: list[Event]) -> Counter[str]:
    return Counter(event.payload.pod_id for event in events if event.type_name == "PodEvicted")


def test_a_borrowing_gang_cannot_preempt_work_inside_its_nominal_quota() -> None:
    """Kueue's rule: the lender's pod reclaims; the gang, which would borrow to run, may not take it back: it waits."""
    events = last_command(chase(Command))
    assert types(events) == ["PodPreempted", "PodEvicted"] * 2 + ["PodScheduled", "GangQueued"]
    assert events[4].payload.pod.pod_id == "a" and events[0].payload.reason == "reclaim"


def test_under_contract_v2_the_chase_ends_after_one_eviction_each() -> None:
    """v2 let a borrower preempt anyone lower; the chase still ends: the lender's pod, evicted once, is never
    evicted again in that command, and its retry may not evict the gang a second time."""
    events = last_command(chase(V2Command))
    assert max(evictions(events).values()) == 1
    assert types(events)[-1] == "PodQueued" and events[-1].payload.pod.pod_id == "a"


def test_a_failed_root_fails_a_chain_of_ten_thousand_dependants_without_recursion() -> None:
    """Each dependant fails in turn on the worklist: the Python stack stays flat (main: RecursionError at ~330)."""
    state = PartitionState()
    decide(state, Command("n", "c", 1, AddNode("n0", 64_000, 262_144, "A100", 8)))
    decide(state, Command("root", "c", 2, SubmitPod("j0", cpu_milli=1)))
    length = 10_000
    for i in range(1, length + 1):
        decide(state, Command(f"s{i}", "c", 3, SubmitPod(f"j{i}", cpu_milli=1, depends_on=(f"j{i - 1}",))))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # a nested call per dependant would fail at once
    try:
        events = decide(state, Command("fail", "c", 4, Release("j0", "failed")))
    finally:
        sys.setrecursionlimit(limit)
    assert Counter(types(events))["DependencyFailed"] == length
    assert [e.payload.holder_id for e in events if e.type_name == "DependencyFailed"] == [
        f"j{i}" for i in range(1, length + 1)
    ]
    assert not state.clusters["c"].pods


def failed_node(kind: type[Command]) -> list[Command]:
    """On n1: p0 (priority 0) and p1 (priority 1) sharing a GPU, and a one-member gang g of priority 0 on two
    GPUs; n2 has two free GPUs. Then n1 fails: all three are evicted, and there is room for either the gang
    or the two pods."""
    payloads = [
        SetPolicy("first-fit", reserve_after_ms=-1),
        AddNode("n1", 32_000, 65_536, "A100", 4),
        AddNode("n2", 32_000, 65_536, "A100", 2),
        SubmitPod("p0", priority=0, num_gpu=1, gpu_milli=250, cpu_milli=500),
        SubmitPod("p1", priority=1, num_gpu=1, gpu_milli=250, cpu_milli=500),
        SubmitGang("g", priority=0, members=(GangMember("g-0", 2, 1000, 1000),)),
        MarkNodeFailed("n1"),
    ]
    return [kind(f"c{i}", "c", 1000 * (i + 1), payload) for i, payload in enumerate(payloads)]


def test_the_evicted_go_back_in_priority_order_gangs_included() -> None:
    """Contract v3: p1 (priority 1) is placed back first, then p0, and the gang waits; placed first, the gang
    would hold the room p1 may not take back from it in this command (one eviction per pod per command),
    leaving a higher-priority pod queued behind a lower-priority one."""
    events = last_command(failed_node(Command))
    placed = [(e.payload.pod.pod_id, e.payload.node_id) for e in events if e.type_name == "PodScheduled"]
    assert placed == [("p1", "n2"), ("p0", "n2")]
    assert types(events)[-1] == "GangQueued"


def test_v2_places_the_evicted_gangs_first_as_it_did() -> None:
    """Contract v2 keeps its order (gangs, then pods): its logs replay unchanged."""
    events = last_command(failed_node(V2Command))
    placed = [(e.payload.pod.pod_id, e.payload.node_id) for e in events if e.type_name == "PodScheduled"]
    assert placed == [("g-0", "n2")]
