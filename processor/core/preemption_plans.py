"""What a preemption takes and gives: the units of eviction, the plans, and evicting on trial.

A victim that is a gang member takes its whole gang along (:class:`Unit`): every running member is a victim,
counted and charged. Nothing is evicted unless the preemptor then fits: a search evicts on trial
(:class:`Trial`) and the fold emits only a plan that places it. The searches: ``processor.core.preemption``
(a pod), ``processor.core.gang_preemption`` (a gang), ``processor.core.node_victims`` (one node).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from processor.core import gangs, quotas
from processor.core.policies.base import Choice
from processor.core.state import ClusterState, Node, Pod
from schemas.commands import BORROW_LOWER, DISRUPT_ABOVE_MIN, PREEMPT_LOWER_OR_NEWER
from schemas.events import GangSpec, PodSpec


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
    # borrow_within_cohort (contract v4): with borrowers_only, the preemptor's cohort peers' pods may go too (also
    # inside their nominal quota), those of priority at most ``peer_max_priority`` (None: any lower one).
    peers: Mapping[str, None] | None = None
    peer_max_priority: int | None = None
    # lower_or_newer_equal_priority (contract v4): the preemptor's (priority, arrival); the search reaches its own
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
    ``borrow_within_cohort`` is ``lower_priority`` (contract v4), its cohort peers' pods too, of at most
    ``borrow_max_victim_priority``. O(cohort members)."""
    quota = quotas.quota_of(cluster, tenant)
    if quota is None or quota.cohort is None or quota.policy.borrow_within_cohort != BORROW_LOWER:
        return Victims(protected, True, equal=equal)
    peers = {member: None for member in quotas.tree_members(cluster, quota.cohort) if member != tenant}
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
    """Whether any pod of lower priority runs in the cluster. O(1): the lowest priority that runs."""
    levels = cluster.priority_levels
    return bool(levels) and levels[0] < priority


def unit_of(cluster: ClusterState, pod: Pod, now: int) -> Unit:
    """The eviction a running pod stands for: itself, or its whole gang (its members still on their nodes: one
    evicted on trial is not counted again)."""
    gang_id = pod.spec.gang_id
    if gang_id is not None:
        gang = cluster.gangs.get(gang_id)
        if gang is not None:
            members = _on_nodes(cluster, gang.placed)
            return Unit(gang_id, pod.spec.priority, members, sum(work_lost(member, now) for member in members))
    return Unit(pod.spec.pod_id, pod.spec.priority, (pod,), work_lost(pod, now))


def _on_nodes(cluster: ClusterState, pod_ids: Iterable[str]) -> tuple[Pod, ...]:
    nodes, pods = cluster.nodes, cluster.pods
    out = []
    for pod_id in sorted(pod_ids):
        member = pods[pod_id]
        if member.node_id is not None and pod_id in nodes[member.node_id].pods:
            out.append(member)
    return tuple(out)


def spare_members(cluster: ClusterState, pod: Pod) -> int:
    """How many members of the pod's gang may be taken one by one (``SubmitGang.disruption: above_min``, contract
    v4): those running (and not evicted on trial) above ``min_members``; 0 for any other pod. O(M). Each role's
    own limit: :func:`role_spares`."""
    gang_id = pod.spec.gang_id
    if gang_id is None:
        return 0
    gang = cluster.gangs.get(gang_id)
    if gang is None or gang.spec.disruption != DISRUPT_ABOVE_MIN:
        return 0
    return max(0, len(_on_nodes(cluster, gang.placed)) - gang.spec.min_members)


def role_spares(cluster: ClusterState, gang_id: str) -> dict[str, int]:
    """Per role with a ``min_members_per_role``: how many of its members running (and not evicted on trial) may
    be taken one by one (``disruption: above_min``): those above the role's minimum. O(M)."""
    gang = cluster.gangs.get(gang_id)
    if gang is None or not gang.spec.min_members_per_role:
        return {}
    counts = gangs.role_counts(pod.spec for pod in _on_nodes(cluster, gang.placed))
    return {role: max(0, counts.get(role, 0) - n) for role, n in gang.spec.min_members_per_role.items()}


@dataclass(slots=True)
class Trial:
    """Evictions and allocations applied to nodes, the index and usage for a look ahead, then undone."""

    cluster: ClusterState
    evicted: list[Pod] = field(default_factory=list)
    allocated: list[tuple[PodSpec, Choice]] = field(default_factory=list)

    def evict(self, pod: Pod, reindex: bool = True) -> Node:
        """Free the pod on trial. ``reindex=False``: the caller reindexes its node before the next search
        (once for several changes on one node); the node is returned for that."""
        node = self.cluster.nodes[pod.node_id]  # type: ignore[index]
        node.free(pod.spec, pod.gpus, pod.started_at)
        if reindex:
            self.cluster.reindex(node)
        self.cluster.charge(pod, node, -1)
        self.evicted.append(pod)
        return node

    def allocate(self, spec: PodSpec, choice: Choice, reindex: bool = True) -> Node:
        """Take the pod's resources on trial (``reindex=False``: as :meth:`evict`)."""
        node = self.cluster.nodes[choice.node_id]
        node.allocate(spec, choice.gpus)
        if reindex:
            self.cluster.reindex(node)
        self.allocated.append((spec, choice))
        return node

    def rollback(self) -> None:
        """Undo every change, then reindex each node changed once (nothing reads the index in between), in
        the order the undo first met them. O(changes)."""
        cluster = self.cluster
        changed: dict[str, Node] = {}
        for spec, choice in reversed(self.allocated):
            node = cluster.nodes[choice.node_id]
            node.free(spec, choice.gpus)
            changed[node.node_id] = node
        for pod in reversed(self.evicted):
            node = cluster.nodes[pod.node_id]  # type: ignore[index]
            node.allocate(pod.spec, pod.gpus, pod.started_at)
            changed[node.node_id] = node
            cluster.charge(pod, node, +1)
        for node in changed.values():
            cluster.reindex(node)
        self.allocated.clear()
        self.evicted.clear()
