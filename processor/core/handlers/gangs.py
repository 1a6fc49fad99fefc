"""Gangs: ``SubmitGang`` and ``ReleaseGang``, placing a gang (quota, free capacity, reclaim, preemption),
and a running gang that lost members.

Where the members go within a topology domain: :mod:`processor.core.gangs`. As for pods, placing is
synchronous and what it sets off is left as follow-up work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from processor.core import cohort_tree, gang_preemption, gangs, preemption_plans, quota_keys, quotas, reclaim
from processor.core.decision import AFTER_PREEMPTION, RETRY_QUEUE, WAKE_DEPENDANTS, Decision, Task, cluster_policy
from processor.core.handlers.checks import check_models, check_new_job_ids, check_no_cycle
from processor.core.handlers.dependants import hold_new_job
from processor.core.handlers.evictions import victim_events
from processor.core.handlers.reservations import holder_started
from processor.core.reasons import blocked_by_earlier, queue_reasons
from processor.core.state import COMPLETED, EVICTED_MEMBER, GANG_RUNNING, ClusterState, Gang, Pod, lookup, shape_of
from schemas.codes import QueueReasonCode, Rejected, RejectionCode
from schemas.commands import (
    DISRUPT_ABOVE_MIN,
    PREEMPT_NEVER,
    PREEMPTING,
    PREEMPTION_MODES,
    PREEMPTION_MODES_V3,
    RECLAIM_LOWER,
    Quota,
    ReleaseGang,
    SubmitGang,
)
from schemas.events import (
    GangQueued,
    GangReleased,
    GangScheduled,
    GangSpec,
    MemberPlacement,
    PodEvicted,
    PodQueued,
    PodReleased,
    PodRetryScheduled,
    PodScheduled,
    PodSpec,
    QueueReason,
)
from schemas.validation import check_release_gang, check_submit_gang

GANG_FAILED = "gang:failed"
"""The ``PodEvicted`` reason of the members a failed member takes with its gang when the gang retries
(not a voluntary disruption: no budget counts it)."""

# ---------------------------------------------------------------- commands


def submit_gang(decision: Decision, command: SubmitGang) -> None:
    check_submit_gang(command, PREEMPTION_MODES_V3 if decision.legacy_gangs else PREEMPTION_MODES)
    cluster = decision.cluster
    name = decision.command.cluster
    ids = (command.gang_id, *(member.pod_id for member in command.members))
    check_new_job_ids(cluster, name, ids[:1], "gang")
    check_new_job_ids(cluster, name, ids[1:], "pod")
    # One admission rule for pods and gangs (contract v4): a cluster with no node yet judges no shape (both queue,
    # NO_NODES); once it has nodes, what no node present could hold is refused (UNKNOWN_GPU_MODEL,
    # UNKNOWN_LABEL_KEY, NEVER_FITS) and what was accepted is never refused later: it waits when nodes go.
    judged = bool(cluster.nodes) or decision.legacy_gangs
    for member in command.members if judged else ():
        check_models(cluster, name, tuple(member.gpu_models))
    for key in (command.topology_required, command.topology_preferred) if judged else ():
        if key is not None and key not in cluster.label_keys:
            raise Rejected(
                RejectionCode.UNKNOWN_LABEL_KEY,
                f"no node in cluster {name!r} has the label key {key!r}; known: {sorted(cluster.label_keys)[:20]}",
            )
    spec = gangs.gang_spec(
        command, decision.now, cluster.arrivals, command.preemption if decision.may_preempt else PREEMPT_NEVER
    )
    never = gangs.never_fits(cluster, spec) if judged else None
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
    for pod_id in waiting_members(cluster, gang):  # an elastic gang's members still queued (contract v4)
        decision.emit(PodReleased(pod_id, None, command.reason), cluster.name)
        decision.then(WAKE_DEPENDANTS, cluster, pod_id)
        yield
    end_gang(decision, cluster, gang, command.reason)
    decision.then(RETRY_QUEUE, cluster, tuple(node_id for node_id in dict.fromkeys(freed) if node_id is not None), None)


GANG_ENDED = "gang_ended"
"""The release reason of a member still waiting when the last running member of its gang ended."""


def waiting_members(cluster: ClusterState, gang: Gang) -> list[str]:
    """The members of a running gang that wait in the queue for room (members beyond ``min_members``, contract
    v3), in the gang's member order. O(M)."""
    if gang.state != GANG_RUNNING:
        return []
    out = []
    for member in gang.spec.members:
        pod = lookup(cluster.pods, member.pod_id)
        if pod is not None and pod.queued:
            out.append(member.pod_id)
    return out


def end_gang(decision: Decision, cluster: ClusterState, gang: Gang, reason: str) -> None:
    """``GangReleased`` (``ok`` only if every member completed), then the gang's dependants."""
    ok = gang.ok and gang.state == GANG_RUNNING and reason == COMPLETED
    members = members_ending(decision, gang)
    decision.emit(GangReleased(gang.gang_id, reason, ok, members), cluster.name)
    decision.then(WAKE_DEPENDANTS, cluster, gang.gang_id)
    for member_id in members:
        decision.then(WAKE_DEPENDANTS, cluster, member_id)


def members_ending(decision: Decision, gang: Gang) -> tuple[str, ...]:
    """The members that end with a gang that is not running (contract v4: jobs waiting for one end too; before,
    they waited forever). A running gang's members each ended with their own ``PodReleased``."""
    if decision.legacy_gangs or gang.state == GANG_RUNNING:
        return ()
    return tuple(member.pod_id for member in gang.spec.members)


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
    still = [cluster.pods[p].spec for p in gang.placed if p != failed_id and cluster.pods[p].running]
    if gangs.enough(gang.spec, still):
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
    may_preempt = spec.preemption in PREEMPTING and decision.may_preempt
    reasons: tuple[QueueReason, ...] = ()
    if isinstance(found, gangs.GangPlacement):
        shortfall = gang_shortfall(cluster, spec, found) if cluster.quotas_on else None
        if shortfall is None:
            emit_gang_placement(decision, cluster, spec, found, from_queue)
            return True
        reclaims = may_preempt and shortfall.reclaimable and quotas.may_reclaim(cluster, spec.tenant)
        if reclaims and _reclaim_for_gang(decision, cluster, spec, from_queue):
            return True
        if not decision.legacy_gangs:  # partial admission: at least min_members within the quota (contract v4)
            trimmed = within_quota(cluster, spec, found)
            if trimmed is not None:
                emit_gang_placement(decision, cluster, spec, trimmed, from_queue)
                return True
        reasons = (QueueReason(QueueReasonCode.QUOTA_EXCEEDED, 0, _quota_words(spec, shortfall.message)),)
    else:
        reasons = found
        reclaiming = may_preempt and cluster.quotas_on and not decision.legacy_gangs
        if reclaiming and _reclaim_capacity_for_gang(decision, cluster, spec, from_queue):
            return True
        level = preemption_plans.reach(spec.priority, spec.preemption)
        if may_preempt and preemption_plans.lower_priority_exists(cluster, level):

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


def quota_rules_out(decision: Decision, cluster: ClusterState, spec: GangSpec) -> bool:
    """Whether the queued gang's quota rules out its start now, wherever it would go and whatever it evicted:
    then :func:`place_gang` from the queue would find no way in and emit nothing, and the queue's retry skips it
    without its trial placement. A retry storm (each eviction of a command retries its tenant's queued gangs)
    costs O(M log M) per gang so screened instead of O(M · placement).

    The least any admissible set of members adds to the quota (:func:`quotas.demand_floor`, at least
    ``min_members``) must not fit. A gang that may not preempt changes nothing before its quota check, so the
    full check decides; one that may preempt can free its cohort's pool by evicting others' pods (reclaim or
    priority), so only its own limits count, less what its own pods below its reach hold."""
    if not cluster.quotas_on:
        return False
    quota = quotas.quota_of(cluster, spec.tenant)
    if quota is None:
        return False
    floor = quotas.demand_floor(cluster, quota, list(spec.members), spec.min_members)
    if not floor:
        return False
    if not (spec.preemption in PREEMPTING and decision.may_preempt):
        return quotas.check(cluster, spec.tenant, quota, floor) is not None
    level = preemption_plans.reach(spec.priority, spec.preemption)
    freed = _freeable(decision, cluster, spec.tenant, level)
    if quotas.over_own_limit(cluster, spec.tenant, quota, floor, freed):
        return True
    cohort = quota.cohort
    if cohort is None or (cluster.cohort_specs and cohort_tree.parent_of(cluster.cohort_specs, cohort) is not None):
        return False
    if quotas.may_reclaim(cluster, spec.tenant) and not quotas.would_borrow_on_every_key(cluster, spec.tenant, floor):
        return False  # a reclaim may evict borrowers of any priority: only the tenant's own limits count
    # Priority preemption frees the pool only by the other members' pods below the gang's reach.
    given_back = {
        member: _freeable(decision, cluster, member, level)
        for member in cluster.cohorts.get(cohort, [])
        if member != spec.tenant
    }
    return quotas.pool_short(cluster, spec.tenant, quota, floor, freed, given_back)


def _freeable(decision: Decision, cluster: ClusterState, tenant: str, level: int) -> quotas.Demand | None:
    """:func:`quotas.freeable_below` for the tenant's quota, kept for the command while no event is emitted."""
    quota = quotas.quota_of(cluster, tenant)
    if quota is None:
        return None
    version = len(decision.events)
    key = (cluster.name, tenant, level)
    known = decision.freeable.get(key)
    if known is None or known[0] != version:
        known = decision.freeable[key] = (version, quotas.freeable_below(cluster, tenant, quota, level))
    freed: quotas.Demand | None = known[1]
    return freed


def _quota_words(spec: GangSpec, message: str) -> str:
    """The quota shortfall of a gang that does not start within its quota, naming what it needs at least: its
    ``min_members`` with each role's minimum (contract v4; a gang without roles: the shortfall alone)."""
    if not spec.min_members_per_role:
        return message
    roles = ", ".join(f"{n} of role {role!r}" for role, n in sorted(spec.min_members_per_role.items()))
    return f"{message}; it needs at least {spec.min_members} member(s) with {roles} within its quota at once"


def _plan_preemption(
    decision: Decision, cluster: ClusterState, spec: GangSpec, admit: Callable[[gangs.GangPlacement], bool]
) -> preemption_plans.GangPlan | None:
    """The victims that make room for the gang, under the same rules as a pod's (``pods._plan_preemption``)."""
    policy = cluster_policy(cluster)
    protected = decision.evicted_in(cluster)
    equal = preemption_plans.equal_of(spec)
    # lower_or_newer_equal_priority: the search reaches the gang's own priority, where only newer work may go
    searched = spec if equal is None else dataclasses.replace(spec, priority=spec.priority + 1)
    allowed = preemption_plans.Victims(protected, equal=equal)
    plan = gang_preemption.plan_gang(cluster, searched, policy, decision.now, admit, allowed)
    if plan is None or not cluster.quotas_on or not decision.kueue_rule:
        return plan
    victims = plan.victims
    quota = quotas.quota_of(cluster, spec.tenant)
    if quota is None or all(quotas.borrowing(cluster, pod) for pod in victims):
        return plan
    if not quotas.would_borrow(cluster, spec.tenant, _gang_demand(cluster, quota, plan.placement), victims):
        return plan
    allowed = preemption_plans.borrower_victims(cluster, spec.tenant, protected, equal)
    return gang_preemption.plan_gang(cluster, searched, policy, decision.now, admit, allowed)


def gang_shortfall(cluster: ClusterState, spec: GangSpec, placement: gangs.GangPlacement) -> quotas.Shortfall | None:
    """Whether the gang's quota has room for this placement (each member counted on its node's model)."""
    quota = quotas.quota_of(cluster, spec.tenant)
    if quota is None:
        return None
    return quotas.check(cluster, spec.tenant, quota, _gang_demand(cluster, quota, placement))


def within_quota(cluster: ClusterState, spec: GangSpec, found: gangs.GangPlacement) -> gangs.GangPlacement | None:
    """Partial admission (Kueue's, for a gang with ``min_members``): the placement without its largest members,
    as few dropped as the quota needs, if at least ``min_members`` are left; None if even those go over.
    O(M · keys)."""
    quota = quotas.quota_of(cluster, spec.tenant)
    if quota is None:
        return found
    placed = list(found.placed)  # largest first (then id)
    demands = [quotas.demand(quota, member, cluster.nodes[choice.node_id].gpu_model) for member, choice in placed]
    total: quotas.Demand = {}
    for wanted in demands:
        quotas.add(total, wanted)
    # Dropped first: the largest members (they free the most quota each), the last in member order among equals;
    # a member whose role would fall below its min_members_per_role is kept (contract v4).
    order = sorted(range(len(placed)), key=lambda i: (_size(placed[i][0]), i), reverse=True)
    minimums = spec.min_members_per_role
    roles = gangs.role_counts(member for member, _ in placed)
    dropped: set[int] = set()
    cursor = 0
    while quotas.check(cluster, spec.tenant, quota, total) is not None:  # measure: the candidates left in order
        if len(placed) - len(dropped) <= spec.min_members or cursor >= len(order):
            return None
        position = order[cursor]
        cursor += 1
        role = placed[position][0].role
        if role is not None and roles.get(role, 0) <= minimums.get(role, 0):
            continue  # its role needs it
        if role is not None:
            roles[role] -= 1
        dropped.add(position)
        for key, amount in demands[position].items():
            total[key] -= amount
    kept = [item for i, item in enumerate(placed) if i not in dropped]
    message = f"{found.message}; {len(kept)} start within tenant {spec.tenant!r}'s quota, the others wait"
    return gangs.GangPlacement(kept, found.topology_key, found.domain, message)


def _size(member: PodSpec) -> tuple[int, int, int]:
    return (member.num_gpu * member.gpu_milli, member.cpu_milli, member.memory_mib)


def _admitted(cluster: ClusterState, spec: GangSpec, found: gangs.GangPlacement) -> gangs.GangPlacement | None:
    """The placement if the quota has room for it, else the most of it the quota has room for (at least
    ``min_members``), else None."""
    if gang_shortfall(cluster, spec, found) is None:
        return found
    return within_quota(cluster, spec, found)


RECLAIM_UNITS = 64
"""Borrowers' units a gang's reclaim on a full cluster evicts on trial at most before it gives up."""


def _reclaim_capacity_for_gang(decision: Decision, cluster: ClusterState, spec: GangSpec, from_queue: bool) -> bool:
    """A gang that fits no free capacity but would run inside its tenant's nominal quota takes capacity back from
    the cohort's borrowers, as a pod's reclaim does (contract v4): borrowers' pods in reclaim's order (lowest
    priority, then youngest) are evicted on trial until the gang fits and stays inside its nominal quota, then
    those not needed are given back (latest first, Kueue's fill-back). Nothing is evicted unless the gang starts.

    Cost: O(P) to list the borrowers' running pods, then O(placement) per unit tried (at most
    :data:`RECLAIM_UNITS`), and as many again for the fill-back."""
    quota = quotas.quota_of(cluster, spec.tenant)
    if quota is None or quota.cohort is None or not quotas.may_reclaim(cluster, spec.tenant):
        return False
    protected = decision.evicted_in(cluster)
    candidates = quotas.reclaim_candidates(cluster, spec.tenant, quota, quota_keys.limited_keys(quota), protected)
    below = spec.priority if quota.policy.reclaim_within_cohort == RECLAIM_LOWER else None
    candidates = [
        pod
        for pod in candidates
        if pod.spec.preemptible
        and (below is None or pod.spec.priority < below)
        and not quotas.shielded(cluster, pod, spec.priority)
    ]
    if not candidates:
        return False
    policy = cluster_policy(cluster)
    now = decision.now

    def fits_inside(units: list[preemption_plans.Unit]) -> gangs.GangPlacement | None:
        trial = preemption_plans.Trial(cluster)
        try:
            for unit in units:
                for pod in unit.pods:
                    trial.evict(pod)
            return _inside_nominal(cluster, spec, quota, gangs.try_place(cluster, spec, policy, now))
        finally:
            trial.rollback()

    units: list[preemption_plans.Unit] = []
    trial = preemption_plans.Trial(cluster)
    taken: dict[str, None] = {}
    found: gangs.GangPlacement | None = None
    try:
        for pod in candidates:  # measure: the candidates left (and at most RECLAIM_UNITS units taken)
            if pod.spec.pod_id in taken or pod.node_id is None or not quotas.borrowing(cluster, pod):
                continue  # taken with its gang, or its tenant no longer borrows after what was taken on trial
            unit = preemption_plans.unit_of(cluster, pod, now)
            if any(member.spec.pod_id in protected or member.spec.pod_id in taken for member in unit.pods):
                continue
            for member in unit.pods:
                trial.evict(member)
                taken[member.spec.pod_id] = None
            units.append(unit)
            found = _inside_nominal(cluster, spec, quota, gangs.try_place(cluster, spec, policy, now))
            if found is not None or len(units) >= RECLAIM_UNITS:
                break
    finally:
        trial.rollback()
    if found is None:
        return False
    on_trial = found  # where the gang goes once ``units`` are evicted
    for position in range(len(units) - 1, -1, -1):  # measure: position; fill-back, latest taken first
        fewer = units[:position] + units[position + 1 :]
        fits = fits_inside(fewer) if fewer else None
        if fits is not None:
            units, on_trial = fewer, fits
    victims = victim_events(decision, cluster, spec.gang_id, "gang", units, "reclaim")
    # Placed again on the capacity the evictions freed; a policy that draws from the folded state (random) may
    # draw other nodes now than on trial, and those may not fit inside the nominal quota: then the placement
    # found on trial, on the same free capacity.
    placed = _inside_nominal(cluster, spec, quota, gangs.try_place(cluster, spec, policy, now)) or on_trial
    emit_gang_placement(decision, cluster, spec, placed, from_queue, tuple(p.spec.pod_id for p, _ in victims))
    decision.then(AFTER_PREEMPTION, cluster, victims)
    return True


def _inside_nominal(
    cluster: ClusterState, spec: GangSpec, quota: Quota, found: gangs.GangPlacement | tuple[QueueReason, ...]
) -> gangs.GangPlacement | None:
    """The placement (or the most of it its quota has room for) if it runs inside the tenant's nominal quota."""
    if not isinstance(found, gangs.GangPlacement):
        return None
    admitted = _admitted(cluster, spec, found)
    if admitted is None or quotas.would_borrow(cluster, spec.tenant, _gang_demand(cluster, quota, admitted), []):
        return None
    return admitted


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
            taken = reclaim.reclaim_on_trial(
                cluster, trial, spec.tenant, quota, wanted, decision.evicted_in(cluster), priority=spec.priority
            )
            if taken is None:
                return False
            if not taken:
                break
            units.extend(taken)
        else:
            return False
    finally:
        trial.rollback()
    on_trial = found  # where the gang went with every unit taken evicted on trial
    victims = victim_events(decision, cluster, spec.gang_id, "gang", units, "reclaim")
    found = gangs.try_place(cluster, spec, policy, decision.now)
    if not isinstance(found, gangs.GangPlacement):
        found = on_trial  # a policy that draws from the folded state may draw otherwise now (as above)
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
    if not decision.legacy_gangs and len(found.placed) < len(spec.members):
        _queue_waiting_members(decision, cluster, spec, found)
        if cluster.quotas_on:  # a member its quota had no room for on the model it was tried on may fit another
            decision.then(RETRY_QUEUE, cluster, (), {spec.tenant})


def _queue_waiting_members(
    decision: Decision, cluster: ClusterState, spec: GangSpec, found: gangs.GangPlacement
) -> None:
    """The members that did not start with their gang wait in the queue as its members (contract v4; before, they
    were dropped): each ``PodQueued`` says so, and why it does not fit now; a member of a gang placed in a
    topology domain waits for a node of that domain. O(M) plus each member's reasons."""
    started = {member.pod_id for member, _ in found.placed}
    key, domain = found.topology_key, found.domain
    head = (
        f"member of gang {spec.gang_id!r}, which started with {len(started)} of {len(spec.members)} members "
        f"(min_members {spec.min_members}): it starts when it fits"
    )
    if key is not None:
        head += f" on a node of {key}={domain}"
    quota = quotas.quota_of(cluster, spec.tenant) if cluster.quotas_on else None
    for member in spec.members:
        if member.pod_id in started:
            continue
        waiting = member if key is None else _in_domain(member, key, domain)  # type: ignore[arg-type]
        decision.emit(PodQueued(waiting, _waiting_reasons(cluster, waiting, head, quota), False), cluster.name)


def _waiting_reasons(
    cluster: ClusterState, waiting: PodSpec, head: str, quota: Quota | None
) -> tuple[QueueReason, ...]:
    """Why a member waits while its gang runs: ``GANG_MEMBER_WAITING`` (``head``, and its role), then its quota's
    shortfall if any, then the per-node reasons."""
    shape = shape_of(waiting)
    words = head if waiting.role is None else f"{head} (role {waiting.role!r})"
    reasons: tuple[QueueReason, ...] = (QueueReason(QueueReasonCode.GANG_MEMBER_WAITING, 0, words),)
    if quota is not None:
        admission = quotas.admit(cluster, waiting, shape)
        if admission.shortfalls:
            words = quotas.shortfall_words(admission.shortfalls)
            reasons += (QueueReason(QueueReasonCode.QUOTA_EXCEEDED, 0, words),)
    return reasons + queue_reasons(cluster, shape)


def _in_domain(member: PodSpec, key: str, domain: str) -> PodSpec:
    """The member kept to its gang's topology domain (a node selector on the domain's label)."""
    selector = dict(member.node_selector)
    selector[key] = domain
    return dataclasses.replace(member, node_selector=dict(sorted(selector.items())))


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
    """Whether at least min_members of the gang (and each role's ``min_members_per_role``) still run after some
    were evicted."""
    if not gang.spec.min_members_per_role:
        still = sum(1 for pod_id in gang.placed if cluster.pods[pod_id].running)
        return still >= gang.spec.min_members
    return gangs.enough(gang.spec, [cluster.pods[p].spec for p in gang.placed if cluster.pods[p].running])


def gang_ends_lost_members(decision: Decision, cluster: ClusterState, gang: Gang, reason: str) -> Task:
    """The gang runs on: each evicted member ends (its dependants are woken); a member of a ``disruption:
    above_min`` gang (contract v4) waits again as a member instead, and starts when it fits."""
    lost = [pod_id for pod_id in gang.placed if not cluster.pods[pod_id].running]
    if gang.spec.disruption == DISRUPT_ABOVE_MIN and not decision.legacy_gangs:
        _members_wait_again(decision, cluster, gang, sorted(lost), reason)
        return
    for pod_id in sorted(lost):  # measure: the lost members left
        decision.emit(PodReleased(pod_id, None, EVICTED_MEMBER + reason), cluster.name)
        decision.then(WAKE_DEPENDANTS, cluster, pod_id)
        yield  # the member's dependants before the next member


def _members_wait_again(decision: Decision, cluster: ClusterState, gang: Gang, lost: list[str], reason: str) -> None:
    """Members of an above_min gang taken alone (preemption, drain, failure, removal, a ``NoExecute`` taint) while
    the gang keeps ``min_members`` and each role's minimum: each waits in the queue as a member of the running gang
    (``PodQueued``, requeued, ``GANG_MEMBER_WAITING`` first), kept to the gang's topology domain, and starts when
    it fits, as members that did not fit at admission do; it has not ended, so no dependant is woken. O(L) plus
    each member's reasons."""
    spec = gang.spec
    runs = len(gang.placed) - len(lost)
    head = (
        f"member of gang {gang.gang_id!r}, taken alone ({reason}) while the gang runs on with {runs} of "
        f"{len(spec.members)} members (disruption above_min, min_members {spec.min_members}): it starts when it fits"
    )
    quota = quotas.quota_of(cluster, spec.tenant) if cluster.quotas_on else None
    key, domain = gang.topology_key, gang.domain
    for pod_id in lost:
        member = cluster.pods[pod_id].spec
        waiting = member if key is None or domain is None else _in_domain(member, key, domain)
        reasons = _waiting_reasons(cluster, waiting, head, quota)
        decision.emit(PodQueued(waiting, reasons, True), cluster.name)


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
    # has room), else it may still reclaim or preempt like any queued gang. Since contract v4 its timeout
    # counts from now: it limits waiting, and the gang did not wait while it ran.
    spec = gang.spec if decision.legacy_gangs else dataclasses.replace(gang.spec, queued_at=decision.now)
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
    elif spec.preemption in PREEMPTING and decision.may_preempt:
        place_gang(decision, cluster, spec, from_queue=True, requeued=True, announce=False)
    decision.then(RETRY_QUEUE, cluster, tuple(n for n in dict.fromkeys(freed) if n is not None), None)
