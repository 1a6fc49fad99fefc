"""Retries with exponential backoff in event time: a failed pod (Release reason failed) with retries left stops and
goes back to placement at its backoff's end (PodRetryScheduled), once; evictions requeue without using a retry; its
dependants wait for its final outcome."""

from __future__ import annotations

from processor.core.snapshot import from_snapshot, to_snapshot
from schemas.commands import AddNode, DrainNode, Release, Retry, SubmitPod, Tick, UncordonNode
from schemas.events import PodRetryScheduled
from tests.strategies import Fold, clusters_hash, types

RETRY = Retry(max_retries=2, backoff_ms=10_000, backoff_max_ms=15_000)


def running(retry: Retry | None = RETRY, **kwargs: object) -> Fold:
    """One 2-GPU node (at t=1 s) running pod p (1 GPU, the given retry), submitted at t=2 s."""
    fold = Fold()
    fold.run_all(AddNode("a", 8000, 32768, "A100", 2), SubmitPod("p", num_gpu=1, gpu_milli=1000, retry=retry, **kwargs))  # type: ignore[arg-type]
    assert fold.placement("p") == "a"
    return fold


def test_a_failed_pod_with_retries_left_is_retried_after_its_backoff() -> None:
    """Release failed: PodRetryScheduled at now + backoff; the GPU is free meanwhile; at not_before it starts again."""
    fold = running()
    events = fold.run(Release("p", "failed"), at=5_000)
    assert [e.payload for e in events] == [PodRetryScheduled("p", 1, 15_000)]
    assert fold.cluster.nodes["a"].gpu_free == [1000, 1000]
    assert types(fold.run(Tick(), at=14_999)) == ["Ticked"]
    events = fold.run(Tick(), at=20_000)
    assert types(events) == ["PodScheduled", "Ticked"]
    assert events[0].occurred_at == 15_000  # at its own time, before the tick
    assert fold.placement("p") == "a"


def test_the_backoff_doubles_and_is_capped_then_the_last_failure_is_final() -> None:
    """Retry 1 after 10 s, retry 2 after min(20 s, 15 s); the third failure releases the pod (max_retries 2)."""
    fold = running()
    (first,) = fold.run(Release("p", "failed"), at=5_000)
    assert first.payload.not_before == 15_000
    fold.run(Tick(), at=16_000)
    (second,) = fold.run(Release("p", "failed"), at=17_000)
    assert (second.payload.attempt, second.payload.not_before) == (2, 32_000)
    fold.run(Tick(), at=40_000)
    events = fold.run(Release("p", "failed"), at=41_000)
    assert types(events) == ["PodReleased"]
    assert "p" not in fold.cluster.pods


def test_a_pod_that_does_not_fit_at_its_retry_is_queued_again() -> None:
    """At not_before the node is full: PodQueued (requeued), then it starts when capacity frees."""
    fold = running()
    fold.run(Release("p", "failed"), at=5_000)
    fold.run(SubmitPod("hog", num_gpu=2, gpu_milli=1000), at=6_000)
    events = fold.run(Tick(), at=20_000)
    assert types(events) == ["PodQueued", "Ticked"]
    assert events[0].payload.requeued
    assert types(fold.run(Release("hog"), at=21_000)) == ["PodReleased", "PodScheduled"]


def test_without_retry_a_failure_is_final_as_before() -> None:
    """No retry policy (the default): Release failed releases the pod."""
    fold = running(retry=None)
    assert types(fold.run(Release("p", "failed"))) == ["PodReleased"]


def test_other_release_reasons_use_no_retry() -> None:
    """Completed (or cancelled) ends the pod even with retries left."""
    fold = running()
    assert types(fold.run(Release("p", "completed"))) == ["PodReleased"]


def test_an_eviction_requeues_without_using_a_retry() -> None:
    """A drain evicts and requeues the pod; its retry count is untouched, a later failure is still retry 1."""
    fold = running()
    fold.run(DrainNode("a"), at=3_000)
    assert fold.cluster.pods["p"].queued and fold.cluster.pods["p"].attempt == 0
    fold.run(UncordonNode("a"), at=4_000)
    (retry,) = fold.run(Release("p", "failed"), at=5_000)
    assert retry.payload.attempt == 1


def test_dependants_wait_for_the_final_outcome() -> None:
    """An afterok dependant does not fail on a retried failure; it starts when the retry completes."""
    fold = running()
    (held,) = fold.run(SubmitPod("after", cpu_milli=100, depends_on=("p",)), at=3_000)
    assert held.payload.waiting_for == ("p",)
    assert types(fold.run(Release("p", "failed"), at=5_000)) == ["PodRetryScheduled"]
    fold.run(Tick(), at=16_000)
    events = fold.run(Release("p", "completed"), at=17_000)
    assert types(events) == ["PodReleased", "PodScheduled"]
    assert events[1].payload.pod.pod_id == "after"


def test_a_final_failure_fails_afterok_dependants() -> None:
    """With no retries left, the failure is final: the afterok dependant fails."""
    fold = running(retry=Retry(max_retries=0))
    fold.run(SubmitPod("after", cpu_milli=100, depends_on=("p",)), at=3_000)
    events = fold.run(Release("p", "failed"), at=5_000)
    assert types(events)[:2] == ["PodReleased", "DependencyFailed"]


def test_a_pod_waiting_for_its_retry_can_be_cancelled_and_its_timer_does_nothing() -> None:
    """Release while waiting: final; the retry's time passes without an event for it."""
    fold = running()
    fold.run(Release("p", "failed"), at=5_000)
    assert types(fold.run(Release("p", "cancelled"), at=6_000)) == ["PodReleased"]
    assert types(fold.run(Tick(), at=20_000)) == ["Ticked"]


def test_a_snapshot_keeps_the_retry_and_its_timer() -> None:
    """Restored while waiting: same state, and the retry fires at the same time."""
    fold = running()
    fold.run(Release("p", "failed"), at=5_000)
    restored = Fold(from_snapshot(to_snapshot(fold.state)), count=fold.count)
    assert clusters_hash(restored.state) == clusters_hash(fold.state)
    assert restored.cluster.pods["p"].retry_at == 15_000
    a, b = fold.run(Tick(), at=20_000), restored.run(Tick(), at=20_000)
    assert [e.payload for e in a] == [e.payload for e in b] and types(a) == ["PodScheduled", "Ticked"]


def test_retry_out_of_range_is_refused() -> None:
    """A backoff of 0 (a timer at the failure's own time) or negative retries are INVALID_COMMAND."""
    fold = Fold()
    for retry in (Retry(1, 0), Retry(-1), Retry(1, 10, 0)):
        (rejected,) = fold.run(SubmitPod("p", cpu_milli=1, retry=retry))
        assert rejected.type_name == "CommandRejected"
