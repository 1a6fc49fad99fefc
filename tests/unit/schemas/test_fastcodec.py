"""The generated codecs of schemas.fastcodec against the fastavro path they replace.

Encoders must write fastavro's bytes exactly; decoders must return what
``X.from_avro(codec.decode(frame))`` returns, and must reject every frame that
path rejects (plus the few malformed bodies it lets through: ``STRICT``),
raising DecodeError and nothing else. Random records come from strategies
derived from the schemas themselves, so every record type and field is covered.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.core.fold import decide
from processor.core.state import PartitionState
from schemas import COMMAND, EVENT, DecodeError, commands, events, registry
from schemas.commands import Command, Release, SetPolicy, SubmitPod, Toleration
from schemas.events import Event, GpuShare, PodQueued, PodReleased, PodScheduled, PodSpec, QueueReason
from schemas.fastcodec import STRICT, decode_command, decode_event, encode_command, encode_event
from schemas.records import Record
from tests.strategies import command_streams

COMMANDS = registry().codec(COMMAND)
EVENTS = registry().codec(EVENT)
HEADER = b"\xc3\x01" + COMMANDS.fingerprint
INT64 = (-(2**63), 2**63 - 1)
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------- strategies derived from the schemas

CLASSES: dict[str, type] = {COMMAND: Command, EVENT: Event}
for _module in (commands, events):
    for _value in vars(_module).values():
        if isinstance(_value, type) and issubclass(_value, Record) and _value is not Record:
            CLASSES[_value.AVRO_NAME] = _value

texts = st.one_of(
    st.sampled_from(("", "a", "node-000001", "H100", "ü€𝄞")),
    st.text(max_size=12),
    st.integers(8185, 8200).map(lambda n: "é" * (n // 2) + "x" * (n % 2)),  # around the 8192-byte table boundary
)
ints = st.one_of(
    st.integers(-3, 3),
    st.sampled_from((8191, 8192, 16383, 16384, -8193, 2**28, 2**42, 2**56, *INT64)),
    st.integers(*INT64),
)


INT32 = st.one_of(
    st.integers(-3, 3), st.sampled_from((8191, 8192, 2**28, -(2**31), 2**31 - 1)), st.integers(-(2**31), 2**31 - 1)
)


def strategy(schema: Any, nan: bool = False, branch: bool = False) -> st.SearchStrategy[Any]:
    """Values of the dataclass model for a parsed Avro schema (named types looked up in the registry).

    An ``int`` outside a union takes any 64-bit value (fastavro writes those too); in a union
    branch (a record branch's fields too) only 32-bit ones, since fastavro picks a union's
    branch by validating the value."""
    if isinstance(schema, str) and schema in CLASSES:
        schema = registry().codec(schema).schema
    if isinstance(schema, list):
        return st.one_of([strategy(item, nan, branch=True) for item in schema])
    kind = schema["type"] if isinstance(schema, dict) else schema
    if kind == "null":
        return st.none()
    if kind == "string":
        return texts
    if kind == "int" and branch:
        return INT32
    if kind in ("int", "long"):
        return ints
    if kind == "boolean":
        return st.booleans()
    if kind == "double":
        return st.floats(allow_nan=nan)
    if kind == "array":
        return st.lists(strategy(schema["items"], nan, branch), max_size=3).map(tuple)
    if kind == "map":
        return st.dictionaries(texts, strategy(schema["values"], nan, branch), max_size=3)
    assert kind == "record", kind
    fields = {f["name"]: strategy(f["type"], nan, branch) for f in schema["fields"]}
    return st.builds(CLASSES[schema["name"]], **fields)


random_commands = strategy(COMMANDS.schema)
random_events = strategy(EVENTS.schema)


@st.composite
def folded_events(draw: st.DrawFn) -> list[Event]:
    """The events of folding a random command stream (realistic shapes: specs, shares, reasons, scores)."""
    state = PartitionState()
    out: list[Event] = []
    for offset, command in enumerate(draw(command_streams(max_size=30))):
        out += decide(state, command, offset)
    return out


def slow_command(frame: Any) -> Any:
    """The fastavro path: the decoded Command, or the DecodeError it raises."""
    try:
        return Command.from_avro(COMMANDS.decode(frame))
    except DecodeError as error:
        return error


def fast_command(frame: Any) -> Any:
    """The generated path: the decoded Command, or the DecodeError it raises."""
    try:
        return decode_command(frame)
    except DecodeError as error:
        return error


def assert_same_outcome(frame: bytes, slow: Any, fast: Any) -> None:
    """Both reject, or both accept equal values, or fastcodec rejects one of the STRICT cases."""
    if isinstance(slow, DecodeError):
        assert isinstance(fast, DecodeError), f"fastcodec accepted what fastavro rejects ({slow}): {frame.hex()}"
    elif isinstance(fast, DecodeError):
        assert any(reason in str(fast) for reason in STRICT), f"{fast} but fastavro accepts {frame.hex()}: {slow}"
    else:
        assert repr(fast) == repr(slow)  # repr, not ==: a flipped byte can make a score NaN in both


# ---------------------------------------------------------------- encoders


@ROUND_TRIP
@given(random_events)
def test_encode_event_writes_the_bytes_fastavro_writes(event: Event) -> None:
    """A random event of any type encodes to fastavro's frame byte for byte."""
    assert encode_event(event) == EVENTS.encode(event.to_avro())


@ROUND_TRIP
@given(random_commands)
def test_encode_command_writes_the_bytes_fastavro_writes(command: Command) -> None:
    """A random command of any type encodes to fastavro's frame byte for byte."""
    assert encode_command(command) == COMMANDS.encode(command.to_avro())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(folded_events())
def test_encode_folded_events_writes_the_bytes_fastavro_writes(folded: list[Event]) -> None:
    """Events the fold emits for a random command stream encode as fastavro encodes them."""
    assert [encode_event(e) for e in folded] == [EVENTS.encode(e.to_avro()) for e in folded]


@settings(max_examples=60, deadline=None)
@given(st.floats(allow_nan=True), st.floats(allow_nan=True))
def test_encode_scores_keeps_every_double_bit(first: float, second: float) -> None:
    """Score doubles (NaN, infinities, -0.0 included) are written with fastavro's exact bits."""
    spec = PodSpec("p", "t", 0, 1, 1000, 1, 1, (), {}, (), 0, 0)
    event = Event(0, 1, "c", "id", 2, 3, PodScheduled(spec, "n", (GpuShare(0, 1000),), "spread", True, {"a": first}))
    event.payload.scores["b"] = second  # type: ignore[union-attr]
    assert encode_event(event) == EVENTS.encode(event.to_avro())


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**70])
def test_encode_refuses_ints_beyond_64_bits(value: int) -> None:
    """An int outside the Avro long range raises OverflowError, as fastavro does, instead of wrapping."""
    command = Command("id", "c", value, SetPolicy("spread"))
    with pytest.raises(OverflowError):
        COMMANDS.encode(command.to_avro())
    with pytest.raises(OverflowError):
        encode_command(command)


def test_encode_sees_a_pod_spec_changed_in_place() -> None:
    """PodSpec is mutable: encoding it again after a change writes the new bytes (nothing cached by identity)."""
    spec = PodSpec("p1", "t", 0, 1, 500, 10, 10, ("A100",), {"zone": "a"}, (Toleration("k"),), 5, 1)
    queued = Event(0, 1, "c", "id", 2, 3, PodQueued(spec, (QueueReason("no_gpu", 2),), False))
    first = encode_event(queued)
    spec.node_selector["zone"] = "b"
    spec.arrival = 2
    scheduled = Event(0, 2, "c", "id", 2, 3, PodScheduled(spec, "n", (GpuShare(1, 500),), "spread"))
    assert first != encode_event(queued) == EVENTS.encode(queued.to_avro())
    assert encode_event(scheduled) == EVENTS.encode(scheduled.to_avro())


# ---------------------------------------------------------------- decoders


@ROUND_TRIP
@given(random_commands)
def test_decode_command_equals_the_fastavro_path(command: Command) -> None:
    """A random command's frame decodes to the object fastavro + from_avro build, and back to the command."""
    frame = COMMANDS.encode(command.to_avro())
    decoded = decode_command(frame)
    assert repr(decoded) == repr(slow_command(frame))
    assert decoded == command


@ROUND_TRIP
@given(random_events)
def test_decode_event_equals_the_fastavro_path(event: Event) -> None:
    """A random event's frame decodes to the object fastavro + from_avro build, and back to the event."""
    frame = EVENTS.encode(event.to_avro())
    decoded = decode_event(frame)
    assert repr(decoded) == repr(Event.from_avro(EVENTS.decode(frame)))
    assert decoded == event


def test_decode_accepts_bytearray_and_memoryview() -> None:
    """Frames given as bytearray or memoryview decode like bytes."""
    command = Command("id", "c", 1_700_000_000_000, SubmitPod("p", gpu_models=("A100",), node_selector={"a": "b"}))
    frame = encode_command(command)
    assert decode_command(bytearray(frame)) == decode_command(memoryview(frame)) == command


def test_decode_falls_back_to_fastavro_for_an_older_writer_schema() -> None:
    """A frame written with an older registered schema (no ``source`` field) decodes with the default filled."""
    old = registry().codec(COMMAND).schema
    older = {
        "type": "record",
        "name": "gpufold.Command",
        "fields": [f for f in _plain(old)["fields"] if f["name"] != "source"],
    }
    fingerprint = registry().register(older)
    # command_id, cluster, issued_at 1, SetPolicy("spread"): reserve_after_ms null, queue_order "", no default quota,
    # max_clock_jump_ms null
    body = b"\x04id\x02c\x02" + b"\x10" + b"\x0cspread\x00\x00\x00\x00"
    frame = b"\xc3\x01" + fingerprint + body
    assert decode_command(frame) == slow_command(frame) == Command("id", "c", 1, SetPolicy("spread"), "")


def _plain(schema: Any) -> Any:
    """A parsed schema without fastavro's bookkeeping keys, to re-register as another version."""
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if not k.startswith("__")}
    if isinstance(schema, list):
        return [_plain(item) for item in schema]
    return schema


@pytest.mark.parametrize(
    "frame",
    [
        None,
        "text",
        7,
        b"",
        b"\xc3\x01",
        HEADER[:-1],
        b"\xc3\x02" + HEADER[2:] + b"\x00",
        b"\xc3\x01" + bytes(8) + b"\x00",
    ],
    ids=["none", "str", "int", "empty", "magic-only", "short-header", "bad-magic", "unknown-fingerprint"],
)
def test_decode_rejects_bad_headers_as_the_codec_does(frame: Any) -> None:
    """Non-bytes, short frames, wrong magic and unknown fingerprints raise the codec's own DecodeError."""
    slow, fast = slow_command(frame), fast_command(frame)
    assert isinstance(slow, DecodeError) and isinstance(fast, DecodeError)
    assert str(fast) == str(slow)


def _s(text: str) -> bytes:
    data = text.encode()
    return bytes([len(data) * 2]) + data


ENVELOPE = HEADER + _s("id") + _s("c") + b"\x02" + _s("")  # command_id, cluster, issued_at 1, source
# reserve_after_ms null, queue_order "", default_quota null, max_clock_jump_ms null
SET_POLICY_TAIL = b"\x00\x00\x00\x00"
# time_limit_ms null, depends_on [], dependency, preemption, movable false, gpu_memory_mib 0, retry null,
# preemptible true
SUBMIT_POD_TAIL = b"\x00\x00" + _s("afterok") + _s("lower_priority") + b"\x00\x00\x00\x01"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            _s("id") + _s("c") + b"\x82" + b"\x80" * 9 + b"\x00" + _s("") + b"\x10" + _s("p") + SET_POLICY_TAIL,
            STRICT[0],
        ),
        (
            _s("id") + _s("c") + b"\xfe" + b"\xff" * 8 + b"\x03" + _s("") + b"\x10" + _s("p") + SET_POLICY_TAIL,
            STRICT[0],
        ),
        # -1: fastavro's last branch, RemoveDisruptionBudget {budget_id "r"}
        (_s("id") + _s("c") + b"\x02" + _s("") + b"\x01" + _s("r"), STRICT[1]),
    ],
    ids=["11-byte-varint", "varint-above-64-bits", "negative-union-index"],
)
def test_decode_rejects_what_fastavro_lets_through(body: bytes, reason: str) -> None:
    """Overlong varints and negative union indexes, which fastavro silently accepts, are rejected."""
    frame = (HEADER + body) if not body.startswith(HEADER) else body
    assert isinstance(slow_command(frame), Command)
    fast = fast_command(frame)
    assert isinstance(fast, DecodeError) and reason in str(fast)


@pytest.mark.parametrize(
    "body",
    [
        b"\x10" + b"\x01",  # negative string length
        b"\x10" + b"\x20abc",  # string length past the end
        b"\x10" + b"\x04\xff\xfe",  # invalid UTF-8
        b"\x10" + b"\x06\xed\xa0\x80",  # an encoded surrogate
        b"\x7e" + _s("p"),  # union index past the end (63)
        b"\x10" + _s("p") + SET_POLICY_TAIL + b"\x00",  # a trailing byte
        b"\x10",  # truncated in the payload
        b"\x0c" + _s("p") + _s("t") + b"\x00" * 5 + b"\xfe\xff\xff\xff\x0f" + _s("a") + b"\x00\x00\x00",  # huge count
        b"\x0c" + _s("p") + _s("t") + b"\x00" * 5 + b"\x00\x02\x01",  # negative map key length
    ],
)
def test_decode_rejects_malformed_bodies_like_fastavro(body: bytes) -> None:
    """Bodies fastavro rejects raise DecodeError here too."""
    frame = ENVELOPE + body
    assert isinstance(slow_command(frame), DecodeError)
    assert isinstance(fast_command(frame), DecodeError)


@pytest.mark.parametrize(
    "body",
    [
        b"\x02" + _s("n") + b"\x02",  # a boolean byte other than 0 and 1 reads as true
        b"\x0c" + _s("p") + _s("t") + b"\x80\x80\x80\x80\x80\x40" + b"\x00" * 4 + b"\x00\x00\x00" + SUBMIT_POD_TAIL,
        b"\x0c" + _s("p") + _s("t") + b"\x00" * 5 + b"\x01\x7e" + _s("a") + b"\x00\x00\x00" + SUBMIT_POD_TAIL,
        b"\x0c"
        + _s("p")
        + _s("t")
        + b"\x00" * 5
        + b"\x02"
        + _s("a")
        + b"\x02"
        + _s("b")
        + b"\x00\x00\x00"
        + SUBMIT_POD_TAIL,
        b"\x0c"
        + _s("p")
        + _s("t")
        + b"\x00" * 5
        + b"\x00\x04"
        + _s("k")
        + _s("1")
        + _s("k")
        + _s("2")
        + b"\x00\x00"
        + SUBMIT_POD_TAIL,
        b"\x90\x00" + _s("p") + SET_POLICY_TAIL,  # a non-minimal varint
    ],
    ids=["bool-2", "int-above-2-31", "negative-block-count", "two-blocks", "duplicate-map-key", "non-minimal-varint"],
)
def test_decode_accepts_unusual_but_valid_bodies_like_fastavro(body: bytes) -> None:
    """Legal-but-unusual encodings fastavro accepts decode to the same command."""
    frame = ENVELOPE + body
    slow = slow_command(frame)
    assert isinstance(slow, Command)
    assert repr(fast_command(frame)) == repr(slow)


MUTATION_BYTES = st.one_of(st.sampled_from((0x00, 0x01, 0x02, 0x7F, 0x80, 0x81, 0xFE, 0xFF)), st.integers(0, 255))


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    """A valid command frame with one to four random edits (overwrite, insert, delete, truncate, append)."""
    frame = bytearray(COMMANDS.encode(draw(random_commands).to_avro()))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(("overwrite", "overwrite", "insert", "delete", "truncate", "append")))
        # Mostly past the 10-byte header: header damage only exercises the shared fallback.
        low = 0 if draw(st.integers(0, 19)) == 0 else min(10, len(frame))
        at = draw(st.integers(low, max(low, len(frame) - 1)))
        if kind == "overwrite" and at < len(frame):
            frame[at] = draw(MUTATION_BYTES)
        elif kind == "insert":
            frame[at:at] = bytes(draw(st.lists(MUTATION_BYTES, min_size=1, max_size=3)))
        elif kind == "delete" and at < len(frame):
            del frame[at]
        elif kind == "truncate":
            del frame[at:]
        elif kind == "append":
            frame += bytes(draw(st.lists(MUTATION_BYTES, min_size=1, max_size=3)))
    return bytes(frame)


@FUZZ
@given(mutated_frames())
def test_decode_command_agrees_with_fastavro_on_mutated_frames(frame: bytes) -> None:
    """On damaged frames both decoders reject, or both accept equal commands (STRICT cases aside)."""
    assert_same_outcome(frame, slow_command(frame), fast_command(frame))


@FUZZ
@given(st.binary(max_size=40))
def test_decode_command_agrees_with_fastavro_on_random_bodies(body: bytes) -> None:
    """Random bytes after a valid header: the same accept/reject outcome as fastavro."""
    frame = HEADER + body
    assert_same_outcome(frame, slow_command(frame), fast_command(frame))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_events, st.data())
def test_decode_event_agrees_with_fastavro_on_truncations_and_flips(event: Event, data: st.DataObject) -> None:
    """A truncated or byte-flipped event frame gets the same outcome from both decoders."""
    frame = bytearray(EVENTS.encode(event.to_avro()))
    at = data.draw(st.integers(10, len(frame) - 1))
    if data.draw(st.booleans()):
        del frame[at:]
    else:
        frame[at] = data.draw(MUTATION_BYTES)
    try:
        slow: Any = Event.from_avro(EVENTS.decode(bytes(frame)))
    except DecodeError as error:
        slow = error
    try:
        fast: Any = decode_event(bytes(frame))
    except DecodeError as error:
        fast = error
    assert_same_outcome(bytes(frame), slow, fast)


def test_decode_of_a_release_and_its_event_round_trip() -> None:
    """A Release command and the PodReleased event (null node) survive encode then decode."""
    command = Command("r-1", "c", 1_700_000_000_123, Release("p1", "cancelled"), "cli")
    event = Event(3, 99_999, "c", "r-1", 2**40, 1_700_000_000_123, PodReleased("p1", None, "cancelled"))
    assert decode_command(encode_command(command)) == command
    assert decode_event(encode_event(event)) == event
