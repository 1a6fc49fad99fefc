"""fgd-pack: fragmentation gradient descent that also prices share packing, CPU per GPU and GPU-model supply.

It ranks the ways of placing a pod (node, and GPU for a share) like ``fgd-plus`` —
FGD's fragmentation growth squashed into an integer score at half FGD's
resolution, then best fit (least GPU, then CPU, left on the node), then the exact
growth, then node id — with three changes to what it measures, each aimed at a
cause of unallocated GPU that FGD's node-by-node view misses (measured per openb
variant in BENCHMARKS.md, "Why fgd-plus lost"):

1. **Shares are packed by price** (:mod:`processor.core.share_prices`). A share pod's
   first key is the reduced cost of the GPU it would take: the part of a GPU lost
   against an optimal packing of the learned share mix (the cluster's typical pods).
   FGD puts a 320 into a 470's gap as readily as next to a 650, and the GPUs left with
   one 470, or 470 + 320, are most of the residue above the 810s that nothing fills.
2. **CPU per GPU is part of fragmentation** (:class:`BalancedFragmenter`): idle GPU
   milli that a node's free CPU cannot serve at the typical pods' CPU per GPU counts as
   fragment, so CPU-heavy pods go to CPU-rich nodes and CPU-only pods to nodes whose
   GPUs are taken, instead of leaving whole GPUs on nodes without CPU.
3. **A model's supply is kept for the pods that can only run on it**
   (:mod:`processor.core.model_supply`): taking ``milli`` of a model costs ``milli x
   risk`` more, the risk being the probability that the restricted pods' need for that
   model exceeds its idle GPU. It is added to the growth (and, for a share, to the
   reduced cost, as a part of a GPU), so FGD's preference for filling small nodes
   first no longer eats the T4 or P100 supply that pinned pods need later.

Everything it reads is derived from the log: typical pods (in snapshots), present
pods' shapes and the capacity index. Prices are computed once per typical-pod list
(~10 ms for openb's 11-20 share sizes), risks per GPU pod (O(R) over the pinned model sets,
from the demand the state keeps summed); evaluations are memoised per (group, request, model risk).
``PodScheduled.scores`` carries the reduced cost, the FGD score, the model risk, the
leftovers and the growth of the chosen option.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from processor.core.fragmentation import BalancedFragmenter
from processor.core.model_supply import model_risk_of_demand
from processor.core.policies.base import Choice, with_gpu_memory
from processor.core.policies.fgd import MEMO_LIMIT, FragMemo, FragmentationPolicy, gpus_on_node, options_for, sigmoid
from processor.core.resources import PodShape, Signature
from processor.core.share_prices import SharePrices, share_prices
from schemas.commands import GPU_MILLI
from schemas.fragmentation import Typical

if TYPE_CHECKING:
    from processor.core.capacity import NodeGroup
    from processor.core.state import ClusterState

RESOLUTION = 50  # as fgd-plus: score = int(sigmoid(-growth / 1000) * RESOLUTION)
DIGITS = 6

Request = tuple[int, int, int]  # GPUs, milli per GPU, CPU milli
Evaluated = tuple[tuple[float, ...], int]  # (key, free milli of the share GPU used or -1)
# (GPU milli left, CPU milli left, [(growth, share reduced cost, free milli of the share GPU or -1)])
Measured = tuple[float, float, list[tuple[float, float, int]]]


def share_mix(typical: Typical) -> dict[int, float]:
    """Popularity of each share size (milli) among the typical pods."""
    mix: dict[int, float] = {}
    for pod in typical:
        key = pod.key
        if key.num_gpu == 1 and 0 < key.gpu_milli < GPU_MILLI:
            mix[key.gpu_milli] = mix.get(key.gpu_milli, 0.0) + pod.weight
    return mix


def best_option(measured: Measured, shape: PodShape, risk: float) -> Evaluated:
    """(key, share GPU free milli) of the best option once the model's risk is priced in; lower key wins.

    Taking ``milli`` of a model costs ``milli x risk`` (GPU a pinned pod would have used and no other
    gives back): added to the growth, and for a share to its reduced cost as a part of a GPU."""
    gpu_left, cpu_left, options = measured
    cost = shape.num_gpu * shape.gpu_milli * risk
    share_cost = risk * shape.gpu_milli / GPU_MILLI if shape.is_share else 0.0
    best: tuple[float, ...] | None = None
    best_used = -1
    for raw_growth, raw_reduced, used in options:
        growth = round(raw_growth + cost, DIGITS)
        score = float(int(sigmoid(-growth / 1000) * RESOLUTION))
        reduced = round(raw_reduced + share_cost, DIGITS) if shape.is_share else 0.0
        # Inside the node gpu_left and cpu_left are the same for every GPU: price, then growth decide.
        candidate = (reduced, -score, gpu_left, cpu_left, growth)
        if best is None or candidate < best:
            best, best_used = candidate, used
    assert best is not None
    return best, best_used


class FgdPack(FragmentationPolicy):
    name = "fgd-pack"
    description = (
        "FGD with CPU per GPU in the fragmentation, shares packed by the learned mix's LP prices, "
        "and GPU models kept for the pods pinned to them"
    )
    score_names = ("share_reduced_cost", "fgd_score_negated", "gpu_milli_left", "cpu_milli_left", "frag_growth_milli")

    def __init__(self) -> None:
        super().__init__()
        self._prices: dict[str, tuple[Typical, SharePrices]] = {}
        # Per cluster, valid for one memo: keys per (request, model risk) and group; options per request and group.
        self._evaluated: dict[
            str,
            tuple[
                FragMemo,
                dict[tuple[int, int, int, float], dict[NodeGroup, Evaluated]],
                dict[Request, dict[NodeGroup, Measured]],
            ],
        ] = {}

    def memo(self, cluster: ClusterState) -> FragMemo:
        memo = self._memos.get(cluster.name)
        if memo is None or memo.typical is not cluster.typical or memo.size > MEMO_LIMIT:
            typical = cluster.typical
            memo = self._memos[cluster.name] = FragMemo(typical, BalancedFragmenter(typical))
        return memo

    def prices(self, cluster: ClusterState) -> SharePrices:
        """The share prices of the cluster's typical pods, computed once per typical-pod list."""
        cached = self._prices.get(cluster.name)
        if cached is None or cached[0] is not cluster.typical:
            cached = self._prices[cluster.name] = (cluster.typical, share_prices(share_mix(cluster.typical)))
        return cached[1]

    def risks(self, cluster: ClusterState) -> dict[str, float]:
        """Per GPU model, the risk that pinned pods will need its idle supply (:mod:`processor.core.model_supply`)."""
        return model_risk_of_demand(cluster.gpu_demand, cluster.pinned_demand, cluster.index)

    def place(self, cluster: ClusterState, shape: PodShape, groups: list[NodeGroup]) -> Choice:
        memo = self.memo(cluster)
        evaluated = self._evaluated.get(cluster.name)
        if evaluated is None or evaluated[0] is not memo:
            evaluated = self._evaluated[cluster.name] = (memo, {}, {})
        keys, options = evaluated[1], evaluated[2]
        prices = self.prices(cluster) if shape.is_share else None
        risks = self.risks(cluster) if shape.num_gpu else {}
        request = (shape.num_gpu, shape.gpu_milli, shape.cpu_milli)
        per_request = options.get(request)
        if per_request is None:
            per_request = options[request] = {}
        # Keys per group at the risk of its model: one dict per model met (one in all without pinned pods).
        by_model: dict[str, tuple[float, dict[NodeGroup, Evaluated]]] = {}
        plain = keys.get((*request, 0.0))
        if plain is None:
            plain = keys[(*request, 0.0)] = {}
        best_group = groups[0]
        best_key: tuple[float, ...] | None = None
        best_used = -1
        best_risk = 0.0
        for group in groups:
            risk = 0.0
            keyed = plain
            if risks:
                model = group.signature.gpu_model
                known = by_model.get(model)
                if known is None:
                    risk = risks.get(model, 0.0)
                    at_risk = keys.get((*request, risk))
                    if at_risk is None:
                        at_risk = keys[(*request, risk)] = {}
                    known = by_model[model] = (risk, at_risk)
                risk, keyed = known
            found = keyed.get(group)
            if found is None:
                measured = per_request.get(group)
                if measured is None:
                    measured = per_request[group] = self.measure(memo, group.signature, shape, prices)
                    memo.size += 1
                found = keyed[group] = best_option(measured, shape, risk)
                memo.size += 1
            key, used = found
            if best_key is None or key < best_key or (key == best_key and group.first() < best_group.first()):
                best_group, best_key, best_used, best_risk = group, key, used, risk
        assert best_key is not None
        node_id = best_group.first()
        scores = self.report(best_key)
        if not shape.is_share:
            del scores["share_reduced_cost"]
        if risks:
            scores["model_risk"] = best_risk
        node = cluster.nodes[node_id]
        return Choice(node_id, with_gpu_memory(node, shape, gpus_on_node(node.gpu_free, shape, best_used)), scores)

    def measure(self, memo: FragMemo, signature: Signature, shape: PodShape, prices: SharePrices | None) -> Measured:
        """Every way of placing the shape on a node of this signature, before any model risk:
        (leftovers, and per option the growth, the share's reduced cost and the share GPU's free milli)."""
        milli = shape.num_gpu * shape.gpu_milli
        found = [
            (after - before, prices.reduced_cost(used, shape.gpu_milli) if prices is not None else 0.0, used)
            for before, after, used in options_for(memo, signature, shape)
        ]
        return float(sum(signature.gpu_free) - milli), float(signature.cpu_free - shape.cpu_milli), found

    def report(self, key: tuple[float, ...]) -> dict[str, float]:
        return {
            "share_reduced_cost": key[0],
            "fgd_score": -key[1],
            "gpu_milli_left": key[2],
            "cpu_milli_left": key[3],
            "frag_growth_milli": key[4],
        }
