"""Why a pod does not fit: queue reasons, each node counted under the first check it fails."""

from __future__ import annotations

from processor.core import reservations
from processor.core.resources import PodShape
from processor.core.state import ClusterState
from schemas.codes import QueueReasonCode
from schemas.commands import STRICT_FIFO
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


def blocked_by_earlier(cluster: ClusterState, key: tuple[int, int, str]) -> QueueReason | None:
    """Strict FIFO: the reason a job may not start because a job ahead of it has not. O(1)."""
    if cluster.queue_order != STRICT_FIFO:
        return None
    head = cluster.head()
    if head is None or head[0] > key:
        return None
    return QueueReason(
        QueueReasonCode.WAITING_FOR_EARLIER_JOB,
        0,
        f"strict-fifo: {head[1]} {head[0][2]!r} (priority {-head[0][0]}) is ahead in the queue and has not started",
    )
