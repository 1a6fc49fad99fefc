"""The contract every :class:`processor.runtime.loop.CommandLog` keeps, as one abstract test class.

Run it against a backend by subclassing :class:`CommandLogContract` in a
``test_*.py`` module (the base class is not collected: its name does not start
with ``Test``) and providing:

- a ``log`` fixture: a fresh, empty log whose commands topic has
  ``PARTITIONS`` partitions, owned by this processor (all partitions assigned);
- :meth:`append_commands`: produce (key, value) frames to the commands topic,
  keyed by cluster with Kafka's murmur2 partitioner; returns (partition, offset)s;
- :meth:`read_topic`: the committed records of an output topic's partition;
- :meth:`reopen`: a second handle on the same log, as a restarted processor opens it;
- :meth:`fail_commit`: make a later ``commit`` of a handle fail after its outputs
  were handed to the log but before the positions were stored.

``tests/contract/test_embedded_log_contract.py`` is the embedded (SQLite) run.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from gpufold.replay import replay_partition
from logs.port import CommandLog, InputRecord, OutputRecord
from processor.core.snapshot import state_hash
from processor.runtime.loop import Processor
from schemas import COMMAND, EVENT, registry
from schemas.commands import AddNode, Command, Release, SubmitPod
from schemas.partitioner import cluster_partition

Frame = tuple[bytes, bytes]  # (key, value)
GARBAGE = b"\xc3\x01 not a command"  # undecodable: must become a dead letter


def command_frame(command: Command) -> Frame:
    """A command as the (key, value) record a producer sends."""
    return command.cluster.encode(), registry().codec(COMMAND).encode(command.to_avro())


def clusters_covering(partitions: int, per_partition: int = 2) -> list[str]:
    """Cluster names chosen so that every partition gets ``per_partition`` of them (murmur2 decides)."""
    found: dict[int, list[str]] = {p: [] for p in range(partitions)}
    i = 0
    while any(len(names) < per_partition for names in found.values()):
        name = f"cluster-{i}"
        bucket = found[cluster_partition(name, partitions)]
        if len(bucket) < per_partition:
            bucket.append(name)
        i += 1
    return sorted(name for names in found.values() for name in names)


def workload(clusters: list[str], pods_per_cluster: int, garbage_every: int = 0) -> list[Frame]:
    """A deterministic stream: nodes, then pods that fit or queue, some releases, optional undecodable frames."""
    frames: list[Frame] = []
    t = 1_767_225_600_000
    for cluster in clusters:
        for n in range(3):
            node = AddNode(f"n{n}", cpu_milli=32_000, memory_mib=65_536, gpu_model="A100", gpu_count=2)
            frames.append(command_frame(Command(f"{cluster}-node-{n}", cluster, t, node)))
    for i in range(pods_per_cluster):
        for cluster in clusters:
            t += 1
            if i % 3 == 2:
                payload: Any = Release(f"p{i - 2}")
            else:
                payload = SubmitPod(f"p{i}", num_gpu=1, gpu_milli=250 + 250 * (i % 3), cpu_milli=1_000)
            frames.append(command_frame(Command(f"{cluster}-cmd-{i}", cluster, t, payload)))
            if garbage_every and (i * len(clusters) + len(frames)) % garbage_every == 0:
                frames.append((cluster.encode(), GARBAGE))
    return frames


class CommandLogContract:
    """Behaviour any CommandLog must show; subclasses provide the ``log`` fixture and the hooks below."""

    PARTITIONS = 2
    POLL_TIMEOUT = 0.2  # seconds a poll may wait; a broker-backed log may need more
    IDLE_POLLS = 2  # empty polls in a row after which a processor run counts as caught up
    # Commit errors after which the log has already rewound and a caller simply runs again (the
    # runner's loop does exactly that); an implementation lists its own, e.g. Kafka's BatchAborted.
    REWOUND_ERRORS: tuple[type[BaseException], ...] = ()

    # ------------------------------------------------------------ hooks

    def append_commands(self, log: CommandLog, frames: list[Frame]) -> list[tuple[int, int]]:
        raise NotImplementedError

    def read_topic(self, log: CommandLog, topic: str, partition: int) -> list[tuple[int, bytes | None, bytes]]:
        """(offset, key, value) of the committed records of one output topic partition."""
        raise NotImplementedError

    def reopen(self, log: CommandLog) -> CommandLog:
        """A new handle on the same log, as a restarted processor opens it (the old one is abandoned)."""
        raise NotImplementedError

    def fail_commit(self, log: CommandLog, monkeypatch: pytest.MonkeyPatch, after: int = 0) -> None:
        """Let ``after`` commits of this handle succeed, then make each later one fail between outputs and positions."""
        raise NotImplementedError

    # ------------------------------------------------------------ helpers

    def poll_all(self, log: CommandLog, expected: int) -> list[InputRecord]:
        records: list[InputRecord] = []
        for _ in range(200):
            records.extend(log.poll(1_000, self.POLL_TIMEOUT))
            if len(records) >= expected:
                break
        return records

    def events_of(self, log: CommandLog, partition: int) -> list[bytes]:
        return [value for _, _, value in self.read_topic(log, log.topics.events, partition)]

    def events_eventually(self, log: CommandLog, partition: int, count: int, timeout: float = 30.0) -> list[bytes]:
        """The committed events of a partition, read again until ``count`` are there or ``timeout`` passes.

        A log may make a commit readable a moment after ``commit`` returns (Kafka writes the transaction
        markers asynchronously); what a reader sees then must be all of it. One CI run in several read
        nothing right after the commit; reading again shows whether the records came late or never.
        """
        deadline = time.monotonic() + timeout
        while True:
            events = self.events_of(log, partition)
            if len(events) >= count or time.monotonic() > deadline:
                return events
            time.sleep(0.2)

    # ------------------------------------------------------------ appends and reads

    def test_offsets_are_dense_and_ordered_per_partition(self, log: CommandLog) -> None:
        """Appended commands get offsets 0, 1, 2, ... per partition, in append order."""
        frames = workload(clusters_covering(self.PARTITIONS), pods_per_cluster=5)
        placed = self.append_commands(log, frames)
        per_partition: dict[int, list[int]] = {}
        for partition, offset in placed:
            per_partition.setdefault(partition, []).append(offset)
        assert sorted(per_partition) == list(range(self.PARTITIONS))
        for offsets in per_partition.values():
            assert offsets == list(range(len(offsets)))

    def test_partition_is_murmur2_of_the_cluster(self, log: CommandLog) -> None:
        """A command lands on the partition Kafka's default partitioner gives its cluster key."""
        clusters = clusters_covering(self.PARTITIONS)
        frames = workload(clusters, pods_per_cluster=1)
        for (key, _), (partition, _) in zip(frames, self.append_commands(log, frames), strict=True):
            assert partition == cluster_partition(key.decode(), self.PARTITIONS)

    def test_read_commands_returns_the_half_open_range(self, log: CommandLog) -> None:
        """read_commands(p, start, end) yields exactly offsets start..end-1 with the appended bytes."""
        frames = workload(clusters_covering(self.PARTITIONS), pods_per_cluster=6)
        placed = self.append_commands(log, frames)
        by_position = dict(zip(placed, frames, strict=True))
        partition = placed[0][0]
        count = sum(1 for p, _ in placed if p == partition)
        records = list(log.read_commands(partition, 2, count - 1))
        assert [r.offset for r in records] == list(range(2, count - 1))
        assert all((r.key, r.value) == by_position[(partition, r.offset)] for r in records)
        assert list(log.read_commands(partition, 3, 3)) == []

    def test_poll_returns_every_record_once_in_offset_order(self, log: CommandLog) -> None:
        """Polling without committing yields each appended record once, in offset order within a partition."""
        frames = workload(clusters_covering(self.PARTITIONS), pods_per_cluster=10)
        self.append_commands(log, frames)
        records = self.poll_all(log, len(frames))
        assert len(records) == len(frames)
        for partition in range(self.PARTITIONS):
            offsets = [r.offset for r in records if r.partition == partition]
            assert offsets == list(range(len(offsets)))
        assert log.poll(100, self.POLL_TIMEOUT) == []

    # ------------------------------------------------------------ commit

    def test_committed_is_zero_before_any_commit(self, log: CommandLog) -> None:
        """A partition nobody committed reports next offset 0 and has no snapshot."""
        assert [log.committed(p) for p in range(self.PARTITIONS)] == [0] * self.PARTITIONS
        assert log.latest_snapshot(0) is None

    def test_commit_publishes_outputs_and_positions(self, log: CommandLog) -> None:
        """After commit the outputs are readable in order and committed() returns the new positions."""
        frames = workload(clusters_covering(self.PARTITIONS), pods_per_cluster=2)
        self.append_commands(log, frames)
        self.poll_all(log, len(frames))
        outputs = [OutputRecord(log.topics.events, 0, b"k", b"event-%d" % i) for i in range(3)]
        log.commit(outputs, {0: 2, 1: 1})
        published = self.events_eventually(log, 0, count=3)
        assert published == [b"event-0", b"event-1", b"event-2"], published
        assert (log.committed(0), log.committed(1)) == (2, 1)
        other = self.reopen(log)
        assert (other.committed(0), other.committed(1)) == (2, 1)

    def test_failed_commit_publishes_nothing(self, log: CommandLog, monkeypatch: pytest.MonkeyPatch) -> None:
        """A failure between writing outputs and storing positions leaves neither visible."""
        frames = workload(clusters_covering(self.PARTITIONS), pods_per_cluster=2)
        self.append_commands(log, frames)
        self.poll_all(log, len(frames))
        log.commit([OutputRecord(log.topics.events, 0, b"k", b"kept")], {0: 1})
        self.fail_commit(log, monkeypatch)
        lost = [OutputRecord(log.topics.events, 0, b"k", b"lost"), OutputRecord(log.topics.snapshots, 0, b"0", b"s")]
        with pytest.raises(Exception):  # noqa: B017 - whatever the backend raises, nothing may be published
            log.commit(lost, {0: 5})
        for handle in (log, self.reopen(log)):
            assert handle.committed(0) == 1
            assert self.events_of(handle, 0) == [b"kept"]
            assert handle.latest_snapshot(0) is None

    def test_latest_snapshot_is_the_newest_of_its_partition(self, log: CommandLog) -> None:
        """latest_snapshot returns the last snapshot committed for a partition, and only for that partition."""
        self.append_commands(log, workload(clusters_covering(self.PARTITIONS), pods_per_cluster=1))
        snapshots = log.topics.snapshots
        log.commit([OutputRecord(snapshots, 0, b"0", b"first")], {0: 1})
        log.commit([OutputRecord(snapshots, 0, b"0", b"second")], {0: 2})
        assert log.latest_snapshot(0) == b"second"
        assert log.latest_snapshot(1) is None

    # ------------------------------------------------------------ the processor on this log

    def reference(self, frames: list[Frame], placed: list[tuple[int, int]]) -> dict[int, Any]:
        """What an uninterrupted in-memory fold of the same records produces, per partition."""
        records: dict[int, list[InputRecord]] = {}
        for (key, value), (partition, offset) in zip(frames, placed, strict=True):
            records.setdefault(partition, []).append(InputRecord(partition, offset, key, value))
        return {p: replay_partition(p, rs, keep_events=True) for p, rs in records.items()}

    def assert_exactly_once(self, log: CommandLog, frames: list[Frame], placed: list[tuple[int, int]]) -> None:
        reference = self.reference(frames, placed)
        codec = registry().codec(EVENT)
        for partition, expected in reference.items():
            events = self.events_of(log, partition)
            assert events == [frame for _, frame in expected.events]
            decoded = [codec.decode(frame) for frame in events]
            assert [e["sequence"] for e in decoded] == list(range(len(decoded)))
            outcomes = Counter(e["command_offset"] for e in decoded)
            commands = {offset for p, offset in placed if p == partition}
            garbage = {
                o for (_, value), (p, o) in zip(frames, placed, strict=True) if p == partition and GARBAGE in value
            }
            assert set(outcomes) == commands - garbage
            assert log.committed(partition) == len(commands)

    def test_processor_folds_each_command_exactly_once(self, log: CommandLog) -> None:
        """The processor's events equal, byte for byte, an in-memory fold of the same commands."""
        frames = workload(clusters_covering(self.PARTITIONS), pods_per_cluster=30, garbage_every=17)
        placed = self.append_commands(log, frames)
        folded = Processor(log, batch_size=25, snapshot_every=40).run_until_idle(
            idle_polls=self.IDLE_POLLS, timeout=self.POLL_TIMEOUT
        )
        assert folded == len(frames)
        self.assert_exactly_once(log, frames, placed)
        dead = sum(len(self.read_topic(log, log.topics.dead_letters, p)) for p in range(self.PARTITIONS))
        assert dead == sum(1 for _, value in frames if value == GARBAGE) > 0

    def test_crash_mid_batch_then_new_processor_gives_one_outcome_per_command(
        self, log: CommandLog, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A processor dying inside a commit, replaced by a new one, still yields one outcome per command."""
        frames = workload(clusters_covering(self.PARTITIONS), pods_per_cluster=40, garbage_every=23)
        placed = self.append_commands(log, frames)
        self.fail_commit(log, monkeypatch, after=3)
        with pytest.raises(Exception):  # noqa: B017 - the injected crash
            Processor(log, batch_size=30, snapshot_every=25).run_until_idle(
                idle_polls=self.IDLE_POLLS, timeout=self.POLL_TIMEOUT
            )
        successor = self.reopen(log)
        Processor(successor, batch_size=30, snapshot_every=25).run_until_idle(
            idle_polls=self.IDLE_POLLS, timeout=self.POLL_TIMEOUT
        )
        self.assert_exactly_once(successor, frames, placed)
        snapshot = successor.latest_snapshot(placed[0][0])
        assert snapshot is not None

    def test_crash_before_commit_then_new_processor_gives_one_outcome_per_command(
        self, log: CommandLog, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A processor dying after folding a batch but before committing it loses and duplicates nothing."""
        frames = workload(clusters_covering(self.PARTITIONS), pods_per_cluster=15)
        placed = self.append_commands(log, frames)
        processor = Processor(log, batch_size=20, snapshot_every=0)
        processor.run_batch(self.POLL_TIMEOUT)

        def die(outputs: list[OutputRecord], positions: dict[int, int]) -> None:
            raise SystemExit("killed before commit")

        monkeypatch.setattr(log, "commit", die)
        if hasattr(log, "commit_async"):  # the pipelined path: the crash comes as its transaction is begun
            monkeypatch.setattr(log, "commit_async", die)
        with pytest.raises(SystemExit):
            processor.run_batch(self.POLL_TIMEOUT)
            processor.settle()
        successor = self.reopen(log)
        Processor(successor, batch_size=20).run_until_idle(idle_polls=self.IDLE_POLLS, timeout=self.POLL_TIMEOUT)
        self.assert_exactly_once(successor, frames, placed)

    def test_processor_continues_after_a_failed_commit(self, log: CommandLog, monkeypatch: pytest.MonkeyPatch) -> None:
        """The same processor, retrying after a failed commit, rebuilds its state and duplicates nothing."""
        frames = workload(clusters_covering(self.PARTITIONS), pods_per_cluster=20)
        placed = self.append_commands(log, frames)
        processor = Processor(log, batch_size=20, snapshot_every=0)
        processor.run_batch(self.POLL_TIMEOUT)
        self.fail_commit(log, monkeypatch, after=0)
        with pytest.raises(Exception):  # noqa: B017 - the injected failure
            processor.run_batch(self.POLL_TIMEOUT)
            processor.settle()  # pipelined: the failure shows when the batch's transaction is waited for
        monkeypatch.undo()
        for attempt in range(5):
            try:
                processor.run_until_idle(idle_polls=self.IDLE_POLLS, timeout=self.POLL_TIMEOUT)
                break
            except self.REWOUND_ERRORS:
                if attempt == 4:
                    raise
        self.assert_exactly_once(log, frames, placed)

    def test_restored_state_equals_uninterrupted_state(self, log: CommandLog) -> None:
        """A processor restarted from snapshot + tail holds the same state_hash as a full in-memory fold."""
        frames = workload(clusters_covering(self.PARTITIONS), pods_per_cluster=25)
        placed = self.append_commands(log, frames)
        Processor(log, batch_size=16, snapshot_every=20).run_until_idle(
            idle_polls=self.IDLE_POLLS, timeout=self.POLL_TIMEOUT
        )
        restarted = Processor(self.reopen(log))
        for partition, expected in self.reference(frames, placed).items():
            assert state_hash(restarted.folder(partition).state) == state_hash(expected.state)
