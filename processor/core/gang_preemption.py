"""Priority preemption for a gang: the topology domain and the victims that make room for all its members.

**A gang** (all or nothing): per topology domain it may use (``topology_required``: each
domain of the key; otherwise the whole cluster), members are placed largest first, each on
free capacity if it fits there (the cluster's policy), else by the pod search above within
the domain, on trial; the domain whose victims are least under the order wins. This is
member by member, not a joint minimum over the gang.

Each member that fits nowhere free is placed by the pod search (``processor.core.preemption``) within the
domain, its victims evicted on trial (``preemption_plans.Trial``) before the next member is placed.

While each member's victims are pods of no gang on the node it takes, that node is the only one changed before
the next member of the same shape: its plan comes from ``preemption.NextPlans``, which keeps the search's merged
stream of candidate nodes (filed and pending) and the plans of the nodes it met, the nodes taken asked again,
instead of a search per member. A gang that takes several of one node's victims (the cheapest of the cluster:
pods that started last), or the next node's each, then pays a search only when that stream ends below its guard
(a node filed at a higher level), meets a node of more than 14 pods, or the index moves a node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from processor.core import gangs, reservations
from processor.core.node_victims import fits_now
from processor.core.policies.base import Choice, Policy
from processor.core.preemption import NextPlans, plan_pod
from processor.core.preemption_plans import ANY_VICTIM, GangPlan, PodPlan, Trial, Unit, Victims, cost_of
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Node, shape_of
from schemas.events import GangSpec, PodSpec


def domains_of(cluster: ClusterState, spec: GangSpec) -> list[tuple[str | None, str | None]]:
    """Where a gang may go: each domain (key, value) of its required key, else the whole cluster (None, None)."""
    key = spec.topology_required
    if key is None:
        return [(None, None)]
    return [(key, value) for value in sorted(cluster.index.domains(key))]


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
    for key, value in domains_of(cluster, spec):
        plan = _gang_in(cluster, spec, policy, now, key, value, admit, allowed)
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
    admit: Callable[[gangs.GangPlacement], bool],
    allowed: Victims,
) -> GangPlan | None:
    trial = Trial(cluster)
    placed: list[tuple[PodSpec, Choice]] = []
    units: dict[str, Unit] = {}
    members = gangs.ordered_members(spec)
    held: dict[PodShape, PodShape] = {}  # member shape -> held to the domain
    last: _Last | None = None  # the last member's plan, while it changed its node alone
    plans: NextPlans | None = None  # the next members' plans while they do
    try:
        for position, member in enumerate(members):
            shape = reservations.usable_shape(cluster, spec.gang_id, shape_of(member), now)
            if last is not None and held.get(shape) is last.shape and not fits_now(cluster.nodes[last.node_id], shape):
                groups = []  # no room for the shape anywhere before the last member, which changed that node alone
            else:
                groups = cluster.index.feasible_in(shape, key, value)
            if groups:
                choice = policy.place(cluster, shape, groups)
                trial.allocate(member, choice)
                last = plans = None
            else:
                within = held.get(shape)
                if within is None:
                    within = held[shape] = in_domain(shape, key, value)
                plan = plans.next(cluster) if plans is not None and plans.shape is within else None
                if plan is None:
                    plan = plan_pod(cluster, within, spec.priority, now, None, allowed)
                    plans = None
                    if plan is not None and changes_its_node_alone(plan, allowed):
                        plans = NextPlans(cluster, within, spec.priority, now, plan)
                elif not changes_its_node_alone(plan, allowed):
                    plans = None  # its victims change other nodes' plans
                last = _Last(within, plan.node_id) if plans is not None and plan is not None else None
                if plan is None:
                    if len(placed) + len(members) - position - 1 < spec.min_members:
                        return None
                    continue
                changed: dict[str, Node] = {}  # reindexed once each, after the member takes its place
                for unit in plan.units:
                    if unit.key not in units:
                        units[unit.key] = unit
                        for pod in unit.pods:
                            evicted_on = trial.evict(pod, reindex=False)
                            changed[evicted_on.node_id] = evicted_on
                node = cluster.nodes[plan.node_id]
                choice = Choice(plan.node_id, policy.choose_gpus(node, shape), {})
                changed[node.node_id] = trial.allocate(member, choice, reindex=False)
                for changed_node in changed.values():
                    cluster.reindex(changed_node)
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


class _Last(NamedTuple):
    """The last member's plan while it changed its node alone: no other node's free room changed since a member of
    its shape fitted nowhere free."""

    shape: PodShape  # the shape searched (held to the domain)
    node_id: str  # the node the plan took


def changes_its_node_alone(plan: PodPlan, allowed: Victims) -> bool:
    """Whether evicting the plan's victims changes no node's plan but its own, for a search without restrictions:
    they are pods of no gang (a gang's unit, and its members' spares, read pods on other nodes), all on its
    node. O(victims)."""
    if allowed.restricts:
        return False  # not searched so (which pods may go can read quota usage, which the evictions change)
    for unit in plan.units:
        for pod in unit.pods:
            if pod.spec.gang_id is not None or pod.node_id != plan.node_id:
                return False
    return True


def in_domain(shape: PodShape, key: str | None, value: str | None) -> PodShape:
    """A member's shape held to its gang's topology domain ``key=value`` (the whole cluster if ``key`` is None):
    the label joins its node selector. The preemption search then reads the domain's nodes only, from the
    preemption index (the classes and pending buckets with that label, :meth:`PreemptionIndex.buckets`), as
    for any pod with a selector: O(C · L) for C classes, not O(N_d) per member. The domain is the schedulable
    nodes with the label (``CapacityIndex.domains``), exactly those the selector admits."""
    if key is None or value is None or (key, value) in shape.node_selector:
        return shape
    return shape._replace(node_selector=tuple(sorted((*shape.node_selector, (key, value)))))
