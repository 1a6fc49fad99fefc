"""The embedded log: Kafka's semantics (topics, partitions, offsets, consumer positions) in one SQLite file.

The default backend, no servers: producers append command frames, the processor
loop (``processor.runtime.loop.Processor``) folds them through the same
:class:`~processor.runtime.loop.CommandLog` interface it uses on Kafka.

Layout (SQLite, WAL mode, one file)::

    meta(name PRIMARY KEY, value)                      -- format version, command partition count
    records(topic, partition, offset, key, value)      -- PRIMARY KEY (topic, partition, offset)
    consumer_offsets(consumer_group, topic, partition, next_offset)

Guarantees:

- Offsets are assigned densely per (topic, partition), in append order, inside the
  writing transaction (so concurrent writers from several processes never collide).
- ``commit(outputs, positions)`` is one SQLite transaction: the outputs and the new
  consumer positions become visible together or not at all.
- Fencing, like a Kafka transactional id: ``commit`` checks that each partition's
  stored position is still the one this handle last read or wrote. If another
  processor committed in between, :class:`FencedError` is raised and nothing is
  published, so two ``gpufold run`` on one file can never duplicate events.
- Durability: ``synchronous=NORMAL`` in WAL mode survives a crash of the process;
  a power loss may drop the last transactions but never tears one. Pass
  ``durable=True`` for ``synchronous=FULL``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from processor.runtime.loop import InputRecord, OutputRecord
from schemas.partitioner import partition_for
from schemas.topics import Topics

FORMAT_VERSION = "1"
DEFAULT_GROUP = "gpufold-processor"
DEFAULT_PARTITIONS = 1
_BUSY_TIMEOUT_MS = 30_000

_SCHEMA = """
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
    PRIMARY KEY (topic, "partition", "offset")
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS consumer_offsets (
    consumer_group TEXT NOT NULL,
    topic TEXT NOT NULL,
    "partition" INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (consumer_group, topic, "partition")
) WITHOUT ROWID;
"""


class LogError(Exception):
    """The log file cannot be used (missing, not a gpufold log, incompatible)."""


class FencedError(LogError):
    """Another processor committed this partition since this handle read it; nothing was published."""


class StoredRecord(NamedTuple):
    """A record as stored: where it is and its bytes."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class EmbeddedLog:
    """A :class:`~processor.runtime.loop.CommandLog` on SQLite, plus the producer side (appends).

    One handle is used by one thread. Several processes may open the same file:
    writes are serialised by SQLite, readers see only committed transactions.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        partitions: int | None = None,
        group: str = DEFAULT_GROUP,
        topics: Topics | None = None,
        create: bool = True,
        readonly: bool = False,
        durable: bool = False,
    ) -> None:
        """Open (or create) a log.

        ``partitions`` is the command partition count of a new log (default
        :data:`DEFAULT_PARTITIONS`); for an existing log it must match or be None.
        ``readonly`` opens without any write (replay, state, events).
        """
        self.path = Path(path)
        self.group = group
        self.topics = topics or Topics()
        exists = self.path.exists() and self.path.stat().st_size > 0
        if not exists and (readonly or not create):
            raise LogError(f"no log at {self.path}")
        try:
            if readonly:
                self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
            else:
                self._db = sqlite3.connect(self.path, isolation_level=None)
            self._db.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            if not readonly:
                self._db.execute("PRAGMA journal_mode = WAL")
                self._db.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
                self._db.executescript(_SCHEMA)
            self.partitions = self._init_meta(partitions, readonly)
        except sqlite3.DatabaseError as error:
            raise LogError(f"{self.path} is not a usable gpufold log: {error}") from error
        # Where poll() reads next, per partition; and the committed position this
        # handle last saw, per partition (the fencing check of commit()).
        self._fetch: dict[int, int] = {}
        self._seen_committed: dict[int, int] = {}
        self._next_poll_partition = 0

    # ------------------------------------------------------------ set-up

    def _init_meta(self, partitions: int | None, readonly: bool) -> int:
        if partitions is not None and partitions < 1:
            raise LogError(f"partition count must be >= 1, got {partitions}")
        meta = dict(self._db.execute("SELECT name, value FROM meta").fetchall())
        if not meta:
            if readonly:
                raise LogError(f"{self.path} is not a gpufold log (no meta table rows)")
            count = partitions or DEFAULT_PARTITIONS
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (FORMAT_VERSION,))
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('partitions', ?)", (str(count),))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            meta = dict(self._db.execute("SELECT name, value FROM meta").fetchall())
        if meta.get("format") != FORMAT_VERSION:
            raise LogError(f"{self.path}: log format {meta.get('format')!r}, this gpufold reads {FORMAT_VERSION!r}")
        stored = int(meta["partitions"])
        if partitions is not None and partitions != stored:
            raise LogError(f"{self.path} has {stored} command partition(s), not {partitions}")
        return stored

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> EmbeddedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ producer side

    def partition_for(self, key: bytes) -> int:
        """The command partition of a key (Kafka's murmur2 partitioner)."""
        return partition_for(key, self.partitions)

    def append_commands(self, frames: Iterable[tuple[bytes, bytes]]) -> list[tuple[int, int]]:
        """Append (key, value) command frames in one transaction; returns each one's (partition, offset).

        The key (the cluster name) chooses the partition; order is kept per partition.
        """
        batch = [(self.partition_for(key), key, value) for key, value in frames]
        return self.append(self.topics.commands, batch)

    def append(self, topic: str, records: Sequence[tuple[int, bytes | None, bytes | None]]) -> list[tuple[int, int]]:
        """Append (partition, key, value) records to a topic in one transaction; returns (partition, offset)s."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            placed = self._insert(topic, records)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return placed

    def import_records(self, records: Iterable[StoredRecord], batch_size: int = 10_000) -> int:
        """Store records at their given offsets (import of an export; gaps are kept). Returns the count.

        Refuses records at an offset that is already taken (the whole batch rolls back).
        """
        total = 0
        batch: list[tuple[str, int, int, bytes | None, bytes | None]] = []

        def flush() -> None:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    'INSERT INTO records (topic, "partition", "offset", key, value) VALUES (?, ?, ?, ?, ?)', batch
                )
                self._db.execute("COMMIT")
            except sqlite3.IntegrityError as error:
                self._db.execute("ROLLBACK")
                raise LogError(f"{self.path}: offset already taken while importing: {error}") from error
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            batch.clear()

        for record in records:
            if record.topic == self.topics.commands and not 0 <= record.partition < self.partitions:
                raise LogError(f"command partition {record.partition} outside 0..{self.partitions - 1}")
            batch.append(tuple(record))  # type: ignore[arg-type]
            total += 1
            if len(batch) >= batch_size:
                flush()
        if batch:
            flush()
        return total

    def set_position(self, partition: int, next_offset: int, topic: str | None = None) -> None:
        """Set this group's position on a partition directly (import of positions)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._upsert_positions(topic or self.topics.commands, {partition: next_offset})
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _insert(self, topic: str, records: Sequence[tuple[int, bytes | None, bytes | None]]) -> list[tuple[int, int]]:
        """Insert records at the next offsets of their partitions (caller holds the write transaction)."""
        next_offsets: dict[int, int] = {}
        rows = []
        placed = []
        for partition, key, value in records:
            offset = next_offsets.get(partition)
            if offset is None:
                offset = self._end_offset(topic, partition)
            next_offsets[partition] = offset + 1
            rows.append((topic, partition, offset, key, value))
            placed.append((partition, offset))
        self._db.executemany(
            'INSERT INTO records (topic, "partition", "offset", key, value) VALUES (?, ?, ?, ?, ?)', rows
        )
        return placed

    # ------------------------------------------------------------ CommandLog

    def assignment(self) -> list[int]:
        """Every command partition: the embedded log has one processor per file."""
        return list(range(self.partitions))

    def poll(self, max_records: int, timeout: float) -> list[InputRecord]:
        """Up to ``max_records`` next command records, taking partitions in turn; waits up to ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            records = self._poll_once(max_records)
            if records or time.monotonic() >= deadline:
                return records
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _poll_once(self, max_records: int) -> list[InputRecord]:
        records: list[InputRecord] = []
        count = self.partitions
        start = self._next_poll_partition
        self._next_poll_partition = (start + 1) % count
        for i in range(count):
            if len(records) >= max_records:
                break
            partition = (start + i) % count
            position = self._fetch.get(partition)
            if position is None:
                position = self._fetch[partition] = self.committed(partition)
            rows = self._db.execute(
                'SELECT "offset", key, value FROM records WHERE topic = ? AND "partition" = ? AND "offset" >= ? '
                'ORDER BY "offset" LIMIT ?',
                (self.topics.commands, partition, position, max_records - len(records)),
            ).fetchall()
            if rows:
                records.extend(InputRecord(partition, offset, key, value) for offset, key, value in rows)
                self._fetch[partition] = rows[-1][0] + 1
        return records

    def seek(self, partition: int, offset: int) -> None:
        """Make the next poll of a partition start at ``offset``."""
        self._fetch[partition] = offset

    def commit(self, outputs: list[OutputRecord], positions: dict[int, int]) -> None:
        """Publish outputs and move this group's positions in one SQLite transaction.

        Raises :class:`FencedError` (publishing nothing) if another handle moved a
        position since this one last read it. On any failure the fetch positions
        of those partitions go back to the committed ones, as after a Kafka abort.
        """
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._check_fence(positions)
                by_topic: dict[str, list[tuple[int, bytes | None, bytes | None]]] = {}
                for record in outputs:
                    by_topic.setdefault(record.topic, []).append((record.partition, record.key, record.value))
                for topic, records in by_topic.items():
                    self._insert(topic, records)
                self._upsert_positions(self.topics.commands, positions)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        except BaseException:
            for partition in positions:
                self._fetch.pop(partition, None)
                self._seen_committed.pop(partition, None)
            raise
        self._seen_committed.update(positions)

    def _check_fence(self, positions: dict[int, int]) -> None:
        for partition in positions:
            expected = self._seen_committed.get(partition)
            if expected is None:
                continue
            current = self._stored_position(partition)
            if current != expected:
                raise FencedError(
                    f"partition {partition} was committed at {current} by another processor "
                    f"(this one last saw {expected}); nothing was published"
                )

    def _upsert_positions(self, topic: str, positions: dict[int, int]) -> None:
        self._db.executemany(
            'INSERT INTO consumer_offsets (consumer_group, topic, "partition", next_offset) VALUES (?, ?, ?, ?) '
            'ON CONFLICT (consumer_group, topic, "partition") DO UPDATE SET next_offset = excluded.next_offset',
            [(self.group, topic, partition, offset) for partition, offset in positions.items()],
        )

    def _stored_position(self, partition: int) -> int:
        row = self._db.execute(
            'SELECT next_offset FROM consumer_offsets WHERE consumer_group = ? AND topic = ? AND "partition" = ?',
            (self.group, self.topics.commands, partition),
        ).fetchone()
        return int(row[0]) if row else 0

    def committed(self, partition: int) -> int:
        """This group's committed next offset on a command partition (0 if none)."""
        position = self._stored_position(partition)
        self._seen_committed[partition] = position
        return position

    def latest_snapshot(self, partition: int) -> bytes | None:
        row = self._db.execute(
            'SELECT value FROM records WHERE topic = ? AND "partition" = ? ORDER BY "offset" DESC LIMIT 1',
            (self.topics.snapshots, partition),
        ).fetchone()
        return bytes(row[0]) if row and row[0] is not None else None

    def read_commands(self, partition: int, start: int, end: int) -> Iterator[InputRecord]:
        for record in self.read(self.topics.commands, partition, start, end):
            yield InputRecord(partition, record.offset, record.key, record.value)

    # ------------------------------------------------------------ reading any topic

    def read(
        self, topic: str, partition: int, start: int = 0, end: int | None = None, chunk: int = 5_000
    ) -> Iterator[StoredRecord]:
        """Records of a topic-partition with start <= offset < end, in offset order (streamed in chunks)."""
        position = start
        while True:
            limit = chunk if end is None else min(chunk, end - position)
            if limit <= 0:
                return
            rows = self._db.execute(
                'SELECT "offset", key, value FROM records WHERE topic = ? AND "partition" = ? AND "offset" >= ? '
                'ORDER BY "offset" LIMIT ?',
                (topic, partition, position, limit),
            ).fetchall()
            for offset, key, value in rows:
                if end is not None and offset >= end:
                    return
                yield StoredRecord(topic, partition, offset, key, value)
            if len(rows) < limit:
                return
            position = rows[-1][0] + 1

    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next record of a topic-partition will get (Kafka's high watermark)."""
        return self._end_offset(topic, partition)

    def _end_offset(self, topic: str, partition: int) -> int:
        row = self._db.execute(
            'SELECT MAX("offset") FROM records WHERE topic = ? AND "partition" = ?', (topic, partition)
        ).fetchone()
        return 0 if row[0] is None else int(row[0]) + 1

    def count(self, topic: str, partition: int | None = None) -> int:
        """How many records a topic holds (in one partition or all)."""
        if partition is None:
            row = self._db.execute("SELECT COUNT(*) FROM records WHERE topic = ?", (topic,)).fetchone()
        else:
            row = self._db.execute(
                'SELECT COUNT(*) FROM records WHERE topic = ? AND "partition" = ?', (topic, partition)
            ).fetchone()
        return int(row[0])

    def topic_partitions(self, topic: str) -> list[int]:
        """The partitions of a topic that hold records (commands: every partition)."""
        if topic == self.topics.commands:
            return list(range(self.partitions))
        rows = self._db.execute(
            'SELECT DISTINCT "partition" FROM records WHERE topic = ? ORDER BY "partition"', (topic,)
        ).fetchall()
        return [int(row[0]) for row in rows]

    def positions(self) -> dict[tuple[str, str, int], int]:
        """Every stored consumer position: (group, topic, partition) -> next offset."""
        rows = self._db.execute('SELECT consumer_group, topic, "partition", next_offset FROM consumer_offsets')
        return {(group, topic, int(partition)): int(offset) for group, topic, partition, offset in rows}

    def lag(self) -> int:
        """Commands appended but not yet committed by this group, over all partitions."""
        return sum(
            self.end_offset(self.topics.commands, partition) - self._stored_position(partition)
            for partition in range(self.partitions)
        )
