"""fgd-plus: gpufold's default policy, fragmentation gradient descent with best-fit among near-equals,
and GPU models kept for the pods that can only run on them.

Like :mod:`fgd` it scores each node by the growth of its expected GPU
fragmentation (against the typical pods the fold learns online), trying every
GPU of the node for a share, and squashes the growth through a sigmoid into an
integer score: ``int(sigmoid(-growth / 1000) * RESOLUTION)``. With RESOLUTION 50
(FGD uses 100) nodes whose growth differs by less than ~80 milli near zero are
equals. FGD breaks its ties at random (kube-scheduler); fgd-plus breaks them:

1. **Scarce model last.** A GPU model is *scarce* when the pods that may only
   run on a few models would, at the learned mix, need at least all of its idle
   GPUs before the cluster fills up: ``demand_share(model) * idle(all) >=
   idle(model)``, where ``demand_share`` is the share of the typical pods' GPU
   demand whose allowed models include ``model`` (pods that allow any model do
   not count). Among equal scores a GPU pod goes to a model that is not scarce.
   FGD's fragmentation only sees one node at a time, so without this it fills
   the models that model-constrained pods depend on with pods that could have
   run anywhere (measured on the ``gpuspec`` traces, BENCHMARKS.md). The
   threshold is the point where the supply runs out, not a tuned constant.
2. **Best fit**: the node left with the least free GPU milli, then the least
   free CPU, then the smaller exact growth, then node id.

Why best fit, measured on openb (BENCHMARKS.md): ranking by the exact growth
alone is worse than FGD (it spreads pods over nodes whose growth differs by
noise, above all while the typical pods are still being learned); best fit among
near-equals packs pods onto already used nodes, which keeps whole nodes free for
the pods that need them; a coarser score widens the near-equal classes where
best fit decides, which measured better than FGD's resolution.

``PodScheduled.scores`` carries the FGD score, whether the node's model was
scarce, the growth and the leftovers of the chosen node.

Cost: the per-group option memo of :class:`FragmentationPolicy`; the scarcity
test is O(1) per model (idle GPU milli per model is kept by the capacity index,
demand shares are computed once per typical-pod list).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from processor.core.policies.base import Choice, with_gpu_memory
from processor.core.policies.fgd import FragMemo, FragmentationPolicy, gpus_on_node, options_for, sigmoid
from processor.core.resources import PodShape, Signature
from schemas.fragmentation import Typical

if TYPE_CHECKING:
    from processor.core.capacity import NodeGroup
    from processor.core.state import ClusterState

RESOLUTION = 50  # FGD's is 100: score = int(sigmoid(-growth / 1000) * RESOLUTION)


def model_demand_shares(typical: Typical) -> dict[str, float]:
    """For each GPU model named by a typical pod, the share of the typical pods' GPU demand
    (weight x GPUs x milli) that may run on it *and* is restricted to a list of models. O(T·M)."""
    total = sum(pod.weight * pod.key.num_gpu * pod.key.gpu_milli for pod in typical)
    shares: dict[str, float] = {}
    if total <= 0:
        return shares
    for pod in typical:
        demand = pod.weight * pod.key.num_gpu * pod.key.gpu_milli
        if demand and pod.key.gpu_models:
            for model in pod.key.gpu_models:
                shares[model] = shares.get(model, 0.0) + demand / total
    return shares


def scarce_models(cluster: ClusterState, shares: dict[str, float]) -> frozenset[str]:
    """Models whose idle GPUs the model-restricted demand would use up before the cluster fills. O(M)."""
    idle = cluster.index.gpu_free()
    return frozenset(
        model for model, share in shares.items() if share > 0 and share * idle >= cluster.index.gpu_free(model)
    )


class FgdPlus(FragmentationPolicy):
    name = "fgd-plus"
    description = "FGD's fragmentation score (learned typical pods), then scarce GPU models last, then best fit"
    score_names = ("fgd_score_negated", "gpu_milli_left", "cpu_milli_left", "frag_growth_milli")

    def __init__(self, resolution: int = RESOLUTION) -> None:
        super().__init__()
        self.resolution = resolution
        self._shares: dict[str, tuple[Typical, dict[str, float]]] = {}

    def evaluate(self, memo: FragMemo, signature: Signature, shape: PodShape) -> tuple[tuple[float, ...], int]:
        gpu_left = float(sum(signature.gpu_free) - shape.num_gpu * shape.gpu_milli)
        cpu_left = float(signature.cpu_free - shape.cpu_milli)
        best: tuple[float, ...] | None = None
        best_used = -1
        for before, after, used in options_for(memo, signature, shape):
            growth = round(after - before, 6)
            score = float(int(sigmoid(-growth / 1000) * self.resolution))
            # Inside the node gpu_left and cpu_left are the same for every GPU: growth decides.
            candidate = (-score, gpu_left, cpu_left, growth)
            if best is None or candidate < best:
                best, best_used = candidate, used
        assert best is not None
        return best, best_used

    def demand_shares(self, cluster: ClusterState) -> dict[str, float]:
        cached = self._shares.get(cluster.name)
        if cached is None or cached[0] is not cluster.typical:
            cached = self._shares[cluster.name] = (cluster.typical, model_demand_shares(cluster.typical))
        return cached[1]

    def place(self, cluster: ClusterState, shape: PodShape, groups: list[NodeGroup]) -> Choice:
        scarce = scarce_models(cluster, self.demand_shares(cluster)) if shape.num_gpu else frozenset()
        if not scarce or all(group.signature.gpu_model in scarce for group in groups):
            choice = super().place(cluster, shape, groups)
            choice.scores["model_scarce"] = float(bool(scarce))
            return choice

        # Some feasible models are scarce and some are not: the flag goes right after the FGD score.
        def rank(group: NodeGroup, base: tuple[float, ...]) -> tuple[float, ...]:
            return (base[0], float(group.signature.gpu_model in scarce), *base[1:])

        node_id, key, used = self.best(cluster, shape, groups, rank)
        scores = self.report((key[0], *key[2:]))
        scores["model_scarce"] = key[1]
        node = cluster.nodes[node_id]
        return Choice(node_id, with_gpu_memory(node, shape, gpus_on_node(node.gpu_free, shape, used)), scores)

    def report(self, key: tuple[float, ...]) -> dict[str, float]:
        return {"fgd_score": -key[0], "gpu_milli_left": key[1], "cpu_milli_left": key[2], "frag_growth_milli": key[3]}
