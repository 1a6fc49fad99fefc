"""The embedded log as a :class:`processor.runtime.replica.ReplicaSource`: read-only, one handle per thread."""

from __future__ import annotations

import itertools
import os
import threading
import time

from gpufold.embedded_log import EmbeddedLog
from processor.runtime.loop import InputRecord
from schemas.topics import Topics


class EmbeddedReplicaSource:
    """Follows an embedded log file without writing to it (SQLite handles are per thread)."""

    def __init__(self, path: str | os.PathLike[str], topics: Topics | None = None, poll_interval: float = 0.05) -> None:
        self.path = path
        self.topics = topics or Topics()
        self.poll_interval = poll_interval
        self._local = threading.local()
        self._partitions = self._log().partitions

    def _log(self) -> EmbeddedLog:
        log = getattr(self._local, "log", None)
        if log is None:
            log = self._local.log = EmbeddedLog(self.path, readonly=True, topics=self.topics)
        return log

    def partition_count(self) -> int:
        return self._partitions

    def latest_snapshot(self, partition: int) -> bytes | None:
        return self._log().latest_snapshot(partition)

    def end_offsets(self) -> dict[int, int]:
        log = self._log()
        return {p: log.end_offset(self.topics.commands, p) for p in range(self._partitions)}

    def fetch(self, positions: dict[int, int], max_records: int, timeout: float) -> list[InputRecord]:
        log = self._log()
        deadline = time.monotonic() + timeout
        while True:
            records: list[InputRecord] = []
            for partition in sorted(positions):
                left = max_records - len(records)
                if left <= 0:
                    break
                rows = log.read(self.topics.commands, partition, positions[partition], None, chunk=min(left, 5_000))
                for row in itertools.islice(rows, left):
                    records.append(InputRecord(partition, row.offset, row.key, row.value))
            if records or time.monotonic() >= deadline:
                return records
            time.sleep(min(self.poll_interval, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        log = getattr(self._local, "log", None)
        if log is not None:
            log.close()
            self._local.log = None
