"""Appliers: how each event changes the state. ``apply`` is the only way the fold's state changes.

Each applier checks the invariant it relies on (a pod is scheduled on a schedulable node, a gang
is released with no member running, ...) and raises :class:`InvariantViolation` rather than fold
a broken state: that is a bug, and the processor stops without committing. Events that only
explain the events after them (``PodPreempted``, ``DefragmentationPlanned``, ...) change nothing.
Every applier is O(1) in the cluster's size, except where its docstring says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from processor.core import cohort_tree
from processor.core.budgets import is_disruption
from processor.core.errors import InvariantViolation
from processor.core.state import (
    COMPLETED,
    EVICTED_MEMBER,
    GANG_NEW,
    GANG_QUEUED,
    GANG_RETRYING,
    GANG_RUNNING,
    GANG_WAITING,
    ClusterState,
    Gang,
    Halt,
    Node,
    PartitionState,
    Pod,
    Reservation,
    lookup,
    shape_of,
)
from processor.core.timers import EVICTION, GANG_TIMEOUT, RESERVATION_START, RETRY, TIME_LIMIT
from schemas.codes import RejectionCode
from schemas.commands import GPU_MILLI
from schemas.events import (
    ClusterHalted,
    ClusterResumed,
    CohortChanged,
    CommandRejected,
    DefragmentationPlanned,
    DependencyFailed,
    DisruptionBudgetRemoved,
    DisruptionBudgetSet,
    Event,
    EvictionBlocked,
    GangQueued,
    GangReleased,
    GangScheduled,
    GangSpec,
    GangTimedOut,
    NodeAdded,
    NodeCordoned,
    NodeDrained,
    NodeFailed,
    NodeRecovered,
    NodeRemoved,
    NodesReserved,
    NodeUncordoned,
    NodeUpdated,
    PodEvicted,
    PodEvictionScheduled,
    PodMigrated,
    PodPreempted,
    PodQueued,
    PodReleased,
    PodRetryScheduled,
    PodScheduled,
    PodSpec,
    PodTimeLimitReached,
    PolicyChanged,
    QuotaChanged,
    ReservationReleased,
    Ticked,
)


def apply(state: PartitionState, event: Event) -> None:
    """Fold one event into the state, in place. Raises InvariantViolation on a broken invariant."""
    if event.sequence != state.sequence:
        raise InvariantViolation(f"event sequence {event.sequence} applied to state expecting {state.sequence}")
    payload = event.payload
    kind = type(payload)
    cluster: ClusterState | None
    if kind is ClusterHalted:
        _halt_cluster(state, event, payload)  # type: ignore[arg-type]
        cluster = lookup(state.clusters, event.cluster)
    elif kind is not CommandRejected and kind is not Ticked:
        cluster = state.cluster(event.cluster)  # no applier but the halt's replaces a cluster
        APPLIERS[kind](state, cluster, payload, event.occurred_at)
    else:
        if kind is Ticked and payload.partition:  # type: ignore[union-attr]
            _applied_partition_tick(state, payload.clock)  # type: ignore[union-attr]
        elif kind is CommandRejected and payload.code == RejectionCode.CLUSTER_HALTED:  # type: ignore[union-attr]
            _count_refused(state, event.cluster)
        cluster = lookup(state.clusters, event.cluster)
    if cluster is not None and event.occurred_at > cluster.clock:
        cluster.clock = event.occurred_at
    state.sequence = event.sequence + 1
    if event.command_offset >= state.next_offset:
        state.next_offset = event.command_offset + 1
    if event.occurred_at > state.clock:
        state.clock = event.occurred_at
    state.remember(event.command_id)


def _applied_partition_tick(state: PartitionState, clock: int) -> None:
    """Every cluster of the partition (but a halted one) moves to ``clock``. O(C)."""
    for cluster in state.clusters.values():
        if cluster.halted is None and cluster.clock < clock:
            cluster.clock = clock


def _count_refused(state: PartitionState, name: str) -> None:
    """One more command refused because its cluster is halted (health and metrics show the count). O(1)."""
    cluster = lookup(state.clusters, name)
    if cluster is not None and cluster.halted is not None:
        cluster.halted.refused += 1


def _halt_cluster(state: PartitionState, event: Event, payload: ClusterHalted) -> None:
    """The cluster is halted: what it held is dropped (a ResumeCluster rebuilds it from the command log), its
    clock and clock setting stay. O(1)."""
    cluster = state.cluster(event.cluster)
    halted = ClusterState(cluster.name, clock=cluster.clock, max_clock_jump_ms=cluster.max_clock_jump_ms)
    halted.halted = Halt(payload.command_id, event.command_offset, payload.error)
    state.clusters[cluster.name] = halted


def _applied_cluster_resumed(state: PartitionState, cluster: ClusterState, event: ClusterResumed, now: int) -> None:
    if cluster.halted is not None:
        raise InvariantViolation(f"cluster {cluster.name!r} resumed without its rebuilt state")


def _node_of(cluster: ClusterState, node_id: str) -> Node:
    node = lookup(cluster.nodes, node_id)
    if node is None:
        raise InvariantViolation(f"event refers to unknown node {node_id!r}")
    return node


def _applied_node_added(state: PartitionState, cluster: ClusterState, event: NodeAdded, now: int) -> None:
    cluster.layout += 1
    if event.node_id in cluster.nodes:
        raise InvariantViolation(f"node {event.node_id!r} added twice")
    node = Node(
        event.node_id,
        event.gpu_model,
        event.gpu_count,
        event.cpu_milli,
        event.memory_mib,
        event.labels,
        event.taints,
        event.gpu_memory_mib,
    )
    cluster.nodes[node.node_id] = node
    cluster.model_nodes[node.gpu_model] = cluster.model_nodes.get(node.gpu_model, 0) + 1
    cluster.gpu_milli_capacity += node.gpu_count * GPU_MILLI
    cluster.cpu_capacity += node.cpu_milli
    cluster.memory_capacity += node.memory_mib
    cluster.count_node(node, +1)
    cluster.reindex(node)


def _applied_node_removed(state: PartitionState, cluster: ClusterState, event: NodeRemoved, now: int) -> None:
    cluster.layout += 1
    node = _node_of(cluster, event.node_id)
    if node.pods:
        raise InvariantViolation(f"node {event.node_id!r} removed while running pods")
    if node.reserved_for is not None:
        raise InvariantViolation(f"node {event.node_id!r} removed while reserved")
    del cluster.nodes[event.node_id]
    if cluster.draining:
        cluster.draining.pop(event.node_id, None)
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
    cluster.layout += 1
    node = _node_of(cluster, event.node_id)
    node.cordoned = True
    cluster.reindex(node)


def _applied_node_uncordoned(state: PartitionState, cluster: ClusterState, event: NodeUncordoned, now: int) -> None:
    cluster.layout += 1
    node = _node_of(cluster, event.node_id)
    node.cordoned = False
    cluster.reindex(node)
    if cluster.draining:
        _end_drain(cluster, node)


def _applied_node_drained(state: PartitionState, cluster: ClusterState, event: NodeDrained, now: int) -> None:
    _applied_node_cordoned(state, cluster, event, now)
    if cluster.draining:
        cluster.draining.pop(event.node_id, None)


def _end_drain(cluster: ClusterState, node: Node) -> None:
    """An uncordon cancels the node's drain: evictions scheduled or blocked there will not happen. O(p)."""
    if cluster.draining.pop(node.node_id, None) is None:
        return
    for pod_id in node.pods:
        pod = cluster.pods[pod_id]
        cluster.blocked.pop(pod_id, None)
        if pod.evicting_at is not None:
            pod.evicting_at = None
            cluster.disrupted.pop(pod_id, None)


def _applied_node_failed(state: PartitionState, cluster: ClusterState, event: NodeFailed, now: int) -> None:
    cluster.layout += 1
    node = _node_of(cluster, event.node_id)
    if cluster.draining:
        cluster.draining.pop(event.node_id, None)  # its pods go anyway
    node.failed = True
    cluster.gpu_milli_capacity -= node.gpu_count * GPU_MILLI
    cluster.cpu_capacity -= node.cpu_milli
    cluster.memory_capacity -= node.memory_mib
    cluster.reindex(node)


def _applied_node_recovered(state: PartitionState, cluster: ClusterState, event: NodeRecovered, now: int) -> None:
    """A failed node is back, empty and schedulable: its capacity counts again. O(1)."""
    cluster.layout += 1
    node = _node_of(cluster, event.node_id)
    if not node.failed or node.pods:
        raise InvariantViolation(f"node {event.node_id!r} recovered but it had not failed or still runs pods")
    node.failed = False
    node.cordoned = False
    cluster.gpu_milli_capacity += node.gpu_count * GPU_MILLI
    cluster.cpu_capacity += node.cpu_milli
    cluster.memory_capacity += node.memory_mib
    cluster.reindex(node)


def _applied_node_updated(state: PartitionState, cluster: ClusterState, event: NodeUpdated, now: int) -> None:
    """New labels and taints: the node moves to its new class in every index. O(labels)."""
    cluster.layout += 1
    node = _node_of(cluster, event.node_id)
    cluster.count_node(node, -1)
    node.relabel(event.labels, tuple(event.taints))
    cluster.count_node(node, +1)
    cluster.reindex(node)
    if cluster.blocked and event.node_id not in cluster.draining:  # taint evictions waiting: decided anew
        for pod_id in node.pods:
            cluster.blocked.pop(pod_id, None)


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
    pod.retry_at = None
    return pod


def _applied_pod_queued(state: PartitionState, cluster: ClusterState, event: PodQueued, now: int) -> None:
    if event.pod.gang_id is not None:
        _member_waits_again(cluster, event.pod)
    pod = _pod_for(cluster, event.pod)
    if event.waiting_for:
        pod.waiting_for = tuple(event.waiting_for)
        cluster.wait_on(event.pod.pod_id, pod.waiting_for)
        return
    pod.queued = True
    cluster.queue.push(pod.group, pod.queue_key)


def _member_waits_again(cluster: ClusterState, spec: PodSpec) -> None:
    """A member an above_min gang lost alone (evicted just before) waits again as its member (contract v4): it
    leaves the gang's placed members, and its pod is made anew from the event's spec (kept to the gang's domain).
    Nothing for any other member. O(1)."""
    gang_id = spec.gang_id
    if gang_id is None:
        return
    gang = cluster.gangs.get(gang_id)
    if gang is None or spec.pod_id not in gang.placed:
        return
    pod = lookup(cluster.pods, spec.pod_id)
    if pod is None or pod.running or pod.queued or gang.state != GANG_RUNNING:
        raise InvariantViolation(f"member {spec.pod_id!r} queued again while it runs or its gang does not")
    del gang.placed[spec.pod_id]
    del cluster.pods[spec.pod_id]
    cluster.count_shape(pod.shape, -1)


def _applied_pod_scheduled(state: PartitionState, cluster: ClusterState, event: PodScheduled, now: int) -> None:
    node = _node_of(cluster, event.node_id)
    if not node.schedulable:
        raise InvariantViolation(f"pod {event.pod.pod_id!r} scheduled on unschedulable node {node.node_id!r}")
    gang_id = event.pod.gang_id
    if gang_id is not None:
        gang = cluster.gangs.get(gang_id)
        if gang is None or gang.state != GANG_RUNNING:
            raise InvariantViolation(f"member {event.pod.pod_id!r} scheduled outside its gang's GangScheduled")
        if event.pod.pod_id not in gang.placed:  # a member that waited for room while its gang ran (contract v4)
            waiting = lookup(cluster.pods, event.pod.pod_id)
            if waiting is None or not waiting.queued:
                raise InvariantViolation(f"member {event.pod.pod_id!r} scheduled outside its gang's GangScheduled")
            gang.placed[event.pod.pod_id] = None
    pod = _pod_for(cluster, event.pod)
    node.allocate(pod.spec, event.gpus, now)
    pod.node_id = node.node_id
    pod.evicting_at = None  # starts afresh: no drain's eviction of an earlier run follows it here
    pod.gpus = event.gpus
    pod.started_at = now
    cluster.gpu_milli_allocated += pod.spec.gpu_milli_total
    cluster.charge(pod, node, +1)
    cluster.reindex(node)
    if pod.spec.time_limit_ms is not None:
        cluster.timers.push(now + pod.spec.time_limit_ms, TIME_LIMIT, pod.spec.pod_id)
    if cluster.disrupted:  # it runs again: no budget counts it any more
        cluster.disrupted.pop(pod.spec.pod_id, None)


def _unbind(cluster: ClusterState, pod: Pod) -> None:
    node = _node_of(cluster, pod.node_id)  # type: ignore[arg-type]
    cluster.charge(pod, node, -1)
    node.free(pod.spec, pod.gpus, pod.started_at)
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
    pod.evicting_at = None
    if cluster.budgets:
        if cluster.blocked:
            cluster.blocked.pop(event.pod_id, None)
        if is_disruption(event.reason):
            cluster.disrupted[event.pod_id] = pod.spec
        else:
            cluster.disrupted.pop(event.pod_id, None)


def _applied_pod_retry_scheduled(
    state: PartitionState, cluster: ClusterState, event: PodRetryScheduled, now: int
) -> None:
    """A failed pod stops running and waits, outside the queue, for its retry at ``not_before`` (a timer). O(1).

    A gang member's failure takes its gang (its other members were evicted just before): O(M)."""
    pod = lookup(cluster.pods, event.pod_id)
    if event.gang_id is not None:
        _gang_retry_scheduled(cluster, cluster.gangs.get(event.gang_id), pod, event, now)
        return
    if (
        pod is None
        or pod.spec.gang_id is not None
        or not pod.running
        or event.attempt != pod.attempt + 1
        or event.not_before <= now
    ):
        raise InvariantViolation(f"retry {event.attempt} of pod {event.pod_id!r} scheduled but it does not run")
    _unbind(cluster, pod)
    pod.evicting_at = None  # a drain's eviction of it is moot: it stopped (a snapshot must not arm it again)
    pod.attempt = event.attempt
    pod.retry_at = event.not_before
    cluster.timers.push(event.not_before, RETRY, event.pod_id)


def _gang_retry_scheduled(
    cluster: ClusterState, gang: Gang | None, pod: Pod | None, event: PodRetryScheduled, now: int
) -> None:
    """The failed member stops; its gang, none of whose members runs any more, leaves running: its members stop
    being pods (as when it is requeued) and it waits, outside the queue, for its retry at ``not_before``. O(M)."""
    if (
        gang is None
        or pod is None
        or pod.spec.gang_id != gang.gang_id
        or gang.state != GANG_RUNNING
        or not pod.running
        or event.attempt != gang.attempt + 1
        or event.not_before <= now
    ):
        raise InvariantViolation(f"retry {event.attempt} of the gang of {event.pod_id!r} scheduled but it does not run")
    _unbind(cluster, pod)
    for pod_id in gang.placed:
        member = cluster.pods.pop(pod_id)
        if member.running:
            raise InvariantViolation(f"gang {gang.gang_id!r} retried while member {pod_id!r} runs")
        if cluster.blocked:
            cluster.blocked.pop(pod_id, None)
        if cluster.disrupted:
            cluster.disrupted.pop(pod_id, None)
        cluster.count_shape(member.shape, -1)
    _drop_waiting_members(cluster, gang)
    gang.placed = {}
    gang.started_at = None
    gang.topology_key = gang.domain = None
    gang.state = GANG_RETRYING
    gang.attempt = event.attempt
    gang.retry_at = event.not_before
    cluster.timers.push(event.not_before, RETRY, gang.gang_id)


def _applied_budget_set(state: PartitionState, cluster: ClusterState, event: DisruptionBudgetSet, now: int) -> None:
    """A budget is set (or replaced): it counts from now on. O(1)."""
    cluster.budgets[event.budget_id] = event


def _applied_budget_removed(
    state: PartitionState, cluster: ClusterState, event: DisruptionBudgetRemoved, now: int
) -> None:
    """A budget goes; with none left nothing is counted (or blocked) any more. O(1), O(U) for the last one."""
    if cluster.budgets.pop(event.budget_id, None) is None:
        raise InvariantViolation(f"unknown disruption budget {event.budget_id!r} removed")
    if not cluster.budgets:
        cluster.disrupted.clear()
        cluster.blocked.clear()


def _applied_eviction_blocked(state: PartitionState, cluster: ClusterState, event: EvictionBlocked, now: int) -> None:
    """A drain waits for a budget: the node stays draining, the pod keeps running. O(1)."""
    pod = lookup(cluster.pods, event.pod_id)
    if pod is None or pod.node_id != event.node_id or event.budget_id not in cluster.budgets:
        raise InvariantViolation(f"eviction of {event.pod_id!r} blocked, but it does not run or has no budget")
    cluster.blocked[event.pod_id] = event.budget_id
    if event.reason == "drain":  # else a NoExecute taint: the pod waits, the node is not drained
        cluster.draining[event.node_id] = (event.grace_ms, True)
    if pod.evicting_at is not None:  # its grace ended but the budget has no room now: it waits again
        pod.evicting_at = None
        cluster.disrupted.pop(event.pod_id, None)


def _applied_pod_eviction_scheduled(
    state: PartitionState, cluster: ClusterState, event: PodEvictionScheduled, now: int
) -> None:
    """A drain evicts the pod at ``at`` (a timer); it counts against its budgets from now. O(log T)."""
    pod = lookup(cluster.pods, event.pod_id)
    if pod is None or pod.node_id != event.node_id or event.at <= now:
        raise InvariantViolation(f"eviction of {event.pod_id!r} scheduled, but it does not run there or in time")
    pod.evicting_at = event.at
    cluster.blocked.pop(event.pod_id, None)
    if cluster.budgets:
        cluster.disrupted[event.pod_id] = pod.spec
    cluster.draining[event.node_id] = (event.at - now, event.respect_budgets)
    cluster.timers.push(event.at, EVICTION, event.pod_id)


def _applied_pod_released(state: PartitionState, cluster: ClusterState, event: PodReleased, now: int) -> None:
    pod = cluster.pods.pop(event.pod_id, None)
    if pod is None:
        raise InvariantViolation(f"unknown pod {event.pod_id!r} released")
    cluster.count_shape(pod.shape, -1)
    ok = pod.running and event.reason == COMPLETED
    if cluster.budgets:
        cluster.blocked.pop(event.pod_id, None)
        if not event.reason.startswith(EVICTED_MEMBER):  # a member lost while its gang runs on stays unavailable
            cluster.disrupted.pop(event.pod_id, None)
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
    if event.max_clock_jump_ms is not None:
        cluster.max_clock_jump_ms = event.max_clock_jump_ms


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
            cluster.timers.push(spec.submitted_at + spec.timeout_ms, GANG_TIMEOUT, spec.gang_id)
        return gang
    if gang.state == GANG_QUEUED:
        cluster.unqueue_gang(gang.key)
    elif gang.state == GANG_WAITING:
        cluster.stop_waiting(spec.gang_id, gang.waiting_for)
        gang.waiting_for = ()
    gang.retry_at = None
    return gang


def _drop_waiting_members(cluster: ClusterState, gang: Gang) -> None:
    """A gang leaves running (requeued, or waiting for its retry): its members that waited for room while it ran
    (contract v4) stop being pods and wait with it again. O(M)."""
    for member in gang.spec.members:
        waiting = lookup(cluster.pods, member.pod_id)
        if waiting is not None and waiting.queued:
            cluster.queue.remove(waiting.group, waiting.queue_key)
            del cluster.pods[member.pod_id]
            cluster.count_shape(waiting.shape, -1)


def _applied_gang_queued(state: PartitionState, cluster: ClusterState, event: GangQueued, now: int) -> None:
    gang = _gang_for(state, cluster, event.gang)
    if gang.state == GANG_RUNNING:  # requeued: its evicted members stop being pods until it starts again
        for pod_id in gang.placed:
            pod = cluster.pods.pop(pod_id)
            if pod.running:
                raise InvariantViolation(f"gang {gang.gang_id!r} requeued while member {pod_id!r} runs")
            if cluster.blocked:
                cluster.blocked.pop(pod_id, None)
            cluster.count_shape(pod.shape, -1)
        _drop_waiting_members(cluster, gang)
        gang.placed = {}
        gang.started_at = None
        gang.topology_key = gang.domain = None
        if event.gang.queued_at is not None:  # contract v4: its timeout counts from this requeue
            gang.spec = event.gang
        if gang.spec.timeout_ms is not None:
            cluster.timers.push(gang.spec.waiting_since + gang.spec.timeout_ms, GANG_TIMEOUT, gang.gang_id)
    elif gang.state == GANG_RETRYING:  # back from its retry: as requeued
        if event.gang.queued_at is not None:  # contract v4: its timeout counts from its retry
            gang.spec = event.gang
        if gang.spec.timeout_ms is not None:
            cluster.timers.push(gang.spec.waiting_since + gang.spec.timeout_ms, GANG_TIMEOUT, gang.gang_id)
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
    if gang.spec.min_members_per_role:
        placed = {member.pod_id for member in event.members}
        counts: dict[str, int] = {}
        for member in gang.spec.members:
            if member.pod_id in placed and member.role is not None:
                counts[member.role] = counts.get(member.role, 0) + 1
        for role, minimum in gang.spec.min_members_per_role.items():
            if counts.get(role, 0) < minimum:
                raise InvariantViolation(f"gang {gang.gang_id!r} scheduled with role {role!r} below its minimum")
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
        if cluster.disrupted:
            cluster.disrupted.pop(member.pod_id, None)
    for member_id in event.members_ended:  # they never ran in this incarnation: ended, not ok (contract v4)
        cluster.remember_end(member_id, False)
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
        cluster.timers.push(event.expected_start, RESERVATION_START, event.holder_id)


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


def _applied_cohort_changed(state: PartitionState, cluster: ClusterState, event: CohortChanged, now: int) -> None:
    """A cohort of the tree declared, changed (a spec) or forgotten (None): the children and pools follow."""
    if event.spec is None:
        cluster.cohort_specs.pop(event.cohort, None)
    else:
        cluster.cohort_specs[event.cohort] = event.spec
    cluster.cohort_children = cohort_tree.children_of(cluster.cohort_specs)
    cluster.rebuild_pools()


def _applied_pod_migrated(state: PartitionState, cluster: ClusterState, event: PodMigrated, now: int) -> None:
    pod = lookup(cluster.pods, event.pod_id)
    if pod is None or pod.node_id != event.from_node or pod.gpus != tuple(event.from_gpus):
        raise InvariantViolation(f"pod {event.pod_id!r} migrated from {event.from_node!r} where it does not run")
    source = _node_of(cluster, event.from_node)
    target = _node_of(cluster, event.to_node)
    if not target.schedulable or (target is source and tuple(event.to_gpus) == pod.gpus):
        raise InvariantViolation(f"pod {event.pod_id!r} migrated to unschedulable node {event.to_node!r} or nowhere")
    cluster.charge(pod, source, -1)
    source.free(pod.spec, pod.gpus, pod.started_at)
    target.allocate(pod.spec, tuple(event.to_gpus), pod.started_at)
    pod.node_id = target.node_id
    pod.gpus = tuple(event.to_gpus)
    cluster.charge(pod, target, +1)
    cluster.reindex(source)
    cluster.reindex(target)


APPLIED_IN_APPLY = (CommandRejected, Ticked, ClusterHalted)
"""Events :func:`apply` handles itself: a rejection and a tick change only the position and the clock (a
partition-wide tick every cluster's clock), and a halt replaces the cluster."""

APPLIERS: dict[type, Callable[[PartitionState, ClusterState, Any, int], None]] = {
    NodeAdded: _applied_node_added,
    NodeRemoved: _applied_node_removed,
    NodeCordoned: _applied_node_cordoned,
    NodeUncordoned: _applied_node_uncordoned,
    NodeDrained: _applied_node_drained,
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
    ClusterResumed: _applied_cluster_resumed,
    NodeRecovered: _applied_node_recovered,
    NodeUpdated: _applied_node_updated,
    PodRetryScheduled: _applied_pod_retry_scheduled,
    DisruptionBudgetSet: _applied_budget_set,
    DisruptionBudgetRemoved: _applied_budget_removed,
    EvictionBlocked: _applied_eviction_blocked,
    PodEvictionScheduled: _applied_pod_eviction_scheduled,
    CohortChanged: _applied_cohort_changed,
}
