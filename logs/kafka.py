"""The Kafka adapter of :class:`processor.runtime.loop.CommandLog`: exactly-once with Kafka transactions.

One consumer in a group (``isolation.level=read_committed``, no auto-commit, static membership with
``group.instance.id`` = the instance id) reads the commands topic; one transactional producer
(``transactional.id`` = ``<group>.<instance id>``, stable across restarts) writes each batch's events,
dead letters and snapshots *and* the consumer offsets in one transaction. A restarted instance fences
its zombie and aborts the zombie's open transaction in ``init_transactions``.
Errors: :mod:`logs.kafka_errors` (``KafkaLogError``, ``BatchAborted``, ``KafkaFatalError``).

Transient errors (coordinator moving or loading, broker restarting) are retried with backoff. A transaction's
commit returns before the coordinator has written its markers, so a read_committed reader may see the outputs
a moment later (the stable offset trails the high watermark until then).

Restoring a partition (``processor.runtime.loop.restore_state``) reads the latest snapshot of the compacted
snapshots topic and the commands up to the committed offset with a separate, group-less reader.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from kafka_settings.config import KafkaConfig, masked_dict
from kafka_settings.topics import SNAPSHOT_MAX_BYTES, watermark_offsets
from logs.fair_batch import PartitionQueues
from logs.kafka_errors import (
    TRANSIENT,
    BatchAborted,
    KafkaFatalError,
    KafkaLogError,
    Stalled,
    describe,
    is_fenced,
    kafka_error,
)
from logs.kafka_placement import placement_metadata, recorded_placement
from logs.port import InputRecord, OutputRecord, Placement
from schemas.topics import Topics

log = logging.getLogger("gpufold.kafka")

DEFAULT_TRANSACTION_TIMEOUT_MS = 30_000
DEFAULT_SESSION_TIMEOUT_MS = 10_000
COMMIT_RETRIES = 5
MAX_RENEWALS = 5


RETRY_FOR = 300.0
"""How long an infrastructure fault (broker restart, coordinator move) is retried before giving up."""
SELF_FENCE_WINDOW = 60.0
"""A consumer fenced this soon after losing its own assignment was fenced by its own rejoin (see _consumer_error)."""
STALL_GRACE = 5.0
"""Seconds a transactional call may overrun its own timeout before the producer is given up as stalled."""
PAUSE_AT = 4
"""A partition holding this many batches of fetched records is paused until it holds less than one (see poll)."""
FIRST_FETCH_WAIT = 0.5
"""Seconds the first batch after an assignment waits for every partition's first fetch (see poll)."""


@dataclass(eq=False)
class _Transaction:
    """A batch's transaction running in its own thread (see :meth:`KafkaCommandLog.commit_async`)."""

    positions: dict[int, int]
    marks: dict[str, float]
    thread: threading.Thread = field(init=False)
    error: BaseException | None = None


class KafkaCommandLog:
    """A :class:`~processor.runtime.loop.CommandLog` over a Kafka cluster, exactly-once via transactions."""

    def __init__(
        self,
        config: KafkaConfig,
        topics: Topics,
        *,
        group_id: str = "gpufold-processor",
        instance_id: str = "0",
        transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        request_timeout: float = 30.0,
        linger: float = 0.005,
        on_revoked: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.topics = topics
        self.group_id = group_id
        self.instance_id = instance_id
        self.transactional_id = f"{group_id}.{instance_id}"
        self.timeout = request_timeout
        # Past the transaction timeout the broker aborts the transaction anyway: no point waiting longer for
        # one of its calls.
        self.transaction_timeout = min(request_timeout, transaction_timeout_ms / 1000)
        self.linger = linger
        self.on_revoked = on_revoked
        self.stopping: Callable[[], bool] = lambda: False
        """Set by the runner: once it returns True, retry loops give up at once (a graceful stop stays bounded)."""
        self._secrets = config.secrets()
        rdkafka_log = logging.getLogger("gpufold.kafka.rdkafka")
        self._producer_config = config.client(
            {
                "linger.ms": 2,
                "compression.type": "lz4",
                "message.max.bytes": SNAPSHOT_MAX_BYTES + (1 << 20),
                # Right after a commit the coordinator answers CONCURRENT_TRANSACTIONS until the previous
                # transaction's markers are written; librdkafka's default 100 ms backoff would add that much
                # to the next batch (p90 commit 119 ms -> 28 ms on the dev broker with 5 ms).
                "retry.backoff.ms": 5,
            },
            {
                "transactional.id": self.transactional_id,
                "enable.idempotence": True,
                "acks": "all",
                "transaction.timeout.ms": transaction_timeout_ms,
                "error_cb": self._on_error,
                "logger": rdkafka_log,
            },
        )
        self._consumer_config = config.client(
            {
                "session.timeout.ms": session_timeout_ms,
                # A fenced (zombie) instance learns it from its next heartbeat: 1 s, not librdkafka's 3 s.
                "heartbeat.interval.ms": min(1_000, session_timeout_ms // 3),
                "auto.offset.reset": "earliest",
                # These bound what the client prefetches; they do not interleave partitions (a fetch returns
                # whole producer batches, thousands of one partition's records in a row): poll does that.
                "fetch.message.max.bytes": 256 << 10,
                "queued.max.messages.kbytes": 4 << 10,
            },
            {
                "group.id": group_id,
                "group.instance.id": instance_id,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": False,
                "error_cb": self._on_error,
                "logger": rdkafka_log,
            },
        )
        self._reader_config = config.client(
            # The reader stops at the end of a partition: an empty fetch must come back at once, not after
            # the default 500 ms wait for new records (two of those made every restore take over a second).
            {"auto.offset.reset": "earliest", "fetch.max.bytes": 128 << 20, "fetch.wait.max.ms": 10},
            {
                "group.id": f"{group_id}.restore",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "logger": rdkafka_log,
            },
        )
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._reader: Consumer | None = None
        self._assigned: set[int] = set()
        self._queues = PartitionQueues()  # fetched, not yet folded (see poll)
        self._paused: set[int] = set()  # paused by poll because their queue is full
        self._unfetched: set[int] = set()  # assigned, and no fetch of theirs has come back yet
        self._renewals = 0
        self._consumer_renewals = 0
        self._lost_at: float | None = None
        self._stalled: list[Any] = []  # producers given up with a call still stuck inside: never destroyed
        self.marks: dict[str, float] = {}
        """Wall-clock times (``time.time()``) of the last batch's stages: ``poll`` (poll called), ``first`` (its
        first record out of the client, or ``poll`` if records were held), ``polled``, ``commit`` (the fold
        done), ``produced``, ``offsets_sent``, ``committed``. A few clock reads per batch; the runner logs them
        with ``--trace-batches``."""
        self.positions: dict[int, int] = {}
        """The positions of the last committed batch (the next offset to fold, per partition)."""
        self.batch_marks: dict[str, float] = {}
        """:attr:`marks` of the last committed batch, with ``txn`` (its transaction began: the previous one had
        committed)."""
        self.commits = 0
        """Transactions committed so far."""
        self._pending: _Transaction | None = None  # begun by commit_async, not waited for yet
        self._placements: dict[int, Placement] = {}  # of the partitions restored, committed with their offsets

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> KafkaCommandLog:
        """Init transactions (fencing any older instance with this id), then join the group."""
        log.info(
            "connecting: transactional.id=%s group=%s config=%s",
            self.transactional_id,
            self.group_id,
            masked_dict({k: v for k, v in self._producer_config.items() if k not in ("error_cb", "logger")}),
        )
        try:
            producer = Producer(self._producer_config)
            self._retrying("initializing transactions", producer.init_transactions, self.timeout)
            self._producer = producer
            self._consumer = self._new_consumer()
            self._reader = Consumer(self._reader_config)
        except KafkaException as exc:
            error = kafka_error(exc)
            raise KafkaFatalError(self._scrub(f"cannot start: {describe(error) if error else exc}")) from None
        return self

    def _new_consumer(self) -> Consumer:
        consumer = Consumer(self._consumer_config)
        consumer.subscribe(
            [self.topics.commands], on_assign=self._assigned_cb, on_revoke=self._revoked_cb, on_lost=self._lost_cb
        )
        return consumer

    def wait_for_assignment(self, timeout: float = 60.0) -> list[int]:
        """Join the group and return the assigned partitions; records fetched meanwhile are sought back."""
        consumer = self._require(self._consumer)
        deadline = time.monotonic() + timeout
        while not self._assigned:
            if time.monotonic() > deadline:
                raise KafkaLogError(f"no partition of {self.topics.commands} assigned within {timeout:g} s")
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                consumer.seek(TopicPartition(message.topic(), message.partition(), message.offset()))
        return self.assignment()

    def close(self) -> None:
        """Leave cleanly: a transaction still in flight is waited for (the processor settles it first), then the
        clients are closed."""
        pending = self._pending
        if pending is not None:
            pending.thread.join()
        for client in (self._reader, self._consumer):
            if client is not None:
                try:
                    client.close()
                except (KafkaException, RuntimeError) as exc:
                    log.warning("closing consumer: %s", self._scrub(str(exc)))
        if self._producer is not None:
            try:
                self._producer.flush(5)
            except KafkaException as exc:  # a fenced or failed producer has nothing left to deliver
                log.info("producer closed after: %s", self._scrub(str(exc)))
        self._reader = self._consumer = self._producer = None

    def __enter__(self) -> KafkaCommandLog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ CommandLog

    def assignment(self) -> list[int]:
        return sorted(self._assigned)

    def lag(self, positions: dict[int, int]) -> dict[int, int]:
        """Records behind the high watermark per assigned partition, from the consumer's cached
        watermarks (no broker round trip; transaction markers make it an upper bound)."""
        consumer = self._consumer
        if consumer is None:
            return {}
        lag: dict[int, int] = {}
        for partition in sorted(self._assigned):
            try:
                _, high = consumer.get_watermark_offsets(TopicPartition(self.topics.commands, partition), cached=True)
            except KafkaException:
                continue
            if high is not None and high >= 0:
                lag[partition] = max(0, high - positions.get(partition, 0))
        return lag

    def poll(self, max_records: int, timeout: float) -> list[InputRecord]:
        """A batch of at most ``max_records``, with a fair share of every partition that has records waiting.

        With nothing held, wait up to ``timeout`` for a first record, then up to ``linger`` for the batch to fill:
        a batch is cut when it is full or its first record has waited ``linger``. Under load the first record
        came during the previous commit, so the linger is also a gap between two transactions: the coordinator
        needs it to write the previous one's markers, and a transaction begun sooner is refused
        (CONCURRENT_TRANSACTIONS) and retried 5-20 ms later (BENCHMARKS.md, issue #14). Then take, without waiting,
        what the client has fetched already: a fetch returns whole producer batches, so one partition's backlog
        can sit in front of every other partition's records in the client's queue. Fetched records wait in
        per-partition queues (:class:`~logs.fair_batch.PartitionQueues`); a partition holding
        ``PAUSE_AT`` batches is paused (the client drops what it prefetched for it and fetches again from the
        next record on resume), so the client's queue shows the others' records. Records held from an earlier
        poll have waited already: they are returned at once.
        """
        consumer = self._require(self._consumer)
        queues = self._queues
        marks = self.marks
        marks["poll"] = marks["first"] = time.time()
        try:
            if not queues:
                first = consumer.poll(timeout)
                if first is None:
                    return []
                marks["first"] = time.time()
                if not self._hold([first]):
                    return []  # a new consumer: the old one's records are for partitions no longer assigned
                if max_records > 1 and not self._hold(consumer.consume(max_records - 1, self.linger)):
                    return []
            if self._unfetched and not self._await_first_fetches(consumer, max_records):
                return []
            while len(queues) < PAUSE_AT * max_records * max(len(self._assigned), 1):
                self._pause_full(max_records)
                more = consumer.consume(max_records, 0)
                if not more:
                    break
                if not self._hold(more):
                    return []
        except KafkaException as exc:
            self._consumer_failed(exc)
            return []
        batch = queues.take(max_records)
        self._resume_drained(max_records)
        marks["polled"] = time.time()
        return batch

    def _await_first_fetches(self, consumer: Consumer, max_records: int) -> bool:
        """After an assignment, give every partition's first fetch up to FIRST_FETCH_WAIT to come back.

        The client starts fetching the partitions of an assignment one by one: without this, the first batches
        would hold only the partitions whose fetch came back first. A partition whose fetch came back has a
        (cached) high watermark, records or not. False if an error replaced the consumer.
        """
        deadline = time.monotonic() + FIRST_FETCH_WAIT
        while True:
            for partition in sorted(self._unfetched):
                tp = TopicPartition(self.topics.commands, partition)
                with contextlib.suppress(KafkaException):
                    if consumer.get_watermark_offsets(tp, cached=True)[1] >= 0:
                        self._unfetched.discard(partition)
            if not self._unfetched or time.monotonic() >= deadline:
                self._unfetched.clear()  # one wait per assignment: an unanswered fetch is not waited for again
                return True
            self._pause_full(max_records)
            if not self._hold(consumer.consume(max_records, 0.01)):
                return False

    def _hold(self, messages: list[Message]) -> bool:
        """Queue fetched messages per partition; False if an error replaced the consumer (nothing is held)."""
        records: list[InputRecord] = []
        assigned = self._assigned
        for message in messages:
            error = message.error()
            if error is not None:
                if self._consumer_error(error):
                    return False
                continue
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            if partition not in assigned:  # fetched before a revocation served in the same call: not ours now
                continue
            records.append(InputRecord(partition, offset, message.key(), message.value()))
        self._queues.add(records)
        if self._unfetched and records:
            self._unfetched.difference_update({record.partition for record in records})
        return True

    def _pause_full(self, max_records: int) -> None:
        full = [p for p in self._queues.full(PAUSE_AT * max_records) if p not in self._paused and p in self._assigned]
        if full:
            self._require(self._consumer).pause([TopicPartition(self.topics.commands, p) for p in full])
            self._paused.update(full)

    def _resume_drained(self, max_records: int) -> None:
        drained = sorted(p for p in self._paused if self._queues.held(p) < max_records)
        if drained:
            self._resume(drained)

    def _resume(self, partitions: list[int]) -> None:
        """Resume paused partitions: the client fetches again from the record after the last one it handed over."""
        self._paused.difference_update(partitions)
        consumer = self._consumer
        if consumer is None:
            return
        tps = [TopicPartition(self.topics.commands, p) for p in partitions if p in self._assigned]
        if tps:
            consumer.resume(tps)

    def commit(self, outputs: list[OutputRecord], positions: dict[int, int]) -> None:
        """Produce ``outputs`` and commit ``positions`` as the group's offsets, in one transaction.

        Raises :class:`BatchAborted` (transaction aborted, consumer rewound) or :class:`KafkaFatalError`.
        """
        self.commit_async(outputs, positions)
        self.wait_committed()

    def commit_async(self, outputs: list[OutputRecord], positions: dict[int, int]) -> None:
        """Begin committing ``outputs`` and ``positions`` in one transaction, in a thread of its own, and return:
        the caller polls and folds the next batch meanwhile (the commit is pipelined, issue #21).

        The transaction of a batch begins only after the previous one has committed (this first waits for it), so
        outputs are never reordered; :meth:`wait_committed` says how it ended. Until then nothing of it is visible,
        and a crash loses it whole (its commands are folded again from the committed offsets).
        """
        self.wait_committed()
        producer = self._require(self._producer)
        consumer = self._require(self._consumer)
        marks = dict(self.marks)
        marks["commit"] = time.time()
        offsets = [self._offset(p, offset) for p, offset in sorted(positions.items())]
        metadata = consumer.consumer_group_metadata()  # the group generation these offsets are committed under
        pending = _Transaction(positions, marks)
        pending.thread = threading.Thread(
            target=self._transact, args=(producer, outputs, offsets, metadata, pending), name="kafka-transaction",
            daemon=True,
        )  # fmt: skip
        self._pending = pending
        pending.thread.start()

    def _transact(
        self, producer: Producer, outputs: list[OutputRecord], offsets: list[TopicPartition], metadata: Any,
        pending: _Transaction,
    ) -> None:  # fmt: skip
        """The transaction's broker calls (in the transaction's thread; its failure is handled by wait_committed)."""
        marks = pending.marks
        try:
            marks["txn"] = time.time()
            producer.begin_transaction()
            for record in outputs:
                self._produce(producer, record)
            marks["produced"] = time.time()
            timeout = self.transaction_timeout
            self._bounded(producer.send_offsets_to_transaction, offsets, metadata, timeout, limit=timeout)
            marks["offsets_sent"] = time.time()
            self._commit_transaction(producer)
            marks["committed"] = time.time()
        except BaseException as error:  # handed to wait_committed, in the caller's thread
            pending.error = error

    def in_flight(self) -> bool:
        """Whether a transaction begun by :meth:`commit_async` has not been waited for yet."""
        return self._pending is not None

    def wait_committed(self, also: Iterable[int] = ()) -> None:
        """Wait for the transaction :meth:`commit_async` began, if any, and settle it.

        On failure the transaction is aborted (or its producer replaced) and the consumer rewound to the committed
        offsets of its partitions and of ``also`` (the partitions of a batch folded meanwhile, on top of its state);
        raises :class:`BatchAborted` or :class:`KafkaFatalError`, as :meth:`commit` does.
        """
        self.marks["folded"] = time.time()  # the caller folded its batch and now waits for the previous one
        pending, self._pending = self._pending, None
        if pending is None:
            return
        pending.thread.join()  # every broker call inside is bounded (send_offsets by _bounded, the commit by retries)
        rewind = dict.fromkeys(also, 0) | pending.positions
        error = pending.error
        if isinstance(error, KafkaException):
            self._transaction_failed(error, rewind, time.time() - pending.marks.get("txn", pending.marks["commit"]))
        elif isinstance(error, Stalled):
            log.warning("%s: starting a new producer", error)
            self._renew_producer(stalled=True)
            self._rewind(rewind)
            raise BatchAborted(f"transaction abandoned ({error}); partitions {sorted(rewind)} rewound") from None
        elif error is not None:
            raise error
        self._renewals = self._consumer_renewals = 0
        self.positions = pending.positions
        self.batch_marks = pending.marks
        self.commits += 1

    def placement(self, partition: int) -> Placement:
        """See :func:`logs.kafka_placement.recorded_placement`; kept to be committed with the partition's offsets."""
        consumer = self._require(self._consumer)
        placement = recorded_placement(consumer, self.topics.commands, self.group_id, partition, self._retrying)
        self._placements[partition] = placement
        return placement

    def committed(self, partition: int) -> int:
        consumer = self._require(self._consumer)
        tps = [TopicPartition(self.topics.commands, partition)]
        [tp] = self._retrying(f"reading the committed offset of partition {partition}", consumer.committed, tps, 10)
        return max(tp.offset, 0)

    def _offset(self, partition: int, offset: int) -> TopicPartition:
        placement = self._placements.get(partition)
        if placement is None:
            return TopicPartition(self.topics.commands, partition, offset)
        return TopicPartition(self.topics.commands, partition, offset, placement_metadata(placement))

    @staticmethod
    def _bounded(call: Callable[..., Any], *args: Any, limit: float) -> Any:
        """``call(*args)`` (a blocking producer call given a timeout of ``limit``), bounded even if it ignores it.

        librdkafka's ``send_offsets_to_transaction`` can block forever whatever its timeout: the request to the
        group coordinator never times out (confluentinc/librdkafka#5456), and after a broker restart it may wait
        on a cached coordinator whose broker handle was decommissioned and never changes state again (#5511).
        A blocked C call cannot be interrupted, so it runs in a helper thread; if it has not returned
        ``STALL_GRACE`` seconds after its own timeout, :class:`Stalled` is raised and the caller gives up the
        producer (a new one with the same transactional.id fences it and aborts its open transaction).
        """
        outcome: list[Any] = []

        def target() -> None:
            try:
                outcome.append((True, call(*args)))
            except BaseException as exc:  # handed to the calling thread
                outcome.append((False, exc))

        thread = threading.Thread(target=target, name=f"kafka-{getattr(call, '__name__', 'call')}", daemon=True)
        thread.start()
        thread.join(limit + STALL_GRACE)
        if not outcome:
            raise Stalled(f"{getattr(call, '__name__', call)} still blocked {limit + STALL_GRACE:g} s after it began")
        ok, value = outcome[0]
        if not ok:
            raise value
        return value

    def _retrying(self, what: str, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``, retried with backoff while the error is transient (up to RETRY_FOR seconds)."""
        deadline = time.monotonic() + RETRY_FOR
        delay = 0.1
        while True:
            try:
                return call(*args)
            except KafkaException as exc:
                error = kafka_error(exc)
                if error is not None and error.fatal():
                    raise KafkaFatalError(self._scrub(f"{what}: {describe(error)}")) from None
                transient = error is not None and (error.retriable() or error.code() in TRANSIENT)
                if not transient or time.monotonic() > deadline or self.stopping():
                    raise KafkaLogError(self._scrub(f"{what}: {exc}")) from None
                log.warning("%s: %s; retrying in %.1f s", what, self._scrub(describe(error)), delay)  # type: ignore[arg-type]
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def latest_snapshot(self, partition: int) -> bytes | None:
        key = str(partition).encode()
        latest: bytes | None = None
        for message in self._read(self.topics.snapshots, partition, None, None):
            if message.key() == key:
                latest = message.value()
        return latest

    def read_commands(self, partition: int, start: int, end: int) -> Iterator[InputRecord]:
        if start >= end:
            return
        for message in self._read(self.topics.commands, partition, start, end):
            offset = message.offset()
            assert offset is not None
            yield InputRecord(partition, offset, message.key(), message.value())

    # ------------------------------------------------------------------ transactions

    def _produce(self, producer: Producer, record: OutputRecord) -> None:
        while True:
            try:
                producer.produce(record.topic, record.value, record.key, partition=record.partition)
                return
            except BufferError:
                producer.poll(0.05)  # local queue full: let deliveries drain

    def _commit_transaction(self, producer: Producer) -> None:
        for attempt in range(COMMIT_RETRIES):
            try:
                self._bounded(producer.commit_transaction, self.timeout, limit=self.timeout)
                return
            except KafkaException as exc:
                error = kafka_error(exc)
                if error is None or not error.retriable() or attempt == COMMIT_RETRIES - 1:
                    raise
                log.warning("commit_transaction retriable error, retrying: %s", self._scrub(describe(error)))

    def _transaction_failed(self, exc: KafkaException, positions: dict[int, int], ran: float = 0.0) -> None:
        """Abort (or renew the producer), rewind ``positions``, raise BatchAborted; KafkaFatalError if fenced. A fence
        after the transaction ran ``ran`` >= its timeout is the coordinator's (it aborted it and bumped the epoch while
        it was down or moving: bench/chaos.py), not a newer instance's (which would also take the group membership)."""
        error = kafka_error(exc)
        described = self._scrub(describe(error) if error is not None else str(exc))
        timed_out = ran >= self.transaction_timeout and self._renewals < MAX_RENEWALS
        if error is not None and is_fenced(error) and timed_out:
            log.warning("fenced after %.1f s, past the transaction timeout (%s): a new producer", ran, described)
            self._renew_producer()
            self._rewind(positions)
            raise BatchAborted(f"transaction timed out ({described}); partitions {sorted(positions)} rewound")
        if error is None or is_fenced(error):
            raise KafkaFatalError(
                f"transaction of {self.transactional_id} failed ({described}): a newer instance with the same id "
                "has taken over. Nothing of this batch is visible; exiting."
            ) from None
        if error.fatal():
            # Not fenced by a newer instance (e.g. the broker timed the transaction out while it was down):
            # a new producer with the same transactional.id aborts whatever is left open and carries on.
            log.warning("producer failed fatally (%s): starting a new one", described)
            self._renew_producer()
        else:
            log.warning("aborting transaction: %s", described)
            self._abort(time.time() - ran)
        self._rewind(positions)
        raise BatchAborted(f"transaction aborted ({described}); partitions {sorted(positions)} rewound")

    def _abort(self, began: float | None = None) -> None:
        """Abort the open transaction; if that fails (after a broker restart its requests may wait for a coordinator
        that never reconnects), a new producer with the same transactional.id finds the coordinator afresh and aborts
        it. A fence once the transaction ``began`` a transaction timeout ago is the coordinator's, not a newer
        instance's (:meth:`_transaction_failed`): a new producer too."""
        producer = self._require(self._producer)
        timeout = self.transaction_timeout
        try:
            self._bounded(producer.abort_transaction, timeout, limit=timeout)
            return
        except Stalled as stalled:
            log.warning("%s: starting a new producer", stalled)
            self._renew_producer(stalled=True)
        except KafkaException as exc:
            error = kafka_error(exc)
            late = began is not None and time.time() - began >= self.transaction_timeout
            if error is not None and is_fenced(error) and late and self._renewals < MAX_RENEWALS:
                log.warning("fenced while aborting, past the transaction timeout: a new producer")
                self._renew_producer()
                return
            if error is None or is_fenced(error):
                raise KafkaFatalError(self._scrub(f"abort_transaction failed: {exc}")) from None
            log.warning("abort_transaction failed (%s): starting a new producer", self._scrub(describe(error)))
            self._renew_producer()

    def _renew_producer(self, stalled: bool = False) -> None:
        """Replace the producer by a new one with the same transactional.id, which fences the old one."""
        self._renewals += 1
        if self._renewals > MAX_RENEWALS:
            raise KafkaFatalError(f"the transactional producer failed {MAX_RENEWALS} times in a row; exiting")
        old, self._producer = self._producer, None
        if stalled:
            # A thread is still inside one of its calls: destroying it now would free what that call uses.
            self._stalled.append(old)
        elif old is not None:
            with contextlib.suppress(KafkaException, RuntimeError):
                old.purge()
        producer = Producer(self._producer_config)
        self._retrying("initializing transactions", producer.init_transactions, self.timeout)
        self._producer = producer

    def _rewind(self, positions: dict[int, int]) -> None:
        """Seek the consumer back to the committed offsets of the batch's (still assigned) partitions."""
        consumer = self._require(self._consumer)
        self._queues.drop(positions)
        paused = sorted(self._paused.intersection(positions))
        if paused:
            self._resume(paused)  # before the seek, which then decides where fetching starts again
        for partition in sorted(positions):
            if partition not in self._assigned:
                continue
            offset = self.committed(partition)
            try:
                consumer.seek(TopicPartition(self.topics.commands, partition, offset))
            except KafkaException as exc:
                # Without the rewind the next records would skip the aborted ones: stop instead.
                raise KafkaFatalError(self._scrub(f"cannot rewind partition {partition} to {offset}: {exc}")) from None
            log.info("partition %d rewound to committed offset %d", partition, offset)

    # ------------------------------------------------------------------ rebalancing

    def _assigned_cb(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned.update(tp.partition for tp in partitions)
        self._unfetched.update(tp.partition for tp in partitions)
        log.info("assigned partitions %s", sorted(tp.partition for tp in partitions))

    def _revoked_cb(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # A batch's transaction may be in flight (pipelined): let it end under the generation it was begun in
        # before the partitions go (wait_committed settles it later), then drop the state.
        pending = self._pending
        if pending is not None:
            pending.thread.join()
        self._unpause(consumer, partitions)
        self._drop([tp.partition for tp in partitions], "revoked")

    def _lost_cb(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Lost (session expired / fenced member): another instance may own them already; never commit for them.
        # A transaction in flight carries the old generation: the coordinator refuses its offsets (then it aborts).
        pending = self._pending
        if pending is not None:
            pending.thread.join()
        self._lost_at = time.monotonic()
        self._unpause(consumer, partitions)
        self._drop([tp.partition for tp in partitions], "lost")

    def _unpause(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Resume what poll paused before it leaves: a partition assigned again later must not stay paused."""
        paused = [tp for tp in partitions if tp.partition in self._paused]
        if paused:
            with contextlib.suppress(KafkaException, RuntimeError):
                consumer.resume([TopicPartition(tp.topic, tp.partition) for tp in paused])

    def _drop(self, partitions: list[int], why: str) -> None:
        self._assigned.difference_update(partitions)
        for partition in partitions:
            self._placements.pop(partition, None)
        self._paused.difference_update(partitions)
        self._unfetched.difference_update(partitions)
        self._queues.drop(partitions)  # fetched under the old assignment: read again by whoever owns them
        log.info("%s partitions %s", why, sorted(partitions))
        if self.on_revoked is not None:
            self.on_revoked(partitions)

    # ------------------------------------------------------------------ reading for restore

    def _read(self, topic: str, partition: int, start: int | None, end: int | None) -> Iterator[Message]:
        """Committed records of one partition from ``start`` (default: the beginning) to ``end``/the end."""
        reader = self._require(self._reader)
        tp = TopicPartition(topic, partition)
        low, high = self._retrying(f"reading the offsets of {topic}[{partition}]", watermark_offsets, reader, tp, 10)
        if start is not None and start < low:
            raise KafkaLogError(f"{topic}[{partition}] starts at {low}: records {start}..{low - 1} were deleted")
        first = low if start is None else start
        if first >= high:
            return
        reader.assign([TopicPartition(topic, partition, first)])
        deadline = time.monotonic() + self.timeout + 120
        try:
            while True:
                if time.monotonic() > deadline:
                    raise KafkaLogError(f"timed out reading {topic}[{partition}] from {first}")
                # poll returns with the first record (or the end-of-partition event); consume(n, t) would wait
                # for n records or the whole t, i.e. 0.5 s on every short read.
                first_message = reader.poll(0.5)
                if first_message is None:
                    continue
                for message in [first_message, *reader.consume(10_000, 0)]:
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            return
                        if error.fatal():
                            raise KafkaFatalError(self._scrub(f"reading {topic}[{partition}]: {describe(error)}"))
                        log.warning("reading %s[%d]: %s", topic, partition, self._scrub(describe(error)))
                        continue
                    offset = message.offset()
                    assert offset is not None
                    if end is not None and offset >= end:
                        return
                    yield message
                    if end is not None and offset + 1 >= end:
                        return
        finally:
            reader.unassign()

    # ------------------------------------------------------------------ errors

    def _consumer_error(self, error: KafkaError) -> bool:
        """Log a consumer error; True if the consumer was replaced, KafkaFatalError if it cannot go on.

        A fatal consumer error arrives as ``_FATAL`` (its ``fatal()`` flag is not set): the consumer is dead and
        would never deliver again. With static membership librdkafka fences *itself* when its session timed out
        (say the broker restarted): it rejoins under the same group.instance.id and a request still carrying the
        old member id is answered FENCED_INSTANCE_ID (confluentinc/librdkafka#3437). A fatal error soon after
        this instance lost its own assignment is that case: a new consumer rejoins. Any other fatal error, or a
        real newer instance (whose init_transactions also fences our producer at the next commit), is fatal.
        """
        described = self._scrub(describe(error))
        if error.fatal() or error.code() in (KafkaError._FATAL, KafkaError.FENCED_INSTANCE_ID):
            lost_at = self._lost_at
            recent = lost_at is not None and time.monotonic() - lost_at < SELF_FENCE_WINDOW
            if not recent or self._consumer_renewals >= MAX_RENEWALS:
                raise KafkaFatalError(f"consumer failed: {described}")
            self._renew_consumer(described)
            return True
        log.warning("consumer: %s", described)
        return False

    def _consumer_failed(self, exc: KafkaException) -> None:
        error = kafka_error(exc)
        if error is None:
            raise KafkaFatalError(self._scrub(f"consumer failed: {exc}")) from None
        self._consumer_error(error)

    def _renew_consumer(self, described: str) -> None:
        self._consumer_renewals += 1
        log.warning("consumer failed right after its session timed out (%s): joining with a new one", described)
        old, self._consumer = self._consumer, None
        if self._assigned:
            self._drop(sorted(self._assigned), "lost")
        if old is not None:
            try:
                self._bounded(old.close, limit=self.timeout)
            except Stalled:
                self._stalled.append(old)
            except (KafkaException, RuntimeError) as exc:
                log.info("closing the failed consumer: %s", self._scrub(str(exc)))
        self._lost_at = None
        self._queues.clear()
        self._paused.clear()
        self._unfetched.clear()
        self._consumer = self._new_consumer()

    def _on_error(self, error: KafkaError) -> None:
        level = logging.ERROR if error.fatal() else logging.WARNING
        log.log(level, "kafka client: %s", self._scrub(describe(error)))

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    @staticmethod
    def _require(client: Any) -> Any:
        if client is None:
            raise KafkaLogError("the Kafka command log is not started (call start() or use it as a context manager)")
        return client
