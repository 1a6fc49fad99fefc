"""Kafka as a :class:`processor.runtime.replica.ReplicaSource`: a group-less, read-only reader of the commands.

It never joins the processor's consumer group and never commits: it assigns every command partition
at the replica's own positions (``read_committed``), reads the latest snapshot of each partition
from the compacted snapshots topic, and asks the brokers for the head (high watermark) of each
partition for the replica's lag.
"""

from __future__ import annotations

import contextlib
import logging
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kafka_settings.config import KafkaConfig
from kafka_settings.topics import SNAPSHOT_MAX_BYTES, watermark_offsets
from logs.port import InputRecord
from schemas.topics import Topics

log = logging.getLogger("gpufold.replica.kafka")


class KafkaReplicaSource:
    """Reads the commands and snapshots topics of a Kafka cluster; see the module docstring."""

    def __init__(self, config: KafkaConfig, topics: Topics, *, timeout: float = 30.0) -> None:
        self.topics = topics
        self.timeout = timeout
        self._scrub = config.scrub

        def consumer(eof: bool) -> Consumer:
            return Consumer(
                config.client(
                    {"fetch.wait.max.ms": 50, "fetch.message.max.bytes": SNAPSHOT_MAX_BYTES + (1 << 20)},
                    {
                        "group.id": f"gpufold-replica-{uuid.uuid4().hex}",  # never joined: partitions are assigned
                        "enable.auto.commit": False,
                        "isolation.level": "read_committed",
                        "enable.partition.eof": eof,
                        "logger": logging.getLogger("gpufold.kafka.rdkafka"),
                    },
                )
            )

        try:
            self._consumer = consumer(False)
            self._reader = consumer(True)
            metadata = self._consumer.list_topics(topics.commands, timeout=timeout).topics[topics.commands]
        except KafkaException as exc:
            raise ValueError(self._scrub(f"cannot read the commands topic {topics.commands}: {exc}")) from None
        if metadata.error is not None or not metadata.partitions:
            detail = metadata.error.str() if metadata.error is not None else "no partitions"
            raise ValueError(f"commands topic {topics.commands}: {detail}")
        self._partitions = len(metadata.partitions)
        self._expected: dict[int, int] = {}

    def partition_count(self) -> int:
        return self._partitions

    def latest_snapshot(self, partition: int) -> bytes | None:
        """The last snapshot keyed by this partition (the topic is compacted: usually the only one)."""
        tp = TopicPartition(self.topics.snapshots, partition)
        try:
            low, high = watermark_offsets(self._reader, tp, self.timeout)
        except KafkaException:
            return None  # no snapshots topic (or partition): start from an empty state
        if high <= low:
            return None
        key = str(partition).encode()
        latest: bytes | None = None
        self._reader.assign([TopicPartition(self.topics.snapshots, partition, low)])
        try:
            while True:
                messages = self._reader.consume(100, 1.0)
                for message in messages:
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            return latest
                        if error.fatal():
                            raise ValueError(self._scrub(f"reading snapshots: {error.str()}"))
                        continue
                    if message.key() == key:
                        latest = message.value()
        finally:
            self._reader.unassign()

    def end_offsets(self) -> dict[int, int]:
        ends = {}
        for partition in range(self._partitions):
            _, high = watermark_offsets(self._reader, TopicPartition(self.topics.commands, partition), self.timeout)
            ends[partition] = high
        return ends

    def fetch(self, positions: dict[int, int], max_records: int, timeout: float) -> list[InputRecord]:
        if positions != self._expected:
            self._consumer.assign([TopicPartition(self.topics.commands, p, o) for p, o in sorted(positions.items())])
            self._expected = dict(positions)
        records = []
        for message in self._consumer.consume(max_records, timeout):
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise ValueError(self._scrub(f"reading commands: {error.str()}"))
                log.warning("reading commands: %s", self._scrub(error.str()))
                continue
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            records.append(InputRecord(partition, offset, message.key(), message.value()))
            self._expected[partition] = offset + 1
        return records

    def close(self) -> None:
        for client in (self._consumer, self._reader):
            with contextlib.suppress(RuntimeError):  # already closed
                client.close()
