"""The tests' reader of a committed topic reads all of it, also behind another producer's open transaction.

Every exactly-once check reads the events topic with ``kafka_support.read_topic``. When an instance is killed
mid-transaction and its partitions move to a survivor (nobody restarts the dead one to fence it), the dead
transaction stays open until the broker times it out, and the survivor's committed records come after it. A
read_committed reader sees nothing past that open transaction (its last stable offset) until then; reading "to
the end" at that moment once returned 1,000 of 3,977 committed events and failed a takeover test by chance.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.kafka_support import RDKAFKA_LOG, read_topic

pytestmark = pytest.mark.integration

ABANDONED_TIMEOUT_MS = 2_000
"""The abandoned producer's transaction timeout: the broker aborts it within this plus its 5 s cleanup interval."""


def _producer(bootstrap: str, timeout_ms: int = 60_000) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"reading-{uuid.uuid4().hex}",
            "transaction.timeout.ms": timeout_ms,
            "logger": RDKAFKA_LOG,
        }
    )
    producer.init_transactions(30)
    return producer


def test_reading_waits_for_an_abandoned_transaction_and_returns_every_committed_record(kafka_bootstrap: str) -> None:
    topic = f"t-reading-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap, "logger": RDKAFKA_LOG})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)

    committed = _producer(kafka_bootstrap)
    committed.begin_transaction()
    for index in range(3):
        committed.produce(topic, f"before-{index}".encode(), partition=0)
    committed.commit_transaction(30)

    # A producer that opens a transaction, writes, and is never heard from again (a killed instance).
    abandoned = _producer(kafka_bootstrap, ABANDONED_TIMEOUT_MS)
    abandoned.begin_transaction()
    for index in range(4):
        abandoned.produce(topic, f"abandoned-{index}".encode(), partition=0)
    assert abandoned.flush(30) == 0

    # Records committed after the open transaction: a read_committed reader sees them only once it has ended.
    committed.begin_transaction()
    for index in range(5):
        committed.produce(topic, f"after-{index}".encode(), partition=0)
    committed.commit_transaction(30)

    values = [record.value for record in read_topic(kafka_bootstrap, topic)[0]]
    assert values == [f"before-{index}".encode() for index in range(3)] + [
        f"after-{index}".encode() for index in range(5)
    ], "the read stopped at the open transaction or saw its aborted records"
