"""What flows through the projector: one event record (:class:`Envelope`), what a batch did
(:class:`BatchResult`), and the projector's two errors.

Kept apart from the projector so that the sources (``projections.sources``) and the runner can name
them without loading the staging and its handlers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.events import Event
from schemas.fastcodec import encode_event


class ProjectionError(Exception):
    """The events cannot be projected (a gap in a partition's sequence, an event about an unknown pod or node)."""


class ProjectionStopped(Exception):
    """A stop was asked for while the database was unavailable: the batch was not written (nothing is lost)."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """One record of the events topic: where it is, its frame, and the frame decoded.

    ``event`` is the frame decoded by :func:`schemas.fastcodec.decode_event` (the
    generated decoder builds the dataclasses directly, ~3x cheaper than fastavro's
    mappings), or None if the bytes did not decode. The projector keeps ``frame``
    verbatim in the audit log.
    """

    partition: int
    offset: int
    event: Event | None
    frame: bytes | None = None
    error: str = ""

    @classmethod
    def of(cls, event: Event, offset: int) -> Envelope:
        """An envelope for an in-process :class:`Event` (tests, benchmarks, the demo)."""
        return cls(event.partition, offset, event, encode_event(event))


@dataclass(slots=True)
class BatchResult:
    """What one batch did."""

    applied: int = 0
    duplicates: int = 0
    undecodable: int = 0
    sealed_hours: list[tuple[str, int]] = field(default_factory=list)
    last_occurred_at: int | None = None
    positions: dict[int, int] = field(default_factory=dict)  # partition -> next offset
    gpu_totals: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # changed: (allocated, capacity)
    pending: dict[str, int] = field(default_factory=dict)  # cluster -> pending pods, for clusters in the batch
