"""GPU memory: a node declares the memory of each GPU (AddNode.gpu_memory_mib), a pod what it needs on each of its
GPUs (SubmitPod.gpu_memory_mib); pods on one GPU never ask for more than it has (INSUFFICIENT_GPU_MEMORY)."""

from __future__ import annotations

import pytest

from processor.core.explain import explain
from processor.core.snapshot import from_snapshot, to_snapshot
from schemas.commands import AddNode, Release, SetPolicy, SubmitPod
from tests.strategies import Fold, clusters_hash, types

POLICIES = ["first-fit", "best-fit", "spread", "fgd", "fgd-plus", "fgd-pack", "random", "gpu-packing"]


def share(pod_id: str, milli: int, memory: int, **kwargs: object) -> SubmitPod:
    return SubmitPod(pod_id, num_gpu=1, gpu_milli=milli, cpu_milli=100, gpu_memory_mib=memory, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", POLICIES)
def test_two_shares_that_fit_in_compute_but_not_in_memory_go_to_different_gpus(policy: str) -> None:
    """Two 300-milli shares asking 30 GiB each on a 40 GiB GPU: never the same GPU, whatever the policy."""
    fold = Fold()
    fold.run_all(SetPolicy(policy), AddNode("a", 8000, 65536, "A100", 2, gpu_memory_mib=40_960))
    fold.run_all(share("p1", 300, 30_720), share("p2", 300, 30_720))
    gpus = [fold.cluster.pods[p].gpus[0].index for p in ("p1", "p2")]
    assert sorted(gpus) == [0, 1]
    (queued,) = fold.run(share("p3", 300, 30_720))
    assert queued.type_name == "PodQueued"
    assert [r.code for r in queued.payload.reasons] == ["INSUFFICIENT_GPU_MEMORY"]
    assert queued.payload.reasons[0].nodes == 1
    assert fold.cluster.nodes["a"].gpu_memory_free == [10_240, 10_240]


def test_a_pod_without_gpu_memory_shares_a_full_gpu_memory() -> None:
    """A share that asks no GPU memory still fits (compute only), as before."""
    fold = Fold()
    fold.run_all(AddNode("a", 8000, 65536, "A100", 1, gpu_memory_mib=40_960), share("big", 300, 40_960))
    (placed,) = fold.run(share("light", 300, 0))
    assert placed.type_name == "PodScheduled"


def test_a_node_without_gpu_memory_checks_nothing() -> None:
    """On a node that declares no GPU memory, a pod's gpu_memory_mib is not checked (today's behaviour)."""
    fold = Fold()
    fold.run(AddNode("a", 8000, 65536, "A100", 1))
    assert types(fold.run_all(share("p1", 300, 99_999), share("p2", 300, 99_999))) == ["PodScheduled"] * 2


def test_a_whole_gpu_pod_needs_a_gpu_with_enough_memory() -> None:
    """A whole-GPU pod asking more memory than any GPU has waits on INSUFFICIENT_GPU_MEMORY; a bigger node takes it."""
    fold = Fold()
    fold.run(AddNode("small", 8000, 65536, "A100", 4, gpu_memory_mib=16_384))
    (queued,) = fold.run(SubmitPod("w", num_gpu=2, gpu_milli=1000, gpu_memory_mib=40_000))
    assert [r.code for r in queued.payload.reasons] == ["INSUFFICIENT_GPU_MEMORY"]
    events = fold.run(AddNode("big", 8000, 65536, "A100", 4, gpu_memory_mib=81_920))
    assert types(events) == ["NodeAdded", "PodScheduled"]
    assert events[1].payload.node_id == "big"


def test_released_memory_is_free_again_and_the_queue_retries() -> None:
    """Releasing a pod gives its GPU memory back: the waiting pod starts on that GPU."""
    fold = Fold()
    fold.run_all(AddNode("a", 8000, 65536, "A100", 1, gpu_memory_mib=40_960), share("p1", 200, 30_000))
    fold.run(share("p2", 200, 30_000))
    events = fold.run(Release("p1"))
    assert types(events) == ["PodReleased", "PodScheduled"]
    assert fold.cluster.nodes["a"].gpu_memory_free == [10_960]


def test_the_policy_choice_moves_to_a_gpu_with_memory() -> None:
    """best-fit would put a share on the fullest GPU; if that GPU lacks the memory, the next best GPU is used."""
    fold = Fold()
    fold.run_all(
        SetPolicy("best-fit"),
        AddNode("a", 8000, 65536, "A100", 2, gpu_memory_mib=40_960),
        share("cpu-heavy-share", 500, 38_000),  # GPU 0: 500 milli, 2,960 MiB free
    )
    (placed,) = fold.run(share("p", 400, 10_000))
    assert placed.payload.gpus[0].index == 1


def test_explain_names_the_gpu_memory() -> None:
    """explain reports INSUFFICIENT_GPU_MEMORY with its words."""
    fold = Fold()
    fold.run_all(AddNode("a", 8000, 65536, "A100", 1, gpu_memory_mib=16_000), share("p", 100, 20_000))
    result = explain(fold.cluster, "p")
    assert result is not None
    (reason,) = result.reasons
    assert reason["code"] == "INSUFFICIENT_GPU_MEMORY"
    assert "20000 MiB of GPU memory" in reason["message"]


def test_a_memory_pod_waits_instead_of_preempting_and_is_never_movable() -> None:
    """The victim searches do not model GPU memory: a pod asking for it does not preempt, and is not movable."""
    fold = Fold()
    fold.run_all(
        AddNode("a", 8000, 65536, "A100", 1, gpu_memory_mib=40_960),
        SubmitPod("low", num_gpu=1, gpu_milli=1000, cpu_milli=100),
    )
    (queued,) = fold.run(share("high", 500, 1_000, priority=10, movable=True))
    assert queued.type_name == "PodQueued"
    assert fold.cluster.pods["high"].spec.movable is False


def test_gpu_memory_survives_a_snapshot() -> None:
    """A restored state has the same GPU memory free on each GPU and places the same way."""
    fold = Fold()
    fold.run_all(AddNode("a", 8000, 65536, "A100", 2, gpu_memory_mib=40_960), share("p1", 300, 30_720))
    restored = from_snapshot(to_snapshot(fold.state))
    node = restored.clusters["c0"].nodes["a"]
    assert (node.gpu_memory_mib, node.gpu_memory_free) == (40_960, [10_240, 40_960])
    assert clusters_hash(restored) == clusters_hash(fold.state)


def test_gpu_memory_out_of_range_or_without_gpu_is_refused() -> None:
    """Negative memory is INVALID_RESOURCES; GPU memory for a pod with no GPU too."""
    fold = Fold()
    fold.run(AddNode("a", 8000, 65536, "A100", 1, gpu_memory_mib=40_960))
    (rejected,) = fold.run(SubmitPod("p", cpu_milli=100, gpu_memory_mib=10))
    assert rejected.payload.code == "INVALID_RESOURCES"
    (rejected,) = fold.run(AddNode("b", 8000, 65536, "A100", 1, gpu_memory_mib=-1))
    assert rejected.type_name == "CommandRejected"
