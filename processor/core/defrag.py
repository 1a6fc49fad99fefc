"""Defragmentation: migrations of movable pods that free whole GPUs, or make room for one waiting job.

Only running pods submitted with ``movable: true`` move, and only to another schedulable node
of the same GPU model (so quota keys and GPU-model constraints stay as they were) that admits
them (selector, taints; reserved nodes are left alone). A move is one ``PodMigrated``.

**Without a target** (consolidation): a GPU that holds only movable shares is *emptied* when
every share on it finds a place on another partly used GPU (best fit: the smallest free share
that holds it; never a fully free GPU, that would only move the hole). The cheapest GPUs go
first (fewest pods, then least used); a GPU is emptied only if that lowers the cluster's FGD
fragmentation (``processor.core.fragmentation``, against the learned typical pods) on the nodes
it touches, and only within the move budget. Cost: O(G log G) to index the G partly used GPUs,
plus O(log G + k) per move for a scan of at most k candidate GPUs.

**With a target** (a waiting pod, or each member of a waiting gang in turn): the node where it
fits after the fewest moves of movable pods away from it (each must fit elsewhere: best fit by
GPU, then node id), ties on node id; on trial, within the budget, or nothing.

The plan is made on trial (nodes and index follow each move, then everything is rolled back);
the fold emits it, so every move is applied by its event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

from sortedcontainers import SortedList

from processor.core.fragmentation import Fragmenter
from processor.core.policies.base import default_gpus
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Node, Pod
from schemas.commands import GPU_MILLI
from schemas.events import GpuShare

SCAN = 64  # candidate destination GPUs looked at per share moved
TARGET_SUBSETS = 2_000  # subsets of a node's movable pods tried per target node


@dataclass(slots=True)
class Move:
    pod_id: str
    from_node: str
    from_gpus: tuple[GpuShare, ...]
    to_node: str
    to_gpus: tuple[GpuShare, ...]
    why: str


@dataclass(slots=True)
class Plan:
    moves: list[Move] = field(default_factory=list)
    gpus_freed: int = 0
    nodes_freed: int = 0
    note: str = ""


def movable_pods(cluster: ClusterState) -> list[Pod]:
    """Running movable pods, by id."""
    return sorted(
        (pod for pod in cluster.pods.values() if pod.node_id is not None and pod.spec.movable),
        key=lambda pod: pod.spec.pod_id,
    )


class Trial:
    """Moves applied to nodes and the index, undone by :meth:`rollback` (newest first)."""

    def __init__(self, cluster: ClusterState) -> None:
        self.cluster = cluster
        self.moves: list[Move] = []
        # The trial's view of where moved pods are: pod id -> (node, gpus).
        self.at: dict[str, tuple[str, tuple[GpuShare, ...]]] = {}

    def where(self, pod: Pod) -> tuple[str, tuple[GpuShare, ...]]:
        moved = self.at.get(pod.spec.pod_id)
        return moved if moved is not None else (pod.node_id, pod.gpus)  # type: ignore[return-value]

    def move(self, pod: Pod, to_node: str, to_gpus: tuple[GpuShare, ...], why: str) -> None:
        from_node, from_gpus = self.where(pod)
        nodes = self.cluster.nodes
        nodes[from_node].free(pod.spec, from_gpus)
        nodes[to_node].allocate(pod.spec, to_gpus, pod.started_at)
        self.cluster.reindex(nodes[from_node])
        self.cluster.reindex(nodes[to_node])
        self.at[pod.spec.pod_id] = (to_node, to_gpus)
        self.moves.append(Move(pod.spec.pod_id, from_node, from_gpus, to_node, to_gpus, why))

    def undo_to(self, mark: int) -> None:
        nodes = self.cluster.nodes
        while len(self.moves) > mark:
            move = self.moves.pop()
            pod = self.cluster.pods[move.pod_id]
            nodes[move.to_node].free(pod.spec, move.to_gpus)
            nodes[move.from_node].allocate(pod.spec, move.from_gpus, pod.started_at)
            self.cluster.reindex(nodes[move.to_node])
            self.cluster.reindex(nodes[move.from_node])
            if move.from_node == pod.node_id and move.from_gpus == pod.gpus:
                self.at.pop(move.pod_id, None)
            else:
                self.at[move.pod_id] = (move.from_node, move.from_gpus)

    def rollback(self) -> None:
        self.undo_to(0)


def _whole_free(node: Node) -> int:
    return sum(1 for milli in node.gpu_free if milli >= GPU_MILLI)


def tally(cluster: ClusterState, moves: list[Move]) -> tuple[int, int]:
    """(whole free GPUs, empty nodes) among the nodes the moves touch, in the state as it is now."""
    touched = sorted({node_id for move in moves for node_id in (move.from_node, move.to_node)})
    nodes = [cluster.nodes[node_id] for node_id in touched]
    return sum(_whole_free(node) for node in nodes), sum(1 for node in nodes if not node.pods)


def _outcome(cluster: ClusterState, moves: list[Move], before: dict[str, tuple[int, bool]]) -> tuple[int, int]:
    """(whole GPUs freed, nodes emptied) on the nodes the moves touched, against ``before``."""
    gpus = nodes = 0
    for node_id, (whole, empty) in before.items():
        node = cluster.nodes[node_id]
        gpus += _whole_free(node) - whole
        nodes += int(not node.pods and not empty)
    return max(gpus, 0), max(nodes, 0)


def _admits(cluster: ClusterState, node: Node, shape: PodShape) -> bool:
    return node.schedulable and cluster.index.admits(node.node_class, shape)


# ---------------------------------------------------------------- consolidation


def consolidate(cluster: ClusterState, budget: int) -> Plan:
    """Free whole GPUs by emptying the cheapest GPUs that hold only movable shares (module docstring)."""
    movable = [pod for pod in movable_pods(cluster) if pod.shape.is_share]
    if not movable:
        return Plan(note="no movable GPU-share pod runs: nothing to consolidate")
    by_gpu: dict[tuple[str, int], list[Pod]] = {}
    for pod in cluster.pods.values():
        if pod.node_id is not None and pod.shape.is_share:
            by_gpu.setdefault((pod.node_id, pod.gpus[0].index), []).append(pod)
    models = sorted({cluster.nodes[pod.node_id].gpu_model for pod in movable})  # type: ignore[index]
    partial: dict[str, SortedList] = {model: SortedList() for model in models}
    for node_id in sorted(cluster.nodes):
        node = cluster.nodes[node_id]
        if node.gpu_model in partial and node.schedulable:
            for index, free in enumerate(node.gpu_free):
                if 0 < free < GPU_MILLI:
                    partial[node.gpu_model].add((free, node_id, index))
    sources = []
    for (node_id, index), pods in by_gpu.items():
        node = cluster.nodes[node_id]
        if node.gpu_model in partial and all(pod.spec.movable for pod in pods):
            used = GPU_MILLI - node.gpu_free[index]
            sources.append((len(pods), used, node_id, index))
    sources.sort()
    fragmenter = Fragmenter(cluster.typical) if cluster.typical else None
    trial = Trial(cluster)
    before: dict[str, tuple[int, bool]] = {}
    receivers: set[tuple[str, int]] = set()  # GPUs that took shares in this plan: never emptied again
    try:
        for _, _, node_id, index in sources:
            if (node_id, index) in receivers:
                continue
            pods = sorted(by_gpu[(node_id, index)], key=lambda p: (-p.spec.gpu_milli, p.spec.pod_id))
            if len(pods) > budget - len(trial.moves):
                continue
            node = cluster.nodes[node_id]
            free_list = partial[node.gpu_model]
            entry = (node.gpu_free[index], node_id, index)
            if entry not in free_list:
                continue
            mark = len(trial.moves)
            touched = {node_id}
            fragment_before = _fragment(cluster, fragmenter, touched)
            free_list.remove(entry)
            changed: list[tuple[tuple[int, str, int], tuple[int, str, int] | None]] = []
            ok = True
            for pod in pods:
                spot = _best_partial(cluster, free_list, pod, node_id, index)
                if spot is None:
                    ok = False
                    break
                free, to_node, to_index = spot
                if to_node not in touched:
                    touched.add(to_node)
                    fragment_before += _fragment(cluster, fragmenter, {to_node})
                for touched_id in (node_id, to_node):
                    if touched_id not in before:
                        touched_node = cluster.nodes[touched_id]
                        before[touched_id] = (_whole_free(touched_node), not touched_node.pods)
                free_list.remove(spot)
                left = free - pod.spec.gpu_milli
                changed.append((spot, (left, to_node, to_index) if left > 0 else None))
                if left > 0:
                    free_list.add((left, to_node, to_index))
                why = f"consolidating GPU {index} of {node_id} to free it whole"
                trial.move(pod, to_node, (GpuShare(to_index, pod.spec.gpu_milli),), why)
            better = ok and (fragmenter is None or _fragment(cluster, fragmenter, touched) < fragment_before)
            if not better:
                trial.undo_to(mark)
                for spot, left_entry in reversed(changed):
                    if left_entry is not None:
                        free_list.remove(left_entry)
                    free_list.add(spot)
                free_list.add(entry)
                continue
            for pod, (spot, _) in zip(pods, changed, strict=True):
                by_gpu.setdefault((spot[1], spot[2]), []).append(pod)
                receivers.add((spot[1], spot[2]))
            by_gpu[(node_id, index)] = []
        plan = Plan(list(trial.moves))
        plan.gpus_freed, plan.nodes_freed = _outcome(cluster, plan.moves, before)
        if not plan.moves:
            plan.note = "no GPU holding only movable shares could be emptied within the budget with less fragmentation"
        return plan
    finally:
        trial.rollback()


def _fragment(cluster: ClusterState, fragmenter: Fragmenter | None, node_ids: set[str]) -> float:
    if fragmenter is None:
        return 0.0
    total = 0.0
    for node_id in node_ids:
        node = cluster.nodes[node_id]
        total += fragmenter(tuple(node.gpu_free), node.cpu_free, node.gpu_model)
    return total


def _best_partial(
    cluster: ClusterState, free_list: SortedList, pod: Pod, source: str, source_index: int
) -> tuple[int, str, int] | None:
    """The partly used GPU with the least free share that holds the pod (CPU and memory on its node too)."""
    need = pod.spec.gpu_milli
    start = free_list.bisect_left((need, "", -1))
    for position in range(start, min(start + SCAN, len(free_list))):
        free, node_id, index = free_list[position]
        if node_id == source and index == source_index:
            continue
        node = cluster.nodes[node_id]
        if node_id != source and (node.cpu_free < pod.spec.cpu_milli or node.memory_free < pod.spec.memory_mib):
            continue
        if not _admits(cluster, node, pod.shape):
            continue
        return free, node_id, index
    return None


# ---------------------------------------------------------------- making room for a target


def _destination(
    cluster: ClusterState, pod: Pod, exclude: set[str], model: str
) -> tuple[str, tuple[GpuShare, ...]] | None:
    """Where a moved pod goes: a node of its model, not excluded, best fit by GPU then node id."""
    shape = pod.shape._replace(gpu_models=(model,)) if pod.spec.num_gpu else pod.shape
    best: tuple[tuple[int, int, str], str] | None = None
    for group in cluster.index.feasible(shape):
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


def _fits(node: Node, shape: PodShape) -> bool:
    if node.cpu_free < shape.cpu_milli or node.memory_free < shape.memory_mib:
        return False
    free = node.gpu_free
    if not shape.num_gpu:
        return True
    if shape.gpu_milli >= GPU_MILLI:
        return sum(1 for milli in free if milli >= GPU_MILLI) >= shape.num_gpu
    return max(free) >= shape.gpu_milli


def make_room(cluster: ClusterState, trial: Trial, shape: PodShape, budget: int, why: str) -> str | None:
    """Move movable pods on trial so the shape fits some node: the node (fewest moves, then id), or None."""
    best: tuple[int, str, list[Pod]] | None = None
    for node_id in sorted(cluster.nodes):
        node = cluster.nodes[node_id]
        if not _admits(cluster, node, shape) or (shape.gpu_models and node.gpu_model not in shape.gpu_models):
            continue
        if _fits(node, shape):
            return node_id
        present = (cluster.pods.get(pod_id) for pod_id in sorted(node.pods))  # a trial member is no pod yet
        movable = [pod for pod in present if pod is not None and pod.spec.movable and pod.spec.gang_id is None]
        if not movable:
            continue
        limit = min(budget, len(movable), best[0] - 1 if best is not None else budget)
        found = _fewest(cluster, trial, node, shape, movable, limit)
        if found is not None and (best is None or len(found) < best[0]):
            best = (len(found), node_id, found)
    if best is None:
        return None
    _, node_id, pods = best
    for pod in pods:
        destination = _destination(cluster, pod, {node_id}, cluster.nodes[node_id].gpu_model)
        if destination is None:  # it fitted while planning this node; the order is the same
            return None
        trial.move(pod, destination[0], destination[1], why)
    return node_id


def _fewest(
    cluster: ClusterState, trial: Trial, node: Node, shape: PodShape, movable: list[Pod], limit: int
) -> list[Pod] | None:
    """The fewest movable pods (ids ascending among equals) whose moves away make the shape fit the node."""
    tried = 0
    for size in range(1, limit + 1):
        for chosen in combinations(movable, size):
            tried += 1
            if tried > TARGET_SUBSETS:
                return None
            mark = len(trial.moves)
            ok = True
            for pod in sorted(chosen, key=lambda p: (-p.spec.gpu_milli_total, p.spec.pod_id)):
                destination = _destination(cluster, pod, {node.node_id}, node.gpu_model)
                if destination is None:
                    ok = False
                    break
                trial.move(pod, destination[0], destination[1], "")
            fits = ok and _fits(node, shape)
            trial.undo_to(mark)
            if fits:
                return sorted(chosen, key=lambda p: (-p.spec.gpu_milli_total, p.spec.pod_id))
    return None
