"""Each FGD-paper baseline picks, on a small hand-built cluster, the node its published definition picks."""

from __future__ import annotations

import pytest

from processor.core.policies.gpu_packing import packing_score
from processor.core.policies.paper_best_fit import raw_score
from processor.core.policies.random_pick import draw
from processor.core.resources import PodShape, Signature
from schemas.commands import AddNode, SetPolicy, SubmitPod
from schemas.events import PodScheduled
from tests.strategies import Fold


def cluster(policy: str, *nodes: AddNode, pods: tuple[SubmitPod, ...] = ()) -> Fold:
    fold = Fold()
    fold.run_all(*nodes, SetPolicy(policy), *pods)
    return fold


def place(fold: Fold, pod: SubmitPod) -> PodScheduled:
    event = fold.run(pod)[-1].payload
    assert isinstance(event, PodScheduled), event
    return event


def share(pod_id: str, milli: int, cpu: int = 1000) -> SubmitPod:
    return SubmitPod(pod_id, num_gpu=1, gpu_milli=milli, cpu_milli=cpu, memory_mib=1024)


def whole(pod_id: str, count: int, cpu: int = 1000) -> SubmitPod:
    return SubmitPod(pod_id, num_gpu=count, gpu_milli=1000, cpu_milli=cpu, memory_mib=1024)


def gpu_node(node_id: str, gpus: int = 2, cpu: int = 64000) -> AddNode:
    return AddNode(node_id, cpu, 262144, "V100", gpus)


def signature(gpu_free: tuple[int, ...], cpu_free: int) -> Signature:
    return Signature("V100", ((), ()), 64000, 262144, gpu_free, cpu_free, 262144)


def shape(num_gpu: int, gpu_milli: int, cpu: int) -> PodShape:
    return PodShape(num_gpu, gpu_milli, cpu, 1024, (), (), ())


# ---------------------------------------------------------------- dot-product


def test_dot_product_prefers_the_smallest_dot_product() -> None:
    """The simulator ranks the smallest dot product of free and asked (CPU, GPU) first: the emptier node loses."""
    fold = cluster("dot-product", gpu_node("a"), gpu_node("b"), pods=(whole("x", 1, cpu=32000),))
    assert fold.placement("x") == "a"  # tie on an empty cluster: smallest id
    # a: 1 GPU and 32 cores free -> smaller dot product than b (2 GPUs, 64 cores): a wins.
    assert place(fold, whole("y", 1)).node_id == "a"


def test_dot_product_scores_are_integers_as_published() -> None:
    """The score is int(100 * (1 - dot / 2)) with (CPU / 128,000, GPU / 8,000) vectors, ties on node id."""
    fold = cluster("dot-product", gpu_node("a"), gpu_node("b"))
    event = place(fold, whole("x", 1, cpu=8000))
    dot = (64000 / 128000) * (8000 / 128000) + (2000 / 8000) * (1000 / 8000)
    assert event.scores == {"dot_product_score_negated": -float(int(100 * (1 - dot / 2)))}


# ---------------------------------------------------------------- gpu-packing


@pytest.mark.parametrize(
    ("gpu_free", "num_gpu", "milli", "expected"),
    [
        ((1000, 1000), 1, 1000, 33 - 2),  # idle node: max(33 - GPUs, GPUs)
        ((1000,) * 8, 1, 1000, 25),
        ((1000, 500), 1, 1000, 49),  # partly used node, one idle GPU used: 50 - 1
        ((1000, 500), 1, 300, 95),  # share on the used GPU: 100 - 50 / 10
        ((1000, 0), 1, 300, 49),  # only the idle GPU fits
    ],
)
def test_gpu_packing_score_follows_the_three_cases(gpu_free: tuple, num_gpu: int, milli: int, expected: int) -> None:
    """Shared GPUs first (50-100), then idle GPUs of used nodes (33-50), then idle nodes (0-33)."""
    assert packing_score(gpu_free, len(gpu_free), num_gpu, milli) == expected


def test_gpu_packing_puts_a_share_on_a_used_gpu() -> None:
    """A GPU share goes to the node whose used GPU has room, not to an idle node."""
    fold = cluster("gpu-packing", gpu_node("a"), gpu_node("b"), pods=(whole("x", 1),))
    fold.run(share("s1", 500))  # a has one idle GPU left (case 2: 49), b is idle (31): a wins
    assert fold.placement("s1") == "a"
    assert place(fold, share("s2", 300)).node_id == "a"  # on the GPU with 500 free (case 1)


# ---------------------------------------------------------------- best-fit-paper


def test_paper_best_fit_weighs_cpu_and_gpu_left() -> None:
    """Least (0.5 CPU left / 128 cores + 0.5 GPU left / 8 GPUs): a node short of CPU can win over one with less GPU."""
    small_cpu = AddNode("a", 8000, 262144, "V100", 4)
    big_cpu = AddNode("b", 128000, 262144, "V100", 2)
    fold = cluster("best-fit-paper", small_cpu, big_cpu)
    # a leaves 3 GPUs and 7 cores, b leaves 1 GPU and 127 cores: a's score is higher.
    assert raw_score(signature((1000,) * 4, 8000), shape(1, 1000, 1000)) > raw_score(
        signature((1000, 1000), 128000), shape(1, 1000, 1000)
    )
    assert place(fold, whole("x", 1)).node_id == "a"


def test_paper_best_fit_normalises_scores_with_integer_arithmetic() -> None:
    """Scores are min-max normalised to 0..100 over the feasible nodes; the chosen node reports 100."""
    fold = cluster("best-fit-paper", gpu_node("a"), gpu_node("b", gpus=4))
    assert place(fold, whole("x", 1)).scores == {"best_fit_score": 100.0}


# ---------------------------------------------------------------- gpu-clustering


def test_gpu_clustering_groups_pods_of_the_same_kind() -> None:
    """A share goes to the node already running shares, a whole-GPU pod to the node running whole-GPU pods."""
    fold = cluster(
        "gpu-clustering",
        gpu_node("a", gpus=4),
        gpu_node("b", gpus=4),
        gpu_node("c", gpus=4),
        pods=(whole("w", 1), share("s", 500)),
    )
    assert fold.placement("w") == "a"  # all idle: 25 + 0 everywhere, smallest id
    assert fold.placement("s") == "b"  # a runs another kind (packed only), b and c idle (25): b
    assert place(fold, share("s2", 200)).node_id == "b"  # only its kind: 75 + packed
    assert place(fold, whole("w2", 1)).node_id == "a"


def test_gpu_clustering_gives_cpu_pods_no_preference() -> None:
    """Pods without GPU score 0 everywhere, so the smallest node id wins."""
    fold = cluster("gpu-clustering", gpu_node("b"), gpu_node("a"), pods=(whole("w", 1),))
    assert place(fold, SubmitPod("cpu", cpu_milli=1000)).node_id == "a"


# ---------------------------------------------------------------- random


def test_random_is_a_pure_function_of_the_folded_state() -> None:
    """Two folds of the same commands draw the same nodes; the draw uses no machine randomness."""
    pods = tuple(share(f"p{i}", 100 * (1 + i % 5)) for i in range(20))
    nodes = tuple(gpu_node(f"n{i}", gpus=4) for i in range(6))
    first = cluster("random", *nodes, pods=pods)
    second = cluster("random", *nodes, pods=pods)
    assert [first.placement(f"p{i}") for i in range(20)] == [second.placement(f"p{i}") for i in range(20)]
    assert len({first.placement(f"p{i}") for i in range(20)}) > 2  # it does spread


def test_random_draw_changes_with_the_state() -> None:
    """The draw depends on the arrival count, so consecutive identical pods do not all land on one node."""
    fold = cluster("random", gpu_node("a"))
    before = draw(fold.cluster, shape(1, 100, 0))
    fold.run(share("p", 100))
    assert draw(fold.cluster, shape(1, 100, 0)) != before


# ---------------------------------------------------------------- all of them


@pytest.mark.parametrize(
    "policy", ["random", "dot-product", "gpu-clustering", "gpu-packing", "best-fit-paper", "fgd", "fgd-plus"]
)
def test_every_policy_honours_cpu_memory_and_model(policy: str) -> None:
    """Only a node with enough CPU and memory and an allowed GPU model is ever chosen."""
    fold = cluster(
        policy,
        AddNode("a-small-cpu", 2000, 262144, "V100", 8),
        AddNode("b-small-mem", 64000, 1024, "V100", 8),
        AddNode("c-other-model", 64000, 262144, "T4", 8),
        AddNode("d-fits", 64000, 262144, "V100", 8),
    )
    pod = SubmitPod("p", num_gpu=1, gpu_milli=500, cpu_milli=4000, memory_mib=4096, gpu_models=("V100",))
    assert place(fold, pod).node_id == "d-fits"
