"""Export/import of a log as Avro object container files: bytes and offsets kept, replay identical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fastavro
import pytest

from gpufold.log_export import ExportError, export_log, import_log, open_topic, write_manifest, write_topic
from logs.embedded import EmbeddedLog, LogError, StoredRecord
from processor.runtime.loop import Processor
from tests.contract.log_contract import GARBAGE, clusters_covering, workload


def everything(log: EmbeddedLog) -> dict[str, list[tuple[int, int, bytes | None, bytes | None]]]:
    topics = log.topics
    return {
        topic: [
            (r.partition, r.offset, r.key, r.value) for p in log.topic_partitions(topic) for r in log.read(topic, p)
        ]
        for topic in (topics.commands, topics.events, topics.snapshots, topics.dead_letters)
    }


@pytest.fixture
def source(tmp_path: Path) -> EmbeddedLog:
    """A processed two-partition log with events, snapshots and a dead letter."""
    log = EmbeddedLog(tmp_path / "prod.sqlite", partitions=2)
    frames = workload(clusters_covering(2), pods_per_cluster=12)
    log.append_commands([*frames, (b"cluster-0", GARBAGE)])
    Processor(log, batch_size=10, snapshot_every=10).run_until_idle()
    return log


def test_export_then_import_is_identical(source: EmbeddedLog, tmp_path: Path) -> None:
    """Every record of every topic comes back with its partition, offset, key and bytes; positions too."""
    counts = export_log(source, tmp_path / "export")
    assert counts["commands"] == source.count(source.topics.commands) and counts["dead-letters"] == 1
    import_log(tmp_path / "export", tmp_path / "laptop.sqlite")
    with EmbeddedLog(tmp_path / "laptop.sqlite") as copy:
        assert everything(copy) == everything(source)
        assert copy.partitions == 2
        assert [copy.committed(p) for p in range(2)] == [source.committed(p) for p in range(2)]


def test_commands_alone_replay_to_byte_identical_events(source: EmbeddedLog, tmp_path: Path) -> None:
    """Importing only the commands and running the processor re-derives exactly the production events."""
    export_log(source, tmp_path / "export", ["commands"])
    counts = import_log(tmp_path / "export", tmp_path / "laptop.sqlite")
    assert list(counts) == ["commands"]
    with EmbeddedLog(tmp_path / "laptop.sqlite") as copy:
        assert copy.committed(0) == 0
        Processor(copy, batch_size=7, snapshot_every=10).run_until_idle()
        assert everything(copy) == everything(source)


def test_export_is_a_plain_avro_container_file(source: EmbeddedLog, tmp_path: Path) -> None:
    """Any Avro reader can read an export: the records and the gpufold metadata are in the file."""
    export_log(source, tmp_path / "export", ["commands"])
    with (tmp_path / "export" / "commands.avro").open("rb") as f:
        reader = fastavro.reader(f)
        rows: list[Any] = list(reader)
        assert reader.metadata["gpufold.role"] == "commands"
        assert reader.metadata["gpufold.partitions"] == "2"
    first = next(source.read(source.topics.commands, rows[0]["partition"]))
    assert (rows[0]["offset"], rows[0]["key"], rows[0]["value"]) == (0, first.key, first.value)
    meta = open_topic(tmp_path / "export" / "commands.avro")
    assert meta.positions == {0: source.committed(0), 1: source.committed(1)}


def test_offset_gaps_survive_the_round_trip(tmp_path: Path) -> None:
    """Offsets with gaps (as on a transactional Kafka topic) are imported where they were."""
    records = [StoredRecord("gpufold.commands", 0, offset, b"lab", b"v%d" % offset) for offset in (0, 1, 4, 9)]
    out = tmp_path / "export"
    out.mkdir()
    write_topic(out / "commands.avro", role="commands", topic="kafka.commands", partitions=1, records=records)
    write_manifest(out, {"commands": len(records)}, partitions=1)
    import_log(out, tmp_path / "laptop.sqlite")
    with EmbeddedLog(tmp_path / "laptop.sqlite") as log:
        assert [(r.offset, r.value) for r in log.read_commands(0, 0, 100)] == [(r.offset, r.value) for r in records]
        assert log.append_commands([(b"lab", b"next")]) == [(0, 10)]


def test_import_never_overwrites_an_existing_log(source: EmbeddedLog, tmp_path: Path) -> None:
    """Importing into a file that already exists is refused and leaves it untouched."""
    export_log(source, tmp_path / "export")
    before = everything(source)
    with pytest.raises(ExportError, match="already exists"):
        import_log(tmp_path / "export", source.path)
    assert everything(source) == before


def test_snapshots_need_events(source: EmbeddedLog, tmp_path: Path) -> None:
    """Snapshots without their events would describe commands the log says are unprocessed: refused."""
    export_log(source, tmp_path / "export")
    with pytest.raises(ExportError, match="together with events"):
        import_log(tmp_path / "export", tmp_path / "laptop.sqlite", ["commands", "snapshots"])
    assert not (tmp_path / "laptop.sqlite").exists()


def test_a_non_export_file_is_refused(tmp_path: Path) -> None:
    """A directory whose commands.avro is not a gpufold export gives a clear error."""
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "commands.avro").write_bytes(b"garbage")
    with pytest.raises(ExportError, match=r"no manifest\.json"):
        import_log(tmp_path / "export", tmp_path / "laptop.sqlite")
    with pytest.raises(ExportError, match="not an Avro container file"):
        import_log(tmp_path / "export", tmp_path / "laptop.sqlite", verify=False)


def test_a_failed_import_leaves_no_half_log(tmp_path: Path) -> None:
    """When an import fails midway, the half-written log file is removed."""
    out = tmp_path / "export"
    out.mkdir()
    dup = [StoredRecord("gpufold.commands", 0, 0, b"lab", b"a"), StoredRecord("gpufold.commands", 0, 0, b"lab", b"b")]
    write_topic(out / "commands.avro", role="commands", topic="gpufold.commands", partitions=1, records=dup)
    write_manifest(out, {"commands": len(dup)}, partitions=1)
    with pytest.raises(LogError, match="already taken"):
        import_log(out, tmp_path / "laptop.sqlite")
    assert not (tmp_path / "laptop.sqlite").exists()
