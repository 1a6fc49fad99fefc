"""Issue #24: ``SubmitGang.min_members_per_role`` with a ``role`` on each member (Volcano's ``minTaskMember``).

A gang starts (also partially, under capacity or its quota) only with ``min_members`` and each role's minimum;
a running gang that loses members keeps running only while it keeps both; a preemptor may take members of a
``disruption: above_min`` gang alone only while their role stays at its minimum too.
"""

from __future__ import annotations

from processor.core.explain import explain
from processor.core.state import GANG_QUEUED, GANG_RUNNING
from schemas.codes import QueueReasonCode, RejectionCode
from schemas.commands import AddNode, GangMember, MarkNodeFailed, Release, SetPolicy, SetQuota, SubmitGang, SubmitPod
from schemas.events import Event
from tests.strategies import Fold, types


def cluster(nodes: int = 1, size: int = 4) -> Fold:
    fold = Fold()
    fold.run(SetPolicy("first-fit", reserve_after_ms=-1))
    for i in range(nodes):
        fold.run(AddNode(f"n{i}", 64_000, 262_144, "A100", size))
    return fold


def member(pod_id: str, role: str | None, gpus: int = 1) -> GangMember:
    return GangMember(pod_id, gpus, 1000, 1000, 1024, role=role)


def gpus(pod_id: str, count: int = 1, priority: int = 0) -> SubmitPod:
    return SubmitPod(pod_id, "default", priority, count, 1000, 1000, 1024)


def of(events: list[Event], name: str) -> list[Event]:
    return [event for event in events if event.type_name == name]


def started(events: list[Event]) -> list[str]:
    (scheduled,) = of(events, "GangScheduled")
    return sorted(m.pod_id for m in scheduled.payload.members)


# ---------------------------------------------------------------- admission


def test_a_gang_starts_with_each_roles_minimum_not_just_min_members() -> None:
    """3 GPUs free, a ps and four workers of 1 GPU, min_members 3 and 3 workers: the workers a role needs are
    placed first, so the three that start are workers (by size and id alone, the ps would have taken a GPU and
    only two workers would run); the ps and the fourth worker wait as members, naming their role."""
    fold = cluster()
    fold.run(gpus("x"))
    gang = SubmitGang(
        "g",
        members=(member("g-a", "ps"), *(member(f"g-w{i}", "worker") for i in range(4))),
        min_members=3,
        min_members_per_role={"worker": 3},
    )
    events = fold.run(gang)
    assert started(events) == ["g-w0", "g-w1", "g-w2"]
    waiting = {e.payload.pod.pod_id: e.payload.reasons[0] for e in of(events, "PodQueued")}
    assert sorted(waiting) == ["g-a", "g-w3"]
    assert waiting["g-a"].code == QueueReasonCode.GANG_MEMBER_WAITING and "role 'ps'" in waiting["g-a"].message
    assert of(events, "GangScheduled")[0].payload.gang.min_members_per_role == {"worker": 3}


def test_a_gang_whose_role_is_short_waits_though_min_members_fit_and_says_which_role() -> None:
    """2 GPUs free: two ps members fit (min_members 2), but the two 2-GPU workers the gang needs do not: it waits,
    and its reason and explain name the role that is short; once room comes, both workers start."""
    fold = cluster()
    fold.run(gpus("x", count=2))
    gang = SubmitGang(
        "g",
        members=(member("g-a", "ps"), member("g-b", "ps"), member("g-w0", "worker", 2), member("g-w1", "worker", 2)),
        min_members=2,
        min_members_per_role={"worker": 2},
    )
    events = fold.run(gang)
    assert types(events)[-1] == "GangQueued" and "GangScheduled" not in types(events)
    reason = events[-1].payload.reasons[0]
    assert reason.code == QueueReasonCode.GANG_DOES_NOT_FIT and "role 'worker' needs 2, 1 fit" in reason.message
    found = explain(fold.cluster, "g", 10_000)
    assert found is not None and found.gang is not None and found.gang["min_members_per_role"] == {"worker": 2}
    assert any("2 of role 'worker' at once" in r["message"] for r in found.reasons), found.reasons
    events = fold.run(Release("x"))
    assert started(events) == ["g-w0", "g-w1"]


def test_without_roles_the_same_gang_starts_its_members_by_size_and_id() -> None:
    """The default (no min_members_per_role, no role) is today's rule: the ps (first by id) and two workers."""
    fold = cluster()
    fold.run(gpus("x"))
    gang = SubmitGang("g", members=(member("g-a", None), *(member(f"g-w{i}", None) for i in range(4))), min_members=3)
    assert started(fold.run(gang)) == ["g-a", "g-w0", "g-w1"]


def test_partial_admission_under_quota_keeps_each_roles_minimum() -> None:
    """Quota 6 GPUs; a 4-GPU ps and three 1-GPU workers (7 GPUs), min_members 2, one ps and one worker needed.
    Partial admission leaves the largest members out first, but not the ps its role needs: a worker waits."""
    fold = cluster(nodes=2)
    fold.run(SetQuota("a", nominal_gpus={"A100": 6}))
    gang = SubmitGang(
        "g",
        "a",
        members=(member("g-p0", "ps", 4), *(member(f"g-w{i}", "worker") for i in range(3))),
        min_members=2,
        min_members_per_role={"ps": 1, "worker": 1},
    )
    events = fold.run(gang)
    assert started(events) == ["g-p0", "g-w0", "g-w1"]
    (queued,) = of(events, "PodQueued")
    assert queued.payload.pod.pod_id == "g-w2"
    assert QueueReasonCode.QUOTA_EXCEEDED in [r.code for r in queued.payload.reasons]


def test_a_gang_whose_roles_do_not_fit_its_quota_waits_and_its_reason_names_the_roles() -> None:
    """Quota 2 GPUs: two 1-GPU ps members would fit it (min_members 2), but the 2-GPU worker its role needs and a
    ps do not: the gang waits with QUOTA_EXCEEDED, naming the roles it needs."""
    fold = cluster(nodes=2)
    fold.run(SetQuota("a", nominal_gpus={"A100": 2}))
    gang = SubmitGang(
        "g",
        "a",
        members=(member("g-a", "ps"), member("g-b", "ps"), member("g-w", "worker", 2)),
        min_members=2,
        min_members_per_role={"worker": 1},
    )
    events = fold.run(gang)
    assert types(events)[-1] == "GangQueued"
    (reason,) = events[-1].payload.reasons
    assert reason.code == QueueReasonCode.QUOTA_EXCEEDED
    assert "at least 2 member(s) with 1 of role 'worker' within its quota" in reason.message
    gang.min_members_per_role = {}
    gang.gang_id, gang.members = "h", (member("h-0", None), member("h-1", None), member("h-w", None, 2))
    assert "GangScheduled" in types(fold.run(gang))  # without roles: the two 1-GPU members start


# ---------------------------------------------------------------- validation


def test_bad_role_minimums_are_refused_with_clear_messages() -> None:
    fold = cluster()
    two = (member("g-a", "ps"), member("g-b", "worker"), member("g-c", "worker"))
    cases = [
        ({"chief": 1}, None, "no member of gang 'g' has"),
        ({"worker": 3}, None, "between 0 and the 2 member(s) of role 'worker'"),
        ({"worker": -1}, None, "between 0 and the 2 member(s) of role 'worker'"),
        ({"worker": 2, "ps": 1}, 2, "sum to 3, more than its min_members 2"),
    ]
    for minimums, min_members, words in cases:
        (event,) = fold.run(SubmitGang("g", members=two, min_members=min_members, min_members_per_role=minimums))
        assert event.type_name == "CommandRejected" and event.payload.code == RejectionCode.INVALID_COMMAND
        assert words in event.payload.message, event.payload.message
    (event,) = fold.run(SubmitGang("g", members=(member("g-a", ""),)))
    assert event.type_name == "CommandRejected" and event.payload.code == RejectionCode.INVALID_COMMAND
    accepted = fold.run(SubmitGang("g", members=two, min_members_per_role={"worker": 2, "ps": 0}))
    assert "GangScheduled" in types(accepted)
    assert accepted[0].payload.gang.min_members_per_role == {"worker": 2}  # a minimum of 0 asks for nothing


# ---------------------------------------------------------------- a running gang losing members


def test_a_failure_that_leaves_min_members_but_not_a_roles_minimum_takes_the_whole_gang() -> None:
    """Two nodes of 2 GPUs; workers g-a, g-b land on n0 (placed first: their role needs both), ps g-c, g-d on n1.
    n0 fails: two members still run (min_members 2) but no worker: the gang goes back whole and starts again
    with its workers on n1."""
    fold = cluster(nodes=2, size=2)
    gang = SubmitGang(
        "g",
        members=(member("g-c", "ps"), member("g-d", "ps"), member("g-a", "worker"), member("g-b", "worker")),
        min_members=2,
        min_members_per_role={"worker": 2},
    )
    fold.run(gang)
    assert fold.placement("g-a") == fold.placement("g-b") == "n0"
    events = fold.run(MarkNodeFailed("n0"))
    assert "GangQueued" in types(events)
    assert started(events) == ["g-a", "g-b"] and fold.placement("g-a") == "n1"
    assert fold.cluster.gangs["g"].state == GANG_RUNNING


def test_a_failure_that_keeps_every_roles_minimum_ends_only_the_lost_members() -> None:
    fold = cluster(nodes=2, size=2)
    gang = SubmitGang(
        "g",
        members=(member("g-c", "ps"), member("g-d", "ps"), member("g-a", "worker"), member("g-b", "worker")),
        min_members=2,
        min_members_per_role={"worker": 1},
    )
    fold.run(gang)
    events = fold.run(MarkNodeFailed("n1"))
    assert "GangQueued" not in types(events)
    assert sorted(fold.cluster.gangs["g"].placed) == ["g-a", "g-b"]


# ---------------------------------------------------------------- preemption with disruption above_min


def elastic_roles() -> Fold:
    """One node of 4 GPUs full with gang g: workers g-a, g-b and ps g-c, g-d (1 GPU each), min_members 2, both
    workers needed, disruption above_min."""
    fold = cluster()
    gang = SubmitGang(
        "g",
        members=(member("g-a", "worker"), member("g-b", "worker"), member("g-c", "ps"), member("g-d", "ps")),
        min_members=2,
        min_members_per_role={"worker": 2},
        disruption="above_min",
    )
    fold.run(gang)
    assert len(fold.cluster.gangs["g"].placed) == 4
    return fold


def test_above_min_takes_a_member_alone_only_if_its_role_keeps_its_minimum() -> None:
    """By id the first victim would be worker g-a, but the workers are at their minimum: the ps go one by one,
    then the gang (at min_members) goes whole."""
    fold = elastic_roles()
    events = fold.run(gpus("p1", priority=5))
    assert [e.payload.pod_id for e in of(events, "PodPreempted")] == ["g-c"]
    assert fold.cluster.gangs["g"].state == GANG_RUNNING
    events = fold.run(gpus("p2", priority=5))
    assert [e.payload.pod_id for e in of(events, "PodPreempted")] == ["g-d"]
    events = fold.run(gpus("p3", priority=5))
    assert [e.payload.pod_id for e in of(events, "PodPreempted")] == ["g-a", "g-b"]
    assert fold.cluster.gangs["g"].state == GANG_QUEUED


def test_above_min_never_takes_two_spare_members_of_a_role_that_spares_one() -> None:
    """Workers g-a, g-b, g-c (one needed) and ps g-d, all 1 GPU, min_members 1 ... 2 GPUs wanted: two workers
    alone (the role spares two); with two workers needed, a worker and the ps."""
    for needed, victims in ((1, ["g-a", "g-b"]), (2, ["g-a", "g-d"])):
        fold = cluster()
        gang = SubmitGang(
            "g",
            members=(member("g-a", "worker"), member("g-b", "worker"), member("g-c", "worker"), member("g-d", "ps")),
            min_members=2,
            min_members_per_role={"worker": needed},
            disruption="above_min",
        )
        fold.run(gang)
        events = fold.run(gpus("p", count=2, priority=5))
        assert [e.payload.pod_id for e in of(events, "PodPreempted")] == victims
        assert fold.cluster.gangs["g"].state == GANG_RUNNING
