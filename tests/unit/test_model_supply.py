"""Model supply risk: how likely a GPU model's idle capacity is to be needed by the pods pinned to it."""

from __future__ import annotations

from processor.core.model_supply import model_risk, model_risk_of_demand, restricted_demand
from processor.core.snapshot import from_snapshot, state_hash, to_snapshot
from processor.core.state import ClusterState
from schemas.commands import AddNode, Release, SubmitPod
from schemas.fragmentation import TypicalKey
from schemas.snapshots import decode_snapshot, encode_snapshot
from tests.strategies import Fold


def cluster_with(t4_nodes: int, v100_nodes: int, pinned: int, anywhere: int) -> Fold:
    """2-GPU T4 and 8-GPU V100 nodes; ``pinned`` T4-only and ``anywhere`` unpinned whole-GPU pods waiting on a
    selector no node has (present, so they count in the mix, but placed nowhere)."""
    fold = Fold()
    fold.run_all(
        *(AddNode(f"t{n}", 64000, 262144, "T4", 2) for n in range(t4_nodes)),
        *(AddNode(f"v{n}", 64000, 262144, "V100", 8) for n in range(v100_nodes)),
    )
    for n in range(pinned):
        fold.run(SubmitPod(f"p{n}", num_gpu=1, gpu_milli=1000, cpu_milli=1000, gpu_models=("T4",),
                           node_selector={"nowhere": "x"}))  # fmt: skip
    for n in range(anywhere):
        fold.run(SubmitPod(f"a{n}", num_gpu=1, gpu_milli=1000, cpu_milli=1000, node_selector={"nowhere": "x"}))
    return fold


def test_restricted_demand_counts_gpu_milli_and_pods_per_model_set() -> None:
    """Every GPU pod counts in the total; pinned ones also under their allowed models; CPU-only pods nowhere."""
    counts = {
        TypicalKey(1, 500, 1000, ()): 4,
        TypicalKey(2, 1000, 1000, ("T4",)): 3,
        TypicalKey(1, 1000, 1000, ("P100", "V100")): 1,
        TypicalKey(0, 0, 1000, ("T4",)): 9,
    }
    assert restricted_demand(counts) == (2000 + 6000 + 1000, {("T4",): (6000, 3), ("P100", "V100"): (1000, 1)})


def test_no_pinned_pods_no_risk() -> None:
    """Without pods pinned to models no model is at risk."""
    fold = cluster_with(2, 2, pinned=0, anywhere=10)
    assert model_risk(fold.cluster.shape_counts, fold.cluster.index) == {}


def test_a_model_with_supply_to_spare_is_not_at_risk() -> None:
    """10% of the demand is T4-only, and T4 holds 20 of the 36 idle GPUs: far more than its need of 3.6."""
    fold = cluster_with(10, 2, pinned=1, anywhere=9)
    assert model_risk(fold.cluster.shape_counts, fold.cluster.index) == {"T4": 0.0}


def test_a_model_short_of_its_need_is_at_risk() -> None:
    """Half the demand is T4-only but T4 holds 4 of the 164 idle GPUs: its need (82) is far above its supply
    (the estimate from 10 pods is loose, so not quite certain)."""
    fold = cluster_with(2, 20, pinned=10, anywhere=10)
    assert model_risk(fold.cluster.shape_counts, fold.cluster.index)["T4"] > 0.99


def test_risk_grows_as_the_supply_shrinks_toward_the_need() -> None:
    """With the same mix, fewer idle T4 GPUs against the same need mean a larger risk: none with plenty, about
    1/2 where the supply meets the need (12 T4 GPUs against 12% of 92), more than 1/2 below it."""
    risks = []
    for t4_nodes in (40, 20, 10, 6, 4):
        fold = cluster_with(t4_nodes, 10, pinned=12, anywhere=88)  # T4-only: 12% of the demand
        risks.append(model_risk(fold.cluster.shape_counts, fold.cluster.index)["T4"])
    assert risks == sorted(risks)
    assert risks[0] == 0.0 and 0.3 < risks[-2] < 0.5 < risks[-1]


def test_a_set_of_models_splits_its_need_by_idle_supply() -> None:
    """Pods allowed on T4 or V100 need both in proportion to what each has idle: neither is at risk when the
    set's supply covers the need, even if one model alone could not."""
    fold = Fold()
    fold.run_all(AddNode("t", 64000, 262144, "T4", 2), AddNode("v", 64000, 262144, "V100", 8))
    for n in range(3):
        fold.run(SubmitPod(f"p{n}", num_gpu=1, gpu_milli=1000, cpu_milli=1000, gpu_models=("T4", "V100"),
                           node_selector={"nowhere": "x"}))  # fmt: skip
    for n in range(7):
        fold.run(SubmitPod(f"a{n}", num_gpu=1, gpu_milli=1000, cpu_milli=1000, node_selector={"nowhere": "x"}))
    risk = model_risk(fold.cluster.shape_counts, fold.cluster.index)
    assert set(risk) == {"T4", "V100"} and risk["T4"] < 0.5 and risk["V100"] < 0.5


def summed(cluster: ClusterState) -> tuple[int, dict[tuple[str, ...], tuple[int, int]]]:
    """The demand the state keeps summed, in :func:`restricted_demand`'s form."""
    return cluster.gpu_demand, {models: (entry[0], entry[1]) for models, entry in cluster.pinned_demand.items()}


def test_the_state_keeps_the_demand_summed_through_releases_and_a_snapshot() -> None:
    """``count_shape`` keeps ``gpu_demand``/``pinned_demand`` equal to the histogram's sums as pods come and go
    (running or waiting, pinned or not, CPU-only), a restored snapshot rebuilds them, and they are not in the
    hash; the risk read from them is the one recomputed from the histogram."""
    fold = Fold()
    fold.run_all(AddNode("t", 64000, 262144, "T4", 2), AddNode("v", 64000, 262144, "V100", 8))
    pods = [
        SubmitPod("a", num_gpu=1, gpu_milli=1000, cpu_milli=1000, gpu_models=("T4",)),
        SubmitPod("b", num_gpu=1, gpu_milli=500, cpu_milli=1000, gpu_models=("T4",)),
        SubmitPod("c", num_gpu=2, gpu_milli=1000, cpu_milli=1000, gpu_models=("T4", "V100")),
        SubmitPod("d", num_gpu=4, gpu_milli=1000, cpu_milli=1000),
        SubmitPod("e", num_gpu=0, gpu_milli=0, cpu_milli=1000, gpu_models=("T4",)),
        SubmitPod("f", num_gpu=8, gpu_milli=1000, cpu_milli=1000, gpu_models=("V100",)),  # waits: no room left
    ]
    for pod in pods:
        fold.run(pod)
        assert summed(fold.cluster) == restricted_demand(fold.cluster.shape_counts)
    assert summed(fold.cluster) == (1000 + 500 + 2000 + 4000 + 8000, {("T4",): (1500, 2), ("T4", "V100"): (2000, 1),
                                                                     ("V100",): (8000, 1)})  # fmt: skip
    for pod_id in ("a", "f"):
        fold.run(Release(pod_id))
        assert summed(fold.cluster) == restricted_demand(fold.cluster.shape_counts)
    assert ("V100",) not in fold.cluster.pinned_demand  # a set whose last pod left is gone
    restored = from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(fold.state))))
    assert summed(restored.clusters["c0"]) == summed(fold.cluster)
    assert state_hash(restored) == state_hash(fold.state)
    cluster = fold.cluster
    risk = model_risk_of_demand(cluster.gpu_demand, cluster.pinned_demand, cluster.index)
    assert risk == model_risk(cluster.shape_counts, cluster.index) != {}
