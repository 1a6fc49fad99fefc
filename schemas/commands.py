"""Commands: what services ask the scheduler to do (imperative names).

Each payload class maps onto a record of ``schemas/command.avsc``; ``Command``
is the envelope. The fold reads time only from ``Command.issued_at``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.records import Record, nest

GPU_MILLI = 1000
"""Milli per GPU: a whole GPU is 1000, a share is 1-999."""
AFTER_OK = "afterok"
"""A dependant starts only after its dependencies were released normally (not timed out, failed or cancelled)."""
AFTER_ANY = "afterany"
"""A dependant starts after its dependencies ended in any way."""
DEPENDENCY_TYPES = (AFTER_OK, AFTER_ANY)
SKIP_AHEAD = "skip-ahead"
"""Queue order: work that fits may start while an earlier, larger job waits (within a reservation's rules)."""
STRICT_FIFO = "strict-fifo"
"""Queue order: nothing starts before every job ahead of it (priority, then age) has started."""
QUEUE_ORDERS = (SKIP_AHEAD, STRICT_FIFO)
DEFAULT_RESERVE_AFTER_MS = 300_000
DEFAULT_MAX_CLOCK_JUMP_MS = 86_400_000
"""How far ahead of its cluster's clock a command may be dated (24 h) unless SetPolicy says otherwise (0: no limit)."""
"""A job at the head of the queue that has waited this long (event time) gets nodes reserved."""
PREEMPT_LOWER = "lower_priority"
"""A pod or gang that fits nowhere may preempt pods of strictly lower priority (the default)."""
PREEMPT_NEVER = "never"
"""It waits instead (what every pod of contract v1 does)."""
PREEMPT_LOWER_OR_NEWER = "lower_or_newer_equal_priority"
"""Contract v4: also pods of equal priority submitted after it (Kueue's ``LowerOrNewerEqualPriority``)."""
PREEMPTION_MODES = (PREEMPT_LOWER, PREEMPT_NEVER, PREEMPT_LOWER_OR_NEWER)
PREEMPTION_MODES_V3 = (PREEMPT_LOWER, PREEMPT_NEVER)
DISRUPT_ALL = "all"
"""A gang member chosen as a victim takes its whole gang (the default)."""
DISRUPT_ABOVE_MIN = "above_min"
"""Contract v4: members above ``min_members`` may be preempted, drained or lost to a failure one by one; the gang runs
on and each waits again as its member."""
DISRUPTION_MODES = (DISRUPT_ALL, DISRUPT_ABOVE_MIN)
"""The modes contracts v1 to v3 accepted (a command of theirs with another is refused, as it was)."""
PREEMPTING = (PREEMPT_LOWER, PREEMPT_LOWER_OR_NEWER)
"""The modes that preempt."""
ANY_MODEL = "*"
"""In a quota's ``nominal_gpus``: the GPUs of every model the quota does not name."""


@dataclass(slots=True, frozen=True, order=True)
class Taint(Record):
    """A node taint; effects NoSchedule and NoExecute keep untolerating pods off the node.

    Ordered because node signatures (which hold taints) are sorted to iterate the capacity index.
    """

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(slots=True, frozen=True)
class Toleration(Record):
    """A pod toleration with Kubernetes semantics (Equal/Exists; empty effect = any)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return self.key == "" or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


WITHIN_NEVER = "never"
WITHIN_LOWER = "lower_priority"
WITHIN_LOWER_OR_NEWER = "lower_or_newer_equal_priority"
WITHIN_TENANT_MODES = (WITHIN_NEVER, WITHIN_LOWER, WITHIN_LOWER_OR_NEWER)
RECLAIM_ANY = "any"
RECLAIM_LOWER = "lower_priority"
RECLAIM_NEVER = "never"
RECLAIM_MODES = (RECLAIM_ANY, RECLAIM_LOWER, RECLAIM_NEVER)
BORROW_NEVER = "never"
BORROW_LOWER = "lower_priority"
BORROW_MODES = (BORROW_NEVER, BORROW_LOWER)


@dataclass(slots=True, frozen=True)
class QuotaPreemption(Record):
    """Whom a tenant's work may preempt (contract v4; Kueue's ClusterQueue ``preemption``).

    ``within_tenant`` (Kueue's ``withinClusterQueue``): a pod that does not fit its tenant's quota may preempt
    the tenant's own lower-priority (or also newer equal-priority) work. ``reclaim_within_cohort``
    (``reclaimWithinCohort``): which borrowers' pods a lender reclaims from: any, lower priority only, none.
    ``borrow_within_cohort`` (``borrowWithinCohort``): a pod that must borrow may preempt other cohort tenants'
    lower-priority pods, also those inside their nominal quota, of at most ``borrow_max_victim_priority``.
    """

    within_tenant: str = WITHIN_NEVER
    reclaim_within_cohort: str = RECLAIM_ANY
    borrow_within_cohort: str = BORROW_NEVER
    borrow_max_victim_priority: int | None = None


DEFAULT_QUOTA_PREEMPTION = QuotaPreemption()


@dataclass(slots=True)
class Quota(Record):
    """A tenant's quota (``SetQuota`` without the tenant), also the cluster's default (``SetPolicy``).

    ``nominal_gpus``: whole GPUs per model, ``"*"`` for the models it does not name
    (an empty map: GPUs are not limited); CPU and memory ``None``: not limited.
    Borrowing and lending limits are GPUs per model key (``None``: no limit).
    """

    cohort: str | None = None
    nominal_gpus: dict[str, int] = field(default_factory=dict)
    nominal_cpu_milli: int | None = None
    nominal_memory_mib: int | None = None
    borrowing_limit_gpus: int | None = None
    lending_limit_gpus: int | None = None
    weight: int = 1
    preemption: QuotaPreemption | None = None  # contract v4; None: DEFAULT_QUOTA_PREEMPTION

    @property
    def policy(self) -> QuotaPreemption:
        """Whom the tenant's work may preempt (the defaults when not set)."""
        return DEFAULT_QUOTA_PREEMPTION if self.preemption is None else self.preemption

    @property
    def limits_nothing(self) -> bool:
        """Whether this quota is the same as none: no limit and the default weight."""
        return (
            not self.nominal_gpus
            and self.nominal_cpu_milli is None
            and self.nominal_memory_mib is None
            and self.cohort is None
            and self.weight == 1
            and self.preemption is None
        )


@dataclass(slots=True, frozen=True)
class Retry(Record):
    """Retries of a pod that fails: at most ``max_retries``, the n-th after ``backoff_ms`` * 2^(n-1), capped at
    ``backoff_max_ms`` (event time)."""

    max_retries: int = 0
    backoff_ms: int = 10_000
    backoff_max_ms: int = 600_000

    def delay_ms(self, attempt: int) -> int:
        """The backoff before the ``attempt``-th retry (1-based). O(1)."""
        return min(self.backoff_ms << min(attempt - 1, 62), self.backoff_max_ms)


@dataclass(slots=True)
class AddNode(Record):
    node_id: str
    cpu_milli: int
    memory_mib: int
    gpu_model: str = ""
    gpu_count: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    gpu_memory_mib: int = 0


@dataclass(slots=True)
class RemoveNode(Record):
    node_id: str
    force: bool = False


@dataclass(slots=True)
class CordonNode(Record):
    node_id: str


@dataclass(slots=True)
class UncordonNode(Record):
    node_id: str


@dataclass(slots=True)
class DrainNode(Record):
    """Cordon the node and evict its pods: after ``grace_ms`` each, as the disruption budgets allow."""

    node_id: str
    grace_ms: int = 0
    respect_budgets: bool = True


@dataclass(slots=True)
class MarkNodeFailed(Record):
    node_id: str
    reason: str = ""


@dataclass(slots=True)
class SubmitPod(Record):
    """A pod asks for num_gpu whole GPUs (gpu_milli = 1000), one GPU share
    (num_gpu = 1, 0 < gpu_milli < 1000) or no GPU (both 0)."""

    pod_id: str
    tenant: str = "default"
    priority: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: tuple[str, ...] = ()
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    time_limit_ms: int | None = None
    depends_on: tuple[str, ...] = ()
    dependency: str = AFTER_OK
    preemption: str = PREEMPT_LOWER
    movable: bool = False
    gpu_memory_mib: int = 0
    retry: Retry | None = None
    preemptible: bool = True  # contract v4: False: never a victim


@dataclass(slots=True)
class Release(Record):
    """The pod finished or was cancelled (queued pods can be released too)."""

    pod_id: str
    reason: str = "completed"


@dataclass(slots=True)
class SetPolicy(Record):
    """Cluster settings; a field left at its default keeps the current value.

    ``reserve_after_ms``: reserve nodes for the head of the queue once it has waited
    this long (negative: no reservations). ``queue_order``: ``skip-ahead`` or ``strict-fifo``.
    ``default_quota``: the quota of tenants without their own (one that limits nothing: none).
    ``max_clock_jump_ms``: a command dated further ahead of the cluster's clock is refused (0: no limit).
    """

    policy: str = ""
    reserve_after_ms: int | None = None
    queue_order: str = ""
    default_quota: Quota | None = None
    max_clock_jump_ms: int | None = None


@dataclass(slots=True)
class GangMember(Record):
    """One pod of a gang: the resource fields of :class:`SubmitPod` (tenant, priority and time are the gang's)."""

    pod_id: str
    num_gpu: int = 0
    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: tuple[str, ...] = ()
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    role: str | None = None  # contract v4: for SubmitGang.min_members_per_role


@dataclass(slots=True)
class SubmitGang(Record):
    """Pods that start together, at least ``min_members`` of them (default: all), or not at all.

    ``topology_required`` (a node label key) keeps every member on nodes with one value
    of it; ``topology_preferred`` tries that domain first and falls back to wider ones.
    ``min_members_per_role`` (contract v4, Volcano's ``minTaskMember``): per member ``role``, how many
    of that role must run too; the minimums sum to at most ``min_members``.
    """

    gang_id: str
    tenant: str = "default"
    priority: int = 0
    members: tuple[GangMember, ...] = ()
    min_members: int | None = None
    topology_required: str | None = None
    topology_preferred: str | None = None
    timeout_ms: int | None = None
    time_limit_ms: int | None = None
    depends_on: tuple[str, ...] = ()
    dependency: str = AFTER_OK
    preemption: str = PREEMPT_LOWER
    retry: Retry | None = None
    preemptible: bool = True  # contract v4: False: no member is ever a victim
    disruption: str = "all"  # contract v4: DISRUPTION_MODES
    min_members_per_role: dict[str, int] = field(default_factory=dict)  # contract v4: role -> minimum running


@dataclass(slots=True)
class ReleaseGang(Record):
    """Release every member of a gang (or take a waiting gang out of the queue)."""

    gang_id: str
    reason: str = "completed"


@dataclass(slots=True)
class Tick(Record):
    """Advances event time when no other command does, so timeouts and time limits fire.

    ``force``: accept a jump further ahead than the cluster's ``max_clock_jump_ms`` (trace replays).
    ``partition``: advance every cluster of the partition (what the processor's own ticks do).
    """

    force: bool = False
    partition: bool = False


MAX_COHORT_DEPTH = 8
"""Contract v4: the most cohorts on one path from a root of the cohort tree down (SetCohort beyond: COHORT_TOO_DEEP)."""


@dataclass(slots=True, frozen=True)
class CohortQuota(Record):
    """A cohort of the cohort tree (contract v4, ``SetCohort``; Kueue's hierarchical cohorts).

    ``parent``: None for a root. ``nominal_gpus`` (whole GPUs per model key, ``"*"`` for the models not named),
    ``nominal_cpu_milli`` and ``nominal_memory_mib``: the cohort's own quota, which its subtree may borrow.
    ``lending_limit_gpus``: the most of its subtree's quota it lends to its parent (the rest is kept for the
    subtree); ``borrowing_limit_gpus``: the most its subtree may use beyond its subtree's quota, from the parent.
    Both per GPU model key; None: no limit.
    """

    cohort: str
    parent: str | None = None
    nominal_gpus: dict[str, int] = field(default_factory=dict)
    nominal_cpu_milli: int | None = None
    nominal_memory_mib: int | None = None
    borrowing_limit_gpus: int | None = None
    lending_limit_gpus: int | None = None


@dataclass(slots=True)
class SetCohort(Record):
    """Declare or change a cohort of the cohort tree (contract v4): the fields of :class:`CohortQuota`."""

    cohort: str
    parent: str | None = None
    nominal_gpus: dict[str, int] = field(default_factory=dict)
    nominal_cpu_milli: int | None = None
    nominal_memory_mib: int | None = None
    borrowing_limit_gpus: int | None = None
    lending_limit_gpus: int | None = None

    def spec(self) -> CohortQuota:
        return CohortQuota(
            self.cohort,
            self.parent,
            dict(sorted(self.nominal_gpus.items())),
            self.nominal_cpu_milli,
            self.nominal_memory_mib,
            self.borrowing_limit_gpus,
            self.lending_limit_gpus,
        )


@dataclass(slots=True)
class RemoveCohort(Record):
    """Forget a cohort's declaration (contract v4); refused while cohorts name it as their parent."""

    cohort: str


@dataclass(slots=True)
class SetQuota(Record):
    """Set a tenant's quota (the fields of :class:`Quota`); a tenant without one has the cluster's default."""

    tenant: str
    cohort: str | None = None
    nominal_gpus: dict[str, int] = field(default_factory=dict)
    nominal_cpu_milli: int | None = None
    nominal_memory_mib: int | None = None
    borrowing_limit_gpus: int | None = None
    lending_limit_gpus: int | None = None
    weight: int = 1
    preemption: QuotaPreemption | None = None  # contract v4

    def quota(self) -> Quota:
        return Quota(
            self.cohort,
            dict(sorted(self.nominal_gpus.items())),
            self.nominal_cpu_milli,
            self.nominal_memory_mib,
            self.borrowing_limit_gpus,
            self.lending_limit_gpus,
            self.weight,
            None if self.preemption == DEFAULT_QUOTA_PREEMPTION else self.preemption,
        )


@dataclass(slots=True)
class RemoveQuota(Record):
    """The tenant falls back to the cluster's default quota."""

    tenant: str


@dataclass(slots=True)
class Defragment(Record):
    """Migrate up to ``max_moves`` running movable pods to free whole GPUs, or to make room for ``target``."""

    max_moves: int
    target: str | None = None


@dataclass(slots=True)
class ResumeCluster(Record):
    """Fold again for a cluster halted by an internal error, from its state before the halting command."""

    reason: str = ""


@dataclass(slots=True)
class RecoverNode(Record):
    """A failed node returns, empty and schedulable, with its capacity, labels and taints."""

    node_id: str


@dataclass(slots=True)
class UpdateNode(Record):
    """Replace a node's labels and/or taints (None: keep them); a NoExecute taint evicts the pods that do not
    tolerate it."""

    node_id: str
    labels: dict[str, str] | None = None
    taints: tuple[Taint, ...] | None = None


@dataclass(slots=True)
class SetDisruptionBudget(Record):
    """At most ``max_unavailable`` matching pods unavailable by a voluntary disruption at once."""

    budget_id: str
    tenant: str | None = None
    gang_id: str | None = None
    label_selector: dict[str, str] | None = None
    max_unavailable: int = 0


@dataclass(slots=True)
class RemoveDisruptionBudget(Record):
    budget_id: str


CommandPayload = (
    AddNode
    | RemoveNode
    | CordonNode
    | UncordonNode
    | DrainNode
    | MarkNodeFailed
    | SubmitPod
    | Release
    | SetPolicy
    | SubmitGang
    | ReleaseGang
    | Tick
    | SetQuota
    | RemoveQuota
    | Defragment
    | ResumeCluster
    | RecoverNode
    | UpdateNode
    | SetDisruptionBudget
    | RemoveDisruptionBudget
    | SetCohort
    | RemoveCohort
)

PAYLOAD_TYPES: dict[str, type[Record]] = {
    cls.AVRO_NAME: cls
    for cls in (
        AddNode,
        RemoveNode,
        CordonNode,
        UncordonNode,
        DrainNode,
        MarkNodeFailed,
        SubmitPod,
        Release,
        SetPolicy,
        SubmitGang,
        ReleaseGang,
        Tick,
        SetQuota,
        RemoveQuota,
        Defragment,
        ResumeCluster,
        RecoverNode,
        UpdateNode,
        SetDisruptionBudget,
        RemoveDisruptionBudget,
        SetCohort,
        RemoveCohort,
    )
}


@dataclass(slots=True)
class Command:
    """The command envelope: idempotency key, partition key, event time, sender, payload.

    ``contract`` names the contract version whose semantics the command keeps: "" for
    today's; a command decoded from a frame written with contract v1 is a
    :class:`V1Command` (see there).
    """

    command_id: str
    cluster: str
    issued_at: int
    payload: CommandPayload
    source: str = ""

    @property
    def contract(self) -> str:  # a property, not a ClassVar: mypyc's dataclasses would take that for a field
        return ""

    @property
    def type_name(self) -> str:
        return type(self.payload).__name__

    def to_avro(self) -> dict[str, Any]:
        return {
            "command_id": self.command_id,
            "cluster": self.cluster,
            "issued_at": self.issued_at,
            "source": self.source,
            "payload": (self.payload.AVRO_NAME, self.payload.to_avro()),
        }

    @classmethod
    def from_avro(cls, data: dict[str, Any]) -> Command:
        name, body = data["payload"]
        payload = PAYLOAD_TYPES[name].from_avro(body)
        return cls(data["command_id"], data["cluster"], data["issued_at"], payload, data["source"])  # type: ignore[arg-type]


@dataclass(slots=True)
class V1Command(Command):
    """A command written by a client of contract v1 (its frame's fingerprint says so).

    It keeps v1's semantics, as Kubernetes applies each API version's own defaults:
    its events are stamped with its own ``issued_at`` (not the partition's clock, if
    it is late), it never makes a reservation (v1 had none), and its pods and gangs
    never preempt (v1 had no preemption). A log written
    entirely with v1 therefore replays to exactly the decisions v1 made.
    """

    @property
    def contract(self) -> str:
        return "v1"


@dataclass(slots=True)
class V2Command(Command):
    """A command written by a client of contract v2 (its frame's fingerprint says so).

    It keeps v2's semantics: event time is the partition's (the largest ``issued_at`` of any cluster on
    it, with no limit on a jump), and a preemptor that would borrow quota may take any lower-priority pod
    (v3 adopts Kueue's rule). A log written entirely with v2 replays to exactly the decisions v2 made.
    """

    @property
    def contract(self) -> str:
        return "v2"


@dataclass(slots=True)
class V3Command(Command):
    """A command written by a client of contract v4 (its frame's fingerprint says so).

    It keeps v3's gang and dependency rules where issue #24 changed them since: members beyond
    ``min_members`` that did not start are dropped (they do not wait as members), a gang under a quota starts
    only whole, a gang reclaims only when capacity is free, its ``timeout_ms`` counts from its submission, a
    dependency binds to the last incarnation of an id, a gang is judged against the nodes present even before
    the first, and fair-share ``weight`` 0 and ``lower_or_newer_equal_priority`` are refused. A log written
    entirely with v3 replays to exactly the decisions v3 made.
    """

    @property
    def contract(self) -> str:
        return "v3"


# The record-valued fields of each record, for from_avro: kept outside the class bodies, where the
# compiled (mypyc) dataclasses would take them for fields.
nest(AddNode, {"taints": Taint})
nest(SubmitPod, {"tolerations": Toleration, "retry": Retry})
nest(SetPolicy, {"default_quota": Quota})
nest(Quota, {"preemption": QuotaPreemption})
nest(SetQuota, {"preemption": QuotaPreemption})
nest(GangMember, {"tolerations": Toleration})
nest(SubmitGang, {"members": GangMember, "retry": Retry})
nest(UpdateNode, {"taints": Taint})
