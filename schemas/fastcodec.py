"""Generated Avro codecs for commands and events: fastavro's exact bytes, straight from the dataclasses.

The functions live in ``schemas/fastcodec_generated.py``, written ahead of time by
``schemas/fastcodec_gen.py`` (one specialised function per record type, every field inlined) and
compiled with the fold when the install can (``build_config.py``):

- ``encode_event(event)`` / ``encode_command(command)``: the whole single-object frame (``C3 01`` +
  fingerprint + body), byte for byte what ``registry().codec(X).encode(obj.to_avro())`` writes;
- ``decode_command(frame)`` / ``decode_event(frame)``: the dataclasses themselves (tuples for arrays, dicts
  for maps), equal to ``X.from_avro(registry().codec(X).decode(frame))``. A frame of any other fingerprint
  (an older writer schema, or none known) takes exactly that fastavro path, schema resolution included.

Decoding raises :class:`~schemas.codec.DecodeError` on every malformed frame, never anything else. It
rejects everything fastavro rejects and, on purpose, three malformed bodies fastavro lets through
(``STRICT`` lists the messages): a varint longer than 10 bytes or above 64 bits (fastavro wraps it), a
negative union branch index (fastavro counts it from the end of the union) and a block count that
cannot fit in the bytes left (fastavro fails on those too, except for the count -2**63).
"""

from __future__ import annotations

from schemas.avro_binary import STRICT
from schemas.fastcodec_generated import decode_command, decode_event, encode_command, encode_event

__all__ = ["STRICT", "decode_command", "decode_event", "encode_command", "encode_event", "source"]


def source() -> str:
    """The generated source (for reading and debugging): what ``schemas/fastcodec_gen.py`` writes now."""
    from schemas.fastcodec_gen import module_source

    return module_source()
