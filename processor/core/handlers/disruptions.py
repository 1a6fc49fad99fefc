"""Disruption budgets and graceful drains: ``SetDisruptionBudget``, ``RemoveDisruptionBudget``, and the part of
``DrainNode`` that waits (for a grace period, or for a budget to free).

A drain with ``grace_ms`` or under budgets cordons the node, then goes over its pods in id order: a pod whose
eviction a budget refuses gets ``EvictionBlocked`` (once per budget) and keeps running; with a grace period a pod
gets ``PodEvictionScheduled`` and a timer evicts it then; without one it is evicted at once. The node stays
*draining* (``ClusterState.draining``) until it is empty: ``NodeDrained``. After every command that touched a
cluster with draining nodes, :func:`drain_upkeep` tries the waiting pods again (their budget may have freed: a
pod ran again, ended, or a budget changed), so no client polls. An uncordon cancels the drain; a failure or a
removal evicts what is left, ignoring budgets (a failure counts against them).
"""

from __future__ import annotations

from collections.abc import Generator

from processor.core import budgets
from processor.core.decision import AFTER_EVICTION, RETRY_QUEUE, Decision, Task
from processor.core.handlers.reservations import drop_reserved_node
from processor.core.resources import evicted_by_taints
from processor.core.state import ClusterState, Node, Pod, lookup
from schemas.codes import Rejected, RejectionCode
from schemas.commands import RemoveDisruptionBudget, SetDisruptionBudget
from schemas.events import (
    DisruptionBudgetRemoved,
    DisruptionBudgetSet,
    EvictionBlocked,
    NodeCordoned,
    NodeDrained,
    PodEvicted,
    PodEvictionScheduled,
)
from schemas.validation import check_id, check_set_disruption_budget

DRAIN = "drain"
TAINTED = "node_updated"


def set_disruption_budget(decision: Decision, command: SetDisruptionBudget) -> None:
    """Set (or replace) a budget; it counts the disruptions from now on. Drains waiting on budgets try again."""
    check_set_disruption_budget(command)
    selector = dict(sorted(command.label_selector.items())) if command.label_selector is not None else None
    decision.emit(
        DisruptionBudgetSet(command.budget_id, command.tenant, command.gang_id, selector, command.max_unavailable)
    )


def remove_disruption_budget(decision: Decision, command: RemoveDisruptionBudget) -> Task:
    """Remove a budget; drains waiting on it go on after the command. With the last budget gone nothing is counted
    or blocked any more: the pods a ``NoExecute`` taint was keeping waiting are evicted now."""
    check_id("budget_id", command.budget_id)
    cluster = decision.cluster
    if command.budget_id not in cluster.budgets:
        raise Rejected(
            RejectionCode.UNKNOWN_BUDGET,
            f"disruption budget {command.budget_id!r} is not set in cluster {decision.command.cluster!r}",
        )
    tainted = []
    if len(cluster.budgets) == 1:
        for pod_id in sorted(cluster.blocked):
            pod = lookup(cluster.pods, pod_id)
            if pod is not None and pod.node_id is not None and pod.node_id not in cluster.draining:
                tainted.append(pod)
    decision.emit(DisruptionBudgetRemoved(command.budget_id))
    for pod in tainted:  # measure: the pods left
        node_id = pod.node_id
        if node_id is not None and evicted_by_taints(cluster.nodes[node_id].taints, pod.spec.tolerations):
            yield from _evict_or_block(decision, cluster, cluster.nodes[node_id], pod, TAINTED)


def drain_waiting(decision: Decision, cluster: ClusterState, node: Node, grace_ms: int, respect: bool) -> Task:
    """Start a drain that may wait: cordon, release a reservation on the node, then one pass over its pods."""
    if not node.cordoned:
        decision.emit(NodeCordoned(node.node_id), cluster.name)
    drop_reserved_node(decision, cluster, node, "node_drained")
    yield from _pass(decision, cluster, node, grace_ms, respect)


def _pass(
    decision: Decision, cluster: ClusterState, node: Node, grace_ms: int, respect: bool
) -> Generator[None, None, bool]:
    """Evict (or schedule, or find blocked) each pod of a draining node, by id, each evicted pod re-placed before
    the next is looked at (it may free its budget); ``NodeDrained`` if the node is empty. Whether any pod was
    evicted or scheduled. O(p · B · (U + L)) for its p pods (``processor.core.budgets``).

    Measure: the node's pods left in the loop."""
    moved = False
    evicted = 0
    for pod_id in sorted(node.pods):
        if pod_id not in node.pods:
            continue  # its gang went back to the queue with an earlier member
        pod = cluster.pods[pod_id]
        if pod.evicting_at is not None:
            continue
        if respect and cluster.budgets:
            budget_id = budgets.blocking(cluster, budgets.leaving_with(cluster, pod))
            if budget_id is not None:
                if cluster.blocked.get(pod_id) != budget_id:
                    decision.emit(EvictionBlocked(pod_id, node.node_id, budget_id, grace_ms), cluster.name)
                continue
        moved = True
        if grace_ms > 0:
            decision.emit(PodEvictionScheduled(pod_id, node.node_id, decision.now + grace_ms, respect), cluster.name)
            continue
        decision.emit(PodEvicted(pod_id, node.node_id, DRAIN), cluster.name)
        evicted += 1
        gang_id = pod.spec.gang_id
        decision.then(AFTER_EVICTION, cluster, [pod] if gang_id is None else [], [gang_id] if gang_id else [], DRAIN)
        yield  # re-placed (or its gang requeued) before the next pod: that may free the budget
    if not node.pods:
        decision.emit(NodeDrained(node.node_id, evicted), cluster.name)
    return moved


def drain_upkeep(decision: Decision, cluster: ClusterState) -> Task:
    """Go on with every draining node: empty ones are drained, waiting pods are tried again, until a round moves
    nothing.

    Measure: the running pods on draining nodes that are not being evicted; a round that does not lower it ends
    the loop (a draining node is cordoned: nothing lands there)."""
    while cluster.draining or cluster.blocked:
        moved = bool(cluster.blocked) and (yield from _tainted_upkeep(decision, cluster))
        for node_id in sorted(cluster.draining):
            node = lookup(cluster.nodes, node_id)
            if node is None or node_id not in cluster.draining:
                continue
            grace_ms, respect = cluster.draining[node_id]
            moved = (yield from _pass(decision, cluster, node, grace_ms, respect)) or moved
        if not moved:
            return


def evict_through_budgets(decision: Decision, cluster: ClusterState, node: Node, leaving: list[str]) -> Task:
    """Evict the pods a new ``NoExecute`` taint sends away (``leaving``, by id) as the budgets allow: a blocked one
    keeps running (``EvictionBlocked``, reason node_updated) and is tried again by :func:`drain_upkeep`. Each
    evicted pod is re-placed before the next is looked at. Measure: the pods of ``leaving`` left."""
    for pod_id in leaving:
        if pod_id in node.pods:
            yield from _evict_or_block(decision, cluster, node, cluster.pods[pod_id], TAINTED)


def _evict_or_block(decision: Decision, cluster: ClusterState, node: Node, pod: Pod, reason: str) -> Task:
    """Evict one pod (``reason``) unless a budget blocks it (then ``EvictionBlocked`` once per budget)."""
    pod_id = pod.spec.pod_id
    budget_id = budgets.blocking(cluster, budgets.leaving_with(cluster, pod))
    if budget_id is not None:
        if cluster.blocked.get(pod_id) != budget_id:
            decision.emit(EvictionBlocked(pod_id, node.node_id, budget_id, 0, reason), cluster.name)
        return
    decision.emit(PodEvicted(pod_id, node.node_id, reason), cluster.name)
    gang_id = pod.spec.gang_id
    decision.then(AFTER_EVICTION, cluster, [pod] if gang_id is None else [], [gang_id] if gang_id else [], reason)
    if reason == TAINTED:  # the node stays schedulable: what it freed goes to the queue (a drained one is cordoned)
        decision.then(RETRY_QUEUE, cluster, (node.node_id,), None)
    yield  # re-placed (or its gang requeued) first: that may free the budget


def _tainted_upkeep(decision: Decision, cluster: ClusterState) -> Generator[None, None, bool]:
    """Pods a ``NoExecute`` taint blocked (on nodes not being drained): evicted now if the budgets allow, or
    forgotten if they tolerate the node's taints now. Whether any left. Measure: the blocked pods left."""
    moved = False
    for pod_id in sorted(cluster.blocked):
        pod = lookup(cluster.pods, pod_id)
        if pod is None or pod.node_id is None or pod.node_id in cluster.draining or pod_id not in cluster.blocked:
            continue
        node = cluster.nodes[pod.node_id]
        if not evicted_by_taints(node.taints, pod.spec.tolerations):
            continue  # an UpdateNode since took the taint away (its applier forgot the block)
        before = len(node.pods)
        yield from _evict_or_block(decision, cluster, node, pod, TAINTED)
        moved = moved or len(node.pods) < before
    return moved


def eviction_due(decision: Decision, cluster: ClusterState, pod_id: str, deadline: int) -> None:
    """A pod's grace period ended: it is evicted, unless its gang would now go past a budget (then it waits
    again, ``EvictionBlocked``); ``NodeDrained`` if that emptied the node."""
    pod = lookup(cluster.pods, pod_id)
    if pod is None or pod.evicting_at != deadline or pod.node_id is None:
        return  # ended, or the drain was cancelled
    node = cluster.nodes[pod.node_id]
    grace_ms, respect = cluster.draining.get(node.node_id, (0, True))
    if respect and cluster.budgets:
        budget_id = budgets.blocking(cluster, budgets.leaving_with(cluster, pod))
        if budget_id is not None:
            decision.emit(EvictionBlocked(pod_id, node.node_id, budget_id, grace_ms), cluster.name)
            return
    decision.emit(PodEvicted(pod_id, node.node_id, DRAIN), cluster.name)
    gang_id = pod.spec.gang_id
    decision.then(AFTER_EVICTION, cluster, [pod] if gang_id is None else [], [gang_id] if gang_id else [], DRAIN)
    if not node.pods and node.node_id in cluster.draining:
        decision.emit(NodeDrained(node.node_id, 1), cluster.name)
