"""Streams on which one command raised inside the fold (the fence halted the cluster: ClusterHalted), or broke an
invariant: found by a fuzzing run (random mixed streams, seeds beyond the property suite's) and by the property
suite's hypothesis in CI. Each folds to the end now, every command with its ordinary outcome."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from processor.core.fold import decide
from processor.core.snapshot import from_snapshot, state_hash, to_snapshot
from processor.core.state import PartitionState
from schemas.commands import (
    AddNode,
    Command,
    DrainNode,
    GangMember,
    Release,
    RemoveDisruptionBudget,
    Retry,
    SetDisruptionBudget,
    SetPolicy,
    SubmitGang,
    SubmitPod,
    Taint,
    Toleration,
    UpdateNode,
)
from schemas.events import Event
from schemas.fastcodec import decode_command
from schemas.snapshots import decode_snapshot, encode_snapshot

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


def test_a_pod_that_failed_during_its_drain_grace_is_not_evicted_again_after_a_restore() -> None:
    """A drain with a grace period scheduled the pod's eviction; the pod failed and was retried elsewhere, and
    kept its eviction time. A state restored from a snapshot armed that eviction again: on the pod's new node,
    not draining, a budget then blocked it (EvictionBlocked) where the straight fold emitted nothing."""
    pod = SubmitPod("p2", "t1", 0, 1, 250, 2000, 8192, retry=Retry(3, 2000, 5000), preemption="never")
    payloads = [
        AddNode("n1", 32_000, 131_072, "V100", 4),
        pod,
        DrainNode("n1", grace_ms=30_000),
        Release("p2", "failed"),  # retried in 2 s, before its eviction was due: no node then, queued
        AddNode("n4", 32_000, 65_536, "V100", 2),  # it starts here
        SetDisruptionBudget("b-t1", "t1", max_unavailable=0),
        DrainNode("n5"),  # unknown: rejected; a restored state fired the stale eviction first
    ]
    times = (3_000, 41_000, 191_000, 196_000, 4_971_000, 6_191_000, 7_123_000)
    commands = [Command(f"c{i}", "c0", at, p) for i, (at, p) in enumerate(zip(times, payloads, strict=True))]
    state, events = _fold(commands)
    assert state.clusters["c0"].pods["p2"].node_id == "n4"
    restored = from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(_fold(commands[:-1])[0]))))
    tail = decide(restored, commands[-1], len(commands) - 1)
    assert [e.payload for e in tail] == [e.payload for e in events[-1]]
    assert state_hash(restored) == state_hash(state)


def test_what_a_budget_let_a_taint_evict_goes_to_the_queue() -> None:
    """A NoExecute taint's evictions waited on a budget; removing the budget evicted them, but the capacity they
    freed on the node (still schedulable) went to no queue retry: a queued pod that tolerates the taint stayed
    queued beside a node it fits (the property suite's hypothesis found it in CI)."""
    payloads = [
        AddNode("n0", 4000, 8192, "A100", 1),
        SubmitPod("p2", "t1", 0, 0, 0, 500),
        SubmitPod("p0", "t1", 0, 1, 100),
        SetDisruptionBudget("b-t1", "t1", max_unavailable=0),
        UpdateNode("n0", taints=(Taint("spot", "", "NoExecute"),)),
        SubmitPod("p1", "t1", 0, 1, 1000, tolerations=(Toleration("spot", "Exists"),)),
        RemoveDisruptionBudget("b-t1"),
    ]
    state, events = _fold([Command(f"c{i}", "c0", 1000 * (i + 1), p) for i, p in enumerate(payloads)])
    assert [e.type_name for e in events[-1]] == [
        "DisruptionBudgetRemoved", "PodEvicted", "PodQueued", "PodScheduled", "PodEvicted", "PodQueued"
    ]  # fmt: skip
    assert state.clusters["c0"].pods["p1"].node_id == "n0"


def test_a_restricted_preemption_search_answers_alike_after_a_restore() -> None:
    """A preemptor that would borrow may take only borrowers' pods (Kueue's rule). The lowest victim level any node
    offered was not allowed; the index's search then answered from whichever nodes it met first, filed or pending,
    so a state restored from a snapshot (every node pending) answered otherwise than the straight fold: the queue
    retry at command 135 of this stream preempted ``p48`` in one and left its preemptor queued in the other. The
    search now checks such an answer node by node (``preemption._plan_pod_exact``)."""
    from tests.adversarial import SeededChooser, mixed_stream

    commands = mixed_stream(SeededChooser(100074), 300, 6)
    state, events = _fold(commands)
    restored = from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(_fold(commands[:135])[0]))))
    tail = [decide(restored, command, offset) for offset, command in enumerate(commands[135:], 135)]
    assert [[e.payload for e in batch] for batch in tail] == [[e.payload for e in batch] for batch in events[135:]]
    assert state_hash(restored) == state_hash(state)
    preempted = [e.payload.pod_id for e in events[135] if e.type_name == "PodPreempted"]
    assert "p48" in preempted
