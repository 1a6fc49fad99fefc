"""The fold: ``decide`` turns a command into events, ``apply`` folds an event into state.

Both are pure functions of their inputs: no clock, no randomness, no
environment, no I/O. Time comes from ``Command.issued_at``; ties break on stable
keys (node id, queue key); nothing iterates an unordered set.

``decide`` applies each event as it emits it, so that later decisions within
the same command (re-placing evicted pods, retrying the queue after a release)
see the earlier ones. State still changes only through ``apply``, and replaying
the events alone rebuilds the same state. A handler validates everything before
its first event, so a refused command emits exactly one ``CommandRejected`` and
changes nothing but the partition's position.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from processor.core.errors import InvariantViolation
from processor.core.policies import get_policy
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Node, PartitionState, Pod, shape_of
from schemas.codes import QueueReasonCode, Rejected, RejectionCode
from schemas.commands import (
    GPU_MILLI,
    AddNode,
    Command,
    CordonNode,
    DrainNode,
    MarkNodeFailed,
    Release,
    RemoveNode,
    SetPolicy,
    SubmitPod,
    UncordonNode,
)
from schemas.events import (
    CommandRejected,
    Event,
    EventPayload,
    NodeAdded,
    NodeCordoned,
    NodeDrained,
    NodeFailed,
    NodeRemoved,
    NodeUncordoned,
    PodEvicted,
    PodQueued,
    PodReleased,
    PodScheduled,
    PodSpec,
    PolicyChanged,
    QueueReason,
)
from schemas.validation import (
    check_add_node,
    check_envelope,
    check_id,
    check_release,
    check_set_policy,
    check_submit_pod,
)

# ---------------------------------------------------------------- decide


class _Decision:
    """The events of one command, applied to the state as they are emitted."""

    __slots__ = ("_scratch", "command", "events", "offset", "state")

    def __init__(self, state: PartitionState, command: Command, offset: int) -> None:
        self.state = state
        self.command = command
        self.offset = offset
        self.events: list[Event] = []
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

    def emit(self, payload: EventPayload) -> None:
        event = Event(
            self.state.partition,
            self.state.sequence,
            self.command.cluster,
            self.command.command_id,
            self.offset,
            self.command.issued_at,
            payload,
        )
        apply(self.state, event)
        self.events.append(event)


def decide(state: PartitionState, command: Command, offset: int | None = None) -> list[Event]:
    """Decide and apply the events of one command (at least one, always).

    ``offset`` is the command's position in the log (default: the state's next offset).
    """
    decision = _Decision(state, command, state.next_offset if offset is None else offset)
    try:
        check_envelope(command)
        if command.command_id in state.seen:
            raise Rejected(
                RejectionCode.DUPLICATE_COMMAND,
                f"command {command.command_id!r} was already processed; a repeated command id changes nothing",
            )
        handler = _HANDLERS.get(type(command.payload))
        if handler is None:
            raise Rejected(RejectionCode.INVALID_COMMAND, f"unknown command type {type(command.payload).__name__}")
        handler(decision, command.payload)
    except Rejected as rejection:
        if decision.events:
            raise InvariantViolation(f"command {command.command_id!r} rejected after emitting events") from rejection
        decision.emit(CommandRejected(command.command_id, command.type_name, rejection.code, rejection.message))
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
    _retry_queue(decision, command.node_id)


def _remove_node(decision: _Decision, command: RemoveNode) -> None:
    node = _node(decision, command.node_id)
    if node.pods and not command.force:
        raise Rejected(
            RejectionCode.NODE_BUSY,
            f"node {command.node_id!r} runs {len(node.pods)} pod(s); drain it first or remove it with force=true",
        )
    evicted = _evict_all(decision, node, "node_removed")
    decision.emit(NodeRemoved(command.node_id, command.force))
    _replace(decision, evicted)


def _cordon_node(decision: _Decision, command: CordonNode) -> None:
    node = _node(decision, command.node_id)
    if node.failed:
        raise Rejected(RejectionCode.NODE_FAILED, f"node {command.node_id!r} has failed; remove it and add it again")
    if node.cordoned:
        raise Rejected(RejectionCode.NODE_ALREADY_CORDONED, f"node {command.node_id!r} is already cordoned")
    decision.emit(NodeCordoned(command.node_id))


def _uncordon_node(decision: _Decision, command: UncordonNode) -> None:
    node = _node(decision, command.node_id)
    if node.failed:
        raise Rejected(RejectionCode.NODE_FAILED, f"node {command.node_id!r} has failed; remove it and add it again")
    if not node.cordoned:
        raise Rejected(RejectionCode.NODE_NOT_CORDONED, f"node {command.node_id!r} is not cordoned")
    decision.emit(NodeUncordoned(command.node_id))
    _retry_queue(decision, command.node_id)


def _drain_node(decision: _Decision, command: DrainNode) -> None:
    node = _node(decision, command.node_id)
    if node.failed:
        raise Rejected(RejectionCode.NODE_FAILED, f"node {command.node_id!r} has failed; its pods were already evicted")
    decision.emit(NodeDrained(command.node_id, len(node.pods)))
    _replace(decision, _evict_all(decision, node, "drain"))


def _mark_node_failed(decision: _Decision, command: MarkNodeFailed) -> None:
    node = _node(decision, command.node_id)
    if node.failed:
        raise Rejected(RejectionCode.NODE_FAILED, f"node {command.node_id!r} is already marked failed")
    decision.emit(NodeFailed(command.node_id, command.reason, len(node.pods)))
    _replace(decision, _evict_all(decision, node, "node_failed"))


def _submit_pod(decision: _Decision, command: SubmitPod) -> None:
    check_submit_pod(command)
    cluster = decision.cluster
    if command.gpu_models and not any(cluster.model_nodes.get(model) for model in command.gpu_models):
        known = sorted(model for model, count in cluster.model_nodes.items() if count and model)
        raise Rejected(
            RejectionCode.UNKNOWN_GPU_MODEL,
            f"no node in cluster {decision.command.cluster!r} has GPU model "
            f"{' or '.join(command.gpu_models)}; known: {known}",
        )
    if command.pod_id in cluster.pods:
        raise Rejected(RejectionCode.DUPLICATE_POD, f"pod {command.pod_id!r} is already queued or running")
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
        decision.command.issued_at,
        cluster.arrivals,
    )
    _place(decision, spec, shape_of(spec), from_queue=False, requeued=False)


def _release(decision: _Decision, command: Release) -> None:
    check_release(command)
    pod = decision.cluster.pods.get(command.pod_id)
    if pod is None:
        raise Rejected(
            RejectionCode.UNKNOWN_POD,
            f"pod {command.pod_id!r} is neither queued nor running in cluster {decision.command.cluster!r} "
            "(never submitted, or already released)",
        )
    node_id = pod.node_id
    decision.emit(PodReleased(command.pod_id, node_id, command.reason))
    if node_id is not None:
        _retry_queue(decision, node_id)


def _set_policy(decision: _Decision, command: SetPolicy) -> None:
    check_set_policy(command)
    decision.emit(PolicyChanged(command.policy, decision.cluster.policy))


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
}


def _place(decision: _Decision, spec: PodSpec, shape: PodShape, *, from_queue: bool, requeued: bool) -> None:
    """Schedule the pod with the cluster's policy, or queue it with reasons. O(S_m)."""
    cluster = decision.cluster
    groups = cluster.index.feasible(shape)
    if groups:
        policy = get_policy(cluster.policy)
        if policy is None:
            raise InvariantViolation(f"cluster {cluster.name!r} has unknown policy {cluster.policy!r}")
        choice = policy.place(cluster, shape, groups)
        decision.emit(PodScheduled(spec, choice.node_id, choice.gpus, policy.name, from_queue, choice.scores))
    else:
        decision.emit(PodQueued(spec, queue_reasons(cluster, shape), requeued))


def queue_reasons(cluster: ClusterState, shape: PodShape) -> tuple[QueueReason, ...]:
    """Why no node takes the shape: nodes counted under the first check they fail. O(S)."""
    counts = cluster.index.misfit_counts(shape)
    if cluster.unschedulable_nodes:
        counts[QueueReasonCode.NODE_UNSCHEDULABLE] = cluster.unschedulable_nodes
    if not cluster.nodes:
        counts[QueueReasonCode.NO_NODES] = 0
    return tuple(
        QueueReason(code, count) for code, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    )


def _evict_all(decision: _Decision, node: Node, reason: str) -> list[Pod]:
    """Evict every pod of the node, in pod id order; returns them for re-placement.

    Sorted, not in placement order, so a state restored from a snapshot evicts
    in the same order as one built by full replay."""
    cluster = decision.cluster
    pods = [cluster.pods[pod_id] for pod_id in sorted(node.pods)]
    for pod in pods:
        decision.emit(PodEvicted(pod.spec.pod_id, node.node_id, reason))
    return pods


def _replace(decision: _Decision, pods: list[Pod]) -> None:
    """Place evicted pods again, highest priority first, FIFO within a priority."""
    for pod in sorted(pods, key=lambda p: p.queue_key):
        _place(decision, pod.spec, pod.shape, from_queue=False, requeued=True)


def _retry_queue(decision: _Decision, node_id: str) -> None:
    """Place queued pods after capacity grew on one node.

    Invariant: after every command no queued pod fits anywhere. So only shapes
    that fit the changed node can be placed now; their heads are taken in queue
    order (priority, then FIFO) and a shape that stops fitting is dropped as a
    whole. Work: O(Q) to screen the Q waiting shapes, plus O(S_m + log) per pod placed.
    """
    cluster = decision.cluster
    if not len(cluster.queue):
        return
    signature = cluster.index.signature_of(node_id)
    if signature is None:
        return
    fits = cluster.index.fits
    heap = [(key, shape) for key, shape in cluster.queue.heads() if fits(signature, shape)]
    heapq.heapify(heap)
    while heap:
        key, shape = heapq.heappop(heap)
        if not cluster.index.feasible(shape):
            continue
        pod = cluster.pods[key[2]]
        _place(decision, pod.spec, shape, from_queue=True, requeued=False)
        following = cluster.queue.head(shape)
        if following is not None:
            heapq.heappush(heap, (following, shape))


# ---------------------------------------------------------------- apply


def apply(state: PartitionState, event: Event) -> None:
    """Fold one event into the state, in place. Raises InvariantViolation on a broken invariant."""
    if event.sequence != state.sequence:
        raise InvariantViolation(f"event sequence {event.sequence} applied to state expecting {state.sequence}")
    payload = event.payload
    if not isinstance(payload, CommandRejected):
        _APPLIERS[type(payload)](state.cluster(event.cluster), payload)
    state.sequence = event.sequence + 1
    if event.command_offset >= state.next_offset:
        state.next_offset = event.command_offset + 1
    state.remember(event.command_id)


def _node_of(cluster: ClusterState, node_id: str) -> Node:
    node = cluster.nodes.get(node_id)
    if node is None:
        raise InvariantViolation(f"event refers to unknown node {node_id!r}")
    return node


def _applied_node_added(cluster: ClusterState, event: NodeAdded) -> None:
    if event.node_id in cluster.nodes:
        raise InvariantViolation(f"node {event.node_id!r} added twice")
    node = Node(
        event.node_id, event.gpu_model, event.gpu_count, event.cpu_milli, event.memory_mib, event.labels, event.taints
    )
    cluster.nodes[node.node_id] = node
    cluster.model_nodes[node.gpu_model] = cluster.model_nodes.get(node.gpu_model, 0) + 1
    cluster.gpu_milli_capacity += node.gpu_count * GPU_MILLI
    cluster.reindex(node)


def _applied_node_removed(cluster: ClusterState, event: NodeRemoved) -> None:
    node = _node_of(cluster, event.node_id)
    if node.pods:
        raise InvariantViolation(f"node {event.node_id!r} removed while running pods")
    del cluster.nodes[event.node_id]
    cluster.index.remove(event.node_id)
    cluster.model_nodes[node.gpu_model] -= 1
    if not cluster.model_nodes[node.gpu_model]:
        del cluster.model_nodes[node.gpu_model]
    if not node.failed:
        cluster.gpu_milli_capacity -= node.gpu_count * GPU_MILLI


def _applied_node_cordoned(cluster: ClusterState, event: NodeCordoned | NodeDrained) -> None:
    node = _node_of(cluster, event.node_id)
    node.cordoned = True
    cluster.reindex(node)


def _applied_node_uncordoned(cluster: ClusterState, event: NodeUncordoned) -> None:
    node = _node_of(cluster, event.node_id)
    node.cordoned = False
    cluster.reindex(node)


def _applied_node_failed(cluster: ClusterState, event: NodeFailed) -> None:
    node = _node_of(cluster, event.node_id)
    node.failed = True
    cluster.gpu_milli_capacity -= node.gpu_count * GPU_MILLI
    cluster.reindex(node)


def _pod_for(cluster: ClusterState, spec: PodSpec) -> Pod:
    """The pod an event is about: known (queued or evicted) or newly submitted."""
    pod = cluster.pods.get(spec.pod_id)
    if pod is None:
        pod = cluster.pods[spec.pod_id] = Pod(spec, shape_of(spec))
        cluster.count_shape(pod.shape, +1)
        if spec.arrival >= cluster.arrivals:
            cluster.arrivals = spec.arrival + 1
            cluster.learn_typical()
    elif pod.running:
        raise InvariantViolation(f"pod {spec.pod_id!r} is already running on {pod.node_id!r}")
    elif pod.queued:
        cluster.queue.remove(pod.shape, pod.queue_key)
        pod.queued = False
    return pod


def _applied_pod_queued(cluster: ClusterState, event: PodQueued) -> None:
    pod = _pod_for(cluster, event.pod)
    pod.queued = True
    cluster.queue.push(pod.shape, pod.queue_key)


def _applied_pod_scheduled(cluster: ClusterState, event: PodScheduled) -> None:
    node = _node_of(cluster, event.node_id)
    if not node.schedulable:
        raise InvariantViolation(f"pod {event.pod.pod_id!r} scheduled on unschedulable node {node.node_id!r}")
    pod = _pod_for(cluster, event.pod)
    node.allocate(pod.spec, event.gpus)
    pod.node_id = node.node_id
    pod.gpus = event.gpus
    cluster.gpu_milli_allocated += pod.spec.gpu_milli_total
    cluster.reindex(node)


def _unbind(cluster: ClusterState, pod: Pod) -> None:
    node = _node_of(cluster, pod.node_id)  # type: ignore[arg-type]
    node.free(pod.spec, pod.gpus)
    pod.node_id = None
    pod.gpus = ()
    cluster.gpu_milli_allocated -= pod.spec.gpu_milli_total
    cluster.reindex(node)


def _applied_pod_evicted(cluster: ClusterState, event: PodEvicted) -> None:
    pod = cluster.pods.get(event.pod_id)
    if pod is None or pod.node_id != event.node_id:
        raise InvariantViolation(f"pod {event.pod_id!r} evicted from {event.node_id!r} where it does not run")
    _unbind(cluster, pod)


def _applied_pod_released(cluster: ClusterState, event: PodReleased) -> None:
    pod = cluster.pods.pop(event.pod_id, None)
    if pod is None:
        raise InvariantViolation(f"unknown pod {event.pod_id!r} released")
    cluster.count_shape(pod.shape, -1)
    if pod.running:
        _unbind(cluster, pod)
    elif pod.queued:
        cluster.queue.remove(pod.shape, pod.queue_key)


def _applied_policy_changed(cluster: ClusterState, event: PolicyChanged) -> None:
    cluster.policy = event.policy


_APPLIERS: dict[type, Callable[[ClusterState, Any], None]] = {
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
}
