"""The gpufold processor, in two rooms.

- ``processor.core``: the pure fold. ``decide``/``apply`` (``processor.core.fold``) over a
  ``PartitionState`` (``processor.core.state``), its indexes, queue, placement policies,
  fragmentation and snapshots. It imports only the contract (``schemas``) and pure
  libraries: no I/O, clock, randomness, environment, Kafka or SQL (``tests/unit/test_import_rules.py``).
- ``processor.runtime``: what feeds the core. The log protocol and the loop
  (``processor.runtime.loop``), the Kafka adapter and runner, metrics.

The records (commands, events) are the contract's (``schemas``); they are re-exported here for convenience.
"""

import schemas  # noqa: F401  first: its import shim decides compiled or pure modules (schemas.pure_python)
from processor.core.errors import InvariantViolation
from processor.core.fold import apply, decide
from processor.core.snapshot import from_snapshot, state_hash, to_snapshot
from processor.core.state import ClusterState, PartitionState
from schemas.codes import QueueReasonCode, RejectionCode
from schemas.commands import (
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
from schemas.events import Event

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
