"""The CommandLog contract on the real Kafka broker (``logs.kafka.KafkaCommandLog``)."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from kafka_settings.config import load
from kafka_settings.topics import create_topics, topic_specs
from logs.kafka import BatchAborted, KafkaCommandLog
from logs.port import CommandLog
from schemas.topics import topics_for
from tests.contract.log_contract import CommandLogContract, Frame
from tests.integration.kafka_support import read_topic

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
        return [
            (record.offset, record.key, record.value) for record in read_topic(self.bootstrap, topic).get(partition, [])
        ]

    def reopen(self, log: CommandLog) -> CommandLog:
        return self._open(log.topics)

    def fail_commit(self, log: CommandLog, monkeypatch: pytest.MonkeyPatch, after: int = 0) -> None:
        assert isinstance(log, KafkaCommandLog)
        monkeypatch.setattr(log, "_producer", _FailingOffsets(log._producer, after))
