"""FGD's GPU fragmentation metric (Weng et al., USENIX ATC '23) and the typical pods it is measured against.

Typical pods are the most common request shapes (GPU count, GPU milli per GPU,
CPU milli, allowed models; memory is not part of the shape, as in the paper)
covering at least 95% of the pods, weighted by popularity. The fold learns them
online: each cluster keeps a histogram of the shapes of its present pods and
refreshes ``ClusterState.typical`` from it at arrival checkpoints (see
:func:`is_checkpoint`), so every decision depends only on folded commands.

The fragmentation of a node for one typical pod, in GPU milli:

- the pod cannot run there (other GPU model, not enough GPUs, not enough CPU,
  or it asks for no GPU at all): every idle GPU milli of the node is fragment;
- it can: only the GPUs whose free share is below the pod's per-GPU request.

A node's fragmentation is the popularity-weighted sum over typical pods; the
cluster's is the sum over nodes. All functions here are pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from processor.resources import PodShape, Signature

if TYPE_CHECKING:
    from processor.state import ClusterState

POPULARITY_THRESHOLD = 0.95
CHECKPOINT_EVERY = 256
REFRESH_TOLERANCE = 0.02


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


def typical_key(shape: PodShape) -> TypicalKey:
    return TypicalKey(shape.num_gpu, shape.gpu_milli, shape.cpu_milli, shape.gpu_models)


def is_checkpoint(arrivals: int) -> bool:
    """Whether the typical pods are refreshed when the cluster's arrival count reaches this value.

    Powers of two up to 256, then every 256 arrivals: the learned distribution settles
    quickly, and a refresh (which invalidates cached fragmentation scores) stays rare.
    """
    return arrivals > 0 and (arrivals & (arrivals - 1) == 0 or arrivals % CHECKPOINT_EVERY == 0)


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


def typical_moved(old: Typical, new: Typical, tolerance: float = REFRESH_TOLERANCE) -> bool:
    """Whether a freshly derived typical-pod list differs enough from the current one to replace it.

    A refresh invalidates every cached fragmentation score, so the learned list is
    only replaced when its shapes change or the weights move by more than
    ``tolerance`` in L1 distance. Both lists are in the state, so this stays pure.
    """
    if not old or not new:
        return old != new
    weights = {pod.key: pod.weight for pod in old}
    if set(weights) != {pod.key for pod in new}:
        return True
    return sum(abs(weights[pod.key] - pod.weight) for pod in new) > tolerance


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


class Fragmenter:
    """:func:`node_fragmentation` for one typical-pod list, precompiled for speed.

    Equal to the reference up to float rounding; each distinct per-GPU request is
    screened once per node, so a call is O(D·G + T) for D distinct requests.
    """

    __slots__ = ("cpu_only", "needs", "pods", "typical")

    def __init__(self, typical: Typical) -> None:
        self.typical = typical
        self.cpu_only = sum(pod.weight for pod in typical if pod.key.gpu_milli == 0)
        self.pods = [
            (pod.weight, pod.key.gpu_milli, pod.key.num_gpu, pod.key.cpu_milli, frozenset(pod.key.gpu_models))
            for pod in typical
            if pod.key.gpu_milli > 0
        ]
        self.needs = sorted({need for _, need, _, _, _ in self.pods})

    def __call__(self, gpu_free: tuple[int, ...], cpu_free: int, gpu_model: str) -> float:
        idle = sum(gpu_free)
        if not idle:
            return 0.0
        fitting: dict[int, tuple[int, int]] = {}
        for need in self.needs:
            count = 0
            small = 0
            for free in gpu_free:
                if free >= need:
                    count += 1
                else:
                    small += free
            fitting[need] = (count, small)
        total = self.cpu_only * idle
        for weight, need, num_gpu, cpu, models in self.pods:
            if cpu_free < cpu or (models and gpu_model not in models):
                total += weight * idle
                continue
            count, small = fitting[need]
            total += weight * (small if count >= num_gpu else idle)
        return total


def signature_fragmentation(signature: Signature, typical: Typical) -> float:
    return node_fragmentation(signature.gpu_free, signature.cpu_free, signature.gpu_model, typical)


class ClusterFragmentation(NamedTuple):
    fragment_milli: float  # expected fragment GPU milli over schedulable nodes
    idle_milli: int  # idle GPU milli over schedulable nodes
    capacity_milli: int  # GPU milli of nodes that are not failed

    @property
    def fragment_pct_of_capacity(self) -> float:
        return 100.0 * self.fragment_milli / self.capacity_milli if self.capacity_milli else 0.0

    @property
    def fragment_pct_of_idle(self) -> float:
        return 100.0 * self.fragment_milli / self.idle_milli if self.idle_milli else 0.0


def cluster_fragmentation(
    cluster: ClusterState, typical_pods: Iterable[TypicalPod] | None = None
) -> ClusterFragmentation:
    """FGD's fragmentation of a cluster (default: its learned typical pods), for live metrics.

    Nodes are visited by capacity-index group, so the cost is O(S·T·G) for S
    distinct signatures, not per node; unschedulable nodes are left out.
    """
    typical = tuple(typical_pods) if typical_pods is not None else cluster.typical
    fragment = 0.0
    idle = 0
    for group in cluster.index.groups():
        signature = group.signature
        count = len(group)
        idle += sum(signature.gpu_free) * count
        fragment += signature_fragmentation(signature, typical) * count
    return ClusterFragmentation(fragment, idle, cluster.gpu_milli_capacity)
