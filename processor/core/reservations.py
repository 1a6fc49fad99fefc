"""Reservations, Slurm's backfill rule: who may use nodes held for the head of the queue, and in what words.

A reservation holds nodes for one job (a pod or a gang: the head of the queue once
it has waited ``reserve_after_ms``) until it starts. Reserved nodes carry a
reservation taint in their node class (``processor.core.resources``), so the
capacity index keeps every pod off them except those given the matching
toleration here: the holder itself, and *backfill*, work whose own time limit
ends before the reservation's expected start. Work without a time limit never
backfills, and nothing backfills a reservation whose start is unknown.

Where the nodes come from: ``processor.core.reservation_planner``.
"""

from __future__ import annotations

from processor.core.resources import PodShape, reservation_toleration
from processor.core.state import GANG_QUEUED, GANG_RUNNING, ClusterState, Reservation, lookup
from schemas.codes import QueueReasonCode


def may_backfill(reservation: Reservation, time_limit_ms: int | None, now: int) -> bool:
    """Whether work with this time limit, starting now, ends by the reservation's expected start."""
    start = reservation.expected_start
    return start is not None and time_limit_ms is not None and now + time_limit_ms <= start


def usable_shape(cluster: ClusterState, job_id: str, shape: PodShape, now: int) -> PodShape:
    """The shape as placement sees it: tolerating the reservation if the job holds it or may backfill. O(1)."""
    reservation = cluster.reservation
    if reservation is None:
        return shape
    if reservation.holder_id == job_id or may_backfill(reservation, shape.time_limit_ms, now):
        return shape._replace(tolerations=(*shape.tolerations, reservation_toleration(reservation.holder_id)))
    return shape


def holder_waiting(cluster: ClusterState, reservation: Reservation) -> bool:
    """Whether the holder is still in the queue."""
    if reservation.holder_kind == "pod":
        pod = lookup(cluster.pods, reservation.holder_id)
        return pod is not None and pod.queued
    gang = cluster.gangs.get(reservation.holder_id)
    return gang is not None and gang.state == GANG_QUEUED


def holder_started(cluster: ClusterState, reservation: Reservation) -> bool:
    if reservation.holder_kind == "pod":
        pod = lookup(cluster.pods, reservation.holder_id)
        return pod is not None and pod.running
    gang = cluster.gangs.get(reservation.holder_id)
    return gang is not None and gang.state == GANG_RUNNING


def _start_words(expected_start: int | None, now: int) -> str:
    if expected_start is None:
        return "expected start unknown: pods without a time limit hold them, so nothing may backfill"
    return (
        f"expected start at event time {expected_start} ms (in {max(expected_start - now, 0) / 1000:g} s, when "
        "running pods' time limits free them); work whose time limit ends by then may backfill"
    )


def reserve_message(
    kind: str, holder_id: str, nodes: tuple[str, ...], expected_start: int | None, waited: int, now: int
) -> str:
    shown = ", ".join(nodes[:8]) + (f" and {len(nodes) - 8} more" if len(nodes) > 8 else "")
    return (
        f"{kind} {holder_id!r} has waited {waited / 1000:g} s at the head of the queue: reserved {len(nodes)} "
        f"node(s) where it starts soonest ({shown}); {_start_words(expected_start, now)}"
    )


RELEASE_REASONS = {
    "started": "its holder started",
    "holder_left": "its holder left the queue (released, timed out or failed)",
    "superseded": "a job ahead of its holder has waited long enough to take the reservation",
    "expected_start_passed": "its expected start passed and the holder still did not fit: planned again",
    "reservations_off": "reservations were turned off (SetPolicy reserve_after_ms -1)",
    "node_removed": "a reserved node was removed: planned again",
    "node_cordoned": "a reserved node was cordoned: planned again",
    "node_drained": "a reserved node was drained: planned again",
    "node_failed": "a reserved node failed: planned again",
}


def release_message(reservation: Reservation, reason: str) -> str:
    why = RELEASE_REASONS.get(reason, reason)
    holder = f"{reservation.holder_kind} {reservation.holder_id!r}"
    return f"released the {len(reservation.nodes)} node(s) held for {holder}: {why}"


def reason_message(cluster: ClusterState, code: str) -> str:
    """The words that go with a queue reason code (only a reservation has any)."""
    reservation = cluster.reservation
    if code != QueueReasonCode.NODE_RESERVED or reservation is None:
        return ""
    start = reservation.expected_start
    until = f"until event time {start} ms" if start is not None else "until its holder starts (time unknown)"
    return (
        f"it would fit, but the node(s) are reserved for {reservation.holder_kind} {reservation.holder_id!r} {until}; "
        "only work whose time limit ends by the expected start may use them"
    )
