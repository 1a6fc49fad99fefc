"""Export and import a log's topics as Avro object container files, to replay a production log on a laptop.

An export is a directory with one container file per topic role::

    commands.avro  events.avro  snapshots.avro  dead-letters.avro

Each file holds ``gpufold.export.LogRecord`` rows (topic, partition, offset, key,
value) in partition then offset order, deflate-compressed. The values are the
records' bytes exactly as they were in the log (Avro single-object frames), so
an imported command log folds to byte-identical events. Offsets are kept as they
were, gaps included (a Kafka topic written transactionally has gaps where its
commit markers sit).

The file metadata says what the file is: ``gpufold.format``, ``gpufold.role``,
``gpufold.topic``, ``gpufold.partitions`` (the command partition count, which
decides where a cluster's commands live) and, in ``commands.avro``, the
processor's committed positions (``gpufold.positions``, JSON). Any log backend
(the Kafka adapter too) can write this format with :func:`write_topic`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro

from gpufold.embedded_log import DEFAULT_GROUP, EmbeddedLog, LogError, StoredRecord
from schemas.topics import Topics

EXPORT_FORMAT = "1"
ROLES = ("commands", "events", "snapshots", "dead-letters")

RECORD_SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "LogRecord",
        "namespace": "gpufold.export",
        "doc": "One record of a log topic, with its bytes exactly as stored.",
        "fields": [
            {"name": "topic", "type": "string"},
            {"name": "partition", "type": "int"},
            {"name": "offset", "type": "long"},
            {"name": "key", "type": ["null", "bytes"], "default": None},
            {"name": "value", "type": ["null", "bytes"], "default": None},
        ],
    }
)


class ExportError(LogError):
    """An export directory or file that cannot be read or written as asked."""


def topic_of(topics: Topics, role: str) -> str:
    """The topic name of a role (``commands``, ``events``, ``snapshots``, ``dead-letters``)."""
    return {
        "commands": topics.commands,
        "events": topics.events,
        "snapshots": topics.snapshots,
        "dead-letters": topics.dead_letters,
    }[role]


def write_topic(
    path: str | os.PathLike[str],
    *,
    role: str,
    topic: str,
    partitions: int,
    records: Iterable[StoredRecord],
    metadata: dict[str, str] | None = None,
) -> int:
    """Write one topic's records to a container file; returns how many were written."""
    count = 0

    def rows() -> Iterator[dict[str, Any]]:
        nonlocal count
        for record in records:
            count += 1
            yield {
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "key": None if record.key is None else bytes(record.key),
                "value": None if record.value is None else bytes(record.value),
            }

    meta = {
        "gpufold.format": EXPORT_FORMAT,
        "gpufold.role": role,
        "gpufold.topic": topic,
        "gpufold.partitions": str(partitions),
        **(metadata or {}),
    }
    with open(path, "wb") as out:
        fastavro.writer(out, RECORD_SCHEMA, rows(), codec="deflate", metadata=meta)
    return count


@dataclass
class TopicFile:
    """An exported topic file opened for reading: its metadata, then its records (streamed)."""

    path: Path
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def role(self) -> str:
        return self.metadata["gpufold.role"]

    @property
    def partitions(self) -> int:
        return int(self.metadata["gpufold.partitions"])

    @property
    def positions(self) -> dict[int, int]:
        raw = self.metadata.get("gpufold.positions")
        return {int(p): int(o) for p, o in json.loads(raw).items()} if raw else {}

    def records(self) -> Iterator[StoredRecord]:
        with open(self.path, "rb") as source:
            for row in fastavro.reader(source, reader_schema=RECORD_SCHEMA):
                data: dict[str, Any] = row  # type: ignore[assignment]
                yield StoredRecord(data["topic"], data["partition"], data["offset"], data["key"], data["value"])


def open_topic(path: str | os.PathLike[str]) -> TopicFile:
    """Read a container file's metadata (records are read lazily by ``records()``)."""
    path = Path(path)
    try:
        with open(path, "rb") as source:
            reader = fastavro.reader(source)
            metadata = {k: v.decode() if isinstance(v, bytes) else v for k, v in reader.metadata.items()}
    except (OSError, ValueError) as error:
        raise ExportError(f"{path}: not an Avro container file: {error}") from error
    if metadata.get("gpufold.format") != EXPORT_FORMAT or metadata.get("gpufold.role") not in ROLES:
        raise ExportError(f"{path}: not a gpufold log export (format {metadata.get('gpufold.format')!r})")
    return TopicFile(path, metadata)


def export_log(log: EmbeddedLog, out_dir: str | os.PathLike[str], roles: Iterable[str] = ROLES) -> dict[str, int]:
    """Export the log's topics into a directory (created if missing); returns records per role."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for role in roles:
        topic = topic_of(log.topics, role)
        metadata: dict[str, str] = {}
        if role == "commands":
            committed = {p: log.committed(p) for p in range(log.partitions)}
            metadata = {"gpufold.positions": json.dumps(committed), "gpufold.group": log.group}

        def records(topic: str = topic) -> Iterator[StoredRecord]:
            for partition in log.topic_partitions(topic):
                yield from log.read(topic, partition)

        counts[role] = write_topic(
            out / f"{role}.avro",
            role=role,
            topic=topic,
            partitions=log.partitions,
            records=records(),
            metadata=metadata,
        )
    return counts


def import_log(
    in_dir: str | os.PathLike[str],
    log_path: str | os.PathLike[str],
    roles: Iterable[str] | None = None,
    *,
    group: str = DEFAULT_GROUP,
) -> dict[str, int]:
    """Import an export directory into a new embedded log; returns records per role.

    Records keep their offsets and bytes; topics are renamed to the local log's
    names by role. The processor's committed positions are imported only together
    with the events (they say which commands' events exist): import the commands
    alone and ``gpufold run`` re-derives every event locally.
    """
    source = Path(in_dir)
    if not source.is_dir():
        raise ExportError(f"{source} does not exist or is not a directory (an export is a directory of .avro files)")
    wanted = tuple(roles) if roles is not None else tuple(r for r in ROLES if (source / f"{r}.avro").exists())
    unknown = [role for role in wanted if role not in ROLES]
    if unknown:
        raise ExportError(f"unknown topic role(s) {unknown}; roles are {', '.join(ROLES)}")
    if "commands" not in wanted:
        raise ExportError(f"{source}: an import needs commands.avro (the source of truth)")
    if "snapshots" in wanted and "events" not in wanted:
        raise ExportError("snapshots can only be imported together with events (they describe folded commands)")
    files = {}
    for role in wanted:
        path = source / f"{role}.avro"
        if not path.exists():
            raise ExportError(f"{path} does not exist")
        files[role] = open_topic(path)
    partitions = files["commands"].partitions
    for role, topic_file in files.items():
        if topic_file.partitions != partitions or topic_file.role != role:
            raise ExportError(f"{topic_file.path}: role/partition count do not match commands.avro")
    target = Path(log_path)
    if target.exists() and target.stat().st_size > 0:
        raise ExportError(f"{target} already exists; import into a new log file")
    counts: dict[str, int] = {}
    try:
        with EmbeddedLog(target, partitions=partitions, group=group) as log:
            for role, topic_file in files.items():
                topic = topic_of(log.topics, role)
                counts[role] = log.import_records(record._replace(topic=topic) for record in topic_file.records())
            if "events" in files:
                for partition, offset in files["commands"].positions.items():
                    log.set_position(partition, offset)
    except BaseException:
        for suffix in ("", "-wal", "-shm"):  # a half-imported log would mislead: remove it
            Path(f"{target}{suffix}").unlink(missing_ok=True)
        raise
    return counts
