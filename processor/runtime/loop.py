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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from logs.port import CommandLog, InputRecord, OutputRecord, Placement
from processor.core.fold import decide
from processor.core.handlers.halting import ResumedCluster
from processor.core.snapshot import from_snapshot, to_snapshot
from processor.core.state import ClusterState, Halt, PartitionState
from processor.runtime.collector import FREEZE_EVERY, Collector
from schemas import DecodeError
from schemas.codes import DeadLetterCode
from schemas.commands import Command, ResumeCluster
from schemas.dead_letters import DeadLetter, encode_dead_letter
from schemas.events import ClusterHalted, ClusterResumed, CommandRejected
from schemas.fastcodec import decode_command, encode_event
from schemas.limits import MAX_DEAD_LETTER_KEY_BYTES, MAX_DEAD_LETTER_VALUE_BYTES, MAX_ERROR_LENGTH, clip
from schemas.partitioner import partition_for
from schemas.snapshots import decode_snapshot, encode_snapshot
from schemas.topics import Topics

log = logging.getLogger("gpufold.processor")

DEFAULT_SNAPSHOT_EVERY = 50_000
DEFAULT_BATCH_SIZE = 2_000


_HALT_EVENTS = (ClusterHalted, ClusterResumed)


def wrong_partition(record: InputRecord, cluster: str, partitions: int) -> str | None:
    """Why ``record`` (a command of ``cluster``) is not its partition's to fold, or None if it is."""
    key = cluster.encode()
    expected = partition_for(key, partitions)
    if record.partition == expected and record.key == key:
        return None
    shown = clip(repr(record.key), 200)
    return (
        f"{DeadLetterCode.WRONG_PARTITION}: cluster {clip(cluster, 200)!r} belongs on partition {expected} "
        f"(murmur2 of the cluster mod {partitions} partitions) with key {clip(repr(key), 200)}; this record is on "
        f"partition {record.partition} with key {shown}. Not folded: publish with the cluster as key and Kafka's "
        "murmur2 partitioner (README: 'Which partition a command goes to')"
    )


class PartitionFolder:
    """Folds the command records of one partition into output records."""

    def __init__(
        self,
        partition: int,
        topics: Topics,
        state: PartitionState | None = None,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        placement: Placement | None = None,
        history: History | None = None,
    ) -> None:
        self.partition = partition
        self.topics = topics
        self.state = state if state is not None else PartitionState(partition=partition)
        self.snapshot_every = snapshot_every
        self.placement = placement
        """None: every command decoded is folded (a re-fold of records without their topic, e.g. a recorded log)."""
        self.history = history  # the log, to rebuild a halted cluster for ResumeCluster (None: refused)
        self.rejected: dict[str, int] = {}  # CommandRejected codes seen by fold(), for metrics
        self.refused: dict[str, int] = {}  # DeadLetterCode codes of commands not folded, for metrics and health
        self._refused_new: dict[str, int] = {}  # the same, since the last take_refused()

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
            placement = self.placement
            if placement is not None and record.offset >= placement.checked_from:
                wrong = wrong_partition(record, command.cluster, placement.partitions)
                if wrong is not None:
                    code = DeadLetterCode.WRONG_PARTITION
                    out.append(self._dead_letter(record, wrong, code))
                    self.refused[code] = self.refused.get(code, 0) + 1
                    self._refused_new[code] = self._refused_new.get(code, 0) + 1
                    state.next_offset = record.offset + 1
                    if self.snapshot_every and state.next_offset % self.snapshot_every == 0:
                        out.append(self.snapshot_record())
                    return
            topic, partition = self.topics.events, self.partition
            events = decide(state, command, record.offset, resumed_for(self.history, state, command, placement))
            key = events[0].cluster.encode()  # a rejection's cluster is bounded (schemas.limits.stand_in)
            for event in events:
                out.append(OutputRecord(topic, partition, key, encode_event(event)))
            outcome = events[0].payload
            if type(outcome) is CommandRejected:  # a refused command has exactly this one event
                self.rejected[outcome.code] = self.rejected.get(outcome.code, 0) + 1
            if self.history is not None and any(type(e.payload) in _HALT_EVENTS for e in events):
                # A restore must never fold across a halt or a resume again: with a fixed build the halting
                # command would fold otherwise than was published, and a resume needs the log. Snapshot here.
                out.append(self.snapshot_record())
                return
        if self.snapshot_every and state.next_offset % self.snapshot_every == 0:
            out.append(self.snapshot_record())

    def fold_silently(self, records: Iterable[InputRecord]) -> None:
        """Re-fold records whose outputs were already published (recovery)."""
        sink: list[OutputRecord] = []
        counted, refused, new = dict(self.rejected), dict(self.refused), dict(self._refused_new)
        for record in records:
            self.fold(record, sink)
            sink.clear()
        self.rejected, self.refused, self._refused_new = counted, refused, new  # counted when first folded

    def take_refused(self) -> dict[str, int]:
        """The refusals (by code) folded since the last call: the processor counts them once their batch commits."""
        new, self._refused_new = self._refused_new, {}
        return new

    def snapshot_record(self) -> OutputRecord:
        return OutputRecord(
            self.topics.snapshots,
            self.partition,
            str(self.partition).encode(),
            encode_snapshot(to_snapshot(self.state)),
        )

    def _dead_letter(self, record: InputRecord, error: str, code: str | None = None) -> OutputRecord:
        letter = bounded_dead_letter(self.topics.commands, record, error, code)
        return OutputRecord(self.topics.dead_letters, record.partition, letter.key, encode_dead_letter(letter))


def bounded_dead_letter(topic: str, record: InputRecord, error: str, code: str | None = None) -> DeadLetter:
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
    return DeadLetter(topic, record.partition, record.offset, error, key, value, code)


def placement_of(log_: CommandLog, partition: int) -> Placement | None:
    """The log's :class:`Placement` of a partition (None for a log that cannot tell, which folds everything)."""
    placement = getattr(log_, "placement", None)
    return placement(partition) if placement is not None else None


class History(Protocol):
    """What a rebuild reads: the command log (a :class:`~logs.port.CommandLog` has both)."""

    def latest_snapshot(self, partition: int) -> bytes | None: ...

    def read_commands(self, partition: int, start: int, end: int) -> Iterator[InputRecord]: ...


def resumed_for(
    history: History | None, state: PartitionState, command: Command, placement: Placement | None = None
) -> ResumedCluster | None:
    """For a ResumeCluster of a halted cluster, the cluster rebuilt from the log (None: nothing to rebuild, or no
    log to rebuild it from, and the fold refuses the command)."""
    if type(command.payload) is not ResumeCluster or history is None:
        return None
    cluster = state.clusters.get(command.cluster)
    if cluster is None or cluster.halted is None:
        return None
    return rebuild(history, state.partition, cluster.name, cluster.halted, placement)


def rebuild(
    history: History, partition: int, name: str, halted: Halt, placement: Placement | None = None
) -> ResumedCluster:
    """The cluster ``name`` just before command ``halted.offset``, re-folded from the log.

    The fold halts a cluster whose fold raised (``ClusterHalted``) and drops what it held; it cannot read the
    log to get it back. Whoever folds the log (the processor, a replay) rebuilds it here: the partition's
    latest snapshot if it lies before the halting command (else an empty state at offset 0), then every
    command from there up to the halting one, folded with today's code, silently (their events were
    published when they were first folded). Cost: the commands re-folded, once per ResumeCluster."""
    start = PartitionState(partition=partition)
    frame = history.latest_snapshot(partition)
    if frame:
        snapshot = from_snapshot(decode_snapshot(frame))
        if snapshot.next_offset <= halted.offset:
            start = snapshot
    origin = start.next_offset
    log.warning(
        "partition %d: rebuilding halted cluster %r from offset %d up to %d", partition, name, origin, halted.offset
    )
    folder = PartitionFolder(partition, Topics(), start, snapshot_every=0, placement=placement, history=history)
    folder.fold_silently(history.read_commands(partition, origin, halted.offset))
    cluster = folder.state.clusters.get(name)
    if cluster is None:
        cluster = ClusterState(name)
    return ResumedCluster(cluster, origin)


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
    placement = placement_of(log_, partition)
    committed = log_.committed(partition)
    if state.next_offset > committed:
        # A snapshot newer than the committed position cannot exist (it is written in
        # the same transaction as the batch that reached it); refuse to guess.
        raise RestoreError(f"partition {partition}: snapshot at {state.next_offset} is past committed {committed}")
    folder = PartitionFolder(partition, log_.topics, state, snapshot_every=0, placement=placement, history=log_)
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


STAGES = ("poll", "fold", "commit", "gc")


@dataclass(slots=True)
class StageTimes:
    """Where a processor's batches spent their time, summed: wall seconds and this thread's CPU seconds.

    ``poll`` includes waiting for records; ``fold`` includes restoring partitions met for the first time;
    ``commit`` is producing the outputs and committing the transaction (mostly waiting for the broker);
    ``gc`` is the garbage collector's freezes, between batches (:mod:`processor.runtime.collector`).
    The client's own threads (librdkafka) are not in these: compare with the process's CPU time.
    """

    batches: int = 0
    records: int = 0
    wall: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    def per_command_us(self) -> dict[str, float]:
        """Microseconds per command folded, by stage (``<stage>_cpu`` and ``<stage>_wall``)."""
        count = max(self.records, 1)
        out = {f"{stage}_cpu": round(seconds * 1e6 / count, 1) for stage, seconds in self.cpu.items()}
        out.update({f"{stage}_wall": round(seconds * 1e6 / count, 1) for stage, seconds in self.wall.items()})
        return out


@dataclass(slots=True)
class _InFlight:
    """A batch whose transaction is being committed while the next one is folded."""

    positions: dict[int, int]
    records: int
    refused: dict[str, int]


class Processor:
    """Drives the fold over a :class:`CommandLog`, one atomic batch at a time.

    With ``pipeline`` (on by default) and a log that can commit in the background (``commit_async`` and
    ``wait_committed``, the Kafka log), batch N+1 is polled and folded while batch N's transaction commits; N+1's
    transaction begins only once N's has committed, so outputs are never reordered, and if N's fails, both
    batches' partitions are rebuilt from what was committed.
    """

    def __init__(
        self,
        log_: CommandLog,
        *,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        batch_size: int = DEFAULT_BATCH_SIZE,
        pipeline: bool = True,
        freeze_every: int = FREEZE_EVERY,
    ) -> None:
        self.log = log_
        self.snapshot_every = snapshot_every
        self.batch_size = batch_size
        self.pipeline = pipeline and hasattr(log_, "commit_async") and hasattr(log_, "wait_committed")
        self.folders: dict[int, PartitionFolder] = {}
        self.processed = 0
        """Commands folded and committed."""
        self.times = StageTimes()
        self._refused: dict[str, int] = {}
        self._in_flight: _InFlight | None = None
        self.last_committed = 0
        """Commands in the batch committed last."""
        self.collector = Collector(freeze_every)
        """Keeps the cyclic collector off the folded states (:mod:`processor.runtime.collector`)."""

    def folder(self, partition: int) -> PartitionFolder:
        folder = self.folders.get(partition)
        if folder is None:
            state = restore_state(self.log, partition)
            placement = placement_of(self.log, partition)
            folder = PartitionFolder(
                partition, self.log.topics, state, self.snapshot_every, placement, history=self.log
            )
            self.folders[partition] = folder
            seconds = self.collector.restored(state.next_offset)  # out of the collector's sight
            log.info(
                "partition %d restored at offset %d (collected and frozen in %.0f ms)",
                partition,
                state.next_offset,
                seconds * 1e3,
            )
        return folder

    def refused(self) -> dict[str, int]:
        """Commands this processor did not fold (dead-lettered with a code, e.g. WRONG_PARTITION) in the batches it
        committed, by code."""
        return dict(self._refused)

    def forget(self, partition: int) -> None:
        """Drop a partition's state (revoked, or its batch aborted: rebuilt on next use)."""
        self.folders.pop(partition, None)

    def run_batch(self, timeout: float = 0.5) -> int:
        """Poll, fold and commit one batch (pipelined: begin its commit and settle the previous batch's); returns
        the records folded. With nothing to poll, a commit in flight is settled."""
        times = self.times
        wall, cpu = time.perf_counter(), time.thread_time()
        records = self.log.poll(self.batch_size, timeout)
        wall, cpu = _lap(times, "poll", wall, cpu)
        if not records:
            self.settle()
            return 0
        outputs: list[OutputRecord] = []
        positions: dict[int, int] = {}
        for record in records:
            folder = self.folder(record.partition)
            folder.fold(record, outputs)
            positions[record.partition] = folder.state.next_offset
        refused: dict[str, int] = {}
        for partition in positions:
            for code, count in self.folders[partition].take_refused().items():
                refused[code] = refused.get(code, 0) + count
        wall, cpu = _lap(times, "fold", wall, cpu)
        batch = _InFlight(positions, len(records), refused)
        if self.pipeline:
            self.settle(positions)  # the previous batch: its transaction must commit before this one begins
        try:
            if self.pipeline:
                self.log.commit_async(outputs, positions)  # type: ignore[attr-defined]
                self._in_flight = batch
            else:
                self.log.commit(outputs, positions)
        except BaseException:
            # The states ran ahead of what was committed: rebuild them from the log.
            for partition in positions:
                self.forget(partition)
            raise
        if not self.pipeline:
            self._committed(batch)
        wall, cpu = _lap(times, "commit", wall, cpu)
        if self.collector.folded(len(records)):  # between batches, never inside a command
            _lap(times, "gc", wall, cpu)
        return len(records)

    def settle(self, folded: dict[int, int] | None = None) -> None:
        """Wait for the batch whose transaction is in flight, if any, and count it once committed. If it failed,
        its partitions and those of ``folded`` (a batch folded on top of it, not committed) are forgotten and the
        log's error (BatchAborted, ...) raised."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        try:
            self.log.wait_committed(also=folded or ())  # type: ignore[attr-defined]
        except BaseException:
            for partition in sorted({*in_flight.positions, *(folded or ())}):
                self.forget(partition)
            raise
        self._committed(in_flight)

    def _committed(self, batch: _InFlight) -> None:
        self.last_committed = batch.records
        self.times.batches += 1
        self.times.records += batch.records
        self.processed += batch.records
        for code, count in batch.refused.items():
            self._refused[code] = self._refused.get(code, 0) + count

    def run_until_idle(self, idle_polls: int = 1, timeout: float = 0.0) -> int:
        """Run batches until ``idle_polls`` polls in a row return nothing; returns records folded."""
        total = 0
        idle = 0
        while idle < idle_polls:
            count = self.run_batch(timeout)
            total += count
            idle = idle + 1 if count == 0 else 0
        self.settle()
        return total


def _lap(times: StageTimes, stage: str, wall: float, cpu: float) -> tuple[float, float]:
    """Add the time since (wall, cpu) to ``stage``; returns the new (wall, cpu) marks."""
    now_wall, now_cpu = time.perf_counter(), time.thread_time()
    times.wall[stage] += now_wall - wall
    times.cpu[stage] += now_cpu - cpu
    return now_wall, now_cpu
