"""The one checked reader of an embedded log's topic (logs.embedded_reader), and the sources built on it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from logs.embedded import DamagedLogError, EmbeddedLog, LogError
from logs.embedded_reader import EmbeddedTopicReader
from logs.embedded_replica import EmbeddedReplicaSource
from projections.sources import EmbeddedEventSource

TOPIC = "gpufold.events"


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    path = tmp_path / "log.sqlite"
    with EmbeddedLog(path, partitions=2) as log:
        log.append(TOPIC, [(0, b"k", b"a%d" % i) for i in range(5)] + [(1, b"k", b"b%d" % i) for i in range(3)])
        log.append_commands([(b"c1", b"cmd0"), (b"c1", b"cmd1")])
    return path


def test_reads_from_positions_to_the_end_and_reports_lag(log_path: Path) -> None:
    """From the stored positions, partitions in order, offsets in order; the lag counts what is left."""
    reader = EmbeddedTopicReader(log_path, TOPIC)
    reader.start(lambda: {0: 3})
    assert reader.lag() == 2 + 3
    got = reader.poll(100)
    assert [(r.partition, r.offset, r.value) for r in got] == [(0, 3, b"a3"), (0, 4, b"a4"), (1, 0, b"b0"),
                                                               (1, 1, b"b1"), (1, 2, b"b2")]  # fmt: skip
    assert reader.caught_up() and reader.lag() == 0
    reader.close()


def test_until_bounds_each_partition(log_path: Path) -> None:
    """With ``until``, a partition is read below its bound only, and is caught up there."""
    reader = EmbeddedTopicReader(log_path, TOPIC, until={0: 2, 1: 1})
    reader.start(dict)
    assert [(r.partition, r.offset) for r in reader.poll(100)] == [(0, 0), (0, 1), (1, 0)]
    assert reader.poll(100) == [] and reader.caught_up()
    reader.close()


def test_max_records_is_a_bound_over_all_partitions(log_path: Path) -> None:
    """A poll returns at most ``max_records``; the next one carries on where it stopped."""
    reader = EmbeddedTopicReader(log_path, TOPIC)
    reader.start(dict)
    first = reader.poll(4)
    assert len(first) == 4 and not reader.caught_up()
    second = reader.poll(100)
    assert reader.caught_up()
    assert [(r.partition, r.offset) for r in first + second] == [(0, i) for i in range(5)] + [(1, i) for i in range(3)]
    reader.close()


def test_a_missing_file_is_a_log_error(tmp_path: Path) -> None:
    """A path with no log is a LogError, never a new empty log."""
    with pytest.raises(LogError, match="no log at"):
        EmbeddedTopicReader(tmp_path / "missing.sqlite", TOPIC)
    assert not (tmp_path / "missing.sqlite").exists()


def test_the_projector_source_refuses_a_damaged_event(log_path: Path) -> None:
    """An event changed behind the log's back fails its checksum in the projector's source (it once read raw SQL)."""
    with sqlite3.connect(log_path) as db:
        db.execute('UPDATE records SET value = X\'00\' WHERE topic = ? AND "offset" = 1 AND "partition" = 0', (TOPIC,))
    source = EmbeddedEventSource(log_path)
    source.start(dict)
    with pytest.raises(DamagedLogError, match=r"gpufold.events\[0\]@1 fails its checksum"):
        source.poll(100, 0.0)
    source.close()


def test_the_replica_source_reads_the_commands_through_the_same_reader(log_path: Path) -> None:
    """The replica's fetch returns the commands at each partition's position, and refuses a damaged one."""
    source = EmbeddedReplicaSource(log_path)
    partition = next(p for p, end in source.end_offsets().items() if end == 2)
    assert [(r.offset, r.value) for r in source.fetch({partition: 1}, 10, 0.0)] == [(1, b"cmd1")]
    with sqlite3.connect(log_path) as db:
        db.execute("UPDATE records SET value = X'01' WHERE topic = 'gpufold.commands' AND \"offset\" = 0")
    with pytest.raises(DamagedLogError):
        source.fetch({partition: 0}, 10, 0.0)
    source.close()
