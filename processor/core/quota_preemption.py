"""A pod that does not fit its tenant's quota, and the tenant's ``SetQuota.preemption`` policy (contract v4;
Kueue's ClusterQueue ``preemption``):

- ``within_tenant`` (Kueue's ``withinClusterQueue``): it may take the tenant's own lower-priority work, or also
  its newer work of equal priority (``never`` by default: the pod waits with ``QUOTA_EXCEEDED``);
- ``borrow_within_cohort: lower_priority`` (``borrowWithinCohort``): a pod that must borrow may take the
  cohort peers' lower-priority pods, also those inside their nominal quota, of at most
  ``borrow_max_victim_priority``.

Planned on trial (:class:`processor.core.preemption_plans.Trial`): the running pods the policy allows (preemptible,
not evicted earlier in the command; a gang member takes its whole gang, and only if the policy allows every
member) are evicted in reclaim's order (lowest priority, then youngest, then id) until the pod's quota has room
and a node has the capacity; then those not needed are given back, latest first (Kueue's fill-back). Nothing
is evicted unless the pod starts.

Cost: O(P) to list the candidates, then O(models · keys + S_m) per unit tried, at most :data:`UNITS`, and as
many again for the fill-back. Only a tenant that set a policy pays it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from processor.core import preemption_plans, quotas
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Pod
from schemas.commands import BORROW_LOWER, WITHIN_LOWER_OR_NEWER, WITHIN_NEVER
from schemas.events import PodSpec

UNITS = 64
"""Units (a pod, or a gang) evicted on trial at most before the search gives up."""

WITHIN_TENANT = "within_tenant"
BORROW_WITHIN_COHORT = "borrow_within_cohort"
"""The ``PodPreempted.reason`` of each policy's victims."""


def within_tenant(cluster: ClusterState, preemptor: PodSpec) -> Callable[[Pod], bool] | None:
    """Whom ``within_tenant`` lets the preemptor take (None: no one): its tenant's preemptible pods of lower
    priority; or, for ``lower_or_newer_equal_priority``, also of equal priority and submitted later."""
    quota = quotas.quota_of(cluster, preemptor.tenant)
    if quota is None or quota.policy.within_tenant == WITHIN_NEVER:
        return None
    newer = quota.policy.within_tenant == WITHIN_LOWER_OR_NEWER

    def allowed(victim: Pod) -> bool:
        spec = victim.spec
        if spec.tenant != preemptor.tenant or not spec.preemptible:
            return False
        if spec.priority < preemptor.priority:
            return True
        return newer and spec.priority == preemptor.priority and spec.arrival > preemptor.arrival

    return allowed


def borrow_within_cohort(cluster: ClusterState, preemptor: PodSpec) -> Callable[[Pod], bool] | None:
    """Whom ``borrow_within_cohort`` lets the preemptor take (None: no one): its cohort peers' preemptible pods of
    lower priority, at most ``borrow_max_victim_priority``."""
    quota = quotas.quota_of(cluster, preemptor.tenant)
    if quota is None or quota.cohort is None or quota.policy.borrow_within_cohort != BORROW_LOWER:
        return None
    peers = set(quotas.tree_members(cluster, quota.cohort))  # the whole cohort tree (contract v4)
    peers.discard(preemptor.tenant)
    ceiling = quota.policy.borrow_max_victim_priority

    def allowed(victim: Pod) -> bool:
        spec = victim.spec
        if spec.tenant not in peers or not spec.preemptible or spec.priority >= preemptor.priority:
            return False
        return ceiling is None or spec.priority <= ceiling

    return allowed


def plan_pod(
    cluster: ClusterState,
    spec: PodSpec,
    usable: PodShape,
    protected: Mapping[str, None],
    now: int,
    allowed: Callable[[Pod], bool],
) -> list[preemption_plans.Unit] | None:
    """The units (among those ``allowed``) to evict so that the pod fits its quota and a node, or None."""
    candidates = [
        pod
        for pod in cluster.pods.values()
        if pod.node_id is not None and pod.spec.pod_id not in protected and allowed(pod)
    ]
    if not candidates:
        return None
    candidates.sort(key=lambda pod: (pod.spec.priority, -(pod.started_at or 0), pod.spec.pod_id))

    def fits() -> bool:
        admission = quotas.admit(cluster, spec, usable)
        return admission.shape is not None and bool(cluster.index.feasible(admission.shape))

    def fits_without(units: list[preemption_plans.Unit]) -> bool:
        trial = preemption_plans.Trial(cluster)
        try:
            for unit in units:
                for pod in unit.pods:
                    trial.evict(pod)
            return fits()
        finally:
            trial.rollback()

    units: list[preemption_plans.Unit] = []
    taken: dict[str, None] = {}
    found = False
    trial = preemption_plans.Trial(cluster)
    try:
        for pod in candidates:  # measure: the candidates left (and at most UNITS units taken)
            if pod.spec.pod_id in taken:
                continue  # taken with its gang
            unit = preemption_plans.unit_of(cluster, pod, now)
            if any(member.spec.pod_id in protected or member.spec.pod_id in taken for member in unit.pods):
                continue
            if not all(allowed(member) for member in unit.pods):
                continue
            for member in unit.pods:
                trial.evict(member)
                taken[member.spec.pod_id] = None
            units.append(unit)
            if fits():
                found = True
                break
            if len(units) >= UNITS:
                break
    finally:
        trial.rollback()
    if not found:
        return None
    for position in range(len(units) - 1, -1, -1):  # measure: position; fill-back, latest taken first
        fewer = units[:position] + units[position + 1 :]
        if fewer and fits_without(fewer):
            units = fewer
    return units
