"""When the Kafka adapter cuts a batch: a linger after its first record, at once for records it holds already.

The client is a stand-in for confluent_kafka's Consumer that records how long each call was allowed to wait,
so the tests assert the waits asked for, never the time taken.
"""

from __future__ import annotations

from collections import deque

from kafka_settings.config import KafkaConfig
from logs.kafka import KafkaCommandLog
from schemas.topics import topics_for

LINGER = 0.005


class Record:
    """What poll reads of a confluent_kafka Message."""

    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"c"

    def value(self) -> bytes:
        return b"v"


class Client:
    """Hands out the records it was given: ``fetched`` are in its queue already, ``later`` come while it waits."""

    def __init__(self, fetched: list[Record], later: list[Record]) -> None:
        self.fetched = deque(fetched)
        self.later = deque(later)
        self.waits: list[tuple[str, float]] = []  # (call, timeout) of each call

    def _arrive(self, timeout: float) -> None:
        if timeout > 0:
            self.fetched.extend(self.later)
            self.later.clear()

    def poll(self, timeout: float) -> Record | None:
        self.waits.append(("poll", timeout))
        self._arrive(timeout)
        return self.fetched.popleft() if self.fetched else None

    def consume(self, count: int, timeout: float) -> list[Record]:
        self.waits.append(("consume", timeout))
        self._arrive(timeout)
        return [self.fetched.popleft() for _ in range(min(count, len(self.fetched)))]

    def pause(self, partitions: list[object]) -> None: ...

    def resume(self, partitions: list[object]) -> None: ...


def adapter(client: Client) -> KafkaCommandLog:
    log = KafkaCommandLog(KafkaConfig({"bootstrap.servers": "127.0.0.1:1"}), topics_for("t"), linger=LINGER)
    log._consumer = client
    log._assigned = {0, 1}
    return log


def test_records_fetched_during_the_last_commit_still_linger() -> None:
    """Records already in the client are not cut at once: the linger after a commit is the gap the transaction
    coordinator needs to finish the last transaction (begun sooner, the next one is refused and retried)."""
    client = Client([Record(0, 0), Record(1, 0)], later=[Record(0, 1)])
    batch = adapter(client).poll(100, timeout=0.5)
    assert sorted((r.partition, r.offset) for r in batch) == [(0, 0), (0, 1), (1, 0)]
    assert ("consume", LINGER) in client.waits


def test_an_idle_processor_lingers_after_the_first_record() -> None:
    """With nothing fetched, poll waits for a first record, then up to the linger for more, and takes both."""
    client = Client([], later=[Record(0, 0), Record(1, 0)])
    batch = adapter(client).poll(100, timeout=0.5)
    assert sorted((r.partition, r.offset) for r in batch) == [(0, 0), (1, 0)]
    assert ("poll", 0.5) in client.waits
    assert ("consume", LINGER) in client.waits


def test_a_full_batch_leaves_the_rest_for_the_next() -> None:
    """A batch holds at most max_records; the next poll returns the held rest without waiting."""
    client = Client([Record(0, offset) for offset in range(5)], later=[])
    log = adapter(client)
    assert [r.offset for r in log.poll(3, timeout=0.5)] == [0, 1, 2]
    before = len(client.waits)
    assert [r.offset for r in log.poll(3, timeout=0.5)] == [3, 4]
    assert all(timeout == 0 for _, timeout in client.waits[before:]), client.waits


def test_the_stage_marks_of_a_poll_are_in_order() -> None:
    """poll records when it began, when its first record came and when it returned (for --trace-batches)."""
    client = Client([], later=[Record(0, 0)])
    log = adapter(client)
    log.poll(10, timeout=0.5)
    marks = log.marks
    assert marks["poll"] <= marks["first"] <= marks["polled"]


def test_a_fence_after_the_transaction_timeout_renews_the_producer_a_quick_one_is_fatal() -> None:
    """A coordinator that was down aborts a transaction on its timeout and bumps the epoch, which librdkafka
    reports as _FENCED: past the timeout the adapter renews its producer and rewinds (BatchAborted); a fence of a
    transaction younger than the timeout is a newer instance's, fatal (bench/chaos.py found the first case)."""
    import pytest
    from confluent_kafka import KafkaError, KafkaException

    from logs.kafka_errors import BatchAborted, KafkaFatalError

    log = KafkaCommandLog(
        KafkaConfig({"bootstrap.servers": "127.0.0.1:1"}), topics_for("t"), transaction_timeout_ms=10_000
    )
    steps: list[str] = []
    log._renew_producer = lambda stalled=False: steps.append("renew")  # type: ignore[method-assign]
    log._rewind = lambda positions: steps.append(f"rewind {sorted(positions)}")  # type: ignore[method-assign]
    fenced = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    with pytest.raises(BatchAborted):
        log._transaction_failed(fenced, {0: 5, 2: 7}, ran=12.0)
    assert steps == ["renew", "rewind [0, 2]"]
    with pytest.raises(KafkaFatalError, match="a newer instance"):
        log._transaction_failed(fenced, {0: 5}, ran=0.5)
    assert steps == ["renew", "rewind [0, 2]"]
