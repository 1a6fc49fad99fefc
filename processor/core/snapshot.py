"""Snapshots of a partition's fold state, and its canonical ``state_hash``.

A snapshot (:class:`schemas.snapshots.Snapshot`) lists clusters, nodes and pods
sorted by id, so equal states encode to equal bytes on any machine; free
capacity, the capacity index and the queue are derived data and are rebuilt on
restore. ``state_hash`` is the SHA-256 of the Avro body of the snapshot with the
log position left out, so it speaks of the allocation state (and the idempotency
window), not of where it came from.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict

from processor.core import cohort_tree
from processor.core.state import (
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
from processor.core.timers import (
    EVICTION,
    GANG_TIMEOUT,
    PREEMPT_CHECK,
    RESERVATION_START,
    RESERVE_CHECK,
    RETRY,
    TIME_LIMIT,
)
from schemas.commands import GPU_MILLI
from schemas.events import DisruptionBudgetSet
from schemas.fragmentation import TypicalKey, TypicalPod
from schemas.snapshots import (
    BudgetSnapshot,
    ClusterSnapshot,
    DrainSnapshot,
    EndedJob,
    GangSnapshot,
    HaltSnapshot,
    NodeSnapshot,
    PodSnapshot,
    PreemptCheck,
    ReservationSnapshot,
    Snapshot,
    TenantQuota,
    TypicalPodSnapshot,
    encode_snapshot_body,
)


def _cluster_snapshot(cluster: ClusterState, reserve_checks: tuple[int, ...] = ()) -> ClusterSnapshot:
    nodes = tuple(
        NodeSnapshot(
            node.node_id,
            node.gpu_model,
            node.gpu_count,
            node.cpu_milli,
            node.memory_mib,
            dict(sorted(node.labels.items())),
            node.taints,
            node.cordoned,
            node.failed,
            node.gpu_memory_mib,
        )
        for node in (cluster.nodes[node_id] for node_id in sorted(cluster.nodes))
    )
    pods = []
    for pod_id in sorted(cluster.pods):
        pod = cluster.pods[pod_id]
        spec = pod.spec
        if list(spec.node_selector) != sorted(spec.node_selector):  # canonical order, whatever the event had
            spec = dataclasses.replace(spec, node_selector=dict(sorted(spec.node_selector.items())))
        pods.append(
            PodSnapshot(
                spec, pod.node_id, pod.gpus, pod.started_at, pod.waiting_for, pod.attempt, pod.retry_at, pod.evicting_at
            )
        )
    typical = tuple(
        TypicalPodSnapshot(pod.key.num_gpu, pod.key.gpu_milli, pod.key.cpu_milli, pod.key.gpu_models, pod.weight)
        for pod in cluster.typical
    )
    gangs = tuple(
        GangSnapshot(
            gang.spec,
            gang.state,
            tuple(sorted(gang.placed)),
            gang.topology_key,
            gang.domain,
            gang.started_at,
            gang.waiting_for,
            gang.ok,
            gang.attempt,
            gang.retry_at,
        )
        for gang in (cluster.gangs[gang_id] for gang_id in sorted(cluster.gangs))
    )
    reservation = cluster.reservation
    return ClusterSnapshot(
        cluster.name,
        cluster.policy,
        cluster.arrivals,
        nodes,
        tuple(pods),
        typical,
        cluster.reserve_after_ms,
        cluster.queue_order,
        gangs,
        tuple(EndedJob(job_id, ok) for job_id, ok in cluster.ended.items()),
        None
        if reservation is None
        else ReservationSnapshot(
            reservation.holder_id,
            reservation.holder_kind,
            reservation.nodes,
            reservation.expected_start,
            reservation.made_at,
        ),
        tuple(TenantQuota(tenant, cluster.quotas[tenant]) for tenant in sorted(cluster.quotas)),
        cluster.default_quota,
        reserve_checks,
        cluster.clock,
        cluster.max_clock_jump_ms,
        None
        if cluster.halted is None
        else HaltSnapshot(
            cluster.halted.command_id, cluster.halted.offset, cluster.halted.error, cluster.halted.refused
        ),
        tuple(
            BudgetSnapshot(b.budget_id, b.tenant, b.gang_id, b.label_selector, b.max_unavailable)
            for b in (cluster.budgets[budget_id] for budget_id in sorted(cluster.budgets))
        ),
        tuple(DrainSnapshot(node_id, *cluster.draining[node_id]) for node_id in sorted(cluster.draining)),
        dict(sorted(cluster.blocked.items())),
        tuple(cluster.disrupted),
        tuple(
            PreemptCheck(deadline, node_id)
            for deadline, kind, node_id in sorted(cluster.timers.heap)
            if kind == PREEMPT_CHECK
        ),
        tuple(cluster.cohort_specs[name] for name in sorted(cluster.cohort_specs)),
    )


def to_snapshot(state: PartitionState) -> Snapshot:
    """The state as a :class:`Snapshot` record. O(n log n) in nodes + pods."""
    checks = _reserve_checks(state)
    return Snapshot(
        state.partition,
        state.next_offset,
        state.sequence,
        state.seen_window,
        tuple(state.seen),
        tuple(_cluster_snapshot(state.clusters[name], checks.get(name, ())) for name in sorted(state.clusters)),
        state.clock,
    )


def _reserve_checks(state: PartitionState) -> dict[str, tuple[int, ...]]:
    """The pending RESERVE_CHECK deadlines per cluster, ascending.

    Unlike the other timers, which check on firing that they still apply, a reservation check set for
    an earlier head of a queue fires and looks at the queue as it is then: it is state, and a restored
    snapshot must hold it to fold the tail as the uninterrupted run does.
    """
    checks: dict[str, tuple[int, ...]] = {}
    for name, cluster in state.clusters.items():
        deadlines = tuple(deadline for deadline, kind, _ in sorted(cluster.timers.heap) if kind == RESERVE_CHECK)
        if deadlines:
            checks[name] = deadlines
    return checks


def from_snapshot(snapshot: Snapshot) -> PartitionState:
    """Rebuild a state (with its indexes and queue) from a snapshot."""
    state = PartitionState(
        partition=snapshot.partition,
        sequence=snapshot.sequence,
        next_offset=snapshot.next_offset,
        seen=OrderedDict.fromkeys(snapshot.seen),
        seen_window=snapshot.seen_window,
        clock=snapshot.clock,
    )
    for data in snapshot.clusters:
        cluster = ClusterState(
            data.cluster,
            policy=data.policy,
            arrivals=data.arrivals,
            reserve_after_ms=data.reserve_after_ms,
            queue_order=data.queue_order,
            clock=data.clock if data.clock >= 0 else snapshot.clock,  # a v2 snapshot has the partition's only
            max_clock_jump_ms=data.max_clock_jump_ms,
            halted=None
            if data.halted is None
            else Halt(data.halted.command_id, data.halted.offset, data.halted.error, data.halted.refused),
        )
        cluster.ended = OrderedDict((job.job_id, job.ok) for job in data.ended)
        cluster.cohort_specs = {spec.cohort: spec for spec in data.cohorts}  # before the quotas: pools need it
        cluster.cohort_children = cohort_tree.children_of(cluster.cohort_specs)
        cluster.rebuild_pools()
        for entry in data.quotas:
            cluster.set_quota(entry.tenant, entry.quota)
        cluster.default_quota = data.default_quota
        cluster.typical = tuple(
            TypicalPod(TypicalKey(raw.num_gpu, raw.gpu_milli, raw.cpu_milli, tuple(raw.gpu_models)), raw.weight)
            for raw in data.typical_pods
        )
        state.clusters[cluster.name] = cluster
        for raw in data.nodes:
            node = Node(
                raw.node_id,
                raw.gpu_model,
                raw.gpu_count,
                raw.cpu_milli,
                raw.memory_mib,
                raw.labels,
                raw.taints,
                raw.gpu_memory_mib,
            )
            node.cordoned = raw.cordoned
            node.failed = raw.failed
            cluster.nodes[node.node_id] = node
            cluster.model_nodes[node.gpu_model] = cluster.model_nodes.get(node.gpu_model, 0) + 1
            cluster.count_node(node, +1)
            if not node.failed:
                cluster.gpu_milli_capacity += node.gpu_count * GPU_MILLI
                cluster.cpu_capacity += node.cpu_milli
                cluster.memory_capacity += node.memory_mib
        for raw_gang in data.gangs:
            gang = Gang(
                raw_gang.gang,
                raw_gang.state,
                dict.fromkeys(raw_gang.placed),
                raw_gang.topology_key,
                raw_gang.domain,
                raw_gang.started_at,
                tuple(raw_gang.waiting_for),
                raw_gang.ok,
                raw_gang.attempt,
                raw_gang.retry_at,
            )
            cluster.gangs[gang.gang_id] = gang
            for member in gang.spec.members:
                cluster.member_of[member.pod_id] = gang.gang_id
            if gang.state == GANG_QUEUED:
                cluster.queue_gang(gang.key)
            elif gang.state == GANG_WAITING:
                cluster.wait_on(gang.gang_id, gang.waiting_for)
        pods = [
            Pod(
                raw.pod,
                shape_of(raw.pod),
                raw.node_id,
                raw.gpus,
                started_at=raw.started_at,
                waiting_for=raw.waiting_for,
                attempt=raw.attempt,
                retry_at=raw.retry_at,
                evicting_at=raw.evicting_at,
            )
            for raw in data.pods
        ]
        # Running pods are bound in their original placement order per node; that
        # order only matters for eviction order, which uses arrival order below.
        for pod in sorted(pods, key=lambda p: (p.spec.arrival, p.spec.pod_id)):
            cluster.pods[pod.spec.pod_id] = pod
            cluster.count_shape(pod.shape, +1)
            if pod.node_id is not None:
                node = cluster.nodes[pod.node_id]
                node.allocate(pod.spec, pod.gpus, pod.started_at)
                cluster.gpu_milli_allocated += pod.spec.gpu_milli_total
                cluster.charge(pod, node, +1)
            elif pod.waiting_for:
                cluster.wait_on(pod.spec.pod_id, pod.waiting_for)
            elif pod.retry_at is not None:
                pass  # waiting for its retry (a timer, rebuilt below), outside the queue
            else:
                pod.queued = True
                cluster.queue.push(pod.group, pod.queue_key)
        if data.reservation is not None:
            raw_reservation = data.reservation
            cluster.reservation = Reservation(
                raw_reservation.holder_id,
                raw_reservation.holder_kind,
                tuple(raw_reservation.nodes),
                raw_reservation.expected_start,
                raw_reservation.made_at,
            )
            for node_id in raw_reservation.nodes:
                cluster.nodes[node_id].reserve(raw_reservation.holder_id)
        for node_id in sorted(cluster.nodes):
            cluster.reindex(cluster.nodes[node_id])
        for deadline in data.reserve_checks:
            cluster.timers.push(deadline, RESERVE_CHECK)
        for check in data.preempt_checks:
            cluster.timers.push(check.at, PREEMPT_CHECK, check.node_id)
        for raw_budget in data.budgets:
            cluster.budgets[raw_budget.budget_id] = DisruptionBudgetSet(
                raw_budget.budget_id,
                raw_budget.tenant,
                raw_budget.gang_id,
                raw_budget.label_selector,
                raw_budget.max_unavailable,
            )
        cluster.draining = {drain.node_id: (drain.grace_ms, drain.respect_budgets) for drain in data.draining}
        cluster.blocked = dict(data.blocked)
        specs = {member.pod_id: member for gang in cluster.gangs.values() for member in gang.spec.members}
        for pod_id in data.disrupted:  # a pod's own spec, or (a member of a gang back in the queue) its gang's
            known = lookup(cluster.pods, pod_id)
            cluster.disrupted[pod_id] = known.spec if known is not None else specs[pod_id]
    rebuild_timers(state)
    return state


def rebuild_timers(state: PartitionState) -> None:
    """The timers a state implies (they are derived data, not in the snapshot), as ``apply`` pushes them."""
    for name in sorted(state.clusters):
        cluster = state.clusters[name]
        timers = cluster.timers
        for pod_id in sorted(cluster.pods):
            pod = cluster.pods[pod_id]
            if pod.running and pod.spec.time_limit_ms is not None and pod.started_at is not None:
                timers.push(pod.started_at + pod.spec.time_limit_ms, TIME_LIMIT, pod_id)
            elif pod.retry_at is not None:
                timers.push(pod.retry_at, RETRY, pod_id)
            if pod.evicting_at is not None:
                timers.push(pod.evicting_at, EVICTION, pod_id)
        for gang_id in sorted(cluster.gangs):
            gang = cluster.gangs[gang_id]
            if gang.state == GANG_RETRYING and gang.retry_at is not None:
                timers.push(gang.retry_at, RETRY, gang_id)
            elif gang.state != GANG_RUNNING and gang.spec.timeout_ms is not None:
                timers.push(gang.spec.waiting_since + gang.spec.timeout_ms, GANG_TIMEOUT, gang_id)
        reservation = cluster.reservation
        if reservation is not None and reservation.expected_start is not None:
            timers.push(reservation.expected_start, RESERVATION_START, reservation.holder_id)
        head = cluster.head()
        if head is not None and cluster.reserve_after_ms >= 0:
            key, kind = head
            holder = cluster.pods[key[2]].spec if kind == "pod" else cluster.gangs[key[2]].spec
            timers.push(holder.submitted_at + cluster.reserve_after_ms, RESERVE_CHECK)


def state_hash(state: PartitionState) -> str:
    """SHA-256 (hex) of the canonical encoding of the state, without its log position."""
    snapshot = to_snapshot(state)
    snapshot.next_offset = 0
    for cluster in snapshot.clusters:  # pending checks are kept for restores, not hashed (recorded hashes stay true)
        cluster.reserve_checks = ()
        cluster.preempt_checks = ()
    return hashlib.sha256(encode_snapshot_body(snapshot)).hexdigest()
