"""Disruption budgets and graceful drains: a drain evicts as budgets allow (EvictionBlocked, retried when the budget
frees, with no command needed), with grace_ms each pod is told first (PodEvictionScheduled) and evicted at that time,
NodeDrained when the node is empty; failures ignore budgets but count."""

from __future__ import annotations

from processor.core.snapshot import from_snapshot, to_snapshot
from processor.core.timers import PREEMPT_CHECK
from schemas.commands import (
    AddNode,
    DrainNode,
    GangMember,
    MarkNodeFailed,
    Release,
    RemoveDisruptionBudget,
    SetDisruptionBudget,
    SetPolicy,
    SubmitGang,
    SubmitPod,
    Taint,
    Tick,
    UncordonNode,
    UpdateNode,
)
from schemas.snapshots import decode_snapshot, encode_snapshot
from tests.strategies import Fold, clusters_hash, types


def rack(budget: int | None = 1) -> Fold:
    """first-fit; node a (4 GPUs) runs p1..p3 of tenant t (1 GPU each); node b (4 GPUs, added after) is empty."""
    fold = Fold()
    fold.run_all(SetPolicy("first-fit"), AddNode("a", 8000, 32768, "A100", 4))
    for pod_id in ("p1", "p2", "p3"):
        fold.run(SubmitPod(pod_id, tenant="t", num_gpu=1, gpu_milli=1000, cpu_milli=100))
    fold.run(AddNode("b", 8000, 32768, "A100", 4))
    if budget is not None:
        fold.run(SetDisruptionBudget("t-budget", tenant="t", max_unavailable=budget))
    return fold


def test_without_budgets_or_grace_a_drain_evicts_everything_at_once_as_before() -> None:
    """No budget, no grace: today's drain (NodeDrained first, then every eviction and re-placement)."""
    fold = rack(budget=None)
    events = fold.run(DrainNode("a"))
    assert types(events)[:4] == ["NodeDrained", "PodEvicted", "PodEvicted", "PodEvicted"]


def test_a_budget_lets_the_drain_go_as_fast_as_replacements_start() -> None:
    """Budget 1: each evicted pod starts on b in the same command, so the budget frees and the next one goes."""
    fold = rack(budget=1)
    events = fold.run(DrainNode("a"))
    assert types(events) == [
        "NodeCordoned",
        "PodEvicted",
        "PodScheduled",
        "PodEvicted",
        "PodScheduled",
        "PodEvicted",
        "PodScheduled",
        "NodeDrained",
    ]
    assert all(fold.placement(p) == "b" for p in ("p1", "p2", "p3"))


def test_a_blocked_eviction_waits_and_goes_when_the_budget_frees() -> None:
    """No room elsewhere: p1 is evicted and waits; p2 and p3 are blocked (once each); when p1 runs again (capacity
    freed by a release elsewhere), the next goes without any command about the drain."""
    fold = Fold()
    fold.run_all(SetPolicy("first-fit"), AddNode("a", 8000, 32768, "A100", 3))
    for pod_id in ("p1", "p2", "p3"):
        fold.run(SubmitPod(pod_id, tenant="t", num_gpu=1, gpu_milli=1000, cpu_milli=100))
    fold.run_all(AddNode("b", 8000, 32768, "A100", 1), SubmitPod("other", num_gpu=1, gpu_milli=1000, cpu_milli=100))
    fold.run(SetDisruptionBudget("t-budget", tenant="t", max_unavailable=1))
    events = fold.run(DrainNode("a"))
    assert types(events) == ["NodeCordoned", "PodEvicted", "PodQueued", "EvictionBlocked", "EvictionBlocked"]
    assert [(e.payload.pod_id, e.payload.budget_id) for e in events[3:]] == [("p2", "t-budget"), ("p3", "t-budget")]
    assert types(fold.run(Tick())) == ["Ticked"]  # nothing moved: no repeated EvictionBlocked
    events = fold.run(Release("other"))
    assert types(events) == ["PodReleased", "PodScheduled", "PodEvicted", "PodQueued"]
    assert (events[1].payload.pod.pod_id, events[2].payload.pod_id) == ("p1", "p2")
    assert fold.cluster.blocked == {"p3": "t-budget"}


def test_removing_the_budget_lets_the_drain_finish() -> None:
    """The budget goes: the blocked pods are evicted in that command and the node is drained."""
    fold = rack(budget=0)
    events = fold.run(DrainNode("a"))
    assert types(events) == ["NodeCordoned", "EvictionBlocked", "EvictionBlocked", "EvictionBlocked"]
    events = fold.run(RemoveDisruptionBudget("t-budget"))
    assert types(events)[0] == "DisruptionBudgetRemoved" and types(events)[-1] == "NodeDrained"
    assert types(events).count("PodEvicted") == 3


def test_a_grace_period_tells_each_pod_then_evicts_it_at_that_time() -> None:
    """grace_ms: PodEvictionScheduled now, the eviction at now + grace (a timer), NodeDrained when empty."""
    fold = rack(budget=None)
    events = fold.run(DrainNode("a", grace_ms=30_000), at=10_000)
    assert types(events) == ["NodeCordoned"] + ["PodEvictionScheduled"] * 3
    assert {e.payload.at for e in events[1:]} == {40_000}
    assert fold.placement("p1") == "a"  # still running during its grace period
    assert types(fold.run(Tick(), at=39_999)) == ["Ticked"]
    events = fold.run(Tick(), at=41_000)
    assert types(events).count("PodEvicted") == 3 and "NodeDrained" in types(events)
    assert all(e.occurred_at == 40_000 for e in events[:-1]) and types(events)[-1] == "Ticked"
    assert all(fold.placement(p) == "b" for p in ("p1", "p2", "p3"))


def test_draining_a_node_whose_drain_waits_again_is_node_draining() -> None:
    """A second DrainNode that would change nothing (the node cordoned, every pod already told or blocked as
    before) is refused with NODE_DRAINING and changes nothing; found by the property tests, where it yielded no
    event at all. A drain without grace or budgets after it still evicts everything at once."""
    fold = rack(budget=None)
    fold.run(DrainNode("a", grace_ms=30_000), at=10_000)
    before = clusters_hash(fold.state)
    (refused,) = fold.run(DrainNode("a", grace_ms=30_000), at=11_000)
    assert refused.payload.code == "NODE_DRAINING" and "already draining" in refused.payload.message
    assert clusters_hash(fold.state) == before
    blocked = rack(budget=0)
    assert types(blocked.run(DrainNode("a"))) == ["NodeCordoned"] + ["EvictionBlocked"] * 3
    assert types(blocked.run(DrainNode("a"))) == ["CommandRejected"]
    events = fold.run(DrainNode("a", respect_budgets=False), at=12_000)
    assert types(events)[:4] == ["NodeDrained", "PodEvicted", "PodEvicted", "PodEvicted"]


def test_grace_and_budget_together_count_the_pods_being_evicted() -> None:
    """A pod in its grace period counts against the budget: with budget 1, one at a time."""
    fold = rack(budget=1)
    events = fold.run(DrainNode("a", grace_ms=5_000), at=10_000)
    assert types(events) == ["NodeCordoned", "PodEvictionScheduled", "EvictionBlocked", "EvictionBlocked"]
    events = fold.run(Tick(), at=16_000)  # p1 evicted at 15 s, runs on b: the budget frees, p2 goes at 20 s
    assert types(events) == ["PodEvicted", "PodScheduled", "PodEvictionScheduled", "Ticked"]
    assert (events[2].occurred_at, events[2].payload.at) == (15_000, 20_000)


def test_failures_ignore_budgets_but_count() -> None:
    """A node failure evicts everything though the budget is 0; while they wait, a drain elsewhere is blocked."""
    fold = Fold()
    fold.run_all(SetPolicy("first-fit"), AddNode("a", 8000, 32768, "A100", 2), AddNode("c", 8000, 32768, "A100", 1))
    for pod_id in ("p1", "p2", "p3"):
        fold.run(SubmitPod(pod_id, tenant="t", num_gpu=1, gpu_milli=1000, cpu_milli=100))
    fold.run(SetDisruptionBudget("t-budget", tenant="t", max_unavailable=1))
    events = fold.run(MarkNodeFailed("a"))
    assert types(events).count("PodEvicted") == 2  # no budget check for a failure
    assert types(fold.run(DrainNode("c"))) == ["NodeCordoned", "EvictionBlocked"]


def test_a_gang_counts_as_all_its_members_when_an_eviction_would_requeue_it() -> None:
    """A 3-member gang (all needed) under a budget of 2 per gang: evicting one member would stop all three, so the
    drain is blocked."""
    fold = Fold()
    fold.run_all(SetPolicy("first-fit"), AddNode("a", 8000, 32768, "A100", 4), AddNode("b", 8000, 32768, "A100", 4))
    members = tuple(GangMember(f"m{i}", 1, 1000, 100) for i in range(3))
    fold.run(SubmitGang("g", members=members))
    fold.run(SetDisruptionBudget("per-gang", gang_id="g", max_unavailable=2))
    node = fold.placement("m0")
    events = fold.run(DrainNode(node))  # type: ignore[arg-type]
    assert "EvictionBlocked" in types(events) and "PodEvicted" not in types(events)


def test_uncordon_cancels_a_waiting_drain() -> None:
    """Uncordon during the grace period: the scheduled evictions do not happen."""
    fold = rack(budget=None)
    fold.run(DrainNode("a", grace_ms=30_000), at=10_000)
    fold.run(UncordonNode("a"), at=11_000)
    assert fold.cluster.draining == {}
    assert types(fold.run(Tick(), at=50_000)) == ["Ticked"]
    assert fold.placement("p1") == "a"


def test_a_waiting_drain_survives_a_snapshot() -> None:
    """Restored mid-drain (blocked and scheduled pods), the drain goes on as in the original."""
    fold = rack(budget=1)
    fold.run(DrainNode("a", grace_ms=5_000), at=10_000)
    restored = Fold(from_snapshot(to_snapshot(fold.state)), count=fold.count)
    assert clusters_hash(restored.state) == clusters_hash(fold.state)
    a, b = fold.run(Tick(), at=30_000), restored.run(Tick(), at=30_000)
    assert [e.payload for e in a] == [e.payload for e in b]
    assert "NodeDrained" in types(a) and all(fold.placement(p) == "b" for p in ("p1", "p2", "p3"))


def test_budget_commands_are_checked() -> None:
    """A negative max_unavailable is INVALID_COMMAND; removing an unknown budget is UNKNOWN_BUDGET."""
    fold = Fold()
    (rejected,) = fold.run(SetDisruptionBudget("b", max_unavailable=-1))
    assert rejected.type_name == "CommandRejected"
    (rejected,) = fold.run(RemoveDisruptionBudget("nope"))
    assert rejected.payload.code == "UNKNOWN_BUDGET"


def test_a_noexecute_taint_evicts_through_the_budgets_like_a_drain() -> None:
    """UpdateNode with a NoExecute taint under a budget of 0: nothing is evicted (EvictionBlocked, reason
    node_updated), the node is not drained; raising the budget lets them go, without a command about the node."""
    fold = rack(budget=0)
    events = fold.run(UpdateNode("a", taints=(Taint("maint", "", "NoExecute"),)))
    assert types(events) == ["NodeUpdated"] + ["EvictionBlocked"] * 3
    assert {e.payload.reason for e in events[1:]} == {"node_updated"}
    assert fold.cluster.draining == {}
    events = fold.run(SetDisruptionBudget("t-budget", tenant="t", max_unavailable=1))
    assert types(events) == ["DisruptionBudgetSet"] + ["PodEvicted", "PodScheduled"] * 3
    assert all(fold.placement(p) == "b" for p in ("p1", "p2", "p3"))


def test_removing_the_last_budget_evicts_what_a_taint_kept_waiting() -> None:
    """With no budget left, the pods a NoExecute taint blocked are evicted in that command."""
    fold = rack(budget=0)
    fold.run(UpdateNode("a", taints=(Taint("maint", "", "NoExecute"),)))
    events = fold.run(RemoveDisruptionBudget("t-budget"))
    assert types(events).count("PodEvicted") == 3
    assert fold.cluster.blocked == {}


def test_a_pod_evicted_and_placed_again_in_a_command_is_preempted_at_the_next() -> None:
    """One command evicts a pod once: p1, evicted by a drain's deadline and placed again on n0 in the command that
    submits p0 (priority 1, all of n0's GPUs), cannot be p0's victim in it. p0 waits, and the node is checked
    again at the cluster's next command, where p0 preempts p1 (found by the property tests: p0 waited forever)."""
    fold = Fold()
    fold.run_all(SetPolicy("first-fit"), AddNode("n2", 4000, 8192, "A100", 1))
    fold.run(SubmitPod("p1", tenant="t", num_gpu=1, gpu_milli=100, cpu_milli=100))
    fold.run(AddNode("n0", 4000, 8192, "A100", 2))
    fold.run(DrainNode("n2", grace_ms=2_000), at=10_000)
    events = fold.run(SubmitPod("p0", priority=1, num_gpu=2, gpu_milli=1000, cpu_milli=100), at=13_000)
    assert types(events) == ["PodEvicted", "NodeDrained", "PodScheduled", "PodQueued"]
    assert fold.placement("p1") == "n0" and fold.placement("p0") is None
    restored = from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(fold.state))))
    assert (13_000, PREEMPT_CHECK, "n0") in restored.clusters["c0"].timers.heap  # a snapshot keeps the check
    events = fold.run(Tick(), at=13_000)  # the next command, even at the same time
    assert types(events)[:3] == ["PodPreempted", "PodEvicted", "PodScheduled"]
    assert fold.placement("p0") == "n0" and fold.placement("p1") is None
