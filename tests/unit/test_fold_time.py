"""Event time: the partition's clock, Tick, and deadlines (time limits, gang timeouts) firing at their time."""

from __future__ import annotations

from processor.core.fold import decide
from processor.core.snapshot import from_snapshot, state_hash, to_snapshot
from schemas.commands import (
    AddNode,
    Command,
    GangMember,
    Release,
    SetPolicy,
    SubmitGang,
    SubmitPod,
    Tick,
    V2Command,
)
from schemas.snapshots import decode_snapshot, encode_snapshot
from tests.strategies import Fold, types

MINUTE = 60_000


def cluster(fold: Fold, nodes: int = 1) -> None:
    fold.run(SetPolicy("first-fit", reserve_after_ms=-1), at=0)
    for i in range(nodes):
        fold.run(AddNode(f"n{i}", 64_000, 262_144, "A100", 8), at=0)


def test_the_clock_is_the_largest_issued_at_and_a_late_command_is_folded_at_it() -> None:
    """A command issued before the clock is stamped (and its pod submitted) at the clock, not in the past."""
    fold = Fold()
    cluster(fold)
    fold.run(SubmitPod("a", cpu_milli=1000), at=10 * MINUTE)
    (event,) = fold.run(SubmitPod("b", cpu_milli=1000), at=3 * MINUTE)
    assert event.occurred_at == 10 * MINUTE and event.payload.pod.submitted_at == 10 * MINUTE
    assert fold.state.clock == 10 * MINUTE


def test_an_invalid_envelope_does_not_move_the_clock() -> None:
    """A rejected envelope's time cannot be trusted: it is folded at the clock, which stays."""
    fold = Fold()
    cluster(fold)
    fold.run(SubmitPod("a", cpu_milli=1000), at=MINUTE)
    (event,) = fold.run(SubmitPod("b", cpu_milli=1000), command_id="bad id", at=99 * MINUTE)
    assert event.type_name == "CommandRejected" and event.occurred_at == MINUTE and fold.state.clock == MINUTE


def test_an_idle_tick_advances_time_and_says_so() -> None:
    fold = Fold()
    cluster(fold)
    (event,) = fold.run(Tick(), at=5 * MINUTE)
    assert event.type_name == "Ticked" and event.payload.clock == 5 * MINUTE and fold.state.clock == 5 * MINUTE
    assert "c0" in fold.state.clusters  # a tick never creates a cluster; this one existed


def test_a_tick_for_an_unknown_cluster_creates_nothing() -> None:
    fold = Fold(cluster_name="nowhere")
    assert types(fold.run(Tick(), at=MINUTE)) == ["Ticked"] and not fold.state.clusters


def test_a_time_limit_releases_the_pod_at_its_deadline_and_the_queue_moves() -> None:
    """The limit fires before the command that passes it, at the deadline's time; the freed GPUs go to the queue."""
    fold = Fold()
    cluster(fold)
    fold.run(SubmitPod("short", num_gpu=8, gpu_milli=1000, time_limit_ms=10 * MINUTE), at=MINUTE)
    fold.run(SubmitPod("next", num_gpu=8, gpu_milli=1000), at=2 * MINUTE)
    events = fold.run(SubmitPod("later", cpu_milli=1000), at=30 * MINUTE)
    assert types(events) == ["PodTimeLimitReached", "PodReleased", "PodScheduled", "PodScheduled"]
    assert [e.occurred_at for e in events] == [11 * MINUTE, 11 * MINUTE, 11 * MINUTE, 30 * MINUTE]
    assert events[1].payload.reason == "time_limit" and events[2].payload.pod.pod_id == "next"
    assert fold.cluster.pods["next"].started_at == 11 * MINUTE


def test_each_cluster_fires_only_its_own_deadlines_on_its_own_clock() -> None:
    """Clusters on one partition keep separate clocks: a command of c0 fires c0's deadlines, never c1's."""
    fold = Fold()
    cluster(fold)
    other = Fold(fold.state, cluster_name="c1", count=100)
    other.run(AddNode("m0", 64_000, 262_144, "A100", 8), at=0)
    fold.run(SubmitPod("late", cpu_milli=1, time_limit_ms=5 * MINUTE), at=MINUTE)
    other.run(SubmitPod("early", cpu_milli=1, time_limit_ms=MINUTE), at=MINUTE)
    events = fold.run(Tick(), at=60 * MINUTE)
    assert [(e.cluster, e.type_name, e.occurred_at) for e in events] == [
        ("c0", "PodTimeLimitReached", 6 * MINUTE),
        ("c0", "PodReleased", 6 * MINUTE),
        ("c0", "Ticked", 60 * MINUTE),
    ]
    assert fold.state.clusters["c1"].clock == MINUTE and "early" in fold.state.clusters["c1"].pods
    events = other.run(Tick(), at=3 * MINUTE)
    assert [(e.cluster, e.type_name, e.occurred_at) for e in events] == [
        ("c1", "PodTimeLimitReached", 2 * MINUTE),
        ("c1", "PodReleased", 2 * MINUTE),
        ("c1", "Ticked", 3 * MINUTE),
    ]


def test_a_partition_tick_fires_every_clusters_deadlines_cluster_by_cluster() -> None:
    """The processor's Tick {partition: true} moves every cluster of the partition to its time."""
    fold = Fold()
    cluster(fold)
    other = Fold(fold.state, cluster_name="c1", count=100)
    other.run(AddNode("m0", 64_000, 262_144, "A100", 8), at=0)
    fold.run(SubmitPod("late", cpu_milli=1, time_limit_ms=5 * MINUTE), at=MINUTE)
    other.run(SubmitPod("early", cpu_milli=1, time_limit_ms=MINUTE), at=MINUTE)
    events = fold.run(Tick(partition=True), at=60 * MINUTE)
    assert [(e.cluster, e.type_name, e.occurred_at) for e in events] == [
        ("c0", "PodTimeLimitReached", 6 * MINUTE),
        ("c0", "PodReleased", 6 * MINUTE),
        ("c1", "PodTimeLimitReached", 2 * MINUTE),
        ("c1", "PodReleased", 2 * MINUTE),
        ("c0", "Ticked", 60 * MINUTE),
    ]
    assert events[-1].payload.partition
    assert fold.state.clusters["c0"].clock == fold.state.clusters["c1"].clock == 60 * MINUTE


def test_contract_v2_commands_keep_one_clock_per_partition() -> None:
    """A command written with contract v2 fires the deadlines of every cluster of the partition, earliest first."""
    fold = Fold()
    cluster(fold)
    other = Fold(fold.state, cluster_name="c1", count=100)
    other.run(AddNode("m0", 64_000, 262_144, "A100", 8), at=0)
    fold.run(SubmitPod("late", cpu_milli=1, time_limit_ms=5 * MINUTE), at=MINUTE)
    other.run(SubmitPod("early", cpu_milli=1, time_limit_ms=MINUTE), at=MINUTE)
    events = decide(fold.state, V2Command("v2-tick", "c0", 60 * MINUTE, Tick()))
    assert [(e.cluster, e.type_name, e.occurred_at) for e in events] == [
        ("c1", "PodTimeLimitReached", 2 * MINUTE),
        ("c1", "PodReleased", 2 * MINUTE),
        ("c0", "PodTimeLimitReached", 6 * MINUTE),
        ("c0", "PodReleased", 6 * MINUTE),
        ("c0", "Ticked", 60 * MINUTE),
    ]


def test_a_gang_time_limit_releases_every_member_and_ends_the_gang_not_ok() -> None:
    fold = Fold()
    cluster(fold, 2)
    gang = SubmitGang("g", members=(GangMember("a", 8, 1000), GangMember("b", 8, 1000)), time_limit_ms=MINUTE)
    fold.run(gang, at=MINUTE)
    events = fold.run(Tick(), at=10 * MINUTE)
    assert types(events) == ["PodTimeLimitReached", "PodReleased"] * 2 + ["GangReleased", "Ticked"]
    assert events[4].payload.reason == "time_limit" and not events[4].payload.ok


def test_a_queued_gang_times_out_and_leaves_the_queue() -> None:
    """Still queued when the clock passes submit + timeout: GangTimedOut, then it ends."""
    fold = Fold()
    cluster(fold, 1)
    fold.run(SubmitGang("g", members=(GangMember("a", 8, 1000), GangMember("b", 8, 1000)), timeout_ms=MINUTE), at=0)
    events = fold.run(Tick(), at=5 * MINUTE)
    assert types(events) == ["GangTimedOut", "GangReleased", "Ticked"]
    assert events[0].occurred_at == MINUTE and events[0].payload.waited_ms == MINUTE
    assert not fold.cluster.gangs and not fold.cluster.gang_queue


def test_a_running_gang_does_not_time_out() -> None:
    fold = Fold()
    cluster(fold, 1)
    fold.run(SubmitGang("g", members=(GangMember("a", 8, 1000),), timeout_ms=MINUTE), at=0)
    assert types(fold.run(Tick(), at=5 * MINUTE)) == ["Ticked"]


def test_a_restored_state_fires_the_same_deadlines() -> None:
    """Timers are derived: a snapshot restores them, so the tail folds to the same events and hash."""
    fold = Fold()
    cluster(fold, 2)
    fold.run(SubmitPod("p", num_gpu=1, gpu_milli=1000, time_limit_ms=3 * MINUTE), at=MINUTE)
    fold.run(SubmitGang("g", members=(GangMember("a", 8, 1000),) * 1, time_limit_ms=4 * MINUTE), at=MINUTE)
    fold.run(
        SubmitGang("w", members=(GangMember("x", 8, 1000), GangMember("y", 8, 1000)), timeout_ms=MINUTE), at=MINUTE
    )
    restored = Fold(from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(fold.state)))), count=fold.count)
    tail = [Tick(), Release("p"), Tick()]
    times = [2 * MINUTE, 3 * MINUTE + 30_000, 10 * MINUTE]
    for payload, at in zip(tail, times, strict=True):
        assert [e.to_avro() for e in restored.run(payload, at=at)] == [e.to_avro() for e in fold.run(payload, at=at)]
    assert state_hash(restored.state) == state_hash(fold.state)


def test_a_duplicate_command_still_moves_time() -> None:
    """A repeated command id changes nothing but its time is evidence: the clock and due timers move."""
    fold = Fold()
    cluster(fold)
    fold.run(SubmitPod("p", cpu_milli=1, time_limit_ms=MINUTE), command_id="x", at=0)
    events = fold.run(SubmitPod("q", cpu_milli=1), command_id="x", at=5 * MINUTE)
    assert types(events) == ["PodTimeLimitReached", "PodReleased", "CommandRejected"]
    assert events[-1].payload.code == "DUPLICATE_COMMAND" and fold.state.clock == 5 * MINUTE


def test_envelope_time_is_what_the_sender_said_for_v1_commands() -> None:
    """A command written with contract v1 keeps v1's time rule (decoded from its frame, see test_recorded_log)."""
    from processor.core.fold import decide
    from schemas.commands import V1Command

    fold = Fold()
    cluster(fold)
    fold.run(Tick(), at=10 * MINUTE)
    (event,) = decide(fold.state, V1Command("v1", "c0", MINUTE, SubmitPod("old", cpu_milli=1)))
    assert event.occurred_at == MINUTE and fold.state.clock == 10 * MINUTE
    (event,) = decide(fold.state, Command("v2", "c0", MINUTE, SubmitPod("new", cpu_milli=1)))
    assert event.occurred_at == 10 * MINUTE
