"""``gpufold processor run``: the exactly-once fold loop on Kafka, with graceful shutdown and JSON logs.

Each iteration polls one batch (at most ``batch_size`` records, gathered for at most ``linger`` seconds after
the first one), folds it and commits it in one Kafka transaction. SIGTERM/SIGINT finish the current batch,
then close. Exit status: 0 after a graceful stop, 3 when fenced or on a fatal Kafka error, 4 on a broken
invariant (a bug: nothing of the failing batch is committed).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import signal
import sys
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

from kafka_settings.config import KafkaConfig, install_secret_filter
from logs.kafka import (
    DEFAULT_SESSION_TIMEOUT_MS,
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    BatchAborted,
    KafkaCommandLog,
    KafkaFatalError,
    KafkaLogError,
)
from logs.port import PartitionCountChanged
from processor.core.errors import InvariantViolation
from processor.runtime.collector import collect_and_freeze
from processor.runtime.loop import DEFAULT_BATCH_SIZE, DEFAULT_SNAPSHOT_EVERY, Processor
from processor.runtime.ticks import TICK_SOURCE, TickSchedule
from schemas.topics import Topics

log = logging.getLogger("gpufold.processor")

EXIT_OK = 0
EXIT_FATAL = 3
EXIT_INVARIANT = 4


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and any ``extra={"fields": {...}}``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(json_lines: bool = True, level: int = logging.INFO) -> None:
    """Route every log record to stderr, as JSON lines (or plain text), with secrets scrubbed."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root.handlers[:] = [handler]
    root.setLevel(level)
    install_secret_filter(root)


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    group_id: str = "gpufold-processor"
    instance_id: str = "0"
    batch_size: int = DEFAULT_BATCH_SIZE
    linger: float = 0.005
    poll_timeout: float = 0.5
    snapshot_every: int = DEFAULT_SNAPSHOT_EVERY
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    stats_every: float = 10.0
    stop_when_idle: float = 0.0
    """Stop after this many seconds without records (0 = run until signalled); for tests and batch jobs."""
    metrics_port: int | None = None
    """Serve Prometheus /metrics on this port (needs prometheus-client, the ``api`` extra)."""
    metrics_host: str = "127.0.0.1"
    metrics_every: float = 5.0
    tick_interval: float = 0.0
    """Publish a Tick into each owned partition every this many seconds (0 = never): deadlines fire on time."""
    pipeline: bool = True
    """Fold the next batch while the previous batch's transaction commits (``--no-pipeline``: one after the other)."""
    trace_batches: bool = False
    """Log one ``batch`` line per committed batch: its positions and the wall-clock time of each stage
    (:attr:`~logs.kafka.KafkaCommandLog.marks`); ``bench/kafka_end_to_end.py --stages`` reads them."""


class Runner:
    """The loop: poll -> fold -> commit, until stopped."""

    def __init__(self, config: KafkaConfig, topics: Topics, settings: RunnerSettings) -> None:
        self.settings = settings
        self.log = KafkaCommandLog(
            config,
            topics,
            group_id=settings.group_id,
            instance_id=settings.instance_id,
            transaction_timeout_ms=settings.transaction_timeout_ms,
            session_timeout_ms=settings.session_timeout_ms,
            linger=settings.linger,
            on_revoked=self._forget,
        )
        self.processor = Processor(
            self.log, snapshot_every=settings.snapshot_every, batch_size=settings.batch_size, pipeline=settings.pipeline
        )
        collect_and_freeze()  # the process's own objects (modules, the client) out of the collector's sight, once
        self._stopping = False
        self.log.stopping = lambda: self._stopping
        self.metrics: Any = None
        self.ticks = TickSchedule(settings.tick_interval)
        self._ticker: Any = None  # a CommandPublisher, made on the first tick
        self._config = config
        self._commands_topic = topics.commands
        self._rejected_reported: dict[str, int] = {}
        self._refused_reported: dict[str, int] = {}
        self._metrics_refreshed = 0.0
        if settings.metrics_port is not None:
            self._serve_metrics(settings.metrics_port, settings.metrics_host)

    def _serve_metrics(self, port: int, host: str) -> None:
        try:
            from prometheus_client import start_http_server

            from processor.runtime.metrics import ProcessorMetrics
        except ImportError as error:
            message = f"--metrics-port needs prometheus-client (pip install 'gpufold[api]'): {error}"
            raise KafkaLogError(message) from None
        self.metrics = ProcessorMetrics()
        start_http_server(port, addr=host, registry=self.metrics.registry)
        log.info("metrics served", extra={"fields": {"url": f"http://{host}:{port}/metrics"}})

    def _observe(self, count: int, now: float) -> None:
        metrics = self.metrics
        rejected: dict[str, int] = {}
        for folder in self.processor.folders.values():
            for code, total in folder.rejected.items():
                rejected[code] = rejected.get(code, 0) + total
        new = {code: total - self._rejected_reported.get(code, 0) for code, total in rejected.items()}
        refused = self.processor.refused()  # cumulative, never reset
        new_refused = {code: total - self._refused_reported.get(code, 0) for code, total in refused.items()}
        positive = {code: n for code, n in new_refused.items() if n > 0}
        metrics.observe_batch(count, {code: n for code, n in new.items() if n > 0}, 0, positive)
        self._rejected_reported = rejected
        self._refused_reported = refused
        if now - self._metrics_refreshed >= self.settings.metrics_every:
            folders = self.processor.folders
            positions = {partition: folder.state.next_offset for partition, folder in folders.items()}
            metrics.refresh((folder.state for folder in folders.values()), self.log.lag(positions))
            self._metrics_refreshed = now

    def _tick(self) -> None:
        """Publish the ticks that are due (outside the fold's transaction: a tick is just a command)."""
        states = [folder.state for folder in self.processor.folders.values()]
        commands = self.ticks.due(states, self.settings.instance_id)
        if not commands:
            return
        if self._ticker is None:
            from producers.publisher import CommandPublisher

            self._ticker = CommandPublisher(self._config, self._commands_topic, source=TICK_SOURCE)
        for command in commands:
            self._ticker.publish(command)

    def _committed(self) -> None:
        """After each transaction committed: its ``batch`` line (``--trace-batches``) and its commit latency."""
        batch = self.log.batch_marks
        if self.settings.trace_batches:
            marks = {stage: round(at, 6) for stage, at in batch.items()}
            fields = {"records": self.processor.last_committed, "positions": self.log.positions, "marks": marks}
            log.info("batch", extra={"fields": fields})
        if self.metrics is not None:
            if "committed" in batch:
                self.metrics.commit_seconds.observe(batch["committed"] - batch.get("txn", batch["commit"]))
            self._observe(self.processor.last_committed, time.monotonic())

    def _settle_last(self, status: int) -> int:
        """Wait for the last batch's transaction (pipelined) before closing; the exit status if it failed."""
        commits = self.log.commits
        try:
            self.processor.settle()
        except BatchAborted as aborted:  # nothing of it is visible: a restart folds it again
            log.warning("the last batch was not committed: %s", aborted)
        except KafkaLogError as error:
            log.error("the last batch was not committed: %s", error)
            return status or EXIT_FATAL
        if self.log.commits != commits:
            self._committed()
        return status

    def _forget(self, partitions: list[int]) -> None:
        for partition in partitions:
            self.processor.forget(partition)

    def stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        if not self._stopping:
            log.info("stopping after the current batch", extra={"fields": {"signal": signum}})
        self._stopping = True

    def run(self) -> int:
        settings = self.settings
        try:
            self.log.start()
        except KafkaLogError as error:
            log.error("%s", error)
            return EXIT_FATAL
        log.info(
            "processor started",
            extra={
                "fields": {
                    "transactional_id": self.log.transactional_id,
                    "group": settings.group_id,
                    "commands": self.log.topics.commands,
                    "batch_size": settings.batch_size,
                    "snapshot_every": settings.snapshot_every,
                }
            },
        )
        processor = self.processor
        started = last_stats = last_record = time.monotonic()
        cpu_started = time.process_time()
        reported = 0
        status = EXIT_OK
        try:
            while not self._stopping:
                commits = self.log.commits
                try:
                    count = processor.run_batch(settings.poll_timeout)
                except BatchAborted as aborted:
                    log.warning("batch aborted, partitions will be rebuilt", extra={"fields": {"reason": str(aborted)}})
                    continue
                now = time.monotonic()
                if self.log.commits != commits:
                    self._committed()
                self._tick()
                if count or not self.log.assignment():  # idle time counts once partitions are assigned
                    last_record = now
                elif settings.stop_when_idle and now - last_record >= settings.stop_when_idle:
                    log.info("idle, stopping")
                    break
                if now - last_stats >= settings.stats_every:
                    done = processor.processed
                    log.info(
                        "progress",
                        extra={
                            "fields": {
                                "processed": done,
                                "rate": round((done - reported) / (now - last_stats), 1),
                                "partitions": self.log.assignment(),
                                "refused": processor.refused(),
                            }
                        },
                    )
                    last_stats, reported = now, done
        except KafkaFatalError as error:
            log.error("fatal: %s", error)
            status = EXIT_FATAL
        except KafkaLogError as error:
            # The batch may be half-folded and uncommitted: stop; a restart rebuilds from what was committed.
            if self._stopping:  # asked to stop while retrying: nothing half-committed, a graceful stop
                log.warning("stopped while retrying: %s", error)
            else:
                log.error("giving up after an infrastructure fault: %s", error)
                status = EXIT_FATAL
        except PartitionCountChanged as error:
            log.error("refusing to fold: %s", error)
            status = EXIT_FATAL
        except InvariantViolation as error:
            log.error("invariant violated, batch not committed: %s", error)
            status = EXIT_INVARIANT
        finally:
            status = self._settle_last(status)
            self.log.close()
            if self._ticker is not None:
                with contextlib.suppress(Exception):  # best effort: a lost tick is replaced by the next one
                    self._ticker.close(timeout=5.0)
        elapsed = time.monotonic() - started
        times = processor.times
        # CPU per command: the whole process (all threads, librdkafka's included) and this thread by stage.
        process_cpu_us = (time.process_time() - cpu_started) * 1e6 / max(times.records, 1)
        log.info(
            "processor stopped",
            extra={
                "fields": {
                    "processed": processor.processed,
                    "refused": processor.refused(),
                    "seconds": round(elapsed, 3),
                    "exit": status,
                    "batches": times.batches,
                    "process_cpu_us": round(process_cpu_us, 1),
                    "per_command_us": times.per_command_us(),
                }
            },
        )
        return status


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def run(config: KafkaConfig, topics: Topics, settings: RunnerSettings) -> int:
    """Run until SIGTERM/SIGINT (or idle, if asked); returns the process exit status."""
    # `kill -USR1 <pid>` dumps every thread's stack to stderr: how to see where a stuck processor waits.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # A stop asked while the runner connects is kept and honoured as soon as it runs: a graceful stop.
    asked: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: asked.append(signum)) for sig in STOP_SIGNALS}
    try:
        runner = Runner(config, topics, settings)
        for sig in STOP_SIGNALS:
            signal.signal(sig, runner.stop)
        if asked:
            runner.stop(asked[0])
        return runner.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
