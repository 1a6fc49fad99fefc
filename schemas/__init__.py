"""The Avro contract of gpufold: the .avsc files beside this module and their codec.

The schema files are the source of truth; `schemas.codec` parses them once and
encodes records as Avro single-object encoding (``C3 01`` + the 8-byte
CRC-64-AVRO fingerprint of the writer schema + the binary body).

The hot path (records, checks, generated codec, fold) may run compiled (mypyc, built at install:
``build_config.py``); first of all here, :mod:`schemas.pure_python` honours ``GPUFOLD_PURE_PYTHON=1``.
"""

from schemas import pure_python

pure_python.install()  # before any compiled module is imported: GPUFOLD_PURE_PYTHON=1 loads their sources

from schemas.codec import (  # noqa: E402
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
