"""Placement inside the fold: GPU choice on a node, GPU models, taints/tolerations and node selectors."""

from __future__ import annotations

import pytest

from processor.core.fold import decide
from processor.core.snapshot import from_snapshot, to_snapshot
from processor.core.state import PartitionState
from schemas.commands import AddNode, Command, SetPolicy, SubmitPod, Taint, Toleration
from schemas.snapshots import decode_snapshot, encode_snapshot
from tests.strategies import Fold, encode_events


def gpus_of(events: list) -> list[tuple[int, int]]:
    (event,) = events
    assert event.type_name == "PodScheduled", event
    return [(share.index, share.milli) for share in event.payload.gpus]


def test_gpu_share_goes_to_the_best_fitting_gpu() -> None:
    """A share takes the GPU whose free milli is smallest but enough, ties on the lowest index."""
    fold = Fold()
    fold.run(AddNode("n1", 64000, 65536, "A100", 3))
    steps = [
        (700, [(0, 700)], [300, 1000, 1000]),  # all free: lowest index
        (400, [(1, 400)], [300, 600, 1000]),  # GPU 0 has only 300
        (250, [(0, 250)], [50, 600, 1000]),  # 300 is the tightest fit
        (500, [(1, 500)], [50, 100, 1000]),  # 600 beats 1000
        (900, [(2, 900)], [50, 100, 100]),
    ]
    for i, (milli, expected, free_after) in enumerate(steps):
        assert gpus_of(fold.run(SubmitPod(f"s{i}", num_gpu=1, gpu_milli=milli))) == expected
        assert fold.cluster.nodes["n1"].gpu_free == free_after


def test_whole_gpus_are_the_lowest_index_fully_free_ones() -> None:
    """Whole-GPU pods take the lowest-index GPUs that are entirely free, skipping partly used ones."""
    fold = Fold()
    fold.run(AddNode("n1", 64000, 65536, "A100", 4))
    assert gpus_of(fold.run(SubmitPod("share", num_gpu=1, gpu_milli=300))) == [(0, 300)]
    assert gpus_of(fold.run(SubmitPod("two", num_gpu=2, gpu_milli=1000))) == [(1, 1000), (2, 1000)]
    assert gpus_of(fold.run(SubmitPod("one", num_gpu=1, gpu_milli=1000))) == [(3, 1000)]
    (event,) = fold.run(SubmitPod("more", num_gpu=1, gpu_milli=1000))
    assert event.type_name == "PodQueued"
    assert [(r.code, r.nodes) for r in event.payload.reasons] == [("INSUFFICIENT_GPU", 1)]


def test_share_of_a_partly_used_gpu_fits_where_a_whole_gpu_does_not() -> None:
    """Shares can stack on one GPU up to 1000 milli; a whole-GPU pod needs an untouched GPU."""
    fold = Fold()
    fold.run(AddNode("n1", 64000, 65536, "A100", 1))
    assert gpus_of(fold.run(SubmitPod("a", num_gpu=1, gpu_milli=600))) == [(0, 600)]
    assert gpus_of(fold.run(SubmitPod("b", num_gpu=1, gpu_milli=400))) == [(0, 400)]
    assert fold.run(SubmitPod("c", num_gpu=1, gpu_milli=1))[0].payload.reasons[0].code == "INSUFFICIENT_GPU_SHARE"


@pytest.mark.parametrize(
    ("models", "node"),
    [((), "a-v100"), (("A100",), "b-a100"), (("V100",), "a-v100"), (("T4", "A100"), "b-a100")],
    ids=["any", "A100", "V100", "T4 or A100"],
)
def test_gpu_models_restrict_the_nodes(models: tuple[str, ...], node: str) -> None:
    """A pod's allowed GPU models (empty = any) decide which nodes it may use."""
    fold = Fold()
    fold.run_all(
        SetPolicy("first-fit"), AddNode("a-v100", 8000, 8192, "V100", 1), AddNode("b-a100", 8000, 8192, "A100", 1)
    )
    if "T4" in models:  # a T4 node exists but is full
        fold.run(AddNode("c-t4", 8000, 8192, "T4", 1))
        fold.run(SubmitPod("fill-t4", num_gpu=1, gpu_milli=1000, gpu_models=("T4",)))
    (event,) = fold.run(SubmitPod("p", num_gpu=1, gpu_milli=1000, gpu_models=models))
    assert event.payload.node_id == node


DEDICATED = Taint("dedicated", "ml")
TAINT_CASES = [
    ("no toleration", (DEDICATED,), (), False),
    ("Equal with the value", (DEDICATED,), (Toleration("dedicated", "Equal", "ml"),), True),
    ("Equal with another value", (DEDICATED,), (Toleration("dedicated", "Equal", "web"),), False),
    ("Exists on the key", (DEDICATED,), (Toleration("dedicated", "Exists"),), True),
    ("Exists on another key", (DEDICATED,), (Toleration("gpu", "Exists"),), False),
    ("Exists with empty key", (DEDICATED,), (Toleration("", "Exists"),), True),
    ("matching effect", (DEDICATED,), (Toleration("dedicated", "Equal", "ml", "NoSchedule"),), True),
    ("other effect", (DEDICATED,), (Toleration("dedicated", "Equal", "ml", "NoExecute"),), False),
    ("NoExecute taint", (Taint("spot", "", "NoExecute"),), (), False),
    ("NoExecute tolerated", (Taint("spot", "", "NoExecute"),), (Toleration("spot", "Exists", "", "NoExecute"),), True),
    ("PreferNoSchedule is advisory", (Taint("soft", "", "PreferNoSchedule"),), (), True),
    ("one of two tolerated", (DEDICATED, Taint("spot", "", "NoExecute")), (Toleration("dedicated", "Exists"),), False),
    (
        "both tolerated",
        (DEDICATED, Taint("spot", "", "NoExecute")),
        (Toleration("dedicated", "Exists"), Toleration("spot", "Exists")),
        True,
    ),
]


@pytest.mark.parametrize(
    ("taints", "tolerations", "admitted"), [c[1:] for c in TAINT_CASES], ids=[c[0] for c in TAINT_CASES]
)
def test_taints_and_tolerations(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...], admitted: bool) -> None:
    """A pod lands on a tainted node only if it tolerates every NoSchedule/NoExecute taint (Kubernetes semantics)."""
    fold = Fold()
    fold.run(AddNode("n1", 8000, 8192, "A100", 1, taints=taints))
    (event,) = fold.run(SubmitPod("p", cpu_milli=100, tolerations=tolerations))
    if admitted:
        assert event.payload.node_id == "n1"
    else:
        assert [(r.code, r.nodes) for r in event.payload.reasons] == [("UNTOLERATED_TAINT", 1)]


SELECTOR_CASES = [
    ("empty", {}, True),
    ("one label", {"zone": "a"}, True),
    ("both labels", {"disk": "ssd", "zone": "a"}, True),
    ("wrong value", {"zone": "b"}, False),
    ("one of two wrong", {"zone": "a", "disk": "hdd"}, False),
    ("missing label", {"rack": "r1"}, False),
]


@pytest.mark.parametrize(("selector", "admitted"), [c[1:] for c in SELECTOR_CASES], ids=[c[0] for c in SELECTOR_CASES])
def test_node_selector_needs_every_label(selector: dict[str, str], admitted: bool) -> None:
    """A pod's node selector matches a node only if the node has every key with the same value."""
    fold = Fold()
    fold.run(AddNode("n1", 8000, 8192, labels={"zone": "a", "disk": "ssd"}))
    (event,) = fold.run(SubmitPod("p", cpu_milli=100, node_selector=selector))
    if admitted:
        assert event.payload.node_id == "n1"
    else:
        assert [(r.code, r.nodes) for r in event.payload.reasons] == [("NODE_SELECTOR_MISMATCH", 1)]


def test_nodes_differing_only_in_taints_can_coexist_with_a_queued_pod() -> None:
    """Two nodes of one model and labels with different taints do not break the index when a pod is queued."""
    fold = Fold()
    fold.run_all(
        AddNode("n1", 1000, 1000, "A100", 1, taints=(Taint("x"),)),
        AddNode("n2", 1000, 1000, "A100", 1, taints=(Taint("y"),)),
    )
    (event,) = fold.run(SubmitPod("p", num_gpu=1, gpu_milli=1000))
    assert [(r.code, r.nodes) for r in event.payload.reasons] == [("UNTOLERATED_TAINT", 2)]


def test_pod_restored_from_a_snapshot_emits_the_same_bytes_as_in_a_full_replay() -> None:
    """A queued pod with a two-key selector, restored from a snapshot, is scheduled later with identical event bytes."""
    submit = Command("s", "c0", 1, SubmitPod("p", cpu_milli=1, node_selector={"zone": "b", "disk": "ssd"}))
    add = Command("a", "c0", 2, AddNode("n", 1000, 1000, labels={"zone": "b", "disk": "ssd"}))
    full = PartitionState()
    decide(full, submit)
    restored = from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(full))))
    assert encode_events(decide(restored, add)) == encode_events(decide(full, add))
