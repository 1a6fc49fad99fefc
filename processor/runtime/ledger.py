"""Which command ids the log already holds, where, and with what body: the write API's idempotent retry.

A sender that retries a command (same ``command_id``) must get the first attempt's outcome, and only a
different body under the same id is a conflict. The fold answers a repeated id with
``DUPLICATE_COMMAND``; the write API answers before appending, from this ledger: the replica records
every command it folds (``command_id -> partition, offset, digest``), the server every command it
appends. The digest covers the cluster and the payload, not the envelope's ``issued_at`` or
``source``, which a retry may fill in anew.

Bounded like the fold's own idempotency window (oldest forgotten first), so a retry older than the
window is a new command, for the ledger as for the fold.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from schemas.commands import Command

DEFAULT_SIZE = 100_000
_HEADER = 10  # the single-object encoding's marker (2 bytes) and writer-schema fingerprint (8 bytes)


@dataclass(frozen=True, slots=True)
class Entry:
    partition: int
    offset: int | None  # None: appended to Kafka, offset known once folded
    digest: bytes


def _varint(frame: bytes, at: int) -> tuple[int, int]:
    """An Avro long (zig-zag varint) at ``at``: (value, the position after it)."""
    shift = result = 0
    while True:
        byte = frame[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at
        shift += 7


def frame_digest(frame: bytes) -> bytes:
    """The digest of a command frame's cluster and payload, read past the envelope without decoding it.

    The envelope is ``command_id, cluster, issued_at, source`` then the payload union
    (``schemas/command.avsc``), so the payload is the frame's tail. O(1) besides hashing the tail.
    """
    length, at = _varint(frame, _HEADER)
    length, at = _varint(frame, at + length)  # past command_id: cluster's length
    cluster = frame[at : at + length]
    _, at = _varint(frame, at + length)  # past cluster: issued_at
    length, at = _varint(frame, at)  # source
    payload = frame[at + length :]
    return hashlib.blake2b(cluster + b"\0" + payload, digest_size=16).digest()


class CommandLedger:
    """``command_id -> Entry``, the first occurrence kept, bounded (see the module docstring). Not thread-safe:
    its owner locks."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.size = size
        self._entries: OrderedDict[str, Entry] = OrderedDict()

    def record(self, command_id: str, entry: Entry) -> None:
        """Remember the first occurrence of an id; a later one with a known offset completes it."""
        known = self._entries.get(command_id)
        if known is not None:
            if known.offset is None and entry.offset is not None and known.partition == entry.partition:
                self._entries[command_id] = entry
            return
        self._entries[command_id] = entry
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def get(self, command_id: str) -> Entry | None:
        return self._entries.get(command_id)

    def __len__(self) -> int:
        return len(self._entries)


def command_digest(command: Command, encode: Callable[[Command], bytes]) -> bytes:
    """The digest of a command as the current contract encodes it (for a request, or an older frame)."""
    return frame_digest(encode(command))
