"""Batch staging: the rows one batch of events touches, loaded once, changed in memory, written back in bulk.

:class:`StagedBatch` reads the rows the batch needs (one query per table, or taken over from the batch
before it in the pipeline), lets the event handlers (``projections.handlers``) change them as plain dicts,
and plans the statements that write them back (:meth:`StagedBatch.plan`): the cost per event is a few
dictionary updates, not a round trip. The SQL helpers below it are the only statements the projector runs
on the read-side tables besides the offsets (``projections.offsets``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from sqlalchemy import Connection, and_, delete, select

from projections import models
from projections.dialect import append_rows, bulk_upsert_replace, target_name
from projections.envelope import Envelope, ProjectionError
from projections.rows import pod_row
from projections.usage import UsageLedger, Write
from schemas.events import (
    DisruptionBudgetRemoved,
    DisruptionBudgetSet,
    Event,
    EvictionBlocked,
    GangQueued,
    GangReleased,
    GangScheduled,
    NodesReserved,
    NodeUncordoned,
    NodeUpdated,
    PodEvictionScheduled,
    PodMigrated,
    PodQueued,
    PodRetryScheduled,
    PodScheduled,
    PodSpec,
    ReservationReleased,
)
from schemas.fastcodec import encode_event
from schemas.limits import MAX_ISSUED_AT

MINUTE_MS = 60_000
_CHUNK = 500  # keys per IN (...) list on SQLite
_GANG_EVENTS = (GangQueued, GangScheduled, GangReleased)
_BUDGET_EVENTS = frozenset(
    (DisruptionBudgetSet, DisruptionBudgetRemoved, EvictionBlocked, PodEvictionScheduled, NodeUncordoned, NodeUpdated)
)
"""Events that change a cluster's disruption budget rows (their blocked evictions): the batch loads them."""

Handler = Callable[["StagedBatch", Event, Any], None]
"""Applies one event's payload to the staged rows (``projections.handlers``)."""


def _subject(payload: Any) -> tuple[str | None, str | None]:
    """(pod_id, node_id) an event is about, for the audit log's indexes."""
    pod = getattr(payload, "pod", None)
    if pod is not None:
        return pod.pod_id, getattr(payload, "node_id", None)
    return getattr(payload, "pod_id", None), getattr(payload, "node_id", None)


class StagedBatch:
    """The rows one batch touches, loaded once, changed in memory, written back at the end.

    ``handlers`` maps an event's payload type to what it changes (payload types it does not name change
    nothing but the audit log and the usage clock).

    ``conn`` is only read from (in :meth:`load`); applying events touches no database,
    and :meth:`plan` turns the changes into statements for the batch's transaction. With
    ``snapshot`` the planned rows are copies, so the next batch may take this one's rows
    over (:meth:`load` with ``previous``) and change them while these are being written.
    """

    def __init__(
        self, conn: Connection, lateness_ms: int, handlers: Mapping[type, Handler], *, snapshot: bool = False
    ) -> None:
        self.conn = conn
        self.handlers = handlers
        self.snapshot = snapshot
        self.clusters: set[str] = set()
        self.nodes: dict[tuple[str, str], dict[str, Any] | None] = {}
        self.nodes_in_db: set[tuple[str, str]] = set()
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods_in_db: set[tuple[str, str]] = set()
        self.dirty_nodes: set[tuple[str, str]] = set()
        self.dirty_pods: set[tuple[str, str]] = set()
        self.gangs: dict[tuple[str, str], dict[str, Any]] = {}
        self.dirty_gangs: set[tuple[str, str]] = set()
        self.reservations: dict[str, dict[str, Any] | None] = {}  # cluster -> current reservation row
        self.reservations_in_db: set[str] = set()
        self.budgets: dict[str, dict[str, dict[str, Any] | None]] = {}  # cluster -> budget id -> row (None: removed)
        self.budgets_in_db: set[tuple[str, str]] = set()
        self.dirty_budgets: set[tuple[str, str]] = set()
        self.realloc: set[tuple[str, str]] = set()  # pods whose allocation rows change
        # (cluster, model) -> [allocated, capacity, nodes, pods running]; cluster -> [pending, running]
        self.totals: dict[tuple[str, str], list[int]] = {}
        self.dirty_totals: set[tuple[str, str]] = set()
        self.stats: dict[str, list[int]] = {}
        self.samples: dict[tuple[str, str, int], tuple[int, int]] = {}
        self.audit: list[tuple[Any, ...]] = []
        self.usage = UsageLedger(lateness_ms=lateness_ms)

    # -------------------------------------------------------------- loading

    def load(self, events: list[Envelope], previous: StagedBatch | None = None) -> None:
        """Load the rows the events need: from ``previous`` (the batch before, as it will have
        written them) where it holds them, from the database otherwise."""
        node_keys: set[tuple[str, str]] = set()
        pod_keys: set[tuple[str, str]] = set()
        gang_keys: set[tuple[str, str]] = set()
        reserved: set[str] = set()
        budgeted: set[str] = set()
        placed: set[tuple[str, str]] = set()  # first placements
        retried: set[tuple[str, str]] = set()  # pods that stop for a retry: their node is not in the event
        clusters = self.clusters
        for envelope in events:
            event: Event = envelope.event  # type: ignore[assignment]
            cluster = event.cluster
            clusters.add(cluster)
            payload = event.payload
            pod_id, node_id = _subject(payload)
            if node_id is not None:
                node_keys.add((cluster, node_id))
            # A first placement of a submission creates its row unless an unreleased one is
            # stored: an evicted pod placed again keeps its row (pod_from_spec). Such rows are
            # few, so first placements look them up by status (below), not one by one. A placement
            # later than the submission, not from the queue (a retry after its backoff), is looked
            # up by its key: its row is pending.
            kind = type(payload)
            if pod_id is not None:
                if (
                    kind is PodScheduled
                    and not payload.from_queue  # type: ignore[union-attr]
                    and event.occurred_at == payload.pod.submitted_at  # type: ignore[union-attr]
                ) or (
                    kind is PodQueued and not payload.requeued  # type: ignore[union-attr]
                ):
                    placed.add((cluster, pod_id))
                else:
                    pod_keys.add((cluster, pod_id))
            if kind in _GANG_EVENTS:
                gang_keys.add((cluster, str(payload.gang_id)))  # type: ignore[union-attr]
                if kind is GangQueued and payload.requeued:  # type: ignore[union-attr]
                    pod_keys.update((cluster, m.pod_id) for m in payload.gang.members)  # type: ignore[union-attr]
            elif kind is PodRetryScheduled:
                retried.add((cluster, payload.pod_id))  # type: ignore[union-attr]
                if payload.gang_id is not None:  # type: ignore[union-attr]  # a member takes its gang
                    gang_keys.add((cluster, payload.gang_id))  # type: ignore[union-attr]
            elif kind is NodesReserved or kind is ReservationReleased:
                reserved.add(cluster)
            if kind in _BUDGET_EVENTS:
                budgeted.add(cluster)
            elif kind is PodMigrated:  # both nodes change (its subject names neither)
                node_keys.add((cluster, payload.from_node))  # type: ignore[union-attr]
                node_keys.add((cluster, payload.to_node))  # type: ignore[union-attr]
        conn = self.conn
        # What the previous batch holds is taken over: a row it loaded or wrote (a node it
        # removed is None, as absent as a deleted row), and per cluster its totals, counts,
        # rates and clocks. Rows it never held are unchanged by it, so the database has them.
        carried = previous.clusters & clusters if previous is not None else set()
        if previous is not None:
            gang_keys = _take(previous.gangs, gang_keys, self.gangs)
            for key in node_keys & previous.nodes.keys():
                row = self.nodes[key] = previous.nodes[key]
                if row is not None:
                    self.nodes_in_db.add(key)
            node_keys -= previous.nodes.keys()
            for cluster in reserved & previous.reservations.keys():
                row = self.reservations[cluster] = previous.reservations[cluster]
                if row is not None:
                    self.reservations_in_db.add(cluster)
            reserved -= previous.reservations.keys()
            for cluster in budgeted & previous.budgets.keys():
                rows = self.budgets[cluster] = {b: row for b, row in previous.budgets[cluster].items() if row}
                self.budgets_in_db.update((cluster, budget_id) for budget_id in rows)
            budgeted -= previous.budgets.keys()
            self.totals.update((key, total) for key, total in previous.totals.items() if key[0] in carried)
            self.stats.update((cluster, counts) for cluster, counts in previous.stats.items() if cluster in carried)
            self.usage.carry(previous.usage, carried)
        for key, row in _fetch(conn, models.gangs, "gang_id", gang_keys):
            self.gangs[key] = row
        for key, row in self.gangs.items():
            if row["status"] != "released":  # a gang that ends may leave evicted member rows to close
                pod_keys.update((key[0], member["pod_id"]) for member in row["members"])
        if previous is not None:  # every pod row the previous batch holds, it read or wrote
            pod_keys = _take(previous.pods, pod_keys, self.pods)
            placed = _take(previous.pods, placed, self.pods)
            self.pods_in_db.update(self.pods)
        if placed:
            pod_keys |= placed & _evicted(conn, {cluster for cluster, _ in placed})
        if budgeted:
            table = models.disruption_budgets
            for cluster in budgeted:
                self.budgets[cluster] = {}
            for found in conn.execute(select(table).where(table.c.cluster.in_(sorted(budgeted)))):
                self.budgets[found.cluster][found.budget_id] = dict(found._mapping)
                self.budgets_in_db.add((found.cluster, found.budget_id))
        if reserved:
            table = models.reservations
            for found in conn.execute(select(table).where(table.c.cluster.in_(sorted(reserved)))):
                self.reservations[found.cluster] = dict(found._mapping)
                self.reservations_in_db.add(found.cluster)
        for key, row in _fetch(conn, models.nodes, "node_id", node_keys):
            self.nodes[key] = row
            self.nodes_in_db.add(key)
        for key, row in _fetch(conn, models.pods, "pod_id", pod_keys):
            self.pods[key] = row
            self.pods_in_db.add(key)
        if retried:
            self._load_nodes_of(retried, previous)
        names = sorted(clusters - carried)
        if names:
            totals = models.gpu_totals
            for total in conn.execute(select(totals).where(totals.c.cluster.in_(names))):
                self.totals[(total.cluster, total.gpu_model)] = [
                    total.allocated_milli,
                    total.capacity_milli,
                    total.nodes,
                    total.pods_running,
                ]
            stats = models.cluster_stats
            for stat in conn.execute(select(stats).where(stats.c.cluster.in_(names))):
                self.stats[stat.cluster] = [stat.pending, stat.running]
        self.usage.load(conn, clusters - carried)

    def _load_nodes_of(self, keys: set[tuple[str, str]], previous: StagedBatch | None) -> None:
        """The nodes the given pods run on as the batch begins (a PodRetryScheduled names no node; a node the pod
        moves to within the batch is named by the event that moves it, so it is loaded already)."""
        wanted = {(key[0], row["node_id"]) for key in keys if (row := self.pods.get(key)) and row["node_id"]}
        wanted -= self.nodes.keys()
        if previous is not None:
            for key in wanted & previous.nodes.keys():
                row = self.nodes[key] = previous.nodes[key]
                if row is not None:
                    self.nodes_in_db.add(key)
            wanted -= previous.nodes.keys()
        for key, row in _fetch(self.conn, models.nodes, "node_id", wanted):
            self.nodes[key] = row
            self.nodes_in_db.add(key)

    # -------------------------------------------------------------- applying

    def apply(self, envelope: Envelope) -> None:
        event: Event = envelope.event  # type: ignore[assignment]
        payload = event.payload
        kind = type(payload)
        pod_id, node_id = _subject(payload)
        frame = envelope.frame if envelope.frame is not None else encode_event(event)
        self.audit.append(  # in the column order of models.audit_events
            (
                event.partition,
                event.sequence,
                event.cluster,
                event.command_id,
                event.command_offset,
                event.occurred_at,
                kind.__name__,
                pod_id,
                node_id,
                frame,
            )
        )
        clock = self.usage.clocks.get(event.cluster)
        # A time past the contract's range (a rejection of a far-future command, or an old log's event) never
        # moves the usage clock: it would seal every hour to 2099 and make all later usage late.
        if clock is None or clock.watermark < event.occurred_at <= MAX_ISSUED_AT:  # else nothing to observe
            self.usage.observe(event.cluster, event.occurred_at, (event.partition, event.sequence))
        handler = self.handlers.get(kind)
        if handler is not None:
            handler(self, event, payload)

    def node(self, cluster: str, node_id: str) -> dict[str, Any]:
        row = self.nodes.get((cluster, node_id))
        if row is None:
            raise ProjectionError(f"event refers to node {node_id!r} of cluster {cluster!r}, which is not projected")
        self.dirty_nodes.add((cluster, node_id))
        return row

    def budgets_of(self, cluster: str) -> dict[str, dict[str, Any] | None]:
        """The cluster's disruption budget rows by id (None: removed in this batch); the caller marks what it
        changes in ``dirty_budgets``."""
        rows = self.budgets.get(cluster)
        if rows is None:
            raise ProjectionError(f"the disruption budgets of cluster {cluster!r} were not loaded")
        return rows

    def pod(self, cluster: str, pod_id: str) -> dict[str, Any]:
        row = self.pods.get((cluster, pod_id))
        if row is None:
            raise ProjectionError(f"event refers to pod {pod_id!r} of cluster {cluster!r}, which is not projected")
        self.dirty_pods.add((cluster, pod_id))
        return row

    def pod_from_spec(self, event: Event, spec: PodSpec) -> dict[str, Any]:
        key = (event.cluster, spec.pod_id)
        row = self.pods.get(key)
        if row is None or row["status"] == "released":
            row = self.pods[key] = pod_row(event.cluster, spec, event.sequence)
        self.dirty_pods.add(key)
        return row

    def shift_totals(
        self, node: dict[str, Any], t: int, allocated: int, capacity: int, nodes: int = 0, pods: int = 0
    ) -> None:
        key = (node["cluster"], node["gpu_model"])
        total = self.totals.get(key)
        if total is None:
            total = self.totals[key] = [0, 0, 0, 0]
        total[0] += allocated
        total[1] += capacity
        total[2] += nodes
        total[3] += pods
        self.dirty_totals.add(key)
        if node["gpu_count"]:  # the time series is about GPUs
            self.samples[(key[0], key[1], t - t % MINUTE_MS)] = (total[0], total[1])

    def set_status(self, pod: dict[str, Any], status: str) -> None:
        """Change a pod's status, keeping the cluster's pending and running counts."""
        old = pod["status"]
        if old == status:
            return
        counts = self.stats.get(pod["cluster"])
        if counts is None:
            counts = self.stats[pod["cluster"]] = [0, 0]
        if old == "pending":
            counts[0] -= 1
        elif old == "running":
            counts[1] -= 1
        if status == "pending":
            counts[0] += 1
        elif status == "running":
            counts[1] += 1
        pod["status"] = status

    def unbind(self, event: Event, pod: dict[str, Any]) -> None:
        """Free a running pod's resources on its node and stop charging its tenant."""
        cluster, t = event.cluster, event.occurred_at
        node = self.node(cluster, pod["node_id"])
        free = node["gpu_free"]
        for index, milli in pod["gpus"]:
            free[index] += milli
        milli_total = pod["num_gpu"] * pod["gpu_milli"]
        node["gpu_milli_allocated"] -= milli_total
        node["cpu_allocated"] -= pod["cpu_milli"]
        node["memory_allocated"] -= pod["memory_mib"]
        node["pods_running"] -= 1
        node["updated_sequence"] = event.sequence
        self.shift_totals(node, t, -milli_total, 0, pods=-1)
        stop = max(t, pod["scheduled_at"] or t)
        self.usage.stop(cluster, pod["tenant"], stop, milli_total, (event.partition, event.sequence))
        pod["node_id"] = None
        pod["gpus"] = []
        self.realloc.add((cluster, pod["pod_id"]))

    # -------------------------------------------------------------- writing

    def flush(self) -> None:
        """Write the batch's changes through its own connection (the classic, unpipelined path)."""
        for write in self.plan():
            write(self.conn)

    def plan(self) -> list[Write]:
        """The batch's statements, in the order they run, with their rows built now."""
        writes: list[Write] = self.usage.seals  # sealing ran before everything else when it was immediate
        self.usage.seals = []
        copy = _copy_row if self.snapshot else _same_row
        audit = self.audit
        writes.append(lambda conn: append_rows(conn, models.audit_events, audit))
        removed = [key for key in sorted(self.dirty_nodes) if self.nodes.get(key) is None and key in self.nodes_in_db]
        if removed:
            writes.append(lambda conn: _delete_nodes(conn, removed))
        alive = [copy(node) for node in (self.nodes.get(key) for key in sorted(self.dirty_nodes)) if node is not None]
        if alive:
            writes.append(lambda conn: bulk_upsert_replace(conn, models.nodes, alive))
        if self.dirty_pods:
            pods = [copy(self.pods[key]) for key in sorted(self.dirty_pods)]
            writes.append(lambda conn: bulk_upsert_replace(conn, models.pods, pods))
        if self.dirty_gangs:
            gangs = [copy(self.gangs[key]) for key in sorted(self.dirty_gangs)]
            writes.append(lambda conn: bulk_upsert_replace(conn, models.gangs, gangs))
        for cluster in sorted(self.reservations):
            row = self.reservations[cluster]
            if row is None:
                if cluster in self.reservations_in_db:
                    writes.append(partial(_delete_reservation, cluster=cluster))
            else:
                writes.append(partial(bulk_upsert_replace, table=models.reservations, rows=[copy(row)]))
        for cluster, budget_id in sorted(self.dirty_budgets):
            budget = self.budgets[cluster].get(budget_id)
            if budget is None:
                if (cluster, budget_id) in self.budgets_in_db:
                    writes.append(partial(_delete_budget, cluster=cluster, budget_id=budget_id))
            else:
                writes.append(partial(bulk_upsert_replace, table=models.disruption_budgets, rows=[copy(budget)]))
        stale = _by_cluster({key for key in self.realloc if key in self.pods_in_db})
        for cluster, ids in stale.items():
            writes.append(partial(_delete_pods, table=models.allocations, cluster=cluster, ids=ids))
        rows: list[tuple[Any, ...]] = []  # in the column order of models.allocations
        for key in sorted(self.realloc):
            pod = self.pods[key]
            if pod["status"] == "running":
                cluster, pod_id = key
                node_id = pod["node_id"]
                rows.extend((cluster, pod_id, index, node_id, milli) for index, milli in pod["gpus"])
        if rows:
            writes.append(lambda conn: append_rows(conn, models.allocations, rows))
        if self.samples:
            samples = [
                {"cluster": c, "gpu_model": m, "minute": minute, "allocated_milli": a, "capacity_milli": cap}
                for (c, m, minute), (a, cap) in sorted(self.samples.items())
            ]
            writes.append(lambda conn: bulk_upsert_replace(conn, models.utilization, samples))
        if self.dirty_totals:
            totals = [
                {"cluster": c, "gpu_model": m, "allocated_milli": t[0], "capacity_milli": t[1], "nodes": t[2],
                 "pods_running": t[3]}
                for (c, m), t in ((key, self.totals[key]) for key in sorted(self.dirty_totals))
            ]  # fmt: skip
            writes.append(lambda conn: bulk_upsert_replace(conn, models.gpu_totals, totals))
        if self.stats:
            stats = [{"cluster": c, "pending": v[0], "running": v[1]} for c, v in sorted(self.stats.items())]
            writes.append(lambda conn: bulk_upsert_replace(conn, models.cluster_stats, stats))
        writes.extend(self.usage.plan())
        return writes


def _evicted(conn: Connection, clusters: set[str]) -> set[tuple[str, str]]:
    """(cluster, pod_id) of the evicted pods of these clusters (index on cluster and status)."""
    table = models.pods
    rows = conn.execute(
        select(table.c.cluster, table.c.pod_id).where(
            table.c.cluster.in_(sorted(clusters)), table.c.status == "evicted"
        )
    )
    return {(row.cluster, row.pod_id) for row in rows}


def _same_row(row: dict[str, Any]) -> dict[str, Any]:
    return row


def _copy_row(row: dict[str, Any]) -> dict[str, Any]:
    """A copy of a row that later changes to the original cannot reach.

    Shallow but for ``gpu_free``: the handlers replace every other list or dict of a row whole
    (``pod["gpus"] = [...]``), and change only a node's ``gpu_free`` in place. A handler that changed
    another nested value in place would need it copied here (tests/unit/projections/test_pipeline.py checks the
    pipelined tables against the unpipelined ones)."""
    copy = row.copy()
    free = copy.get("gpu_free")
    if free is not None:
        copy["gpu_free"] = free.copy()
    return copy


def _take(held: dict[Any, Any], keys: set[Any], into: dict[Any, Any]) -> set[Any]:
    """Move the rows ``held`` has for ``keys`` into ``into``; the keys it does not hold."""
    missing = set()
    for key in keys:
        if key in held:
            into[key] = held[key]
        else:
            missing.add(key)
    return missing


def _delete_nodes(conn: Connection, keys: list[tuple[str, str]]) -> None:
    table = models.nodes
    for cluster, node_id in keys:
        conn.execute(delete(table).where(and_(table.c.cluster == cluster, table.c.node_id == node_id)))


def _delete_budget(conn: Connection, cluster: str, budget_id: str) -> None:
    table = models.disruption_budgets
    conn.execute(delete(table).where(and_(table.c.cluster == cluster, table.c.budget_id == budget_id)))


def _delete_reservation(conn: Connection, cluster: str) -> None:
    table = models.reservations
    conn.execute(delete(table).where(table.c.cluster == cluster))


def _fetch(
    conn: Connection, table: Any, id_column: str, keys: set[tuple[str, str]]
) -> list[tuple[Any, dict[str, Any]]]:
    """Rows of a (cluster, id)-keyed table for the given keys, as ((cluster, id), row dict).

    On PostgreSQL the keys are joined as an unnested array, so each is one primary-key
    probe whatever the table's statistics say; the query goes straight to psycopg (no
    per-row SQLAlchemy Row) and JSON columns are parsed from str (psycopg hands bytes to
    ``json.loads``, which then sniffs the encoding: 4x the parse itself). Elsewhere a
    plain IN list per chunk.
    """
    out = []
    if conn.dialect.name == "postgresql":
        from psycopg.types.json import set_json_loads  # psycopg is optional (the postgres extra)

        names = [column.name for column in table.columns]
        at = names.index(id_column)
        sql = (
            f"SELECT {', '.join(f't.{name}' for name in names)} FROM {target_name(conn, table)} AS t "
            f"JOIN unnest(%s::varchar[]) AS k(id) ON t.cluster = %s AND t.{id_column} = k.id"
        )
        with conn.connection.driver_connection.cursor() as cursor:  # type: ignore[union-attr]
            set_json_loads(_json_loads, cursor)  # type: ignore[arg-type]
            for cluster, ids in _by_cluster(keys).items():
                for chunk in _chunks(ids, 10_000):
                    cursor.execute(sql, (chunk, cluster), prepare=False)
                    for row in cursor.fetchall():
                        out.append(((cluster, row[at]), dict(zip(names, row, strict=True))))
        return out
    for cluster, ids in _by_cluster(keys).items():
        for chunk in _chunks(ids):
            for row in conn.execute(select(table).where(table.c.cluster == cluster, table.c[id_column].in_(chunk))):
                mapping = dict(row._mapping)
                out.append(((mapping["cluster"], mapping[id_column]), mapping))
    return out


_decode_json = json.JSONDecoder().decode


def _json_loads(data: bytes) -> Any:
    return _decode_json(data.decode())


def _delete_pods(conn: Connection, table: Any, cluster: str, ids: list[str]) -> None:
    """Delete the rows of a (cluster, pod_id, ...)-keyed table for the given pods.

    On PostgreSQL: one unprepared ``pod_id = ANY(%s)``. Prepared (psycopg prepares a
    query after five runs) the server switches to a generic plan in which the array is
    a parameter, never hashed, so every row is compared with every id: ~35 us per
    event projected. Unprepared, the planner sees the array as a constant and hashes it.
    """
    if conn.dialect.name != "postgresql":
        for chunk in _chunks(ids):
            conn.execute(delete(table).where(table.c.cluster == cluster, table.c.pod_id.in_(chunk)))
        return
    with conn.connection.driver_connection.cursor() as cursor:  # type: ignore[union-attr]
        cursor.execute(
            f"DELETE FROM {target_name(conn, table)} WHERE cluster = %s AND pod_id = ANY(%s::varchar[])",
            (cluster, ids),
            prepare=False,
        )


def _by_cluster(keys: set[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for cluster, name in sorted(keys):
        out.setdefault(cluster, []).append(name)
    return out


def _chunks(items: list[Any], size: int = _CHUNK) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
