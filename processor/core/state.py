"""The fold state of one partition: clusters, their nodes, pods, indexes and queue.

One writer owns a ``PartitionState`` and changes it only through
``processor.core.fold.apply``; the indexes are updated in place on each event.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from sortedcontainers import SortedList

from processor.core import cohort_tree, quota_keys
from processor.core.capacity import CapacityIndex
from processor.core.cohort_tree import CohortPool
from processor.core.errors import InvariantViolation
from processor.core.node import NEVER_VICTIM as NEVER_VICTIM
from processor.core.node import Node as Node
from processor.core.node import victim_level as victim_level
from processor.core.pending import PendingQueue, QueueKey
from processor.core.preemption_index import PreemptionIndex
from processor.core.resources import NodeClass, PodShape
from processor.core.timers import Timers
from processor.core.typical import is_checkpoint, typical_key, typical_moved
from schemas.commands import (
    DEFAULT_MAX_CLOCK_JUMP_MS,
    DEFAULT_RESERVE_AFTER_MS,
    SKIP_AHEAD,
    CohortQuota,
    Quota,
)
from schemas.events import DisruptionBudgetSet, GangSpec, GpuShare, PodSpec
from schemas.fragmentation import Typical, TypicalKey, derive_typical

DEFAULT_POLICY = "fgd-plus"
COMPLETED = "completed"  # the Release reason of a normal end: what afterok dependants wait for
EVICTED_MEMBER = "evicted:"  # a member beyond min_members lost its node; the gang runs on without it
DEFAULT_SEEN_WINDOW = 100_000
"""How many recent command ids each partition remembers for idempotency.

A command id repeated within the last 100,000 commands of its partition is
rejected as DUPLICATE_COMMAND; older ids are forgotten (oldest first), which
bounds memory (about 10 MB) and snapshot size. Senders retrying for longer than
that window must use the idempotent producer, which Kafka dedupes itself.
"""
MAX_COMMAND_ID_LENGTH = 253  # longer (invalid, rejected) ids are not remembered
ENDED_WINDOW = 100_000
"""How many ended pods and gangs each cluster remembers for dependencies (oldest forgotten first).

A dependency on an id that ended longer ago than that, or that was never submitted,
waits until a job with that id ends; the window bounds memory and snapshot size."""


@dataclass(slots=True)
class Pod:
    """A pod known to the fold: waiting for dependencies, queued (node_id None) or running (node_id set)."""

    spec: PodSpec
    shape: PodShape
    node_id: str | None = None
    gpus: tuple[GpuShare, ...] = ()
    queued: bool = False  # waiting in the pending queue (an evicted pod is briefly neither)
    started_at: int | None = None  # event time of its (latest) placement
    waiting_for: tuple[str, ...] = ()  # dependencies not ended yet (sorted); the pod is outside the queue
    attempt: int = 0  # retries used after failures (PodRetryScheduled)
    retry_at: int | None = None  # failed, waiting for its retry until then, outside the queue
    evicting_at: int | None = None  # a drain evicts it then (PodEvictionScheduled): it still runs until then

    @property
    def queue_key(self) -> QueueKey:
        return (-self.spec.priority, self.spec.arrival, self.spec.pod_id)

    @property
    def group(self) -> QueueGroup:
        """The pods it waits with in the queue: same tenant, preemption setting and request shape."""
        return (self.spec.tenant, self.spec.preemption, self.shape)

    @property
    def running(self) -> bool:
        return self.node_id is not None


QueueGroup = tuple[str, str, PodShape]
"""Pods of one group are interchangeable for placement, quota and preemption: if the first of a group
(the highest priority, then the oldest) can neither start nor preempt, none of the others can."""


class TenantUsage:
    """What a tenant's running pods hold in one cluster: GPU milli per model, CPU, memory. Derived."""

    __slots__ = ("cpu", "gpu", "memory", "pods")

    def __init__(self) -> None:
        self.gpu: dict[str, int] = {}
        self.cpu = 0
        self.memory = 0
        self.pods = 0

    def add(self, model: str, spec: PodSpec, sign: int) -> None:
        milli = spec.num_gpu * spec.gpu_milli
        if milli:
            self.gpu[model] = self.gpu.get(model, 0) + sign * milli
            if not self.gpu[model]:
                del self.gpu[model]
        self.cpu += sign * spec.cpu_milli
        self.memory += sign * spec.memory_mib
        self.pods += sign

    @property
    def gpu_total(self) -> int:
        return sum(self.gpu.values())


UNINDEXED_AT_MOST = 256
"""Changed nodes left waiting to be filed in the capacity index (``ClusterState.index``) when a command ends
(:meth:`ClusterState.file_waiting`): few enough that the command reading the index next pays a bounded share
(a few ms pure) for changes made before it. Within a command nodes wait unbounded: a gang's trial, its rollback
and its events move each of its nodes several times, and each is filed once."""


def shape_of(spec: PodSpec) -> PodShape:
    return PodShape(
        spec.num_gpu,
        spec.gpu_milli,
        spec.cpu_milli,
        spec.memory_mib,
        tuple(sorted(set(spec.gpu_models))) if spec.gpu_models else (),
        tuple(sorted(spec.node_selector.items())) if spec.node_selector else (),
        spec.tolerations,
        spec.time_limit_ms,
        spec.gpu_memory_mib,
    )


GANG_NEW = "new"  # being created by its first event
GANG_WAITING = "waiting"  # for dependencies
GANG_QUEUED = "queued"
GANG_RUNNING = "running"
GANG_RETRYING = "retrying"  # a member failed and took the gang: it waits, outside the queue, until retry_at


@dataclass(slots=True)
class Gang:
    """A gang the fold knows: waiting for dependencies, queued, running with ``placed`` members, or retrying
    (a member's failure took it; it goes back to placement at ``retry_at``, a timer)."""

    spec: GangSpec
    state: str
    placed: dict[str, None] = field(default_factory=dict)  # running member pod ids, in placement order
    topology_key: str | None = None
    domain: str | None = None
    started_at: int | None = None
    waiting_for: tuple[str, ...] = ()
    ok: bool = True  # every member released so far ended normally
    attempt: int = 0  # retries of the whole gang used after failures (SubmitGang.retry)
    retry_at: int | None = None  # retrying: due then

    @property
    def key(self) -> QueueKey:
        return (-self.spec.priority, self.spec.arrival, self.spec.gang_id)

    @property
    def gang_id(self) -> str:
        return self.spec.gang_id


@dataclass(slots=True)
class Reservation:
    """Nodes held for the head of the queue until it starts (Slurm's backfill reservation)."""

    holder_id: str
    holder_kind: str  # "pod" or "gang"
    nodes: tuple[str, ...]
    expected_start: int | None  # None: some blocking pod has no time limit
    made_at: int


@dataclass(slots=True)
class Halt:
    """Why a cluster is halted: the command whose fold raised (and its offset), and the error."""

    command_id: str
    offset: int
    error: str
    refused: int = 0  # commands for the cluster refused with CLUSTER_HALTED since (health and metrics count them)


@dataclass(slots=True)
class ClusterState:
    """One cluster: nodes, pods, the capacity index and the pending queue."""

    name: str
    policy: str = DEFAULT_POLICY
    arrivals: int = 0  # accepted SubmitPods so far: the next PodSpec.arrival
    nodes: dict[str, Node] = field(default_factory=dict)
    pods: dict[str, Pod] = field(default_factory=dict)
    # The capacity index (read it as ``index``: the nodes changed since the last read are filed first) and those
    # nodes, in the order first changed.
    capacity: CapacityIndex = field(default_factory=CapacityIndex)
    unindexed: dict[str, None] = field(default_factory=dict)
    queue: PendingQueue = field(default_factory=PendingQueue)
    model_nodes: dict[str, int] = field(default_factory=dict)  # GPU model -> nodes present
    gpu_milli_capacity: int = 0  # of nodes that are not failed
    gpu_milli_allocated: int = 0
    # Request shapes of the present (queued or running) pods, derived; and the typical
    # pods learned from it at arrival checkpoints (persisted: snapshots carry it).
    shape_counts: dict[TypicalKey, int] = field(default_factory=dict)
    typical: Typical = ()
    # Derived from shape_counts as it changes (rebuilt by the snapshot restore's count_shape calls, not
    # persisted, not hashed): the GPU milli of the present pods, and per allowed-model tuple the GPU milli
    # and the count of the pinned ones; fgd-pack's model risk reads them in O(1) (processor.core.model_supply).
    gpu_demand: int = 0
    pinned_demand: dict[tuple[str, ...], list[int]] = field(default_factory=dict)
    # Settings (SetPolicy).
    reserve_after_ms: int = DEFAULT_RESERVE_AFTER_MS  # negative: no reservations
    queue_order: str = SKIP_AHEAD
    # Gangs: by id, the queue of queued gangs (priority, then FIFO), and member pod id -> gang id.
    gangs: dict[str, Gang] = field(default_factory=dict)
    gang_queue: list[QueueKey] = field(default_factory=list)  # sorted (bisect): gangs waiting are few
    member_of: dict[str, str] = field(default_factory=dict)
    # Dependencies: recently ended pods and gangs (id -> ended normally), oldest first, and the
    # jobs waiting on each id (derived from the waiting pods and gangs).
    ended: OrderedDict[str, bool] = field(default_factory=OrderedDict)
    dependants: dict[str, dict[str, None]] = field(default_factory=dict)
    reservation: Reservation | None = None
    # Node label keys present (any node) -> node count; fixed node capacities -> node count (derived).
    label_keys: dict[str, int] = field(default_factory=dict)
    capacities: dict[tuple[str, NodeClass, int, int, int], int] = field(default_factory=dict)
    # Label (key, value) -> the fixed capacities whose labels have it -> node count (derived): a pod with a node
    # selector reads its rarest label's capacities, not every one.
    capacities_by_label: dict[tuple[str, str], dict[tuple[str, NodeClass, int, int, int], int]] = field(
        default_factory=dict
    )
    # Quotas (SetQuota, by tenant) and the default quota of tenants without one (SetPolicy).
    quotas: dict[str, Quota] = field(default_factory=dict)
    default_quota: Quota | None = None
    # Derived: tenants' usage, the members of each cohort (sorted), CPU and memory of the nodes that
    # are not failed (for dominant shares), and the nodes that run pods of each priority.
    usage: dict[str, TenantUsage] = field(default_factory=dict)
    cohorts: dict[str, list[str]] = field(default_factory=dict)
    # The cohort tree (SetCohort, contract v4), by cohort; and, derived, each parent's child cohorts (sorted).
    cohort_specs: dict[str, CohortQuota] = field(default_factory=dict)
    cohort_children: dict[str, list[str]] = field(default_factory=dict)
    cpu_capacity: int = 0
    memory_capacity: int = 0
    priority_nodes: dict[int, dict[str, int]] = field(default_factory=dict)
    priority_levels: SortedList = field(default_factory=SortedList)  # derived: the keys of priority_nodes, sorted
    preemptible: PreemptionIndex = field(default_factory=PreemptionIndex)  # derived: nodes by victim class
    # Derived: each cohort's pool per quota key, (cohort, key) -> CohortPool, kept as pods start and stop so an
    # admission check is O(1).
    pools: dict[tuple[str, str], CohortPool] = field(default_factory=dict)
    limits: dict[str, quota_keys.Limits] = field(default_factory=dict)  # the quotas, compiled
    # Derived: the running pods of each tenant in a cohort, in reclaim's order (priority, -start, id), under
    # (tenant, "") and, holding GPUs, (tenant, GPU model of the node): a reclaim walks the borrowers' lists.
    reclaimable: dict[tuple[str, str], SortedList] = field(default_factory=dict)
    reclaim_sizes: dict[tuple[str, str], dict[int, int]] = field(default_factory=dict)  # GPU milli of one pod -> pods
    reclaim_nodes: dict[str, dict[str, int]] = field(default_factory=dict)  # tenant -> node -> its running pods there
    # Event time: the largest issued_at of the cluster's own commands (0 before the first), the jump a
    # command may make ahead of it (SetPolicy; 0: no limit), and the deadlines it will reach (derived).
    clock: int = 0
    max_clock_jump_ms: int = DEFAULT_MAX_CLOCK_JUMP_MS
    timers: Timers = field(default_factory=Timers)
    halted: Halt | None = None  # an internal error halted the fold of this cluster (ClusterHalted)
    # Disruption budgets (SetDisruptionBudget), by id; the nodes whose drain waits (for a budget or a grace
    # period) and the drain's grace; the pods a budget blocks (pod id -> budget id); and, while any budget
    # exists, the pods unavailable because of a disruption (evicted by a drain, a failure, a NoExecute taint or
    # a removal, or being evicted), with their specs, until they run again or end: what budgets count.
    budgets: dict[str, DisruptionBudgetSet] = field(default_factory=dict)
    draining: dict[str, tuple[int, bool]] = field(default_factory=dict)  # node -> (grace_ms, respect_budgets)
    blocked: dict[str, str] = field(default_factory=dict)
    disrupted: dict[str, PodSpec] = field(default_factory=dict)
    # Derived, not in snapshots: a counter moved by every change of the node layout (added, removed,
    # cordoned, uncordoned, failed), and the queue heads no reservation can be planned for, at that layout.
    layout: int = 0
    unplannable: dict[str, int] = field(default_factory=dict)
    fit_cache: dict[PodShape, dict[str, tuple[int, tuple[bool, tuple[int, object] | None] | None]]] = field(
        default_factory=dict
    )  # derived: the reservation planner's answer per holder shape and node (reservation_planner._trigger)
    # Derived: per node, the planner's step that first frees one of its pods (reservation_planner._first_release),
    # the nodes in that order (None until the planner first needs it), and the nodes changed since.
    first_release: dict[str, tuple[int, object] | None] = field(default_factory=dict)
    release_order: SortedList | None = None
    release_changed: dict[str, None] = field(default_factory=dict)

    def charge(self, pod: Pod, node: Node, sign: int) -> None:
        """A pod started (+1) or stopped (-1) running on a node: tenant usage and the priority index. O(1),
        and O(log p) for a tenant in a cohort (its pods in reclaim's order)."""
        spec = pod.spec
        usage = self.usage.get(spec.tenant)
        if usage is None:
            usage = self.usage[spec.tenant] = TenantUsage()
        quota = self.quotas.get(spec.tenant)
        if quota is not None and quota.cohort is not None:
            self._file_reclaimable(pod, node, sign)
            pools, cohort, limits = self.pools, quota.cohort, self.limits[spec.tenant]
            milli = spec.num_gpu * spec.gpu_milli
            for key, amount in (
                (quota_keys.key_of(limits, node.gpu_model) if milli else None, milli),
                (quota_keys.CPU, spec.cpu_milli),
                (quota_keys.MEMORY, spec.memory_mib),
            ):
                if key is None or not amount or key not in limits:
                    continue
                kept = limits[key].kept
                held = quota_keys.usage_on(usage, quota, key)
                pool = pools[(cohort, key)]
                before = pool.in_use
                pool.in_use += max(0, held + sign * amount - kept) - max(0, held - kept)
                if self.cohort_specs:
                    cohort_tree.lift(self.cohort_specs, pools, cohort, key, before)
        usage.add(node.gpu_model, spec, sign)
        if not usage.pods:
            del self.usage[spec.tenant]
        level = spec.priority if spec.preemptible else NEVER_VICTIM  # victim_level, inline: hot
        at_priority = self.priority_nodes.get(level)
        if at_priority is None:
            at_priority = self.priority_nodes[level] = {}
            self.priority_levels.add(level)
        count = at_priority.get(node.node_id, 0) + sign
        if count:
            at_priority[node.node_id] = count
        else:
            del at_priority[node.node_id]
            if not at_priority:
                del self.priority_nodes[level]
                self.priority_levels.remove(level)

    def _file_reclaimable(self, pod: Pod, node: Node, sign: int) -> None:
        """File (+1) or unfile (-1) a cohort tenant's running pod on a node in reclaim's order: under (tenant, "")
        and, if it holds GPUs, under (tenant, the GPU model of its node); count it on its node and by its GPU
        size. O(log p)."""
        spec = pod.spec
        model = node.gpu_model
        entry = (spec.priority, -(pod.started_at or 0), spec.pod_id)
        milli = spec.num_gpu * spec.gpu_milli
        keys = ((spec.tenant, ""), (spec.tenant, model)) if milli else ((spec.tenant, ""),)
        on_nodes = self.reclaim_nodes.setdefault(spec.tenant, {})
        here = on_nodes.get(node.node_id, 0) + sign
        if here > 0:
            on_nodes[node.node_id] = here
        else:
            on_nodes.pop(node.node_id, None)
            if not on_nodes:
                del self.reclaim_nodes[spec.tenant]
        if milli:
            sizes = self.reclaim_sizes.setdefault((spec.tenant, model), {})
            count = sizes.get(milli, 0) + sign
            if count > 0:
                sizes[milli] = count
            else:
                sizes.pop(milli, None)
                if not sizes:
                    del self.reclaim_sizes[(spec.tenant, model)]
        for key in keys:
            pods = self.reclaimable.get(key)
            if sign > 0:
                if pods is None:
                    pods = self.reclaimable[key] = SortedList()
                pods.add(entry)
            elif pods is not None:
                pods.discard(entry)
                if not pods:
                    del self.reclaimable[key]

    def _refile_reclaimable(self, tenant: str, in_cohort: bool) -> None:
        """A tenant joined or left a cohort: its running pods are filed for reclaim, or no longer. O(P)."""
        for key in [key for key in self.reclaimable if key[0] == tenant]:
            del self.reclaimable[key]
        for key in [key for key in self.reclaim_sizes if key[0] == tenant]:
            del self.reclaim_sizes[key]
        self.reclaim_nodes.pop(tenant, None)
        if in_cohort:
            for pod in self.pods.values():
                if pod.spec.tenant == tenant and pod.node_id is not None:
                    self._file_reclaimable(pod, self.nodes[pod.node_id], +1)

    def set_quota(self, tenant: str, quota: Quota | None) -> None:
        """Give a tenant a quota (None: back to the default) and keep the cohort lists. O(members), and O(P) if the
        tenant joins or leaves a cohort."""
        previous = self.quotas.pop(tenant, None)
        was_in = previous is not None and previous.cohort is not None
        now_in = quota is not None and quota.cohort is not None
        if was_in != now_in:
            self._refile_reclaimable(tenant, now_in)
        if previous is not None and previous.cohort is not None:
            members = self.cohorts[previous.cohort]
            members.remove(tenant)
            if not members:
                del self.cohorts[previous.cohort]
        self.limits.pop(tenant, None)
        if quota is not None:
            self.quotas[tenant] = quota
            self.limits[tenant] = quota_keys.compile_limits(quota)
            if quota.cohort is not None:
                members = self.cohorts.setdefault(quota.cohort, [])
                members.append(tenant)
                members.sort()
        self.rebuild_pools()

    def rebuild_pools(self) -> None:
        """Every cohort's pools from the cohort tree, the quotas and usage (:func:`cohort_tree.build_pools`).
        O(members · keys + cohorts · depth); on quota and cohort changes only."""
        self.pools = cohort_tree.build_pools(self.cohort_specs, self.cohorts, self.quotas, self.usage)

    @property
    def quotas_on(self) -> bool:
        """Whether any quota applies: only then do admission checks and fair-share ordering act."""
        return bool(self.quotas) or self.default_quota is not None

    def count_shape(self, shape: PodShape, delta: int) -> None:
        """Add (+1) or remove (-1) a present pod's shape from the histogram. O(1)."""
        key = typical_key(shape)
        count = self.shape_counts.get(key, 0) + delta
        if count > 0:
            self.shape_counts[key] = count
        else:
            self.shape_counts.pop(key, None)
        milli = shape.num_gpu * shape.gpu_milli
        if milli:
            self.gpu_demand += delta * milli
            if shape.gpu_models:
                entry = self.pinned_demand.get(shape.gpu_models)
                if entry is None:
                    entry = self.pinned_demand[shape.gpu_models] = [0, 0]
                entry[0] += delta * milli
                entry[1] += delta
                if entry[1] <= 0:
                    del self.pinned_demand[shape.gpu_models]

    def learn_typical(self) -> None:
        """Refresh the typical pods from the histogram if the arrival count is a checkpoint."""
        if is_checkpoint(self.arrivals):
            typical = derive_typical(self.shape_counts)
            if typical_moved(self.typical, typical):
                self.typical = typical

    def reindex(self, node: Node) -> None:
        """Put a node in the capacity index under its current signature, or take it out; and mark it for
        the preemption index, which refiles it before its next search (or, past a bound on marked nodes,
        moves the oldest marked one to its pending bucket now)."""
        node.changes += 1
        if self.release_order is not None:
            self.release_changed[node.node_id] = None
        self.preemptible.touch(node.node_id, self.nodes)
        self.unindexed[node.node_id] = None  # a node already waiting keeps its place

    @property
    def index(self) -> CapacityIndex:
        """The capacity index, every node changed since the last read filed under its signature first.

        Filing waits for a read: a node changed many times in between (a gang's members and their victims
        on one node, a trial and its rollback) is filed once, under where it ended; the index has the same
        content either way (its lists of nodes are sorted, and every reader orders what it reads by stable
        keys). At most :data:`UNINDEXED_AT_MOST` nodes wait from earlier commands (each command ends with
        :meth:`file_waiting`), so a read pays for at most that many besides its own command's changes, not for
        a mass change made before it (10,000 nodes added). O(nodes waiting)."""
        if self.unindexed:
            self._file_changed()
        return self.capacity

    def file_waiting(self) -> None:
        """After a command: file the nodes that waited longest until at most :data:`UNINDEXED_AT_MOST` wait, so
        the next read pays for no more. The command that changed them pays: once per node it changed, however
        often. O(nodes filed)."""
        unindexed = self.unindexed
        while len(unindexed) > UNINDEXED_AT_MOST:  # measure: the nodes waiting beyond the bound
            self._file(next(iter(unindexed)))

    def _file_changed(self) -> None:
        # measure: the changed nodes not yet filed (this command's, and at most UNINDEXED_AT_MOST from before it)
        for node_id in list(self.unindexed):
            self._file(node_id)

    def _file(self, node_id: str) -> None:
        """File one changed node in the capacity index now (the oldest, when too many wait)."""
        del self.unindexed[node_id]
        node = lookup(self.nodes, node_id)
        if node is not None and node.schedulable:
            self.capacity.update(node_id, node.signature())
        else:
            self.capacity.remove(node_id)  # unschedulable, or removed since it changed

    @property
    def unschedulable_nodes(self) -> int:
        return len(self.nodes) - len(self.index)

    def count_node(self, node: Node, delta: int) -> None:
        """Add (+1) or remove (-1) a present node's label keys and fixed capacity. O(labels)."""
        for key in node.labels:
            count = self.label_keys.get(key, 0) + delta
            if count > 0:
                self.label_keys[key] = count
            else:
                self.label_keys.pop(key, None)
        capacity = (node.gpu_model, node.base_class, node.gpu_count, node.cpu_milli, node.memory_mib)
        count = self.capacities.get(capacity, 0) + delta
        if count > 0:
            self.capacities[capacity] = count
        else:
            self.capacities.pop(capacity, None)
        by_label = self.capacities_by_label
        for pair in node.base_class[0]:
            counts = by_label.get(pair)
            if counts is None:
                counts = by_label[pair] = {}
            if count > 0:
                counts[capacity] = count
            else:
                counts.pop(capacity, None)
                if not counts:
                    del by_label[pair]

    def capacities_for(self, selector: tuple[tuple[str, str], ...]) -> Iterable[tuple[str, NodeClass, int, int, int]]:
        """The fixed capacities whose labels may match a node selector: every one for no selector, else those
        carrying its rarest label. O(1) to choose; the caller reads only those."""
        if not selector:
            return self.capacities
        by_label = self.capacities_by_label
        rarest: dict[tuple[str, NodeClass, int, int, int], int] | None = None
        for pair in selector:
            counts = by_label.get(pair)
            if counts is None:
                return ()
            if rarest is None or len(counts) < len(rarest):
                rarest = counts
        return rarest if rarest is not None else ()

    def job_exists(self, job_id: str) -> bool:
        """Whether a present pod or gang (any state) has this id."""
        return job_id in self.pods or job_id in self.gangs or job_id in self.member_of

    def remember_end(self, job_id: str, ok: bool) -> None:
        """Record that a pod or gang ended (dependencies resolve against it); bounded, oldest forgotten."""
        self.ended.pop(job_id, None)
        self.ended[job_id] = ok
        if len(self.ended) > ENDED_WINDOW:
            self.ended.popitem(last=False)

    def wait_on(self, job_id: str, waiting_for: tuple[str, ...]) -> None:
        for dependency in waiting_for:
            self.dependants.setdefault(dependency, {})[job_id] = None

    def stop_waiting(self, job_id: str, waiting_for: tuple[str, ...]) -> None:
        for dependency in waiting_for:
            waiters = self.dependants.get(dependency)
            if waiters is not None:
                waiters.pop(job_id, None)
                if not waiters:
                    del self.dependants[dependency]

    def queue_gang(self, key: QueueKey) -> None:
        bisect.insort(self.gang_queue, key)

    def unqueue_gang(self, key: QueueKey) -> None:
        index = bisect.bisect_left(self.gang_queue, key)
        if index == len(self.gang_queue) or self.gang_queue[index] != key:
            raise InvariantViolation(f"gang {key[2]!r} is not in the gang queue")
        del self.gang_queue[index]

    def head(self) -> tuple[QueueKey, str] | None:
        """The first queued job (priority, then age; pods and gangs together) and its kind. O(1)."""
        first = self.queue.first()
        gang = self.gang_queue[0] if self.gang_queue else None  # a plain list: a C-level emptiness test
        if first is None and gang is None:
            return None
        if gang is None or (first is not None and first[0] < gang):
            return first[0], "pod"  # type: ignore[index]
        return gang, "gang"


_K = TypeVar("_K")
_V = TypeVar("_V")


def lookup(table: dict[_K, _V], key: _K) -> _V | None:
    """``table.get(key)``, read with ``in`` and ``[]``: use it on ``clusters``, ``nodes`` and ``pods``.

    A what-if fork (``processor.runtime.whatif``) hands the fold dicts that copy a value on first read
    by overriding ``[]`` and ``get``; compiled code (mypyc) reads ``dict.get`` straight from the hash
    table, past a subclass's ``get``, so the fork would change the live state. ``in`` and ``[]`` go
    through the subclass in both builds (``tests/unit/test_compiled.py`` checks no ``.get`` is left).
    """
    return table[key] if key in table else None  # noqa: SIM401 (.get is what this avoids)


class SeenWindow(Protocol):
    """The idempotency window as the fold uses it: ``in``, add at the end, drop the oldest, count, list in order.

    An ``OrderedDict[str, None]`` in the live state; a what-if fork puts an overlay on the live window
    instead (``processor.runtime.whatif.SeenOverlay``). Typed as this protocol rather than as a dict so
    that the compiled ``PartitionState`` (mypyc checks attribute types at run time) accepts both.
    """

    def __contains__(self, key: object, /) -> bool: ...

    def __setitem__(self, key: str, value: None, /) -> None: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[str]: ...

    def popitem(self, last: bool = True) -> tuple[str, None]: ...


def new_seen_window() -> SeenWindow:
    """An empty idempotency window."""
    return OrderedDict()


@dataclass(slots=True)
class PartitionState:
    """Everything the fold knows for one partition of the command log."""

    partition: int = 0
    clusters: dict[str, ClusterState] = field(default_factory=dict)
    sequence: int = 0  # the next event's sequence number
    next_offset: int = 0  # the next command offset to fold
    seen: SeenWindow = field(default_factory=new_seen_window)
    seen_window: int = DEFAULT_SEEN_WINDOW
    clock: int = 0  # the partition's event time: the largest issued_at folded (contract v1 and v2 fold at it)

    def cluster(self, name: str) -> ClusterState:
        """The cluster, created on first use (only ``apply`` may call this)."""
        state = lookup(self.clusters, name)
        if state is None:
            state = self.clusters[name] = ClusterState(name)
        return state

    def remember(self, command_id: str) -> None:
        """Add a command id to the idempotency window (oldest forgotten first).

        Ids that are not valid ids (empty, or longer than 253 characters) were
        rejected and are not kept, so the window's memory stays bounded.
        """
        if command_id in self.seen or not 0 < len(command_id) <= MAX_COMMAND_ID_LENGTH:
            return
        self.seen[command_id] = None
        if len(self.seen) > self.seen_window:
            self.seen.popitem(last=False)
