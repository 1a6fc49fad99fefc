"""Where the projector reads events: the Kafka events topic, or the embedded log's SQLite file.

Both read through their backend's one reader in ``logs/`` (:mod:`logs.kafka_reader`,
:mod:`logs.embedded_reader`, which checks every record's CRC) and decode what it returns.
Both sources start each partition at the position stored in the database
(``projection_offsets.next_offset``), never at a position the log remembers:
the database is the only record of what was applied. Kafka is read with
``isolation.level=read_committed``, so events of aborted processor transactions
are never seen. A record whose bytes do not decode becomes an
:class:`~projections.envelope.Envelope` with ``event=None`` (the projector
counts it, logs it and moves past it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from logs.embedded_reader import EmbeddedTopicReader
from logs.kafka_reader import KafkaTopicReader
from projections.defaults import DEFAULT_GROUP, DEFAULT_TOPIC
from projections.envelope import Envelope
from schemas import DecodeError
from schemas.fastcodec import decode_event

log = logging.getLogger("gpufold.projector.sources")


class EventSource(Protocol):
    """What the projector loop needs from a log of events."""

    name: str  # the key of this source in projection_offsets (the topic name)

    def start(self, positions: Callable[[], dict[int, int]]) -> None:
        """Begin reading; ``positions()`` gives partition -> next offset from the database."""
        ...

    def poll(self, max_records: int, timeout: float) -> list[Envelope]:
        """The next records, in offset order per partition (empty when nothing is ready)."""
        ...

    def caught_up(self) -> bool:
        """Whether every partition has been read to its end (or to its ``until`` bound)."""
        ...

    def lag(self) -> int | None:
        """Records not yet read, over all partitions (None if unknown)."""
        ...

    def close(self) -> None: ...


class Decoder:
    """Event frames -> :class:`Envelope`, never raising on bad bytes.

    Uses the generated :func:`schemas.fastcodec.decode_event` (the dataclasses straight
    from the bytes, raising only DecodeError; frames of older writer schemas take the
    fastavro path inside it).
    """

    def __call__(self, partition: int, offset: int, value: bytes | None) -> Envelope:
        if value is None:
            return Envelope(partition, offset, None, None, "empty record")
        try:
            return Envelope(partition, offset, decode_event(value), value)
        except DecodeError as error:
            return Envelope(partition, offset, None, value, str(error))


# ------------------------------------------------------------------ embedded log


class EmbeddedEventSource:
    """The events topic of an embedded log file, read-only and checked (:mod:`logs.embedded_reader`).

    A damaged topic (a record failing its checksum, records lost from a page) stops the projector with
    one :class:`~logs.embedded_format.DamagedLogError` line instead of being projected; a missing file is
    a :class:`~logs.embedded_format.LogError`.
    """

    def __init__(self, path: str | Path, topic: str = DEFAULT_TOPIC, until: dict[int, int] | None = None) -> None:
        self._reader = EmbeddedTopicReader(path, topic, until)
        self.name = topic
        self.until = until
        self._decode = Decoder()

    def start(self, positions: Callable[[], dict[int, int]]) -> None:
        self._reader.start(positions)

    def poll(self, max_records: int, timeout: float) -> list[Envelope]:
        decode = self._decode
        return [decode(r.partition, r.offset, r.value) for r in self._reader.poll(max_records)]

    def caught_up(self) -> bool:
        return self._reader.caught_up()

    def lag(self) -> int | None:
        return self._reader.lag()

    def close(self) -> None:
        self._reader.close()


# ------------------------------------------------------------------ Kafka


class KafkaEventSource:
    """The events topic on Kafka (:mod:`logs.kafka_reader`), read with a consumer group (or all partitions
    assigned, for rebuilds)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str = DEFAULT_TOPIC,
        *,
        group: str = DEFAULT_GROUP,
        until: dict[int, int] | None = None,
        assign_all: bool = False,
        extra_config: dict[str, Any] | None = None,
    ) -> None:
        self._reader = KafkaTopicReader(
            bootstrap, topic, group=group, until=until, assign_all=assign_all, extra_config=extra_config
        )
        self.name = topic
        self.until = until
        self._decode = Decoder()

    @property
    def assign_all(self) -> bool:
        return self._reader.assign_all

    def start(self, positions: Callable[[], dict[int, int]]) -> None:
        self._reader.start(positions)

    def poll(self, max_records: int, timeout: float) -> list[Envelope]:
        decode = self._decode
        return [decode(r.partition, r.offset, r.value) for r in self._reader.poll(max_records, timeout)]

    def committed(self, positions: dict[int, int]) -> None:
        """Tell Kafka too (best effort, for lag tooling); the database stays the source of truth."""
        self._reader.committed(positions)

    def caught_up(self) -> bool:
        return self._reader.caught_up()

    def lag(self) -> int | None:
        return self._reader.lag()

    def close(self) -> None:
        self._reader.close()
