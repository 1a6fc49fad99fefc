"""Events: what the fold decided (past-tense names), one record per ``schemas/event.avsc`` branch.

``Event`` is the envelope: position (partition, sequence), the causing command
(id and log offset) and ``occurred_at``, the causing command's ``issued_at``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.commands import Taint, Toleration
from schemas.records import Record


@dataclass(slots=True)
class PodSpec(Record):
    """A pod as accepted by the fold; ``arrival`` orders pods FIFO within a priority."""

    pod_id: str
    tenant: str
    priority: int
    num_gpu: int
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    gpu_models: tuple[str, ...]
    node_selector: dict[str, str]
    tolerations: tuple[Toleration, ...]
    submitted_at: int
    arrival: int
    NESTED = {"tolerations": Toleration}

    @property
    def gpu_milli_total(self) -> int:
        """GPU milli the pod holds in all: 1000 per whole GPU, or its share."""
        return self.num_gpu * self.gpu_milli

    def __hash__(self) -> int:  # node_selector is a dict; pods are keyed by id
        return hash(self.pod_id)


@dataclass(slots=True)
class GpuShare(Record):
    index: int
    milli: int


@dataclass(slots=True)
class QueueReason(Record):
    code: str
    nodes: int
    message: str = ""


@dataclass(slots=True)
class NodeAdded(Record):
    node_id: str
    gpu_model: str
    gpu_count: int
    cpu_milli: int
    memory_mib: int
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    NESTED = {"taints": Taint}


@dataclass(slots=True)
class NodeRemoved(Record):
    node_id: str
    forced: bool


@dataclass(slots=True)
class NodeCordoned(Record):
    node_id: str


@dataclass(slots=True)
class NodeUncordoned(Record):
    node_id: str


@dataclass(slots=True)
class NodeDrained(Record):
    node_id: str
    evicted: int


@dataclass(slots=True)
class NodeFailed(Record):
    node_id: str
    reason: str
    evicted: int


@dataclass(slots=True)
class PodQueued(Record):
    pod: PodSpec
    reasons: tuple[QueueReason, ...]
    requeued: bool = False
    NESTED = {"pod": PodSpec, "reasons": QueueReason}


@dataclass(slots=True)
class PodScheduled(Record):
    pod: PodSpec
    node_id: str
    gpus: tuple[GpuShare, ...]
    policy: str
    from_queue: bool = False
    scores: dict[str, float] = field(default_factory=dict)
    NESTED = {"pod": PodSpec, "gpus": GpuShare}


@dataclass(slots=True)
class PodEvicted(Record):
    pod_id: str
    node_id: str
    reason: str


@dataclass(slots=True)
class PodReleased(Record):
    pod_id: str
    node_id: str | None
    reason: str


@dataclass(slots=True)
class PolicyChanged(Record):
    policy: str
    previous: str


@dataclass(slots=True)
class CommandRejected(Record):
    command_id: str
    command_type: str
    code: str
    message: str


EventPayload = (
    NodeAdded
    | NodeRemoved
    | NodeCordoned
    | NodeUncordoned
    | NodeDrained
    | NodeFailed
    | PodQueued
    | PodScheduled
    | PodEvicted
    | PodReleased
    | PolicyChanged
    | CommandRejected
)

PAYLOAD_TYPES: dict[str, type[Record]] = {
    cls.AVRO_NAME: cls
    for cls in (
        NodeAdded,
        NodeRemoved,
        NodeCordoned,
        NodeUncordoned,
        NodeDrained,
        NodeFailed,
        PodQueued,
        PodScheduled,
        PodEvicted,
        PodReleased,
        PolicyChanged,
        CommandRejected,
    )
}


@dataclass(slots=True)
class Event:
    """The event envelope."""

    partition: int
    sequence: int
    cluster: str
    command_id: str
    command_offset: int
    occurred_at: int
    payload: EventPayload

    @property
    def type_name(self) -> str:
        return type(self.payload).__name__

    def to_avro(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "sequence": self.sequence,
            "cluster": self.cluster,
            "command_id": self.command_id,
            "command_offset": self.command_offset,
            "occurred_at": self.occurred_at,
            "payload": (self.payload.AVRO_NAME, self.payload.to_avro()),
        }

    @classmethod
    def from_avro(cls, data: dict[str, Any]) -> Event:
        name, body = data["payload"]
        payload = PAYLOAD_TYPES[name].from_avro(body)
        return cls(
            data["partition"],
            data["sequence"],
            data["cluster"],
            data["command_id"],
            data["command_offset"],
            data["occurred_at"],
            payload,  # type: ignore[arg-type]
        )
