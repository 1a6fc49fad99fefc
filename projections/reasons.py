"""Queue reasons as the projection stores them: as of the moment a pod was queued, worded for people.

``PodQueued.reasons`` are computed once, when the pod is queued; the fold does not rewrite them
when capacity changes later. So the read side labels them ``reasons_when_queued`` with the time
they were computed, fills an empty ``message`` from the code, and points to the live replica's
``explain`` (``GET /v1/clusters/{cluster}/pods/{pod_id}/explain``) for the reasons *now*.
"""

from __future__ import annotations

from typing import Any

from schemas.codes import QueueReasonCode

EXPLAIN_HINT = (
    "reasons as computed when each pod was queued; why it waits now: GET /v1/clusters/{cluster}/pods/{pod_id}/explain"
)

_TEXT = {
    QueueReasonCode.NO_NODES: "the cluster had no nodes",
    QueueReasonCode.NODE_UNSCHEDULABLE: "{n} cordoned or failed",
    QueueReasonCode.GPU_MODEL_MISMATCH: "{n} of a GPU model the pod does not allow",
    QueueReasonCode.NODE_SELECTOR_MISMATCH: "{n} without the labels of the pod's node selector",
    QueueReasonCode.UNTOLERATED_TAINT: "{n} with a taint the pod does not tolerate",
    QueueReasonCode.INSUFFICIENT_GPU: "{n} without enough whole free GPUs",
    QueueReasonCode.INSUFFICIENT_GPU_SHARE: "{n} with no GPU that had the share free",
    QueueReasonCode.INSUFFICIENT_CPU: "{n} without enough free CPU",
    QueueReasonCode.INSUFFICIENT_MEMORY: "{n} without enough free memory",
}


def worded(reasons: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stored reasons with an empty message filled in from the code and node count."""
    out = []
    for reason in reasons:
        code, nodes = reason.get("code", ""), int(reason.get("nodes", 0))
        message = reason.get("message") or _TEXT.get(code, "{n}: " + code).format(
            n=f"{nodes} node{'s' if nodes != 1 else ''}"
        )
        out.append({"code": code, "nodes": nodes, "message": message})
    return out
