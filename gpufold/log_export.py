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

``manifest.json`` beside them makes the export verifiable: the SHA-256, size and
record count of every file. Avro's deflate blocks carry no checksum (a flipped byte
can decode to other bytes), so :func:`import_log` checks every file against the
manifest, and reads every record once, before it writes anything; a mismatch, a
truncated file or an undecodable block is refused with one clear message.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro

from logs.embedded import DEFAULT_GROUP, EmbeddedLog, LogError, StoredRecord
from schemas.topics import Topics

EXPORT_FORMAT = "1"
ROLES = ("commands", "events", "snapshots", "dead-letters")
MANIFEST = "manifest.json"

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
        try:
            return {int(p): int(o) for p, o in json.loads(raw).items()} if raw else {}
        except (ValueError, AttributeError, TypeError):
            raise ExportError(f"{self.path}: the committed positions in its metadata are not valid JSON") from None

    def records(self) -> Iterator[StoredRecord]:
        """The records in file order; a damaged or truncated file raises ExportError (never EOFError etc.)."""
        count = 0
        try:
            with open(self.path, "rb") as source:
                for row in fastavro.reader(source, reader_schema=RECORD_SCHEMA):
                    data: dict[str, Any] = row  # type: ignore[assignment]
                    count += 1
                    yield StoredRecord(data["topic"], data["partition"], data["offset"], data["key"], data["value"])
        except ExportError:
            raise
        except Exception as error:  # fastavro raises EOFError, ValueError, zlib.error, ... on damage
            raise ExportError(
                f"{self.path}: damaged after {count} record(s): {type(error).__name__}: {str(error)[:200]}"
            ) from None


def open_topic(path: str | os.PathLike[str]) -> TopicFile:
    """Read a container file's metadata (records are read lazily by ``records()``)."""
    path = Path(path)
    try:
        with open(path, "rb") as source:
            reader = fastavro.reader(source)
            metadata = {k: v.decode() if isinstance(v, bytes) else v for k, v in reader.metadata.items()}
    except Exception as error:  # OSError, ValueError, EOFError, ...: one message whatever fastavro raised
        raise ExportError(f"{path}: not an Avro container file: {type(error).__name__}: {str(error)[:200]}") from None
    if metadata.get("gpufold.format") != EXPORT_FORMAT or metadata.get("gpufold.role") not in ROLES:
        raise ExportError(f"{path}: not a gpufold log export (format {metadata.get('gpufold.format')!r})")
    return TopicFile(path, metadata)


def export_log(log: EmbeddedLog, out_dir: str | os.PathLike[str], roles: Iterable[str] = ROLES) -> dict[str, int]:
    """Export the log's topics into a directory (created if missing), with its manifest; returns records per role."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    (out / MANIFEST).unlink(missing_ok=True)  # a manifest is only ever written for a complete export
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
    write_manifest(out, counts, log.partitions)
    return counts


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while block := source.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(out: Path, counts: dict[str, int], partitions: int) -> None:
    """``manifest.json``: SHA-256, size and record count of each exported file (written last, atomically)."""
    files = {
        f"{role}.avro": {"sha256": _sha256(out / f"{role}.avro"), "bytes": (out / f"{role}.avro").stat().st_size,
                         "records": count}
        for role, count in counts.items()
    }  # fmt: skip
    manifest = {"format": EXPORT_FORMAT, "partitions": partitions, "files": files}
    temporary = out / f".{MANIFEST}.tmp"
    temporary.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    temporary.replace(out / MANIFEST)


def verify_export(source: Path, roles: Iterable[str]) -> dict[str, Any]:
    """Check the files of ``roles`` against ``manifest.json``: hash, size, and every record read and counted.

    Raises ExportError naming the first problem; returns the manifest.
    """
    path = source / MANIFEST
    if not path.exists():
        raise ExportError(
            f"{source} has no {MANIFEST}, so its files cannot be verified (an export of an older gpufold, or not "
            "complete): export it again, or import it with --unverified"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if not isinstance(files, dict):
            raise TypeError("files is not an object")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ExportError(f"{path} is damaged: {type(error).__name__}: {str(error)[:200]}") from None
    for role in roles:
        name = f"{role}.avro"
        entry = files.get(name)
        if not isinstance(entry, dict):
            raise ExportError(f"{source / name} is not listed in {MANIFEST}")
        file = source / name
        size = file.stat().st_size
        if size != entry.get("bytes"):
            raise ExportError(f"{file} is {size} bytes, the manifest says {entry.get('bytes')}: truncated or changed")
        if _sha256(file) != entry.get("sha256"):
            raise ExportError(f"{file} does not match its SHA-256 in {MANIFEST}: the file is damaged or was changed")
        count = sum(1 for _ in open_topic(file).records())
        if count != entry.get("records"):
            raise ExportError(f"{file} holds {count} record(s), the manifest says {entry.get('records')}")
    return manifest  # type: ignore[no-any-return]


def import_log(
    in_dir: str | os.PathLike[str],
    log_path: str | os.PathLike[str],
    roles: Iterable[str] | None = None,
    *,
    group: str = DEFAULT_GROUP,
    verify: bool = True,
) -> dict[str, int]:
    """Import an export directory into a new embedded log; returns records per role.

    Records keep their offsets and bytes; topics are renamed to the local log's
    names by role. The processor's committed positions are imported only together
    with the events (they say which commands' events exist): import the commands
    alone and ``gpufold run`` re-derives every event locally. With ``verify`` (the default) every
    file is checked against ``manifest.json`` before anything is written (:func:`verify_export`).
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
    for role in wanted:
        if not (source / f"{role}.avro").exists():
            raise ExportError(f"{source / f'{role}.avro'} does not exist")
    target = Path(log_path)
    if target.exists() and (not target.is_file() or target.stat().st_size > 0):
        raise ExportError(f"{target} already exists; import into a new log file")
    if verify:
        verify_export(source, wanted)
    files = {role: open_topic(source / f"{role}.avro") for role in wanted}
    try:
        partitions = files["commands"].partitions
        mismatched = [f for role, f in files.items() if f.partitions != partitions or f.role != role]
    except (KeyError, ValueError):
        raise ExportError(f"{files['commands'].path}: its metadata has no valid partition count") from None
    for topic_file in mismatched:
        raise ExportError(f"{topic_file.path}: role/partition count do not match commands.avro")
    if not 1 <= partitions <= 100_000:
        raise ExportError(f"{files['commands'].path}: partition count {partitions} is not plausible")

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
