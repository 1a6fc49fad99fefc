"""Jobs going (back) to placement: the evicted, the victims of a preemption, and the dependants whose
dependencies ended. Each is follow-up work (:mod:`processor.core.decision`), run in the order it was left.
"""

from __future__ import annotations

from processor.core import dependencies
from processor.core.decision import AFTER_EVICTION, RETRY_QUEUE, Decision, Task
from processor.core.handlers.dependants import fail_dependant
from processor.core.handlers.gangs import gang_lost_members, place_gang
from processor.core.handlers.pods import place
from processor.core.state import GANG_WAITING, ClusterState, Pod, lookup


def after_eviction(
    decision: Decision, cluster: ClusterState, evicted: list[Pod], gang_ids: list[str], reason: str
) -> Task:
    """Gangs hit by an eviction, then the evicted plain pods (queue order), go back to placement; then
    their tenants' work (with quotas: their quota has room again). O(E) placements for E evicted."""
    for gang_id in gang_ids:  # measure: the gangs left
        yield from gang_lost_members(decision, cluster, cluster.gangs[gang_id], reason)
        yield  # what the gang set off, before the next gang
    for pod in sorted(evicted, key=lambda p: p.queue_key):  # measure: the pods left
        place(decision, cluster, pod.spec, pod.shape, from_queue=False, requeued=True)
        yield  # what its placement set off (its own victims), before the next pod
    decision.then(RETRY_QUEUE, cluster, (), None)


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
    live = not decision.legacy  # contract v3: a dependency binds to the live incarnation of a reused id
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
