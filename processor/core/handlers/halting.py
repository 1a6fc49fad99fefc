"""The last-resort fence, and the clock's guard: a cluster whose fold raised is halted, not the partition.

**Halting.** If, despite the worklist's bounds, a unit of work raises (a bug), the fold drops the
events that unit emitted, emits ``ClusterHalted {cluster, command_id, error}`` and goes on with the
partition's other clusters; the halted cluster's later commands are refused with ``CLUSTER_HALTED``
(they stay in the log) until an operator, after an upgrade, sends ``ResumeCluster``: the runtime
rebuilds the cluster by re-folding the command log up to the halting command
(``processor.runtime.loop.rebuild``) and the fold takes it back with ``ClusterResumed``. Errors that stop
the processor instead: ``InvariantViolation`` (nothing wrong may be published) and errors that depend
on the machine (``MemoryError``, ``RecursionError``), which a replay elsewhere would not meet.

**The clock's guard.** A command dated more than its cluster's ``max_clock_jump_ms`` ahead of the
cluster's clock is refused with ``CLOCK_JUMP`` and moves nothing, except the cluster's first command,
a ``Tick`` with ``force``, and a ``ResumeCluster`` (time passed while the cluster was halted). A
partition-wide ``Tick`` is checked against the latest clock of the partition's clusters.
"""

from __future__ import annotations

from dataclasses import dataclass

from processor.core.decision import Decision
from processor.core.state import ClusterState, PartitionState
from schemas.codes import Rejected, RejectionCode
from schemas.commands import DEFAULT_MAX_CLOCK_JUMP_MS, CommandPayload, ResumeCluster, Tick
from schemas.events import ClusterHalted, ClusterResumed, CommandRejected
from schemas.limits import MAX_MESSAGE_LENGTH, clip
from schemas.validation import check_resume_cluster

MAX_ERROR_WORDS = 500
"""Characters of the error kept in ``ClusterHalted.error`` (its type and message; never a traceback, whose
file paths differ between machines)."""


@dataclass(slots=True)
class ResumedCluster:
    """A halted cluster as the command log rebuilds it: its state just before the halting command, and the
    offset the re-fold started from (a snapshot's position, or 0)."""

    state: ClusterState
    refolded_from: int


def halt(decision: Decision, name: str, mark: int, sequence: int, error: Exception) -> None:
    """Drop the events of the unit that raised (from ``mark``; the sequence back to ``sequence``) and the
    work it left, then halt the cluster: ``ClusterHalted``, which empties it (``processor.core.appliers``)."""
    del decision.events[mark:]
    decision.state.sequence = sequence
    decision.forget(name)
    words = clip(f"{type(error).__name__}: {error}", MAX_ERROR_WORDS)
    message = (
        f"folding command {decision.command.command_id!r} raised {words}; cluster {name!r} is halted: its "
        "commands are refused (CLUSTER_HALTED) until a ResumeCluster after an upgrade, and the partition's "
        "other clusters go on"
    )
    decision.emit(ClusterHalted(name, decision.command.command_id, words, clip(message, MAX_MESSAGE_LENGTH)), name)


def refuse(decision: Decision, cluster: ClusterState) -> None:
    """A command for a halted cluster: ``CLUSTER_HALTED`` at the cluster's clock, which it does not move."""
    halted = cluster.halted
    assert halted is not None
    decision.now = cluster.clock
    command = decision.command
    message = (
        f"cluster {cluster.name!r} is halted since command {halted.command_id!r} (offset {halted.offset}) raised "
        f"{halted.error}; this command stays in the log but is not folded: send ResumeCluster after an upgrade"
    )
    decision.emit(
        CommandRejected(
            command.command_id, command.type_name, RejectionCode.CLUSTER_HALTED, clip(message, MAX_MESSAGE_LENGTH)
        )
    )


def resume(decision: Decision, cluster: ClusterState, command: ResumeCluster, resumed: ResumedCluster | None) -> None:
    """Take the rebuilt cluster back (``ClusterResumed``), then fire what came due while it was halted."""
    halted = cluster.halted
    assert halted is not None
    try:
        check_resume_cluster(command)
        if resumed is None:
            raise Rejected(
                RejectionCode.CLUSTER_HALTED,
                f"cluster {cluster.name!r} can only be resumed by a processor that reads its command log (the "
                "rebuild re-folds it up to the halting command): fold this ResumeCluster with gpufold run or "
                "gpufold processor run",
            )
        if resumed.state.halted is not None:
            raise Rejected(
                RejectionCode.CLUSTER_HALTED,
                f"re-folding cluster {cluster.name!r} up to offset {halted.offset} halted it again, at command "
                f"{resumed.state.halted.command_id!r}: {resumed.state.halted.error}; upgrade and resume again",
            )
    except Rejected as rejection:
        refuse_with(decision, cluster, rejection)
        return
    state = decision.state
    rebuilt = resumed.state
    rebuilt.clock = max(rebuilt.clock, cluster.clock)
    state.clusters[cluster.name] = rebuilt  # the one change that is not an event's: it comes from the log
    issued = decision.command.issued_at
    decision.now = issued if issued > rebuilt.clock else rebuilt.clock
    message = (
        f"cluster {cluster.name!r} folds again from its state before command {halted.command_id!r} (offset "
        f"{halted.offset}), rebuilt by re-folding the command log from offset {resumed.refolded_from}; the "
        "commands refused while it was halted were not folded: send them again"
    )
    decision.emit(
        ClusterResumed(
            cluster.name, halted.command_id, halted.offset, resumed.refolded_from, clip(message, MAX_MESSAGE_LENGTH)
        )
    )


def not_halted(decision: Decision, command: ResumeCluster) -> None:
    """``ResumeCluster`` of a cluster that folds normally: ``NOT_HALTED``."""
    check_resume_cluster(command)
    raise Rejected(
        RejectionCode.NOT_HALTED,
        f"cluster {decision.command.cluster!r} is not halted: there is nothing to resume",
    )


def refuse_with(decision: Decision, cluster: ClusterState, rejection: Rejected) -> None:
    decision.now = cluster.clock
    command = decision.command
    decision.emit(
        CommandRejected(
            command.command_id, command.type_name, rejection.code, clip(rejection.message, MAX_MESSAGE_LENGTH)
        )
    )


def jumps(decision: Decision, cluster: ClusterState | None, payload: CommandPayload, state: PartitionState) -> bool:
    """Refuse (``CLOCK_JUMP``, at the clock it would have moved) a command dated too far ahead; whether it was."""
    tick = payload if type(payload) is Tick else None
    if tick is not None and tick.force:
        return False
    issued = decision.command.issued_at
    if tick is not None and tick.partition:
        clock = max((c.clock for c in state.clusters.values()), default=0)
        limit = cluster.max_clock_jump_ms if cluster is not None else DEFAULT_MAX_CLOCK_JUMP_MS
        what = f"partition {state.partition}'s latest clock"
    else:
        if cluster is None or not cluster.clock:
            return False  # the cluster's first command sets its clock
        clock, limit = cluster.clock, cluster.max_clock_jump_ms
        what = f"cluster {cluster.name!r}'s clock"
    if not limit or not clock or issued - clock <= limit:
        return False
    decision.now = cluster.clock if cluster is not None else state.clock
    message = (
        f"issued_at {issued} is {(issued - clock) / 1000:g} s ahead of {what} ({clock}); more than "
        f"max_clock_jump_ms {limit} is refused, so that one mis-dated command cannot stop every deadline: fix the "
        "sender's clock, or move time on purpose with Tick {force: true} (or SetPolicy max_clock_jump_ms 0)"
    )
    command = decision.command
    decision.emit(
        CommandRejected(
            command.command_id, command.type_name, RejectionCode.CLOCK_JUMP, clip(message, MAX_MESSAGE_LENGTH)
        )
    )
    return True
