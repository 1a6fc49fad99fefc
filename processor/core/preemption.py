"""Priority preemption: the victims that make room for a pod or gang, fewest and cheapest first.

A pod (or gang) that fits nowhere and allows it (``preemption: lower_priority``) may evict
running pods of strictly lower priority. Candidate victim sets are ordered, lower first, by

1. the highest priority among the victims,
2. the number of victims,
3. the GPU-seconds of work they lose (GPU milli held x time since they started),
4. the node the preemptor goes to (a gang: its topology domain), then the victims' ids.

A victim that is a gang member takes its whole gang along: every running member is a
victim, counted and charged (``processor.core.preemption_plans``). Nothing is evicted unless the preemptor then
fits: the search evicts on trial (``preemption_plans.Trial``) and the fold emits only a plan that places it.

**A pod.** The lowest priority level whose pods, all removed, make room, and a lower bound
on the victims and work lost, come from what each node's running pods hold per priority
(``Node.by_priority``, kept incrementally), without visiting pods. Nodes equal in all that,
start times aside, form one class of the preemption index (``processor.core.preemption_index``):
the fit and the level are asked once per class; per class and (priority, GPU size of one pod)
its nodes are sorted by latest start, and merging those runs meets nodes in the order of their
bound, so the scan stops at the first node whose bound cannot beat the best found, without
bounding the nodes after it. On the nodes it meets the victim set is the exact minimum under
the order above (``processor.core.node_victims``). Cost: O(C · L)
for C classes and L priority levels, plus O(log) per node met, plus the enumeration on the nodes
met (C(k, 1) + C(k, 2) + ... for k candidate victims on a node), plus a pending bucket for each
node changed since the last search and still marked (O(1) each, at most
``preemption_index.EAGER_AFTER``; past that the marks themselves moved the oldest). A shape that no
distinct node capacity could hold even emptied is decided before all that, in O(C) for C capacities
(``node_victims.could_hold_somewhere``). Pending nodes are bounded by bucket, from below
(:func:`_pending_to_file`), and filed in their classes (O(log n) each) only when their bound could
tie or beat the plan found (or, before there is one, the least bounds, a few at a time), so the
answer is the one over all nodes. Pending nodes whose bound ties or beats every filed node's (a node
the command just changed, often) are searched first, so the scan of the filed ones can stop at once;
when it does, they stay pending (filing them costs more than searching them, and a gang's member changes
the same node again before the next search); else they are filed, and the search goes on in rounds. A gang's
topology domain is searched as a node-selector label (``gang_preemption.in_domain``).
Among ``near`` (a queue retry's changed nodes, the only ones where a waiting pod may preempt then) the
nodes are bounded one by one instead: O(N · L).

**A gang**: ``processor.core.gang_preemption``, member by member with this search, or :class:`NextPlans` while
each member changes only the node it takes.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence

from processor.core import quotas
from processor.core.node_victims import (
    WHOLE_UP_TO,
    best_on_node,
    bound_terms,
    could_hold,
    could_hold_somewhere,
    fewest_victims,
    lower_bound,
    minimal_level,
    try_node,
)
from processor.core.preemption_index import PendingKey, VictimClass
from processor.core.preemption_plans import ANY_VICTIM, PodPlan, Victims
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Node, lookup
from schemas.commands import GPU_MILLI


def candidate_nodes(cluster: ClusterState, priority: int, near: Iterable[str] | None) -> list[str]:
    """Nodes running a pod of lower priority (among ``near`` if given), sorted by id."""
    found: set[str] = set()
    for level in cluster.priority_levels.irange(maximum=priority, inclusive=(True, False)):
        found.update(cluster.priority_nodes[level])
    if near is not None:
        found.intersection_update(near)
    return sorted(found)


def plan_pod(
    cluster: ClusterState,
    shape: PodShape,
    priority: int,
    now: int,
    near: Iterable[str] | None = None,
    allowed: Victims = ANY_VICTIM,
) -> PodPlan | None:
    """The best node and victims for a pod of ``shape`` and ``priority`` (the order above), or None.

    Over the whole cluster from the preemption index (classes of alike nodes, see
    ``processor.core.preemption_index``); among ``near`` node by node.

    Each node offers its least victim set at its own minimal level (:func:`try_node`); the answer is the least of
    these. The index's search reads only the lowest level it meets, and under ``allowed`` restrictions that
    level's nodes may offer nothing while a higher level's do: which nodes the search meets first then depends
    on which are filed and which pending, that is on the searches before it (a restore files none). So a
    restricted search whose answer is not at the lowest level any node could offer is checked node by node
    (:func:`_plan_pod_exact`): the answer depends on the state alone, as replay from a snapshot needs. Two
    restrictions name the nodes that could offer a plan, which are then asked node by node and no others: a
    borrowing preemptor's (the nodes of borrowers' pods) and a ``lower_or_newer_equal_priority`` one's once no
    plan below its priority exists (the nodes that run work of its priority)."""
    if near is not None:
        return _plan_pod_on(cluster, shape, priority, now, near, allowed)
    if not could_hold_somewhere(cluster, shape):
        return None  # no node could hold it even emptied: decided without refreshing or filing a node
    if allowed.borrowers_only:
        among = _nodes_of_borrowers(cluster, allowed)
        if among is not None:  # only these nodes run a pod that may go: each is asked, none else
            return _plan_pod_exact(cluster, shape, priority, now, allowed, among)
    if not allowed.restricts:
        return _search(cluster, shape, priority, now, allowed)
    equal = allowed.equal
    if equal is None or allowed.borrowers_only or equal[0] != priority - 1:
        return _plan_restricted(cluster, shape, priority, now, allowed)
    # lower_or_newer_equal_priority: a plan below its own priority beats any at it, and is found as for a pod that
    # takes only lower priorities; else only nodes that run work of its priority may offer one.
    below = Victims(allowed.protected)
    if below.restricts:
        plan = _plan_restricted(cluster, shape, equal[0], now, below)
    else:
        plan = _search(cluster, shape, equal[0], now, below)
    if plan is not None:
        return plan
    among = [
        node_id
        for node_id in sorted(cluster.priority_nodes.get(equal[0], _NO_NODES))
        if _runs_newer(cluster, cluster.nodes[node_id], equal)
    ]
    return _plan_pod_exact(cluster, shape, priority, now, allowed, among)


class NextPlans:
    """The plans of a gang's next members of one shape, without a search each, while each member changes only the
    node it takes: the search's answers, kept exact as nodes change (issue #20).

    Made after an unrestricted search answered ``plan``, whose victims are pods of no gang on its node
    (``gang_preemption.changes_its_node_alone``), before its member takes that node; asked (:meth:`next`) for
    each next member of the same shape (held to the same domain), priority and time. The caller vouches that
    between the two only the node of the last plan changed, by its victims evicted and its member placed. Every
    other node's plan is then what it was: its least victim set is a function of its own pods and their gangs.

    Kept: one merged stream, least bound first, of the nodes the index could offer a plan from: the sorted runs
    of the filed classes at their least level L (``_filed_runs``, as the search merges them) and every pending
    bucket's nodes, latest start first (``_pending_tiers``: the buckets' bounds, as :func:`_pending_to_file`
    reads them), no node filed or moved; a heap, the *frontier*, of (level, victims, work, node id) for the exact
    plans of the nodes met there and the lower bounds of the nodes taken since (a bound is replaced by the node's
    plan when it comes first); and a *guard*, (L + 1, 0, 0), below the plan of every filed node of a higher least
    level. The answer is the frontier's least entry once it is a plan below the stream's next bound and strictly
    below the guard: every node's plan is then no less, in the order of the search (node ids break ties). Else
    None: the caller searches, and makes a new one.

    Exact only where a node's least victim set does not depend on what a search asks it to beat: a node met
    with more than :data:`WHOLE_UP_TO` pods ends it (its search might spend the budget). Valid while the
    preemption index moves no node (``PreemptionIndex.moves``): the nodes taken stay marked, out of date in the
    stream and skipped there, until the next search refreshes them.

    Cost: made in O(B + R) for the B buckets screened and R runs (a heap of their first entries); per answer, a
    bound of the node last taken (O(L · G)), the victim search on each node the stream meets (each once, in the
    order of its bound, as a search meets them, but none filed) and O(log) heap steps per entry met. A gang
    whose members each take the next cheapest node's victims, or one node's one after the other, pays that instead
    of a search, a refresh and a filing per member."""

    __slots__ = (
        "_changed",
        "_filed",
        "_frontier",
        "_guard",
        "_heap",
        "_index",
        "_level",
        "_moves",
        "_now",
        "_priority",
        "_seen",
        "_streams",
        "_taken",
        "shape",
    )

    def __init__(self, cluster: ClusterState, shape: PodShape, priority: int, now: int, plan: PodPlan) -> None:
        index = cluster.preemptible
        self._index = index
        self.shape = shape
        self._priority = priority
        self._now = now
        self._taken: str | None = plan.node_id  # its bound enters the frontier when next asked, changed by then
        self._changed: dict[str, None] = {}
        self._seen: dict[str, None] = {}
        self._frontier: list[tuple[int, int, int, str, PodPlan | None]] = []
        level, runs = _filed_runs(cluster, shape, priority)  # the search's reading, kept: no node moved since
        self._level = 0 if level is None else level
        self._guard = (priority, 0, 0) if level is None else (level + 1, 0, 0)  # (every plan is below its priority)
        # Streams: (entries, their level, victims at least, GPU milli x, 1: timed); the filed runs first.
        streams: list[tuple[Iterator, int, int, int, int]] = [(iter(e), self._level, c, m, t) for e, c, m, t in runs]
        self._filed = len(streams)
        pending = index.pending
        for (low, fewest), members in _pending_tiers(cluster, shape, priority, priority):
            for deficit, key in members:
                streams.append((iter(pending[key].ordered()), low, fewest, deficit, 1))
        self._streams = streams
        heap: list[tuple[int, int, int, str, int]] = []
        for stream_id, stream in enumerate(streams):
            entry = _next_bound(stream, stream_id, now)
            if entry is not None:
                heap.append(entry)
        heapq.heapify(heap)
        self._heap = heap
        self._moves = -1 if index.dirty else index.moves  # (a search refreshed the index: nothing is marked)

    def next(self, cluster: ClusterState) -> PodPlan | None:
        """The next member's plan, as the search would answer it; None: search (this one is spent)."""
        index = self._index
        if cluster.preemptible is not index or index.moves != self._moves:
            return None
        nodes = cluster.nodes
        shape, priority, now, frontier = self.shape, self._priority, self._now, self._frontier
        taken = self._taken
        if taken is not None:
            self._taken = None
            self._changed[taken] = None
            node = lookup(nodes, taken)
            if node is not None and could_hold(cluster, node, shape):
                level = minimal_level(node, shape, priority)
                if level is not None:
                    count, work = lower_bound(node, shape, level, now)
                    heapq.heappush(frontier, (level, count, work, taken, None))
        heap, streams, changed, seen = self._heap, self._streams, self._changed, self._seen
        # Measure: the stream's entries not yet met plus the frontier's bounds (each node's asked once per change).
        while True:
            top = frontier[0] if frontier else None
            if heap and (top is None or heap[0][:4] < top[:4]):
                _level, _count, _work, node_id, stream_id = heapq.heappop(heap)
                entry = _next_bound(streams[stream_id], stream_id, now)
                if entry is not None:
                    heapq.heappush(heap, entry)
                if node_id in changed or node_id in seen:
                    continue  # taken since (its bound is in the frontier), or met on another run
                seen[node_id] = None
                node = nodes[node_id]
                if stream_id < self._filed:
                    level = self._level  # a filed class's least level
                elif could_hold(cluster, node, shape):
                    level = minimal_level(node, shape, priority)  # a pending bucket's is a bound
                    if level is None:
                        continue
                else:
                    continue
                if not self._ask(cluster, node, level):
                    return None
                continue
            if top is None:
                return None  # no node met or taken offers a plan: one filed at a higher level may
            if top[4] is None:  # a node taken since, by its bound: its plan now
                heapq.heappop(frontier)
                if not self._ask(cluster, nodes[top[3]], top[0]):
                    return None
                continue
            if top[:3] >= self._guard:
                return None  # a node filed at a higher level might do as well
            heapq.heappop(frontier)
            plan = top[4]
            self._taken = plan.node_id
            return plan

    def _ask(self, cluster: ClusterState, node: Node, level: int) -> bool:
        """The node's least victim set at its level onto the frontier (if it has one); False if its pods are too
        many for that set not to depend on what it is asked to beat. O(the node's victim search)."""
        if len(node.pods) > WHOLE_UP_TO:
            return False
        found = best_on_node(cluster, node, self.shape, level, self._now, None, ANY_VICTIM)
        if found is not None:
            (count, work), units = found
            plan = PodPlan(node.node_id, units, (level, count, work))
            heapq.heappush(self._frontier, (level, count, work, node.node_id, plan))
        return True


def _next_bound(
    stream: tuple[Iterator, int, int, int, int], stream_id: int, now: int
) -> tuple[int, int, int, str, int] | None:
    """The stream's next node with its bound (level, victims, work), as :func:`_push_next` bounds a run's."""
    entries, level, count, milli, timed = stream
    entry = next(entries, None)
    if entry is None:
        return None
    if timed:
        return (level, count, milli * max(0, now + entry[0]), entry[1], stream_id)
    return (level, 1, 0, entry, stream_id)


def _runs_newer(cluster: ClusterState, node: Node, equal: tuple[int, int]) -> bool:
    """Whether the node runs a preemptible pod of priority ``equal[0]`` that arrived after ``equal[1]``: a plan at
    that priority takes at least one such pod. O(pods on the node)."""
    pods = cluster.pods
    level, arrival = equal
    for pod_id in node.pods:
        pod = lookup(pods, pod_id)
        if pod is not None and pod.spec.priority == level and pod.spec.arrival > arrival and pod.spec.preemptible:
            return True
    return False


def _plan_restricted(
    cluster: ClusterState, shape: PodShape, priority: int, now: int, allowed: Victims
) -> PodPlan | None:
    """:func:`plan_pod` with restrictions: the index's search, then node by node unless its answer is at the
    lowest level any node could offer (at that level the search is exact). O(C · L + B) more than the search."""
    cluster.preemptible.refresh(cluster.nodes)
    lowest = _lowest_level(cluster, shape, priority)  # before the search: its reading of the classes is kept
    best = _search(cluster, shape, priority, now, allowed)
    if lowest is None or (best is not None and best.cost[0] <= lowest):
        return best  # no node offers a lower level: the search at that level is exact
    return _plan_pod_exact(cluster, shape, priority, now, allowed)


def _lowest_level(cluster: ClusterState, shape: PodShape, priority: int) -> int | None:
    """A lower bound of the least minimal level over every node that could hold the pod: the filed classes'
    least (exact) and each pending bucket's lowest level held. O(C · L + B)."""
    level, _runs = _filed_runs(cluster, shape, priority)
    tiers = _pending_tiers(cluster, shape, priority, priority if level is None else level - 1)
    if tiers and (level is None or tiers[0][0][0] < level):
        level = tiers[0][0][0]  # (tiers ascend)
    return level


_NO_NODES: dict[str, int] = {}


def _nodes_of_borrowers(cluster: ClusterState, allowed: Victims) -> list[str] | None:
    """For a search that may take only borrowers' pods (and ``allowed.peers``'): the nodes that run a pod of a
    tenant over its nominal quota on some key, or of a peer, sorted; a node without one offers no victim set.
    None if such a tenant's pods are not filed by node (``ClusterState.reclaim_nodes``: a tenant with its own
    quota in a cohort). O(tenants · keys + the nodes returned · log)."""
    peers = allowed.peers or {}
    found: dict[str, None] = {}
    for tenant in cluster.usage:
        quota = quotas.quota_of(cluster, tenant)
        if quota is None or (tenant not in peers and not quotas.over_nominal(cluster, tenant, quota)):
            continue
        if cluster.quotas.get(tenant) is not quota or quota.cohort is None:
            return None
        for node_id in cluster.reclaim_nodes.get(tenant, _NO_NODES):
            found[node_id] = None
    return sorted(found)


def _plan_pod_exact(
    cluster: ClusterState,
    shape: PodShape,
    priority: int,
    now: int,
    allowed: Victims,
    among: list[str] | None = None,
) -> PodPlan | None:
    """:func:`plan_pod`, node by node (among the sorted node ids ``among``: every node that could offer a plan;
    None: every node that runs lower-priority work): each node offers its plan at its own minimal level; the least
    (level, victims, work, node id) wins. O(N · L) plus a victim search per node at or below the best level so far:
    for a restricted search whose lowest level offered nothing, or one that may take only borrowers' pods (their
    nodes)."""
    nodes = cluster.nodes
    best: PodPlan | None = None
    for node_id in candidate_nodes(cluster, priority, None) if among is None else among:  # sorted by id
        node = nodes[node_id]
        if not could_hold(cluster, node, shape):
            continue
        level = minimal_level(node, shape, priority)
        if level is None or (best is not None and level > best.cost[0]):
            continue
        if best is not None and level < best.cost[0]:
            found = try_node(cluster, node, shape, level, now, None, allowed)
            best = found if found is not None else best
        else:
            best = try_node(cluster, node, shape, level, now, best, allowed)
    return best


def _search(cluster: ClusterState, shape: PodShape, priority: int, now: int, allowed: Victims) -> PodPlan | None:
    """The index's search (see :func:`plan_pod`): the best plan at the lowest level it meets."""
    index = cluster.preemptible
    index.refresh(cluster.nodes)
    level, runs = _filed_runs(cluster, shape, priority)
    best: PodPlan | None = None
    met: set[str] = set()
    least = _least_bound(runs, now) if level is not None else None
    covered: tuple[int, int, int] | None = None  # every pending node bounded at most this is met
    first_met: list[str] = []  # met while pending: filed only if the search goes on past the filed nodes
    if level is not None and least is not None:
        # Pending nodes whose bound ties or beats every filed node's (often a node the command itself just
        # changed) are searched first: the scan of the filed ones can then stop at once. The answer does not
        # depend on which nodes are filed; the scan skips the nodes met here, whose plan is ``best``.
        first = (level, *least)
        first_met = _pending_to_file(cluster, shape, priority, now, first, PROMOTE_FIRST)
        if len(first_met) < PROMOTE_FIRST:
            covered = first
        if first_met:
            best = _plan_pod_among(cluster, shape, priority, now, first_met, None, allowed)
            if best is not None and best.cost[0] == level:
                met.update(first_met)  # not in the runs read above, or met there
            else:
                best, covered = None, None  # another level: the scan starts afresh, those nodes filed
                index.promote(first_met, cluster.nodes)
                first_met = []
                level, runs = _filed_runs(cluster, shape, priority)
    if level is not None and (best is None or least is None or best.cost[1:] >= least):
        # (Else every filed node not met has a bound above the plan: the scan would stop at its first node.)
        best = _scan_filed(cluster, shape, level, runs, now, allowed, best, met)
    if best is not None and covered is not None and best.cost <= covered:
        return best  # a pending node that could tie or beat it was met above (it stays pending)
    if first_met:
        index.promote(first_met, cluster.nodes)  # met: filed, so that the rounds below do not meet it again
    limit = PROMOTE_FIRST
    while True:
        promote = _pending_to_file(cluster, shape, priority, now, best.cost if best is not None else None, limit)
        if not promote:
            return best  # no pending node could tie or beat it
        index.promote(promote, cluster.nodes)
        best = _plan_pod_among(cluster, shape, priority, now, promote, best, allowed)  # best: the best of the others
        limit *= 4


PROMOTE_FIRST = 16
"""Pending nodes filed first when no filed node gives a plan (the least bounds), then 4x as many each round."""


def _pending_to_file(
    cluster: ClusterState, shape: PodShape, priority: int, now: int, beat: tuple[int, int, int] | None, limit: int
) -> list[str]:
    """Pending nodes whose lower bound (victim level, victims, work lost) is at most ``beat`` (any if None),
    at most ``limit``, least bound first. A bucket's nodes are sorted by latest start, latest first, so by
    their bound: O(B + limit · log) for B buckets (a pod with a node selector: those of its rarest label), the
    screen of the buckets kept for the next search of the shape (:func:`_pending_tiers`)."""
    pending = cluster.preemptible.pending
    chosen: list[str] = []
    for tier, members in _pending_tiers(cluster, shape, priority, priority if beat is None else beat[0]):
        if beat is not None and tier > beat[:2]:
            break  # (tiers ascend; each is below the priority)
        room = limit - len(chosen)
        found: list[tuple[int, str]] = []
        for deficit, key in members:
            entries = pending[key].ordered()
            end = room
            if deficit and beat is not None and tier == beat[:2]:
                # deficit x (now - latest) <= the work to beat  <=>  latest >= now - work // deficit
                end = min(room, bisect_left(entries, (beat[2] // deficit - now + 1,)))
            found.extend((deficit * max(0, now + minus_latest), node_id) for minus_latest, node_id in entries[:end])
        if len(found) > room:
            found = heapq.nsmallest(room, found)
        chosen.extend(node_id for _, node_id in found)
        if len(chosen) >= limit:
            break
    return chosen


Tiers = list[tuple[tuple[int, int], list[tuple[int, PendingKey]]]]
"""Pending buckets by the first two terms of their bound, ascending: ((level, victims at least), [(GPU milli the
victims must free at least, bucket key), ...] in ``pending``'s order)."""


def _pending_tiers(cluster: ClusterState, shape: PodShape, priority: int, top: int) -> Tiers:
    """The pending buckets whose lowest level is below ``priority``, at most ``top``, and whose nodes could hold
    the shape (:func:`could_hold`, read from the bucket: a pending node is schedulable, the rest is in its key), by
    their bound's tier (:func:`_pending_bound_terms`); callers read them up to what they need (more levels may
    come: every one below ``priority`` once kept). O(B) for the B buckets of the shape's node selector (and
    O(T log T) for their T tiers). A second reading of the same shape and priority while no bucket was made or
    dropped (``PreemptionIndex.bucket_changes``: a bucket's key is its bound; its nodes are read when used),
    a gang's next member, screens every level below the priority once and keeps that: O(1) while it holds."""
    index = cluster.preemptible
    last = index.last_tiers
    if (
        last is not None
        and last[2] == index.bucket_changes
        and last[1] == priority
        and (last[0] is shape or last[0] == shape)
    ):
        kept = last[3]
        if kept is None:
            kept = _screen_buckets(cluster, shape, priority, priority)
            index.last_tiers = (shape, priority, index.bucket_changes, kept)
        return kept
    index.last_tiers = (shape, priority, index.bucket_changes, None)  # screened whole if read again
    return _screen_buckets(cluster, shape, priority, top)


def _screen_buckets(cluster: ClusterState, shape: PodShape, priority: int, top: int) -> Tiers:
    admits = cluster.capacity.admits  # (a pure memo: no need to file the changed nodes first)
    models, cpu, memory = shape.gpu_models, shape.cpu_milli, shape.memory_mib
    gpus = (shape.num_gpu if shape.gpu_milli >= GPU_MILLI else 1) if shape.num_gpu else 0
    by_tier: dict[tuple[int, int], list[tuple[int, PendingKey]]] = {}
    for key, _bucket in cluster.preemptible.buckets(shape.node_selector):
        model, node_class, node_cpu, node_memory, gpu_count, level = key[:6]
        if level >= priority or level > top:
            continue
        if (models and model not in models) or node_cpu < cpu or node_memory < memory or gpu_count < gpus:
            continue
        if admits(node_class, shape):
            fewest, deficit = _pending_bound_terms(key, shape)
            by_tier.setdefault((level, fewest), []).append((deficit, key))
    return sorted(by_tier.items())


def _pending_bound_terms(key: PendingKey, shape: PodShape) -> tuple[int, int]:
    """:func:`bound_terms` from a pending bucket, at its lowest level, from below: (at least how many victims,
    GPU milli they must free at least; 0 if no work bound). GPU milli free and the most free on one GPU
    bound what the largest free GPUs hold. Only the lowest level matters: a node whose victims reach a
    higher level is worse than the bound in the first term already."""
    if not shape.num_gpu:
        return (1, 0)
    _model, _node_class, _cpu, _memory, gpu_count, _level, gpu_pods, largest, total_free, most_free = key
    whole = shape.gpu_milli >= GPU_MILLI
    if whole:
        deficit = shape.num_gpu * GPU_MILLI - min(total_free, shape.num_gpu * most_free)
    else:
        deficit = shape.gpu_milli - most_free
    if deficit <= 0 or largest <= 0:
        return (1, 0)
    return (fewest_victims(deficit, largest, whole and shape.num_gpu == gpu_count, gpu_pods), deficit)


Run = tuple[Sequence, int, int, int]
"""A sorted run of filed nodes: (entries, victims at least, GPU milli x, 1: timed); timed entries are (minus the
latest start, node id) and bound a node by (victims, milli x its time running since), others are node ids
bound by (1, 0)."""


def _filed_runs(cluster: ClusterState, shape: PodShape, priority: int) -> tuple[int | None, list[Run]]:
    """The least victim level over the preemption index's classes, and the sorted runs of the classes at that
    level (see :func:`_scan_filed`); (None, []) if no filed node could make room. O(C · L); O(1) when the last
    reading was of this shape and priority and no class or run was made or dropped since (``filings``: the runs
    read are the classes' own sorted lists, kept in place as nodes of existing classes are filed and unfiled; a
    gang's members, one after the other). Read after ``refresh``: no filed node changed."""
    index = cluster.preemptible
    last = index.last_runs
    if last is not None and last[2] == index.filings and last[1] == priority and (last[0] is shape or last[0] == shape):
        return last[3], last[4]
    level, runs = _read_classes(cluster, shape, priority)
    index.last_runs = (shape, priority, index.filings, level, runs)
    return level, runs


def _read_classes(cluster: ClusterState, shape: PodShape, priority: int) -> tuple[int | None, list[Run]]:
    index = cluster.preemptible
    nodes = cluster.nodes
    at_level: list[tuple[int, VictimClass, Node]] = []
    best_level: int | None = None
    for group in index.classes.values():  # any order: the minimum below does not depend on it
        node = nodes[group.node_ids[0]]  # any node of the class answers for all of them
        if not could_hold(cluster, node, shape):
            continue
        level = minimal_level(node, shape, priority)
        if level is None or (best_level is not None and level > best_level):
            continue
        if best_level is None or level < best_level:
            best_level, at_level = level, []
        at_level.append((level, group, node))
    runs: list[Run] = []
    for level, group, node in at_level:
        fewest, deficit = bound_terms(node, shape, level)
        if not fewest:
            runs.append((group.node_ids, 1, 0, 0))
            continue
        for (stream_level, milli), entries in group.streams.items():
            if stream_level > level:
                continue
            if fewest > 1:
                runs.append((entries, fewest, deficit, 1))
            elif milli >= deficit:
                runs.append((entries, 1, milli, 1))
    return best_level, runs


def _least_bound(runs: list[Run], now: int) -> tuple[int, int] | None:
    """The least (victims, work) bound among the runs' first nodes: no filed node at the level does better."""
    least: tuple[int, int] | None = None
    for entries, count, milli, timed in runs:
        if entries:
            bound = (count, milli * max(0, now + entries[0][0])) if timed else (1, 0)
            if least is None or bound < least:
                least = bound
    return least


def _scan_filed(
    cluster: ClusterState,
    shape: PodShape,
    level: int,
    runs: list[Run],
    now: int,
    allowed: Victims,
    best: PodPlan | None,
    met: set[str],
) -> PodPlan | None:
    """:func:`plan_pod` among the filed nodes at ``level``: the better of ``best`` (the plan of the nodes in
    ``met``, skipped here) and the nodes met in the order of their bound until none can do better."""
    nodes = cluster.nodes
    # Merge the classes' sorted runs into one stream of (bound, node id), least first: exactly the
    # order in which the scan below visits them.
    heap: list[tuple[int, int, str, int]] = []
    iterators: list[tuple[Iterator, int, int, int]] = [(iter(e), c, m, t) for e, c, m, t in runs]
    for run_id, run in enumerate(iterators):
        _push_next(heap, run, run_id, now)
    seen = met
    while heap:  # measure: the runs' entries not yet met
        count, work, node_id, run_id = heapq.heappop(heap)
        _push_next(heap, iterators[run_id], run_id, now)
        if node_id in seen:
            continue  # met again on another run, with a bound no lower than the first (or met before the scan)
        seen.add(node_id)
        if best is not None and (count, work) > best.cost[1:]:
            break  # neither this node nor any after it can do better
        best = try_node(cluster, nodes[node_id], shape, level, now, best, allowed)
    return best


def _push_next(
    heap: list[tuple[int, int, str, int]], run: tuple[Iterator, int, int, int], run_id: int, now: int
) -> None:
    """The run's next node onto the heap with its bound (see :func:`lower_bound`)."""
    entries, count, milli, timed = run
    entry = next(entries, None)
    if entry is None:
        return
    if timed:
        heapq.heappush(heap, (count, milli * max(0, now + entry[0]), entry[1], run_id))
    else:
        heapq.heappush(heap, (1, 0, entry, run_id))


def _plan_pod_on(
    cluster: ClusterState, shape: PodShape, priority: int, now: int, near: Iterable[str], allowed: Victims
) -> PodPlan | None:
    """:func:`plan_pod` among the given nodes, node by node: O(N · L)."""
    return _plan_pod_among(cluster, shape, priority, now, candidate_nodes(cluster, priority, near), None, allowed)


def _plan_pod_among(
    cluster: ClusterState,
    shape: PodShape,
    priority: int,
    now: int,
    node_ids: Iterable[str],
    best: PodPlan | None = None,
    allowed: Victims = ANY_VICTIM,
) -> PodPlan | None:
    """The better of ``best`` and :func:`plan_pod` among the given node ids (any order), node by node: O(N · L)."""
    nodes = cluster.nodes
    levels: list[tuple[int, str]] = []
    for node_id in node_ids:
        node = lookup(nodes, node_id)
        if node is None or not could_hold(cluster, node, shape):
            continue
        level = minimal_level(node, shape, priority)
        if level is not None:
            levels.append((level, node_id))
    if not levels:
        return best
    best_level = min(level for level, _ in levels)
    if best is not None and best.cost[0] != best_level:
        if best.cost[0] < best_level:
            return best  # a lower victim priority than any here
        best = None
    if best is None and len(levels) == 1:  # one node and nothing to beat: no bound to order or stop by
        return try_node(cluster, nodes[levels[0][1]], shape, best_level, now, None, allowed)
    bounds = sorted(
        (lower_bound(nodes[node_id], shape, level, now), node_id) for level, node_id in levels if level == best_level
    )
    for bound, node_id in bounds:  # most promising first; the order does not change the answer
        if best is not None and bound > best.cost[1:]:
            break  # neither this node nor any after it can do better
        best = try_node(cluster, nodes[node_id], shape, best_level, now, best, allowed)
    return best
