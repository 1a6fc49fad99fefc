"""Placing a gang: every member (at least ``min_members``) at once, within one topology domain, or none.

Nodes carry topology as ordinary labels (``topology/block``, ``topology/rack``,
``topology/nvlink``). ``topology_required: K`` keeps all members on nodes with one
value of label K; ``topology_preferred: K`` tries K's domains first, then the wider
levels of :data:`TOPOLOGY_LEVELS` after K, then the whole cluster. Among the domains
of a level, those whose summed free capacity (kept per label value by the capacity
index) can hold the gang are tried in order of least left over, so large domains
stay whole for large gangs; the first one whose members all fit wins. Inside the
domain, members (largest first) are placed one by one by the cluster's policy on a
trial basis: each allocation is applied to the nodes and the index, then all of
them are rolled back, and the fold emits the placements as events, which apply
them for good. A gang never holds anything while it waits.

Cost: O(D) to rank the D domains of a level, plus, per domain tried, O(M · S_d)
for M members over the S_d signature groups of the domain; never a scan of the nodes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from processor.core import reservations
from processor.core.capacity import DomainFree
from processor.core.policies.base import Choice, Policy
from processor.core.reasons import queue_reasons
from processor.core.resources import PodShape, Signature, class_admits
from processor.core.state import ClusterState, shape_of
from schemas.codes import QueueReasonCode
from schemas.commands import AFTER_OK, GPU_MILLI, SubmitGang
from schemas.events import GangSpec, PodSpec, QueueReason

TOPOLOGY_LEVELS = ("topology/nvlink", "topology/rack", "topology/block")
"""Topology label keys from the tightest domain to the widest: where ``topology_preferred`` falls back."""


Best = tuple[int, str | None, str | None, PodSpec | None, tuple[str, int, int] | None]
"""The trial that placed the most members: (placed, key, value, the first member missing, the role short)."""


@dataclass(slots=True)
class GangPlacement:
    placed: list[tuple[PodSpec, Choice]]
    topology_key: str | None
    domain: str | None
    message: str


def gang_spec(command: SubmitGang, now: int, arrival: int, preemption: str) -> GangSpec:
    """The gang as the fold accepts it: member pod specs carry the gang's tenant, priority, time and limit."""
    members = tuple(
        PodSpec(
            member.pod_id,
            command.tenant,
            command.priority,
            member.num_gpu,
            member.gpu_milli,
            member.cpu_milli,
            member.memory_mib,
            tuple(member.gpu_models),
            dict(sorted(member.node_selector.items())),
            tuple(member.tolerations),
            now,
            arrival,
            command.gang_id,
            command.time_limit_ms,
            (),
            AFTER_OK,
            preemption,
            preemptible=command.preemptible,
            role=member.role,
        )
        for member in command.members
    )
    return GangSpec(
        command.gang_id,
        command.tenant,
        command.priority,
        members,
        command.min_members or len(members),
        command.topology_required,
        command.topology_preferred,
        command.timeout_ms,
        command.time_limit_ms,
        tuple(dict.fromkeys(command.depends_on)),
        command.dependency,
        now,
        arrival,
        preemption,
        command.retry,
        preemptible=command.preemptible,
        disruption=command.disruption,
        min_members_per_role={role: n for role, n in sorted(command.min_members_per_role.items()) if n > 0},
    )


def describe(spec: PodSpec) -> str:
    """A member's request in words: ``8 GPUs, 64 cores, 512 GiB``."""
    if spec.num_gpu == 0:
        gpus = "no GPU"
    elif spec.gpu_milli < GPU_MILLI:
        gpus = f"{spec.gpu_milli} milli of a GPU"
    else:
        gpus = f"{spec.num_gpu} GPU{'s' if spec.num_gpu > 1 else ''}"
    return f"{gpus}, {spec.cpu_milli / 1000:g} cores, {spec.memory_mib / 1024:g} GiB"


def never_fits(cluster: ClusterState, spec: GangSpec) -> str | None:
    """Why some member could never run on any node present (empty, of any model), or None. O(C · M) for
    C distinct node capacities (for a member with a node selector: those with its rarest label) and M distinct
    member shapes."""
    seen: set[PodShape] = set()
    for member in spec.members:
        shape = shape_of(member)
        if shape in seen:
            continue
        seen.add(shape)
        whole = shape.gpu_milli >= GPU_MILLI
        fits = False
        for model, node_class, gpu_count, cpu, memory in cluster.capacities_for(shape.node_selector):
            if shape.gpu_models and model not in shape.gpu_models:
                continue
            if shape.num_gpu and gpu_count < (shape.num_gpu if whole else 1):
                continue
            if cpu < shape.cpu_milli or memory < shape.memory_mib or not class_admits(node_class, shape):
                continue
            fits = True
            break
        if not fits:
            return (
                f"member {member.pod_id!r} of gang {spec.gang_id!r} ({describe(member)}) fits no node of cluster "
                f"{cluster.name!r}, even empty: no node has that much of a model, labels and taints it accepts"
            )
    return None


def ordered_members(spec: GangSpec) -> list[PodSpec]:
    """Largest first (GPU milli, CPU, memory), then id: big members pick nodes while the choice is widest.

    With ``min_members_per_role`` (contract v4), the members each role needs at least (its largest) come first,
    so that the others do not take the room a role's minimum needs; a later member of a role stands in for one of
    them that did not fit."""
    ordered = sorted(spec.members, key=lambda m: (-m.num_gpu * m.gpu_milli, -m.cpu_milli, -m.memory_mib, m.pod_id))
    minimums = spec.min_members_per_role
    if not minimums:
        return ordered
    taken: dict[str, int] = {}
    first: list[PodSpec] = []
    rest: list[PodSpec] = []
    for member in ordered:
        role = member.role
        if role is not None and taken.get(role, 0) < minimums.get(role, 0):
            taken[role] = taken.get(role, 0) + 1
            first.append(member)
        else:
            rest.append(member)
    return first + rest


def role_counts(specs: Iterable[PodSpec]) -> dict[str, int]:
    """How many of these members each role has (members without a role are not counted). O(M)."""
    counts: dict[str, int] = {}
    for spec in specs:
        role = spec.role
        if role is not None:
            counts[role] = counts.get(role, 0) + 1
    return counts


def role_short(spec: GangSpec, specs: Iterable[PodSpec]) -> tuple[str, int, int] | None:
    """The first role (by name) that these members leave below its ``min_members_per_role``: (role, needed,
    present); None if every role has its minimum (always, for a gang without roles). O(M + R)."""
    minimums = spec.min_members_per_role
    if not minimums:
        return None
    counts = role_counts(specs)
    for role in sorted(minimums):
        if counts.get(role, 0) < minimums[role]:
            return (role, minimums[role], counts.get(role, 0))
    return None


def enough(spec: GangSpec, specs: list[PodSpec]) -> bool:
    """Whether these members may run as the gang: at least ``min_members`` and each role's minimum. O(M)."""
    return len(specs) >= spec.min_members and role_short(spec, specs) is None


def short_words(short: tuple[str, int, int]) -> str:
    """``role 'worker' needs 4, 2 fit``."""
    role, needed, present = short
    return f"role {role!r} needs {needed}, {present} fit"


def levels(spec: GangSpec) -> list[str | None]:
    """The domain levels to try, tightest first (None: the whole cluster)."""
    if spec.topology_required is not None:
        return [spec.topology_required]
    if spec.topology_preferred is not None:
        key = spec.topology_preferred
        wider = list(TOPOLOGY_LEVELS[TOPOLOGY_LEVELS.index(key) + 1 :]) if key in TOPOLOGY_LEVELS else []
        return [key, *wider, None]
    return [None]


class Demand:
    """What the gang needs at least, summed: necessary (not sufficient) for a domain to hold it."""

    __slots__ = ("cpu", "gpu_milli", "memory", "whole_gpus")

    def __init__(self, members: list[PodSpec], count: int) -> None:
        # With min_members < all, the smallest `count` members bound what is needed, resource by resource.
        self.whole_gpus = sum(sorted(m.num_gpu for m in members if m.gpu_milli >= GPU_MILLI)[:count])
        self.gpu_milli = sum(sorted(m.num_gpu * m.gpu_milli for m in members)[:count])
        self.cpu = sum(sorted(m.cpu_milli for m in members)[:count])
        self.memory = sum(sorted(m.memory_mib for m in members)[:count])

    def held_by(self, free: DomainFree) -> bool:
        return (
            free.whole_gpus >= self.whole_gpus
            and free.gpu_milli >= self.gpu_milli
            and free.cpu >= self.cpu
            and free.memory >= self.memory
        )

    def lacks(self, free: DomainFree) -> str:
        parts = []
        if free.whole_gpus < self.whole_gpus:
            parts.append(f"{self.whole_gpus - free.whole_gpus} idle GPU(s)")
        if free.gpu_milli < self.gpu_milli:
            parts.append(f"{self.gpu_milli - free.gpu_milli} GPU milli")
        if free.cpu < self.cpu:
            parts.append(f"{(self.cpu - free.cpu) / 1000:g} cores")
        if free.memory < self.memory:
            parts.append(f"{(self.memory - free.memory) / 1024:g} GiB")
        return ", ".join(parts) or "nothing in sum (the members' shapes do not fit its nodes)"


def _trial(
    cluster: ClusterState,
    members: list[PodSpec],
    shapes: list[PodShape],
    key: str | None,
    value: str | None,
    policy: Policy,
    min_members: int,
) -> tuple[list[tuple[PodSpec, Choice]], PodSpec | None]:
    """Place members on trial in one domain and roll back: (placed members, the first that did not fit)."""
    placed: list[tuple[PodSpec, Choice]] = []
    missing: PodSpec | None = None
    nodes = cluster.nodes
    try:
        for position, (member, shape) in enumerate(zip(members, shapes, strict=True)):
            groups = cluster.index.feasible_in(shape, key, value)  # read again: the member before changed a node
            if not groups:
                if missing is None:
                    missing = member
                if len(placed) + len(members) - position - 1 < min_members:
                    break
                continue
            choice = policy.place(cluster, shape, groups)
            node = nodes[choice.node_id]
            node.allocate(member, choice.gpus)
            cluster.reindex(node)
            placed.append((member, choice))
    finally:
        for member, choice in reversed(placed):
            node = nodes[choice.node_id]
            node.free(member, choice.gpus)
            cluster.reindex(node)
    return placed, missing


def try_place(
    cluster: ClusterState, spec: GangSpec, policy: Policy, now: int
) -> GangPlacement | tuple[QueueReason, ...]:
    """Where the gang goes now, or why it cannot start (queue reasons). The state is left as it was."""
    if not cluster.nodes:
        return (QueueReason(QueueReasonCode.NO_NODES, 0, f"cluster {cluster.name!r} has no nodes"),)
    members = ordered_members(spec)
    shapes = [reservations.usable_shape(cluster, spec.gang_id, shape_of(member), now) for member in members]
    demand = Demand(members, spec.min_members)
    best: Best | None = None
    too_small: list[tuple[str, str, DomainFree]] = []
    key: str | None
    value: str | None
    for key in levels(spec):
        if key is None:
            candidates: list[str | None] = [None]
        else:
            domains = cluster.index.domains(key)
            ranked = []
            for value, free in domains.items():
                if demand.held_by(free):
                    ranked.append((free.gpu_milli - demand.gpu_milli, free.cpu - demand.cpu, value))
                else:
                    too_small.append((key, value, free))
            candidates = [value for _, _, value in sorted(ranked)]
        for candidate in candidates:
            value = candidate
            placed, missing = _trial(cluster, members, shapes, key, value, policy, spec.min_members)
            short = role_short(spec, [member for member, _ in placed])
            if len(placed) >= spec.min_members and short is None:
                where = f"{key}={value}" if key is not None else f"cluster {cluster.name!r}"
                message = f"placed {len(placed)} of {len(members)} member(s) on {where}"
                if key is not None:
                    message += " (the fitting domain with the least capacity left over)"
                return GangPlacement(placed, key, value, message)
            if best is None or len(placed) > best[0]:
                best = (len(placed), key, value, missing, short)
    return _reasons(cluster, spec, members, best, too_small)


def _reasons(
    cluster: ClusterState,
    spec: GangSpec,
    members: list[PodSpec],
    best: Best | None,
    too_small: list[tuple[str, str, DomainFree]],
) -> tuple[QueueReason, ...]:
    reasons: list[QueueReason] = []
    demand = Demand(members, spec.min_members)
    if best is None:  # no domain of any level had the capacity in sum
        keys = [key for key in levels(spec) if key is not None]
        if too_small:
            key, value, free = max(too_small, key=lambda item: (item[2].gpu_milli, item[2].cpu, item[1]))
            message = (
                f"no {keys[0] if len(keys) == 1 else ' or '.join(keys)} domain can hold the gang: the largest free "
                f"one, {key}={value}, has {free.whole_gpus} idle GPU(s) ({free.gpu_milli} milli), "
                f"{free.cpu / 1000:g} cores, {free.memory / 1024:g} GiB free on {free.nodes} node(s); "
                f"it lacks {demand.lacks(free)}"
            )
        else:
            message = f"no schedulable node has the label {' or '.join(keys)}"
        reasons.append(QueueReason(QueueReasonCode.TOPOLOGY_DOMAIN_TOO_SMALL, 0, message))
        return tuple(reasons)
    placed, best_key, best_value, missing, short = best
    where = f"{best_key}={best_value}" if best_key is not None else f"cluster {cluster.name!r}"
    first = missing if missing is not None else members[0]
    if placed >= spec.min_members and short is not None:  # enough members, not of the roles it needs
        role = short[0]
        first = next((m for m in members if m.role == role), first)
        message = (
            f"{short_words(short)} at once ({where} came closest, min_members_per_role); "
            f"the others of role {role!r} ({describe(first)}) fit no node left there"
        )
    else:
        message = (
            f"at most {placed} of the {spec.min_members} member(s) it needs fit at once ({where} came closest); "
            f"member {first.pod_id!r} ({describe(first)}) fits no node left there"
        )
        if short is not None:
            message += f"; {short_words(short)}"
    reasons.append(QueueReason(QueueReasonCode.GANG_DOES_NOT_FIT, 0, message))
    reasons.extend(queue_reasons(cluster, shape_of(first)))  # the per-node counts of the member that did not fit
    return tuple(reasons)


def may_use(cluster: ClusterState, spec: GangSpec, signatures: list[Signature], now: int) -> bool:
    """Whether capacity that grew on nodes of these signatures could help the gang: some member fits one. O(M·n)."""
    fits = cluster.index.fits
    seen: set[PodShape] = set()
    for member in spec.members:
        shape = shape_of(member)
        if shape in seen:
            continue
        seen.add(shape)
        usable = reservations.usable_shape(cluster, spec.gang_id, shape, now)
        if any(fits(signature, usable) for signature in signatures):
            return True
    return False
