"""decide/apply per command type: the events each command yields, every rejection code, and apply on its own."""

from __future__ import annotations

import pytest

from processor.core.errors import InvariantViolation
from processor.core.fold import apply, decide
from processor.core.snapshot import state_hash
from processor.core.state import DEFAULT_POLICY, PartitionState
from schemas.codes import RejectionCode
from schemas.commands import (
    AddNode,
    Command,
    CordonNode,
    Defragment,
    DrainNode,
    GangMember,
    MarkNodeFailed,
    RecoverNode,
    Release,
    ReleaseGang,
    RemoveCohort,
    RemoveDisruptionBudget,
    RemoveNode,
    RemoveQuota,
    ResumeCluster,
    SetCohort,
    SetPolicy,
    SubmitGang,
    SubmitPod,
    UncordonNode,
)
from schemas.events import Event, NodeAdded, NodeCordoned, PodEvicted, PodReleased
from tests.strategies import Fold, clusters_hash, types


def busy_fold() -> Fold:
    """n1 (2 x A100) runs p1 on GPU 0; n2 (1 x A100) is idle; p2 (4 GPUs) is queued."""
    fold = Fold()
    busy_fold_events(fold)
    return fold


COMMAND_EVENTS = [
    ("AddNode", AddNode("n3", 4000, 8192, "V100", 1, {"zone": "a"}), ["NodeAdded"]),
    ("AddNode that fits a queued pod", AddNode("n3", 4000, 8192, "V100", 4), ["NodeAdded", "PodScheduled"]),
    ("RemoveNode idle", RemoveNode("n2"), ["NodeRemoved"]),
    ("RemoveNode busy with force", RemoveNode("n1", force=True), ["PodEvicted", "NodeRemoved", "PodScheduled"]),
    ("CordonNode", CordonNode("n2"), ["NodeCordoned"]),
    ("DrainNode", DrainNode("n1"), ["NodeDrained", "PodEvicted", "PodScheduled"]),
    ("DrainNode idle", DrainNode("n2"), ["NodeDrained"]),
    ("MarkNodeFailed", MarkNodeFailed("n1", "ecc"), ["NodeFailed", "PodEvicted", "PodScheduled"]),
    ("SubmitPod that fits", SubmitPod("p3", num_gpu=1, gpu_milli=500), ["PodScheduled"]),
    ("SubmitPod that does not fit", SubmitPod("p3", num_gpu=3, gpu_milli=1000), ["PodQueued"]),
    ("Release running", Release("p1"), ["PodReleased"]),
    ("Release queued", Release("p2", "cancelled"), ["PodReleased"]),
    ("SetPolicy", SetPolicy("spread"), ["PolicyChanged"]),
]


@pytest.mark.parametrize(("payload", "expected"), [c[1:] for c in COMMAND_EVENTS], ids=[c[0] for c in COMMAND_EVENTS])
def test_command_yields_its_events(payload: object, expected: list[str]) -> None:
    """Each command type yields the events listed, in order, all stamped with the command's id, offset and time."""
    fold = busy_fold()
    sequence = fold.state.sequence
    events = fold.run(payload, command_id="the-command")  # type: ignore[arg-type]
    assert types(events) == expected
    assert [event.sequence for event in events] == list(range(sequence, sequence + len(events)))
    assert {(e.command_id, e.command_offset, e.occurred_at, e.cluster) for e in events} == {
        ("the-command", fold.state.next_offset - 1, 1000 * fold.count, "c0")
    }


def test_uncordon_yields_node_uncordoned() -> None:
    """UncordonNode on a cordoned node yields NodeUncordoned and makes it schedulable again."""
    fold = busy_fold()
    fold.run(CordonNode("n2"))
    assert types(fold.run(UncordonNode("n2"))) == ["NodeUncordoned"]
    assert "n2" in fold.cluster.index


def test_policy_changed_names_the_previous_policy() -> None:
    """PolicyChanged carries the new and the previous policy; a fresh cluster starts on the default."""
    fold = Fold()
    (event,) = fold.run(SetPolicy("spread"))
    assert (event.payload.policy, event.payload.previous) == ("spread", DEFAULT_POLICY)
    (event,) = fold.run(SetPolicy("first-fit"))
    assert (event.payload.policy, event.payload.previous) == ("first-fit", "spread")


REJECTIONS = [
    ("DUPLICATE_COMMAND", CordonNode("n2"), "cmd-1", RejectionCode.DUPLICATE_COMMAND),
    ("INVALID_COMMAND", AddNode("bad id", 1000, 1000), None, RejectionCode.INVALID_COMMAND),
    ("INVALID_RESOURCES", SubmitPod("p9", cpu_milli=-1), None, RejectionCode.INVALID_RESOURCES),
    ("UNKNOWN_GPU_MODEL", SubmitPod("p9", num_gpu=1, gpu_milli=1000, gpu_models=("H100",)), None, "UNKNOWN_GPU_MODEL"),
    ("UNKNOWN_NODE", DrainNode("nx"), None, RejectionCode.UNKNOWN_NODE),
    ("DUPLICATE_NODE", AddNode("n1", 1000, 1000), None, RejectionCode.DUPLICATE_NODE),
    ("NODE_BUSY", RemoveNode("n1"), None, RejectionCode.NODE_BUSY),
    ("NODE_FAILED", CordonNode("n3"), None, RejectionCode.NODE_FAILED),
    ("NODE_ALREADY_CORDONED", CordonNode("n4"), None, RejectionCode.NODE_ALREADY_CORDONED),
    ("NODE_NOT_CORDONED", UncordonNode("n2"), None, RejectionCode.NODE_NOT_CORDONED),
    ("UNKNOWN_POD", Release("px"), None, RejectionCode.UNKNOWN_POD),
    ("DUPLICATE_POD", SubmitPod("p1", cpu_milli=1), None, RejectionCode.DUPLICATE_POD),
    ("UNKNOWN_POLICY", SetPolicy("worst-fit"), None, RejectionCode.UNKNOWN_POLICY),
    ("DUPLICATE_GANG", SubmitGang("p2", members=(GangMember("m1", cpu_milli=1),)), None, RejectionCode.DUPLICATE_GANG),
    ("UNKNOWN_GANG", ReleaseGang("gx"), None, RejectionCode.UNKNOWN_GANG),
    (
        "UNKNOWN_LABEL_KEY",
        SubmitGang("g1", members=(GangMember("m1", cpu_milli=1),), topology_required="topology/rack"),
        None,
        RejectionCode.UNKNOWN_LABEL_KEY,
    ),
    ("NEVER_FITS", SubmitGang("g1", members=(GangMember("m1", 8, 1000),)), None, RejectionCode.NEVER_FITS),
    ("DEPENDENCY_CYCLE", SubmitPod("p9", cpu_milli=1, depends_on=("p9",)), None, RejectionCode.DEPENDENCY_CYCLE),
    ("UNKNOWN_QUOTA", RemoveQuota("nobody"), None, RejectionCode.UNKNOWN_QUOTA),
    ("NOT_WAITING", Defragment(5, target="p1"), None, RejectionCode.NOT_WAITING),
    ("TOO_LARGE", Release("p1", "x" * 2000), None, RejectionCode.TOO_LARGE),
    ("NOT_HALTED", ResumeCluster(), None, RejectionCode.NOT_HALTED),
    ("NODE_NOT_FAILED", RecoverNode("n2"), None, RejectionCode.NODE_NOT_FAILED),
    ("UNKNOWN_BUDGET", RemoveDisruptionBudget("nope"), None, RejectionCode.UNKNOWN_BUDGET),
    ("COHORT_CYCLE", SetCohort("c1", parent="c1"), None, RejectionCode.COHORT_CYCLE),
    ("UNKNOWN_COHORT", RemoveCohort("c1"), None, RejectionCode.UNKNOWN_COHORT),
]


@pytest.mark.parametrize(("payload", "command_id", "code"), [r[1:] for r in REJECTIONS], ids=[r[0] for r in REJECTIONS])
def test_refused_command_yields_one_rejection_and_changes_no_allocation(
    payload: object, command_id: str | None, code: str
) -> None:
    """A refused command yields exactly one CommandRejected with its code and message; clusters are unchanged."""
    fold = busy_fold()
    fold.run_all(AddNode("n3", 1000, 1000), MarkNodeFailed("n3"), AddNode("n4", 1000, 1000), CordonNode("n4"))
    before = clusters_hash(fold.state)
    (event,) = fold.run(payload, command_id)  # type: ignore[arg-type]
    assert event.type_name == "CommandRejected"
    assert event.payload.code == code
    assert event.payload.command_type == type(payload).__name__
    assert event.payload.command_id == event.command_id
    assert event.payload.message
    assert clusters_hash(fold.state) == before


def test_issued_at_past_the_contract_range_is_time_out_of_range() -> None:
    """A command issued after 2099 (e.g. microseconds by mistake) is refused as TIME_OUT_OF_RANGE; nothing changes."""
    fold = busy_fold()
    before = clusters_hash(fold.state)
    (event,) = decide(fold.state, Command("late", "c0", 1_767_225_600_000_000, Release("p1")))
    assert event.payload.code == RejectionCode.TIME_OUT_OF_RANGE
    assert "microseconds" in event.payload.message
    assert clusters_hash(fold.state) == before


def test_rejection_table_covers_every_code() -> None:
    """The table above has one case per RejectionCode (TIME_OUT_OF_RANGE has its own test, it needs a time; so does
    CLOCK_JUMP, in test_fold_clock.py, CLUSTER_HALTED needs a halted cluster, in test_fold_halting.py,
    NODE_DRAINING a drain that waits, in test_fold_disruptions.py, COHORT_TOO_DEEP and COHORT_IN_USE a cohort
    tree, in test_fold_cohorts.py)."""
    codes = [code for *_, code in REJECTIONS] + [
        RejectionCode.TIME_OUT_OF_RANGE,
        RejectionCode.CLOCK_JUMP,
        RejectionCode.CLUSTER_HALTED,
        RejectionCode.NODE_DRAINING,
        RejectionCode.COHORT_TOO_DEEP,
        RejectionCode.COHORT_IN_USE,
    ]
    assert sorted(codes) == sorted(RejectionCode.ALL)


def test_rejected_command_on_an_unknown_cluster_creates_no_cluster() -> None:
    """A command refused for a cluster never seen leaves the partition without that cluster."""
    state = PartitionState()
    (event,) = decide(state, Command("c1", "nowhere", 0, CordonNode("n1")))
    assert event.payload.code == RejectionCode.UNKNOWN_NODE
    assert state.clusters == {}


def test_submit_to_an_empty_new_cluster_queues_the_pod_there() -> None:
    """A pod submitted to a cluster without nodes creates the cluster and waits in its queue."""
    state = PartitionState()
    (event,) = decide(state, Command("c1", "fresh", 0, SubmitPod("p", cpu_milli=5)))
    assert event.type_name == "PodQueued"
    assert state.clusters["fresh"].pods["p"].queued


def test_pod_arrival_counts_accepted_submissions_only() -> None:
    """PodSpec.arrival numbers accepted pods 0, 1, 2, ...; rejected submissions take no number."""
    fold = Fold()
    fold.run(AddNode("n1", 8000, 8192))
    arrivals = []
    for pod_id in ("a", "a", "b", "", "c"):
        (event,) = fold.run(SubmitPod(pod_id, cpu_milli=1))
        if event.type_name != "CommandRejected":
            arrivals.append((event.payload.pod.pod_id, event.payload.pod.arrival))
    assert arrivals == [("a", 0), ("b", 1), ("c", 2)]


def test_offset_defaults_to_the_states_next_offset_and_advances_it() -> None:
    """Without an offset, decide stamps events with next_offset; an explicit offset moves next_offset past it."""
    state = PartitionState()
    (first,) = decide(state, Command("a", "c0", 0, AddNode("n1", 1000, 1000)))
    assert (first.command_offset, state.next_offset) == (0, 1)
    (second,) = decide(state, Command("b", "c0", 0, AddNode("n2", 1000, 1000)), offset=41)
    assert (second.command_offset, state.next_offset) == (41, 42)


# ---------------------------------------------------------------- apply on its own


def _event(sequence: int, payload: object, command_id: str = "x") -> Event:
    return Event(0, sequence, "c0", command_id, sequence, 0, payload)  # type: ignore[arg-type]


def test_apply_alone_reproduces_decide() -> None:
    """Applying decide's events to a fresh state gives the same state_hash as decide left."""
    fold = busy_fold()
    events = [event for payload in (DrainNode("n1"), Release("p1"), UncordonNode("n1")) for event in fold.run(payload)]
    setup = Fold()
    setup_events = busy_fold_events(setup)
    replay = PartitionState()
    for event in setup_events + events:
        apply(replay, event)
    assert state_hash(replay) == state_hash(fold.state)


def busy_fold_events(fold: Fold) -> list[Event]:
    return fold.run_all(
        AddNode("n1", 8000, 32768, "A100", 2),
        AddNode("n2", 8000, 32768, "A100", 1),
        SetPolicy("first-fit"),
        SubmitPod("p1", num_gpu=1, gpu_milli=1000, cpu_milli=1000, memory_mib=1024),
        SubmitPod("p2", num_gpu=4, gpu_milli=1000),
    )


@pytest.mark.parametrize(
    "payload",
    [
        NodeAdded("n1", "A100", 1, 1000, 1000),  # added twice
        NodeCordoned("ghost"),  # unknown node
        PodEvicted("p1", "n2", "drain"),  # not running there
        PodReleased("ghost", None, "completed"),  # unknown pod
    ],
    ids=["node added twice", "unknown node", "eviction from the wrong node", "unknown pod released"],
)
def test_apply_raises_invariant_violation_on_an_impossible_event(payload: object) -> None:
    """An event that contradicts the state is a bug: apply raises InvariantViolation."""
    state = PartitionState()
    apply(state, _event(0, NodeAdded("n1", "A100", 1, 1000, 1000)))
    with pytest.raises(InvariantViolation):
        apply(state, _event(1, payload))


def test_apply_refuses_an_event_out_of_sequence() -> None:
    """Events must be applied in sequence order with no gaps."""
    state = PartitionState()
    with pytest.raises(InvariantViolation, match="sequence"):
        apply(state, _event(1, NodeAdded("n1", "A100", 1, 1000, 1000)))
