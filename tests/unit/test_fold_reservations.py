"""Reservations and backfill (Slurm's rule): big jobs at the head of the queue never starve."""

from __future__ import annotations

from schemas.codes import QueueReasonCode
from schemas.commands import AddNode, GangMember, Release, SetPolicy, SubmitGang, SubmitPod, Tick
from schemas.events import Event
from tests.strategies import Fold, types

MINUTE = 60_000
LIMIT = 10 * MINUTE


def busy(reserve_after_ms: int | None = None) -> Fold:
    """Two 8-GPU nodes nearly full of 1-GPU pods that end at minute 10; an 8-GPU pod waits from minute 1."""
    fold = Fold()
    fold.run(SetPolicy("first-fit", reserve_after_ms=reserve_after_ms), at=0)
    for i in range(2):
        fold.run(AddNode(f"n{i}", 64_000, 262_144, "A100", 8), at=0)
    for i in range(15):
        fold.run(SubmitPod(f"s{i}", num_gpu=1, gpu_milli=1000, time_limit_ms=LIMIT), at=0)
    assert types(fold.run(SubmitPod("big", num_gpu=8, gpu_milli=1000), at=MINUTE)) == ["PodQueued"]
    return fold


def of(events: list[Event], name: str) -> list[Event]:
    return [event for event in events if event.type_name == name]


def test_the_head_that_waited_long_enough_gets_the_nodes_where_it_starts_soonest() -> None:
    """After reserve_after_ms (default 5 minutes) the head reserves the node that frees first, with its time."""
    fold = busy()
    assert not of(fold.run(Tick(), at=5 * MINUTE), "NodesReserved")
    (reserved,) = of(fold.run(Tick(), at=7 * MINUTE), "NodesReserved")
    assert reserved.occurred_at == 6 * MINUTE  # the deadline itself, not the tick that passed it
    assert (reserved.payload.holder_id, reserved.payload.holder_kind) == ("big", "pod")
    assert reserved.payload.nodes == ("n0",) and reserved.payload.expected_start == LIMIT
    assert "has waited 300 s at the head of the queue" in reserved.payload.message


def test_work_without_a_time_limit_never_lands_on_reserved_nodes() -> None:
    """The free GPU of n1 is taken; the next unlimited pod waits although n0 will have room, and says why."""
    fold = busy()
    fold.run(Tick(), at=7 * MINUTE)
    fold.run(Release("s0"), at=7 * MINUTE)  # a GPU frees on the reserved n0
    (queued,) = fold.run(SubmitPod("u1", num_gpu=1, gpu_milli=1000), at=7 * MINUTE)
    assert queued.payload.node_id == "n1"  # n1's last GPU
    (queued,) = fold.run(SubmitPod("u2", num_gpu=1, gpu_milli=1000), at=7 * MINUTE)
    assert queued.type_name == "PodQueued"
    reason = {r.code: r for r in queued.payload.reasons}[QueueReasonCode.NODE_RESERVED]
    assert reason.nodes == 1 and "reserved for pod 'big'" in reason.message


def test_backfill_runs_on_reserved_nodes_only_if_it_ends_before_the_expected_start() -> None:
    fold = busy()
    fold.run(Tick(), at=7 * MINUTE)
    fold.run(SubmitPod("fill-n1", num_gpu=1, gpu_milli=1000), at=7 * MINUTE)
    fold.run(Release("s0"), at=7 * MINUTE)
    (late,) = fold.run(SubmitPod("too-long", num_gpu=1, gpu_milli=1000, time_limit_ms=4 * MINUTE), at=7 * MINUTE)
    assert late.type_name == "PodQueued"
    (fits,) = fold.run(SubmitPod("short", num_gpu=1, gpu_milli=1000, time_limit_ms=3 * MINUTE), at=7 * MINUTE)
    assert fits.type_name == "PodScheduled" and fits.payload.node_id == "n0"


def test_the_holder_starts_on_its_nodes_at_the_expected_start_and_the_reservation_ends() -> None:
    fold = busy()
    fold.run(Tick(), at=7 * MINUTE)
    events = fold.run(Tick(), at=11 * MINUTE)
    started = [e for e in of(events, "PodScheduled") if e.payload.pod.pod_id == "big"]
    assert started and started[0].payload.node_id == "n0" and started[0].occurred_at == LIMIT
    (released,) = of(events, "ReservationReleased")
    assert released.payload.reason == "started" and fold.cluster.reservation is None
    assert not fold.cluster.nodes["n0"].reserved_for


def test_without_reservations_a_stream_of_small_pods_starves_the_big_one() -> None:
    """skip-ahead alone (reserve_after_ms -1): each freed GPU goes to the next small pod, forever."""
    fold = busy(reserve_after_ms=-1)
    for minute in range(2, 40):
        fold.run(SubmitPod(f"t{minute}", num_gpu=1, gpu_milli=1000, time_limit_ms=LIMIT), at=minute * MINUTE)
    assert fold.cluster.pods["big"].queued


def test_a_stream_of_small_pods_cannot_delay_a_big_gang_past_the_reservation_rule() -> None:
    """A 2-node gang waits from minute 1; small pods keep arriving. It starts by the reserved expected start."""
    fold = Fold()
    fold.run(SetPolicy("first-fit"), at=0)
    for i in range(3):
        fold.run(AddNode(f"n{i}", 64_000, 262_144, "A100", 8), at=0)
    for i in range(20):
        fold.run(SubmitPod(f"s{i}", num_gpu=1, gpu_milli=1000, time_limit_ms=LIMIT), at=0)
    members = (GangMember("m0", 8, 1000), GangMember("m1", 8, 1000))
    gang = SubmitGang("train", members=members, priority=10, preemption="never")
    fold.run(gang, at=MINUTE)
    reserved: list[Event] = []
    started = None
    for second in range(90, 40 * 60, 30):
        events = fold.run(SubmitPod(f"t{second}", num_gpu=1, gpu_milli=1000, time_limit_ms=LIMIT), at=second * 1000)
        reserved += of(events, "NodesReserved")
        if started is None and of(events, "GangScheduled"):
            started = of(events, "GangScheduled")[0]
    assert reserved and reserved[0].payload.holder_id == "train"
    expected = reserved[0].payload.expected_start
    assert expected is not None and started is not None and started.occurred_at <= expected
    assert {m.node_id for m in started.payload.members} == set(reserved[0].payload.nodes)


def test_a_higher_priority_head_takes_over_the_reservation_once_it_has_waited() -> None:
    fold = busy()
    fold.run(Tick(), at=7 * MINUTE)
    fold.run(SubmitPod("vip", num_gpu=8, gpu_milli=1000, priority=100, preemption="never"), at=7 * MINUTE)
    assert fold.cluster.reservation.holder_id == "big"  # vip has not waited yet
    events = fold.run(Tick(), at=13 * MINUTE)
    assert [e.payload.reason for e in of(events, "ReservationReleased")][:1] in (["superseded"], ["started"])
    assert fold.cluster.pods["vip"].running or fold.cluster.reservation.holder_id == "vip"  # type: ignore[union-attr]


def test_reservations_can_be_turned_off() -> None:
    fold = busy()
    fold.run(Tick(), at=7 * MINUTE)
    events = fold.run(SetPolicy(reserve_after_ms=-1), at=7 * MINUTE)
    assert types(events) == ["PolicyChanged", "ReservationReleased"]
    assert events[1].payload.reason == "reservations_off" and fold.cluster.reservation is None


def test_strict_fifo_lets_nothing_start_before_the_head() -> None:
    """strict-fifo: a small pod that would fit waits behind the big head, and says why."""
    fold = busy(reserve_after_ms=-1)
    fold.run(SetPolicy(queue_order="strict-fifo"), at=2 * MINUTE)
    (event,) = fold.run(SubmitPod("small", num_gpu=1, gpu_milli=1000), at=2 * MINUTE)
    assert event.type_name == "PodQueued"
    assert event.payload.reasons[0].code == QueueReasonCode.WAITING_FOR_EARLIER_JOB
    events = fold.run(Tick(), at=11 * MINUTE)
    started = [e.payload.pod.pod_id for e in of(events, "PodScheduled")]
    assert started[:2] == ["big", "small"]


def test_a_reserved_node_lost_is_planned_again() -> None:
    from schemas.commands import CordonNode

    fold = busy()
    fold.run(Tick(), at=7 * MINUTE)
    events = fold.run(CordonNode("n0"), at=7 * MINUTE)
    assert types(events)[:2] == ["ReservationReleased", "NodeCordoned"]
    assert events[0].payload.reason == "node_cordoned"
    assert fold.cluster.reservation is not None and fold.cluster.reservation.nodes == ("n1",)


def test_a_restored_snapshot_keeps_the_reservation_check_of_an_earlier_head() -> None:
    """A check set for an earlier head still fires after a new head came and went; a snapshot taken in
    between must keep it, or the restored fold reserves later than the uninterrupted one (found by the
    snapshot-plus-tail property test)."""
    from processor.core.snapshot import from_snapshot, state_hash, to_snapshot
    from schemas.fastcodec import encode_event
    from schemas.snapshots import decode_snapshot, encode_snapshot

    full = Fold()
    full.run(SetPolicy(reserve_after_ms=MINUTE), at=0)
    full.run(AddNode("n1", 64000, 65536, "A100", 1), at=0)
    full.run(SubmitPod("blocker", num_gpu=1, gpu_milli=1000), at=0)
    full.run(SubmitPod("a", num_gpu=1, gpu_milli=1000, preemption="never"), at=1000)  # head: checks at 61 s
    member = GangMember("b-0", num_gpu=1, gpu_milli=1000)
    full.run(SubmitGang("b", members=(member,), priority=5, timeout_ms=10_000, preemption="never"), at=2000)
    restored = Fold(from_snapshot(decode_snapshot(encode_snapshot(to_snapshot(full.state)))), count=full.count)
    assert state_hash(restored.state) == state_hash(full.state)
    # The gang times out at 12 s: the head is `a` again, whose check (61 s) the uninterrupted fold still holds.
    ran = [[encode_event(e) for e in fold.run(Tick(), at=100_000)] for fold in (full, restored)]
    assert ran[1] == ran[0]
    assert state_hash(restored.state) == state_hash(full.state)


def test_a_wildcard_toleration_does_not_get_past_a_reservation() -> None:
    """A pod that tolerates every taint (key "", Exists) still stays off a node reserved for the head: only the
    toleration the fold gives (the holder, backfill that ends in time) names the reservation's taint. Found by
    fuzzing: with no expected start ("nothing may backfill"), such a pod started on the reserved node."""
    from processor.core.fold import decide
    from processor.core.state import PartitionState
    from schemas.commands import Command, Toleration

    commands = [
        Command("c0", "c0", 1_000, SetPolicy("first-fit", 60_000)),
        Command("c1", "c0", 1_000, SubmitPod("head", "t", 9, 1, 1000, 500, 1024, gpu_memory_mib=8192)),
        Command("c2", "c0", 1_000, SubmitPod("big", "t", 11, 8, 1000)),
        Command("c3", "c0", 900_000, AddNode("n1", 16_000, 65_536, "H100", 8)),  # big starts; n1 reserved for head
        Command(
            "c4",
            "c0",
            1_000_000,
            SubmitPod("wild", "t", 0, 0, 0, 500, 1024, time_limit_ms=300_000, tolerations=(Toleration("", "Exists"),)),
        ),
    ]
    state = PartitionState()
    for offset, command in enumerate(commands):
        decide(state, command, offset)
    cluster = state.clusters["c0"]
    assert cluster.reservation is not None and cluster.reservation.nodes == ("n1",)
    assert cluster.reservation.expected_start is None
    wild = cluster.pods["wild"]
    assert wild.node_id is None and wild.queued  # it waits: nothing may backfill a reservation without a start
