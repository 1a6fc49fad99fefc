"""Issue #24: gangs and tenants with the semantics Kueue and Volcano users rely on (contract v4).

Each test here was written against a scenario that went wrong before its fix: a gang under quota that
waited forever, members beyond ``min_members`` dropped, a lender's gang that could not reclaim on a full
cluster, a requeued gang timed out at once, dependants bound to a dead incarnation or left waiting.
"""

from __future__ import annotations

from processor.core.fold import decide
from processor.core.state import GANG_RETRYING, GANG_RUNNING
from schemas.codes import QueueReasonCode
from schemas.commands import (
    AddNode,
    GangMember,
    MarkNodeFailed,
    QuotaPreemption,
    Release,
    Retry,
    SetPolicy,
    SetQuota,
    SubmitGang,
    SubmitPod,
    Tick,
    V3Command,
)
from schemas.events import Event
from tests.strategies import Fold, types


def cluster(nodes: int = 2, size: int = 4, model: str = "A100") -> Fold:
    fold = Fold()
    fold.run(SetPolicy("first-fit", reserve_after_ms=-1))
    for i in range(nodes):
        fold.run(AddNode(f"{model.lower()}-{i}", 64_000, 262_144, model, size))
    return fold


def gpus(pod_id: str, tenant: str = "default", count: int = 1, priority: int = 0, **fields: object) -> SubmitPod:
    return SubmitPod(pod_id, tenant, priority, count, 1000, 1000, 1024, **fields)  # type: ignore[arg-type]


def members(gang_id: str, count: int, gpus: int) -> tuple[GangMember, ...]:
    return tuple(GangMember(f"{gang_id}-{i}", gpus, 1000, 1000, 1024) for i in range(count))


def of(events: list[Event], name: str) -> list[Event]:
    return [event for event in events if event.type_name == name]


def running(fold: Fold, tenant: str) -> int:
    return sum(p.spec.num_gpu for p in fold.cluster.pods.values() if p.running and p.spec.tenant == tenant)


# ---------------------------------------------------------------- elastic gangs under quota


def test_a_gang_starts_min_members_within_its_quota_and_the_rest_wait_as_members() -> None:
    """Quota 4 GPUs, a gang of 4 x 2 GPUs with min_members 2: two start (partial admission), two wait queued as
    members of the running gang, saying why (the quota); the whole gang is not held back."""
    fold = cluster()
    fold.run(SetQuota("a", nominal_gpus={"A100": 4}))
    events = fold.run(SubmitGang("g", "a", members=members("g", 4, 2), min_members=2))
    scheduled = of(events, "GangScheduled")
    assert len(scheduled) == 1 and len(scheduled[0].payload.members) == 2
    assert running(fold, "a") == 4
    queued = of(events, "PodQueued")
    assert sorted(e.payload.pod.pod_id for e in queued) == ["g-2", "g-3"]
    for event in queued:
        codes = [reason.code for reason in event.payload.reasons]
        assert codes[0] == QueueReasonCode.GANG_MEMBER_WAITING and QueueReasonCode.QUOTA_EXCEEDED in codes
        assert event.payload.pod.gang_id == "g"
    assert fold.cluster.gangs["g"].state == GANG_RUNNING


def test_members_beyond_min_members_start_when_capacity_comes_and_the_gang_ends_ok_when_all_completed() -> None:
    fold = cluster(nodes=1)
    fold.run(gpus("x", count=2))
    events = fold.run(SubmitGang("g", members=members("g", 2, 2), min_members=1))
    assert len(of(events, "GangScheduled")[0].payload.members) == 1
    (waiting,) = of(events, "PodQueued")
    assert waiting.payload.pod.pod_id == "g-1"
    assert waiting.payload.reasons[0].code == QueueReasonCode.GANG_MEMBER_WAITING
    events = fold.run(Release("x"))
    started = of(events, "PodScheduled")
    assert [e.payload.pod.pod_id for e in started] == ["g-1"] and started[0].payload.from_queue
    assert set(fold.cluster.gangs["g"].placed) == {"g-0", "g-1"}
    fold.run(Release("g-0"))
    events = fold.run(Release("g-1"))
    (released,) = of(events, "GangReleased")
    assert released.payload.ok


def test_a_gang_whose_members_never_all_ran_does_not_end_ok() -> None:
    """The running members complete while one still waits: the waiting member is withdrawn and GangReleased.ok is
    false (README: ok only if every member completed)."""
    fold = cluster(nodes=1)
    fold.run(gpus("x", count=2))
    fold.run(SubmitGang("g", members=members("g", 2, 2), min_members=1))
    events = fold.run(Release("g-0"))
    assert types(events) == ["PodReleased", "PodReleased", "GangReleased"]
    assert events[1].payload.pod_id == "g-1" and events[1].payload.reason == "gang_ended"
    assert not events[2].payload.ok
    assert "g" not in fold.cluster.gangs and "g-1" not in fold.cluster.pods


def test_a_requeued_elastic_gang_takes_its_waiting_members_back() -> None:
    """Below min_members after a node failure the gang goes back to the queue whole: its waiting members stop
    being pods of their own (no member is queued twice)."""
    fold = cluster(nodes=2, size=2)
    fold.run(gpus("x", count=2))
    fold.run(SubmitGang("g", members=members("g", 2, 2), min_members=1))
    node = fold.placement("g-0")
    events = fold.run(MarkNodeFailed(node))  # type: ignore[arg-type]
    assert "GangQueued" in types(events)
    assert not any(pod.spec.gang_id == "g" for pod in fold.cluster.pods.values())
    events = fold.run(Release("x"))
    assert len(of(events, "GangScheduled")[0].payload.members) == 1


def test_a_waiting_member_does_not_start_while_its_gang_loses_its_members() -> None:
    """Quota a = 2 GPUs: g starts 2 of 3 members on a100-0, g-2 waits for quota. a100-0 fails: x (priority 5) is
    placed back first and preempts y on a100-1, whose retry of the queue sees a's quota free again. g-2 must not
    start there while g's evicted members are on their way back to the queue (the fold stopped with 'gang
    requeued while member runs': mixed stream seed 1469); g goes back whole and starts again, g-2 waits again."""
    fold = cluster(nodes=2, size=4)
    fold.run(SetQuota("a", nominal_gpus={"A100": 2}))
    fold.run(gpus("x", tenant="b", priority=5))
    fold.run(gpus("y", tenant="c", count=4))
    fold.run(SubmitGang("g", "a", members=members("g", 3, 1), min_members=2))
    assert fold.placement("g-0") == fold.placement("g-1") == fold.placement("x") == "a100-0"
    events = fold.run(MarkNodeFailed("a100-0"))
    assert [e.payload.pod_id for e in of(events, "PodPreempted")] == ["y"]
    assert [e.payload.pod.pod_id for e in of(events, "PodScheduled")] == ["x", "g-0", "g-1"]
    assert [e.payload.pod.pod_id for e in of(events, "PodQueued")] == ["y", "g-2"]
    gang = fold.cluster.gangs["g"]
    assert gang.state == GANG_RUNNING and set(gang.placed) == {"g-0", "g-1"}
    assert fold.cluster.pods["g-2"].queued


def test_a_member_left_out_for_its_quota_on_one_model_starts_on_another_at_once() -> None:
    """Best fit tries g-0 (2 GPUs) on the V100 node, which t's quota (A100 only) does not allow: the gang starts with
    g-1 within the quota and g-0, left to wait, starts on the A100 node in the same command."""
    fold = Fold()
    fold.run(SetPolicy("best-fit", reserve_after_ms=-1))
    fold.run(AddNode("a100", 32_000, 65_536, "A100", 4))
    fold.run(AddNode("v100", 32_000, 65_536, "V100", 2))
    fold.run(SetQuota("t", nominal_gpus={"A100": 4}))
    gang = (GangMember("g-0", 2, 1000, 1000, 0), GangMember("g-1", 1, 1000, 1000, 0))
    events = fold.run(SubmitGang("g", "t", members=gang, min_members=1))
    assert [e.payload.pod.pod_id for e in of(events, "PodScheduled")] == ["g-1", "g-0"]
    assert fold.placement("g-0") == fold.placement("g-1") == "a100"


def test_a_waiting_member_takes_only_free_capacity() -> None:
    """g (priority 5) starts one of its two members; g-1 waits and does not preempt x (priority 0) when the queue
    is retried (Volcano: only a job below its minimum preempts); it starts when x ends."""
    fold = cluster(nodes=1, size=4)
    fold.run(gpus("x", count=2))
    fold.run(SubmitPod("s", "default", 0, 0, 0, 1000, 1024))
    events = fold.run(SubmitGang("g", priority=5, members=members("g", 2, 2), min_members=1))
    assert len(of(events, "GangScheduled")[0].payload.members) == 1 and "PodPreempted" not in types(events)
    events = fold.run(Release("s"))  # capacity changed: the queue is retried
    assert "PodPreempted" not in types(events) and fold.placement("x") is not None
    events = fold.run(Release("x"))
    assert [e.payload.pod.pod_id for e in of(events, "PodScheduled")] == ["g-1"]


# ---------------------------------------------------------------- reclaim


def test_a_gang_inside_its_quota_reclaims_from_borrowers_on_a_full_cluster() -> None:
    """b borrowed a's whole quota and filled the cluster; a's gang (inside a's nominal) takes it back like a pod
    would, from b's youngest pods, and no more than it needs."""
    fold = cluster(nodes=2, size=4)
    fold.run(SetQuota("a", cohort="lab", nominal_gpus={"A100": 4}))
    fold.run(SetQuota("b", cohort="lab", nominal_gpus={"A100": 4}))
    for i in range(8):
        fold.run(gpus(f"b{i}", "b"), at=60_000 * (i + 1))
    events = fold.run(SubmitGang("g", "a", members=members("g", 2, 2)), at=60_000 * 20)
    preempted = [e.payload for e in of(events, "PodPreempted")]
    assert {p.reason for p in preempted} == {"reclaim"} and len(preempted) == 4
    assert {p.pod_id for p in preempted} <= {f"b{i}" for i in range(8)}
    assert len(of(events, "GangScheduled")) == 1
    assert running(fold, "a") == 4 and running(fold, "b") == 4


def test_a_gang_that_would_borrow_does_not_reclaim() -> None:
    fold = cluster(nodes=2, size=4)
    fold.run(SetQuota("a", cohort="lab", nominal_gpus={"A100": 2}))
    fold.run(SetQuota("b", cohort="lab", nominal_gpus={"A100": 6}))
    for i in range(8):
        fold.run(gpus(f"b{i}", "b"))
    events = fold.run(SubmitGang("g", "a", members=members("g", 2, 2)))
    assert types(events) == ["GangQueued"]


# ---------------------------------------------------------------- time


def test_a_gang_timeout_counts_from_each_requeue() -> None:
    """A gang that started, then lost its node an hour later, waits its whole timeout again before it times out."""
    fold = Fold()
    fold.run(AddNode("n0", 64_000, 262_144, "A100", 8), at=0)
    fold.run(SubmitGang("g", members=members("g", 1, 8), timeout_ms=10_000), at=1_000)
    events = fold.run(MarkNodeFailed("n0"), at=3_600_000)
    assert "GangQueued" in types(events) and "GangTimedOut" not in types(events)
    assert "GangTimedOut" not in types(fold.run(Tick(), at=3_605_000))
    events = fold.run(Tick(), at=3_611_000)
    (timed_out,) = of(events, "GangTimedOut")
    assert timed_out.payload.waited_ms == 10_000


# ---------------------------------------------------------------- dependencies end


def test_a_dependency_binds_to_the_live_incarnation_of_a_reused_id() -> None:
    fold = cluster(nodes=1)
    fold.run(gpus("x"))
    fold.run(Release("x", "failed"))
    fold.run(gpus("x"))  # the id again: a new incarnation, running
    events = fold.run(gpus("y", depends_on=("x",)))
    assert types(events) == ["PodQueued"] and events[0].payload.waiting_for == ("x",)
    events = fold.run(Release("x"))
    assert [e.payload.pod.pod_id for e in of(events, "PodScheduled")] == ["y"]


def test_dependants_of_a_timed_out_gangs_member_end() -> None:
    fold = Fold()
    fold.run(AddNode("n0", 64_000, 262_144, "A100", 8), at=0)
    fold.run(SubmitGang("g", members=members("g", 2, 8), timeout_ms=5_000), at=1_000)
    fold.run(gpus("y", depends_on=("g-0",)), at=2_000)
    events = fold.run(Tick(), at=10_000)
    assert "GangTimedOut" in types(events)
    failed = of(events, "DependencyFailed")
    assert [(e.payload.holder_id, e.payload.dependency_id) for e in failed] == [("y", "g-0")]
    assert "y" not in fold.cluster.pods


# ---------------------------------------------------------------- admission


def test_a_gang_submitted_before_any_node_queues_like_a_pod() -> None:
    """One rule: with no node yet nothing is judged by shape (pods and gangs queue NO_NODES and start when
    nodes come); once nodes exist, a job no node present could hold is refused."""
    fold = Fold()
    events = fold.run(SubmitGang("g", members=members("g", 2, 4)))
    assert types(events) == ["GangQueued"] and events[0].payload.reasons[0].code == QueueReasonCode.NO_NODES
    events = fold.run(gpus("p", count=4))
    assert events[0].payload.reasons[0].code == QueueReasonCode.NO_NODES
    events = fold.run(AddNode("n0", 64_000, 262_144, "A100", 8))
    assert "GangScheduled" in types(events)


def test_with_nodes_a_job_no_node_present_could_hold_is_refused_and_an_accepted_one_waits() -> None:
    """The same rule for pods and gangs once the cluster has nodes: a new H100 job with no H100 node is refused
    (UNKNOWN_GPU_MODEL), a gang no node could hold is refused (NEVER_FITS); an H100 pod accepted before its node
    went waits for one."""
    fold = Fold()
    fold.run(AddNode("a0", 64_000, 262_144, "A100", 8))
    fold.run(AddNode("h0", 64_000, 262_144, "H100", 8))
    fold.run(gpus("busy", count=8, gpu_models=("H100",)))
    fold.run(gpus("queued", count=8, gpu_models=("H100",)))
    from schemas.commands import RemoveNode

    fold.run(Release("busy"))
    fold.run(RemoveNode("h0", force=True))
    assert fold.cluster.pods["queued"].node_id is None
    (refused,) = fold.run(gpus("new", count=1, gpu_models=("H100",)))
    assert refused.type_name == "CommandRejected" and refused.payload.code == "UNKNOWN_GPU_MODEL"
    gang = SubmitGang("g", members=(GangMember("g-0", 16, 1000),))
    (refused,) = fold.run(gang)
    assert refused.payload.code == "NEVER_FITS"


# ---------------------------------------------------------------- preemptible and SetQuota.preemption


def test_a_pod_that_is_not_preemptible_is_never_a_victim_of_priority_preemption() -> None:
    fold = cluster(nodes=2, size=4)
    fold.run(gpus("keep", count=4, preemptible=False))
    fold.run(gpus("take", count=4))
    events = fold.run(gpus("high", count=4, priority=10))
    assert [e.payload.pod_id for e in of(events, "PodPreempted")] == ["take"]
    events = fold.run(gpus("higher", count=4, priority=10))
    assert types(events) == ["PodQueued"] and fold.placement("keep") is not None


def test_a_pod_that_is_not_preemptible_does_not_hide_a_victim_on_another_node() -> None:
    """The search takes the lowest priority level it could free first: a pod that may not go (priority 0 on
    a100-0) is no level at all, so p (priority 3) preempts q (priority 1) on a100-1 (the search found nothing
    when it counted the pod that may not go as level 0)."""
    fold = cluster(nodes=2, size=1)
    fold.run(gpus("kept", preemptible=False))
    fold.run(gpus("q", priority=1))
    events = fold.run(gpus("p", priority=3))
    assert [e.payload.pod_id for e in of(events, "PodPreempted")] == ["q"]
    assert fold.placement("p") == "a100-1" and fold.placement("kept") == "a100-0"


def test_a_gang_that_is_not_preemptible_is_never_a_victim() -> None:
    fold = cluster(nodes=1, size=4)
    fold.run(SubmitGang("g", members=members("g", 2, 2), preemptible=False))
    events = fold.run(gpus("high", count=2, priority=10))
    assert "PodPreempted" not in types(events)


def test_a_borrower_that_is_not_preemptible_is_not_reclaimed() -> None:
    fold = cluster(nodes=2, size=4)
    fold.run(SetQuota("a", cohort="lab", nominal_gpus={"A100": 4}))
    fold.run(SetQuota("b", cohort="lab", nominal_gpus={"A100": 4}))
    for i in range(8):
        fold.run(gpus(f"b{i}", "b", preemptible=i < 6), at=60_000 * (i + 1))
    events = fold.run(gpus("a0", "a", 3), at=60_000 * 20)
    preempted = {e.payload.pod_id for e in of(events, "PodPreempted")}
    assert len(preempted) == 3 and not preempted & {"b6", "b7"}  # the youngest, b6 and b7, may not be taken
    assert fold.placement("a0") is not None


def test_reclaim_within_cohort_never_lower_priority_and_any() -> None:
    """b borrows a's quota with priority-5 pods: a priority-3 lender reclaims under any, not under lower_priority
    (nor never); a priority-10 lender reclaims under lower_priority."""
    for policy, priority, expected in (
        ("never", 10, set()),
        ("lower_priority", 3, set()),
        ("lower_priority", 10, {"b6", "b7"}),
        ("any", 3, {"b6", "b7"}),
    ):
        fold = cluster(nodes=2, size=4)
        preemption = QuotaPreemption(reclaim_within_cohort=policy)
        fold.run(SetQuota("a", cohort="lab", nominal_gpus={"A100": 4}, preemption=preemption))
        fold.run(SetQuota("b", cohort="lab", nominal_gpus={"A100": 4}))
        for i in range(8):
            fold.run(gpus(f"b{i}", "b", priority=5), at=60_000 * (i + 1))
        events = fold.run(gpus("a0", "a", 2, priority=priority), at=60_000 * 20)
        assert {e.payload.pod_id for e in of(events, "PodPreempted")} == expected, policy
        assert ("PodScheduled" in types(events)) == bool(expected), policy


def test_within_tenant_lower_priority_preempts_the_tenants_own_work_when_its_quota_is_full() -> None:
    fold = cluster(nodes=2, size=4)
    fold.run(SetQuota("a", nominal_gpus={"A100": 4}))
    fold.run(gpus("low", "a", 4))
    (queued,) = fold.run(gpus("high", "a", 4, priority=5))
    assert queued.type_name == "PodQueued"  # default never: it waits
    fold.run(Release("high"))
    fold.run(SetQuota("a", nominal_gpus={"A100": 4}, preemption=QuotaPreemption(within_tenant="lower_priority")))
    events = fold.run(gpus("high", "a", 4, priority=5))
    (preempted,) = of(events, "PodPreempted")
    assert preempted.payload.pod_id == "low" and preempted.payload.reason == "within_tenant"
    assert fold.placement("high") is not None and running(fold, "a") == 4


def test_within_tenant_lower_or_newer_equal_priority_takes_newer_work_of_equal_priority() -> None:
    """old (4 GPUs) waits for capacity while new (2 GPUs, same priority, submitted later) starts; when capacity
    comes, old's quota is full with new: lower_priority leaves old waiting, lower_or_newer_equal_priority takes
    new for it."""
    for policy, taken in (("lower_priority", False), ("lower_or_newer_equal_priority", True)):
        fold = cluster(nodes=1, size=4)
        fold.run(SetQuota("a", nominal_gpus={"A100": 4}, preemption=QuotaPreemption(within_tenant=policy)))
        fold.run(gpus("blocker", "other", 2, preemptible=False))
        fold.run(gpus("old", "a", 4))
        fold.run(gpus("new", "a", 2))
        events = fold.run(Release("blocker"))
        assert ({e.payload.pod_id for e in of(events, "PodPreempted")} == {"new"}) is taken, policy
        assert (fold.placement("old") is not None) is taken, policy


def test_borrow_within_cohort_lets_a_borrower_take_peers_lower_priority_pods_inside_their_nominal() -> None:
    """b runs inside its nominal, and the pool has nothing left for a to borrow: by default (Kueue's rule) a waits;
    with borrow_within_cohort lower_priority and a ceiling, a takes b's pods of priority at most the ceiling."""
    for policy, ceiling, expected in (
        ("never", None, set()),
        ("lower_priority", 1, {"b0"}),
        ("lower_priority", 0, set()),
    ):
        fold = cluster(nodes=1, size=4)
        preemption = QuotaPreemption(borrow_within_cohort=policy, borrow_max_victim_priority=ceiling)
        fold.run(SetQuota("a", cohort="lab", nominal_gpus={"A100": 0}, preemption=preemption))
        fold.run(SetQuota("b", cohort="lab", nominal_gpus={"A100": 4}))
        fold.run(gpus("b0", "b", 2, priority=1))
        fold.run(gpus("b1", "b", 2, priority=3))
        events = fold.run(gpus("a0", "a", 2, priority=5))
        assert {e.payload.pod_id for e in of(events, "PodPreempted")} == expected, (policy, ceiling)
        for event in of(events, "PodPreempted"):
            assert event.payload.reason == "borrow_within_cohort"
        # b0 goes back to the queue: inside b's nominal, but it does not reclaim from a0, which took it by
        # borrow_within_cohort with a higher priority (else the two would evict each other in turn)
        assert (fold.placement("a0") is not None) == bool(expected)


def test_bad_quota_preemption_values_are_rejected() -> None:
    fold = cluster()
    for preemption in (
        QuotaPreemption(within_tenant="always"),
        QuotaPreemption(reclaim_within_cohort="lower"),
        QuotaPreemption(borrow_within_cohort="any"),
    ):
        (event,) = fold.run(SetQuota("a", nominal_gpus={"A100": 1}, preemption=preemption))
        assert event.type_name == "CommandRejected" and event.payload.code == "INVALID_COMMAND"


def test_explain_names_a_waiting_member_of_a_running_gang() -> None:
    from processor.core.explain import explain

    fold = cluster(nodes=1)
    fold.run(gpus("x", count=2))
    fold.run(SubmitGang("g", members=members("g", 2, 2), min_members=1))
    found = explain(fold.cluster, "g-1", 10_000)
    assert found is not None and found.state == "pending"
    assert found.reasons[0]["code"] == QueueReasonCode.GANG_MEMBER_WAITING
    assert "runs 1 of 2 members" in found.message and found.gang is not None
    running = explain(fold.cluster, "g-0", 10_000)
    assert running is not None and running.state == "running"


def test_preemption_lower_or_newer_equal_priority_takes_newer_work_of_the_same_priority() -> None:
    """old (4 GPUs, priority 3) waits behind a pod that may not be preempted while new (2 GPUs, priority 3) starts;
    when the blocker ends, old takes new's place under lower_or_newer_equal_priority, not under lower_priority;
    new, being newer, never takes old's back."""
    for mode, taken in (("lower_priority", False), ("lower_or_newer_equal_priority", True)):
        fold = cluster(nodes=1, size=4)
        fold.run(gpus("blocker", count=2, preemptible=False))
        fold.run(gpus("old", count=4, priority=3, preemption=mode))
        fold.run(gpus("new", count=2, priority=3, preemption=mode))
        events = fold.run(Release("blocker"))
        assert ({e.payload.pod_id for e in of(events, "PodPreempted")} == {"new"}) is taken, mode
        assert (fold.placement("old") is not None) is taken, mode
        if taken:
            assert fold.placement("new") is None
            assert "PodPreempted" not in types(fold.run(Tick()))


def test_lower_or_newer_equal_priority_prefers_lower_work_and_finds_newer_work_on_any_node() -> None:
    """A pod that may take newer work of its priority waits while the only such work is older (the first node);
    once a newer pod runs on the second node and a blocker there ends, it takes that pod, past the first node.
    And lower-priority work goes before newer work of its own priority (a lower victim level wins)."""
    mode = "lower_or_newer_equal_priority"
    fold = cluster(nodes=2, size=4)
    fold.run(gpus("old", count=4, priority=3))
    fold.run(gpus("blocker", count=2, preemptible=False))
    assert types(fold.run(gpus("waits", count=4, priority=3, preemption=mode))) == ["PodQueued"]
    assert types(fold.run(gpus("newer", count=2, priority=3))) == ["PodScheduled"]
    events = fold.run(Release("blocker"))
    assert {e.payload.pod_id for e in of(events, "PodPreempted")} == {"newer"}
    assert fold.placement("waits") is not None
    assert fold.placement("old") is not None and fold.placement("newer") is None
    fold = cluster(nodes=2, size=4)
    fold.run(gpus("low", count=4, priority=1))
    fold.run(gpus("same", count=4, priority=3))
    events = fold.run(gpus("p", count=4, priority=3, preemption=mode))
    assert {e.payload.pod_id for e in of(events, "PodPreempted")} == {"low"}


def test_a_tenant_of_weight_0_gets_capacity_only_when_no_one_else_wants_it() -> None:
    """Fair share with weight 0 (contract v4): freed capacity goes to every weighted tenant's waiting pods first,
    however little they run, then to the weight-0 tenant's, older though they are."""
    fold = cluster(nodes=1, size=4)
    fold.run(SetQuota("spare", weight=0))
    fold.run(SetQuota("main", weight=1))
    fold.run(gpus("big", "main", 4))
    fold.run(gpus("s0", "spare", 1))  # waits first
    fold.run(gpus("m0", "main", 1))
    events = fold.run(Release("big"))
    assert [e.payload.pod.pod_id for e in of(events, "PodScheduled")] == ["m0", "s0"]
    (event,) = fold.run(SetQuota("x", weight=0))
    assert event.type_name == "QuotaChanged"


# ---------------------------------------------------------------- contract v3 logs keep v3's rules


def v3(fold: Fold, payload: object, at: int | None = None) -> list[Event]:
    """A command as a client of contract v3 wrote it (its frame decodes to ``V3Command``)."""
    fold.count += 1
    issued_at = 1000 * fold.count if at is None else at
    return decide(fold.state, V3Command(f"cmd-{fold.count}", fold.cluster_name, issued_at, payload))  # type: ignore[arg-type]


def test_a_v3_gang_under_quota_starts_whole_or_waits_and_drops_members_beyond_min() -> None:
    """Contract v3 had no partial admission under a quota and dropped the members beyond min_members that did not
    fit: a v3 log replays so."""
    fold = cluster()
    v3(fold, SetQuota("a", nominal_gpus={"A100": 4}))
    events = v3(fold, SubmitGang("g", "a", members=members("g", 4, 2), min_members=2))
    assert types(events) == ["GangQueued"]
    fold = cluster(nodes=1)
    v3(fold, gpus("x", count=2))
    events = v3(fold, SubmitGang("g", members=members("g", 2, 2), min_members=1))
    assert "PodQueued" not in types(events) and "g-1" not in fold.cluster.pods


def test_a_v3_gang_timeout_counts_from_its_submission() -> None:
    """v3 timed a requeued gang out at once if it had been submitted longer ago than its timeout."""
    fold = Fold()
    v3(fold, AddNode("n0", 64_000, 262_144, "A100", 8), at=0)
    v3(fold, SubmitGang("g", members=members("g", 1, 8), timeout_ms=10_000), at=1_000)
    assert fold.cluster.gangs["g"].state == GANG_RUNNING
    events = v3(fold, MarkNodeFailed("n0"), at=3_600_000)
    assert "GangTimedOut" in types(events)


def test_v3_refuses_what_it_did_not_know() -> None:
    """weight 0, lower_or_newer_equal_priority and a gang before any node: refused under v3, as v3 did."""
    fold = Fold()
    (event,) = v3(fold, SubmitGang("g", members=members("g", 2, 4)))
    assert event.type_name == "CommandRejected"
    fold = cluster()
    (event,) = v3(fold, SetQuota("a", weight=0))
    assert event.type_name == "CommandRejected"
    (event,) = v3(fold, gpus("p", preemption="lower_or_newer_equal_priority"))
    assert event.type_name == "CommandRejected" and event.payload.code == "INVALID_COMMAND"
    (event,) = v3(fold, SubmitGang("g", members=members("g", 1, 1), preemption="lower_or_newer_equal_priority"))
    assert event.type_name == "CommandRejected" and event.payload.code == "INVALID_COMMAND"
    (event,) = fold.run(gpus("p", preemption="lower_or_newer_equal_priority"))
    assert event.type_name == "PodScheduled"


def test_an_elastic_gang_waiting_for_its_retry_takes_its_waiting_members_along() -> None:
    """g starts 2 of its 3 members (one node of 2 GPUs), g-2 waits; g-0 fails and takes the gang (min_members 2):
    g-2 stops being a pod while the gang waits for its retry (no member outside a running gang), and at the retry
    the gang starts 2 members again, g-2 waiting again as its member."""
    fold = Fold()
    fold.run(AddNode("n0", 64_000, 262_144, "A100", 2), at=0)
    submit = SubmitGang(
        "g", members=members("g", 3, 1), min_members=2, timeout_ms=30_000, retry=Retry(1, 10_000, 10_000)
    )
    fold.run(submit, at=1_000)
    assert fold.cluster.pods["g-2"].queued
    events = fold.run(Release("g-0", "failed"), at=100_000)
    assert types(events)[-1] == "PodRetryScheduled"
    assert fold.cluster.gangs["g"].state == GANG_RETRYING and "g-2" not in fold.cluster.pods
    events = fold.run(Tick(), at=110_000)
    assert types(events)[:4] == ["GangScheduled", "PodScheduled", "PodScheduled", "PodQueued"]
    assert fold.cluster.pods["g-2"].queued and fold.cluster.gangs["g"].state == GANG_RUNNING


def test_a_gangs_timeout_counts_from_its_retry() -> None:
    """Submitted at 1 s with timeout_ms 30 s, g runs, fails at 100 s and is retried at 110 s when a pod holds its
    node: it waits, and times out 30 s after its retry, not at once."""
    fold = Fold()
    fold.run(AddNode("n0", 64_000, 262_144, "A100", 2), at=0)
    fold.run(SubmitGang("g", members=members("g", 2, 1), timeout_ms=30_000, retry=Retry(1, 10_000)), at=1_000)
    fold.run(Release("g-0", "failed"), at=100_000)
    fold.run(gpus("x", count=2), at=101_000)
    events = fold.run(Tick(), at=110_000)
    assert "GangQueued" in types(events) and "GangTimedOut" not in types(events)
    assert "GangTimedOut" not in types(fold.run(Tick(), at=139_000))
    (timed_out,) = of(fold.run(Tick(), at=141_000), "GangTimedOut")
    assert timed_out.payload.waited_ms == 30_000


# ---------------------------------------------------------------- SubmitGang.disruption


def elastic(disruption: str) -> Fold:
    """One node of 4 GPUs full with gang g (4 x 1 GPU, min_members 2, priority 0)."""
    fold = cluster(nodes=1, size=4)
    fold.run(SubmitGang("g", members=members("g", 4, 1), min_members=2, disruption=disruption))
    assert len(fold.cluster.gangs["g"].placed) == 4
    return fold


def test_above_min_lets_a_preemptor_take_members_above_min_members_one_by_one() -> None:
    """disruption above_min: a 1-GPU preemptor takes one member, which waits as a member; the gang runs on with 3.
    A second takes one more. A third finds the gang at min_members: it takes the whole gang, which goes back to the
    queue with its waiting members."""
    fold = elastic("above_min")
    events = fold.run(gpus("p1", priority=5))
    assert [e.payload.pod_id for e in of(events, "PodPreempted")] == ["g-0"]
    assert "above_min" in of(events, "PodPreempted")[0].payload.message
    assert "PodReleased" not in types(events)
    (waiting,) = of(events, "PodQueued")
    assert waiting.payload.pod.pod_id == "g-0" and waiting.payload.reasons[0].code == "GANG_MEMBER_WAITING"
    assert fold.cluster.gangs["g"].state == GANG_RUNNING and len(fold.cluster.gangs["g"].placed) == 3
    events = fold.run(gpus("p2", priority=5))
    assert [e.payload.pod_id for e in of(events, "PodPreempted")] == ["g-1"]
    events = fold.run(gpus("p3", priority=5))
    assert [e.payload.pod_id for e in of(events, "PodPreempted")] == ["g-2", "g-3"]
    assert "GangQueued" in types(events) and fold.placement("p3") is not None


def test_above_min_never_takes_more_members_alone_than_the_gang_can_spare() -> None:
    """3 GPUs wanted, 2 members to spare: not three members alone (the gang would fall below min_members) but the
    whole gang; 2 GPUs wanted: two members alone."""
    fold = elastic("above_min")
    events = fold.run(gpus("p", priority=5, count=3))
    assert len(of(events, "PodPreempted")) == 4 and "GangQueued" in types(events)
    fold = elastic("above_min")
    events = fold.run(gpus("p", priority=5, count=2))
    assert [e.payload.pod_id for e in of(events, "PodPreempted")] == ["g-0", "g-1"]
    assert fold.cluster.gangs["g"].state == GANG_RUNNING and set(fold.cluster.gangs["g"].placed) == {"g-2", "g-3"}


def test_disruption_all_is_the_default_a_victim_member_takes_its_whole_gang() -> None:
    fold = elastic("all")
    events = fold.run(gpus("p", priority=5))
    assert len(of(events, "PodPreempted")) == 4 and "GangQueued" in types(events)
    (event,) = fold.run(SubmitGang("h", members=members("h", 1, 1), disruption="some"))
    assert event.type_name == "CommandRejected" and event.payload.code == "INVALID_COMMAND"


def test_a_gang_preemptor_that_needs_more_than_the_spare_members_takes_the_whole_gang() -> None:
    """A gang of 2 x 2 GPUs (priority 5) on g's node: its first member could take the two spare members alone, its
    second then takes the rest with the gang; no member is taken twice, g goes back to the queue, and every
    PodPreempted says the whole gang goes."""
    fold = elastic("above_min")
    events = fold.run(SubmitGang("big", priority=5, members=members("big", 2, 2)))
    preempted = of(events, "PodPreempted")
    assert [e.payload.pod_id for e in preempted] == ["g-0", "g-1", "g-2", "g-3"]
    assert all("whole gang 'g'" in e.payload.message for e in preempted)
    assert fold.cluster.gangs["g"].state != GANG_RUNNING and fold.cluster.gangs["big"].state == GANG_RUNNING
