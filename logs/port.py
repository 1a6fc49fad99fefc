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


@dataclass(frozen=True, slots=True)
class Placement:
    """Which commands a partition may fold: those whose record key is their cluster's name and whose partition is
    murmur2(cluster) mod ``partitions`` (the commands topic's partition count), from offset ``checked_from`` on.

    Anything else would be folded into a second, divergent state of its cluster (the same node twice, the same pod
    running twice), so the processor dead-letters it with code ``WRONG_PARTITION``. Commands before
    ``checked_from`` were folded by a processor that did not check (a log older than the check): a re-fold folds
    them as it did.
    """

    partitions: int
    checked_from: int = 0


class PartitionCountChanged(RuntimeError):
    """The commands topic's partition count differs from the one recorded when the processor first ran:
    clusters map to other partitions now, and folding on would split their states. Not retried."""


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

    def placement(self, partition: int) -> Placement:
        """The partition's :class:`Placement`; raises :class:`PartitionCountChanged` if the commands topic's
        partition count is not the one recorded when the processor first ran."""
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
