"""The projector's source over an embedded log, read through :class:`~gpufold.embedded_log.EmbeddedLog`'s checks.

``projections.sources.EmbeddedEventSource`` reads the file with plain SQL (the read
side may not import the CLI's log). The CLI uses this one instead, so that a damaged
events topic (a record failing its checksum, records lost from a page) stops the
projector with one clear line instead of being projected.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from pathlib import Path

from gpufold.embedded_log import EmbeddedLog
from projections.projector import Envelope
from projections.sources import DEFAULT_TOPIC, Decoder


class CheckedEmbeddedEventSource:
    """The events topic of an embedded log file, read-only and checked (an ``EventSource``)."""

    def __init__(self, path: str | Path, topic: str = DEFAULT_TOPIC, until: dict[int, int] | None = None) -> None:
        self._log = EmbeddedLog(path, readonly=True, shared=True)  # LogError if missing or not a log
        self.name = topic
        self.until = until
        self._lock = threading.Lock()  # the runner polls from its reader thread, asks for lag from the main one
        self._decode = Decoder()
        self._next: dict[int, int] = {}
        self._done: set[int] = set()

    def start(self, positions: Callable[[], dict[int, int]]) -> None:
        stored = positions()
        with self._lock:
            for partition in self._log.topic_partitions(self.name):
                self._next[partition] = stored.get(partition, 0)
            for partition, offset in stored.items():
                self._next.setdefault(partition, offset)

    def poll(self, max_records: int, timeout: float) -> list[Envelope]:
        with self._lock:
            for partition in self._log.topic_partitions(self.name):  # partitions that appeared since start
                self._next.setdefault(partition, 0)
            out: list[Envelope] = []
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
                records = list(itertools.islice(self._log.read(self.name, partition, start, end), limit))
                out.extend(self._decode(partition, r.offset, r.value) for r in records)
                if records:
                    self._next[partition] = records[-1].offset + 1
                if len(records) < limit:
                    self._done.add(partition)
            return out

    def caught_up(self) -> bool:
        with self._lock:
            return all(p in self._done for p in self._next)

    def lag(self) -> int | None:
        with self._lock:
            return sum(
                max(0, self._log.end_offset(self.name, partition) - position)
                for partition, position in list(self._next.items())
            )

    def close(self) -> None:
        with self._lock:
            self._log.close()
