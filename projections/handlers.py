"""The projector's event handlers: what each event changes in the staged rows, and which events change nothing.

One handler per event type of ``schemas/event.avsc`` that changes a read-side table (:data:`HANDLERS`);
every other event type is named in :data:`NOT_PROJECTED` with the reason. Every event is kept in the audit
log either way. ``tests/unit/projections/test_handlers.py`` checks that the two cover the schema's union.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from projections.envelope import ProjectionError
from projections.rows import gang_row
from projections.staging import Handler, StagedBatch
from schemas.codes import QueueReasonCode
from schemas.events import (
    DisruptionBudgetRemoved,
    DisruptionBudgetSet,
    Event,
    EvictionBlocked,
    GangQueued,
    GangReleased,
    GangScheduled,
    GangSpec,
    NodeAdded,
    NodeCordoned,
    NodeDrained,
    NodeFailed,
    NodeRecovered,
    NodeRemoved,
    NodesReserved,
    NodeUncordoned,
    NodeUpdated,
    PodEvicted,
    PodEvictionScheduled,
    PodMigrated,
    PodQueued,
    PodReleased,
    PodRetryScheduled,
    PodScheduled,
    ReservationReleased,
)


def _node_added(batch: StagedBatch, event: Event, p: NodeAdded) -> None:
    cluster = event.cluster
    key = (cluster, p.node_id)
    node = batch.nodes[key] = {
        "cluster": cluster,
        "node_id": p.node_id,
        "gpu_model": p.gpu_model,
        "gpu_count": p.gpu_count,
        "cpu_milli": p.cpu_milli,
        "memory_mib": p.memory_mib,
        "labels": dict(p.labels),
        "taints": [t.to_avro() for t in p.taints],
        "cordoned": False,
        "failed": False,
        "gpu_free": [1000] * p.gpu_count,
        "gpu_milli_allocated": 0,
        "cpu_allocated": 0,
        "memory_allocated": 0,
        "pods_running": 0,
        "added_at": event.occurred_at,
        "updated_sequence": event.sequence,
    }
    batch.dirty_nodes.add(key)
    batch.shift_totals(node, event.occurred_at, 0, p.gpu_count * 1000, nodes=1)


def _node_removed(batch: StagedBatch, event: Event, p: NodeRemoved) -> None:
    cluster = event.cluster
    node = batch.node(cluster, p.node_id)
    capacity = 0 if node["failed"] else node["gpu_count"] * 1000
    batch.shift_totals(node, event.occurred_at, 0, -capacity, nodes=-1)
    batch.nodes[(cluster, p.node_id)] = None


def _node_flag(flag: str, value: bool) -> Handler:
    def handler(batch: StagedBatch, event: Event, p: Any) -> None:
        node = batch.node(event.cluster, p.node_id)
        node[flag] = value
        node["updated_sequence"] = event.sequence

    return handler


def _node_failed(batch: StagedBatch, event: Event, p: NodeFailed) -> None:
    node = batch.node(event.cluster, p.node_id)
    node["failed"] = True
    node["updated_sequence"] = event.sequence
    batch.shift_totals(node, event.occurred_at, 0, -node["gpu_count"] * 1000)


def _node_recovered(batch: StagedBatch, event: Event, p: NodeRecovered) -> None:
    """A failed node is back, empty and schedulable: its capacity counts again."""
    node = batch.node(event.cluster, p.node_id)
    node["failed"] = False
    node["cordoned"] = False
    node["updated_sequence"] = event.sequence
    batch.shift_totals(node, event.occurred_at, 0, node["gpu_count"] * 1000)


def _node_updated(batch: StagedBatch, event: Event, p: NodeUpdated) -> None:
    """A node's labels and taints are replaced (its evicted pods' PodEvicted events follow). Evictions its old
    NoExecute taints had blocked are decided anew (unless a drain holds the node: it goes on)."""
    node = batch.node(event.cluster, p.node_id)
    node["labels"] = dict(p.labels)
    node["taints"] = [t.to_avro() for t in p.taints]
    node["updated_sequence"] = event.sequence
    if not node["cordoned"]:
        _unblock(batch, event, lambda blocked: blocked["node_id"] == p.node_id)


def _node_uncordoned(batch: StagedBatch, event: Event, p: NodeUncordoned) -> None:
    """Schedulable again; a drain of the node is cancelled, so the evictions it had blocked will not happen."""
    _node_flag("cordoned", False)(batch, event, p)
    _unblock(batch, event, lambda blocked: blocked["node_id"] == p.node_id)


def _pod_queued(batch: StagedBatch, event: Event, p: PodQueued) -> None:
    pod = batch.pod_from_spec(event, p.pod)
    batch.set_status(pod, "pending")
    pod["reasons"] = [{"code": r.code, "nodes": r.nodes, "message": r.message} for r in p.reasons]
    pod["queued_at"] = event.occurred_at
    pod["updated_sequence"] = event.sequence


def _pod_scheduled(batch: StagedBatch, event: Event, p: PodScheduled) -> None:
    spec = p.pod
    cluster, t = event.cluster, event.occurred_at
    pod = batch.pod_from_spec(event, spec)
    node = batch.node(cluster, p.node_id)
    free = node["gpu_free"]
    gpus = [[share.index, share.milli] for share in p.gpus]
    for index, milli in gpus:
        free[index] -= milli
    milli_total = spec.num_gpu * spec.gpu_milli
    node["gpu_milli_allocated"] += milli_total
    node["cpu_allocated"] += spec.cpu_milli
    node["memory_allocated"] += spec.memory_mib
    node["pods_running"] += 1
    node["updated_sequence"] = event.sequence
    batch.set_status(pod, "running")
    pod["node_id"] = p.node_id
    pod["gpus"] = gpus
    pod["reasons"] = []
    pod["scheduled_at"] = t
    pod["updated_sequence"] = event.sequence
    batch.realloc.add((cluster, spec.pod_id))
    batch.shift_totals(node, t, milli_total, 0, pods=1)
    batch.usage.start(cluster, spec.tenant, t, milli_total, (event.partition, event.sequence))


def _pod_evicted(batch: StagedBatch, event: Event, p: PodEvicted) -> None:
    pod = batch.pod(event.cluster, p.pod_id)
    if pod["status"] != "running" or pod["node_id"] != p.node_id:
        raise ProjectionError(f"pod {p.pod_id!r} evicted from {p.node_id!r} where it does not run")
    batch.unbind(event, pod)
    batch.set_status(pod, "evicted")
    pod["updated_sequence"] = event.sequence


def _pod_retry_scheduled(batch: StagedBatch, event: Event, p: PodRetryScheduled) -> None:
    """A failed pod stops running and waits for its retry: pending, with the reason and the time it is due."""
    pod = batch.pod(event.cluster, p.pod_id)
    if pod["status"] != "running":
        raise ProjectionError(f"pod {p.pod_id!r} scheduled for a retry but it does not run")
    batch.unbind(event, pod)
    if p.gang_id is not None:
        _gang_retry_scheduled(batch, event, p, pod)
        return
    batch.set_status(pod, "pending")
    message = f"it failed; retry {p.attempt} is due at event time {p.not_before} ms (backoff)"
    pod["reasons"] = [{"code": QueueReasonCode.WAITING_FOR_RETRY, "nodes": 0, "message": message}]
    pod["queued_at"] = event.occurred_at
    pod["updated_sequence"] = event.sequence


def _gang_retry_scheduled(batch: StagedBatch, event: Event, p: PodRetryScheduled, pod: dict[str, Any]) -> None:
    """A member's failure took its gang: the failed member's row ends, as do the rows of the members evicted with
    it (they are pods again when the gang starts again); the gang is pending, with the reason and the time it is
    due."""
    key = (event.cluster, p.gang_id)
    gang = batch.gangs.get(key)  # type: ignore[arg-type]
    if gang is None or gang["status"] != "running":
        raise ProjectionError(f"gang {p.gang_id!r} scheduled for a retry but it does not run")
    batch.set_status(pod, "released")
    pod["reasons"] = []
    pod["ended_at"] = event.occurred_at
    pod["end_reason"] = "failed"
    pod["updated_sequence"] = event.sequence
    _close_evicted_members(batch, event, gang, "gang failed")
    gang["status"] = "pending"
    message = f"member {p.pod_id} failed; retry {p.attempt} of the gang is due at event time {p.not_before} ms"
    gang["reasons"] = [{"code": QueueReasonCode.WAITING_FOR_RETRY, "nodes": 0, "message": message + " (backoff)"}]
    gang["placed"] = []
    gang["started_at"] = gang["topology_key"] = gang["domain"] = None
    gang["queued_at"] = event.occurred_at
    gang["updated_sequence"] = event.sequence
    batch.dirty_gangs.add(key)  # type: ignore[arg-type]


def _eviction_blocked(batch: StagedBatch, event: Event, p: EvictionBlocked) -> None:
    """A drain waits for a budget: the running pod's row says so (its reasons), until it moves, and the budget's
    row lists it among the evictions it blocks."""
    pod = batch.pod(event.cluster, p.pod_id)
    message = f"a drain of node {p.node_id} waits: disruption budget {p.budget_id!r} has no room"
    pod["reasons"] = [{"code": "EVICTION_BLOCKED", "nodes": 0, "message": message}]
    pod["updated_sequence"] = event.sequence
    _unblock(batch, event, lambda blocked: blocked["pod_id"] == p.pod_id)
    budget = batch.budgets_of(event.cluster).get(p.budget_id)
    if budget is not None:
        entry = {"pod_id": p.pod_id, "node_id": p.node_id, "since": event.occurred_at, "reason": p.reason}
        budget["blocked"] = [*budget["blocked"], entry]  # a new list: a staged copy never shares it
        budget["updated_sequence"] = event.sequence
        batch.dirty_budgets.add((event.cluster, p.budget_id))


def _pod_eviction_scheduled(batch: StagedBatch, event: Event, p: PodEvictionScheduled) -> None:
    """A drain evicts the running pod at ``at``: its row says when; no budget blocks it any more."""
    pod = batch.pod(event.cluster, p.pod_id)
    message = f"a drain of node {p.node_id} evicts it at event time {p.at} ms (grace period)"
    pod["reasons"] = [{"code": "EVICTION_SCHEDULED", "nodes": 0, "message": message}]
    pod["updated_sequence"] = event.sequence
    _unblock(batch, event, lambda blocked: blocked["pod_id"] == p.pod_id)


# ---------------------------------------------------------------- disruption budgets


def _budget_set(batch: StagedBatch, event: Event, p: DisruptionBudgetSet) -> None:
    """A budget is set, or replaced: its filters and limit; the evictions it blocks stay listed."""
    rows = batch.budgets_of(event.cluster)
    before = rows.get(p.budget_id)
    rows[p.budget_id] = {
        "cluster": event.cluster,
        "budget_id": p.budget_id,
        "tenant": p.tenant,
        "gang_id": p.gang_id,
        "label_selector": dict(sorted((p.label_selector or {}).items())),
        "max_unavailable": p.max_unavailable,
        "set_at": event.occurred_at,
        "blocked": before["blocked"] if before is not None else [],
        "updated_sequence": event.sequence,
    }
    batch.dirty_budgets.add((event.cluster, p.budget_id))


def _budget_removed(batch: StagedBatch, event: Event, p: DisruptionBudgetRemoved) -> None:
    """A budget goes, with the evictions it blocked (the fold decides them anew)."""
    rows = batch.budgets_of(event.cluster)
    if rows.get(p.budget_id) is None:
        raise ProjectionError(f"disruption budget {p.budget_id!r} of cluster {event.cluster!r} removed but not set")
    rows[p.budget_id] = None
    batch.dirty_budgets.add((event.cluster, p.budget_id))


def _unblock(batch: StagedBatch, event: Event, gone: Callable[[dict[str, Any]], bool]) -> None:
    """Drop the blocked evictions ``gone`` picks from every budget of the event's cluster. O(B · E)."""
    for budget_id, budget in batch.budgets_of(event.cluster).items():
        if budget is None or not budget["blocked"]:
            continue
        kept = [blocked for blocked in budget["blocked"] if not gone(blocked)]
        if len(kept) != len(budget["blocked"]):
            budget["blocked"] = kept
            budget["updated_sequence"] = event.sequence
            batch.dirty_budgets.add((event.cluster, budget_id))


def _pod_released(batch: StagedBatch, event: Event, p: PodReleased) -> None:
    pod = batch.pod(event.cluster, p.pod_id)
    if pod["status"] == "running":
        batch.unbind(event, pod)
    batch.set_status(pod, "released")
    pod["reasons"] = []
    pod["ended_at"] = event.occurred_at
    pod["end_reason"] = p.reason[:64]
    pod["updated_sequence"] = event.sequence


def _pod_migrated(batch: StagedBatch, event: Event, p: PodMigrated) -> None:
    """A running pod moved (Defragment): its resources go from one node to the other; its tenant's usage
    goes on uninterrupted."""
    pod = batch.pod(event.cluster, p.pod_id)
    if pod["status"] != "running" or pod["node_id"] != p.from_node:
        raise ProjectionError(f"pod {p.pod_id!r} migrated from {p.from_node!r} where it does not run")
    t = event.occurred_at
    milli_total = pod["num_gpu"] * pod["gpu_milli"]
    for node_id, shares, sign in ((p.from_node, p.from_gpus, -1), (p.to_node, p.to_gpus, +1)):
        node = batch.node(event.cluster, node_id)
        free = node["gpu_free"]
        for share in shares:
            free[share.index] -= sign * share.milli
        node["gpu_milli_allocated"] += sign * milli_total
        node["cpu_allocated"] += sign * pod["cpu_milli"]
        node["memory_allocated"] += sign * pod["memory_mib"]
        node["pods_running"] += sign
        node["updated_sequence"] = event.sequence
        batch.shift_totals(node, t, sign * milli_total, 0, pods=sign)
    pod["node_id"] = p.to_node
    pod["gpus"] = [[share.index, share.milli] for share in p.to_gpus]
    pod["updated_sequence"] = event.sequence
    batch.realloc.add((event.cluster, p.pod_id))


def _gang_from_spec(batch: StagedBatch, event: Event, spec: GangSpec) -> dict[str, Any]:
    key = (event.cluster, spec.gang_id)
    row = batch.gangs.get(key)
    if row is None or row["status"] == "released":
        row = batch.gangs[key] = gang_row(event.cluster, spec, event.sequence)
    batch.dirty_gangs.add(key)
    return row


def _close_evicted_members(batch: StagedBatch, event: Event, gang: dict[str, Any], reason: str) -> None:
    """Members evicted with their gang stop being pods until it starts again: their rows end; so do those of
    members that waited for room while it ran (contract v4: pending rows)."""
    for member in gang["members"]:
        key = (event.cluster, member["pod_id"])
        pod = batch.pods.get(key)
        if pod is not None and pod["status"] in ("evicted", "pending"):
            batch.set_status(pod, "released")
            pod["ended_at"] = event.occurred_at
            pod["end_reason"] = reason
            pod["updated_sequence"] = event.sequence
            batch.dirty_pods.add(key)


def _gang_queued(batch: StagedBatch, event: Event, p: GangQueued) -> None:
    gang = _gang_from_spec(batch, event, p.gang)
    if p.requeued:
        _close_evicted_members(batch, event, gang, "gang requeued")
    gang["status"] = "waiting" if p.waiting_for else "pending"
    gang["waiting_for"] = list(p.waiting_for)
    gang["reasons"] = [{"code": r.code, "nodes": r.nodes, "message": r.message} for r in p.reasons]
    gang["placed"] = []
    gang["started_at"] = gang["topology_key"] = gang["domain"] = None
    gang["queued_at"] = event.occurred_at
    gang["updated_sequence"] = event.sequence


def _gang_scheduled(batch: StagedBatch, event: Event, p: GangScheduled) -> None:
    gang = _gang_from_spec(batch, event, p.gang)
    gang["status"] = "running"
    gang["waiting_for"] = []
    gang["reasons"] = []
    gang["placed"] = [{"pod_id": m.pod_id, "node_id": m.node_id} for m in p.members]
    gang["topology_key"] = p.topology_key
    gang["domain"] = p.domain
    gang["started_at"] = event.occurred_at
    gang["updated_sequence"] = event.sequence


def _gang_released(batch: StagedBatch, event: Event, p: GangReleased) -> None:
    key = (event.cluster, p.gang_id)
    gang = batch.gangs.get(key)
    if gang is None:
        raise ProjectionError(
            f"event refers to gang {p.gang_id!r} of cluster {event.cluster!r}, which is not projected"
        )
    _close_evicted_members(batch, event, gang, "gang ended")
    gang["status"] = "released"
    gang["reasons"] = []
    gang["waiting_for"] = []
    gang["ended_at"] = event.occurred_at
    gang["end_reason"] = p.reason[:64]
    gang["ended_ok"] = p.ok
    gang["updated_sequence"] = event.sequence
    batch.dirty_gangs.add(key)


def _nodes_reserved(batch: StagedBatch, event: Event, p: NodesReserved) -> None:
    batch.reservations[event.cluster] = {
        "cluster": event.cluster,
        "holder_id": p.holder_id,
        "holder_kind": p.holder_kind,
        "nodes": list(p.nodes),
        "expected_start": p.expected_start,
        "made_at": event.occurred_at,
        "message": p.message[:1000],
        "updated_sequence": event.sequence,
    }


def _reservation_released(batch: StagedBatch, event: Event, p: ReservationReleased) -> None:
    batch.reservations[event.cluster] = None


HANDLERS: dict[type, Handler] = {
    NodeAdded: _node_added,
    NodeRemoved: _node_removed,
    NodeCordoned: _node_flag("cordoned", True),
    NodeDrained: _node_flag("cordoned", True),
    NodeUncordoned: _node_uncordoned,
    NodeFailed: _node_failed,
    PodQueued: _pod_queued,
    PodScheduled: _pod_scheduled,
    PodEvicted: _pod_evicted,
    PodReleased: _pod_released,
    GangQueued: _gang_queued,
    GangScheduled: _gang_scheduled,
    GangReleased: _gang_released,
    NodesReserved: _nodes_reserved,
    ReservationReleased: _reservation_released,
    PodMigrated: _pod_migrated,
    NodeRecovered: _node_recovered,
    NodeUpdated: _node_updated,
    PodRetryScheduled: _pod_retry_scheduled,
    EvictionBlocked: _eviction_blocked,
    PodEvictionScheduled: _pod_eviction_scheduled,
    DisruptionBudgetSet: _budget_set,
    DisruptionBudgetRemoved: _budget_removed,
}

NOT_PROJECTED: dict[str, str] = {
    # event type (its name in schemas/event.avsc) -> why no table but the audit log changes
    "ClusterHalted": "the events of the work that raised were not published, so the cluster's rows stay as they "
    "were before it: what ResumeCluster rebuilds; the audit log keeps the halt",
    "ClusterResumed": "the rebuilt cluster is the one its rows already show (its state before the halting command)",
    "CommandRejected": "a refused command changes no state; the audit log answers `query command`",
    "PolicyChanged": "the placement policy is the fold's; the audit log keeps the change",
    "QuotaChanged": "quotas are read from the replica (the fold's state); the audit log keeps the change",
    "CohortChanged": "the cohort tree is read from the replica (the fold's state); the audit log keeps the change",
    "Ticked": "event time only; the usage clock moves on every event's time",
    "PodPreempted": "its PodEvicted follows and moves the pod; the audit log lists it as a disruption",
    "PodTimeLimitReached": "its PodReleased follows and ends the pod",
    "GangTimedOut": "its GangReleased follows and ends the gang",
    "DependencyFailed": "the dependant's release follows and ends it",
    "DefragmentationPlanned": "its PodMigrated events follow and move the pods",
}
"""Event types that change no read-side table but the audit log, each with the reason."""
