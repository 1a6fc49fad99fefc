"""fgd-plus: gpufold's default policy, fragmentation gradient descent with best-fit among near-equals.

Like :mod:`fgd` it scores each node by the growth of its expected GPU
fragmentation (against the typical pods the fold learns online), trying every
GPU of the node for a share, and squashes the growth through a sigmoid into an
integer score: ``int(sigmoid(-growth / 1000) * RESOLUTION)``. With RESOLUTION 50
(FGD uses 100) nodes whose growth differs by less than ~80 milli near zero are
equals. FGD breaks its ties at random (kube-scheduler); fgd-plus breaks them by
best fit: the node left with the least free GPU milli, then the least free CPU,
then the smaller exact growth, then node id.

Why, measured on openb (BENCHMARKS.md): ranking by the exact growth alone is
worse than FGD (it spreads pods over nodes whose growth differs by noise, above
all while the typical pods are still being learned); best fit among near-equals
packs pods onto already used nodes, which keeps whole nodes free for the pods
that need them; a coarser score widens the near-equal classes where best fit
decides, which measured better than FGD's resolution.

``PodScheduled.scores`` carries the FGD score, the growth and the leftovers of the
chosen node.
"""

from __future__ import annotations

from processor.policies.fgd import FragMemo, FragmentationPolicy, options_for, sigmoid
from processor.resources import PodShape, Signature

RESOLUTION = 50  # FGD's is 100: score = int(sigmoid(-growth / 1000) * RESOLUTION)


class FgdPlus(FragmentationPolicy):
    name = "fgd-plus"
    description = "FGD's fragmentation score (learned typical pods), best fit among equal scores"
    score_names = ("fgd_score_negated", "gpu_milli_left", "cpu_milli_left", "frag_growth_milli")

    def __init__(self, resolution: int = RESOLUTION) -> None:
        super().__init__()
        self.resolution = resolution

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

    def report(self, key: tuple[float, ...]) -> dict[str, float]:
        return {"fgd_score": -key[0], "gpu_milli_left": key[1], "cpu_milli_left": key[2], "frag_growth_milli": key[3]}
