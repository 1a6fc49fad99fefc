"""Avro single-object encoding on fastavro, with writer/reader schema resolution.

A frame is ``C3 01`` + the little-endian CRC-64-AVRO fingerprint of the writer
schema's Parsing Canonical Form + the Avro binary body. Decoding looks the
fingerprint up among the schemas this process knows (the current one and any
older versions registered with :meth:`SchemaRegistry.register`) and resolves
the writer schema to the reader schema, so a record written with an older
schema decodes under a newer one that adds a defaulted field.

Timestamps are carried as plain epoch milliseconds: the runtime copy of each
schema drops the ``timestamp-millis`` logical type (Parsing Canonical Form drops
logical types too, so fingerprints are unchanged) so that decoding never turns
them into ``datetime`` objects.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

import fastavro
from fastavro.schema import fingerprint

MAGIC = b"\xc3\x01"
HEADER_SIZE = 10

COMMAND = "gpufold.Command"
EVENT = "gpufold.Event"
SNAPSHOT = "gpufold.Snapshot"
DEAD_LETTER = "gpufold.DeadLetter"

_SCHEMA_FILES = ("types.avsc", "command.avsc", "event.avsc", "snapshot.avsc", "dead_letter.avsc")
HISTORY = ("v1", "v2", "v3")
"""Released versions of the contract, kept under ``schemas/history/<version>/`` (the same five files).

Every record a released version wrote still decodes: the registry knows each
version's writer schemas by fingerprint and resolves them to the current
reader schemas. Changing a schema file therefore means copying the released
files here first, under a new version name (``tests/unit/schemas/test_history.py``
checks that the current schemas can read every version).
"""


class DecodeError(ValueError):
    """Bytes that are not a valid single-object-encoded record of a known schema."""


def _strip_logical_types(schema: Any) -> Any:
    if isinstance(schema, dict):
        if schema.get("logicalType") == "timestamp-millis":
            return schema["type"]
        return {key: _strip_logical_types(value) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_strip_logical_types(item) for item in schema]
    return schema


_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


def parsing_canonical_form(schema: Any, named: dict[str, Any]) -> str:
    """The Parsing Canonical Form of a parsed schema, as the Avro spec and Java's SchemaNormalization give it.

    Each named type is written in full at its first occurrence and by name after
    that; references to shared types (types.avsc) are resolved through ``named``.
    (fastavro's own form, on an ``expand=True`` schema, repeats a type used twice
    and leaves types nested in shared types undefined, so other Avro
    implementations would compute another fingerprint.)
    """
    seen: set[str] = set()

    def form(node: Any) -> str:
        if isinstance(node, str):
            if node in _PRIMITIVES or node in seen:
                return json.dumps(node, ensure_ascii=False)
            return form(named[node])
        if isinstance(node, list):
            return "[" + ",".join(form(item) for item in node) + "]"
        kind = node["type"]
        if kind == "array":
            return '{"type":"array","items":' + form(node["items"]) + "}"
        if kind == "map":
            return '{"type":"map","values":' + form(node["values"]) + "}"
        if kind not in ("record", "error", "enum", "fixed"):
            return form(kind)  # {"type": "long"} or a nested type
        name = node["name"]
        if name in seen:
            return json.dumps(name, ensure_ascii=False)
        seen.add(name)
        head = '{"name":' + json.dumps(name, ensure_ascii=False)
        if kind == "enum":
            return head + ',"type":"enum","symbols":' + json.dumps(node["symbols"], separators=(",", ":")) + "}"
        if kind == "fixed":
            return head + ',"type":"fixed","size":' + str(int(node["size"])) + "}"
        fields = ",".join(
            '{"name":' + json.dumps(field["name"], ensure_ascii=False) + ',"type":' + form(field["type"]) + "}"
            for field in node["fields"]
        )
        return head + ',"type":"record","fields":[' + fields + "]}"

    return form(schema)


def _load_json(name: str, version: str | None = None) -> Any:
    folder = resources.files("schemas")
    if version is not None:
        folder = folder.joinpath("history").joinpath(version)
    return json.loads(folder.joinpath(name).read_text(encoding="utf-8"))


@dataclass(frozen=True, slots=True)
class AvroCodec:
    """Encodes and decodes one record type (the reader schema) in single-object frames."""

    name: str
    schema: Any  # parsed runtime schema (the reader schema)
    fingerprint: bytes
    registry: SchemaRegistry

    def encode(self, record: Any) -> bytes:
        """Encode a record (a mapping as fastavro takes it) into one frame."""
        buffer = io.BytesIO()
        buffer.write(MAGIC)
        buffer.write(self.fingerprint)
        fastavro.schemaless_writer(buffer, self.schema, record)
        return buffer.getvalue()

    def encode_body(self, record: Any) -> bytes:
        """Encode only the Avro binary body (no header), e.g. for hashing."""
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, self.schema, record)
        return buffer.getvalue()

    def decode(self, frame: bytes) -> Any:
        """Decode one frame into a mapping; raises DecodeError on anything malformed."""
        if not isinstance(frame, (bytes, bytearray, memoryview)):
            raise DecodeError(f"expected bytes, got {type(frame).__name__}")
        frame = bytes(frame)
        if len(frame) < HEADER_SIZE:
            raise DecodeError(f"frame of {len(frame)} bytes is shorter than the 10-byte header")
        if frame[:2] != MAGIC:
            raise DecodeError(f"bad magic {frame[:2].hex()}: not Avro single-object encoding (want c301)")
        writer = self.registry.writer_schema(frame[2:HEADER_SIZE])
        if writer is None:
            raise DecodeError(f"unknown schema fingerprint {frame[2:HEADER_SIZE].hex()}")
        if isinstance(writer, dict) and writer.get("name") != self.name:
            raise DecodeError(f"a {writer.get('name')} frame, not {self.name}")
        buffer = io.BytesIO(frame)
        buffer.seek(HEADER_SIZE)
        reader = None if writer is self.schema else self.schema
        try:
            record = fastavro.schemaless_reader(
                buffer,
                writer,
                reader,
                return_record_name=True,
                return_record_name_override=True,
            )
        except Exception as error:  # fastavro raises many types on corrupt bodies
            # Bounded: a dead letter carries this text, and fastavro may quote whole schemas.
            raise DecodeError(f"corrupt Avro body: {type(error).__name__}: {str(error)[:200]}") from error
        if buffer.tell() != len(frame):
            raise DecodeError(f"{len(frame) - buffer.tell()} trailing bytes after the record")
        return record


class SchemaRegistry:
    """The schemas this process knows, by full name and by fingerprint.

    The current schemas come from the .avsc files of this package; older writer
    schemas can be registered so their records still decode (schema evolution).
    """

    def __init__(self) -> None:
        self._named: dict[str, Any] = {}
        self._by_fingerprint: dict[bytes, Any] = {}
        self._codecs: dict[str, AvroCodec] = {}
        for file_name in _SCHEMA_FILES:
            document = _load_json(file_name)
            for schema in document if isinstance(document, list) else [document]:
                self._add_current(schema)
        self.versions: dict[str, dict[str, bytes]] = {}  # version -> record name -> writer fingerprint
        for version in HISTORY:
            self.versions[version] = self._add_version(version)

    def _add_version(self, version: str) -> dict[str, bytes]:
        """Register a released version's writer schemas, parsed against that version's own shared types."""
        named: dict[str, Any] = {}
        fingerprints: dict[str, bytes] = {}
        for file_name in _SCHEMA_FILES:
            document = _load_json(file_name, version)
            for schema in document if isinstance(document, list) else [document]:
                parsed: Any = fastavro.parse_schema(_strip_logical_types(schema), named_schemas=named)
                if file_name == "types.avsc":
                    continue
                fingerprint_bytes = self._fingerprint_of(parsed, named)
                fingerprints[parsed["name"]] = fingerprint_bytes
                self._by_fingerprint.setdefault(fingerprint_bytes, parsed)
        return fingerprints

    def _add_current(self, schema: dict[str, Any]) -> None:
        parsed: Any = fastavro.parse_schema(_strip_logical_types(schema), named_schemas=self._named)
        name = parsed["name"]
        self._codecs[name] = AvroCodec(name, parsed, self._fingerprint_of(parsed), self)
        self._by_fingerprint[self._codecs[name].fingerprint] = parsed

    def _fingerprint_of(self, parsed: Any, named: dict[str, Any] | None = None) -> bytes:
        # fastavro returns the CRC-64-AVRO as the hex of its little-endian bytes: the frame's order.
        return bytes.fromhex(fingerprint(parsing_canonical_form(parsed, named or self._named), "CRC-64-AVRO"))

    def register(self, schema: dict[str, Any]) -> bytes:
        """Register an older (or other) writer schema; returns its fingerprint.

        The schema may refer to the shared named types of types.avsc.
        """
        named = dict(self._named)
        parsed = fastavro.parse_schema(_strip_logical_types(schema), named_schemas=named)
        fingerprint_bytes = self._fingerprint_of(parsed, named)
        self._by_fingerprint[fingerprint_bytes] = parsed
        return fingerprint_bytes

    def released_version(self, name: str, fingerprint_bytes: bytes) -> str | None:
        """The released version that wrote a frame of this record, if it is not today's schema."""
        if fingerprint_bytes == self._codecs[name].fingerprint:
            return None
        for version, fingerprints in self.versions.items():
            if fingerprints.get(name) == fingerprint_bytes:
                return version
        return None

    def writer_schema(self, fingerprint_bytes: bytes) -> Any | None:
        return self._by_fingerprint.get(fingerprint_bytes)

    def codec(self, name: str) -> AvroCodec:
        try:
            return self._codecs[name]
        except KeyError:
            raise KeyError(f"no schema named {name!r}; known: {sorted(self._codecs)}") from None

    def canonical_form(self, name: str) -> str:
        return parsing_canonical_form(self._codecs[name].schema, self._named)


_REGISTRY: SchemaRegistry | None = None


def registry() -> SchemaRegistry:
    """The process-wide registry, parsed once on first use."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = SchemaRegistry()
    return _REGISTRY
