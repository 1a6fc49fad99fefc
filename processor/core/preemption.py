"""Priority preemption: the victims that make room for a pod or gang, fewest and cheapest first.

A pod (or gang) that fits nowhere and allows it (``preemption: lower_priority``) may evict
running pods of strictly lower priority. Candidate victim sets are ordered, lower first, by

1. the highest priority among the victims,
2. the number of victims,
3. the GPU-seconds of work they lose (GPU milli held x time since they started),
4. the node the preemptor goes to (a gang: its topology domain), then the victims' ids.

A victim that is a gang member takes its whole gang along: every running member is a
victim, counted and charged. Nothing is evicted unless the preemptor then fits: the
search evicts on trial (:class:`Trial`) and the fold emits only a plan that places it.

**A pod.** The lowest priority level whose pods, all removed, make room, and a lower bound
on the victims and work lost, come from what each node's running pods hold per priority
(``Node.by_priority``, kept incrementally), without visiting pods. Nodes equal in all that,
start times aside, form one class of the preemption index (``processor.core.preemption_index``):
the fit and the level are asked once per class; per class and (priority, GPU size of one pod)
its nodes are sorted by latest start, and merging those runs meets nodes in the order of their
bound, so the scan stops at the first node whose bound cannot beat the best found, without
bounding the nodes after it. On the nodes it meets the victim set is the exact minimum under
the order above: sets of 1, 2, ... victims are enumerated (ids ascending) until the count can
no longer beat the best. The enumeration has a budget (:data:`SEARCH_BUDGET` subsets per node);
past it the best set found is kept, or the cheapest greedy set if none was. Cost: O(C · L)
for C classes and L priority levels, plus O(log) per node met, plus the enumeration on the nodes
met (C(k, 1) + C(k, 2) + ... for k candidate victims on a node), plus a pending bucket for each
node changed since the last search and still marked (O(1) each, at most
``preemption_index.EAGER_AFTER``; past that the marks themselves moved the oldest). A shape that no
distinct node capacity could hold even emptied is decided before all that, in O(C) for C capacities
(:func:`could_hold_somewhere`). Pending nodes are bounded by bucket, from below
(:func:`_pending_to_file`), and filed in their classes (O(log n) each) only when their bound could
tie or beat the plan found (or, before there is one, the least bounds, a few at a time), so the
answer is the one over all nodes. Within a gang's domain (``near``) the nodes are bounded one by
one instead: O(N · L).

**A gang** (all or nothing): per topology domain it may use (``topology_required``: each
domain of the key; otherwise the whole cluster), members are placed largest first, each on
free capacity if it fits there (the cluster's policy), else by the pod search above within
the domain, on trial; the domain whose victims are least under the order wins. This is
member by member, not a joint minimum over the gang.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import combinations

from processor.core import gangs, quotas, reservations
from processor.core.policies.base import Choice, Policy
from processor.core.preemption_index import PendingBucket, VictimClass
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Node, Pod, lookup, shape_of
from schemas.commands import BORROW_LOWER, GPU_MILLI, PREEMPT_LOWER_OR_NEWER
from schemas.events import GangSpec, PodSpec

SEARCH_BUDGET = 20_000
"""Victim subsets examined per node at most (the exact minimum is found well within it on nodes with
up to ~14 lower-priority pods or gangs); the benchmarks and tests never reach it."""


@dataclass(slots=True)
class Unit:
    """What one eviction takes: a plain pod, or a whole gang (all its running members)."""

    key: str  # the pod id, or the gang id
    priority: int
    pods: tuple[Pod, ...]  # sorted by pod id
    work: int  # GPU milli x ms of work lost

    @property
    def count(self) -> int:
        return len(self.pods)


@dataclass(slots=True)
class Victims:
    """Which running pods a preemption may take, beyond their lower priority.

    ``protected``: pods evicted earlier in the same command; none is evicted twice in one command, which
    bounds every cascade (``processor.core.decision``). ``borrowers_only``: the preemptor would borrow quota
    to run, so it may take only pods whose tenant itself runs over its nominal quota (Kueue's rule: work
    inside its nominal quota is never the victim of a borrower). A gang is a victim whole or not at all.
    The search's bounds still hold (fewer victims allowed can only cost more); a node whose victims at the
    bound's priority level are not allowed gives no plan there."""

    protected: Mapping[str, None]
    borrowers_only: bool = False
    # borrow_within_cohort (contract v3): with borrowers_only, the preemptor's cohort peers' pods may go too (also
    # inside their nominal quota), those of priority at most ``peer_max_priority`` (None: any lower one).
    peers: Mapping[str, None] | None = None
    peer_max_priority: int | None = None
    # lower_or_newer_equal_priority (contract v3): the preemptor's (priority, arrival); the search reaches its own
    # priority, and of that priority only pods submitted after it may go.
    equal: tuple[int, int] | None = None

    @property
    def restricts(self) -> bool:
        """Whether the victims must be filtered (beyond priority and ``preemptible``)."""
        return bool(self.protected) or self.borrowers_only or self.equal is not None

    def allow(self, cluster: ClusterState, pod: Pod) -> bool:
        if pod.spec.pod_id in self.protected or not pod.spec.preemptible:
            return False
        equal = self.equal
        if equal is not None and pod.spec.priority == equal[0] and pod.spec.arrival <= equal[1]:
            return False
        if not self.borrowers_only or quotas.borrowing(cluster, pod):
            return True
        peers = self.peers
        if peers is None or pod.spec.tenant not in peers:
            return False
        return self.peer_max_priority is None or pod.spec.priority <= self.peer_max_priority


def reach(priority: int, mode: str) -> int:
    """The priority below which a preemptor's search looks for victims: its own, or one more for
    ``lower_or_newer_equal_priority`` (then :attr:`Victims.equal` keeps the older pods of its priority)."""
    return priority + 1 if mode == PREEMPT_LOWER_OR_NEWER else priority


def equal_of(spec: PodSpec | GangSpec) -> tuple[int, int] | None:
    """:attr:`Victims.equal` for a preemptor: its (priority, arrival) if it may take newer work of its priority."""
    return (spec.priority, spec.arrival) if spec.preemption == PREEMPT_LOWER_OR_NEWER else None


def borrower_victims(
    cluster: ClusterState, tenant: str, protected: Mapping[str, None], equal: tuple[int, int] | None = None
) -> Victims:
    """Whom a preemptor that would borrow quota may take (Kueue's rule): borrowers' pods; and, if its tenant's
    ``borrow_within_cohort`` is ``lower_priority`` (contract v3), its cohort peers' pods too, of at most
    ``borrow_max_victim_priority``. O(cohort members)."""
    quota = quotas.quota_of(cluster, tenant)
    if quota is None or quota.cohort is None or quota.policy.borrow_within_cohort != BORROW_LOWER:
        return Victims(protected, True, equal=equal)
    peers = {member: None for member in sorted(cluster.cohorts.get(quota.cohort, ())) if member != tenant}
    return Victims(protected, True, peers, quota.policy.borrow_max_victim_priority, equal)


ANY_VICTIM = Victims({})
"""No restriction beyond priority (a search outside a command's cascade: tests, explain)."""


@dataclass(slots=True)
class PodPlan:
    """Where a pod goes and whom it evicts; ``cost`` is its place in the order above."""

    node_id: str
    units: list[Unit]
    cost: tuple[int, int, int]  # (highest victim priority, victims, work lost)

    @property
    def victims(self) -> list[Pod]:
        return sorted((pod for unit in self.units for pod in unit.pods), key=lambda pod: pod.spec.pod_id)


@dataclass(slots=True)
class GangPlan:
    placement: gangs.GangPlacement
    units: list[Unit]
    cost: tuple[int, int, int]

    @property
    def victims(self) -> list[Pod]:
        return sorted((pod for unit in self.units for pod in unit.pods), key=lambda pod: pod.spec.pod_id)


def work_lost(pod: Pod, now: int) -> int:
    """GPU milli x ms since the pod started (0 for a pod without GPUs)."""
    return pod.spec.num_gpu * pod.spec.gpu_milli * max(0, now - (pod.started_at if pod.started_at is not None else now))


def cost_of(units: Iterable[Unit]) -> tuple[int, int, int]:
    units = list(units)
    return (max(unit.priority for unit in units), sum(unit.count for unit in units), sum(unit.work for unit in units))


def lower_priority_exists(cluster: ClusterState, priority: int) -> bool:
    """Whether any pod of lower priority runs in the cluster. O(distinct priorities)."""
    return any(level < priority for level in cluster.priority_nodes)


def unit_of(cluster: ClusterState, pod: Pod, now: int) -> Unit:
    """The eviction a running pod stands for: itself, or its whole gang."""
    gang_id = pod.spec.gang_id
    if gang_id is not None:
        gang = cluster.gangs.get(gang_id)
        if gang is not None:
            members = tuple(
                cluster.pods[pod_id] for pod_id in sorted(gang.placed) if cluster.pods[pod_id].node_id is not None
            )
            return Unit(gang_id, pod.spec.priority, members, sum(work_lost(member, now) for member in members))
    return Unit(pod.spec.pod_id, pod.spec.priority, (pod,), work_lost(pod, now))


# ---------------------------------------------------------------- fit on one node


def _static_fit(cluster: ClusterState, node: Node, shape: PodShape) -> bool:
    """Whether the node could ever hold the shape: schedulable, model, labels/taints, capacity. O(1)."""
    if not node.schedulable:
        return False
    if shape.gpu_models and node.gpu_model not in shape.gpu_models:
        return False
    if node.cpu_milli < shape.cpu_milli or node.memory_mib < shape.memory_mib:
        return False
    if shape.num_gpu and node.gpu_count < (shape.num_gpu if shape.gpu_milli >= GPU_MILLI else 1):
        return False
    return cluster.index.admits(node.node_class, shape)


def gpus_fit(free: list[int], shape: PodShape) -> bool:
    """Whether GPUs with this much free (milli each) hold the shape's GPUs. O(G)."""
    return _gpu_ok(free, shape)


def _gpu_ok(free: list[int], shape: PodShape) -> bool:
    if not shape.num_gpu:
        return True
    if shape.gpu_milli >= GPU_MILLI:
        return sum(1 for milli in free if milli >= GPU_MILLI) >= shape.num_gpu
    return max(free) >= shape.gpu_milli


def minimal_level(node: Node, shape: PodShape, priority: int) -> int | None:
    """The lowest priority L < ``priority`` such that removing every pod of priority <= L makes room,
    or None. O(L · G) from the per-priority sums."""
    by_priority = node.by_priority
    levels = [level for level in by_priority if level < priority]
    if not levels:
        return None
    if len(levels) > 1:
        levels.sort()
    cpu, memory = node.cpu_free, node.memory_free
    gpu = node.gpu_free
    for level in levels:
        held = by_priority[level]
        cpu += held[0]
        memory += held[1]
        gpu = [free + milli for free, milli in zip(gpu, held[2], strict=True)]
        if cpu >= shape.cpu_milli and memory >= shape.memory_mib and _gpu_ok(gpu, shape):
            return level
    return None


def _contribution(node_id: str, unit: Unit) -> tuple[int, int, list[tuple[int, int]]]:
    cpu = memory = 0
    gpus: list[tuple[int, int]] = []
    for pod in unit.pods:
        if pod.node_id == node_id:
            cpu += pod.spec.cpu_milli
            memory += pod.spec.memory_mib
            gpus.extend((share.index, share.milli) for share in pod.gpus)
    return cpu, memory, gpus


def _best_on_node(
    cluster: ClusterState,
    node: Node,
    shape: PodShape,
    level: int,
    now: int,
    beat: tuple[int, int] | None,
    allowed: Victims = ANY_VICTIM,
) -> tuple[tuple[int, int], list[Unit]] | None:
    """The minimum (victims, work, victim ids) set of units of priority <= ``level`` on the node that makes
    room, strictly better in (victims, work) than ``beat`` (a node with a smaller id found that).

    Sets are enumerated by size; a size is skipped whole when even its units that free the most GPU,
    CPU or memory could not cover what is missing, and a set whose count or work cannot win is not
    checked. At most :data:`SEARCH_BUDGET` sets per node; past it, the greedy set."""
    pods = cluster.pods
    units: dict[str, Unit] = {}
    for pod_id in node.pods:
        pod = lookup(pods, pod_id)  # None: a member of the gang being placed, on trial
        if pod is None or pod.spec.priority > level or not pod.spec.preemptible:
            continue  # a pod that is not preemptible (contract v3) is never a victim; nor is its gang
        spec = pod.spec
        if spec.gang_id is None:
            started = pod.started_at if pod.started_at is not None else now
            units[pod_id] = Unit(pod_id, spec.priority, (pod,), spec.num_gpu * spec.gpu_milli * max(0, now - started))
        elif spec.gang_id not in units:
            units[spec.gang_id] = unit_of(cluster, pod, now)
    if allowed.restricts:
        units = {key: unit for key, unit in units.items() if all(allowed.allow(cluster, pod) for pod in unit.pods)}
    if not units:
        return None
    if beat is not None and beat[0] == 1 and all(unit.count > 1 or unit.work >= beat[1] for unit in units.values()):
        return None  # only one victim with less work could win here
    ordered = [units[key] for key in sorted(units)]
    contributions = [_contribution(node.node_id, unit) for unit in ordered]
    need_cpu = shape.cpu_milli - node.cpu_free
    need_memory = shape.memory_mib - node.memory_free
    need_gpu = _gpu_deficit(node.gpu_free, shape)
    by_cpu = sorted((c[0] for c in contributions), reverse=True)
    by_memory = sorted((c[1] for c in contributions), reverse=True)
    by_gpu = sorted((sum(m for _, m in c[2]) for c in contributions), reverse=True)
    counts = [unit.count for unit in ordered]
    works = [unit.work for unit in ordered]
    best: tuple[tuple[int, int], tuple[str, ...], list[Unit]] | None = None
    budget = SEARCH_BUDGET
    for size in range(1, len(ordered) + 1):
        bound = best[0] if best is not None else beat
        if bound is not None and size > bound[0]:
            break
        if sum(by_cpu[:size]) < need_cpu or sum(by_memory[:size]) < need_memory or sum(by_gpu[:size]) < need_gpu:
            continue
        for chosen in combinations(range(len(ordered)), size):
            budget -= 1
            if budget < 0:
                break
            count = sum(counts[i] for i in chosen)
            work = sum(works[i] for i in chosen)
            if beat is not None and (count, work) >= beat:
                continue
            if best is not None and (count, work) > best[0]:
                continue
            cpu, memory = node.cpu_free, node.memory_free
            gpu = list(node.gpu_free)
            for i in chosen:
                more_cpu, more_memory, more_gpus = contributions[i]
                cpu += more_cpu
                memory += more_memory
                for index, milli in more_gpus:
                    gpu[index] += milli
            if cpu < shape.cpu_milli or memory < shape.memory_mib or not _gpu_ok(gpu, shape):
                continue
            ids = tuple(sorted(pod.spec.pod_id for i in chosen for pod in ordered[i].pods))
            if best is None or ((count, work), ids) < (best[0], best[1]):
                best = ((count, work), ids, [ordered[i] for i in chosen])
        if budget < 0:
            break
    if best is None and budget < 0:
        return _greedy(node, shape, ordered, contributions, beat)
    return None if best is None else (best[0], best[2])


def gpu_deficit(free: list[int], shape: PodShape) -> int:
    """GPU milli that must be freed on a node with this much free for the shape to fit (0: the GPUs suffice)."""
    return _gpu_deficit(free, shape)


def _gpu_deficit(free: list[int], shape: PodShape) -> int:
    """GPU milli that victims must free on the node at least (0 if the GPUs already suffice)."""
    if not shape.num_gpu:
        return 0
    if shape.gpu_milli >= GPU_MILLI:
        largest = sorted(free, reverse=True)[: shape.num_gpu]
        return max(0, shape.num_gpu * GPU_MILLI - sum(largest))
    return max(0, shape.gpu_milli - max(free))


def _greedy(
    node: Node,
    shape: PodShape,
    ordered: list[Unit],
    contributions: list[tuple[int, int, list[tuple[int, int]]]],
    beat: tuple[int, int] | None,
) -> tuple[tuple[int, int], list[Unit]] | None:
    """Past the budget: units by the most GPU they free on the node, then fewest victims, until it fits."""
    order = sorted(
        range(len(ordered)),
        key=lambda i: (-sum(m for _, m in contributions[i][2]), -contributions[i][0], ordered[i].count, ordered[i].key),
    )
    cpu, memory, gpu = node.cpu_free, node.memory_free, list(node.gpu_free)
    chosen: list[int] = []
    for i in order:
        chosen.append(i)
        more_cpu, more_memory, more_gpus = contributions[i]
        cpu += more_cpu
        memory += more_memory
        for index, milli in more_gpus:
            gpu[index] += milli
        if cpu >= shape.cpu_milli and memory >= shape.memory_mib and _gpu_ok(gpu, shape):
            units = sorted((ordered[j] for j in chosen), key=lambda unit: unit.key)
            value = (sum(unit.count for unit in units), sum(unit.work for unit in units))
            return None if beat is not None and value >= beat else (value, units)
    return None


def candidate_nodes(cluster: ClusterState, priority: int, near: Iterable[str] | None) -> list[str]:
    """Nodes running a pod of lower priority (among ``near`` if given), sorted by id."""
    found: set[str] = set()
    for level, nodes in cluster.priority_nodes.items():
        if level < priority:
            found.update(nodes)
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
    ``processor.core.preemption_index``); among ``near`` (a gang's domain) node by node."""
    if near is not None:
        return _plan_pod_on(cluster, shape, priority, now, near, allowed)
    if not could_hold_somewhere(cluster, shape):
        return None  # no node could hold it even emptied: decided without refreshing or filing a node
    index = cluster.preemptible
    index.refresh(cluster.nodes)
    best = _plan_pod_filed(cluster, shape, priority, now, allowed)
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
    their bound: O(B + limit · log) for B buckets."""
    nodes = cluster.nodes
    tiers: dict[tuple[int, int], list[tuple[int, PendingBucket]]] = {}
    for key, bucket in cluster.preemptible.pending.items():
        level = key[5]
        if level >= priority or (beat is not None and level > beat[0]):
            continue
        if not _static_fit(cluster, nodes[bucket.first()], shape):  # alike in all that it reads
            continue
        fewest, deficit = _pending_bound_terms(key, shape)
        if beat is not None and (level, fewest) > beat[:2]:
            continue
        tiers.setdefault((level, fewest), []).append((deficit, bucket))
    chosen: list[str] = []
    for tier in sorted(tiers):
        room = limit - len(chosen)
        found: list[tuple[int, str]] = []
        for deficit, bucket in tiers[tier]:
            entries = bucket.ordered()
            if deficit and beat is not None and tier == beat[:2]:
                # deficit x (now - latest) <= the work to beat  <=>  latest >= now - work // deficit
                entries = entries[: bisect_left(entries, (beat[2] // deficit - now + 1,))]
            found.extend((deficit * max(0, now + minus_latest), node_id) for minus_latest, node_id in entries[:room])
        if len(found) > room:
            found = heapq.nsmallest(room, found)
        chosen.extend(node_id for _, node_id in found)
        if len(chosen) >= limit:
            break
    return chosen


def _pending_bound_terms(key: tuple, shape: PodShape) -> tuple[int, int]:
    """:func:`_bound_terms` from a pending bucket, at its lowest level, from below: (at least how many victims,
    GPU milli they must free at least; 0 if no work bound). GPU milli free and the most free on one GPU
    bound what the largest free GPUs hold. Only the lowest level matters: a node whose victims reach a
    higher level is worse than the bound in the first term already."""
    gpu_count, gpu_pods, largest, total_free, most_free = key[4], key[6], key[7], key[8], key[9]
    if not shape.num_gpu:
        return (1, 0)
    whole = shape.gpu_milli >= GPU_MILLI
    if whole:
        deficit = shape.num_gpu * GPU_MILLI - min(total_free, shape.num_gpu * most_free)
    else:
        deficit = shape.gpu_milli - most_free
    if deficit <= 0 or largest <= 0:
        return (1, 0)
    fewest = -(-deficit // largest)
    if whole and shape.num_gpu == gpu_count and gpu_pods > fewest:
        fewest = gpu_pods
    return (fewest, deficit)


def _plan_pod_filed(
    cluster: ClusterState, shape: PodShape, priority: int, now: int, allowed: Victims
) -> PodPlan | None:
    """:func:`plan_pod` among the nodes filed in the preemption index's classes."""
    index = cluster.preemptible
    nodes = cluster.nodes
    at_level: list[tuple[int, VictimClass, Node]] = []
    best_level: int | None = None
    for group in index.classes.values():  # any order: the minimum below does not depend on it
        node = nodes[group.node_ids[0]]  # any node of the class answers for all of them
        if not _static_fit(cluster, node, shape):
            continue
        level = minimal_level(node, shape, priority)
        if level is None or (best_level is not None and level > best_level):
            continue
        if best_level is None or level < best_level:
            best_level, at_level = level, []
        at_level.append((level, group, node))
    if best_level is None:
        return None
    # Merge the classes' sorted runs into one stream of (bound, node id), least first: exactly the
    # order in which the scan below visits them.
    heap: list[tuple[int, int, str, int]] = []
    runs: list[tuple[Iterator, int, int, int]] = []  # (entries, victims at least, milli x, 0: constant)
    for level, group, node in at_level:
        fewest, deficit = _bound_terms(node, shape, level)
        if not fewest:
            runs.append((iter(group.node_ids), 1, 0, 0))
            continue
        for (stream_level, milli), entries in group.streams.items():
            if stream_level > level:
                continue
            if fewest > 1:
                runs.append((iter(entries), fewest, deficit, 1))
            elif milli >= deficit:
                runs.append((iter(entries), 1, milli, 1))
    for run_id, run in enumerate(runs):
        _push_next(heap, run, run_id, now)
    best: PodPlan | None = None
    seen: set[str] = set()
    while heap:
        count, work, node_id, run_id = heapq.heappop(heap)
        _push_next(heap, runs[run_id], run_id, now)
        if node_id in seen:
            continue  # met again on another run, with a bound no lower than the first
        seen.add(node_id)
        if best is not None and (count, work) > best.cost[1:]:
            break  # neither this node nor any after it can do better
        best = _try_node(cluster, nodes[node_id], shape, best_level, now, best, allowed)
    return best


def _push_next(
    heap: list[tuple[int, int, str, int]], run: tuple[Iterator, int, int, int], run_id: int, now: int
) -> None:
    """The run's next node onto the heap with its bound (see :func:`_lower_bound`)."""
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
        if node is None or not _static_fit(cluster, node, shape):
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
    bounds = sorted(
        (_lower_bound(nodes[node_id], shape, level, now), node_id) for level, node_id in levels if level == best_level
    )
    for bound, node_id in bounds:  # most promising first; the order does not change the answer
        if best is not None and bound > best.cost[1:]:
            break  # neither this node nor any after it can do better
        best = _try_node(cluster, nodes[node_id], shape, best_level, now, best, allowed)
    return best


def _try_node(
    cluster: ClusterState,
    node: Node,
    shape: PodShape,
    level: int,
    now: int,
    best: PodPlan | None,
    allowed: Victims = ANY_VICTIM,
) -> PodPlan | None:
    """The better of ``best`` and the node's least victim set (None if neither exists)."""
    beat = None
    if best is not None:
        # A node with a smaller id wins a tie in victims and work; one with a larger id must do better.
        beat = (best.cost[1], best.cost[2] + (1 if node.node_id < best.node_id else 0))
    found = _best_on_node(cluster, node, shape, level, now, beat, allowed)
    if found is not None:
        (count, work), units = found
        candidate = PodPlan(node.node_id, units, (level, count, work))
        if best is None or _rank(candidate) < _rank(best):
            return candidate
    return best


def _rank(plan: PodPlan) -> tuple[int, int, int, str, tuple[str, ...]]:
    return (*plan.cost, plan.node_id, tuple(pod.spec.pod_id for pod in plan.victims))


def _bound_terms(node: Node, shape: PodShape, level: int) -> tuple[int, int]:
    """(at least how many victims, GPU milli they must free) on the node, from what its pods of priority
    <= ``level`` hold, start times aside; (0, 0) if the GPUs give no bound (the bound is then (1, 0)).

    Victims must free the GPU the node lacks, each at most the largest GPU a pod there holds; a pod that
    wants every GPU of the node in whole takes every pod holding a GPU there along. Alike for the nodes
    of one preemption-index class."""
    deficit = _gpu_deficit(node.gpu_free, shape)
    if not deficit:
        return (0, 0)
    largest = gpu_pods = 0
    for priority, held in node.by_priority.items():
        if priority <= level:
            gpu_pods += held[5]
            for milli in held[4]:
                if milli > largest:
                    largest = milli
    if largest <= 0:
        return (0, 0)
    fewest = -(-deficit // largest)
    if shape.num_gpu == node.gpu_count and shape.gpu_milli >= GPU_MILLI and gpu_pods > fewest:
        fewest = gpu_pods
    return (fewest, deficit)


def _lower_bound(node: Node, shape: PodShape, level: int, now: int) -> tuple[int, int]:
    """At least how many victims, and how much work lost, it takes on this node, from the per-priority
    summary (no pod is visited): :func:`_bound_terms`, every GPU milli freed running since the latest
    start of a pod there at least; one victim alone loses at least its GPU x its time running. Latest
    starts are never lowered when a pod leaves, so the bound stays a bound."""
    fewest, deficit = _bound_terms(node, shape, level)
    if not fewest:
        return (1, 0)
    latest: dict[int, int] = {}
    for priority, held in node.by_priority.items():
        if priority <= level:
            for milli, started in held[4].items():
                if latest.get(milli, -1) < started:
                    latest[milli] = started
    if fewest > 1:  # every GPU milli freed ran at least since the latest start of a pod here
        return (fewest, deficit * max(0, now - max(latest.values())))
    return (1, min(m * max(0, now - t) for m, t in latest.items() if m >= deficit))


def could_hold_somewhere(cluster: ClusterState, shape: PodShape) -> bool:
    """Whether some node present could hold the shape once emptied: :func:`_static_fit` on each distinct fixed
    capacity (model, node class without a reservation's taint, GPUs, CPU, memory), schedulability aside: a
    superset of the nodes :func:`_static_fit` admits. O(C) for C distinct capacities, whatever the nodes."""
    whole = shape.gpu_milli >= GPU_MILLI
    for model, node_class, gpu_count, cpu, memory in cluster.capacities:
        if shape.gpu_models and model not in shape.gpu_models:
            continue
        if shape.num_gpu and gpu_count < (shape.num_gpu if whole else 1):
            continue
        if cpu < shape.cpu_milli or memory < shape.memory_mib:
            continue
        if cluster.index.admits(node_class, shape):
            return True
    return False


def could_hold(cluster: ClusterState, node: Node, shape: PodShape) -> bool:
    """Whether the node could hold the shape once emptied (schedulable, model, labels/taints, capacity)."""
    return _static_fit(cluster, node, shape)


def fits_now(node: Node, shape: PodShape) -> bool:
    """Whether the node's free capacity holds the shape now (a node that ``could_hold`` it)."""
    if node.cpu_free < shape.cpu_milli or node.memory_free < shape.memory_mib:
        return False
    return _gpu_ok(node.gpu_free, shape)


def could_preempt_on(node: Node, shape: PodShape, priority: int, cluster: ClusterState) -> bool:
    """Whether removing the node's pods below ``priority`` would make room for the shape. O(L · G)."""
    return _static_fit(cluster, node, shape) and minimal_level(node, shape, priority) is not None


# ---------------------------------------------------------------- trials


@dataclass(slots=True)
class Trial:
    """Evictions and allocations applied to nodes, the index and usage for a look ahead, then undone."""

    cluster: ClusterState
    evicted: list[Pod] = field(default_factory=list)
    allocated: list[tuple[PodSpec, Choice]] = field(default_factory=list)

    def evict(self, pod: Pod) -> None:
        node = self.cluster.nodes[pod.node_id]  # type: ignore[index]
        node.free(pod.spec, pod.gpus)
        self.cluster.reindex(node)
        self.cluster.charge(pod, node, -1)
        self.evicted.append(pod)

    def allocate(self, spec: PodSpec, choice: Choice) -> None:
        node = self.cluster.nodes[choice.node_id]
        node.allocate(spec, choice.gpus)
        self.cluster.reindex(node)
        self.allocated.append((spec, choice))

    def rollback(self) -> None:
        cluster = self.cluster
        for spec, choice in reversed(self.allocated):
            node = cluster.nodes[choice.node_id]
            node.free(spec, choice.gpus)
            cluster.reindex(node)
        for pod in reversed(self.evicted):
            node = cluster.nodes[pod.node_id]  # type: ignore[index]
            node.allocate(pod.spec, pod.gpus, pod.started_at)
            cluster.reindex(node)
            cluster.charge(pod, node, +1)
        self.allocated.clear()
        self.evicted.clear()


def domains_of(cluster: ClusterState, spec: GangSpec) -> list[tuple[str | None, str | None, list[str] | None]]:
    """Where a gang may go: each domain of its required key (key, value, node ids), else the whole cluster."""
    key = spec.topology_required
    if key is None:
        return [(None, None, None)]
    return [(key, value, cluster.index.domain_nodes(key, value)) for value in sorted(cluster.index.domains(key))]


def plan_gang(
    cluster: ClusterState,
    spec: GangSpec,
    policy: Policy,
    now: int,
    admit: Callable[[gangs.GangPlacement], bool],
    allowed: Victims = ANY_VICTIM,
) -> GangPlan | None:
    """The best domain and victims for a gang, member by member (see the module docstring), or None.

    ``admit`` (the quota check) sees each candidate placement with its victims evicted on trial."""
    best: GangPlan | None = None
    best_key: tuple[int, int, int, str] | None = None
    for key, value, node_ids in domains_of(cluster, spec):
        plan = _gang_in(cluster, spec, policy, now, key, value, node_ids, admit, allowed)
        if plan is None or not plan.units:
            continue
        rank = (*plan.cost, value or "")
        if best_key is None or rank < best_key:
            best, best_key = plan, rank
    return best


def _gang_in(
    cluster: ClusterState,
    spec: GangSpec,
    policy: Policy,
    now: int,
    key: str | None,
    value: str | None,
    node_ids: list[str] | None,
    admit: Callable[[gangs.GangPlacement], bool],
    allowed: Victims,
) -> GangPlan | None:
    trial = Trial(cluster)
    placed: list[tuple[PodSpec, Choice]] = []
    units: dict[str, Unit] = {}
    members = gangs.ordered_members(spec)
    search = None if node_ids is None else DomainSearch(cluster, node_ids, spec.priority, now, allowed)
    try:
        for position, member in enumerate(members):
            shape = reservations.usable_shape(cluster, spec.gang_id, shape_of(member), now)
            groups = cluster.index.feasible_in(shape, key, value)
            if groups:
                choice = policy.place(cluster, shape, groups)
            else:
                if search is None:
                    plan = plan_pod(cluster, shape, spec.priority, now, None, allowed)
                else:
                    plan = search.plan(shape)
                if plan is None:
                    if len(placed) + len(members) - position - 1 < spec.min_members:
                        return None
                    continue
                for unit in plan.units:
                    if unit.key not in units:
                        units[unit.key] = unit
                        for pod in unit.pods:
                            if search is not None:
                                search.touch(pod.node_id)  # type: ignore[arg-type]
                            trial.evict(pod)
                node = cluster.nodes[plan.node_id]
                choice = Choice(plan.node_id, policy.choose_gpus(node, shape), {})
            trial.allocate(member, choice)
            if search is not None:
                search.touch(choice.node_id)
            placed.append((member, choice))
        if len(placed) < spec.min_members or not units:
            return None
        where = f"{key}={value}" if key is not None else f"cluster {cluster.name!r}"
        message = f"placed {len(placed)} of {len(members)} member(s) on {where} by preempting lower-priority pods"
        ordered = sorted(units.values(), key=lambda unit: unit.key)
        placement = gangs.GangPlacement(placed, key, value, message)
        if not admit(placement):
            return None
        return GangPlan(placement, ordered, cost_of(ordered))
    finally:
        trial.rollback()


class DomainSearch:
    """:func:`plan_pod` among the nodes of one topology domain, for the members of one gang in turn.

    The node-by-node search (:func:`_plan_pod_among`) computes every node's victim level and lower bound for
    every member: O(M · N_d · L). Here they are computed once per member shape, kept in a heap ordered as that
    search visits nodes (level, then bound, then node id), and computed again only for the nodes the gang's own
    trial touched (its victims' nodes and the nodes its members took): O(N_d · L) per shape, then O(log N_d)
    per node a member's search meets, plus the exact victim search on those nodes. The answer is the
    node-by-node search's: the same least level, nodes met in the same order, the same stop."""

    __slots__ = ("_changed", "_heaps", "_in_domain", "_version", "allowed", "cluster", "node_ids", "now", "priority")

    def __init__(
        self, cluster: ClusterState, node_ids: Iterable[str], priority: int, now: int, allowed: Victims
    ) -> None:
        self.cluster = cluster
        self.node_ids = list(node_ids)
        self._in_domain = set(self.node_ids)
        self.priority = priority
        self.now = now
        self.allowed = allowed
        self._version: dict[str, int] = {}
        self._changed: list[str] = []
        # Per member shape: the heap of (level, victims at least, work at least, node id, node version), and
        # how much of _changed it has taken in.
        self._heaps: dict[PodShape, tuple[list[tuple[int, int, int, str, int]], list[int]]] = {}

    def touch(self, node_id: str) -> None:
        """The gang's trial changed a node: its level and bound are computed again before the next search."""
        if node_id in self._in_domain:  # a victim gang's members may run outside the domain
            self._version[node_id] = self._version.get(node_id, 0) + 1
            self._changed.append(node_id)

    def _entry(self, node_id: str, shape: PodShape) -> tuple[int, int, int, str, int] | None:
        node = lookup(self.cluster.nodes, node_id)
        if node is None or not _static_fit(self.cluster, node, shape):
            return None
        level = minimal_level(node, shape, self.priority)
        if level is None:
            return None
        count, work = _lower_bound(node, shape, level, self.now)
        return (level, count, work, node_id, self._version.get(node_id, 0))

    def _heap(self, shape: PodShape) -> list[tuple[int, int, int, str, int]]:
        found = self._heaps.get(shape)
        if found is None:
            entries = [entry for entry in (self._entry(n, shape) for n in self.node_ids) if entry is not None]
            heapq.heapify(entries)
            found = self._heaps[shape] = (entries, [len(self._changed)])
            return entries
        heap, seen = found
        changed = self._changed
        for node_id in dict.fromkeys(changed[seen[0] :]):  # measure: the changes not yet taken in
            entry = self._entry(node_id, shape)
            if entry is not None:
                heapq.heappush(heap, entry)
        seen[0] = len(changed)
        return heap

    def plan(self, shape: PodShape) -> PodPlan | None:
        """The best node and victims for a member of this shape, as :func:`plan_pod` with ``near`` the domain."""
        heap = self._heap(shape)
        version = self._version
        nodes = self.cluster.nodes
        best: PodPlan | None = None
        level: int | None = None
        met: list[tuple[int, int, int, str, int]] = []
        try:
            while heap:  # measure: the heap's entries (each met once per search)
                entry = heap[0]
                if entry[4] != version.get(entry[3], 0):
                    heapq.heappop(heap)  # stale: the node's fresh entry is on the heap too
                    continue
                if level is None:
                    level = entry[0]
                if entry[0] != level or (best is not None and entry[1:3] > best.cost[1:]):
                    break  # a higher level, or no node from here on can do better
                met.append(heapq.heappop(heap))
                best = _try_node(self.cluster, nodes[entry[3]], shape, level, self.now, best, self.allowed)
        finally:
            for entry in met:  # searching changed no node: their entries stay true
                heapq.heappush(heap, entry)
        return best
