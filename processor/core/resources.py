"""The resource model: node free capacity signatures, pod request shapes, and the fit predicate.

A GPU is 1000 milli. A pod asks for ``num_gpu`` whole GPUs (``gpu_milli`` 1000),
one share of one GPU (``num_gpu`` 1, ``0 < gpu_milli < 1000``) or no GPU.

Two nodes with the same :class:`Signature` are interchangeable for every pod
(same model, labels and taints, capacity and free capacity), so fit checks and
scores are computed per signature, not per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from schemas.codes import QueueReasonCode
from schemas.commands import GPU_MILLI, Taint, Toleration

# A node's labels and taints, normalised; nodes of one class accept the same pods.
NodeClass = tuple[tuple[tuple[str, str], ...], tuple[Taint, ...]]


class Signature(NamedTuple):
    """Everything about a node that placement looks at, except its id."""

    gpu_model: str
    node_class: NodeClass
    cpu_capacity: int
    memory_capacity: int
    gpu_free: tuple[int, ...]  # free milli per GPU, sorted descending
    cpu_free: int
    memory_free: int
    # (free milli, free memory) per GPU, sorted descending, on a node that declares GPU memory; else empty.
    gpu_memory: tuple[tuple[int, int], ...] = ()


class PodShape(NamedTuple):
    """Everything about a pod request that placement looks at, except its id and priority."""

    num_gpu: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    gpu_models: tuple[str, ...]  # sorted; empty = any
    node_selector: tuple[tuple[str, str], ...]  # sorted items
    tolerations: tuple[Toleration, ...]
    # Pods of one shape are interchangeable in the queue; a time limit decides whether a pod may
    # backfill onto reserved nodes, so pods with different limits are different shapes.
    time_limit_ms: int | None = None
    gpu_memory_mib: int = 0  # on each of its GPUs

    @property
    def is_share(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI

    @property
    def gpu_milli_total(self) -> int:
        return self.num_gpu * self.gpu_milli


@dataclass(slots=True)
class Held:
    """What the running pods of one priority hold on one node (``Node.by_priority``), kept as they start and stop.

    A preemption search reads from it what the pods below a priority would free, and how few victims and how
    little work it could take on the node at best, without visiting the pods (``processor.core.preemption``).
    """

    gpu_milli: list[int]  # per GPU index
    cpu_milli: int = 0
    memory_mib: int = 0
    pods: int = 0
    gpu_pods: int = 0  # of them, the pods holding GPUs
    # GPU milli of one pod -> the latest start among the pods that size (the pods that started with a start
    # recorded; a pod stopped without its start given leaves it an upper bound, dropped with the last pod of that
    # size: a size no pod has any more would promise a victim that is not there); the latest start of all (-1:
    # none) and the largest size in it (0: none); and how many pods of each size run.
    latest_starts: dict[int, int] = field(default_factory=dict)
    latest_start: int = -1
    largest_gpu_milli: int = 0
    sizes: dict[int, int] = field(default_factory=dict)
    # GPU milli of one pod -> start -> how many pods of that size started then: what makes the latest start
    # exact again when the latest pod stops (else, after an eviction of a node's newest pod, the node's bound
    # stays that of a pod no longer there and every preemption search meets it in vain).
    starts: dict[int, dict[int, int]] = field(default_factory=dict)

    def copied(self) -> Held:
        """A copy with its own GPU list and starts (a what-if fork's)."""
        return Held(
            list(self.gpu_milli),
            self.cpu_milli,
            self.memory_mib,
            self.pods,
            self.gpu_pods,
            dict(self.latest_starts),
            self.latest_start,
            self.largest_gpu_milli,
            dict(self.sizes),
            {milli: dict(by_start) for milli, by_start in self.starts.items()},
        )

    def forget_start(self, milli: int, started: int) -> None:
        """One pod of ``milli`` GPU milli that started at ``started`` stopped: the size's latest start (and the
        latest of all, and the largest size) become those of the pods left. O(1), or O(distinct starts of the
        size) when it was the latest. A start never recorded changes nothing (the latest stays a bound)."""
        by_start = self.starts.get(milli)
        if by_start is None or started not in by_start:
            return
        count = by_start[started] - 1
        if count:
            by_start[started] = count
            return
        del by_start[started]
        if started != self.latest_starts.get(milli):
            return
        if by_start:
            self.latest_starts[milli] = max(by_start)
        else:  # pods of the size without a start recorded may run on: the size stays in ``sizes``
            del self.starts[milli]
            del self.latest_starts[milli]
            if milli == self.largest_gpu_milli:
                self.largest_gpu_milli = max(self.latest_starts, default=0)
        if started == self.latest_start:
            self.latest_start = max(self.latest_starts.values(), default=-1)

    def drop_size(self, milli: int) -> None:
        """One pod of ``milli`` GPU milli stopped: the last one of its size takes the size's latest start along."""
        count = self.sizes[milli] - 1
        if count:
            self.sizes[milli] = count
            return
        del self.sizes[milli]
        self.starts.pop(milli, None)
        started = self.latest_starts.pop(milli, None)
        if started is None:
            return
        if started == self.latest_start:
            self.latest_start = max(self.latest_starts.values(), default=-1)
        if milli == self.largest_gpu_milli:
            self.largest_gpu_milli = max(self.latest_starts, default=0)


def gpu_fits(gpu_free: tuple[int, ...], num_gpu: int, gpu_milli: int) -> bool:
    """Whether a sorted-descending free vector can give the GPU part of a request. O(1)."""
    if num_gpu == 0:
        return True
    if gpu_milli >= GPU_MILLI:
        return len(gpu_free) >= num_gpu and gpu_free[num_gpu - 1] >= GPU_MILLI
    return len(gpu_free) > 0 and gpu_free[0] >= gpu_milli


def gpu_memory_fits(gpu_memory: tuple[tuple[int, int], ...], num_gpu: int, gpu_milli: int, need: int) -> bool:
    """Whether a node's (free milli, free memory) pairs hold the request's GPUs with ``need`` MiB on each
    (true on a node that does not declare GPU memory, or for a pod that asks none). O(G)."""
    if not gpu_memory or not need or not num_gpu:
        return True
    if gpu_milli >= GPU_MILLI:
        return sum(1 for milli, memory in gpu_memory if milli >= GPU_MILLI and memory >= need) >= num_gpu
    return any(milli >= gpu_milli and memory >= need for milli, memory in gpu_memory)


def class_admits(node_class: NodeClass, shape: PodShape) -> bool:
    """Node selector and taints/tolerations (NoSchedule and NoExecute filter; PreferNoSchedule does not)."""
    return _selector_matches(node_class, shape) and _taints_tolerated(node_class, shape)


def _selector_matches(node_class: NodeClass, shape: PodShape) -> bool:
    if not shape.node_selector:
        return True
    labels = dict(node_class[0])
    return all(labels.get(key) == value for key, value in shape.node_selector)


def _taints_tolerated(node_class: NodeClass, shape: PodShape, *, reservation: bool = True) -> bool:
    for taint in node_class[1]:
        if taint.key == RESERVED_TAINT_KEY:
            # Only the toleration the fold gives (the holder, backfill that ends in time) names this key: a
            # pod's own wildcard toleration (key "", Exists) does not get past a reservation.
            if reservation and not any(
                toleration.key == RESERVED_TAINT_KEY and toleration.tolerates(taint) for toleration in shape.tolerations
            ):
                return False
            continue
        if taint.effect == "PreferNoSchedule":
            continue
        if not any(toleration.tolerates(taint) for toleration in shape.tolerations):
            return False
    return True


def evicted_by_taints(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]) -> bool:
    """Whether a running pod must leave a node with these taints: one ``NoExecute`` taint it does not tolerate."""
    return any(
        taint.effect == NO_EXECUTE and not any(toleration.tolerates(taint) for toleration in tolerations)
        for taint in taints
    )


NO_EXECUTE = "NoExecute"
"""The taint effect that evicts the running pods that do not tolerate it (UpdateNode), as in Kubernetes."""

RESERVED_TAINT_KEY = "gpufold.io/reserved"
"""A node reserved for the head of the queue carries this taint (value: the holder's id) in its node
class, so the capacity index keeps every pod off it but those given the matching toleration: the
holder itself and backfill that ends before the reservation's expected start. It is never one of the
node's own taints (``Node.taints``, snapshots, events)."""


def reservation_taint(holder_id: str) -> Taint:
    return Taint(RESERVED_TAINT_KEY, holder_id, "NoSchedule")


def reservation_toleration(holder_id: str) -> Toleration:
    return Toleration(RESERVED_TAINT_KEY, "Equal", holder_id, "NoSchedule")


def is_reserved(node_class: NodeClass) -> bool:
    return any(taint.key == RESERVED_TAINT_KEY for taint in node_class[1])


def first_misfit(signature: Signature, shape: PodShape) -> str | None:
    """The first check a node of this signature fails for the shape, or None if it fits.

    The order (model, selector, taints, GPU, share, GPU memory, CPU, memory, reservation) is
    the order of the reasons reported in ``PodQueued``: a reserved node is reported
    as ``NODE_RESERVED`` only when the pod would otherwise fit it.
    """
    if shape.gpu_models and signature.gpu_model not in shape.gpu_models:
        return QueueReasonCode.GPU_MODEL_MISMATCH
    if not _selector_matches(signature.node_class, shape):
        return QueueReasonCode.NODE_SELECTOR_MISMATCH
    if not _taints_tolerated(signature.node_class, shape, reservation=False):
        return QueueReasonCode.UNTOLERATED_TAINT
    if not gpu_fits(signature.gpu_free, shape.num_gpu, shape.gpu_milli):
        return QueueReasonCode.INSUFFICIENT_GPU_SHARE if shape.is_share else QueueReasonCode.INSUFFICIENT_GPU
    if not gpu_memory_fits(signature.gpu_memory, shape.num_gpu, shape.gpu_milli, shape.gpu_memory_mib):
        return QueueReasonCode.INSUFFICIENT_GPU_MEMORY
    if signature.cpu_free < shape.cpu_milli:
        return QueueReasonCode.INSUFFICIENT_CPU
    if signature.memory_free < shape.memory_mib:
        return QueueReasonCode.INSUFFICIENT_MEMORY
    if not _taints_tolerated(signature.node_class, shape):
        return QueueReasonCode.NODE_RESERVED
    return None
