"""The embedded log as a :class:`logs.port.ReplicaSource`: read-only, one checked reader per thread."""

from __future__ import annotations

import os
import threading
import time

from logs.embedded import EmbeddedLog
from logs.embedded_reader import EmbeddedTopicReader
from logs.port import InputRecord
from schemas.topics import Topics


class EmbeddedReplicaSource:
    """Follows an embedded log file without writing to it (SQLite handles are per thread)."""

    def __init__(self, path: str | os.PathLike[str], topics: Topics | None = None, poll_interval: float = 0.05) -> None:
        self.path = path
        self.topics = topics or Topics()
        self.poll_interval = poll_interval
        self._local = threading.local()
        self._partitions = self._log().partitions

    def _reader(self) -> EmbeddedTopicReader:
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = self._local.reader = EmbeddedTopicReader(self.path, self.topics.commands, topics=self.topics)
        return reader

    def _log(self) -> EmbeddedLog:
        return self._reader().log

    def partition_count(self) -> int:
        return self._partitions

    def latest_snapshot(self, partition: int) -> bytes | None:
        return self._log().latest_snapshot(partition)

    def end_offsets(self) -> dict[int, int]:
        log = self._log()
        return {p: log.end_offset(self.topics.commands, p) for p in range(self._partitions)}

    def fetch(self, positions: dict[int, int], max_records: int, timeout: float) -> list[InputRecord]:
        reader = self._reader()
        deadline = time.monotonic() + timeout
        while True:
            reader.seek(positions)
            rows = reader.poll(max_records, follow_new_partitions=False)
            records = [InputRecord(row.partition, row.offset, row.key, row.value) for row in rows]
            if records or time.monotonic() >= deadline:
                return records
            time.sleep(min(self.poll_interval, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        reader = getattr(self._local, "reader", None)
        if reader is not None:
            reader.close()
            self._local.reader = None
