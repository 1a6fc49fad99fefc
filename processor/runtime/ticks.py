"""Ticks: event time that moves when no command does, so timeouts and time limits fire on time.

The fold never reads a clock: a deadline fires when a command's ``issued_at``
passes it. In a quiet partition that could be never, so a processor may publish
a ``Tick`` command into the commands log every ``--tick-interval`` seconds of
wall-clock time (read here, in the runtime, never in the fold). A tick is an
ordinary command in the log, so replaying the log fires the same deadlines at the
same offsets as the live run did.

One tick per partition is enough: it is a ``Tick {partition: true}``, which moves the
clock of every cluster of the partition (each cluster keeps its own clock and fires
its own deadlines), sent under the partition's first cluster (sorted), which routes
it to that partition by the cluster key like any other command. A partition without
clusters has no timers and gets no tick. A tick dated more than a day past the
partition's latest clock is refused (``CLOCK_JUMP``), like any command.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from processor.core.state import PartitionState
from schemas.commands import Command, Tick

TICK_SOURCE = "gpufold.tick"


def tick_commands(states: Iterable[PartitionState], issued_at: int, instance: str) -> list[Command]:
    """One Tick per partition that holds clusters, keyed by its first cluster."""
    commands = []
    for state in states:
        if state.clusters:
            cluster = min(state.clusters)
            command_id = f"tick-{instance}-{state.partition}-{issued_at}"
            commands.append(Command(command_id, cluster, issued_at, Tick(partition=True), TICK_SOURCE))
    return commands


class TickSchedule:
    """When the next ticks are due, on a monotonic clock; ``issued_at`` comes from the wall clock."""

    def __init__(
        self,
        interval: float,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if interval < 0:
            raise ValueError(f"tick interval must be >= 0 seconds (0: no ticks), got {interval}")
        self.interval = interval
        self._monotonic = monotonic
        self._wall = wall
        self._next = monotonic() + interval

    def due(self, states: Iterable[PartitionState], instance: str) -> list[Command]:
        """The ticks to publish now (none if ticks are off or the interval has not passed)."""
        if not self.interval:
            return []
        now = self._monotonic()
        if now < self._next:
            return []
        self._next = now + self.interval
        return tick_commands(states, int(self._wall() * 1000), instance)
