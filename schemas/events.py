"""Events: what the fold decided (past-tense names), one record per ``schemas/event.avsc`` branch.

``Event`` is the envelope: position (partition, sequence), the causing command
(id and log offset) and ``occurred_at``, the causing command's ``issued_at``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.commands import AFTER_OK, PREEMPT_LOWER, CohortQuota, Quota, Retry, Taint, Toleration
from schemas.records import Record, nest


@dataclass(slots=True)
class PodSpec(Record):
    """A pod as accepted by the fold; ``arrival`` orders pods FIFO within a priority."""

    pod_id: str
    tenant: str
    priority: int
    num_gpu: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    gpu_models: tuple[str, ...]
    node_selector: dict[str, str]
    tolerations: tuple[Toleration, ...]
    submitted_at: int
    arrival: int
    gang_id: str | None = None
    time_limit_ms: int | None = None
    depends_on: tuple[str, ...] = ()
    dependency: str = AFTER_OK
    preemption: str = PREEMPT_LOWER
    movable: bool = False
    gpu_memory_mib: int = 0
    retry: Retry | None = None
    preemptible: bool = True  # contract v4: False: never a victim
    role: str | None = None  # contract v4: a gang member's role (SubmitGang member role)

    @property
    def gpu_milli_total(self) -> int:
        """GPU milli the pod holds in all: 1000 per whole GPU, or its share."""
        return self.num_gpu * self.gpu_milli

    def __hash__(self) -> int:  # node_selector is a dict; pods are keyed by id
        return hash(self.pod_id)


@dataclass(slots=True)
class GpuShare(Record):
    index: int
    milli: int


@dataclass(slots=True)
class GangSpec(Record):
    """A gang as accepted by the fold: its members are pod specs with ``gang_id`` set."""

    gang_id: str
    tenant: str
    priority: int
    members: tuple[PodSpec, ...]
    min_members: int
    topology_required: str | None
    topology_preferred: str | None
    timeout_ms: int | None
    time_limit_ms: int | None
    depends_on: tuple[str, ...]
    dependency: str
    submitted_at: int
    arrival: int
    preemption: str = PREEMPT_LOWER
    retry: Retry | None = None
    queued_at: int | None = None  # contract v4: the last requeue of a gang that ran (its timeout counts from it)
    preemptible: bool = True  # contract v4: False: no member is ever a victim
    disruption: str = "all"  # contract v4: all or above_min (SubmitGang.disruption)
    min_members_per_role: dict[str, int] = field(default_factory=dict)  # contract v4: role -> minimum running

    @property
    def waiting_since(self) -> int:
        """Where the gang's ``timeout_ms`` counts from: its last requeue, else its submission."""
        return self.submitted_at if self.queued_at is None else self.queued_at

    def __hash__(self) -> int:  # specs hold dicts; gangs are keyed by id
        return hash(self.gang_id)


@dataclass(slots=True)
class MemberPlacement(Record):
    pod_id: str
    node_id: str
    gpus: tuple[GpuShare, ...]


@dataclass(slots=True)
class QueueReason(Record):
    code: str
    nodes: int
    message: str = ""


@dataclass(slots=True)
class NodeAdded(Record):
    node_id: str
    gpu_model: str
    gpu_count: int
    cpu_milli: int
    memory_mib: int
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    gpu_memory_mib: int = 0


@dataclass(slots=True)
class NodeRemoved(Record):
    node_id: str
    forced: bool


@dataclass(slots=True)
class NodeCordoned(Record):
    node_id: str


@dataclass(slots=True)
class NodeUncordoned(Record):
    node_id: str


@dataclass(slots=True)
class NodeDrained(Record):
    node_id: str
    evicted: int


@dataclass(slots=True)
class NodeFailed(Record):
    node_id: str
    reason: str
    evicted: int


@dataclass(slots=True)
class PodQueued(Record):
    pod: PodSpec
    reasons: tuple[QueueReason, ...]
    requeued: bool = False
    waiting_for: tuple[str, ...] = ()


@dataclass(slots=True)
class PodScheduled(Record):
    pod: PodSpec
    node_id: str
    gpus: tuple[GpuShare, ...]
    policy: str
    from_queue: bool = False
    scores: dict[str, float] = field(default_factory=dict)
    preempted: tuple[str, ...] = ()


@dataclass(slots=True)
class PodEvicted(Record):
    pod_id: str
    node_id: str
    reason: str


@dataclass(slots=True)
class PodReleased(Record):
    pod_id: str
    node_id: str | None
    reason: str


@dataclass(slots=True)
class PolicyChanged(Record):
    """The cluster's settings changed (the placement policy; reservation wait and queue order if set)."""

    policy: str
    previous: str
    reserve_after_ms: int | None = None
    queue_order: str = ""
    max_clock_jump_ms: int | None = None


@dataclass(slots=True)
class CommandRejected(Record):
    command_id: str
    command_type: str
    code: str
    message: str


@dataclass(slots=True)
class GangQueued(Record):
    gang_id: str
    reasons: tuple[QueueReason, ...]
    gang: GangSpec
    requeued: bool = False
    waiting_for: tuple[str, ...] = ()


@dataclass(slots=True)
class GangScheduled(Record):
    """Every placed member, in one outcome; the members' ``PodScheduled`` events follow in the same command."""

    gang_id: str
    members: tuple[MemberPlacement, ...]
    gang: GangSpec
    topology_key: str | None = None
    domain: str | None = None
    from_queue: bool = False
    message: str = ""
    preempted: tuple[str, ...] = ()


@dataclass(slots=True)
class GangTimedOut(Record):
    gang_id: str
    waited_ms: int
    message: str = ""


@dataclass(slots=True)
class GangReleased(Record):
    """The gang ended; ``ok`` only for a normal end (what ``afterok`` dependants wait for)."""

    gang_id: str
    reason: str
    ok: bool = False
    members_ended: tuple[str, ...] = ()  # contract v4: members of a gang that ended while not running


@dataclass(slots=True)
class PodTimeLimitReached(Record):
    pod_id: str
    node_id: str
    time_limit_ms: int
    gang_id: str | None = None


@dataclass(slots=True)
class NodesReserved(Record):
    holder_id: str
    holder_kind: str  # "pod" or "gang"
    nodes: tuple[str, ...]
    expected_start: int | None = None
    message: str = ""


@dataclass(slots=True)
class ReservationReleased(Record):
    holder_id: str
    holder_kind: str
    nodes: tuple[str, ...]
    reason: str
    message: str = ""


@dataclass(slots=True)
class DependencyFailed(Record):
    holder_id: str
    holder_kind: str
    dependency_id: str
    message: str = ""


@dataclass(slots=True)
class Ticked(Record):
    """Event time advanced to ``clock``: the event's cluster's, or (``partition``) every cluster's of the partition."""

    clock: int
    partition: bool = False


@dataclass(slots=True)
class PodPreempted(Record):
    """A running pod was preempted ``by`` a pod or gang: for ``priority``, or to ``reclaim`` a lender's quota.

    It explains the ``PodEvicted`` that follows (the victim goes back to the queue)."""

    pod_id: str
    node_id: str
    by: str
    reason: str  # "priority" or "reclaim"
    message: str = ""


@dataclass(slots=True)
class QuotaChanged(Record):
    """A tenant's quota was set (``quota``) or removed (None); ``tenant`` None: the cluster's default."""

    tenant: str | None
    quota: Quota | None
    previous: Quota | None = None
    message: str = ""


@dataclass(slots=True)
class CohortChanged(Record):
    """A cohort of the cohort tree was declared or changed (``spec``) or forgotten (None); contract v4."""

    cohort: str
    spec: CohortQuota | None
    previous: CohortQuota | None = None
    message: str = ""


@dataclass(slots=True)
class PodMigrated(Record):
    """A running pod moved from one node to another in one step (never on both, never on neither)."""

    pod_id: str
    from_node: str
    from_gpus: tuple[GpuShare, ...]
    to_node: str
    to_gpus: tuple[GpuShare, ...]
    reason: str = "defragment"
    message: str = ""


@dataclass(slots=True)
class DefragmentationPlanned(Record):
    """What a ``Defragment`` decided: how many moves follow, and the whole GPUs and nodes they free."""

    moves: int
    gpus_freed: int
    nodes_freed: int = 0
    target: str | None = None
    message: str = ""


@dataclass(slots=True)
class ClusterHalted(Record):
    """The fold raised on a command of ``cluster``: it is halted (its commands refused with ``CLUSTER_HALTED``)
    while the partition's other clusters go on; the command's events for it were not published."""

    cluster: str
    command_id: str
    error: str
    message: str = ""


@dataclass(slots=True)
class ClusterResumed(Record):
    """A halted cluster folds again, from its state before the halting command (re-folded from ``refolded_from``)."""

    cluster: str
    halted_command_id: str
    halted_offset: int
    refolded_from: int
    message: str = ""


@dataclass(slots=True)
class NodeRecovered(Record):
    """A failed node is back: empty, schedulable, with its capacity, labels and taints."""

    node_id: str


@dataclass(slots=True)
class NodeUpdated(Record):
    """A node's labels and taints are now these; ``evicting`` pods that do not tolerate a NoExecute taint follow."""

    node_id: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    evicting: int = 0


@dataclass(slots=True)
class PodRetryScheduled(Record):
    """A failed pod with retries left stops now and goes back to placement at ``not_before`` (its ``attempt``-th
    retry). ``gang_id``: the failed pod is a member of this gang, which stops whole and is retried (its attempt)."""

    pod_id: str
    attempt: int
    not_before: int
    gang_id: str | None = None


@dataclass(slots=True)
class DisruptionBudgetSet(Record):
    budget_id: str
    tenant: str | None = None
    gang_id: str | None = None
    label_selector: dict[str, str] | None = None
    max_unavailable: int = 0


@dataclass(slots=True)
class DisruptionBudgetRemoved(Record):
    budget_id: str


@dataclass(slots=True)
class EvictionBlocked(Record):
    """A drain may not evict the pod now (its budget has no room); it is evicted when the budget frees."""

    pod_id: str
    node_id: str
    budget_id: str
    grace_ms: int = 0
    reason: str = "drain"


@dataclass(slots=True)
class PodEvictionScheduled(Record):
    """A drain evicts the pod at ``at`` (its grace period); it counts against its budgets from now."""

    pod_id: str
    node_id: str
    at: int
    respect_budgets: bool = True


EventPayload = (
    NodeAdded
    | NodeRemoved
    | NodeCordoned
    | NodeUncordoned
    | NodeDrained
    | NodeFailed
    | PodQueued
    | PodScheduled
    | PodEvicted
    | PodReleased
    | PolicyChanged
    | CommandRejected
    | GangQueued
    | GangScheduled
    | GangTimedOut
    | GangReleased
    | PodTimeLimitReached
    | NodesReserved
    | ReservationReleased
    | DependencyFailed
    | Ticked
    | PodPreempted
    | QuotaChanged
    | PodMigrated
    | DefragmentationPlanned
    | ClusterHalted
    | ClusterResumed
    | NodeRecovered
    | NodeUpdated
    | PodRetryScheduled
    | DisruptionBudgetSet
    | DisruptionBudgetRemoved
    | EvictionBlocked
    | PodEvictionScheduled
    | CohortChanged
)

PAYLOAD_TYPES: dict[str, type[Record]] = {
    cls.AVRO_NAME: cls
    for cls in (
        NodeAdded,
        NodeRemoved,
        NodeCordoned,
        NodeUncordoned,
        NodeDrained,
        NodeFailed,
        PodQueued,
        PodScheduled,
        PodEvicted,
        PodReleased,
        PolicyChanged,
        CommandRejected,
        GangQueued,
        GangScheduled,
        GangTimedOut,
        GangReleased,
        PodTimeLimitReached,
        NodesReserved,
        ReservationReleased,
        DependencyFailed,
        Ticked,
        PodPreempted,
        QuotaChanged,
        PodMigrated,
        DefragmentationPlanned,
        ClusterHalted,
        ClusterResumed,
        NodeRecovered,
        NodeUpdated,
        PodRetryScheduled,
        DisruptionBudgetSet,
        DisruptionBudgetRemoved,
        EvictionBlocked,
        PodEvictionScheduled,
        CohortChanged,
    )
}


@dataclass(slots=True)
class Event:
    """The event envelope."""

    partition: int
    sequence: int
    cluster: str
    command_id: str
    command_offset: int
    occurred_at: int
    payload: EventPayload

    @property
    def type_name(self) -> str:
        return type(self.payload).__name__

    def to_avro(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "sequence": self.sequence,
            "cluster": self.cluster,
            "command_id": self.command_id,
            "command_offset": self.command_offset,
            "occurred_at": self.occurred_at,
            "payload": (self.payload.AVRO_NAME, self.payload.to_avro()),
        }

    @classmethod
    def from_avro(cls, data: dict[str, Any]) -> Event:
        name, body = data["payload"]
        payload = PAYLOAD_TYPES[name].from_avro(body)
        return cls(
            data["partition"],
            data["sequence"],
            data["cluster"],
            data["command_id"],
            data["command_offset"],
            data["occurred_at"],
            payload,  # type: ignore[arg-type]
        )


# The record-valued fields of each record, for from_avro: kept outside the class bodies, where the
# compiled (mypyc) dataclasses would take them for fields.
nest(PodSpec, {"tolerations": Toleration, "retry": Retry})
nest(GangSpec, {"members": PodSpec, "retry": Retry})
nest(MemberPlacement, {"gpus": GpuShare})
nest(NodeAdded, {"taints": Taint})
nest(NodeUpdated, {"taints": Taint})
nest(PodQueued, {"pod": PodSpec, "reasons": QueueReason})
nest(PodScheduled, {"pod": PodSpec, "gpus": GpuShare})
nest(GangQueued, {"reasons": QueueReason, "gang": GangSpec})
nest(GangScheduled, {"members": MemberPlacement, "gang": GangSpec})
nest(QuotaChanged, {"quota": Quota, "previous": Quota})
nest(CohortChanged, {"spec": CohortQuota, "previous": CohortQuota})
nest(PodMigrated, {"from_gpus": GpuShare, "to_gpus": GpuShare})
