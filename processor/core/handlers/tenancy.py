"""A cluster's settings, its tenants' quotas and the cohort tree: ``SetPolicy``, ``SetQuota``, ``RemoveQuota``,
``SetCohort``, ``RemoveCohort``.

A change that lets queued work start (more quota, a cohort that lends more, leaving strict FIFO)
leaves the queue to retry that work on the whole cluster.
"""

from __future__ import annotations

from processor.core import cohort_tree, quotas
from processor.core.decision import RETRY_QUEUE, Decision, Task
from processor.core.state import ClusterState
from schemas.codes import Rejected, RejectionCode
from schemas.commands import (
    MAX_COHORT_DEPTH,
    STRICT_FIFO,
    RemoveCohort,
    RemoveQuota,
    SetCohort,
    SetPolicy,
    SetQuota,
)
from schemas.events import CohortChanged, PolicyChanged, QuotaChanged
from schemas.validation import check_id, check_remove_quota, check_set_cohort, check_set_policy, check_set_quota


def set_policy(decision: Decision, command: SetPolicy) -> Task:
    check_set_policy(command)
    if command.default_quota is not None:
        _check_weight(decision, command.default_quota.weight)
    cluster = decision.cluster
    was_strict = cluster.queue_order == STRICT_FIFO
    decision.emit(
        PolicyChanged(
            command.policy or cluster.policy,
            cluster.policy,
            command.reserve_after_ms,
            command.queue_order,
            command.max_clock_jump_ms,
        )
    )
    if command.default_quota is not None:
        quota = None if command.default_quota.limits_nothing else command.default_quota
        cluster = decision.cluster
        previous = cluster.default_quota
        words = quotas.describe(quota) if quota is not None else "none: tenants without a quota are not limited"
        decision.emit(
            QuotaChanged(None, quota, previous, f"default quota of tenants without their own: {words}"),
        )
        affected = {tenant for tenant in _queued_tenants(cluster) if tenant not in cluster.quotas}
        decision.then(RETRY_QUEUE, cluster, (), affected)
        yield  # that work starts before leaving strict FIFO looks at the queue again
    cluster = decision.cluster
    if was_strict and cluster.queue_order != STRICT_FIFO:
        # Strict FIFO kept fitting work behind the head; every queued tenant's work may start now.
        decision.then(RETRY_QUEUE, cluster, (), _queued_tenants(cluster))


def _queued_tenants(cluster: ClusterState) -> set[str]:
    """Tenants with pods or gangs in the queue. O(Q + G)."""
    tenants = {group[0] for _, group in cluster.queue.heads()}
    tenants.update(cluster.gangs[key[2]].spec.tenant for key in cluster.gang_queue)
    return tenants


def set_quota(decision: Decision, command: SetQuota) -> None:
    check_set_quota(command)
    _check_weight(decision, command.weight)
    cluster = decision.cluster
    quota = command.quota()
    previous = cluster.quotas.get(command.tenant)
    notes = []
    if quota.cohort is not None and quota.cohort not in cluster.cohorts:
        notes.append(f"cohort {quota.cohort!r} is new: it starts with this tenant")
    over = quotas.over_limit(cluster, command.tenant, quota)
    if over:
        notes.append(
            f"it runs more than this allows on {', '.join(over)}: nothing is evicted, its new work waits until it is "
            "back under"
        )
    message = f"tenant {command.tenant!r}: {quotas.describe(quota)}" + "".join(f"; {note}" for note in notes)
    decision.emit(QuotaChanged(command.tenant, quota, previous, message))
    cluster = decision.cluster
    decision.then(RETRY_QUEUE, cluster, (), quotas.with_peers(cluster, {command.tenant}, previous))


def _check_weight(decision: Decision, weight: int) -> None:
    """Weight 0 is contract v4's (capacity only when no one else wants it); v1, v2 and v3 refused it, so their logs
    replay as they were."""
    if weight == 0 and decision.legacy_gangs:
        raise Rejected(RejectionCode.INVALID_RESOURCES, f"quota weight must be between 1 and 1000, got {weight}")


def remove_quota(decision: Decision, command: RemoveQuota) -> None:
    check_remove_quota(command)
    cluster = decision.cluster
    previous = cluster.quotas.get(command.tenant)
    if previous is None:
        raise Rejected(
            RejectionCode.UNKNOWN_QUOTA,
            f"tenant {command.tenant!r} has no quota of its own in cluster {decision.command.cluster!r}",
        )
    fallback = quotas.describe(cluster.default_quota) if cluster.default_quota is not None else "none: not limited"
    decision.emit(
        QuotaChanged(
            command.tenant, None, previous, f"tenant {command.tenant!r} falls back to the default quota: {fallback}"
        )
    )
    decision.then(RETRY_QUEUE, cluster, (), quotas.with_peers(cluster, {command.tenant}, previous))


def set_cohort(decision: Decision, command: SetCohort) -> None:
    """Declare or change a cohort of the tree. Its parent may be a cohort nobody declared (a root with nothing
    of its own, as a tenant's cohort is). Refused: a parent that is the cohort or below it (COHORT_CYCLE), a path
    from a root down longer than MAX_COHORT_DEPTH cohorts (COHORT_TOO_DEEP). Lowering a cohort's quota evicts
    nothing: new work waits, as when a tenant's quota is lowered."""
    check_set_cohort(command)
    cluster = decision.cluster
    spec = command.spec()
    specs = cluster.cohort_specs
    above: list[str] = []
    if spec.parent is not None:
        above = cohort_tree.ancestors(specs, spec.parent)
        if command.cohort in above:
            path = " -> ".join(reversed(above[: above.index(command.cohort) + 1]))
            raise Rejected(
                RejectionCode.COHORT_CYCLE,
                f"cohort {command.cohort!r} cannot have parent {spec.parent!r}: {spec.parent!r} is below it "
                f"({path}), so the tree would have a cycle",
            )
    below = cohort_tree.height(cluster.cohort_children, command.cohort, MAX_COHORT_DEPTH)
    if len(above) + below > MAX_COHORT_DEPTH:
        raise Rejected(
            RejectionCode.COHORT_TOO_DEEP,
            f"cohort {command.cohort!r} under {spec.parent!r} would make a path of {len(above) + below} cohorts "
            f"from a root down; at most {MAX_COHORT_DEPTH}",
        )
    previous = specs.get(command.cohort)
    before = quotas.tree_tenants(cluster, command.cohort)
    decision.emit(CohortChanged(command.cohort, spec, previous, quotas.describe_cohort(cluster, spec)))
    cluster = decision.cluster
    before.update(quotas.tree_tenants(cluster, command.cohort))
    decision.then(RETRY_QUEUE, cluster, (), before)


def remove_cohort(decision: Decision, command: RemoveCohort) -> None:
    """Forget a cohort's declaration: its own quota, its parent and its limits. Refused while cohorts name it as
    their parent (COHORT_IN_USE: move or remove them first). Its tenants stay in it, a flat cohort of what they
    lend; nothing is evicted."""
    check_id("cohort", command.cohort)
    cluster = decision.cluster
    previous = cluster.cohort_specs.get(command.cohort)
    if previous is None:
        raise Rejected(
            RejectionCode.UNKNOWN_COHORT,
            f"cohort {command.cohort!r} was not declared (SetCohort) in cluster {decision.command.cluster!r}",
        )
    children = cluster.cohort_children.get(command.cohort, [])
    if children:
        raise Rejected(
            RejectionCode.COHORT_IN_USE,
            f"cohort {command.cohort!r} is the parent of {', '.join(repr(c) for c in children)}: move or remove "
            "them first",
        )
    affected = quotas.tree_tenants(cluster, command.cohort)
    members = len(cluster.cohorts.get(command.cohort, ()))
    message = f"cohort {command.cohort!r} removed" + (
        f"; its {members} tenant(s) stay in it as a flat cohort of what they lend" if members else ""
    )
    decision.emit(CohortChanged(command.cohort, None, previous, message))
    decision.then(RETRY_QUEUE, decision.cluster, (), affected)
