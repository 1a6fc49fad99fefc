"""Gang retries (SubmitGang.retry): a member's failure (Release reason failed) that takes its gang (fewer than
min_members would run on) stops the whole gang, which goes back to placement after its backoff in event time
(PodRetryScheduled of the failed member, with the gang's attempt), once per attempt; evictions requeue without
using a retry; its dependants wait for the final outcome."""

from __future__ import annotations

from processor.core.snapshot import from_snapshot, to_snapshot
from processor.core.state import GANG_RETRYING, GANG_RUNNING
from schemas.commands import (
    AddNode,
    DrainNode,
    GangMember,
    Release,
    ReleaseGang,
    Retry,
    SetDisruptionBudget,
    SubmitGang,
    SubmitPod,
    Tick,
    UncordonNode,
)
from schemas.events import PodEvicted, PodRetryScheduled
from tests.strategies import Fold, clusters_hash, types

RETRY = Retry(max_retries=2, backoff_ms=10_000, backoff_max_ms=15_000)


def gang(retry: Retry | None = RETRY, min_members: int | None = None, **kwargs: object) -> SubmitGang:
    members = tuple(GangMember(f"g-{i}", num_gpu=1, gpu_milli=1000) for i in range(3))
    return SubmitGang("g", members=members, min_members=min_members, retry=retry, **kwargs)  # type: ignore[arg-type]


def running(retry: Retry | None = RETRY, min_members: int | None = None, **kwargs: object) -> Fold:
    """Two 2-GPU nodes (t=1 s, 2 s) running gang g of three 1-GPU members, submitted at t=3 s."""
    fold = Fold()
    fold.run_all(AddNode("a", 8000, 32768, "A100", 2), AddNode("b", 8000, 32768, "A100", 2))
    fold.run(gang(retry, min_members, **kwargs))
    assert fold.cluster.gangs["g"].state == GANG_RUNNING
    return fold


def test_a_failed_member_takes_its_gang_which_is_retried_after_its_backoff() -> None:
    """Release failed of one member: the others are evicted (gang:failed), PodRetryScheduled for the failed member
    at now + backoff; every GPU is free meanwhile; at not_before the whole gang starts again, at its own time."""
    fold = running()
    events = fold.run(Release("g-1", "failed"), at=5_000)
    assert [e.payload for e in events] == [
        PodEvicted("g-0", fold_node(events, "g-0"), "gang:failed"),
        PodEvicted("g-2", fold_node(events, "g-2"), "gang:failed"),
        PodRetryScheduled("g-1", 1, 15_000, "g"),
    ]
    state = fold.cluster
    assert state.gangs["g"].state == GANG_RETRYING and state.gangs["g"].retry_at == 15_000
    assert all(node.gpu_free == [1000, 1000] for node in state.nodes.values())
    assert not any(pod_id.startswith("g-") for pod_id in state.pods)
    assert types(fold.run(Tick(), at=14_999)) == ["Ticked"]
    events = fold.run(Tick(), at=20_000)
    assert types(events) == ["GangScheduled", "PodScheduled", "PodScheduled", "PodScheduled", "Ticked"]
    assert events[0].occurred_at == 15_000
    assert fold.cluster.gangs["g"].state == GANG_RUNNING and fold.cluster.gangs["g"].attempt == 1


def fold_node(events: list, pod_id: str) -> str:
    """The node an evicted member ran on (from its own event)."""
    return next(e.payload.node_id for e in events if getattr(e.payload, "pod_id", None) == pod_id)


def test_the_backoff_doubles_and_is_capped_then_the_last_failure_is_final() -> None:
    """Retry 1 after 10 s, retry 2 after min(20 s, 15 s); the third failure is today's: the member ends."""
    fold = running()
    first = fold.run(Release("g-0", "failed"), at=5_000)[-1]
    assert (first.payload.attempt, first.payload.not_before) == (1, 15_000)
    fold.run(Tick(), at=16_000)
    second = fold.run(Release("g-2", "failed"), at=17_000)[-1]
    assert (second.payload.pod_id, second.payload.attempt, second.payload.not_before) == ("g-2", 2, 32_000)
    fold.run(Tick(), at=40_000)
    events = fold.run(Release("g-1", "failed"), at=41_000)
    assert types(events) == ["PodReleased"]
    assert fold.cluster.gangs["g"].state == GANG_RUNNING and not fold.cluster.gangs["g"].ok


def test_a_gang_that_does_not_fit_at_its_retry_is_queued_again() -> None:
    """At not_before the cluster is full: GangQueued (requeued); it starts when capacity frees."""
    fold = running()
    fold.run(Release("g-1", "failed"), at=5_000)
    fold.run(SubmitPod("hog", num_gpu=2, gpu_milli=1000), at=6_000)
    events = fold.run(Tick(), at=20_000)
    assert types(events) == ["GangQueued", "Ticked"]
    assert events[0].payload.requeued
    assert types(fold.run(Release("hog"), at=21_000))[:2] == ["PodReleased", "GangScheduled"]


def test_without_retry_a_member_failure_is_todays() -> None:
    """No retry policy (the default): the member is released and the gang runs on without it."""
    fold = running(retry=None)
    assert types(fold.run(Release("g-1", "failed"))) == ["PodReleased"]
    assert fold.cluster.gangs["g"].state == GANG_RUNNING


def test_a_failure_that_leaves_min_members_running_does_not_take_the_gang() -> None:
    """min_members 2 of 3: one failure leaves 2 running, so the member ends (no retry used); a second takes it."""
    fold = running(min_members=2)
    assert types(fold.run(Release("g-1", "failed"), at=5_000)) == ["PodReleased"]
    assert fold.cluster.gangs["g"].attempt == 0
    events = fold.run(Release("g-2", "failed"), at=6_000)
    assert types(events) == ["PodEvicted", "PodRetryScheduled"]
    assert (events[-1].payload.pod_id, events[-1].payload.attempt) == ("g-2", 1)


def test_other_release_reasons_use_no_retry() -> None:
    """Completed ends the member even with retries left."""
    fold = running()
    assert types(fold.run(Release("g-1", "completed"))) == ["PodReleased"]


def test_an_eviction_requeues_the_gang_without_using_a_retry() -> None:
    """A drain takes the gang back to the queue; its attempt count is untouched, a later failure is retry 1."""
    fold = running()
    node = fold.cluster.pods["g-0"].node_id
    fold.run(DrainNode(node), at=4_000)
    assert fold.cluster.gangs["g"].attempt == 0
    fold.run(UncordonNode(node), at=4_500)
    assert fold.cluster.gangs["g"].state == GANG_RUNNING
    retry = fold.run(Release("g-0", "failed"), at=5_000)[-1]
    assert retry.payload.attempt == 1


def test_dependants_wait_for_the_final_outcome() -> None:
    """An afterok dependant of the gang does not fail on a retried failure; it starts when the gang completes."""
    fold = running()
    (held,) = fold.run(SubmitPod("after", cpu_milli=100, depends_on=("g",)), at=4_000)
    assert held.payload.waiting_for == ("g",)
    assert types(fold.run(Release("g-1", "failed"), at=5_000))[-1] == "PodRetryScheduled"
    assert fold.cluster.pods["after"].waiting_for == ("g",)
    fold.run(Tick(), at=16_000)
    events = fold.run(ReleaseGang("g", "completed"), at=17_000)
    assert types(events)[-2:] == ["GangReleased", "PodScheduled"]
    assert events[-2].payload.ok and events[-1].payload.pod.pod_id == "after"


def test_a_gang_waiting_for_its_retry_can_be_cancelled_and_its_timer_does_nothing() -> None:
    """ReleaseGang while it waits: final (not ok), its dependants learn it; the retry's time passes silently."""
    fold = running()
    fold.run(SubmitPod("after", cpu_milli=100, depends_on=("g",)), at=4_000)
    fold.run(Release("g-1", "failed"), at=5_000)
    events = fold.run(ReleaseGang("g", "cancelled"), at=6_000)
    assert types(events)[:2] == ["GangReleased", "DependencyFailed"]
    assert not events[0].payload.ok
    assert types(fold.run(Tick(), at=20_000)) == ["Ticked"]


def test_a_gang_waiting_for_its_retry_does_not_time_out() -> None:
    """Its timeout is for waiting in the queue: the backoff is a timer of its own (as after an eviction, the
    timeout applies again once it is back in the queue)."""
    fold = running(timeout_ms=1_000)
    fold.run(Release("g-1", "failed"), at=5_000)
    assert types(fold.run(Tick(), at=10_000)) == ["Ticked"]
    assert types(fold.run(Tick(), at=20_000))[0] == "GangScheduled"


def test_a_retried_gang_is_not_counted_by_disruption_budgets() -> None:
    """A failure is not a voluntary disruption: the members it took leave no budget short."""
    fold = running()
    fold.run(SetDisruptionBudget("b1", gang_id="g", max_unavailable=0), at=4_000)
    fold.run(Release("g-1", "failed"), at=5_000)
    assert not fold.cluster.disrupted


def test_a_snapshot_keeps_the_gang_retry_and_its_timer() -> None:
    """Restored while it waits: same state, and the retry fires at the same time with the same events."""
    fold = running()
    fold.run(Release("g-1", "failed"), at=5_000)
    restored = Fold(from_snapshot(to_snapshot(fold.state)), count=fold.count)
    assert clusters_hash(restored.state) == clusters_hash(fold.state)
    assert restored.cluster.gangs["g"].retry_at == 15_000 and restored.cluster.gangs["g"].attempt == 1
    a, b = fold.run(Tick(), at=20_000), restored.run(Tick(), at=20_000)
    assert [e.payload for e in a] == [e.payload for e in b] and types(a)[0] == "GangScheduled"


def test_gang_retry_out_of_range_is_refused() -> None:
    """A backoff of 0 or negative retries are refused as for a pod (the field named), nothing runs."""
    fold = Fold()
    fold.run(AddNode("a", 8000, 32768, "A100", 2))
    for retry in (Retry(1, 0), Retry(-1), Retry(1, 10, 0)):
        (rejected,) = fold.run(gang(retry))
        assert rejected.type_name == "CommandRejected"
        assert "retry." in rejected.payload.message
    assert not fold.cluster.gangs
