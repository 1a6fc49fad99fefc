"""Nodes that come back and change: RecoverNode (a failed node returns, empty) and UpdateNode (new labels and
taints; a NoExecute taint evicts the pods that do not tolerate it)."""

from __future__ import annotations

from processor.core.appliers import apply
from schemas.commands import (
    GPU_MILLI,
    AddNode,
    CordonNode,
    MarkNodeFailed,
    RecoverNode,
    SetPolicy,
    SubmitPod,
    Taint,
    Toleration,
    UncordonNode,
    UpdateNode,
)
from schemas.events import NodeUpdated
from tests.strategies import Fold, clusters_hash, types


def failed_node() -> Fold:
    """first-fit; a (2 x A100, labels zone=a) failed with two pods on it, which wait now (no other node)."""
    fold = Fold()
    fold.run_all(
        SetPolicy("first-fit"),
        AddNode("a", 8000, 32768, "A100", 2, labels={"zone": "a"}, taints=(Taint("dedicated", "ml"),)),
        SubmitPod("p1", num_gpu=1, gpu_milli=1000, tolerations=(Toleration("dedicated", "Equal", "ml"),)),
        SubmitPod("p2", num_gpu=1, gpu_milli=1000, tolerations=(Toleration("dedicated", "Equal", "ml"),)),
        MarkNodeFailed("a", "ecc"),
    )
    assert all(pod.queued for pod in fold.cluster.pods.values())
    return fold


def test_a_recovered_node_returns_with_its_capacity_and_labels_and_takes_the_waiting_pods() -> None:
    """RecoverNode: NodeRecovered, the node is schedulable with its capacity, labels and taints, the queue starts."""
    fold = failed_node()
    assert fold.cluster.gpu_milli_capacity == 0
    events = fold.run(RecoverNode("a"))
    assert types(events) == ["NodeRecovered", "PodScheduled", "PodScheduled"]
    assert [e.payload.node_id for e in events[1:]] == ["a", "a"]
    node = fold.cluster.nodes["a"]
    assert (node.failed, node.cordoned, node.labels, node.taints) == (
        False,
        False,
        {"zone": "a"},
        (Taint("dedicated", "ml"),),
    )
    assert fold.cluster.gpu_milli_capacity == 2 * GPU_MILLI


def test_a_cordoned_then_failed_node_recovers_uncordoned() -> None:
    """A node cordoned before it failed comes back schedulable: RecoverNode means empty and schedulable."""
    fold = Fold()
    fold.run_all(AddNode("a", 8000, 32768, "A100", 2), CordonNode("a"), MarkNodeFailed("a"))
    assert types(fold.run(RecoverNode("a"))) == ["NodeRecovered"]
    assert fold.cluster.nodes["a"].schedulable and "a" in fold.cluster.index


def test_recover_refuses_a_node_that_has_not_failed_or_is_unknown() -> None:
    """RecoverNode of a healthy node is NODE_NOT_FAILED, of an unknown one UNKNOWN_NODE; nothing changes."""
    fold = Fold()
    fold.run(AddNode("a", 8000, 32768, "A100", 2))
    for node_id, code in (("a", "NODE_NOT_FAILED"), ("zz", "UNKNOWN_NODE")):
        (rejected,) = fold.run(RecoverNode(node_id))
        assert (rejected.type_name, rejected.payload.code) == ("CommandRejected", code)
    assert types(fold.run(UncordonNode("a"))) == ["CommandRejected"]  # still not cordoned: untouched


def test_a_recovered_node_can_fail_again() -> None:
    """Fail, recover, fail: each time the capacity leaves and comes back."""
    fold = failed_node()
    fold.run(RecoverNode("a"))
    events = fold.run(MarkNodeFailed("a"))
    assert events[0].payload.evicted == 2
    assert fold.cluster.gpu_milli_capacity == 0
    fold.run(RecoverNode("a"))
    assert fold.cluster.gpu_milli_capacity == 2 * GPU_MILLI


def labelled() -> Fold:
    """first-fit; a (zone=a) runs 'plain' and 'tolerant' (tolerates spot NoExecute); b (zone=b) is empty."""
    fold = Fold()
    fold.run_all(
        SetPolicy("first-fit"),
        AddNode("a", 8000, 32768, "A100", 4, labels={"zone": "a"}),
        AddNode("b", 8000, 32768, "A100", 4, labels={"zone": "b"}),
        SubmitPod("plain", num_gpu=1, gpu_milli=1000, node_selector={"zone": "a"}),
        SubmitPod("tolerant", num_gpu=1, gpu_milli=1000, tolerations=(Toleration("spot", "Exists"),)),
    )
    assert fold.placement("plain") == fold.placement("tolerant") == "a"
    return fold


def test_placement_uses_the_new_labels() -> None:
    """After UpdateNode a waiting pod whose selector now matches starts there; running pods stay."""
    fold = labelled()
    (queued,) = fold.run(SubmitPod("wants-c", num_gpu=1, gpu_milli=1000, node_selector={"zone": "c"}))
    assert queued.type_name == "PodQueued"
    events = fold.run(UpdateNode("b", labels={"zone": "c"}))
    assert types(events) == ["NodeUpdated", "PodScheduled"]
    assert events[0].payload == NodeUpdated("b", {"zone": "c"}, (), 0)
    assert events[1].payload.node_id == "b"
    fold.run(UpdateNode("a", labels={}))  # labels replaced: plain's selector no longer matches, it stays anyway
    assert fold.placement("plain") == "a"
    (again,) = fold.run(SubmitPod("wants-a", num_gpu=1, gpu_milli=1000, node_selector={"zone": "a"}))
    assert again.type_name == "PodQueued"


def test_a_noschedule_taint_keeps_new_pods_off_but_evicts_nobody() -> None:
    """NoSchedule: running pods stay; a new pod that does not tolerate it goes elsewhere; the labels are kept."""
    fold = labelled()
    events = fold.run(UpdateNode("a", taints=(Taint("dedicated", "ml"),)))
    assert types(events) == ["NodeUpdated"]
    assert fold.cluster.nodes["a"].labels == {"zone": "a"}  # labels null: kept
    (placed,) = fold.run(SubmitPod("new", num_gpu=1, gpu_milli=1000))
    assert placed.payload.node_id == "b"


def test_a_noexecute_taint_evicts_the_pods_that_do_not_tolerate_it() -> None:
    """NoExecute: the untolerating pods are evicted (reason node_updated) and re-placed or requeued; the tolerating
    pod stays."""
    fold = labelled()
    events = fold.run(UpdateNode("a", taints=(Taint("spot", "", "NoExecute"),)))
    assert types(events) == ["NodeUpdated", "PodEvicted", "PodQueued"]
    assert events[0].payload.evicting == 1
    assert (events[1].payload.pod_id, events[1].payload.reason) == ("plain", "node_updated")
    assert events[2].payload.requeued  # zone=a only: b does not match, a does not tolerate it
    assert fold.placement("tolerant") == "a"
    events = fold.run(UpdateNode("a", taints=()))  # the taint goes: plain starts again on a
    assert types(events) == ["NodeUpdated", "PodScheduled"]
    assert events[1].payload.node_id == "a"


def test_an_evicted_pod_moves_to_another_node_that_fits() -> None:
    """A NoExecute eviction re-places the pod where it fits (not on the tainted node)."""
    fold = Fold()
    fold.run_all(
        SetPolicy("first-fit"),
        AddNode("a", 8000, 32768, "A100", 2),
        SubmitPod("p", num_gpu=1, gpu_milli=1000),
        AddNode("b", 8000, 32768, "A100", 2),
    )
    events = fold.run(UpdateNode("a", taints=(Taint("maint", "", "NoExecute"),)))
    assert types(events) == ["NodeUpdated", "PodEvicted", "PodScheduled"]
    assert events[2].payload.node_id == "b"


def test_update_node_refuses_bad_taints_and_unknown_nodes() -> None:
    """An unknown node is UNKNOWN_NODE; a taint effect outside the three is INVALID_COMMAND; nothing changes."""
    fold = labelled()
    (rejected,) = fold.run(UpdateNode("zz", labels={}))
    assert rejected.payload.code == "UNKNOWN_NODE"
    (rejected,) = fold.run(UpdateNode("a", taints=(Taint("k", "", "Evict"),)))
    assert rejected.payload.code == "INVALID_COMMAND"
    assert fold.cluster.nodes["a"].taints == ()


def test_updates_replay_to_the_same_state() -> None:
    """The events of recoveries and updates, applied to the state before them, rebuild the same state."""
    fold = failed_node()
    before = failed_node()
    events = []
    for payload in (
        RecoverNode("a"),
        UpdateNode("a", labels={"zone": "q"}, taints=(Taint("x", "", "NoExecute"),)),
        SubmitPod("p3", cpu_milli=100, tolerations=(Toleration("x", "Exists"),)),
        UpdateNode("a", taints=()),
    ):
        events.extend(fold.run(payload))
    for event in events:
        apply(before.state, event)
    assert clusters_hash(before.state) == clusters_hash(fold.state)
