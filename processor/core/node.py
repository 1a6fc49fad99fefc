"""A node of the fold: its fixed capacity, what is free now GPU by GPU, and what its pods hold per priority.

Split from ``processor.core.state`` (which re-exports ``Node``, ``victim_level`` and ``NEVER_VICTIM``): the node
is what ``allocate``/``free`` change and what the placement and victim searches read.
"""

from __future__ import annotations

from processor.core.errors import InvariantViolation
from processor.core.resources import Held, NodeClass, Signature, reservation_taint
from schemas.commands import GPU_MILLI, Taint
from schemas.events import GpuShare, PodSpec

NEVER_VICTIM = 2**31
"""The level a pod that is not ``preemptible`` is held at in ``Node.by_priority`` and ``priority_nodes``: above
every priority (an Avro int), so no preemptor's search counts what it holds as room it could make."""


def victim_level(spec: PodSpec) -> int:
    """Where the pod is held per priority on its node: its priority, or :data:`NEVER_VICTIM` if it is not
    ``preemptible``."""
    return spec.priority if spec.preemptible else NEVER_VICTIM


class Node:
    """A node: its fixed capacity and what is free now, GPU by GPU."""

    __slots__ = (
        "base_class",
        "by_priority",
        "changes",
        "cordoned",
        "cpu_free",
        "cpu_milli",
        "failed",
        "gpu_count",
        "gpu_free",
        "gpu_memory_free",
        "gpu_memory_mib",
        "gpu_model",
        "labels",
        "memory_free",
        "memory_mib",
        "node_class",
        "node_id",
        "pods",
        "reserved_for",
        "taints",
    )

    def __init__(
        self,
        node_id: str,
        gpu_model: str,
        gpu_count: int,
        cpu_milli: int,
        memory_mib: int,
        labels: dict[str, str],
        taints: tuple[Taint, ...],
        gpu_memory_mib: int = 0,
    ) -> None:
        self.node_id = node_id
        self.gpu_model = gpu_model
        self.gpu_count = gpu_count
        self.cpu_milli = cpu_milli
        self.memory_mib = memory_mib
        self.labels = dict(labels)
        self.taints = tuple(taints)
        self.base_class: NodeClass = (tuple(sorted(self.labels.items())), self.taints)
        self.node_class: NodeClass = self.base_class  # plus the reservation taint while reserved
        self.reserved_for: str | None = None
        self.gpu_free = [GPU_MILLI] * gpu_count
        # Memory of each GPU and what is free of it, per index; empty (not checked) unless the node declares it.
        self.gpu_memory_mib = gpu_memory_mib
        self.gpu_memory_free: list[int] = [gpu_memory_mib] * gpu_count if gpu_memory_mib else []
        self.cpu_free = cpu_milli
        self.memory_free = memory_mib
        self.cordoned = False
        self.failed = False
        self.pods: dict[str, None] = {}  # running pod ids, in placement order
        # What the running pods hold, per priority (derived): see Held.
        self.by_priority: dict[int, Held] = {}
        self.changes = 0  # moved by every reindex: a node's derived answers (fit steps) are kept while it stays

    def __copy__(self) -> Node:
        """A shallow copy (a what-if fork's): compiled, ``copy.copy`` cannot make one without ``__init__``'s arguments.

        Every attribute is shared, as ``copy.copy`` shares them (``tests/unit/test_whatif_fork.py`` checks all).
        """
        twin = Node(self.node_id, self.gpu_model, self.gpu_count, self.cpu_milli, self.memory_mib, {}, ())
        twin.labels, twin.taints, twin.base_class, twin.node_class = (
            self.labels,
            self.taints,
            self.base_class,
            self.node_class,
        )
        twin.reserved_for, twin.gpu_free, twin.cpu_free = self.reserved_for, self.gpu_free, self.cpu_free
        twin.gpu_memory_mib, twin.gpu_memory_free = self.gpu_memory_mib, self.gpu_memory_free
        twin.memory_free, twin.cordoned, twin.failed = self.memory_free, self.cordoned, self.failed
        twin.pods, twin.by_priority, twin.changes = self.pods, self.by_priority, self.changes
        return twin

    @property
    def schedulable(self) -> bool:
        return not (self.cordoned or self.failed)

    def relabel(self, labels: dict[str, str], taints: tuple[Taint, ...]) -> None:
        """Replace the node's labels and taints (UpdateNode); the caller recounts and reindexes."""
        self.labels = dict(labels)
        self.taints = tuple(taints)
        self.base_class = (tuple(sorted(self.labels.items())), self.taints)
        self.reserve(self.reserved_for)

    def reserve(self, holder_id: str | None) -> None:
        """Hold the node for a reservation's holder (None: release it); the caller reindexes."""
        self.reserved_for = holder_id
        if holder_id is None:
            self.node_class = self.base_class
        else:
            self.node_class = (self.base_class[0], (*self.base_class[1], reservation_taint(holder_id)))

    def signature(self) -> Signature:
        return Signature(
            self.gpu_model,
            self.node_class,
            self.cpu_milli,
            self.memory_mib,
            tuple(sorted(self.gpu_free, reverse=True)),
            self.cpu_free,
            self.memory_free,
            tuple(sorted(zip(self.gpu_free, self.gpu_memory_free, strict=True), reverse=True))
            if self.gpu_memory_free
            else (),
        )

    def allocate(self, pod: PodSpec, gpus: tuple[GpuShare, ...], started_at: int | None = None) -> None:
        """Take a pod's resources; raises InvariantViolation rather than over-commit.

        ``started_at`` feeds the per-priority summary a preemption search uses to skip the node."""
        if self.cpu_free < pod.cpu_milli or self.memory_free < pod.memory_mib:
            raise InvariantViolation(f"pod {pod.pod_id} over-commits CPU or memory on node {self.node_id}")
        total = 0
        for share in gpus:
            if not 0 <= share.index < self.gpu_count or self.gpu_free[share.index] < share.milli:
                raise InvariantViolation(f"pod {pod.pod_id} over-commits GPU {share.index} on node {self.node_id}")
            total += share.milli
        repeated = len(gpus) > 1 and len({share.index for share in gpus}) != len(gpus)  # a GPU twice
        if repeated or total != pod.num_gpu * pod.gpu_milli:
            raise InvariantViolation(f"pod {pod.pod_id}: GPU assignment {gpus} does not match its request")
        memory = self.gpu_memory_free
        need = pod.gpu_memory_mib if memory else 0
        if need:
            for share in gpus:
                if memory[share.index] < need:
                    raise InvariantViolation(f"pod {pod.pod_id} over-commits the memory of GPU {share.index}")
            for share in gpus:
                memory[share.index] -= need
        level = pod.priority if pod.preemptible else NEVER_VICTIM  # victim_level, inline: hot
        held = self.by_priority.get(level)
        if held is None:
            held = self.by_priority[level] = Held([0] * self.gpu_count)
        milli = pod.num_gpu * pod.gpu_milli
        held.sizes[milli] = held.sizes.get(milli, 0) + 1
        if started_at is not None:
            by_start = held.starts.get(milli)
            if by_start is None:
                held.starts[milli] = {started_at: 1}
            else:
                by_start[started_at] = by_start.get(started_at, 0) + 1
            latest = held.latest_starts
            if latest.get(milli, -1) < started_at:
                latest[milli] = started_at
                if held.latest_start < started_at:
                    held.latest_start = started_at
            if held.largest_gpu_milli < milli:
                held.largest_gpu_milli = milli
        held_gpus = held.gpu_milli
        for share in gpus:
            self.gpu_free[share.index] -= share.milli
            held_gpus[share.index] += share.milli
        self.cpu_free -= pod.cpu_milli
        self.memory_free -= pod.memory_mib
        held.cpu_milli += pod.cpu_milli
        held.memory_mib += pod.memory_mib
        held.pods += 1
        if gpus:
            held.gpu_pods += 1
        self.pods[pod.pod_id] = None

    def free(self, pod: PodSpec, gpus: tuple[GpuShare, ...], started_at: int | None = None) -> None:
        """Give a pod's resources back. ``started_at``: the start it was allocated with (None if none), so the
        per-priority summary's latest starts stay exact (:meth:`Held.forget_start`)."""
        level = pod.priority if pod.preemptible else NEVER_VICTIM  # victim_level, inline: hot
        held = self.by_priority[level]
        held_gpus = held.gpu_milli
        gpu_free = self.gpu_free
        over = False  # a GPU freed past its capacity (the other GPUs did not change)
        for share in gpus:
            gpu_free[share.index] += share.milli
            held_gpus[share.index] -= share.milli
            if gpu_free[share.index] > GPU_MILLI:
                over = True
        memory = self.gpu_memory_free
        if memory and pod.gpu_memory_mib:
            for share in gpus:
                memory[share.index] += pod.gpu_memory_mib
        self.cpu_free += pod.cpu_milli
        self.memory_free += pod.memory_mib
        held.cpu_milli -= pod.cpu_milli
        held.memory_mib -= pod.memory_mib
        held.pods -= 1
        if gpus:
            held.gpu_pods -= 1
        if not held.pods:
            del self.by_priority[level]
        else:
            milli = pod.num_gpu * pod.gpu_milli
            if started_at is not None:
                held.forget_start(milli, started_at)
            held.drop_size(milli)
        del self.pods[pod.pod_id]
        if self.cpu_free > self.cpu_milli or over:
            raise InvariantViolation(f"node {self.node_id} freed more than its capacity")
        if memory and any(free > self.gpu_memory_mib for free in memory):
            raise InvariantViolation(f"node {self.node_id} freed more GPU memory than it has")

    @property
    def gpu_milli_allocated(self) -> int:
        return self.gpu_count * GPU_MILLI - sum(self.gpu_free)
