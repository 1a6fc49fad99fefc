"""Defragmentation: migrations of movable pods that free whole GPUs, or make room for one waiting job.

Only running pods submitted with ``movable: true`` move, and only to another schedulable node
of the same GPU model (so quota keys and GPU-model constraints stay as they were) that admits
them (selector, taints; reserved nodes are left alone). A move is one ``PodMigrated``.

**Without a target** (consolidation): a GPU that holds only movable shares is *emptied* when
every share on it finds a place on another partly used GPU: best fit (the smallest gap that holds
it; never a fully free GPU, that would only move the hole), or, when no gap is large enough, a
chain: a smaller movable share leaves a GPU whose gap is just too small, into a gap of its own
(best fit), and the share takes the room it left (a chain is at most ``DEPTH`` + 1 moves deep,
and every move fits where it lands when it is applied). The cheapest GPUs go first (fewest pods,
then least used); a GPU is emptied only if that lowers the cluster's FGD fragmentation
(``processor.core.fragmentation``, against the learned typical pods) on the nodes it touches, and
only within the move budget. A GPU that took shares in the plan is not emptied in it.

Then, **relief**: an idle whole GPU on a node whose CPU or memory is gone serves nobody. For the
first waiting whole-GPU shapes (queue order), movable shares on such a node (CPU-heaviest first)
move into gaps elsewhere, the same way, until the first shape that wants no more GPUs than are idle
there fits; or nothing moves there. The queue then takes the room (the fold places after the moves).

Cost: O(G log G) to index the G partly used GPUs, plus per share placed a scan of at most
``SCAN`` gaps, or for a chain ``EJECT_SCAN`` gaps times the shares on each times ``SCAN``.

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
from processor.core.state import ClusterState, Node, Pod, lookup
from schemas.commands import GPU_MILLI
from schemas.events import GpuShare

SCAN = 64  # candidate destination GPUs looked at per share moved
RELIEVE_SHAPES = 16  # waiting whole-GPU shapes (queue order) that idle GPUs short of CPU are relieved for
DEPTH = 1  # ejections per chain (depth 2 measured: no better within noise, 2-4x the CPU)
EJECT_SCAN = 16  # gaps just too small for a share looked at for a chain of two moves
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


GpuKey = tuple[str, int]  # (node id, GPU index)


class _Gaps:
    """The partly used GPUs of each model by free milli, and the shares on every GPU, as trial moves go.

    Every change is journalled, so a failed attempt to empty a GPU is undone with the trial's moves."""

    def __init__(self, cluster: ClusterState, trial: Trial, models: list[str]) -> None:
        self.cluster = cluster
        self.trial = trial
        self.lists: dict[str, SortedList] = {model: SortedList() for model in models}
        self.shares: dict[GpuKey, list[Pod]] = {}
        self.journal: list[tuple[Pod, GpuKey, GpuKey]] = []
        # The nodes an attempt touched, as first seen: free GPUs, free CPU, whether no pod ran there.
        self.seen: dict[str, tuple[tuple[int, ...], int, bool]] = {}
        for pod in cluster.pods.values():
            if pod.node_id is not None and pod.shape.is_share:
                self.shares.setdefault((pod.node_id, pod.gpus[0].index), []).append(pod)
        for node_id in sorted(cluster.nodes):
            node = cluster.nodes[node_id]
            if node.gpu_model in self.lists and node.schedulable:
                for index, free in enumerate(node.gpu_free):
                    if 0 < free < GPU_MILLI:
                        self.lists[node.gpu_model].add((free, node_id, index))

    def _resync(self, key: GpuKey, old_free: int) -> None:
        node = self.cluster.nodes[key[0]]
        entries = self.lists.get(node.gpu_model)
        if entries is None or not node.schedulable:
            return
        if 0 < old_free < GPU_MILLI:
            entries.remove((old_free, key[0], key[1]))
        new_free = node.gpu_free[key[1]]
        if 0 < new_free < GPU_MILLI:
            entries.add((new_free, key[0], key[1]))

    def move(self, pod: Pod, to: GpuKey, why: str) -> None:
        """Move a share on trial (the caller checked it fits), keeping the lists in step."""
        at = self.trial.where(pod)
        source: GpuKey = (at[0], at[1][0].index)
        nodes = self.cluster.nodes
        for node_id in (source[0], to[0]):
            if node_id not in self.seen:
                node = nodes[node_id]
                self.seen[node_id] = (tuple(node.gpu_free), node.cpu_free, not node.pods)
        old_source, old_to = nodes[source[0]].gpu_free[source[1]], nodes[to[0]].gpu_free[to[1]]
        self.trial.move(pod, to[0], (GpuShare(to[1], pod.spec.gpu_milli),), why)
        self._resync(source, old_source)
        self._resync(to, old_to)
        self.shares[source].remove(pod)
        self.shares.setdefault(to, []).append(pod)
        self.journal.append((pod, source, to))

    def undo_to(self, mark: int) -> None:
        nodes = self.cluster.nodes
        while len(self.journal) > mark:
            pod, source, to = self.journal.pop()
            old_source, old_to = nodes[source[0]].gpu_free[source[1]], nodes[to[0]].gpu_free[to[1]]
            self.trial.undo_to(len(self.trial.moves) - 1)
            self._resync(source, old_source)
            self._resync(to, old_to)
            self.shares[to].remove(pod)
            self.shares[source].append(pod)
            self.shares[source].sort(key=lambda p: p.spec.pod_id)

    def room(self, pod: Pod, key: GpuKey) -> bool:
        """Whether the share fits GPU ``key`` now (GPU, and CPU and memory unless it is already on that node)."""
        node = self.cluster.nodes[key[0]]
        if node.gpu_free[key[1]] < pod.spec.gpu_milli:
            return False
        if self.trial.where(pod)[0] != key[0] and (
            node.cpu_free < pod.spec.cpu_milli or node.memory_free < pod.spec.memory_mib
        ):
            return False
        return _admits(self.cluster, node, pod.shape)

    def best_fit(self, pod: Pod, model: str, exclude: set[GpuKey]) -> GpuKey | None:
        """The partly used GPU with the least free milli that holds the share (never a fully free GPU)."""
        entries = self.lists[model]
        start = entries.bisect_left((pod.spec.gpu_milli, "", -1))
        for position in range(start, min(start + SCAN, len(entries))):
            _, node_id, index = entries[position]
            if (node_id, index) not in exclude and self.room(pod, (node_id, index)):
                return node_id, index
        return None

    def place(self, pod: Pod, model: str, exclude: set[GpuKey], why: str, depth: int = 1) -> bool:
        """Put a share into an existing gap: best fit, or else into a gap a smaller movable share
        leaves by moving first into a gap of its own (a chain of two moves). On trial; True if placed."""
        spot = self.best_fit(pod, model, exclude)
        if spot is not None:
            self.move(pod, spot, why)
            return True
        if depth <= 0:
            return False
        need = pod.spec.gpu_milli
        entries = self.lists[model]
        end = entries.bisect_left((need, "", -1))
        for position in range(end - 1, max(end - 1 - EJECT_SCAN, -1), -1):
            free, node_id, index = entries[position]
            key = (node_id, index)
            if key in exclude:
                continue
            others = sorted(self.shares.get(key, ()), key=lambda p: (p.spec.gpu_milli, p.spec.pod_id))
            for other in others:
                if not other.spec.movable or other.spec.gpu_milli >= need or free + other.spec.gpu_milli < need:
                    continue
                mark = len(self.journal)
                making = f"{why}: leaving room on GPU {index} of {node_id} for a larger share"
                if not self.place(other, model, exclude | {key}, making, depth - 1):
                    continue
                if self.room(pod, key):
                    self.move(pod, key, why)
                    return True
                self.undo_to(mark)
        return False


def consolidate(cluster: ClusterState, budget: int) -> Plan:
    """Free whole GPUs by emptying the cheapest GPUs that hold only movable shares (module docstring)."""
    movable = [pod for pod in movable_pods(cluster) if pod.shape.is_share]
    if not movable:
        return Plan(note="no movable GPU-share pod runs: nothing to consolidate")
    models = sorted({cluster.nodes[pod.node_id].gpu_model for pod in movable})  # type: ignore[index]
    trial = Trial(cluster)
    gaps = _Gaps(cluster, trial, models)
    sources = []
    for (node_id, index), pods in gaps.shares.items():
        node = cluster.nodes[node_id]
        if node.gpu_model in gaps.lists and node.schedulable and all(pod.spec.movable for pod in pods):
            used = GPU_MILLI - node.gpu_free[index]
            sources.append((len(pods), used, node_id, index))
    sources.sort()
    fragmenter = Fragmenter(cluster.typical) if cluster.typical else None
    before: dict[str, tuple[int, bool]] = {}
    receivers: set[GpuKey] = set()  # GPUs that took shares in this plan: never emptied again
    try:
        for _, _, node_id, index in sources:
            key = (node_id, index)
            pods = sorted(gaps.shares.get(key, ()), key=lambda p: (-p.spec.gpu_milli, p.spec.pod_id))
            if key in receivers or not pods or len(pods) > budget - len(trial.moves):
                continue
            node = cluster.nodes[node_id]
            mark, journal_mark = len(trial.moves), len(gaps.journal)
            gaps.seen = {}
            why = f"consolidating GPU {index} of {node_id} to free it whole"
            ok = True
            for pod in pods:
                if not gaps.place(pod, node.gpu_model, {key}, why, DEPTH):
                    ok = False
                    break
            moved = trial.moves[mark:]
            better = ok and len(trial.moves) <= budget and _less_fragmented(cluster, fragmenter, gaps.seen)
            if not better:
                gaps.undo_to(journal_mark)
                continue
            for touched_id, (gpu_free, _, empty) in gaps.seen.items():
                before.setdefault(touched_id, (sum(1 for milli in gpu_free if milli >= GPU_MILLI), empty))
            receivers.update((move.to_node, move.to_gpus[0].index) for move in moved)
        _relieve(cluster, gaps, budget, before)
        plan = Plan(list(trial.moves))
        plan.gpus_freed, plan.nodes_freed = _outcome(cluster, plan.moves, before)
        if not plan.moves:
            plan.note = "no GPU holding only movable shares could be emptied within the budget with less fragmentation"
        return plan
    finally:
        trial.rollback()


def _waiting_whole_gpu_shapes(cluster: ClusterState) -> list[PodShape]:
    """The shapes of the first waiting whole-GPU pods, in queue order (at most ``RELIEVE_SHAPES``)."""
    heads = sorted(cluster.queue.heads(), key=lambda head: head[0])
    shapes = [group[2] for _, group in heads if group[2].num_gpu and group[2].gpu_milli >= GPU_MILLI]
    return shapes[:RELIEVE_SHAPES]


def _relieve(cluster: ClusterState, gaps: _Gaps, budget: int, before: dict[str, tuple[int, bool]]) -> None:
    """Make idle whole GPUs usable where a waiting pod lacks only CPU or memory on their node: move
    movable shares (CPU-heaviest first) off that node into gaps elsewhere until the first waiting
    whole-GPU shape (queue order) that wants no more GPUs than are idle there fits; or move nothing."""
    shapes = _waiting_whole_gpu_shapes(cluster)
    if not shapes:
        return
    trial = gaps.trial
    for node_id in sorted(cluster.nodes):
        node = cluster.nodes[node_id]
        idle = _whole_free(node)
        if not idle or not node.schedulable or node.gpu_model not in gaps.lists:
            continue
        for shape in shapes:
            if shape.num_gpu > idle or (shape.gpu_models and node.gpu_model not in shape.gpu_models):
                continue
            if _fits(node, shape) or not _admits(cluster, node, shape):
                break  # it fits as it is (the queue takes it), or never will by moving shares
            keys = {(node_id, index) for index in range(node.gpu_count)}
            pods = [pod for key in sorted(keys) for pod in gaps.shares.get(key, ()) if pod.spec.movable]
            pods.sort(key=lambda p: (-p.spec.cpu_milli, -p.spec.memory_mib, p.spec.pod_id))
            cpu = node.cpu_free + sum(pod.spec.cpu_milli for pod in pods)
            memory = node.memory_free + sum(pod.spec.memory_mib for pod in pods)
            if cpu < shape.cpu_milli or memory < shape.memory_mib:
                continue
            mark = len(gaps.journal)
            gaps.seen = {}
            why = f"moving CPU and memory off {node_id} so its {idle} idle GPU(s) can take a waiting pod"
            for pod in pods:
                if _fits(node, shape) or len(trial.moves) >= budget:
                    break
                gaps.place(pod, node.gpu_model, keys, why, DEPTH)
            if not _fits(node, shape):
                gaps.undo_to(mark)
                continue
            for touched_id, (gpu_free, _, empty) in gaps.seen.items():
                before.setdefault(touched_id, (sum(1 for milli in gpu_free if milli >= GPU_MILLI), empty))
            break
        if len(trial.moves) >= budget:
            return


def _less_fragmented(cluster: ClusterState, fragmenter: Fragmenter | None, seen: dict[str, tuple]) -> bool:
    """Whether FGD's fragmentation of the nodes an attempt touched (``seen``: their free GPUs and CPU
    before it) is lower now than before."""
    if fragmenter is None:
        return True
    before = after = 0.0
    for node_id in sorted(seen):
        node = cluster.nodes[node_id]
        gpu_free, cpu_free, _ = seen[node_id]
        before += fragmenter(gpu_free, cpu_free, node.gpu_model)
        after += fragmenter(tuple(node.gpu_free), node.cpu_free, node.gpu_model)
    return after < before


def _fragment(cluster: ClusterState, fragmenter: Fragmenter | None, node_ids: set[str]) -> float:
    if fragmenter is None:
        return 0.0
    total = 0.0
    for node_id in sorted(node_ids):
        node = cluster.nodes[node_id]
        total += fragmenter(tuple(node.gpu_free), node.cpu_free, node.gpu_model)
    return total


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
        present = (lookup(cluster.pods, pod_id) for pod_id in sorted(node.pods))  # a trial member is no pod yet
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
