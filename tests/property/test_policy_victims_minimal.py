"""Issue #24's (c) for the tenant policies (``within_tenant``, ``borrow_within_cohort``): the victims a policy
takes are minimal by inclusion. Kueue plans these greedily, in reclaim's order, then gives back what is not
needed (fill-back), and so does gpufold (``processor/core/quota_preemption.py``; README "Tenant preemption
policies"): the set is not always the fewest victims an exhaustive search would find (priority preemption's is,
``test_fold_properties``), but no victim in it can be given back and the pod still fit its quota and a node.

Checked on the state the plan was made on: each command is folded first on a what-if fork; when it is a
``SubmitPod`` whose pod starts by a policy's preemption (its first events), the state before the command is the
state of the plan, and there the victims (their units: a gang whole) are tried again, each given back in turn.
Works the same on the compiled hot path (nothing is patched).
"""

from __future__ import annotations

from hypothesis import given, note, target

from processor.core import preemption_plans, quotas
from processor.core.fold import decide
from processor.core.state import ClusterState, PartitionState, shape_of
from processor.runtime.whatif import fork
from schemas.commands import AddNode, Command, QuotaPreemption, SetPolicy, SetQuota, SubmitPod
from schemas.events import Event, PodPreempted, PodScheduled, PodSpec
from tests.property.test_tenant_policies import SETTINGS, policy_streams

POLICY_REASONS = ("within_tenant", "borrow_within_cohort")


def _fits_with(cluster: ClusterState, spec: PodSpec, units: list[preemption_plans.Unit]) -> bool:
    """Whether the pod fits its quota and a node once these units are evicted (on trial, undone)."""
    trial = preemption_plans.Trial(cluster)
    try:
        for unit in units:
            for pod in unit.pods:
                trial.evict(pod)
        admission = quotas.admit(cluster, spec, shape_of(spec))
        return admission.shape is not None and bool(cluster.index.feasible(admission.shape))
    finally:
        trial.rollback()


def _policy_plan(command: Command, events: list[Event]) -> tuple[PodSpec, list[str]] | None:
    """The submitted pod and its victims, if the command's first events are a policy's preemption for it."""
    payload = command.payload
    if not isinstance(payload, SubmitPod) or not events:
        return None
    first = events[0].payload
    if not isinstance(first, PodPreempted) or first.reason not in POLICY_REASONS or first.by != payload.pod_id:
        return None
    victims: list[str] = []
    for event in events:
        if isinstance(event.payload, PodPreempted) and event.payload.by == payload.pod_id:
            victims.append(event.payload.pod_id)
        elif isinstance(event.payload, PodScheduled) and event.payload.pod.pod_id == payload.pod_id:
            return event.payload.pod, victims
    raise AssertionError(f"{payload.pod_id!r} preempted for but did not start: {events}")


def _check_minimal(before: PartitionState, command: Command, spec: PodSpec, victims: list[str]) -> int:
    cluster = before.clusters[command.cluster]
    now = command.issued_at  # what a unit's work lost is counted at: no part of a fit
    units: dict[str, preemption_plans.Unit] = {}
    for pod_id in victims:
        unit = preemption_plans.unit_of(cluster, cluster.pods[pod_id], now)
        units.setdefault(unit.key, unit)
    taken = [units[key] for key in sorted(units)]
    assert _fits_with(cluster, spec, taken), f"the victims of {spec.pod_id!r} do not make room: {victims}"
    assert not _fits_with(cluster, spec, []), f"victims taken for {spec.pod_id!r}, which fits without: {victims}"
    for position, unit in enumerate(taken):
        fewer = taken[:position] + taken[position + 1 :]
        assert not _fits_with(cluster, spec, fewer), (
            f"{spec.pod_id!r} fits without victim {unit.key!r}: it should have been given back ({victims})"
        )
    return len(taken)


def _fold_checked(commands: list[Command]) -> list[int]:
    """Fold the commands; the size of every policy plan checked, in order."""
    plans: list[int] = []
    state = PartitionState()
    for offset, command in enumerate(commands):
        events = decide(fork(state), command, offset)  # the fork changes; ``state`` is still the state before
        plan = _policy_plan(command, events)
        if plan is not None:
            plans.append(_check_minimal(state, command, *plan))
        assert decide(state, command, offset) == events, "the fork and the state decide alike"
    return plans


def _commands(payloads: list) -> list[Command]:
    return [Command(f"c{i}", "lab", 1000 * (i + 1), payload, "test") for i, payload in enumerate(payloads)]


def test_the_check_sees_the_plans_it_checks() -> None:
    """A tenant at its quota with ``within_tenant: lower_priority``: its priority-5 pod takes one of its two
    priority-0 pods (the youngest), not both; the check saw that plan (so the property below is not vacuous)."""
    policy = QuotaPreemption(within_tenant="lower_priority")
    commands = _commands(
        [
            SetPolicy("first-fit", -1),
            AddNode("n0", 32_000, 65_536, "A100", 8),
            SetQuota("t1", nominal_gpus={"A100": 4}, preemption=policy),
            SubmitPod("old", "t1", 0, 2, 1000, 1000, 1024),
            SubmitPod("young", "t1", 0, 2, 1000, 1000, 1024),
            SubmitPod("urgent", "t1", 5, 2, 1000, 1000, 1024),
        ]
    )
    assert _fold_checked(commands) == [1]


def test_a_victim_taken_first_and_not_needed_is_given_back() -> None:
    """Kueue's fill-back: reclaim's order takes the priority-0 one-GPU pod first, which is not enough, then the
    priority-1 four-GPU pod; with that one gone the first is not needed, so it is given back (runs on)."""
    policy = QuotaPreemption(within_tenant="lower_priority")
    commands = _commands(
        [
            SetPolicy("first-fit", -1),
            AddNode("n0", 32_000, 65_536, "A100", 8),
            SetQuota("t1", nominal_gpus={"A100": 6}, preemption=policy),
            SubmitPod("big", "t1", 1, 4, 1000, 1000, 1024),
            SubmitPod("small", "t1", 0, 1, 1000, 1000, 1024),
            SubmitPod("urgent", "t1", 5, 4, 1000, 1000, 1024),
        ]
    )
    assert _fold_checked(commands) == [1]
    state = PartitionState()
    events = [event for command in commands for event in decide(state, command)]
    assert [event.payload.pod_id for event in events if isinstance(event.payload, PodPreempted)] == ["big"]
    assert state.clusters["lab"].pods["small"].running


@SETTINGS
@given(commands=policy_streams())
def test_policy_victims_are_minimal_by_inclusion(commands: list[Command]) -> None:
    plans = _fold_checked(commands)
    note(f"policy plans checked: {plans}")
    target(float(len(plans)), label="policy plans checked")
