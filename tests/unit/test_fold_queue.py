"""The pending queue: structured queue reasons, retry triggers, priority + FIFO order, no head-of-line blocking."""

from __future__ import annotations

import pytest

from schemas.codes import QueueReasonCode as Q
from schemas.commands import AddNode, CordonNode, Release, SetPolicy, SubmitPod, Taint, UncordonNode
from tests.strategies import Fold, types


def reasons_fold() -> Fold:
    """a: 2 x A100, zone=a; b: 1 x V100, tainted dedicated=ml; c: CPU-only, small."""
    fold = Fold()
    fold.run_all(
        AddNode("a", 8000, 16384, "A100", 2, {"zone": "a"}),
        AddNode("b", 4000, 8192, "V100", 1, taints=(Taint("dedicated", "ml"),)),
        AddNode("c", 2000, 4096),
    )
    return fold


REASONS = [
    (
        "model, then CPU",
        SubmitPod("p", num_gpu=1, gpu_milli=1000, cpu_milli=9000, gpu_models=("A100",)),
        [(Q.GPU_MODEL_MISMATCH, 2), (Q.INSUFFICIENT_CPU, 1)],
    ),
    ("selector", SubmitPod("p", cpu_milli=100, node_selector={"zone": "b"}), [(Q.NODE_SELECTOR_MISMATCH, 3)]),
    (
        "GPUs, then taint",
        SubmitPod("p", num_gpu=3, gpu_milli=1000),
        [(Q.INSUFFICIENT_GPU, 2), (Q.UNTOLERATED_TAINT, 1)],
    ),
    (
        "share, memory, taint",
        SubmitPod("p", num_gpu=1, gpu_milli=500, memory_mib=20000),
        [(Q.INSUFFICIENT_GPU_SHARE, 1), (Q.INSUFFICIENT_MEMORY, 1), (Q.UNTOLERATED_TAINT, 1)],
    ),
    ("CPU-only pod too big", SubmitPod("p", cpu_milli=9000), [(Q.INSUFFICIENT_CPU, 2), (Q.UNTOLERATED_TAINT, 1)]),
]


@pytest.mark.parametrize(("payload", "expected"), [r[1:] for r in REASONS], ids=[r[0] for r in REASONS])
def test_queued_pod_carries_reasons_counted_per_node(payload: SubmitPod, expected: list[tuple[str, int]]) -> None:
    """Each node counts once, under the first check it fails; reasons are sorted by count, then code."""
    fold = reasons_fold()
    (event,) = fold.run(payload)
    assert event.type_name == "PodQueued"
    assert [(reason.code, reason.nodes) for reason in event.payload.reasons] == expected
    assert not event.payload.requeued


def test_cordoned_nodes_are_reported_as_unschedulable() -> None:
    """Cordoned (and failed) nodes count under NODE_UNSCHEDULABLE."""
    fold = reasons_fold()
    fold.run_all(CordonNode("a"), CordonNode("c"))
    (event,) = fold.run(SubmitPod("p", cpu_milli=100))
    assert [(r.code, r.nodes) for r in event.payload.reasons] == [(Q.NODE_UNSCHEDULABLE, 2), (Q.UNTOLERATED_TAINT, 1)]


def test_pod_in_a_cluster_without_nodes_is_queued_with_no_nodes() -> None:
    """With no node at all the reason is NO_NODES."""
    (event,) = Fold().run(SubmitPod("p", cpu_milli=100))
    assert [(r.code, r.nodes) for r in event.payload.reasons] == [(Q.NO_NODES, 0)]


def one_gpu_busy() -> Fold:
    """n1 has one GPU, held by 'blocker'; pods then queue behind it."""
    fold = Fold()
    fold.run_all(AddNode("n1", 64000, 65536, "A100", 1), SubmitPod("blocker", num_gpu=1, gpu_milli=1000))
    return fold


def test_retry_order_is_priority_first_then_fifo() -> None:
    """Freed capacity goes to the highest priority first, and to the earliest arrival within a priority."""
    fold = one_gpu_busy()
    for pod_id, priority in (("low1", 0), ("high1", 5), ("low2", 0), ("high2", 5), ("mid", 1)):
        pod = SubmitPod(pod_id, priority=priority, num_gpu=1, gpu_milli=1000, preemption="never")
        assert types(fold.run(pod)) == ["PodQueued"]
    order = []
    previous = "blocker"
    for _ in range(5):
        events = fold.run(Release(previous))
        assert types(events) == ["PodReleased", "PodScheduled"]
        assert events[1].payload.from_queue
        previous = events[1].payload.pod.pod_id
        order.append(previous)
    assert order == ["high1", "high2", "mid", "low1", "low2"]


def test_added_capacity_places_several_queued_pods_in_order() -> None:
    """An AddNode with room for three places the three first in queue order; the fourth keeps waiting."""
    fold = one_gpu_busy()
    for pod_id, priority in (("low1", 0), ("high1", 5), ("low2", 0), ("high2", 5)):
        fold.run(SubmitPod(pod_id, priority=priority, num_gpu=1, gpu_milli=1000, preemption="never"))
    events = fold.run(AddNode("n2", 64000, 65536, "A100", 3))
    assert types(events) == ["NodeAdded", "PodScheduled", "PodScheduled", "PodScheduled"]
    assert [e.payload.pod.pod_id for e in events[1:]] == ["high1", "high2", "low1"]
    assert fold.cluster.pods["low2"].queued


def test_big_queued_pod_does_not_block_smaller_ones() -> None:
    """A high-priority pod too big for the freed capacity stays queued while smaller ones behind it are placed."""
    fold = Fold()
    fold.run_all(
        AddNode("n1", 64000, 65536, "A100", 2),
        SubmitPod("a", num_gpu=1, gpu_milli=1000),
        SubmitPod("b", num_gpu=1, gpu_milli=1000),
        SubmitPod("big", priority=10, num_gpu=2, gpu_milli=1000, preemption="never"),
        SubmitPod("small", num_gpu=1, gpu_milli=1000),
        SubmitPod("share", num_gpu=1, gpu_milli=300),
    )
    assert all(fold.cluster.pods[p].queued for p in ("big", "small", "share"))
    events = fold.run(Release("a"))
    assert types(events) == ["PodReleased", "PodScheduled"]
    assert events[1].payload.pod.pod_id == "small"
    events = fold.run(Release("b"))
    assert [e.payload.pod.pod_id for e in events[1:]] == ["share"]
    assert fold.cluster.pods["big"].queued


def test_fifo_holds_across_shapes_within_a_priority() -> None:
    """Pods of different shapes but equal priority are retried in arrival order."""
    fold = one_gpu_busy()
    fold.run_all(SubmitPod("first", num_gpu=1, gpu_milli=600), SubmitPod("second", num_gpu=1, gpu_milli=500))
    events = fold.run(Release("blocker"))
    assert [e.payload.pod.pod_id for e in events[1:]] == ["first"]  # 400 left: the 500 share keeps waiting
    assert fold.cluster.pods["second"].queued


@pytest.mark.parametrize(
    ("setup", "trigger"),
    [
        ((), Release("blocker")),
        ((), AddNode("n2", 8000, 8192, "A100", 1)),
        ((CordonNode("n2"),), UncordonNode("n2")),
    ],
    ids=["Release", "AddNode", "UncordonNode"],
)
def test_capacity_growth_retries_the_queue(setup: tuple[object, ...], trigger: object) -> None:
    """Release, AddNode and UncordonNode each place a queued pod that now fits, marked from_queue."""
    fold = one_gpu_busy()
    if setup:
        fold.run(AddNode("n2", 8000, 8192, "A100", 1))
        fold.run_all(*setup)  # type: ignore[arg-type]
    fold.run(SubmitPod("waiting", num_gpu=1, gpu_milli=1000))
    assert fold.cluster.pods["waiting"].queued
    events = fold.run(trigger)  # type: ignore[arg-type]
    scheduled = [e for e in events if e.type_name == "PodScheduled"]
    assert [(e.payload.pod.pod_id, e.payload.from_queue) for e in scheduled] == [("waiting", True)]


def test_releasing_a_queued_pod_removes_it_from_the_queue() -> None:
    """A queued pod can be cancelled: PodReleased without a node, and it never gets placed."""
    fold = one_gpu_busy()
    fold.run(SubmitPod("waiting", num_gpu=1, gpu_milli=1000))
    (event,) = fold.run(Release("waiting", "cancelled"))
    assert (event.payload.node_id, event.payload.reason) == (None, "cancelled")
    assert len(fold.cluster.queue) == 0
    assert types(fold.run(Release("blocker"))) == ["PodReleased"]


def test_cpu_only_pods_take_no_gpu_and_fit_cpu_nodes() -> None:
    """A CPU-only pod lands on a CPU-only node or a GPU node without using a GPU; it queues on CPU shortage."""
    fold = Fold()
    fold.run_all(SetPolicy("first-fit"), AddNode("cpu", 2000, 4096), AddNode("gpu", 8000, 8192, "A100", 1))
    (first,) = fold.run(SubmitPod("c1", cpu_milli=1500, memory_mib=1024))
    (second,) = fold.run(SubmitPod("c2", cpu_milli=1500, memory_mib=1024))
    assert (first.payload.node_id, first.payload.gpus) == ("cpu", ())
    assert (second.payload.node_id, second.payload.gpus) == ("gpu", ())
    assert fold.cluster.nodes["gpu"].gpu_free == [1000]
    (third,) = fold.run(SubmitPod("c3", cpu_milli=7000))
    assert [(r.code, r.nodes) for r in third.payload.reasons] == [(Q.INSUFFICIENT_CPU, 2)]
    assert fold.cluster.gpu_milli_allocated == 0


def test_leaving_strict_fifo_starts_the_work_that_waited_behind_the_head() -> None:
    """Under strict FIFO a pod that fits waits behind a head that does not; switching the queue order back
    starts it in the SetPolicy's own command (found by the jobs property test: it stayed queued on a free node)."""
    fold = Fold()
    fold.run_all(
        AddNode("n1", 32000, 65536, "A100", 4),
        SetPolicy(queue_order="strict-fifo"),
        SubmitPod("head", num_gpu=8, gpu_milli=1000, preemption="never"),
        SubmitPod("cpu", cpu_milli=500),
    )
    assert fold.cluster.pods["cpu"].queued
    events = fold.run(SetPolicy(queue_order="skip-ahead"))
    assert types(events) == ["PolicyChanged", "PodScheduled"]
    assert events[1].payload.pod.pod_id == "cpu"
    assert fold.cluster.pods["head"].queued
