"""The replica's answers as JSON-ready values: pod and node rows, the GPU grid, clusters, the queue in
scheduling order, gangs, quotas and disruption budgets. Pure functions of the fold state, called under the
replica's lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from processor.core import budgets, quotas
from processor.core.explain import gang_json, gang_reasons, live_reasons, pending_reasons, request_text
from processor.core.resources import PodShape
from processor.core.state import GANG_QUEUED, GANG_RETRYING, GANG_WAITING, ClusterState
from processor.runtime.pod_index import pod_row
from schemas.commands import GPU_MILLI, STRICT_FIFO


def status_of(node: Any) -> str:
    return "failed" if node.failed else "cordoned" if node.cordoned else "ready"


def pod_rows(keys: list[tuple[str, str]], cluster_of: Callable[[str], ClusterState | None]) -> list[dict[str, Any]]:
    """Rows of pods (cluster, pod id) in the one pod-row shape (``pod_index.pod_row``), with the API's older
    ``state`` field, and pending ones with their capacity reasons now (cached per shape)."""
    reasons: dict[tuple[str, PodShape], list[dict[str, Any]]] = {}
    rows = []
    for name, pod_id in keys:
        found = cluster_of(name)
        pod = found.pods.get(pod_id) if found is not None else None
        if found is None or pod is None:
            continue
        row = pod_row(name, pod_id, pod)
        row["state"] = row["status"]  # the field's name before pod rows had one shape (kept for API clients)
        if not pod.running:
            key = (name, pod.shape)
            if key not in reasons:
                reasons[key] = live_reasons(found, pod.shape)
            row["reasons"] = reasons[key]
        rows.append(row)
    return rows


def node_row(cluster: ClusterState, node_id: str) -> dict[str, Any]:
    node = cluster.nodes[node_id]
    gpus: list[dict[str, Any]] = [
        {"index": i, "allocated_milli": GPU_MILLI - free, "free_milli": free, "pods": []}
        for i, free in enumerate(node.gpu_free)
    ]
    for pod_id in node.pods:
        pod = cluster.pods[pod_id]
        for share in pod.gpus:
            gpus[share.index]["pods"].append({"pod_id": pod_id, "tenant": pod.spec.tenant, "milli": share.milli})
    return {
        "cluster": cluster.name,
        "node_id": node_id,
        "gpu_model": node.gpu_model,
        "gpu_count": node.gpu_count,
        "labels": dict(sorted(node.labels.items())),
        "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in node.taints],
        "status": status_of(node),
        "reserved_for": node.reserved_for,
        "cpu_milli": node.cpu_milli,
        "cpu_milli_allocated": node.cpu_milli - node.cpu_free,
        "memory_mib": node.memory_mib,
        "memory_mib_allocated": node.memory_mib - node.memory_free,
        "pods": len(node.pods),
        "gpus": gpus,
    }


def node_detail(cluster: ClusterState, node_id: str) -> dict[str, Any]:
    """A node with every pod on it (tenant, priority, request, GPUs, since when)."""
    row = node_row(cluster, node_id)
    pods = []
    for pod_id in cluster.nodes[node_id].pods:
        pod = cluster.pods[pod_id]
        spec = pod.spec
        pods.append(
            {
                "pod_id": pod_id,
                "tenant": spec.tenant,
                "priority": spec.priority,
                "request": request_text(pod.shape),
                "cpu_milli": spec.cpu_milli,
                "memory_mib": spec.memory_mib,
                "gpus": [{"index": g.index, "milli": g.milli} for g in pod.gpus],
                "started_at": pod.started_at,
                "gang_id": spec.gang_id,
            }
        )
    row["pod_list"] = sorted(pods, key=lambda p: p["pod_id"])
    return row


def grid(cluster: ClusterState | None, node_ids: list[str]) -> dict[str, Any]:
    """Every node compactly, grouped by GPU model: ``[node_id, status, [allocated milli per GPU], pods,
    [label values of the group keys]]``; plus per model the GPUs free, shared and whole-allocated."""
    if cluster is None:
        return {"models": [], "label_keys": []}
    label_keys = sorted(cluster.label_keys)
    models: dict[str, dict[str, Any]] = {}
    for node_id in node_ids:
        node = cluster.nodes[node_id]
        model = node.gpu_model or ""
        entry = models.get(model)
        if entry is None:
            entry = models[model] = {
                "gpu_model": model,
                "nodes": 0,
                "gpus": 0,
                "free": 0,
                "shared": 0,
                "full": 0,
                "cordoned": 0,
                "failed": 0,
                "rows": [],
            }
        shared = _shared_gpus(cluster, node)
        allocated = [GPU_MILLI - free for free in node.gpu_free]
        for index, milli in enumerate(allocated):
            if milli == 0:
                entry["free"] += 1
            elif index in shared or milli < GPU_MILLI:
                entry["shared"] += 1
            else:
                entry["full"] += 1
        entry["nodes"] += 1
        entry["gpus"] += node.gpu_count
        status = status_of(node)
        if status != "ready":
            entry[status] += 1
        labels = [node.labels.get(key, "") for key in label_keys]
        entry["rows"].append([node_id, status, allocated, len(node.pods), labels, sorted(shared)])
    return {"models": [models[m] for m in sorted(models)], "label_keys": label_keys}


def _shared_gpus(cluster: ClusterState, node: Any) -> set[int]:
    """GPU indexes held by more than one pod, or by a share (less than a whole GPU)."""
    holders: dict[int, int] = {}
    partial: set[int] = set()
    for pod_id in node.pods:
        for share in cluster.pods[pod_id].gpus:
            holders[share.index] = holders.get(share.index, 0) + 1
            if share.milli < GPU_MILLI:
                partial.add(share.index)
    return {index for index, count in holders.items() if count > 1} | partial


def cluster_row(
    cluster: ClusterState, event_time: int | None, fragmentation_pct: float, halted: dict[str, Any] | None
) -> dict[str, Any]:
    running = sum(len(node.pods) for node in cluster.nodes.values())
    return {
        "cluster": cluster.name,
        "policy": cluster.policy,
        "queue_order": cluster.queue_order,
        "nodes": len(cluster.nodes),
        "nodes_unschedulable": cluster.unschedulable_nodes,
        "gpus": sum(node.gpu_count for node in cluster.nodes.values()),
        "gpu_milli_capacity": cluster.gpu_milli_capacity,
        "gpu_milli_allocated": cluster.gpu_milli_allocated,
        "running": running,
        "pending": len(cluster.queue),
        "gangs_pending": len(cluster.gang_queue),
        "waiting": sum(1 for pod in cluster.pods.values() if pod.waiting_for),
        "fragmentation_pct": round(fragmentation_pct, 3),
        "event_time": event_time,
        "reservation": None
        if cluster.reservation is None
        else {
            "holder_id": cluster.reservation.holder_id,
            "holder_kind": cluster.reservation.holder_kind,
            "nodes": len(cluster.reservation.nodes),
            "expected_start": cluster.reservation.expected_start,
        },
        "halted": halted,
    }


# ------------------------------------------------------------------ the queue


def scheduling_order(cluster: ClusterState) -> list[tuple[str, str]]:
    """Every queued job, (kind, id), in the order the fold retries them: priority, then (with quotas) the tenant's
    weighted dominant share, then arrival; pods and gangs together. Strict FIFO: priority, then arrival. O(n log n).
    """
    fair = cluster.quotas_on and cluster.queue_order != STRICT_FIFO
    shares: dict[str, float] = {}

    def order(key: tuple[int, int, str], tenant: str) -> tuple[Any, ...]:
        if not fair:
            return key
        share = shares.get(tenant)
        if share is None:
            share = shares[tenant] = quotas.dominant_share(cluster, tenant)
        return (key[0], share, key[1], key[2])

    entries: list[tuple[tuple[Any, ...], str, str]] = []
    for key in cluster.queue.ordered():
        pod = cluster.pods[key[2]]
        entries.append((order(key, pod.spec.tenant), "pod", key[2]))
    for key in cluster.gang_queue:
        gang = cluster.gangs[key[2]]
        entries.append((order(key, gang.spec.tenant), "gang", key[2]))
    entries.sort()
    return [(kind, job_id) for _, kind, job_id in entries]


def waiting_jobs(cluster: ClusterState) -> list[tuple[str, str]]:
    """Jobs outside the queue, waiting for dependencies or for their retry after a failure: (kind, id) in
    arrival order."""
    found = [
        (p.spec.arrival, "pod", pid)
        for pid, p in cluster.pods.items()
        if (p.waiting_for or p.retry_at is not None) and not p.queued and not p.running
    ]
    found += [
        (g.spec.arrival, "gang", gid) for gid, g in cluster.gangs.items() if g.state in (GANG_WAITING, GANG_RETRYING)
    ]
    return [(kind, job_id) for _, kind, job_id in sorted(found)]


def queue_page(
    cluster: ClusterState,
    now: int,
    order: list[tuple[str, str]],
    *,
    tenant: str | None,
    search: str | None,
    offset: int,
    limit: int,
) -> dict[str, Any]:
    """One page of ``order`` (queued jobs, then those waiting for dependencies), filtered by tenant and an id
    substring, each with its position in the whole queue, age, request, reasons now and expected start."""
    positions = {job: i + 1 for i, job in enumerate(order)}
    jobs = order + waiting_jobs(cluster)
    matched = [job for job in jobs if _matches(cluster, job, tenant, search)]
    rows = []
    cache: dict[tuple[str, PodShape], tuple[list[dict[str, Any]], bool]] = {}
    for kind, job_id in matched[offset : offset + limit]:
        rows.append(_queue_row(cluster, now, kind, job_id, positions.get((kind, job_id)), cache))
    return {"total": len(matched), "queued": len(order), "jobs": rows}


def _matches(cluster: ClusterState, job: tuple[str, str], tenant: str | None, search: str | None) -> bool:
    kind, job_id = job
    if search and search not in job_id:
        return False
    if tenant is None:
        return True
    owner = cluster.pods[job_id].spec.tenant if kind == "pod" else cluster.gangs[job_id].spec.tenant
    return owner == tenant


def _queue_row(
    cluster: ClusterState,
    now: int,
    kind: str,
    job_id: str,
    position: int | None,
    cache: dict[tuple[str, PodShape], tuple[list[dict[str, Any]], bool]],
) -> dict[str, Any]:
    held = cluster.reservation
    expected = held.expected_start if held is not None and held.holder_id == job_id else None
    if kind == "pod":
        pod = cluster.pods[job_id]
        spec = pod.spec
        if pod.waiting_for:
            reasons = [_dependency_reason(pod.waiting_for)]
        elif pod.retry_at is not None:
            reasons = [_retry_reason(pod.attempt, pod.retry_at)]
        else:
            key = (spec.tenant, pod.shape)
            if key not in cache or held is not None:  # a reservation makes reasons depend on the pod itself
                cache[key] = pending_reasons(cluster, spec, pod.shape, now)
            reasons = cache[key][0]
        request: dict[str, Any] = {
            "num_gpu": spec.num_gpu,
            "gpu_milli": spec.gpu_milli,
            "cpu_milli": spec.cpu_milli,
            "memory_mib": spec.memory_mib,
            "gpu_models": list(spec.gpu_models),
            "text": request_text(pod.shape),
        }
        state = "waiting" if pod.waiting_for or pod.retry_at is not None else "pending"
        tenant, priority, submitted_at = spec.tenant, spec.priority, spec.submitted_at
    else:
        gang = cluster.gangs[job_id]
        queued = gang.state == GANG_QUEUED
        if queued:
            reasons = gang_reasons(cluster, gang, now)
        elif gang.state == GANG_RETRYING:
            reasons = [_retry_reason(gang.attempt, gang.retry_at)]
        else:
            reasons = [_dependency_reason(gang.waiting_for)]
        members = gang.spec.members
        milli = sum(m.num_gpu * m.gpu_milli for m in members)
        request = {
            "members": len(members),
            "min_members": gang.spec.min_members,
            "gpu_milli_total": milli,
            "text": f"gang of {len(members)}, {milli / GPU_MILLI:g} GPU(s)",
        }
        state = "pending" if queued else "waiting"
        tenant, priority, submitted_at = gang.spec.tenant, gang.spec.priority, gang.spec.submitted_at
    return {
        "kind": kind,
        "id": job_id,
        "position": position,
        "state": state,
        "tenant": tenant,
        "priority": priority,
        "submitted_at": submitted_at,
        "age_ms": max(0, now - submitted_at) if now else None,
        "request": request,
        "reasons": reasons,
        "expected_start": expected,
        "holds_reservation": held is not None and held.holder_id == job_id,
    }


def _retry_reason(attempt: int, retry_at: int | None) -> dict[str, Any]:
    message = f"it failed; retry {attempt} is due at event time {retry_at} ms (backoff)"
    return {"code": "WAITING_FOR_RETRY", "nodes": 0, "message": message}


def _dependency_reason(waiting_for: tuple[str, ...]) -> dict[str, Any]:
    return {"code": "WAITING_FOR_DEPENDENCY", "nodes": 0, "message": f"starts after {', '.join(waiting_for)} end"}


def gang_rows(cluster: ClusterState, state: str | None = None) -> list[dict[str, Any]]:
    """Every gang the fold knows (queued, waiting or running), queued ones in queue order first."""
    rows = [gang_json(cluster, cluster.gangs[key[2]]) for key in cluster.gang_queue]
    rows += [gang_json(cluster, g) for _, g in sorted(cluster.gangs.items()) if g.state != GANG_QUEUED]
    return [row for row in rows if state is None or row["state"] == state]


def quota_rows(cluster: ClusterState) -> list[dict[str, Any]]:
    return [{"cluster": cluster.name, **asdict(line)} for line in quotas.quota_report(cluster)]


def cohort_rows(cluster: ClusterState) -> list[dict[str, Any]]:
    """Each cohort of the cluster's cohort tree per quota key (contract v4): its subtree quota, kept, in use."""
    return [{"cluster": cluster.name, **asdict(line)} for line in quotas.cohort_report(cluster)]


def budget_rows(cluster: ClusterState) -> list[dict[str, Any]]:
    """Each disruption budget of the cluster, by id: its filters and ``max_unavailable``, the matching pods
    unavailable now (evicted by a voluntary disruption and not running since, or being evicted), how many more
    disruptions it allows now, and the drain evictions it blocks (pod and node). O(B · U + P_b) for B budgets,
    U pods unavailable and P_b pods blocked."""
    blocked: dict[str, list[dict[str, Any]]] = {}
    for pod_id in sorted(cluster.blocked):
        pod = cluster.pods.get(pod_id)
        entry = {"pod_id": pod_id, "node_id": pod.node_id if pod is not None else None}
        blocked.setdefault(cluster.blocked[pod_id], []).append(entry)
    rows = []
    for budget_id in sorted(cluster.budgets):
        budget = cluster.budgets[budget_id]
        unavailable = budgets.unavailable(cluster, budget)
        rows.append(
            {
                "cluster": cluster.name,
                "budget_id": budget_id,
                "tenant": budget.tenant,
                "gang_id": budget.gang_id,
                "label_selector": dict(sorted((budget.label_selector or {}).items())),
                "max_unavailable": budget.max_unavailable,
                "unavailable": unavailable,
                "allowed_disruptions": max(0, budget.max_unavailable - unavailable),
                "blocked_evictions": blocked.get(budget_id, []),
            }
        )
    return rows
