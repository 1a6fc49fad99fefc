"""The projector: folds a batch of events into the read-side tables, exactly once.

``project_batch(conn, source, batch)`` runs inside the caller's transaction. It
locks each partition's row of ``projection_offsets`` (``SELECT ... FOR UPDATE``
on PostgreSQL), skips events whose sequence is below the stored
``next_sequence`` (already applied: a replay after a crash, or another projector
got there first), applies the rest, and writes the new offsets, all in that
one transaction. Commit makes rows and offsets visible together, so a crash at
any point loses nothing and duplicates nothing.

The batch is applied in memory: the rows it touches are loaded with one query
per table, changed event by event, and written back with bulk statements, so
the cost per event is a few dictionary updates, not a round trip.
:class:`Projector` adds the transaction and retries with backoff on database
outages (the batch is re-projected whole; the offsets make that safe).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from sqlalchemy import Connection, Engine, and_, delete, select, update
from sqlalchemy.exc import DBAPIError, OperationalError

from projections import models
from projections.dialect import append_rows, bulk_upsert_replace, target_name, upsert_ignore
from projections.secrets import mask_url
from projections.usage import DEFAULT_LATENESS_MS, UsageLedger, Write
from schemas.events import (
    Event,
    GangQueued,
    GangReleased,
    GangScheduled,
    GangSpec,
    NodeAdded,
    NodeCordoned,
    NodeDrained,
    NodeFailed,
    NodeRemoved,
    NodesReserved,
    NodeUncordoned,
    PodEvicted,
    PodMigrated,
    PodQueued,
    PodReleased,
    PodScheduled,
    PodSpec,
    ReservationReleased,
)
from schemas.fastcodec import encode_event
from schemas.limits import MAX_ISSUED_AT

log = logging.getLogger("gpufold.projector")

MINUTE_MS = 60_000
_CHUNK = 500  # keys per IN (...) list on SQLite


class ProjectionError(Exception):
    """The events cannot be projected (a gap in a partition's sequence, an event about an unknown pod or node)."""


class ProjectionStopped(Exception):
    """A stop was asked for while the database was unavailable: the batch was not written (nothing is lost)."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """One record of the events topic: where it is, its frame, and the frame decoded.

    ``event`` is the frame decoded by :func:`schemas.fastcodec.decode_event` (the
    generated decoder builds the dataclasses directly, ~3x cheaper than fastavro's
    mappings), or None if the bytes did not decode. The projector keeps ``frame``
    verbatim in the audit log.
    """

    partition: int
    offset: int
    event: Event | None
    frame: bytes | None = None
    error: str = ""

    @classmethod
    def of(cls, event: Event, offset: int) -> Envelope:
        """An envelope for an in-process :class:`Event` (tests, benchmarks, the demo)."""
        return cls(event.partition, offset, event, encode_event(event))


@dataclass(slots=True)
class BatchResult:
    """What one batch did."""

    applied: int = 0
    duplicates: int = 0
    undecodable: int = 0
    sealed_hours: list[tuple[str, int]] = field(default_factory=list)
    last_occurred_at: int | None = None
    positions: dict[int, int] = field(default_factory=dict)  # partition -> next offset
    gpu_totals: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # changed: (allocated, capacity)
    pending: dict[str, int] = field(default_factory=dict)  # cluster -> pending pods, for clusters in the batch


# ------------------------------------------------------------------ offsets


def load_offsets(conn: Connection, source: str) -> dict[int, tuple[int, int]]:
    """partition -> (next_offset, next_sequence) for a source."""
    table = models.projection_offsets
    rows = conn.execute(select(table).where(table.c.source == source))
    return {row.partition: (row.next_offset, row.next_sequence) for row in rows}


def _lock_offsets(conn: Connection, source: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
    table = models.projection_offsets
    conn.execute(
        upsert_ignore(conn, table),
        [{"source": source, "partition": p, "next_offset": 0, "next_sequence": 0} for p in partitions],
    )
    rows = conn.execute(
        select(table)
        .where(and_(table.c.source == source, table.c.partition.in_(partitions)))
        .order_by(table.c.partition)
        .with_for_update()
    )
    return {row.partition: (row.next_offset, row.next_sequence) for row in rows}


# ------------------------------------------------------------------ rows


def _pod_row(cluster: str, spec: PodSpec, sequence: int) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "pod_id": spec.pod_id,
        "tenant": spec.tenant,
        "priority": spec.priority,
        "num_gpu": spec.num_gpu,
        "gpu_milli": spec.gpu_milli,
        "cpu_milli": spec.cpu_milli,
        "memory_mib": spec.memory_mib,
        "gpu_models": list(spec.gpu_models),
        "arrival": spec.arrival,
        "status": None,  # set by the event that creates the row
        "node_id": None,
        "gpus": [],
        "reasons": [],
        "submitted_at": spec.submitted_at,
        "queued_at": None,
        "scheduled_at": None,
        "ended_at": None,
        "end_reason": None,
        "updated_sequence": sequence,
    }


def _subject(payload: Any) -> tuple[str | None, str | None]:
    """(pod_id, node_id) an event is about, for the audit log's indexes."""
    pod = getattr(payload, "pod", None)
    if pod is not None:
        return pod.pod_id, getattr(payload, "node_id", None)
    return getattr(payload, "pod_id", None), getattr(payload, "node_id", None)


class _Batch:
    """The rows one batch touches, loaded once, changed in memory, written back at the end.

    ``conn`` is only read from (in :meth:`load`); applying events touches no database,
    and :meth:`plan` turns the changes into statements for the batch's transaction. With
    ``snapshot`` the planned rows are copies, so the next batch may take this one's rows
    over (:meth:`load` with ``previous``) and change them while these are being written.
    """

    def __init__(self, conn: Connection, lateness_ms: int, *, snapshot: bool = False) -> None:
        self.conn = conn
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
        self.realloc: set[tuple[str, str]] = set()  # pods whose allocation rows change
        # (cluster, model) -> [allocated, capacity, nodes, pods running]; cluster -> [pending, running]
        self.totals: dict[tuple[str, str], list[int]] = {}
        self.dirty_totals: set[tuple[str, str]] = set()
        self.stats: dict[str, list[int]] = {}
        self.samples: dict[tuple[str, str, int], tuple[int, int]] = {}
        self.audit: list[tuple[Any, ...]] = []
        self.usage = UsageLedger(lateness_ms=lateness_ms)

    # -------------------------------------------------------------- loading

    def load(self, events: list[Envelope], previous: _Batch | None = None) -> None:
        """Load the rows the events need: from ``previous`` (the batch before, as it will have
        written them) where it holds them, from the database otherwise."""
        node_keys: set[tuple[str, str]] = set()
        pod_keys: set[tuple[str, str]] = set()
        gang_keys: set[tuple[str, str]] = set()
        reserved: set[str] = set()
        placed: set[tuple[str, str]] = set()  # first placements
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
            # few, so first placements look them up by status (below), not one by one.
            kind = type(payload)
            if pod_id is not None:
                if (kind is PodScheduled and not payload.from_queue) or (  # type: ignore[union-attr]
                    kind is PodQueued and not payload.requeued  # type: ignore[union-attr]
                ):
                    placed.add((cluster, pod_id))
                else:
                    pod_keys.add((cluster, pod_id))
            if kind in _GANG_EVENTS:
                gang_keys.add((cluster, str(payload.gang_id)))  # type: ignore[union-attr]
                if kind is GangQueued and payload.requeued:  # type: ignore[union-attr]
                    pod_keys.update((cluster, m.pod_id) for m in payload.gang.members)  # type: ignore[union-attr]
            elif kind is NodesReserved or kind is ReservationReleased:
                reserved.add(cluster)
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
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, event, payload)

    def node(self, cluster: str, node_id: str) -> dict[str, Any]:
        row = self.nodes.get((cluster, node_id))
        if row is None:
            raise ProjectionError(f"event refers to node {node_id!r} of cluster {cluster!r}, which is not projected")
        self.dirty_nodes.add((cluster, node_id))
        return row

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
            row = self.pods[key] = _pod_row(event.cluster, spec, event.sequence)
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
    another nested value in place would need it copied here (test_projections_pipeline checks the
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


# ------------------------------------------------------------------ handlers


Handler = Callable[[_Batch, Event, Any], None]


def _node_added(batch: _Batch, event: Event, p: NodeAdded) -> None:
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


def _node_removed(batch: _Batch, event: Event, p: NodeRemoved) -> None:
    cluster = event.cluster
    node = batch.node(cluster, p.node_id)
    capacity = 0 if node["failed"] else node["gpu_count"] * 1000
    batch.shift_totals(node, event.occurred_at, 0, -capacity, nodes=-1)
    batch.nodes[(cluster, p.node_id)] = None


def _node_flag(flag: str, value: bool) -> Handler:
    def handler(batch: _Batch, event: Event, p: Any) -> None:
        node = batch.node(event.cluster, p.node_id)
        node[flag] = value
        node["updated_sequence"] = event.sequence

    return handler


def _node_failed(batch: _Batch, event: Event, p: NodeFailed) -> None:
    node = batch.node(event.cluster, p.node_id)
    node["failed"] = True
    node["updated_sequence"] = event.sequence
    batch.shift_totals(node, event.occurred_at, 0, -node["gpu_count"] * 1000)


def _pod_queued(batch: _Batch, event: Event, p: PodQueued) -> None:
    pod = batch.pod_from_spec(event, p.pod)
    batch.set_status(pod, "pending")
    pod["reasons"] = [{"code": r.code, "nodes": r.nodes, "message": r.message} for r in p.reasons]
    pod["queued_at"] = event.occurred_at
    pod["updated_sequence"] = event.sequence


def _pod_scheduled(batch: _Batch, event: Event, p: PodScheduled) -> None:
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


def _pod_evicted(batch: _Batch, event: Event, p: PodEvicted) -> None:
    pod = batch.pod(event.cluster, p.pod_id)
    if pod["status"] != "running" or pod["node_id"] != p.node_id:
        raise ProjectionError(f"pod {p.pod_id!r} evicted from {p.node_id!r} where it does not run")
    batch.unbind(event, pod)
    batch.set_status(pod, "evicted")
    pod["updated_sequence"] = event.sequence


def _pod_released(batch: _Batch, event: Event, p: PodReleased) -> None:
    pod = batch.pod(event.cluster, p.pod_id)
    if pod["status"] == "running":
        batch.unbind(event, pod)
    batch.set_status(pod, "released")
    pod["reasons"] = []
    pod["ended_at"] = event.occurred_at
    pod["end_reason"] = p.reason[:64]
    pod["updated_sequence"] = event.sequence


def _pod_migrated(batch: _Batch, event: Event, p: PodMigrated) -> None:
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


def _gang_row(cluster: str, spec: GangSpec, sequence: int) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "gang_id": spec.gang_id,
        "tenant": spec.tenant,
        "priority": spec.priority,
        "arrival": spec.arrival,
        "members": [_member(m) for m in spec.members],
        "min_members": spec.min_members,
        "topology_required": spec.topology_required,
        "topology_preferred": spec.topology_preferred,
        "time_limit_ms": spec.time_limit_ms,
        "timeout_ms": spec.timeout_ms,
        "depends_on": list(spec.depends_on),
        "status": "pending",
        "waiting_for": [],
        "reasons": [],
        "placed": [],
        "topology_key": None,
        "domain": None,
        "submitted_at": spec.submitted_at,
        "queued_at": None,
        "started_at": None,
        "ended_at": None,
        "end_reason": None,
        "ended_ok": None,
        "updated_sequence": sequence,
    }


def _member(spec: PodSpec) -> dict[str, Any]:
    return {
        "pod_id": spec.pod_id,
        "num_gpu": spec.num_gpu,
        "gpu_milli": spec.gpu_milli,
        "cpu_milli": spec.cpu_milli,
        "memory_mib": spec.memory_mib,
    }


def _gang_from_spec(batch: _Batch, event: Event, spec: GangSpec) -> dict[str, Any]:
    key = (event.cluster, spec.gang_id)
    row = batch.gangs.get(key)
    if row is None or row["status"] == "released":
        row = batch.gangs[key] = _gang_row(event.cluster, spec, event.sequence)
    batch.dirty_gangs.add(key)
    return row


def _close_evicted_members(batch: _Batch, event: Event, gang: dict[str, Any], reason: str) -> None:
    """Members evicted with their gang stop being pods until it starts again: their rows end."""
    for member in gang["members"]:
        key = (event.cluster, member["pod_id"])
        pod = batch.pods.get(key)
        if pod is not None and pod["status"] == "evicted":
            batch.set_status(pod, "released")
            pod["ended_at"] = event.occurred_at
            pod["end_reason"] = reason
            pod["updated_sequence"] = event.sequence
            batch.dirty_pods.add(key)


def _gang_queued(batch: _Batch, event: Event, p: GangQueued) -> None:
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


def _gang_scheduled(batch: _Batch, event: Event, p: GangScheduled) -> None:
    gang = _gang_from_spec(batch, event, p.gang)
    gang["status"] = "running"
    gang["waiting_for"] = []
    gang["reasons"] = []
    gang["placed"] = [{"pod_id": m.pod_id, "node_id": m.node_id} for m in p.members]
    gang["topology_key"] = p.topology_key
    gang["domain"] = p.domain
    gang["started_at"] = event.occurred_at
    gang["updated_sequence"] = event.sequence


def _gang_released(batch: _Batch, event: Event, p: GangReleased) -> None:
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


def _nodes_reserved(batch: _Batch, event: Event, p: NodesReserved) -> None:
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


def _reservation_released(batch: _Batch, event: Event, p: ReservationReleased) -> None:
    batch.reservations[event.cluster] = None


_GANG_EVENTS = (GangQueued, GangScheduled, GangReleased)


_HANDLERS: dict[type, Handler] = {
    NodeAdded: _node_added,
    NodeRemoved: _node_removed,
    NodeCordoned: _node_flag("cordoned", True),
    NodeDrained: _node_flag("cordoned", True),
    NodeUncordoned: _node_flag("cordoned", False),
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
}


# ------------------------------------------------------------------ the batch


def project_batch(
    conn: Connection, source: str, batch: Sequence[Envelope], *, lateness_ms: int = DEFAULT_LATENESS_MS
) -> BatchResult:
    """Apply a batch of events (in log order per partition) inside the caller's transaction.

    Events already applied (sequence below the partition's stored next_sequence)
    are skipped; the partition offsets are written before returning, so commit
    makes the rows and the offsets visible together.
    """
    if not batch:
        return BatchResult()
    partitions = sorted({envelope.partition for envelope in batch})
    planned = _plan(conn, source, batch, _lock_offsets(conn, source, partitions), lateness_ms)
    planned.write(conn)
    return planned.result


@dataclass(slots=True)
class _Planned:
    """A batch applied in memory: its statements, and the offsets they start from and lead to."""

    source: str
    start: dict[int, tuple[int, int]]  # partition -> (next_offset, next_sequence) the batch was applied on
    end: dict[int, tuple[int, int]]  # ... and once it is written
    writes: list[Write]
    work: _Batch
    result: BatchResult

    def write(self, conn: Connection) -> None:
        """Run the statements and move the offsets (in the caller's transaction)."""
        for write in self.writes:
            write(conn)
        table = models.projection_offsets
        for p, (next_offset, next_sequence) in sorted(self.end.items()):
            conn.execute(
                update(table)
                .where(and_(table.c.source == self.source, table.c.partition == p))
                .values(next_offset=next_offset, next_sequence=next_sequence)
            )
        self.result.sealed_hours = self.work.usage.sealed


def _plan(
    conn: Connection,
    source: str,
    batch: Sequence[Envelope],
    offsets: dict[int, tuple[int, int]],
    lateness_ms: int,
    previous: _Batch | None = None,
    *,
    snapshot: bool = False,
) -> _Planned:
    """Skip what ``offsets`` says is applied, apply the rest in memory, and plan the writes.

    ``offsets`` (partition -> (next_offset, next_sequence)) must cover every partition of the batch.
    """
    result = BatchResult()
    partitions = sorted({envelope.partition for envelope in batch})
    next_sequence = {p: offsets[p][1] for p in partitions}
    next_offset = {p: offsets[p][0] for p in partitions}
    fresh: list[Envelope] = []
    for envelope in batch:
        p = envelope.partition
        next_offset[p] = max(next_offset[p], envelope.offset + 1)
        event = envelope.event
        if event is None:
            result.undecodable += 1
            log.warning("skipping undecodable record at %s[%d]@%d: %s", source, p, envelope.offset, envelope.error)
            continue
        sequence = event.sequence
        if event.partition != p:
            raise ProjectionError(f"event of partition {event.partition} found in {source}[{p}]@{envelope.offset}")
        if sequence < next_sequence[p]:
            result.duplicates += 1
            continue
        if sequence != next_sequence[p]:
            raise ProjectionError(
                f"{source}[{p}]: expected event sequence {next_sequence[p]}, got {sequence} "
                f"at offset {envelope.offset} (events are missing)"
            )
        next_sequence[p] += 1
        fresh.append(envelope)
    work = _Batch(conn, lateness_ms, snapshot=snapshot)
    work.load(fresh, previous)
    for envelope in fresh:
        work.apply(envelope)
    writes = work.plan()
    result.applied = len(fresh)
    result.gpu_totals = {key: (work.totals[key][0], work.totals[key][1]) for key in work.dirty_totals}
    result.pending = {cluster: counts[0] for cluster, counts in work.stats.items()}
    result.positions = next_offset
    if fresh:
        result.last_occurred_at = max(e.event.occurred_at for e in fresh)  # type: ignore[union-attr]
    start = {p: offsets[p] for p in partitions}
    end = {p: (next_offset[p], next_sequence[p]) for p in partitions}
    return _Planned(source, start, end, writes, work, result)


# ------------------------------------------------------------------ the service


def _count_retry() -> None:
    try:
        from projections import metrics
    except ImportError:  # prometheus-client is optional
        return
    metrics.RETRIES.inc()


class Projector:
    """Projects batches into a database, one transaction per batch, retrying through outages."""

    def __init__(
        self,
        engine: Engine,
        source: str,
        *,
        lateness_ms: int = DEFAULT_LATENESS_MS,
        max_backoff: float = 5.0,
        give_up_after: float | None = None,
        on_commit: Callable[[BatchResult, float], None] | None = None,
        schema: str | None = None,
    ) -> None:
        self.engine = engine
        self.source = source
        self.lateness_ms = lateness_ms
        self.max_backoff = max_backoff
        self.give_up_after = give_up_after
        self.on_commit = on_commit
        self.schema = schema
        self.retries = 0
        self.stopping: Callable[[], bool] = lambda: False
        """Set by the runner: once it returns True, an outage is no longer waited out (SIGTERM stays prompt)."""

    def _connect(self) -> Connection:
        conn = self.engine.connect()
        if self.schema:
            conn = conn.execution_options(schema_translate_map={None: self.schema})
        return conn

    def positions(self) -> dict[int, int]:
        """partition -> next source offset to read, as committed (retrying through outages)."""
        return self._retry(lambda: self._positions_once())

    def _positions_once(self) -> dict[int, int]:
        with self._connect() as conn:
            return {p: offset for p, (offset, _) in load_offsets(conn, self.source).items()}

    def project(self, batch: Sequence[Envelope]) -> BatchResult:
        """Project one batch in one transaction; on a database outage wait and retry the whole batch."""
        return self._retry(lambda: self._project_once(batch))

    def _project_once(self, batch: Sequence[Envelope]) -> BatchResult:
        started = time.perf_counter()
        with self._connect() as conn, conn.begin():
            result = project_batch(conn, self.source, batch, lateness_ms=self.lateness_ms)
        if self.on_commit is not None:
            self.on_commit(result, time.perf_counter() - started)
        return result

    def _retry(self, attempt: Callable[[], Any]) -> Any:
        delay = 0.1
        first_failure: float | None = None
        while True:
            try:
                return attempt()
            except (OperationalError, DBAPIError) as error:
                if (
                    isinstance(error, DBAPIError)
                    and not error.connection_invalidated
                    and not isinstance(error, OperationalError)
                ):
                    raise
                now = time.monotonic()
                first_failure = first_failure or now
                if self.give_up_after is not None and now - first_failure > self.give_up_after:
                    raise
                self.retries += 1
                _count_retry()
                message = mask_url(str(error.orig) if error.orig is not None else str(error)).splitlines()[0]
                log.warning("database unavailable (%s); retrying in %.1fs", message, delay)
                deadline = time.monotonic() + delay
                while time.monotonic() < deadline:
                    if self.stopping():
                        raise ProjectionStopped(f"stopped while the database was unavailable ({message})") from None
                    time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
                delay = min(self.max_backoff, delay * 2)


class _Moved(Exception):
    """The offsets moved since the batch was applied: it was applied on a view that is not the database's."""


class Pipeline:
    """Projects batches so that one is written while the next is applied (PostgreSQL).

    :meth:`submit` applies a batch in memory on top of the batch before it (whose
    transaction may still be open: the rows it holds are taken over as it will have
    written them, the rest read from the database, which it does not change), then
    waits for that transaction and hands the new batch to a writer thread. The writer
    locks the offsets, checks that they are where the batch was applied from, and
    commits rows and offsets in one transaction, as :func:`project_batch` does. If the
    offsets moved (another projector of the group got there) or a write failed (an
    outage), nothing of that batch is committed, and it and the batch applied on top
    of it are projected again the unpipelined way (:meth:`Projector.project`, which
    skips what is already applied and retries outages). Exactly once either way.
    """

    def __init__(self, projector: Projector) -> None:
        self.projector = projector
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="projector-writer")
        self._inflight: tuple[Future[BatchResult], Sequence[Envelope]] | None = None
        self._previous: _Planned | None = None
        self.replays = 0
        """Batches projected again the unpipelined way (their pipelined write was not committed)."""

    def submit(self, batch: Sequence[Envelope]) -> list[BatchResult]:
        """Apply the batch and start writing it; the results of the batches committed meanwhile, in order."""
        planned: _Planned | None = None
        if batch:
            try:
                planned = self._plan(batch)
            except (ProjectionError, OperationalError, DBAPIError) as error:  # decided again below
                log.info("pipelined apply failed (%s); projecting the batch unpipelined", error)
        results, ok = self._wait()
        if planned is None or not ok:  # applied on a view the database does not have
            self._previous = None
            if batch:
                results.append(self.projector.project(batch))
            return results
        self._inflight = (self._writer.submit(self._write, planned), batch)
        self._previous = planned
        return results

    def drain(self) -> list[BatchResult]:
        """Wait for the batch being written; its result (nothing if none was in flight)."""
        results, _ = self._wait()
        self._previous = None
        return results

    def close(self) -> None:
        """Wait for the batch being written to commit or fail (the database is consistent either way), then
        stop the writer thread. After :meth:`drain` on a normal exit; on an error, so that no write outlives
        the run."""
        if self._inflight is not None:
            future, _ = self._inflight
            self._inflight = None
            error = future.exception()
            if error is not None:
                log.info("pipelined write not committed (%s)", error)
        self._previous = None
        self._writer.shutdown(wait=True)

    def _plan(self, batch: Sequence[Envelope]) -> _Planned:
        previous = self._previous
        offsets = dict(previous.end) if previous is not None else {}
        with self.projector._connect() as conn, conn.begin():
            # Offsets before rows: a commit by anyone else after this read moves them, which the write sees.
            if {envelope.partition for envelope in batch} - offsets.keys():
                stored = load_offsets(conn, self.projector.source)
                for envelope in batch:
                    offsets.setdefault(envelope.partition, stored.get(envelope.partition, (0, 0)))
            return _plan(conn, self.projector.source, batch, offsets, self.projector.lateness_ms,
                         previous.work if previous is not None else None, snapshot=True)  # fmt: skip

    def _write(self, planned: _Planned) -> BatchResult:
        started = time.perf_counter()
        with self.projector._connect() as conn, conn.begin():
            found = _lock_offsets(conn, self.projector.source, sorted(planned.start))
            if found != planned.start:
                raise _Moved(f"offsets {found} are not {planned.start}, which the batch was applied on")
            planned.write(conn)
        if self.projector.on_commit is not None:
            self.projector.on_commit(planned.result, time.perf_counter() - started)
        return planned.result

    def _wait(self) -> tuple[list[BatchResult], bool]:
        """The result of the batch in flight; if its write failed, it is projected again unpipelined."""
        if self._inflight is None:
            return [], True
        future, batch = self._inflight
        self._inflight = None
        try:
            return [future.result()], True
        except Exception as error:  # nothing of it was committed (a rolled-back transaction)
            log.info("pipelined write not committed (%s); projecting the batch again unpipelined", error)
            self._previous = None
            self.replays += 1
            return [self.projector.project(batch)], False
