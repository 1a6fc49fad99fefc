"""FGD's GPU fragmentation measure (Weng et al., USENIX ATC '23) and the typical pods it is measured against.

This is the measure every side agrees on: the fold learns typical pods and records
them in its snapshots (``TypicalPodSnapshot`` in ``snapshot.avsc``), its policies
score nodes by it, and the read side reports it for projected nodes. Everything
here is pure.

Typical pods are the most common request shapes (GPU count, GPU milli per GPU,
CPU milli, allowed models; memory is not part of the shape, as in the paper)
covering at least 95% of the pods, weighted by popularity.

The fragmentation of a node for one typical pod, in GPU milli:

- the pod cannot run there (other GPU model, not enough GPUs, not enough CPU,
  or it asks for no GPU at all): every idle GPU milli of the node is fragment;
- it can: only the GPUs whose free share is below the pod's per-GPU request.

A node's fragmentation is the popularity-weighted sum over typical pods; the
cluster's is the sum over nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

POPULARITY_THRESHOLD = 0.95


class TypicalKey(NamedTuple):
    """The part of a pod request that FGD's typical pods look at."""

    num_gpu: int
    gpu_milli: int  # per GPU
    cpu_milli: int
    gpu_models: tuple[str, ...]  # sorted; empty = any


class TypicalPod(NamedTuple):
    key: TypicalKey
    weight: float  # popularity, the weights of a typical-pod list sum to 1


Typical = tuple[TypicalPod, ...]


def derive_typical(counts: Mapping[TypicalKey, int], threshold: float = POPULARITY_THRESHOLD) -> Typical:
    """The most popular shapes covering ``threshold`` of the pods, weights renormalised to sum to 1.

    Shapes are ranked by count, ties by the larger (CPU, GPU milli, GPU count, models)
    as in the simulator's reversed sort, so the result does not depend on dict order.
    O(K log K) for K shapes.
    """
    total = sum(counts.values())
    if total <= 0:
        return ()
    ranked = sorted(
        ((count, key) for key, count in counts.items() if count > 0),
        key=lambda item: (item[0], item[1].cpu_milli, item[1].gpu_milli, item[1].num_gpu, "|".join(item[1].gpu_models)),
        reverse=True,
    )
    chosen: list[tuple[int, TypicalKey]] = []
    covered = 0
    for count, key in ranked:
        if covered >= threshold * total:
            break
        chosen.append((count, key))
        covered += count
    return tuple(TypicalPod(key, count / covered) for count, key in chosen)


def frag_for(gpu_free: tuple[int, ...], cpu_free: int, gpu_model: str, key: TypicalKey) -> int:
    """Fragment GPU milli of a node (free per GPU, CPU free, model) for one typical pod. O(G)."""
    idle = sum(gpu_free)
    if not idle or key.gpu_milli == 0:
        return idle
    if key.gpu_models and gpu_model not in key.gpu_models:
        return idle
    if cpu_free < key.cpu_milli:
        return idle
    need = key.gpu_milli
    if sum(1 for free in gpu_free if free >= need) < key.num_gpu:
        return idle
    return sum(free for free in gpu_free if free < need)


def node_fragmentation(gpu_free: tuple[int, ...], cpu_free: int, gpu_model: str, typical: Typical) -> float:
    """Expected fragment GPU milli of a node under the typical-pod distribution. O(T·G)."""
    if not any(gpu_free):
        return 0.0
    return sum(pod.weight * frag_for(gpu_free, cpu_free, gpu_model, pod.key) for pod in typical)
