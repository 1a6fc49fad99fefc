"""The fold: ``decide`` turns a command into events, ``apply`` folds an event into state.

Both are pure functions of their inputs: no clock, no randomness, no environment, no I/O. Time is
event time: the partition's clock is the largest ``issued_at`` folded so far (a late command is
folded at the clock), and the deadlines it reaches (time limits, gang timeouts, reservations) fire
first, in order, each at its own time (:mod:`processor.core.handlers.clock`). Ties break on stable
keys (node id, queue key); nothing iterates an unordered set.

``decide`` applies each event as it emits it (:class:`processor.core.decision.Decision`), so that
later decisions within the same command (re-placing evicted pods, retrying the queue after a
release) see the earlier ones. State still changes only through ``apply``
(:mod:`processor.core.appliers`), and replaying the events alone rebuilds the same state. A handler
validates everything before its first event, so a refused command emits one ``CommandRejected``
(after the events of any timers that came due) and changes nothing but the position and the clock.

The rooms: one handler module per command family (:mod:`processor.core.handlers`). What a handler
sets off (the evicted back to placement, the queue retried, dependants woken, reservations kept) is
follow-up work on the decision's worklist, never a nested call, so every command ends and the
Python stack stays flat (:mod:`processor.core.decision` says why it ends).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from processor.core import decision as worklist
from processor.core.appliers import apply
from processor.core.decision import Decision, Task
from processor.core.errors import InvariantViolation
from processor.core.handlers import (
    clock,
    defragment,
    disruptions,
    gangs,
    halting,
    nodes,
    pods,
    queue,
    rescheduling,
    tenancy,
)
from processor.core.handlers.halting import ResumedCluster
from processor.core.handlers.reservations import reservation_upkeep
from processor.core.state import UNINDEXED_AT_MOST, ClusterState, PartitionState, lookup
from processor.core.timers import PREEMPT_CHECK, pop_due_in_partition
from schemas.codes import Rejected, RejectionCode
from schemas.commands import (
    AddNode,
    Command,
    CordonNode,
    Defragment,
    DrainNode,
    MarkNodeFailed,
    RecoverNode,
    Release,
    ReleaseGang,
    RemoveCohort,
    RemoveDisruptionBudget,
    RemoveNode,
    RemoveQuota,
    ResumeCluster,
    SetCohort,
    SetDisruptionBudget,
    SetPolicy,
    SetQuota,
    SubmitGang,
    SubmitPod,
    Tick,
    UncordonNode,
    UpdateNode,
)
from schemas.events import CommandRejected, Event
from schemas.limits import MAX_MESSAGE_LENGTH, clip, stand_in
from schemas.validation import check_envelope

__all__ = ["HANDLERS", "apply", "decide"]

HANDLERS: dict[type, Callable[[Decision, Any], Task | None]] = {
    AddNode: nodes.add_node,
    RemoveNode: nodes.remove_node,
    CordonNode: nodes.cordon_node,
    UncordonNode: nodes.uncordon_node,
    DrainNode: nodes.drain_node,
    MarkNodeFailed: nodes.mark_node_failed,
    SubmitPod: pods.submit_pod,
    Release: pods.release,
    SetPolicy: tenancy.set_policy,
    SubmitGang: gangs.submit_gang,
    ReleaseGang: gangs.release_gang,
    Tick: clock.tick,
    SetQuota: tenancy.set_quota,
    RemoveQuota: tenancy.remove_quota,
    SetCohort: tenancy.set_cohort,
    RemoveCohort: tenancy.remove_cohort,
    Defragment: defragment.defragment,
    ResumeCluster: halting.not_halted,  # a halted cluster's ResumeCluster is taken before the handlers
    RecoverNode: nodes.recover_node,
    UpdateNode: nodes.update_node,
    SetDisruptionBudget: disruptions.set_disruption_budget,
    RemoveDisruptionBudget: disruptions.remove_disruption_budget,
}
"""The handler of each command type: it validates, then emits (a generator when it must let the work it
left run before it goes on)."""

worklist.TASKS[:] = [
    queue.retry_queue,  # RETRY_QUEUE
    rescheduling.after_eviction,  # AFTER_EVICTION
    rescheduling.after_preemption,  # AFTER_PREEMPTION
    rescheduling.wake_dependants,  # WAKE_DEPENDANTS
    reservation_upkeep,  # RESERVATION_UPKEEP
]


def decide(
    state: PartitionState, command: Command, offset: int | None = None, resumed: ResumedCluster | None = None
) -> list[Event]:
    """Decide and apply the events of one command (at least one, always).

    ``offset`` is the command's position in the log (default: the state's next offset). ``resumed``: for a
    ``ResumeCluster``, the cluster as the command log rebuilds it (``processor.runtime.loop.rebuild``); the fold
    cannot read the log itself.
    """
    decision = Decision(state, command, state.next_offset if offset is None else offset)
    _decide(decision, command, resumed)
    _file_waiting(decision)
    return decision.events


def _file_waiting(decision: Decision) -> None:
    """Each cluster the command changed leaves at most ``UNINDEXED_AT_MOST`` nodes waiting for the capacity index
    (``ClusterState.file_waiting``): those it emitted events for (a rejection's too; the command's own cluster
    whenever it changed a node, on trial or not). O(clusters touched + nodes filed)."""
    clusters = decision.state.clusters
    for name in decision.touched:  # any order: what is filed does not depend on it
        cluster = lookup(clusters, name)
        if cluster is not None and len(cluster.unindexed) > UNINDEXED_AT_MOST:
            cluster.file_waiting()


def _decide(decision: Decision, command: Command, resumed: ResumedCluster | None) -> None:
    state = decision.state
    try:
        check_envelope(command)
    except Rejected as rejection:  # its time cannot be trusted: folded at the clock, which it does not move
        # A rejection stays small whatever it refuses: an id over its bound is carried as a short stand-in
        # and the message is clipped, so the event always fits a Kafka record (schemas.limits).
        decision.command = _bounded_envelope(command)
        message = clip(rejection.message, MAX_MESSAGE_LENGTH)
        decision.emit(CommandRejected(decision.command.command_id, command.type_name, rejection.code, message))
        return
    payload = command.payload
    cluster = lookup(state.clusters, command.cluster)
    if cluster is not None and cluster.halted is not None:
        if type(payload) is ResumeCluster:
            halting.resume(decision, cluster, payload, resumed)
            _finish(decision)
        else:
            halting.refuse(decision, cluster)
        return
    if decision.legacy_time:
        clock_now = command.issued_at if command.issued_at > state.clock else state.clock
        duplicate = command.command_id in state.seen  # before timers: their events carry this command's id
        _fire_partition(decision, clock_now)
        # Contract v1 stamped events with their command's own issued_at, late or not (``V1Command``).
        decision.now = command.issued_at if command.contract == "v1" else clock_now
    else:
        base = cluster.clock if cluster is not None else 0
        if halting.jumps(decision, cluster, payload, state):
            return
        clock_now = command.issued_at if command.issued_at > base else base
        duplicate = command.command_id in state.seen
        if type(payload) is Tick and payload.partition:
            for name in sorted(state.clusters):
                _fire_cluster(decision, state.clusters[name], clock_now)
        elif cluster is not None:
            _fire_cluster(decision, cluster, clock_now)
        decision.now = clock_now
        cluster = lookup(state.clusters, command.cluster)
        if cluster is not None and cluster.halted is not None:
            _finish(decision)  # one of its deadlines halted it: that is this command's outcome
            return
    mark, sequence = len(decision.events), state.sequence
    try:
        if duplicate:
            raise Rejected(
                RejectionCode.DUPLICATE_COMMAND,
                f"command {command.command_id!r} was already processed; a repeated command id changes nothing",
            )
        handler = HANDLERS.get(type(payload))
        if handler is None:
            raise Rejected(RejectionCode.INVALID_COMMAND, f"unknown command type {type(payload).__name__}")
        decision.run(handler(decision, payload))
    except Rejected as rejection:
        if len(decision.events) > mark or decision.pending():
            raise InvariantViolation(f"command {command.command_id!r} rejected after emitting events") from rejection
        message = clip(rejection.message, MAX_MESSAGE_LENGTH)  # e.g. a list of every GPU model a cluster knows
        decision.emit(CommandRejected(command.command_id, command.type_name, rejection.code, message))
    except FATAL:
        raise
    except Exception as error:
        halting.halt(decision, command.cluster, mark, sequence, error)
    _finish(decision)


FATAL = (InvariantViolation, MemoryError, RecursionError)
"""Errors that stop the processor instead of halting one cluster: a broken invariant in ``apply`` (nothing
wrong may be published), and errors whose occurrence depends on the machine (memory, stack), which a
replay elsewhere would not meet at the same command."""


def _guarded(decision: Decision, cluster: ClusterState, unit: Callable[[], Task | None]) -> None:
    """Run one unit of work on a cluster (and all it leaves); if it raises, halt that cluster."""
    mark, sequence = len(decision.events), decision.state.sequence
    try:
        decision.run(unit())
    except FATAL:
        raise
    except Exception as error:
        halting.halt(decision, cluster.name, mark, sequence, error)


def _fire_cluster(decision: Decision, cluster: ClusterState, until: int) -> None:
    """The cluster's deadlines up to ``until``, in order, each a unit with what it sets off.

    Measure: the cluster's due timers; a timer set while these fire is due only if its deadline is at
    most ``until`` (a requeued gang's timeout, at most once per eviction of the gang)."""
    decision.now = cluster.clock  # each deadline moves it on: events are stamped at their deadlines
    while cluster.halted is None:
        timer = cluster.timers.pop_due(until)
        if timer is None:
            return
        _guarded(decision, cluster, partial(clock.fire, decision, cluster, timer))
        cluster = lookup(decision.state.clusters, cluster.name) or cluster
        if (cluster.draining or cluster.blocked) and cluster.halted is None:  # a budget may have freed: go on
            _guarded(decision, cluster, partial(disruptions.drain_upkeep, decision, cluster))


def _fire_partition(decision: Decision, until: int) -> None:
    """Contract v1 and v2: every cluster's deadlines up to the partition's clock, in one order. Measure: the
    due timers of the partition."""
    clusters = decision.state.clusters
    while True:
        due = pop_due_in_partition((c for c in clusters.values() if c.halted is None), until)
        if due is None:
            return
        cluster, timer = due
        _guarded(decision, cluster, partial(clock.fire, decision, cluster, timer))


def _finish(decision: Decision) -> None:
    """After the command: queued work of tenants whose quota grew, reservations of the clusters it touched,
    then deadlines that came due meanwhile, each cluster's a unit of its own. Measure: the clusters left."""
    clusters = decision.state.clusters
    if decision.freed:
        for name in sorted(decision.freed):
            cluster = lookup(clusters, name)
            if cluster is not None and cluster.halted is None:
                _guarded(decision, cluster, partial(queue.retry_queue, decision, cluster, (), None))
        decision.freed.clear()
    touched = decision.touched
    names = list(touched) if len(touched) == 1 else sorted(touched)
    for name in names:  # drains that wait go on (a budget may have freed); nothing to do without one
        cluster = lookup(clusters, name)
        if cluster is not None and (cluster.draining or cluster.blocked) and cluster.halted is None:
            _guarded(decision, cluster, partial(disruptions.drain_upkeep, decision, cluster))
    for name in names:
        cluster = lookup(clusters, name)
        # Nothing to keep without a queue or a reservation: the common case, answered without a call.
        if cluster is not None and (cluster.queue.size or cluster.gang_queue or cluster.reservation is not None):
            _guarded(decision, cluster, partial(reservation_upkeep, decision, cluster))
    if decision.legacy_time:
        _fire_partition(decision, decision.now)
        return
    for name in names:
        cluster = lookup(clusters, name)
        if cluster is not None and cluster.timers.due(cluster.clock):
            _fire_cluster(decision, cluster, cluster.clock)
    if decision.evicted:
        for name in sorted(decision.evicted):
            cluster = lookup(clusters, name)
            if cluster is not None and cluster.halted is None and (cluster.queue.size or cluster.gang_queue):
                _check_preemption_next(cluster, decision.evicted[name])


def _check_preemption_next(cluster: ClusterState, evicted: dict[str, None]) -> None:
    """Pods evicted in this command that run again (placed elsewhere) could not be victims of the queue in it (one
    command evicts a pod once): their nodes are retried, preemption included, at the cluster's next command, so a
    higher-priority pod that waits behind one does not wait for capacity to change. O(evicted)."""
    for pod_id in evicted:
        pod = lookup(cluster.pods, pod_id)
        if pod is not None and pod.node_id is not None:
            cluster.timers.push(cluster.clock, PREEMPT_CHECK, pod.node_id)


def _bounded_envelope(command: Command) -> Command:
    """The command itself, or a copy whose command_id and cluster are short, encodable stand-ins."""
    command_id, cluster = stand_in(command.command_id), stand_in(command.cluster)
    if command_id == command.command_id and cluster == command.cluster:
        return command
    return replace(command, command_id=command_id, cluster=cluster, source="")
