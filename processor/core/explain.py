"""Why a job waits *now*: every reason the fold knows, recomputed on the current state, and what would help.

Pure functions of a :class:`~processor.core.state.ClusterState` (read only, never changed): the
read side's answer to "why is my pod waiting?". ``PodQueued.reasons`` say why a pod did not fit
when it was queued; capacity changes afterwards (a node of the right model added, another pod
released) do not rewrite them, so the live replica answers with :func:`explain` instead.

The reasons follow the fold's own order of checks (``processor.core.fold._place``): dependencies
(outside the queue), strict FIFO (a job ahead has not started), quota (the tenant's usage and
limit), then capacity per node class, a reservation holding the nodes it would fit, and
preemption. A remedy is proposed only if it could work: no "free 8 GPUs on node X" when X has
4 GPUs, no "add a node" when the quota holds the pod.

Jobs: a pod (pending, waiting for dependencies, or running), a gang (by its id), or a member of a
queued gang (which is not a pod until the gang starts).

Cost: O(S) in distinct signatures of the schedulable nodes (as ``queue_reasons``), plus O(N_u) over
the unschedulable nodes for the "uncordon" suggestion, plus O(models · keys) for quota.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from processor.core import gangs, node_victims, preemption, preemption_plans, quotas, reservations
from processor.core.reasons import queue_reasons
from processor.core.resources import NodeClass, PodShape, Signature, class_admits, first_misfit, gpu_memory_fits
from processor.core.state import (
    GANG_QUEUED,
    GANG_RETRYING,
    GANG_RUNNING,
    GANG_WAITING,
    ClusterState,
    Gang,
    Node,
    Pod,
    lookup,
    shape_of,
)
from schemas.codes import QueueReasonCode
from schemas.commands import GPU_MILLI, PREEMPT_NEVER, STRICT_FIFO
from schemas.events import PodSpec

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
        QueueReasonCode.NODE_RESERVED: f"{n} where it would fit are reserved",
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


_UNITS = {
    "gpus": "whole free GPU(s)",
    "gpu_milli": "GPU milli",
    "gpu_memory_mib": "MiB of GPU memory on one GPU",
    "cpu_milli": "CPU milli",
    "memory_mib": "MiB memory",
}


def _lacks_text(lacks: list[Shortfall]) -> str:
    return " and ".join(f"{s.missing} {_UNITS[s.resource]}" for s in lacks)


@dataclass(slots=True)
class NearestMiss:
    """The schedulable node that comes closest: it passes model, selector and taints, could hold the pod when
    empty, and lacks the least free capacity now."""

    node_id: str
    gpu_model: str
    lacks: list[Shortfall]
    similar_nodes: int  # nodes in the same free-capacity state (any of them would do)

    @property
    def message(self) -> str:
        return f"node {self.node_id} lacks {_lacks_text(self.lacks)}"

    def as_json(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "gpu_model": self.gpu_model,
            "similar_nodes": self.similar_nodes,
            "lacks": [s.as_json() for s in self.lacks],
            "message": self.message,
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
    """Why a job waits (or where it runs), computed on the state it was asked on."""

    cluster: str
    pod_id: str  # the job asked about: a pod, a gang, or a gang's member
    state: str  # "pending" | "running" | "waiting" (for dependencies)
    request: str
    kind: str = "pod"  # "pod" | "gang"
    node_id: str | None = None
    fits_now: bool = False
    reasons: list[dict[str, Any]] = field(default_factory=list)
    classes: list[ClassReason] = field(default_factory=list)
    nearest: NearestMiss | None = None
    would_fit_if: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""
    gang: dict[str, Any] | None = None  # the gang (and its members) the job is or belongs to
    reservation: dict[str, Any] | None = None  # the cluster's reservation, if it concerns the job

    def as_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "pod_id": self.pod_id,
            "kind": self.kind,
            "state": self.state,
            "request": self.request,
            "node_id": self.node_id,
            "fits_now": self.fits_now,
            "message": self.message,
            "reasons": self.reasons,
            "node_classes": [c.as_json() for c in self.classes],
            "nearest_miss": None if self.nearest is None else self.nearest.as_json(),
            "would_fit_if": self.would_fit_if,
            "gang": self.gang,
            "reservation": self.reservation,
        }


def _ordered(counts: dict[str, int]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _reason(code: str, nodes: int, message: str) -> dict[str, Any]:
    return {"code": code, "nodes": nodes, "message": message}


def live_reasons(cluster: ClusterState, shape: PodShape) -> list[dict[str, Any]]:
    """``PodQueued``'s capacity reasons as they would be now (the fold's own ``queue_reasons``), each with a
    message. O(S)."""
    return [
        _reason(r.code, r.nodes, r.message or reason_message(r.code, r.nodes, shape))
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


def could_ever_hold(signature: Signature, shape: PodShape) -> bool:
    """Whether a node of this signature, emptied, has the capacity the shape asks (GPUs, CPU, memory)."""
    gpus = len(signature.gpu_free)
    return (
        gpus >= shape.num_gpu
        and signature.cpu_capacity >= shape.cpu_milli
        and (signature.memory_capacity >= shape.memory_mib)
    )


def _distance(lacks: list[Shortfall]) -> tuple[int, float]:
    """Fewer resources short first, then the smallest shortfall relative to the request."""
    return (len(lacks), sum(s.missing / s.requested for s in lacks if s.requested))


def _class_key(node_class: NodeClass) -> tuple[dict[str, str], list[str]]:
    labels, taints = node_class
    return dict(labels), [f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}" for t in taints]


# ------------------------------------------------------------------ the entry point


def explain(cluster: ClusterState, job_id: str, now: int | None = None) -> Explanation | None:
    """Explain a pod, a gang or a gang's member on the cluster's current state; None if the cluster does not
    know the id. ``now``: the cluster's event time (for ages and a reservation's start; default: unknown)."""
    pod = lookup(cluster.pods, job_id)
    gang = cluster.gangs.get(job_id)
    if gang is None and (pod is None or pod.spec.gang_id is not None):
        owner = cluster.member_of.get(job_id) or (pod.spec.gang_id if pod is not None else None)
        gang = cluster.gangs.get(owner) if owner is not None else None
    if pod is None and gang is None:
        return None
    clock = 0 if now is None else now
    if pod is not None and pod.running:
        return _running(cluster, pod, gang)
    if gang is not None and pod is not None and pod.queued and gang.state == GANG_RUNNING:
        return _waiting_member(cluster, pod, gang, clock)
    if gang is not None:
        return _explain_gang(cluster, gang, job_id, clock)
    assert pod is not None
    if pod.waiting_for:
        return _waiting(cluster, pod)
    if pod.retry_at is not None:
        return _retrying(cluster, pod)
    return _pending(cluster, pod, clock)


def _waiting_member(cluster: ClusterState, pod: Pod, gang: Gang, now: int) -> Explanation:
    """A member beyond ``min_members`` waiting for room while its gang runs (contract v4): a pending pod, the
    first reason saying whose member it is."""
    result = _pending(cluster, pod, now)
    spec = gang.spec
    role = "" if pod.spec.role is None else f" (role {pod.spec.role!r})"
    words = (
        f"member{role} of gang {gang.gang_id!r}, which runs {len(gang.placed)} of {len(spec.members)} members "
        f"(min_members {spec.min_members}): it starts when it fits"
    )
    result.reasons.insert(0, _reason(QueueReasonCode.GANG_MEMBER_WAITING, 0, words))
    result.gang = gang_json(cluster, gang)
    result.message = f"{words}; {result.message}"
    return result


def _running(cluster: ClusterState, pod: Pod, gang: Gang | None) -> Explanation:
    result = Explanation(cluster.name, pod.spec.pod_id, "running", request_text(pod.shape))
    result.node_id = pod.node_id
    gpus = ", ".join(f"GPU {g.index}: {g.milli} milli" for g in pod.gpus) or "no GPU"
    result.fits_now = True
    result.message = f"running on node {pod.node_id} ({gpus})"
    if gang is not None:
        result.gang = gang_json(cluster, gang)
        result.message += f", a member of gang {gang.gang_id!r}"
    return result


def _waiting(cluster: ClusterState, pod: Pod) -> Explanation:
    result = Explanation(cluster.name, pod.spec.pod_id, "waiting", request_text(pod.shape))
    dependency = getattr(pod.spec, "dependency", "")
    waiting = ", ".join(pod.waiting_for)
    message = f"waiting for {waiting} to end" + (f" ({dependency})" if dependency else "")
    result.reasons = [_reason(QueueReasonCode.WAITING_FOR_DEPENDENCY, 0, message)]
    result.message = message + ": it enters the queue then"
    return result


def _retrying(cluster: ClusterState, pod: Pod) -> Explanation:
    """A failed pod waiting for its retry: a timer, not the queue."""
    result = Explanation(cluster.name, pod.spec.pod_id, "waiting", request_text(pod.shape))
    message = f"it failed; retry {pod.attempt} is due at event time {pod.retry_at} ms (backoff)"
    result.reasons = [_reason(QueueReasonCode.WAITING_FOR_RETRY, 0, message)]
    result.message = message
    return result


# ------------------------------------------------------------------ a pending pod


def pending_reasons(
    cluster: ClusterState, spec: PodSpec, shape: PodShape, now: int
) -> tuple[list[dict[str, Any]], bool]:
    """Every reason a queued pod does not start now, in the fold's order, and whether capacity alone would let
    it start (it fits a node it may use). O(S + models · keys)."""
    reasons: list[dict[str, Any]] = []
    fifo = _fifo_reason(cluster, (-spec.priority, spec.arrival, spec.pod_id))
    if fifo is not None:
        reasons.append(fifo)
    usable = reservations.usable_shape(cluster, spec.pod_id, shape, now)
    if cluster.quotas_on:
        admission = quotas.admit(cluster, spec, usable)
        if admission.shortfalls:
            words = quotas.shortfall_words(admission.shortfalls)
            if admission.shape is not None:
                words = f"not on {', '.join(model for model, _ in admission.shortfalls)}: {words}"
            reason = _reason(QueueReasonCode.QUOTA_EXCEEDED, 0, words)
            above = [short for _, short in admission.shortfalls if short.depth >= 2 and short.cohort is not None]
            if above:  # it waits on the pool of a cohort above its own (contract v4): which one, at which level
                reason["cohort"], reason["level"] = above[0].cohort, above[0].depth
            reasons.append(reason)
        if admission.shape is None:
            return reasons, bool(cluster.index.feasible(usable))
        usable = admission.shape
    fits = bool(cluster.index.feasible(usable))
    if not fits:
        reasons.extend(live_reasons(cluster, usable))
        if spec.preemption == PREEMPT_NEVER and preemption_plans.lower_priority_exists(cluster, spec.priority):
            count = sum(
                1
                for node_id in preemption.candidate_nodes(cluster, spec.priority, None)
                if node_victims.could_preempt_on(cluster.nodes[node_id], usable, spec.priority, cluster)
            )
            if count:
                message = (
                    f"it would fit on {count} node(s) once lower-priority pods there end; it does not preempt them "
                    "(preemption: never)"
                )
                reasons.append(_reason(QueueReasonCode.WAITING_FOR_PREEMPTION, count, message))
    return reasons, fits


def _fifo_reason(cluster: ClusterState, key: tuple[int, int, str]) -> dict[str, Any] | None:
    """Strict FIFO: the job ahead that has not started (the fold's ``_blocked_by_earlier``)."""
    if cluster.queue_order != STRICT_FIFO:
        return None
    head = cluster.head()
    if head is None or head[0] >= key:
        return None
    message = (
        f"strict-fifo: {head[1]} {head[0][2]!r} (priority {-head[0][0]}) is ahead in the queue and has not started"
    )
    return _reason(QueueReasonCode.WAITING_FOR_EARLIER_JOB, 0, message)


def _pending(cluster: ClusterState, pod: Pod, now: int) -> Explanation:
    shape = pod.shape
    result = Explanation(cluster.name, pod.spec.pod_id, "pending", request_text(shape))
    result.reasons, capacity_fits = pending_reasons(cluster, pod.spec, shape, now)
    codes = {r["code"] for r in result.reasons}
    held = codes & {QueueReasonCode.WAITING_FOR_EARLIER_JOB, QueueReasonCode.QUOTA_EXCEEDED}
    result.fits_now = capacity_fits and not held
    reserved = cluster.reservation
    if reserved is not None and (reserved.holder_id == pod.spec.pod_id or QueueReasonCode.NODE_RESERVED in codes):
        result.reservation = _reservation_json(cluster, pod.spec.pod_id, now)
    usable = reservations.usable_shape(cluster, pod.spec.pod_id, shape, now)
    _per_class(cluster, usable, result)
    result.would_fit_if = _remedies(cluster, pod, result, codes, capacity_fits)
    result.message = _summary(cluster, result, codes, capacity_fits)
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
        if code in _STATIC or not could_ever_hold(signature, shape):
            continue
        if code == QueueReasonCode.INSUFFICIENT_GPU_MEMORY and cluster.nodes[group.first()].gpu_memory_mib < (
            shape.gpu_memory_mib
        ):
            continue  # its GPUs are smaller than the pod's need: freeing nothing there helps
        lacks = shortfalls(signature, shape)
        if not lacks:  # it fits but is reserved: not a miss of capacity
            continue
        candidate = (_distance(lacks), group.first(), signature, group.size)
        if best is None or candidate[:2] < best[:2]:
            best = candidate
    result.classes = [classes[key] for key in sorted(classes, key=lambda k: (k[0], repr(k[1])))]
    if best is not None:
        _, node_id, signature, size = best
        result.nearest = NearestMiss(node_id, signature.gpu_model, shortfalls(signature, shape), size)


def _fits_somewhere(cluster: ClusterState, shape: PodShape) -> int:
    return sum(group.size for group in cluster.index.feasible(shape))


def _largest(cluster: ClusterState, shape: PodShape) -> tuple[int, int, int] | None:
    """The most GPUs, CPU milli and MiB any node of the pod's models has (each on its own), or None if none."""
    found: tuple[int, int, int] | None = None
    for model, _labels, gpus, cpu, memory in cluster.capacities:
        if shape.gpu_models and model not in shape.gpu_models:
            continue
        found = (
            (gpus, cpu, memory) if found is None else (max(found[0], gpus), max(found[1], cpu), max(found[2], memory))
        )
    return found


def never_fits_text(cluster: ClusterState, shape: PodShape) -> str | None:
    """Why no node of the cluster, even empty, could hold the shape (e.g. "no node of model A10 has 8 GPUs")."""
    models = " or ".join(shape.gpu_models) if shape.gpu_models else "any model"
    for model, _labels, gpus, cpu, memory in sorted(cluster.capacities):
        if shape.gpu_models and model not in shape.gpu_models:
            continue
        if gpus >= shape.num_gpu and cpu >= shape.cpu_milli and memory >= shape.memory_mib:
            return None
    largest = _largest(cluster, shape)
    if largest is None:
        return f"the cluster has no node of model {models}" if shape.gpu_models else "the cluster has no nodes"
    gpus, cpu, memory = largest
    if gpus < shape.num_gpu:
        return f"no node of model {models} has {shape.num_gpu} GPUs (the largest has {gpus})"
    if cpu < shape.cpu_milli:
        return f"no node of model {models} has {shape.cpu_milli} CPU milli (the largest has {cpu})"
    if memory < shape.memory_mib:
        return f"no node of model {models} has {shape.memory_mib} MiB of memory (the largest has {memory})"
    return f"no node of model {models} has {shape.num_gpu} GPUs, {shape.cpu_milli} CPU milli and {shape.memory_mib} MiB"


def _remedies(
    cluster: ClusterState, pod: Pod, result: Explanation, codes: set[str], capacity_fits: bool
) -> list[dict[str, Any]]:
    """Single changes that would let the pod start now, each possible: never one the state rules out."""
    shape = pod.shape
    spec = pod.spec
    remedies: list[dict[str, Any]] = []
    if QueueReasonCode.WAITING_FOR_EARLIER_JOB in codes:
        head = cluster.head()
        ahead = f"{head[1]} {head[0][2]!r}" if head is not None else "the job ahead"
        remedies.append(
            {
                "change": "queue_order",
                "message": f"let work skip ahead (SetPolicy queue_order skip-ahead), or let {ahead} start first",
            }
        )
    if QueueReasonCode.QUOTA_EXCEEDED in codes:
        remedies.append(
            {
                "change": "raise_quota",
                "tenant": spec.tenant,
                "message": f"raise tenant {spec.tenant!r}'s quota (SetQuota), or release some of its running pods",
            }
        )
        cohort = next((r["cohort"] for r in result.reasons if "cohort" in r), None)
        if cohort is not None:
            remedies.append(
                {
                    "change": "raise_cohort_quota",
                    "cohort": cohort,
                    "message": f"raise cohort {cohort!r}'s own quota or the lending limits below it (SetCohort), or "
                    "release work that borrows in its subtree",
                }
            )
        if capacity_fits:
            return remedies  # the capacity is there: only the quota holds it
    reservation = cluster.reservation
    if (
        QueueReasonCode.NODE_RESERVED in codes
        and reservation is not None
        and reservation.holder_id != spec.pod_id
        and reservation.expected_start is not None
    ):
        remedies.append(
            {
                "change": "time_limit",
                "message": f"give it a time limit that ends by event time {reservation.expected_start} ms: it may "
                f"then backfill the nodes reserved for {reservation.holder_kind} {reservation.holder_id!r}",
            }
        )
    if capacity_fits:
        return remedies
    nearest = result.nearest
    if nearest is not None:
        remedies.append(
            {
                "change": "free_capacity",
                "node_id": nearest.node_id,
                "message": f"free {_lacks_text(nearest.lacks)} on node {nearest.node_id} (release or move pods there)",
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


def _summary(cluster: ClusterState, result: Explanation, codes: set[str], capacity_fits: bool) -> str:
    first: dict[str, str] = {}  # each code's first message (a loop: mypyc cannot compile this as a comprehension)
    for reason in result.reasons:
        first.setdefault(str(reason["code"]), str(reason["message"]))
    if QueueReasonCode.WAITING_FOR_EARLIER_JOB in codes:
        return f"held by strict FIFO: {first[QueueReasonCode.WAITING_FOR_EARLIER_JOB]}"
    if QueueReasonCode.QUOTA_EXCEEDED in codes and (capacity_fits or len(codes) == 1):
        return f"held by its quota: {first[QueueReasonCode.QUOTA_EXCEEDED]}"
    if result.fits_now:
        return "fits a node now: it will be placed when the queue is next retried on that node"
    if not cluster.nodes:
        return "the cluster has no nodes"
    reservation = result.reservation
    if reservation is not None and reservation.get("holder_id") == result.pod_id:
        return f"waiting for {result.request}; {reservation['message']}"
    if QueueReasonCode.NODE_RESERVED in codes:  # it would fit there: the reservation is what holds it
        return f"waiting for {result.request}: {first[QueueReasonCode.NODE_RESERVED]}"
    never = never_fits_text(cluster, _shape_of(result, cluster))
    if never is not None:
        return f"waiting for {result.request}: {never}"
    if result.nearest is not None:
        return f"waiting for {result.request}; nearest miss: {result.nearest.message}"
    top = result.reasons[0]["message"] if result.reasons else "no schedulable node"
    return f"waiting for {result.request}: no schedulable node passes model, selector and taints ({top})"


def _shape_of(result: Explanation, cluster: ClusterState) -> PodShape:
    pod = lookup(cluster.pods, result.pod_id)
    assert pod is not None
    return pod.shape


def _reservation_json(cluster: ClusterState, job_id: str, now: int) -> dict[str, Any] | None:
    """The cluster's reservation if the job holds it or would fit only on its nodes; None otherwise."""
    held = cluster.reservation
    if held is None:
        return None
    start = held.expected_start
    if held.holder_id == job_id:
        when = "expected start unknown" if start is None else f"expected start at event time {start} ms"
        if start is not None and now:
            when += f" (in {max(0, start - now) / 1000:g} s)"
        message = f"holds a reservation of {len(held.nodes)} node(s) ({', '.join(held.nodes[:8])}); {when}"
    else:
        message = reservations.reason_message(cluster, QueueReasonCode.NODE_RESERVED)
    return {
        "holder_id": held.holder_id,
        "holder_kind": held.holder_kind,
        "nodes": list(held.nodes),
        "expected_start": start,
        "made_at": held.made_at,
        "message": message,
    }


# ------------------------------------------------------------------ gangs

_GANG_STATES = {GANG_QUEUED: "pending", GANG_RUNNING: "running", GANG_WAITING: "waiting", GANG_RETRYING: "waiting"}
"""A gang's state as queries name it (a gang waiting for its retry is waiting, like a pod)."""


def gang_json(cluster: ClusterState, gang: Gang) -> dict[str, Any]:
    """A gang and its members: state, shapes, where the placed ones run."""
    spec = gang.spec
    members = []
    for member in spec.members:
        pod = lookup(cluster.pods, member.pod_id)
        members.append(
            {
                "pod_id": member.pod_id,
                "request": request_text(shape_of(member)),
                "num_gpu": member.num_gpu,
                "gpu_milli": member.gpu_milli,
                "cpu_milli": member.cpu_milli,
                "memory_mib": member.memory_mib,
                "node_id": pod.node_id if pod is not None else None,
                "role": member.role,
            }
        )
    state = _GANG_STATES.get(gang.state, gang.state)
    return {
        "gang_id": gang.gang_id,
        "tenant": spec.tenant,
        "priority": spec.priority,
        "state": state,
        "min_members": spec.min_members,
        "min_members_per_role": dict(spec.min_members_per_role),
        "members": members,
        "placed": len(gang.placed),
        "topology_required": spec.topology_required,
        "topology_preferred": spec.topology_preferred,
        "domain": None if gang.topology_key is None else f"{gang.topology_key}={gang.domain}",
        "waiting_for": list(gang.waiting_for),
        "submitted_at": spec.submitted_at,
    }


def gang_reasons(cluster: ClusterState, gang: Gang, now: int) -> list[dict[str, Any]]:
    """Why a queued gang does not start now: strict FIFO, its quota for all members, and the members that fit no
    node on their own (live per-node reasons of the first such member). O(M · S)."""
    spec = gang.spec
    reasons: list[dict[str, Any]] = []
    fifo = _fifo_reason(cluster, gang.key)
    if fifo is not None:
        reasons.append(fifo)
    quota = quotas.quota_of(cluster, spec.tenant) if cluster.quotas_on else None
    if quota is not None:
        wanted: quotas.Demand = {}
        for member in spec.members:
            models = quotas.models_for(cluster, shape_of(member)) or [""]
            quotas.add(wanted, quotas.demand(quota, member, models[0]))
        shortfall = quotas.check(cluster, spec.tenant, quota, wanted)
        if shortfall is not None:
            reasons.append(_reason(QueueReasonCode.QUOTA_EXCEEDED, 0, f"for all its members: {shortfall.message}"))
    missing = []
    for member in spec.members:
        usable = reservations.usable_shape(cluster, spec.gang_id, shape_of(member), now)
        if not cluster.index.feasible(usable):
            missing.append((member, usable))
    fitting = len(spec.members) - len(missing)
    if spec.min_members_per_role:  # contract v4: the role that is short, if one is (members that fit on their own)
        absent = {m.pod_id for m, _ in missing}
        short = gangs.role_short(spec, [m for m in spec.members if m.pod_id not in absent])
        if short is not None:
            role = short[0]
            message = f"{gangs.short_words(short)} (members that fit some node on their own now; min_members_per_role)"
            reasons.append(_reason(QueueReasonCode.GANG_DOES_NOT_FIT, 0, message))
            usable = next(u for m, u in missing if m.role == role)
            reasons.extend(live_reasons(cluster, usable))
            return reasons
    if missing:
        member, usable = missing[0]
        names = ", ".join(repr(m.pod_id) for m, _ in missing[:5]) + (" ..." if len(missing) > 5 else "")
        message = (
            f"{fitting} of {len(spec.members)} member(s) fit some node on their own now (it needs "
            f"{spec.min_members} at once); {names} fit no node"
        )
        reasons.append(_reason(QueueReasonCode.GANG_DOES_NOT_FIT, 0, message))
        reasons.extend(live_reasons(cluster, usable))
    elif not reasons:
        where = f" within one {spec.topology_required} domain" if spec.topology_required else ""
        roles = ""
        if spec.min_members_per_role:
            roles = " with " + ", ".join(f"{n} of role {r!r}" for r, n in sorted(spec.min_members_per_role.items()))
        message = (
            f"each member fits some node on its own, but not all {spec.min_members}{roles} at once{where} "
            "(they compete for the same nodes)"
        )
        reasons.append(_reason(QueueReasonCode.GANG_DOES_NOT_FIT, 0, message))
    return reasons


def _explain_gang(cluster: ClusterState, gang: Gang, job_id: str, now: int) -> Explanation:
    spec = gang.spec
    gpus = sum(m.num_gpu * m.gpu_milli for m in spec.members) / GPU_MILLI
    request = f"{len(spec.members)} member(s), {gpus:g} GPU(s) in all"
    state = _GANG_STATES.get(gang.state, gang.state)
    result = Explanation(cluster.name, job_id, state, request, kind="gang")
    result.gang = gang_json(cluster, gang)
    member = "" if job_id == gang.gang_id else f"member {job_id!r} of "
    if gang.state == GANG_RUNNING:
        result.fits_now = True
        result.message = f"{member}gang {gang.gang_id!r} runs: {len(gang.placed)} member(s) placed"
        return result
    if gang.state == GANG_RETRYING:  # a member failed: its retry is a timer, not the queue
        message = f"{member}gang {gang.gang_id!r} failed; retry {gang.attempt} is due at event time {gang.retry_at} ms"
        result.reasons = [_reason(QueueReasonCode.WAITING_FOR_RETRY, 0, message)]
        result.message = message + " (backoff)"
        return result
    if gang.state == GANG_WAITING:
        waiting = ", ".join(gang.waiting_for)
        message = f"{member}gang {gang.gang_id!r} waits for {waiting} to end"
        result.reasons = [_reason(QueueReasonCode.WAITING_FOR_DEPENDENCY, 0, message)]
        result.message = message + ": it enters the queue then"
        return result
    result.reasons = gang_reasons(cluster, gang, now)
    result.reservation = _reservation_json(cluster, gang.gang_id, now)
    codes = [r["code"] for r in result.reasons]
    top = result.reasons[0]["message"] if result.reasons else "it is queued"
    held = "held by strict FIFO: " if codes and codes[0] == QueueReasonCode.WAITING_FOR_EARLIER_JOB else ""
    if not held and QueueReasonCode.QUOTA_EXCEEDED in codes:
        held = "held by its quota: "
        top = next(r["message"] for r in result.reasons if r["code"] == QueueReasonCode.QUOTA_EXCEEDED)
    result.message = f"{member}gang {gang.gang_id!r} is queued: {held}{top}"
    if QueueReasonCode.QUOTA_EXCEEDED in codes:
        result.would_fit_if.append(
            {
                "change": "raise_quota",
                "tenant": spec.tenant,
                "message": f"raise tenant {spec.tenant!r}'s quota (SetQuota)",
            }
        )
    for text in {never_fits_text(cluster, shape_of(m)) for m in spec.members} - {None}:
        result.would_fit_if.append({"change": "add_node", "message": f"add a larger node: {text}"})
    return result
