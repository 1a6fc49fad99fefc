"""Each cluster's clock: its own commands move it; a command dated too far ahead is refused (CLOCK_JUMP)."""

from __future__ import annotations

from processor.core.fold import decide
from processor.core.state import PartitionState
from schemas.codes import RejectionCode
from schemas.commands import DEFAULT_MAX_CLOCK_JUMP_MS, AddNode, Command, SetPolicy, SubmitPod, Tick, V2Command
from tests.strategies import clusters_hash, types

HOUR = 3_600_000
DAY = 24 * HOUR
T0 = 1_767_225_600_000  # 2026-01-01


def cluster(state: PartitionState, name: str, at: int = T0) -> None:
    decide(state, Command(f"{name}-n", name, at, AddNode("n1", 32_000, 65_536, "A100", 8)))


def test_a_far_future_command_is_refused_and_moves_nothing() -> None:
    """Dated more than 24 h (the default) ahead of its cluster's clock: CLOCK_JUMP at the clock, which stays."""
    state = PartitionState()
    cluster(state, "a")
    decide(state, Command("p1", "a", T0 + HOUR, SubmitPod("p1", cpu_milli=1, time_limit_ms=1000)))
    before = clusters_hash(state)
    (event,) = decide(state, Command("2099", "a", 4_070_908_800_000, Tick()))
    assert event.payload.code == RejectionCode.CLOCK_JUMP and "Tick {force: true}" in event.payload.message
    assert event.occurred_at == T0 + HOUR and state.clusters["a"].clock == T0 + HOUR
    assert clusters_hash(state) == before  # the 1 s time limit did not fire at 2099
    events = decide(state, Command("t", "a", T0 + 2 * HOUR, Tick()))
    assert types(events) == ["PodTimeLimitReached", "PodReleased", "Ticked"]  # it fires on time instead


def test_a_forced_tick_jumps_on_purpose() -> None:
    state = PartitionState()
    cluster(state, "a")
    (event,) = decide(state, Command("jump", "a", T0 + 30 * DAY, Tick(force=True)))
    assert event.type_name == "Ticked" and state.clusters["a"].clock == T0 + 30 * DAY


def test_the_limit_is_a_setting_and_zero_turns_it_off() -> None:
    state = PartitionState()
    cluster(state, "a")
    (changed,) = decide(state, Command("s", "a", T0, SetPolicy(max_clock_jump_ms=HOUR)))
    assert changed.payload.max_clock_jump_ms == HOUR and state.clusters["a"].max_clock_jump_ms == HOUR
    (refused,) = decide(state, Command("x", "a", T0 + 2 * HOUR, Tick()))
    assert refused.payload.code == RejectionCode.CLOCK_JUMP
    decide(state, Command("off", "a", T0, SetPolicy(max_clock_jump_ms=0)))
    assert types(decide(state, Command("y", "a", T0 + 400 * DAY, Tick()))) == ["Ticked"]


def test_a_clusters_first_command_sets_its_clock_whatever_the_others() -> None:
    """Clusters on one partition keep separate clocks: a new cluster starts at its own first command's time."""
    state = PartitionState()
    cluster(state, "a", T0 + 100 * DAY)
    cluster(state, "b", T0)
    assert state.clusters["b"].clock == T0 and state.clusters["a"].clock == T0 + 100 * DAY
    (event,) = decide(state, Command("b-p", "b", T0 + HOUR, SubmitPod("p", cpu_milli=1)))
    assert event.occurred_at == T0 + HOUR  # not a's clock


def test_one_clusters_jump_cannot_pin_another() -> None:
    """A forced jump of cluster a leaves b's time limits firing on b's clock."""
    state = PartitionState()
    cluster(state, "a")
    cluster(state, "b")
    decide(state, Command("b-p", "b", T0 + 1000, SubmitPod("p", cpu_milli=1, time_limit_ms=1000)))
    decide(state, Command("a-jump", "a", T0 + 10_000 * DAY, Tick(force=True)))
    events = decide(state, Command("b-t", "b", T0 + 5000, Tick()))
    assert types(events) == ["PodTimeLimitReached", "PodReleased", "Ticked"]
    assert events[-1].occurred_at == T0 + 5000


def test_a_partition_tick_is_checked_against_the_latest_clock_of_the_partition() -> None:
    state = PartitionState()
    cluster(state, "a")
    (event,) = decide(state, Command("pt", "a", T0 + 3 * DAY, Tick(partition=True)))
    assert event.payload.code == RejectionCode.CLOCK_JUMP
    (event,) = decide(state, Command("pt2", "a", T0 + HOUR, Tick(partition=True)))
    assert event.type_name == "Ticked" and event.payload.partition


def test_contract_v2_commands_have_no_limit() -> None:
    """A command of contract v2 keeps its release's semantics: the partition's clock, no jump limit."""
    state = PartitionState()
    cluster(state, "a")
    (event,) = decide(state, V2Command("v2", "a", T0 + 1000 * DAY, Tick()))
    assert event.type_name == "Ticked" and DEFAULT_MAX_CLOCK_JUMP_MS == DAY
