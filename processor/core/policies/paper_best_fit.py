"""best-fit-paper: the FGD simulator's BestFitScore baseline (the paper's "BestFit").

Score = ``int(100 * (1 - (0.5 (CPU free - CPU asked) / 128,000 + 0.5 (GPU free - GPU
asked) / 8,000)))`` (higher wins), then min-max normalised to 0..100 over the
feasible nodes with integer arithmetic, as the plugin's NormalizeScore does
(which can merge close scores into ties). Ties break on node id; shares go to
the best-fitting GPU. It differs from the core ``best-fit`` (lexicographic least
GPU, then CPU, then memory left), which ignores CPU until GPUs tie.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from processor.core.policies.base import Choice, Policy
from processor.core.resources import PodShape, Signature

if TYPE_CHECKING:
    from processor.core.capacity import NodeGroup
    from processor.core.state import ClusterState

MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000


def raw_score(signature: Signature, shape: PodShape) -> int:
    cpu_left = signature.cpu_free - shape.cpu_milli
    gpu_left = sum(signature.gpu_free) - shape.num_gpu * shape.gpu_milli
    return int((1.0 - (cpu_left / MAX_SPEC_CPU * 0.5 + gpu_left / MAX_SPEC_GPU * 0.5)) * 100)


class PaperBestFit(Policy):
    name = "best-fit-paper"
    description = "FGD paper's BestFit baseline: least (CPU, GPU) left, normalised by the largest node spec"

    def place(self, cluster: ClusterState, shape: PodShape, groups: list[NodeGroup]) -> Choice:
        raw = [raw_score(group.signature, shape) for group in groups]
        low, high = min(raw), max(raw)
        span = high - low
        best_group = groups[0]
        best = -1
        for group, value in zip(groups, raw, strict=True):
            normalised = (value - low) * 100 // span if span else 0
            if normalised > best or (normalised == best and group.first() < best_group.first()):
                best_group, best = group, normalised
        node_id = best_group.first()
        return Choice(node_id, self.choose_gpus(cluster.nodes[node_id], shape), {"best_fit_score": float(best)})
