"""The Avro codec: single-object framing, fingerprints, schema evolution and round trips of every record type.

The fingerprint is checked against an independent Parsing Canonical Form and
CRC-64-AVRO written here from the Avro specification, not against fastavro.
"""

from __future__ import annotations

import io
import json
import struct
from importlib import resources
from typing import Any

import fastavro
import pytest

from schemas import COMMAND, DEAD_LETTER, EVENT, SNAPSHOT, DecodeError, SchemaRegistry, registry
from schemas.commands import (
    AddNode,
    Command,
    CordonNode,
    DrainNode,
    MarkNodeFailed,
    Release,
    RemoveNode,
    SetPolicy,
    SubmitPod,
    Taint,
    Toleration,
    UncordonNode,
)
from schemas.events import (
    CommandRejected,
    Event,
    GpuShare,
    NodeAdded,
    NodeCordoned,
    NodeDrained,
    NodeFailed,
    NodeRemoved,
    NodeUncordoned,
    PodEvicted,
    PodQueued,
    PodReleased,
    PodScheduled,
    PodSpec,
    PolicyChanged,
    QueueReason,
)

# ---------------------------------------------------------------- an independent CRC-64-AVRO and PCF

EMPTY_64 = 0xC15D213AA4D7A795  # the Avro spec's EMPTY


def crc64_avro(data: bytes) -> int:
    """CRC-64-AVRO (Rabin), bit by bit as in the spec's fingerprint64 (no table)."""
    fp = EMPTY_64
    for byte in data:
        fp ^= byte
        for _ in range(8):
            fp = (fp >> 1) ^ (EMPTY_64 & -(fp & 1))
    return fp


PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def _shared_types() -> dict[str, dict[str, Any]]:
    """The named types of types.avsc by full name, as written."""
    document = json.loads(resources.files("schemas").joinpath("types.avsc").read_text())
    return {f"{item['namespace']}.{item['name']}": item for item in document}


def spec_canonical_form(schema: Any, shared: dict[str, dict[str, Any]]) -> str:
    """Parsing Canonical Form per the spec: [PRIMITIVES] [FULLNAMES] [STRIP] [ORDER], no whitespace,
    each named type in full at first use and by full name after (as Java's SchemaNormalization)."""
    seen: set[str] = set()

    def full(name: str, namespace: str) -> str:
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def walk(node: Any, namespace: str) -> str:
        if isinstance(node, str):
            if node in PRIMITIVES:
                return f'"{node}"'
            name = full(node, namespace)
            if name in seen:
                return f'"{name}"'
            return walk(shared[name], "")
        if isinstance(node, list):
            return "[" + ",".join(walk(item, namespace) for item in node) + "]"
        kind = node["type"]
        if kind == "array":
            return '{"type":"array","items":' + walk(node["items"], namespace) + "}"
        if kind == "map":
            return '{"type":"map","values":' + walk(node["values"], namespace) + "}"
        if kind == "record":
            name = full(node["name"], node.get("namespace", namespace))
            seen.add(name)
            inner = name.rpartition(".")[0]
            fields = ",".join(
                '{"name":"' + field["name"] + '","type":' + walk(field["type"], inner) + "}" for field in node["fields"]
            )
            return '{"name":"' + name + '","type":"record","fields":[' + fields + "]}"
        return walk(kind, namespace)  # {"type": "long", "logicalType": ...} -> "long"

    return walk(schema, "")


def _schema_file(name: str) -> Any:
    return json.loads(resources.files("schemas").joinpath(name).read_text())


# ---------------------------------------------------------------- framing and fingerprints


def test_crc64_avro_matches_the_spec_test_vector() -> None:
    """The independent CRC-64-AVRO gives the Avro test-suite fingerprint of the schema "null"."""
    assert crc64_avro(b'"null"') == 7195948357588979594


@pytest.mark.parametrize(
    ("name", "file_name"),
    [(COMMAND, "command.avsc"), (EVENT, "event.avsc"), (SNAPSHOT, "snapshot.avsc"), (DEAD_LETTER, "dead_letter.avsc")],
)
def test_frame_header_is_magic_and_little_endian_fingerprint(name: str, file_name: str) -> None:
    """A frame starts C3 01, then the little-endian CRC-64-AVRO of the independently computed canonical form."""
    canonical = spec_canonical_form(_schema_file(file_name), _shared_types())
    assert registry().canonical_form(name) == canonical
    codec = registry().codec(name)
    assert codec.fingerprint == struct.pack("<Q", crc64_avro(canonical.encode()))
    frame = codec.encode(_minimal_record(name))
    assert frame[:2] == b"\xc3\x01"
    assert frame[2:10] == codec.fingerprint


@pytest.mark.parametrize("name", [COMMAND, EVENT, SNAPSHOT])
def test_canonical_form_defines_every_named_type_exactly_once(name: str) -> None:
    """Each named type used by a schema is defined once in its canonical form, so other Avro libraries can parse it."""
    canonical = registry().canonical_form(name)
    definitions = canonical.count('"type":"record"')
    names = {part.split('"')[0] for part in canonical.split('{"name":"')[1:] if '","type":"record"' in part[:80]}
    assert definitions == len(names)
    for shared in ("gpufold.Toleration", "gpufold.PodSpec", "gpufold.Taint"):
        if f'"{shared}"' in canonical:
            assert canonical.count(f'{{"name":"{shared}","type":"record"') == 1


def _minimal_record(name: str) -> dict[str, Any]:
    if name == COMMAND:
        return Command("c", "k", 1, CordonNode("n")).to_avro()
    if name == EVENT:
        return Event(0, 0, "k", "c", 0, 1, NodeCordoned("n")).to_avro()
    if name == DEAD_LETTER:
        return {"topic": "t", "partition": 0, "offset": 3, "error": "bad", "key": None, "value": b"\x00"}
    return {"partition": 0, "next_offset": 0, "sequence": 0, "seen_window": 10, "seen": [], "clusters": []}


def test_decode_rejects_bad_magic_short_frames_unknown_fingerprints_and_trailing_bytes() -> None:
    """Malformed frames raise DecodeError with a reason, never another exception."""
    codec = registry().codec(COMMAND)
    frame = codec.encode(_minimal_record(COMMAND))
    cases = {
        "shorter than the 10-byte header": frame[:9],
        "bad magic": b"\xc3\x02" + frame[2:],
        "unknown schema fingerprint": frame[:2] + bytes(8) + frame[10:],
        "trailing bytes": frame + b"\x00",
        "corrupt Avro body": frame[:-1],
        "expected bytes": None,
    }
    for reason, bad in cases.items():
        with pytest.raises(DecodeError, match=reason):
            codec.decode(bad)  # type: ignore[arg-type]


def test_a_frame_of_another_record_type_does_not_decode_as_a_command() -> None:
    """An Event frame (a known fingerprint of another record) fed to the Command codec is a DecodeError."""
    event_frame = registry().codec(EVENT).encode(_minimal_record(EVENT))
    with pytest.raises(DecodeError, match=r"a gpufold\.Event frame, not gpufold\.Command"):
        registry().codec(COMMAND).decode(event_frame)


# ---------------------------------------------------------------- schema evolution


def test_record_written_with_an_older_schema_decodes_under_the_newer_one() -> None:
    """A SubmitPod written before `tenant` and `priority` existed decodes with their defaults filled in."""
    old = _schema_file("command.avsc")
    for branch in old["fields"][4]["type"]:
        if branch["name"] == "SubmitPod":
            branch["fields"] = [field for field in branch["fields"] if field["name"] not in ("tenant", "priority")]
    old["fields"] = [field for field in old["fields"] if field["name"] != "source"]
    old_registry = SchemaRegistry()
    writer = old_registry.register(old)
    assert writer != old_registry.codec(COMMAND).fingerprint
    # Write with the old schema (as an old producer would), framed with its fingerprint.
    body = io.BytesIO()
    old_parsed = fastavro.parse_schema(old, named_schemas=_fresh_named_types())
    record = {
        "command_id": "old-1",
        "cluster": "k",
        "issued_at": 5,
        "payload": ("gpufold.SubmitPod", {"pod_id": "p", "num_gpu": 1, "gpu_milli": 500, "cpu_milli": 100}),
    }
    fastavro.schemaless_writer(body, old_parsed, record)
    frame = b"\xc3\x01" + writer + body.getvalue()

    command = Command.from_avro(old_registry.codec(COMMAND).decode(frame))
    assert command.source == ""
    assert command.payload == SubmitPod("p", tenant="default", priority=0, num_gpu=1, gpu_milli=500, cpu_milli=100)
    with pytest.raises(DecodeError, match="unknown schema fingerprint"):
        SchemaRegistry().codec(COMMAND).decode(frame)  # a registry that never heard of the old schema


def _fresh_named_types() -> dict[str, Any]:
    named: dict[str, Any] = {}
    for item in json.loads(resources.files("schemas").joinpath("types.avsc").read_text()):
        fastavro.parse_schema(item, named_schemas=named)
    return named


# ---------------------------------------------------------------- round trips

SPEC = PodSpec(
    "p1",
    "tenant-a",
    7,
    2,
    1000,
    4000,
    16384,
    ("A100", "V100"),
    {"disk": "ssd", "zone": "a"},
    (Toleration("dedicated", "Equal", "ml", "NoSchedule"), Toleration("", "Exists")),
    1_700_000_000_000,
    42,
)

COMMANDS = [
    AddNode("n1", 64000, 262144, "A100", 8, {"zone": "a"}, (Taint("dedicated", "ml"), Taint("spot", "", "NoExecute"))),
    AddNode("cpu-1", 16000, 65536),
    RemoveNode("n1", force=True),
    CordonNode("n1"),
    UncordonNode("n1"),
    DrainNode("n1"),
    MarkNodeFailed("n1", "ecc errors"),
    SubmitPod("p1", "t", -3, 1, 250, 1000, 2048, ("A100",), {"zone": "a"}, (Toleration("k", "Exists"),)),
    SubmitPod("cpu-pod", cpu_milli=500),
    Release("p1", "cancelled"),
    SetPolicy("spread"),
]

EVENTS = [
    NodeAdded("n1", "A100", 8, 64000, 262144, {"zone": "a"}, (Taint("dedicated", "ml"),)),
    NodeRemoved("n1", True),
    NodeCordoned("n1"),
    NodeUncordoned("n1"),
    NodeDrained("n1", 3),
    NodeFailed("n1", "ecc", 2),
    PodQueued(SPEC, (QueueReason("INSUFFICIENT_GPU", 3), QueueReason("NO_NODES", 0, "none")), True),
    PodScheduled(SPEC, "n1", (GpuShare(0, 1000), GpuShare(3, 1000)), "best-fit", True, {"gpu_milli_left": 6000.0}),
    PodEvicted("p1", "n1", "drain"),
    PodReleased("p1", "n1", "completed"),
    PodReleased("p1", None, "cancelled"),
    PolicyChanged("spread", "best-fit"),
    CommandRejected("c9", "SubmitPod", "UNKNOWN_NODE", "node 'x' is not in cluster 'k'"),
]


@pytest.mark.parametrize("payload", COMMANDS, ids=lambda p: type(p).__name__)
def test_every_command_type_round_trips(payload: Any) -> None:
    """Each command type encodes and decodes back to an equal command."""
    command = Command("id-1", "cluster-a", 1_700_000_000_123, payload, source="test")
    codec = registry().codec(COMMAND)
    assert Command.from_avro(codec.decode(codec.encode(command.to_avro()))) == command


@pytest.mark.parametrize("payload", EVENTS, ids=lambda p: type(p).__name__)
def test_every_event_type_round_trips(payload: Any) -> None:
    """Each event type encodes and decodes back to an equal event, and re-encodes to the same bytes."""
    event = Event(3, 99, "cluster-a", "id-1", 12, 1_700_000_000_123, payload)
    codec = registry().codec(EVENT)
    frame = codec.encode(event.to_avro())
    decoded = Event.from_avro(codec.decode(frame))
    assert decoded == event
    assert codec.encode(decoded.to_avro()) == frame


def test_timestamps_decode_as_plain_epoch_millis() -> None:
    """issued_at comes back as an int of milliseconds, not a datetime."""
    codec = registry().codec(COMMAND)
    decoded = codec.decode(codec.encode(Command("c", "k", 1_700_000_000_123, CordonNode("n")).to_avro()))
    assert decoded["issued_at"] == 1_700_000_000_123
    assert type(decoded["issued_at"]) is int
