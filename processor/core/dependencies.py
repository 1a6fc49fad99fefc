"""Job dependencies: what a pod or gang still waits for, and the cycles a submission would close.

A job's ``depends_on`` names pods or gangs, submitted or not yet (a workflow may
arrive in any order). A dependency is met once a job with that id has ended
(``ClusterState.ended``, a bounded window of recent ends): for ``afterany`` in any
way, for ``afterok`` normally (released while running with reason ``completed``).
A job whose afterok dependency ended otherwise never starts (``DependencyFailed``).

Which incarnation a dependency binds to (contract v4): an id may be used again once its job ended. A
dependency names the job with that id that is in the cluster when the dependant is submitted (and is
rechecked), else the latest one that ended; so a dependant of a reused id waits for the new job, never fails
for the old one. Every dependant ends: a gang that ends without running ends its members too
(``GangReleased.members_ended``), so jobs that waited for a member are failed (afterok) or started (afterany).

Cycle detection is incremental: a new submission can only close a cycle if some job
already waits for it (an edge into it), and only through jobs that are still waiting.
So a job nothing waits for yet (a workflow submitted in order: the common case) is
checked in O(ids); otherwise the search walks from its dependencies through waiting
jobs only, never the whole graph: O(W) for the W waiting jobs reachable from them.
"""

from __future__ import annotations

from collections.abc import Iterable

from processor.core.state import GANG_WAITING, ClusterState, lookup
from schemas.codes import QueueReasonCode
from schemas.commands import AFTER_OK
from schemas.events import QueueReason


def live(cluster: ClusterState, job_id: str) -> bool:
    """Whether a pod or gang with this id is in the cluster now (waiting, queued or running; a gang's member
    while its gang is). O(1)."""
    return job_id in cluster.pods or job_id in cluster.gangs or job_id in cluster.member_of


def unmet(cluster: ClusterState, depends_on: Iterable[str], bind_live: bool = False) -> tuple[str, ...]:
    """The dependencies that have not ended yet, sorted. ``bind_live`` (contract v4): an id in use now is the
    incarnation a dependency binds to, whatever an earlier job of that id did. O(d)."""
    ended = cluster.ended
    return tuple(
        sorted({job_id for job_id in depends_on if job_id not in ended or (bind_live and live(cluster, job_id))})
    )


def waiting_reason(waiting: tuple[str, ...], dependency: str) -> QueueReason:
    """Why a job is outside the placement queue, in words: what it waits for."""
    ends = "ends" if len(waiting) == 1 else "end"
    return QueueReason(
        QueueReasonCode.WAITING_FOR_DEPENDENCY, 0, f"starts after {', '.join(waiting)} {ends} ({dependency})"
    )


def failed_dependency(
    cluster: ClusterState, depends_on: Iterable[str], dependency: str, bind_live: bool = False
) -> str | None:
    """For ``afterok``, the first dependency (by id) that ended without success; None otherwise. ``bind_live``
    as in :func:`unmet`: a reused id in use now has not ended. O(d)."""
    if dependency != AFTER_OK:
        return None
    for job_id in sorted(set(depends_on)):
        if cluster.ended.get(job_id) is False and not (bind_live and live(cluster, job_id)):
            return job_id
    return None


def _waiting_edges(cluster: ClusterState, job_id: str) -> tuple[str, ...]:
    """What a still-waiting job (pod, gang, or a member of a waiting gang) waits for; () if it waits for nothing."""
    pod = lookup(cluster.pods, job_id)
    if pod is not None:
        return pod.waiting_for if not pod.queued and not pod.running else ()
    gang_id = cluster.member_of.get(job_id, job_id)
    gang = cluster.gangs.get(gang_id)
    if gang is not None and gang.state == GANG_WAITING:
        return gang.waiting_for
    return ()


def find_cycle(cluster: ClusterState, own_ids: tuple[str, ...], depends_on: Iterable[str]) -> list[str] | None:
    """The cycle a new job (known by ``own_ids``: its id, and its members' for a gang) would close, or None.

    Returned as a path ``[new job, dependency, ..., job that waits for the new one, new job's id]`` for
    the rejection message. Only dependencies not ended yet can lead back: an ended job waits for nothing.
    """
    if not any(job_id in cluster.dependants for job_id in own_ids):
        return None  # nothing waits for the new job yet: no edge leads back to it (a chain built in order: O(1))
    targets = set(own_ids)
    parent: dict[str, str] = {}
    stack: list[str] = []
    for job_id in dict.fromkeys(depends_on):
        if job_id in targets:
            return [own_ids[0], job_id]
        if job_id not in parent and job_id not in cluster.ended:
            parent[job_id] = ""
            stack.append(job_id)
    while stack:
        job_id = stack.pop()
        for following in _waiting_edges(cluster, job_id):
            if following in cluster.ended:
                continue  # met already: not an edge any more
            if following in targets:
                chain = [job_id]
                while parent[chain[-1]]:
                    chain.append(parent[chain[-1]])
                return [own_ids[0], *reversed(chain), following]
            if following not in parent:
                parent[following] = job_id
                stack.append(following)
    return None
