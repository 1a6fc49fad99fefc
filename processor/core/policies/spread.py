"""spread: the least allocated node (Kubernetes' LeastAllocated), to spread load."""

from __future__ import annotations

from processor.core.policies.base import ScoringPolicy
from processor.core.resources import PodShape, Signature
from schemas.commands import GPU_MILLI


class Spread(ScoringPolicy):
    name = "spread"
    description = "least allocated: highest mean free fraction of GPU, CPU and memory after placement"
    score_names = ("free_fraction_negated",)

    def score(self, signature: Signature, shape: PodShape) -> tuple[float, ...]:
        fractions = []
        gpu_capacity = len(signature.gpu_free) * GPU_MILLI
        if gpu_capacity:
            fractions.append((sum(signature.gpu_free) - shape.gpu_milli_total) / gpu_capacity)
        if signature.cpu_capacity:
            fractions.append((signature.cpu_free - shape.cpu_milli) / signature.cpu_capacity)
        if signature.memory_capacity:
            fractions.append((signature.memory_free - shape.memory_mib) / signature.memory_capacity)
        return (-(sum(fractions) / len(fractions)) if fractions else 0.0,)
