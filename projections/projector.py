"""The projector: folds a batch of events into the read-side tables, exactly once.

``project_batch(conn, source, batch)`` runs inside the caller's transaction. It
locks each partition's row of ``projection_offsets`` (``SELECT ... FOR UPDATE``
on PostgreSQL), skips events whose sequence is below the stored
``next_sequence`` (already applied: a replay after a crash, or another projector
got there first), applies the rest, and writes the new offsets, all in that
one transaction. Commit makes rows and offsets visible together, so a crash at
any point loses nothing and duplicates nothing.

The batch is applied in memory (``projections.staging``: the rows it touches are
loaded with one query per table, changed event by event by ``projections.handlers``,
and written back with bulk statements). :class:`Projector` adds the transaction and
retries with backoff on database outages (the batch is re-projected whole; the
offsets make that safe); ``projections.pipeline`` overlaps one batch's write with the
next one's apply.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, and_, update
from sqlalchemy.exc import DBAPIError, OperationalError

from projections import models
from projections.envelope import BatchResult, Envelope, ProjectionError, ProjectionStopped
from projections.handlers import HANDLERS
from projections.offsets import load_offsets, lock_offsets
from projections.secrets import mask_url
from projections.staging import StagedBatch
from projections.usage import DEFAULT_LATENESS_MS, Write

log = logging.getLogger("gpufold.projector")


def project_batch(
    conn: Connection, source: str, batch: Sequence[Envelope], *, lateness_ms: int = DEFAULT_LATENESS_MS
) -> BatchResult:
    """Apply a batch of events (in log order per partition) inside the caller's transaction.

    Events already applied (sequence below the partition's stored next_sequence)
    are skipped; the partition offsets are written before returning, so commit
    makes the rows and the offsets visible together.
    """
    if not batch:
        return BatchResult()
    partitions = sorted({envelope.partition for envelope in batch})
    planned = plan_batch(conn, source, batch, lock_offsets(conn, source, partitions), lateness_ms)
    planned.write(conn)
    return planned.result


@dataclass(slots=True)
class PlannedBatch:
    """A batch applied in memory: its statements, and the offsets they start from and lead to."""

    source: str
    start: dict[int, tuple[int, int]]  # partition -> (next_offset, next_sequence) the batch was applied on
    end: dict[int, tuple[int, int]]  # ... and once it is written
    writes: list[Write]
    work: StagedBatch
    result: BatchResult

    def write(self, conn: Connection) -> None:
        """Run the statements and move the offsets (in the caller's transaction)."""
        for write in self.writes:
            write(conn)
        table = models.projection_offsets
        for p, (next_offset, next_sequence) in sorted(self.end.items()):
            conn.execute(
                update(table)
                .where(and_(table.c.source == self.source, table.c.partition == p))
                .values(next_offset=next_offset, next_sequence=next_sequence)
            )
        self.result.sealed_hours = self.work.usage.sealed


def plan_batch(
    conn: Connection,
    source: str,
    batch: Sequence[Envelope],
    offsets: dict[int, tuple[int, int]],
    lateness_ms: int,
    previous: StagedBatch | None = None,
    *,
    snapshot: bool = False,
) -> PlannedBatch:
    """Skip what ``offsets`` says is applied, apply the rest in memory, and plan the writes.

    ``offsets`` (partition -> (next_offset, next_sequence)) must cover every partition of the batch.
    """
    result = BatchResult()
    partitions = sorted({envelope.partition for envelope in batch})
    next_sequence = {p: offsets[p][1] for p in partitions}
    next_offset = {p: offsets[p][0] for p in partitions}
    fresh: list[Envelope] = []
    for envelope in batch:
        p = envelope.partition
        next_offset[p] = max(next_offset[p], envelope.offset + 1)
        event = envelope.event
        if event is None:
            result.undecodable += 1
            log.warning("skipping undecodable record at %s[%d]@%d: %s", source, p, envelope.offset, envelope.error)
            continue
        sequence = event.sequence
        if event.partition != p:
            raise ProjectionError(f"event of partition {event.partition} found in {source}[{p}]@{envelope.offset}")
        if sequence < next_sequence[p]:
            result.duplicates += 1
            continue
        if sequence != next_sequence[p]:
            raise ProjectionError(
                f"{source}[{p}]: expected event sequence {next_sequence[p]}, got {sequence} "
                f"at offset {envelope.offset} (events are missing)"
            )
        next_sequence[p] += 1
        fresh.append(envelope)
    work = StagedBatch(conn, lateness_ms, HANDLERS, snapshot=snapshot)
    work.load(fresh, previous)
    for envelope in fresh:
        work.apply(envelope)
    writes = work.plan()
    result.applied = len(fresh)
    result.gpu_totals = {key: (work.totals[key][0], work.totals[key][1]) for key in work.dirty_totals}
    result.pending = {cluster: counts[0] for cluster, counts in work.stats.items()}
    result.positions = next_offset
    if fresh:
        result.last_occurred_at = max(e.event.occurred_at for e in fresh)  # type: ignore[union-attr]
    start = {p: offsets[p] for p in partitions}
    end = {p: (next_offset[p], next_sequence[p]) for p in partitions}
    return PlannedBatch(source, start, end, writes, work, result)


# ------------------------------------------------------------------ the service


def _count_retry() -> None:
    try:
        from projections import metrics
    except ImportError:  # prometheus-client is optional
        return
    metrics.RETRIES.inc()


class Projector:
    """Projects batches into a database, one transaction per batch, retrying through outages."""

    def __init__(
        self,
        engine: Engine,
        source: str,
        *,
        lateness_ms: int = DEFAULT_LATENESS_MS,
        max_backoff: float = 5.0,
        give_up_after: float | None = None,
        on_commit: Callable[[BatchResult, float], None] | None = None,
        schema: str | None = None,
    ) -> None:
        self.engine = engine
        self.source = source
        self.lateness_ms = lateness_ms
        self.max_backoff = max_backoff
        self.give_up_after = give_up_after
        self.on_commit = on_commit
        self.schema = schema
        self.retries = 0
        self.stopping: Callable[[], bool] = lambda: False
        """Set by the runner: once it returns True, an outage is no longer waited out (SIGTERM stays prompt)."""

    def _connect(self) -> Connection:
        conn = self.engine.connect()
        if self.schema:
            conn = conn.execution_options(schema_translate_map={None: self.schema})
        return conn

    def positions(self) -> dict[int, int]:
        """partition -> next source offset to read, as committed (retrying through outages)."""
        return self._retry(lambda: self._positions_once())

    def _positions_once(self) -> dict[int, int]:
        with self._connect() as conn:
            return {p: offset for p, (offset, _) in load_offsets(conn, self.source).items()}

    def project(self, batch: Sequence[Envelope]) -> BatchResult:
        """Project one batch in one transaction; on a database outage wait and retry the whole batch."""
        return self._retry(lambda: self._project_once(batch))

    def _project_once(self, batch: Sequence[Envelope]) -> BatchResult:
        started = time.perf_counter()
        with self._connect() as conn, conn.begin():
            result = project_batch(conn, self.source, batch, lateness_ms=self.lateness_ms)
        if self.on_commit is not None:
            self.on_commit(result, time.perf_counter() - started)
        return result

    def _retry(self, attempt: Callable[[], Any]) -> Any:
        delay = 0.1
        first_failure: float | None = None
        while True:
            try:
                return attempt()
            except (OperationalError, DBAPIError) as error:
                if (
                    isinstance(error, DBAPIError)
                    and not error.connection_invalidated
                    and not isinstance(error, OperationalError)
                ):
                    raise
                now = time.monotonic()
                first_failure = first_failure or now
                if self.give_up_after is not None and now - first_failure > self.give_up_after:
                    raise
                self.retries += 1
                _count_retry()
                message = mask_url(str(error.orig) if error.orig is not None else str(error)).splitlines()[0]
                log.warning("database unavailable (%s); retrying in %.1fs", message, delay)
                deadline = time.monotonic() + delay
                while time.monotonic() < deadline:
                    if self.stopping():
                        raise ProjectionStopped(f"stopped while the database was unavailable ({message})") from None
                    time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
                delay = min(self.max_backoff, delay * 2)
