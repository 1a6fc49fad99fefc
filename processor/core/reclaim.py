"""Reclaim: a lender asks inside its nominal quota that others borrowed, and borrowers give it back.

Planned on trial (:class:`processor.core.preemption_plans.Trial`): nothing is evicted unless the job then
starts. Which borrowers' pods go first, and the quota arithmetic: :mod:`processor.core.quotas`.
"""

from __future__ import annotations

from collections.abc import Mapping

from sortedcontainers import SortedList

from processor.core import cohort_tree, node_victims, preemption, preemption_plans, quota_keys, quotas
from processor.core.policies.base import Choice, Policy
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Pod, lookup
from schemas.commands import ANY_MODEL, PREEMPTING, RECLAIM_LOWER, Quota
from schemas.events import PodSpec

NODE_PLANS = 64
"""Node plans tried at most per reclaim: those of the least lower bound on their victims (then node id). With
fewer nodes hosting borrowers than this the search is exhaustive; beyond, it is budgeted (a plan with fewer
victims on a node further down may be missed; the plan without a node is always tried)."""

PodReclaim = tuple[list[preemption_plans.Unit], Choice | None, preemption_plans.PodPlan, PodShape]
"""A pod's reclaim plan: the borrowers' units it takes, where it goes (a choice on free capacity, or a
priority-preemption plan after the reclaim), and the shape it is placed with."""


class Borrowers:
    """Where a reclaim finds its victims: the running pods of the cohort peers that borrow on a key, in reclaim's
    order (lowest priority, then youngest, then id), read from the lists the state keeps per tenant and GPU model
    (``ClusterState.reclaimable``), never by visiting every pod. A peer counts while it borrows on the key; within
    one trial evictions only lower usage, so a peer that stops borrowing never borrows again, and a pod evicted
    on trial leaves its list."""

    __slots__ = ("below", "cluster", "lender", "priority", "protected", "quota")

    def __init__(
        self, cluster: ClusterState, lender: str, quota: Quota, protected: Mapping[str, None], priority: int = 0
    ) -> None:
        self.cluster = cluster
        self.lender = lender
        self.quota = quota
        self.protected = protected
        self.priority = priority
        # reclaim_within_cohort (contract v4): lower_priority takes only borrowers' units below the lender's job.
        self.below = priority if quota.policy.reclaim_within_cohort == RECLAIM_LOWER else None

    def lists(self, key: str) -> list[tuple[tuple[str, str], SortedList]]:
        """((peer, model), its list) for each peer of the lender's cohort that borrows on the key now, by peer
        and model. O(members · models)."""
        cluster = self.cluster
        cohort = self.quota.cohort
        out: list[tuple[tuple[str, str], SortedList]] = []
        if cohort is None:
            return out
        for peer in quotas.tree_members(cluster, cohort):
            if peer == self.lender or not _borrows(cluster, peer, key):
                continue
            quota = cluster.quotas[peer]
            if key in (quota_keys.CPU, quota_keys.MEMORY):
                models = [""]
            elif key == quota_keys.GPU + ANY_MODEL:
                models = sorted(m for m in cluster.model_nodes if m and m not in quota.nominal_gpus)
            else:
                models = [key[len(quota_keys.GPU) :]]
            for model in models:
                pods = cluster.reclaimable.get((peer, model))
                if pods:
                    out.append(((peer, model), pods))
        return out

    def allowed(self, pod: Pod, key: str) -> bool:
        """Whether the pod itself counts on the key (a CPU-only pod does not on a GPU key, and so on)."""
        if key == quota_keys.CPU:
            return pod.spec.cpu_milli > 0
        if key == quota_keys.MEMORY:
            return pod.spec.memory_mib > 0
        return True  # filed under its model only if it holds GPUs

    def unit(self, pod: Pod) -> preemption_plans.Unit | None:
        """The pod's eviction (a gang: all its running members), unless one of them is protected or not
        preemptible, or the lender's ``reclaim_within_cohort`` keeps it (not of lower priority)."""
        if not pod.spec.preemptible or (self.below is not None and pod.spec.priority >= self.below):
            return None
        if quotas.shielded(self.cluster, pod, self.priority):
            return None
        unit = preemption_plans.unit_of(self.cluster, pod, 0)
        if any(member.spec.pod_id in self.protected for member in unit.pods):
            return None
        return unit

    def walker(self) -> Walker:
        return Walker(self)


class Walker:
    """One trial's walk over :class:`Borrowers`: the next unit reclaim takes on a key (or on one node), merging
    the peers' lists by reclaim's order. Each list keeps a cursor (the last entry passed), and an entry evicted
    on trial has left its list, so a walk costs O(log p) per unit taken or candidate passed over."""

    __slots__ = ("_cursors", "_nodes", "borrowers")

    def __init__(self, borrowers: Borrowers) -> None:
        self.borrowers = borrowers
        self._cursors: dict[tuple[str, tuple[str, str]], Entry] = {}
        self._nodes: dict[tuple[str, str], list[tuple[Entry, Pod]]] = {}

    def next_unit(self, key: str, node_id: str | None = None, level: str | None = None) -> preemption_plans.Unit | None:
        """The first candidate's unit still to take, or None if there is none; with ``level`` (the cohort of the
        tree that has no room), only a pod whose eviction lowers that cohort's use (its tenant is below it and
        borrows beyond what the cohorts between keep). A candidate passed over is not taken later in the walk."""
        if node_id is not None:
            return self._next_on_node(key, node_id)
        borrowers = self.borrowers
        pods = borrowers.cluster.pods
        while True:  # measure: the entries of the borrowing peers' lists after their cursors
            best: tuple[Entry, tuple[str, str]] | None = None
            for handle, entries in borrowers.lists(key):
                cursor = self._cursors.get((key, handle))
                at = entries.bisect_right(cursor) if cursor is not None else 0
                if at < len(entries) and (best is None or entries[at] < best[0]):
                    best = (entries[at], handle)
            if best is None:
                return None
            entry, handle = best
            self._cursors[(key, handle)] = entry
            pod = pods[entry[2]]
            if borrowers.allowed(pod, key) and (level is None or _relieves(borrowers.cluster, pod, key, level)):
                unit = borrowers.unit(pod)
                if unit is not None:
                    return unit

    def _next_on_node(self, key: str, node_id: str) -> preemption_plans.Unit | None:
        """As :meth:`next_unit`, among the pods of one node (listed once per walk: O(p log p) for its p pods)."""
        borrowers = self.borrowers
        cluster = borrowers.cluster
        listed = self._nodes.get((key, node_id))
        if listed is None:
            listed = self._nodes[(key, node_id)] = _node_candidates(borrowers, key, node_id)
        while listed:  # measure: the node's candidates left
            _, pod = listed.pop()
            if pod.node_id != node_id or pod.spec.pod_id not in cluster.nodes[node_id].pods:
                continue  # evicted on trial (a gang member taken with its gang)
            if not _borrows(cluster, pod.spec.tenant, key):
                continue
            unit = borrowers.unit(pod)
            if unit is not None:
                return unit
        return None


Entry = tuple[int, int, str]
"""A running pod in reclaim's order: (priority, -start, pod id)."""


def _node_candidates(borrowers: Borrowers, key: str, node_id: str) -> list[tuple[Entry, Pod]]:
    """The node's pods that reclaim may take on the key now, last first (popped from the end)."""
    cluster = borrowers.cluster
    cohort = borrowers.quota.cohort
    peers = {p for p in quotas.tree_members(cluster, cohort) if p != borrowers.lender} if cohort is not None else set()
    out = []
    for pod_id in cluster.nodes[node_id].pods:
        pod = lookup(cluster.pods, pod_id)
        if pod is None or pod.spec.tenant not in peers or not borrowers.allowed(pod, key):
            continue
        peer = cluster.quotas[pod.spec.tenant]
        if key not in quota_keys.demand(peer, pod.spec, cluster.nodes[node_id].gpu_model):
            continue
        if _borrows(cluster, pod.spec.tenant, key):
            out.append(((pod.spec.priority, -(pod.started_at or 0), pod_id), pod))
    out.sort(reverse=True)
    return out


def _relieves(cluster: ClusterState, pod: Pod, key: str, at: str) -> bool:
    """Whether evicting a borrower's running pod lowers the use of cohort ``at`` on the key. Always, without a
    declared tree (``at`` is the borrower's own cohort). O(depth)."""
    if not cluster.cohort_specs or pod.node_id is None:
        return True
    quota = cluster.quotas[pod.spec.tenant]
    if quota.cohort is None:
        return False
    amount = quota_keys.demand(quota, pod.spec, cluster.nodes[pod.node_id].gpu_model).get(key, 0)
    held = quotas.used(cluster, pod.spec.tenant, quota, key)
    kept = quota_keys.guaranteed(quota, key)
    freed = max(0, held - kept) - max(0, held - amount - kept)
    return cohort_tree.relief(cluster.cohort_specs, cluster.pools, quota.cohort, key, freed, at) > 0


def _borrows(cluster: ClusterState, tenant: str, key: str) -> bool:
    """Whether a cohort tenant runs more than its nominal quota on the key (its own key). O(models)."""
    quota = cluster.quotas[tenant]
    if not quota_keys.has_key(quota, key):
        return False
    amount = quota_keys.nominal(quota, key)
    return amount is not None and quotas.used(cluster, tenant, quota, key) > amount


def reclaim_on_trial(
    cluster: ClusterState,
    trial: preemption_plans.Trial,
    tenant: str,
    quota: Quota,
    wanted: quotas.Demand,
    protected: Mapping[str, None],
    walker: Walker | None = None,
    priority: int = 0,
) -> list[preemption_plans.Unit] | None:
    """Evict borrowers on trial until ``wanted`` fits the lender's quota: the units taken, or None if the
    lender would still be short (or short on something reclaim cannot give)."""
    if walker is None:
        walker = Borrowers(cluster, tenant, quota, protected, priority).walker()
    units: list[preemption_plans.Unit] = []
    while True:  # measure: the borrowers' running pods not yet evicted on trial
        shortfall = quotas.check(cluster, tenant, quota, wanted)
        if shortfall is None:
            return units
        if not shortfall.reclaimable:
            return None
        unit = walker.next_unit(shortfall.key, None, shortfall.cohort)
        if unit is None:
            return None
        for pod in unit.pods:
            trial.evict(pod)
        units.append(unit)


def plan_pod(
    cluster: ClusterState,
    spec: PodSpec,
    usable: PodShape,
    admission: quotas.Admission,
    policy: Policy,
    now: int,
    protected: Mapping[str, None],
) -> PodReclaim | None:
    """The reclaim that lets a pod start with the fewest victims, or None.

    Borrowers' pods are preempted, lowest priority then youngest first, until the lender's
    quota has room, and no more; the pod then starts on free capacity, or by priority
    preemption. Or, if that takes fewer victims, borrowers' pods on one node go first (same
    order) until the pod fits that node, then others until the quota has room. The plan with
    the fewest victims wins (ties: the first kind, then the node id).

    Cost: one trial per plan tried, each walking the borrowers' lists (O(log p) per victim or candidate
    passed over). Node plans are listed only if the plan without a node failed or could take fewer victims
    (then O(N_b log N_b) for the N_b nodes where borrowers run, no pod visited), and tried in order of a
    lower bound on their victims while that bound could still beat the best plan found, at most
    :data:`NODE_PLANS` of them; a node where the pod fits already never beats the plan without a node,
    which ties it and wins ties."""
    quota = quotas.quota_of(cluster, spec.tenant)
    assert quota is not None
    by_key: dict[str, list[str]] = {}
    for model, shortfall in admission.shortfalls:
        if shortfall.reclaimable:
            by_key.setdefault(shortfall.key, []).append(model)
    best: tuple[tuple[int, str], PodReclaim] | None = None
    borrowers = Borrowers(cluster, spec.tenant, quota, protected, spec.priority)
    for key in sorted(by_key):
        models = [model for model in by_key[key] if model]
        shape = usable._replace(gpu_models=tuple(models)) if models and spec.num_gpu else usable
        wanted = quotas.demand(quota, spec, by_key[key][0])
        short = quotas.check(cluster, spec.tenant, quota, wanted)
        deficit = short.need - short.room if short is not None and short.key == key else 0
        options: list[tuple[int, str | None]] = [(0, None)]
        position = 0
        while position < len(options):  # measure: the options left (the node plans are listed at most once)
            bound, node_id = options[position]
            position += 1
            if best is not None and (bound, node_id or "") >= best[0]:
                break  # neither this node nor any after it can have fewer victims
            trial = preemption_plans.Trial(cluster)
            try:
                found = _option(cluster, trial, spec, quota, key, wanted, shape, node_id, policy, now, borrowers)
            finally:
                trial.rollback()
            if found is not None:
                units, choice, plan = found
                rank = (sum(unit.count for unit in units) + (plan.cost[1] if plan.units else 0), node_id or "")
                if best is None or rank < best[0]:
                    best = (rank, (units, choice, plan, shape))
            largest = _largest(cluster, borrowers, key)
            if node_id is None and (best is None or best[0][0] > _fewest(deficit, largest)):
                # A node plan takes at least as many victims as covering the quota's shortfall with the largest
                # borrowers' pods does (and one), and the plan without a node wins a tie: only if it could
                # still take fewer are the node plans worth listing (O(P_b log P_b)).
                options += _node_bounds(cluster, borrowers, key, shape, largest)[:NODE_PLANS]
    return None if best is None else best[1]


def _largest(cluster: ClusterState, borrowers: Borrowers, key: str) -> int:
    """The largest GPU share (milli) one borrower pod holds on a GPU key (``ClusterState.reclaim_sizes``); 0 on
    CPU and memory keys. O(members · models · sizes)."""
    if not key.startswith(quota_keys.GPU):
        return 0
    largest = 0
    for handle, _ in borrowers.lists(key):
        sizes = cluster.reclaim_sizes.get(handle)
        if sizes:
            largest = max(largest, max(sizes))
    return largest


def _fewest(deficit: int, largest: int) -> int:
    """At least how many victims cover a quota shortfall of ``deficit`` with pods of at most ``largest``, and 1."""
    return max(1, -(-deficit // largest)) if deficit > 0 and largest else 1


def _node_bounds(
    cluster: ClusterState, borrowers: Borrowers, key: str, shape: PodShape, largest: int
) -> list[tuple[int, str]]:
    """(at least how many victims, node id) of each node plan worth trying, least first: nodes where a
    borrowing peer runs pods (``ClusterState.reclaim_nodes``), that could hold the shape, and where it does
    not fit now. The bound: the GPU the shape lacks there over the largest GPU share one borrower pod holds,
    and 1. O(N_b log N_b) for the N_b nodes of the borrowers (alike nodes, one signature, asked once), no pod
    visited."""
    nodes: dict[str, None] = {}
    for peer, _ in {handle[0]: None for handle, _ in borrowers.lists(key)}.items():
        nodes.update(dict.fromkeys(cluster.reclaim_nodes.get(peer, ())))
    out: list[tuple[int, str]] = []
    by_signature: dict[object, int] = {}  # nodes of one signature are alike in all this: asked once
    signature_of = cluster.index.signature_of
    for node_id in nodes:
        signature = signature_of(node_id)  # None: unschedulable
        if signature is None:
            continue
        bound = by_signature.get(signature)
        if bound is None:
            node = cluster.nodes[node_id]
            if node_victims.fits_now(node, shape) or not node_victims.could_hold(cluster, node, shape):
                bound = 0
            else:
                deficit = node_victims.gpu_deficit(node.gpu_free, shape)
                bound = max(1, -(-deficit // largest)) if largest and deficit else 1
            by_signature[signature] = bound
        if bound:
            out.append((bound, node_id))
    out.sort()
    return out


def _option(
    cluster: ClusterState,
    trial: preemption_plans.Trial,
    spec: PodSpec,
    quota: Quota,
    key: str,
    wanted: quotas.Demand,
    shape: PodShape,
    node_id: str | None,
    policy: Policy,
    now: int,
    borrowers: Borrowers,
) -> tuple[list[preemption_plans.Unit], Choice | None, preemption_plans.PodPlan] | None:
    """One reclaim plan on trial (see :func:`plan_pod`): its units, and where the pod goes."""
    units: list[preemption_plans.Unit] = []
    walker = borrowers.walker()
    if node_id is not None:
        node = cluster.nodes[node_id]
        while not node_victims.fits_now(node, shape):  # measure: the borrowers' pods on the node
            unit = walker.next_unit(key, node_id)
            if unit is None:
                return None
            for pod in unit.pods:
                trial.evict(pod)
            units.append(unit)
    more = reclaim_on_trial(cluster, trial, spec.tenant, quota, wanted, borrowers.protected, walker)
    if more is None:
        return None
    units += more
    if node_id is not None:
        choice = Choice(node_id, policy.choose_gpus(cluster.nodes[node_id], shape), {})
        return units, choice, preemption_plans.PodPlan(node_id, [], (0, 0, 0))
    groups = cluster.index.feasible(shape)
    if groups:
        choice = policy.place(cluster, shape, groups)
        return units, choice, preemption_plans.PodPlan(choice.node_id, [], (0, 0, 0))
    level = preemption_plans.reach(spec.priority, spec.preemption)
    if spec.preemption in PREEMPTING and preemption_plans.lower_priority_exists(cluster, level):
        allowed = preemption_plans.Victims(borrowers.protected, equal=preemption_plans.equal_of(spec))
        plan = preemption.plan_pod(cluster, shape, level, now, None, allowed)
        if plan is not None:
            return units, None, plan
    return None
