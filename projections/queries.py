"""The reporting queries: what operators and tenants ask of the projection, as JSON-ready values.

Each query takes a SQLAlchemy ``Connection`` (PostgreSQL or SQLite) and
validated parameters; :func:`check_*` helpers raise :class:`QueryError` (a
``ValueError``) with a clear message for bad ones, so the CLI and the HTTP API
refuse the same inputs the same way. Every value reaches SQL as a bound
parameter, never as text.

Units: GPUs are reported as floats (milli / 1000); usage as GPU-hours.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Connection, and_, func, select

from projections import models
from projections.reasons import EXPLAIN_HINT, worded
from projections.usage import HOUR_MS
from schemas import EVENT, registry
from schemas.fragmentation import TypicalKey, derive_typical, node_fragmentation

DAY_MS = 24 * HOUR_MS
MAX_LIMIT = 1_000
MAX_BUCKETS = 10_000
MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
MILLI_MS_PER_GPU_HOUR = 1000 * HOUR_MS
_ID = re.compile(r"[^\s]{1,253}")


class QueryError(ValueError):
    """A query parameter is invalid: the message says which and why."""


class NotFound(LookupError):
    """The thing asked about does not exist in the projection."""


# ------------------------------------------------------------------ validation


def check_id(what: str, value: Any) -> str:
    """An identifier as the fold accepts them: 1-253 printable characters without spaces."""
    if not isinstance(value, str) or not _ID.fullmatch(value) or not value.isprintable():
        raise QueryError(f"{what} must be 1-253 printable characters without spaces")
    return value


def check_int(what: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value), 10)
        except ValueError:
            raise QueryError(f"{what} must be an integer between {low} and {high}") from None
    if not low <= value <= high:
        raise QueryError(f"{what} must be between {low} and {high}, got {value}")
    return value


def check_range(start: int, end: int) -> tuple[int, int]:
    start = check_int("start", start, 0, MAX_TIME_MS)
    end = check_int("end", end, 0, MAX_TIME_MS)
    if end <= start:
        raise QueryError(f"end ({end}) must be after start ({start})")
    return start, end


def check_known_cluster(conn: Connection, cluster: str) -> None:
    """NotFound unless some event of the cluster was projected (every one moves its usage clock)."""
    c = models.usage_clocks.c
    if conn.execute(select(c.cluster).where(c.cluster == cluster)).first() is None:
        raise NotFound(f"no cluster {cluster!r} in the projection")


def check_choice(what: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise QueryError(f"{what} must be one of {', '.join(choices)}")
    return str(value)


def _gpus(milli: int | None) -> float:
    return round(int(milli or 0) / 1000, 3)


def _ratio(part: int | None, whole: int | None) -> float:
    return round(int(part or 0) / int(whole), 6) if whole else 0.0


# ------------------------------------------------------------------ utilization


def utilization_now(
    conn: Connection, *, by: str = "cluster", cluster: str | None = None, limit: int = 100, offset: int = 0
) -> list[dict[str, Any]]:
    """GPUs allocated vs capacity now, by cluster, by GPU model, or by node (failed nodes have no capacity)."""
    by = check_choice("by", by, ("cluster", "model", "node"))
    n = models.nodes.c
    if by == "node":
        if cluster is None:
            raise QueryError("by=node needs a cluster")
        query: Any = (
            select(n.cluster, n.node_id, n.gpu_model, n.gpu_count, n.gpu_milli_allocated, n.cordoned, n.failed,
                   n.pods_running, n.gpu_free)
            .where(n.cluster == check_id("cluster", cluster))
            .order_by(n.node_id)
            .limit(check_int("limit", limit, 1, MAX_LIMIT))
            .offset(check_int("offset", offset, 0, 10**9))
        )  # fmt: skip
        return [
            {
                "cluster": row.cluster,
                "node_id": row.node_id,
                "gpu_model": row.gpu_model,
                "allocated_gpus": _gpus(row.gpu_milli_allocated),
                "capacity_gpus": 0.0 if row.failed else float(row.gpu_count),
                "utilization": 0.0 if row.failed else _ratio(row.gpu_milli_allocated, row.gpu_count * 1000),
                "gpu_free_milli": list(row.gpu_free),
                "cordoned": bool(row.cordoned),
                "failed": bool(row.failed),
                "pods_running": row.pods_running,
            }
            for row in conn.execute(query)
        ]
    # Cluster and model views read the totals the projector keeps per (cluster, model): a few rows.
    g = models.gpu_totals.c
    keys = [g.cluster] if by == "cluster" else [g.cluster, g.gpu_model]
    query = select(
        *keys,
        func.sum(g.nodes).label("nodes"),
        func.sum(g.allocated_milli).label("allocated"),
        func.sum(g.capacity_milli).label("capacity"),
        func.sum(g.pods_running).label("pods_running"),
    ).group_by(*keys)
    if by == "model":
        query = query.where(g.gpu_model != "")
    if cluster is not None:
        query = query.where(g.cluster == check_id("cluster", cluster))
    out = []
    for row in conn.execute(query.order_by(*keys)):
        item: dict[str, Any] = {"cluster": row.cluster}
        if by == "model":
            item["gpu_model"] = row.gpu_model
        item.update(
            nodes=int(row.nodes or 0),
            allocated_gpus=_gpus(row.allocated),
            capacity_gpus=_gpus(row.capacity),
            utilization=_ratio(row.allocated, row.capacity),
            pods_running=int(row.pods_running or 0),
        )
        out.append(item)
    return out


def utilization_history(
    conn: Connection, *, cluster: str, start: int, end: int, step_ms: int = 60_000, gpu_model: str | None = None
) -> dict[str, Any]:
    """Allocated vs capacity GPUs at the end of each step in [start, end), summed over models (or one model)."""
    cluster = check_id("cluster", cluster)
    start, end = check_range(start, end)
    step_ms = check_int("step_ms", step_ms, 60_000, 366 * DAY_MS)
    buckets = -(-(end - start) // step_ms)
    if buckets > MAX_BUCKETS:
        raise QueryError(f"{buckets} steps asked; at most {MAX_BUCKETS} (use a larger step_ms or a shorter range)")
    check_known_cluster(conn, cluster)
    u = models.utilization.c
    where = [u.cluster == cluster]
    if gpu_model is not None:
        where.append(u.gpu_model == check_id("gpu_model", gpu_model))
    # The last sample before start of each model carries its value into the range.
    before = (
        select(u.gpu_model, func.max(u.minute).label("minute"))
        .where(*where, u.minute < start)
        .group_by(u.gpu_model)
        .subquery()
    )
    carried = select(u.gpu_model, u.minute, u.allocated_milli, u.capacity_milli).join(
        before, and_(u.gpu_model == before.c.gpu_model, u.minute == before.c.minute)
    ).where(*where)  # fmt: skip
    inside = (
        select(u.gpu_model, u.minute, u.allocated_milli, u.capacity_milli)
        .where(*where, u.minute >= start, u.minute < end)
        .order_by(u.minute, u.gpu_model)
    )
    current: dict[str, tuple[int, int]] = {}
    for row in conn.execute(carried):
        current[row.gpu_model] = (row.allocated_milli, row.capacity_milli)
    samples = list(conn.execute(inside))
    points = []
    index = 0
    for b in range(buckets):
        bucket_end = min(end, start + (b + 1) * step_ms)
        while index < len(samples) and samples[index].minute < bucket_end:
            row = samples[index]
            current[row.gpu_model] = (row.allocated_milli, row.capacity_milli)
            index += 1
        allocated = sum(a for a, _ in current.values())
        capacity = sum(c for _, c in current.values())
        points.append(
            {"t": start + b * step_ms, "allocated_gpus": _gpus(allocated), "capacity_gpus": _gpus(capacity),
             "utilization": _ratio(allocated, capacity)}
        )  # fmt: skip
    return {"cluster": cluster, "gpu_model": gpu_model, "step_ms": step_ms, "points": points}


# ------------------------------------------------------------------ fragmentation


def fragmentation_now(conn: Connection, *, cluster: str) -> dict[str, Any]:
    """FGD's fragmentation (``schemas.fragmentation``) of the cluster's schedulable GPU nodes.

    The figure every surface shows (the live replica computes the same from the fold's state): FGD's
    expected fragment of the idle GPU of the schedulable nodes, for the typical pods derived from the
    pods present now (pending, waiting for dependencies, or running).
    """
    cluster = check_id("cluster", cluster)
    check_known_cluster(conn, cluster)
    p = models.pods.c
    counts: dict[TypicalKey, int] = {}
    shapes = conn.execute(
        select(p.num_gpu, p.gpu_milli, p.cpu_milli, p.gpu_models, func.count())
        .where(p.cluster == cluster, p.status.in_(("pending", "running")))
        .group_by(p.num_gpu, p.gpu_milli, p.cpu_milli, p.gpu_models)
    )
    for num_gpu, gpu_milli, cpu_milli, gpu_models, count in shapes:
        key = TypicalKey(num_gpu, gpu_milli, cpu_milli, tuple(sorted(set(gpu_models or ()))))
        counts[key] = counts.get(key, 0) + count
    typical = derive_typical(counts)
    n = models.nodes.c
    rows = conn.execute(
        select(n.gpu_free, n.cpu_milli, n.cpu_allocated, n.gpu_model).where(
            n.cluster == cluster, n.gpu_count > 0, n.failed.is_(False), n.cordoned.is_(False)
        )
    )
    fragmented = 0.0
    idle = 0
    nodes = 0
    for row in rows:
        free = tuple(row.gpu_free)
        nodes += 1
        idle += sum(free)
        fragmented += node_fragmentation(free, row.cpu_milli - row.cpu_allocated, row.gpu_model, typical)
    return {
        "cluster": cluster,
        "nodes": nodes,
        "idle_gpus": _gpus(idle),
        "fragmented_gpus": round(fragmented / 1000, 3),
        "fragmentation_ratio": round(fragmented / idle, 6) if idle else 0.0,
        "fragmentation_pct": round(100.0 * fragmented / idle, 3) if idle else 0.0,
        "typical_pods": [
            {"num_gpu": t.key.num_gpu, "gpu_milli": t.key.gpu_milli, "cpu_milli": t.key.cpu_milli,
             "gpu_models": list(t.key.gpu_models), "weight": round(t.weight, 6)}
            for t in typical
        ],
    }  # fmt: skip


# ------------------------------------------------------------------ pods and commands


def pending(conn: Connection, *, cluster: str, limit: int = 100, offset: int = 0) -> dict[str, Any]:
    """Pending pods in queue order (priority, then arrival), with their queue position and the reasons
    they were queued with (not recomputed: the live replica's explain says why a pod waits now)."""
    cluster = check_id("cluster", cluster)
    limit = check_int("limit", limit, 1, MAX_LIMIT)
    offset = check_int("offset", offset, 0, 10**9)
    check_known_cluster(conn, cluster)
    p = models.pods.c
    is_pending = and_(p.cluster == cluster, p.status == "pending")
    stats = models.cluster_stats.c
    total = conn.execute(select(stats.pending).where(stats.cluster == cluster)).scalar() or 0
    rows = conn.execute(
        select(p.pod_id, p.tenant, p.priority, p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib, p.gpu_models,
               p.submitted_at, p.queued_at, p.reasons)
        .where(is_pending)
        .order_by(p.priority.desc(), p.arrival, p.pod_id)
        .limit(limit)
        .offset(offset)
    )  # fmt: skip
    pods = [
        {
            "position": offset + i + 1,
            "pod_id": row.pod_id,
            "tenant": row.tenant,
            "priority": row.priority,
            "num_gpu": row.num_gpu,
            "gpu_milli": row.gpu_milli,
            "cpu_milli": row.cpu_milli,
            "memory_mib": row.memory_mib,
            "gpu_models": list(row.gpu_models),
            "submitted_at": row.submitted_at,
            "queued_at": row.queued_at,
            "reasons_when_queued": worded(list(row.reasons)),
        }
        for i, row in enumerate(rows.all())
    ]
    return {
        "cluster": cluster,
        "total": total,
        "offset": offset,
        "reasons_note": EXPLAIN_HINT,
        "pods": pods,
        "gangs": _gangs(conn, cluster, ("pending", "waiting"), MAX_LIMIT, 0),
        "reservation": reservation(conn, cluster),
    }


GANG_STATES = ("waiting", "pending", "running", "released")


def _gangs(conn: Connection, cluster: str, states: tuple[str, ...], limit: int, offset: int) -> list[dict[str, Any]]:
    g = models.gangs.c
    rows = conn.execute(
        select(models.gangs)
        .where(g.cluster == cluster, g.status.in_(states))
        .order_by(g.priority.desc(), g.arrival, g.gang_id)
        .limit(limit)
        .offset(offset)
    )
    out = []
    for row in rows.all():
        gang = dict(row._mapping)
        gang.pop("cluster")
        gang.pop("updated_sequence")
        gang["reasons_when_queued"] = worded(list(gang.pop("reasons")))
        out.append(gang)
    return out


def gangs(
    conn: Connection, *, cluster: str, state: str | None = None, limit: int = 100, offset: int = 0
) -> dict[str, Any]:
    """Gangs with their members and state (waiting for dependencies, pending, running or released), queue order."""
    cluster = check_id("cluster", cluster)
    limit = check_int("limit", limit, 1, MAX_LIMIT)
    offset = check_int("offset", offset, 0, 10**9)
    if state is not None and state not in GANG_STATES:
        raise QueryError(f"state must be one of {', '.join(GANG_STATES)}, got {state[:64]!r}")
    check_known_cluster(conn, cluster)
    states = (state,) if state is not None else GANG_STATES
    return {"cluster": cluster, "offset": offset, "gangs": _gangs(conn, cluster, states, limit, offset)}


DISRUPTIONS = models.DISRUPTION_TYPES  # the partial index ix_audit_events_disruptions covers these


def disruptions(
    conn: Connection, *, cluster: str, pod_id: str | None = None, limit: int = 100, offset: int = 0
) -> dict[str, Any]:
    """Preemptions and migrations of a cluster (newest first), each with its cause: who preempted the pod
    and why (priority or reclaim), what a Defragment planned and moved, in the fold's words."""
    cluster = check_id("cluster", cluster)
    limit = check_int("limit", limit, 1, MAX_LIMIT)
    offset = check_int("offset", offset, 0, 10**9)
    check_known_cluster(conn, cluster)
    a = models.audit_events.c
    query = select(models.audit_events).where(a.cluster == cluster, a.type.in_(DISRUPTIONS))
    if pod_id is not None:
        query = query.where(a.pod_id == check_id("pod_id", pod_id))
    rows = conn.execute(query.order_by(a.occurred_at.desc(), a.sequence.desc()).limit(limit).offset(offset))
    return {"cluster": cluster, "offset": offset, "events": [_event(row) for row in rows]}


def reservation(conn: Connection, cluster: str) -> dict[str, Any] | None:
    """The cluster's current reservation (nodes held for the head of its queue), or None."""
    r = models.reservations
    row = conn.execute(select(r).where(r.c.cluster == cluster)).first()
    if row is None:
        return None
    held = dict(row._mapping)
    held.pop("cluster")
    held.pop("updated_sequence")
    return held


def reservations(conn: Connection, *, cluster: str | None = None) -> dict[str, Any]:
    """Current reservations: per cluster, the holder, its nodes and the expected start (None: unknown)."""
    r = models.reservations
    query = select(r).order_by(r.c.cluster)
    if cluster is not None:
        cluster = check_id("cluster", cluster)
        check_known_cluster(conn, cluster)
        query = query.where(r.c.cluster == cluster)
    out = []
    for row in conn.execute(query):
        held = dict(row._mapping)
        held.pop("updated_sequence")
        out.append(held)
    return {"reservations": out}


def disruption_budgets(conn: Connection, *, cluster: str | None = None) -> dict[str, Any]:
    """The disruption budgets set now, by cluster and id: filters, ``max_unavailable``, when set, and the drain
    evictions each blocks now (those whose pod still runs on the node named: one evicted, released or moved
    since is blocked no more). How many pods each counts unavailable is the live replica's to say (it needs the
    pods' selectors). O(B + E) for B budgets and E blocked evictions."""
    b = models.disruption_budgets
    query = select(b).order_by(b.c.cluster, b.c.budget_id)
    if cluster is not None:
        cluster = check_id("cluster", cluster)
        check_known_cluster(conn, cluster)
        query = query.where(b.c.cluster == cluster)
    rows = [dict(row._mapping) for row in conn.execute(query)]
    running: set[tuple[str, str, str]] = set()
    for name in sorted({row["cluster"] for row in rows if row["blocked"]}):
        ids = sorted({blocked["pod_id"] for row in rows if row["cluster"] == name for blocked in row["blocked"]})
        p = models.pods
        found = conn.execute(
            select(p.c.pod_id, p.c.node_id).where(p.c.cluster == name, p.c.pod_id.in_(ids), p.c.status == "running")
        )
        running.update((name, pod_id, node_id) for pod_id, node_id in found)
    out = []
    for row in rows:
        row.pop("updated_sequence")
        blocked = row.pop("blocked")
        row["blocked_evictions"] = [e for e in blocked if (row["cluster"], e["pod_id"], e["node_id"]) in running]
        out.append(row)
    return {"budgets": out}


def _payload(frame: bytes) -> dict[str, Any]:
    """The payload of an audited event frame, as JSON-ready values."""
    return dict(registry().codec(EVENT).decode(bytes(frame))["payload"][1])


def _event(row: Any) -> dict[str, Any]:
    return {
        "partition": row.partition,
        "sequence": row.sequence,
        "type": row.type,
        "occurred_at": row.occurred_at,
        "command_id": row.command_id,
        "command_offset": row.command_offset,
        "payload": _payload(row.frame),
    }


def pod_history(conn: Connection, *, cluster: str, pod_id: str) -> dict[str, Any]:
    """A pod's current row and every event about it, each with the command that caused it."""
    cluster = check_id("cluster", cluster)
    pod_id = check_id("pod_id", pod_id)
    p = models.pods
    row = conn.execute(select(p).where(p.c.cluster == cluster, p.c.pod_id == pod_id)).first()
    a = models.audit_events.c
    events = conn.execute(
        select(models.audit_events).where(a.cluster == cluster, a.pod_id == pod_id).order_by(a.partition, a.sequence)
    ).all()
    if row is None and not events:
        raise NotFound(f"pod {pod_id!r} is not known in cluster {cluster!r}")
    return {
        "cluster": cluster,
        "pod_id": pod_id,
        "current": None if row is None else {k: v for k, v in row._mapping.items() if k not in ("cluster", "pod_id")},
        "events": [_event(e) for e in events],
    }


def command_outcome(conn: Connection, *, command_id: str) -> dict[str, Any]:
    """What a command did: rejected (code and message) or accepted (its events)."""
    command_id = check_id("command_id", command_id)
    a = models.audit_events.c
    events = conn.execute(
        select(models.audit_events).where(a.command_id == command_id).order_by(a.partition, a.sequence)
    ).all()
    if not events:
        raise NotFound(f"command {command_id!r} has no projected outcome (unknown, or not processed yet)")
    first = events[0]
    outcome: dict[str, Any] = {
        "command_id": command_id,
        "cluster": first.cluster,
        "command_offset": first.command_offset,
    }
    if first.type == "CommandRejected":
        payload = _payload(first.frame)
        outcome.update(outcome="rejected", code=payload["code"], message=payload["message"])
    else:
        outcome["outcome"] = "accepted"
    outcome["events"] = [_event(e) for e in events]
    return outcome


# ------------------------------------------------------------------ usage


def tenant_usage(
    conn: Connection,
    *,
    start: int,
    end: int,
    granularity: str = "hour",
    tenant: str | None = None,
    cluster: str | None = None,
) -> list[dict[str, Any]]:
    """GPU-hours per tenant per hour or day of event time in [start, end), adjustments included.

    ``sealed`` says whether every hour of the period is final; ``adjustment_gpu_hours``
    is the part that arrived after its hour was sealed.
    """
    start, end = check_range(start, end)
    granularity = check_choice("granularity", granularity, ("hour", "day"))
    size = HOUR_MS if granularity == "hour" else DAY_MS
    if (end - start) // size > 100_000:
        raise QueryError("range too long for this granularity (more than 100000 periods)")
    filters_u = []
    filters_a = []
    u, a = models.tenant_usage.c, models.usage_adjustments.c
    if tenant is not None:
        filters_u.append(u.tenant == check_id("tenant", tenant))
        filters_a.append(a.tenant == tenant)
    if cluster is not None:
        filters_u.append(u.cluster == check_id("cluster", cluster))
        filters_a.append(a.cluster == cluster)
    periods: dict[tuple[str, int], dict[str, Any]] = {}

    def period(tenant_: str, hour: int) -> dict[str, Any]:
        key = (tenant_, hour - hour % size)
        item = periods.get(key)
        if item is None:
            item = periods[key] = {"tenant": tenant_, "period_start": key[1], "milli_ms": 0, "adjust": 0,
                                   "sealed": True}  # fmt: skip
        return item

    rows = conn.execute(
        select(u.tenant, u.hour, func.sum(u.gpu_milli_ms), func.min(u.status))
        .where(u.hour >= start - start % size, u.hour < end, *filters_u)
        .group_by(u.tenant, u.hour)
    )
    for tenant_, hour, milli_ms, status in rows:
        item = period(tenant_, hour)
        item["milli_ms"] += int(milli_ms)
        item["sealed"] = item["sealed"] and status == "sealed"
    adjustments = conn.execute(
        select(a.tenant, a.hour, func.sum(a.gpu_milli_ms))
        .where(a.hour >= start - start % size, a.hour < end, *filters_a)
        .group_by(a.tenant, a.hour)
    )
    for tenant_, hour, milli_ms in adjustments:
        item = period(tenant_, hour)
        item["milli_ms"] += int(milli_ms)
        item["adjust"] += int(milli_ms)
    for table, adjust in ((models.tenant_usage_spans, False), (models.usage_adjustment_spans, True)):
        for tenant_, first, hours, milli_ms in _spans(conn, table, start - start % size, end, tenant, cluster):
            # Every hour of the span inside the asked range, period by period (at most 100,000 periods).
            hour = max(first, start - start % size)
            stop = min(first + hours * HOUR_MS, end + (-end) % HOUR_MS)
            while hour < stop:
                item = period(tenant_, hour)
                inside = min(stop, hour - hour % size + size)
                amount = milli_ms * ((inside - hour) // HOUR_MS)
                item["milli_ms"] += amount
                if adjust:
                    item["adjust"] += amount
                hour = inside
    return [
        {
            "tenant": item["tenant"],
            "period_start": item["period_start"],
            "granularity": granularity,
            "gpu_hours": round(item["milli_ms"] / MILLI_MS_PER_GPU_HOUR, 6),
            "adjustment_gpu_hours": round(item["adjust"] / MILLI_MS_PER_GPU_HOUR, 6),
            "sealed": item["sealed"],
        }
        for _, item in sorted(periods.items())
    ]


def top_consumers(
    conn: Connection, *, start: int, end: int, limit: int = 10, cluster: str | None = None
) -> list[dict[str, Any]]:
    """Tenants by GPU-hours used in [start, end) of event time (whole hours), largest first."""
    start, end = check_range(start, end)
    limit = check_int("limit", limit, 1, MAX_LIMIT)
    totals: dict[str, int] = {}
    for table in (models.tenant_usage, models.usage_adjustments):
        c = table.c
        query = select(c.tenant, func.sum(c.gpu_milli_ms)).where(c.hour >= start, c.hour < end).group_by(c.tenant)
        if cluster is not None:
            query = query.where(c.cluster == check_id("cluster", cluster))
        for tenant_, milli_ms in conn.execute(query):
            totals[tenant_] = totals.get(tenant_, 0) + int(milli_ms)
    first_hour, end_hour = start + (-start) % HOUR_MS, end + (-end) % HOUR_MS  # whole hours in [start, end)
    for table in (models.tenant_usage_spans, models.usage_adjustment_spans):
        for tenant_, first, hours, milli_ms in _spans(conn, table, first_hour, end_hour, None, cluster):
            inside = (min(first + hours * HOUR_MS, end_hour) - max(first, first_hour)) // HOUR_MS
            if inside > 0:
                totals[tenant_] = totals.get(tenant_, 0) + milli_ms * inside
    ranked = sorted(totals.items(), key=lambda item: (-item[1], item[0]))[:limit]
    return [
        {"rank": i + 1, "tenant": t, "gpu_hours": round(v / MILLI_MS_PER_GPU_HOUR, 6)}
        for i, (t, v) in enumerate(ranked)
    ]


def _spans(
    conn: Connection, table: Any, start: int, end: int, tenant: str | None, cluster: str | None
) -> list[tuple[str, int, int, int]]:
    """(tenant, first hour, hours, milli-ms per hour) of the span rows overlapping [start, end)."""
    c = table.c
    query = select(c.tenant, c.start_hour, c.hours, c.gpu_milli_ms_per_hour).where(
        c.start_hour < end, c.start_hour + c.hours * HOUR_MS > start
    )
    if tenant is not None:
        query = query.where(c.tenant == tenant)
    if cluster is not None:
        query = query.where(c.cluster == cluster)
    return [(t, int(h), int(n), int(m)) for t, h, n, m in conn.execute(query.order_by(c.tenant, c.start_hour))]


def status(conn: Connection) -> dict[str, Any]:
    """Where the projection stands: per source partition, and the clusters' watermarks."""
    o = models.projection_offsets.c
    clocks = models.usage_clocks.c
    return {
        "offsets": [
            {"source": r.source, "partition": r.partition, "next_offset": r.next_offset,
             "next_sequence": r.next_sequence}
            for r in conn.execute(select(models.projection_offsets).order_by(o.source, o.partition))
        ],
        "clusters": [
            {"cluster": r.cluster, "watermark": r.watermark, "sealed_until": r.sealed_until}
            for r in conn.execute(select(models.usage_clocks).order_by(clocks.cluster))
        ],
    }  # fmt: skip


__all__ = [
    "NotFound",
    "QueryError",
    "command_outcome",
    "disruptions",
    "fragmentation_now",
    "gangs",
    "pending",
    "pod_history",
    "reservation",
    "reservations",
    "status",
    "tenant_usage",
    "top_consumers",
    "utilization_history",
    "utilization_now",
]
