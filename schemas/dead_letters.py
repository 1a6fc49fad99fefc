"""The dead-letter record of ``dead_letter.avsc``: a command record not folded (bytes that did not decode, or a
command on the wrong partition), kept with where and why."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.codec import DEAD_LETTER, registry
from schemas.records import Record


@dataclass(slots=True)
class DeadLetter(Record):
    topic: str
    partition: int
    offset: int
    error: str
    key: bytes | None = None
    value: bytes | None = None
    code: str | None = None
    """A :class:`~schemas.codes.DeadLetterCode` when a decoded command was refused; None for undecodable bytes."""


def encode_dead_letter(letter: DeadLetter) -> bytes:
    return registry().codec(DEAD_LETTER).encode(letter.to_avro())


def decode_dead_letter(frame: bytes) -> DeadLetter:
    """A dead letter from its frame; raises ``DecodeError`` if malformed."""
    return DeadLetter.from_avro(registry().codec(DEAD_LETTER).decode(frame))
