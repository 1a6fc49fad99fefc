"""Nodes: ``AddNode``, ``RemoveNode``, ``CordonNode``, ``UncordonNode``, ``DrainNode``, ``MarkNodeFailed``,
``RecoverNode``, ``UpdateNode``.

A node that grows capacity leaves the queue to retry it; a node that goes away (drained, failed,
removed) evicts its pods, which go back to placement as follow-up work; a reserved node that becomes
unusable releases its reservation (planned again after the command). Since contract v3 the node
becomes unusable first, and the evicted pods are re-placed before the released reservation's nodes are
retried, so nothing lands on a node in the command that takes it away (a pod placed there would be
evicted twice in one command); contract v1 and v2 released the reservation and retried first.
"""

from __future__ import annotations

from processor.core.decision import AFTER_EVICTION, RETRY_QUEUE, Decision, Task
from processor.core.handlers.disruptions import drain_waiting, evict_through_budgets
from processor.core.handlers.evictions import evict_all, evict_untolerating
from processor.core.handlers.reservations import drop_reserved_node
from processor.core.state import Node, lookup
from schemas.codes import Rejected, RejectionCode
from schemas.commands import (
    AddNode,
    CordonNode,
    DrainNode,
    MarkNodeFailed,
    RecoverNode,
    RemoveNode,
    UncordonNode,
    UpdateNode,
)
from schemas.events import (
    NodeAdded,
    NodeCordoned,
    NodeDrained,
    NodeFailed,
    NodeRecovered,
    NodeRemoved,
    NodeUncordoned,
    NodeUpdated,
)
from schemas.validation import check_add_node, check_drain_node, check_id, check_mark_node_failed, check_update_node


def _node(decision: Decision, node_id: str) -> Node:
    check_id("node_id", node_id)
    node = lookup(decision.cluster.nodes, node_id)
    if node is None:
        raise Rejected(RejectionCode.UNKNOWN_NODE, f"node {node_id!r} is not in cluster {decision.command.cluster!r}")
    return node


def add_node(decision: Decision, command: AddNode) -> None:
    check_add_node(command)
    if command.node_id in decision.cluster.nodes:
        raise Rejected(
            RejectionCode.DUPLICATE_NODE,
            f"node {command.node_id!r} already exists in cluster {decision.command.cluster!r}",
        )
    decision.emit(
        NodeAdded(
            command.node_id,
            command.gpu_model,
            command.gpu_count,
            command.cpu_milli,
            command.memory_mib,
            dict(command.labels),
            tuple(command.taints),
            command.gpu_memory_mib,
        )
    )
    decision.then(RETRY_QUEUE, decision.cluster, (command.node_id,), None)


def remove_node(decision: Decision, command: RemoveNode) -> Task:
    node = _node(decision, command.node_id)
    if node.pods and not command.force:
        raise Rejected(
            RejectionCode.NODE_BUSY,
            f"node {command.node_id!r} runs {len(node.pods)} pod(s); drain it first or remove it with force=true",
        )
    cluster = decision.cluster
    if decision.legacy:  # contract v1/v2: the reservation's retry ran first and could place on the node
        if drop_reserved_node(decision, cluster, node, "node_removed"):
            yield  # the queue retries the released nodes first
        evicted, gang_ids = evict_all(decision, cluster, node, "node_removed")
        decision.emit(NodeRemoved(command.node_id, command.force))
        decision.then(AFTER_EVICTION, cluster, evicted, gang_ids, "node_removed")
        return
    evicted, gang_ids = evict_all(decision, cluster, node, "node_removed")
    decision.then(AFTER_EVICTION, cluster, evicted, gang_ids, "node_removed")
    drop_reserved_node(decision, cluster, node, "node_removed")  # its retry runs after: the node is gone by then
    decision.emit(NodeRemoved(command.node_id, command.force))


def cordon_node(decision: Decision, command: CordonNode) -> Task:
    node = _node(decision, command.node_id)
    if node.failed:
        raise Rejected(RejectionCode.NODE_FAILED, f"node {command.node_id!r} has failed; remove it and add it again")
    if node.cordoned:
        raise Rejected(RejectionCode.NODE_ALREADY_CORDONED, f"node {command.node_id!r} is already cordoned")
    if drop_reserved_node(decision, decision.cluster, node, "node_cordoned"):
        yield  # the queue retries the released nodes first (a cordon evicts nothing: no pod moves twice)
    decision.emit(NodeCordoned(command.node_id))


def uncordon_node(decision: Decision, command: UncordonNode) -> None:
    node = _node(decision, command.node_id)
    if node.failed:
        raise Rejected(RejectionCode.NODE_FAILED, f"node {command.node_id!r} has failed; remove it and add it again")
    if not node.cordoned:
        raise Rejected(RejectionCode.NODE_NOT_CORDONED, f"node {command.node_id!r} is not cordoned")
    decision.emit(NodeUncordoned(command.node_id))
    decision.then(RETRY_QUEUE, decision.cluster, (command.node_id,), None)


def drain_node(decision: Decision, command: DrainNode) -> Task:
    check_drain_node(command)
    node = _node(decision, command.node_id)
    if node.failed:
        raise Rejected(RejectionCode.NODE_FAILED, f"node {command.node_id!r} has failed; its pods were already evicted")
    cluster = decision.cluster
    if not decision.legacy and (command.grace_ms > 0 or (command.respect_budgets and cluster.budgets)):
        mark = len(decision.events)
        yield from drain_waiting(decision, cluster, node, command.grace_ms, command.respect_budgets)
        if len(decision.events) == mark:  # already cordoned, every pod already on its way or blocked as before
            raise Rejected(
                RejectionCode.NODE_DRAINING,
                f"node {command.node_id!r} is already draining: its {len(node.pods)} pod(s) wait for their "
                "eviction (a grace period or a disruption budget); this drain changes nothing",
            )
        return
    if decision.legacy:
        if drop_reserved_node(decision, cluster, node, "node_drained"):
            yield  # the queue retries the released nodes first
        decision.emit(NodeDrained(command.node_id, len(node.pods)))
        evicted, gang_ids = evict_all(decision, cluster, node, "drain")
        decision.then(AFTER_EVICTION, cluster, evicted, gang_ids, "drain")
        return
    decision.emit(NodeDrained(command.node_id, len(node.pods)))  # cordoned first: nothing lands on it any more
    evicted, gang_ids = evict_all(decision, cluster, node, "drain")
    decision.then(AFTER_EVICTION, cluster, evicted, gang_ids, "drain")
    drop_reserved_node(decision, cluster, node, "node_drained")


def mark_node_failed(decision: Decision, command: MarkNodeFailed) -> Task:
    check_mark_node_failed(command)
    node = _node(decision, command.node_id)
    if node.failed:
        raise Rejected(RejectionCode.NODE_FAILED, f"node {command.node_id!r} is already marked failed")
    cluster = decision.cluster
    if decision.legacy:
        if drop_reserved_node(decision, cluster, node, "node_failed"):
            yield  # the queue retries the released nodes first
        decision.emit(NodeFailed(command.node_id, command.reason, len(node.pods)))
        evicted, gang_ids = evict_all(decision, cluster, node, "node_failed")
        decision.then(AFTER_EVICTION, cluster, evicted, gang_ids, "node_failed")
        return
    decision.emit(NodeFailed(command.node_id, command.reason, len(node.pods)))  # unusable first
    evicted, gang_ids = evict_all(decision, cluster, node, "node_failed")
    decision.then(AFTER_EVICTION, cluster, evicted, gang_ids, "node_failed")
    drop_reserved_node(decision, cluster, node, "node_failed")


def recover_node(decision: Decision, command: RecoverNode) -> None:
    """A failed node returns, empty and schedulable (its pods were evicted when it failed); the queue retries it."""
    node = _node(decision, command.node_id)
    if not node.failed:
        raise Rejected(RejectionCode.NODE_NOT_FAILED, f"node {command.node_id!r} has not failed; nothing to recover")
    decision.emit(NodeRecovered(command.node_id))
    decision.then(RETRY_QUEUE, decision.cluster, (command.node_id,), None)


def update_node(decision: Decision, command: UpdateNode) -> Task:
    """New labels and/or taints; the running pods that do not tolerate a ``NoExecute`` taint are evicted and
    re-placed (through the disruption budgets, like a drain, if the cluster has any), the reservation on the node
    (whose holder may no longer fit it) is released, and the queue retries the node. O(p log p) for the node's p
    pods, and a budget check per leaving pod."""
    check_update_node(command)
    node = _node(decision, command.node_id)
    cluster = decision.cluster
    # Sorted: the event's bytes must not depend on the order a restored node keeps its labels in.
    labels = dict(sorted((command.labels if command.labels is not None else node.labels).items()))
    taints = tuple(command.taints) if command.taints is not None else node.taints
    leaving = evict_untolerating(cluster, node, taints)
    decision.emit(NodeUpdated(command.node_id, labels, taints, len(leaving)))  # first: nothing untolerating lands
    if leaving and cluster.budgets and not decision.legacy:
        yield from evict_through_budgets(decision, cluster, node, leaving)
    elif leaving:
        evicted, gang_ids = evict_all(decision, cluster, node, "node_updated", leaving)
        decision.then(AFTER_EVICTION, cluster, evicted, gang_ids, "node_updated")
    drop_reserved_node(decision, cluster, node, "node_updated")
    if node.schedulable:  # the new labels or taints may admit what waits (after the evicted are re-placed)
        decision.then(RETRY_QUEUE, cluster, (command.node_id,), None)
