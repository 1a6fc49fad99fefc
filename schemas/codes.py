"""The machine-readable codes of the contract: why a command was refused, why a pod waits.

Three tiers of failure, as in STYLE.md:

- bytes that do not decode -> a dead letter (``schemas.dead_letters.DeadLetter``), never an exception;
  a command the partition must not fold (on the wrong partition, or keyed other than its cluster) -> a dead
  letter with a code from :class:`DeadLetterCode`, never folded;
- a well-formed command the domain refuses -> ``CommandRejected`` with a code from
  :class:`RejectionCode` (state unchanged); the stateless checks (``schemas.validation``)
  and the fold raise :class:`Rejected` to say so;
- a broken invariant inside the fold's ``apply`` -> the fold's own ``InvariantViolation``:
  a bug; the loop stops without committing so nothing wrong is published.
"""

from __future__ import annotations

from typing import Final

from mypy_extensions import mypyc_attr


class RejectionCode:
    """Machine-readable codes carried by ``CommandRejected.code``."""

    DUPLICATE_COMMAND: Final = "DUPLICATE_COMMAND"
    INVALID_COMMAND: Final = "INVALID_COMMAND"
    INVALID_RESOURCES: Final = "INVALID_RESOURCES"
    UNKNOWN_GPU_MODEL: Final = "UNKNOWN_GPU_MODEL"
    UNKNOWN_NODE: Final = "UNKNOWN_NODE"
    DUPLICATE_NODE: Final = "DUPLICATE_NODE"
    NODE_BUSY: Final = "NODE_BUSY"
    NODE_FAILED: Final = "NODE_FAILED"
    NODE_ALREADY_CORDONED: Final = "NODE_ALREADY_CORDONED"
    NODE_NOT_CORDONED: Final = "NODE_NOT_CORDONED"
    UNKNOWN_POD: Final = "UNKNOWN_POD"
    DUPLICATE_POD: Final = "DUPLICATE_POD"
    UNKNOWN_POLICY: Final = "UNKNOWN_POLICY"
    DUPLICATE_GANG: Final = "DUPLICATE_GANG"
    UNKNOWN_GANG: Final = "UNKNOWN_GANG"
    UNKNOWN_LABEL_KEY: Final = "UNKNOWN_LABEL_KEY"
    NEVER_FITS: Final = "NEVER_FITS"
    DEPENDENCY_CYCLE: Final = "DEPENDENCY_CYCLE"
    UNKNOWN_QUOTA: Final = "UNKNOWN_QUOTA"  # RemoveQuota of a tenant that has no quota of its own
    NOT_WAITING: Final = "NOT_WAITING"  # a Defragment target that is not waiting in the queue
    TIME_OUT_OF_RANGE: Final = "TIME_OUT_OF_RANGE"  # issued_at past schemas.limits.MAX_ISSUED_AT
    TOO_LARGE: Final = "TOO_LARGE"  # a string or a collection over its bound in schemas.limits
    CLUSTER_HALTED: Final = "CLUSTER_HALTED"  # the cluster is halted (ClusterHalted) until ResumeCluster
    CLOCK_JUMP: Final = "CLOCK_JUMP"  # dated further ahead of the cluster's clock than max_clock_jump_ms
    NOT_HALTED: Final = "NOT_HALTED"  # ResumeCluster of a cluster that is not halted
    NODE_NOT_FAILED: Final = "NODE_NOT_FAILED"  # RecoverNode of a node that has not failed
    UNKNOWN_BUDGET: Final = "UNKNOWN_BUDGET"  # RemoveDisruptionBudget of a budget that is not set
    NODE_DRAINING: Final = "NODE_DRAINING"  # DrainNode of a node whose drain waits already, changing nothing
    COHORT_CYCLE: Final = "COHORT_CYCLE"  # SetCohort whose parent is the cohort itself or one of its descendants
    COHORT_TOO_DEEP: Final = "COHORT_TOO_DEEP"  # SetCohort that makes a path of the tree longer than 8 cohorts
    UNKNOWN_COHORT: Final = "UNKNOWN_COHORT"  # RemoveCohort of a cohort that SetCohort did not declare
    COHORT_IN_USE: Final = "COHORT_IN_USE"  # RemoveCohort of a cohort other cohorts name as their parent

    ALL: Final = (
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
        DUPLICATE_GANG,
        UNKNOWN_GANG,
        UNKNOWN_LABEL_KEY,
        NEVER_FITS,
        DEPENDENCY_CYCLE,
        UNKNOWN_QUOTA,
        NOT_WAITING,
        TIME_OUT_OF_RANGE,
        TOO_LARGE,
        CLUSTER_HALTED,
        CLOCK_JUMP,
        NOT_HALTED,
        NODE_NOT_FAILED,
        UNKNOWN_BUDGET,
        NODE_DRAINING,
        COHORT_CYCLE,
        COHORT_TOO_DEEP,
        UNKNOWN_COHORT,
        COHORT_IN_USE,
    )


class QueueReasonCode:
    """Why a pod could not be placed, counted per node in ``PodQueued.reasons``.

    Each schedulable node is counted once, under the first check it fails, in
    this order: model, selector, taints, GPU, GPU share, GPU memory, CPU, memory, reservation.
    Gang-level and waiting codes carry no node count (``nodes`` 0) but a message.
    """

    NO_NODES: Final = "NO_NODES"
    NODE_UNSCHEDULABLE: Final = "NODE_UNSCHEDULABLE"  # cordoned or failed
    GPU_MODEL_MISMATCH: Final = "GPU_MODEL_MISMATCH"
    NODE_SELECTOR_MISMATCH: Final = "NODE_SELECTOR_MISMATCH"
    UNTOLERATED_TAINT: Final = "UNTOLERATED_TAINT"
    INSUFFICIENT_GPU: Final = "INSUFFICIENT_GPU"
    INSUFFICIENT_GPU_SHARE: Final = "INSUFFICIENT_GPU_SHARE"
    INSUFFICIENT_CPU: Final = "INSUFFICIENT_CPU"
    INSUFFICIENT_MEMORY: Final = "INSUFFICIENT_MEMORY"
    INSUFFICIENT_GPU_MEMORY: Final = "INSUFFICIENT_GPU_MEMORY"  # no GPU with the pod's GPU share has its memory free
    NODE_RESERVED: Final = "NODE_RESERVED"  # would fit, but held for the head of the queue (checked last)
    WAITING_FOR_DEPENDENCY: Final = "WAITING_FOR_DEPENDENCY"  # not in the placement queue until its dependencies end
    WAITING_FOR_EARLIER_JOB: Final = "WAITING_FOR_EARLIER_JOB"  # strict-fifo: a job ahead of it has not started
    TOPOLOGY_DOMAIN_TOO_SMALL: Final = "TOPOLOGY_DOMAIN_TOO_SMALL"  # no domain has the free capacity the gang needs
    GANG_DOES_NOT_FIT: Final = "GANG_DOES_NOT_FIT"  # domains have the capacity in sum, but not the members' shapes
    QUOTA_EXCEEDED: Final = (
        "QUOTA_EXCEEDED"  # the tenant's quota (and what it may borrow) has no room: usage and limit said
    )
    WAITING_FOR_RETRY: Final = "WAITING_FOR_RETRY"  # it failed; its retry is due at a set event time (backoff)
    WAITING_FOR_PREEMPTION: Final = (
        "WAITING_FOR_PREEMPTION"  # it would fit once lower-priority pods end; it does not preempt
    )
    GANG_MEMBER_WAITING: Final = (
        "GANG_MEMBER_WAITING"  # a member beyond min_members of a running gang: it starts when it fits (v3)
    )


class DeadLetterCode:
    """Machine-readable codes carried by ``DeadLetter.code``: why a command that decoded was not folded."""

    WRONG_PARTITION: Final = "WRONG_PARTITION"
    """Its partition is not murmur2(cluster) mod the commands topic's partition count, or its record key is not
    its cluster: folding it would make a second, divergent state of that cluster."""

    ALL: Final = (WRONG_PARTITION,)


@mypyc_attr(native_class=False)  # compiled with mypyc, which cannot subclass Exception natively
class Rejected(Exception):
    """Raised inside ``decide`` handlers to refuse a command; becomes ``CommandRejected``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
