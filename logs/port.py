"""The port to a log of commands: what the processor and a replica need from a backend, and the records they pass.

Two backends implement it: the embedded log (:mod:`logs.embedded`, one SQLite file) and Kafka
(:mod:`logs.kafka`). A :class:`CommandLog` is what a processor folds from and commits to; a
:class:`ReplicaSource` is a read-only view of the same commands (:mod:`logs.embedded_replica`,
:mod:`logs.kafka_replica`). Nothing here knows a backend.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from schemas.topics import Topics


class StoredRecord(NamedTuple):
    """A record as stored: where it is and its bytes."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class InputRecord:
    """A record read from the commands topic."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(slots=True)
class OutputRecord:
    """A record to produce: an event, a dead letter or a snapshot."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes


class CommandLog(Protocol):
    """What the processor needs from a log (one implementation per backend).

    ``commit`` must be atomic: the outputs become visible to readers together
    with the new consumer positions, or not at all.
    """

    topics: Topics

    def assignment(self) -> list[int]:
        """The command partitions this processor owns now."""
        ...

    def poll(self, max_records: int, timeout: float) -> list[InputRecord]:
        """The next command records of the owned partitions, in offset order per partition."""
        ...

    def commit(self, outputs: list[OutputRecord], positions: dict[int, int]) -> None:
        """Atomically publish outputs and set each partition's next offset to fold."""
        ...

    def committed(self, partition: int) -> int:
        """The committed next offset of a partition (0 if none)."""
        ...

    def latest_snapshot(self, partition: int) -> bytes | None:
        """The newest snapshot frame written for a partition, if any."""
        ...

    def read_commands(self, partition: int, start: int, end: int) -> Iterator[InputRecord]:
        """Command records with start <= offset < end (committed ones only)."""
        ...


class ReplicaSource(Protocol):
    """Read-only access to a command log (one implementation per backend)."""

    topics: Topics

    def partition_count(self) -> int:
        """How many command partitions the log has (decides a cluster's partition)."""
        ...

    def latest_snapshot(self, partition: int) -> bytes | None:
        """The newest snapshot frame of a partition, if any."""
        ...

    def end_offsets(self) -> dict[int, int]:
        """The head of each command partition: the offset the next command will get."""
        ...

    def fetch(self, positions: dict[int, int], max_records: int, timeout: float) -> list[InputRecord]:
        """Command records at or after each partition's position, in offset order per partition."""
        ...

    def close(self) -> None: ...
