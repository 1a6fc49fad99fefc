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

from processor.core import gangs, preemption
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
    """(nodes, expected start or None if unknown) for the holder, or None if it fits nowhere even empty.

    "No node capacity could hold it even empty" depends only on the holder and the nodes (their capacities,
    labels and taints), so it is decided from the distinct node capacities (O(C · M)) once per holder and node
    layout, and remembered until a node is added, removed or changes (``ClusterState.layout``): a head of the
    queue that can never start (a typo in its node selector) costs O(1) per later command, not a sweep over
    every running pod."""
    if cluster.unplannable.get(holder_id) == cluster.layout:
        return None
    if not _could_start_on_empty(cluster, holder_id, kind):
        _remember(cluster, holder_id)
        return None
    return _sweep(cluster, holder_id, kind, policy, now)


def _remember(cluster: ClusterState, holder_id: str) -> None:
    """Note that the holder fits nowhere at this layout; notes of an older layout go (their nodes changed)."""
    memo = cluster.unplannable
    if memo and next(iter(memo.values())) != cluster.layout:
        memo.clear()
    memo[holder_id] = cluster.layout


def _could_start_on_empty(cluster: ClusterState, holder_id: str, kind: str) -> bool:
    """Whether some node capacity could hold the holder if it were empty (schedulability aside). O(C · M)."""
    if kind == "pod":
        return preemption.could_hold_somewhere(cluster, cluster.pods[holder_id].shape)
    return gangs.never_fits(cluster, cluster.gangs[holder_id].spec) is None


def _sweep(
    cluster: ClusterState, holder_id: str, kind: str, policy: Policy, now: int
) -> tuple[tuple[str, ...], int | None] | None:
    """Free running pods on trial in order of their ends until the holder fits. O(P log P)."""
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
