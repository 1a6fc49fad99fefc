"""Jobs going (back) to placement: the evicted, the victims of a preemption, and the dependants whose
dependencies ended. Each is follow-up work (:mod:`processor.core.decision`), run in the order it was left.
"""

from __future__ import annotations

from processor.core import dependencies
from processor.core.decision import AFTER_EVICTION, RETRY_QUEUE, Decision, Task
from processor.core.handlers.dependants import fail_dependant
from processor.core.handlers.gangs import (
    gang_ends_lost_members,
    gang_evict_members,
    gang_keeps_running,
    gang_lost_members,
    gang_placed_back,
    place_gang,
)
from processor.core.handlers.pods import place
from processor.core.pending import QueueKey
from processor.core.state import GANG_WAITING, ClusterState, Pod, QueueGroup, lookup
from schemas.commands import PREEMPT_LOWER_OR_NEWER
from schemas.events import PodQueued, QueueReason


def after_eviction(
    decision: Decision, cluster: ClusterState, evicted: list[Pod], gang_ids: list[str], reason: str
) -> Task:
    """The evicted go back to placement, then their tenants' work (with quotas: their quota has room again).
    O(E) placements for E evicted; a pod alike the last one that did not start is queued in O(1) (``_place_back``).

    Contract v3: gangs and plain pods together in queue order (priority first), so a pod placed back is never
    one a later, higher-priority one would have preempted (it may not: one eviction per pod per command).
    v1 and v2: the gangs first, then the plain pods in queue order, as they were released."""
    if decision.legacy:
        for gang_id in gang_ids:  # measure: the gangs left
            yield from gang_lost_members(decision, cluster, cluster.gangs[gang_id], reason)
            yield  # what the gang set off, before the next gang
        failed = _Failed()
        for pod in sorted(evicted, key=lambda p: p.queue_key):  # measure: the pods left
            _place_back(decision, cluster, pod, failed)
            yield  # what its placement set off (its own victims), before the next pod
    else:
        # First every gang takes its loss (runs on without the lost members, or has them all evicted) ...
        jobs: list[tuple[QueueKey, int, int, list[str | None]]] = []
        for i, gang_id in enumerate(gang_ids):  # measure: the gangs left
            gang = cluster.gangs[gang_id]
            if gang_keeps_running(gang, cluster):
                yield from gang_ends_lost_members(decision, cluster, gang, reason)
                yield  # what the gang's lost members set off, before the next gang
            else:
                jobs.append((gang.key, 0, i, gang_evict_members(decision, cluster, gang, reason)))
        # ... then the evicted gangs and pods are placed back in queue order.
        jobs += [(pod.queue_key, 1, i, []) for i, pod in enumerate(evicted)]
        jobs.sort()  # (kind, i) is unique: the order of (key, kind, i), never comparing the lists
        failed = _Failed()
        for _, kind, i, freed in jobs:  # measure: the jobs left
            if kind == 0:
                gang_placed_back(decision, cluster, cluster.gangs[gang_ids[i]], freed)
            else:
                _place_back(decision, cluster, evicted[i], failed)
            yield  # what the job set off (its own victims), before the next one
    decision.then(RETRY_QUEUE, cluster, (), None)


class _Failed:
    """The last evicted pod placed back that did not start: its group and priority, its reasons, and how many
    events the command had then."""

    __slots__ = ("events", "key", "reasons")

    def __init__(self) -> None:
        self.key: tuple[QueueGroup, int] | None = None
        self.reasons: tuple[QueueReason, ...] = ()
        self.events = -1


def _place_back(decision: Decision, cluster: ClusterState, pod: Pod, failed: _Failed) -> None:
    """Place an evicted pod back (``place``), or queue it at once if it is the like of the last one, which did
    not start, and nothing happened since.

    Pods of one queue group are interchangeable for placement (``state.QueueGroup``): with the same priority,
    no event since (the state is the same but for that pod's own ``PodQueued``), no quota, no reservation and
    no ``lower_or_newer_equal_priority`` (whose victims depend on the pod's arrival), ``place`` would find
    the same: no room, no victims, the same reasons. O(1) then instead of a placement: after a mass eviction
    (a gang's victims, a drain) most of the evicted are alike and the cluster is full."""
    spec = pod.spec
    key = (pod.group, spec.priority)
    if failed.key == key and failed.events == len(decision.events):
        decision.emit(PodQueued(spec, failed.reasons, True), cluster.name)
        failed.events = len(decision.events)
        return
    failed.key = None
    if place(decision, cluster, spec, pod.shape, from_queue=False, requeued=True):
        return
    last = decision.events[-1].payload if decision.events else None
    alike = not cluster.quotas_on and cluster.reservation is None and spec.preemption != PREEMPT_LOWER_OR_NEWER
    if alike and isinstance(last, PodQueued) and last.pod is spec and not last.waiting_for:
        failed.key, failed.reasons, failed.events = key, last.reasons, len(decision.events)


def after_preemption(decision: Decision, cluster: ClusterState, victims: list[tuple[Pod, str]]) -> None:
    """Victims back to placement (gangs first, as after any eviction), then what they freed to the queue."""
    plain = [pod for pod, _ in victims if pod.spec.gang_id is None]
    gang_ids = sorted({pod.spec.gang_id for pod, _ in victims if pod.spec.gang_id is not None})
    decision.then(AFTER_EVICTION, cluster, plain, [g for g in gang_ids if g in cluster.gangs], "preempted")
    decision.then(RETRY_QUEUE, cluster, tuple(sorted({node_id for _, node_id in victims})), None)


def wake_dependants(decision: Decision, cluster: ClusterState, job_id: str) -> Task | None:
    """After ``job_id`` ended: fail its afterok dependants if it ended badly, start those with nothing left."""
    waiters = cluster.dependants.get(job_id) if cluster.dependants else None
    if not waiters:
        return None
    return _recheck_all(decision, cluster, sorted(waiters))


def _recheck_all(decision: Decision, cluster: ClusterState, waiters: list[str]) -> Task:
    for waiter in waiters:  # measure: the waiters left
        _recheck(decision, cluster, waiter)
        yield  # what it set off (a failure cascades to its own dependants) before the next waiter


def _recheck(decision: Decision, cluster: ClusterState, waiter: str) -> None:
    live = not decision.legacy_gangs  # contract v4: a dependency binds to the live incarnation of a reused id
    pod = lookup(cluster.pods, waiter)
    if pod is not None and not pod.queued and not pod.running:
        spec = pod.spec
        failed = dependencies.failed_dependency(cluster, spec.depends_on, spec.dependency, live)
        if failed is not None:
            fail_dependant(decision, cluster, waiter, "pod", failed, spec)
        elif not dependencies.unmet(cluster, spec.depends_on, live):
            place(decision, cluster, spec, pod.shape, from_queue=True, requeued=False, new=True, announce=True)
        return
    gang = cluster.gangs.get(waiter)
    if gang is not None and gang.state == GANG_WAITING:
        failed = dependencies.failed_dependency(cluster, gang.spec.depends_on, gang.spec.dependency, live)
        if failed is not None:
            fail_dependant(decision, cluster, waiter, "gang", failed, gang.spec)
        elif not dependencies.unmet(cluster, gang.spec.depends_on, live):
            place_gang(decision, cluster, gang.spec, from_queue=True, requeued=False, new=True, announce=True)
