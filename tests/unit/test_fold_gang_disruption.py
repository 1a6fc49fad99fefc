"""Issue #24: ``SubmitGang.disruption: above_min`` under drains and failures, not only priority preemption.

A drain (through budgets and grace periods), a node failure, a removal or a ``NoExecute`` taint may take members
of an above_min gang above ``min_members`` (and above each role's ``min_members_per_role``) one by one: the gang
runs on, and each member taken alone waits in the queue as a member of the running gang (``PodQueued``,
``GANG_MEMBER_WAITING``) and starts when it fits. Below the minimums the gang goes back to the queue whole, as
before; a gang of ``disruption: all`` keeps today's rule (a member lost above ``min_members`` ends).
"""

from __future__ import annotations

from processor.core.explain import explain
from processor.core.state import GANG_QUEUED, GANG_RUNNING
from schemas.codes import QueueReasonCode
from schemas.commands import (
    AddNode,
    DrainNode,
    GangMember,
    MarkNodeFailed,
    RecoverNode,
    Release,
    ReleaseGang,
    SetDisruptionBudget,
    SetPolicy,
    SubmitGang,
    SubmitPod,
    Tick,
)
from schemas.events import Event
from tests.strategies import Fold, types


def of(events: list[Event], name: str) -> list[Event]:
    return [event for event in events if event.type_name == name]


def spread(disruption: str, min_members: int = 2, roles: dict[str, int] | None = None) -> Fold:
    """Three nodes of 2 GPUs; gang g of four 2-GPU members (g-0 and g-1 workers, g-2 and g-3 ps) on n0, n1 and
    n2 (g-3 waits: no room), min_members 2."""
    fold = Fold()
    fold.run(SetPolicy("first-fit", reserve_after_ms=-1))
    for i in range(3):
        fold.run(AddNode(f"n{i}", 64_000, 262_144, "A100", 2))
    members = tuple(GangMember(f"g-{i}", 2, 1000, 1000, 1024, role="worker" if i < 2 else "ps") for i in range(4))
    fold.run(
        SubmitGang(
            "g", members=members, min_members=min_members, disruption=disruption, min_members_per_role=roles or {}
        )
    )
    assert sorted(fold.cluster.gangs["g"].placed) == ["g-0", "g-1", "g-2"]
    return fold


def test_a_failed_node_takes_an_above_min_member_alone_and_it_waits_as_a_member_then_starts() -> None:
    """n2 fails: g-2 is taken alone (3 ran, 2 are needed); the gang runs on and g-2 waits as its member, saying
    why; when n2 recovers, g-2 starts again (before issue #24's change it ended, evicted:node_failed)."""
    fold = spread("above_min")
    events = fold.run(MarkNodeFailed("n2"))
    assert "PodReleased" not in types(events) and "GangQueued" not in types(events)
    (queued,) = of(events, "PodQueued")
    assert queued.payload.pod.pod_id == "g-2" and queued.payload.requeued
    head = queued.payload.reasons[0]
    assert head.code == QueueReasonCode.GANG_MEMBER_WAITING and "node_failed" in head.message
    assert "role 'ps'" in head.message
    gang = fold.cluster.gangs["g"]
    assert gang.state == GANG_RUNNING and sorted(gang.placed) == ["g-0", "g-1"]
    assert fold.cluster.pods["g-2"].queued
    found = explain(fold.cluster, "g-2", 10_000)
    assert found is not None and found.state == "pending" and found.reasons[0]["code"] == "GANG_MEMBER_WAITING"
    assert "member (role 'ps') of gang 'g', which runs 2 of 4" in found.message
    events = fold.run(RecoverNode("n2"))
    assert [e.payload.pod.pod_id for e in of(events, "PodScheduled")] == ["g-2"]
    assert sorted(fold.cluster.gangs["g"].placed) == ["g-0", "g-1", "g-2"]


def test_a_drain_takes_above_min_members_alone_and_the_gang_runs_on() -> None:
    fold = spread("above_min")
    events = fold.run(DrainNode("n2"))
    assert "NodeDrained" in types(events) and [e.payload.pod.pod_id for e in of(events, "PodQueued")] == ["g-2"]
    assert fold.cluster.gangs["g"].state == GANG_RUNNING
    fold.run(Release("g-0"))  # n0 frees: g-2 (waiting longest among the members, then by id) starts there
    assert fold.placement("g-2") == "n0"


def test_a_drain_below_min_members_takes_the_whole_gang_as_before() -> None:
    """min_members 3: n2's member is needed, so the drain sends the whole gang back to the queue."""
    fold = spread("above_min", min_members=3)
    events = fold.run(DrainNode("n2"))
    assert "GangQueued" in types(events)
    assert fold.cluster.gangs["g"].state in (GANG_QUEUED, GANG_RUNNING)
    assert not any(e.payload.reasons[0].code == QueueReasonCode.GANG_MEMBER_WAITING for e in of(events, "PodQueued"))


def test_a_drain_that_takes_a_roles_last_needed_member_takes_the_whole_gang() -> None:
    """Both workers needed: draining n1 (worker g-1) leaves 2 members (min_members) but one worker: whole gang."""
    fold = spread("above_min", roles={"worker": 2})
    events = fold.run(DrainNode("n1"))
    assert "GangQueued" in types(events)
    fold = spread("above_min", roles={"worker": 1})
    events = fold.run(DrainNode("n1"))
    assert "GangQueued" not in types(events) and [e.payload.pod.pod_id for e in of(events, "PodQueued")] == ["g-1"]


def test_a_gang_of_disruption_all_loses_a_member_above_min_members_as_today() -> None:
    fold = spread("all")
    events = fold.run(MarkNodeFailed("n2"))
    (ended,) = of(events, "PodReleased")
    assert ended.payload.pod_id == "g-2" and ended.payload.reason == "evicted:node_failed"
    assert "g-2" not in fold.cluster.pods


def test_a_graceful_drain_under_a_budget_takes_one_member_at_a_time() -> None:
    """A budget lets one member of g be unavailable: draining n1 and n2 with a grace period evicts g-1 at its
    deadline; g-2 is blocked while g-1 waits (unavailable); once g-1 runs again elsewhere, g-2 goes too."""
    fold = spread("above_min", min_members=1)
    fold.run(SetDisruptionBudget("b", gang_id="g", max_unavailable=1))
    fold.run(DrainNode("n1", grace_ms=5_000), at=100_000)
    events = fold.run(DrainNode("n2", grace_ms=5_000), at=101_000)
    assert [e.payload.pod_id for e in of(events, "EvictionBlocked")] == ["g-2"]
    events = fold.run(Tick(), at=106_000)
    assert [e.payload.pod.pod_id for e in of(events, "PodQueued")] == ["g-1"]
    assert fold.cluster.gangs["g"].state == GANG_RUNNING and fold.cluster.pods["g-2"].running
    events = fold.run(AddNode("n3", 64_000, 262_144, "A100", 2), at=107_000)  # g-1 runs again: the budget frees
    assert fold.placement("g-1") == "n3"
    assert [e.payload.pod_id for e in of(events, "PodEvictionScheduled")] == ["g-2"]
    events = fold.run(Tick(), at=113_000)
    assert [e.payload.pod.pod_id for e in of(events, "PodQueued")] == ["g-2"] and "NodeDrained" in types(events)
    assert fold.cluster.gangs["g"].state == GANG_RUNNING and sorted(fold.cluster.gangs["g"].placed) == ["g-0", "g-1"]


def test_a_member_waiting_after_a_failure_ends_with_its_gang() -> None:
    fold = spread("above_min")
    fold.run(MarkNodeFailed("n2"))
    events = fold.run(ReleaseGang("g"))
    released = sorted(e.payload.pod_id for e in of(events, "PodReleased"))
    assert released == ["g-0", "g-1", "g-2", "g-3"]
    (gang_released,) = of(events, "GangReleased")
    assert not gang_released.payload.ok and "g" not in fold.cluster.gangs


def test_a_preempted_above_min_member_waits_as_a_member() -> None:
    """A 2-GPU preemptor of higher priority on a full cluster takes one member alone; it waits, it does not end."""
    fold = spread("above_min")
    events = fold.run(SubmitPod("p", "default", 5, 2, 1000, 1000, 1024))
    (preempted,) = of(events, "PodPreempted")
    assert "waits as its member" in preempted.payload.message
    assert "PodReleased" not in types(events)
    assert fold.cluster.pods[preempted.payload.pod_id].queued
