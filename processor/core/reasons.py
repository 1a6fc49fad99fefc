"""Why a pod does not fit: queue reasons, each node counted under the first check it fails."""

from __future__ import annotations

from processor.core import reservations
from processor.core.resources import PodShape
from processor.core.state import ClusterState
from schemas.codes import QueueReasonCode
from schemas.events import QueueReason


def queue_reasons(cluster: ClusterState, shape: PodShape) -> tuple[QueueReason, ...]:
    """Why no node takes the shape: nodes counted under the first check they fail. O(S)."""
    counts = cluster.index.misfit_counts(shape)
    if cluster.unschedulable_nodes:
        counts[QueueReasonCode.NODE_UNSCHEDULABLE] = cluster.unschedulable_nodes
    if not cluster.nodes:
        counts[QueueReasonCode.NO_NODES] = 0
    return tuple(
        QueueReason(code, count, reservations.reason_message(cluster, code))
        for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    )
