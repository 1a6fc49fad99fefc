"""FGD's fragmentation over the fold's own structures: a precompiled per-node measure and a cluster's total.

The measure itself is defined once, in :mod:`schemas.fragmentation`; this module
evaluates it fast for the policies (:class:`Fragmenter`, and :class:`BalancedFragmenter`,
which adds the GPU a node's CPU cannot serve) and per capacity-index group for live
metrics (:func:`cluster_fragmentation`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from processor.core.resources import Signature
from processor.core.state import ClusterState
from schemas.fragmentation import Typical, TypicalPod, node_fragmentation


class Fragmenter:
    """:func:`node_fragmentation` for one typical-pod list, precompiled for speed.

    Equal to the reference up to float rounding; each distinct per-GPU request is
    screened once per node, so a call is O(D·G + T) for D distinct requests.
    """

    __slots__ = ("cpu_only", "needs", "pods", "ratio", "typical")

    def __init__(self, typical: Typical) -> None:
        self.typical = typical
        self.ratio = 0.0  # CPU milli per GPU milli; 0: FGD's measure alone (BalancedFragmenter sets it)
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
        if self.ratio > 0.0:
            stranded = idle - cpu_free / self.ratio
            if stranded > 0.0:
                total += stranded
        return total


class BalancedFragmenter(Fragmenter):
    """FGD's measure plus the idle GPU milli a node's free CPU cannot serve at the workload's CPU per GPU.

    FGD counts a node's idle GPU as fragment for a typical pod only once its CPU is
    below that pod's request; until then a CPU-heavy pod on a node with little CPU per
    GPU looks free, and the node ends with idle GPUs and no CPU (measured on openb:
    0.3-0.6% of GPU capacity on ``default`` and ``cpu100``, BENCHMARKS.md). Here every
    idle GPU milli needs ``ratio`` CPU milli, the typical GPU pods' CPU per GPU milli
    (popularity-weighted: ``sum(w * cpu) / sum(w * gpus * milli)``), and the idle milli
    beyond ``cpu_free / ratio`` counts as fragment too: ``max(0, idle - cpu_free / ratio)``.
    A CPU-heavy pod on a CPU-poor node raises it, a light one there lowers it, so CPU goes
    where GPUs will need it. Same cost as :class:`Fragmenter` plus O(1) (it is :class:`Fragmenter` with
    ``ratio`` set, so the fold's FGD measure pays one comparison for it).
    """

    __slots__ = ()

    def __init__(self, typical: Typical) -> None:
        super().__init__(typical)
        self.ratio = cpu_per_gpu_milli(typical)  # the measure itself is Fragmenter's, which adds the term


def cpu_per_gpu_milli(typical: Typical) -> float:
    """CPU milli per GPU milli of the typical GPU pods, popularity-weighted (0 without GPU pods). O(T)."""
    cpu = gpu = 0.0
    for pod in typical:
        key = pod.key
        if key.num_gpu and key.gpu_milli:
            cpu += pod.weight * key.cpu_milli
            gpu += pod.weight * key.num_gpu * key.gpu_milli
    return cpu / gpu if gpu > 0 else 0.0


def stranded_by_cpu(gpu_free: tuple[int, ...], cpu_free: int, typical: Typical) -> float:
    """The reference for :class:`BalancedFragmenter`'s extra term: idle milli beyond what the free CPU serves."""
    ratio = cpu_per_gpu_milli(typical)
    return max(0.0, sum(gpu_free) - cpu_free / ratio) if ratio > 0 else 0.0


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
