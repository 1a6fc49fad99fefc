"""What a placement policy is: a pure choice of node (and GPUs) among feasible groups.

A policy gets the groups of nodes that can take the pod (never empty) and
returns a :class:`Choice`. It must be deterministic: no clock, no randomness
from the machine, no dependence on set or dict iteration order for the outcome
(ties break on node id). ``score`` values are reported in ``PodScheduled.scores``
so every decision can be explained.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from processor.core.resources import PodShape, Signature
from schemas.commands import GPU_MILLI
from schemas.events import GpuShare

if TYPE_CHECKING:
    from processor.core.capacity import NodeGroup
    from processor.core.state import ClusterState, Node


@dataclass(slots=True)
class Choice:
    node_id: str
    gpus: tuple[GpuShare, ...]
    scores: dict[str, float] = field(default_factory=dict)


class Policy(ABC):
    """A placement policy, registered by ``name``."""

    name: ClassVar[str]
    description: ClassVar[str] = ""

    @abstractmethod
    def place(self, cluster: ClusterState, shape: PodShape, groups: list[NodeGroup]) -> Choice:
        """Choose a node among feasible ``groups`` (non-empty) and the GPUs on it."""

    def choose_gpus(self, node: Node, shape: PodShape) -> tuple[GpuShare, ...]:
        """Default GPU choice: lowest-index free GPUs; a share goes to the best-fitting GPU (with the memory the
        pod asks for, on a node that declares GPU memory)."""
        return with_gpu_memory(node, shape, default_gpus(node.gpu_free, shape))


def with_gpu_memory(node: Node, shape: PodShape, gpus: tuple[GpuShare, ...]) -> tuple[GpuShare, ...]:
    """A policy's choice of GPUs, kept if each has the pod's GPU memory free; else the same rule among the GPUs
    that have it (whole: the lowest-index idle ones; a share: best fit on milli, then the lowest index). O(G).

    The capacity index admitted the node only if such GPUs exist (``gpu_memory_fits``)."""
    need = shape.gpu_memory_mib
    memory = node.gpu_memory_free
    if not need or not memory or all(memory[share.index] >= need for share in gpus):
        return gpus
    free = node.gpu_free
    if shape.gpu_milli >= GPU_MILLI:
        chosen = [i for i, milli in enumerate(free) if milli >= GPU_MILLI and memory[i] >= need][: shape.num_gpu]
        return tuple(GpuShare(i, GPU_MILLI) for i in chosen)
    best = -1
    for i, milli in enumerate(free):
        if milli >= shape.gpu_milli and memory[i] >= need and (best < 0 or milli < free[best]):
            best = i
    return (GpuShare(best, shape.gpu_milli),) if best >= 0 else ()


def default_gpus(gpu_free: list[int], shape: PodShape) -> tuple[GpuShare, ...]:
    """Whole GPUs: the lowest-index fully free ones. A share: the GPU whose free
    milli is smallest but enough (best fit), ties on the lowest index. O(G)."""
    if shape.num_gpu == 0:
        return ()
    if shape.gpu_milli >= GPU_MILLI:
        chosen = [i for i, free in enumerate(gpu_free) if free >= GPU_MILLI][: shape.num_gpu]
        return tuple(GpuShare(i, GPU_MILLI) for i in chosen)
    best = -1
    for i, free in enumerate(gpu_free):
        if free >= shape.gpu_milli and (best < 0 or free < gpu_free[best]):
            best = i
    return (GpuShare(best, shape.gpu_milli),)


class ScoringPolicy(Policy):
    """A policy that ranks signatures by a score tuple (lower is better), then node id.

    Cost per placement: O(k) score evaluations for k feasible groups.
    """

    score_names: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def score(self, signature: Signature, shape: PodShape) -> tuple[float, ...]:
        """The score of placing the shape on a node of this signature (lower wins)."""

    def place(self, cluster: ClusterState, shape: PodShape, groups: list[NodeGroup]) -> Choice:
        score = self.score
        best_group = groups[0]
        best_score = score(best_group.signature, shape)
        for group in groups[1:]:
            candidate = score(group.signature, shape)
            if candidate < best_score or (candidate == best_score and group.first() < best_group.first()):
                best_group, best_score = group, candidate
        node_id = best_group.first()
        scores = dict(zip(self.score_names, map(float, best_score), strict=True))
        return Choice(node_id, self.choose_gpus(cluster.nodes[node_id], shape), scores)
