"""gpu-packing: the FGD simulator's GpuPackingScore baseline.

From high to low: (1) a share fits on partly used GPUs: ``100 - sum(free % of the
GPUs used) / 10``, at least 50; (2) idle GPUs of a partly used node must be used:
``50 - idle GPUs used``, at least 33; (3) the node is idle: ``max(33 - GPUs, GPUs)``.
Pods without GPU score 0 everywhere. Ties break on node id; shares go to the
best-fitting GPU. The GPUs the simulator would use are the fitting ones with the
least free milli first (as in its scoring loop).
"""

from __future__ import annotations

from processor.core.policies.base import ScoringPolicy
from processor.core.resources import PodShape, Signature
from schemas.commands import GPU_MILLI


def packing_score(gpu_free: tuple[int, ...], gpu_count: int, num_gpu: int, gpu_milli: int) -> int:
    idle = sum(1 for free in gpu_free if free == GPU_MILLI)
    if idle == gpu_count:
        return max(100 // 3 - idle, idle)
    need = num_gpu
    idle_used = 0
    free_ratio = 0
    for free in sorted(gpu_free):  # least free first
        if need == 0:
            break
        if gpu_milli <= free:
            need -= 1
            free_ratio += free * 100 // GPU_MILLI
            if free == GPU_MILLI:
                idle_used += 1
    if idle_used:
        return max(100 // 2 - idle_used, 100 // 3)
    return max(100 - free_ratio // 10, 100 // 2)


class GpuPacking(ScoringPolicy):
    name = "gpu-packing"
    description = "FGD paper's GpuPacking baseline: shared GPUs first, then partly used nodes, then idle nodes"
    score_names = ("packing_score_negated",)

    def score(self, signature: Signature, shape: PodShape) -> tuple[float, ...]:
        if shape.num_gpu == 0:
            return (0.0,)
        gpu_free = signature.gpu_free
        return (-float(packing_score(gpu_free, len(gpu_free), shape.num_gpu, shape.gpu_milli)),)
