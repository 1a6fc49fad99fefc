"""Where a reservation goes: the nodes where the head of the queue will start soonest.

Slurm's backfill rule, on the fold's state: running pods end at ``started_at +
time_limit_ms``. The planner frees them on trial in order of end time (the
capacity index follows each step), and after each step where a node changed asks
whether the holder fits now; the first time it does is the expected start, and the
nodes it would use there are reserved. If it only fits once pods without a time
limit end too (they are freed oldest first), the nodes are reserved with an unknown
start. Everything freed on trial is allocated back before returning: the state is
left exactly as it was.

Cost, for a gang: O(P log P) for the P running pods, plus one fit check per changed
node and a placement (a gang trial) only at steps where one could succeed. For a
pod, node by node (:func:`_plan_pod`): O(N) plus the nodes that could end soonest.
It runs when a reservation is made, not per command.
"""

from __future__ import annotations

from collections.abc import Iterable

from sortedcontainers import SortedList

from processor.core import gangs, node_victims
from processor.core.policies.base import Policy
from processor.core.resources import PodShape, gpu_memory_fits
from processor.core.state import ClusterState, Node, Pod, lookup


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
    if kind == "pod":
        return _plan_pod(cluster, holder_id, policy, now)
    return _sweep(cluster, holder_id, kind, policy, now)


# The step at which a node first holds the pod, in the sweep's order: (0, end) while pods with a time limit
# end, then (1, (start, pod id)) as pods without one are freed oldest first.
FitKey = tuple[int, object]
FIT_CACHE_SHAPES = 4  # holder shapes whose per-node answers are kept (the heads of the queue change slowly)


def _plan_pod(
    cluster: ClusterState, holder_id: str, policy: Policy, now: int
) -> tuple[tuple[str, ...], int | None] | None:
    """The sweep's answer for a pod, node by node instead of pod by pod.

    The sweep asks, after each step, whether a node that changed at that step holds the pod, and then places
    it among every node that holds it. A node's fit changes only when its own pods are freed, so the first such
    step is the least, over the nodes, of each node's own trigger (:func:`_trigger`, over that node's pods
    only): the step at which it first holds the pod, or, for a node that holds it already, the first step that
    frees one of its pods. A node's trigger is never before its first release (the step of its earliest pod),
    so the nodes are asked in order of their first release and the asking stops at the first node whose first
    release comes after the least trigger found: the nodes that hold the pod now (the capacity index's) and
    those few. Each node's answer is kept per holder shape while the node is unchanged (``Node.changes``), and
    its first release too. If one node alone holds the pod at that step, the pod goes there; otherwise the
    sweep's own state at that step is built and the policy chooses, as the sweep does.

    Cost: O(D log N) to keep the nodes in order of their first release (D nodes changed since the last
    plan; O(N + P) the first time), plus O(p log p) for each node asked whose answer is not kept (a node's
    p pods); O(P) only when several nodes hold the pod at that step. A pod that asks for GPU memory asks
    every node (the capacity index checks GPU memory, :func:`_trigger` does not)."""
    shape = cluster.pods[holder_id].shape
    answers = cluster.fit_cache.get(shape)
    if answers is None:
        if len(cluster.fit_cache) >= FIT_CACHE_SHAPES:
            cluster.fit_cache.clear()
        answers = cluster.fit_cache[shape] = {}
    step: FitKey | None = None
    holding: dict[str, FitKey | None] = {}  # node -> the step from which it holds the pod (None: now)
    if shape.gpu_memory_mib:
        for node_id in cluster.nodes:
            step = _ask(cluster, answers, shape, node_id, holding, step)
    else:
        for group in cluster.index.feasible(shape):  # the nodes that hold it now
            for node_id in group.node_ids:
                step = _ask(cluster, answers, shape, node_id, holding, step)
        for first, node_id in _release_order(cluster):  # measure: the nodes not yet taken from the order
            if step is not None and first > step:
                break  # this node and every later one frees its first pod after the least trigger found
            if node_id not in holding:
                step = _ask(cluster, answers, shape, node_id, holding, step)
    if step is None:
        return None
    at_step = [node_id for node_id, since in holding.items() if since is None or since <= step]
    expected = step[1] if step[0] == 0 else None
    if len(at_step) == 1:
        return (at_step[0],), expected  # type: ignore[return-value]
    return _place_at(cluster, holder_id, policy, now, step), expected  # type: ignore[return-value]


def _ask(
    cluster: ClusterState,
    answers: dict[str, tuple[int, tuple[bool, FitKey | None] | None]],
    shape: PodShape,
    node_id: str,
    holding: dict[str, FitKey | None],
    step: FitKey | None,
) -> FitKey | None:
    """Ask one node (its kept answer if it is unchanged): note in ``holding`` from which step it holds the
    shape, if ever; the least trigger so far, ``step`` or this node's."""
    node = cluster.nodes[node_id]
    known = answers.get(node_id)
    if known is None or known[0] != node.changes:
        known = answers[node_id] = (node.changes, _trigger(cluster, node, shape))
    answer = known[1]
    if answer is None:
        return step
    holds_now, trigger = answer
    holding[node_id] = None if holds_now else trigger
    if trigger is not None and (step is None or trigger < step):
        return trigger
    return step


def _release_order(cluster: ClusterState) -> SortedList:
    """The nodes that run a pod as (the sweep's step that first frees one of its pods, node), in that order:
    built once (O(N + P)), then kept up to date for the nodes changed since the last plan
    (``ClusterState.release_changed``, marked by every ``reindex``): O(D log N) for D changed nodes."""
    order = cluster.release_order
    kept = cluster.first_release
    if order is None:
        order = cluster.release_order = SortedList()
        kept.clear()
        changed: Iterable[str] = list(cluster.nodes)
    else:
        changed = list(cluster.release_changed)
    cluster.release_changed.clear()
    for node_id in changed:  # measure: the changed nodes not yet refiled
        old = kept.pop(node_id, None)
        if old is not None:
            order.remove((old, node_id))
        node = lookup(cluster.nodes, node_id)
        key = None if node is None else _first_release(cluster, node)
        if key is not None:
            kept[node_id] = key
            order.add((key, node_id))
    return order


def _first_release(cluster: ClusterState, node: Node) -> FitKey | None:
    """The sweep's first step that frees one of the node's pods (its step keys, as in :func:`_trigger`)."""
    first: FitKey | None = None
    for pod_id in node.pods:
        pod = lookup(cluster.pods, pod_id)
        if pod is None or pod.node_id is None:
            continue
        if pod.spec.time_limit_ms is not None and pod.started_at is not None:
            key: FitKey = (0, pod.started_at + pod.spec.time_limit_ms)
        else:
            key = (1, (pod.started_at or 0, pod_id))
        if first is None or key < first:
            first = key
    return first


def _trigger(cluster: ClusterState, node: Node, shape: PodShape) -> tuple[bool, FitKey | None] | None:
    """(whether the node holds the shape now, the sweep's step at which it first shows it does: its first
    step that frees a pod there if it does already, else the step after which it does, None if never); None
    if the node can never hold the shape. What holds it is what the capacity index asks (``CapacityIndex.fits``):
    CPU, memory, GPUs and, where the node declares it and the pod asks, GPU memory. O(p log p) for the node's
    p pods."""
    if not node_victims.could_hold(cluster, node, shape):
        return None
    gpu_memory = shape.gpu_memory_mib if node.gpu_memory_free else 0  # a node without it: not checked
    if gpu_memory and node.gpu_memory_mib < gpu_memory:
        return None  # no GPU of this node has that much memory, even empty
    limited: list[tuple[int, str, Pod]] = []
    unlimited: list[tuple[int, str, Pod]] = []
    for pod_id in node.pods:
        pod = lookup(cluster.pods, pod_id)
        if pod is None or pod.node_id is None:
            continue
        if pod.spec.time_limit_ms is not None and pod.started_at is not None:
            limited.append((pod.started_at + pod.spec.time_limit_ms, pod_id, pod))
        else:
            unlimited.append((pod.started_at or 0, pod_id, pod))
    limited.sort()
    unlimited.sort()
    cpu, memory, gpus = node.cpu_free, node.memory_free, list(node.gpu_free)
    memories = list(node.gpu_memory_free) if gpu_memory else []
    if _holds(cpu, memory, gpus, memories, shape):
        if limited:
            return True, (0, limited[0][0])
        return True, ((1, (unlimited[0][0], unlimited[0][1])) if unlimited else None)
    for position, (end, _, pod) in enumerate(limited):
        cpu, memory = cpu + pod.spec.cpu_milli, memory + pod.spec.memory_mib
        _free_gpus(pod, gpus, memories)
        last = position + 1 == len(limited) or limited[position + 1][0] != end  # a step frees all that end then
        if last and _holds(cpu, memory, gpus, memories, shape):
            return False, (0, end)
    for started, pod_id, pod in unlimited:
        cpu, memory = cpu + pod.spec.cpu_milli, memory + pod.spec.memory_mib
        _free_gpus(pod, gpus, memories)
        if _holds(cpu, memory, gpus, memories, shape):
            return False, (1, (started, pod_id))
    return False, None


def _free_gpus(pod: Pod, gpus: list[int], memories: list[int]) -> None:
    """The pod's GPU shares (and, if counted, its GPU memory on each) back to ``gpus`` (and ``memories``)."""
    for share in pod.gpus:
        gpus[share.index] += share.milli
        if memories:
            memories[share.index] += pod.spec.gpu_memory_mib


def _holds(cpu: int, memory: int, gpus: list[int], memories: list[int], shape: PodShape) -> bool:
    """Whether free CPU, memory, GPUs (and GPU memory, if counted) hold the shape."""
    if not node_victims.room_in(cpu, memory, gpus, shape):
        return False
    if not memories:
        return True
    return gpu_memory_fits(
        tuple(zip(gpus, memories, strict=True)), shape.num_gpu, shape.gpu_milli, shape.gpu_memory_mib
    )


def _place_at(cluster: ClusterState, holder_id: str, policy: Policy, now: int, step: FitKey) -> tuple[str, ...]:
    """The sweep's placement at ``step``: every pod it has freed by then freed on trial (O(P)), then the policy."""
    freed: list[Pod] = []
    try:
        for pod in list(cluster.pods.values()):
            if pod.node_id is None:
                continue
            if pod.spec.time_limit_ms is not None and pod.started_at is not None:
                key: FitKey = (0, pod.started_at + pod.spec.time_limit_ms)
            else:
                key = (1, (pod.started_at or 0, pod.spec.pod_id))
            if key <= step:
                node = cluster.nodes[pod.node_id]
                node.free(pod.spec, pod.gpus, pod.started_at)
                freed.append(pod)
        for node_id in dict.fromkeys(pod.node_id for pod in freed):
            cluster.reindex(cluster.nodes[node_id])  # type: ignore[index]
        nodes = _holder_nodes(cluster, holder_id, "pod", policy, now)
        assert nodes is not None, "the holder fits at the step its nodes said"
        return nodes
    finally:
        for pod in reversed(freed):
            node = cluster.nodes[pod.node_id]  # type: ignore[index]
            node.allocate(pod.spec, pod.gpus, pod.started_at)
        for node_id in dict.fromkeys(pod.node_id for pod in freed):
            cluster.reindex(cluster.nodes[node_id])  # type: ignore[index]


def _remember(cluster: ClusterState, holder_id: str) -> None:
    """Note that the holder fits nowhere at this layout; notes of an older layout go (their nodes changed)."""
    memo = cluster.unplannable
    if memo and next(iter(memo.values())) != cluster.layout:
        memo.clear()
    memo[holder_id] = cluster.layout


def _could_start_on_empty(cluster: ClusterState, holder_id: str, kind: str) -> bool:
    """Whether some node capacity could hold the holder if it were empty (schedulability aside). O(C · M)."""
    if kind == "pod":
        return node_victims.could_hold_somewhere(cluster, cluster.pods[holder_id].shape)
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
                node.free(pod.spec, pod.gpus, pod.started_at)
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
