"""Checks a submission passes before its first event (they raise :class:`~schemas.codes.Rejected`)."""

from __future__ import annotations

from processor.core import dependencies
from processor.core.state import ClusterState
from schemas.codes import Rejected, RejectionCode


def check_new_job_ids(cluster: ClusterState, name: str, ids: tuple[str, ...], what: str) -> None:
    """No present pod or gang has any of these ids. O(ids)."""
    for job_id in ids:
        if cluster.job_exists(job_id):
            code = RejectionCode.DUPLICATE_GANG if what == "gang" else RejectionCode.DUPLICATE_POD
            raise Rejected(code, f"{what} id {job_id!r} is already taken by a pod or gang in cluster {name!r}")


def check_models(cluster: ClusterState, name: str, models: tuple[str, ...]) -> None:
    """Some node present has one of the GPU models (none asked: any will do). O(models)."""
    if models and not any(cluster.model_nodes.get(model) for model in models):
        known = sorted(model for model, count in cluster.model_nodes.items() if count and model)
        raise Rejected(
            RejectionCode.UNKNOWN_GPU_MODEL,
            f"no node in cluster {name!r} has GPU model {' or '.join(models)}; known: {known}",
        )


def check_no_cycle(cluster: ClusterState, ids: tuple[str, ...], depends_on: tuple[str, ...]) -> None:
    """The job's dependencies do not lead back to it (``dependencies.find_cycle``: O(W) waiting jobs)."""
    cycle = dependencies.find_cycle(cluster, ids, depends_on)
    if cycle is not None:
        raise Rejected(
            RejectionCode.DEPENDENCY_CYCLE,
            f"{ids[0]!r} would close the dependency cycle {' -> '.join(cycle)}: none of them could ever start",
        )
