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
from typing import Any

from processor.core import dependencies, gangs, reservation_planner, reservations
from processor.core.errors import InvariantViolation
from processor.core.policies import get_policy
from processor.core.policies.base import Policy
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
    shape_of,
)
from processor.core.timers import GANG_TIMEOUT, RESERVATION_START, RESERVE_CHECK, TIME_LIMIT
from schemas.codes import QueueReasonCode, Rejected, RejectionCode
from schemas.commands import (
    GPU_MILLI,
    STRICT_FIFO,
    AddNode,
    Command,
    CordonNode,
    DrainNode,
    MarkNodeFailed,
    Release,
    ReleaseGang,
    RemoveNode,
    SetPolicy,
    SubmitGang,
    SubmitPod,
    Tick,
    UncordonNode,
)
from schemas.events import (
    CommandRejected,
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
    PodQueued,
    PodReleased,
    PodScheduled,
    PodSpec,
    PodTimeLimitReached,
    PolicyChanged,
    QueueReason,
    ReservationReleased,
    Ticked,
)
from schemas.validation import (
    check_add_node,
    check_envelope,
    check_id,
    check_release,
    check_release_gang,
    check_set_policy,
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

    __slots__ = ("_scratch", "command", "events", "now", "offset", "state", "touched")

    def __init__(self, state: PartitionState, command: Command, offset: int) -> None:
        self.state = state
        self.command = command
        self.offset = offset
        self.events: list[Event] = []
        self.now = state.clock
        self.touched: dict[str, None] = {}  # clusters whose queue or reservation may need upkeep
        self._scratch: ClusterState | None = None

    @property
    def cluster(self) -> ClusterState:
        """The command's cluster; an empty scratch one until an event creates it."""
        cluster = self.state.clusters.get(self.command.cluster)
        if cluster is not None:
            return cluster
        if self._scratch is None:
            self._scratch = ClusterState(self.command.cluster)
        return self._scratch

    def emit(self, payload: EventPayload, cluster: str | None = None) -> None:
        name = self.command.cluster if cluster is None else cluster
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
        decision.emit(CommandRejected(command.command_id, command.type_name, rejection.code, rejection.message))
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
        decision.emit(CommandRejected(command.command_id, command.type_name, rejection.code, rejection.message))
    _upkeep(decision)
    return decision.events


def _node(decision: _Decision, node_id: str) -> Node:
    check_id("node_id", node_id)
    node = decision.cluster.nodes.get(node_id)
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
        reason = QueueReason(
            QueueReasonCode.WAITING_FOR_DEPENDENCY,
            0,
            f"starts after {', '.join(waiting)} end{'s' if len(waiting) == 1 else ''} ({spec.dependency})",
        )
        decision.emit(PodQueued(spec, (reason,), False, waiting), cluster.name)
        return
    _place(decision, cluster, spec, shape_of(spec), from_queue=False, requeued=False, new=True)


def _release(decision: _Decision, command: Release) -> None:
    check_release(command)
    cluster = decision.cluster
    pod = cluster.pods.get(command.pod_id)
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
    decision.emit(
        PolicyChanged(
            command.policy or cluster.policy,
            cluster.policy,
            command.reserve_after_ms,
            command.queue_order,
        )
    )


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
    spec = gangs.gang_spec(command, decision.now, cluster.arrivals)
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
        reason = QueueReason(
            QueueReasonCode.WAITING_FOR_DEPENDENCY,
            0,
            f"starts after {', '.join(waiting)} end{'s' if len(waiting) == 1 else ''} ({spec.dependency})",
        )
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
    for pod_id in list(gang.placed):
        pod = cluster.pods[pod_id]
        freed.append(pod.node_id)
        decision.emit(PodReleased(pod_id, pod.node_id, command.reason), cluster.name)
        _wake_dependants(decision, cluster, pod_id)
    _end_gang(decision, cluster, gang, command.reason)
    _capacity_grew(decision, cluster, tuple(node_id for node_id in dict.fromkeys(freed) if node_id is not None))


def _tick(decision: _Decision, command: Tick) -> None:
    decision.emit(Ticked(decision.now))


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
) -> bool:
    """Schedule the pod with the cluster's policy, or queue it with reasons. O(S_m).

    ``new``: the job enters the queue now (strict FIFO may hold it back). ``announce``
    (default: not ``from_queue``): emit ``PodQueued`` if it does not fit; a pod retried
    from the queue stays queued silently."""
    if new and cluster.queue_order == STRICT_FIFO:
        blocked = _blocked_by_earlier(cluster, (-spec.priority, spec.arrival, spec.pod_id))
        if blocked is not None:
            decision.emit(PodQueued(spec, (blocked,), requeued), cluster.name)
            return False
    reserved = cluster.reservation is not None
    usable = reservations.usable_shape(cluster, spec.pod_id, shape, decision.now) if reserved else shape
    groups = cluster.index.feasible(usable)
    if groups:
        policy = get_policy(cluster.policy)
        if policy is None:
            raise InvariantViolation(f"cluster {cluster.name!r} has unknown policy {cluster.policy!r}")
        choice = policy.place(cluster, usable, groups)
        decision.emit(
            PodScheduled(spec, choice.node_id, choice.gpus, policy.name, from_queue, choice.scores), cluster.name
        )
        if reserved:
            _holder_started(decision, cluster, spec.pod_id)
        return True
    if (not from_queue) if announce is None else announce:
        decision.emit(PodQueued(spec, queue_reasons(cluster, shape), requeued), cluster.name)
    return False


def _cluster_policy(cluster: ClusterState) -> Policy:
    policy = get_policy(cluster.policy)
    if policy is None:
        raise InvariantViolation(f"cluster {cluster.name!r} has unknown policy {cluster.policy!r}")
    return policy


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
    found = gangs.try_place(cluster, spec, _cluster_policy(cluster), decision.now)
    if isinstance(found, gangs.GangPlacement):
        _emit_gang_placement(decision, cluster, spec, found, from_queue)
        return True
    if (not from_queue) if announce is None else announce:
        decision.emit(GangQueued(spec.gang_id, found, spec, requeued), cluster.name)
    return False


def _emit_gang_placement(
    decision: _Decision, cluster: ClusterState, spec: GangSpec, found: gangs.GangPlacement, from_queue: bool
) -> None:
    """``GangScheduled`` with every placed member, then each member's ``PodScheduled``: one outcome."""
    policy = _cluster_policy(cluster)
    members = tuple(MemberPlacement(member.pod_id, choice.node_id, choice.gpus) for member, choice in found.placed)
    decision.emit(
        GangScheduled(spec.gang_id, members, spec, found.topology_key, found.domain, from_queue, found.message),
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
    # Back to the queue (its members stop being pods), then placed again at once if it fits.
    found = gangs.try_place(cluster, gang.spec, _cluster_policy(cluster), decision.now)
    placed = isinstance(found, gangs.GangPlacement)
    decision.emit(GangQueued(gang.gang_id, () if placed else found, gang.spec, True), cluster.name)  # type: ignore[arg-type]
    if placed:
        _emit_gang_placement(decision, cluster, gang.spec, found, True)  # type: ignore[arg-type]
    _capacity_grew(decision, cluster, tuple(n for n in dict.fromkeys(freed) if n is not None))


def _capacity_grew(decision: _Decision, cluster: ClusterState, node_ids: tuple[str, ...]) -> None:
    """Place queued pods and gangs after capacity grew on some nodes.

    Invariant: after every command no queued job fits anywhere it may go (strict
    FIFO and reservations aside). So only pod shapes that fit a changed node can be
    placed now, and gangs with a member that fits one; candidates are taken in queue
    order (priority, then FIFO), and a pod shape that stops fitting is dropped as a
    whole. Work: O(Q + G) to screen the Q waiting shapes and G queued gangs, plus
    O(S_m + log) per pod placed. Under strict FIFO, only the head may start.
    """
    if not node_ids or (not cluster.queue.size and not cluster.gang_queue):
        return
    if cluster.queue_order == STRICT_FIFO:
        _start_heads(decision, cluster)
        return
    index = cluster.index
    signatures = [signature for signature in map(index.signature_of, node_ids) if signature is not None]
    if not signatures:
        return
    now = decision.now
    fits = index.fits
    heap: list[tuple[tuple[int, int, str], int, Any]] = []
    for key, shape in cluster.queue.heads():
        usable = reservations.usable_shape(cluster, key[2], shape, now)
        if any(fits(signature, usable) for signature in signatures):
            heap.append((key, 0, shape))
    for key in cluster.gang_queue:
        if gangs.may_use(cluster, cluster.gangs[key[2]].spec, signatures, now):
            heap.append((key, 1, None))
    heapq.heapify(heap)
    while heap:
        key, kind, shape = heapq.heappop(heap)
        if kind == 1:
            queued = cluster.gangs.get(key[2])
            if queued is not None and queued.state == GANG_QUEUED:
                _place_gang(decision, cluster, queued.spec, from_queue=True, requeued=False)
            continue
        head = cluster.queue.head(shape)
        if head != key:  # placed meanwhile (a released reservation retried these nodes first)
            if head is not None:
                heapq.heappush(heap, (head, 0, shape))
            continue
        pod = cluster.pods[key[2]]
        if not _place(decision, cluster, pod.spec, shape, from_queue=True, requeued=False):
            continue
        following = cluster.queue.head(shape)
        if following is not None:
            heapq.heappush(heap, (following, 0, shape))


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


# ---------------------------------------------------------------- dependencies


def _wake_dependants(decision: _Decision, cluster: ClusterState, job_id: str) -> None:
    """After ``job_id`` ended: fail its afterok dependants if it ended badly, start those with nothing left."""
    waiters = cluster.dependants.get(job_id) if cluster.dependants else None
    if not waiters:
        return
    for waiter in sorted(waiters):
        _recheck_waiter(decision, cluster, waiter)


def _recheck_waiter(decision: _Decision, cluster: ClusterState, waiter: str) -> None:
    pod = cluster.pods.get(waiter)
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
    known = cluster.pods.get(job_id) if kind == "pod" else cluster.gangs.get(job_id)
    if known is None:  # a new submission: it enters the fold waiting, then fails at once
        if isinstance(spec, PodSpec):
            waiting = QueueReason(QueueReasonCode.WAITING_FOR_DEPENDENCY, 0, message)
            decision.emit(PodQueued(spec, (waiting,), False, (failed,)), cluster.name)
        else:
            waiting = QueueReason(QueueReasonCode.WAITING_FOR_DEPENDENCY, 0, message)
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
        cluster = clusters.get(name)
        if cluster is None:
            continue
        if deadline > decision.now:
            decision.now = deadline
        _TIMER_HANDLERS[kind](decision, cluster, job_id, deadline)


def _time_limit_reached(decision: _Decision, cluster: ClusterState, pod_id: str, deadline: int) -> None:
    pod = cluster.pods.get(pod_id)
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
    """After the command: reservations of the clusters it touched, then timers that came due."""
    touched = decision.touched
    clusters = decision.state.clusters
    for name in touched if len(touched) == 1 else sorted(touched):
        cluster = clusters.get(name)
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
    node = cluster.nodes.get(node_id)
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
    cluster.count_node(node, -1)
    cluster.model_nodes[node.gpu_model] -= 1
    if not cluster.model_nodes[node.gpu_model]:
        del cluster.model_nodes[node.gpu_model]
    if not node.failed:
        cluster.gpu_milli_capacity -= node.gpu_count * GPU_MILLI


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
    cluster.reindex(node)


def _pod_for(cluster: ClusterState, spec: PodSpec) -> Pod:
    """The pod an event is about: known (waiting, queued or evicted) or newly submitted."""
    pod = cluster.pods.get(spec.pod_id)
    if pod is None:
        pod = cluster.pods[spec.pod_id] = Pod(spec, shape_of(spec))
        cluster.count_shape(pod.shape, +1)
        if spec.arrival >= cluster.arrivals and spec.gang_id is None:
            cluster.arrivals = spec.arrival + 1
            cluster.learn_typical()
    elif pod.running:
        raise InvariantViolation(f"pod {spec.pod_id!r} is already running on {pod.node_id!r}")
    elif pod.queued:
        cluster.queue.remove(pod.shape, pod.queue_key)
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
    cluster.queue.push(pod.shape, pod.queue_key)


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
    node.allocate(pod.spec, event.gpus)
    pod.node_id = node.node_id
    pod.gpus = event.gpus
    pod.started_at = now
    cluster.gpu_milli_allocated += pod.spec.gpu_milli_total
    cluster.reindex(node)
    if pod.spec.time_limit_ms is not None:
        state.timers.push(now + pod.spec.time_limit_ms, TIME_LIMIT, cluster.name, pod.spec.pod_id)


def _unbind(cluster: ClusterState, pod: Pod) -> None:
    node = _node_of(cluster, pod.node_id)  # type: ignore[arg-type]
    node.free(pod.spec, pod.gpus)
    pod.node_id = None
    pod.gpus = ()
    pod.started_at = None
    cluster.gpu_milli_allocated -= pod.spec.gpu_milli_total
    cluster.reindex(node)


def _applied_pod_evicted(state: PartitionState, cluster: ClusterState, event: PodEvicted, now: int) -> None:
    pod = cluster.pods.get(event.pod_id)
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
        cluster.queue.remove(pod.shape, pod.queue_key)
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
        node = cluster.nodes.get(node_id)
        if node is not None:
            node.reserve(None)
            cluster.reindex(node)


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
}
