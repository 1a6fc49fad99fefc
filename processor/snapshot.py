"""Snapshots of a partition's fold state, and its canonical ``state_hash``.

A snapshot lists clusters, nodes and pods sorted by id, so equal states encode
to equal bytes on any machine; free capacity, the capacity index and the queue
are derived data and are rebuilt on restore. ``state_hash`` is the SHA-256 of
the Avro body of the snapshot with the log position left out, so it speaks of
the allocation state (and the idempotency window), not of where it came from.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

from processor.commands import Taint
from processor.events import GpuShare, PodSpec
from processor.fragmentation import TypicalKey, TypicalPod
from processor.state import ClusterState, Node, PartitionState, Pod, shape_of


def to_snapshot(state: PartitionState) -> dict[str, Any]:
    """The state as a ``gpufold.Snapshot`` mapping. O(n log n) in nodes + pods."""
    clusters = []
    for name in sorted(state.clusters):
        cluster = state.clusters[name]
        nodes = [
            {
                "node_id": node.node_id,
                "gpu_model": node.gpu_model,
                "gpu_count": node.gpu_count,
                "cpu_milli": node.cpu_milli,
                "memory_mib": node.memory_mib,
                "labels": dict(sorted(node.labels.items())),
                "taints": [taint.to_avro() for taint in node.taints],
                "cordoned": node.cordoned,
                "failed": node.failed,
            }
            for node in (cluster.nodes[node_id] for node_id in sorted(cluster.nodes))
        ]
        pods = []
        for pod_id in sorted(cluster.pods):
            pod = cluster.pods[pod_id]
            spec = pod.spec.to_avro()
            spec["node_selector"] = dict(sorted(spec["node_selector"].items()))
            pods.append({"pod": spec, "node_id": pod.node_id, "gpus": [gpu.to_avro() for gpu in pod.gpus]})
        typical = [
            {
                "num_gpu": pod.key.num_gpu,
                "gpu_milli": pod.key.gpu_milli,
                "cpu_milli": pod.key.cpu_milli,
                "gpu_models": list(pod.key.gpu_models),
                "weight": pod.weight,
            }
            for pod in cluster.typical
        ]
        clusters.append(
            {
                "cluster": name,
                "policy": cluster.policy,
                "arrivals": cluster.arrivals,
                "nodes": nodes,
                "pods": pods,
                "typical_pods": typical,
            }
        )
    return {
        "partition": state.partition,
        "next_offset": state.next_offset,
        "sequence": state.sequence,
        "seen_window": state.seen_window,
        "seen": list(state.seen),
        "clusters": clusters,
    }


def from_snapshot(snapshot: dict[str, Any]) -> PartitionState:
    """Rebuild a state (with its indexes and queue) from a snapshot mapping."""
    state = PartitionState(
        partition=snapshot["partition"],
        sequence=snapshot["sequence"],
        next_offset=snapshot["next_offset"],
        seen=OrderedDict.fromkeys(snapshot["seen"]),
        seen_window=snapshot["seen_window"],
    )
    for data in snapshot["clusters"]:
        cluster = ClusterState(data["cluster"], policy=data["policy"], arrivals=data["arrivals"])
        cluster.typical = tuple(
            TypicalPod(
                TypicalKey(raw["num_gpu"], raw["gpu_milli"], raw["cpu_milli"], tuple(raw["gpu_models"])), raw["weight"]
            )
            for raw in data.get("typical_pods", [])
        )
        state.clusters[cluster.name] = cluster
        for raw in data["nodes"]:
            node = Node(
                raw["node_id"],
                raw["gpu_model"],
                raw["gpu_count"],
                raw["cpu_milli"],
                raw["memory_mib"],
                raw["labels"],
                tuple(Taint.from_avro(taint) for taint in raw["taints"]),
            )
            node.cordoned = raw["cordoned"]
            node.failed = raw["failed"]
            cluster.nodes[node.node_id] = node
            cluster.model_nodes[node.gpu_model] = cluster.model_nodes.get(node.gpu_model, 0) + 1
            if not node.failed:
                cluster.gpu_milli_capacity += node.gpu_count * 1000
        pods = [
            Pod(
                PodSpec.from_avro(raw["pod"]),
                shape_of(PodSpec.from_avro(raw["pod"])),
                raw["node_id"],
                tuple(GpuShare.from_avro(gpu) for gpu in raw["gpus"]),
            )
            for raw in data["pods"]
        ]
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
    from schemas import SNAPSHOT, registry  # the contract package; imported late to keep the core light

    snapshot = to_snapshot(state)
    snapshot["next_offset"] = 0
    return hashlib.sha256(registry().codec(SNAPSHOT).encode_body(snapshot)).hexdigest()
