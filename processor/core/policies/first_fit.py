"""first-fit: the feasible node with the smallest id."""

from __future__ import annotations

from typing import TYPE_CHECKING

from processor.core.policies.base import Choice, Policy
from processor.core.resources import PodShape

if TYPE_CHECKING:
    from processor.core.capacity import NodeGroup
    from processor.core.state import ClusterState


class FirstFit(Policy):
    name = "first-fit"
    description = "the feasible node with the smallest id"

    def place(self, cluster: ClusterState, shape: PodShape, groups: list[NodeGroup]) -> Choice:
        node_id = min(group.first() for group in groups)
        return Choice(node_id, self.choose_gpus(cluster.nodes[node_id], shape))
