"""Where the write API puts commands: the embedded log (append) or Kafka (``CommandPublisher``).

Both say where each command went (:class:`Placed`) and hand out outcomes: the events the processor
committed for a command (``PodScheduled``, ``PodQueued``, ``CommandRejected``, ...).

- :meth:`CommandWriter.append` writes, blocking the calling thread for the append only;
- :meth:`CommandWriter.watch` returns a future that one watcher thread per writer completes when the
  outcome is committed, so a request waiting for outcomes (``?wait``) holds no thread;
- :meth:`CommandWriter.outcome_at` reads the outcome of a command already in the log (an idempotent
  retry's original outcome), or None if the processor has not committed it yet.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from kafka_settings.config import KafkaConfig
from logs.embedded import EmbeddedLog
from producers.outcomes import Outcome  # one Outcome for the client library and the server
from schemas import COMMAND, registry
from schemas.commands import Command
from schemas.events import Event
from schemas.fastcodec import decode_event
from schemas.partitioner import partition_for
from schemas.topics import Topics

log = logging.getLogger("gpufold.serve.writers")
RECENT_OUTCOMES = 10_000  # outcomes read before anyone waited for them (Kafka: the watcher reads all events)


@dataclass(frozen=True, slots=True)
class Placed:
    command_id: str
    cluster: str
    partition: int
    offset: int | None  # known on the embedded log; on Kafka once the replica folded it


class WriteError(RuntimeError):
    """The log could not take the commands (nothing, or not all, was written): HTTP 503."""


class CommandWriter(Protocol):
    backend: str

    def append(self, commands: list[Command]) -> list[Placed]:
        """Write the commands in order (blocking until the log has them)."""
        ...

    def prepare(self) -> None:
        """Call before :meth:`append` when outcomes will be watched (Kafka starts reading the events here)."""
        ...

    def watch(self, placed: Placed) -> Future[Outcome]:
        """A future completed with the command's outcome once the processor committed it."""
        ...

    def outcome_at(self, partition: int, offset: int) -> Outcome | None:
        """The committed outcome of the command at this offset, or None if not committed yet."""
        ...

    def close(self) -> None: ...


class _Watcher:
    """One thread completing futures: ``check`` runs every ``poll`` seconds while anything is watched."""

    def __init__(self, name: str, poll: float) -> None:
        self.poll = poll
        self._lock = threading.Lock()
        self._waiting: dict[Any, list[tuple[Placed, Future[Outcome]]]] = {}
        self._recent: OrderedDict[Any, Outcome] = OrderedDict()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, key: Any, placed: Placed) -> Future[Outcome]:
        future: Future[Outcome] = Future()
        with self._lock:
            done = self._recent.pop(key, None)
            if done is None:
                self._waiting.setdefault(key, []).append((placed, future))
        if done is not None:
            future.set_result(done)
        self._wake.set()
        return future

    def waiting(self) -> dict[Any, list[tuple[Placed, Future[Outcome]]]]:
        """What is watched now, cancelled futures dropped."""
        with self._lock:
            for key in list(self._waiting):
                self._waiting[key] = [(p, f) for p, f in self._waiting[key] if not f.cancelled()]
                if not self._waiting[key]:
                    del self._waiting[key]
            return {key: list(items) for key, items in self._waiting.items()}

    def complete(self, key: Any, outcome: Outcome) -> None:
        with self._lock:
            items = self._waiting.pop(key, [])
            if not items:  # read before its waiter registered (it registers after appending): kept a while
                self._recent[key] = outcome
                while len(self._recent) > RECENT_OUTCOMES:
                    self._recent.popitem(last=False)
        for _, future in items:
            if not future.done():
                future.set_result(outcome)

    def _run(self) -> None:
        while not self._stop.is_set():
            waiting = self.waiting()
            if not waiting:
                self.idle()
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            try:
                self.check(waiting)
            except Exception:  # a log hiccup: keep watching, the waiters time out on their own
                log.exception("watching outcomes")
            self._stop.wait(self.poll)

    def check(self, waiting: dict[Any, list[tuple[Placed, Future[Outcome]]]]) -> None:
        raise NotImplementedError

    def idle(self) -> None:
        """Called when nothing is watched (before sleeping)."""

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)


class EmbeddedWriter:
    """Appends to an embedded log file (one SQLite handle per thread) and reads outcomes from its events."""

    backend = "embedded"

    def __init__(self, path: str | os.PathLike[str], topics: Topics | None = None, poll: float = 0.02) -> None:
        self.path = path
        self.topics = topics or Topics()
        self._local = threading.local()
        self._handles: list[EmbeddedLog] = []
        self._handles_lock = threading.Lock()
        self._encode = registry().codec(COMMAND).encode
        self._log()  # create the file now, so the replica can open it read-only
        writer = self

        class Watcher(_Watcher):
            def check(self, waiting: dict[Any, list[tuple[Placed, Future[Outcome]]]]) -> None:
                handle = writer._log()
                committed: dict[int, int] = {}
                for (partition, offset), _items in sorted(waiting.items()):
                    if partition not in committed:
                        committed[partition] = handle.committed(partition)
                    if committed[partition] > offset:
                        outcome = writer._outcome(handle, partition, offset)
                        if outcome is not None:
                            self.complete((partition, offset), outcome)

        self._watcher = Watcher("gpufold-outcomes", poll)

    def _log(self) -> EmbeddedLog:
        handle = getattr(self._local, "log", None)
        if handle is None:
            handle = self._local.log = EmbeddedLog(self.path, topics=self.topics)
            with self._handles_lock:
                self._handles.append(handle)
        return handle

    def append(self, commands: list[Command]) -> list[Placed]:
        frames = [(c.cluster.encode(), self._encode(c.to_avro())) for c in commands]
        try:
            positions = self._log().append_commands(frames)
        except Exception as error:
            raise WriteError(f"cannot append to {self.path}: {error}") from error
        return [Placed(c.command_id, c.cluster, p, o) for c, (p, o) in zip(commands, positions, strict=True)]

    def prepare(self) -> None:
        return None

    def watch(self, placed: Placed) -> Future[Outcome]:
        assert placed.offset is not None
        return self._watcher.add((placed.partition, placed.offset), placed)

    def outcome_at(self, partition: int, offset: int) -> Outcome | None:
        handle = self._log()
        if handle.committed(partition) <= offset:
            return None
        return self._outcome(handle, partition, offset)

    def write(self, commands: list[Command], wait: float | None = None) -> tuple[list[Placed], list[Outcome | None]]:
        """Append, then (with ``wait``) block this thread for the outcomes: for scripts and tests."""
        placed = self.append(commands)
        if wait is None:
            return placed, []
        futures = [self.watch(p) for p in placed]
        deadline = time.monotonic() + wait
        outcomes: list[Outcome | None] = []
        for future in futures:
            try:
                outcomes.append(future.result(max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                future.cancel()
                outcomes.append(None)
        return placed, outcomes

    def _outcome(self, handle: EmbeddedLog, partition: int, offset: int) -> Outcome | None:
        """The events of the command at ``offset``: a binary search on the events' command offsets."""
        topic = self.topics.events

        def first_at_or_after(index: int) -> Event | None:
            # An imported Kafka topic has gaps (transaction markers): take the next record there is.
            record = next(handle.read(topic, partition, index, None, chunk=1), None)
            return None if record is None else decode_event(record.value)

        low, high = 0, handle.end_offset(topic, partition)
        while low < high:  # the first event offset whose command offset is >= the command's
            middle = (low + high) // 2
            event = first_at_or_after(middle)
            if event is not None and event.command_offset < offset:
                low = middle + 1
            else:
                high = middle
        events = []
        for record in handle.read(topic, partition, low, None, chunk=64):
            event = decode_event(record.value)
            if event.command_offset != offset:
                break
            events.append(event)
        if not events:
            return None  # a dead letter: the command did not decode
        return Outcome(events[0].command_id, partition, offset, tuple(events))

    def close(self) -> None:
        self._watcher.stop()
        with self._handles_lock:
            handles, self._handles = self._handles, []
        for handle in handles:
            with contextlib.suppress(Exception):  # a handle of another thread: SQLite refuses, the process ends
                handle.close()
        self._local = threading.local()


class KafkaWriter:
    """Publishes with one shared ``CommandPublisher``; one watcher thread reads the events topic for outcomes."""

    backend = "kafka"

    def __init__(self, config: KafkaConfig, topics: Topics, partitions: int) -> None:
        from producers.publisher import CommandPublisher

        self.config = config
        self.topics = topics
        self.partitions = partitions
        self._publisher = CommandPublisher(config, topics.commands, source="gpufold-api")
        self._lock = threading.Lock()
        self._watcher = _KafkaWatcher(config, topics.events)

    def append(self, commands: list[Command]) -> list[Placed]:
        from producers.publisher import DeliveryError

        try:
            with self._lock:
                for command in commands:
                    self._publisher.publish(command)
                self._publisher.flush()
        except (DeliveryError, ValueError) as error:
            raise WriteError(self.config.scrub(str(error))) from None
        return [
            Placed(c.command_id, c.cluster, partition_for(c.cluster.encode(), self.partitions), None) for c in commands
        ]

    def prepare(self) -> None:
        self._watcher.prepare()

    def watch(self, placed: Placed) -> Future[Outcome]:
        return self._watcher.add(placed.command_id, placed)

    def outcome_at(self, partition: int, offset: int) -> Outcome | None:
        return _kafka_outcome_at(self.config, self.topics.events, partition, offset)

    def close(self) -> None:
        self._watcher.stop()
        self._publisher.close()


class _KafkaWatcher(_Watcher):
    """Reads the events topic (``read_committed``) while outcomes are watched, from the end as of :meth:`prepare`
    (called before publishing); when nothing is watched for a while it lets go of the partitions."""

    IDLE_SECONDS = 10.0

    def __init__(self, config: KafkaConfig, topic: str) -> None:
        self.config = config
        self.topic = topic
        self._consumer: Any = None
        self._ready = threading.Event()
        self._want = threading.Event()
        self._active_at = time.monotonic()  # the last prepare() or moment with a waiter
        self._gate = threading.Lock()
        self._open: dict[int, tuple[str, int, list[Event]]] = {}
        super().__init__("gpufold-kafka-outcomes", 0.0)

    def prepare(self) -> None:
        """Make sure the consumer reads from (at most) the end of the topic as of now; blocks until it does."""
        with self._gate:
            self._active_at = time.monotonic()  # the thread will not let go for IDLE_SECONDS
            if self._ready.is_set():
                return
        self._want.set()
        self._wake.set()
        if not self._ready.wait(30):
            raise WriteError(f"cannot read the events topic {self.topic} to wait for outcomes")

    def _position(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        from kafka_settings.topics import watermark_offsets

        self._consumer = Consumer(
            self.config.client(
                {"fetch.wait.max.ms": 10},
                {
                    "group.id": f"gpufold-serve-outcomes-{os.getpid()}",
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "logger": logging.getLogger("gpufold.kafka.rdkafka"),
                },
            )
        )
        metadata = self._consumer.list_topics(self.topic, timeout=10).topics[self.topic]
        assignment = []
        for partition in sorted(metadata.partitions):
            _, high = watermark_offsets(self._consumer, TopicPartition(self.topic, partition), 10)
            assignment.append(TopicPartition(self.topic, partition, high))
        self._consumer.assign(assignment)
        self._open = {}
        self._ready.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._want.is_set() and not self._ready.is_set():
                try:
                    self._position()
                except Exception:
                    log.exception("cannot read the events topic")
                    self._stop.wait(1.0)
                    continue
                self._want.clear()
            if not self._ready.is_set():
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            if self.waiting():
                self._active_at = time.monotonic()
            elif time.monotonic() - self._active_at > self.IDLE_SECONDS:
                with self._gate:  # prepare() cannot slip in between the check and the close
                    if time.monotonic() - self._active_at > self.IDLE_SECONDS:
                        self._ready.clear()
                        with contextlib.suppress(Exception):
                            self._consumer.close()
                        self._consumer = None
                        continue
            try:
                self._read(0.1)
            except Exception:
                log.exception("reading outcomes")

    def _read(self, timeout: float) -> None:
        from confluent_kafka import KafkaError

        first = self._consumer.poll(timeout)
        if first is None:
            return
        for message in [first, *self._consumer.consume(1000, 0)]:
            error = message.error()
            partition = message.partition()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    self._close_open(partition)
                continue
            try:
                event = decode_event(message.value())
            except Exception:
                continue
            current = self._open.get(partition)
            if current is not None and current[1] != event.command_offset:
                self._close_open(partition)
                current = None
            if current is None:
                self._open[partition] = (event.command_id, event.command_offset, [event])
            else:
                current[2].append(event)

    def _close_open(self, partition: int) -> None:
        current = self._open.pop(partition, None)
        if current is not None:
            command_id, offset, events = current
            self.complete(command_id, Outcome(command_id, partition, offset, tuple(events)))

    def stop(self) -> None:
        super().stop()
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                self._consumer.close()


def _kafka_outcome_at(config: KafkaConfig, topic: str, partition: int, offset: int) -> Outcome | None:
    """The events of the command at ``offset`` on Kafka: a binary search over the events partition (each event
    carries its command's offset), then the run of events of that command. O(log n) fetches."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from kafka_settings.topics import watermark_offsets

    consumer = Consumer(
        config.client(
            {"fetch.wait.max.ms": 10},
            {
                "group.id": f"gpufold-serve-lookup-{os.getpid()}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "logger": logging.getLogger("gpufold.kafka.rdkafka"),
            },
        )
    )
    try:
        low, high = watermark_offsets(consumer, TopicPartition(topic, partition), 10)

        def read_from(index: int, count: int) -> list[tuple[int, Event]]:
            """Up to ``count`` (offset, event) from ``index`` on (gaps, such as transaction markers, skipped);
            fewer at the end of the partition."""
            consumer.assign([TopicPartition(topic, partition, index)])
            found: list[tuple[int, Event]] = []
            deadline = time.monotonic() + 10
            while len(found) < count and time.monotonic() < deadline:
                for message in consumer.consume(count - len(found), 0.2):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            return found
                        continue
                    found.append((message.offset() or 0, decode_event(message.value())))
            return found

        lo, hi = low, high
        while lo < hi:  # the first event offset whose command offset is >= the command's
            middle = (lo + hi) // 2
            first = read_from(middle, 1)
            if first and first[0][1].command_offset < offset:
                lo = first[0][0] + 1
            else:
                hi = middle
        events: list[Event] = []
        position = lo
        while position < high:
            chunk = read_from(position, 64)
            if not chunk:
                break
            for at, event in chunk:
                if event.command_offset != offset:
                    position = high
                    break
                events.append(event)
                position = at + 1
        return Outcome(events[0].command_id, partition, offset, tuple(events)) if events else None
    finally:
        consumer.close()
