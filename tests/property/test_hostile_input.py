"""The hostile-input corpus of issue 12: every class, named cases and generated variants.

Each case asserts the clear outcome (a rejection with its code, a reported line, one
error line and a non-zero exit) and that nothing else was lost or changed: the good
input beside the bad still lands, the state and every output are what they would
have been, nothing is partial and presented as whole.

- oversized values anywhere in a command: a bounded rejection, state unchanged;
- hostile JSON lines for ``gpufold log append``: each bad line reported and skipped, the rest appended;
- a damaged embedded log: the same answer as before the damage, or one clear error (never a partial state);
- a damaged export: refused before anything is written.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from gpufold.cli import main
from gpufold.jsonl import parse_text
from logs.embedded import EmbeddedLog
from logs.port import InputRecord, OutputRecord
from processor.core.fold import decide
from processor.core.state import PartitionState
from processor.runtime.loop import PartitionFolder
from schemas.codes import Rejected, RejectionCode
from schemas.commands import (
    AddNode,
    Command,
    CordonNode,
    GangMember,
    MarkNodeFailed,
    Release,
    ReleaseGang,
    SetPolicy,
    SubmitGang,
    SubmitPod,
    Taint,
    Toleration,
)
from schemas.dead_letters import decode_dead_letter
from schemas.events import CommandRejected
from schemas.fastcodec import decode_event, encode_command
from schemas.limits import MAX_DEAD_LETTER_VALUE_BYTES, MAX_ID_LENGTH, MAX_MESSAGE_LENGTH
from schemas.topics import Topics
from schemas.validation import check_command
from tests import workload
from tests.strategies import clusters_hash

TOPICS = Topics()
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Soaked once with 150 seeds each of flipped bits and of overwritten ranges (no failure); CI runs a dozen.
KAFKA_RECORD = 1 << 20  # Kafka's default max.message.bytes (~1 MiB): every output must fit
T0 = workload.START_MS


def cli(*argv: str) -> tuple[int, str, str]:
    """``gpufold ARGV`` in-process: exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


def assert_one_clear_line(code: int, err: str) -> None:
    assert code == 2, (code, err)
    assert err.startswith("gpufold: error: ") and err.count("\n") == 1 and "Traceback" not in err, err


# ---------------------------------------------------------------- 3. oversized values anywhere


def _busy_state() -> PartitionState:
    state = PartitionState()
    for i, payload in enumerate(
        (AddNode("n1", 8000, 32768, "A100", 2), SubmitPod("p1", num_gpu=1, gpu_milli=1000, cpu_milli=10))
    ):
        decide(state, Command(f"setup-{i}", "c0", T0 + i, payload))
    return state


def _big(size: int, char: str) -> str:
    """An incompressible string (Kafka compresses; a run of one character would hide the size)."""
    rng = random.Random(size)
    return char + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(size - 1))


# (where, how to put a big string there) for every string and collection of the contract
OVERSIZED: list[tuple[str, Callable[[str], Command]]] = [
    ("command_id", lambda big: Command(big, "c0", T0, CordonNode("n1"))),
    ("cluster", lambda big: Command("x", big, T0, CordonNode("n1"))),
    ("source", lambda big: Command("x", "c0", T0, CordonNode("n1"), big)),
    ("node_id", lambda big: Command("x", "c0", T0, CordonNode(big))),
    ("gpu_model", lambda big: Command("x", "c0", T0, AddNode("n9", 1, 1, big, 1))),
    ("label key", lambda big: Command("x", "c0", T0, AddNode("n9", 1, 1, labels={big: "v"}))),
    ("label value", lambda big: Command("x", "c0", T0, AddNode("n9", 1, 1, labels={"k": big}))),
    ("labels", lambda big: Command("x", "c0", T0, AddNode("n9", 1, 1, labels={big[:i]: "" for i in range(1, 400)}))),
    ("taint key", lambda big: Command("x", "c0", T0, AddNode("n9", 1, 1, taints=(Taint(big),)))),
    ("taint value", lambda big: Command("x", "c0", T0, AddNode("n9", 1, 1, taints=(Taint("k", big),)))),
    ("taint effect", lambda big: Command("x", "c0", T0, AddNode("n9", 1, 1, taints=(Taint("k", "", big),)))),
    ("taints", lambda big: Command("x", "c0", T0, AddNode("n9", 1, 1, taints=(Taint("k"),) * 1000))),
    ("failure reason", lambda big: Command("x", "c0", T0, MarkNodeFailed("n1", big))),
    ("pod_id", lambda big: Command("x", "c0", T0, SubmitPod(big, cpu_milli=1))),
    ("tenant", lambda big: Command("x", "c0", T0, SubmitPod("p9", big, cpu_milli=1))),
    ("gpu_models item", lambda big: Command("x", "c0", T0, SubmitPod("p9", cpu_milli=1, gpu_models=(big,)))),
    ("gpu_models", lambda big: Command("x", "c0", T0, SubmitPod("p9", cpu_milli=1, gpu_models=("A100",) * 5000))),
    ("selector key", lambda big: Command("x", "c0", T0, SubmitPod("p9", cpu_milli=1, node_selector={big: ""}))),
    ("selector value", lambda big: Command("x", "c0", T0, SubmitPod("p9", cpu_milli=1, node_selector={"k": big}))),
    (
        "toleration key",
        lambda big: Command("x", "c0", T0, SubmitPod("p9", cpu_milli=1, tolerations=(Toleration(big),))),
    ),
    (
        "toleration value",
        lambda big: Command("x", "c0", T0, SubmitPod("p9", cpu_milli=1, tolerations=(Toleration("k", "Equal", big),))),
    ),
    (
        "toleration operator",
        lambda big: Command("x", "c0", T0, SubmitPod("p9", cpu_milli=1, tolerations=(Toleration("k", big),))),
    ),
    (
        "tolerations",
        lambda big: Command("x", "c0", T0, SubmitPod("p9", cpu_milli=1, tolerations=(Toleration(),) * 999)),
    ),
    ("release reason", lambda big: Command("x", "c0", T0, Release("p1", big))),
    ("policy", lambda big: Command("x", "c0", T0, SetPolicy(big))),
    ("queue_order", lambda big: Command("x", "c0", T0, SetPolicy("", queue_order=big))),
    ("gang_id", lambda big: Command("x", "c0", T0, SubmitGang(big, members=(GangMember("m", cpu_milli=1),)))),
    ("gang member id", lambda big: Command("x", "c0", T0, SubmitGang("g", members=(GangMember(big, cpu_milli=1),)))),
    ("gang members", lambda big: Command("x", "c0", T0, SubmitGang("g", members=_members(5000, "")))),
    ("gang text", lambda big: Command("x", "c0", T0, SubmitGang("g", members=_members(1000, big[:200])))),
    (
        "gang topology",
        lambda big: Command("x", "c0", T0, SubmitGang("g", members=_members(1, ""), topology_required=big)),
    ),
    ("depends_on", lambda big: Command("x", "c0", T0, SubmitPod("p9", cpu_milli=1, depends_on=(big,)))),
    ("dependency", lambda big: Command("x", "c0", T0, SubmitPod("p9", cpu_milli=1, depends_on=("a",), dependency=big))),
    ("release gang", lambda big: Command("x", "c0", T0, ReleaseGang(big))),
]


def _members(count: int, value: str) -> tuple[GangMember, ...]:
    tolerations = (Toleration("k", "Equal", value),) if value else ()
    return tuple(GangMember(f"m{i}", cpu_milli=1, tolerations=tolerations) for i in range(count))


def test_the_largest_gang_allowed_still_makes_events_that_fit_kafka() -> None:
    """A gang at the member and text limits is accepted, and its event (every member's spec) fits 1 MiB."""
    members = tuple(
        GangMember(f"member-{i:04d}", cpu_milli=1, tolerations=(Toleration("k", "Equal", "v" * 40),))
        for i in range(1024)
    )
    state = _busy_state()
    folder = PartitionFolder(0, TOPICS, state, snapshot_every=0)
    out: list[OutputRecord] = []
    command = Command("big-gang", "c0", T0 + 10, SubmitGang("g1", members=members))
    check_command(command)
    folder.fold(InputRecord(0, state.next_offset, b"c0", encode_command(command)), out)
    assert {type(decode_event(r.value).payload).__name__ for r in out} & {"GangQueued", "GangScheduled"}
    assert max(len(r.value) for r in out) < KAFKA_RECORD // 4


def _assert_bounded_rejection(command: Command, state: PartitionState) -> CommandRejected:
    """Folded from its frame: one small CommandRejected, as the publisher's check says; nothing else changes."""
    before, sequence = clusters_hash(state), state.sequence
    folder = PartitionFolder(0, TOPICS, state, snapshot_every=0)
    out: list[OutputRecord] = []
    folder.fold(InputRecord(0, state.next_offset, command.cluster.encode(), encode_command(command)), out)
    assert [record.topic for record in out] == [TOPICS.events]
    event = decode_event(out[0].value)
    rejection = event.payload
    assert isinstance(rejection, CommandRejected), event
    assert len(out[0].value) + len(out[0].key or b"") <= 4096, len(out[0].value)  # was 4x the bad value
    assert len(event.command_id) <= MAX_ID_LENGTH and len(event.cluster) <= MAX_ID_LENGTH
    assert len(rejection.message) <= MAX_MESSAGE_LENGTH
    assert clusters_hash(state) == before and state.sequence == sequence + 1
    with pytest.raises(Rejected) as refused:  # the publisher refuses it the same way, before sending
        check_command(command)
    if rejection.code != RejectionCode.UNKNOWN_GPU_MODEL or refused.value.code == rejection.code:
        assert refused.value.code == rejection.code
    return rejection


@pytest.mark.parametrize("build", [b for _, b in OVERSIZED], ids=[name for name, _ in OVERSIZED])
def test_a_300_kb_value_anywhere_is_a_small_rejection(build: Callable[[str], Command]) -> None:
    """A 300 KB value in any field becomes a rejection of a few hundred bytes (it was 1.2 MB)."""
    rejection = _assert_bounded_rejection(build(_big(300_000, "z")), _busy_state())
    assert rejection.code in RejectionCode.ALL


@SETTINGS
@given(
    where=st.sampled_from([b for _, b in OVERSIZED]),
    size=st.integers(MAX_ID_LENGTH + 1, 200_000),
    char=st.characters(codec="utf-8", categories=("L", "N", "P", "S")),
)
def test_any_oversized_value_is_a_bounded_rejection(where: Callable[[str], Command], size: int, char: str) -> None:
    """Generated: any field, any size over the bounds, any first character."""
    command = where(_big(size, char))
    try:
        check_command(command)
    except Rejected:
        pass
    else:  # a size that still fits this field (e.g. a reason under 1 KiB): nothing to check here
        assume(False)
    _assert_bounded_rejection(command, _busy_state())


def test_an_oversized_undecodable_record_is_a_small_dead_letter() -> None:
    """Garbage bigger than a dead letter may copy is referenced (size, sha256, position), not copied."""
    folder = PartitionFolder(0, TOPICS, PartitionState(), snapshot_every=0)
    out: list[OutputRecord] = []
    garbage = random.Random(1).randbytes(MAX_DEAD_LETTER_VALUE_BYTES + 100_000)
    folder.fold(InputRecord(0, 0, b"k" * 5000, garbage), out)
    (record,) = out
    letter = decode_dead_letter(record.value)
    assert record.topic == TOPICS.dead_letters and len(record.value) + len(record.key or b"") < KAFKA_RECORD // 2
    assert letter.value is None and letter.key is None and "sha256" in letter.error and "@0" in letter.error
    assert folder.state.next_offset == 1


# ---------------------------------------------------------------- 2. hostile JSON lines


GOOD = '{"command_id": "g%d", "cluster": "lab", "issued_at": 1767225600000, "payload": {"SetPolicy": {"policy": "spread"}}}'  # noqa: E501
HOSTILE_LINES: list[tuple[str, bytes, str]] = [
    ("deep nesting", b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested 100001 levels"),
    ("lone surrogate", GOOD.replace('"g%d"', '"\\ud800"').encode(), "lone surrogate"),
    ("non-UTF-8 byte", GOOD.replace("lab", "l\xffb").encode("latin-1"), "not UTF-8: byte 0xff at column"),
    (
        "duplicate key",
        GOOD.replace('"cluster": "lab"', '"cluster": "lab", "cluster": "prod"').encode(),
        "duplicate key",
    ),
    ("huge integer", GOOD.replace("1767225600000", "9" * 5000).encode(), "not JSON this reader accepts"),
    ("NaN time", GOOD.replace("1767225600000", "NaN").encode(), "expected epoch milliseconds"),
    ("infinite time", GOOD.replace("1767225600000", "1e400").encode(), "expected epoch milliseconds"),
    ("time past Avro long", GOOD.replace("1767225600000", str(1 << 64)).encode(), "does not fit in an Avro long"),
    ("line of 2 MiB", b'{"command_id": "' + b"x" * (2 << 20) + b'"}', "over the limit"),
    ("NUL in the JSON", GOOD.replace(", ", ",\x00 ").encode(), "not JSON"),
    ("a JSON array", b"[1, 2, 3]", "expected a JSON object"),
    ("truncated", GOOD.encode()[:-7], "not JSON"),
    ("unknown field", GOOD.replace('"cluster"', '"clutser"').encode(), "unknown field"),
    ("payload of two types", GOOD.replace("}}}", '}, "Release": {"pod_id": "p"}}}').encode(), "exactly one key"),
]


@pytest.mark.parametrize(("line", "reason"), [c[1:] for c in HOSTILE_LINES], ids=[c[0] for c in HOSTILE_LINES])
def test_a_hostile_line_is_reported_and_skipped_and_the_rest_lands(tmp_path: Path, line: bytes, reason: str) -> None:
    """Between two good lines, a hostile one is reported with its number and reason; both good lines land."""
    source = tmp_path / "in.jsonl"
    source.write_bytes((GOOD % 1).encode() + b"\n" + line + b"\n" + (GOOD % 3).encode() + b"\n")
    log = str(tmp_path / "log.sqlite")
    code, out, err = cli("log", "append", "--create", "--log", log, str(source))
    assert code == 1 and "appended 2 command(s)" in out and "skipped 1 bad line(s)" in out
    assert "in.jsonl line 2: " in err and reason in err and "Traceback" not in err and len(err) < 1000, err
    with EmbeddedLog(log, readonly=True) as opened:
        assert [r.offset for r in opened.read_commands(0, 0, 10)] == [0, 1]


def test_a_byte_order_mark_before_the_first_line_is_ignored(tmp_path: Path) -> None:
    """A file saved with a UTF-8 BOM appends its first line like the others."""
    source = tmp_path / "bom.jsonl"
    source.write_bytes(b"\xef\xbb\xbf" + (GOOD % 1).encode() + b"\r\n" + (GOOD % 2).encode() + b"\r\n")
    code, out, _ = cli("log", "append", "--create", "--log", str(tmp_path / "l.sqlite"), str(source))
    assert code == 0 and "appended 2 command(s)" in out


def _mutated(rng: random.Random, line: bytes) -> bytes:
    data = bytearray(line)
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(("flip", "insert", "delete", "byte"))
        at = rng.randrange(len(data)) if data else 0
        if kind == "flip" and data:
            data[at] ^= 1 << rng.randrange(8)
        elif kind == "insert":
            data[at:at] = rng.choice((b"[", b"{", b'"', b"\\u", b"\xff", b"\xc3", b"\x1b[2J", b"\\ud800", b'":1,"'))
        elif kind == "delete" and data:
            del data[at]
        else:
            data[at:at] = bytes([rng.randrange(256)])
    return bytes(data).replace(b"\n", b" ")


@SETTINGS
@given(seed=st.integers(0, 2**32), lines=st.integers(1, 30))
def test_generated_files_append_exactly_their_good_lines(
    tmp_path_factory: pytest.TempPathFactory, seed: int, lines: int
) -> None:
    """Mutated and random lines: exactly the lines that parse on their own are appended; each other is reported."""
    rng = random.Random(seed)
    raw = [
        (GOOD % i).encode() if rng.random() < 0.4 else _mutated(rng, (GOOD % i).encode()) if rng.random() < 0.8
        else rng.randbytes(rng.randint(0, 200)).replace(b"\n", b"")
        for i in range(lines)
    ]  # fmt: skip
    good, silent = [], set()  # lines that parse; blank and comment lines (skipped without a word)
    for number, line in enumerate(raw, start=1):
        try:
            item = parse_text(number, line.decode("utf-8"))
        except UnicodeDecodeError:
            continue  # reported: even a comment must be text
        if item is None:
            silent.add(number)
        elif not hasattr(item, "reason"):
            good.append(number)
    folder = tmp_path_factory.mktemp("append")
    (folder / "in.jsonl").write_bytes(b"\n".join(raw) + b"\n")
    code, out, err = cli("log", "append", "--create", "--log", str(folder / "l.sqlite"), str(folder / "in.jsonl"))
    assert "Traceback" not in err
    assert f"appended {len(good)} command(s)" in out
    reported = {int(line.split(" line ")[1].split(":")[0]) for line in err.splitlines() if " line " in line}
    assert reported == set(range(1, lines + 1)) - set(good) - silent
    assert code == (1 if reported else 0)


# ---------------------------------------------------------------- 4. a damaged embedded log


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A folded log of 1,500 commands (with a snapshot) and what every read command says about it."""
    folder = tmp_path_factory.mktemp("pristine")
    log = folder / "log.sqlite"
    with EmbeddedLog(log) as opened:
        commands = list(workload.commands(1_500, nodes=30, seed=5))
        opened.append_commands([(c.cluster.encode(), encode_command(c)) for c in commands])
    assert cli("run", "--log", str(log), "--no-progress", "--snapshot-every", "1000")[0] == 0
    answers = {name: cli(*argv, "--log", str(log)) for name, argv in READS.items()}
    assert all(code == 0 for code, _, _ in answers.values()), answers
    return Pristine({"log": log, "answers": answers, "size": log.stat().st_size})


class Pristine(dict):  # type: ignore[type-arg]
    """The pristine log's facts (a short repr: hypothesis prints its arguments when a case fails)."""

    def __repr__(self) -> str:
        return f"Pristine({self['log']})"


READS = {
    "state": ("state", "--json"),
    "replay": ("replay", "--json"),
    "events": ("events", "--json", "--limit", "100000"),
    "info": ("log", "info", "--json"),
}
PAGE = 4096


def _damaged_copy(pristine: dict[str, Any], folder: Path, damage: Callable[[bytearray], None]) -> str:
    data = bytearray(pristine["log"].read_bytes())
    damage(data)
    copy = folder / "damaged.sqlite"
    copy.write_bytes(bytes(data))
    return str(copy)


def _stable(out: str) -> list[Any]:
    """JSON lines without the timing fields."""
    values = [json.loads(line) for line in out.splitlines()]
    for value in values:
        for key in ("seconds", "commands_per_sec"):
            value.pop(key, None)
    return values


def _check_reads(copy: str, pristine: dict[str, Any], names: tuple[str, ...] = tuple(READS)) -> None:
    """Each read gives the pristine answer or one clear error line: never another answer with exit 0."""
    for name in names:
        code, out, err = cli(*READS[name], "--log", copy)
        if code == 0:
            expected = pristine["answers"][name][1]
            if name == "info":  # it names the file
                out, expected = out.replace(copy, "LOG"), expected.replace(str(pristine["log"]), "LOG")
            assert _stable(out) == _stable(expected), f"{name} answered differently with exit 0 on a damaged log"
        else:
            assert_one_clear_line(code, err)


@pytest.mark.parametrize("page", [1, 3, 8, 21, -2, -1])
def test_a_zeroed_page_is_one_clear_error_or_no_change(tmp_path: Path, pristine: dict[str, Any], page: int) -> None:
    """A page of zeros (a torn write) anywhere: every read command errors in one line or answers as before."""
    pages = pristine["size"] // PAGE

    def zero(data: bytearray) -> None:
        at = (page % pages) * PAGE
        data[at : at + PAGE] = bytes(PAGE)

    copy = _damaged_copy(pristine, tmp_path, zero)
    _check_reads(copy, pristine)
    code, out, err = cli("run", "--log", copy, "--no-progress")
    assert (code == 0 and "nothing to fold" in out) or code == 2, (code, out, err)
    if code:
        assert_one_clear_line(code, err)


def test_truncation_and_garbage_are_one_clear_error(tmp_path: Path, pristine: dict[str, Any]) -> None:
    """A log cut short, or overwritten with text, is refused by every command in one line."""
    for damage in (
        lambda data: data.__delitem__(slice(len(data) // 2, None)),
        lambda data: data.__setitem__(slice(0, 100), b"not a log " * 10),
    ):
        copy = _damaged_copy(pristine, tmp_path, damage)
        for name in READS:
            assert_one_clear_line(*cli(*READS[name], "--log", copy)[::2])


def test_schema_text_that_does_not_decode_is_one_clear_error(tmp_path: Path, pristine: dict[str, Any]) -> None:
    """A flipped bit in the schema's own text (``CREATE TABLE`` of a table, kept in the file, no longer UTF-8:
    SQLite hands Python text it cannot decode): every read refuses in one line, not "unexpected
    UnicodeDecodeError" (found by the flipped-bits test below, seed 2808)."""

    def unreadable(data: bytearray) -> None:
        at = data.index(b"CREATE TABLE consumer_offsets") + len("CREATE TABL")
        data[at] ^= 0x80  # "E" becomes 0xC5, a lead byte followed by a space: invalid UTF-8

    copy = _damaged_copy(pristine, tmp_path, unreadable)
    for name in READS:
        code, _out, err = cli(*READS[name], "--log", copy)
        assert_one_clear_line(code, err)
        assert "damaged" in err, err


RECORDS_CRC = b"    crc INTEGER,\n    PRIMARY KEY (topic,"  # the records table's checksum column, in its schema text


def test_a_checksum_column_named_in_another_case_still_checks(tmp_path: Path, pristine: dict[str, Any]) -> None:
    """A flipped bit that turns the schema's ``crc`` into ``Crc`` names the same column (SQLite ignores case in
    names): the records are still checked, so a damaged record is an error, not another answer (before, the log
    was taken for one written before the checksums and read unchecked: a soak of the flipped-bits test found a
    replay that answered another state with exit 0)."""

    def damage(data: bytearray) -> None:
        data[data.index(RECORDS_CRC) + 4] ^= 0x20  # "crc" -> "Crc"
        data[data.index(b"c1-cmd-50") + 8] ^= 0x01  # and a command's id in its record

    copy = _damaged_copy(pristine, tmp_path, damage)
    code, _out, err = cli(*READS["replay"], "--log", copy)  # reads every command
    assert_one_clear_line(code, err)
    assert "fails its checksum" in err, err
    _check_reads(copy, pristine)  # the others: the pristine answer (a snapshot past the record) or that error


def test_a_schema_that_lost_its_checksum_columns_is_refused(tmp_path: Path, pristine: dict[str, Any]) -> None:
    """The schema's ``crc`` renamed by damage: the log's meta rows carry their checksum, so it was written with the
    checksum columns, and it is refused rather than read unchecked as a log from before them."""

    def damage(data: bytearray) -> None:
        data[data.index(RECORDS_CRC) + 6] ^= 0x07  # "crc" -> "crd"

    copy = _damaged_copy(pristine, tmp_path, damage)
    for name in READS:
        code, _out, err = cli(*READS[name], "--log", copy)
        assert_one_clear_line(code, err)
        assert "lost its checksum columns" in err, err


def test_a_record_whose_blob_reads_back_as_text_is_one_clear_error(tmp_path: Path, pristine: dict[str, Any]) -> None:
    """A flipped bit in a row's header can turn its key's type from blob to text: SQLite then hands back ``str``.
    Every read refuses it in one line (before: "unexpected TypeError" from the checksum, found by a soak of the
    flipped-bits test, seed 3179 of ``Random(seed)`` drawing the flips too)."""
    copy = tmp_path / "damaged.sqlite"
    copy.write_bytes(pristine["log"].read_bytes())
    with contextlib.closing(sqlite3.connect(copy)) as db:
        db.execute('UPDATE records SET key = CAST(key AS TEXT) WHERE topic = ? AND "offset" = 7', (TOPICS.commands,))
        db.commit()
    code, _out, err = cli(*READS["replay"], "--log", str(copy))
    assert_one_clear_line(code, err)
    assert "holds text where bytes belong" in err, err
    _check_reads(str(copy), pristine)


def test_a_damaged_recorded_end_is_refused_when_the_log_opens(tmp_path: Path, pristine: dict[str, Any]) -> None:
    """The commands' tail lost, and the row that records their end damaged too (its topic's text): a read looks the
    end up by topic and partition, so it found none and answered from what was left, exit 0 (a soak of the
    flipped-bits test, seed 20211 of ``Random(seed)`` drawing the flips too: two bits did it). Every recorded end
    is checked when the log opens."""
    copy = tmp_path / "damaged.sqlite"
    copy.write_bytes(pristine["log"].read_bytes())
    with contextlib.closing(sqlite3.connect(copy)) as db:
        db.execute('DELETE FROM records WHERE topic = ? AND "offset" >= 15', (TOPICS.commands,))
        db.execute("UPDATE ends SET topic = 'gpufold.comoands' WHERE topic = ?", (TOPICS.commands,))
        db.commit()
    for name in ("replay", *READS):  # replay first: before, it answered from 15 commands with exit 0
        code, _out, err = cli(*READS[name], "--log", str(copy))
        assert_one_clear_line(code, err)
        assert "a recorded end ('gpufold.comoands') fails its checksum" in err, err


def test_a_damaged_committed_position_is_refused_when_the_log_opens(tmp_path: Path, pristine: dict[str, Any]) -> None:
    """A committed position's row damaged (its topic's text): a read looks it up by group, topic and partition and
    found none, so ``log info`` reported the processor at offset 0, exit 0. Every committed position is checked
    when the log opens, as every recorded end is."""
    copy = tmp_path / "damaged.sqlite"
    copy.write_bytes(pristine["log"].read_bytes())
    with contextlib.closing(sqlite3.connect(copy)) as db:
        db.execute("UPDATE consumer_offsets SET topic = 'gpufold.comoands' WHERE topic = ?", (TOPICS.commands,))
        db.commit()
    for argv in (*READS.values(), ("run", "--no-progress")):
        code, _out, err = cli(*argv, "--log", str(copy))
        assert_one_clear_line(code, err)
        assert "gpufold.comoands[0] fails its checksum" in err, err


@SETTINGS
@example(seed=2808, flips=11)  # flips a bit of the schema's text in the log these tests build
@given(seed=st.integers(0, 2**32), flips=st.integers(1, 40))
def test_flipped_bits_never_change_an_answer_silently(
    tmp_path_factory: pytest.TempPathFactory, pristine: dict[str, Any], seed: int, flips: int
) -> None:
    """Any number of flipped bits anywhere (the issue's 20 folded 230 of 1,500 commands with exit 0)."""
    rng = random.Random(seed)

    def flip(data: bytearray) -> None:
        for _ in range(flips):
            at = rng.randrange(100, len(data))  # the 100-byte header is covered by the garbage test
            data[at] ^= 1 << rng.randrange(8)

    copy = _damaged_copy(pristine, tmp_path_factory.mktemp("flips"), flip)
    _check_reads(copy, pristine, ("state", "replay"))


# ---------------------------------------------------------------- 5. a damaged export


@pytest.fixture(scope="module")
def export(pristine: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "export"
    assert cli("log", "export", "--log", str(pristine["log"]), str(out))[0] == 0
    return out


def _assert_import_refused(directory: Path, target: Path, reason: str) -> None:
    code, _, err = cli("log", "import", "--log", str(target), str(directory))
    assert_one_clear_line(code, err)
    assert reason in err, err
    assert not target.exists()


def test_an_intact_export_imports_to_the_same_state(export: Path, tmp_path: Path, pristine: dict[str, Any]) -> None:
    """The manifest's checks pass on an untouched export, and the copy replays to the same answer."""
    target = tmp_path / "copy.sqlite"
    assert cli("log", "import", "--log", str(target), str(export))[0] == 0
    assert _stable(cli("replay", "--json", "--log", str(target))[1]) == _stable(pristine["answers"]["replay"][1])
    manifest = json.loads((export / "manifest.json").read_text())
    commands = json.loads(pristine["answers"]["info"][1])["partitions"][0]["commands"]
    assert manifest["files"]["commands.avro"]["records"] == commands


@pytest.mark.parametrize(
    ("name", "damage", "reason"),
    [
        ("truncated", lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "truncated or changed"),
        ("one byte flipped", lambda p: p.write_bytes(_flip(p.read_bytes(), p.stat().st_size // 2)), "SHA-256"),
        ("a byte of the header", lambda p: p.write_bytes(_flip(p.read_bytes(), 20)), "SHA-256"),
        ("emptied", lambda p: p.write_bytes(b""), "truncated or changed"),
    ],
)
def test_a_damaged_export_file_is_refused_before_anything_is_written(
    export: Path, tmp_path: Path, name: str, damage: Callable[[Path], None], reason: str
) -> None:
    """Truncation or a flipped byte (even inside a deflate block, which has no checksum) is refused."""
    copy = tmp_path / "export"
    shutil.copytree(export, copy)
    damage(copy / "commands.avro")
    _assert_import_refused(copy, tmp_path / "new.sqlite", reason)


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :]


def test_a_missing_or_edited_manifest_is_refused(export: Path, tmp_path: Path) -> None:
    """No manifest, a damaged one, or one whose count was edited: refused, nothing written."""
    copy = tmp_path / "export"
    shutil.copytree(export, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["events.avro"]["records"] += 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    _assert_import_refused(copy, tmp_path / "a.sqlite", "the manifest says")
    (copy / "manifest.json").write_text('{"files": ')
    _assert_import_refused(copy, tmp_path / "b.sqlite", "manifest.json is damaged")
    (copy / "manifest.json").unlink()
    _assert_import_refused(copy, tmp_path / "c.sqlite", "--unverified")


@SETTINGS
@given(at=st.floats(0.0, 0.999), bit=st.integers(0, 7))
def test_any_flipped_bit_of_an_export_is_refused(
    export: Path, tmp_path_factory: pytest.TempPathFactory, at: float, bit: int
) -> None:
    """Generated: a bit flipped anywhere in any exported file, and --unverified still gives one line or a log."""
    folder = tmp_path_factory.mktemp("flip")
    copy = folder / "export"
    shutil.copytree(export, copy)
    victim = copy / random.Random(int(at * 1e6)).choice(("commands.avro", "events.avro", "snapshots.avro"))
    data = bytearray(victim.read_bytes())
    data[int(at * len(data))] ^= 1 << bit
    victim.write_bytes(bytes(data))
    _assert_import_refused(copy, folder / "new.sqlite", "SHA-256")
    code, _, err = cli("log", "import", "--unverified", "--log", str(folder / "u.sqlite"), str(copy))
    assert code == 0 or (code == 2 and err.count("\n") == 1 and "Traceback" not in err), err


def test_a_log_being_written_never_looks_damaged(tmp_path: Path) -> None:
    """Readers checking ends, counts, chains and restores while a processor appends and commits see no damage."""
    import threading

    from processor.runtime.loop import Processor, restore_state

    path = tmp_path / "busy.sqlite"
    commands = list(workload.commands(2_500, nodes=20, seed=4))
    with EmbeddedLog(path) as log:
        log.append_commands([(b"c1", encode_command(c)) for c in commands[:100]])
    stop, errors = threading.Event(), []

    def write() -> None:
        with EmbeddedLog(path) as log:
            processor = Processor(log, batch_size=50, snapshot_every=500)
            for i in range(100, len(commands), 50):
                if stop.is_set():
                    return
                log.append_commands([(b"c1", encode_command(c)) for c in commands[i : i + 50]])
                processor.run_batch(0.0)

    def read() -> None:
        try:
            while not stop.is_set():
                with EmbeddedLog(path, readonly=True) as log:
                    for topic in (log.topics.commands, log.topics.events, log.topics.snapshots):
                        log.count(topic)
                        log.end_offset(topic, 0)
                    sum(1 for _ in log.read(log.topics.events, 0))
                    restore_state(log, 0)
        except Exception as error:
            errors.append(error)

    writer = threading.Thread(target=write)
    readers = [threading.Thread(target=read) for _ in range(2)]
    for thread in (writer, *readers):
        thread.start()
    writer.join(60)
    stop.set()
    for thread in readers:
        thread.join(30)
    assert not errors, errors[0]
