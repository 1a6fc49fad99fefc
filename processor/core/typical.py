"""How the fold learns a cluster's typical pods online, at arrival checkpoints.

Each cluster keeps a histogram of the request shapes of its present pods
(``ClusterState.shape_counts``) and refreshes ``ClusterState.typical`` from it
with :func:`schemas.fragmentation.derive_typical` when its arrival count is a
checkpoint, so every decision depends only on folded commands.
"""

from __future__ import annotations

from processor.core.resources import PodShape
from schemas.fragmentation import Typical, TypicalKey

CHECKPOINT_EVERY = 256
REFRESH_TOLERANCE = 0.02


def typical_key(shape: PodShape) -> TypicalKey:
    return TypicalKey(shape.num_gpu, shape.gpu_milli, shape.cpu_milli, shape.gpu_models)


def is_checkpoint(arrivals: int) -> bool:
    """Whether the typical pods are refreshed when the cluster's arrival count reaches this value.

    Powers of two up to 256, then every 256 arrivals: the learned distribution settles
    quickly, and a refresh (which invalidates cached fragmentation scores) stays rare.
    """
    return arrivals > 0 and (arrivals & (arrivals - 1) == 0 or arrivals % CHECKPOINT_EVERY == 0)


def typical_moved(old: Typical, new: Typical, tolerance: float = REFRESH_TOLERANCE) -> bool:
    """Whether a freshly derived typical-pod list differs enough from the current one to replace it.

    A refresh invalidates every cached fragmentation score, so the learned list is
    only replaced when its shapes change or the weights move by more than
    ``tolerance`` in L1 distance. Both lists are in the state, so this stays pure.
    """
    if not old or not new:
        return old != new
    weights = {pod.key: pod.weight for pod in old}
    if set(weights) != {pod.key for pod in new}:
        return True
    return sum(abs(weights[pod.key] - pod.weight) for pod in new) > tolerance
