"""fgd: Fragmentation Gradient Descent (Weng et al., USENIX ATC '23), as in the authors' simulator.

Each pod goes where the expected GPU fragmentation of the node grows least
(``schemas.fragmentation``, measured against the cluster's learned typical
pods). For a GPU-share pod every GPU of the node is tried and the one with the
smallest growth is used; whole GPUs are the lowest-index idle ones.

Faithful to the simulator's ``FGDScore`` plugin: the node score is
``int(sigmoid((frag_before - frag_after) / 1000) * 100)`` (higher wins), so nodes
whose growth differs by less than about 40 milli tie; kube-scheduler breaks
such ties at random, here they break on node id (in the experiment node ids
follow the seed's shuffled node order).

Speed: a node's score depends only on its free-capacity signature, the pod
shape and the typical pods, so scores are memoised per (capacity-index group,
shape) and fragmentation per (free vector, CPU free, model); the memo is
dropped whenever the cluster's typical pods are refreshed. A placement then
costs one dict lookup per feasible group, plus O(T·G²) for each group not seen
before with this shape (T typical pods, G GPUs per node).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from processor.core.fragmentation import Fragmenter
from processor.core.policies.base import Choice, Policy, with_gpu_memory
from processor.core.resources import PodShape, Signature
from schemas.commands import GPU_MILLI
from schemas.events import GpuShare
from schemas.fragmentation import Typical

if TYPE_CHECKING:
    from processor.core.capacity import NodeGroup
    from processor.core.state import ClusterState

MEMO_LIMIT = 400_000  # entries per cluster before the memo is dropped and rebuilt lazily

# An evaluated option: (frag before, frag after, free milli of the share GPU used, or -1)
Option = tuple[float, float, int]


class FragMemo:
    """Per-cluster caches, valid for one typical-pod list (compared by identity)."""

    __slots__ = ("compute", "frag", "options", "size", "typical")

    def __init__(self, typical: Typical, compute: Fragmenter | None = None) -> None:
        self.typical = typical
        self.compute = compute if compute is not None else Fragmenter(typical)
        self.frag: dict[tuple[tuple[int, ...], int, str], float] = {}
        self.options: dict[tuple[int, int, int], dict[NodeGroup, tuple[tuple[float, ...], int]]] = {}
        self.size = 0

    def fragmentation(self, gpu_free: tuple[int, ...], cpu_free: int, model: str) -> float:
        key = (gpu_free, cpu_free, model)
        value = self.frag.get(key)
        if value is None:
            value = self.frag[key] = self.compute(gpu_free, cpu_free, model)
            self.size += 1
        return value


def after_share(gpu_free: tuple[int, ...], used: int, milli: int) -> tuple[int, ...]:
    """The sorted-descending free vector after taking ``milli`` from one GPU with ``used`` free."""
    index = gpu_free.index(used)
    rest = gpu_free[:index] + gpu_free[index + 1 :]
    left = used - milli
    return tuple(sorted((*rest, left), reverse=True))


def after_whole(gpu_free: tuple[int, ...], count: int) -> tuple[int, ...]:
    """The free vector after taking ``count`` idle GPUs (the first ``count``, as it is sorted descending)."""
    return tuple(sorted((*gpu_free[count:], *([0] * count)), reverse=True))


def options_for(memo: FragMemo, signature: Signature, shape: PodShape) -> list[Option]:
    """Every distinct way of placing the shape on a node of this signature, with its fragmentation."""
    gpu_free, cpu_free, model = signature.gpu_free, signature.cpu_free, signature.gpu_model
    before = memo.fragmentation(gpu_free, cpu_free, model)
    cpu_after = cpu_free - shape.cpu_milli
    if shape.num_gpu == 0:
        return [(before, memo.fragmentation(gpu_free, cpu_after, model), -1)]
    if shape.gpu_milli >= GPU_MILLI:
        return [(before, memo.fragmentation(after_whole(gpu_free, shape.num_gpu), cpu_after, model), -1)]
    options = []
    for used in sorted(set(gpu_free)):
        if used >= shape.gpu_milli:
            after = memo.fragmentation(after_share(gpu_free, used, shape.gpu_milli), cpu_after, model)
            options.append((before, after, used))
    return options


def gpus_on_node(gpu_free: list[int], shape: PodShape, used: int) -> tuple[GpuShare, ...]:
    """The GPUs for the chosen option: a share on the lowest-index GPU with ``used`` free milli;
    whole GPUs on the lowest-index idle ones (the simulator's AllocateExclusiveGpuId)."""
    if shape.num_gpu == 0:
        return ()
    if shape.gpu_milli < GPU_MILLI:
        return (GpuShare(gpu_free.index(used), shape.gpu_milli),)
    chosen = [i for i, free in enumerate(gpu_free) if free >= GPU_MILLI][: shape.num_gpu]
    return tuple(GpuShare(i, GPU_MILLI) for i in chosen)


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


class FragmentationPolicy(Policy):
    """Shared machinery of fragmentation-aware policies: per-cluster memo of per-group evaluations.

    Subclasses define :meth:`evaluate` (a group's best option as a comparable key,
    lower wins, plus the share GPU to use and the scores to report).
    """

    score_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self._memos: dict[str, FragMemo] = {}

    def memo(self, cluster: ClusterState) -> FragMemo:
        memo = self._memos.get(cluster.name)
        if memo is None or memo.typical is not cluster.typical or memo.size > MEMO_LIMIT:
            memo = self._memos[cluster.name] = FragMemo(cluster.typical)
        return memo

    def evaluate(self, memo: FragMemo, signature: Signature, shape: PodShape) -> tuple[tuple[float, ...], int]:
        """(key, share GPU free milli) of the best option on a node of this signature; lower key wins."""
        raise NotImplementedError

    def place(self, cluster: ClusterState, shape: PodShape, groups: list[NodeGroup]) -> Choice:
        node_id, key, used = self.best(cluster, shape, groups)
        node = cluster.nodes[node_id]
        return Choice(node_id, with_gpu_memory(node, shape, gpus_on_node(node.gpu_free, shape, used)), self.report(key))

    def best(
        self,
        cluster: ClusterState,
        shape: PodShape,
        groups: list[NodeGroup],
        rank: Callable[[NodeGroup, tuple[float, ...]], tuple[float, ...]] | None = None,
    ) -> tuple[str, tuple[float, ...], int]:
        """(node id, key, share GPU free milli) of the best group: lowest key, then node id.

        ``rank`` may turn a group's evaluated key into the key compared (``fgd-plus``
        inserts its scarce-model flag); evaluations are memoised per group either way.
        """
        memo = self.memo(cluster)
        # Options depend on the request only through (GPUs, milli per GPU, CPU): memory and
        # models only decide feasibility, which the groups already passed.
        request = (shape.num_gpu, shape.gpu_milli, shape.cpu_milli)
        per_shape = memo.options.get(request)
        if per_shape is None:
            per_shape = memo.options[request] = {}
        evaluate = self.evaluate
        lookup = per_shape.get
        best_group = groups[0]
        best_key: tuple[float, ...] | None = None
        best_used = -1
        for group in groups:
            found = lookup(group)
            if found is None:
                found = per_shape[group] = evaluate(memo, group.signature, shape)
                memo.size += 1
            key, used = found  # type: ignore[misc]
            if rank is not None:
                key = rank(group, key)
            if best_key is None or key < best_key or (key == best_key and group.first() < best_group.first()):
                best_group, best_key, best_used = group, key, used
        assert best_key is not None
        return best_group.first(), best_key, best_used

    def report(self, key: tuple[float, ...]) -> dict[str, float]:
        return dict(zip(self.score_names, map(float, key), strict=False))


class Fgd(FragmentationPolicy):
    name = "fgd"
    description = "FGD (ATC '23): least growth of expected GPU fragmentation, integer sigmoid score as published"
    score_names = ("fgd_score_negated", "frag_growth_milli")

    def evaluate(self, memo: FragMemo, signature: Signature, shape: PodShape) -> tuple[tuple[float, ...], int]:
        best: tuple[float, float] | None = None
        best_used = -1
        for before, after, used in options_for(memo, signature, shape):
            growth = after - before
            # The GPU inside the node: largest score, then (our tie-break) smallest growth, then best fit.
            candidate = (-float(int(sigmoid(-growth / 1000) * 100)), growth)
            if best is None or candidate < best:
                best, best_used = candidate, used
        assert best is not None
        return (best[0],), best_used

    def report(self, key: tuple[float, ...]) -> dict[str, float]:
        return {"fgd_score": -key[0]}
