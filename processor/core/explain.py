"""Why a pending pod does not fit *now*: reasons recomputed on the current state, the nearest miss, what would help.

Pure functions of a :class:`~processor.core.state.ClusterState` (read only, never changed): the
read side's answer to "why is my pod waiting?". ``PodQueued.reasons`` say why a pod did not fit
when it was queued; capacity changes afterwards (a node of the right model added, another pod
released) do not rewrite them, so the live replica answers with :func:`explain` instead.

Cost: O(S) in distinct signatures of the schedulable nodes (as ``queue_reasons``), plus O(N_u) over
the unschedulable nodes for the "uncordon" suggestion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from processor.core.reasons import queue_reasons
from processor.core.resources import NodeClass, PodShape, Signature, class_admits, first_misfit, gpu_memory_fits
from processor.core.state import ClusterState, Node, Pod, lookup
from schemas.codes import QueueReasonCode
from schemas.commands import GPU_MILLI

_STATIC = frozenset(
    {
        QueueReasonCode.GPU_MODEL_MISMATCH,
        QueueReasonCode.NODE_SELECTOR_MISMATCH,
        QueueReasonCode.UNTOLERATED_TAINT,
    }
)


def request_text(shape: PodShape) -> str:
    """The request in words: ``2 whole GPUs``, ``a 250-milli GPU share``, ``no GPU``."""
    if not shape.num_gpu:
        return "no GPU"
    if shape.is_share:
        return f"a {shape.gpu_milli}-milli GPU share"
    return f"{shape.num_gpu} whole GPU{'s' if shape.num_gpu != 1 else ''}"


def reason_message(code: str, nodes: int, shape: PodShape) -> str:
    """A queue reason as a sentence a person can act on."""
    n = f"{nodes} node{'s' if nodes != 1 else ''}"
    models = " or ".join(shape.gpu_models)
    texts = {
        QueueReasonCode.NO_NODES: "the cluster has no nodes",
        QueueReasonCode.NODE_UNSCHEDULABLE: f"{n} cordoned or failed",
        QueueReasonCode.GPU_MODEL_MISMATCH: f"{n} of another GPU model (the pod allows {models or 'any'})",
        QueueReasonCode.NODE_SELECTOR_MISMATCH: f"{n} without the labels of the pod's node selector",
        QueueReasonCode.UNTOLERATED_TAINT: f"{n} with a taint the pod does not tolerate",
        QueueReasonCode.INSUFFICIENT_GPU: f"{n} with fewer than {shape.num_gpu} whole free GPU(s)",
        QueueReasonCode.INSUFFICIENT_GPU_SHARE: f"{n} with no GPU that has {shape.gpu_milli} milli free",
        QueueReasonCode.INSUFFICIENT_CPU: f"{n} with less than {shape.cpu_milli} CPU milli free",
        QueueReasonCode.INSUFFICIENT_MEMORY: f"{n} with less than {shape.memory_mib} MiB of memory free",
        QueueReasonCode.INSUFFICIENT_GPU_MEMORY: f"{n} with no GPU that has both the GPU share and "
        f"{shape.gpu_memory_mib} MiB of GPU memory free",
    }
    return texts.get(code, f"{n}: {code}")


@dataclass(slots=True)
class Shortfall:
    """One resource a node lacks for the pod: how much the pod asks, how much is free, how much is missing."""

    resource: str  # "gpus" (whole GPUs), "gpu_milli" (on one GPU), "gpu_memory_mib" (on one GPU), "cpu_milli", ...
    requested: int
    free: int

    @property
    def missing(self) -> int:
        return self.requested - self.free

    def as_json(self) -> dict[str, Any]:
        return {"resource": self.resource, "requested": self.requested, "free": self.free, "missing": self.missing}


@dataclass(slots=True)
class NearestMiss:
    """The schedulable node that comes closest: it passes model, selector and taints, and lacks the least."""

    node_id: str
    gpu_model: str
    lacks: list[Shortfall]
    similar_nodes: int  # nodes in the same free-capacity state (any of them would do)

    @property
    def message(self) -> str:
        parts = [f"{s.missing} {_UNITS[s.resource]}" for s in self.lacks]
        return f"node {self.node_id} lacks " + " and ".join(parts)

    def as_json(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "gpu_model": self.gpu_model,
            "similar_nodes": self.similar_nodes,
            "lacks": [s.as_json() for s in self.lacks],
            "message": self.message,
        }


_UNITS = {
    "gpus": "whole free GPU(s)",
    "gpu_milli": "GPU milli",
    "gpu_memory_mib": "MiB of GPU memory on one GPU",
    "cpu_milli": "CPU milli",
    "memory_mib": "MiB memory",
}


@dataclass(slots=True)
class ClassReason:
    """One node class (GPU model, labels, taints): how many nodes, and why none of them takes the pod."""

    gpu_model: str
    labels: dict[str, str]
    taints: list[str]
    nodes: int  # schedulable nodes of the class
    reasons: dict[str, int]  # first failing check -> nodes

    def as_json(self) -> dict[str, Any]:
        return {
            "gpu_model": self.gpu_model,
            "labels": self.labels,
            "taints": self.taints,
            "nodes": self.nodes,
            "reasons": [{"code": code, "nodes": count} for code, count in _ordered(self.reasons)],
        }


@dataclass(slots=True)
class Explanation:
    """Why a pod waits (or where it runs), computed on the state it was asked on."""

    cluster: str
    pod_id: str
    state: str  # "pending" | "running" | "waiting" (for dependencies)
    request: str
    node_id: str | None = None
    fits_now: bool = False
    reasons: list[dict[str, Any]] = field(default_factory=list)
    classes: list[ClassReason] = field(default_factory=list)
    nearest: NearestMiss | None = None
    would_fit_if: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "pod_id": self.pod_id,
            "state": self.state,
            "request": self.request,
            "node_id": self.node_id,
            "fits_now": self.fits_now,
            "message": self.message,
            "reasons": self.reasons,
            "node_classes": [c.as_json() for c in self.classes],
            "nearest_miss": None if self.nearest is None else self.nearest.as_json(),
            "would_fit_if": self.would_fit_if,
        }


def _ordered(counts: dict[str, int]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def live_reasons(cluster: ClusterState, shape: PodShape) -> list[dict[str, Any]]:
    """``PodQueued``'s reasons as they would be now (the fold's own ``queue_reasons``), each with a message. O(S)."""
    return [
        {"code": r.code, "nodes": r.nodes, "message": r.message or reason_message(r.code, r.nodes, shape)}
        for r in queue_reasons(cluster, shape)
    ]


def shortfalls(signature: Signature, shape: PodShape) -> list[Shortfall]:
    """What a node of this signature lacks for the shape's resources (model, selector and taints aside)."""
    lacks: list[Shortfall] = []
    free = signature.gpu_free  # sorted descending
    if shape.num_gpu:
        if shape.is_share:
            largest = free[0] if free else 0
            if largest < shape.gpu_milli:
                lacks.append(Shortfall("gpu_milli", shape.gpu_milli, largest))
        else:
            whole = sum(1 for milli in free if milli >= GPU_MILLI)
            if whole < shape.num_gpu:
                lacks.append(Shortfall("gpus", shape.num_gpu, whole))
    need = shape.gpu_memory_mib
    pairs = signature.gpu_memory
    if need and pairs and not lacks and not gpu_memory_fits(pairs, shape.num_gpu, shape.gpu_milli, need):
        enough = [memory for milli, memory in pairs if milli >= min(shape.gpu_milli, GPU_MILLI)]
        lacks.append(Shortfall("gpu_memory_mib", need, max(enough, default=0)))
    if signature.cpu_free < shape.cpu_milli:
        lacks.append(Shortfall("cpu_milli", shape.cpu_milli, signature.cpu_free))
    if signature.memory_free < shape.memory_mib:
        lacks.append(Shortfall("memory_mib", shape.memory_mib, signature.memory_free))
    return lacks


def _distance(lacks: list[Shortfall]) -> tuple[int, float]:
    """Fewer resources short first, then the smallest shortfall relative to the request."""
    return (len(lacks), sum(s.missing / s.requested for s in lacks if s.requested))


def _class_key(node_class: NodeClass) -> tuple[dict[str, str], list[str]]:
    labels, taints = node_class
    return dict(labels), [f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}" for t in taints]


def explain(cluster: ClusterState, pod_id: str) -> Explanation | None:
    """Explain a pod of the cluster on its current state; None if the cluster does not know the pod."""
    pod = lookup(cluster.pods, pod_id)
    if pod is None:
        return None
    shape = pod.shape
    result = Explanation(cluster.name, pod_id, "running" if pod.running else "pending", request_text(shape))
    if pod.running:
        result.node_id = pod.node_id
        gpus = ", ".join(f"GPU {g.index}: {g.milli} milli" for g in pod.gpus) or "no GPU"
        result.fits_now = True
        result.message = f"running on node {pod.node_id} ({gpus})"
        return result
    waiting_for = tuple(getattr(pod, "waiting_for", ()))
    if waiting_for:  # not in the queue yet: its dependencies have not ended
        result.state = "waiting"
        dependency = getattr(pod.spec, "dependency", "")
        result.message = f"waiting for {', '.join(waiting_for)} to end" + (f" ({dependency})" if dependency else "")
        return result
    retry_at = getattr(pod, "retry_at", None)
    if retry_at is not None:  # failed: its retry is a timer, not the queue
        result.state = "waiting"
        result.reasons = [
            {"code": QueueReasonCode.WAITING_FOR_RETRY, "nodes": 0, "message": f"retry {pod.attempt} is due"}
        ]
        result.message = f"it failed; retry {pod.attempt} is due at event time {retry_at} ms (backoff)"
        return result
    result.reasons = live_reasons(cluster, shape)
    result.fits_now = bool(cluster.index.feasible(shape))
    _per_class(cluster, shape, result)
    result.would_fit_if = _remedies(cluster, pod, result.nearest)
    result.message = _summary(cluster, result)
    return result


def _per_class(cluster: ClusterState, shape: PodShape, result: Explanation) -> None:
    classes: dict[tuple[str, NodeClass], ClassReason] = {}
    best: tuple[tuple[int, float], str, Signature, int] | None = None
    for group in cluster.index.groups():  # deterministic order: model, then signature
        signature = group.signature
        key = (signature.gpu_model, signature.node_class)
        entry = classes.get(key)
        if entry is None:
            labels, taints = _class_key(signature.node_class)
            entry = classes[key] = ClassReason(signature.gpu_model, labels, taints, 0, {})
        entry.nodes += group.size
        code = first_misfit(signature, shape)
        if code is None:
            continue
        entry.reasons[code] = entry.reasons.get(code, 0) + group.size
        if code in _STATIC:
            continue
        if code == QueueReasonCode.INSUFFICIENT_GPU_MEMORY and cluster.nodes[group.first()].gpu_memory_mib < (
            shape.gpu_memory_mib
        ):
            continue  # its GPUs are smaller than the pod's need: freeing nothing there helps
        lacks = shortfalls(signature, shape)
        candidate = (_distance(lacks), group.first(), signature, group.size)
        if best is None or candidate[:2] < best[:2]:
            best = candidate
    result.classes = [classes[key] for key in sorted(classes, key=lambda k: (k[0], repr(k[1])))]
    if best is not None:
        _, node_id, signature, size = best
        result.nearest = NearestMiss(node_id, signature.gpu_model, shortfalls(signature, shape), size)


def _fits_somewhere(cluster: ClusterState, shape: PodShape) -> int:
    return sum(group.size for group in cluster.index.feasible(shape))


def _remedies(cluster: ClusterState, pod: Pod, nearest: NearestMiss | None) -> list[dict[str, Any]]:
    """Single changes that would let the pod be placed now, each with the nodes it would then fit."""
    shape = pod.shape
    remedies: list[dict[str, Any]] = []
    if nearest is not None:
        remedies.append(
            {
                "change": "free_capacity",
                "node_id": nearest.node_id,
                "message": f"free {' and '.join(f'{s.missing} {_UNITS[s.resource]}' for s in nearest.lacks)} "
                f"on node {nearest.node_id} (release or move pods there)",
            }
        )
    if shape.gpu_models:
        count = _fits_somewhere(cluster, shape._replace(gpu_models=()))
        if count:
            message = f"allow any GPU model: fits {count} node(s)"
            remedies.append({"change": "allow_any_gpu_model", "nodes": count, "message": message})
    if shape.node_selector:
        count = _fits_somewhere(cluster, shape._replace(node_selector=()))
        if count:
            message = f"drop the node selector: fits {count} node(s)"
            remedies.append({"change": "drop_node_selector", "nodes": count, "message": message})
    cordoned = sorted(
        node.node_id for node in cluster.nodes.values() if node.cordoned and not node.failed and _node_fits(node, shape)
    )
    if cordoned:
        shown = ", ".join(cordoned[:5]) + (" ..." if len(cordoned) > 5 else "")
        remedies.append(
            {
                "change": "uncordon",
                "nodes": len(cordoned),
                "node_ids": cordoned[:20],
                "message": f"uncordon {shown}: fits there",
            }
        )
    if shape.num_gpu:
        models = " or ".join(shape.gpu_models) if shape.gpu_models else "any GPU model"
        remedies.append(
            {
                "change": "add_node",
                "message": f"add a node ({models}) with {request_text(shape)} free, "
                f"{shape.cpu_milli} CPU milli and {shape.memory_mib} MiB",
            }
        )
    return remedies


def _node_fits(node: Node, shape: PodShape) -> bool:
    signature = node.signature()
    return first_misfit(signature, shape) is None and class_admits(signature.node_class, shape)


def _summary(cluster: ClusterState, result: Explanation) -> str:
    if result.fits_now:
        return "fits a node now: it will be placed when the queue is next retried on that node"
    if not cluster.nodes:
        return "the cluster has no nodes"
    if result.nearest is not None:
        return f"waiting for {result.request}; nearest miss: {result.nearest.message}"
    top = result.reasons[0]["message"] if result.reasons else "no schedulable node"
    return f"waiting for {result.request}: no schedulable node passes model, selector and taints ({top})"
