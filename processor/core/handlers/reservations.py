"""Keeping the reservation with the head of the queue (Slurm's backfill rule), as events.

Who may use reserved nodes and the words: :mod:`processor.core.reservations`; where the nodes come
from: :mod:`processor.core.reservation_planner`. Releasing a reservation leaves the queue to retry
its nodes (:data:`~processor.core.decision.RETRY_QUEUE`).
"""

from __future__ import annotations

from processor.core import reservation_planner, reservations
from processor.core.decision import RESERVATION_ROUNDS, RETRY_QUEUE, Decision, Task, cluster_policy
from processor.core.state import ClusterState, Node
from processor.core.timers import RESERVE_CHECK
from schemas.events import NodesReserved, ReservationReleased


def release_reservation(decision: Decision, cluster: ClusterState, reason: str) -> bool:
    """Release the cluster's reservation, if any, and leave its nodes to the queue; whether there was one."""
    reservation = cluster.reservation
    if reservation is None:
        return False
    nodes = tuple(node_id for node_id in reservation.nodes if node_id in cluster.nodes)
    decision.emit(
        ReservationReleased(
            reservation.holder_id,
            reservation.holder_kind,
            reservation.nodes,
            reason,
            reservations.release_message(reservation, reason),
        ),
        cluster.name,
    )
    decision.then(RETRY_QUEUE, cluster, nodes, None)
    return True


def holder_started(decision: Decision, cluster: ClusterState, job_id: str) -> None:
    """The job that held the reservation started: its nodes go back to everyone at once."""
    reservation = cluster.reservation
    if reservation is not None and reservation.holder_id == job_id:
        release_reservation(decision, cluster, "started")


def drop_reserved_node(decision: Decision, cluster: ClusterState, node: Node, reason: str) -> bool:
    """A reserved node becomes unusable: the reservation is released (and planned again after the command).
    Whether it was (the caller lets the queue's retry run before it goes on)."""
    if node.reserved_for is not None and cluster.reservation is not None:
        return release_reservation(decision, cluster, reason)
    return False


def reservation_upkeep(decision: Decision, cluster: ClusterState) -> Task | None:
    """Keep the reservation with the head of the queue, Slurm's backfill rule.

    The head (priority, then age) that has waited ``reserve_after_ms`` gets the nodes
    where it will start soonest; a reservation whose holder left the queue, or that a
    new head past its wait supersedes, is released. Releasing lets the queue move, so
    this looks again until it settles: at most :data:`RESERVATION_ROUNDS` rounds, each
    releases or makes one reservation. O(1) unless a reservation is planned. A v1 command
    (whose contract had no reservations) leaves them to the next command of today's contract.
    """
    if decision.command.contract == "v1":
        return None
    return _rounds(decision, cluster)


def _rounds(decision: Decision, cluster: ClusterState) -> Task:
    for _ in range(RESERVATION_ROUNDS):  # measure: the rounds left
        if not _step(decision, cluster):
            return
        yield  # the queue retries the released nodes before the next round looks again


def _step(decision: Decision, cluster: ClusterState) -> bool:
    """One round of upkeep; True if it released a reservation (the queue may have moved)."""
    reservation = cluster.reservation
    if reservation is not None and not reservations.holder_waiting(cluster, reservation):
        started = reservations.holder_started(cluster, reservation)
        return release_reservation(decision, cluster, "started" if started else "holder_left")
    if cluster.reserve_after_ms < 0:
        if reservation is not None:
            return release_reservation(decision, cluster, "reservations_off")
        return False
    head = cluster.head()
    if head is None:
        return False
    key, kind = head
    if reservation is not None and reservation.holder_id == key[2]:
        return False
    holder = cluster.pods[key[2]].spec if kind == "pod" else cluster.gangs[key[2]].spec
    deadline = holder.submitted_at + cluster.reserve_after_ms
    if decision.now < deadline:
        cluster.timers.push(deadline, RESERVE_CHECK)
        return False
    if reservation is not None:
        return release_reservation(decision, cluster, "superseded")
    plan = reservation_planner.plan(cluster, key[2], kind, cluster_policy(cluster), decision.now)
    if plan is None:
        return False
    nodes, expected_start = plan
    waited = decision.now - holder.submitted_at
    decision.emit(
        NodesReserved(
            key[2],
            kind,
            nodes,
            expected_start,
            reservations.reserve_message(kind, key[2], nodes, expected_start, waited, decision.now),
        ),
        cluster.name,
    )
    return False
