"""The embedded log: Kafka's semantics (topics, partitions, offsets, consumer positions) in one SQLite file.

The default backend, no servers: producers append command frames, the processor
loop (``processor.runtime.loop.Processor``) folds them through the same
:class:`~logs.port.CommandLog` interface it uses on Kafka.

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
- Damage is detected, never folded: every record carries a CRC-32 of its position,
  its bytes and ``prev``, the offset of the record before it in its partition, so a
  changed byte and a missing or duplicated row both fail the check when the record
  is read; each partition's end is recorded (``ends``) so records lost at the tail are
  noticed too; consumer positions and the meta rows carry a checksum too. SQLite's own errors
  (a zeroed page: "database disk image is malformed") become :class:`DamagedLogError`,
  one line. Records written before the checksums existed are read unchecked.
- What a read looks up by name, it checks when the log opens: every recorded end and
  committed position (a damaged row would else just not be found), and the schema's
  checksum columns (a log whose meta rows carry their checksum was written with them, so
  their absence is damage, not an old log). Text where the schema or a record holds
  bytes, or that does not decode, is damage too.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from logs.embedded_format import (
    BUSY_TIMEOUT_MS,
    CHECKED_COLUMNS,
    DEFAULT_GROUP,
    DEFAULT_PARTITIONS,
    FORMAT_VERSION,
    SCHEMA,
    DamagedLogError,
    FencedError,
    LogError,
    end_crc,
    meta_crc,
    position_crc,
    record_crc,
)
from logs.port import InputRecord, OutputRecord, Placement, StoredRecord
from schemas.partitioner import partition_for
from schemas.topics import Topics

__all__ = [
    "DEFAULT_GROUP",
    "DEFAULT_PARTITIONS",
    "DamagedLogError",
    "EmbeddedLog",
    "FencedError",
    "LogError",
    "StoredRecord",
    "record_crc",
]

_F = TypeVar("_F", bound=Callable[..., Any])


def _guarded(method: _F) -> _F:
    """SQLite errors become one LogError naming the file (DamagedLogError when SQLite says it is corrupt)."""

    @functools.wraps(method)
    def wrapper(self: EmbeddedLog, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.DatabaseError as error:
            raise self._damaged(error) from None
        except (ValueError, TypeError, OverflowError) as error:  # a value of the wrong type read back
            raise DamagedLogError(
                f"{self.path}: a value read from the log makes no sense ({error}): the file is damaged"
            ) from None

    return wrapper  # type: ignore[return-value]


class EmbeddedLog:
    """A :class:`~logs.port.CommandLog` on SQLite, plus the producer side (appends).

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
        shared: bool = False,
    ) -> None:
        """Open (or create) a log.

        ``partitions`` is the command partition count of a new log (default
        :data:`DEFAULT_PARTITIONS`); for an existing log it must match or be None.
        ``readonly`` opens without any write (replay, state, events). ``shared`` lets several threads
        use the handle, one at a time (the caller serialises them).
        """
        self.path = Path(path)
        self.group = group
        self.topics = topics or Topics()
        exists = self.path.exists() and self.path.stat().st_size > 0
        if not exists and (readonly or not create):
            raise LogError(f"no log at {self.path}")
        if exists and not self.path.is_file():
            raise LogError(f"{self.path} is not a file")
        try:
            if readonly:
                uri = f"{self.path.resolve().as_uri()}?mode=ro"
                self._db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=not shared)
            else:
                self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=not shared)
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            if not readonly:
                self._db.execute("PRAGMA journal_mode = WAL")
                self._db.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
                self._db.executescript(SCHEMA)
                self._refuse_lost_checksums()
                self._add_checksum_columns()
            else:
                self._refuse_lost_checksums()
            self._checked = self._has_checksum_columns()
            self._ends = self._checked and bool(
                self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ends'").fetchone()
            )
            if self._checked:
                self.positions()  # every committed position checked (a damaged row would else just not be found)
            if self._ends:
                self._check_ends()
            self.partitions = self._init_meta(partitions, readonly)
        except sqlite3.DatabaseError as error:
            raise LogError(f"{self.path} is not a usable gpufold log: {error}") from None
        except UnicodeDecodeError as error:  # text read back (a column's name or type) that is not UTF-8
            raise DamagedLogError(
                f"{self.path}: the log's schema text does not decode ({error}): the file is damaged"
            ) from None
        # Where poll() reads next, per partition; and the committed position this
        # handle last saw, per partition (the fencing check of commit()).
        self._fetch: dict[int, int] = {}
        self._seen_committed: dict[int, int] = {}
        self._next_poll_partition = 0
        self._last_read: dict[int, int] = {}  # partition -> offset of the last command record polled

    @property
    def _columns(self) -> str:
        return '"offset", key, value, prev, crc' if self._checked else '"offset", key, value, NULL, NULL'

    def _verified(
        self, topic: str, partition: int, rows: list[Any], start: int, last: int | None = None
    ) -> Iterator[tuple[int, bytes | None, bytes | None]]:
        """Rows (offset, key, value, prev, crc) read from ``start`` on, each checked against its checksum and its
        predecessor: a changed byte fails the CRC, a missing row breaks the chain of ``prev`` offsets."""
        for offset, key, value, prev, crc in rows:
            if (key is not None and type(key) is not bytes) or (value is not None and type(value) is not bytes):
                raise DamagedLogError(  # a flipped bit in a row's type: SQLite reads the blob back as text
                    f"{self.path}: record {topic}[{partition}]@{offset} holds text where bytes belong: "
                    "the file is damaged"
                )
            if crc is not None:
                if crc != record_crc(topic, partition, offset, prev, key, value):
                    raise DamagedLogError(
                        f"{self.path}: record {topic}[{partition}]@{offset} fails its checksum: the file is damaged"
                    )
                if (last is not None and prev != last) or (last is None and prev >= start):
                    raise DamagedLogError(
                        f"{self.path}: record {topic}[{partition}]@{prev} is missing (the record at {offset} follows "
                        "it): the file is damaged"
                    )
            last = offset
            yield offset, key, value

    def _stored_end(self, topic: str, partition: int) -> int | None:
        """The end recorded for a topic-partition (checked), or None for a log or partition written before it."""
        stored = self._stored_ends(topic, partition)
        return None if stored is None else stored[0]

    def _stored_ends(self, topic: str, partition: int) -> tuple[int, int] | None:
        """(next offset, record count) recorded for a topic-partition, checked; None if never recorded."""
        return self._with_ends("SELECT 1", (), topic, partition)[1]

    def _with_ends(
        self, query: str, params: tuple[Any, ...], topic: str, partition: int
    ) -> tuple[tuple[Any, ...] | None, tuple[int, int] | None]:
        """A query's first row (None if none) and the partition's recorded (end, count), in ONE statement.

        One statement reads one snapshot, so a writer committing between two separate reads can never make
        the records and their recorded end disagree (which would look like damage to a reader).
        """
        if not self._ends:
            return self._db.execute(query, params).fetchone(), None
        row = self._db.execute(
            f"SELECT q.*, e.next_offset, e.records, e.crc FROM (SELECT 1) AS one LEFT JOIN ({query}) AS q ON 1 "
            'LEFT JOIN ends AS e ON e.topic = ? AND e."partition" = ?',
            (*params, topic, partition),
        ).fetchone()
        found, (next_offset, records, crc) = row[:-3], row[-3:]
        first = None if all(value is None for value in found) else tuple(found)
        if next_offset is None:
            return first, None
        if crc != end_crc(topic, partition, next_offset, records):
            raise DamagedLogError(
                f"{self.path}: the end of {topic}[{partition}] fails its checksum: the file is damaged"
            )
        return first, (int(next_offset), int(records))

    def _check_ends(self) -> None:
        """Every recorded end checked when the log opens. A read looks its partition's end up by topic and
        partition, so a damaged row (its topic's text, say) would else just not be found, and a tail lost with it
        would go unnoticed (:meth:`_check_tail`). O(topics x partitions)."""
        for topic, partition, next_offset, records, crc in self._db.execute(
            'SELECT topic, "partition", next_offset, records, crc FROM ends'
        ):
            if crc != end_crc(topic, partition, next_offset, records):
                raise DamagedLogError(
                    f"{self.path}: a recorded end ({topic!r}) fails its checksum: the file is damaged"
                )

    def _check_tail(self, topic: str, partition: int, start: int, last: int | None, end: int | None) -> None:
        """After reading [start, end) (end None: to the end), with ``last`` the last offset read: nothing skipped.

        The first record at or after where the read stopped must point back at ``last``; with none, the
        recorded end must be right after it. So records lost from the tail of a range are noticed.
        """
        if not self._checked:
            return
        after = (last + 1 if last is not None else start) if end is None else max(end, start)
        row, ends = self._with_ends(
            'SELECT "offset", prev FROM records WHERE topic = ? AND "partition" = ? AND "offset" >= ? '
            'ORDER BY "offset" LIMIT 1',
            (topic, partition, after),
            topic,
            partition,
        )
        expected_prev = last if last is not None else None
        if row is not None and row[1] is not None:
            if (expected_prev is not None and row[1] != expected_prev) or (expected_prev is None and row[1] >= start):
                raise DamagedLogError(
                    f"{self.path}: record {topic}[{partition}]@{row[1]} is missing (the record at {row[0]} follows "
                    "it): the file is damaged"
                )
            return
        if row is None:
            stored = None if ends is None else ends[0]
            reached = last + 1 if last is not None else start
            if stored is not None and stored > reached and (end is None or end > reached):
                raise DamagedLogError(
                    f"{self.path}: {topic}[{partition}] ends at {stored} but its records stop at {reached}: "
                    "the file is damaged"
                )

    def _write_ends(self, topic: str, ends: dict[int, int], added: dict[int, int]) -> None:
        """Record each partition's new end and record count after ``added[partition]`` records were inserted."""
        rows = []
        for partition, end in ends.items():
            stored = self._stored_ends(topic, partition)
            if stored is None:  # first time (a log written before ends existed): count what is there
                count = self._db.execute(
                    'SELECT COUNT(*) FROM records WHERE topic = ? AND "partition" = ?', (topic, partition)
                ).fetchone()[0]
            else:
                count = stored[1] + added[partition]
            rows.append((topic, partition, end, count, end_crc(topic, partition, end, count)))
        self._db.executemany(
            'INSERT INTO ends (topic, "partition", next_offset, records, crc) VALUES (?, ?, ?, ?, ?) '
            'ON CONFLICT (topic, "partition") DO UPDATE SET next_offset = excluded.next_offset, '
            "records = excluded.records, crc = excluded.crc",
            rows,
        )

    def _damaged(self, error: BaseException) -> LogError:
        if isinstance(error, sqlite3.OperationalError):  # locked, read-only, I/O: the file may well be fine
            return LogError(f"{self.path}: {error}")
        return DamagedLogError(f"{self.path}: the log cannot be read, it is damaged: {error}")

    def _has_checksum_columns(self) -> bool:
        columns = {
            (table, row[1].lower()) for table in ("records", "consumer_offsets")  # SQLite's names ignore case
            for row in self._db.execute(f"PRAGMA table_info({table})")
        }  # fmt: skip
        return all(column in columns for column in CHECKED_COLUMNS)

    def _refuse_lost_checksums(self) -> None:
        """A log whose meta rows carry their checksum was written with the checksum columns (both came in one
        release, and a writable open adds both): if its schema no longer names them, the schema's text is
        damaged, and its records would be read unchecked. O(1)."""
        if self._has_checksum_columns():
            return
        if self._db.execute("SELECT 1 FROM meta WHERE name = 'check'").fetchone():
            raise DamagedLogError(f"{self.path}: the log's schema lost its checksum columns: the file is damaged")

    def _add_checksum_columns(self) -> None:
        """A log written before the checksums gets the columns (its old rows stay unchecked)."""
        for table, column in CHECKED_COLUMNS:
            names = {row[1].lower() for row in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in names:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} INTEGER")

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
                written = dict(self._db.execute("SELECT name, value FROM meta").fetchall())
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('check', ?)", (meta_crc(written),))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            meta = dict(self._db.execute("SELECT name, value FROM meta").fetchall())
        elif "check" not in meta and not readonly and meta.get("format") == FORMAT_VERSION:
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('check', ?)", (meta_crc(meta),))
            meta["check"] = meta_crc(meta)
        if "check" in meta and meta["check"] != meta_crc(meta):
            raise DamagedLogError(f"{self.path}: the log's meta rows fail their checksum: the file is damaged")
        if meta.get("format") != FORMAT_VERSION:
            raise LogError(f"{self.path}: log format {meta.get('format')!r}, this gpufold reads {FORMAT_VERSION!r}")
        try:
            stored = int(meta["partitions"])
        except (KeyError, ValueError):
            raise DamagedLogError(f"{self.path}: no valid partition count in the log's meta rows") from None
        if stored < 1:
            raise DamagedLogError(f"{self.path}: partition count {stored} in the log's meta rows")
        if partitions is not None and partitions != stored:
            raise LogError(f"{self.path} has {stored} command partition(s), not {partitions}")
        row = self._db.execute(
            'SELECT MAX("partition") FROM records WHERE topic = ?', (self.topics.commands,)
        ).fetchone()
        if row[0] is not None and not 0 <= int(row[0]) < stored:
            raise DamagedLogError(f"{self.path}: a command record in partition {row[0]} of a {stored}-partition log")
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

    @_guarded
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

    @_guarded
    def import_records(self, records: Iterable[StoredRecord], batch_size: int = 10_000) -> int:
        """Store records at their given offsets (import of an export; gaps are kept). Returns the count.

        Refuses records at an offset that is already taken (the whole batch rolls back).
        """
        total = 0
        batch: list[tuple[str, int, int, bytes | None, bytes | None, int, int]] = []
        previous: dict[tuple[str, int], int] = {}

        def flush() -> None:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    'INSERT INTO records (topic, "partition", "offset", key, value, prev, crc) '
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    batch,
                )
                by_topic: dict[str, tuple[dict[int, int], dict[int, int]]] = {}
                for topic, partition, offset, *_ in batch:
                    ends, added = by_topic.setdefault(topic, ({}, {}))
                    ends[partition] = offset + 1
                    added[partition] = added.get(partition, 0) + 1
                for topic, (ends, added) in by_topic.items():
                    self._write_ends(topic, ends, added)
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
            where = (record.topic, record.partition)
            prev = previous.get(where)
            if prev is None:
                prev = self._end_offset(record.topic, record.partition) - 1
            if record.offset <= prev:
                raise LogError(
                    f"{self.path}: offset already taken while importing {record.topic}[{record.partition}]@"
                    f"{record.offset} (records are imported in offset order, each offset once)"
                )
            previous[where] = record.offset
            crc = record_crc(record.topic, record.partition, record.offset, prev, record.key, record.value)
            batch.append((*record, prev, crc))
            total += 1
            if len(batch) >= batch_size:
                flush()
        if batch:
            flush()
        return total

    @_guarded
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
            prev = offset - 1  # dense: the record before is the one at offset - 1 (or none: -1)
            rows.append(
                (topic, partition, offset, key, value, prev, record_crc(topic, partition, offset, prev, key, value))
            )
            placed.append((partition, offset))
        self._db.executemany(
            'INSERT INTO records (topic, "partition", "offset", key, value, prev, crc) VALUES (?, ?, ?, ?, ?, ?, ?)',
            rows,
        )
        added: dict[int, int] = {}
        for partition, _ in placed:
            added[partition] = added.get(partition, 0) + 1
        self._write_ends(topic, next_offsets, added)
        return placed

    # ------------------------------------------------------------ CommandLog

    def assignment(self) -> list[int]:
        """Every command partition: the embedded log has one processor per file."""
        return list(range(self.partitions))

    def placement(self, partition: int) -> Placement:
        """Kafka's check, on the file's own partition count (fixed when the file was made, so it never changes): a
        command appended or imported onto a partition that is not murmur2(cluster) mod that count, or keyed
        other than its cluster, is dead-lettered (WRONG_PARTITION), never folded."""
        return Placement(self.partitions)

    @_guarded
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
                f'SELECT {self._columns} FROM records WHERE topic = ? AND "partition" = ? AND "offset" >= ? '
                'ORDER BY "offset" LIMIT ?',
                (self.topics.commands, partition, position, max_records - len(records)),
            ).fetchall()
            topic = self.topics.commands
            if rows:
                records.extend(
                    InputRecord(partition, offset, key, value)
                    for offset, key, value in self._verified(topic, partition, rows, position)
                )
                self._fetch[partition] = rows[-1][0] + 1
            if len(rows) < max_records - (len(records) - len(rows)):  # read to the end: nothing may be missing
                self._check_tail(topic, partition, position, rows[-1][0] if rows else None, None)
        return records

    def seek(self, partition: int, offset: int) -> None:
        """Make the next poll of a partition start at ``offset``."""
        self._fetch[partition] = offset

    @_guarded
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
            'INSERT INTO consumer_offsets (consumer_group, topic, "partition", next_offset, crc) '
            "VALUES (?, ?, ?, ?, ?) "
            'ON CONFLICT (consumer_group, topic, "partition") DO UPDATE SET next_offset = excluded.next_offset, '
            "crc = excluded.crc",
            [
                (self.group, topic, partition, offset, position_crc(self.group, topic, partition, offset))
                for partition, offset in positions.items()
            ],
        )

    def _checked_position(self, group: str, topic: str, partition: int, offset: int, crc: int | None) -> int:
        if crc is not None and crc != position_crc(group, topic, partition, offset):
            raise DamagedLogError(
                f"{self.path}: the position of group {group} on {topic}[{partition}] fails its checksum: "
                "the file is damaged"
            )
        if offset < 0:
            raise DamagedLogError(f"{self.path}: negative position {offset} of group {group} on {topic}[{partition}]")
        return int(offset)

    def _stored_position(self, partition: int) -> int:
        crc = "crc" if self._checked else "NULL"
        row = self._db.execute(
            f"SELECT next_offset, {crc} FROM consumer_offsets "
            'WHERE consumer_group = ? AND topic = ? AND "partition" = ?',
            (self.group, self.topics.commands, partition),
        ).fetchone()
        if not row:
            return 0
        return self._checked_position(self.group, self.topics.commands, partition, int(row[0]), row[1])

    @_guarded
    def committed(self, partition: int) -> int:
        """This group's committed next offset on a command partition (0 if none)."""
        position = self._stored_position(partition)
        self._seen_committed[partition] = position
        return position

    @_guarded
    def latest_snapshot(self, partition: int) -> bytes | None:
        row = self._db.execute(
            f'SELECT {self._columns} FROM records WHERE topic = ? AND "partition" = ? ORDER BY "offset" DESC LIMIT 1',
            (self.topics.snapshots, partition),
        ).fetchone()
        if not row:
            return None
        ((_, _, value),) = self._verified(self.topics.snapshots, partition, [row], start=row[0] + 1, last=row[3])
        return bytes(value) if value is not None else None

    @_guarded
    def check_restored(self, partition: int, sequence: int) -> None:
        """After a restore: the events topic must end with the event the restored state says came last.

        The processor publishes a partition's events in sequence order in the same transaction as its
        position, so an events topic that ends before the restored sequence lost rows: a damaged file.
        (A position that went back is caught by its own checksum.)
        """
        from schemas import DecodeError
        from schemas.fastcodec import decode_event

        topic = self.topics.events
        row = self._db.execute(
            f'SELECT {self._columns} FROM records WHERE topic = ? AND "partition" = ? ORDER BY "offset" DESC LIMIT 1',
            (topic, partition),
        ).fetchone()
        if row is None:
            last = -1
        else:
            ((offset, _, value),) = self._verified(topic, partition, [row], start=row[0] + 1, last=row[3])
            try:
                last = decode_event(value).sequence  # type: ignore[arg-type]
            except DecodeError:
                raise DamagedLogError(f"{self.path}: event {topic}[{partition}]@{offset} does not decode") from None
        if last < sequence - 1:  # more is fine: a processor may have committed since the position was read
            raise DamagedLogError(
                f"{self.path}: partition {partition}'s committed position accounts for {sequence} event(s) but the "
                f"events topic ends at sequence {last}: the file is damaged"
            )

    def read_commands(self, partition: int, start: int, end: int) -> Iterator[InputRecord]:
        for record in self.read(self.topics.commands, partition, start, end):
            yield InputRecord(partition, record.offset, record.key, record.value)

    # ------------------------------------------------------------ reading any topic

    def read(
        self, topic: str, partition: int, start: int = 0, end: int | None = None, chunk: int = 5_000
    ) -> Iterator[StoredRecord]:
        """Records of a topic-partition with start <= offset < end, in offset order (streamed in chunks).

        Each record is checked (see :meth:`_verified`); a damaged one raises :class:`DamagedLogError`.
        """
        position = start
        last: int | None = None
        while True:
            limit = chunk if end is None else min(chunk, end - position)
            if limit <= 0:
                return
            try:
                rows = self._db.execute(
                    f'SELECT {self._columns} FROM records WHERE topic = ? AND "partition" = ? AND "offset" >= ? '
                    'ORDER BY "offset" LIMIT ?',
                    (topic, partition, position, limit),
                ).fetchall()
            except sqlite3.DatabaseError as error:
                raise self._damaged(error) from None
            try:
                rows = [(int(o), k, v, None if q is None else int(q), c) for o, k, v, q, c in rows]
            except (ValueError, TypeError) as error:
                raise DamagedLogError(
                    f"{self.path}: {topic}[{partition}] holds a value that makes no sense ({error})"
                ) from None
            for offset, key, value in self._verified(topic, partition, rows, start, last):
                if end is not None and offset >= end:
                    return
                last = offset
                yield StoredRecord(topic, partition, offset, key, value)
            if len(rows) < limit or (end is not None and rows[-1][0] + 1 >= end):
                try:
                    self._check_tail(topic, partition, start, last, end)
                except sqlite3.DatabaseError as error:
                    raise self._damaged(error) from None
                return
            position = rows[-1][0] + 1

    @_guarded
    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next record of a topic-partition will get (Kafka's high watermark)."""
        return self._end_offset(topic, partition)

    def _end_offset(self, topic: str, partition: int) -> int:
        row, ends = self._with_ends(
            'SELECT MAX("offset") FROM records WHERE topic = ? AND "partition" = ?',
            (topic, partition),
            topic,
            partition,
        )
        found = 0 if row is None or row[0] is None else int(row[0]) + 1
        stored = None if ends is None else ends[0]
        if stored is not None and stored != found:
            raise DamagedLogError(
                f"{self.path}: {topic}[{partition}] ends at {stored} but its last record is at {found - 1}: "
                "the file is damaged"
            )
        return found

    @_guarded
    def count(self, topic: str, partition: int | None = None) -> int:
        """How many records a topic holds (in one partition or all), checked against the recorded counts."""
        total = 0
        for p in self.topic_partitions(topic) if partition is None else [partition]:
            row, stored = self._with_ends(
                'SELECT COUNT(*) FROM records WHERE topic = ? AND "partition" = ?', (topic, p), topic, p
            )
            row = row or (0,)
            if stored is not None and stored[1] != int(row[0]):
                raise DamagedLogError(
                    f"{self.path}: {topic}[{p}] holds {row[0]} record(s) but {stored[1]} were written: "
                    "the file is damaged"
                )
            total += int(row[0])
        return total

    @_guarded
    def topic_partitions(self, topic: str) -> list[int]:
        """The partitions of a topic that hold records (commands: every partition)."""
        if topic == self.topics.commands:
            return list(range(self.partitions))
        query = 'SELECT DISTINCT "partition", 0 FROM records WHERE topic = ?'
        params: tuple[Any, ...] = (topic,)
        if self._ends:  # one statement, one snapshot: a concurrent append cannot look like a lost partition
            query += ' UNION ALL SELECT "partition", 1 FROM ends WHERE topic = ? AND records > 0'
            params = (topic, topic)
        rows = self._db.execute(query, params).fetchall()
        found = {row[0] for row in rows if row[1] == 0}
        recorded = {row[0] for row in rows if row[1] == 1}
        if not all(isinstance(p, int) and p >= 0 for p in found | recorded) or not recorded <= found:
            raise DamagedLogError(
                f"{self.path}: the partitions of {topic} are not what was written: the file is damaged"
            )
        return sorted(found)

    @_guarded
    def positions(self) -> dict[tuple[str, str, int], int]:
        """Every stored consumer position: (group, topic, partition) -> next offset."""
        crc = "crc" if self._checked else "NULL"
        rows = self._db.execute(f'SELECT consumer_group, topic, "partition", next_offset, {crc} FROM consumer_offsets')
        return {
            (group, topic, int(partition)): self._checked_position(group, topic, int(partition), int(offset), check)
            for group, topic, partition, offset, check in rows
        }

    @_guarded
    def lag(self) -> int:
        """Commands appended but not yet committed by this group, over all partitions."""
        return sum(
            self.end_offset(self.topics.commands, partition) - self._stored_position(partition)
            for partition in range(self.partitions)
        )
