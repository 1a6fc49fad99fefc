"""Deadlines in event time: time limits, gang timeouts, reservations coming due.

Each cluster keeps its own clock (the largest ``issued_at`` of its own commands) and its own timers:
a command moves its cluster's clock, and every deadline of that cluster the clock has reached fires
first, in deadline order, at its own time (so the event stream stays ordered in time and a time limit
ends a pod exactly when it passed). A command of contract v1 or v2 keeps the partition-wide time of
its release: the partition's clock, and every cluster's deadlines up to it, in one order across the
partition (:func:`pop_due_in_partition`). Timers are derived data: each is checked against the state
when it fires (a stale one does nothing), and a restored state rebuilds them from what it holds, so
a snapshot plus its tail fires the same timers as a full replay.

Cost: ``push`` O(log n); each fired or stale entry O(log n) once; across the partition (v1/v2 only),
O(C) more per timer for C clusters with timers.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Protocol, TypeVar

TIME_LIMIT = 0  # a running pod's start + time limit
RESERVATION_START = 1  # a reservation's expected start: the holder should fit now
GANG_TIMEOUT = 2  # a waiting gang's submission + timeout
RESERVE_CHECK = 3  # the head of a queue has waited long enough for a reservation
RETRY = 4  # a failed pod's retry is due (its backoff passed)
EVICTION = 5  # a drain's grace period for a pod ended: it is evicted
PREEMPT_CHECK = 6  # a pod evicted earlier in a command runs on this node again: the queue may preempt it now

Timer = tuple[int, int, str]  # (deadline, kind, pod or gang id)


class Timers:
    """One cluster's timers: a min-heap without duplicates."""

    __slots__ = ("_known", "heap")

    def __init__(self) -> None:
        self.heap: list[Timer] = []  # read-only outside: ``heap and heap[0][0] <= now`` is the cheap due test
        self._known: set[Timer] = set()

    def push(self, deadline: int, kind: int, job_id: str = "") -> None:
        timer = (deadline, kind, job_id)
        if timer not in self._known:
            self._known.add(timer)
            heapq.heappush(self.heap, timer)

    def due(self, now: int) -> bool:
        heap = self.heap
        return bool(heap) and heap[0][0] <= now

    def pop_due(self, now: int) -> Timer | None:
        """The earliest timer with deadline <= now, removed; None if there is none."""
        heap = self.heap
        if not heap or heap[0][0] > now:
            return None
        timer = heapq.heappop(heap)
        self._known.discard(timer)
        return timer

    def next_deadline(self) -> int | None:
        return self.heap[0][0] if self.heap else None

    def __len__(self) -> int:
        return len(self.heap)


class Clustered(Protocol):
    """What :func:`pop_due_in_partition` needs of a cluster."""

    @property
    def name(self) -> str: ...

    @property
    def timers(self) -> Timers: ...


C = TypeVar("C", bound=Clustered)


def pop_due_in_partition(clusters: Iterable[C], now: int) -> tuple[C, Timer] | None:
    """The earliest due timer of any cluster (deadline, kind, cluster name, id: the order contract v1 and v2
    fired them in), removed, with its cluster; None if none is due. O(C)."""
    best: tuple[int, int, str, str] | None = None
    owner: C | None = None
    for cluster in clusters:
        heap = cluster.timers.heap
        if heap and heap[0][0] <= now:
            deadline, kind, job_id = heap[0]
            key = (deadline, kind, cluster.name, job_id)
            if best is None or key < best:
                best, owner = key, cluster
    if owner is None:
        return None
    timer = owner.timers.pop_due(now)
    assert timer is not None
    return owner, timer
