"""random: a uniformly random feasible node, as the simulator's RandomScore plugin.

"Random" must stay deterministic: the draw is a BLAKE2b hash of what the fold
has already folded (cluster name, arrival count, pods present, GPU milli
allocated) and the pod's shape, never the machine's randomness. Every feasible
node is equally likely (groups weigh by their size); a GPU-share pod gets a
random fitting GPU (the simulator's ``random`` GPU selection), whole GPUs the
lowest-index idle ones. O(k log k) for k feasible groups (sorted for a stable order).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, NamedTuple

from processor.core.policies.base import Choice, Policy, with_gpu_memory
from processor.core.resources import PodShape
from schemas.commands import GPU_MILLI
from schemas.events import GpuShare

if TYPE_CHECKING:
    from processor.core.capacity import NodeGroup
    from processor.core.state import ClusterState


class _Shape7(NamedTuple):
    """The seven request fields the draw has always hashed, under the name it hashed them with: a
    time limit (added to ``PodShape`` later) does not move a pod, so old logs draw the same nodes."""

    num_gpu: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    gpu_models: tuple[str, ...]
    node_selector: tuple[tuple[str, str], ...]
    tolerations: tuple[object, ...]


# setattr, not assignment: mypyc compiles this module and refuses assignments to a class's attributes.
setattr(_Shape7, "__name__", "PodShape")  # noqa: B010
setattr(_Shape7, "__qualname__", "PodShape")  # noqa: B010


def draw(cluster: ClusterState, shape: PodShape) -> int:
    """A 64-bit number determined by the folded state and the shape."""
    seed = repr((cluster.name, cluster.arrivals, len(cluster.pods), cluster.gpu_milli_allocated, _Shape7(*shape[:7])))
    return int.from_bytes(hashlib.blake2b(seed.encode(), digest_size=8).digest(), "big")


class RandomPick(Policy):
    name = "random"
    description = "a uniformly random feasible node, drawn from a hash of the folded state (deterministic)"

    def place(self, cluster: ClusterState, shape: PodShape, groups: list[NodeGroup]) -> Choice:
        number = draw(cluster, shape)
        ordered = sorted(groups, key=lambda group: group.first())
        total = sum(len(group) for group in ordered)
        pick = number % total
        for group in ordered:
            if pick < len(group):
                node_id: str = group.node_ids[pick]
                break
            pick -= len(group)
        node = cluster.nodes[node_id]
        if shape.num_gpu and shape.gpu_milli < GPU_MILLI:
            fitting = [i for i, free in enumerate(node.gpu_free) if free >= shape.gpu_milli]
            gpus: tuple[GpuShare, ...] = (GpuShare(fitting[(number >> 32) % len(fitting)], shape.gpu_milli),)
            gpus = with_gpu_memory(node, shape, gpus)
        else:
            gpus = self.choose_gpus(node, shape)
        return Choice(node_id, gpus, {"feasible_nodes": float(total)})
