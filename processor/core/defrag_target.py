"""Making room for a target: the node where a waiting pod (or a gang member) fits after the fewest moves.

Movable pods (not gang members) move away from that node, each to where it fits elsewhere (best fit by GPU,
then CPU, then node id); ties on node id; on trial, within the budget, or nothing. Branch and bound: a
node's least number of moves is known from arithmetic on its own pods (:func:`_least_moves`), nodes are
searched in order of that bound, and one whose bound cannot beat the best found is not searched.

Work: listing the nodes for a shape is a look per node (once per shape per ``Defragment``, then per node a
trial move touched); every subset of a node's pods looked at and every trial move is spent from the
allowance (:class:`~processor.core.defrag_moves.Allowance`), at most ``TARGET_SUBSETS`` subsets per node.
"""

from __future__ import annotations

from itertools import combinations
from math import comb

from sortedcontainers import SortedList

from processor.core.defrag_moves import Allowance, Trial, admits, fewest_covering, fits_without
from processor.core.node_victims import fits_now
from processor.core.policies.base import default_gpus
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Node, Pod, lookup
from schemas.commands import GPU_MILLI
from schemas.events import GpuShare

TARGET_SUBSETS = 2_000  # subsets of a node's movable pods tried per target node


def make_room(cluster: ClusterState, trial: Trial, shape: PodShape, budget: int, why: str) -> str | None:
    """Move movable pods on trial so the shape fits some node: the node (fewest moves, then id), or None.

    Branch and bound over the nodes: a node's least number of moves is known from arithmetic on its own pods
    (:func:`_least_moves`); nodes are visited in order of that bound (then id), and one whose bound cannot beat
    the best found is not searched. Within the allowance (:class:`Allowance`) the node and the pods are
    exactly those of a search of every node in id order (:func:`_fewest` on each, fewest moves wins)."""
    fitting = [group.first() for group in cluster.index.feasible(shape)]
    if fitting:
        return min(fitting)  # the first node in id order that admits and fits the shape as it is
    allowance = trial.allowance(budget)
    listed = _listed(trial, shape, allowance)
    if listed is None:
        return None  # out of work before a node was searched
    order, known = listed
    reachable: dict[tuple[PodShape, str], tuple[int, str]] = {}
    best: tuple[int, str, list[Pod]] | None = None
    for bound, node_id in order:  # measure: nodes left in bound order; a look each (and the subsets')
        if best is not None and (bound > best[0] or (bound == best[0] and node_id > best[1])):
            break  # sorted: no node left can need fewer moves, or as few with a smaller id
        if not allowance.look():
            break  # out of work: the best found so far
        movable = known[node_id][1]
        least = _least_moves(cluster, trial, cluster.nodes[node_id], shape, movable, reachable, allowance)
        if least is None or least > min(budget, len(movable)):
            continue
        if best is not None and (least > best[0] or (least == best[0] and node_id > best[1])):
            continue
        # Fewer moves than the best found, or as few on a node with a smaller id (ties go to the smaller id).
        limit = budget if best is None else best[0] - (1 if node_id > best[1] else 0)
        found = _fewest(cluster, trial, node_id, shape, movable, min(limit, len(movable)), least, reachable, allowance)
        if found is not None:
            best = (len(found), node_id, found)
        if allowance.spent:
            break
    if best is None:
        return None
    _, node_id, pods = best
    for pod in pods:
        destination = _destination(cluster, pod, {node_id}, cluster.nodes[node_id].gpu_model, allowance)
        if destination is None:  # it fitted while planning this node; the order is the same
            return None
        trial.move(pod, destination[0], destination[1], why)
    return node_id


def _listed(
    trial: Trial, shape: PodShape, allowance: Allowance
) -> tuple[SortedList, dict[str, tuple[int, list[Pod]]]] | None:
    """The nodes :func:`make_room` may make room on for the shape, by their bound (:class:`_Rooms`); a look
    per node listed (all of them the first time, those trial moves touched since then), or None if the
    allowance cannot pay for it."""
    rooms: _Rooms | None = trial.rooms.get(shape)
    if rooms is None:
        if not allowance.look(len(trial.cluster.nodes)):
            return None
        rooms = trial.rooms[shape] = _Rooms(trial.cluster, trial, shape)
    else:
        if not allowance.look(len(trial.touched) - rooms.seen):
            return None
        rooms.refresh(trial.cluster, trial, shape)
    return rooms.order, rooms.known


class _Rooms:
    """The nodes :func:`make_room` may make room on for one shape, by a lower bound on the moves it takes
    (every movable pod there counted as able to leave), kept for the members of one ``Defragment``: a node is
    looked at again only once a trial move touched it. Between members the trial only adds moves (refreshed
    here) and gang members (which only take room, so a bound stays a lower bound)."""

    __slots__ = ("known", "order", "seen")

    def __init__(self, cluster: ClusterState, trial: Trial, shape: PodShape) -> None:
        self.order: SortedList = SortedList()  # (bound, node id)
        self.known: dict[str, tuple[int, list[Pod]]] = {}  # node id -> (bound, its movable pods by id)
        self.seen = len(trial.touched)
        for node_id in sorted(cluster.nodes):  # measure: nodes left (paid for: a look per node)
            self.file(cluster, trial, shape, node_id)

    def file(self, cluster: ClusterState, trial: Trial, shape: PodShape, node_id: str) -> None:
        node = cluster.nodes[node_id]
        if not admits(cluster, node, shape) or (shape.gpu_models and node.gpu_model not in shape.gpu_models):
            return
        present = (lookup(cluster.pods, pod_id) for pod_id in sorted(node.pods))  # a trial member is no pod yet
        movable = [pod for pod in present if pod is not None and pod.spec.movable and pod.spec.gang_id is None]
        if not movable:
            return
        bound = _least_moves(cluster, trial, node, shape, movable, None)
        if bound is not None:
            self.known[node_id] = (bound, movable)
            self.order.add((bound, node_id))

    def refresh(self, cluster: ClusterState, trial: Trial, shape: PodShape) -> None:
        """File again the nodes trial moves touched since the last call."""
        for node_id in sorted(set(trial.touched[self.seen :])):
            entry = self.known.pop(node_id, None)
            if entry is not None:
                self.order.remove((entry[0], node_id))
            self.file(cluster, trial, shape, node_id)
        self.seen = len(trial.touched)


def _can_leave(
    cluster: ClusterState,
    pod: Pod,
    node_id: str,
    reachable: dict[tuple[PodShape, str], tuple[int, str]],
    allowance: Allowance,
) -> bool:
    """Whether the pod has a destination (:func:`_destination`) off node ``node_id`` as the nodes are now.

    Moves away from a node only take room elsewhere, so a pod with none now has none after other moves of
    the same search either. The schedulable nodes that could take each shape are counted once per call."""
    model = cluster.nodes[node_id].gpu_model
    key = (pod.shape, model)
    counted = reachable.get(key)
    if counted is None:
        shape = pod.shape._replace(gpu_models=(model,)) if pod.spec.num_gpu else pod.shape
        groups = [
            group for group in cluster.index.feasible(shape) if shape.num_gpu or group.signature.gpu_model == model
        ]
        allowance.spend(len(groups))  # a look per group of the capacity index
        count = sum(group.size for group in groups)
        counted = reachable[key] = (count, groups[0].first() if count == 1 else "")
    return counted[0] > 1 or (counted[0] == 1 and counted[1] != node_id)


def _least_moves(
    cluster: ClusterState,
    trial: Trial,
    node: Node,
    shape: PodShape,
    movable: list[Pod],
    reachable: dict[tuple[PodShape, str], tuple[int, str]] | None,
    allowance: Allowance | None = None,
) -> int | None:
    """A lower bound on the moves that make the shape fit the node, or None if moving every pod that could
    leave (:func:`_can_leave`; every movable pod if ``reachable`` is None) would not do it. Arithmetic on the
    node's free CPU, memory and GPUs and on what those pods hold there: the CPU short takes at least as many
    pods as the CPU-heaviest ones it takes to cover it; likewise memory; whole GPUs, as many pods as it takes,
    most GPUs freed first, where a GPU is freed only if every pod on it leaves; a share, the fewest pods on one
    GPU that leave it room."""
    leaving = (
        movable
        if reachable is None or allowance is None
        else [p for p in movable if _can_leave(cluster, p, node.node_id, reachable, allowance)]
    )
    least = 1
    short = shape.cpu_milli - node.cpu_free
    if short > 0:
        count = fewest_covering([pod.spec.cpu_milli for pod in leaving], short)
        if count is None:
            return None
        least = max(least, count)
    short = shape.memory_mib - node.memory_free
    if short > 0:
        count = fewest_covering([pod.spec.memory_mib for pod in leaving], short)
        if count is None:
            return None
        least = max(least, count)
    if not shape.num_gpu:
        return least
    free = node.gpu_free
    at = trial.at
    placed = [at[pod.spec.pod_id][1] if pod.spec.pod_id in at else pod.gpus for pod in leaving] if at else None
    held = [0] * len(free)  # GPU index -> the milli the leaving pods hold there
    for gpus in placed if placed is not None else (pod.gpus for pod in leaving):
        for gpu in gpus:
            held[gpu.index] += gpu.milli
    if shape.gpu_milli >= GPU_MILLI:
        short = shape.num_gpu - sum(1 for milli in free if milli >= GPU_MILLI)
        if short <= 0:
            return least
        freed = [milli < GPU_MILLI <= milli + more for milli, more in zip(free, held, strict=True)]
        counts = [
            sum(1 for gpu in gpus if freed[gpu.index])
            for gpus in (placed if placed is not None else (pod.gpus for pod in leaving))
        ]
        count = fewest_covering(counts, short)
    else:
        if max(free, default=0) >= shape.gpu_milli:
            return least
        count = None
        for index, milli in enumerate(free):
            if milli + held[index] >= shape.gpu_milli:
                on_it = [
                    gpu.milli for gpus in (placed or [p.gpus for p in leaving]) for gpu in gpus if gpu.index == index
                ]
                option = fewest_covering(on_it, shape.gpu_milli - milli)
                if option is not None and (count is None or option < count):
                    count = option
    if count is None:
        return None
    return max(least, count)


def _fewest(
    cluster: ClusterState,
    trial: Trial,
    node_id: str,
    shape: PodShape,
    movable: list[Pod],
    limit: int,
    least: int,
    reachable: dict[tuple[PodShape, str], tuple[int, str]],
    allowance: Allowance,
) -> list[Pod] | None:
    """The fewest movable pods (ids ascending among equals) whose moves away make the shape fit the node.

    Subsets are tried by size, then in ``combinations`` order, at most ``TARGET_SUBSETS`` of them counted
    from size 1. Those that cannot work are counted without being tried on trial: every subset smaller than
    ``least`` (the node's lower bound), and any that holds a pod with no destination or that would not make
    room even if all its pods left (arithmetic). Each subset looked at and each trial move spends the
    allowance; when it is spent the search ends (None)."""
    node = cluster.nodes[node_id]
    tried = 0
    for size in range(1, limit + 1):
        if size < least:
            tried += comb(len(movable), size)  # all fail: counted, as trying each would
            if tried > TARGET_SUBSETS:
                return None
            continue
        for chosen in combinations(movable, size):  # at most TARGET_SUBSETS per node, a look each
            tried += 1
            if tried > TARGET_SUBSETS or not allowance.look():
                return None
            if not all(_can_leave(cluster, pod, node_id, reachable, allowance) for pod in chosen) or not fits_without(
                node, shape, chosen, trial
            ):
                continue
            mark = len(trial.moves)
            ok = True
            for pod in sorted(chosen, key=lambda p: (-p.spec.gpu_milli_total, p.spec.pod_id)):
                if not allowance.move(trial):
                    trial.undo_to(mark)
                    return None
                destination = _destination(cluster, pod, {node_id}, node.gpu_model, allowance)
                if destination is None:
                    ok = False
                    break
                trial.move(pod, destination[0], destination[1], "")
            room_made = ok and fits_now(node, shape)
            trial.undo_to(mark)
            if room_made:
                return sorted(chosen, key=lambda p: (-p.spec.gpu_milli_total, p.spec.pod_id))
    return None


def _destination(
    cluster: ClusterState, pod: Pod, exclude: set[str], model: str, allowance: Allowance
) -> tuple[str, tuple[GpuShare, ...]] | None:
    """Where a moved pod goes: a node of its model, not excluded, best fit by GPU then node id. A look per
    group of the capacity index."""
    shape = pod.shape._replace(gpu_models=(model,)) if pod.spec.num_gpu else pod.shape
    best: tuple[tuple[int, int, str], str] | None = None
    groups = cluster.index.feasible(shape)
    allowance.spend(len(groups))
    for group in groups:  # measure: the groups left
        if shape.num_gpu == 0 and group.signature.gpu_model != model:
            continue
        node_id = next((n for n in group.node_ids if n not in exclude), None)
        if node_id is None:
            continue
        free = group.signature.gpu_free
        if shape.num_gpu and shape.gpu_milli < GPU_MILLI:
            fit = min(milli for milli in free if milli >= shape.gpu_milli) - shape.gpu_milli
        else:
            fit = sum(1 for milli in free if milli >= GPU_MILLI) - shape.num_gpu
        rank = (fit, group.signature.cpu_free - shape.cpu_milli, node_id)
        if best is None or rank < best[0]:
            best = (rank, node_id)
    if best is None:
        return None
    node_id = best[1]
    return node_id, default_gpus(cluster.nodes[node_id].gpu_free, shape)
