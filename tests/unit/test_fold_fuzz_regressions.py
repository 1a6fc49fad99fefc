"""Streams a fuzzing run found (random mixed streams, seeds beyond the property suite's) on which one command
raised inside the fold: the fence halted the cluster (ClusterHalted). Each folds to the end now, every command
with its ordinary outcome."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from processor.core.fold import decide
from processor.core.state import PartitionState
from schemas.commands import AddNode, Command, GangMember, SetPolicy, SubmitGang, SubmitPod, Toleration
from schemas.events import Event
from schemas.fastcodec import decode_command

REGRESSIONS = Path(__file__).resolve().parents[1] / "data" / "regressions"


def _fold(commands: list[Command]) -> tuple[PartitionState, list[list[Event]]]:
    state = PartitionState()
    events = [decide(state, command, offset) for offset, command in enumerate(commands)]
    halted = [e.payload for batch in events for e in batch if e.type_name == "ClusterHalted"]
    assert halted == [], halted
    return state, events


def _recorded(name: str) -> list[Command]:
    lines = (REGRESSIONS / f"{name}.jsonl").read_text().splitlines()
    return [decode_command(base64.b64decode(json.loads(line))) for line in lines]


def test_a_queued_gang_whose_members_tolerate_different_taints_is_retried() -> None:
    """The queue retry sorted the gang's member shapes to screen them; tolerations have no order (TypeError)."""
    payloads = [
        SetPolicy("first-fit", -1),
        AddNode("n0", 32_000, 65_536, "A100", 2),
        SubmitPod("low", "t", 0, 1, 1000, 1000, 1024),
        SubmitPod("hi", "t", 10, 1, 1000, 1000, 1024),
        SubmitGang(
            "g",
            "t",
            5,
            (
                GangMember("g-0", 1, 1000, 1000, 1024, tolerations=(Toleration("a", "Exists"),)),
                GangMember("g-1", 1, 1000, 1000, 1024, tolerations=(Toleration("b", "Exists"),)),
            ),
        ),
        AddNode("n1", 32_000, 65_536, "", 0),  # capacity changes: the queue is retried, the gang screened
    ]
    state, events = _fold([Command(f"c{i}", "c0", 1000 * (i + 1), p) for i, p in enumerate(payloads)])
    assert [e.type_name for e in events[-1]] == ["NodeAdded"]
    assert state.clusters["c0"].gangs["g"].state == "queued"


def test_a_waiting_pod_that_asks_gpu_memory_gets_a_reservation_where_its_memory_fits() -> None:
    """The planner's sweep left GPU memory out, so it expected the holder to fit on a node whose GPUs have too
    little memory, and then asserted that it did."""
    state, _ = _fold(_recorded("holder-asks-gpu-memory"))
    cluster = state.clusters["adv"]
    holder = cluster.reservation
    assert holder is not None and holder.holder_id == "p278"
    for node_id in holder.nodes:  # its GPUs have the 20,000 MiB it asks for, or do not count GPU memory
        node = cluster.nodes[node_id]
        assert not node.gpu_memory_free or node.gpu_memory_mib >= cluster.pods["p278"].spec.gpu_memory_mib


def test_a_lender_gang_reclaims_capacity_under_the_random_policy() -> None:
    """Placed again after its reclaim's evictions, the gang drew other nodes (the random policy draws from the
    folded state, which the evictions changed), outside its nominal quota: InvariantViolation. The placement
    found on trial, on the same free capacity, is used then."""
    _, events = _fold(_recorded("gang-reclaim-random-policy"))
    last = [e.type_name for e in events[-1]]
    assert "GangScheduled" in last and "PodPreempted" in last, last
