"""The processor loop: the same code folds commands from the embedded log or from Kafka.

A :class:`~logs.port.CommandLog` is the adapter to a log (``logs.embedded`` and
``logs.kafka``); :class:`PartitionFolder` turns one partition's
command records into output records (events, dead letters, snapshots) with the
pure fold; :class:`Processor` drives them batch by batch, committing each
batch's outputs together with the consumer position in one atomic step, so a
crash at any moment loses nothing and duplicates nothing.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from logs.port import CommandLog, InputRecord, OutputRecord
from processor.core.fold import decide
from processor.core.snapshot import from_snapshot, to_snapshot
from processor.core.state import PartitionState
from schemas import DecodeError
from schemas.dead_letters import DeadLetter, encode_dead_letter
from schemas.events import CommandRejected
from schemas.fastcodec import decode_command, encode_event
from schemas.limits import MAX_DEAD_LETTER_KEY_BYTES, MAX_DEAD_LETTER_VALUE_BYTES, MAX_ERROR_LENGTH, clip
from schemas.snapshots import decode_snapshot, encode_snapshot
from schemas.topics import Topics

log = logging.getLogger("gpufold.processor")

DEFAULT_SNAPSHOT_EVERY = 50_000
DEFAULT_BATCH_SIZE = 2_000


class PartitionFolder:
    """Folds the command records of one partition into output records."""

    def __init__(
        self,
        partition: int,
        topics: Topics,
        state: PartitionState | None = None,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
    ) -> None:
        self.partition = partition
        self.topics = topics
        self.state = state if state is not None else PartitionState(partition=partition)
        self.snapshot_every = snapshot_every
        self.rejected: dict[str, int] = {}  # CommandRejected codes seen by fold(), for metrics

    def fold(self, record: InputRecord, out: list[OutputRecord]) -> None:
        """Fold one record, appending what it produces to ``out``.

        A record below the state's position was folded already and is skipped.
        """
        state = self.state
        if record.offset < state.next_offset:
            return
        try:
            command = decode_command(record.value)  # generated decoder; older fingerprints go through fastavro
        except DecodeError as error:
            out.append(self._dead_letter(record, str(error)))
            state.next_offset = record.offset + 1
        else:
            topic, partition = self.topics.events, self.partition
            events = decide(state, command, record.offset)
            key = events[0].cluster.encode()  # a rejection's cluster is bounded (schemas.limits.stand_in)
            for event in events:
                out.append(OutputRecord(topic, partition, key, encode_event(event)))
            outcome = events[0].payload
            if type(outcome) is CommandRejected:  # a refused command has exactly this one event
                self.rejected[outcome.code] = self.rejected.get(outcome.code, 0) + 1
        if self.snapshot_every and state.next_offset % self.snapshot_every == 0:
            out.append(self.snapshot_record())

    def fold_silently(self, records: Iterable[InputRecord]) -> None:
        """Re-fold records whose outputs were already published (recovery)."""
        sink: list[OutputRecord] = []
        counted = dict(self.rejected)
        for record in records:
            self.fold(record, sink)
            sink.clear()
        self.rejected = counted  # these were counted when they were first folded

    def snapshot_record(self) -> OutputRecord:
        return OutputRecord(
            self.topics.snapshots,
            self.partition,
            str(self.partition).encode(),
            encode_snapshot(to_snapshot(self.state)),
        )

    def _dead_letter(self, record: InputRecord, error: str) -> OutputRecord:
        letter = bounded_dead_letter(self.topics.commands, record, error)
        return OutputRecord(self.topics.dead_letters, record.partition, letter.key, encode_dead_letter(letter))


def bounded_dead_letter(topic: str, record: InputRecord, error: str) -> DeadLetter:
    """The dead letter of an undecodable record, small enough to publish whatever the record's size.

    The bytes are copied when they fit (:data:`~schemas.limits.MAX_DEAD_LETTER_VALUE_BYTES`); a larger record
    is referenced by its size and SHA-256 (the commands topic keeps the original forever).
    """
    error = clip(error, MAX_ERROR_LENGTH)
    key, value = record.key, record.value
    if key is not None and len(key) > MAX_DEAD_LETTER_KEY_BYTES:
        error += f"; key of {len(key)} bytes not copied (sha256 {hashlib.sha256(key).hexdigest()})"
        key = None
    if value is not None and len(value) > MAX_DEAD_LETTER_VALUE_BYTES:
        error += (
            f"; value of {len(value)} bytes not copied (sha256 {hashlib.sha256(value).hexdigest()}), "
            f"read it at {topic}[{record.partition}]@{record.offset}"
        )
        value = None
    return DeadLetter(topic, record.partition, record.offset, error, key, value)


class RestoreError(RuntimeError):
    """A partition's state cannot be rebuilt as committed: its snapshot or commands are missing or damaged."""


def restore_state(log_: CommandLog, partition: int) -> PartitionState:
    """Load the partition's latest snapshot, then re-fold commands up to the committed offset.

    Those commands' events are already published, so nothing is produced here. The re-fold must
    reach exactly the committed position (the processor commits the offset after the last command
    it folded), else the log lost commands and the state would be silently partial: refused.
    A log that can check more (the embedded log: that its events end where the state says)
    provides ``check_restored(partition, sequence)``.
    """
    frame = log_.latest_snapshot(partition)
    try:
        state = from_snapshot(decode_snapshot(frame)) if frame else PartitionState(partition=partition)
    except (DecodeError, ValueError, KeyError) as error:
        raise RestoreError(f"partition {partition}: the latest snapshot cannot be read: {error}") from None
    committed = log_.committed(partition)
    if state.next_offset > committed:
        # A snapshot newer than the committed position cannot exist (it is written in
        # the same transaction as the batch that reached it); refuse to guess.
        raise RestoreError(f"partition {partition}: snapshot at {state.next_offset} is past committed {committed}")
    folder = PartitionFolder(partition, log_.topics, state, snapshot_every=0)
    folder.fold_silently(log_.read_commands(partition, state.next_offset, committed))
    if state.next_offset != committed:
        raise RestoreError(
            f"partition {partition}: the commands up to the committed offset {committed} could not all be read "
            f"(they end at {state.next_offset}): the log lost commands"
        )
    check = getattr(log_, "check_restored", None)
    if check is not None:
        check(partition, state.sequence)
    return state


@dataclass(slots=True)
class StageTimes:
    """Where a processor's batches spent their time, summed: wall seconds and this thread's CPU seconds.

    ``poll`` includes waiting for records; ``fold`` includes restoring partitions met for the first time;
    ``commit`` is producing the outputs and committing the transaction (mostly waiting for the broker).
    The client's own threads (librdkafka) are not in these: compare with the process's CPU time.
    """

    batches: int = 0
    records: int = 0
    wall: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("poll", "fold", "commit"), 0.0))
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("poll", "fold", "commit"), 0.0))

    def per_command_us(self) -> dict[str, float]:
        """Microseconds per command folded, by stage (``<stage>_cpu`` and ``<stage>_wall``)."""
        count = max(self.records, 1)
        out = {f"{stage}_cpu": round(seconds * 1e6 / count, 1) for stage, seconds in self.cpu.items()}
        out.update({f"{stage}_wall": round(seconds * 1e6 / count, 1) for stage, seconds in self.wall.items()})
        return out


class Processor:
    """Drives the fold over a :class:`CommandLog`, one atomic batch at a time."""

    def __init__(
        self,
        log_: CommandLog,
        *,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        self.log = log_
        self.snapshot_every = snapshot_every
        self.batch_size = batch_size
        self.folders: dict[int, PartitionFolder] = {}
        self.processed = 0
        self.times = StageTimes()

    def folder(self, partition: int) -> PartitionFolder:
        folder = self.folders.get(partition)
        if folder is None:
            state = restore_state(self.log, partition)
            folder = PartitionFolder(partition, self.log.topics, state, self.snapshot_every)
            self.folders[partition] = folder
            log.info("partition %d restored at offset %d", partition, state.next_offset)
        return folder

    def forget(self, partition: int) -> None:
        """Drop a partition's state (revoked, or its batch aborted: rebuilt on next use)."""
        self.folders.pop(partition, None)

    def run_batch(self, timeout: float = 0.5) -> int:
        """Poll, fold and atomically commit one batch; returns the records folded."""
        times = self.times
        wall, cpu = time.perf_counter(), time.thread_time()
        records = self.log.poll(self.batch_size, timeout)
        wall, cpu = _lap(times, "poll", wall, cpu)
        if not records:
            return 0
        outputs: list[OutputRecord] = []
        positions: dict[int, int] = {}
        for record in records:
            folder = self.folder(record.partition)
            folder.fold(record, outputs)
            positions[record.partition] = folder.state.next_offset
        wall, cpu = _lap(times, "fold", wall, cpu)
        try:
            self.log.commit(outputs, positions)
        except BaseException:
            # The states ran ahead of what was committed: rebuild them from the log.
            for partition in positions:
                self.forget(partition)
            raise
        _lap(times, "commit", wall, cpu)
        times.batches += 1
        times.records += len(records)
        self.processed += len(records)
        return len(records)

    def run_until_idle(self, idle_polls: int = 1, timeout: float = 0.0) -> int:
        """Run batches until ``idle_polls`` polls in a row return nothing; returns records folded."""
        total = 0
        idle = 0
        while idle < idle_polls:
            count = self.run_batch(timeout)
            total += count
            idle = idle + 1 if count == 0 else 0
        return total


def _lap(times: StageTimes, stage: str, wall: float, cpu: float) -> tuple[float, float]:
    """Add the time since (wall, cpu) to ``stage``; returns the new (wall, cpu) marks."""
    now_wall, now_cpu = time.perf_counter(), time.thread_time()
    times.wall[stage] += now_wall - wall
    times.cpu[stage] += now_cpu - cpu
    return now_wall, now_cpu
