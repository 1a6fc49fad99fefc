"""The fold: ``decide`` turns a command into events, ``apply`` folds an event into state.

Both are pure functions of their inputs: no clock, no randomness, no
environment, no I/O. Time is event time: the partition's clock is the largest
``issued_at`` folded so far (a late command is folded at the clock), and the
deadlines it reaches (time limits, gang timeouts, reservations) fire first, in
order, each at its own time (``processor.core.timers``). Ties break on stable
keys (node id, queue key); nothing iterates an unordered set.

``decide`` applies each event as it emits it, so that later decisions within
the same command (re-placing evicted pods, retrying the queue after a release)
see the earlier ones. State still changes only through ``apply``, and replaying
the events alone rebuilds the same state. A handler validates everything before
its first event, so a refused command emits one ``CommandRejected`` (after the
events of any timers that came due) and changes nothing but the position and the clock.

The rooms next door: ``processor.core.gangs`` (placing a gang within a topology
domain), ``processor.core.reservations`` (planning a reservation, who may use
reserved nodes), ``processor.core.dependencies`` (cycles, what a job waits for).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from processor.core import defrag, dependencies, gangs, preemption, quotas, reservation_planner, reservations
from processor.core.errors import InvariantViolation
from processor.core.policies import get_policy
from processor.core.policies.base import Choice, Policy
from processor.core.reasons import queue_reasons
from processor.core.resources import PodShape
from processor.core.state import (
    GANG_NEW,
    GANG_QUEUED,
    GANG_RUNNING,
    GANG_WAITING,
    ClusterState,
    Gang,
    Node,
    PartitionState,
    Pod,
    Reservation,
    lookup,
    shape_of,
)
from processor.core.timers import GANG_TIMEOUT, RESERVATION_START, RESERVE_CHECK, TIME_LIMIT
from schemas.codes import QueueReasonCode, Rejected, RejectionCode
from schemas.commands import (
    GPU_MILLI,
    PREEMPT_LOWER,
    PREEMPT_NEVER,
    STRICT_FIFO,
    AddNode,
    Command,
    CordonNode,
    Defragment,
    DrainNode,
    MarkNodeFailed,
    Quota,
    Release,
    ReleaseGang,
    RemoveNode,
    RemoveQuota,
    SetPolicy,
    SetQuota,
    SubmitGang,
    SubmitPod,
    Tick,
    UncordonNode,
)
from schemas.events import (
    CommandRejected,
    DefragmentationPlanned,
    DependencyFailed,
    Event,
    EventPayload,
    GangQueued,
    GangReleased,
    GangScheduled,
    GangSpec,
    GangTimedOut,
    MemberPlacement,
    NodeAdded,
    NodeCordoned,
    NodeDrained,
    NodeFailed,
    NodeRemoved,
    NodesReserved,
    NodeUncordoned,
    PodEvicted,
    PodMigrated,
    PodPreempted,
    PodQueued,
    PodReleased,
    PodScheduled,
    PodSpec,
    PodTimeLimitReached,
    PolicyChanged,
    QueueReason,
    QuotaChanged,
    ReservationReleased,
    Ticked,
)
from schemas.limits import MAX_MESSAGE_LENGTH, clip, stand_in
from schemas.validation import (
    check_add_node,
    check_defragment,
    check_envelope,
    check_id,
    check_mark_node_failed,
    check_release,
    check_release_gang,
    check_remove_quota,
    check_set_policy,
    check_set_quota,
    check_submit_gang,
    check_submit_pod,
)

COMPLETED = "completed"  # the Release reason of a normal end: what afterok dependants wait for
EVICTED_MEMBER = "evicted:"  # a member beyond min_members lost its node; the gang runs on without it

# ---------------------------------------------------------------- decide


class _Decision:
    """The events of one command, applied to the state as they are emitted.

    ``now`` is the event time of the next event: a timer's deadline while timers
    fire, then the command's time (the clock)."""

    __slots__ = ("_scratch", "command", "events", "freed", "now", "offset", "state", "touched")

    def __init__(self, state: PartitionState, command: Command, offset: int) -> None:
        self.state = state
        self.command = command
        self.offset = offset
        self.events: list[Event] = []
        self.now = state.clock
        self.touched: dict[str, None] = {}  # clusters whose queue or reservation may need upkeep
        # Tenants (per cluster with quotas) whose running pods stopped: their quota (and their
        # cohort's pool) has room again, so their queued work is retried on the whole cluster.
        self.freed: dict[str, dict[str, None]] = {}
        self._scratch: ClusterState | None = None

    @property
    def may_preempt(self) -> bool:
        """A command of contract v1 never preempts (v1 had no preemption)."""
        return self.command.contract != "v1"

    @property
    def cluster(self) -> ClusterState:
        """The command's cluster; an empty scratch one until an event creates it."""
        cluster = lookup(self.state.clusters, self.command.cluster)
        if cluster is not None:
            return cluster
        if self._scratch is None:
            self._scratch = ClusterState(self.command.cluster)
        return self._scratch

    def emit(self, payload: EventPayload, cluster: str | None = None) -> None:
        name = self.command.cluster if cluster is None else cluster
        kind = type(payload)
        if kind is PodEvicted or kind is PodReleased:
            known = lookup(self.state.clusters, name)
            if known is not None and known.quotas_on:
                pod = lookup(known.pods, payload.pod_id)  # type: ignore[union-attr]
                if pod is not None and pod.node_id is not None:
                    self.freed.setdefault(name, {})[pod.spec.tenant] = None
        event = Event(
            self.state.partition,
            self.state.sequence,
            name,
            self.command.command_id,
            self.offset,
            self.now,
            payload,
        )
        apply(self.state, event)
        self.events.append(event)
        self.touched[name] = None


def decide(state: PartitionState, command: Command, offset: int | None = None) -> list[Event]:
    """Decide and apply the events of one command (at least one, always).

    ``offset`` is the command's position in the log (default: the state's next offset).
    """
    decision = _Decision(state, command, state.next_offset if offset is None else offset)
    try:
        check_envelope(command)
    except Rejected as rejection:  # its time cannot be trusted: folded at the clock, which it does not move
        # A rejection stays small whatever it refuses: an id over its bound is carried as a short stand-in
        # and the message is clipped, so the event always fits a Kafka record (schemas.limits).
        decision.command = _bounded_envelope(command)
        message = clip(rejection.message, MAX_MESSAGE_LENGTH)
        decision.emit(CommandRejected(decision.command.command_id, command.type_name, rejection.code, message))
        return decision.events
    clock = command.issued_at if command.issued_at > state.clock else state.clock
    duplicate = command.command_id in state.seen  # before timers: their events carry this command's id
    heap = state.timers.heap
    if heap and heap[0][0] <= clock:
        _fire_timers(decision, clock)
    # A command keeps the semantics of the contract it was written in: v1 stamped events with
    # their command's own issued_at, late or not (``schemas.commands.V1Command``).
    decision.now = command.issued_at if command.contract == "v1" else clock
    mark = len(decision.events)
    try:
        if duplicate:
            raise Rejected(
                RejectionCode.DUPLICATE_COMMAND,
                f"command {command.command_id!r} was already processed; a repeated command id changes nothing",
            )
        handler = _HANDLERS.get(type(command.payload))
        if handler is None:
            raise Rejected(RejectionCode.INVALID_COMMAND, f"unknown command type {type(command.payload).__name__}")
        handler(decision, command.payload)
    except Rejected as rejection:
        if len(decision.events) > mark:
            raise InvariantViolation(f"command {command.command_id!r} rejected after emitting events") from rejection
        message = clip(rejection.message, MAX_MESSAGE_LENGTH)  # e.g. a list of every GPU model a cluster knows
        decision.emit(CommandRejected(command.command_id, command.type_name, rejection.code, message))
    _upkeep(decision)
    return decision.events


def _bounded_envelope(command: Command) -> Command:
    """The command itself, or a copy whose command_id and cluster are short, encodable stand-ins."""
    command_id, cluster = stand_in(command.command_id), stand_in(command.cluster)
    if command_id == command.command_id and cluster == command.cluster:
        return command
    return replace(command, command_id=command_id, cluster=cluster, source="")


def _node(decision: _Decision, node_id: str) -> Node:
    check_id("node_id", node_id)
    node = lookup(decision.cluster.nodes, node_id)
    if node is None:
        raise Rejected(RejectionCode.UNKNOWN_NODE, f"node {node_id!r} is not in cluster {decision.command.cluster!r}")
    return node


def _add_node(decision: _Decision, command: AddNode) -> None:
    check_add_node(command)
    if command.node_id in decision.cluster.nodes:
        raise Rejected(
            RejectionCode.DUPLICATE_NODE,
            f"node {command.node_id!r} already exists in cluster {decision.command.cluster!r}",
        )
    decision.emit(
        NodeAdded(
            command.node_id,
            command.gpu_model,
            command.gpu_count,
            command.cpu_milli,
            command.memory_mib,
            dict(command.labels),
            tuple(command.taints),
        )
    )
    _capacity_grew(decision, decision.cluster, (command.node_id,))


def _remove_node(decision: _Decision, command: RemoveNode) -> None:
    node = _node(decision, command.node_id)
    if node.pods and not command.force:
        raise Rejected(
            RejectionCode.NODE_BUSY,
            f"node {command.node_id!r} runs {len(node.pods)} pod(s); drain it first or remove it with force=true",
        )
    cluster = decision.cluster
    _drop_reserved_node(decision, cluster, node, "node_removed")
    evicted, gang_ids = _evict_all(decision, cluster, node, "node_removed")
    decision.emit(NodeRemoved(command.node_id, command.force))
    _after_eviction(decision, cluster, evicted, gang_ids, "node_removed")


def _cordon_node(decision: _Decision, command: CordonNode) -> None:
    node = _node(decision, command.node_id)
    if node.failed:
        raise Rejected(RejectionCode.NODE_FAILED, f"node {command.node_id!r} has failed; remove it and add it again")
    if node.cordoned:
        raise Rejected(RejectionCode.NODE_ALREADY_CORDONED, f"node {command.node_id!r} is already cordoned")
    _drop_reserved_node(decision, decision.cluster, node, "node_cordoned")
    decision.emit(NodeCordoned(command.node_id))


def _uncordon_node(decision: _Decision, command: UncordonNode) -> None:
    node = _node(decision, command.node_id)
    if node.failed:
        raise Rejected(RejectionCode.NODE_FAILED, f"node {command.node_id!r} has failed; remove it and add it again")
    if not node.cordoned:
        raise Rejected(RejectionCode.NODE_NOT_CORDONED, f"node {command.node_id!r} is not cordoned")
    decision.emit(NodeUncordoned(command.node_id))
    _capacity_grew(decision, decision.cluster, (command.node_id,))


def _drain_node(decision: _Decision, command: DrainNode) -> None:
    node = _node(decision, command.node_id)
    if node.failed:
        raise Rejected(RejectionCode.NODE_FAILED, f"node {command.node_id!r} has failed; its pods were already evicted")
    cluster = decision.cluster
    _drop_reserved_node(decision, cluster, node, "node_drained")
    decision.emit(NodeDrained(command.node_id, len(node.pods)))
    evicted, gang_ids = _evict_all(decision, cluster, node, "drain")
    _after_eviction(decision, cluster, evicted, gang_ids, "drain")


def _mark_node_failed(decision: _Decision, command: MarkNodeFailed) -> None:
    check_mark_node_failed(command)
    node = _node(decision, command.node_id)
    if node.failed:
        raise Rejected(RejectionCode.NODE_FAILED, f"node {command.node_id!r} is already marked failed")
    cluster = decision.cluster
    _drop_reserved_node(decision, cluster, node, "node_failed")
    decision.emit(NodeFailed(command.node_id, command.reason, len(node.pods)))
    evicted, gang_ids = _evict_all(decision, cluster, node, "node_failed")
    _after_eviction(decision, cluster, evicted, gang_ids, "node_failed")


def _check_new_job_ids(cluster: ClusterState, name: str, ids: tuple[str, ...], what: str) -> None:
    for job_id in ids:
        if cluster.job_exists(job_id):
            code = RejectionCode.DUPLICATE_GANG if what == "gang" else RejectionCode.DUPLICATE_POD
            raise Rejected(code, f"{what} id {job_id!r} is already taken by a pod or gang in cluster {name!r}")


def _check_models(cluster: ClusterState, name: str, models: tuple[str, ...]) -> None:
    if models and not any(cluster.model_nodes.get(model) for model in models):
        known = sorted(model for model, count in cluster.model_nodes.items() if count and model)
        raise Rejected(
            RejectionCode.UNKNOWN_GPU_MODEL,
            f"no node in cluster {name!r} has GPU model {' or '.join(models)}; known: {known}",
        )


def _check_no_cycle(cluster: ClusterState, ids: tuple[str, ...], depends_on: tuple[str, ...]) -> None:
    cycle = dependencies.find_cycle(cluster, ids, depends_on)
    if cycle is not None:
        raise Rejected(
            RejectionCode.DEPENDENCY_CYCLE,
            f"{ids[0]!r} would close the dependency cycle {' -> '.join(cycle)}: none of them could ever start",
        )


def _submit_pod(decision: _Decision, command: SubmitPod) -> None:
    check_submit_pod(command)
    cluster = decision.cluster
    name = decision.command.cluster
    if command.gpu_models:
        _check_models(cluster, name, tuple(command.gpu_models))
    if command.pod_id in cluster.pods:
        raise Rejected(RejectionCode.DUPLICATE_POD, f"pod {command.pod_id!r} is already queued or running")
    if command.pod_id in cluster.gangs or command.pod_id in cluster.member_of:
        _check_new_job_ids(cluster, name, (command.pod_id,), "pod")
    if command.depends_on:
        _check_no_cycle(cluster, (command.pod_id,), tuple(command.depends_on))
    spec = PodSpec(
        command.pod_id,
        command.tenant,
        command.priority,
        command.num_gpu,
        command.gpu_milli,
        command.cpu_milli,
        command.memory_mib,
        tuple(command.gpu_models),
        dict(sorted(command.node_selector.items())),  # canonical order: a restored spec encodes alike
        tuple(command.tolerations),
        decision.now,
        cluster.arrivals,
        None,
        command.time_limit_ms,
        tuple(dict.fromkeys(command.depends_on)) if command.depends_on else (),
        command.dependency,
        command.preemption if decision.may_preempt else PREEMPT_NEVER,
        command.movable,
    )
    if spec.depends_on:
        _start_or_wait_pod(decision, cluster, spec)
    else:
        _place(decision, cluster, spec, shape_of(spec), from_queue=False, requeued=False, new=True)


def _start_or_wait_pod(decision: _Decision, cluster: ClusterState, spec: PodSpec) -> None:
    """A new (or no longer waiting) pod: fails, waits for dependencies, or goes to placement."""
    failed = dependencies.failed_dependency(cluster, spec.depends_on, spec.dependency)
    if failed is not None:
        _fail_dependant(decision, cluster, spec.pod_id, "pod", failed, spec)
        return
    waiting = dependencies.unmet(cluster, spec.depends_on)
    if waiting:
        reason = dependencies.waiting_reason(waiting, spec.dependency)
        decision.emit(PodQueued(spec, (reason,), False, waiting), cluster.name)
        return
    _place(decision, cluster, spec, shape_of(spec), from_queue=False, requeued=False, new=True)


def _release(decision: _Decision, command: Release) -> None:
    check_release(command)
    cluster = decision.cluster
    pod = lookup(cluster.pods, command.pod_id)
    if pod is None:
        raise Rejected(
            RejectionCode.UNKNOWN_POD,
            f"pod {command.pod_id!r} is neither queued nor running in cluster {decision.command.cluster!r} "
            "(never submitted, or already released)",
        )
    _release_pod(decision, cluster, pod, command.reason)


def _release_pod(decision: _Decision, cluster: ClusterState, pod: Pod, reason: str) -> None:
    """Release one pod (a gang member too); end its gang if it was the last; wake its dependants."""
    node_id = pod.node_id
    pod_id = pod.spec.pod_id
    gang_id = pod.spec.gang_id
    decision.emit(PodReleased(pod_id, node_id, reason), cluster.name)
    if gang_id is not None:
        gang = cluster.gangs.get(gang_id)
        if gang is not None and gang.state == GANG_RUNNING and not gang.placed:
            _end_gang(decision, cluster, gang, reason)
    _wake_dependants(decision, cluster, pod_id)
    if node_id is not None:
        _capacity_grew(decision, cluster, (node_id,))


def _end_gang(decision: _Decision, cluster: ClusterState, gang: Gang, reason: str) -> None:
    ok = gang.ok and gang.state == GANG_RUNNING and reason == COMPLETED
    decision.emit(GangReleased(gang.gang_id, reason, ok), cluster.name)
    _wake_dependants(decision, cluster, gang.gang_id)


def _set_policy(decision: _Decision, command: SetPolicy) -> None:
    check_set_policy(command)
    cluster = decision.cluster
    was_strict = cluster.queue_order == STRICT_FIFO
    decision.emit(
        PolicyChanged(
            command.policy or cluster.policy,
            cluster.policy,
            command.reserve_after_ms,
            command.queue_order,
        )
    )
    if command.default_quota is not None:
        quota = None if command.default_quota.limits_nothing else command.default_quota
        cluster = decision.cluster
        previous = cluster.default_quota
        words = quotas.describe(quota) if quota is not None else "none: tenants without a quota are not limited"
        decision.emit(
            QuotaChanged(None, quota, previous, f"default quota of tenants without their own: {words}"),
        )
        affected = {tenant for tenant in _queued_tenants(cluster) if tenant not in cluster.quotas}
        _capacity_grew(decision, cluster, (), affected)
    cluster = decision.cluster
    if was_strict and cluster.queue_order != STRICT_FIFO:
        # Strict FIFO kept fitting work behind the head; every queued tenant's work may start now.
        _capacity_grew(decision, cluster, (), _queued_tenants(cluster))


def _queued_tenants(cluster: ClusterState) -> set[str]:
    """Tenants with pods or gangs in the queue. O(Q + G)."""
    tenants = {group[0] for _, group in cluster.queue.heads()}
    tenants.update(cluster.gangs[key[2]].spec.tenant for key in cluster.gang_queue)
    return tenants


def _set_quota(decision: _Decision, command: SetQuota) -> None:
    check_set_quota(command)
    cluster = decision.cluster
    quota = command.quota()
    previous = cluster.quotas.get(command.tenant)
    notes = []
    if quota.cohort is not None and quota.cohort not in cluster.cohorts:
        notes.append(f"cohort {quota.cohort!r} is new: it starts with this tenant")
    over = quotas.over_limit(cluster, command.tenant, quota)
    if over:
        notes.append(
            f"it runs more than this allows on {', '.join(over)}: nothing is evicted, its new work waits until it is "
            "back under"
        )
    message = f"tenant {command.tenant!r}: {quotas.describe(quota)}" + "".join(f"; {note}" for note in notes)
    decision.emit(QuotaChanged(command.tenant, quota, previous, message))
    _capacity_grew(decision, decision.cluster, (), _with_peers(decision.cluster, {command.tenant}, previous))


def _with_peers(cluster: ClusterState, tenants: set[str], *previous: Quota | None) -> set[str]:
    """The tenants and everyone who shares a cohort (now, or before a change) with one of them."""
    out = set(tenants)
    cohorts = {quota.cohort for quota in previous if quota is not None and quota.cohort is not None}
    for tenant in tenants:
        quota = cluster.quotas.get(tenant)
        if quota is not None and quota.cohort is not None:
            cohorts.add(quota.cohort)
    for cohort in cohorts:
        out.update(cluster.cohorts.get(cohort, ()))
    return out


def _remove_quota(decision: _Decision, command: RemoveQuota) -> None:
    check_remove_quota(command)
    cluster = decision.cluster
    previous = cluster.quotas.get(command.tenant)
    if previous is None:
        raise Rejected(
            RejectionCode.UNKNOWN_QUOTA,
            f"tenant {command.tenant!r} has no quota of its own in cluster {decision.command.cluster!r}",
        )
    fallback = quotas.describe(cluster.default_quota) if cluster.default_quota is not None else "none: not limited"
    decision.emit(
        QuotaChanged(
            command.tenant, None, previous, f"tenant {command.tenant!r} falls back to the default quota: {fallback}"
        )
    )
    _capacity_grew(decision, cluster, (), _with_peers(cluster, {command.tenant}, previous))


def _submit_gang(decision: _Decision, command: SubmitGang) -> None:
    check_submit_gang(command)
    cluster = decision.cluster
    name = decision.command.cluster
    ids = (command.gang_id, *(member.pod_id for member in command.members))
    _check_new_job_ids(cluster, name, ids[:1], "gang")
    _check_new_job_ids(cluster, name, ids[1:], "pod")
    for member in command.members:
        _check_models(cluster, name, tuple(member.gpu_models))
    for key in (command.topology_required, command.topology_preferred):
        if key is not None and key not in cluster.label_keys:
            raise Rejected(
                RejectionCode.UNKNOWN_LABEL_KEY,
                f"no node in cluster {name!r} has the label key {key!r}; known: {sorted(cluster.label_keys)[:20]}",
            )
    spec = gangs.gang_spec(
        command, decision.now, cluster.arrivals, command.preemption if decision.may_preempt else PREEMPT_NEVER
    )
    never = gangs.never_fits(cluster, spec)
    if never is not None:
        raise Rejected(RejectionCode.NEVER_FITS, never)
    _check_no_cycle(cluster, ids, spec.depends_on)
    _start_or_wait_gang(decision, cluster, spec)


def _start_or_wait_gang(decision: _Decision, cluster: ClusterState, spec: GangSpec) -> None:
    failed = dependencies.failed_dependency(cluster, spec.depends_on, spec.dependency)
    if failed is not None:
        _fail_dependant(decision, cluster, spec.gang_id, "gang", failed, spec)
        return
    waiting = dependencies.unmet(cluster, spec.depends_on)
    if waiting:
        reason = dependencies.waiting_reason(waiting, spec.dependency)
        decision.emit(GangQueued(spec.gang_id, (reason,), spec, False, waiting), cluster.name)
        return
    _place_gang(decision, cluster, spec, from_queue=False, requeued=False, new=True)


def _release_gang(decision: _Decision, command: ReleaseGang) -> None:
    check_release_gang(command)
    cluster = decision.cluster
    gang = cluster.gangs.get(command.gang_id)
    if gang is None:
        raise Rejected(
            RejectionCode.UNKNOWN_GANG,
            f"gang {command.gang_id!r} is neither waiting, queued nor running in cluster "
            f"{decision.command.cluster!r} (never submitted, or already ended)",
        )
    freed = []
    for pod_id in sorted(gang.placed):  # sorted: a gang restored from a snapshot releases in the same order
        pod = cluster.pods[pod_id]
        freed.append(pod.node_id)
        decision.emit(PodReleased(pod_id, pod.node_id, command.reason), cluster.name)
        _wake_dependants(decision, cluster, pod_id)
    _end_gang(decision, cluster, gang, command.reason)
    _capacity_grew(decision, cluster, tuple(node_id for node_id in dict.fromkeys(freed) if node_id is not None))


def _tick(decision: _Decision, command: Tick) -> None:
    decision.emit(Ticked(decision.now))


def _defragment(decision: _Decision, command: Defragment) -> None:
    check_defragment(command)
    _run_defragment(decision, decision.cluster, command)


_HANDLERS: dict[type, Callable[[_Decision, Any], None]] = {
    AddNode: _add_node,
    RemoveNode: _remove_node,
    CordonNode: _cordon_node,
    UncordonNode: _uncordon_node,
    DrainNode: _drain_node,
    MarkNodeFailed: _mark_node_failed,
    SubmitPod: _submit_pod,
    Release: _release,
    SetPolicy: _set_policy,
    SubmitGang: _submit_gang,
    ReleaseGang: _release_gang,
    Tick: _tick,
    SetQuota: _set_quota,
    RemoveQuota: _remove_quota,
    Defragment: _defragment,
}

# ---------------------------------------------------------------- placement


def _blocked_by_earlier(cluster: ClusterState, key: tuple[int, int, str]) -> QueueReason | None:
    """Strict FIFO: the reason a job may not start because a job ahead of it has not."""
    if cluster.queue_order != STRICT_FIFO:
        return None
    head = cluster.head()
    if head is None or head[0] > key:
        return None
    return QueueReason(
        QueueReasonCode.WAITING_FOR_EARLIER_JOB,
        0,
        f"strict-fifo: {head[1]} {head[0][2]!r} (priority {-head[0][0]}) is ahead in the queue and has not started",
    )


def _place(
    decision: _Decision,
    cluster: ClusterState,
    spec: PodSpec,
    shape: PodShape,
    *,
    from_queue: bool,
    requeued: bool,
    new: bool = False,
    announce: bool | None = None,
    near: tuple[str, ...] | None = None,
) -> bool:
    """Schedule the pod with the cluster's policy, or queue it with reasons. O(S_m).

    Quota first (``processor.core.quotas``; a lender may reclaim), then free capacity, then,
    if it may, priority preemption (``processor.core.preemption``; ``near``: only on these
    nodes, the ones whose capacity changed). ``new``: the job enters the queue now (strict
    FIFO may hold it back). ``announce`` (default: not ``from_queue``): emit ``PodQueued``
    if it does not start; a pod retried from the queue stays queued silently."""
    if new and cluster.queue_order == STRICT_FIFO:
        blocked = _blocked_by_earlier(cluster, (-spec.priority, spec.arrival, spec.pod_id))
        if blocked is not None:
            decision.emit(PodQueued(spec, (blocked,), requeued), cluster.name)
            return False
    reserved = cluster.reservation is not None
    usable = reservations.usable_shape(cluster, spec.pod_id, shape, decision.now) if reserved else shape
    quota_reasons: tuple[QueueReason, ...] = ()
    may_preempt = spec.preemption == PREEMPT_LOWER and decision.may_preempt
    if cluster.quotas_on:
        admission = quotas.admit(cluster, spec, usable)
        if admission.shortfalls:
            quota_reasons = (_quota_reason(admission.shortfalls, admission.shape is None),)
        if admission.shape is None:
            reclaimable = any(shortfall.reclaimable for _, shortfall in admission.shortfalls)
            if may_preempt and reclaimable and _reclaim_for_pod(decision, cluster, spec, usable, admission, from_queue):
                return True
            if (not from_queue) if announce is None else announce:
                decision.emit(PodQueued(spec, quota_reasons, requeued), cluster.name)
            return False
        usable = admission.shape
    groups = cluster.index.feasible(usable)
    if groups:
        policy = _cluster_policy(cluster)
        choice = policy.place(cluster, usable, groups)
        decision.emit(
            PodScheduled(spec, choice.node_id, choice.gpus, policy.name, from_queue, choice.scores), cluster.name
        )
        if reserved:
            _holder_started(decision, cluster, spec.pod_id)
        return True
    if may_preempt and preemption.lower_priority_exists(cluster, spec.priority):
        plan = preemption.plan_pod(cluster, usable, spec.priority, decision.now, near)
        if plan is not None:
            _preempt_for_pod(decision, cluster, spec, usable, [], plan, from_queue)
            return True
    if (not from_queue) if announce is None else announce:
        reasons = quota_reasons + queue_reasons(cluster, shape)
        if spec.preemption == PREEMPT_NEVER and decision.may_preempt:
            reasons += _waiting_for_preemption(cluster, usable, spec.priority)
        decision.emit(PodQueued(spec, reasons, requeued), cluster.name)
    return False


def _quota_reason(shortfalls: list[tuple[str, quotas.Shortfall]], everywhere: bool) -> QueueReason:
    words = quotas.shortfall_words(shortfalls)
    if not everywhere:
        models = ", ".join(model for model, _ in shortfalls)
        words = f"not on {models}: {words}"
    return QueueReason(QueueReasonCode.QUOTA_EXCEEDED, 0, words)


def _waiting_for_preemption(cluster: ClusterState, shape: PodShape, priority: int) -> tuple[QueueReason, ...]:
    """A pod that said ``preemption: never``: the nodes where it would fit once lower-priority pods end."""
    if not preemption.lower_priority_exists(cluster, priority):
        return ()
    count = sum(
        1
        for node_id in preemption.candidate_nodes(cluster, priority, None)
        if preemption.could_preempt_on(cluster.nodes[node_id], shape, priority, cluster)
    )
    if not count:
        return ()
    message = (
        f"it would fit on {count} node(s) once lower-priority pods there end; it does not preempt them "
        "(preemption: never)"
    )
    return (QueueReason(QueueReasonCode.WAITING_FOR_PREEMPTION, count, message),)


def _reclaim_for_pod(
    decision: _Decision,
    cluster: ClusterState,
    spec: PodSpec,
    usable: PodShape,
    admission: quotas.Admission,
    from_queue: bool,
) -> bool:
    """A lender asks inside its nominal quota that others borrowed: borrowers give it back.

    Borrowers' pods are preempted, lowest priority then youngest first, until the lender's
    quota has room, and no more; the pod then starts on free capacity, or by priority
    preemption. Or, if that takes fewer victims, borrowers' pods on one node go first (same
    order) until the pod fits that node, then others until the quota has room. The plan with
    the fewest victims wins (ties: the first kind, then the node id). All on trial first:
    nothing is evicted unless the pod then starts."""
    quota = quotas.quota_of(cluster, spec.tenant)
    assert quota is not None
    by_key: dict[str, list[str]] = {}
    for model, shortfall in admission.shortfalls:
        if shortfall.reclaimable:
            by_key.setdefault(shortfall.key, []).append(model)
    best: tuple[tuple[int, str], list[preemption.Unit], Choice | None, preemption.PodPlan, PodShape] | None = None
    for key in sorted(by_key):
        models = [model for model in by_key[key] if model]
        shape = usable._replace(gpu_models=tuple(models)) if models and spec.num_gpu else usable
        wanted = quotas.demand(quota, spec, by_key[key][0])
        candidates = quotas.reclaim_candidates(cluster, spec.tenant, quota, [key])
        nodes = sorted({pod.node_id for pod in candidates if pod.node_id is not None})
        for node_id in [None, *nodes]:
            if node_id is not None and not preemption.could_hold(cluster, cluster.nodes[node_id], shape):
                continue
            trial = preemption.Trial(cluster)
            try:
                found = _reclaim_option(decision, cluster, trial, spec, quota, key, wanted, shape, node_id)
            finally:
                trial.rollback()
            if found is None:
                continue
            units, choice, plan = found
            rank = (sum(unit.count for unit in units) + (plan.cost[1] if plan.units else 0), node_id or "")
            if best is None or rank < best[0]:
                best = (rank, units, choice, plan, shape)
    if best is None:
        return False
    _, units, choice, plan, shape = best
    _preempt_for_pod(decision, cluster, spec, shape, units, plan, from_queue, choice)
    return True


def _reclaim_option(
    decision: _Decision,
    cluster: ClusterState,
    trial: preemption.Trial,
    spec: PodSpec,
    quota: Quota,
    key: str,
    wanted: quotas.Demand,
    shape: PodShape,
    node_id: str | None,
) -> tuple[list[preemption.Unit], Choice | None, preemption.PodPlan] | None:
    """One reclaim plan on trial (see ``_reclaim_for_pod``): its units, and where the pod goes."""
    units: list[preemption.Unit] = []
    policy = _cluster_policy(cluster)
    if node_id is not None:
        node = cluster.nodes[node_id]
        while not preemption.fits_now(node, shape):
            here = [
                pod for pod in quotas.reclaim_candidates(cluster, spec.tenant, quota, [key]) if pod.node_id == node_id
            ]
            if not here:
                return None
            unit = preemption.unit_of(cluster, here[0], 0)
            for pod in unit.pods:
                trial.evict(pod)
            units.append(unit)
    more = _reclaim_on_trial(cluster, trial, spec.tenant, quota, wanted)
    if more is None:
        return None
    units += more
    if node_id is not None:
        choice = Choice(node_id, policy.choose_gpus(cluster.nodes[node_id], shape), {})
        return units, choice, preemption.PodPlan(node_id, [], (0, 0, 0))
    groups = cluster.index.feasible(shape)
    if groups:
        choice = policy.place(cluster, shape, groups)
        return units, choice, preemption.PodPlan(choice.node_id, [], (0, 0, 0))
    if spec.preemption == PREEMPT_LOWER and preemption.lower_priority_exists(cluster, spec.priority):
        plan = preemption.plan_pod(cluster, shape, spec.priority, decision.now)
        if plan is not None:
            return units, None, plan
    return None


def _reclaim_on_trial(
    cluster: ClusterState, trial: preemption.Trial, tenant: str, quota: Quota, wanted: quotas.Demand
) -> list[preemption.Unit] | None:
    """Evict borrowers on trial until ``wanted`` fits the lender's quota: the units taken, or None if the
    lender would still be short (or short on something reclaim cannot give)."""
    units: list[preemption.Unit] = []
    while True:
        shortfall = quotas.check(cluster, tenant, quota, wanted)
        if shortfall is None:
            return units
        if not shortfall.reclaimable:
            return None
        candidates = quotas.reclaim_candidates(cluster, tenant, quota, [shortfall.key])
        if not candidates:
            return None
        unit = preemption.unit_of(cluster, candidates[0], 0)
        for pod in unit.pods:
            trial.evict(pod)
        units.append(unit)


def _victim_events(
    decision: _Decision, cluster: ClusterState, by: str, kind: str, units: list[preemption.Unit], reason: str
) -> list[tuple[Pod, str]]:
    """``PodPreempted`` (why, and by whom), then ``PodEvicted``, for every pod of the units, by pod id;
    returns the victims with the nodes they ran on."""
    victims = sorted((pod for unit in units for pod in unit.pods), key=lambda pod: pod.spec.pod_id)
    out = []
    for pod in victims:
        node_id = pod.node_id
        assert node_id is not None
        out.append((pod, node_id))
        if reason == "reclaim":
            words = (
                f"preempted to reclaim quota for {kind} {by!r}: its tenant asked for quota it lends to the cohort, "
                f"which tenant {pod.spec.tenant!r} was borrowing (borrowers give back lowest priority, youngest first)"
            )
        else:
            words = f"preempted by {kind} {by!r}, which has a higher priority than {pod.spec.priority}"
        if pod.spec.gang_id is not None:
            words += f"; its whole gang {pod.spec.gang_id!r} goes with it"
        decision.emit(PodPreempted(pod.spec.pod_id, node_id, by, reason, words), cluster.name)
        decision.emit(PodEvicted(pod.spec.pod_id, node_id, f"preempted:{reason}"), cluster.name)
    return out


def _preempt_for_pod(
    decision: _Decision,
    cluster: ClusterState,
    spec: PodSpec,
    shape: PodShape,
    reclaimed: list[preemption.Unit],
    plan: preemption.PodPlan,
    from_queue: bool,
    choice: Choice | None = None,
) -> None:
    """Evict the victims, place the pod on the node they freed (nominated: nothing else takes it first),
    then requeue the victims and let the rest of what they freed go to the queue."""
    victims = _victim_events(decision, cluster, spec.pod_id, "pod", reclaimed, "reclaim")
    victims += _victim_events(decision, cluster, spec.pod_id, "pod", plan.units, "priority")
    policy = _cluster_policy(cluster)
    if choice is None:
        choice = Choice(plan.node_id, policy.choose_gpus(cluster.nodes[plan.node_id], shape), {})
    if plan.units:
        highest, count, work = plan.cost
        choice.scores = {
            **choice.scores,
            "victim_priority": float(highest),
            "victims": float(count),
            "gpu_seconds_lost": work / 1e6,
        }
    decision.emit(
        PodScheduled(
            spec,
            choice.node_id,
            choice.gpus,
            policy.name,
            from_queue,
            choice.scores,
            tuple(pod.spec.pod_id for pod, _ in victims),
        ),
        cluster.name,
    )
    _holder_started(decision, cluster, spec.pod_id)
    _after_preemption(decision, cluster, victims)


def _after_preemption(decision: _Decision, cluster: ClusterState, victims: list[tuple[Pod, str]]) -> None:
    """Victims back to placement (gangs first, as after any eviction), then what they freed to the queue."""
    plain = [pod for pod, _ in victims if pod.spec.gang_id is None]
    gang_ids = sorted({pod.spec.gang_id for pod, _ in victims if pod.spec.gang_id is not None})
    _after_eviction(decision, cluster, plain, [g for g in gang_ids if g in cluster.gangs], "preempted")
    _capacity_grew(decision, cluster, tuple(sorted({node_id for _, node_id in victims})))


def _cluster_policy(cluster: ClusterState) -> Policy:
    policy = get_policy(cluster.policy)
    if policy is None:
        raise InvariantViolation(f"cluster {cluster.name!r} has unknown policy {cluster.policy!r}")
    return policy


def _gang_shortfall(cluster: ClusterState, spec: GangSpec, placement: gangs.GangPlacement) -> quotas.Shortfall | None:
    """Whether the gang's quota has room for this placement (each member counted on its node's model)."""
    quota = quotas.quota_of(cluster, spec.tenant)
    if quota is None:
        return None
    return quotas.check(cluster, spec.tenant, quota, _gang_demand(cluster, quota, placement))


def _gang_demand(cluster: ClusterState, quota: Quota, placement: gangs.GangPlacement) -> quotas.Demand:
    wanted: quotas.Demand = {}
    for member, choice in placement.placed:
        quotas.add(wanted, quotas.demand(quota, member, cluster.nodes[choice.node_id].gpu_model))
    return wanted


def _place_gang(
    decision: _Decision,
    cluster: ClusterState,
    spec: GangSpec,
    *,
    from_queue: bool,
    requeued: bool,
    new: bool = False,
    announce: bool | None = None,
) -> bool:
    """Place every member (at least min_members) in one outcome, or queue the gang with reasons (as ``_place``)."""
    if new:
        blocked = _blocked_by_earlier(cluster, (-spec.priority, spec.arrival, spec.gang_id))
        if blocked is not None:
            decision.emit(GangQueued(spec.gang_id, (blocked,), spec, requeued), cluster.name)
            return False
    policy = _cluster_policy(cluster)
    found = gangs.try_place(cluster, spec, policy, decision.now)
    may_preempt = spec.preemption == PREEMPT_LOWER and decision.may_preempt
    reasons: tuple[QueueReason, ...] = ()
    if isinstance(found, gangs.GangPlacement):
        shortfall = _gang_shortfall(cluster, spec, found) if cluster.quotas_on else None
        if shortfall is None:
            _emit_gang_placement(decision, cluster, spec, found, from_queue)
            return True
        if may_preempt and shortfall.reclaimable and _reclaim_for_gang(decision, cluster, spec, from_queue):
            return True
        reasons = (QueueReason(QueueReasonCode.QUOTA_EXCEEDED, 0, shortfall.message),)
    else:
        reasons = found
        if may_preempt and preemption.lower_priority_exists(cluster, spec.priority):

            def admit(placement: gangs.GangPlacement) -> bool:
                return not cluster.quotas_on or _gang_shortfall(cluster, spec, placement) is None

            plan = preemption.plan_gang(cluster, spec, policy, decision.now, admit)
            if plan is not None:
                victims = _victim_events(decision, cluster, spec.gang_id, "gang", plan.units, "priority")
                _emit_gang_placement(
                    decision, cluster, spec, plan.placement, from_queue, tuple(p.spec.pod_id for p, _ in victims)
                )
                _after_preemption(decision, cluster, victims)
                return True
    if (not from_queue) if announce is None else announce:
        decision.emit(GangQueued(spec.gang_id, reasons, spec, requeued), cluster.name)
    return False


def _reclaim_for_gang(decision: _Decision, cluster: ClusterState, spec: GangSpec, from_queue: bool) -> bool:
    """A lender's gang within its nominal quota: reclaim from borrowers on trial until its placement fits."""
    quota = quotas.quota_of(cluster, spec.tenant)
    assert quota is not None
    policy = _cluster_policy(cluster)
    trial = preemption.Trial(cluster)
    units: list[preemption.Unit] = []
    try:
        for _ in range(len(spec.members) + 8):  # each round evicts a borrower; the placement may change
            found = gangs.try_place(cluster, spec, policy, decision.now)
            if not isinstance(found, gangs.GangPlacement):
                return False
            taken = _reclaim_on_trial(cluster, trial, spec.tenant, quota, _gang_demand(cluster, quota, found))
            if taken is None:
                return False
            if not taken:
                break
            units.extend(taken)
        else:
            return False
    finally:
        trial.rollback()
    victims = _victim_events(decision, cluster, spec.gang_id, "gang", units, "reclaim")
    found = gangs.try_place(cluster, spec, policy, decision.now)
    if not isinstance(found, gangs.GangPlacement):
        raise InvariantViolation(f"gang {spec.gang_id!r} does not fit after reclaiming its quota")
    _emit_gang_placement(decision, cluster, spec, found, from_queue, tuple(p.spec.pod_id for p, _ in victims))
    _after_preemption(decision, cluster, victims)
    return True


def _emit_gang_placement(
    decision: _Decision,
    cluster: ClusterState,
    spec: GangSpec,
    found: gangs.GangPlacement,
    from_queue: bool,
    preempted: tuple[str, ...] = (),
) -> None:
    """``GangScheduled`` with every placed member, then each member's ``PodScheduled``: one outcome."""
    policy = _cluster_policy(cluster)
    members = tuple(MemberPlacement(member.pod_id, choice.node_id, choice.gpus) for member, choice in found.placed)
    decision.emit(
        GangScheduled(
            spec.gang_id, members, spec, found.topology_key, found.domain, from_queue, found.message, preempted
        ),
        cluster.name,
    )
    for member, choice in found.placed:
        decision.emit(
            PodScheduled(member, choice.node_id, choice.gpus, policy.name, from_queue, choice.scores), cluster.name
        )
    _holder_started(decision, cluster, spec.gang_id)


def _holder_started(decision: _Decision, cluster: ClusterState, job_id: str) -> None:
    """The job that held the reservation started: its nodes go back to everyone at once."""
    reservation = cluster.reservation
    if reservation is not None and reservation.holder_id == job_id:
        _release_reservation(decision, cluster, "started")


def _evict_all(decision: _Decision, cluster: ClusterState, node: Node, reason: str) -> tuple[list[Pod], list[str]]:
    """Evict every pod of the node, in pod id order: (plain pods to re-place, gangs hit).

    Sorted, not in placement order, so a state restored from a snapshot evicts
    in the same order as one built by full replay."""
    plain: list[Pod] = []
    gang_ids: dict[str, None] = {}
    for pod_id in sorted(node.pods):
        pod = cluster.pods[pod_id]
        decision.emit(PodEvicted(pod_id, node.node_id, reason), cluster.name)
        if pod.spec.gang_id is None:
            plain.append(pod)
        else:
            gang_ids[pod.spec.gang_id] = None
    return plain, sorted(gang_ids)


def _after_eviction(
    decision: _Decision, cluster: ClusterState, evicted: list[Pod], gang_ids: list[str], reason: str
) -> None:
    """Gangs hit by an eviction, then the evicted plain pods, go back to placement."""
    for gang_id in gang_ids:
        _gang_lost_members(decision, cluster, cluster.gangs[gang_id], reason)
    for pod in sorted(evicted, key=lambda p: p.queue_key):
        _place(decision, cluster, pod.spec, pod.shape, from_queue=False, requeued=True)
    _capacity_grew(decision, cluster, ())  # their tenants' quota has room again (with quotas only)


def _gang_lost_members(decision: _Decision, cluster: ClusterState, gang: Gang, reason: str) -> None:
    """Some members were evicted: the gang keeps running if at least min_members still run (the lost
    ones end), else every member is evicted and the gang goes back to the queue (training restarts)."""
    lost = [pod_id for pod_id in gang.placed if not cluster.pods[pod_id].running]
    still = len(gang.placed) - len(lost)
    if still >= gang.spec.min_members:
        for pod_id in sorted(lost):
            decision.emit(PodReleased(pod_id, None, EVICTED_MEMBER + reason), cluster.name)
            _wake_dependants(decision, cluster, pod_id)
        return
    freed = []
    for pod_id in sorted(gang.placed):
        pod = cluster.pods[pod_id]
        if pod.running:
            freed.append(pod.node_id)
            decision.emit(PodEvicted(pod_id, pod.node_id, f"gang:{reason}"), cluster.name)  # type: ignore[arg-type]
    # Back to the queue (its members stop being pods), then placed again at once if it fits (and its quota
    # has room), else it may still reclaim or preempt like any queued gang.
    spec = gang.spec
    found = gangs.try_place(cluster, spec, _cluster_policy(cluster), decision.now)
    placed = isinstance(found, gangs.GangPlacement)
    reasons: tuple[QueueReason, ...] = () if placed else found  # type: ignore[assignment]
    if placed and cluster.quotas_on:
        shortfall = _gang_shortfall(cluster, spec, found)  # type: ignore[arg-type]
        if shortfall is not None:
            placed, reasons = False, (QueueReason(QueueReasonCode.QUOTA_EXCEEDED, 0, shortfall.message),)
    decision.emit(GangQueued(gang.gang_id, reasons, spec, True), cluster.name)
    if placed:
        _emit_gang_placement(decision, cluster, spec, found, True)  # type: ignore[arg-type]
    elif spec.preemption == PREEMPT_LOWER and decision.may_preempt:
        _place_gang(decision, cluster, spec, from_queue=True, requeued=True, announce=False)
    _capacity_grew(decision, cluster, tuple(n for n in dict.fromkeys(freed) if n is not None))


def _capacity_grew(
    decision: _Decision, cluster: ClusterState, node_ids: tuple[str, ...], tenants: set[str] | None = None
) -> None:
    """Place queued pods and gangs after capacity grew on some nodes, or quota for some tenants.

    Invariant: after every command no queued job fits anywhere it may go, within its quota
    (strict FIFO and reservations aside), and none that may preempt could make room by
    preempting lower-priority pods. So only groups (tenant, preemption, shape) that fit a
    changed node, or could preempt there, can start now, and gangs with a member that
    could; plus, on the whole cluster, the work of ``tenants`` and of tenants whose running
    pods stopped in this command (their quota, and their cohort's pool, grew). Candidates
    are taken in queue order (priority, then FIFO; with quotas, priority, then the tenant's
    weighted dominant share, then FIFO), and a group that cannot start is dropped as a
    whole. Work: O(Q + G) to screen the Q waiting groups and G queued gangs, plus
    O(S_m + log) per pod placed. Under strict FIFO, only the head may start.
    """
    freed = decision.freed.pop(cluster.name, None) if decision.freed else None
    if freed:
        tenants = (tenants or set()) | _with_peers(cluster, set(freed))
    if not cluster.queue.size and not cluster.gang_queue:
        return
    if not node_ids and not tenants:
        return
    if cluster.queue_order == STRICT_FIFO:
        _start_heads(decision, cluster)
        return
    index = cluster.index
    signatures = [signature for signature in map(index.signature_of, node_ids) if signature is not None]
    changed = [node for node in (lookup(cluster.nodes, n) for n in node_ids) if node is not None and node.schedulable]
    if not signatures and not tenants:
        return
    now = decision.now
    fits = index.fits
    fair = cluster.quotas_on
    preempting = decision.may_preempt and bool(changed)
    heap: list[tuple[tuple[Any, ...], int, Any, tuple[int, int, str], tuple[str, ...] | None]] = []
    for key, group in cluster.queue.heads():
        tenant, mode, shape = group
        usable = reservations.usable_shape(cluster, key[2], shape, now)
        near: tuple[str, ...] | None = node_ids
        if tenants and tenant in tenants:
            near = None
        elif not any(fits(signature, usable) for signature in signatures) and not (
            preempting and mode == PREEMPT_LOWER and _may_preempt_on(cluster, usable, -key[0], changed)
        ):
            continue
        heap.append((_order(cluster, key, tenant, fair), 0, group, key, near))
    for key in cluster.gang_queue:
        spec = cluster.gangs[key[2]].spec
        if not (
            (tenants and spec.tenant in tenants)
            or gangs.may_use(cluster, spec, signatures, now)
            or (preempting and spec.preemption == PREEMPT_LOWER and _gang_may_preempt_on(cluster, spec, changed, now))
        ):
            continue
        heap.append((_order(cluster, key, spec.tenant, fair), 1, None, key, None))
    heapq.heapify(heap)
    while heap:
        order, kind, group, key, near = heapq.heappop(heap)
        if fair:  # shares grew with every placement since this entry was pushed: look again
            fresh = _order(cluster, key, group[0] if kind == 0 else cluster.gangs[key[2]].spec.tenant, fair)
            if fresh != order:
                heapq.heappush(heap, (fresh, kind, group, key, near))
                continue
        if kind == 1:
            queued = cluster.gangs.get(key[2])
            if queued is not None and queued.state == GANG_QUEUED:
                _place_gang(decision, cluster, queued.spec, from_queue=True, requeued=False)
            continue
        head = cluster.queue.head(group)
        if head != key:  # placed meanwhile (a released reservation retried these nodes first)
            if head is not None:
                heapq.heappush(heap, (_order(cluster, head, group[0], fair), 0, group, head, near))
            continue
        pod = cluster.pods[key[2]]
        if not _place(decision, cluster, pod.spec, pod.shape, from_queue=True, requeued=False, near=near):
            continue
        following = cluster.queue.head(group)
        if following is not None:
            heapq.heappush(heap, (_order(cluster, following, group[0], fair), 0, group, following, near))


def _order(cluster: ClusterState, key: tuple[int, int, str], tenant: str, fair: bool) -> tuple[Any, ...]:
    """Retry order: priority, then (with quotas) the tenant's weighted dominant share, then FIFO."""
    if not fair:
        return key
    return (key[0], quotas.dominant_share(cluster, tenant), key[1], key[2])


def _may_preempt_on(cluster: ClusterState, shape: PodShape, priority: int, nodes: list[Node]) -> bool:
    if not preemption.lower_priority_exists(cluster, priority):
        return False
    return any(preemption.could_preempt_on(node, shape, priority, cluster) for node in nodes)


def _gang_may_preempt_on(cluster: ClusterState, spec: GangSpec, nodes: list[Node], now: int) -> bool:
    if not preemption.lower_priority_exists(cluster, spec.priority):
        return False
    shapes = {reservations.usable_shape(cluster, spec.gang_id, shape_of(member), now) for member in spec.members}
    return any(_may_preempt_on(cluster, shape, spec.priority, nodes) for shape in sorted(shapes))


def _start_heads(decision: _Decision, cluster: ClusterState) -> None:
    """Strict FIFO: start jobs from the head of the queue until one does not fit."""
    while True:
        head = cluster.head()
        if head is None:
            return
        key, kind = head
        if kind == "gang":
            if not _place_gang(decision, cluster, cluster.gangs[key[2]].spec, from_queue=True, requeued=False):
                return
        else:
            pod = cluster.pods[key[2]]
            if not _place(decision, cluster, pod.spec, pod.shape, from_queue=True, requeued=False):
                return


# ---------------------------------------------------------------- defragmentation


def _run_defragment(decision: _Decision, cluster: ClusterState, command: Defragment) -> None:
    """Plan migrations on trial (``processor.core.defrag``), then emit them: ``DefragmentationPlanned``, one
    ``PodMigrated`` per move, the target's placement (nominated: it goes first), then the queue."""
    target = command.target
    name = decision.command.cluster
    pod = gang = None
    if target is not None:
        pod = lookup(cluster.pods, target)
        gang = cluster.gangs.get(target)
        if pod is None and gang is None:
            raise Rejected(
                RejectionCode.UNKNOWN_POD, f"target {target!r} is neither a pod nor a gang in cluster {name!r}"
            )
        if (pod is not None and not pod.queued) or (gang is not None and gang.state != GANG_QUEUED):
            running = (pod is not None and pod.running) or (gang is not None and gang.state == GANG_RUNNING)
            what = "running" if running else "waiting for its dependencies, outside the queue"
            raise Rejected(
                RejectionCode.NOT_WAITING,
                f"target {target!r} is {what}: only a job waiting in the queue has something to make room for",
            )
    if command.max_moves == 0:
        decision.emit(DefragmentationPlanned(0, 0, 0, target, "a budget of 0 moves: nothing was moved"))
        return
    if not defrag.movable_pods(cluster):
        message = "no running pod is movable (submitted with movable=true): nothing was moved"
        decision.emit(DefragmentationPlanned(0, 0, 0, target, message))
        return
    if target is None:
        plan = defrag.consolidate(cluster, command.max_moves)
    else:
        plan = _plan_room(decision, cluster, target, pod, gang, command.max_moves)
    moves = plan.moves
    if moves:
        freed = f"freeing {plan.gpus_freed} whole GPU(s)" + (
            f" and {plan.nodes_freed} node(s)" if plan.nodes_freed else ""
        )
        message = f"{len(moves)} move(s) of movable pods (budget {command.max_moves}), {freed}"
        if target is not None:
            message += f", to make room for {target!r}"
    else:
        message = plan.note or "nothing to move"
    decision.emit(DefragmentationPlanned(len(moves), plan.gpus_freed, plan.nodes_freed, target, message))
    for move in moves:
        decision.emit(
            PodMigrated(move.pod_id, move.from_node, move.from_gpus, move.to_node, move.to_gpus, "defragment", move.why)
        )
    sources = tuple(sorted({move.from_node for move in moves}))
    if moves and pod is not None:
        _place(decision, cluster, pod.spec, pod.shape, from_queue=True, requeued=False)
    elif moves and gang is not None:
        _place_gang(decision, cluster, gang.spec, from_queue=True, requeued=False)
    _capacity_grew(decision, cluster, sources)


def _plan_room(
    decision: _Decision, cluster: ClusterState, target: str, pod: Pod | None, gang: Gang | None, budget: int
) -> defrag.Plan:
    """Moves that let a waiting pod (or every member of a waiting gang) start, checked on trial; or none."""
    now = decision.now
    trial = defrag.Trial(cluster)
    placed = preemption.Trial(cluster)
    why = f"making room for {'pod' if pod is not None else 'gang'} {target!r}"
    try:
        if pod is not None:
            shape: PodShape | None = reservations.usable_shape(cluster, target, pod.shape, now)
            if cluster.quotas_on:
                shape = quotas.admit(cluster, pod.spec, shape).shape  # type: ignore[arg-type]
            if shape is None:
                return defrag.Plan(note=f"pod {target!r} is over its tenant's quota: moving pods would not help")
            if defrag.make_room(cluster, trial, shape, budget, why) is None or not cluster.index.feasible(shape):
                return defrag.Plan(note=f"no node can hold pod {target!r} after at most {budget} move(s)")
        else:
            assert gang is not None
            policy = _cluster_policy(cluster)
            for member in gangs.ordered_members(gang.spec):
                shape = reservations.usable_shape(cluster, target, shape_of(member), now)
                groups = cluster.index.feasible(shape)
                if groups:
                    placed.allocate(member, policy.place(cluster, shape, groups))
                    continue
                node_id = defrag.make_room(cluster, trial, shape, budget - len(trial.moves), why)
                if node_id is None:
                    return defrag.Plan(note=f"no room for gang {target!r} after at most {budget} move(s)")
                node = cluster.nodes[node_id]
                placed.allocate(member, Choice(node_id, policy.choose_gpus(node, shape), {}))
            placed.rollback()
            found = gangs.try_place(cluster, gang.spec, policy, now)
            if not isinstance(found, gangs.GangPlacement) or (
                cluster.quotas_on and _gang_shortfall(cluster, gang.spec, found) is not None
            ):
                return defrag.Plan(note=f"gang {target!r} would still not start after the moves")
        moves = list(trial.moves)
        after = defrag.tally(cluster, moves)
    finally:
        placed.rollback()
        trial.rollback()
    before = defrag.tally(cluster, moves)
    return defrag.Plan(moves, max(0, after[0] - before[0]), max(0, after[1] - before[1]))


# ---------------------------------------------------------------- dependencies


def _wake_dependants(decision: _Decision, cluster: ClusterState, job_id: str) -> None:
    """After ``job_id`` ended: fail its afterok dependants if it ended badly, start those with nothing left."""
    waiters = cluster.dependants.get(job_id) if cluster.dependants else None
    if not waiters:
        return
    for waiter in sorted(waiters):
        _recheck_waiter(decision, cluster, waiter)


def _recheck_waiter(decision: _Decision, cluster: ClusterState, waiter: str) -> None:
    pod = lookup(cluster.pods, waiter)
    if pod is not None and not pod.queued and not pod.running:
        spec = pod.spec
        failed = dependencies.failed_dependency(cluster, spec.depends_on, spec.dependency)
        if failed is not None:
            _fail_dependant(decision, cluster, waiter, "pod", failed, spec)
        elif not dependencies.unmet(cluster, spec.depends_on):
            _place(decision, cluster, spec, pod.shape, from_queue=True, requeued=False, new=True, announce=True)
        return
    gang = cluster.gangs.get(waiter)
    if gang is not None and gang.state == GANG_WAITING:
        failed = dependencies.failed_dependency(cluster, gang.spec.depends_on, gang.spec.dependency)
        if failed is not None:
            _fail_dependant(decision, cluster, waiter, "gang", failed, gang.spec)
        elif not dependencies.unmet(cluster, gang.spec.depends_on):
            _place_gang(decision, cluster, gang.spec, from_queue=True, requeued=False, new=True, announce=True)


def _fail_dependant(
    decision: _Decision, cluster: ClusterState, job_id: str, kind: str, failed: str, spec: PodSpec | GangSpec
) -> None:
    """An afterok dependency ended without success: the job will never start."""
    message = f"{kind} {job_id!r} will not start: its afterok dependency {failed!r} ended without success"
    known = lookup(cluster.pods, job_id) if kind == "pod" else cluster.gangs.get(job_id)
    if known is None:  # a new submission: it enters the fold waiting, then fails at once
        waiting = QueueReason(QueueReasonCode.WAITING_FOR_DEPENDENCY, 0, message)
        if isinstance(spec, PodSpec):
            decision.emit(PodQueued(spec, (waiting,), False, (failed,)), cluster.name)
        else:
            decision.emit(GangQueued(job_id, (waiting,), spec, False, (failed,)), cluster.name)
    decision.emit(DependencyFailed(job_id, kind, failed, message), cluster.name)
    if kind == "pod":
        decision.emit(PodReleased(job_id, None, "dependency_failed"), cluster.name)
    else:
        decision.emit(GangReleased(job_id, "dependency_failed", False), cluster.name)
    _wake_dependants(decision, cluster, job_id)


# ---------------------------------------------------------------- time and reservations


def _fire_timers(decision: _Decision, until: int) -> None:
    """Fire every timer whose deadline is at most ``until``, in order, each at its deadline."""
    timers = decision.state.timers
    clusters = decision.state.clusters
    while True:
        timer = timers.pop_due(until)
        if timer is None:
            return
        deadline, kind, name, job_id = timer
        cluster = lookup(clusters, name)
        if cluster is None:
            continue
        if deadline > decision.now:
            decision.now = deadline
        _TIMER_HANDLERS[kind](decision, cluster, job_id, deadline)


def _time_limit_reached(decision: _Decision, cluster: ClusterState, pod_id: str, deadline: int) -> None:
    pod = lookup(cluster.pods, pod_id)
    limit = pod.spec.time_limit_ms if pod is not None else None
    if pod is None or limit is None or not pod.running or pod.started_at is None:
        return
    if pod.started_at + limit != deadline:
        return
    decision.emit(PodTimeLimitReached(pod_id, pod.node_id, limit, pod.spec.gang_id), cluster.name)  # type: ignore[arg-type]
    _release_pod(decision, cluster, pod, "time_limit")


def _gang_timed_out(decision: _Decision, cluster: ClusterState, gang_id: str, deadline: int) -> None:
    gang = cluster.gangs.get(gang_id)
    if gang is None or gang.state == GANG_RUNNING or gang.spec.timeout_ms is None:
        return
    if gang.spec.submitted_at + gang.spec.timeout_ms != deadline:
        return
    waited = decision.now - gang.spec.submitted_at
    decision.emit(
        GangTimedOut(
            gang_id, waited, f"gang {gang_id!r} did not start within its timeout of {gang.spec.timeout_ms} ms"
        ),
        cluster.name,
    )
    _end_gang(decision, cluster, gang, "timed_out")


def _reservation_due(decision: _Decision, cluster: ClusterState, holder_id: str, deadline: int) -> None:
    """The expected start of a reservation passed and its holder has not started: plan it again."""
    reservation = cluster.reservation
    if reservation is None or reservation.holder_id != holder_id or reservation.expected_start != deadline:
        return
    if reservations.holder_waiting(cluster, reservation):
        _release_reservation(decision, cluster, "expected_start_passed")


def _reserve_check(decision: _Decision, cluster: ClusterState, job_id: str, deadline: int) -> None:
    _reservation_upkeep(decision, cluster)


_TIMER_HANDLERS: dict[int, Callable[[_Decision, ClusterState, str, int], None]] = {
    TIME_LIMIT: _time_limit_reached,
    RESERVATION_START: _reservation_due,
    GANG_TIMEOUT: _gang_timed_out,
    RESERVE_CHECK: _reserve_check,
}


def _upkeep(decision: _Decision) -> None:
    """After the command: queued work of tenants whose quota grew, reservations of the clusters it
    touched, then timers that came due."""
    clusters = decision.state.clusters
    if decision.freed:
        for name in sorted(decision.freed):
            cluster = lookup(clusters, name)
            if cluster is not None:
                _capacity_grew(decision, cluster, ())
        decision.freed.clear()
    touched = decision.touched
    for name in touched if len(touched) == 1 else sorted(touched):
        cluster = lookup(clusters, name)
        # Nothing to keep without a queue or a reservation: the common case, answered without a call.
        if cluster is not None and (cluster.queue.size or cluster.gang_queue or cluster.reservation is not None):
            _reservation_upkeep(decision, cluster)
    heap = decision.state.timers.heap
    if heap and heap[0][0] <= decision.now:
        _fire_timers(decision, decision.now)


def _release_reservation(decision: _Decision, cluster: ClusterState, reason: str) -> None:
    reservation = cluster.reservation
    if reservation is None:
        return
    nodes = tuple(node_id for node_id in reservation.nodes if node_id in cluster.nodes)
    decision.emit(
        ReservationReleased(
            reservation.holder_id,
            reservation.holder_kind,
            reservation.nodes,
            reason,
            reservations.release_message(reservation, reason),
        ),
        cluster.name,
    )
    _capacity_grew(decision, cluster, nodes)


def _drop_reserved_node(decision: _Decision, cluster: ClusterState, node: Node, reason: str) -> None:
    """A reserved node becomes unusable: the reservation is released (and planned again after the command)."""
    if node.reserved_for is not None and cluster.reservation is not None:
        _release_reservation(decision, cluster, reason)


def _reservation_upkeep(decision: _Decision, cluster: ClusterState) -> None:
    """Keep the reservation with the head of the queue, Slurm's backfill rule.

    The head (priority, then age) that has waited ``reserve_after_ms`` gets the nodes
    where it will start soonest; a reservation whose holder left the queue, or that a
    new head past its wait supersedes, is released. Releasing lets the queue move, so
    this looks again until it settles (a few rounds at most: each round releases or
    makes one reservation). O(1) unless a reservation is planned. A v1 command (whose
    contract had no reservations) leaves them to the next command of today's contract.
    """
    if decision.command.contract == "v1":
        return
    for _ in range(8):
        if not _reservation_step(decision, cluster):
            return


def _reservation_step(decision: _Decision, cluster: ClusterState) -> bool:
    """One round of upkeep; True if it released a reservation (the queue may have moved)."""
    reservation = cluster.reservation
    if reservation is not None and not reservations.holder_waiting(cluster, reservation):
        started = reservations.holder_started(cluster, reservation)
        _release_reservation(decision, cluster, "started" if started else "holder_left")
        return True
    if cluster.reserve_after_ms < 0:
        if reservation is not None:
            _release_reservation(decision, cluster, "reservations_off")
            return True
        return False
    head = cluster.head()
    if head is None:
        return False
    key, kind = head
    if reservation is not None and reservation.holder_id == key[2]:
        return False
    holder = cluster.pods[key[2]].spec if kind == "pod" else cluster.gangs[key[2]].spec
    deadline = holder.submitted_at + cluster.reserve_after_ms
    if decision.now < deadline:
        decision.state.timers.push(deadline, RESERVE_CHECK, cluster.name)
        return False
    if reservation is not None:
        _release_reservation(decision, cluster, "superseded")
        return True
    plan = reservation_planner.plan(cluster, key[2], kind, _cluster_policy(cluster), decision.now)
    if plan is None:
        return False
    nodes, expected_start = plan
    waited = decision.now - holder.submitted_at
    decision.emit(
        NodesReserved(
            key[2],
            kind,
            nodes,
            expected_start,
            reservations.reserve_message(kind, key[2], nodes, expected_start, waited, decision.now),
        ),
        cluster.name,
    )
    return False


# ---------------------------------------------------------------- apply


def apply(state: PartitionState, event: Event) -> None:
    """Fold one event into the state, in place. Raises InvariantViolation on a broken invariant."""
    if event.sequence != state.sequence:
        raise InvariantViolation(f"event sequence {event.sequence} applied to state expecting {state.sequence}")
    payload = event.payload
    kind = type(payload)
    if kind is not CommandRejected and kind is not Ticked:
        _APPLIERS[kind](state, state.cluster(event.cluster), payload, event.occurred_at)
    state.sequence = event.sequence + 1
    if event.command_offset >= state.next_offset:
        state.next_offset = event.command_offset + 1
    if event.occurred_at > state.clock:
        state.clock = event.occurred_at
    state.remember(event.command_id)


def _node_of(cluster: ClusterState, node_id: str) -> Node:
    node = lookup(cluster.nodes, node_id)
    if node is None:
        raise InvariantViolation(f"event refers to unknown node {node_id!r}")
    return node


def _applied_node_added(state: PartitionState, cluster: ClusterState, event: NodeAdded, now: int) -> None:
    if event.node_id in cluster.nodes:
        raise InvariantViolation(f"node {event.node_id!r} added twice")
    node = Node(
        event.node_id, event.gpu_model, event.gpu_count, event.cpu_milli, event.memory_mib, event.labels, event.taints
    )
    cluster.nodes[node.node_id] = node
    cluster.model_nodes[node.gpu_model] = cluster.model_nodes.get(node.gpu_model, 0) + 1
    cluster.gpu_milli_capacity += node.gpu_count * GPU_MILLI
    cluster.cpu_capacity += node.cpu_milli
    cluster.memory_capacity += node.memory_mib
    cluster.count_node(node, +1)
    cluster.reindex(node)


def _applied_node_removed(state: PartitionState, cluster: ClusterState, event: NodeRemoved, now: int) -> None:
    node = _node_of(cluster, event.node_id)
    if node.pods:
        raise InvariantViolation(f"node {event.node_id!r} removed while running pods")
    if node.reserved_for is not None:
        raise InvariantViolation(f"node {event.node_id!r} removed while reserved")
    del cluster.nodes[event.node_id]
    cluster.index.remove(event.node_id)
    cluster.preemptible.touch(event.node_id)
    cluster.count_node(node, -1)
    cluster.model_nodes[node.gpu_model] -= 1
    if not cluster.model_nodes[node.gpu_model]:
        del cluster.model_nodes[node.gpu_model]
    if not node.failed:
        cluster.gpu_milli_capacity -= node.gpu_count * GPU_MILLI
        cluster.cpu_capacity -= node.cpu_milli
        cluster.memory_capacity -= node.memory_mib


def _applied_node_cordoned(
    state: PartitionState, cluster: ClusterState, event: NodeCordoned | NodeDrained, now: int
) -> None:
    node = _node_of(cluster, event.node_id)
    node.cordoned = True
    cluster.reindex(node)


def _applied_node_uncordoned(state: PartitionState, cluster: ClusterState, event: NodeUncordoned, now: int) -> None:
    node = _node_of(cluster, event.node_id)
    node.cordoned = False
    cluster.reindex(node)


def _applied_node_failed(state: PartitionState, cluster: ClusterState, event: NodeFailed, now: int) -> None:
    node = _node_of(cluster, event.node_id)
    node.failed = True
    cluster.gpu_milli_capacity -= node.gpu_count * GPU_MILLI
    cluster.cpu_capacity -= node.cpu_milli
    cluster.memory_capacity -= node.memory_mib
    cluster.reindex(node)


def _pod_for(cluster: ClusterState, spec: PodSpec) -> Pod:
    """The pod an event is about: known (waiting, queued or evicted) or newly submitted."""
    pod = lookup(cluster.pods, spec.pod_id)
    if pod is None:
        pod = cluster.pods[spec.pod_id] = Pod(spec, shape_of(spec))
        cluster.count_shape(pod.shape, +1)
        if spec.arrival >= cluster.arrivals and spec.gang_id is None:
            cluster.arrivals = spec.arrival + 1
            cluster.learn_typical()
    elif pod.running:
        raise InvariantViolation(f"pod {spec.pod_id!r} is already running on {pod.node_id!r}")
    elif pod.queued:
        cluster.queue.remove(pod.group, pod.queue_key)
        pod.queued = False
    if pod.waiting_for:
        cluster.stop_waiting(spec.pod_id, pod.waiting_for)
        pod.waiting_for = ()
    return pod


def _applied_pod_queued(state: PartitionState, cluster: ClusterState, event: PodQueued, now: int) -> None:
    pod = _pod_for(cluster, event.pod)
    if event.waiting_for:
        pod.waiting_for = tuple(event.waiting_for)
        cluster.wait_on(event.pod.pod_id, pod.waiting_for)
        return
    pod.queued = True
    cluster.queue.push(pod.group, pod.queue_key)


def _applied_pod_scheduled(state: PartitionState, cluster: ClusterState, event: PodScheduled, now: int) -> None:
    node = _node_of(cluster, event.node_id)
    if not node.schedulable:
        raise InvariantViolation(f"pod {event.pod.pod_id!r} scheduled on unschedulable node {node.node_id!r}")
    gang_id = event.pod.gang_id
    if gang_id is not None:
        gang = cluster.gangs.get(gang_id)
        if gang is None or gang.state != GANG_RUNNING or event.pod.pod_id not in gang.placed:
            raise InvariantViolation(f"member {event.pod.pod_id!r} scheduled outside its gang's GangScheduled")
    pod = _pod_for(cluster, event.pod)
    node.allocate(pod.spec, event.gpus, now)
    pod.node_id = node.node_id
    pod.gpus = event.gpus
    pod.started_at = now
    cluster.gpu_milli_allocated += pod.spec.gpu_milli_total
    cluster.charge(pod, node, +1)
    cluster.reindex(node)
    if pod.spec.time_limit_ms is not None:
        state.timers.push(now + pod.spec.time_limit_ms, TIME_LIMIT, cluster.name, pod.spec.pod_id)


def _unbind(cluster: ClusterState, pod: Pod) -> None:
    node = _node_of(cluster, pod.node_id)  # type: ignore[arg-type]
    cluster.charge(pod, node, -1)
    node.free(pod.spec, pod.gpus)
    pod.node_id = None
    pod.gpus = ()
    pod.started_at = None
    cluster.gpu_milli_allocated -= pod.spec.gpu_milli_total
    cluster.reindex(node)


def _applied_pod_evicted(state: PartitionState, cluster: ClusterState, event: PodEvicted, now: int) -> None:
    pod = lookup(cluster.pods, event.pod_id)
    if pod is None or pod.node_id != event.node_id:
        raise InvariantViolation(f"pod {event.pod_id!r} evicted from {event.node_id!r} where it does not run")
    _unbind(cluster, pod)


def _applied_pod_released(state: PartitionState, cluster: ClusterState, event: PodReleased, now: int) -> None:
    pod = cluster.pods.pop(event.pod_id, None)
    if pod is None:
        raise InvariantViolation(f"unknown pod {event.pod_id!r} released")
    cluster.count_shape(pod.shape, -1)
    ok = pod.running and event.reason == COMPLETED
    if pod.running:
        _unbind(cluster, pod)
    elif pod.queued:
        cluster.queue.remove(pod.group, pod.queue_key)
    if pod.waiting_for:
        cluster.stop_waiting(event.pod_id, pod.waiting_for)
    gang_id = pod.spec.gang_id
    if gang_id is not None:
        gang = cluster.gangs.get(gang_id)
        if gang is not None:
            gang.placed.pop(event.pod_id, None)
            if not event.reason.startswith(EVICTED_MEMBER):
                gang.ok = gang.ok and ok
    cluster.remember_end(event.pod_id, ok)


def _applied_policy_changed(state: PartitionState, cluster: ClusterState, event: PolicyChanged, now: int) -> None:
    cluster.policy = event.policy
    if event.reserve_after_ms is not None:
        cluster.reserve_after_ms = event.reserve_after_ms
    if event.queue_order:
        cluster.queue_order = event.queue_order


def _gang_for(state: PartitionState, cluster: ClusterState, spec: GangSpec) -> Gang:
    """The gang an event is about: known, or newly submitted (then registered with its member ids)."""
    gang = cluster.gangs.get(spec.gang_id)
    if gang is None:
        gang = cluster.gangs[spec.gang_id] = Gang(spec, GANG_NEW)
        for member in spec.members:
            cluster.member_of[member.pod_id] = spec.gang_id
        if spec.arrival >= cluster.arrivals:
            cluster.arrivals = spec.arrival + 1
            cluster.learn_typical()
        if spec.timeout_ms is not None:
            state.timers.push(spec.submitted_at + spec.timeout_ms, GANG_TIMEOUT, cluster.name, spec.gang_id)
        return gang
    if gang.state == GANG_QUEUED:
        cluster.unqueue_gang(gang.key)
    elif gang.state == GANG_WAITING:
        cluster.stop_waiting(spec.gang_id, gang.waiting_for)
        gang.waiting_for = ()
    return gang


def _applied_gang_queued(state: PartitionState, cluster: ClusterState, event: GangQueued, now: int) -> None:
    gang = _gang_for(state, cluster, event.gang)
    if gang.state == GANG_RUNNING:  # requeued: its evicted members stop being pods until it starts again
        for pod_id in gang.placed:
            pod = cluster.pods.pop(pod_id)
            if pod.running:
                raise InvariantViolation(f"gang {gang.gang_id!r} requeued while member {pod_id!r} runs")
            cluster.count_shape(pod.shape, -1)
        gang.placed = {}
        gang.started_at = None
        gang.topology_key = gang.domain = None
        if gang.spec.timeout_ms is not None:
            state.timers.push(gang.spec.submitted_at + gang.spec.timeout_ms, GANG_TIMEOUT, cluster.name, gang.gang_id)
    if event.waiting_for:
        gang.state = GANG_WAITING
        gang.waiting_for = tuple(event.waiting_for)
        cluster.wait_on(gang.gang_id, gang.waiting_for)
    else:
        gang.state = GANG_QUEUED
        cluster.queue_gang(gang.key)


def _applied_gang_scheduled(state: PartitionState, cluster: ClusterState, event: GangScheduled, now: int) -> None:
    gang = _gang_for(state, cluster, event.gang)
    if gang.state == GANG_RUNNING:
        raise InvariantViolation(f"gang {gang.gang_id!r} scheduled while running")
    if len(event.members) < gang.spec.min_members:
        raise InvariantViolation(f"gang {gang.gang_id!r} scheduled with {len(event.members)} < min_members")
    gang.state = GANG_RUNNING
    gang.placed = dict.fromkeys(member.pod_id for member in event.members)
    gang.started_at = now
    gang.topology_key = event.topology_key
    gang.domain = event.domain
    gang.ok = True


def _applied_gang_released(state: PartitionState, cluster: ClusterState, event: GangReleased, now: int) -> None:
    gang = cluster.gangs.get(event.gang_id)
    if gang is None:
        raise InvariantViolation(f"unknown gang {event.gang_id!r} released")
    if gang.placed:
        raise InvariantViolation(f"gang {event.gang_id!r} released while {len(gang.placed)} member(s) run")
    if gang.state == GANG_QUEUED:
        cluster.unqueue_gang(gang.key)
    elif gang.state == GANG_WAITING:
        cluster.stop_waiting(gang.gang_id, gang.waiting_for)
    del cluster.gangs[event.gang_id]
    for member in gang.spec.members:
        cluster.member_of.pop(member.pod_id, None)
    cluster.remember_end(event.gang_id, event.ok)


def _applied_nothing(state: PartitionState, cluster: ClusterState, event: Any, now: int) -> None:
    """Events that explain what the next events do (the decision is in those)."""


def _applied_nodes_reserved(state: PartitionState, cluster: ClusterState, event: NodesReserved, now: int) -> None:
    if cluster.reservation is not None:
        raise InvariantViolation(f"cluster {cluster.name!r} reserved twice")
    cluster.reservation = Reservation(event.holder_id, event.holder_kind, tuple(event.nodes), event.expected_start, now)
    for node_id in event.nodes:
        node = _node_of(cluster, node_id)
        node.reserve(event.holder_id)
        cluster.reindex(node)
    if event.expected_start is not None:
        state.timers.push(event.expected_start, RESERVATION_START, cluster.name, event.holder_id)


def _applied_reservation_released(
    state: PartitionState, cluster: ClusterState, event: ReservationReleased, now: int
) -> None:
    reservation = cluster.reservation
    if reservation is None or reservation.holder_id != event.holder_id:
        raise InvariantViolation(f"reservation of {event.holder_id!r} released but not held")
    cluster.reservation = None
    for node_id in reservation.nodes:
        node = lookup(cluster.nodes, node_id)
        if node is not None:
            node.reserve(None)
            cluster.reindex(node)


def _applied_quota_changed(state: PartitionState, cluster: ClusterState, event: QuotaChanged, now: int) -> None:
    if event.tenant is None:
        cluster.default_quota = event.quota
    else:
        cluster.set_quota(event.tenant, event.quota)


def _applied_pod_migrated(state: PartitionState, cluster: ClusterState, event: PodMigrated, now: int) -> None:
    pod = lookup(cluster.pods, event.pod_id)
    if pod is None or pod.node_id != event.from_node or pod.gpus != tuple(event.from_gpus):
        raise InvariantViolation(f"pod {event.pod_id!r} migrated from {event.from_node!r} where it does not run")
    source = _node_of(cluster, event.from_node)
    target = _node_of(cluster, event.to_node)
    if not target.schedulable or (target is source and tuple(event.to_gpus) == pod.gpus):
        raise InvariantViolation(f"pod {event.pod_id!r} migrated to unschedulable node {event.to_node!r} or nowhere")
    cluster.charge(pod, source, -1)
    source.free(pod.spec, pod.gpus)
    target.allocate(pod.spec, tuple(event.to_gpus), pod.started_at)
    pod.node_id = target.node_id
    pod.gpus = tuple(event.to_gpus)
    cluster.charge(pod, target, +1)
    cluster.reindex(source)
    cluster.reindex(target)


_APPLIERS: dict[type, Callable[[PartitionState, ClusterState, Any, int], None]] = {
    NodeAdded: _applied_node_added,
    NodeRemoved: _applied_node_removed,
    NodeCordoned: _applied_node_cordoned,
    NodeUncordoned: _applied_node_uncordoned,
    NodeDrained: _applied_node_cordoned,
    NodeFailed: _applied_node_failed,
    PodQueued: _applied_pod_queued,
    PodScheduled: _applied_pod_scheduled,
    PodEvicted: _applied_pod_evicted,
    PodReleased: _applied_pod_released,
    PolicyChanged: _applied_policy_changed,
    GangQueued: _applied_gang_queued,
    GangScheduled: _applied_gang_scheduled,
    GangTimedOut: _applied_nothing,
    GangReleased: _applied_gang_released,
    PodTimeLimitReached: _applied_nothing,
    DependencyFailed: _applied_nothing,
    NodesReserved: _applied_nodes_reserved,
    ReservationReleased: _applied_reservation_released,
    PodPreempted: _applied_nothing,
    QuotaChanged: _applied_quota_changed,
    PodMigrated: _applied_pod_migrated,
    DefragmentationPlanned: _applied_nothing,
}
