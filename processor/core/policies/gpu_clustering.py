"""gpu-clustering: the FGD simulator's GpuClusteringScore baseline.

Pods are tagged by kind (GPU share, or k whole GPUs); a node's affinity is the
set of kinds of the GPU pods it runs. With ``packed = 25 * (8000 - GPU milli
free) // 8000``: 75 + packed if the node runs only this kind; 50 + packed if it
runs this kind among others; 25 + packed if it runs no GPU pod; packed if it
runs other kinds only. Pods without GPU score 0 everywhere. Ties break on node
id; shares go to the best-fitting GPU.

The affinity is not part of the free-capacity signature, so each node of a
group is looked at (its running pods): O(n + pods) per placement. A baseline,
not tuned for speed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from processor.core.policies.base import Choice, Policy
from processor.core.resources import PodShape
from schemas.commands import GPU_MILLI

if TYPE_CHECKING:
    from processor.core.capacity import NodeGroup
    from processor.core.state import ClusterState

MAX_SPEC_GPU = 8_000


def kind(num_gpu: int, gpu_milli: int) -> str:
    if num_gpu == 0:
        return ""
    return "share" if gpu_milli < GPU_MILLI else f"{num_gpu}-gpu"


class GpuClustering(Policy):
    name = "gpu-clustering"
    description = "FGD paper's GpuClustering baseline: pack pods of the same GPU kind together"

    def place(self, cluster: ClusterState, shape: PodShape, groups: list[NodeGroup]) -> Choice:
        wanted = kind(shape.num_gpu, shape.gpu_milli)
        best_id = ""
        best = -1
        for group in groups:
            if not wanted:
                candidate_id, score = group.first(), 0
            else:
                packed = 25 * (MAX_SPEC_GPU - sum(group.signature.gpu_free)) // MAX_SPEC_GPU
                candidate_id, score = "", -1
                for node_id in group.node_ids:
                    kinds = set()
                    for pod_id in cluster.nodes[node_id].pods:
                        # None: a gang member placed on trial, not yet a pod (`in` and [], not .get: see state.lookup)
                        pod = cluster.pods[pod_id] if pod_id in cluster.pods else None  # noqa: SIM401
                        if pod is not None and pod.spec.num_gpu:
                            kinds.add(kind(pod.spec.num_gpu, pod.spec.gpu_milli))
                    if wanted in kinds:
                        value = packed + (75 if len(kinds) == 1 else 50)
                    else:
                        value = packed + (25 if not kinds else 0)
                    if value > score:
                        candidate_id, score = node_id, value
                        if value == packed + 75:
                            break  # the best a node of this group can get; ids are sorted
            if score > best or (score == best and candidate_id < best_id):
                best_id, best = candidate_id, score
        node = cluster.nodes[best_id]
        return Choice(best_id, self.choose_gpus(node, shape), {"clustering_score": float(best)})
