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

from processor.core.state import ClusterState, Node, PartitionState, Pod, shape_of
from schemas.commands import GPU_MILLI
from schemas.fragmentation import TypicalKey, TypicalPod
from schemas.snapshots import (
    ClusterSnapshot,
    NodeSnapshot,
    PodSnapshot,
    Snapshot,
    TypicalPodSnapshot,
    encode_snapshot_body,
)


def _cluster_snapshot(cluster: ClusterState) -> ClusterSnapshot:
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
        )
        for node in (cluster.nodes[node_id] for node_id in sorted(cluster.nodes))
    )
    pods = []
    for pod_id in sorted(cluster.pods):
        pod = cluster.pods[pod_id]
        spec = pod.spec
        if list(spec.node_selector) != sorted(spec.node_selector):  # canonical order, whatever the event had
            spec = dataclasses.replace(spec, node_selector=dict(sorted(spec.node_selector.items())))
        pods.append(PodSnapshot(spec, pod.node_id, pod.gpus))
    typical = tuple(
        TypicalPodSnapshot(pod.key.num_gpu, pod.key.gpu_milli, pod.key.cpu_milli, pod.key.gpu_models, pod.weight)
        for pod in cluster.typical
    )
    return ClusterSnapshot(cluster.name, cluster.policy, cluster.arrivals, nodes, tuple(pods), typical)


def to_snapshot(state: PartitionState) -> Snapshot:
    """The state as a :class:`Snapshot` record. O(n log n) in nodes + pods."""
    return Snapshot(
        state.partition,
        state.next_offset,
        state.sequence,
        state.seen_window,
        tuple(state.seen),
        tuple(_cluster_snapshot(state.clusters[name]) for name in sorted(state.clusters)),
    )


def from_snapshot(snapshot: Snapshot) -> PartitionState:
    """Rebuild a state (with its indexes and queue) from a snapshot."""
    state = PartitionState(
        partition=snapshot.partition,
        sequence=snapshot.sequence,
        next_offset=snapshot.next_offset,
        seen=OrderedDict.fromkeys(snapshot.seen),
        seen_window=snapshot.seen_window,
    )
    for data in snapshot.clusters:
        cluster = ClusterState(data.cluster, policy=data.policy, arrivals=data.arrivals)
        cluster.typical = tuple(
            TypicalPod(TypicalKey(raw.num_gpu, raw.gpu_milli, raw.cpu_milli, tuple(raw.gpu_models)), raw.weight)
            for raw in data.typical_pods
        )
        state.clusters[cluster.name] = cluster
        for raw in data.nodes:
            node = Node(
                raw.node_id, raw.gpu_model, raw.gpu_count, raw.cpu_milli, raw.memory_mib, raw.labels, raw.taints
            )
            node.cordoned = raw.cordoned
            node.failed = raw.failed
            cluster.nodes[node.node_id] = node
            cluster.model_nodes[node.gpu_model] = cluster.model_nodes.get(node.gpu_model, 0) + 1
            if not node.failed:
                cluster.gpu_milli_capacity += node.gpu_count * GPU_MILLI
        pods = [Pod(raw.pod, shape_of(raw.pod), raw.node_id, raw.gpus) for raw in data.pods]
        # Running pods are bound in their original placement order per node; that
        # order only matters for eviction order, which uses arrival order below.
        for pod in sorted(pods, key=lambda p: (p.spec.arrival, p.spec.pod_id)):
            cluster.pods[pod.spec.pod_id] = pod
            cluster.count_shape(pod.shape, +1)
            if pod.node_id is not None:
                node = cluster.nodes[pod.node_id]
                node.allocate(pod.spec, pod.gpus)
                cluster.gpu_milli_allocated += pod.spec.gpu_milli_total
            else:
                pod.queued = True
                cluster.queue.push(pod.shape, pod.queue_key)
        for node_id in sorted(cluster.nodes):
            cluster.reindex(cluster.nodes[node_id])
    return state


def state_hash(state: PartitionState) -> str:
    """SHA-256 (hex) of the canonical encoding of the state, without its log position."""
    snapshot = to_snapshot(state)
    snapshot.next_offset = 0
    return hashlib.sha256(encode_snapshot_body(snapshot)).hexdigest()
