"""Event time: ``Tick``, and the deadlines a command's time reaches (time limits, gang timeouts, reservations,
retries after a failure).

Deadlines fire first, in deadline order, each at its own time, and each deadline's follow-up work
(a pod released by its time limit frees capacity the queue retries) runs before the next deadline
fires (:mod:`processor.core.fold` drives that). The timers themselves: :mod:`processor.core.timers`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from processor.core.decision import RESERVATION_UPKEEP, RETRY_QUEUE, Decision
from processor.core.handlers.disruptions import eviction_due
from processor.core.handlers.gangs import end_gang, place_gang
from processor.core.handlers.pods import place, release_pod
from processor.core.handlers.reservations import release_reservation
from processor.core.reservations import holder_waiting
from processor.core.state import GANG_RETRYING, GANG_RUNNING, ClusterState, lookup
from processor.core.timers import (
    EVICTION,
    GANG_TIMEOUT,
    PREEMPT_CHECK,
    RESERVATION_START,
    RESERVE_CHECK,
    RETRY,
    TIME_LIMIT,
    Timer,
)
from schemas.commands import Tick
from schemas.events import GangTimedOut, PodTimeLimitReached, Ticked


def tick(decision: Decision, command: Tick) -> None:
    """``Ticked``: the cluster's time (its deadlines fired before); a partition-wide tick names its own time,
    to which every cluster of the partition moves (each fired its own deadlines up to it first)."""
    if command.partition and not decision.legacy_time:
        decision.emit(Ticked(decision.command.issued_at, True))
    else:
        decision.emit(Ticked(decision.now))


def fire(decision: Decision, cluster: ClusterState, timer: Timer) -> None:
    """Fire one of the cluster's timers at its deadline; what it sets off is left as follow-up work. A stale
    timer (its pod left, its gang started, its reservation moved) does nothing. O(1) plus what it sets off."""
    deadline, kind, job_id = timer
    if deadline > decision.now:
        decision.now = deadline
    _TIMER_HANDLERS[kind](decision, cluster, job_id, deadline)


def _time_limit_reached(decision: Decision, cluster: ClusterState, pod_id: str, deadline: int) -> None:
    pod = lookup(cluster.pods, pod_id)
    limit = pod.spec.time_limit_ms if pod is not None else None
    if pod is None or limit is None or not pod.running or pod.started_at is None:
        return
    if pod.started_at + limit != deadline:
        return
    decision.emit(PodTimeLimitReached(pod_id, pod.node_id, limit, pod.spec.gang_id), cluster.name)  # type: ignore[arg-type]
    release_pod(decision, cluster, pod, "time_limit")


def _gang_timed_out(decision: Decision, cluster: ClusterState, gang_id: str, deadline: int) -> None:
    gang = cluster.gangs.get(gang_id)
    if gang is None or gang.state in (GANG_RUNNING, GANG_RETRYING) or gang.spec.timeout_ms is None:
        return
    if gang.spec.waiting_since + gang.spec.timeout_ms != deadline:
        return  # stale: a requeue started the wait again (contract v4)
    waited = decision.now - gang.spec.waiting_since
    decision.emit(
        GangTimedOut(
            gang_id, waited, f"gang {gang_id!r} did not start within its timeout of {gang.spec.timeout_ms} ms"
        ),
        cluster.name,
    )
    end_gang(decision, cluster, gang, "timed_out")


def _reservation_due(decision: Decision, cluster: ClusterState, holder_id: str, deadline: int) -> None:
    """The expected start of a reservation passed and its holder has not started: plan it again."""
    reservation = cluster.reservation
    if reservation is None or reservation.holder_id != holder_id or reservation.expected_start != deadline:
        return
    if holder_waiting(cluster, reservation):
        release_reservation(decision, cluster, "expected_start_passed")


def _retry_due(decision: Decision, cluster: ClusterState, job_id: str, deadline: int) -> None:
    """A failed pod's (or gang's) backoff passed: it goes back to placement (started, or queued again), once."""
    pod = lookup(cluster.pods, job_id)
    if pod is None:
        gang = cluster.gangs.get(job_id)
        if gang is None or gang.retry_at != deadline:
            return  # released (cancelled) while it waited
        # Contract v4: its timeout_ms counts from its retry, as from a requeue (it did not wait while it ran).
        spec = gang.spec if decision.legacy_gangs else dataclasses.replace(gang.spec, queued_at=decision.now)
        place_gang(decision, cluster, spec, from_queue=False, requeued=True)
        return
    if pod.retry_at != deadline:
        return  # released (cancelled) while it waited
    place(decision, cluster, pod.spec, pod.shape, from_queue=False, requeued=True)


def _reserve_check(decision: Decision, cluster: ClusterState, job_id: str, deadline: int) -> None:
    decision.then(RESERVATION_UPKEEP, cluster)


def _preempt_check(decision: Decision, cluster: ClusterState, node_id: str, deadline: int) -> None:
    """A pod evicted in an earlier command was placed again on the node in that command, where the queue could
    not take it as a victim (one command evicts a pod once): the queue retries the node, preemption included."""
    if node_id in cluster.nodes:
        decision.then(RETRY_QUEUE, cluster, (node_id,), None)


_TIMER_HANDLERS: dict[int, Callable[[Decision, ClusterState, str, int], None]] = {
    TIME_LIMIT: _time_limit_reached,
    RESERVATION_START: _reservation_due,
    GANG_TIMEOUT: _gang_timed_out,
    RESERVE_CHECK: _reserve_check,
    RETRY: _retry_due,
    EVICTION: eviction_due,
    PREEMPT_CHECK: _preempt_check,
}
