"""The bad-input corpus: undecodable bytes and invalid commands through ``PartitionFolder.fold``.

Every bad record yields a dead letter (bytes that do not decode) or exactly one
``CommandRejected`` (a well-formed command the domain refuses), never an
exception; the allocation state is unchanged and the next good record folds.

What "unchanged" means: a dead letter changes nothing but the position, so
``state_hash`` is equal before and after. A rejection also takes one event
sequence number and remembers the command id in the idempotency window (both
part of ``state_hash``), so there the clusters, nodes and pods are compared.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logs.port import InputRecord, OutputRecord
from processor.core.fold import HANDLERS
from processor.core.snapshot import state_hash
from processor.core.state import PartitionState
from processor.runtime.loop import PartitionFolder
from schemas import COMMAND, DEAD_LETTER, EVENT, SNAPSHOT, registry
from schemas.codes import RejectionCode
from schemas.commands import (
    AddNode,
    Command,
    CommandPayload,
    CordonNode,
    Defragment,
    DrainNode,
    GangMember,
    MarkNodeFailed,
    Quota,
    RecoverNode,
    Release,
    ReleaseGang,
    RemoveCohort,
    RemoveDisruptionBudget,
    RemoveNode,
    RemoveQuota,
    ResumeCluster,
    Retry,
    SetCohort,
    SetPolicy,
    SetQuota,
    SubmitGang,
    SubmitPod,
    Taint,
    Toleration,
    UncordonNode,
)
from schemas.events import CommandRejected, Event
from schemas.fastcodec import decode_event
from schemas.topics import Topics
from tests.property.test_fold_properties import check_state
from tests.strategies import clusters_hash, command_streams, wild_commands

TOPICS = Topics()
BAD_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STREAM_SETTINGS = settings(BAD_SETTINGS, max_examples=100)  # whole command streams per example


def frame(payload: CommandPayload, command_id: str = "bad-1", cluster: str = "c0", issued_at: int = 5) -> bytes:
    return registry().codec(COMMAND).encode(Command(command_id, cluster, issued_at, payload).to_avro())


class Harness:
    """A folder over a small busy cluster: n1 (2 x A100) runs p1, n2 is idle, p2 waits for 8 GPUs."""

    def __init__(self) -> None:
        self.folder = PartitionFolder(0, TOPICS, PartitionState(), snapshot_every=0)
        self.offset = 0
        for payload in (
            AddNode("n1", 8000, 32768, "A100", 2),
            AddNode("n2", 8000, 32768, "A100", 2, {"zone": "a"}),
            SubmitPod("p1", num_gpu=1, gpu_milli=1000, cpu_milli=1000, memory_mib=1024),
            SubmitPod("p2", num_gpu=8, gpu_milli=1000),
            SetPolicy("first-fit"),
        ):
            self.feed(frame(payload, f"setup-{self.offset}"))
        assert self.folder.state.clusters["c0"].pods["p1"].node_id == "n1"

    def feed(self, value: bytes | None) -> list[OutputRecord]:
        out: list[OutputRecord] = []
        self.folder.fold(InputRecord(0, self.offset, b"c0", value), out)
        self.offset += 1
        return out

    def expect_dead_letter(self, value: bytes | None) -> str:
        """Fold a record that must become a dead letter; returns its error."""
        before = state_hash(self.folder.state)
        out = self.feed(value)
        assert [record.topic for record in out] == [TOPICS.dead_letters]
        assert state_hash(self.folder.state) == before
        assert self.folder.state.next_offset == self.offset
        letter = registry().codec(DEAD_LETTER).decode(out[0].value)
        assert (letter["topic"], letter["partition"], letter["offset"]) == (TOPICS.commands, 0, self.offset - 1)
        assert letter["value"] == value
        assert 0 < len(letter["error"]) <= 400, letter["error"]  # a reason, not a dump
        return str(letter["error"])

    def expect_rejection(self, value: bytes) -> CommandRejected:
        """Fold a command that must be refused; returns the rejection."""
        state = self.folder.state
        before, sequence, seen = clusters_hash(state), state.sequence, list(state.seen)
        out = self.feed(value)
        assert [record.topic for record in out] == [TOPICS.events]
        event = Event.from_avro(registry().codec(EVENT).decode(out[0].value))
        assert isinstance(event.payload, CommandRejected), event
        assert event.payload.code in RejectionCode.ALL
        assert event.payload.message
        assert clusters_hash(state) == before
        assert state.sequence == sequence + 1
        assert [command_id for command_id in state.seen if command_id not in seen] in ([], [event.command_id])
        return event.payload

    def still_works(self) -> None:
        """A good command after the bad ones is folded normally."""
        out = self.feed(frame(SubmitPod(f"ok-{self.offset}", cpu_milli=10), f"ok-{self.offset}"))
        event = Event.from_avro(registry().codec(EVENT).decode(out[0].value))
        assert event.type_name == "PodScheduled"


@pytest.fixture
def harness() -> Harness:
    return Harness()


# ---------------------------------------------------------------- bytes that do not decode


def _good_frame() -> bytes:
    return frame(SubmitPod("p9", num_gpu=1, gpu_milli=500, cpu_milli=100, node_selector={"zone": "a"}))


def _other_records() -> dict[str, bytes]:
    codecs = registry()
    event = Event(0, 0, "c0", "x", 0, 0, CommandRejected("x", "AddNode", "INVALID_COMMAND", "m")).to_avro()
    snapshot = {"partition": 0, "next_offset": 0, "sequence": 0, "seen_window": 1, "seen": [], "clusters": []}
    letter = {"topic": "t", "partition": 0, "offset": 0, "error": "e", "key": None, "value": None}
    return {
        "event": codecs.codec(EVENT).encode(event),
        "snapshot": codecs.codec(SNAPSHOT).encode(snapshot),
        "dead letter": codecs.codec(DEAD_LETTER).encode(letter),
    }


UNDECODABLE: dict[str, Any] = {
    "empty": b"",
    "tombstone (None)": None,
    "one byte": b"\xc3",
    "header only": _good_frame()[:10],
    "wrong magic": b"\x00\x01" + _good_frame()[2:],
    "Avro object container": b"Obj\x01" + _good_frame()[4:],
    "unknown fingerprint": _good_frame()[:2] + b"\xde\xad\xbe\xef\x00\x00\x00\x00" + _good_frame()[10:],
    "reversed fingerprint": _good_frame()[:2] + _good_frame()[2:10][::-1] + _good_frame()[10:],
    "trailing garbage": _good_frame() + b"\x00\x01",
    "JSON instead of Avro": b'{"command_id": "x", "cluster": "c0"}',
    "union index out of range": _good_frame()[:10] + b"\x02x\x04c0\x02\x00\x7f",
    "negative string length": _good_frame()[:10] + b"\x01",
    "huge string length": _good_frame()[:10] + b"\xfe\xff\xff\xff\x0f",
    "invalid UTF-8 in an id": _good_frame()[:10] + b"\x04\xff\xfe" + _good_frame()[13:],
    **{f"valid {name} frame": value for name, value in _other_records().items()},
}


@pytest.mark.parametrize("value", list(UNDECODABLE.values()), ids=list(UNDECODABLE))
def test_undecodable_record_becomes_a_dead_letter(harness: Harness, value: bytes | None) -> None:
    """Bytes that are not a Command frame become one dead letter with the error; state is unchanged; folding goes on."""
    assert harness.expect_dead_letter(value)
    harness.still_works()


def test_every_truncation_of_a_valid_frame_is_a_dead_letter(harness: Harness) -> None:
    """A frame cut at any length short of whole is a dead letter, never a partial command."""
    whole = _good_frame()
    for length in range(len(whole)):
        harness.expect_dead_letter(whole[:length])
    harness.still_works()


@BAD_SETTINGS
@given(st.binary(max_size=64))
def test_random_bytes_become_dead_letters(value: bytes) -> None:
    """Random bytes (almost never a valid frame) become dead letters and never raise."""
    harness = Harness()
    harness.expect_dead_letter(value)
    harness.still_works()


@BAD_SETTINGS
@given(st.binary(max_size=48))
def test_random_bodies_behind_a_valid_header_never_raise(body: bytes) -> None:
    """A valid header with a random body gives a dead letter, or a command that folds to events: never an exception."""
    harness = Harness()
    out = harness.feed(_good_frame()[:10] + body)
    assert out
    assert {record.topic for record in out} <= {TOPICS.dead_letters, TOPICS.events}
    assert len(out) == 1 or all(record.topic == TOPICS.events for record in out)
    harness.still_works()


@STREAM_SETTINGS
@given(command_streams(max_size=20), st.data())
def test_mutated_frames_never_raise(commands: list[Command], data: st.DataObject) -> None:
    """Valid command frames with a flipped or dropped byte fold to a dead letter or to events, never an exception."""
    folder = PartitionFolder(0, TOPICS, PartitionState(), snapshot_every=0)
    codec = registry().codec(COMMAND)
    for offset, command in enumerate(commands):
        value = bytearray(codec.encode(command.to_avro()))
        position = data.draw(st.integers(0, len(value) - 1))
        if data.draw(st.booleans()):
            value[position] ^= 1 << data.draw(st.integers(0, 7))
        else:
            del value[position]
        out: list[OutputRecord] = []
        folder.fold(InputRecord(0, offset, None, bytes(value)), out)
        assert out
        assert folder.state.next_offset == offset + 1


@STREAM_SETTINGS
@given(command_streams(max_size=25), st.lists(wild_commands(), min_size=1, max_size=25), st.randoms())
def test_wild_values_in_a_stream_never_raise_and_keep_the_invariants(
    commands: list[Command], wild: list[Command], random: Any
) -> None:
    """Commands with any schema-valid values, mixed into a normal stream, are folded or refused, never raise,
    and a refused one leaves the clusters as they were."""
    mixed = list(commands)
    for command in wild:
        mixed.insert(random.randint(0, len(mixed)), command)
    folder = PartitionFolder(0, TOPICS, PartitionState(), snapshot_every=0)
    codec, events = registry().codec(COMMAND), registry().codec(EVENT)
    for offset, command in enumerate(mixed):
        before = clusters_hash(folder.state)
        out: list[OutputRecord] = []
        folder.fold(InputRecord(0, offset, None, codec.encode(command.to_avro())), out)
        decoded = [Event.from_avro(events.decode(record.value)) for record in out]
        assert decoded and all(record.topic == TOPICS.events for record in out)
        if isinstance(decoded[0].payload, CommandRejected):
            assert len(decoded) == 1
            assert clusters_hash(folder.state) == before
        check_state(folder.state)


# ---------------------------------------------------------------- well-formed commands the domain refuses

BIG = 1 << 60
MEMBER = GangMember("m1", cpu_milli=1000)
INVALID: list[tuple[str, CommandPayload, str]] = [
    ("resume of a cluster that is not halted", ResumeCluster(), RejectionCode.NOT_HALTED),
    # sizes: negative, zero, absurd
    ("node with negative CPU", AddNode("n9", -1, 1024, "A100", 1), RejectionCode.INVALID_RESOURCES),
    ("node with zero CPU", AddNode("n9", 0, 1024), RejectionCode.INVALID_RESOURCES),
    ("node with zero memory", AddNode("n9", 1000, 0), RejectionCode.INVALID_RESOURCES),
    ("node with absurd memory", AddNode("n9", 1000, BIG), RejectionCode.INVALID_RESOURCES),
    ("node with absurd CPU", AddNode("n9", BIG, 1024), RejectionCode.INVALID_RESOURCES),
    ("node with negative GPU count", AddNode("n9", 1000, 1024, "A100", -1), RejectionCode.INVALID_RESOURCES),
    ("node with 1000 GPUs", AddNode("n9", 1000, 1024, "A100", 1000), RejectionCode.INVALID_RESOURCES),
    ("GPU node without a model", AddNode("n9", 1000, 1024, "", 2), RejectionCode.UNKNOWN_GPU_MODEL),
    ("GPU model with spaces", AddNode("n9", 1000, 1024, "A 100", 2), RejectionCode.UNKNOWN_GPU_MODEL),
    ("taint with a bad effect", AddNode("n9", 1000, 1024, taints=(Taint("k", "", "Never"),)), "INVALID_COMMAND"),
    ("taint with an empty key", AddNode("n9", 1000, 1024, taints=(Taint(""),)), RejectionCode.INVALID_COMMAND),
    ("label with an empty key", AddNode("n9", 1000, 1024, labels={"": "x"}), RejectionCode.INVALID_COMMAND),
    ("pod asking for nothing", SubmitPod("p9"), RejectionCode.INVALID_RESOURCES),
    ("pod with negative CPU", SubmitPod("p9", cpu_milli=-5), RejectionCode.INVALID_RESOURCES),
    ("pod with negative memory", SubmitPod("p9", cpu_milli=5, memory_mib=-1), RejectionCode.INVALID_RESOURCES),
    ("pod with absurd CPU", SubmitPod("p9", cpu_milli=BIG), RejectionCode.INVALID_RESOURCES),
    ("pod with negative GPUs", SubmitPod("p9", num_gpu=-1, gpu_milli=1000), RejectionCode.INVALID_RESOURCES),
    ("pod with 65 GPUs", SubmitPod("p9", num_gpu=65, gpu_milli=1000), RejectionCode.INVALID_RESOURCES),
    ("share of zero milli", SubmitPod("p9", num_gpu=1, gpu_milli=0), RejectionCode.INVALID_RESOURCES),
    ("share over 1000 milli", SubmitPod("p9", num_gpu=1, gpu_milli=1500), RejectionCode.INVALID_RESOURCES),
    ("milli without a GPU", SubmitPod("p9", num_gpu=0, gpu_milli=500), RejectionCode.INVALID_RESOURCES),
    ("two half GPUs", SubmitPod("p9", num_gpu=2, gpu_milli=500), RejectionCode.INVALID_RESOURCES),
    ("bad toleration operator", SubmitPod("p9", cpu_milli=1, tolerations=(Toleration("k", "In"),)), "INVALID_COMMAND"),
    (
        "bad toleration effect",
        SubmitPod("p9", cpu_milli=1, tolerations=(Toleration("k", "Exists", "", "X"),)),
        "INVALID_COMMAND",
    ),
    # ids
    ("empty node id", AddNode("", 1000, 1024), RejectionCode.INVALID_COMMAND),
    ("node id with a space", AddNode("n 9", 1000, 1024), RejectionCode.INVALID_COMMAND),
    ("node id of 254 characters", AddNode("n" * 254, 1000, 1024), RejectionCode.INVALID_COMMAND),
    ("empty pod id", SubmitPod("", cpu_milli=1), RejectionCode.INVALID_COMMAND),
    ("pod id with a newline", SubmitPod("p\n9", cpu_milli=1), RejectionCode.INVALID_COMMAND),
    ("empty tenant", SubmitPod("p9", tenant="", cpu_milli=1), RejectionCode.INVALID_COMMAND),
    ("empty release id", Release(""), RejectionCode.INVALID_COMMAND),
    ("empty node to cordon", CordonNode(""), RejectionCode.INVALID_COMMAND),
    # sizes over the contract's bounds (schemas.limits)
    ("node with 257 labels", AddNode("n9", 1000, 1024, labels={f"k{i}": "v" for i in range(257)}), "TOO_LARGE"),
    ("node with 65 taints", AddNode("n9", 1000, 1024, taints=tuple(Taint(f"k{i}") for i in range(65))), "TOO_LARGE"),
    ("taint value of 254 characters", AddNode("n9", 1000, 1024, taints=(Taint("k", "v" * 254),)), "TOO_LARGE"),
    ("pod with 65 GPU models", SubmitPod("p9", cpu_milli=1, gpu_models=("A100",) * 65), RejectionCode.TOO_LARGE),
    (
        "pod with 65 selector entries",
        SubmitPod("p9", cpu_milli=1, node_selector={str(i): "" for i in range(65)}),
        RejectionCode.TOO_LARGE,
    ),
    ("pod with 65 tolerations", SubmitPod("p9", cpu_milli=1, tolerations=(Toleration("k"),) * 65), "TOO_LARGE"),
    (
        "toleration value of 254",
        SubmitPod("p9", cpu_milli=1, tolerations=(Toleration("k", value="v" * 254),)),
        RejectionCode.TOO_LARGE,
    ),
    ("release reason of 1025", Release("p1", "r" * 1025), RejectionCode.TOO_LARGE),
    ("failure reason of 1025", MarkNodeFailed("n2", "r" * 1025), RejectionCode.TOO_LARGE),
    # unknown things
    ("unknown node to remove", RemoveNode("nx"), RejectionCode.UNKNOWN_NODE),
    ("unknown node to cordon", CordonNode("nx"), RejectionCode.UNKNOWN_NODE),
    ("unknown node to uncordon", UncordonNode("nx"), RejectionCode.UNKNOWN_NODE),
    ("unknown node to drain", DrainNode("nx"), RejectionCode.UNKNOWN_NODE),
    ("unknown node to fail", MarkNodeFailed("nx"), RejectionCode.UNKNOWN_NODE),
    ("unknown pod", Release("px"), RejectionCode.UNKNOWN_POD),
    ("unknown GPU model", SubmitPod("p9", num_gpu=1, gpu_milli=1000, gpu_models=("H100",)), "UNKNOWN_GPU_MODEL"),
    ("empty GPU model", SubmitPod("p9", num_gpu=1, gpu_milli=1000, gpu_models=("",)), "UNKNOWN_GPU_MODEL"),
    ("unknown policy", SetPolicy("no-such-policy"), RejectionCode.UNKNOWN_POLICY),
    ("empty policy", SetPolicy(""), RejectionCode.UNKNOWN_POLICY),
    # conflicts with the state
    ("duplicate node", AddNode("n1", 1000, 1024), RejectionCode.DUPLICATE_NODE),
    ("duplicate running pod", SubmitPod("p1", cpu_milli=1), RejectionCode.DUPLICATE_POD),
    ("duplicate queued pod", SubmitPod("p2", cpu_milli=1), RejectionCode.DUPLICATE_POD),
    ("busy node without force", RemoveNode("n1"), RejectionCode.NODE_BUSY),
    ("uncordon a schedulable node", UncordonNode("n2"), RejectionCode.NODE_NOT_CORDONED),
    ("recover a node that has not failed", RecoverNode("n2"), RejectionCode.NODE_NOT_FAILED),
    ("remove a budget that is not set", RemoveDisruptionBudget("b9"), RejectionCode.UNKNOWN_BUDGET),
    ("cohort that is its own parent", SetCohort("c9", parent="c9"), RejectionCode.COHORT_CYCLE),
    ("root cohort with a lending limit", SetCohort("c9", lending_limit_gpus=1), RejectionCode.INVALID_COMMAND),
    ("cohort with negative GPUs", SetCohort("c9", nominal_gpus={"A100": -1}), RejectionCode.INVALID_RESOURCES),
    ("remove a cohort never declared", RemoveCohort("c9"), RejectionCode.UNKNOWN_COHORT),
    # gangs, time and dependencies (issue 10)
    ("gang with no members", SubmitGang("g9"), RejectionCode.INVALID_COMMAND),
    ("gang with a member listed twice", SubmitGang("g9", members=(MEMBER, MEMBER)), RejectionCode.DUPLICATE_POD),
    ("gang member named like the gang", SubmitGang("m1", members=(MEMBER,)), RejectionCode.DUPLICATE_POD),
    ("gang member that fits no node", SubmitGang("g9", members=(GangMember("m1", 4, 1000),)), RejectionCode.NEVER_FITS),
    (
        "min_members above the members",
        SubmitGang("g9", members=(MEMBER,), min_members=2),
        RejectionCode.INVALID_COMMAND,
    ),
    ("min_members of zero", SubmitGang("g9", members=(MEMBER,), min_members=0), RejectionCode.INVALID_COMMAND),
    (
        "min_members_per_role naming a role no member has (issue 24)",
        SubmitGang("g9", members=(MEMBER,), min_members_per_role={"worker": 1}),
        RejectionCode.INVALID_COMMAND,
    ),
    (
        "min_members_per_role above the role's members",
        SubmitGang("g9", members=(GangMember("m1", cpu_milli=1000, role="w"),), min_members_per_role={"w": 2}),
        RejectionCode.INVALID_COMMAND,
    ),
    (
        "min_members_per_role summing above min_members",
        SubmitGang(
            "g9",
            members=(GangMember("m1", cpu_milli=1000, role="w"), GangMember("m2", cpu_milli=1000, role="p")),
            min_members=1,
            min_members_per_role={"w": 1, "p": 1},
        ),
        RejectionCode.INVALID_COMMAND,
    ),
    (
        "unknown topology key",
        SubmitGang("g9", members=(MEMBER,), topology_required="topology/rack"),
        "UNKNOWN_LABEL_KEY",
    ),
    (
        "required and preferred topology",
        SubmitGang("g9", members=(MEMBER,), topology_required="zone", topology_preferred="zone"),
        RejectionCode.INVALID_COMMAND,
    ),
    ("gang id taken by a pod", SubmitGang("p1", members=(MEMBER,)), RejectionCode.DUPLICATE_GANG),
    ("gang member id taken by a pod", SubmitGang("g9", members=(GangMember("p2", cpu_milli=1),)), "DUPLICATE_POD"),
    ("gang that depends on itself", SubmitGang("g9", members=(MEMBER,), depends_on=("g9",)), "DEPENDENCY_CYCLE"),
    ("gang that depends on its member", SubmitGang("g9", members=(MEMBER,), depends_on=("m1",)), "DEPENDENCY_CYCLE"),
    ("pod that depends on itself", SubmitPod("p9", cpu_milli=1, depends_on=("p9",)), RejectionCode.DEPENDENCY_CYCLE),
    ("unknown dependency type", SubmitPod("p9", cpu_milli=1, dependency="afternoon"), RejectionCode.INVALID_COMMAND),
    ("65 dependencies", SubmitPod("p9", cpu_milli=1, depends_on=tuple(f"d{i}" for i in range(65))), "INVALID_COMMAND"),
    ("negative time limit", SubmitPod("p9", cpu_milli=1, time_limit_ms=-1), RejectionCode.INVALID_RESOURCES),
    ("zero gang timeout", SubmitGang("g9", members=(MEMBER,), timeout_ms=0), RejectionCode.INVALID_RESOURCES),
    ("absurd gang time limit", SubmitGang("g9", members=(MEMBER,), time_limit_ms=BIG), RejectionCode.INVALID_RESOURCES),
    # retries after a failure (issue 25)
    ("pod retry backoff of 0", SubmitPod("p9", cpu_milli=1, retry=Retry(1, 0)), RejectionCode.INVALID_RESOURCES),
    ("gang retry backoff of 0", SubmitGang("g9", members=(MEMBER,), retry=Retry(1, 0)), "INVALID_RESOURCES"),
    ("negative gang retries", SubmitGang("g9", members=(MEMBER,), retry=Retry(-1)), RejectionCode.INVALID_RESOURCES),
    ("absurd gang retries", SubmitGang("g9", members=(MEMBER,), retry=Retry(1_001)), RejectionCode.INVALID_RESOURCES),
    ("gang retry cap of 0", SubmitGang("g9", members=(MEMBER,), retry=Retry(1, 10, 0)), "INVALID_RESOURCES"),
    ("unknown gang to release", ReleaseGang("gx"), RejectionCode.UNKNOWN_GANG),
    ("unknown queue order", SetPolicy(queue_order="lifo"), RejectionCode.INVALID_COMMAND),
    ("reservation wait below -1", SetPolicy(reserve_after_ms=-5), RejectionCode.INVALID_RESOURCES),
    # quotas, preemption and defragmentation
    ("negative quota", SetQuota("t", nominal_gpus={"A100": -1}), RejectionCode.INVALID_RESOURCES),
    ("absurd quota", SetQuota("t", nominal_gpus={"A100": BIG}), RejectionCode.INVALID_RESOURCES),
    ("quota of a bad model", SetQuota("t", nominal_gpus={"A 100": 1}), RejectionCode.UNKNOWN_GPU_MODEL),
    ("quota with a negative weight", SetQuota("t", weight=-1), RejectionCode.INVALID_RESOURCES),
    ("quota with a bad cohort", SetQuota("t", cohort=""), RejectionCode.INVALID_COMMAND),
    ("borrowing without a cohort", SetQuota("t", borrowing_limit_gpus=1), RejectionCode.INVALID_COMMAND),
    ("default quota with a cohort", SetPolicy(default_quota=Quota(cohort="lab")), RejectionCode.INVALID_COMMAND),
    ("unknown quota to remove", RemoveQuota("nobody"), RejectionCode.UNKNOWN_QUOTA),
    ("unknown preemption mode", SubmitPod("p9", cpu_milli=1, preemption="always"), RejectionCode.INVALID_COMMAND),
    ("negative move budget", Defragment(-1), RejectionCode.INVALID_RESOURCES),
    ("unknown defragment target", Defragment(3, target="px"), RejectionCode.UNKNOWN_POD),
    ("running defragment target", Defragment(3, target="p1"), RejectionCode.NOT_WAITING),
]


@pytest.mark.parametrize(("payload", "code"), [(p, c) for _, p, c in INVALID], ids=[name for name, _, _ in INVALID])
def test_invalid_command_is_rejected_with_its_code(harness: Harness, payload: CommandPayload, code: str) -> None:
    """A well-formed but invalid command yields one CommandRejected with the expected code; nothing else changes."""
    assert harness.expect_rejection(frame(payload)).code == code
    harness.still_works()


@pytest.mark.parametrize(
    ("command_id", "cluster", "issued_at"),
    [("", "c0", 1), ("a b", "c0", 1), ("x" * 254, "c0", 1), ("ok", "", 1), ("ok", "c 0", 1), ("ok", "c0", -1)],
    ids=["empty id", "id with space", "id too long", "empty cluster", "cluster with space", "negative time"],
)
def test_invalid_envelope_is_rejected(harness: Harness, command_id: str, cluster: str, issued_at: int) -> None:
    """A bad command id, cluster or issued_at is refused as INVALID_COMMAND, whatever the payload."""
    rejection = harness.expect_rejection(frame(CordonNode("n1"), command_id, cluster, issued_at))
    assert rejection.code == RejectionCode.INVALID_COMMAND
    harness.still_works()


@pytest.mark.parametrize(
    "issued_at", [4_102_444_800_000, 1_767_225_600_000_000, (1 << 62), (1 << 63) - 1], ids=["2100", "µs", "2^62", "max"]
)
def test_issued_at_after_2099_is_time_out_of_range(harness: Harness, issued_at: int) -> None:
    """A command issued after 2099-12-31 (microseconds by mistake, overflow) is TIME_OUT_OF_RANGE."""
    rejection = harness.expect_rejection(frame(CordonNode("n2"), issued_at=issued_at))
    assert rejection.code == RejectionCode.TIME_OUT_OF_RANGE
    harness.still_works()


def test_releasing_twice_is_rejected_the_second_time(harness: Harness) -> None:
    """The first Release frees the pod; the second one is UNKNOWN_POD and changes nothing."""
    harness.feed(frame(Release("p1"), "release-1"))
    assert harness.expect_rejection(frame(Release("p1"), "release-2")).code == RejectionCode.UNKNOWN_POD


def test_repeated_command_id_is_rejected_as_duplicate(harness: Harness) -> None:
    """A command id seen before is DUPLICATE_COMMAND even with another payload."""
    assert harness.expect_rejection(frame(CordonNode("n2"), "setup-0")).code == RejectionCode.DUPLICATE_COMMAND


def test_commands_on_a_failed_node_are_rejected(harness: Harness) -> None:
    """Cordon, uncordon, drain and fail on a failed node are NODE_FAILED."""
    harness.feed(frame(MarkNodeFailed("n2"), "fail-n2"))
    for i, payload in enumerate((CordonNode("n2"), UncordonNode("n2"), DrainNode("n2"), MarkNodeFailed("n2"))):
        assert harness.expect_rejection(frame(payload, f"again-{i}")).code == RejectionCode.NODE_FAILED


def test_cordoning_twice_is_rejected(harness: Harness) -> None:
    """A second CordonNode is NODE_ALREADY_CORDONED."""
    harness.feed(frame(CordonNode("n2"), "cordon-1"))
    assert harness.expect_rejection(frame(CordonNode("n2"), "cordon-2")).code == RejectionCode.NODE_ALREADY_CORDONED


def test_draining_a_draining_node_again_is_rejected(harness: Harness) -> None:
    """A second DrainNode that changes nothing (its pods already told of their eviction) is NODE_DRAINING."""
    harness.feed(frame(DrainNode("n1", grace_ms=60_000), "drain-1"))
    assert harness.expect_rejection(frame(DrainNode("n1", grace_ms=60_000), "drain-2")).code == "NODE_DRAINING"


def test_a_command_dated_a_day_ahead_of_its_clusters_clock_is_clock_jump(harness: Harness) -> None:
    """More than max_clock_jump_ms (24 h) ahead of the cluster's clock: CLOCK_JUMP, and the clock stays."""
    rejection = harness.expect_rejection(frame(CordonNode("n2"), issued_at=5 + 25 * 3_600_000))
    assert rejection.code == RejectionCode.CLOCK_JUMP
    harness.still_works()


def test_a_halted_cluster_refuses_its_commands(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command whose fold raises halts its cluster (ClusterHalted); the next ones are CLUSTER_HALTED."""

    def broken(decision: object, command: CordonNode) -> None:
        raise IndexError("injected")

    monkeypatch.setitem(HANDLERS, CordonNode, broken)
    (halted,) = [decode_event(o.value) for o in harness.feed(frame(CordonNode("n2"), "halt-1"))]
    assert halted.type_name == "ClusterHalted" and halted.payload.error == "IndexError: injected"
    assert harness.expect_rejection(frame(Release("p1"), "after-1")).code == RejectionCode.CLUSTER_HALTED


def test_every_rejection_code_is_covered_by_the_corpus() -> None:
    """The corpus above exercises every RejectionCode the fold defines."""
    covered = {code for _, _, code in INVALID} | {
        RejectionCode.DUPLICATE_COMMAND,
        RejectionCode.NODE_FAILED,
        RejectionCode.NODE_ALREADY_CORDONED,
        RejectionCode.NODE_DRAINING,
        RejectionCode.TIME_OUT_OF_RANGE,
        RejectionCode.CLOCK_JUMP,
        RejectionCode.CLUSTER_HALTED,
        RejectionCode.COHORT_TOO_DEEP,  # a tree of 8 cohorts: tests/unit/test_fold_cohorts.py
        RejectionCode.COHORT_IN_USE,  # a cohort with children: tests/unit/test_fold_cohorts.py
    }
    assert covered == set(RejectionCode.ALL)
