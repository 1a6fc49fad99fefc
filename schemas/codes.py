"""The machine-readable codes of the contract: why a command was refused, why a pod waits.

Three tiers of failure, as in STYLE.md:

- bytes that do not decode -> a dead letter (``schemas.dead_letters.DeadLetter``), never an exception;
- a well-formed command the domain refuses -> ``CommandRejected`` with a code from
  :class:`RejectionCode` (state unchanged); the stateless checks (``schemas.validation``)
  and the fold raise :class:`Rejected` to say so;
- a broken invariant inside the fold's ``apply`` -> ``processor.core.errors.InvariantViolation``:
  a bug; the loop stops without committing so nothing wrong is published.
"""

from __future__ import annotations


class RejectionCode:
    """Machine-readable codes carried by ``CommandRejected.code``."""

    DUPLICATE_COMMAND = "DUPLICATE_COMMAND"
    INVALID_COMMAND = "INVALID_COMMAND"
    INVALID_RESOURCES = "INVALID_RESOURCES"
    UNKNOWN_GPU_MODEL = "UNKNOWN_GPU_MODEL"
    UNKNOWN_NODE = "UNKNOWN_NODE"
    DUPLICATE_NODE = "DUPLICATE_NODE"
    NODE_BUSY = "NODE_BUSY"
    NODE_FAILED = "NODE_FAILED"
    NODE_ALREADY_CORDONED = "NODE_ALREADY_CORDONED"
    NODE_NOT_CORDONED = "NODE_NOT_CORDONED"
    UNKNOWN_POD = "UNKNOWN_POD"
    DUPLICATE_POD = "DUPLICATE_POD"
    UNKNOWN_POLICY = "UNKNOWN_POLICY"

    ALL = (
        DUPLICATE_COMMAND,
        INVALID_COMMAND,
        INVALID_RESOURCES,
        UNKNOWN_GPU_MODEL,
        UNKNOWN_NODE,
        DUPLICATE_NODE,
        NODE_BUSY,
        NODE_FAILED,
        NODE_ALREADY_CORDONED,
        NODE_NOT_CORDONED,
        UNKNOWN_POD,
        DUPLICATE_POD,
        UNKNOWN_POLICY,
    )


class QueueReasonCode:
    """Why a pod could not be placed, counted per node in ``PodQueued.reasons``.

    Each schedulable node is counted once, under the first check it fails, in
    this order: model, selector, taints, GPU, GPU share, CPU, memory.
    """

    NO_NODES = "NO_NODES"
    NODE_UNSCHEDULABLE = "NODE_UNSCHEDULABLE"  # cordoned or failed
    GPU_MODEL_MISMATCH = "GPU_MODEL_MISMATCH"
    NODE_SELECTOR_MISMATCH = "NODE_SELECTOR_MISMATCH"
    UNTOLERATED_TAINT = "UNTOLERATED_TAINT"
    INSUFFICIENT_GPU = "INSUFFICIENT_GPU"
    INSUFFICIENT_GPU_SHARE = "INSUFFICIENT_GPU_SHARE"
    INSUFFICIENT_CPU = "INSUFFICIENT_CPU"
    INSUFFICIENT_MEMORY = "INSUFFICIENT_MEMORY"


class Rejected(Exception):
    """Raised inside ``decide`` handlers to refuse a command; becomes ``CommandRejected``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
