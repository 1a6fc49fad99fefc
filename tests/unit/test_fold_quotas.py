"""Quotas: nominal limits per GPU model, cohorts with borrowing and lending, reclaim, defaults, fair share."""

from __future__ import annotations

import pytest

from processor.core.quotas import dominant_share
from processor.core.snapshot import from_snapshot, state_hash, to_snapshot
from schemas.codes import QueueReasonCode, RejectionCode
from schemas.commands import (
    AddNode,
    GangMember,
    Quota,
    Release,
    RemoveQuota,
    SetPolicy,
    SetQuota,
    SubmitGang,
    SubmitPod,
)
from schemas.events import Event
from schemas.snapshots import decode_snapshot, encode_snapshot
from tests.strategies import Fold, types


def gpus(pod_id: str, tenant: str, count: int = 1, priority: int = 0, **fields: object) -> SubmitPod:
    return SubmitPod(pod_id, tenant, priority, count, 1000, 1000, 1024, **fields)  # type: ignore[arg-type]


def cluster(nodes: int = 2, size: int = 4, model: str = "A100") -> Fold:
    fold = Fold()
    fold.run(SetPolicy("first-fit", reserve_after_ms=-1))
    for i in range(nodes):
        fold.run(AddNode(f"{model.lower()}-{i}", 64_000, 262_144, model, size))
    return fold


def of(events: list[Event], name: str) -> list[Event]:
    return [event for event in events if event.type_name == name]


def running(fold: Fold, tenant: str) -> int:
    return sum(p.spec.num_gpu for p in fold.cluster.pods.values() if p.running and p.spec.tenant == tenant)


def test_a_tenant_never_runs_more_than_its_nominal_quota_without_a_cohort() -> None:
    """Pods beyond the quota wait with QUOTA_EXCEEDED, whose message gives the usage and the limit."""
    fold = cluster()
    fold.run(SetQuota("a", nominal_gpus={"A100": 3}))
    assert [types(fold.run(gpus(f"p{i}", "a")))[0] for i in range(4)] == ["PodScheduled"] * 3 + ["PodQueued"]
    (event,) = fold.run(gpus("p4", "a"))
    (quota_reason,) = event.payload.reasons
    assert quota_reason.code == QueueReasonCode.QUOTA_EXCEEDED
    assert "runs 3 A100 GPU(s) of its quota of 3 A100 GPU(s); this needs 1 A100 GPU(s) more" in quota_reason.message
    assert fold.cluster.pods["p3"].queued and running(fold, "a") == 3


def test_a_release_frees_quota_and_the_tenants_next_pod_starts_on_any_node() -> None:
    """The freed quota is used on another node than the released pod's (quota, not capacity, held it back)."""
    fold = cluster(nodes=2, size=2)
    fold.run(SetQuota("a", nominal_gpus={"A100": 2}))
    fold.run_all(gpus("p0", "a"), gpus("p1", "a"), gpus("p2", "a", 1))
    fold.run(gpus("other", "b", 2))  # fills node a100-1... first-fit: a100-1 has the 2 free GPUs
    events = fold.run(Release("p0"))
    assert types(events) == ["PodReleased", "PodScheduled"]
    assert events[1].payload.pod.pod_id == "p2"


def test_models_not_named_count_under_star() -> None:
    """A quota naming only A100 leaves 0 GPUs of other models ('*' not given); '*' gives them a pool."""
    fold = Fold()
    fold.run(AddNode("v", 64_000, 262_144, "V100", 4))
    fold.run(SetQuota("a", nominal_gpus={"A100": 4}))
    (event,) = fold.run(gpus("p0", "a"))
    assert event.type_name == "PodQueued"
    assert "GPU(s) of models its quota does not name" in event.payload.reasons[0].message
    events = fold.run(SetQuota("a", nominal_gpus={"A100": 4, "*": 1}))
    assert types(events) == ["QuotaChanged", "PodScheduled"]


def test_a_pod_that_allows_several_models_runs_where_its_quota_has_room() -> None:
    """Quota full on A100, room on V100: the pod goes to V100 and is never over quota."""
    fold = Fold()
    fold.run(AddNode("a", 64_000, 262_144, "A100", 4))
    fold.run(AddNode("v", 64_000, 262_144, "V100", 4))
    fold.run(SetQuota("t", nominal_gpus={"A100": 1, "V100": 2}))
    fold.run(gpus("first", "t", gpu_models=("A100",)))
    (event,) = fold.run(gpus("second", "t"))
    assert (event.type_name, event.payload.node_id) == ("PodScheduled", "v")


def test_cohort_members_borrow_unused_quota_up_to_their_borrowing_limit() -> None:
    """Tenant b has 2 nominal and may borrow 3 more from a's unused quota: its sixth GPU waits."""
    fold = cluster(nodes=2, size=4)
    fold.run(SetQuota("a", cohort="lab", nominal_gpus={"A100": 6}))
    fold.run(SetQuota("b", cohort="lab", nominal_gpus={"A100": 2}, borrowing_limit_gpus=3))
    outcomes = [types(fold.run(gpus(f"b{i}", "b")))[0] for i in range(6)]
    assert outcomes == ["PodScheduled"] * 5 + ["PodQueued"]
    (event,) = fold.run(gpus("b6", "b"))
    assert "plus the 3 A100 GPU(s) it may borrow in cohort 'lab'" in event.payload.reasons[0].message


def test_a_lending_limit_keeps_part_of_the_quota_for_its_tenant() -> None:
    """a lends at most 1 of its 4 GPUs: b (nominal 1) borrows 1, not more."""
    fold = cluster(nodes=2, size=4)
    fold.run(SetQuota("a", cohort="lab", nominal_gpus={"A100": 4}, lending_limit_gpus=1))
    fold.run(SetQuota("b", cohort="lab", nominal_gpus={"A100": 1}))
    outcomes = [types(fold.run(gpus(f"b{i}", "b")))[0] for i in range(3)]
    assert outcomes == ["PodScheduled", "PodScheduled", "PodQueued"]


def test_a_lender_reclaims_its_quota_within_the_command_that_asks_for_it() -> None:
    """b borrowed all of a's quota; a asks for 3 GPUs: b's youngest lowest-priority pods go, exactly 3 GPUs' worth."""
    fold = cluster(nodes=2, size=4)
    fold.run(SetQuota("a", cohort="lab", nominal_gpus={"A100": 4}))
    fold.run(SetQuota("b", cohort="lab", nominal_gpus={"A100": 4}))
    for i in range(8):
        fold.run(gpus(f"b{i}", "b", priority=1 if i < 2 else 0), at=60_000 * (i + 1))
    events = fold.run(gpus("a0", "a", 3), at=60_000 * 20)
    preempted = [e.payload for e in of(events, "PodPreempted")]
    assert [p.pod_id for p in preempted] == ["b5", "b6", "b7"]  # priority 0, youngest first, and no more
    assert {p.reason for p in preempted} == {"reclaim"} and {p.by for p in preempted} == {"a0"}
    scheduled = of(events, "PodScheduled")[0].payload
    assert scheduled.pod.pod_id == "a0" and scheduled.preempted == ("b5", "b6", "b7")
    assert running(fold, "a") == 3 and running(fold, "b") == 5


def test_a_tenant_asking_beyond_its_nominal_does_not_reclaim() -> None:
    """Borrowing is not reclaiming: a borrower finds the cohort full and waits; nobody is evicted."""
    fold = cluster(nodes=2, size=4)
    fold.run(SetQuota("a", cohort="lab", nominal_gpus={"A100": 4}))
    fold.run(SetQuota("b", cohort="lab", nominal_gpus={"A100": 4}))
    for i in range(8):
        fold.run(gpus(f"a{i}", "a"))
    assert running(fold, "a") == 8
    fold.run(Release("a0"))
    (event,) = [e for e in fold.run(gpus("x", "a", 2)) if e.type_name != "PodReleased"]
    assert event.type_name == "PodQueued" and running(fold, "a") == 7


def test_lowering_a_quota_below_usage_evicts_nothing_and_new_work_waits() -> None:
    """SetQuota under what the tenant runs: its pods keep running, the message says so, new pods wait."""
    fold = cluster()
    for i in range(4):
        fold.run(gpus(f"p{i}", "a"))
    (event,) = fold.run(SetQuota("a", nominal_gpus={"A100": 2}))
    assert event.type_name == "QuotaChanged" and "nothing is evicted" in event.payload.message
    assert running(fold, "a") == 4
    assert types(fold.run(gpus("p4", "a"))) == ["PodQueued"]
    fold.run_all(Release("p0"), Release("p1"))
    assert fold.cluster.pods["p4"].queued  # 2 still run: at the quota
    assert types(fold.run(Release("p2"))) == ["PodReleased", "PodScheduled"]
    assert fold.cluster.pods["p4"].running


def test_the_default_quota_applies_to_tenants_without_their_own() -> None:
    """SetPolicy default_quota limits every tenant without a SetQuota; a quota that limits nothing clears it."""
    fold = cluster()
    events = fold.run(SetPolicy(default_quota=Quota(nominal_gpus={"A100": 1})))
    assert types(events) == ["PolicyChanged", "QuotaChanged"] and events[1].payload.tenant is None
    assert [types(fold.run(gpus(f"p{i}", "anyone")))[0] for i in range(2)] == ["PodScheduled", "PodQueued"]
    fold.run(SetQuota("vip", nominal_gpus={"A100": 3}))
    assert [types(fold.run(gpus(f"v{i}", "vip")))[0] for i in range(3)] == ["PodScheduled"] * 3
    events = fold.run(SetPolicy(default_quota=Quota()))
    assert fold.cluster.default_quota is None
    assert types(events) == ["PolicyChanged", "QuotaChanged", "PodScheduled"]


def test_remove_quota_falls_back_to_the_default() -> None:
    fold = cluster()
    fold.run(SetQuota("a", nominal_gpus={"A100": 1}))
    fold.run_all(gpus("p0", "a"), gpus("p1", "a"))
    events = fold.run(RemoveQuota("a"))
    assert types(events) == ["QuotaChanged", "PodScheduled"]
    assert events[0].payload.quota is None and "falls back to the default quota" in events[0].payload.message
    (rejected,) = fold.run(RemoveQuota("a"))
    assert rejected.payload.code == RejectionCode.UNKNOWN_QUOTA


@pytest.mark.parametrize(
    ("quota", "code"),
    [
        (SetQuota("a", nominal_gpus={"A100": -1}), RejectionCode.INVALID_RESOURCES),
        (SetQuota("a", nominal_gpus={"A100": 10**12}), RejectionCode.INVALID_RESOURCES),
        (SetQuota("a", nominal_cpu_milli=-5), RejectionCode.INVALID_RESOURCES),
        (SetQuota("a", weight=-1), RejectionCode.INVALID_RESOURCES),
        (SetQuota("a", nominal_gpus={"bad model": 1}), RejectionCode.UNKNOWN_GPU_MODEL),
        (SetQuota("a", borrowing_limit_gpus=2), RejectionCode.INVALID_COMMAND),
        (SetQuota("a", cohort="no spaces"), RejectionCode.INVALID_COMMAND),
        (SetQuota("a b"), RejectionCode.INVALID_COMMAND),
        (SetPolicy(default_quota=Quota(cohort="lab")), RejectionCode.INVALID_COMMAND),
    ],
    ids=[
        "negative",
        "absurd",
        "negative-cpu",
        "weight-0",
        "bad-model",
        "limit-without-cohort",
        "bad-cohort",
        "bad-tenant",
        "default-with-cohort",
    ],
)
def test_bad_quotas_are_rejected_with_a_code(quota: object, code: str) -> None:
    """Negative, absurd or meaningless quotas are refused; nothing changes."""
    fold = cluster()
    (event,) = fold.run(quota)  # type: ignore[arg-type]
    assert (event.type_name, event.payload.code) == ("CommandRejected", code)
    assert not fold.cluster.quotas and fold.cluster.default_quota is None


def test_a_new_cohort_is_created_by_naming_it() -> None:
    (event,) = cluster().run(SetQuota("a", cohort="lab", nominal_gpus={"A100": 1}))
    assert "cohort 'lab' is new" in event.payload.message


def test_capacity_freed_goes_first_to_the_tenant_with_the_lowest_weighted_dominant_share() -> None:
    """Equal priorities: a (weight 1, 2 GPUs running) waits behind b (weight 2, 2 GPUs running) and c (none)."""
    fold = cluster(nodes=1, size=8)
    for tenant, weight in (("a", 1), ("b", 2), ("c", 1)):
        fold.run(SetQuota(tenant, weight=weight))
    fold.run_all(gpus("a0", "a", 2), gpus("b0", "b", 2), gpus("x", "x", 4))
    fold.run_all(gpus("a1", "a", 2), gpus("b1", "b", 2), gpus("c1", "c", 2))  # all wait: the node is full
    events = fold.run(Release("x"))
    assert [e.payload.pod.pod_id for e in of(events, "PodScheduled")] == ["c1", "b1"]
    assert dominant_share(fold.cluster, "b") == pytest.approx(4 / 8 / 2)


def test_a_gang_is_held_to_its_tenants_quota() -> None:
    """A gang that would take its tenant over quota waits with QUOTA_EXCEEDED and holds nothing."""
    fold = cluster(nodes=2, size=4)
    fold.run(SetQuota("a", nominal_gpus={"A100": 4}))
    members = tuple(GangMember(f"g-{i}", 4, 1000, 1000) for i in range(2))
    (event,) = fold.run(SubmitGang("g", "a", members=members))
    assert event.type_name == "GangQueued" and event.payload.reasons[0].code == QueueReasonCode.QUOTA_EXCEEDED


def test_quotas_survive_a_snapshot() -> None:
    fold = cluster()
    fold.run(SetQuota("a", cohort="lab", nominal_gpus={"A100": 2, "*": 1}, weight=3))
    fold.run(SetPolicy(default_quota=Quota(nominal_gpus={"*": 1})))
    fold.run(gpus("p", "a"))
    restored = from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(fold.state))))
    assert state_hash(restored) == state_hash(fold.state)
    assert restored.clusters["c0"].quotas == fold.cluster.quotas
    assert restored.clusters["c0"].cohorts == {"lab": ["a"]}
    assert restored.clusters["c0"].default_quota == fold.cluster.default_quota


def test_a_gangs_quota_floor_counts_its_smallest_members_and_gpus_only_under_one_key() -> None:
    """``demand_floor``: the ``count`` smallest amounts on each key; GPUs only when every model present is counted
    under one key (a member could land on a model the quota does not limit)."""
    from processor.core.quotas import demand_floor
    from schemas.events import PodSpec

    fold = cluster(nodes=1)
    fold.run(SetQuota("a", nominal_gpus={"A100": 8}, nominal_cpu_milli=64_000))
    quota = fold.cluster.quotas["a"]
    members = [
        PodSpec(f"m{i}", "a", 0, gpus, 1000, cpu, 1024, (), {}, (), 0, i)
        for i, (gpus, cpu) in enumerate(((4, 1000), (1, 9000), (2, 5000)))
    ]
    assert demand_floor(fold.cluster, quota, members, 2) == {"gpu:A100": 3000, "cpu": 6000}
    fold.run(AddNode("h100-0", 64_000, 262_144, "H100", 8))  # not named by the quota: counted elsewhere
    assert demand_floor(fold.cluster, quota, members, 2) == {"cpu": 6000}


def test_a_queued_gang_its_cohort_pool_cannot_hold_stays_queued_through_a_cascade() -> None:
    """A preempting gang of a tenant with no nominal quota, borrowing from a pool smaller than its smallest
    admissible set, is skipped by the queue's retry (``quota_rules_out``) and stays queued with its reason; a gang
    the pool can hold starts once room is freed."""
    from processor.core.decision import Decision
    from processor.core.handlers.gangs import quota_rules_out
    from schemas.commands import Command, Tick

    fold = cluster(nodes=2, size=4)
    fold.run(SetQuota("lender", cohort="lab", nominal_gpus={"A100": 2}))
    fold.run(SetQuota("b", cohort="lab", nominal_gpus={"A100": 0}))
    members = tuple(GangMember(f"big-{i}", 2, 1000, 1000, 1024) for i in range(2))
    (queued,) = fold.run(SubmitGang("big", "b", 10, members))
    assert queued.type_name == "GangQueued"
    assert queued.payload.reasons[0].code == QueueReasonCode.QUOTA_EXCEEDED
    spec = fold.cluster.gangs["big"].spec
    probe = Decision(fold.state, Command("probe", fold.cluster.name, fold.state.clock, Tick()), 0)
    assert quota_rules_out(probe, fold.cluster, spec)  # 4 GPUs wanted, the pool lends 2: no eviction helps
    small = tuple(GangMember(f"small-{i}", 1, 1000, 1000, 1024) for i in range(2))
    assert types(fold.run(SubmitGang("small", "b", 10, small)))[0] == "GangScheduled"
    assert fold.cluster.gangs["big"].state == "queued"
