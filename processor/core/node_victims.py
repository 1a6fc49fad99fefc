"""The least victim set on one node, and the bounds that let a search skip nodes without visiting their pods.

On a node a search meets, the victim set is the exact minimum under the order of ``processor.core.preemption``:
sets of 1, 2, ... victims (units: a pod, or a whole gang) are enumerated, ids ascending, until the count can no
longer beat the best. The enumeration has a budget (:data:`SEARCH_BUDGET` subsets per node); past it the best
set found is kept, or the cheapest greedy set if none was. Cost: C(k, 1) + C(k, 2) + ... for k candidate
victims on the node.

Before that, from what the node's running pods hold per priority (``Node.by_priority``, kept incrementally):
the lowest priority level whose pods, all removed, make room (:func:`minimal_level`), and a lower bound on the
victims and the work they lose (:func:`lower_bound`), in O(L · G) for L levels and G GPUs, no pod visited.
"""

from __future__ import annotations

from itertools import combinations

from processor.core.preemption_plans import (
    ANY_VICTIM,
    PodPlan,
    Unit,
    Victims,
    role_spares,
    spare_members,
    unit_of,
    work_lost,
)
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Node, Pod, lookup
from schemas.commands import GPU_MILLI

SEARCH_BUDGET = 20_000
"""Victim subsets examined per node at most (the exact minimum is found well within it on nodes with
up to ~14 lower-priority pods or gangs); the benchmarks and tests never reach it."""

WHOLE_UP_TO = 14
"""Pods on a node up to which its search never spends the budget: every subset of 14 units is 2^14 - 1 = 16,383
sets. Its least victim set is then a function of the node (and the gangs of its pods) alone, whatever a search
asks it to beat (``preemption.NextPlans`` relies on that)."""


def could_hold(cluster: ClusterState, node: Node, shape: PodShape) -> bool:
    """Whether the node could ever hold the shape: schedulable, model, labels/taints, capacity. O(1)."""
    if not node.schedulable:
        return False
    if shape.gpu_models and node.gpu_model not in shape.gpu_models:
        return False
    if node.cpu_milli < shape.cpu_milli or node.memory_mib < shape.memory_mib:
        return False
    if shape.num_gpu and node.gpu_count < (shape.num_gpu if shape.gpu_milli >= GPU_MILLI else 1):
        return False
    return cluster.capacity.admits(node.node_class, shape)


def gpus_fit(free: list[int], shape: PodShape) -> bool:
    if not shape.num_gpu:
        return True
    if shape.gpu_milli < GPU_MILLI or shape.num_gpu == 1:  # one GPU with room for the share, or whole
        need = min(shape.gpu_milli, GPU_MILLI)
        for milli in free:  # noqa: SIM110 (a loop, not max() or a generator: compiled, it stays in C)
            if milli >= need:
                return True
        return False
    whole = 0
    for milli in free:
        if milli >= GPU_MILLI:
            whole += 1
    return whole >= shape.num_gpu


def room_in(cpu: int, memory: int, gpus: list[int], shape: PodShape) -> bool:
    """Whether free CPU, memory and GPUs (milli per GPU, any order) hold the shape, GPU memory and the node's
    model and class aside: the free-room part of ``CapacityIndex.fits``, read from a node's free capacity
    (or one counted with victims gone) instead of its sorted signature. O(G)."""
    return cpu >= shape.cpu_milli and memory >= shape.memory_mib and gpus_fit(gpus, shape)


def minimal_level(node: Node, shape: PodShape, priority: int) -> int | None:
    """The lowest priority L < ``priority`` such that removing every pod of priority <= L makes room,
    or None. O(L · G) from the per-priority sums."""
    by_priority = node.by_priority
    if len(by_priority) == 1:  # the common node: one level, no list to build
        for level, held in by_priority.items():
            if level >= priority:
                return None
            if (
                node.cpu_free + held.cpu_milli < shape.cpu_milli
                or node.memory_free + held.memory_mib < shape.memory_mib
            ):
                return None
            gpu = [free + milli for free, milli in zip(node.gpu_free, held.gpu_milli, strict=True)]
            return level if gpus_fit(gpu, shape) else None
    levels = [level for level in by_priority if level < priority]
    if not levels:
        return None
    if len(levels) > 1:
        levels.sort()
    cpu, memory = node.cpu_free, node.memory_free
    gpu = node.gpu_free
    for level in levels:
        held = by_priority[level]
        cpu += held.cpu_milli
        memory += held.memory_mib
        gpu = [free + milli for free, milli in zip(gpu, held.gpu_milli, strict=True)]
        if room_in(cpu, memory, gpu, shape):
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


def best_on_node(
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
    # Plain pods (no gang) as (work, id, id, pod): most nodes run no gang member, and then the least single
    # victim needs no unit built (:func:`_least_single`).
    plain: list[tuple[int, str, str, Pod]] = []
    members = False
    for pod_id in node.pods:
        if pod_id not in pods:  # a member of the gang being placed, on trial (``lookup``, inlined: the hot loop)
            continue
        pod = pods[pod_id]
        spec = pod.spec
        if spec.priority > level or not spec.preemptible:
            continue
        if spec.gang_id is None:
            started = pod.started_at if pod.started_at is not None else now
            plain.append((spec.num_gpu * spec.gpu_milli * max(0, now - started), pod_id, pod_id, pod))
        else:
            members = True
    spare: dict[str, tuple[int, dict[str, int]]] = {}
    if not members and not allowed.restricts:
        if not plain:
            return None
        if beat is not None and beat[0] == 1 and all(entry[0] >= beat[1] for entry in plain):
            return None  # only one victim with less work could win here
        if len(plain) <= SEARCH_BUDGET:  # within it, the search below would find the same single victim
            single = _least_single(node, shape, sorted(plain), beat)
            if single is not None:
                work, _key, pod = single
                return ((1, work), [Unit(pod.spec.pod_id, pod.spec.priority, (pod,), work)])
        units = {pod_id: Unit(pod_id, pod.spec.priority, (pod,), work) for work, pod_id, _, pod in plain}
    else:
        units, spare = _units_on(cluster, node, level, now)
        if allowed.restricts:
            units = {k: unit for k, unit in units.items() if all(allowed.allow(cluster, pod) for pod in unit.pods)}
        if not units:
            return None
        if beat is not None and beat[0] == 1 and all(u.count > 1 or u.work >= beat[1] for u in units.values()):
            return None  # only one victim with less work could win here
        if len(units) <= SEARCH_BUDGET:  # within it, the search below would find the same single victim
            singles = sorted(
                (u.work, u.pods[0].spec.pod_id, key, u.pods[0]) for key, u in units.items() if u.count == 1
            )
            single = _least_single(node, shape, singles, beat)
            if single is not None:
                return ((1, single[0]), [units[single[1]]])
    ordered = [units[key] for key in sorted(units)]
    contributions = [_contribution(node.node_id, unit) for unit in ordered]
    need_cpu = shape.cpu_milli - node.cpu_free
    need_memory = shape.memory_mib - node.memory_free
    need_gpu = gpu_deficit(node.gpu_free, shape)
    # What the units free at most, largest first, for the resources the node lacks (none: no bound to read).
    by_cpu = sorted((c[0] for c in contributions), reverse=True) if need_cpu > 0 else []
    by_memory = sorted((c[1] for c in contributions), reverse=True) if need_memory > 0 else []
    by_gpu = sorted((sum(m for _, m in c[2]) for c in contributions), reverse=True) if need_gpu > 0 else []
    counts = [unit.count for unit in ordered]
    works = [unit.work for unit in ordered]
    best: tuple[tuple[int, int], tuple[str, ...], list[Unit]] | None = None
    budget = SEARCH_BUDGET
    for size in range(1, len(ordered) + 1):
        bound = best[0] if best is not None else beat
        if bound is not None and size > bound[0]:
            break
        if (
            (need_cpu > 0 and sum(by_cpu[:size]) < need_cpu)
            or (need_memory > 0 and sum(by_memory[:size]) < need_memory)
            or (need_gpu > 0 and sum(by_gpu[:size]) < need_gpu)
        ):
            continue
        for chosen in combinations(range(len(ordered)), size):
            budget -= 1
            if budget < 0:
                break
            if size == 1:
                count, work = counts[chosen[0]], works[chosen[0]]
            else:
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
            if not room_in(cpu, memory, gpu, shape):
                continue
            if spare and not _allowed_together([ordered[i] for i in chosen], spare):
                continue
            ids = tuple(sorted(pod.spec.pod_id for i in chosen for pod in ordered[i].pods))
            if best is None or ((count, work), ids) < (best[0], best[1]):
                best = ((count, work), ids, [ordered[i] for i in chosen])
        if budget < 0:
            break
    if best is None and budget < 0:
        return _greedy(node, shape, ordered, contributions, beat, spare)
    return None if best is None else (best[0], best[2])


def _units_on(
    cluster: ClusterState, node: Node, level: int, now: int
) -> tuple[dict[str, Unit], dict[str, tuple[int, dict[str, int]]]]:
    """The units of priority <= ``level`` on the node (a plain pod, a gang whole, a gang's member alone when
    its gang may lose it alone), and the gangs whose members above ``min_members`` may go one by one
    (``disruption: above_min``): how many, and per role with a ``min_members_per_role`` how many of that role."""
    pods = cluster.pods
    units: dict[str, Unit] = {}
    spare: dict[str, tuple[int, dict[str, int]]] = {}
    for pod_id in node.pods:
        pod = lookup(pods, pod_id)  # None: a member of the gang being placed, on trial
        if pod is None or pod.spec.priority > level or not pod.spec.preemptible:
            continue
        spec = pod.spec
        gang_id = spec.gang_id
        if gang_id is None:
            units[pod_id] = Unit(pod_id, spec.priority, (pod,), work_lost(pod, now))
            continue
        if gang_id not in units:
            units[gang_id] = unit_of(cluster, pod, now)
            if pods_spare := spare_members(cluster, pod):
                spare[gang_id] = (pods_spare, role_spares(cluster, gang_id))
        if gang_id in spare and spare[gang_id][1].get(spec.role or "", 1) > 0:  # its role (if any) spares one
            units[pod_id] = Unit(pod_id, spec.priority, (pod,), work_lost(pod, now))  # see _allowed_together
    return units, spare


def _least_single(
    node: Node, shape: PodShape, singles: list[tuple[int, str, str, Pod]], beat: tuple[int, int] | None
) -> tuple[int, str, Pod] | None:
    """The least set of one victim that makes room, if one does: the search's answer then, as every other set
    takes more victims. ``singles``: the one-pod units as (work, pod id, unit key, pod), sorted, which is the
    order the search keeps (work, then the victim's id, then the unit's key: a one-member gang and its member
    alone are the same victim); the first that makes room and beats ``beat`` wins, as (work, key, pod). One unit
    alone is always allowed (:func:`_allowed_together`). O(U), U the singles; None: the search goes on from
    sets of one."""
    node_id = node.node_id
    cpu_free, memory_free = node.cpu_free, node.memory_free
    gpu_free = node.gpu_free
    # :func:`gpus_fit` of the node's free GPUs plus one victim's shares, from what the free GPUs alone give:
    # one GPU (or a share of one): the most free on one GPU, and each share's GPU with it added; several whole
    # GPUs: the whole ones free, and each share's GPU that it makes whole.
    wanted = shape.num_gpu
    one = shape.gpu_milli < GPU_MILLI or wanted == 1
    need = min(shape.gpu_milli, GPU_MILLI)
    whole = 0
    if not wanted:
        fits_free = True
    elif one:
        fits_free = bool(gpu_free) and max(gpu_free) >= need
    else:
        for milli in gpu_free:
            if milli >= GPU_MILLI:
                whole += 1
        fits_free = whole >= wanted
    for work, _pod_id, key, pod in singles:  # measure: the singles left
        if beat is not None and (1, work) >= beat:
            return None  # this one and every later one lose to the node that set ``beat``
        here = pod.node_id == node_id  # else it frees nothing here (a gang's one member left, elsewhere)
        spec = pod.spec
        cpu = cpu_free + spec.cpu_milli if here else cpu_free
        memory = memory_free + spec.memory_mib if here else memory_free
        if cpu < shape.cpu_milli or memory < shape.memory_mib:
            continue
        if fits_free:
            return (work, key, pod)
        if not here:
            continue
        if one:
            for share in pod.gpus:
                if gpu_free[share.index] + share.milli >= need:
                    return (work, key, pod)
        else:
            gained = whole
            for share in pod.gpus:
                free = gpu_free[share.index]
                if free < GPU_MILLI <= free + share.milli:
                    gained += 1
            if gained >= wanted:
                return (work, key, pod)
    return None


def _allowed_together(chosen: list[Unit], spare: dict[str, tuple[int, dict[str, int]]]) -> bool:
    """Whether units may go together when some gangs' members above ``min_members`` may go one by one
    (``disruption: above_min``): a gang whole or at most its spare members alone (and of a role with a
    ``min_members_per_role``, at most the role's spare members), never both. O(units)."""
    alone: dict[str, int] = {}
    alone_in_role: dict[tuple[str, str], int] = {}
    whole: set[str] = set()
    for unit in chosen:
        spec = unit.pods[0].spec
        gang_id = spec.gang_id
        if gang_id is None or gang_id not in spare:
            continue
        if unit.key == gang_id:
            whole.add(gang_id)
            continue
        alone[gang_id] = alone.get(gang_id, 0) + 1
        role = spec.role
        if role is not None and role in spare[gang_id][1]:
            alone_in_role[(gang_id, role)] = alone_in_role.get((gang_id, role), 0) + 1
            if alone_in_role[(gang_id, role)] > spare[gang_id][1][role]:
                return False
    return all(gang_id not in whole and count <= spare[gang_id][0] for gang_id, count in alone.items())


def gpu_deficit(free: list[int], shape: PodShape) -> int:
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
    spare: dict[str, tuple[int, dict[str, int]]],
) -> tuple[tuple[int, int], list[Unit]] | None:
    """Past the budget: units by the most GPU they free on the node, then fewest victims, until it fits (a unit
    that may not go with those taken is passed over)."""
    order = sorted(
        range(len(ordered)),
        key=lambda i: (-sum(m for _, m in contributions[i][2]), -contributions[i][0], ordered[i].count, ordered[i].key),
    )
    cpu, memory, gpu = node.cpu_free, node.memory_free, list(node.gpu_free)
    chosen: list[int] = []
    for i in order:
        if spare and not _allowed_together([ordered[j] for j in (*chosen, i)], spare):
            continue
        chosen.append(i)
        more_cpu, more_memory, more_gpus = contributions[i]
        cpu += more_cpu
        memory += more_memory
        for index, milli in more_gpus:
            gpu[index] += milli
        if room_in(cpu, memory, gpu, shape):
            units = sorted((ordered[j] for j in chosen), key=lambda unit: unit.key)
            value = (sum(unit.count for unit in units), sum(unit.work for unit in units))
            return None if beat is not None and value >= beat else (value, units)
    return None


def try_node(
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
    found = best_on_node(cluster, node, shape, level, now, beat, allowed)
    if found is not None:
        (count, work), units = found
        candidate = PodPlan(node.node_id, units, (level, count, work))
        if best is None or _rank(candidate) < _rank(best):
            return candidate
    return best


def _rank(plan: PodPlan) -> tuple[int, int, int, str, tuple[str, ...]]:
    return (*plan.cost, plan.node_id, tuple(pod.spec.pod_id for pod in plan.victims))


def fewest_victims(deficit: int, largest: int, takes_every_gpu: bool, gpu_pods: int) -> int:
    """At least how many victims free ``deficit`` GPU milli when each frees at most ``largest`` (> 0); a pod
    that wants every GPU of its node in whole (``takes_every_gpu``) takes every one of the ``gpu_pods`` pods
    holding a GPU there along. Shared by the node bounds here and the preemption index's bucket bounds."""
    fewest = -(-deficit // largest)
    return gpu_pods if takes_every_gpu and gpu_pods > fewest else fewest


def _takes_every_gpu(node: Node, shape: PodShape) -> bool:
    return shape.num_gpu == node.gpu_count and shape.gpu_milli >= GPU_MILLI


def _held_below(node: Node, level: int) -> tuple[int, int, dict[int, int], int]:
    """What the node's pods of priority <= ``level`` hold, from the per-priority summary: (the largest GPU
    milli of one pod with a start, how many pods hold a GPU, GPU milli -> latest start, the latest start of
    all). A node with one level answers from that level's own summary, no dict built."""
    by_priority = node.by_priority
    if len(by_priority) == 1:  # the common node
        held_level, held = next(iter(by_priority.items()))
        if held_level > level:
            return (0, 0, {}, -1)
        return (held.largest_gpu_milli, held.gpu_pods, held.latest_starts, held.latest_start)
    largest = gpu_pods = 0
    newest = -1
    latest: dict[int, int] = {}
    for priority, held in by_priority.items():
        if priority <= level:
            gpu_pods += held.gpu_pods
            if largest < held.largest_gpu_milli:
                largest = held.largest_gpu_milli
            if newest < held.latest_start:
                newest = held.latest_start
            for milli, started in held.latest_starts.items():
                if latest.get(milli, -1) < started:
                    latest[milli] = started
    return (largest, gpu_pods, latest, newest)


def bound_terms(node: Node, shape: PodShape, level: int) -> tuple[int, int]:
    """(at least how many victims, GPU milli they must free) on the node, from what its pods of priority
    <= ``level`` hold, start times aside; (0, 0) if the GPUs give no bound (the bound is then (1, 0)).

    Victims must free the GPU the node lacks, each at most the largest GPU a pod there holds
    (:func:`fewest_victims`). Alike for the nodes of one preemption-index class."""
    deficit = gpu_deficit(node.gpu_free, shape)
    if not deficit:
        return (0, 0)
    largest, gpu_pods, _latest, _newest = _held_below(node, level)
    if largest <= 0:
        return (0, 0)
    return (fewest_victims(deficit, largest, _takes_every_gpu(node, shape), gpu_pods), deficit)


def lower_bound(node: Node, shape: PodShape, level: int, now: int) -> tuple[int, int]:
    """At least how many victims, and how much work lost, it takes on this node, from the per-priority
    summary (no pod is visited): :func:`bound_terms`, every GPU milli freed running since the latest
    start of a pod there at least; one victim alone loses at least its GPU x its time running. Latest
    starts are those of the pods running (``Held.forget_start``), or later for a pod stopped without its start
    given, so the bound stays a bound."""
    deficit = gpu_deficit(node.gpu_free, shape)
    if not deficit:
        return (1, 0)
    largest, gpu_pods, latest, newest = _held_below(node, level)
    if largest <= 0:
        return (1, 0)
    fewest = fewest_victims(deficit, largest, _takes_every_gpu(node, shape), gpu_pods)
    if fewest > 1:  # every GPU milli freed ran at least since the latest start of a pod here
        return (fewest, deficit * max(0, now - newest))
    return (1, min(m * max(0, now - t) for m, t in latest.items() if m >= deficit))


def could_hold_somewhere(cluster: ClusterState, shape: PodShape) -> bool:
    """Whether some node present could hold the shape once emptied: :func:`could_hold` on each distinct fixed
    capacity (model, node class without a reservation's taint, GPUs, CPU, memory), schedulability aside: a
    superset of the nodes :func:`could_hold` admits. O(C) for C distinct capacities, whatever the nodes (a pod
    with a node selector: those with its rarest label)."""
    whole = shape.gpu_milli >= GPU_MILLI
    for model, node_class, gpu_count, cpu, memory in cluster.capacities_for(shape.node_selector):
        if shape.gpu_models and model not in shape.gpu_models:
            continue
        if shape.num_gpu and gpu_count < (shape.num_gpu if whole else 1):
            continue
        if cpu < shape.cpu_milli or memory < shape.memory_mib:
            continue
        if cluster.capacity.admits(node_class, shape):
            return True
    return False


def fits_now(node: Node, shape: PodShape) -> bool:
    """Whether the node's free capacity holds the shape now (a node that ``could_hold`` it): :func:`room_in`."""
    return room_in(node.cpu_free, node.memory_free, node.gpu_free, shape)


def could_preempt_on(node: Node, shape: PodShape, priority: int, cluster: ClusterState) -> bool:
    """Whether removing the node's pods below ``priority`` would make room for the shape. O(L · G)."""
    return could_hold(cluster, node, shape) and minimal_level(node, shape, priority) is not None
