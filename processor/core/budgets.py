"""Disruption budgets: which pods a budget counts, how many are unavailable, and whether an eviction fits.

A budget (``SetDisruptionBudget``) matches a pod by every filter it gives: the tenant, the gang, and a label
selector matched against the pod's ``node_selector`` (pods carry no labels of their own in this contract; the
labels a pod asks of its node are the ones it is known by). It counts the matching pods in
``ClusterState.disrupted``: evicted by a drain, a failure, a ``NoExecute`` taint or a removal (or scheduled for
eviction by a drain) and not running since. A drain evicts a pod only if every budget that matches what would
become unavailable (the pod, or all the running members of a gang that would go back to the queue) keeps within
``max_unavailable``; a failure is never refused, but counts.

Cost: a check is O(B · (U + L)) for B budgets, U pods unavailable now and L pods leaving.
"""

from __future__ import annotations

from processor.core.state import GANG_RUNNING, ClusterState, Pod
from schemas.events import DisruptionBudgetSet, PodSpec

DISRUPTIONS = ("drain", "node_failed", "node_updated", "node_removed")
"""``PodEvicted`` reasons that make a pod unavailable for budgets (``gang:`` plus one: its gang went with it)."""


def is_disruption(reason: str) -> bool:
    return reason in DISRUPTIONS or (reason.startswith("gang:") and reason[5:] in DISRUPTIONS)


def matches(budget: DisruptionBudgetSet, spec: PodSpec) -> bool:
    if budget.tenant is not None and budget.tenant != spec.tenant:
        return False
    if budget.gang_id is not None and budget.gang_id != spec.gang_id:
        return False
    selector = budget.label_selector
    if selector:
        own = spec.node_selector
        return all(own.get(key) == value for key, value in selector.items())
    return True


def unavailable(cluster: ClusterState, budget: DisruptionBudgetSet) -> int:
    """The matching pods unavailable now. O(U)."""
    return sum(1 for spec in cluster.disrupted.values() if matches(budget, spec))


def leaving_with(cluster: ClusterState, pod: Pod) -> list[PodSpec]:
    """What becomes unavailable if the pod is evicted: the pod, or every running member of its gang when the gang
    would have fewer than ``min_members`` left, or its role fewer than its ``min_members_per_role`` (it goes back to
    the queue whole). O(M) for a gang's M members."""
    gang_id = pod.spec.gang_id
    if gang_id is None:
        return [pod.spec]
    gang = cluster.gangs.get(gang_id)
    if gang is None or gang.state != GANG_RUNNING:
        return [pod.spec]
    if len(gang.placed) - 1 >= gang.spec.min_members:
        minimums = gang.spec.min_members_per_role
        role = pod.spec.role
        if role is None or role not in minimums:
            return [pod.spec]
        if sum(1 for member in gang.placed if cluster.pods[member].spec.role == role) - 1 >= minimums[role]:
            return [pod.spec]  # its role keeps its min_members_per_role too
    return [cluster.pods[member].spec for member in sorted(gang.placed)]


def blocking(cluster: ClusterState, leaving: list[PodSpec]) -> str | None:
    """The first budget (by id) that evicting ``leaving`` would take past its ``max_unavailable``; None if all
    keep within. Pods already unavailable are not counted twice."""
    budgets = cluster.budgets
    if not budgets:
        return None
    fresh = [spec for spec in leaving if spec.pod_id not in cluster.disrupted]
    for budget_id in sorted(budgets):  # measure: the budgets left
        budget = budgets[budget_id]
        new = sum(1 for spec in fresh if matches(budget, spec))
        if new and unavailable(cluster, budget) + new > budget.max_unavailable:
            return budget_id
    return None
