"""The snapshot records of ``snapshot.avsc``: a partition's whole fold state, as plain data.

The fold builds a :class:`Snapshot` from its state and
restores from one; readers that only want to look (``gpufold state``, a replica) can
decode it without the fold. Lists are sorted by id, so equal states encode to equal bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.codec import SNAPSHOT, registry
from schemas.commands import DEFAULT_MAX_CLOCK_JUMP_MS, DEFAULT_RESERVE_AFTER_MS, SKIP_AHEAD, CohortQuota, Quota, Taint
from schemas.events import GangSpec, GpuShare, PodSpec
from schemas.records import Record, nest


@dataclass(slots=True)
class NodeSnapshot(Record):
    node_id: str
    gpu_model: str
    gpu_count: int
    cpu_milli: int
    memory_mib: int
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    cordoned: bool = False
    failed: bool = False
    gpu_memory_mib: int = 0


@dataclass(slots=True)
class PodSnapshot(Record):
    """A present pod: queued (``node_id`` None) or running on ``node_id`` with ``gpus``."""

    pod: PodSpec
    node_id: str | None = None
    gpus: tuple[GpuShare, ...] = ()
    started_at: int | None = None
    waiting_for: tuple[str, ...] = ()
    attempt: int = 0
    retry_at: int | None = None
    evicting_at: int | None = None


@dataclass(slots=True)
class TypicalPodSnapshot(Record):
    """One FGD typical pod learned by the fold (``schemas.fragmentation``)."""

    num_gpu: int
    gpu_milli: int
    cpu_milli: int
    gpu_models: tuple[str, ...]
    weight: float


@dataclass(slots=True)
class GangSnapshot(Record):
    """A gang the fold knows: ``state`` is waiting (for dependencies), queued, running or retrying (after a
    failure, until ``retry_at``)."""

    gang: GangSpec
    state: str
    placed: tuple[str, ...] = ()
    topology_key: str | None = None
    domain: str | None = None
    started_at: int | None = None
    waiting_for: tuple[str, ...] = ()
    ok: bool = True
    attempt: int = 0
    retry_at: int | None = None


@dataclass(slots=True)
class EndedJob(Record):
    job_id: str
    ok: bool


@dataclass(slots=True)
class ReservationSnapshot(Record):
    holder_id: str
    holder_kind: str
    nodes: tuple[str, ...]
    expected_start: int | None
    made_at: int


@dataclass(slots=True)
class TenantQuota(Record):
    tenant: str
    quota: Quota


@dataclass(slots=True)
class HaltSnapshot(Record):
    """Why a cluster is halted: the command whose fold raised, its offset, the error."""

    command_id: str
    offset: int
    error: str
    refused: int = 0


@dataclass(slots=True)
class BudgetSnapshot(Record):
    budget_id: str
    tenant: str | None = None
    gang_id: str | None = None
    label_selector: dict[str, str] | None = None
    max_unavailable: int = 0


@dataclass(slots=True)
class DrainSnapshot(Record):
    node_id: str
    grace_ms: int = 0
    respect_budgets: bool = True


@dataclass(slots=True)
class PreemptCheck(Record):
    at: int
    node_id: str


@dataclass(slots=True)
class ClusterSnapshot(Record):
    cluster: str
    policy: str
    arrivals: int
    nodes: tuple[NodeSnapshot, ...] = ()
    pods: tuple[PodSnapshot, ...] = ()
    typical_pods: tuple[TypicalPodSnapshot, ...] = ()
    reserve_after_ms: int = DEFAULT_RESERVE_AFTER_MS
    queue_order: str = SKIP_AHEAD
    gangs: tuple[GangSnapshot, ...] = ()
    ended: tuple[EndedJob, ...] = ()
    reservation: ReservationSnapshot | None = None
    quotas: tuple[TenantQuota, ...] = ()
    default_quota: Quota | None = None
    reserve_checks: tuple[int, ...] = ()
    clock: int = -1  # -1: written before clusters had clocks (contract v2): the partition's clock
    max_clock_jump_ms: int = DEFAULT_MAX_CLOCK_JUMP_MS
    halted: HaltSnapshot | None = None
    budgets: tuple[BudgetSnapshot, ...] = ()
    draining: tuple[DrainSnapshot, ...] = ()
    blocked: dict[str, str] = field(default_factory=dict)
    disrupted: tuple[str, ...] = ()
    preempt_checks: tuple[PreemptCheck, ...] = ()
    cohorts: tuple[CohortQuota, ...] = ()  # contract v4: SetCohort, sorted by name


@dataclass(slots=True)
class Snapshot(Record):
    """The fold state of one partition after the command at ``next_offset - 1``."""

    partition: int
    next_offset: int
    sequence: int
    seen_window: int
    seen: tuple[str, ...] = ()
    clusters: tuple[ClusterSnapshot, ...] = ()
    clock: int = 0


def encode_snapshot(snapshot: Snapshot) -> bytes:
    """The single-object frame of a snapshot."""
    return registry().codec(SNAPSHOT).encode(snapshot.to_avro())


def encode_snapshot_body(snapshot: Snapshot) -> bytes:
    """The Avro body alone (no header): what ``state_hash`` digests."""
    return registry().codec(SNAPSHOT).encode_body(snapshot.to_avro())


def decode_snapshot(frame: bytes) -> Snapshot:
    """A snapshot from its frame (older writer schemas resolved); raises ``DecodeError`` if malformed."""
    return Snapshot.from_avro(registry().codec(SNAPSHOT).decode(frame))


# The record-valued fields of each record, for from_avro: kept outside the class bodies, where the
# compiled (mypyc) dataclasses would take them for fields.
nest(NodeSnapshot, {"taints": Taint})
nest(PodSnapshot, {"pod": PodSpec, "gpus": GpuShare})
nest(GangSnapshot, {"gang": GangSpec})
nest(TenantQuota, {"quota": Quota})
nest(
    ClusterSnapshot,
    {
        "nodes": NodeSnapshot,
        "pods": PodSnapshot,
        "typical_pods": TypicalPodSnapshot,
        "gangs": GangSnapshot,
        "ended": EndedJob,
        "reservation": ReservationSnapshot,
        "quotas": TenantQuota,
        "default_quota": Quota,
        "halted": HaltSnapshot,
        "budgets": BudgetSnapshot,
        "draining": DrainSnapshot,
        "preempt_checks": PreemptCheck,
        "cohorts": CohortQuota,
    },
)
nest(Snapshot, {"clusters": ClusterSnapshot})
