"""The fold state of one partition: clusters, their nodes, pods, indexes and queue.

One writer owns a ``PartitionState`` and changes it only through
``processor.core.fold.apply``; the indexes are updated in place on each event.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from processor.core.capacity import CapacityIndex
from processor.core.errors import InvariantViolation
from processor.core.pending import PendingQueue, QueueKey
from processor.core.resources import NodeClass, PodShape, Signature
from processor.core.typical import is_checkpoint, typical_key, typical_moved
from schemas.commands import GPU_MILLI, Taint
from schemas.events import GpuShare, PodSpec
from schemas.fragmentation import Typical, TypicalKey, derive_typical

DEFAULT_POLICY = "fgd-plus"
DEFAULT_SEEN_WINDOW = 100_000
"""How many recent command ids each partition remembers for idempotency.

A command id repeated within the last 100,000 commands of its partition is
rejected as DUPLICATE_COMMAND; older ids are forgotten (oldest first), which
bounds memory (about 10 MB) and snapshot size. Senders retrying for longer than
that window must use the idempotent producer, which Kafka dedupes itself.
"""
MAX_COMMAND_ID_LENGTH = 253  # longer (invalid, rejected) ids are not remembered


class Node:
    """A node: its fixed capacity and what is free now, GPU by GPU."""

    __slots__ = (
        "cordoned",
        "cpu_free",
        "cpu_milli",
        "failed",
        "gpu_count",
        "gpu_free",
        "gpu_model",
        "labels",
        "memory_free",
        "memory_mib",
        "node_class",
        "node_id",
        "pods",
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
    ) -> None:
        self.node_id = node_id
        self.gpu_model = gpu_model
        self.gpu_count = gpu_count
        self.cpu_milli = cpu_milli
        self.memory_mib = memory_mib
        self.labels = dict(labels)
        self.taints = tuple(taints)
        self.node_class: NodeClass = (tuple(sorted(self.labels.items())), self.taints)
        self.gpu_free = [GPU_MILLI] * gpu_count
        self.cpu_free = cpu_milli
        self.memory_free = memory_mib
        self.cordoned = False
        self.failed = False
        self.pods: dict[str, None] = {}  # running pod ids, in placement order

    @property
    def schedulable(self) -> bool:
        return not (self.cordoned or self.failed)

    def signature(self) -> Signature:
        return Signature(
            self.gpu_model,
            self.node_class,
            self.cpu_milli,
            self.memory_mib,
            tuple(sorted(self.gpu_free, reverse=True)),
            self.cpu_free,
            self.memory_free,
        )

    def allocate(self, pod: PodSpec, gpus: tuple[GpuShare, ...]) -> None:
        """Take a pod's resources; raises InvariantViolation rather than over-commit."""
        if self.cpu_free < pod.cpu_milli or self.memory_free < pod.memory_mib:
            raise InvariantViolation(f"pod {pod.pod_id} over-commits CPU or memory on node {self.node_id}")
        for share in gpus:
            if not 0 <= share.index < self.gpu_count or self.gpu_free[share.index] < share.milli:
                raise InvariantViolation(f"pod {pod.pod_id} over-commits GPU {share.index} on node {self.node_id}")
        if len({share.index for share in gpus}) != len(gpus) or sum(s.milli for s in gpus) != pod.gpu_milli_total:
            raise InvariantViolation(f"pod {pod.pod_id}: GPU assignment {gpus} does not match its request")
        for share in gpus:
            self.gpu_free[share.index] -= share.milli
        self.cpu_free -= pod.cpu_milli
        self.memory_free -= pod.memory_mib
        self.pods[pod.pod_id] = None

    def free(self, pod: PodSpec, gpus: tuple[GpuShare, ...]) -> None:
        for share in gpus:
            self.gpu_free[share.index] += share.milli
        self.cpu_free += pod.cpu_milli
        self.memory_free += pod.memory_mib
        del self.pods[pod.pod_id]
        if self.cpu_free > self.cpu_milli or any(free > GPU_MILLI for free in self.gpu_free):
            raise InvariantViolation(f"node {self.node_id} freed more than its capacity")

    @property
    def gpu_milli_allocated(self) -> int:
        return self.gpu_count * GPU_MILLI - sum(self.gpu_free)


@dataclass(slots=True)
class Pod:
    """A pod known to the fold: queued (node_id None) or running (node_id set)."""

    spec: PodSpec
    shape: PodShape
    node_id: str | None = None
    gpus: tuple[GpuShare, ...] = ()
    queued: bool = False  # waiting in the pending queue (an evicted pod is briefly neither)

    @property
    def queue_key(self) -> QueueKey:
        return (-self.spec.priority, self.spec.arrival, self.spec.pod_id)

    @property
    def running(self) -> bool:
        return self.node_id is not None


def shape_of(spec: PodSpec) -> PodShape:
    return PodShape(
        spec.num_gpu,
        spec.gpu_milli,
        spec.cpu_milli,
        spec.memory_mib,
        tuple(sorted(set(spec.gpu_models))),
        tuple(sorted(spec.node_selector.items())),
        spec.tolerations,
    )


@dataclass(slots=True)
class ClusterState:
    """One cluster: nodes, pods, the capacity index and the pending queue."""

    name: str
    policy: str = DEFAULT_POLICY
    arrivals: int = 0  # accepted SubmitPods so far: the next PodSpec.arrival
    nodes: dict[str, Node] = field(default_factory=dict)
    pods: dict[str, Pod] = field(default_factory=dict)
    index: CapacityIndex = field(default_factory=CapacityIndex)
    queue: PendingQueue = field(default_factory=PendingQueue)
    model_nodes: dict[str, int] = field(default_factory=dict)  # GPU model -> nodes present
    gpu_milli_capacity: int = 0  # of nodes that are not failed
    gpu_milli_allocated: int = 0
    # Request shapes of the present (queued or running) pods, derived; and the typical
    # pods learned from it at arrival checkpoints (persisted: snapshots carry it).
    shape_counts: dict[TypicalKey, int] = field(default_factory=dict)
    typical: Typical = ()

    def count_shape(self, shape: PodShape, delta: int) -> None:
        """Add (+1) or remove (-1) a present pod's shape from the histogram. O(1)."""
        key = typical_key(shape)
        count = self.shape_counts.get(key, 0) + delta
        if count > 0:
            self.shape_counts[key] = count
        else:
            self.shape_counts.pop(key, None)

    def learn_typical(self) -> None:
        """Refresh the typical pods from the histogram if the arrival count is a checkpoint."""
        if is_checkpoint(self.arrivals):
            typical = derive_typical(self.shape_counts)
            if typical_moved(self.typical, typical):
                self.typical = typical

    def reindex(self, node: Node) -> None:
        """Put a node in the capacity index under its current signature, or take it out."""
        if node.schedulable:
            self.index.update(node.node_id, node.signature())
        else:
            self.index.remove(node.node_id)

    @property
    def unschedulable_nodes(self) -> int:
        return len(self.nodes) - len(self.index)


@dataclass(slots=True)
class PartitionState:
    """Everything the fold knows for one partition of the command log."""

    partition: int = 0
    clusters: dict[str, ClusterState] = field(default_factory=dict)
    sequence: int = 0  # the next event's sequence number
    next_offset: int = 0  # the next command offset to fold
    seen: OrderedDict[str, None] = field(default_factory=OrderedDict)
    seen_window: int = DEFAULT_SEEN_WINDOW

    def cluster(self, name: str) -> ClusterState:
        """The cluster, created on first use (only ``apply`` may call this)."""
        state = self.clusters.get(name)
        if state is None:
            state = self.clusters[name] = ClusterState(name)
        return state

    def remember(self, command_id: str) -> None:
        """Add a command id to the idempotency window (oldest forgotten first).

        Ids that are not valid ids (empty, or longer than 253 characters) were
        rejected and are not kept, so the window's memory stays bounded.
        """
        if command_id in self.seen or not 0 < len(command_id) <= MAX_COMMAND_ID_LENGTH:
            return
        self.seen[command_id] = None
        if len(self.seen) > self.seen_window:
            self.seen.popitem(last=False)
