"""best-fit: the node left with the least free capacity after placement (bin packing)."""

from __future__ import annotations

from processor.core.policies.base import ScoringPolicy
from processor.core.resources import PodShape, Signature


class BestFit(ScoringPolicy):
    name = "best-fit"
    description = "least leftover: GPU milli, then CPU, then memory left on the node after placement"
    score_names = ("gpu_milli_left", "cpu_milli_left", "memory_mib_left")

    def score(self, signature: Signature, shape: PodShape) -> tuple[float, ...]:
        return (
            sum(signature.gpu_free) - shape.num_gpu * shape.gpu_milli,
            signature.cpu_free - shape.cpu_milli,
            signature.memory_free - shape.memory_mib,
        )
