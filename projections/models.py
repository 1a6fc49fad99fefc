"""The read-side schema: SQLAlchemy 2 declarative models, one table per question asked of the events.

Every table is a pure function of the events projected so far (in sequence order
per partition), so a rebuild from offset 0 produces byte-identical contents; no
table has a surrogate key, a server default or a wall-clock column.

Times are epoch milliseconds (``BigInteger``), like the events. GPU amounts are
milli-GPUs (1000 = one GPU); usage is milli-GPU-milliseconds (``/ 1e6`` gives
GPU-seconds), kept as integers so that sums are exact.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import JSON, BigInteger, Boolean, Index, Integer, LargeBinary, MetaData, String, Table, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ID = String(253)
JsonType = JSON().with_variant(JSONB(), "postgresql")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


DISRUPTION_TYPES = ("PodPreempted", "PodMigrated", "DefragmentationPlanned")
"""The audit event types the disruptions query reads (its partial index covers only these)."""
DISRUPTIONS_SQL = "type IN ('PodPreempted', 'PodMigrated', 'DefragmentationPlanned')"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class NodeRow(Base):
    """A node present now (removed nodes are deleted); free GPU share per GPU index in ``gpu_free``."""

    __tablename__ = "nodes"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    node_id: Mapped[str] = mapped_column(ID, primary_key=True)
    gpu_model: Mapped[str] = mapped_column(String(64))
    gpu_count: Mapped[int] = mapped_column(Integer)
    cpu_milli: Mapped[int] = mapped_column(BigInteger)
    memory_mib: Mapped[int] = mapped_column(BigInteger)
    labels: Mapped[Any] = mapped_column(JsonType)
    taints: Mapped[Any] = mapped_column(JsonType)
    cordoned: Mapped[bool] = mapped_column(Boolean)
    failed: Mapped[bool] = mapped_column(Boolean)
    gpu_free: Mapped[Any] = mapped_column(JsonType)  # list of free milli per GPU index
    gpu_milli_allocated: Mapped[int] = mapped_column(BigInteger)
    cpu_allocated: Mapped[int] = mapped_column(BigInteger)
    memory_allocated: Mapped[int] = mapped_column(BigInteger)
    pods_running: Mapped[int] = mapped_column(Integer)
    added_at: Mapped[int] = mapped_column(BigInteger)
    updated_sequence: Mapped[int] = mapped_column(BigInteger)


class PodRow(Base):
    """A pod's latest state: pending (with reasons), running (on node_id) or released."""

    __tablename__ = "pods"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    pod_id: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(ID)
    priority: Mapped[int] = mapped_column(Integer)
    num_gpu: Mapped[int] = mapped_column(Integer)
    gpu_milli: Mapped[int] = mapped_column(Integer)
    cpu_milli: Mapped[int] = mapped_column(BigInteger)
    memory_mib: Mapped[int] = mapped_column(BigInteger)
    gpu_models: Mapped[Any] = mapped_column(JsonType)
    arrival: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))  # pending | running | released
    node_id: Mapped[str | None] = mapped_column(ID, nullable=True)
    gpus: Mapped[Any] = mapped_column(JsonType)  # [[index, milli], ...] while running
    reasons: Mapped[Any] = mapped_column(JsonType)  # queue reasons while pending
    submitted_at: Mapped[int] = mapped_column(BigInteger)
    queued_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    scheduled_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    ended_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    end_reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    updated_sequence: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        # The pending queue in order (priority first, FIFO within it); partial on PostgreSQL.
        Index(
            "ix_pods_pending_order",
            "cluster",
            text("priority DESC"),
            "arrival",
            "pod_id",
            postgresql_where=text("status = 'pending'"),
            sqlite_where=text("status = 'pending'"),
        ),
        # The evicted pods of a cluster (the projector looks them up for first placements). Partial: an
        # index on (cluster, status) over every row cost PostgreSQL ~3-4 us per event projected (every
        # status change moves the entry), and no query reads pods by another status through it.
        Index(
            "ix_pods_evicted",
            "cluster",
            postgresql_where=text("status = 'evicted'"),
            sqlite_where=text("status = 'evicted'"),
        ),
    )


class GangRow(Base):
    """A gang's latest state: waiting (for dependencies), pending (with reasons), running or released."""

    __tablename__ = "gangs"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    gang_id: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(ID)
    priority: Mapped[int] = mapped_column(Integer)
    arrival: Mapped[int] = mapped_column(BigInteger)
    members: Mapped[Any] = mapped_column(JsonType)  # [{pod_id, num_gpu, gpu_milli, cpu_milli, memory_mib}, ...]
    min_members: Mapped[int] = mapped_column(Integer)
    topology_required: Mapped[str | None] = mapped_column(ID, nullable=True)
    topology_preferred: Mapped[str | None] = mapped_column(ID, nullable=True)
    time_limit_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    timeout_ms: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    depends_on: Mapped[Any] = mapped_column(JsonType)
    status: Mapped[str] = mapped_column(String(16))  # waiting | pending | running | released
    waiting_for: Mapped[Any] = mapped_column(JsonType)  # dependencies not ended when it was queued
    reasons: Mapped[Any] = mapped_column(JsonType)  # queue reasons while pending (as queued)
    placed: Mapped[Any] = mapped_column(JsonType)  # [{pod_id, node_id}, ...] while running
    topology_key: Mapped[str | None] = mapped_column(ID, nullable=True)
    domain: Mapped[str | None] = mapped_column(ID, nullable=True)
    submitted_at: Mapped[int] = mapped_column(BigInteger)
    queued_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    started_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    ended_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    end_reason: Mapped[str | None] = mapped_column(String(64), nullable=True)
    ended_ok: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    updated_sequence: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (Index("ix_gangs_cluster_status", "cluster", "status"),)


class ReservationRow(Base):
    """A cluster's current reservation: the nodes held for the head of its queue (deleted when released)."""

    __tablename__ = "reservations"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    holder_id: Mapped[str] = mapped_column(ID)
    holder_kind: Mapped[str] = mapped_column(String(8))  # pod | gang
    nodes: Mapped[Any] = mapped_column(JsonType)
    expected_start: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    made_at: Mapped[int] = mapped_column(BigInteger)
    message: Mapped[str] = mapped_column(String(1000))
    updated_sequence: Mapped[int] = mapped_column(BigInteger)


class DisruptionBudgetRow(Base):
    """A disruption budget as set (deleted when removed), with the drain evictions it blocks: each
    ``{pod_id, node_id, since, reason}`` as EvictionBlocked said, dropped when the eviction is scheduled or
    the drain cancelled (uncordon) or decided anew; queries show only those whose pod still runs on that node
    (an evicted or released pod is blocked no more). How many pods a budget counts unavailable needs the
    pods' selectors, which no table keeps: the live replica answers it
    (``/v1/clusters/{cluster}/disruption-budgets``)."""

    __tablename__ = "disruption_budgets"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    budget_id: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str | None] = mapped_column(ID, nullable=True)
    gang_id: Mapped[str | None] = mapped_column(ID, nullable=True)
    label_selector: Mapped[Any] = mapped_column(JsonType)  # {} when it gives none
    max_unavailable: Mapped[int] = mapped_column(Integer)
    set_at: Mapped[int] = mapped_column(BigInteger)
    blocked: Mapped[Any] = mapped_column(JsonType)  # [{pod_id, node_id, since, reason}, ...]
    updated_sequence: Mapped[int] = mapped_column(BigInteger)


class AllocationRow(Base):
    """One GPU (or share of one) held by a running pod."""

    __tablename__ = "allocations"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    pod_id: Mapped[str] = mapped_column(ID, primary_key=True)
    gpu_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[str] = mapped_column(ID)
    milli: Mapped[int] = mapped_column(Integer)

    __table_args__ = (Index("ix_allocations_node", "cluster", "node_id"),)


class AuditEventRow(Base):
    """Every event, with its position and the command that caused it, and its bytes verbatim.

    The frame is kept rather than a JSON copy: it is what was published (an audit
    can check it bit for bit), and it costs nothing to store; readers decode it.
    """

    __tablename__ = "audit_events"
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    sequence: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    cluster: Mapped[str] = mapped_column(ID)
    command_id: Mapped[str] = mapped_column(ID)
    command_offset: Mapped[int] = mapped_column(BigInteger)
    occurred_at: Mapped[int] = mapped_column(BigInteger)
    type: Mapped[str] = mapped_column(String(32))
    pod_id: Mapped[str | None] = mapped_column(ID, nullable=True)
    node_id: Mapped[str | None] = mapped_column(ID, nullable=True)
    frame: Mapped[bytes] = mapped_column(LargeBinary)  # the event exactly as published (Avro single-object)

    __table_args__ = (
        Index("ix_audit_events_command", "command_id"),
        Index("ix_audit_events_pod", "cluster", "pod_id"),
        # Preemptions and migrations of a cluster (queries.disruptions): partial, so the other events, nearly
        # all of them, cost no entry (~4 us of PostgreSQL per event). Keep in step with queries.DISRUPTIONS.
        Index(
            "ix_audit_events_disruptions",
            "cluster",
            "type",
            postgresql_where=text(DISRUPTIONS_SQL),
            sqlite_where=text(DISRUPTIONS_SQL),
        ),
    )


class ProjectionOffsetRow(Base):
    """Where the projection of one source partition stands: written in the same transaction as the rows."""

    __tablename__ = "projection_offsets"
    source: Mapped[str] = mapped_column(String(255), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    next_offset: Mapped[int] = mapped_column(BigInteger)  # log offset to read next
    next_sequence: Mapped[int] = mapped_column(BigInteger)  # event sequence to apply next


class GpuTotalRow(Base):
    """Nodes, capacity, allocation and running pods per cluster and GPU model, now (the utilization query)."""

    __tablename__ = "gpu_totals"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    gpu_model: Mapped[str] = mapped_column(String(64), primary_key=True)  # '' for CPU-only nodes
    nodes: Mapped[int] = mapped_column(Integer)
    capacity_milli: Mapped[int] = mapped_column(BigInteger)  # of nodes that have not failed
    allocated_milli: Mapped[int] = mapped_column(BigInteger)
    pods_running: Mapped[int] = mapped_column(Integer)


class ClusterStatsRow(Base):
    """How many pods of a cluster are pending and running now (the pending query's total)."""

    __tablename__ = "cluster_stats"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    pending: Mapped[int] = mapped_column(Integer)
    running: Mapped[int] = mapped_column(Integer)


class UtilizationRow(Base):
    """Allocated vs capacity GPU milli per cluster and model, as it stood at the end of each minute."""

    __tablename__ = "utilization"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    gpu_model: Mapped[str] = mapped_column(String(64), primary_key=True)
    minute: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # epoch ms, minute-aligned
    allocated_milli: Mapped[int] = mapped_column(BigInteger)
    capacity_milli: Mapped[int] = mapped_column(BigInteger)


class UsageClockRow(Base):
    """A cluster's event-time watermark and the hour up to which its usage is sealed."""

    __tablename__ = "usage_clocks"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    watermark: Mapped[int] = mapped_column(BigInteger)  # max occurred_at seen
    sealed_until: Mapped[int] = mapped_column(BigInteger)  # hours before this are sealed


class TenantRateRow(Base):
    """GPU milli a tenant runs now, and the event time up to which it is credited."""

    __tablename__ = "tenant_rates"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(ID, primary_key=True)
    running_milli: Mapped[int] = mapped_column(BigInteger)
    since: Mapped[int] = mapped_column(BigInteger)


class UsageHourRow(Base):
    """One hour of a cluster: open until the watermark passes its end plus the lateness allowance."""

    __tablename__ = "usage_hours"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    hour: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    status: Mapped[str] = mapped_column(String(8))  # open | sealed
    sealed_watermark: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class TenantUsageRow(Base):
    """GPU usage of a tenant in one hour of event time; never changes once sealed."""

    __tablename__ = "tenant_usage"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(ID, primary_key=True)
    hour: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    gpu_milli_ms: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(8))  # open | sealed

    __table_args__ = (Index("ix_tenant_usage_hour", "hour"),)


class UsageAdjustmentRow(Base):
    """Usage that arrived for an hour after it was sealed, keyed by the event that revealed it."""

    __tablename__ = "usage_adjustments"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(ID, primary_key=True)
    hour: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    sequence: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    gpu_milli_ms: Mapped[int] = mapped_column(BigInteger)


class TenantUsageSpanRow(Base):
    """A run of more than a day of whole sealed hours in which a tenant's rate did not change.

    Written instead of one ``tenant_usage`` row per hour, so a gap in event time (a far-future
    ``issued_at``) costs one row per running tenant, not one per hour. Each hour of
    ``[start_hour, start_hour + hours * 1 h)`` used ``gpu_milli_ms_per_hour``; sealed when written.
    """

    __tablename__ = "tenant_usage_spans"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(ID, primary_key=True)
    start_hour: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    hours: Mapped[int] = mapped_column(BigInteger)
    gpu_milli_ms_per_hour: Mapped[int] = mapped_column(BigInteger)


class UsageAdjustmentSpanRow(Base):
    """A late event's correction over more than a day of sealed hours, as one row (see ``usage_adjustments``)."""

    __tablename__ = "usage_adjustment_spans"
    cluster: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str] = mapped_column(ID, primary_key=True)
    start_hour: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    sequence: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    hours: Mapped[int] = mapped_column(BigInteger)
    gpu_milli_ms_per_hour: Mapped[int] = mapped_column(BigInteger)


nodes: Table = cast(Table, NodeRow.__table__)
pods: Table = cast(Table, PodRow.__table__)
gangs: Table = cast(Table, GangRow.__table__)
reservations: Table = cast(Table, ReservationRow.__table__)
disruption_budgets: Table = cast(Table, DisruptionBudgetRow.__table__)
allocations: Table = cast(Table, AllocationRow.__table__)
audit_events: Table = cast(Table, AuditEventRow.__table__)
projection_offsets: Table = cast(Table, ProjectionOffsetRow.__table__)
gpu_totals: Table = cast(Table, GpuTotalRow.__table__)
cluster_stats: Table = cast(Table, ClusterStatsRow.__table__)
utilization: Table = cast(Table, UtilizationRow.__table__)
usage_clocks: Table = cast(Table, UsageClockRow.__table__)
tenant_rates: Table = cast(Table, TenantRateRow.__table__)
usage_hours: Table = cast(Table, UsageHourRow.__table__)
tenant_usage: Table = cast(Table, TenantUsageRow.__table__)
usage_adjustments: Table = cast(Table, UsageAdjustmentRow.__table__)
tenant_usage_spans: Table = cast(Table, TenantUsageSpanRow.__table__)
usage_adjustment_spans: Table = cast(Table, UsageAdjustmentSpanRow.__table__)

TABLES = tuple(Base.metadata.sorted_tables)
