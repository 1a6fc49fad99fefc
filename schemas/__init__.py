"""The Avro contract of gpufold: the .avsc files beside this module and their codec.

The schema files are the source of truth; `schemas.codec` parses them once and
encodes records as Avro single-object encoding (``C3 01`` + the 8-byte
CRC-64-AVRO fingerprint of the writer schema + the binary body).
"""

from schemas.codec import (
    COMMAND,
    DEAD_LETTER,
    EVENT,
    SNAPSHOT,
    AvroCodec,
    DecodeError,
    SchemaRegistry,
    registry,
)

__all__ = [
    "COMMAND",
    "DEAD_LETTER",
    "EVENT",
    "SNAPSHOT",
    "AvroCodec",
    "DecodeError",
    "SchemaRegistry",
    "registry",
]
