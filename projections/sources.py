"""Where the projector reads events: the Kafka events topic, or the embedded log's SQLite file.

Both sources start each partition at the position stored in the database
(``projection_offsets.next_offset``), never at a position the log remembers:
the database is the only record of what was applied. Kafka is read with
``isolation.level=read_committed``, so events of aborted processor transactions
are never seen. A record whose bytes do not decode becomes an
:class:`~projections.projector.Envelope` with ``event=None`` (the projector
counts it, logs it and moves past it).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from projections.defaults import DEFAULT_GROUP, DEFAULT_TOPIC
from projections.projector import Envelope
from schemas import DecodeError
from schemas.fastcodec import decode_event

log = logging.getLogger("gpufold.projector.sources")


class EventSource(Protocol):
    """What the projector loop needs from a log of events."""

    name: str  # the key of this source in projection_offsets (the topic name)

    def start(self, positions: Callable[[], dict[int, int]]) -> None:
        """Begin reading; ``positions()`` gives partition -> next offset from the database."""
        ...

    def poll(self, max_records: int, timeout: float) -> list[Envelope]:
        """The next records, in offset order per partition (empty when nothing is ready)."""
        ...

    def caught_up(self) -> bool:
        """Whether every partition has been read to its end (or to its ``until`` bound)."""
        ...

    def lag(self) -> int | None:
        """Records not yet read, over all partitions (None if unknown)."""
        ...

    def close(self) -> None: ...


class Decoder:
    """Event frames -> :class:`Envelope`, never raising on bad bytes.

    Uses the generated :func:`schemas.fastcodec.decode_event` (the dataclasses straight
    from the bytes, raising only DecodeError; frames of older writer schemas take the
    fastavro path inside it).
    """

    def __call__(self, partition: int, offset: int, value: bytes | None) -> Envelope:
        if value is None:
            return Envelope(partition, offset, None, None, "empty record")
        try:
            return Envelope(partition, offset, decode_event(value), value)
        except DecodeError as error:
            return Envelope(partition, offset, None, value, str(error))


# ------------------------------------------------------------------ embedded log


class EmbeddedEventSource:
    """The events topic of an embedded log file (``gpufold.embedded_log``), read-only."""

    def __init__(self, path: str | Path, topic: str = DEFAULT_TOPIC, until: dict[int, int] | None = None) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"no embedded log at {self.path}")
        self.name = topic
        self.until = until
        # The runner polls from its reader thread and asks for lag from the main one.
        self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout = 30000")
        self._lock = threading.Lock()
        self._decode = Decoder()
        self._next: dict[int, int] = {}
        self._done: set[int] = set()

    def _partitions(self) -> list[int]:
        rows = self._db.execute('SELECT DISTINCT "partition" FROM records WHERE topic = ?', (self.name,))
        return sorted(int(row[0]) for row in rows)

    def start(self, positions: Callable[[], dict[int, int]]) -> None:
        stored = positions()
        for partition in self._partitions():
            self._next[partition] = stored.get(partition, 0)
        for partition, offset in stored.items():
            self._next.setdefault(partition, offset)

    def poll(self, max_records: int, timeout: float) -> list[Envelope]:
        with self._lock:
            return self._poll(max_records)

    def _poll(self, max_records: int) -> list[Envelope]:
        for partition in self._partitions():  # partitions that appeared since start
            self._next.setdefault(partition, 0)
        out: list[Envelope] = []
        self._done.clear()
        for partition in sorted(self._next):
            start = self._next[partition]
            limit = max_records - len(out)
            end = None if self.until is None else self.until.get(partition, 0)
            if end is not None:
                limit = min(limit, end - start)
            if limit <= 0:
                if end is not None and start >= end:
                    self._done.add(partition)
                continue
            rows = self._db.execute(
                'SELECT "offset", value FROM records WHERE topic = ? AND "partition" = ? AND "offset" >= ? '
                'ORDER BY "offset" LIMIT ?',
                (self.name, partition, start, limit),
            ).fetchall()
            for offset, value in rows:
                out.append(self._decode(partition, int(offset), value))
            if rows:
                self._next[partition] = int(rows[-1][0]) + 1
            if len(rows) < limit:
                self._done.add(partition)
        return out

    def caught_up(self) -> bool:
        with self._lock:
            return all(p in self._done for p in self._next)

    def lag(self) -> int | None:
        with self._lock:
            return self._lag()

    def _lag(self) -> int:
        total = 0
        for partition, position in list(self._next.items()):
            row = self._db.execute(
                'SELECT MAX("offset") FROM records WHERE topic = ? AND "partition" = ?', (self.name, partition)
            ).fetchone()
            end = 0 if row[0] is None else int(row[0]) + 1
            total += max(0, end - position)
        return total

    def close(self) -> None:
        with self._lock:
            self._db.close()


# ------------------------------------------------------------------ Kafka


def kafka_consumer_config(bootstrap: str, group: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The consumer settings the projector needs; ``extra`` (e.g. security settings) wins."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "isolation.level": "read_committed",  # never see events of aborted processor transactions
        "enable.auto.commit": False,  # the database holds the positions
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        # A crashed projector's partitions move to a live one after this long (broker minimum: 6 s).
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 2_000,
        "fetch.max.bytes": 52_428_800,
        "max.partition.fetch.bytes": 10_485_760,
        "queued.max.messages.kbytes": 262_144,
    }
    config.update(extra or {})
    return config


class KafkaEventSource:
    """The events topic on Kafka, read with a consumer group (or all partitions assigned, for rebuilds)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str = DEFAULT_TOPIC,
        *,
        group: str = DEFAULT_GROUP,
        until: dict[int, int] | None = None,
        assign_all: bool = False,
        extra_config: dict[str, Any] | None = None,
    ) -> None:
        from confluent_kafka import Consumer

        self.name = topic
        self.until = until
        self.assign_all = assign_all or until is not None
        self._consumer = Consumer(kafka_consumer_config(bootstrap, group, extra_config))
        self._decode = Decoder()
        self._positions: Callable[[], dict[int, int]] = dict
        self._assigned: set[int] = set()
        self._eof: set[int] = set()
        self._next: dict[int, int] = {}
        # The runner polls from its reader thread; a consumer call from another thread while
        # consume() runs can block, so commits and lag are handed over and done in poll().
        self._to_commit: dict[int, int] | None = None
        self._lag: int | None = None
        self._lag_at = 0.0

    def _all_partitions(self) -> list[int]:
        metadata = self._consumer.list_topics(self.name, timeout=10)
        topic = metadata.topics.get(self.name)
        if topic is None or topic.error is not None:
            raise RuntimeError(f"Kafka topic {self.name!r} is not available: {getattr(topic, 'error', 'missing')}")
        return sorted(topic.partitions)

    def start(self, positions: Callable[[], dict[int, int]]) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self._positions = positions
        if self.assign_all:
            stored = positions()
            tps = [TopicPartition(self.name, p, stored.get(p, OFFSET_BEGINNING)) for p in self._all_partitions()]
            self._on_assign(self._consumer, tps, stored)
            return

        def on_assign(consumer: Any, tps: list[Any]) -> None:
            self._on_assign(consumer, tps, self._positions())

        def on_revoke(consumer: Any, tps: list[Any]) -> None:
            for tp in tps:
                self._assigned.discard(tp.partition)
                self._eof.discard(tp.partition)
            consumer.unassign()

        self._consumer.subscribe([self.name], on_assign=on_assign, on_revoke=on_revoke)

    def _on_assign(self, consumer: Any, tps: list[Any], stored: dict[int, int]) -> None:
        from confluent_kafka import OFFSET_BEGINNING

        for tp in tps:
            tp.offset = stored.get(tp.partition, OFFSET_BEGINNING)
            self._assigned.add(tp.partition)
            self._next[tp.partition] = max(0, stored.get(tp.partition, 0))
            self._eof.discard(tp.partition)
            if self.until is not None and self._next[tp.partition] >= self.until.get(tp.partition, 0):
                self._eof.add(tp.partition)
        consumer.assign(tps)
        log.info("projecting %s partitions %s from %s", self.name, sorted(self._assigned), stored)

    def poll(self, max_records: int, timeout: float) -> list[Envelope]:
        from confluent_kafka import KafkaError

        self._commit_pending()
        if time.monotonic() - self._lag_at > 5.0:
            self._lag_at = time.monotonic()
            self._lag = self._measure_lag()
        out: list[Envelope] = []
        messages = self._consumer.consume(num_messages=max_records, timeout=timeout)
        for message in messages:
            error = message.error()
            partition = int(message.partition() or 0)
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    self._eof.add(partition)
                    continue
                if error.retriable() or not error.fatal():
                    log.warning("Kafka: %s", error)
                    continue
                raise RuntimeError(f"Kafka consumer failed: {error}")
            offset = int(message.offset() or 0)
            if self.until is not None and offset >= self.until.get(partition, 0):
                self._eof.add(partition)
                continue
            self._eof.discard(partition)
            out.append(self._decode(partition, offset, message.value()))
            self._next[partition] = offset + 1
            if self.until is not None and offset + 1 >= self.until.get(partition, 0):
                self._eof.add(partition)
        return out

    def committed(self, positions: dict[int, int]) -> None:
        """Tell Kafka too (best effort, for lag tooling); the database stays the source of truth.

        Any thread may call this; the commit itself happens in the next ``poll``.
        """
        if not self.assign_all and positions:
            self._to_commit = dict(positions)

    def _commit_pending(self) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        positions, self._to_commit = self._to_commit, None
        if not positions:
            return
        offsets = [TopicPartition(self.name, p, o) for p, o in positions.items() if p in self._assigned]
        if not offsets:
            return
        try:
            self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as error:  # pragma: no cover - informational only
            log.debug("offset commit to Kafka failed: %s", error)

    def caught_up(self) -> bool:
        return bool(self._assigned) and self._assigned <= self._eof

    def lag(self) -> int | None:
        """Records not yet read, as measured by the last poll (at most every 5 s)."""
        return self._lag

    def _measure_lag(self) -> int | None:
        from confluent_kafka import TopicPartition

        total = 0
        try:
            for partition in sorted(self._assigned):
                _, high = self._consumer.get_watermark_offsets(TopicPartition(self.name, partition), cached=True)
                if high >= 0:
                    total += max(0, high - self._next.get(partition, 0))
        except Exception:  # metadata unavailable right now
            return None
        return total

    def close(self) -> None:
        self._consumer.close()
