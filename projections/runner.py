"""The projector loop: poll a source, project each batch in one transaction, repeat."""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import create_engine

from projections.envelope import BatchResult, Envelope, ProjectionStopped
from projections.pipeline import Pipeline
from projections.projector import Projector
from projections.schema import ensure_schema
from projections.sources import EmbeddedEventSource, EventSource
from projections.usage import DEFAULT_LATENESS_MS

log = logging.getLogger("gpufold.projector")

DEFAULT_BATCH_SIZE = 5_000


@dataclass(slots=True)
class RunStats:
    """What a run of the loop did."""

    events: int = 0
    duplicates: int = 0
    undecodable: int = 0
    batches: int = 0
    sealed_hours: list[tuple[str, int]] = field(default_factory=list)
    seconds: float = 0.0


def _record_metrics(result: BatchResult, seconds: float) -> None:
    try:
        from projections import metrics
    except ImportError:  # prometheus-client is optional (the api extra)
        return
    metrics.BATCHES.inc()
    metrics.EVENTS_PROJECTED.inc(result.applied)
    metrics.DUPLICATES_SKIPPED.inc(result.duplicates)
    metrics.UNDECODABLE.inc(result.undecodable)
    metrics.HOURS_SEALED.inc(len(result.sealed_hours))
    metrics.COMMIT_SECONDS.observe(seconds)
    if result.last_occurred_at is not None:
        metrics.PROJECTION_LAG.set(max(0.0, time.time() - result.last_occurred_at / 1000))
    for (cluster, model), (allocated, capacity) in result.gpu_totals.items():
        if model:
            metrics.GPUS_ALLOCATED.labels(cluster, model).set(allocated / 1000)
            metrics.GPUS_TOTAL.labels(cluster, model).set(capacity / 1000)
    for cluster, pending in result.pending.items():
        metrics.PENDING_PODS.labels(cluster).set(pending)


def run(
    projector: Projector,
    source: EventSource,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    poll_timeout: float = 0.5,
    stop_when_idle: bool = False,
    stop: threading.Event | None = None,
    prefetch: int = 2,
    pipeline: bool | None = None,
) -> RunStats:
    """Project until ``stop`` is set (or, with ``stop_when_idle``, until the source is read to its end).

    A reader thread polls and decodes the next batches while the current one is
    written (psycopg releases the GIL while PostgreSQL works), at most
    ``prefetch`` batches ahead. Prefetched batches are only in memory: the
    database offsets stay the one record of progress. With ``pipeline`` (the
    default on PostgreSQL) each batch is applied while the one before it commits
    (:class:`projections.pipeline.Pipeline`).
    """
    stats = RunStats()
    started = time.perf_counter()
    if projector.on_commit is None:
        projector.on_commit = _record_metrics
    stop = stop or threading.Event()
    projector.stopping = stop.is_set
    source.start(projector.positions)
    # Long-lived objects (modules, schemas) never need scanning again, and a batch allocates
    # tens of thousands of short-lived containers: collect young objects less often.
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, 20, 100)
    batches: queue.Queue[list[Envelope] | BaseException | None] = queue.Queue(maxsize=max(1, prefetch))
    reader = threading.Thread(
        target=_read, args=(source, batches, batch_size, poll_timeout, stop_when_idle, stop), daemon=True
    )
    reader.start()
    if pipeline is None:
        pipeline = projector.engine.dialect.name == "postgresql"
    pipelined = Pipeline(projector) if pipeline else None
    last_lag = 0.0

    def count(result: BatchResult) -> None:
        stats.batches += 1
        stats.events += result.applied
        stats.duplicates += result.duplicates
        stats.undecodable += result.undecodable
        stats.sealed_hours.extend(result.sealed_hours)
        committed = getattr(source, "committed", None)
        if committed is not None:
            committed(result.positions)

    try:
        while not stop.is_set():
            try:
                batch = batches.get(timeout=0.2)
            except queue.Empty:
                if not reader.is_alive():
                    break
                continue
            if batch is None:
                break
            if isinstance(batch, BaseException):
                raise batch
            try:
                results = [projector.project(batch)] if pipelined is None else pipelined.submit(batch)
            except ProjectionStopped as stopped:
                log.info("%s", stopped)
                break
            for result in results:
                count(result)
            now = time.monotonic()
            if now - last_lag > 5.0:
                last_lag = now
                _update_lag(source)
        if pipelined is not None:
            for result in pipelined.drain():
                count(result)
    except ProjectionStopped as stopped:
        log.info("%s", stopped)
    finally:
        stop.set()
        if pipelined is not None:
            pipelined.close()  # a batch still being written commits (or not) before the run returns
        reader.join(timeout=10)
        gc.set_threshold(*thresholds)
    stats.seconds = time.perf_counter() - started
    return stats


def _read(
    source: EventSource,
    batches: queue.Queue[list[Envelope] | BaseException | None],
    batch_size: int,
    poll_timeout: float,
    stop_when_idle: bool,
    stop: threading.Event,
) -> None:
    """The reader thread: poll and decode batches into the queue; None when idle (if asked), an error if one."""

    def put(item: list[Envelope] | BaseException | None) -> bool:
        while not stop.is_set():
            try:
                batches.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    try:
        while not stop.is_set():
            batch = source.poll(batch_size, poll_timeout)
            if batch:
                if not put(batch):
                    return
            elif stop_when_idle and source.caught_up():
                put(None)
                return
    except BaseException as error:  # handed to the main thread, which raises it
        put(error)


def _update_lag(source: EventSource) -> None:
    try:
        from projections import metrics
    except ImportError:
        return
    lag = source.lag()
    if lag is not None:
        metrics.CONSUMER_LAG.set(lag)


def project_embedded_log(
    log_path: str | Path,
    sqlite_url: str,
    *,
    lateness_ms: int = DEFAULT_LATENESS_MS,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> RunStats:
    """Project the events topic of an embedded log into a database (SQLite for `gpufold demo`), to its end.

    Creates the tables if missing; safe to call again (continues where it stopped).
    """
    engine = create_engine(sqlite_url)
    try:
        ensure_schema(engine)
        source = EmbeddedEventSource(log_path)
        try:
            return run(Projector(engine, source.name, lateness_ms=lateness_ms), source, batch_size=batch_size,
                       poll_timeout=0.0, stop_when_idle=True)  # fmt: skip
        finally:
            source.close()
    finally:
        engine.dispose()
