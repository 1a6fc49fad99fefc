"""Jobs that wait for others (``depends_on``), as events: held outside the queue, or failed for good.

What a job still waits for and the cycle a submission would close: :mod:`processor.core.dependencies`.
Starting the jobs whose dependencies ended is follow-up work
(:data:`~processor.core.decision.WAKE_DEPENDANTS`, in :mod:`.rescheduling`).
"""

from __future__ import annotations

from processor.core import dependencies
from processor.core.decision import WAKE_DEPENDANTS, Decision
from processor.core.state import ClusterState, lookup
from schemas.codes import QueueReasonCode
from schemas.events import (
    DependencyFailed,
    GangQueued,
    GangReleased,
    GangSpec,
    PodQueued,
    PodReleased,
    PodSpec,
    QueueReason,
)


def hold_new_job(decision: Decision, cluster: ClusterState, spec: PodSpec | GangSpec) -> bool:
    """A new job with dependencies: failed or held to wait (True), or free to go to placement (False). O(d)."""
    kind, job_id = ("pod", spec.pod_id) if isinstance(spec, PodSpec) else ("gang", spec.gang_id)
    live = not decision.legacy_gangs
    failed = dependencies.failed_dependency(cluster, spec.depends_on, spec.dependency, live)
    if failed is not None:
        fail_dependant(decision, cluster, job_id, kind, failed, spec)
        return True
    waiting = dependencies.unmet(cluster, spec.depends_on, live)
    if waiting:
        reason = dependencies.waiting_reason(waiting, spec.dependency)
        if isinstance(spec, PodSpec):
            decision.emit(PodQueued(spec, (reason,), False, waiting), cluster.name)
        else:
            decision.emit(GangQueued(spec.gang_id, (reason,), spec, False, waiting), cluster.name)
        return True
    return False


def fail_dependant(
    decision: Decision, cluster: ClusterState, job_id: str, kind: str, failed: str, spec: PodSpec | GangSpec
) -> None:
    """An afterok dependency ended without success: the job will never start; its own dependants are next."""
    message = f"{kind} {job_id!r} will not start: its afterok dependency {failed!r} ended without success"
    known = lookup(cluster.pods, job_id) if kind == "pod" else cluster.gangs.get(job_id)
    if known is None:  # a new submission: it enters the fold waiting, then fails at once
        waiting = QueueReason(QueueReasonCode.WAITING_FOR_DEPENDENCY, 0, message)
        if isinstance(spec, PodSpec):
            decision.emit(PodQueued(spec, (waiting,), False, (failed,)), cluster.name)
        else:
            decision.emit(GangQueued(job_id, (waiting,), spec, False, (failed,)), cluster.name)
    decision.emit(DependencyFailed(job_id, kind, failed, message), cluster.name)
    if kind == "pod":
        decision.emit(PodReleased(job_id, None, "dependency_failed"), cluster.name)
    else:
        members = () if decision.legacy_gangs else tuple(member.pod_id for member in spec.members)  # type: ignore[union-attr]
        decision.emit(GangReleased(job_id, "dependency_failed", False, members), cluster.name)
        decision.then(WAKE_DEPENDANTS, cluster, job_id)
        for member_id in members:  # then its members' dependants
            decision.then(WAKE_DEPENDANTS, cluster, member_id)
        return
    decision.then(WAKE_DEPENDANTS, cluster, job_id)
