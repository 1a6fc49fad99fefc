"""Gangs: all members at once (at least min_members) within a topology domain, or none; and their lifecycle."""

from __future__ import annotations

import pytest

from processor.core.snapshot import from_snapshot, state_hash, to_snapshot
from schemas.codes import QueueReasonCode, RejectionCode
from schemas.commands import (
    AddNode,
    DrainNode,
    GangMember,
    MarkNodeFailed,
    Release,
    ReleaseGang,
    SetPolicy,
    SubmitGang,
    SubmitPod,
)
from schemas.snapshots import decode_snapshot, encode_snapshot
from tests.strategies import Fold, types

RACK = "topology/rack"
BLOCK = "topology/block"


def members(gang_id: str, count: int, gpus: int = 8) -> tuple[GangMember, ...]:
    return tuple(GangMember(f"{gang_id}-{i}", gpus, 1000, 4000, 16384) for i in range(count))


def racks(fold: Fold, sizes: dict[str, int], block: str = "b0") -> None:
    """Racks of 8-GPU nodes, named rack-index (``r1-0``...), all in one block."""
    fold.run(SetPolicy("best-fit", reserve_after_ms=-1))
    for rack, size in sizes.items():
        for i in range(size):
            fold.run(AddNode(f"{rack}-{i}", 64_000, 262_144, "H100", 8, {RACK: rack, BLOCK: block}))


def placed_nodes(fold: Fold, gang_id: str) -> set[str]:
    cluster = fold.cluster
    return {cluster.pods[pod_id].node_id for pod_id in cluster.gangs[gang_id].placed}  # type: ignore[misc]


def test_a_gang_is_placed_in_one_outcome_gang_event_first() -> None:
    """GangScheduled lists every member's node and GPUs; each member's PodScheduled follows in the same command."""
    fold = Fold()
    racks(fold, {"r1": 2})
    events = fold.run(SubmitGang("g", members=members("g", 2)))
    assert types(events) == ["GangScheduled", "PodScheduled", "PodScheduled"]
    gang = events[0].payload
    assert [(m.pod_id, m.node_id) for m in gang.members] == [
        (e.payload.pod.pod_id, e.payload.node_id) for e in events[1:]
    ]
    assert all(len(m.gpus) == 8 for m in gang.members)
    assert {e.payload.pod.gang_id for e in events[1:]} == {"g"}


def test_a_gang_that_does_not_fit_holds_nothing() -> None:
    """Three 8-GPU members on two nodes: nothing is placed, nothing is held, the gang waits with a reason."""
    fold = Fold()
    racks(fold, {"r1": 2})
    events = fold.run(SubmitGang("g", members=members("g", 3)))
    assert types(events) == ["GangQueued"]
    assert fold.cluster.gpu_milli_allocated == 0 and not fold.cluster.pods
    assert events[0].payload.reasons[0].code == QueueReasonCode.GANG_DOES_NOT_FIT
    assert "at most 2 of the 3 member(s)" in events[0].payload.reasons[0].message


def test_a_queued_gang_starts_when_enough_capacity_frees() -> None:
    """A waiting gang is retried when capacity grows, and starts with every member."""
    fold = Fold()
    racks(fold, {"r1": 2})
    fold.run(SubmitPod("blocker", num_gpu=8, gpu_milli=1000))
    fold.run(SubmitGang("g", members=members("g", 2)))
    events = fold.run(Release("blocker"))
    assert types(events) == ["PodReleased", "GangScheduled", "PodScheduled", "PodScheduled"]
    assert events[1].payload.from_queue


def test_topology_required_keeps_every_member_in_one_domain() -> None:
    """Four members fit two racks of two nodes only when split; required rack keeps them waiting instead."""
    fold = Fold()
    racks(fold, {"r1": 2, "r2": 2})
    events = fold.run(SubmitGang("g", members=members("g", 4), topology_required=RACK))
    assert types(events) == ["GangQueued"]
    reason = events[0].payload.reasons[0]
    assert reason.code == QueueReasonCode.TOPOLOGY_DOMAIN_TOO_SMALL
    assert "largest free one, topology/rack=r2, has 16 idle GPU(s)" in reason.message
    assert "it lacks 16 idle GPU(s)" in reason.message
    events = fold.run(SubmitGang("h", members=members("h", 2), topology_required=RACK))
    assert types(events)[0] == "GangScheduled" and events[0].payload.domain in ("r1", "r2")
    assert len({fold.cluster.nodes[n].labels[RACK] for n in placed_nodes(fold, "h")}) == 1


def test_the_domain_the_gang_fills_best_is_chosen() -> None:
    """Among racks that fit, the one with the least left over: big racks stay whole for big gangs."""
    fold = Fold()
    racks(fold, {"big": 4, "small": 2, "mid": 3})
    events = fold.run(SubmitGang("g", members=members("g", 2), topology_required=RACK))
    assert events[0].payload.domain == "small"
    events = fold.run(SubmitGang("h", members=members("h", 3), topology_required=RACK))
    assert events[0].payload.domain == "mid"
    events = fold.run(SubmitGang("i", members=members("i", 4), topology_required=RACK))
    assert events[0].payload.domain == "big"


def test_topology_preferred_falls_back_to_wider_domains() -> None:
    """Preferred rack: no rack can hold it, so the block holds it; no block either, so the whole cluster."""
    fold = Fold()
    fold.run(SetPolicy("best-fit"))
    for block, rack in (("b0", "r1"), ("b0", "r2"), ("b1", "r3")):
        for i in range(2):
            fold.run(AddNode(f"{rack}-{i}", 64_000, 262_144, "H100", 8, {RACK: rack, BLOCK: block}))
    events = fold.run(SubmitGang("g", members=members("g", 3), topology_preferred=RACK))
    assert (events[0].payload.topology_key, events[0].payload.domain) == (BLOCK, "b0")
    events = fold.run(SubmitGang("h", members=members("h", 3), topology_preferred=RACK))
    assert (events[0].payload.topology_key, events[0].payload.domain) == (None, None)
    assert types(events)[0] == "GangScheduled"


def test_min_members_lets_a_gang_start_without_every_member() -> None:
    """With min_members 2 of 3 and room for two, the gang starts with two members; the third waits in the queue
    as a member of the running gang (contract v4; it was dropped before) and starts when a node comes."""
    fold = Fold()
    racks(fold, {"r1": 2})
    events = fold.run(SubmitGang("g", members=members("g", 3), min_members=2))
    assert types(events) == ["GangScheduled", "PodScheduled", "PodScheduled", "PodQueued"]
    assert len(events[0].payload.members) == 2
    assert events[3].payload.pod.pod_id == "g-2"
    assert events[3].payload.reasons[0].code == QueueReasonCode.GANG_MEMBER_WAITING
    events = fold.run(AddNode("r1-2", 64_000, 262_144, "H100", 8, {RACK: "r1", BLOCK: "b0"}))
    assert [e.payload.pod.pod_id for e in events if e.type_name == "PodScheduled"] == ["g-2"]
    assert len(fold.cluster.gangs["g"].placed) == 3


def test_a_failed_member_node_sends_the_whole_gang_back_to_the_queue() -> None:
    """Losing one member evicts them all (training restarts from a checkpoint); it starts again where it fits."""
    fold = Fold()
    racks(fold, {"r1": 3})
    fold.run(SubmitGang("g", members=members("g", 2)))
    node = sorted(placed_nodes(fold, "g"))[0]
    events = fold.run(MarkNodeFailed(node))
    assert (
        types(events)
        == ["NodeFailed", "PodEvicted", "PodEvicted", "GangQueued", "GangScheduled"] + ["PodScheduled"] * 2
    )
    assert events[3].payload.requeued
    assert node not in placed_nodes(fold, "g")


def test_a_gang_that_cannot_restart_waits_holding_nothing() -> None:
    """A drained member node with no spare capacity: all members evicted, the gang queued, nothing held."""
    fold = Fold()
    racks(fold, {"r1": 2})
    fold.run(SubmitGang("g", members=members("g", 2)))
    events = fold.run(DrainNode("r1-0"))
    assert types(events)[-1] == "GangQueued" and events[-1].payload.requeued
    assert fold.cluster.gpu_milli_allocated == 0 and not fold.cluster.pods
    assert fold.cluster.gangs["g"].state == "queued"


def test_a_gang_above_min_members_loses_only_the_failed_member() -> None:
    """Three members running with min_members 2: one node fails, that member ends, the gang runs on."""
    fold = Fold()
    racks(fold, {"r1": 3})
    fold.run(SubmitGang("g", members=members("g", 3), min_members=2))
    lost = fold.cluster.pods["g-0"].node_id
    events = fold.run(MarkNodeFailed(lost))
    assert types(events) == ["NodeFailed", "PodEvicted", "PodReleased"]
    assert fold.cluster.gangs["g"].state == "running" and len(fold.cluster.gangs["g"].placed) == 2


def test_releasing_one_member_releases_only_that_pod() -> None:
    """Release of a member is recorded for that pod; the gang ends with its last member."""
    fold = Fold()
    racks(fold, {"r1": 2})
    fold.run(SubmitGang("g", members=members("g", 2)))
    assert types(fold.run(Release("g-0"))) == ["PodReleased"]
    assert fold.cluster.gangs["g"].placed == {"g-1": None}
    events = fold.run(Release("g-1"))
    assert types(events) == ["PodReleased", "GangReleased"]
    assert events[1].payload.ok and "g" not in fold.cluster.gangs


def test_release_gang_releases_every_member_and_frees_the_capacity() -> None:
    fold = Fold()
    racks(fold, {"r1": 2})
    fold.run(SubmitGang("g", members=members("g", 2)))
    events = fold.run(ReleaseGang("g"))
    assert types(events) == ["PodReleased", "PodReleased", "GangReleased"]
    assert fold.cluster.gpu_milli_allocated == 0 and not fold.cluster.gangs and not fold.cluster.member_of


def test_release_gang_takes_a_queued_gang_out_of_the_queue() -> None:
    fold = Fold()
    racks(fold, {"r1": 1})
    fold.run(SubmitGang("g", members=members("g", 2)))
    events = fold.run(ReleaseGang("g", "cancelled"))
    assert types(events) == ["GangReleased"] and not events[0].payload.ok
    assert not fold.cluster.gang_queue


@pytest.mark.parametrize(
    ("gang", "code"),
    [
        (SubmitGang("g"), RejectionCode.INVALID_COMMAND),
        (SubmitGang("g", members=(GangMember("m", cpu_milli=1), GangMember("m", cpu_milli=1))), "DUPLICATE_POD"),
        (SubmitGang("g", members=(GangMember("m", 16, 1000),)), RejectionCode.NEVER_FITS),
        (SubmitGang("g", members=(GangMember("m", 1, 500, gpu_models=("A100",)),)), "UNKNOWN_GPU_MODEL"),
        (SubmitGang("g", members=members("g", 2), min_members=3), RejectionCode.INVALID_COMMAND),
        (SubmitGang("g", members=members("g", 2), topology_required="topology/nvlink"), "UNKNOWN_LABEL_KEY"),
        (SubmitGang("g", members=members("g", 1), depends_on=("g",)), RejectionCode.DEPENDENCY_CYCLE),
    ],
    ids=["no members", "duplicate member", "never fits", "unknown model", "min above", "unknown key", "self"],
)
def test_bad_gangs_are_rejected_and_hold_nothing(gang: SubmitGang, code: str) -> None:
    """Each bad submission is one CommandRejected with a clear code; the state holds no gang and no pod."""
    fold = Fold()
    racks(fold, {"r1": 1})
    before = state_hash(fold.state)
    events = fold.run(gang)
    assert types(events) == ["CommandRejected"] and events[0].payload.code == code
    assert events[0].payload.message
    assert "g" not in fold.cluster.gangs and state_hash(fold.state) != before  # only position and clock moved
    assert not [p for p in fold.cluster.pods if p.startswith("g")]


def test_ids_are_unique_across_pods_gangs_and_waiting_members() -> None:
    """A queued gang's member ids are taken: by a plain pod, by another gang's member, or as a gang id."""
    fold = Fold()
    racks(fold, {"r1": 1})
    fold.run(SubmitGang("g", members=members("g", 2)))
    assert fold.run(SubmitPod("g-1", cpu_milli=1))[0].payload.code == RejectionCode.DUPLICATE_POD
    other = SubmitGang("h", members=(GangMember("g-0", cpu_milli=1),))
    assert fold.run(other)[0].payload.code == RejectionCode.DUPLICATE_POD
    assert fold.run(SubmitGang("g-1", members=(GangMember("x", cpu_milli=1),)))[0].payload.code == "DUPLICATE_GANG"


def test_gang_state_survives_a_snapshot() -> None:
    """Queued and running gangs, their members and domains restore to the same state hash and keep working."""
    fold = Fold()
    racks(fold, {"r1": 2, "r2": 2})
    fold.run(SubmitGang("run", members=members("run", 2), topology_required=RACK, time_limit_ms=60_000))
    fold.run(SubmitGang("wait", members=members("wait", 3), topology_required=RACK, timeout_ms=600_000))
    restored = from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(fold.state))))
    assert state_hash(restored) == state_hash(fold.state)
    other = Fold(restored, count=fold.count)
    assert types(other.run(ReleaseGang("run"))) == types(fold.run(ReleaseGang("run")))
    assert state_hash(other.state) == state_hash(fold.state)
