"""Commands: what services ask the scheduler to do (imperative names).

Each payload class maps onto a record of ``schemas/command.avsc``; ``Command``
is the envelope. The fold reads time only from ``Command.issued_at``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.records import Record

GPU_MILLI = 1000
"""Milli per GPU: a whole GPU is 1000, a share is 1-999."""


@dataclass(slots=True, frozen=True, order=True)
class Taint(Record):
    """A node taint; effects NoSchedule and NoExecute keep untolerating pods off the node.

    Ordered because node signatures (which hold taints) are sorted to iterate the capacity index.
    """

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(slots=True, frozen=True)
class Toleration(Record):
    """A pod toleration with Kubernetes semantics (Equal/Exists; empty effect = any)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return self.key == "" or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(slots=True)
class AddNode(Record):
    node_id: str
    cpu_milli: int
    memory_mib: int
    gpu_model: str = ""
    gpu_count: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    NESTED = {"taints": Taint}


@dataclass(slots=True)
class RemoveNode(Record):
    node_id: str
    force: bool = False


@dataclass(slots=True)
class CordonNode(Record):
    node_id: str


@dataclass(slots=True)
class UncordonNode(Record):
    node_id: str


@dataclass(slots=True)
class DrainNode(Record):
    node_id: str


@dataclass(slots=True)
class MarkNodeFailed(Record):
    node_id: str
    reason: str = ""


@dataclass(slots=True)
class SubmitPod(Record):
    """A pod asks for num_gpu whole GPUs (gpu_milli = 1000), one GPU share
    (num_gpu = 1, 0 < gpu_milli < 1000) or no GPU (both 0)."""

    pod_id: str
    tenant: str = "default"
    priority: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: tuple[str, ...] = ()
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    NESTED = {"tolerations": Toleration}


@dataclass(slots=True)
class Release(Record):
    """The pod finished or was cancelled (queued pods can be released too)."""

    pod_id: str
    reason: str = "completed"


@dataclass(slots=True)
class SetPolicy(Record):
    policy: str


CommandPayload = (
    AddNode | RemoveNode | CordonNode | UncordonNode | DrainNode | MarkNodeFailed | SubmitPod | Release | SetPolicy
)

PAYLOAD_TYPES: dict[str, type[Record]] = {
    cls.AVRO_NAME: cls
    for cls in (AddNode, RemoveNode, CordonNode, UncordonNode, DrainNode, MarkNodeFailed, SubmitPod, Release, SetPolicy)
}


@dataclass(slots=True)
class Command:
    """The command envelope: idempotency key, partition key, event time, sender, payload."""

    command_id: str
    cluster: str
    issued_at: int
    payload: CommandPayload
    source: str = ""

    @property
    def type_name(self) -> str:
        return type(self.payload).__name__

    def to_avro(self) -> dict[str, Any]:
        return {
            "command_id": self.command_id,
            "cluster": self.cluster,
            "issued_at": self.issued_at,
            "source": self.source,
            "payload": (self.payload.AVRO_NAME, self.payload.to_avro()),
        }

    @classmethod
    def from_avro(cls, data: dict[str, Any]) -> Command:
        name, body = data["payload"]
        payload = PAYLOAD_TYPES[name].from_avro(body)
        return cls(data["command_id"], data["cluster"], data["issued_at"], payload, data["source"])  # type: ignore[arg-type]
