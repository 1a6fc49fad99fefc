"""Defragment: atomic migrations of movable pods that free whole GPUs or make room for a waiting job."""

from __future__ import annotations

import pytest

from processor.core import defrag_repack
from processor.core.fold import apply
from processor.core.snapshot import state_hash
from processor.core.state import PartitionState
from schemas.codes import RejectionCode
from schemas.commands import (
    AddNode,
    CordonNode,
    Defragment,
    GangMember,
    Release,
    SetPolicy,
    SubmitGang,
    SubmitPod,
    UncordonNode,
)
from tests.strategies import Fold, types


def share(pod_id: str, milli: int, movable: bool = True, **fields: object) -> SubmitPod:
    return SubmitPod(pod_id, num_gpu=1, gpu_milli=milli, cpu_milli=1000, memory_mib=1024, movable=movable, **fields)  # type: ignore[arg-type]


def spread_shares(whole_pod: bool = True) -> Fold:
    """Three 2-GPU nodes, one 300-milli movable share on GPU 0 of each (policy spread); with ``whole_pod``, a
    waiting 2-GPU pod ``w``, so the learned typical pods include one that needs a whole node."""
    fold = Fold()
    fold.run(SetPolicy("spread", reserve_after_ms=-1))
    for i in range(3):
        fold.run(AddNode(f"n{i}", 64_000, 65_536, "A100", 2))
    for i in range(3):
        fold.run(share(f"s{i}", 300))
    if whole_pod:
        fold.run(SubmitPod("w", num_gpu=2, gpu_milli=1000, cpu_milli=1000, preemption="never"))
    fold.run(SetPolicy("best-fit"))
    return fold


def whole_free(fold: Fold) -> int:
    return sum(sum(1 for milli in node.gpu_free if milli == 1000) for node in fold.cluster.nodes.values())


def test_defragment_consolidates_shares_to_free_whole_gpus() -> None:
    """Shares on three nodes move onto one GPU: two GPUs and two nodes are freed, the waiting pod starts."""
    fold = spread_shares()
    assert whole_free(fold) == 3
    events = fold.run(Defragment(10))
    planned = events[0].payload
    assert types(events) == ["DefragmentationPlanned", "PodMigrated", "PodMigrated", "PodScheduled"]
    assert (planned.moves, planned.gpus_freed, planned.nodes_freed) == (2, 2, 2)
    assert "freeing 2 whole GPU(s) and 2 node(s)" in planned.message
    for event in events[1:3]:
        pod = fold.cluster.pods[event.payload.pod_id]
        assert (pod.node_id, pod.gpus) == (event.payload.to_node, tuple(event.payload.to_gpus))
        assert event.payload.to_node == "n1" and "to free it whole" in event.payload.message
    assert events[3].payload.pod.pod_id == "w"


def test_consolidation_that_would_not_lower_fragmentation_moves_nothing() -> None:
    """With only small shares in the workload no GPU is a fragment: moving them would gain nothing."""
    fold = spread_shares(whole_pod=False)
    (event,) = fold.run(Defragment(10))
    assert event.payload.moves == 0 and "less fragmentation" in event.payload.message


def test_the_budget_bounds_the_moves() -> None:
    fold = spread_shares()
    events = fold.run(Defragment(1))
    assert events[0].payload.moves <= 1


def test_a_budget_of_zero_moves_nothing_and_says_so() -> None:
    fold = spread_shares()
    (event,) = fold.run(Defragment(0))
    assert (event.type_name, event.payload.moves) == ("DefragmentationPlanned", 0)
    assert "budget of 0" in event.payload.message


def test_pods_that_are_not_movable_never_move() -> None:
    fold = Fold()
    fold.run(SetPolicy("spread"))
    fold.run_all(AddNode("n0", 64_000, 65_536, "A100", 2), AddNode("n1", 64_000, 65_536, "A100", 2))
    for i in range(2):
        fold.run(share(f"s{i}", 300, movable=False))
    (event,) = fold.run(Defragment(10))
    assert event.payload.moves == 0 and "no running pod is movable" in event.payload.message


def test_a_negative_budget_is_rejected() -> None:
    (event,) = spread_shares().run(Defragment(-1))
    assert event.payload.code == RejectionCode.INVALID_RESOURCES


def test_a_target_that_is_not_waiting_is_rejected() -> None:
    fold = spread_shares()
    (event,) = fold.run(Defragment(5, target="s0"))
    assert event.payload.code == RejectionCode.NOT_WAITING
    (event,) = fold.run(Defragment(5, target="nobody"))
    assert event.payload.code == RejectionCode.UNKNOWN_POD


def test_defragment_makes_room_for_a_target_pod_with_the_fewest_moves() -> None:
    """A 2-GPU pod waits: one share moves off n0 (fewest moves, then node id) and it starts there at once."""
    fold = spread_shares(whole_pod=False)
    (queued,) = fold.run(SubmitPod("big", num_gpu=2, gpu_milli=1000, cpu_milli=1000, preemption="never"))
    assert queued.type_name == "PodQueued"
    events = fold.run(Defragment(5, target="big"))
    assert types(events) == ["DefragmentationPlanned", "PodMigrated", "PodScheduled"]
    assert events[0].payload.target == "big" and "to make room for 'big'" in events[0].payload.message
    assert (events[1].payload.pod_id, events[1].payload.from_node) == ("s0", "n0")
    assert events[2].payload.node_id == "n0" and fold.cluster.pods["big"].running


def test_defragment_makes_room_for_a_target_gang() -> None:
    """Each member of a waiting gang gets a node emptied for it; then the gang starts in one outcome."""
    fold = spread_shares(whole_pod=False)
    members = tuple(GangMember(f"g-{i}", 2, 1000, 1000) for i in range(2))
    (queued,) = fold.run(SubmitGang("g", members=members, preemption="never"))
    assert queued.type_name == "GangQueued"
    events = fold.run(Defragment(5, target="g"))
    assert types(events)[:3] == ["DefragmentationPlanned", "PodMigrated", "PodMigrated"]
    assert "GangScheduled" in types(events) and fold.cluster.gangs["g"].state == "running"


def test_a_target_that_cannot_get_room_within_the_budget_moves_nothing() -> None:
    fold = spread_shares(whole_pod=False)
    members = tuple(GangMember(f"g-{i}", 2, 1000, 1000) for i in range(2))
    fold.run(SubmitGang("g", members=members, preemption="never"))
    (event,) = fold.run(Defragment(1, target="g"))
    assert event.payload.moves == 0 and "no room for gang 'g'" in event.payload.message


def test_migrations_replay_from_their_events() -> None:
    """Applying the events alone gives the same state: a pod is on exactly one node after each move."""
    fold = Fold()
    events = fold.run(SetPolicy("spread", reserve_after_ms=-1))
    events += fold.run_all(*(AddNode(f"n{i}", 64_000, 65_536, "A100", 2) for i in range(3)))
    events += fold.run_all(*(share(f"s{i}", 300) for i in range(3)))
    events += fold.run(SubmitPod("w", num_gpu=2, gpu_milli=1000, cpu_milli=1000, preemption="never"))
    events += fold.run_all(SetPolicy("best-fit"), Defragment(10))
    assert "PodMigrated" in types(events)
    state = PartitionState()
    for event in events:
        apply(state, event)
    assert state_hash(state) == state_hash(fold.state)


def chained_shares(log: list | None = None) -> Fold:
    """Three 1-GPU nodes (policy spread): n0 holds 700, n1 500, n2 450 + 250; a 1-GPU pod ``w`` waits.
    No gap holds the 500 (both are 300): only a chain of two moves frees n1. Events go to ``log``."""
    fold = Fold()
    events = fold.run(SetPolicy("spread", reserve_after_ms=-1))
    events += fold.run_all(*(AddNode(f"n{i}", 64_000, 65_536, "A100", 1) for i in range(3)))
    events += fold.run_all(share("a", 700), share("b", 500), share("c", 450), share("d", 250))
    events += fold.run(SubmitPod("w", num_gpu=1, gpu_milli=1000, cpu_milli=1000, preemption="never"))
    events += fold.run(SetPolicy("best-fit"))
    if log is not None:
        log.extend(events)
    return fold


def test_a_chain_of_two_moves_frees_a_gpu_no_single_move_can() -> None:
    """The 250 moves into n0's gap first, leaving n2 room for the 500: n1 is freed and ``w`` starts there.
    Each move fits where it lands when it is applied (never over-committed on the way)."""
    fold = chained_shares()
    assert [fold.cluster.pods[p].node_id for p in "abcd"] == ["n0", "n1", "n2", "n2"]
    events = fold.run(Defragment(10))
    assert types(events) == ["DefragmentationPlanned", "PodMigrated", "PodMigrated", "PodScheduled"]
    planned, first, second, started = (event.payload for event in events)
    assert (planned.moves, planned.gpus_freed, planned.nodes_freed) == (2, 1, 1)
    assert (first.pod_id, first.from_node, first.to_node) == ("d", "n2", "n0")
    assert "leaving room on GPU 0 of n2 for a larger share" in first.message
    assert (second.pod_id, second.from_node, second.to_node) == ("b", "n1", "n2")
    assert "to free it whole" in second.message
    assert (started.pod.pod_id, started.node_id) == ("w", "n1")
    assert [node.gpu_free for node in map(fold.cluster.nodes.get, ("n0", "n1", "n2"))] == [[50], [0], [50]]


def test_a_chain_replays_from_its_events() -> None:
    log: list = []
    fold = chained_shares(log)
    log += fold.run(Defragment(10))
    assert "PodMigrated" in types(log)
    state = PartitionState()
    for event in log:
        apply(state, event)
    assert state_hash(state) == state_hash(fold.state)


def test_a_chain_beyond_the_budget_is_not_started() -> None:
    """Emptying n1 takes two moves: with a budget of one nothing moves (no half-done chain)."""
    fold = chained_shares()
    (event,) = fold.run(Defragment(1))
    assert event.payload.moves == 0


def cpu_bound_idle_gpu() -> Fold:
    """n0 (8 cores, 2 GPUs): GPU 0 holds a CPU-heavy 300 share and a 600 share, GPU 1 is idle but only
    1.9 cores are free; n1 (64 cores, 1 GPU) holds a 500 share pinned there. A 1-GPU, 4-core pod waits.
    GPU 0 of n0 cannot be emptied (no gap takes the 600), so consolidation alone moves nothing."""
    fold = Fold()
    fold.run(SetPolicy("best-fit", reserve_after_ms=-1))
    fold.run_all(
        AddNode("n0", 8_000, 65_536, "A100", 2),
        SubmitPod("heavy", num_gpu=1, gpu_milli=300, cpu_milli=6_000, memory_mib=1024, movable=True),
        SubmitPod("light", num_gpu=1, gpu_milli=600, cpu_milli=100, memory_mib=1024, movable=True),
        AddNode("n1", 64_000, 65_536, "A100", 1, labels={"pool": "b"}),
        share("pinned", 500, node_selector={"pool": "b"}),
    )
    fold.run(SubmitPod("w", num_gpu=1, gpu_milli=1000, cpu_milli=4_000, preemption="never"))
    return fold


def test_relief_moves_cpu_off_a_node_whose_idle_gpu_a_waiting_pod_needs() -> None:
    fold = cpu_bound_idle_gpu()
    assert [fold.placement(p) for p in ("heavy", "light", "pinned", "w")] == ["n0", "n0", "n1", None]
    events = fold.run(Defragment(10))
    assert types(events) == ["DefragmentationPlanned", "PodMigrated", "PodScheduled"]
    planned, moved, started = (event.payload for event in events)
    assert planned.moves == 1
    assert (moved.pod_id, moved.from_node, moved.to_node) == ("heavy", "n0", "n1")
    assert "moving CPU and memory off n0 so its 1 idle GPU(s) can take a waiting pod" in moved.message
    assert (started.pod.pod_id, started.node_id) == ("w", "n0")


def test_no_relief_without_a_waiting_whole_gpu_pod() -> None:
    fold = cpu_bound_idle_gpu()
    fold.run(Release("w"))
    (event,) = fold.run(Defragment(10))
    assert event.payload.moves == 0


def pinned_shares(gpus: list[list[int]], log: list | None = None) -> Fold:
    """One 1-GPU node per entry of ``gpus`` (``n0``, ``n1``, ...) holding movable shares of those sizes (``p0``,
    ``p1``, ... in order), placed by cordoning each node once filled; then a 1-GPU pod ``w`` waits."""
    fold = Fold()
    events = fold.run(SetPolicy("best-fit", reserve_after_ms=-1))
    count = 0
    for i, sizes in enumerate(gpus):
        events += fold.run(AddNode(f"n{i}", 64_000, 65_536, "A100", 1))
        for milli in sizes:
            events += fold.run(share(f"p{count}", milli))
            count += 1
        events += fold.run(CordonNode(f"n{i}"))
    events += fold.run_all(*(UncordonNode(f"n{i}") for i in range(len(gpus))))
    events += fold.run(SubmitPod("w", num_gpu=1, gpu_milli=1000, cpu_milli=1000, preemption="never"))
    if log is not None:
        log.extend(events)
    return fold


# n0 holds 200, n1 450 + 400, n2 450 + 400: no gap (150, 150) holds the 200, and no chain of two frees a GPU
# (the 450 of n1 or n2 would take n0's gap, and then no gap takes its 400); re-pairing the three GPUs does:
# a 400 joins the 200 on n0, the other 450 joins n1's 450, the other 400 joins n0: n2 is freed in three moves.
REPACKABLE = [[200], [450, 400], [450, 400]]

# n0 250, n1 550 + 350, n2 150 + 700, n3 450 + 500: freeing n2 puts its 700 with n0's 250 and its 150 with
# 500 + 350 on n3, where the 450 must first leave for n1, where the 350 must first leave: a cycle, so the 350
# is parked on n2 (the GPU being freed) until n3 has room for it.
PARKING = [[250], [550, 350], [150, 700], [450, 500]]


def test_only_a_set_repack_frees_this_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without sets (gap filling and chains alone) nothing moves; re-packing three GPUs frees n2 and ``w`` starts."""
    monkeypatch.setattr(defrag_repack, "REPACK_SET", 1)
    (event,) = pinned_shares(REPACKABLE).run(Defragment(10))
    assert event.payload.moves == 0
    monkeypatch.undo()
    fold = pinned_shares(REPACKABLE)
    assert [fold.placement(f"p{i}") for i in range(5)] == ["n0", "n1", "n1", "n2", "n2"]
    events = fold.run(Defragment(10))
    assert types(events) == ["DefragmentationPlanned"] + ["PodMigrated"] * 3 + ["PodScheduled"]
    planned = events[0].payload
    assert (planned.moves, planned.gpus_freed, planned.nodes_freed) == (3, 1, 1)
    moves = [(event.payload.pod_id, event.payload.from_node, event.payload.to_node) for event in events[1:4]]
    assert moves == [("p2", "n1", "n0"), ("p3", "n2", "n1"), ("p4", "n2", "n0")]
    why = "re-packing the shares of GPU 0 of n0, GPU 0 of n1, GPU 0 of n2 so GPU 0 of n2 is freed whole"
    assert all(event.payload.message == why for event in events[1:4])
    assert (events[4].payload.pod.pod_id, events[4].payload.node_id) == ("w", "n2")


def test_a_set_repack_parks_a_share_to_break_a_cycle() -> None:
    """The 350 is parked on the GPU being freed, then moves on: five moves, each explained."""
    fold = pinned_shares(PARKING)
    events = fold.run(Defragment(10))
    moves = [(event.payload.pod_id, event.payload.from_node, event.payload.to_node) for event in events[1:6]]
    assert moves == [("p4", "n2", "n0"), ("p2", "n1", "n2"), ("p5", "n3", "n1"), ("p2", "n2", "n3"), ("p3", "n2", "n3")]
    assert "(parked on GPU 0 of n2 until its place has room)" in events[2].payload.message
    assert events[6].payload.node_id == "n2" and fold.cluster.nodes["n2"].gpu_free == [0]
    assert [fold.cluster.nodes[node].gpu_free for node in ("n0", "n1", "n3")] == [[50], [0], [0]]


@pytest.mark.parametrize("case", [REPACKABLE, PARKING])
def test_a_set_repack_never_over_commits_on_the_way(case: list[list[int]]) -> None:
    """Replaying the events one by one: after every move each GPU, CPU and memory is within capacity, and
    the replayed state is the fold's."""
    log: list = []
    fold = pinned_shares(case, log)
    log += fold.run(Defragment(10))
    state = PartitionState()
    migrated = 0
    for event in log:
        apply(state, event)  # raises InvariantViolation on an over-commit
        if event.type_name == "PodMigrated":
            migrated += 1
            for node in state.clusters[fold.cluster_name].nodes.values():
                assert min(node.gpu_free) >= 0 and node.cpu_free >= 0 and node.memory_free >= 0
    assert migrated >= 3
    assert state_hash(state) == state_hash(fold.state)


@pytest.mark.parametrize(("case", "needed"), [(REPACKABLE, 3), (PARKING, 5)])
def test_a_set_repack_beyond_the_budget_is_not_started(case: list[list[int]], needed: int) -> None:
    """One move short of what the re-packing takes (parked moves included), nothing moves (none half done)."""
    fold = pinned_shares(case)
    placed = [fold.placement(pod_id) for pod_id in sorted(fold.cluster.pods)]
    (event,) = fold.run(Defragment(needed - 1))
    assert event.payload.moves == 0
    assert [fold.placement(pod_id) for pod_id in sorted(fold.cluster.pods)] == placed


def test_a_set_repack_is_deterministic() -> None:
    """The same commands give the same events, byte for byte, and the same state."""
    first, second = pinned_shares(PARKING), pinned_shares(PARKING)
    assert first.run(Defragment(10)) == second.run(Defragment(10))
    assert state_hash(first.state) == state_hash(second.state)


def stranded_whole_gpu(n1_gpus: int = 1, log: list | None = None, small: bool = False) -> Fold:
    """n0 (16 cores, 2 GPUs) runs ``heavy``, a movable whole-GPU pod of 7 cores: its other GPU is idle with
    9 cores free. n1 (10 cores, ``n1_gpus`` GPUs) is empty. ``w`` (1 GPU, 12 cores) fits neither node; with
    ``heavy`` on n1, n0 holds it. With ``small``, ``w2`` (1 GPU, 4 cores, a selector no node matches) waits
    too. No share runs: consolidation has nothing to do."""
    fold = Fold()
    events = fold.run(SetPolicy("best-fit", reserve_after_ms=-1))
    events += fold.run_all(
        AddNode("n0", 16_000, 65_536, "A100", 2),
        SubmitPod("heavy", num_gpu=1, gpu_milli=1000, cpu_milli=7_000, memory_mib=1024, movable=True),
        AddNode("n1", 10_000, 65_536, "A100", n1_gpus),
        SubmitPod("w", num_gpu=1, gpu_milli=1000, cpu_milli=12_000, memory_mib=1024, preemption="never"),
    )
    if small:
        events += fold.run(SubmitPod("w2", num_gpu=1, gpu_milli=1000, cpu_milli=4_000, node_selector={"pool": "none"}))
    if log is not None:
        log.extend(events)
    return fold


@pytest.mark.parametrize("n1_gpus", [1, 2])
def test_moving_a_cpu_heavy_whole_gpu_pod_across_nodes_lets_a_waiting_pod_start(n1_gpus: int) -> None:
    """With 2 GPUs on n1, its GPUs lack CPU for ``w`` already: ``heavy`` may land there as well."""
    fold = stranded_whole_gpu(n1_gpus)
    assert [fold.placement(p) for p in ("heavy", "w")] == ["n0", None]
    events = fold.run(Defragment(10))
    assert types(events) == ["DefragmentationPlanned", "PodMigrated", "PodScheduled"]
    planned, moved, started = (event.payload for event in events)
    assert planned.moves == 1
    assert (moved.pod_id, moved.from_node, moved.to_node) == ("heavy", "n0", "n1")
    assert "moving it off n0 so a waiting pod (1 GPU(s), 12000 mCPU) fits there" in moved.message
    assert "lacked the CPU or memory" in moved.message
    assert (started.pod.pod_id, started.node_id) == ("w", "n0")


def test_a_move_across_nodes_that_would_strand_the_landing_node_is_not_made() -> None:
    """``w2`` asks 4 cores: n1 (2 GPUs, 10 cores) could serve a pod like it, but with ``heavy`` there its
    other GPU would be idle with 3 cores. The stranded GPU would only move: nothing moves."""
    fold = stranded_whole_gpu(n1_gpus=2, small=True)
    (event,) = fold.run(Defragment(10))
    assert event.payload.moves == 0
    assert [fold.placement(p) for p in ("heavy", "w", "w2")] == ["n0", None, None]


def test_no_move_across_nodes_without_a_waiting_pod_or_budget() -> None:
    fold = stranded_whole_gpu()
    (event,) = fold.run(Defragment(0))
    assert event.payload.moves == 0
    fold.run(Release("w"))
    (event,) = fold.run(Defragment(10))
    assert event.payload.moves == 0 and fold.placement("heavy") == "n0"


def test_moves_across_nodes_never_over_commit_on_replay() -> None:
    """Replaying the events one by one: after every move each GPU, CPU and memory is within capacity, and
    the replayed state is the fold's."""
    log: list = []
    fold = stranded_whole_gpu(log=log)
    log += fold.run(Defragment(10))
    state = PartitionState()
    migrated = 0
    for event in log:
        apply(state, event)  # raises InvariantViolation on an over-commit
        if event.type_name == "PodMigrated":
            migrated += 1
            for node in state.clusters[fold.cluster_name].nodes.values():
                assert min(node.gpu_free) >= 0 and node.cpu_free >= 0 and node.memory_free >= 0
    assert migrated == 1
    assert state_hash(state) == state_hash(fold.state)


def stranded_idle_gpu(log: list | None = None) -> Fold:
    """n0 (64 cores, 1 GPU) runs ``light``, a movable whole-GPU pod of 1 core; n1 (2 cores, 1 GPU) has its
    GPU idle but too little CPU for ``w`` (1 GPU, 12 cores), which fits neither node. With ``light`` on
    n1's idle GPU, n0 holds ``w``."""
    fold = Fold()
    events = fold.run(SetPolicy("best-fit", reserve_after_ms=-1))
    events += fold.run_all(
        AddNode("n0", 64_000, 65_536, "A100", 1),
        SubmitPod("light", num_gpu=1, gpu_milli=1000, cpu_milli=1_000, memory_mib=1024, movable=True),
        AddNode("n1", 2_000, 65_536, "A100", 1),
        SubmitPod("w", num_gpu=1, gpu_milli=1000, cpu_milli=12_000, memory_mib=1024, preemption="never"),
    )
    if log is not None:
        log.extend(events)
    return fold


def test_a_light_pod_moved_onto_a_stranded_idle_gpu_lets_a_waiting_pod_start() -> None:
    fold = stranded_idle_gpu()
    assert [fold.placement(p) for p in ("light", "w")] == ["n0", None]
    events = fold.run(Defragment(10))
    assert types(events) == ["DefragmentationPlanned", "PodMigrated", "PodScheduled"]
    planned, moved, started = (event.payload for event in events)
    assert planned.moves == 1
    assert (moved.pod_id, moved.from_node, moved.to_node) == ("light", "n0", "n1")
    assert "to a GPU that lacked the CPU or memory for that pod" in moved.message
    assert (started.pod.pod_id, started.node_id) == ("w", "n0")


def test_a_move_onto_a_stranded_gpu_never_over_commits_on_replay() -> None:
    log: list = []
    fold = stranded_idle_gpu(log)
    log += fold.run(Defragment(10))
    state = PartitionState()
    for event in log:
        apply(state, event)  # raises InvariantViolation on an over-commit
        for node in state.clusters[fold.cluster_name].nodes.values():
            assert min(node.gpu_free) >= 0 and node.cpu_free >= 0 and node.memory_free >= 0
    assert "PodMigrated" in types(log)
    assert state_hash(state) == state_hash(fold.state)
