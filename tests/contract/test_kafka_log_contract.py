"""The CommandLog contract on the real Kafka broker (``logs.kafka.KafkaCommandLog``)."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from kafka_settings.config import load
from kafka_settings.topics import create_topics, topic_specs, watermark_offsets
from logs.kafka import BatchAborted, KafkaCommandLog
from logs.port import CommandLog
from schemas.topics import topics_for
from tests.contract.log_contract import CommandLogContract, Frame

pytestmark = pytest.mark.integration

RDKAFKA_LOG = logging.getLogger("tests.rdkafka")


@pytest.fixture(scope="module")
def bootstrap() -> str:
    """The broker of scripts/test.sh (skipped locally without one, a failure in CI)."""
    value = os.environ.get("GPUFOLD_KAFKA_BOOTSTRAP", "")
    if not value:
        message = "Kafka is not running: GPUFOLD_KAFKA_BOOTSTRAP is unset (run `make test`)"
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(message)
        pytest.skip(message)
    return value


class _FailingOffsets:
    """Wraps the transactional producer: after ``after`` commits, sending the offsets fails (abortably)."""

    def __init__(self, producer: Any, after: int) -> None:
        self._producer = producer
        self._left = after

    def send_offsets_to_transaction(self, *args: Any) -> None:
        if self._left <= 0:
            raise KafkaException(KafkaError(KafkaError._STATE, "injected failure", txn_requires_abort=True))
        self._left -= 1
        self._producer.send_offsets_to_transaction(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


class TestKafkaLogContract(CommandLogContract):
    """The shared contract, each test on fresh topics and a fresh consumer group."""

    POLL_TIMEOUT = 1.0
    IDLE_POLLS = 2
    REWOUND_ERRORS = (BatchAborted,)

    @pytest.fixture
    def log(self, bootstrap: str) -> Iterator[KafkaCommandLog]:
        self.bootstrap = bootstrap
        self.config = load(bootstrap=bootstrap, environ={})
        topics = topics_for(f"contract-{uuid.uuid4().hex[:10]}")
        create_topics(self.config.client(), topic_specs(topics, self.PARTITIONS, 1))
        self.group = topics.commands + ".group"
        self.handles: list[KafkaCommandLog] = []
        log = self._open(topics)
        yield log
        for handle in reversed(self.handles):
            handle.close()

    def _open(self, topics: Any) -> KafkaCommandLog:
        handle = KafkaCommandLog(
            self.config, topics, group_id=self.group, instance_id="contract", transaction_timeout_ms=10_000
        ).start()
        self.handles.append(handle)
        assert handle.wait_for_assignment() == list(range(self.PARTITIONS))
        return handle

    def append_commands(self, log: CommandLog, frames: list[Frame]) -> list[tuple[int, int]]:
        placed: list[tuple[int, int] | None] = [None] * len(frames)
        failures: list[str] = []

        def report(index: int) -> Any:
            def on_delivery(error: KafkaError | None, message: Any) -> None:
                if error is not None:
                    failures.append(error.str())
                else:
                    placed[index] = (message.partition(), message.offset())

            return on_delivery

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "partitioner": "murmur2_random",
                "logger": RDKAFKA_LOG,
            }
        )
        for index, (key, value) in enumerate(frames):
            producer.produce(log.topics.commands, value, key, on_delivery=report(index))
        assert producer.flush(30) == 0 and not failures, failures
        return placed  # type: ignore[return-value]

    def read_topic(self, log: CommandLog, topic: str, partition: int) -> list[tuple[int, bytes | None, bytes]]:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"reader-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "logger": RDKAFKA_LOG,
            }
        )
        records: list[tuple[int, bytes | None, bytes]] = []
        try:
            tp = TopicPartition(topic, partition)
            low, high = self.stable_end(consumer, tp)
            if high <= low:
                return records
            consumer.assign([TopicPartition(topic, partition, low)])
            for _ in range(600):
                messages = consumer.consume(1_000, 0.1)
                for message in messages:
                    error = message.error()
                    if error is not None:
                        assert error.code() == KafkaError._PARTITION_EOF, error
                        if message.offset() >= high:
                            return records
                        continue
                    records.append((message.offset(), message.key(), message.value()))
            raise AssertionError(f"no end of {topic}[{partition}] within 60 s")
        finally:
            consumer.close()

    def stable_end(self, consumer: Consumer, tp: TopicPartition, timeout: float = 60.0) -> tuple[int, int]:
        """(low, end) of a partition once no transaction is open on it: its stable end reached the high watermark.

        A commit returns before the coordinator has written the transaction markers. Until then a read_committed
        consumer's end offset (its watermark query answers the last stable offset, LSO) stays at the first
        record of the transaction, and reading "to the end" would see none of the committed records.
        """
        uncommitted = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": f"reader-{uuid.uuid4().hex}", "logger": RDKAFKA_LOG}
        )
        try:
            deadline = time.monotonic() + timeout
            while True:
                low, stable = watermark_offsets(consumer, tp)
                _, high = watermark_offsets(uncommitted, tp)
                if stable >= high:
                    return low, high
                assert time.monotonic() < deadline, f"{tp.topic}[{tp.partition}]: LSO {stable} < high watermark {high}"
                time.sleep(0.05)
        finally:
            uncommitted.close()

    def reopen(self, log: CommandLog) -> CommandLog:
        return self._open(log.topics)

    def fail_commit(self, log: CommandLog, monkeypatch: pytest.MonkeyPatch, after: int = 0) -> None:
        assert isinstance(log, KafkaCommandLog)
        monkeypatch.setattr(log, "_producer", _FailingOffsets(log._producer, after))
