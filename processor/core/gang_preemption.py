"""Priority preemption for a gang: the topology domain and the victims that make room for all its members.

**A gang** (all or nothing): per topology domain it may use (``topology_required``: each
domain of the key; otherwise the whole cluster), members are placed largest first, each on
free capacity if it fits there (the cluster's policy), else by the pod search above within
the domain, on trial; the domain whose victims are least under the order wins. This is
member by member, not a joint minimum over the gang.

Each member that fits nowhere free is placed by the pod search (``processor.core.preemption``) within the
domain, its victims evicted on trial (``preemption_plans.Trial``) before the next member is placed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from processor.core import gangs, reservations
from processor.core.node_victims import could_hold, lower_bound, minimal_level, try_node
from processor.core.policies.base import Choice, Policy
from processor.core.preemption import plan_pod
from processor.core.preemption_plans import ANY_VICTIM, GangPlan, PodPlan, Trial, Unit, Victims, cost_of
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Node, lookup, shape_of
from schemas.events import GangSpec, PodSpec


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
                trial.allocate(member, choice)
            else:
                if search is None:
                    plan = plan_pod(cluster, shape, spec.priority, now, None, allowed)
                else:
                    plan = search.plan(shape)
                if plan is None:
                    if len(placed) + len(members) - position - 1 < spec.min_members:
                        return None
                    continue
                changed: dict[str, Node] = {}  # reindexed once each, after the member takes its place
                for unit in plan.units:
                    if unit.key not in units:
                        units[unit.key] = unit
                        for pod in unit.pods:
                            if search is not None:
                                search.touch(pod.node_id)  # type: ignore[arg-type]
                            evicted_on = trial.evict(pod, reindex=False)
                            changed[evicted_on.node_id] = evicted_on
                node = cluster.nodes[plan.node_id]
                choice = Choice(plan.node_id, policy.choose_gpus(node, shape), {})
                changed[node.node_id] = trial.allocate(member, choice, reindex=False)
                for changed_node in changed.values():
                    cluster.reindex(changed_node)
            if search is not None:
                search.touch(choice.node_id)
            placed.append((member, choice))
        if len(placed) < spec.min_members or not units:
            return None
        if spec.min_members_per_role and gangs.role_short(spec, [member for member, _ in placed]) is not None:
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
        if node is None or not could_hold(self.cluster, node, shape):
            return None
        level = minimal_level(node, shape, self.priority)
        if level is None:
            return None
        count, work = lower_bound(node, shape, level, self.now)
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
                entry_level, victims, work, node_id, node_version = heap[0]
                if node_version != version.get(node_id, 0):
                    heapq.heappop(heap)  # stale: the node's fresh entry is on the heap too
                    continue
                if level is None:
                    level = entry_level
                if entry_level != level or (best is not None and (victims, work) > best.cost[1:]):
                    break  # a higher level, or no node from here on can do better
                met.append(heapq.heappop(heap))
                best = try_node(self.cluster, nodes[node_id], shape, level, self.now, best, self.allowed)
        finally:
            for entry in met:  # searching changed no node: their entries stay true
                heapq.heappush(heap, entry)
        return best
