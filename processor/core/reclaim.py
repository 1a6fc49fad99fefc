"""Reclaim: a lender asks inside its nominal quota that others borrowed, and borrowers give it back.

Planned on trial (:class:`processor.core.preemption.Trial`): nothing is evicted unless the job then
starts. Which borrowers' pods go first, and the quota arithmetic: :mod:`processor.core.quotas`.
"""

from __future__ import annotations

from collections.abc import Mapping

from processor.core import preemption, quotas
from processor.core.policies.base import Choice, Policy
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Pod
from schemas.commands import PREEMPT_LOWER, Quota
from schemas.events import PodSpec

PodReclaim = tuple[list[preemption.Unit], Choice | None, preemption.PodPlan, PodShape]
"""A pod's reclaim plan: the borrowers' units it takes, where it goes (a choice on free capacity, or a
priority-preemption plan after the reclaim), and the shape it is placed with."""


def reclaim_on_trial(
    cluster: ClusterState,
    trial: preemption.Trial,
    tenant: str,
    quota: Quota,
    wanted: quotas.Demand,
    protected: Mapping[str, None],
) -> list[preemption.Unit] | None:
    """Evict borrowers on trial until ``wanted`` fits the lender's quota: the units taken, or None if the
    lender would still be short (or short on something reclaim cannot give)."""
    units: list[preemption.Unit] = []
    while True:  # measure: the borrowers' running pods not yet evicted on trial
        shortfall = quotas.check(cluster, tenant, quota, wanted)
        if shortfall is None:
            return units
        if not shortfall.reclaimable:
            return None
        candidates = quotas.reclaim_candidates(cluster, tenant, quota, [shortfall.key], protected)
        unit = _first_allowed(cluster, candidates, protected)
        if unit is None:
            return None
        for pod in unit.pods:
            trial.evict(pod)
        units.append(unit)


def _first_allowed(
    cluster: ClusterState, candidates: list[Pod], protected: Mapping[str, None]
) -> preemption.Unit | None:
    """The unit of the first candidate none of whose pods (a gang: every member) is protected."""
    for pod in candidates:
        unit = preemption.unit_of(cluster, pod, 0)
        if not any(member.spec.pod_id in protected for member in unit.pods):
            return unit
    return None


def plan_pod(
    cluster: ClusterState,
    spec: PodSpec,
    usable: PodShape,
    admission: quotas.Admission,
    policy: Policy,
    now: int,
    protected: Mapping[str, None],
) -> PodReclaim | None:
    """The reclaim that lets a pod start with the fewest victims, or None.

    Borrowers' pods are preempted, lowest priority then youngest first, until the lender's
    quota has room, and no more; the pod then starts on free capacity, or by priority
    preemption. Or, if that takes fewer victims, borrowers' pods on one node go first (same
    order) until the pod fits that node, then others until the quota has room. The plan with
    the fewest victims wins (ties: the first kind, then the node id)."""
    quota = quotas.quota_of(cluster, spec.tenant)
    assert quota is not None
    by_key: dict[str, list[str]] = {}
    for model, shortfall in admission.shortfalls:
        if shortfall.reclaimable:
            by_key.setdefault(shortfall.key, []).append(model)
    best: tuple[tuple[int, str], PodReclaim] | None = None
    for key in sorted(by_key):
        models = [model for model in by_key[key] if model]
        shape = usable._replace(gpu_models=tuple(models)) if models and spec.num_gpu else usable
        wanted = quotas.demand(quota, spec, by_key[key][0])
        candidates = quotas.reclaim_candidates(cluster, spec.tenant, quota, [key], protected)
        nodes = sorted({pod.node_id for pod in candidates if pod.node_id is not None})
        for node_id in [None, *nodes]:
            if node_id is not None and not preemption.could_hold(cluster, cluster.nodes[node_id], shape):
                continue
            trial = preemption.Trial(cluster)
            try:
                found = _option(cluster, trial, spec, quota, key, wanted, shape, node_id, policy, now, protected)
            finally:
                trial.rollback()
            if found is None:
                continue
            units, choice, plan = found
            rank = (sum(unit.count for unit in units) + (plan.cost[1] if plan.units else 0), node_id or "")
            if best is None or rank < best[0]:
                best = (rank, (units, choice, plan, shape))
    return None if best is None else best[1]


def _option(
    cluster: ClusterState,
    trial: preemption.Trial,
    spec: PodSpec,
    quota: Quota,
    key: str,
    wanted: quotas.Demand,
    shape: PodShape,
    node_id: str | None,
    policy: Policy,
    now: int,
    protected: Mapping[str, None],
) -> tuple[list[preemption.Unit], Choice | None, preemption.PodPlan] | None:
    """One reclaim plan on trial (see :func:`plan_pod`): its units, and where the pod goes."""
    units: list[preemption.Unit] = []
    if node_id is not None:
        node = cluster.nodes[node_id]
        while not preemption.fits_now(node, shape):  # measure: the borrowers' pods on the node
            here = [
                pod
                for pod in quotas.reclaim_candidates(cluster, spec.tenant, quota, [key], protected)
                if pod.node_id == node_id
            ]
            unit = _first_allowed(cluster, here, protected)
            if unit is None:
                return None
            for pod in unit.pods:
                trial.evict(pod)
            units.append(unit)
    more = reclaim_on_trial(cluster, trial, spec.tenant, quota, wanted, protected)
    if more is None:
        return None
    units += more
    if node_id is not None:
        choice = Choice(node_id, policy.choose_gpus(cluster.nodes[node_id], shape), {})
        return units, choice, preemption.PodPlan(node_id, [], (0, 0, 0))
    groups = cluster.index.feasible(shape)
    if groups:
        choice = policy.place(cluster, shape, groups)
        return units, choice, preemption.PodPlan(choice.node_id, [], (0, 0, 0))
    if spec.preemption == PREEMPT_LOWER and preemption.lower_priority_exists(cluster, spec.priority):
        plan = preemption.plan_pod(cluster, shape, spec.priority, now, None, preemption.Victims(protected))
        if plan is not None:
            return units, None, plan
    return None
