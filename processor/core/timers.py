"""Deadlines in event time: time limits, gang timeouts, reservations coming due.

The fold's clock is the largest ``issued_at`` folded in the partition; a command
moves it, and every deadline the clock has reached fires first, in deadline order,
at its own time (so the event stream stays ordered in time and a time limit ends a
pod exactly when it passed). Timers are derived data: each is checked against the
state when it fires (a stale one does nothing), and a restored state rebuilds them
from what it holds, so a snapshot plus its tail fires the same timers as a full replay.

Cost: ``push`` O(log n); each fired or stale entry O(log n) once.
"""

from __future__ import annotations

import heapq

TIME_LIMIT = 0  # a running pod's start + time limit
RESERVATION_START = 1  # a reservation's expected start: the holder should fit now
GANG_TIMEOUT = 2  # a waiting gang's submission + timeout
RESERVE_CHECK = 3  # the head of a queue has waited long enough for a reservation

Timer = tuple[int, int, str, str]  # (deadline, kind, cluster, pod or gang id)


class Timers:
    """A min-heap of timers without duplicates."""

    __slots__ = ("_known", "heap")

    def __init__(self) -> None:
        self.heap: list[Timer] = []  # read-only outside: ``heap and heap[0][0] <= now`` is the cheap due test
        self._known: set[Timer] = set()

    def push(self, deadline: int, kind: int, cluster: str, job_id: str = "") -> None:
        timer = (deadline, kind, cluster, job_id)
        if timer not in self._known:
            self._known.add(timer)
            heapq.heappush(self.heap, timer)

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
