"""FGD's fragmentation metric, the learned typical pods, and their persistence in snapshots."""

from __future__ import annotations

import pytest

from processor.core.fragmentation import (
    BalancedFragmenter,
    Fragmenter,
    cluster_fragmentation,
    cpu_per_gpu_milli,
    stranded_by_cpu,
)
from processor.core.snapshot import from_snapshot, state_hash, to_snapshot
from processor.core.typical import is_checkpoint, typical_moved
from schemas.commands import AddNode, Release, SubmitPod
from schemas.fragmentation import TypicalKey, TypicalPod, derive_typical, frag_for, node_fragmentation
from schemas.snapshots import decode_snapshot, encode_snapshot
from tests.strategies import Fold

SHARE_500 = TypicalKey(1, 500, 1000, ())
WHOLE_1 = TypicalKey(1, 1000, 1000, ())
WHOLE_2 = TypicalKey(2, 1000, 1000, ())
CPU_ONLY = TypicalKey(0, 0, 1000, ())


@pytest.mark.parametrize(
    ("gpu_free", "cpu_free", "key", "expected"),
    [
        ((1000, 300), 8000, SHARE_500, 300),  # fits: only the GPU below 500 free is fragment
        ((1000, 300), 8000, WHOLE_1, 300),
        ((1000, 300), 8000, WHOLE_2, 1300),  # cannot run: every idle milli is fragment
        ((1000, 300), 500, SHARE_500, 1300),  # not enough CPU
        ((1000, 300), 8000, CPU_ONLY, 1300),  # a pod without GPU counts all idle GPU (the simulator's XL/XR)
        ((1000, 300), 8000, TypicalKey(1, 500, 1000, ("T4",)), 1300),  # other model
        ((0, 0), 8000, SHARE_500, 0),
    ],
)
def test_fragment_of_one_node_for_one_typical_pod(
    gpu_free: tuple, cpu_free: int, key: TypicalKey, expected: int
) -> None:
    """Fragment milli follows the paper: all idle GPU if the pod cannot run, else GPUs below its per-GPU request."""
    assert frag_for(gpu_free, cpu_free, "V100", key) == expected


def test_node_fragmentation_is_the_popularity_weighted_sum() -> None:
    """A node's fragmentation weighs each typical pod's fragment by its popularity."""
    typical = (TypicalPod(SHARE_500, 0.75), TypicalPod(WHOLE_2, 0.25))
    assert node_fragmentation((1000, 300), 8000, "V100", typical) == pytest.approx(0.75 * 300 + 0.25 * 1300)


def test_fragmenter_equals_the_reference() -> None:
    """The precompiled fragmenter gives the reference value on varied nodes."""
    typical = (
        TypicalPod(SHARE_500, 0.3),
        TypicalPod(WHOLE_1, 0.2),
        TypicalPod(WHOLE_2, 0.2),
        TypicalPod(CPU_ONLY, 0.1),
        TypicalPod(TypicalKey(1, 250, 9000, ("V100",)), 0.2),
    )
    fragmenter = Fragmenter(typical)
    for gpu_free in [(1000, 1000), (1000, 300), (700, 250, 0, 0), (900,) * 8, (0,)]:
        for cpu_free in (0, 1000, 10000):
            for model in ("V100", "T4"):
                expected = node_fragmentation(gpu_free, cpu_free, model, typical)
                assert fragmenter(gpu_free, cpu_free, model) == pytest.approx(expected)


def test_balanced_fragmenter_adds_the_gpu_the_cpu_cannot_serve() -> None:
    """CPU per GPU is weighted by popularity over the typical GPU pods (shares by their milli). At 3 CPU milli per
    GPU milli, a node with 2,000 idle GPU milli and 3,000 CPU milli free serves 1,000 of them: the other 1,000
    count as fragment on top of FGD's measure."""
    typical = (TypicalPod(TypicalKey(1, 1000, 2000, ()), 0.5), TypicalPod(TypicalKey(1, 500, 2000, ()), 0.5))
    assert cpu_per_gpu_milli(typical) == pytest.approx(4000 / 1500)
    typical = (TypicalPod(TypicalKey(1, 1000, 3000, ()), 0.8), TypicalPod(CPU_ONLY, 0.2))
    assert cpu_per_gpu_milli(typical) == 3.0  # CPU-only pods do not count
    fgd, balanced = Fragmenter(typical), BalancedFragmenter(typical)
    assert balanced((1000, 1000), 3000, "V100") == pytest.approx(fgd((1000, 1000), 3000, "V100") + 1000)
    assert balanced((1000, 1000), 6000, "V100") == pytest.approx(fgd((1000, 1000), 6000, "V100"))  # enough CPU
    assert balanced((0, 0), 0, "V100") == 0.0


def test_balanced_fragmenter_equals_the_reference() -> None:
    """FGD's reference measure plus the CPU term's reference, on varied nodes."""
    typical = (
        TypicalPod(SHARE_500, 0.3),
        TypicalPod(WHOLE_1, 0.2),
        TypicalPod(TypicalKey(1, 1000, 12000, ()), 0.2),
        TypicalPod(CPU_ONLY, 0.1),
        TypicalPod(TypicalKey(1, 250, 9000, ("V100",)), 0.2),
    )
    balanced = BalancedFragmenter(typical)
    for gpu_free in [(1000, 1000), (1000, 300), (700, 250, 0, 0), (900,) * 8, (0,)]:
        for cpu_free in (0, 1000, 10000, 64000):
            expected = node_fragmentation(gpu_free, cpu_free, "V100", typical) + stranded_by_cpu(
                gpu_free, cpu_free, typical
            )
            assert balanced(gpu_free, cpu_free, "V100") == pytest.approx(expected)


def test_typical_pods_cover_95_percent_by_popularity() -> None:
    """The most common shapes are taken until they cover 95% of pods, and their weights sum to 1."""
    counts = {WHOLE_1: 60, SHARE_500: 30, WHOLE_2: 6, CPU_ONLY: 4}
    typical = derive_typical(counts)
    assert [pod.key for pod in typical] == [WHOLE_1, SHARE_500, WHOLE_2]
    assert sum(pod.weight for pod in typical) == pytest.approx(1.0)
    assert typical[0].weight == pytest.approx(60 / 96)


def test_typical_pod_ties_do_not_depend_on_dict_order() -> None:
    """Equal counts rank by the larger (CPU, GPU milli, GPU count), whatever the insertion order."""
    forward = derive_typical({WHOLE_1: 5, SHARE_500: 5})
    backward = derive_typical({SHARE_500: 5, WHOLE_1: 5})
    assert forward == backward
    assert forward[0].key == WHOLE_1


def test_refresh_points_and_tolerance() -> None:
    """Typical pods are refreshed at powers of two and every 256 arrivals, and only if they moved."""
    assert [n for n in range(1, 600) if is_checkpoint(n)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    old = (TypicalPod(WHOLE_1, 0.5), TypicalPod(SHARE_500, 0.5))
    assert not typical_moved(old, (TypicalPod(WHOLE_1, 0.505), TypicalPod(SHARE_500, 0.495)))
    assert typical_moved(old, (TypicalPod(WHOLE_1, 0.6), TypicalPod(SHARE_500, 0.4)))
    assert typical_moved(old, (TypicalPod(WHOLE_1, 1.0),))


def test_the_fold_learns_typical_pods_from_present_pods() -> None:
    """After submitting pods the cluster's typical pods reflect their shapes; releases leave the histogram."""
    fold = Fold()
    fold.run(AddNode("n", 64000, 262144, "V100", 8))
    for i in range(4):
        fold.run(SubmitPod(f"w{i}", num_gpu=1, gpu_milli=1000, cpu_milli=1000))
    assert fold.cluster.typical == (TypicalPod(WHOLE_1, 1.0),)
    fold.run(Release("w0"))
    assert fold.cluster.shape_counts == {WHOLE_1: 3}


def test_typical_pods_survive_a_snapshot_and_count_in_the_hash() -> None:
    """A snapshot carries the learned typical pods; restoring gives the same state hash and histogram."""
    fold = Fold()
    fold.run(AddNode("n", 64000, 262144, "V100", 8))
    for i in range(5):
        fold.run(SubmitPod(f"s{i}", num_gpu=1, gpu_milli=500, cpu_milli=1000))
    restored = from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(fold.state))))
    assert restored.clusters["c0"].typical == fold.cluster.typical != ()
    assert restored.clusters["c0"].shape_counts == fold.cluster.shape_counts
    assert state_hash(restored) == state_hash(fold.state)
    fold.cluster.typical = ()
    assert state_hash(restored) != state_hash(fold.state)


def test_cluster_fragmentation_sums_nodes() -> None:
    """Cluster fragmentation is the sum over schedulable nodes, reported against capacity and idle GPU."""
    fold = Fold()
    fold.run_all(AddNode("a", 64000, 262144, "V100", 2), AddNode("b", 64000, 262144, "V100", 2))
    fold.run(SubmitPod("s", num_gpu=1, gpu_milli=700, cpu_milli=1000))
    typical = (TypicalPod(SHARE_500, 1.0),)
    frag = cluster_fragmentation(fold.cluster, typical)
    assert frag.fragment_milli == pytest.approx(300)  # one GPU with 300 free, below the 500 asked
    assert frag.idle_milli == 3300
    assert frag.fragment_pct_of_capacity == pytest.approx(100 * 300 / 4000)
