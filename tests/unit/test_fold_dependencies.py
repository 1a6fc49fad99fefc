"""Dependencies: a pod or gang starts only after what it depends on ended (afterok / afterany), never early."""

from __future__ import annotations

from processor.core.snapshot import from_snapshot, state_hash, to_snapshot
from schemas.codes import QueueReasonCode, RejectionCode
from schemas.commands import AddNode, GangMember, Release, ReleaseGang, SetPolicy, SubmitGang, SubmitPod
from schemas.snapshots import decode_snapshot, encode_snapshot
from tests.strategies import Fold, types


def cluster() -> Fold:
    fold = Fold()
    fold.run(SetPolicy("first-fit", reserve_after_ms=-1))
    fold.run(AddNode("n0", 64_000, 262_144, "A100", 8))
    return fold


def pod(pod_id: str, *depends_on: str, dependency: str = "afterok") -> SubmitPod:
    return SubmitPod(pod_id, cpu_milli=1000, depends_on=depends_on, dependency=dependency)


def test_a_dependant_waits_outside_the_queue_and_starts_after_a_normal_end() -> None:
    fold = cluster()
    fold.run(pod("a"))
    (waiting,) = fold.run(pod("b", "a"))
    assert waiting.type_name == "PodQueued" and waiting.payload.waiting_for == ("a",)
    assert waiting.payload.reasons[0].code == QueueReasonCode.WAITING_FOR_DEPENDENCY
    assert not fold.cluster.pods["b"].queued and not len(fold.cluster.queue)
    events = fold.run(Release("a"))
    assert types(events) == ["PodReleased", "PodScheduled"] and events[1].payload.pod.pod_id == "b"


def test_afterok_fails_when_the_dependency_ends_badly_and_the_failure_cascades() -> None:
    """b (afterok a) fails when a is cancelled; c (afterok b) fails in turn; d (afterany b) starts."""
    fold = cluster()
    fold.run(pod("a"))
    fold.run(pod("b", "a"))
    fold.run(pod("c", "b"))
    fold.run(pod("d", "b", dependency="afterany"))
    events = fold.run(Release("a", "cancelled"))
    assert types(events) == [
        "PodReleased",
        "DependencyFailed",
        "PodReleased",
        "DependencyFailed",
        "PodReleased",
        "PodScheduled",
    ]
    assert [e.payload.holder_id for e in events if e.type_name == "DependencyFailed"] == ["b", "c"]
    assert events[-1].payload.pod.pod_id == "d"
    assert fold.cluster.ended["b"] is False and fold.cluster.ended["c"] is False


def test_a_time_limited_end_is_not_ok() -> None:
    fold = cluster()
    fold.run(SubmitPod("a", cpu_milli=1000, time_limit_ms=1000), at=10_000)
    fold.run(pod("b", "a"), at=10_500)
    events = fold.run(pod("z"), at=60_000)
    assert "DependencyFailed" in types(events) and "b" not in fold.cluster.pods


def test_dependencies_may_name_jobs_not_submitted_yet() -> None:
    """A workflow may arrive in any order: the dependant waits until the job with that id exists and ends."""
    fold = cluster()
    fold.run(pod("train", "prep"))
    assert fold.cluster.pods["train"].waiting_for == ("prep",)
    fold.run(pod("prep"))
    assert fold.cluster.pods["train"].waiting_for == ("prep",)  # prep runs; train still waits
    assert types(fold.run(Release("prep"))) == ["PodReleased", "PodScheduled"]


def test_an_already_ended_dependency_is_met_at_once() -> None:
    fold = cluster()
    fold.run(pod("a"))
    fold.run(Release("a"))
    assert types(fold.run(pod("b", "a"))) == ["PodScheduled"]
    fold.run(pod("c"))
    fold.run(Release("c", "failed"))
    events = fold.run(pod("d", "c"))
    assert types(events) == ["PodQueued", "DependencyFailed", "PodReleased"]


def test_a_cycle_closed_through_three_submissions_is_rejected_by_name() -> None:
    """a waits for c, b waits for a; c waiting for b closes a -> c -> b -> a: DEPENDENCY_CYCLE, nothing held."""
    fold = cluster()
    fold.run(pod("a", "c"))
    fold.run(pod("b", "a"))
    before = dict(fold.cluster.pods)
    (event,) = fold.run(pod("c", "b"))
    assert event.payload.code == RejectionCode.DEPENDENCY_CYCLE
    assert "c -> b -> a -> c" in event.payload.message
    assert fold.cluster.pods == before


def test_a_chain_through_an_ended_job_is_not_a_cycle() -> None:
    """Ended jobs wait for nothing: reusing an id whose job already ended cannot close a cycle."""
    fold = cluster()
    fold.run(pod("a"))
    fold.run(Release("a"))
    fold.run(pod("x", "y"))
    assert types(fold.run(pod("y", "a"))) == ["PodScheduled"]


def test_gangs_and_pods_depend_on_each_other() -> None:
    """A gang waits for a pod; a pod waits for the gang; the gang ends ok when its members complete."""
    fold = cluster()
    fold.run(pod("prep"))
    gang = SubmitGang("g", members=(GangMember("g-0", cpu_milli=1000), GangMember("g-1", cpu_milli=1000)))
    gang.depends_on = ("prep",)
    (waiting,) = fold.run(gang)
    assert waiting.type_name == "GangQueued" and waiting.payload.waiting_for == ("prep",)
    fold.run(pod("report", "g"))
    assert types(fold.run(Release("prep"))) == ["PodReleased", "GangScheduled", "PodScheduled", "PodScheduled"]
    events = fold.run(ReleaseGang("g"))
    assert types(events) == ["PodReleased", "PodReleased", "GangReleased", "PodScheduled"]
    assert events[2].payload.ok and events[-1].payload.pod.pod_id == "report"


def test_a_gang_depending_on_its_own_member_is_a_cycle() -> None:
    fold = cluster()
    gang = SubmitGang("g", members=(GangMember("g-0", cpu_milli=1),), depends_on=("w",))
    fold.run(gang)
    (event,) = fold.run(pod("w", "g-0"))
    assert event.payload.code == RejectionCode.DEPENDENCY_CYCLE and "cycle w -> g-0 -> w" in event.payload.message


def test_cancelling_a_waiting_job_ends_it_not_ok() -> None:
    fold = cluster()
    fold.run(pod("a"))
    fold.run(pod("b", "a"))
    fold.run(pod("c", "b"))
    events = fold.run(Release("b", "cancelled"))
    assert types(events) == ["PodReleased", "DependencyFailed", "PodReleased"]


def test_waiting_jobs_survive_a_snapshot() -> None:
    fold = cluster()
    fold.run(pod("a"))
    fold.run(pod("b", "a"))
    fold.run(SubmitGang("g", members=(GangMember("g-0", cpu_milli=1),), depends_on=("b",)))
    restored = Fold(from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(fold.state)))), count=fold.count)
    assert state_hash(restored.state) == state_hash(fold.state)
    assert [e.to_avro() for e in restored.run(Release("a"))] == [e.to_avro() for e in fold.run(Release("a"))]
    assert [e.to_avro() for e in restored.run(Release("b"))] == [e.to_avro() for e in fold.run(Release("b"))]
    assert fold.cluster.gangs["g"].state == "running"
