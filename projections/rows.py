"""The rows an event creates: a pod's and a gang's, in the columns of ``models.pods`` and ``models.gangs``."""

from __future__ import annotations

from typing import Any

from schemas.events import GangSpec, PodSpec


def pod_row(cluster: str, spec: PodSpec, sequence: int) -> dict[str, Any]:
    """A submitted pod's row; the event that creates it sets its status."""
    return {
        "cluster": cluster,
        "pod_id": spec.pod_id,
        "tenant": spec.tenant,
        "priority": spec.priority,
        "num_gpu": spec.num_gpu,
        "gpu_milli": spec.gpu_milli,
        "cpu_milli": spec.cpu_milli,
        "memory_mib": spec.memory_mib,
        "gpu_models": list(spec.gpu_models),
        "arrival": spec.arrival,
        "status": None,  # set by the event that creates the row
        "node_id": None,
        "gpus": [],
        "reasons": [],
        "submitted_at": spec.submitted_at,
        "queued_at": None,
        "scheduled_at": None,
        "ended_at": None,
        "end_reason": None,
        "updated_sequence": sequence,
    }


def gang_row(cluster: str, spec: GangSpec, sequence: int) -> dict[str, Any]:
    """A submitted gang's row, pending."""
    return {
        "cluster": cluster,
        "gang_id": spec.gang_id,
        "tenant": spec.tenant,
        "priority": spec.priority,
        "arrival": spec.arrival,
        "members": [member_row(m) for m in spec.members],
        "min_members": spec.min_members,
        "topology_required": spec.topology_required,
        "topology_preferred": spec.topology_preferred,
        "time_limit_ms": spec.time_limit_ms,
        "timeout_ms": spec.timeout_ms,
        "depends_on": list(spec.depends_on),
        "status": "pending",
        "waiting_for": [],
        "reasons": [],
        "placed": [],
        "topology_key": None,
        "domain": None,
        "submitted_at": spec.submitted_at,
        "queued_at": None,
        "started_at": None,
        "ended_at": None,
        "end_reason": None,
        "ended_ok": None,
        "updated_sequence": sequence,
    }


def member_row(spec: PodSpec) -> dict[str, Any]:
    """A gang member, as the gang's ``members`` column holds it."""
    return {
        "pod_id": spec.pod_id,
        "num_gpu": spec.num_gpu,
        "gpu_milli": spec.gpu_milli,
        "cpu_milli": spec.cpu_milli,
        "memory_mib": spec.memory_mib,
    }
