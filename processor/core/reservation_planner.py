"""Where a reservation goes: the nodes where the head of the queue will start soonest.

Slurm's backfill rule, on the fold's state: running pods end at ``started_at +
time_limit_ms``. The planner frees them on trial in order of end time (the
capacity index follows each step), and after each step where a node changed asks
whether the holder fits now; the first time it does is the expected start, and the
nodes it would use there are reserved. If it only fits once pods without a time
limit end too (they are freed oldest first), the nodes are reserved with an unknown
start. Everything freed on trial is allocated back before returning: the state is
left exactly as it was.

Cost: O(P log P) for the P running pods, plus one fit check per changed node and
a placement (a gang trial) only at steps where one could succeed. It runs when a
reservation is made, not per command.
"""

from __future__ import annotations

from processor.core import gangs
from processor.core.policies.base import Policy
from processor.core.state import ClusterState, Pod


def _holder_nodes(cluster: ClusterState, holder_id: str, kind: str, policy: Policy, now: int) -> tuple[str, ...] | None:
    """The nodes the holder would use if it were placed now, or None."""
    if kind == "pod":
        pod = cluster.pods[holder_id]
        groups = cluster.index.feasible(pod.shape)
        if not groups:
            return None
        return (policy.place(cluster, pod.shape, groups).node_id,)
    found = gangs.try_place(cluster, cluster.gangs[holder_id].spec, policy, now)
    if not isinstance(found, gangs.GangPlacement):
        return None
    return tuple(sorted({choice.node_id for _, choice in found.placed}))


def _may_fit_on(cluster: ClusterState, holder_id: str, kind: str, node_ids: list[str], now: int) -> bool:
    signatures = [s for s in map(cluster.index.signature_of, node_ids) if s is not None]
    if not signatures:
        return False
    if kind == "pod":
        shape = cluster.pods[holder_id].shape
        return any(cluster.index.fits(signature, shape) for signature in signatures)
    return gangs.may_use(cluster, cluster.gangs[holder_id].spec, signatures, now)


def plan(
    cluster: ClusterState, holder_id: str, kind: str, policy: Policy, now: int
) -> tuple[tuple[str, ...], int | None] | None:
    """(nodes, expected start or None if unknown) for the holder, or None if it fits nowhere even empty."""
    limited: list[tuple[int, str]] = []
    unlimited: list[tuple[int, str]] = []
    for pod_id, pod in cluster.pods.items():
        if not pod.running or pod.node_id is None:
            continue
        if pod.spec.time_limit_ms is not None and pod.started_at is not None:
            limited.append((pod.started_at + pod.spec.time_limit_ms, pod_id))
        else:
            unlimited.append((pod.started_at or 0, pod_id))
    limited.sort()
    unlimited.sort()
    steps: list[tuple[int | None, list[str]]] = []
    end: int | None
    for end, pod_id in limited:
        if steps and steps[-1][0] == end:
            steps[-1][1].append(pod_id)
        else:
            steps.append((end, [pod_id]))
    steps.extend((None, [pod_id]) for _, pod_id in unlimited)
    freed: list[Pod] = []
    try:
        for end, pod_ids in steps:
            changed = []
            for pod_id in pod_ids:
                pod = cluster.pods[pod_id]
                node = cluster.nodes[pod.node_id]  # type: ignore[index]
                node.free(pod.spec, pod.gpus)
                cluster.reindex(node)
                freed.append(pod)
                changed.append(node.node_id)
            if not _may_fit_on(cluster, holder_id, kind, changed, now):
                continue
            nodes = _holder_nodes(cluster, holder_id, kind, policy, now)
            if nodes is not None:
                return nodes, end
        return None
    finally:
        for pod in reversed(freed):
            node = cluster.nodes[pod.node_id]  # type: ignore[index]
            node.allocate(pod.spec, pod.gpus, pod.started_at)
            cluster.reindex(node)
