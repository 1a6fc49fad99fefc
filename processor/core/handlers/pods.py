"""Pods: ``SubmitPod`` and ``Release``, and placing one pod (quota, free capacity, reclaim, preemption).

Placement itself is synchronous: :func:`place` decides, emits and says whether the pod started; what
the decision sets off (the victims back to placement, the queue retrying what they freed, a released
reservation) is left as follow-up work.
"""

from __future__ import annotations

from processor.core import node_victims, preemption, preemption_plans, quota_preemption, quotas, reclaim, reservations
from processor.core.decision import AFTER_PREEMPTION, RETRY_QUEUE, WAKE_DEPENDANTS, Decision, cluster_policy
from processor.core.errors import InvariantViolation
from processor.core.handlers.checks import check_models, check_new_job_ids, check_no_cycle
from processor.core.handlers.dependants import hold_new_job
from processor.core.handlers.evictions import victim_events
from processor.core.handlers.gangs import GANG_ENDED, end_gang, retry_gang, waiting_members
from processor.core.handlers.reservations import holder_started
from processor.core.policies.base import Choice
from processor.core.reasons import blocked_by_earlier, queue_reasons
from processor.core.resources import PodShape
from processor.core.state import GANG_RUNNING, ClusterState, Pod, lookup, shape_of
from schemas.codes import QueueReasonCode, Rejected, RejectionCode
from schemas.commands import (
    PREEMPT_NEVER,
    PREEMPTING,
    PREEMPTION_MODES,
    PREEMPTION_MODES_V3,
    STRICT_FIFO,
    Release,
    SubmitPod,
)
from schemas.events import PodQueued, PodReleased, PodRetryScheduled, PodScheduled, PodSpec, QueueReason
from schemas.validation import check_release, check_submit_pod

FAILED = "failed"
"""The Release reason of a failure: the one that uses a retry (SubmitPod.retry)."""

# ---------------------------------------------------------------- commands


def submit_pod(decision: Decision, command: SubmitPod) -> None:
    check_submit_pod(command, PREEMPTION_MODES_V3 if decision.legacy_gangs else PREEMPTION_MODES)
    cluster = decision.cluster
    name = decision.command.cluster
    if command.gpu_models and (cluster.nodes or decision.legacy_gangs):  # the admission rule: ``handlers.gangs``
        check_models(cluster, name, tuple(command.gpu_models))
    if command.pod_id in cluster.pods:
        raise Rejected(RejectionCode.DUPLICATE_POD, f"pod {command.pod_id!r} is already queued or running")
    if command.pod_id in cluster.gangs or command.pod_id in cluster.member_of:
        check_new_job_ids(cluster, name, (command.pod_id,), "pod")
    if command.depends_on:
        check_no_cycle(cluster, (command.pod_id,), tuple(command.depends_on))
    spec = PodSpec(
        command.pod_id,
        command.tenant,
        command.priority,
        command.num_gpu,
        command.gpu_milli,
        command.cpu_milli,
        command.memory_mib,
        tuple(command.gpu_models),
        dict(sorted(command.node_selector.items())),  # canonical order: a restored spec encodes alike
        tuple(command.tolerations),
        decision.now,
        cluster.arrivals,
        None,
        command.time_limit_ms,
        tuple(dict.fromkeys(command.depends_on)) if command.depends_on else (),
        command.dependency,
        command.preemption if decision.may_preempt else PREEMPT_NEVER,
        command.movable and not command.gpu_memory_mib,  # Defragment does not model GPU memory: never moved
        command.gpu_memory_mib,
        command.retry,
        command.preemptible,
    )
    if spec.depends_on and hold_new_job(decision, cluster, spec):
        return
    place(decision, cluster, spec, shape_of(spec), from_queue=False, requeued=False, new=True)


def release(decision: Decision, command: Release) -> None:
    check_release(command)
    cluster = decision.cluster
    pod = lookup(cluster.pods, command.pod_id)
    if pod is None:
        raise Rejected(
            RejectionCode.UNKNOWN_POD,
            f"pod {command.pod_id!r} is neither queued nor running in cluster {decision.command.cluster!r} "
            "(never submitted, or already released)",
        )
    release_pod(decision, cluster, pod, command.reason)


def release_pod(decision: Decision, cluster: ClusterState, pod: Pod, reason: str) -> None:
    """Release one pod (a gang member too); end its gang if it was the last; then its dependants and the queue.

    A running pod that *failed* with retries left is not released: it stops, and its retry is due after its
    backoff (``PodRetryScheduled``, a timer); its dependants wait for its final outcome. A gang member's failure
    that takes its gang (``SubmitGang.retry``: fewer than ``min_members`` would run on) retries the whole gang."""
    node_id = pod.node_id
    pod_id = pod.spec.pod_id
    gang_id = pod.spec.gang_id
    if reason == FAILED and node_id is not None:
        if gang_id is not None:
            gang = cluster.gangs.get(gang_id)
            if gang is not None and retry_gang(decision, cluster, gang, pod):
                return
        elif pod.spec.retry is not None:
            retry = pod.spec.retry
            attempt = pod.attempt + 1
            if attempt <= retry.max_retries:
                decision.emit(PodRetryScheduled(pod_id, attempt, decision.now + retry.delay_ms(attempt)), cluster.name)
                decision.then(RETRY_QUEUE, cluster, (node_id,), None)
                return
    decision.emit(PodReleased(pod_id, node_id, reason), cluster.name)
    if gang_id is not None:
        gang = cluster.gangs.get(gang_id)
        if gang is not None and gang.state == GANG_RUNNING and not gang.placed:
            for member_id in waiting_members(cluster, gang):  # no member runs: those still waiting go with it
                decision.emit(PodReleased(member_id, None, GANG_ENDED), cluster.name)
                decision.then(WAKE_DEPENDANTS, cluster, member_id)
            end_gang(decision, cluster, gang, reason)
    decision.then(WAKE_DEPENDANTS, cluster, pod_id)
    if node_id is not None:
        decision.then(RETRY_QUEUE, cluster, (node_id,), None)


# ---------------------------------------------------------------- placement


def place(
    decision: Decision,
    cluster: ClusterState,
    spec: PodSpec,
    shape: PodShape,
    *,
    from_queue: bool,
    requeued: bool,
    new: bool = False,
    announce: bool | None = None,
    near: tuple[str, ...] | None = None,
) -> bool:
    """Schedule the pod with the cluster's policy, or queue it with reasons; whether it started. O(S_m).

    Quota first (``processor.core.quotas``; a lender may reclaim), then free capacity, then,
    if it may, priority preemption (``processor.core.preemption``; ``near``: only on these
    nodes, the ones whose capacity changed). ``new``: the job enters the queue now (strict
    FIFO may hold it back). ``announce`` (default: not ``from_queue``): emit ``PodQueued``
    if it does not start; a pod retried from the queue stays queued silently."""
    if new and cluster.queue_order == STRICT_FIFO:
        blocked = blocked_by_earlier(cluster, (-spec.priority, spec.arrival, spec.pod_id))
        if blocked is not None:
            decision.emit(PodQueued(spec, (blocked,), requeued), cluster.name)
            return False
    member = spec.gang_id is not None  # a member beyond min_members that waits while its gang runs
    if member and not member_may_start(cluster, spec):
        return False  # its gang is losing members in this command: it waits with the gang, or starts after
    reserved = cluster.reservation is not None
    usable = reservations.usable_shape(cluster, spec.pod_id, shape, decision.now) if reserved else shape
    quota_reasons: tuple[QueueReason, ...] = ()
    # A pod that asks for GPU memory waits rather than preempting: the victim searches do not model GPU memory.
    # A waiting member takes only free capacity (Volcano: only a job below its minimum preempts).
    may_preempt = spec.preemption in PREEMPTING and decision.may_preempt and not spec.gpu_memory_mib and not member
    if cluster.quotas_on:
        admission = quotas.admit(cluster, spec, usable)
        if admission.shortfalls:
            quota_reasons = (quota_reason(admission.shortfalls, admission.shape is None),)
        if admission.shape is None:
            reclaimable = any(shortfall.reclaimable for _, shortfall in admission.shortfalls)
            if may_preempt and reclaimable and quotas.may_reclaim(cluster, spec.tenant):
                found = reclaim.plan_pod(
                    cluster,
                    spec,
                    usable,
                    admission,
                    cluster_policy(cluster),
                    decision.now,
                    decision.evicted_in(cluster),
                )
                if found is not None:
                    units, choice, plan, reclaim_shape = found
                    _preempt_for_pod(decision, cluster, spec, reclaim_shape, units, plan, from_queue, choice)
                    return True
            if may_preempt and _preempt_by_quota_policy(decision, cluster, spec, usable, from_queue):
                return True
            if (not from_queue) if announce is None else announce:
                decision.emit(PodQueued(spec, quota_reasons, requeued), cluster.name)
            return False
        usable = admission.shape
    groups = cluster.index.feasible(usable)
    if groups:
        policy = cluster_policy(cluster)
        choice = policy.place(cluster, usable, groups)
        decision.emit(
            PodScheduled(spec, choice.node_id, choice.gpus, policy.name, from_queue, choice.scores), cluster.name
        )
        if reserved:
            holder_started(decision, cluster, spec.pod_id)
        return True
    if may_preempt and preemption_plans.lower_priority_exists(
        cluster, preemption_plans.reach(spec.priority, spec.preemption)
    ):
        preempting = _plan_preemption(decision, cluster, spec, usable, near)
        if preempting is not None:
            _preempt_for_pod(decision, cluster, spec, usable, [], preempting, from_queue)
            return True
    if (not from_queue) if announce is None else announce:
        reasons = quota_reasons + queue_reasons(cluster, shape)
        if spec.preemption == PREEMPT_NEVER and decision.may_preempt:
            reasons += waiting_for_preemption(cluster, usable, spec.priority)
        decision.emit(PodQueued(spec, reasons, requeued), cluster.name)
    return False


def member_may_start(cluster: ClusterState, spec: PodSpec) -> bool:
    """Whether a waiting member of an elastic gang may start now: its gang runs and none of its placed members
    was evicted in this command (then the gang runs on without them, or goes back to the queue with every
    member, this one too). O(M)."""
    gang_id = spec.gang_id
    gang = lookup(cluster.gangs, gang_id) if gang_id is not None else None
    if gang is None or gang.state != GANG_RUNNING:
        return False
    pods = cluster.pods
    return all(pods[pod_id].running for pod_id in gang.placed)


def _plan_preemption(
    decision: Decision, cluster: ClusterState, spec: PodSpec, shape: PodShape, near: tuple[str, ...] | None
) -> preemption_plans.PodPlan | None:
    """The victims that make room for the pod: none evicted earlier in this command, and if the pod would
    borrow quota to run there, only borrowers' pods (Kueue's rule: work inside its nominal quota is never the
    victim of a borrower)."""
    protected = decision.evicted_in(cluster)
    level = preemption_plans.reach(spec.priority, spec.preemption)  # lower_or_newer_equal_priority: its own too
    equal = preemption_plans.equal_of(spec)
    allowed = preemption_plans.Victims(protected, equal=equal)
    plan = preemption.plan_pod(cluster, shape, level, decision.now, near, allowed)
    if plan is None or not cluster.quotas_on or not decision.kueue_rule:
        return plan
    victims = plan.victims
    quota = quotas.quota_of(cluster, spec.tenant)
    if quota is None or all(quotas.borrowing(cluster, pod) for pod in victims):
        return plan
    wanted = quotas.demand(quota, spec, cluster.nodes[plan.node_id].gpu_model)
    if not quotas.would_borrow(cluster, spec.tenant, wanted, victims):
        return plan
    allowed = preemption_plans.borrower_victims(cluster, spec.tenant, protected, equal)
    return preemption.plan_pod(cluster, shape, level, decision.now, near, allowed)


def _preempt_by_quota_policy(
    decision: Decision, cluster: ClusterState, spec: PodSpec, usable: PodShape, from_queue: bool
) -> bool:
    """The tenant's ``SetQuota.preemption`` (contract v4), for a pod its quota has no room for: ``within_tenant``
    (its own lower-priority or newer work), then ``borrow_within_cohort`` (cohort peers' lower-priority pods) go
    so that it fits, and it starts on the capacity that freed (``processor.core.quota_preemption``)."""
    units = None
    reason = ""
    for kind, policy_of in (
        (quota_preemption.WITHIN_TENANT, quota_preemption.within_tenant),
        (quota_preemption.BORROW_WITHIN_COHORT, quota_preemption.borrow_within_cohort),
    ):
        allowed = policy_of(cluster, spec)
        if allowed is not None:
            protected = decision.evicted_in(cluster)
            units = quota_preemption.plan_pod(cluster, spec, usable, protected, decision.now, allowed)
            if units is not None:
                reason = kind
                break
    if units is None:
        return False
    victims = victim_events(decision, cluster, spec.pod_id, "pod", units, reason)
    admission = quotas.admit(cluster, spec, usable)
    groups = cluster.index.feasible(admission.shape) if admission.shape is not None else []
    if not groups:
        raise InvariantViolation(f"pod {spec.pod_id!r} does not fit after preempting within its tenant")
    policy = cluster_policy(cluster)
    choice = policy.place(cluster, admission.shape, groups)  # type: ignore[arg-type]
    _start_after_preemption(decision, cluster, spec, choice, policy.name, from_queue, victims)
    return True


def quota_reason(shortfalls: list[tuple[str, quotas.Shortfall]], everywhere: bool) -> QueueReason:
    """``QUOTA_EXCEEDED`` in words: what the tenant runs, its limit and what the pod needs (per model if not all)."""
    words = quotas.shortfall_words(shortfalls)
    if not everywhere:
        models = ", ".join(model for model, _ in shortfalls)
        words = f"not on {models}: {words}"
    return QueueReason(QueueReasonCode.QUOTA_EXCEEDED, 0, words)


def waiting_for_preemption(cluster: ClusterState, shape: PodShape, priority: int) -> tuple[QueueReason, ...]:
    """A pod that said ``preemption: never``: the nodes where it would fit once lower-priority pods end."""
    if not preemption_plans.lower_priority_exists(cluster, priority):
        return ()
    count = sum(
        1
        for node_id in preemption.candidate_nodes(cluster, priority, None)
        if node_victims.could_preempt_on(cluster.nodes[node_id], shape, priority, cluster)
    )
    if not count:
        return ()
    message = (
        f"it would fit on {count} node(s) once lower-priority pods there end; it does not preempt them "
        "(preemption: never)"
    )
    return (QueueReason(QueueReasonCode.WAITING_FOR_PREEMPTION, count, message),)


def _preempt_for_pod(
    decision: Decision,
    cluster: ClusterState,
    spec: PodSpec,
    shape: PodShape,
    reclaimed: list[preemption_plans.Unit],
    plan: preemption_plans.PodPlan,
    from_queue: bool,
    choice: Choice | None = None,
) -> None:
    """Evict the victims, place the pod on the node they freed (nominated: nothing else takes it first),
    then leave the victims to go back to placement and the rest of what they freed to the queue."""
    victims = victim_events(decision, cluster, spec.pod_id, "pod", reclaimed, "reclaim")
    victims += victim_events(decision, cluster, spec.pod_id, "pod", plan.units, "priority")
    policy = cluster_policy(cluster)
    if choice is None:
        choice = Choice(plan.node_id, policy.choose_gpus(cluster.nodes[plan.node_id], shape), {})
    if plan.units:
        highest, count, work = plan.cost
        choice.scores = {
            **choice.scores,
            "victim_priority": float(highest),
            "victims": float(count),
            "gpu_seconds_lost": work / 1e6,
        }
    _start_after_preemption(decision, cluster, spec, choice, policy.name, from_queue, victims)


def _start_after_preemption(
    decision: Decision,
    cluster: ClusterState,
    spec: PodSpec,
    choice: Choice,
    policy_name: str,
    from_queue: bool,
    victims: list[tuple[Pod, str]],
) -> None:
    """The preemptor's ``PodScheduled`` naming its victims (already evicted), then the victims' placement
    as follow-up work."""
    decision.emit(
        PodScheduled(
            spec,
            choice.node_id,
            choice.gpus,
            policy_name,
            from_queue,
            choice.scores,
            tuple(pod.spec.pod_id for pod, _ in victims),
        ),
        cluster.name,
    )
    holder_started(decision, cluster, spec.pod_id)
    decision.then(AFTER_PREEMPTION, cluster, victims)
