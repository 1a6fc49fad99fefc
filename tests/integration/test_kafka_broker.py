"""The Kafka broker from `scripts/kafka.sh` does what the exactly-once processor needs.

Transactions work on the single KRaft node (commit is seen, abort is not, by a
read_committed consumer; a read_uncommitted one sees both, proving the aborted
records really were written), and `scripts/kafka.sh restart` brings the same
broker back on the same address with committed records and transaction state
intact: other tests restart Kafka mid-stream to prove recovery, and rely on this.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_SH = REPO_ROOT / "scripts" / "kafka.sh"
PARTITIONS = 3
TIMEOUT_S = 60.0


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@pytest.fixture
def topic(kafka_bootstrap: str) -> Iterator[str]:
    """A topic with three partitions, unique to this test, deleted afterwards."""
    name = f"test-broker-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)])
    futures[name].result(timeout=TIMEOUT_S)
    _wait_for_leaders(admin, name)
    yield name
    # Best effort: a unique name never collides anyway.
    with contextlib.suppress(KafkaException):
        AdminClient({"bootstrap.servers": kafka_bootstrap}).delete_topics([name])[name].result(timeout=TIMEOUT_S)


def _wait_for_leaders(admin: AdminClient, name: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        metadata = admin.list_topics(name, timeout=10).topics.get(name)
        if (
            metadata is not None
            and metadata.error is None
            and len(metadata.partitions) == PARTITIONS
            and all(p.leader >= 0 for p in metadata.partitions.values())
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"topic {name} has no leader for every partition after {TIMEOUT_S} s")


def _producer(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "transaction.timeout.ms": 30_000,
            "linger.ms": 5,
        }
    )
    producer.init_transactions(TIMEOUT_S)
    return producer


def _transaction(producer: Producer, topic: str, values: list[str], *, commit: bool) -> None:
    """One transaction writing `values` round-robin over the partitions, then committed or aborted."""
    producer.begin_transaction()
    for index, value in enumerate(values):
        producer.produce(topic, value=value.encode(), key=value.encode(), partition=index % PARTITIONS)
    # Everything must reach the broker before an abort too, or the test would prove nothing.
    assert producer.flush(TIMEOUT_S) == 0
    if commit:
        producer.commit_transaction(TIMEOUT_S)
    else:
        producer.abort_transaction(TIMEOUT_S)


def _read_all(bootstrap: str, topic: str, isolation: str, expected: int) -> list[tuple[int, str]]:
    """Every (partition, value) in `topic` as `isolation` sees it, in offset order per partition.

    Reads until `expected` records came, then 2 s more to catch any that should not be there.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-broker-{uuid.uuid4().hex[:12]}",
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        values: list[tuple[int, str]] = []
        deadline = time.monotonic() + TIMEOUT_S
        quiet_until: float | None = None
        while time.monotonic() < deadline:
            if quiet_until is None and len(values) >= expected:
                quiet_until = time.monotonic() + 2.0
            if quiet_until is not None and time.monotonic() >= quiet_until:
                break
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(error)
            partition, value = message.partition(), message.value()
            assert partition is not None and value is not None
            values.append((partition, value.decode()))
        return values
    finally:
        consumer.close()


def test_transactions_commit_and_abort(kafka_bootstrap: str, topic: str) -> None:
    producer = _producer(kafka_bootstrap, f"test-broker-tx-{uuid.uuid4().hex[:12]}")
    first = [f"committed-a-{i}" for i in range(30)]
    aborted = [f"aborted-{i}" for i in range(12)]
    second = [f"committed-b-{i}" for i in range(6)]
    _transaction(producer, topic, first, commit=True)
    _transaction(producer, topic, aborted, commit=False)
    _transaction(producer, topic, second, commit=True)

    committed = _read_all(kafka_bootstrap, topic, "read_committed", len(first) + len(second))
    assert sorted(v for _, v in committed) == sorted(first + second)
    # Within a partition, the committed records come in the order they were produced.
    for partition in range(PARTITIONS):
        produced = [v for i, v in enumerate(first) if i % PARTITIONS == partition]
        produced += [v for i, v in enumerate(second) if i % PARTITIONS == partition]
        assert [v for p, v in committed if p == partition] == produced

    everything = _read_all(kafka_bootstrap, topic, "read_uncommitted", len(first) + len(aborted) + len(second))
    assert sorted(v for _, v in everything) == sorted(first + aborted + second)

    # The log end offsets count the aborted records and the three transaction markers per partition.
    # read_uncommitted: librdkafka's default (read_committed) answers the last stable offset, not the log end.
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"wm-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        ends = sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS))
    finally:
        consumer.close()
    assert ends == len(first) + len(aborted) + len(second) + 3 * PARTITIONS


def _kafka_sh(command: str) -> subprocess.CompletedProcess[str]:
    # The script keeps its state in ${GPUFOLD_RUN_DIR:-$PWD/.services}: run it
    # from the repo root, as make and CI do, with any inherited GPUFOLD_RUN_DIR.
    return subprocess.run(
        ["bash", str(KAFKA_SH), command],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_restart_keeps_committed_records(kafka_bootstrap: str, topic: str) -> None:
    status = _kafka_sh("status")
    if status.returncode != 0 or not status.stdout.strip().endswith(f" on {kafka_bootstrap}"):
        message = (
            f"the Kafka at GPUFOLD_KAFKA_BOOTSTRAP={kafka_bootstrap} is not one that scripts/kafka.sh manages "
            f"in this run directory, so it cannot be restarted (status exit {status.returncode}: "
            f"{(status.stdout + status.stderr).strip()})"
        )
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    pid_before = status.stdout.split("pid ")[1].split(")")[0]

    transactional_id = f"test-broker-restart-{uuid.uuid4().hex[:12]}"
    producer = _producer(kafka_bootstrap, transactional_id)
    before = [f"before-{i}" for i in range(300)]
    _transaction(producer, topic, before, commit=True)
    # An open transaction with records in the log when the broker goes down: it must not surface.
    producer.begin_transaction()
    for i in range(9):
        producer.produce(topic, value=f"in-flight-{i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(TIMEOUT_S) == 0

    restart = _kafka_sh("restart")
    assert restart.returncode == 0, f"restart failed:\n{restart.stdout}\n{restart.stderr}"
    assert restart.stdout.strip().splitlines()[-1] == kafka_bootstrap, "restart moved the broker"
    status = _kafka_sh("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.split("pid ")[1].split(")")[0] != pid_before, "the broker was not restarted"

    # A new producer with the same transactional.id fences the old one and aborts its open transaction.
    del producer
    fresh = _producer(kafka_bootstrap, transactional_id)
    after = [f"after-{i}" for i in range(30)]
    _transaction(fresh, topic, after, commit=True)

    committed = _read_all(kafka_bootstrap, topic, "read_committed", len(before) + len(after))
    assert sorted(v for _, v in committed) == sorted(before + after)
