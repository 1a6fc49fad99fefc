"""Issue #24's (c) for the tenant policies (``within_tenant``, ``borrow_within_cohort``): the victims a policy
takes are minimal by inclusion. Kueue plans these greedily, in reclaim's order, then gives back what is not
needed (fill-back), and so does gpufold (``processor/core/quota_preemption.py``; README "Tenant preemption
policies"): the set is not always the fewest victims an exhaustive search would find (priority preemption's is,
``test_fold_properties``), but no victim in it can be given back and the pod still fit its quota and a node.

Checked where the plan is made, on the state it is made on: every plan ``quota_preemption.plan_pod`` returns
during random policy streams is tried again with each of its units given back, and with none taken.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from unittest import mock

from hypothesis import given, note, target

from processor.core import preemption_plans, quota_preemption, quotas
from processor.core.fold import decide
from processor.core.resources import PodShape
from processor.core.state import ClusterState, PartitionState, Pod
from schemas.commands import AddNode, Command, QuotaPreemption, SetPolicy, SetQuota, SubmitPod
from schemas.events import PodSpec
from tests.property.test_tenant_policies import SETTINGS, policy_streams

Plan = Callable[..., list[preemption_plans.Unit] | None]


def _fits_with(cluster: ClusterState, spec: PodSpec, usable: PodShape, units: list[preemption_plans.Unit]) -> bool:
    """Whether the pod fits its quota and a node once these units are evicted (on trial, undone)."""
    trial = preemption_plans.Trial(cluster)
    try:
        for unit in units:
            for pod in unit.pods:
                trial.evict(pod)
        admission = quotas.admit(cluster, spec, usable)
        return admission.shape is not None and bool(cluster.index.feasible(admission.shape))
    finally:
        trial.rollback()


def _checking(original: Plan, plans: list[int]) -> Plan:
    def plan_pod(
        cluster: ClusterState,
        spec: PodSpec,
        usable: PodShape,
        protected: Mapping[str, None],
        now: int,
        allowed: Callable[[Pod], bool],
    ) -> list[preemption_plans.Unit] | None:
        units = original(cluster, spec, usable, protected, now, allowed)
        if units is None:
            return None
        plans.append(len(units))
        assert units, f"an empty plan for {spec.pod_id!r}"
        assert _fits_with(cluster, spec, usable, units), f"the victims planned for {spec.pod_id!r} do not make room"
        assert not _fits_with(cluster, spec, usable, []), f"victims planned for {spec.pod_id!r}, which fits without"
        for position, unit in enumerate(units):
            fewer = units[:position] + units[position + 1 :]
            assert not _fits_with(cluster, spec, usable, fewer), (
                f"{spec.pod_id!r} fits without victim {unit.key!r}: it should have been given back"
            )
        return units

    return plan_pod


def _fold_checked(commands: list[Command]) -> list[int]:
    plans: list[int] = []
    with mock.patch.object(quota_preemption, "plan_pod", _checking(quota_preemption.plan_pod, plans)):
        state = PartitionState()
        for offset, command in enumerate(commands):
            decide(state, command, offset)
    return plans


def test_the_check_sees_the_plans_it_checks() -> None:
    """A tenant at its quota with ``within_tenant: lower_priority``: its priority-5 pod takes one of its two
    priority-0 pods (the youngest), not both; the patched planner saw that plan (so the property below is not
    vacuous)."""
    policy = QuotaPreemption(within_tenant="lower_priority")
    payloads = [
        SetPolicy("first-fit", -1),
        AddNode("n0", 32_000, 65_536, "A100", 8),
        SetQuota("t1", nominal_gpus={"A100": 4}, preemption=policy),
        SubmitPod("old", "t1", 0, 2, 1000, 1000, 1024),
        SubmitPod("young", "t1", 0, 2, 1000, 1000, 1024),
        SubmitPod("urgent", "t1", 5, 2, 1000, 1000, 1024),
    ]
    commands = [Command(f"c{i}", "lab", 1000 * (i + 1), payload, "test") for i, payload in enumerate(payloads)]
    assert _fold_checked(commands) == [1]


def test_a_victim_taken_first_and_not_needed_is_given_back() -> None:
    """Kueue's fill-back: reclaim's order takes the priority-0 one-GPU pod first, which is not enough, then the
    priority-1 four-GPU pod; with that one gone the first is not needed, so it is given back (runs on)."""
    policy = QuotaPreemption(within_tenant="lower_priority")
    payloads = [
        SetPolicy("first-fit", -1),
        AddNode("n0", 32_000, 65_536, "A100", 8),
        SetQuota("t1", nominal_gpus={"A100": 6}, preemption=policy),
        SubmitPod("big", "t1", 1, 4, 1000, 1000, 1024),
        SubmitPod("small", "t1", 0, 1, 1000, 1000, 1024),
        SubmitPod("urgent", "t1", 5, 4, 1000, 1000, 1024),
    ]
    commands = [Command(f"c{i}", "lab", 1000 * (i + 1), payload, "test") for i, payload in enumerate(payloads)]
    assert _fold_checked(commands) == [1]
    state = PartitionState()
    events = [event for command in commands for event in decide(state, command)]
    preempted = [event.payload.pod_id for event in events if event.type_name == "PodPreempted"]
    assert preempted == ["big"]
    assert state.clusters["lab"].pods["small"].running


@SETTINGS
@given(commands=policy_streams())
def test_policy_victims_are_minimal_by_inclusion(commands: list[Command]) -> None:
    plans = _fold_checked(commands)
    note(f"policy plans: {plans}")
    target(float(len(plans)), label="policy plans checked")
