"""Node life cycle: cordon, drain, failure and forced removal, with eviction and re-placement of pods."""

from __future__ import annotations

import pytest

from schemas.commands import (
    GPU_MILLI,
    AddNode,
    CordonNode,
    DrainNode,
    MarkNodeFailed,
    Release,
    RemoveNode,
    SetPolicy,
    SubmitPod,
    UncordonNode,
)
from tests.strategies import Fold, types


def two_nodes() -> Fold:
    """first-fit; src (4 x A100) runs hi (prio 5, 2 GPUs), lo1 and lo2 (prio 0, 1 GPU); dst (2 x A100) is empty."""
    fold = Fold()
    fold.run_all(
        SetPolicy("first-fit"),
        AddNode("a-src", 8000, 32768, "A100", 4),
        SubmitPod("lo2", num_gpu=1, gpu_milli=1000, cpu_milli=100),
        SubmitPod("lo1", num_gpu=1, gpu_milli=1000, cpu_milli=100),
        SubmitPod("hi", priority=5, num_gpu=2, gpu_milli=1000, cpu_milli=100),
        AddNode("b-dst", 8000, 32768, "A100", 2),
    )
    assert {pod.node_id for pod in fold.cluster.pods.values()} == {"a-src"}
    return fold


EVICTIONS = [
    ("drain", DrainNode("a-src"), "NodeDrained", 0, "drain"),
    ("failure", MarkNodeFailed("a-src", "ecc"), "NodeFailed", 0, "node_failed"),
    ("forced removal", RemoveNode("a-src", force=True), "NodeRemoved", 3, "node_removed"),
]


@pytest.mark.parametrize(
    ("payload", "node_event", "at", "reason"), [e[1:] for e in EVICTIONS], ids=[e[0] for e in EVICTIONS]
)
def test_evicted_pods_are_replaced_by_priority_then_fifo(
    payload: object, node_event: str, at: int, reason: str
) -> None:
    """Pods are evicted in pod id order, then re-placed highest priority first; those that do not fit are requeued."""
    fold = two_nodes()
    events = fold.run(payload)  # type: ignore[arg-type]
    evictions = [e.payload for e in events if e.type_name == "PodEvicted"]
    assert [(e.pod_id, e.node_id, e.reason) for e in evictions] == [
        ("hi", "a-src", reason),
        ("lo1", "a-src", reason),
        ("lo2", "a-src", reason),
    ]
    assert events[at].type_name == node_event
    after = [e for e in events if e.type_name in ("PodScheduled", "PodQueued")]
    assert [(e.type_name, e.payload.pod.pod_id) for e in after] == [
        ("PodScheduled", "hi"),
        ("PodQueued", "lo2"),  # lo2 arrived before lo1
        ("PodQueued", "lo1"),
    ]
    assert after[0].payload.node_id == "b-dst"
    assert all(e.payload.requeued for e in after[1:])
    assert not after[0].payload.from_queue


def test_drain_counts_evictions_and_cordons_the_node() -> None:
    """NodeDrained reports how many pods it evicts; the node stays (cordoned, empty) and can be uncordoned."""
    fold = two_nodes()
    events = fold.run(DrainNode("a-src"))
    assert events[0].payload.evicted == 3
    node = fold.cluster.nodes["a-src"]
    assert (node.cordoned, node.failed, dict(node.pods), node.gpu_free) == (True, False, {}, [GPU_MILLI] * 4)
    assert "a-src" not in fold.cluster.index
    events = fold.run(UncordonNode("a-src"))
    assert types(events) == ["NodeUncordoned", "PodScheduled", "PodScheduled"]
    assert [e.payload.pod.pod_id for e in events[1:]] == ["lo2", "lo1"]


def test_failed_node_loses_its_capacity_until_removed() -> None:
    """A failed node's GPUs leave the cluster capacity; it takes no pods; removing it needs no force."""
    fold = two_nodes()
    capacity = fold.cluster.gpu_milli_capacity
    events = fold.run(MarkNodeFailed("a-src", "ecc"))
    assert events[0].payload.evicted == 3
    assert fold.cluster.gpu_milli_capacity == capacity - 4 * GPU_MILLI
    assert fold.cluster.gpu_milli_allocated == 2 * GPU_MILLI  # hi re-placed on b-dst
    assert types(fold.run(RemoveNode("a-src"))) == ["NodeRemoved"]
    assert fold.cluster.gpu_milli_capacity == capacity - 4 * GPU_MILLI


def test_busy_node_is_removed_only_with_force() -> None:
    """RemoveNode on a node running pods is refused unless force is set."""
    fold = two_nodes()
    (event,) = fold.run(RemoveNode("a-src"))
    assert event.payload.code == "NODE_BUSY"
    events = fold.run(RemoveNode("a-src", force=True))
    assert events[3].payload.forced
    assert "a-src" not in fold.cluster.nodes


def test_cordoned_node_keeps_its_pods_but_takes_no_new_ones() -> None:
    """Cordoning evicts nothing; new pods go elsewhere, or wait with NODE_UNSCHEDULABLE."""
    fold = two_nodes()
    assert types(fold.run(CordonNode("a-src"))) == ["NodeCordoned"]
    assert len(fold.cluster.nodes["a-src"].pods) == 3
    (placed,) = fold.run(SubmitPod("new", num_gpu=1, gpu_milli=1000))
    assert placed.payload.node_id == "b-dst"
    fold.run(CordonNode("b-dst"))
    (queued,) = fold.run(SubmitPod("newer", cpu_milli=1))
    assert [(r.code, r.nodes) for r in queued.payload.reasons] == [("NODE_UNSCHEDULABLE", 2)]


def test_release_on_a_cordoned_node_frees_capacity_without_placing_there() -> None:
    """Capacity freed on a cordoned node is not offered to the queue."""
    fold = two_nodes()
    fold.run_all(CordonNode("a-src"), SubmitPod("wait", num_gpu=4, gpu_milli=1000))
    assert types(fold.run(Release("hi"))) == ["PodReleased"]
    assert fold.cluster.pods["wait"].queued


def test_a_removed_node_id_can_be_added_again() -> None:
    """After RemoveNode the id is free: AddNode with it succeeds and starts empty."""
    fold = two_nodes()
    fold.run(MarkNodeFailed("a-src"))
    fold.run(RemoveNode("a-src"))
    events = fold.run(AddNode("a-src", 8000, 32768, "A100", 4))
    assert events[0].type_name == "NodeAdded"
    assert {e.payload.pod.pod_id for e in events[1:]} == {"lo1", "lo2"}
