"""The gpufold processor: the deterministic allocation fold and the loop that feeds it.

The pure core is ``decide``/``apply`` (``processor.fold``) over a
``PartitionState`` (``processor.state``), with placement policies in
``processor.policies``. ``processor.loop`` runs it over any command log.
"""

from processor.commands import (
    AddNode,
    Command,
    CordonNode,
    DrainNode,
    MarkNodeFailed,
    Release,
    RemoveNode,
    SetPolicy,
    SubmitPod,
    Taint,
    Toleration,
    UncordonNode,
)
from processor.errors import InvariantViolation, QueueReasonCode, RejectionCode
from processor.events import Event
from processor.fold import apply, decide
from processor.snapshot import from_snapshot, state_hash, to_snapshot
from processor.state import ClusterState, PartitionState

__all__ = [
    "AddNode",
    "ClusterState",
    "Command",
    "CordonNode",
    "DrainNode",
    "Event",
    "InvariantViolation",
    "MarkNodeFailed",
    "PartitionState",
    "QueueReasonCode",
    "RejectionCode",
    "Release",
    "RemoveNode",
    "SetPolicy",
    "SubmitPod",
    "Taint",
    "Toleration",
    "UncordonNode",
    "apply",
    "decide",
    "from_snapshot",
    "state_hash",
    "to_snapshot",
]
