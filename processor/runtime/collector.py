"""The cyclic garbage collector, kept off a processor's folded state.

A partition's state is millions of long-lived objects (10,000 nodes and 100,000 running pods: ~590,000
objects the collector tracks). CPython's full collection walks every one of them, ~250 ms on this machine
(BENCHMARKS.md, "The collector off the state"), and it starts whenever the objects promoted since the last
one pass a quarter of those alive: every few tens of thousands of commands, in the middle of whichever
command happens to allocate then. That stalls every cluster of the partition, as a slow command does.

The fold needs the collector only for the short-lived reference cycles of a command's own work (closures,
generators), which the young generations collect; the state itself holds no cycle that outlives it (each
object dies by its reference count). So the processor *freezes* the state (:func:`collect_and_freeze`:
one full collection, then ``gc.freeze()``, which moves every object alive into a generation the collector
never walks) once a partition's state is restored (if it holds :data:`FREEZE_EVERY` commands or more),
and again every :data:`FREEZE_EVERY` commands folded, between batches. A full collection then walks only
what was allocated since the last freeze, and a freeze's own pause is bounded by that too, and paid
between batches rather than inside a command. Frozen objects are still freed by their reference counts;
only a cycle that was frozen and later became garbage would stay (nothing in the state forms one).
"""

from __future__ import annotations

import gc
import time

FREEZE_EVERY = 10_000
"""Commands folded between two freezes: what a full collection may walk at most is what that many commands
left alive (BENCHMARKS.md gives the pause measured)."""


def collect_and_freeze() -> float:
    """Collect every generation, then freeze what is alive out of the collector's sight; the seconds it took."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    return time.perf_counter() - started


class Collector:
    """Collects and freezes after every :data:`FREEZE_EVERY` commands counted (and whenever asked)."""

    __slots__ = ("every", "freezes", "seconds", "since")

    def __init__(self, every: int = FREEZE_EVERY) -> None:
        self.every = every
        self.since = 0  # commands counted since the last freeze
        self.freezes = 0
        self.seconds = 0.0  # spent collecting and freezing, in all

    def restored(self, commands: int) -> float:
        """A state of ``commands`` folded commands was restored: freeze it, if that is :attr:`every` or more
        (a small state is left to the collector, as is a test's). Seconds spent."""
        if self.every <= 0 or commands < self.every:
            return 0.0
        return self.now()

    def now(self) -> float:
        """Collect and freeze at once; the seconds it took."""
        seconds = collect_and_freeze()
        self.since = 0
        self.freezes += 1
        self.seconds += seconds
        return seconds

    def folded(self, commands: int) -> float:
        """Count commands folded; freeze if :attr:`every` were counted since the last freeze. Seconds spent."""
        self.since += commands
        if self.every <= 0 or self.since < self.every:
            return 0.0
        return self.now()
