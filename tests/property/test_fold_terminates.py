"""Every command ends, in bounded work, and replays identically (issue #20).

For the adversarial streams of ``tests/adversarial.py``, the random mixed streams that crashed main (recorded
seeds) and a hypothesis-driven sample of such streams, each command must:

- return: ``decide`` never raises (no ``RecursionError``), and the stream folds to its end within
  :data:`HANG_SECONDS` of wall-clock time (a guard against a hang, not a speed figure: a hung stream
  would otherwise stall the suite; speed lives in ``bench/worst_case.py``);
- emit at most :func:`event_bound` events: :data:`EVENTS_PER_OBJECT` per node, gang and pod (gang members
  included) submitted so far in the stream, plus :data:`EVENTS_PER_COMMAND`. A pod evicted at most once in
  a command has at most: preempted, evicted, queued, scheduled, released, time limit reached, dependency
  failed, migrated; a gang and a node fewer than that;
- take each pod as a victim at most once, and never after any other eviction of it in the command (Kueue's
  rule: reclaim and priority preemption cannot chase each other); evict a pod again only after it was placed
  again (a node going away evicts whatever runs on it, also a pod an earlier deadline of the same command
  placed there), and at most :data:`EVICTIONS_PER_POD` times (:func:`check_evictions`);

and folding the stream twice (through ``decide``, and through the processor's folder with
``tests/fold_digest.py``) gives the same events, frames and state hash.

Every stream here crashed, hung or evicted a pod twice on main at d76cefd (the recorded figures are in
``tests/adversarial.py`` and beside each seed below); the worklist, Kueue's rule and one eviction per pod
per command (issue #20) made them end.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from processor.core import defrag, defrag_gaps, defrag_moves
from processor.core.errors import InvariantViolation
from processor.core.fold import decide
from processor.core.snapshot import state_hash
from processor.core.state import PartitionState
from schemas.commands import AddNode, Command, Defragment, SubmitGang, SubmitPod, V2Command
from schemas.events import Event, PodEvicted, PodMigrated, PodScheduled
from tests import adversarial
from tests.adversarial import SeededChooser, mixed_stream
from tests.fold_digest import fold_digest, records_of
from tests.strategies import encode_events, mixed_streams

ROOT = Path(__file__).resolve().parents[2]
EVENTS_PER_OBJECT = 8
EVENTS_PER_COMMAND = 32
HANG_SECONDS = 120


def event_bound(objects: int) -> int:
    """The most events one command may emit after ``objects`` nodes, gangs and pods were submitted."""
    return EVENTS_PER_OBJECT * objects + EVENTS_PER_COMMAND


def _objects(command: Command) -> int:
    payload = command.payload
    if isinstance(payload, AddNode | SubmitPod):
        return 1
    if isinstance(payload, SubmitGang):
        return 1 + len(payload.members)
    return 0


@contextmanager
def wall_clock_limit(seconds: int) -> Iterator[None]:
    """Raise TimeoutError in this (main) thread if the block runs longer than ``seconds``: a hang guard."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"the stream did not fold to its end within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def fold_checked(commands: list[Command]) -> tuple[list[bytes], str]:
    """Fold the stream with ``decide``, checking each command's events; (encoded events, state hash)."""
    state = PartitionState()
    objects = 0
    encoded: list[bytes] = []
    for command in commands:
        objects += _objects(command)
        events = decide(state, command)
        what = f"command {command.command_id} ({command.type_name})"
        assert len(events) <= event_bound(objects), f"{what} emitted {len(events)} events > {event_bound(objects)}"
        check_evictions(what, events)
        encoded.extend(encode_events(events))
    return encoded, state_hash(state)


EVICTIONS_PER_POD = 3
"""At most this many evictions of one pod in one command: as a victim once (first), then by each node that goes
away under it, a deadline's drain and the command's own (a node going away takes no pod afterwards)."""


def check_evictions(what: str, events: list[Event]) -> None:
    """No pod is a victim twice in a command, nor after any other eviction in it (a search skips the pods
    evicted earlier: Kueue's rule, the chase bounded); a pod evicted again was placed again in between (a
    node going away, a drain or a failure, evicts whatever runs on it, also a pod an earlier deadline of the
    command placed there); and at most :data:`EVICTIONS_PER_POD` evictions per pod."""
    evictions: dict[str, list[str]] = {}
    running_again: dict[str, bool] = {}
    for event in events:
        payload = event.payload
        kind = type(payload)
        if kind is PodScheduled:
            running_again[payload.pod.pod_id] = True  # type: ignore[union-attr]
        elif kind is PodEvicted:
            pod_id, reason = payload.pod_id, payload.reason  # type: ignore[union-attr]
            before = evictions.setdefault(pod_id, [])
            if before:
                assert not reason.startswith("preempted:"), f"{what} took {pod_id!r} as a victim after {before}"
                assert running_again.get(pod_id), (
                    f"{what} evicted {pod_id!r} ({reason}) after {before}, not placed since"
                )
            before.append(reason)
            running_again[pod_id] = False
    most = max((len(reasons) for reasons in evictions.values()), default=0)
    assert most <= EVICTIONS_PER_POD, f"{what} evicted a pod {most} times"


def check_terminates(commands: list[Command]) -> None:
    """Each command ends within its event bound, takes each pod as a victim at most once (:func:`check_evictions`),
    and replays identically."""
    with wall_clock_limit(HANG_SECONDS):
        events, final = fold_checked(commands)
        again = fold_checked(commands)
        records = records_of(commands)
        digest = fold_digest(records)
        assert fold_digest(records) == digest
    assert again == (events, final)
    assert digest["state_hash"] == final


# ---------------------------------------------------------------- the adversarial streams of the issue

_CHASE = "reclaim and priority preemption chase each other: RecursionError"
CRASHING: dict[str, tuple[Callable[[], list[Command]], str]] = {
    "reclaim_chase": (adversarial.reclaim_chase, _CHASE),
    "afterok_chain_fails_500": (
        lambda: adversarial.afterok_chain_fails(500),
        "failing dependants recursively: RecursionError",
    ),
    "preemption_cascade_300": (
        lambda: adversarial.preemption_cascade(300),
        "a preemption cascade recurses once per link: RecursionError",
    ),
}


@pytest.mark.parametrize(
    "name",
    sorted(CRASHING),
)
def test_adversarial_streams_that_crash_main_fold_to_the_end(name: str) -> None:
    """The issue's crashing streams (a reclaim/preemption chase, a failed root of a long afterok chain, a deep
    preemption cascade) fold to the end within the bounds."""
    check_terminates(CRASHING[name][0]())


BOUNDED: dict[str, Callable[[], list[Command]]] = {
    "preemption_cascade_40": lambda: adversarial.preemption_cascade(40),
    "dependency_chain_60": lambda: adversarial.dependency_chain(60),
    "gang_preempts_24": lambda: adversarial.gang_preempts(24, 48, topology=True),
    "gang_preempts_spread_24": lambda: adversarial.gang_preempts_spread(24, 48),
    "lender_reclaims_12": lambda: adversarial.lender_reclaims(12),
    "defragment_target_12": lambda: adversarial.defragment_target(12),
    "tick_time_limits_48": lambda: adversarial.tick_time_limits(48, 48),
    "unfit_queue_head_64": lambda: adversarial.unfit_queue_head(64, 3),
    "ordinary_mixed_30": lambda: adversarial.ordinary_mixed(30, 300),
    "queued_big_gang_12": lambda: adversarial.queued_big_gang(12, 48, 3),
    "unique_node_labels_12": lambda: adversarial.unique_node_labels(12, None, 3),
    "distinct_priorities_12": lambda: adversarial.distinct_priorities(12, None, 2),
    "never_preempting_waits_12": lambda: adversarial.never_preempting_waits(12, None, 2),
    "wide_gang_released_12": lambda: adversarial.wide_gang_released(12, 24),
    "consolidate_12": lambda: adversarial.consolidate(12),
    "queue_retries_12": lambda: adversarial.queue_retries(12, None, 24),
    "baseline_12": lambda: adversarial.baseline(12, None, 20),
    "borrower_meets_guaranteed_work_12": lambda: adversarial.borrower_meets_guaranteed_work(12, None, 3),
    "newer_equal_priority_absent_12": lambda: adversarial.newer_equal_priority_absent(12, None, 2),
}


@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_adversarial_streams_at_a_small_size_fold_to_the_end(name: str) -> None:
    """The issue's slow shapes, small: they fold within the bounds (their cost is bench/worst_case.py's)."""
    check_terminates(BOUNDED[name]())


# ---------------------------------------------------------------- Defragment: work bounded by its budget

DEFRAGMENTS: dict[str, Callable[[], list[Command]]] = {
    "defragment_target_120": lambda: adversarial.defragment_target(120, budget=8),
    "consolidate_40": lambda: adversarial.consolidate(40),
}
# (LOOKS_BASE, LOOKS, TRIAL_MOVES): as built, and tiny (it must bite)
ALLOWANCES = [(defrag_moves.LOOKS_BASE, defrag_moves.LOOKS, defrag_moves.TRIAL_MOVES), (0, 3, 1)]


def _up_to_the_attack(commands: list[Command]) -> tuple[PartitionState, Command]:
    """The state the stream builds before its last command (the attacking ``Defragment``), and that command."""
    state = PartitionState()
    for command in commands[:-1]:
        decide(state, command)
    return state, commands[-1]


def _plan_work(state: PartitionState, attack: Command) -> tuple[int, int, int]:
    """(looks, trial moves, moves) of the attack's plan, made directly by the planner and rolled back."""
    cluster = state.clusters[adversarial.CLUSTER]
    payload = attack.payload
    assert isinstance(payload, Defragment)
    if payload.target is None:
        plan = defrag.consolidate(cluster, payload.max_moves)
        return plan.looks, plan.trial_moves, len(plan.moves)
    trial = defrag.Trial(cluster)
    try:
        defrag.make_room(cluster, trial, cluster.pods[payload.target].shape, payload.max_moves, "test")
        return trial.allowance(payload.max_moves).looked, trial.made, len(trial.moves)
    finally:
        trial.rollback()


@pytest.mark.parametrize(("base", "looks", "trial_moves"), ALLOWANCES)
@pytest.mark.parametrize("name", sorted(DEFRAGMENTS))
def test_a_defragment_plans_within_its_allowance(
    monkeypatch: pytest.MonkeyPatch, name: str, base: int, looks: int, trial_moves: int
) -> None:
    """A ``Defragment`` of budget B looks at most LOOKS_BASE + LOOKS * B times (plus the one scan under way
    when it ran out: ``SCAN`` gaps or the capacity index's groups) and makes at most TRIAL_MOVES * B trial
    moves (plus the moves of the attempt under way: at most 8 * B), whatever the cluster; it emits at most B
    moves and ends."""
    monkeypatch.setattr(defrag_moves, "LOOKS_BASE", base)
    monkeypatch.setattr(defrag_moves, "LOOKS", looks)
    monkeypatch.setattr(defrag_moves, "TRIAL_MOVES", trial_moves)
    state, attack = _up_to_the_attack(DEFRAGMENTS[name]())
    budget = attack.payload.max_moves  # type: ignore[union-attr]
    groups = sum(1 for _ in state.clusters[adversarial.CLUSTER].index.groups())
    looked, made, moves = _plan_work(state, attack)
    assert looked <= base + looks * budget + max(defrag_gaps.SCAN, groups)
    assert made <= trial_moves * budget + 8 * budget
    assert moves <= budget
    with wall_clock_limit(HANG_SECONDS):
        events = decide(state, attack)
    migrated = [event for event in events if type(event.payload) is PodMigrated]
    assert len(migrated) <= budget
    assert len(events) <= 1 + budget + EVENTS_PER_COMMAND


def test_a_tiny_allowance_bites_only_from_contract_v3(monkeypatch: pytest.MonkeyPatch) -> None:
    """With 3 looks per move (none beside), listing the 40 nodes for the target costs more than 8 moves' worth: the
    ``Defragment`` (contract v3) moves nothing. The same command written with contract v2 has no allowance:
    it makes the 7 moves it makes with the allowance as built, byte for byte."""
    commands = adversarial.defragment_target(40, budget=8)
    attack = commands[-1]
    legacy = V2Command(attack.command_id, attack.cluster, attack.issued_at, attack.payload, attack.source)

    def fold_attack(command: Command) -> list[Event]:
        return decide(_up_to_the_attack(commands)[0], command)

    as_built, as_built_v2 = fold_attack(attack), encode_events(fold_attack(legacy))
    assert [type(event.payload).__name__ for event in as_built] == (
        ["DefragmentationPlanned"] + ["PodMigrated"] * 7 + ["PodScheduled"]
    )
    monkeypatch.setattr(defrag_moves, "LOOKS_BASE", 0)
    monkeypatch.setattr(defrag_moves, "LOOKS", 3)
    tiny, tiny_v2 = fold_attack(attack), encode_events(fold_attack(legacy))
    assert [type(event.payload).__name__ for event in tiny] == ["DefragmentationPlanned"]
    assert "after at most 8 move(s)" in tiny[0].payload.message  # type: ignore[union-attr]
    assert tiny_v2 == as_built_v2 and len(as_built_v2) == len(as_built)


# ---------------------------------------------------------------- random mixed streams


RECORDED_SEEDS: dict[int, tuple[int, type[BaseException], str]] = {
    # seed of mixed_stream(SeededChooser(seed), size): (size, what main raises first under check_terminates, how)
    10: (200, RecursionError, "RecursionError in a DrainNode after 1,870 events"),
    13: (200, RecursionError, "RecursionError in a SetQuota after 879 events"),
    27: (200, RecursionError, "RecursionError in an AddNode after 1,854 events"),
    41: (200, RecursionError, "RecursionError in a SubmitGang after 1,423 events"),
    45: (200, RecursionError, "RecursionError in a SubmitPod after 1,856 events"),
    88: (200, RecursionError, "RecursionError in an UncordonNode after 1,387 events"),
    108: (300, RecursionError, "RecursionError in a MarkNodeFailed after 1,868 events"),
    3: (200, AssertionError, "a SubmitGang evicts gang g114's members twice"),
    25: (200, AssertionError, "a DrainNode evicts gang g28's members twice"),
    38: (200, AssertionError, "a MarkNodeFailed evicts p76 and p125 twice"),
    59: (200, AssertionError, "a Tick evicts p76 and p148 twice"),
    68: (200, AssertionError, "a Release evicts g71-0, p66 and p117 twice"),
    105: (300, AssertionError, "a SetQuota evicts p107 twice; later a ReleaseGang raises RecursionError"),
    1469: (
        200,
        InvariantViolation,
        "the tenants merge f29ad33: a DrainNode starts g84-2, a waiting member, then requeues g84",
    ),
}


@pytest.mark.parametrize(
    "seed",
    sorted(RECORDED_SEEDS),
)
def test_recorded_random_streams_that_crash_main_fold_to_the_end(seed: int) -> None:
    """Random mixed streams whose seeds crashed main, or evicted a pod twice in one command, fold to the end
    within the bounds."""
    check_terminates(mixed_stream(SeededChooser(seed), RECORDED_SEEDS[seed][0]))


HANG_SEED = 201  # mixed_stream(SeededChooser(201), 300): main never ends command x-268 (MarkNodeFailed)
HANG_GUARD_CPU_SECONDS = 60  # the whole check takes ~1-2 s of CPU on the pure-Python hot path
HANG_GUARD_WALL_SECONDS = 900  # only so a stopped child cannot hold the suite: the CPU limit is the guard


def test_the_recorded_random_stream_that_hangs_main_folds_to_the_end() -> None:
    """The stream whose MarkNodeFailed chased a lender's pod and a borrower's pod round the queue forever (no
    deep recursion: ~330 events/s until killed) folds to the end within the bounds. In a child process, the
    pure-Python hot path, killed once it has used :data:`HANG_GUARD_CPU_SECONDS` of CPU (a hang guard, not a
    speed figure, and CPU time, so a loaded machine does not trip it): a compiled loop never sees the alarm of
    :func:`wall_clock_limit`."""
    script = (
        "from tests.adversarial import SeededChooser, mixed_stream\n"
        "from tests.property.test_fold_terminates import check_terminates\n"
        f"check_terminates(mixed_stream(SeededChooser({HANG_SEED}), 300))\n"
    )
    env = {**os.environ, "GPUFOLD_PURE_PYTHON": "1"}

    def cpu_limit() -> None:  # in the child: SIGXCPU (death) after the limit
        resource.setrlimit(resource.RLIMIT_CPU, (HANG_GUARD_CPU_SECONDS, HANG_GUARD_CPU_SECONDS + 5))

    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_WALL_SECONDS,
        preexec_fn=cpu_limit,
    )
    assert done.returncode == 0, f"exit {done.returncode} (-24: over the CPU limit, a hang): {done.stderr[-3000:]}"


TERMINATION_SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@TERMINATION_SETTINGS
@example(commands=mixed_stream(SeededChooser(10), 200))
@given(commands=mixed_streams())
def test_random_mixed_streams_fold_to_the_end(commands: list[Command]) -> None:
    """Every command of a random mixed stream of pods, gangs, quotas and priorities ends within the bounds,
    evicts each pod at most once, and the stream replays identically (shrinks to a small failing stream)."""
    check_terminates(commands)


@TERMINATION_SETTINGS
@example(seed=10)
@example(seed=66)  # a deadline re-places a preempted gang member on the node that MarkNodeFailed then fails
@example(seed=6714)  # a deadline re-places a reclaimed pod on the node that DrainNode then drains
@given(seed=st.integers(0, 2**32 - 1))
def test_random_seeds_of_mixed_streams_fold_to_the_end(seed: int) -> None:
    """As above, over seeds of the seeded generator: the distribution that found the recorded seeds
    (on main, 31 of seeds 0-99 raised RecursionError or evicted a pod twice in one command)."""
    check_terminates(mixed_stream(SeededChooser(seed), 200))
