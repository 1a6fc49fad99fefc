"""The embedded log's file format: its tables, its checksums and its errors.

Kept apart from :mod:`logs.embedded` (the log itself) so that the format can be read at a glance:
every record, consumer position, partition end and the meta rows carry a CRC-32 computed here.
"""

from __future__ import annotations

import zlib

FORMAT_VERSION = "1"
DEFAULT_GROUP = "gpufold-processor"
DEFAULT_PARTITIONS = 1
BUSY_TIMEOUT_MS = 30_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    topic TEXT NOT NULL,
    "partition" INTEGER NOT NULL,
    "offset" INTEGER NOT NULL,
    key BLOB,
    value BLOB,
    prev INTEGER,
    crc INTEGER,
    PRIMARY KEY (topic, "partition", "offset")
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS consumer_offsets (
    consumer_group TEXT NOT NULL,
    topic TEXT NOT NULL,
    "partition" INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    crc INTEGER,
    PRIMARY KEY (consumer_group, topic, "partition")
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ends (
    topic TEXT NOT NULL,
    "partition" INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    records INTEGER NOT NULL,
    crc INTEGER NOT NULL,
    PRIMARY KEY (topic, "partition")
) WITHOUT ROWID;
"""
CHECKED_COLUMNS = (("records", "prev"), ("records", "crc"), ("consumer_offsets", "crc"))


class LogError(Exception):
    """The log file cannot be used (missing, not a gpufold log, incompatible)."""


class FencedError(LogError):
    """Another processor committed this partition since this handle read it; nothing was published."""


class DamagedLogError(LogError):
    """The file is damaged: SQLite cannot read it, or a record, position or meta row fails its checksum."""


def record_crc(topic: str, partition: int, offset: int, prev: int, key: bytes | None, value: bytes | None) -> int:
    """CRC-32 of a record's position, its predecessor's offset and its bytes (None and b'' differ)."""
    crc = zlib.crc32(f"{topic}\x00{partition}\x00{offset}\x00{prev}\x00".encode())
    crc = zlib.crc32(b"\x00", crc) if key is None else zlib.crc32(key, zlib.crc32(b"\x01", crc))
    return zlib.crc32(b"\x00", crc) if value is None else zlib.crc32(value, zlib.crc32(b"\x01", crc))


def position_crc(group: str, topic: str, partition: int, next_offset: int) -> int:
    return zlib.crc32(f"{group}\x00{topic}\x00{partition}\x00{next_offset}".encode())


def end_crc(topic: str, partition: int, next_offset: int, records: int) -> int:
    return zlib.crc32(f"end\x00{topic}\x00{partition}\x00{next_offset}\x00{records}".encode())


def meta_crc(meta: dict[str, str]) -> str:
    return str(zlib.crc32(f"{meta.get('format')}\x00{meta.get('partitions')}".encode()))
