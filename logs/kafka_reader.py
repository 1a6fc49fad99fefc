"""The one reader of a Kafka topic: the projector reads its events, the replica its commands and snapshots through it.

Each partition starts at the position the caller stored (``start(positions)``, or ``seek``), never at
one Kafka remembers: the database is the only record of what was applied. The topic is read with
``isolation.level=read_committed``, so records of aborted processor transactions are never seen.
With a consumer group, partitions move between readers on a rebalance; with ``assign_all`` (or an
``until`` bound, for rebuilds) every partition is assigned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from logs.port import StoredRecord

log = logging.getLogger("gpufold.kafka.reader")


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


class KafkaReadError(RuntimeError):
    """The consumer failed with a fatal error (retriable ones are logged and read past)."""


class KafkaTopicReader:
    """One topic on Kafka: read with a consumer group (the projector), with all partitions assigned (rebuilds),
    or at positions the caller sets with :meth:`seek` (the replica, which keeps its own positions)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        group: str,
        until: dict[int, int] | None = None,
        assign_all: bool = False,
        extra_config: dict[str, Any] | None = None,
        consumer: Any = None,
    ) -> None:
        """``consumer``: a confluent-kafka Consumer made by the caller (then ``bootstrap``, ``group`` and
        ``extra_config`` are not used), for readers that build their clients from ``kafka_settings``."""
        from confluent_kafka import Consumer

        self.topic = topic
        self.until = until
        self.assign_all = assign_all or until is not None
        self._consumer = (
            consumer if consumer is not None else Consumer(kafka_consumer_config(bootstrap, group, extra_config))
        )
        self._positions: Callable[[], dict[int, int]] = dict
        self._assigned: set[int] = set()
        self._eof: set[int] = set()
        self._next: dict[int, int] = {}
        # The runner polls from its reader thread; a consumer call from another thread while
        # consume() runs can block, so commits and lag are handed over and done in poll().
        self._to_commit: dict[int, int] | None = None
        self._lag: int | None = None
        self._lag_at = 0.0

    @classmethod
    def over(cls, consumer: Any, topic: str) -> KafkaTopicReader:
        """A reader on the caller's group-less consumer, positioned with :meth:`seek`."""
        return cls("", topic, group="", consumer=consumer)

    def _all_partitions(self) -> list[int]:
        metadata = self._consumer.list_topics(self.topic, timeout=10)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            raise RuntimeError(f"Kafka topic {self.topic!r} is not available: {getattr(topic, 'error', 'missing')}")
        return sorted(topic.partitions)

    def start(self, positions: Callable[[], dict[int, int]]) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self._positions = positions
        if self.assign_all:
            stored = positions()
            tps = [TopicPartition(self.topic, p, stored.get(p, OFFSET_BEGINNING)) for p in self._all_partitions()]
            self._on_assign(self._consumer, tps, stored)
            return

        def on_assign(consumer: Any, tps: list[Any]) -> None:
            self._on_assign(consumer, tps, self._positions())

        def on_revoke(consumer: Any, tps: list[Any]) -> None:
            for tp in tps:
                self._assigned.discard(tp.partition)
                self._eof.discard(tp.partition)
            consumer.unassign()

        self._consumer.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)

    def seek(self, positions: dict[int, int]) -> None:
        """Read exactly these partitions, from these offsets, from the next :meth:`poll` on (no group)."""
        from confluent_kafka import TopicPartition

        self._assigned = set(positions)
        self._next = dict(positions)
        self._eof.clear()
        self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in sorted(positions.items())])

    def positions(self) -> dict[int, int]:
        """Partition -> the next offset this reader will return."""
        return dict(self._next)

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
        log.info("projecting %s partitions %s from %s", self.topic, sorted(self._assigned), stored)

    def poll(self, max_records: int, timeout: float) -> list[StoredRecord]:
        from confluent_kafka import KafkaError

        self._commit_pending()
        if time.monotonic() - self._lag_at > 5.0:
            self._lag_at = time.monotonic()
            self._lag = self._measure_lag()
        out: list[StoredRecord] = []
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
                raise KafkaReadError(f"Kafka consumer failed: {error}")
            offset = int(message.offset() or 0)
            if self.until is not None and offset >= self.until.get(partition, 0):
                self._eof.add(partition)
                continue
            self._eof.discard(partition)
            out.append(StoredRecord(self.topic, partition, offset, message.key(), message.value()))
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
        offsets = [TopicPartition(self.topic, p, o) for p, o in positions.items() if p in self._assigned]
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
                _, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, partition), cached=True)
                if high >= 0:
                    total += max(0, high - self._next.get(partition, 0))
        except Exception:  # metadata unavailable right now
            return None
        return total

    def close(self) -> None:
        self._consumer.close()


def read_partition(
    consumer: Any, topic: str, partition: int, timeout: float, batch: int = 1_000
) -> Iterator[StoredRecord]:
    """Every committed record of one topic-partition, from its low watermark to its end, with a group-less
    ``consumer`` whose ``enable.partition.eof`` is on (none if the topic or partition does not exist).

    What the replica reads a partition's snapshots with, and what ``gpufold log export --bootstrap`` exports.
    A fatal consumer error raises :class:`KafkaReadError`.
    """
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    from kafka_settings.topics import watermark_offsets

    try:
        low, high = watermark_offsets(consumer, TopicPartition(topic, partition), timeout)
    except KafkaException:
        return
    if high <= low:
        return
    consumer.assign([TopicPartition(topic, partition, low)])
    try:
        while True:
            for message in consumer.consume(batch, 1.0):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return
                    if error.fatal():
                        raise KafkaReadError(f"reading {topic}[{partition}]: {error.str()}")
                    continue
                offset = message.offset()
                assert offset is not None
                yield StoredRecord(topic, partition, offset, message.key(), message.value())
    finally:
        consumer.unassign()
