"""Avro binary primitives the generated codec (``schemas/fastcodec_generated.py``) calls, and its slow paths.

Varint tables and writers, the errors of a malformed body, and the fastavro path that frames of any
other writer schema take. Kept apart from the generator (``schemas/fastcodec_gen.py``) so that the
generated module imports only what it runs; both are compiled with the hot path (``build_config.py``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from schemas.codec import COMMAND, EVENT, HEADER_SIZE, DecodeError, registry
from schemas.commands import Command, V1Command, V2Command, V3Command
from schemas.events import Event

# Messages of the rejections fastavro would not make (see schemas/fastcodec.py).
STRICT: Final = ("varint longer than 10 bytes or above 64 bits", "negative union branch index", "block count")

SMALL: Final = 8192  # non-negative ints below this encode by table lookup (1 or 2 bytes)


def _varint(z: int) -> bytes:
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_T: list[bytes] = [_varint(z) for z in range(1 << 14)]  # the varint of z < 2**14
_C: list[bytes] = [bytes(((z & 0x7F) | 0x80, (z >> 7) | 0x80)) for z in range(1 << 14)]  # 14 bits, both continued
_P: list[bytes] = _T[0 : 2 * SMALL : 2]  # the zigzag varint of 0 <= n < SMALL


def _long(n: int) -> bytes:
    """The zigzag varint of a 64-bit int (the slow path of the generated ``_P[n]`` lookups)."""
    z = n << 1 if n >= 0 else ~(n << 1)
    if z < 268435456:
        return _C[z & 16383] + _T[z >> 14] if z > 16383 else _T[z]
    if z < 4398046511104:
        return _C[z & 16383] + _C[(z >> 14) & 16383] + _T[z >> 28]
    if z >= 18446744073709551616:
        raise OverflowError(f"{n} does not fit in an Avro long")
    if z < 72057594037927936:
        return _C[z & 16383] + _C[(z >> 14) & 16383] + _C[(z >> 28) & 16383] + _T[z >> 42]
    return _C[z & 16383] + _C[(z >> 14) & 16383] + _C[(z >> 28) & 16383] + _C[(z >> 42) & 16383] + _T[z >> 56]


# First byte of a varint -> its value when the varint is that one byte (0 when it continues: the generated
# code reads _ZD only for bytes below 128); for a length, -1 when it continues. An odd byte is a negative
# length: _NEGATIVE always runs past the end of the frame.
_NEGATIVE: Final = 1 << 62
_ZD: list[int] = [(b >> 1) ^ -(b & 1) if b < 128 else 0 for b in range(256)]
_ZL: list[int] = [-1 if b >= 128 else _NEGATIVE if b % 2 else b >> 1 for b in range(256)]


def _length_error(n: int, left: int) -> DecodeError:
    if n < 0 or n == _NEGATIVE:
        return DecodeError("corrupt Avro body: negative length")
    return DecodeError(f"corrupt Avro body: length {n} runs past the end of the frame ({left} bytes left)")


def _count_error(count: int, left: int) -> DecodeError:
    return DecodeError(f"corrupt Avro body: {STRICT[2]} {count} cannot fit in the {left} bytes left")


def _union_error(index: int, size: int) -> DecodeError:
    if index < 0:
        return DecodeError(f"corrupt Avro body: {STRICT[1]} {index}")
    return DecodeError(f"corrupt Avro body: union branch index {index} out of range (union of {size})")


def _slow_command(frame: Any) -> Command:
    """A command through fastavro (another writer schema): a :class:`V1Command`, :class:`V2Command` or
    :class:`V3Command` if that release wrote it, so it keeps its release's semantics."""
    codecs = registry()
    data = codecs.codec(COMMAND).decode(frame)
    version = codecs.released_version(COMMAND, bytes(frame[2:HEADER_SIZE]))
    kind = V1Command if version == "v1" else V2Command if version == "v2" else Command
    if version == "v3":
        kind = V3Command
    return kind.from_avro(data)


def _slow_event(frame: Any) -> Event:
    """An event through fastavro (another writer schema, or not a frame of ours)."""
    return Event.from_avro(registry().codec(EVENT).decode(frame))


_pack_d: Callable[[float], bytes] = struct.Struct("<d").pack
_pack_f: Callable[[float], bytes] = struct.Struct("<f").pack
_unpack_d: Callable[[bytes, int], tuple[Any, ...]] = struct.Struct("<d").unpack_from
_unpack_f: Callable[[bytes, int], tuple[Any, ...]] = struct.Struct("<f").unpack_from
