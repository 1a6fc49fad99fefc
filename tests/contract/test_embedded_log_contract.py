"""The CommandLog contract on the embedded SQLite log, plus what only the embedded log promises."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from logs.embedded import EmbeddedLog, FencedError, LogError, StoredRecord
from logs.port import CommandLog, OutputRecord
from processor.runtime.loop import Processor
from tests.contract.log_contract import CommandLogContract, Frame, clusters_covering, workload


class TestEmbeddedLogContract(CommandLogContract):
    """The shared contract, run on a fresh SQLite file per test."""

    @pytest.fixture
    def log(self, tmp_path: Path) -> Iterator[EmbeddedLog]:
        self.handles: list[EmbeddedLog] = []
        log = EmbeddedLog(tmp_path / "log.sqlite", partitions=self.PARTITIONS)
        self.handles.append(log)
        yield log
        for handle in self.handles:
            handle.close()

    def append_commands(self, log: CommandLog, frames: list[Frame]) -> list[tuple[int, int]]:
        assert isinstance(log, EmbeddedLog)
        return log.append_commands(frames)

    def read_topic(self, log: CommandLog, topic: str, partition: int) -> list[tuple[int, bytes | None, bytes]]:
        assert isinstance(log, EmbeddedLog)
        return [(r.offset, r.key, r.value) for r in log.read(topic, partition)]  # type: ignore[misc]

    def reopen(self, log: CommandLog) -> CommandLog:
        assert isinstance(log, EmbeddedLog)
        handle = EmbeddedLog(log.path)
        self.handles.append(handle)
        return handle

    def fail_commit(self, log: CommandLog, monkeypatch: pytest.MonkeyPatch, after: int = 0) -> None:
        # Storing the positions is the last step of the commit transaction; failing there
        # means the outputs were already inserted in it.
        original = log._upsert_positions  # type: ignore[attr-defined]
        calls = {"n": 0}

        def upsert(topic: str, positions: dict[int, int]) -> None:
            calls["n"] += 1
            if calls["n"] > after:
                raise OSError("injected failure between outputs and positions")
            original(topic, positions)

        monkeypatch.setattr(log, "_upsert_positions", upsert)


# ------------------------------------------------------------ embedded-only guarantees


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "log.sqlite"


def test_second_processor_on_the_same_file_is_fenced(path: Path) -> None:
    """A processor whose partition was committed by another one meanwhile publishes nothing."""
    with EmbeddedLog(path, partitions=1) as first, EmbeddedLog(path) as second:
        frames = workload(["lab"], pods_per_cluster=10)
        first.append_commands(frames)
        zombie = Processor(first, batch_size=5)
        zombie.run_batch(0)
        Processor(second, batch_size=100).run_until_idle()
        events = second.count(second.topics.events)
        records = first.poll(5, 0)
        with pytest.raises(FencedError):
            first.commit([OutputRecord(first.topics.events, 0, b"lab", b"duplicate")], {0: records[-1].offset + 1})
        assert second.count(second.topics.events) == events
        assert second.committed(0) == len(frames)


def test_appends_from_two_handles_interleave_densely(path: Path) -> None:
    """Two producers appending to one file never get the same offset and leave no gap."""
    with EmbeddedLog(path, partitions=1) as a, EmbeddedLog(path) as b:
        placed = []
        for i in range(10):
            producer = a if i % 2 else b
            placed += producer.append_commands([(b"lab", b"x%d" % i), (b"lab", b"y%d" % i)])
        assert [offset for _, offset in placed] == list(range(20))


def test_reopening_with_another_partition_count_is_refused(path: Path) -> None:
    """A log keeps the partition count it was created with; asking for another one is an error."""
    EmbeddedLog(path, partitions=3).close()
    with pytest.raises(LogError, match="has 3 command partition"):
        EmbeddedLog(path, partitions=4)
    with EmbeddedLog(path) as log:
        assert log.partitions == 3


def test_readonly_open_of_a_missing_log_fails_without_creating_it(path: Path) -> None:
    """Read-only commands never create a log file."""
    with pytest.raises(LogError, match="no log at"):
        EmbeddedLog(path, readonly=True)
    assert not path.exists()


def test_readonly_handle_cannot_write(path: Path) -> None:
    """A read-only handle refuses appends (replay and state never modify the log)."""
    EmbeddedLog(path).close()
    with EmbeddedLog(path, readonly=True) as log, pytest.raises(LogError, match="readonly"):
        log.append_commands([(b"lab", b"x")])


def test_a_file_that_is_not_a_log_is_refused(path: Path) -> None:
    """Opening some other file as a log is a LogError, not a crash."""
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LogError):
        EmbeddedLog(path)


def test_log_uses_wal_journal(path: Path) -> None:
    """The file is in WAL mode, so readers never block the processor's writes."""
    EmbeddedLog(path).close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_import_keeps_offsets_and_refuses_collisions(path: Path) -> None:
    """Imported records keep their offsets (gaps too); an offset already present aborts the batch."""
    with EmbeddedLog(path, partitions=1) as log:
        events = log.topics.events
        log.import_records([StoredRecord(events, 0, 0, None, b"a"), StoredRecord(events, 0, 5, None, b"b")])
        assert [r.offset for r in log.read(events, 0)] == [0, 5]
        assert log.end_offset(events, 0) == 6
        with pytest.raises(LogError, match="already taken"):
            log.import_records([StoredRecord(events, 0, 7, None, b"c"), StoredRecord(events, 0, 5, None, b"d")])
        assert [r.value for r in log.read(events, 0)] == [b"a", b"b"]


def test_poll_waits_for_records_until_the_timeout(path: Path) -> None:
    """An empty poll with a timeout returns nothing after waiting, and records once they exist."""
    with EmbeddedLog(path, partitions=2) as log:
        assert log.poll(10, 0.1) == []
        log.append_commands(workload(clusters_covering(2, 1), pods_per_cluster=1))
        assert len(log.poll(100, 0.1)) > 0
