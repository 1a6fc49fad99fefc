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

from confluent_kafka import Consumer, KafkaException, TopicPartition

from kafka_settings.config import KafkaConfig
from kafka_settings.topics import SNAPSHOT_MAX_BYTES, watermark_offsets
from logs.kafka_reader import KafkaReadError, KafkaTopicReader, read_partition
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
        # The commands, at the replica's own positions, through the one Kafka reader (logs.kafka_reader).
        self._commands = KafkaTopicReader.over(self._consumer, topics.commands)

    def partition_count(self) -> int:
        return self._partitions

    def latest_snapshot(self, partition: int) -> bytes | None:
        """The last snapshot keyed by this partition (the topic is compacted: usually the only one)."""
        key = str(partition).encode()
        latest: bytes | None = None
        try:
            for record in read_partition(self._reader, self.topics.snapshots, partition, self.timeout, batch=100):
                if record.key == key:
                    latest = record.value
        except KafkaReadError as error:
            raise ValueError(self._scrub(f"reading snapshots: {error}")) from None
        return latest

    def end_offsets(self) -> dict[int, int]:
        ends = {}
        for partition in range(self._partitions):
            _, high = watermark_offsets(self._reader, TopicPartition(self.topics.commands, partition), self.timeout)
            ends[partition] = high
        return ends

    def fetch(self, positions: dict[int, int], max_records: int, timeout: float) -> list[InputRecord]:
        if positions != self._commands.positions():
            self._commands.seek(positions)
        try:
            rows = self._commands.poll(max_records, timeout)
        except KafkaReadError as error:
            raise ValueError(self._scrub(f"reading commands: {error}")) from None
        return [InputRecord(row.partition, row.offset, row.key, row.value) for row in rows]

    def close(self) -> None:
        for client in (self._consumer, self._reader):
            with contextlib.suppress(RuntimeError):  # already closed
                client.close()
