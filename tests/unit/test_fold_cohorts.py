"""The cohort tree (SetCohort, contract v4): scenarios after Kueue's hierarchical cohort tests (borrowing from a
parent, lending and borrowing limits at a level, reclaim across the tree), refusals, removal and snapshots."""

from __future__ import annotations

from processor.core import cohort_tree
from processor.core.explain import explain
from processor.core.snapshot import from_snapshot, state_hash, to_snapshot
from schemas.codes import QueueReasonCode, RejectionCode
from schemas.commands import AddNode, Release, RemoveCohort, SetCohort, SetPolicy, SetQuota, SubmitPod
from schemas.snapshots import decode_snapshot, encode_snapshot
from tests.strategies import Fold, types


def gpus(pod_id: str, tenant: str, count: int = 1, priority: int = 0) -> SubmitPod:
    return SubmitPod(pod_id, tenant, priority, count, 1000, 1000, 1024)


def cluster(nodes: int = 4, size: int = 4) -> Fold:
    fold = Fold()
    fold.run(SetPolicy("first-fit", reserve_after_ms=-1))
    for i in range(nodes):
        fold.run(AddNode(f"a100-{i}", 64_000, 262_144, "A100", size))
    return fold


def running(fold: Fold, tenant: str) -> int:
    return sum(p.spec.num_gpu for p in fold.cluster.pods.values() if p.running and p.spec.tenant == tenant)


def rejection(events: list) -> str:
    (event,) = events
    assert event.type_name == "CommandRejected"
    return event.payload.code


def test_a_tenant_borrows_its_parent_cohorts_own_quota() -> None:
    """Kueue: a ClusterQueue with no quota of its own admits on the quota of a cohort above it."""
    fold = cluster()
    events = fold.run(SetCohort("org", nominal_gpus={"A100": 6}))
    assert types(events) == ["CohortChanged"] and events[0].payload.spec.nominal_gpus == {"A100": 6}
    fold.run(SetCohort("team", parent="org"))
    fold.run(SetQuota("a", cohort="team", nominal_gpus={"A100": 0}))
    results = [types(fold.run(gpus(f"p{i}", "a", 2)))[0] for i in range(4)]
    assert results == ["PodScheduled"] * 3 + ["PodQueued"]
    assert running(fold, "a") == 6
    (queued,) = fold.run(gpus("p9", "a"))
    (reason,) = queued.payload.reasons
    assert reason.code == QueueReasonCode.QUOTA_EXCEEDED
    assert "cohort 'org' (level 2 of the tree above cohort 'team')" in reason.message


def test_borrowing_goes_first_to_the_own_cohort_then_up() -> None:
    """Two teams under one root: a's team pool (b's lending) is used first, then the root's own quota; the
    tenants' total never passes what the tree holds."""
    fold = cluster()
    fold.run(SetCohort("org", nominal_gpus={"A100": 2}))
    fold.run(SetCohort("team", parent="org"))
    fold.run(SetQuota("a", cohort="team", nominal_gpus={"A100": 2}))
    fold.run(SetQuota("b", cohort="team", nominal_gpus={"A100": 2}))
    for i in range(7):
        fold.run(gpus(f"p{i}", "a"))
    assert running(fold, "a") == 6  # 2 own + 2 from b + 2 from the root
    team, org = fold.cluster.pools[("team", "gpu:A100")], fold.cluster.pools[("org", "gpu:A100")]
    assert (team.lent, team.in_use) == (4000, 6000)  # team's subtree quota 4, used 6: 2 of them borrowed above
    assert (org.lent, org.in_use) == (6000, 6000)  # the root: its own 2 plus team's 4, all in use
    events = fold.run(gpus("b0", "b"))  # within b's nominal quota, which a borrowed: b reclaims one of a's pods
    assert types(events).count("PodPreempted") == 1 and fold.cluster.pods["b0"].running
    assert running(fold, "a") == 5


def test_a_lending_limit_at_a_cohort_keeps_part_of_its_subtree_quota() -> None:
    """Kueue's lendingLimit on a cohort: a sibling subtree borrows at most that much of it."""
    fold = cluster()
    fold.run(SetCohort("left", parent="org", lending_limit_gpus=1))
    fold.run(SetCohort("right", parent="org"))
    fold.run(SetQuota("a", cohort="left", nominal_gpus={"A100": 4}))
    fold.run(SetQuota("b", cohort="right", nominal_gpus={"A100": 0}))
    results = [types(fold.run(gpus(f"b{i}", "b")))[0] for i in range(3)]
    assert results == ["PodScheduled", "PodQueued", "PodQueued"]
    assert running(fold, "b") == 1
    # a keeps the other 3 for itself, and can still use all of its 4
    assert [types(fold.run(gpus(f"a{i}", "a")))[0] for i in range(3)] == ["PodScheduled"] * 3


def test_a_borrowing_limit_at_a_cohort_caps_its_whole_subtree() -> None:
    """Kueue's borrowingLimit on a cohort: its subtree uses at most its quota plus that much from the parent,
    whatever its tenants' own limits say."""
    fold = cluster()
    fold.run(SetCohort("org", nominal_gpus={"A100": 8}))
    fold.run(SetCohort("team", parent="org", borrowing_limit_gpus=3))
    fold.run(SetQuota("a", cohort="team", nominal_gpus={"A100": 1}))
    fold.run(SetQuota("b", cohort="team", nominal_gpus={"A100": 1}))
    for i in range(4):
        fold.run(gpus(f"a{i}", "a"))
    assert running(fold, "a") == 4  # 1 own, 1 of b's, 2 of the 3 team may borrow
    assert types(fold.run(gpus("b0", "b")))[0] == "PodScheduled"  # b's own, within team's 2 + 3
    (queued,) = fold.run(gpus("a9", "a"))
    assert queued.type_name == "PodQueued"
    assert "its subtree's quota plus its borrowing limit" in queued.payload.reasons[0].message


def test_a_lender_reclaims_from_a_borrower_in_another_branch_of_the_tree() -> None:
    """Kueue: reclaim within the cohort tree. b (under right) borrowed a's quota (under left) through the
    root; a asks within its nominal quota and b's pods are preempted, no more than needed."""
    fold = cluster(nodes=1, size=4)
    fold.run(SetCohort("left", parent="org"))
    fold.run(SetCohort("right", parent="org"))
    fold.run(SetQuota("a", cohort="left", nominal_gpus={"A100": 3}))
    fold.run(SetQuota("b", cohort="right", nominal_gpus={"A100": 1}))
    for i in range(4):
        fold.run(gpus(f"b{i}", "b"))
    assert running(fold, "b") == 4
    events = fold.run(gpus("a0", "a", 2))
    assert types(events).count("PodPreempted") == 2
    assert fold.cluster.pods["a0"].running and running(fold, "b") == 2


def test_cycles_and_too_deep_trees_are_refused() -> None:
    fold = cluster(nodes=1)
    assert rejection(fold.run(SetCohort("x", parent="x"))) == RejectionCode.COHORT_CYCLE
    fold.run(SetCohort("b", parent="a"))
    fold.run(SetCohort("c", parent="b"))
    events = fold.run(SetCohort("a", parent="c"))
    assert rejection(events) == RejectionCode.COHORT_CYCLE
    assert "a -> b -> c" in events[0].payload.message or "cycle" in events[0].payload.message
    for depth in range(3, 8):  # a <- b <- c <- d3 ... <- d7: 8 cohorts from the root down
        assert types(fold.run(SetCohort(f"d{depth}", parent="c" if depth == 3 else f"d{depth - 1}"))) == [
            "CohortChanged"
        ]
    assert rejection(fold.run(SetCohort("d8", parent="d7"))) == RejectionCode.COHORT_TOO_DEEP
    assert types(fold.run(SetCohort("top", nominal_gpus={"A100": 1}))) == ["CohortChanged"]
    assert rejection(fold.run(SetCohort("a", parent="top"))) == RejectionCode.COHORT_TOO_DEEP


def test_remove_cohort_refuses_a_parent_and_leaves_its_tenants_in_a_flat_cohort() -> None:
    fold = cluster()
    assert rejection(fold.run(RemoveCohort("nope"))) == RejectionCode.UNKNOWN_COHORT
    fold.run(SetCohort("org", nominal_gpus={"A100": 4}))
    fold.run(SetCohort("team", parent="org"))
    fold.run(SetQuota("a", cohort="team", nominal_gpus={"A100": 1}))
    assert rejection(fold.run(RemoveCohort("org"))) == RejectionCode.COHORT_IN_USE
    fold.run_all(gpus("p0", "a", 3))
    events = fold.run(RemoveCohort("team"))
    assert types(events) == ["CohortChanged"] and events[0].payload.spec is None
    assert "stay in it as a flat cohort" in events[0].payload.message
    assert fold.cluster.pods["p0"].running  # nothing is evicted
    (queued,) = fold.run(gpus("p1", "a"))
    assert queued.type_name == "PodQueued"  # team no longer borrows org's quota
    assert types(fold.run(RemoveCohort("org"))) == ["CohortChanged"]
    assert fold.cluster.cohort_specs == {}


def test_a_snapshot_keeps_the_tree_and_its_pools() -> None:
    fold = cluster()
    assert rejection(fold.run(SetCohort("org", lending_limit_gpus=2))) == RejectionCode.INVALID_COMMAND
    fold.run(SetCohort("org", nominal_gpus={"A100": 4}))
    fold.run(SetCohort("team", parent="org", borrowing_limit_gpus=2, nominal_gpus={"A100": 1}))
    fold.run(SetQuota("a", cohort="team", nominal_gpus={"A100": 1}))
    fold.run_all(gpus("p0", "a", 2), gpus("p1", "a", 2))
    restored = from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(fold.state))))
    assert state_hash(restored) == state_hash(fold.state)
    cluster_ = restored.clusters[fold.cluster.name]
    assert cluster_.cohort_specs == fold.cluster.cohort_specs
    assert cluster_.pools == fold.cluster.pools
    fold.run(Release("p0"))
    assert fold.cluster.pools == cohort_tree.build_pools(
        fold.cluster.cohort_specs, fold.cluster.cohorts, fold.cluster.quotas, fold.cluster.usage
    )


def test_reclaim_takes_only_borrowers_whose_eviction_frees_the_level_that_has_no_room() -> None:
    """d borrows c's quota inside cohort right, which lends nothing up (lending limit 0): evicting d frees nothing
    at the root, where a's request has no room. Only b, which borrows a's quota through the root, is reclaimed,
    though d comes first in reclaim's order (lower priority)."""
    fold = cluster(nodes=1, size=4)
    fold.run(SetCohort("left", parent="org"))
    fold.run(SetCohort("mid", parent="org"))
    fold.run(SetCohort("right", parent="org", lending_limit_gpus=0))
    fold.run(SetQuota("a", cohort="left", nominal_gpus={"A100": 2}))
    fold.run(SetQuota("b", cohort="mid", nominal_gpus={"A100": 0}))
    fold.run(SetQuota("c", cohort="right", nominal_gpus={"A100": 2}))
    fold.run(SetQuota("d", cohort="right", nominal_gpus={"A100": 0}))
    fold.run_all(gpus("d0", "d", 2, priority=0), gpus("b0", "b", 2, priority=1))
    assert running(fold, "d") == 2 and running(fold, "b") == 2
    events = fold.run(gpus("a0", "a", 2, priority=2))
    preempted = [event.payload.pod_id for event in events if event.type_name == "PodPreempted"]
    assert preempted == ["b0"]
    assert fold.cluster.pods["a0"].running and fold.cluster.pods["d0"].running


def test_explain_names_the_cohort_and_level_a_pod_waits_on() -> None:
    """A pod refused by a cohort above its own: explain's QUOTA_EXCEEDED names that cohort and its level, and
    offers raising that cohort's quota."""
    fold = cluster()
    fold.run(SetCohort("org", nominal_gpus={"A100": 1}))
    fold.run(SetCohort("team", parent="org"))
    fold.run(SetQuota("a", cohort="team", nominal_gpus={"A100": 0}))
    fold.run_all(gpus("p0", "a"), gpus("p1", "a"))
    found = explain(fold.cluster, "p1")
    assert found is not None
    (reason,) = [r for r in found.reasons if r["code"] == QueueReasonCode.QUOTA_EXCEEDED]
    assert (reason["cohort"], reason["level"]) == ("org", 2)
    assert "cohort 'org' (level 2 of the tree above cohort 'team')" in reason["message"]
    assert {"raise_quota", "raise_cohort_quota"} <= {r["change"] for r in found.would_fit_if}
