"""Gangs: ``SubmitGang`` and ``ReleaseGang``, placing a gang (quota, free capacity, reclaim, preemption),
and a running gang that lost members.

Where the members go within a topology domain: :mod:`processor.core.gangs`. As for pods, placing is
synchronous and what it sets off is left as follow-up work.
"""

from __future__ import annotations

from collections.abc import Callable

from processor.core import gang_preemption, gangs, preemption_plans, quotas, reclaim
from processor.core.decision import AFTER_PREEMPTION, RETRY_QUEUE, WAKE_DEPENDANTS, Decision, Task, cluster_policy
from processor.core.errors import InvariantViolation
from processor.core.handlers.checks import check_models, check_new_job_ids, check_no_cycle
from processor.core.handlers.dependants import hold_new_job
from processor.core.handlers.evictions import victim_events
from processor.core.handlers.reservations import holder_started
from processor.core.reasons import blocked_by_earlier
from processor.core.state import COMPLETED, EVICTED_MEMBER, GANG_RUNNING, ClusterState, Gang, Pod
from schemas.codes import QueueReasonCode, Rejected, RejectionCode
from schemas.commands import PREEMPT_LOWER, PREEMPT_NEVER, Quota, ReleaseGang, SubmitGang
from schemas.events import (
    GangQueued,
    GangReleased,
    GangScheduled,
    GangSpec,
    MemberPlacement,
    PodEvicted,
    PodReleased,
    PodRetryScheduled,
    PodScheduled,
    QueueReason,
)
from schemas.validation import check_release_gang, check_submit_gang

GANG_FAILED = "gang:failed"
"""The ``PodEvicted`` reason of the members a failed member takes with its gang when the gang retries
(not a voluntary disruption: no budget counts it)."""

# ---------------------------------------------------------------- commands


def submit_gang(decision: Decision, command: SubmitGang) -> None:
    check_submit_gang(command)
    cluster = decision.cluster
    name = decision.command.cluster
    ids = (command.gang_id, *(member.pod_id for member in command.members))
    check_new_job_ids(cluster, name, ids[:1], "gang")
    check_new_job_ids(cluster, name, ids[1:], "pod")
    for member in command.members:
        check_models(cluster, name, tuple(member.gpu_models))
    for key in (command.topology_required, command.topology_preferred):
        if key is not None and key not in cluster.label_keys:
            raise Rejected(
                RejectionCode.UNKNOWN_LABEL_KEY,
                f"no node in cluster {name!r} has the label key {key!r}; known: {sorted(cluster.label_keys)[:20]}",
            )
    spec = gangs.gang_spec(
        command, decision.now, cluster.arrivals, command.preemption if decision.may_preempt else PREEMPT_NEVER
    )
    never = gangs.never_fits(cluster, spec)
    if never is not None:
        raise Rejected(RejectionCode.NEVER_FITS, never)
    check_no_cycle(cluster, ids, spec.depends_on)
    if hold_new_job(decision, cluster, spec):
        return
    place_gang(decision, cluster, spec, from_queue=False, requeued=False, new=True)


def release_gang(decision: Decision, command: ReleaseGang) -> Task:
    check_release_gang(command)
    cluster = decision.cluster
    gang = cluster.gangs.get(command.gang_id)
    if gang is None:
        raise Rejected(
            RejectionCode.UNKNOWN_GANG,
            f"gang {command.gang_id!r} is neither waiting, queued nor running in cluster "
            f"{decision.command.cluster!r} (never submitted, or already ended)",
        )
    freed = []
    for pod_id in sorted(gang.placed):  # sorted: a gang restored from a snapshot releases in the same order
        pod = cluster.pods[pod_id]
        freed.append(pod.node_id)
        decision.emit(PodReleased(pod_id, pod.node_id, command.reason), cluster.name)
        decision.then(WAKE_DEPENDANTS, cluster, pod_id)
        yield  # the member's dependants before the next member
    end_gang(decision, cluster, gang, command.reason)
    decision.then(RETRY_QUEUE, cluster, tuple(node_id for node_id in dict.fromkeys(freed) if node_id is not None), None)


def end_gang(decision: Decision, cluster: ClusterState, gang: Gang, reason: str) -> None:
    """``GangReleased`` (``ok`` only if every member completed), then the gang's dependants."""
    ok = gang.ok and gang.state == GANG_RUNNING and reason == COMPLETED
    decision.emit(GangReleased(gang.gang_id, reason, ok), cluster.name)
    decision.then(WAKE_DEPENDANTS, cluster, gang.gang_id)


def retry_gang(decision: Decision, cluster: ClusterState, gang: Gang, failed: Pod) -> bool:
    """A running member failed: if that takes its gang (fewer than ``min_members`` would run on, the gang's
    disruption mode) and the gang has retries left, its other running members are evicted (``gang:failed``,
    not a voluntary disruption) and the failed member's ``PodRetryScheduled`` sends the whole gang to wait for
    its retry, outside the queue; its dependants wait for the final outcome. Whether it did. O(M log M)."""
    retry = gang.spec.retry
    if retry is None or gang.state != GANG_RUNNING or failed.spec.pod_id not in gang.placed:
        return False
    attempt = gang.attempt + 1
    if attempt > retry.max_retries:
        return False
    failed_id = failed.spec.pod_id
    still = sum(1 for pod_id in gang.placed if pod_id != failed_id and cluster.pods[pod_id].running)
    if still >= gang.spec.min_members:
        return False  # the gang runs on without it: the member ends, as without retries
    freed: list[str | None] = [failed.node_id]
    for pod_id in sorted(gang.placed):  # sorted: a gang restored from a snapshot evicts in the same order
        pod = cluster.pods[pod_id]
        if pod_id != failed_id and pod.running:
            freed.append(pod.node_id)
            decision.emit(PodEvicted(pod_id, pod.node_id, GANG_FAILED), cluster.name)  # type: ignore[arg-type]
    not_before = decision.now + retry.delay_ms(attempt)
    decision.emit(PodRetryScheduled(failed_id, attempt, not_before, gang.gang_id), cluster.name)
    decision.then(RETRY_QUEUE, cluster, tuple(n for n in dict.fromkeys(freed) if n is not None), None)
    return True


# ---------------------------------------------------------------- placement


def place_gang(
    decision: Decision,
    cluster: ClusterState,
    spec: GangSpec,
    *,
    from_queue: bool,
    requeued: bool,
    new: bool = False,
    announce: bool | None = None,
) -> bool:
    """Place every member (at least min_members) in one outcome, or queue the gang with reasons (as ``place``)."""
    if new:
        blocked = blocked_by_earlier(cluster, (-spec.priority, spec.arrival, spec.gang_id))
        if blocked is not None:
            decision.emit(GangQueued(spec.gang_id, (blocked,), spec, requeued), cluster.name)
            return False
    policy = cluster_policy(cluster)
    found = gangs.try_place(cluster, spec, policy, decision.now)
    may_preempt = spec.preemption == PREEMPT_LOWER and decision.may_preempt
    reasons: tuple[QueueReason, ...] = ()
    if isinstance(found, gangs.GangPlacement):
        shortfall = gang_shortfall(cluster, spec, found) if cluster.quotas_on else None
        if shortfall is None:
            emit_gang_placement(decision, cluster, spec, found, from_queue)
            return True
        if may_preempt and shortfall.reclaimable and _reclaim_for_gang(decision, cluster, spec, from_queue):
            return True
        reasons = (QueueReason(QueueReasonCode.QUOTA_EXCEEDED, 0, shortfall.message),)
    else:
        reasons = found
        if may_preempt and preemption_plans.lower_priority_exists(cluster, spec.priority):

            def admit(placement: gangs.GangPlacement) -> bool:
                return not cluster.quotas_on or gang_shortfall(cluster, spec, placement) is None

            plan = _plan_preemption(decision, cluster, spec, admit)
            if plan is not None:
                victims = victim_events(decision, cluster, spec.gang_id, "gang", plan.units, "priority")
                emit_gang_placement(
                    decision, cluster, spec, plan.placement, from_queue, tuple(p.spec.pod_id for p, _ in victims)
                )
                decision.then(AFTER_PREEMPTION, cluster, victims)
                return True
    if (not from_queue) if announce is None else announce:
        decision.emit(GangQueued(spec.gang_id, reasons, spec, requeued), cluster.name)
    return False


def _plan_preemption(
    decision: Decision, cluster: ClusterState, spec: GangSpec, admit: Callable[[gangs.GangPlacement], bool]
) -> preemption_plans.GangPlan | None:
    """The victims that make room for the gang, under the same rules as a pod's (``pods._plan_preemption``)."""
    policy = cluster_policy(cluster)
    protected = decision.evicted_in(cluster)
    plan = gang_preemption.plan_gang(cluster, spec, policy, decision.now, admit, preemption_plans.Victims(protected))
    if plan is None or not cluster.quotas_on or not decision.kueue_rule:
        return plan
    victims = plan.victims
    quota = quotas.quota_of(cluster, spec.tenant)
    if quota is None or all(quotas.borrowing(cluster, pod) for pod in victims):
        return plan
    if not quotas.would_borrow(cluster, spec.tenant, _gang_demand(cluster, quota, plan.placement), victims):
        return plan
    return gang_preemption.plan_gang(
        cluster, spec, policy, decision.now, admit, preemption_plans.Victims(protected, True)
    )


def gang_shortfall(cluster: ClusterState, spec: GangSpec, placement: gangs.GangPlacement) -> quotas.Shortfall | None:
    """Whether the gang's quota has room for this placement (each member counted on its node's model)."""
    quota = quotas.quota_of(cluster, spec.tenant)
    if quota is None:
        return None
    return quotas.check(cluster, spec.tenant, quota, _gang_demand(cluster, quota, placement))


def _gang_demand(cluster: ClusterState, quota: Quota, placement: gangs.GangPlacement) -> quotas.Demand:
    wanted: quotas.Demand = {}
    for member, choice in placement.placed:
        quotas.add(wanted, quotas.demand(quota, member, cluster.nodes[choice.node_id].gpu_model))
    return wanted


def _reclaim_for_gang(decision: Decision, cluster: ClusterState, spec: GangSpec, from_queue: bool) -> bool:
    """A lender's gang within its nominal quota: reclaim from borrowers on trial until its placement fits."""
    quota = quotas.quota_of(cluster, spec.tenant)
    assert quota is not None
    policy = cluster_policy(cluster)
    trial = preemption_plans.Trial(cluster)
    units: list[preemption_plans.Unit] = []
    try:
        for _ in range(len(spec.members) + 8):  # measure: rounds left; each evicts a borrower, the placement may change
            found = gangs.try_place(cluster, spec, policy, decision.now)
            if not isinstance(found, gangs.GangPlacement):
                return False
            wanted = _gang_demand(cluster, quota, found)
            taken = reclaim.reclaim_on_trial(cluster, trial, spec.tenant, quota, wanted, decision.evicted_in(cluster))
            if taken is None:
                return False
            if not taken:
                break
            units.extend(taken)
        else:
            return False
    finally:
        trial.rollback()
    victims = victim_events(decision, cluster, spec.gang_id, "gang", units, "reclaim")
    found = gangs.try_place(cluster, spec, policy, decision.now)
    if not isinstance(found, gangs.GangPlacement):
        raise InvariantViolation(f"gang {spec.gang_id!r} does not fit after reclaiming its quota")
    emit_gang_placement(decision, cluster, spec, found, from_queue, tuple(p.spec.pod_id for p, _ in victims))
    decision.then(AFTER_PREEMPTION, cluster, victims)
    return True


def emit_gang_placement(
    decision: Decision,
    cluster: ClusterState,
    spec: GangSpec,
    found: gangs.GangPlacement,
    from_queue: bool,
    preempted: tuple[str, ...] = (),
) -> None:
    """``GangScheduled`` with every placed member, then each member's ``PodScheduled``: one outcome."""
    policy = cluster_policy(cluster)
    members = tuple(MemberPlacement(member.pod_id, choice.node_id, choice.gpus) for member, choice in found.placed)
    decision.emit(
        GangScheduled(
            spec.gang_id, members, spec, found.topology_key, found.domain, from_queue, found.message, preempted
        ),
        cluster.name,
    )
    for member, choice in found.placed:
        decision.emit(
            PodScheduled(member, choice.node_id, choice.gpus, policy.name, from_queue, choice.scores), cluster.name
        )
    holder_started(decision, cluster, spec.gang_id)


# ---------------------------------------------------------------- a running gang that lost members


def gang_lost_members(decision: Decision, cluster: ClusterState, gang: Gang, reason: str) -> Task:
    """Some members were evicted: the gang keeps running if at least min_members still run (the lost
    ones end), else every member is evicted and the gang goes back to the queue (training restarts)."""
    if gang_keeps_running(gang, cluster):
        yield from gang_ends_lost_members(decision, cluster, gang, reason)
        return
    freed = gang_evict_members(decision, cluster, gang, reason)
    gang_placed_back(decision, cluster, gang, freed)


def gang_keeps_running(gang: Gang, cluster: ClusterState) -> bool:
    """Whether at least min_members of the gang still run after some were evicted."""
    still = sum(1 for pod_id in gang.placed if cluster.pods[pod_id].running)
    return still >= gang.spec.min_members


def gang_ends_lost_members(decision: Decision, cluster: ClusterState, gang: Gang, reason: str) -> Task:
    """The gang runs on: each evicted member ends (its dependants are woken)."""
    lost = [pod_id for pod_id in gang.placed if not cluster.pods[pod_id].running]
    for pod_id in sorted(lost):  # measure: the lost members left
        decision.emit(PodReleased(pod_id, None, EVICTED_MEMBER + reason), cluster.name)
        decision.then(WAKE_DEPENDANTS, cluster, pod_id)
        yield  # the member's dependants before the next member


def gang_evict_members(decision: Decision, cluster: ClusterState, gang: Gang, reason: str) -> list[str | None]:
    """Too few members left: the running ones are evicted too (training restarts); the nodes they freed."""
    freed: list[str | None] = []
    for pod_id in sorted(gang.placed):
        pod = cluster.pods[pod_id]
        if pod.running:
            freed.append(pod.node_id)
            decision.emit(PodEvicted(pod_id, pod.node_id, f"gang:{reason}"), cluster.name)  # type: ignore[arg-type]
    return freed


def gang_placed_back(decision: Decision, cluster: ClusterState, gang: Gang, freed: list[str | None]) -> None:
    """A gang whose members were all evicted goes back to the queue, and is placed again if it can be."""
    # Back to the queue (its members stop being pods), then placed again at once if it fits (and its quota
    # has room), else it may still reclaim or preempt like any queued gang.
    spec = gang.spec
    found = gangs.try_place(cluster, spec, cluster_policy(cluster), decision.now)
    placed = isinstance(found, gangs.GangPlacement)
    reasons: tuple[QueueReason, ...] = () if placed else found  # type: ignore[assignment]
    if placed and cluster.quotas_on:
        shortfall = gang_shortfall(cluster, spec, found)  # type: ignore[arg-type]
        if shortfall is not None:
            placed, reasons = False, (QueueReason(QueueReasonCode.QUOTA_EXCEEDED, 0, shortfall.message),)
    decision.emit(GangQueued(gang.gang_id, reasons, spec, True), cluster.name)
    if placed:
        emit_gang_placement(decision, cluster, spec, found, True)  # type: ignore[arg-type]
    elif spec.preemption == PREEMPT_LOWER and decision.may_preempt:
        place_gang(decision, cluster, spec, from_queue=True, requeued=True, announce=False)
    decision.then(RETRY_QUEUE, cluster, tuple(n for n in dict.fromkeys(freed) if n is not None), None)
