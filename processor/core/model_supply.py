"""How likely a GPU model's idle capacity is to be needed by the pods that can only run on it.

Pods that name their allowed GPU models (``gpu_models``) can only use those models'
GPUs; a pod that allows any model can use every model. If the pods that may use
any model take the supply of a model that restricted pods will need, those pods
fail later while other models still have room (measured on the openb ``gpuspec``
traces, BENCHMARKS.md). This module prices that risk from the workload the fold
has seen, as it is now:

- *demand*: the GPU milli of the present pods (running or waiting:
  ``ClusterState.shape_counts``), in all, and per set of allowed models;
- *need*: the restricted sets' share of the demand, applied to the cluster's idle
  GPU milli (what is left to fill): ``need(S) = idle(all) x demand(S) / demand(all)``,
  split over the models of ``S`` in proportion to their idle GPU milli;
- *risk* of a model: the probability that its need exceeds its idle GPU milli, with
  the need taken as normal around that estimate: its spread is that of the pods
  still to come (about one GPU each: variance ``need x 1000`` milli^2) plus that of
  the estimate itself (``need^2 / pods`` of the sets counted).

Taking ``milli`` of a model then costs ``milli x risk`` of GPU in expectation: capacity
a restricted pod would have used and no other pod can give back. ``fgd-pack`` adds
that cost to its fragmentation measure, so the threshold is no tuned constant: a
model whose supply exceeds its need by a few spreads costs nothing, one at its need
costs half of what is taken.

Everything is derived from the present pods and the capacity index, so a replay or a
restored snapshot gives the same risk. Cost: O(R) over the models of the R restricted sets, from
the demand ``ClusterState.count_shape`` keeps summed as pods come and go (``gpu_demand``,
``pinned_demand``); :func:`model_risk` recomputes it from the histogram in O(K) over the K
distinct request shapes (the reference the tests compare with).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from processor.core.capacity import CapacityIndex
from schemas.commands import GPU_MILLI
from schemas.fragmentation import TypicalKey

RISK_DIGITS = 2  # risks are rounded (a cost of at most 5 milli per GPU taken), so evaluations are reused


def restricted_demand(
    shape_counts: Mapping[TypicalKey, int],
) -> tuple[int, dict[tuple[str, ...], tuple[int, int]]]:
    """(GPU milli of every present pod, {allowed models: (GPU milli, pods)} of the restricted ones). O(K)."""
    total = 0
    restricted: dict[tuple[str, ...], tuple[int, int]] = {}
    for key, count in shape_counts.items():
        milli = count * key.num_gpu * key.gpu_milli
        if not milli:
            continue
        total += milli
        if key.gpu_models:
            known = restricted.get(key.gpu_models)
            restricted[key.gpu_models] = (milli, count) if known is None else (known[0] + milli, known[1] + count)
    return total, restricted


def model_risk(shape_counts: Mapping[TypicalKey, int], index: CapacityIndex) -> dict[str, float]:
    """Per GPU model named by a restricted present pod: the probability its need exceeds its idle milli. O(K)."""
    total, restricted = restricted_demand(shape_counts)
    return model_risk_of_demand(total, restricted, index)


def model_risk_of_demand(
    total: int, restricted: Mapping[tuple[str, ...], Sequence[int]], index: CapacityIndex
) -> dict[str, float]:
    """:func:`model_risk` from the demand already summed (``ClusterState.gpu_demand`` and ``pinned_demand``,
    which ``count_shape`` keeps equal to :func:`restricted_demand`): O(R) over the restricted sets' models."""
    if not restricted or total <= 0:
        return {}
    idle_all = index.gpu_free()
    need: dict[str, float] = {}
    counted: dict[str, float] = {}  # restricted pods behind each need
    for models in sorted(restricted):
        milli, count = restricted[models][0], restricted[models][1]
        idle = [index.gpu_free(model) for model in models]
        supply = sum(idle)
        share = idle_all * milli / total
        for model, free in zip(models, idle, strict=True):
            part = free / supply if supply else 1.0 / len(models)
            need[model] = need.get(model, 0.0) + share * part
            counted[model] = counted.get(model, 0.0) + count * part
    risk: dict[str, float] = {}
    for model in sorted(need):
        wanted = need[model]
        if wanted <= 0.0:
            continue  # nothing left to fill: no pod will need this model's supply
        spread = math.sqrt(wanted * GPU_MILLI + wanted * wanted / max(counted[model], 1.0))
        gap = wanted - index.gpu_free(model)
        risk[model] = round(0.5 * math.erfc(-gap / (spread * math.sqrt(2.0))), RISK_DIGITS)
    return risk
