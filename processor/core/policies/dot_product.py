"""dot-product: Tetris-style alignment as in the FGD simulator's DotProductScore (merge, max-normalised).

Node vector = (CPU milli free / 128,000, GPU milli free in all / 8,000), pod
vector = (CPU milli / 128,000, GPU milli in all / 8,000), both normalised by the
simulator's largest node spec. Score = ``int(100 * (1 - dot / 2))``, higher wins:
the simulator ranks the *smallest* dot product first. Ties break on node id;
a GPU share goes to the best-fitting GPU (the experiment's ``best`` GPU selection).
"""

from __future__ import annotations

from processor.core.policies.base import ScoringPolicy
from processor.core.resources import PodShape, Signature

MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000


class DotProduct(ScoringPolicy):
    name = "dot-product"
    description = "FGD paper's DotProd baseline: smallest dot product of free and requested (CPU, GPU)"
    score_names = ("dot_product_score_negated",)

    def score(self, signature: Signature, shape: PodShape) -> tuple[float, ...]:
        dot = (signature.cpu_free / MAX_SPEC_CPU) * (shape.cpu_milli / MAX_SPEC_CPU) + (
            sum(signature.gpu_free) / MAX_SPEC_GPU
        ) * (shape.num_gpu * shape.gpu_milli / MAX_SPEC_GPU)
        return (-float(int(100 * (1 - dot / 2))),)
