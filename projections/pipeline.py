"""The threaded pipeline: one batch is written while the next is applied (PostgreSQL)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from sqlalchemy.exc import DBAPIError, OperationalError

from projections.envelope import BatchResult, Envelope, ProjectionError
from projections.offsets import load_offsets, lock_offsets
from projections.projector import PlannedBatch, Projector, plan_batch

log = logging.getLogger("gpufold.projector")


class _Moved(Exception):
    """The offsets moved since the batch was applied: it was applied on a view that is not the database's."""


class Pipeline:
    """Projects batches so that one is written while the next is applied (PostgreSQL).

    :meth:`submit` applies a batch in memory on top of the batch before it (whose
    transaction may still be open: the rows it holds are taken over as it will have
    written them, the rest read from the database, which it does not change), then
    waits for that transaction and hands the new batch to a writer thread. The writer
    locks the offsets, checks that they are where the batch was applied from, and
    commits rows and offsets in one transaction, as :func:`project_batch` does. If the
    offsets moved (another projector of the group got there) or a write failed (an
    outage), nothing of that batch is committed, and it and the batch applied on top
    of it are projected again the unpipelined way (:meth:`Projector.project`, which
    skips what is already applied and retries outages). Exactly once either way.
    """

    def __init__(self, projector: Projector) -> None:
        self.projector = projector
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="projector-writer")
        self._inflight: tuple[Future[BatchResult], Sequence[Envelope]] | None = None
        self._previous: PlannedBatch | None = None
        self.replays = 0
        """Batches projected again the unpipelined way (their pipelined write was not committed)."""

    def submit(self, batch: Sequence[Envelope]) -> list[BatchResult]:
        """Apply the batch and start writing it; the results of the batches committed meanwhile, in order."""
        planned: PlannedBatch | None = None
        if batch:
            try:
                planned = self._apply(batch)
            except (ProjectionError, OperationalError, DBAPIError) as error:  # decided again below
                log.info("pipelined apply failed (%s); projecting the batch unpipelined", error)
        results, ok = self._wait()
        if planned is None or not ok:  # applied on a view the database does not have
            self._previous = None
            if batch:
                results.append(self.projector.project(batch))
            return results
        self._inflight = (self._writer.submit(self._write, planned), batch)
        self._previous = planned
        return results

    def drain(self) -> list[BatchResult]:
        """Wait for the batch being written; its result (nothing if none was in flight)."""
        results, _ = self._wait()
        self._previous = None
        return results

    def close(self) -> None:
        """Wait for the batch being written to commit or fail (the database is consistent either way), then
        stop the writer thread. After :meth:`drain` on a normal exit; on an error, so that no write outlives
        the run."""
        if self._inflight is not None:
            future, _ = self._inflight
            self._inflight = None
            error = future.exception()
            if error is not None:
                log.info("pipelined write not committed (%s)", error)
        self._previous = None
        self._writer.shutdown(wait=True)

    def _apply(self, batch: Sequence[Envelope]) -> PlannedBatch:
        previous = self._previous
        offsets = dict(previous.end) if previous is not None else {}
        with self.projector._connect() as conn, conn.begin():
            # Offsets before rows: a commit by anyone else after this read moves them, which the write sees.
            if {envelope.partition for envelope in batch} - offsets.keys():
                stored = load_offsets(conn, self.projector.source)
                for envelope in batch:
                    offsets.setdefault(envelope.partition, stored.get(envelope.partition, (0, 0)))
            return plan_batch(conn, self.projector.source, batch, offsets, self.projector.lateness_ms,
                         previous.work if previous is not None else None, snapshot=True)  # fmt: skip

    def _write(self, planned: PlannedBatch) -> BatchResult:
        started = time.perf_counter()
        with self.projector._connect() as conn, conn.begin():
            found = lock_offsets(conn, self.projector.source, sorted(planned.start))
            if found != planned.start:
                raise _Moved(f"offsets {found} are not {planned.start}, which the batch was applied on")
            planned.write(conn)
        if self.projector.on_commit is not None:
            self.projector.on_commit(planned.result, time.perf_counter() - started)
        return planned.result

    def _wait(self) -> tuple[list[BatchResult], bool]:
        """The result of the batch in flight; if its write failed, it is projected again unpipelined."""
        if self._inflight is None:
            return [], True
        future, batch = self._inflight
        self._inflight = None
        try:
            return [future.result()], True
        except Exception as error:  # nothing of it was committed (a rolled-back transaction)
            log.info("pipelined write not committed (%s); projecting the batch again unpipelined", error)
            self._previous = None
            self.replays += 1
            return [self.projector.project(batch)], False
