"""Evictions as events: the victims of a preemption, and every pod of a node that goes away.

Both only emit; putting the evicted back to placement is follow-up work
(:data:`~processor.core.decision.AFTER_PREEMPTION`, :data:`~processor.core.decision.AFTER_EVICTION`).
"""

from __future__ import annotations

from processor.core import preemption_plans
from processor.core.decision import Decision
from processor.core.resources import NO_EXECUTE, evicted_by_taints
from processor.core.state import ClusterState, Node, Pod
from schemas.commands import Taint
from schemas.events import PodEvicted, PodPreempted


def victim_events(
    decision: Decision, cluster: ClusterState, by: str, kind: str, units: list[preemption_plans.Unit], reason: str
) -> list[tuple[Pod, str]]:
    """``PodPreempted`` (why, and by whom), then ``PodEvicted``, for every pod of the units, by pod id;
    returns the victims with the nodes they ran on. O(V log V) for V victims."""
    victims = sorted((pod for unit in units for pod in unit.pods), key=lambda pod: pod.spec.pod_id)
    # Members taken alone: above their gang's min_members (disruption above_min), the gang runs on.
    whole = {unit.key for unit in units if unit.pods[0].spec.gang_id == unit.key}
    alone: set[str] = set()
    for unit in units:  # (a loop: mypyc cannot compile a starred tuple in a comprehension's condition)
        gang_id = unit.pods[0].spec.gang_id
        if gang_id is not None and gang_id != unit.key and gang_id not in whole:
            alone.add(unit.key)
    out = []
    for pod in victims:
        node_id = pod.node_id
        assert node_id is not None
        out.append((pod, node_id))
        if reason == "reclaim":
            words = (
                f"preempted to reclaim quota for {kind} {by!r}: its tenant asked for quota it lends to the cohort, "
                f"which tenant {pod.spec.tenant!r} was borrowing (borrowers give back lowest priority, youngest first)"
            )
        elif reason == "within_tenant":
            words = (
                f"preempted by {kind} {by!r} of its own tenant {pod.spec.tenant!r}, which did not fit the tenant's "
                "quota (the tenant's preemption.within_tenant lets it take lower-priority or newer work)"
            )
        elif reason == "borrow_within_cohort":
            words = (
                f"preempted by {kind} {by!r}, which borrows quota in the cohort and has a higher priority than "
                f"{pod.spec.priority} (its tenant's preemption.borrow_within_cohort)"
            )
        else:
            words = f"preempted by {kind} {by!r}, which has a higher priority than {pod.spec.priority}"
        if pod.spec.pod_id in alone:
            words += (
                f"; a member of gang {pod.spec.gang_id!r} above its min_members (disruption above_min): the gang "
                "runs on, the member waits as its member"
            )
        elif pod.spec.gang_id is not None:
            words += f"; its whole gang {pod.spec.gang_id!r} goes with it"
        decision.emit(PodPreempted(pod.spec.pod_id, node_id, by, reason, words), cluster.name)
        decision.emit(PodEvicted(pod.spec.pod_id, node_id, f"preempted:{reason}"), cluster.name)
    return out


def evict_untolerating(cluster: ClusterState, node: Node, taints: tuple[Taint, ...]) -> list[str]:
    """The node's running pods that a ``NoExecute`` taint among ``taints`` evicts, by pod id. O(p log p)."""
    if not any(taint.effect == NO_EXECUTE for taint in taints):
        return []
    return [pod_id for pod_id in sorted(node.pods) if evicted_by_taints(taints, cluster.pods[pod_id].spec.tolerations)]


def evict_all(
    decision: Decision, cluster: ClusterState, node: Node, reason: str, only: list[str] | None = None
) -> tuple[list[Pod], list[str]]:
    """Evict every pod of the node (or the pods ``only`` names, sorted), in pod id order: (plain pods to re-place,
    gangs hit). O(p log p) for its p pods.

    Sorted, not in placement order, so a state restored from a snapshot evicts
    in the same order as one built by full replay."""
    plain: list[Pod] = []
    gang_ids: dict[str, None] = {}
    for pod_id in sorted(node.pods) if only is None else only:
        pod = cluster.pods[pod_id]
        decision.emit(PodEvicted(pod_id, node.node_id, reason), cluster.name)
        if pod.spec.gang_id is None:
            plain.append(pod)
        else:
            gang_ids[pod.spec.gang_id] = None
    return plain, sorted(gang_ids)
