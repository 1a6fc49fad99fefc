"""The one checked reader of an embedded log's topic: what the projector and the replica read through.

Every record comes from :meth:`logs.embedded.EmbeddedLog.read`, so a damaged topic (a record failing its
checksum, records lost from a page or from the tail) raises :class:`~logs.embedded_format.DamagedLogError`
with one clear line instead of being handed on. Nothing outside ``logs/`` reads the log's tables.

A reader keeps a next position per partition (set from outside with :meth:`EmbeddedTopicReader.start` or
:meth:`EmbeddedTopicReader.seek`), reads up to an optional ``until`` bound per partition, and may be used from
several threads (one lock): the projector polls from its reader thread and asks for the lag from the main one.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable

from logs.embedded import EmbeddedLog
from logs.port import StoredRecord
from schemas.topics import Topics


class EmbeddedTopicReader:
    """One topic of an embedded log file, read-only and checked."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        topic: str,
        until: dict[int, int] | None = None,
        *,
        topics: Topics | None = None,
    ) -> None:
        self.log = EmbeddedLog(path, readonly=True, shared=True, topics=topics)  # LogError if missing or not a log
        self.topic = topic
        self.until = until
        self._lock = threading.Lock()
        self._next: dict[int, int] = {}
        self._done: set[int] = set()

    def start(self, positions: Callable[[], dict[int, int]]) -> None:
        """Begin at ``positions()`` (partition -> next offset); partitions it does not name start at 0."""
        stored = positions()
        with self._lock:
            for partition in self.log.topic_partitions(self.topic):
                self._next[partition] = stored.get(partition, 0)
            for partition, offset in stored.items():
                self._next.setdefault(partition, offset)

    def seek(self, positions: dict[int, int]) -> None:
        """Read exactly these partitions from these offsets from now on."""
        with self._lock:
            self._next = dict(positions)
            self._done.clear()

    def poll(self, max_records: int, *, follow_new_partitions: bool = True) -> list[StoredRecord]:
        """Up to ``max_records`` records, in offset order per partition, partitions in order."""
        with self._lock:
            if follow_new_partitions:
                for partition in self.log.topic_partitions(self.topic):  # partitions that appeared since start
                    self._next.setdefault(partition, 0)
            out: list[StoredRecord] = []
            self._done.clear()
            for partition in sorted(self._next):
                start = self._next[partition]
                limit = max_records - len(out)
                end = None if self.until is None else self.until.get(partition, 0)
                if end is not None:
                    limit = min(limit, end - start)
                if limit <= 0:
                    if end is not None and start >= end:
                        self._done.add(partition)
                    continue
                records = list(
                    itertools.islice(self.log.read(self.topic, partition, start, end, min(limit, 5_000)), limit)
                )
                out.extend(records)
                if records:
                    self._next[partition] = records[-1].offset + 1
                if len(records) < limit:
                    self._done.add(partition)
            return out

    def caught_up(self) -> bool:
        """Whether the last poll read every partition to its end (or to its ``until`` bound)."""
        with self._lock:
            return all(p in self._done for p in self._next)

    def lag(self) -> int:
        """Records not yet read, over all partitions."""
        with self._lock:
            return sum(
                max(0, self.log.end_offset(self.topic, partition) - position)
                for partition, position in list(self._next.items())
            )

    def close(self) -> None:
        with self._lock:
            self.log.close()
