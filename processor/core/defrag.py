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

Then, **set re-packing**, for what gaps and chains cannot find (re-pairing shares among several GPUs at
once): a GPU to free (the pool: partly used GPUs whose shares are all movable, most free milli first) and
as few other GPUs of its model as have that much free milli between them (on its node or with CPU for one of
its shares; one more if that fails; at most ``REPACK_SET`` in all) have all their shares packed anew into all
but one of them: depth first, largest share first, each trying its own GPU first and then best fit; selector,
taints, and the CPU and memory of every node at the end respected. The moves are ordered so that each fits
where it lands when it is applied; a cycle is broken by parking a share (on the GPU being freed, another of
the set, or a best-fit gap outside it) until its place has room. Of the GPUs of the set it could free, the
sequence with the fewest moves wins; kept within the budget and if it lowers the FGD fragmentation, as above.

Last, **moving pods across nodes** for the first waiting GPU pods (queue order, at most ``RELIEVE_PODS``),
where GPUs sit idle (or in large gaps) on nodes whose CPU or memory is taken: either up to ``RELIEVE_MOVES``
movable pods of any kind (whole-GPU, shares, CPU-only; CPU-heaviest first) leave a node whose GPUs the waiting
pod could take but whose CPU or memory is short, or one light GPU pod leaves a node with CPU to spare for
GPUs that lacked CPU or memory for the waiting pods, so the waiting pod fits the node it left. A moved pod
goes where it fits (best fit by GPU, then CPU, then node id; of its own GPU model, or, without quotas, of any
model its request allows), never leaving idle GPUs there short of the CPU or memory the smallest waiting GPU
pod asks. Each move fits where it lands when it is applied; a node made ready for one waiting pod takes no
pods and is not used again in the plan; no pod moves twice.

Cost: O(G log G) to index the G partly used GPUs, plus per share placed a scan of at most
``SCAN`` gaps, or for a chain ``EJECT_SCAN`` gaps times the shares on each times ``SCAN``; per model, at most
``REPACK_TRIES`` sets, each up to three packings of at most ``REPACK_STEPS`` steps.

**With a target** (a waiting pod, or each member of a waiting gang in turn): the node where it
fits after the fewest moves of movable pods away from it (each must fit elsewhere: best fit by
GPU, then node id), ties on node id; on trial, within the budget, or nothing.

The plan is made on trial (nodes and index follow each move, then everything is rolled back);
the fold emits it, so every move is applied by its event.
"""

from __future__ import annotations

from collections.abc import Iterator
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
RELIEVE_PODS = 8  # waiting GPU pods (queue order) that pods are moved across nodes for, per Defragment
RELIEVE_MOVES = 2  # pods moved off one node at most to make room for one waiting pod
ACROSS_MODELS = True  # without quotas, a pod moved across nodes may change GPU model (within its own constraint)
SWAP = True  # also move a light GPU pod onto GPUs left idle for want of CPU, freeing a GPU with CPU to spare
RELIEVE_SUBSETS = 200  # subsets of a node's movable pods tried per node when moving pods across nodes
REPACK_SET = 6  # GPUs re-packed together at most (one of them is freed)
REPACK_POOL = 48  # GPUs per model, most free milli first, that the sets are drawn from
REPACK_TRIES = 32  # sets tried per model per Defragment
REPACK_STEPS = 400  # search steps per packing of a set (a bound, so a Defragment stays fast)
REPACK_RIGID = 750  # a GPU holding one share larger than this only takes tiny shares: not in the pool


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
        return _across_only(cluster, budget)
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
            _record(gaps, before)
            receivers.update((move.to_node, move.to_gpus[0].index) for move in moved)
        _relieve(cluster, gaps, budget, before)
        _repack(cluster, gaps, budget, before, fragmenter)
        _relieve_across(cluster, trial, budget, before)  # last: it moves pods the gaps do not follow
        plan = Plan(list(trial.moves))
        plan.gpus_freed, plan.nodes_freed = _outcome(cluster, plan.moves, before)
        if not plan.moves:
            plan.note = "no GPU holding only movable shares could be emptied within the budget with less fragmentation"
        return plan
    finally:
        trial.rollback()


def _across_only(cluster: ClusterState, budget: int) -> Plan:
    """No movable share runs: only moving pods across nodes for the first waiting pods can help."""
    trial = Trial(cluster)
    before: dict[str, tuple[int, bool]] = {}
    try:
        _relieve_across(cluster, trial, budget, before)
        plan = Plan(list(trial.moves))
        plan.gpus_freed, plan.nodes_freed = _outcome(cluster, plan.moves, before)
        if not plan.moves:
            plan.note = "no movable GPU-share pod runs, and no move lets a waiting pod start: nothing was moved"
        return plan
    finally:
        trial.rollback()


def _record(gaps: _Gaps, before: dict[str, tuple[int, bool]]) -> None:
    for touched_id, (gpu_free, _, empty) in gaps.seen.items():
        before.setdefault(touched_id, (sum(1 for milli in gpu_free if milli >= GPU_MILLI), empty))


# ---------------------------------------------------------------- re-packing a set of GPUs


def _repack_pool(gaps: _Gaps, model: str) -> list[GpuKey]:
    """The partly used GPUs of a model whose shares are all movable, most free milli first (then key), at most
    ``REPACK_POOL``; a GPU holding one share larger than ``REPACK_RIGID`` is left out (it can only take tiny
    shares, and its own share fits nowhere but an empty GPU)."""
    pool: list[GpuKey] = []
    entries = gaps.lists[model]
    for position in range(len(entries) - 1, -1, -1):
        _, node_id, index = entries[position]
        key = (node_id, index)
        pods = gaps.shares.get(key, ())
        if not pods or not all(pod.spec.movable for pod in pods):
            continue
        if len(pods) == 1 and pods[0].spec.gpu_milli > REPACK_RIGID:
            continue
        pool.append(key)
        if len(pool) >= REPACK_POOL:
            break
    # Equal free milli: by key, so the order never depends on how the list was built.
    free = {key: gaps.cluster.nodes[key[0]].gpu_free[key[1]] for key in pool}
    pool.sort(key=lambda key: (-free[key], key))
    return pool


def _gpu_of(trial: Trial, pod: Pod) -> GpuKey:
    """The GPU a share is on in the trial."""
    node_id, gpus = trial.where(pod)
    return node_id, gpus[0].index


def _repack_sets(gaps: _Gaps, pool: list[GpuKey]) -> Iterator[tuple[GpuKey, ...]]:
    """Candidate sets, the GPU to free first: each GPU of the pool (most free first) with the GPUs of the pool
    that could take one of its shares' CPU (on its node, or on a node with that much CPU free), most free first,
    as few as add up to its used milli, then one more, up to ``REPACK_SET``."""
    nodes = gaps.cluster.nodes
    free = {key: nodes[key[0]].gpu_free[key[1]] for key in pool}
    for source in pool:
        pods = gaps.shares.get(source, ())
        cpu = min(pod.spec.cpu_milli for pod in pods)
        memory = min(pod.spec.memory_mib for pod in pods)
        receivers = [
            key
            for key in pool
            if key != source
            and (key[0] == source[0] or (nodes[key[0]].cpu_free >= cpu and nodes[key[0]].memory_free >= memory))
        ]
        need, total, size = GPU_MILLI - free[source], 0, 0
        while size < len(receivers) and total < need:
            total += free[receivers[size]]
            size += 1
        if total < need:
            continue
        for extra in range(size, min(size + 2, REPACK_SET, len(receivers) + 1)):
            yield (source, *receivers[:extra])


def _pack(gaps: _Gaps, pods: list[Pod], bins: list[GpuKey], at: dict[str, GpuKey]) -> dict[str, GpuKey] | None:
    """A packing of the shares ``pods`` into the GPUs ``bins``: depth-first, largest share first, each trying
    the GPU it is on first and then the fullest GPU that holds it (best fit); GPU model, selector, taints and
    the CPU and memory of every node at the end respected. At most ``REPACK_STEPS`` steps; None if none found."""
    cluster = gaps.cluster
    order = sorted(pods, key=lambda p: (-p.spec.gpu_milli, p.spec.pod_id))
    # Room on each GPU once the set's shares are lifted off (what else holds it stays).
    room = {key: cluster.nodes[key[0]].gpu_free[key[1]] for key in bins}
    for pod in order:
        if at[pod.spec.pod_id] in room:
            room[at[pod.spec.pod_id]] += pod.spec.gpu_milli
    admits: dict[tuple[str, str], bool] = {}
    for pod in order:
        for key in bins:
            admits[(pod.spec.pod_id, key[0])] = _admits(cluster, cluster.nodes[key[0]], pod.shape)
    left = [0] * (len(order) + 1)
    for i in range(len(order) - 1, -1, -1):
        left[i] = left[i + 1] + order[i].spec.gpu_milli
    chosen: dict[str, GpuKey] = {}
    steps = 0

    def resources_fit() -> bool:
        cpu: dict[str, int] = {}
        memory: dict[str, int] = {}
        for pod in order:
            spec = pod.spec
            source, target = at[spec.pod_id][0], chosen[spec.pod_id][0]
            if source == target:
                continue
            cpu[source] = cpu.get(source, 0) + spec.cpu_milli
            cpu[target] = cpu.get(target, 0) - spec.cpu_milli
            memory[source] = memory.get(source, 0) + spec.memory_mib
            memory[target] = memory.get(target, 0) - spec.memory_mib
        for node_id in sorted(cpu):
            node = cluster.nodes[node_id]
            if node.cpu_free + cpu[node_id] < 0 or node.memory_free + memory[node_id] < 0:
                return False
        return True

    def search(i: int) -> bool:
        nonlocal steps
        steps += 1
        if steps > REPACK_STEPS:
            return False
        if i == len(order):
            return resources_fit()
        if left[i] > sum(room.values()):
            return False
        pod = order[i]
        need, pod_id = pod.spec.gpu_milli, pod.spec.pod_id
        here = at[pod_id]
        options = sorted(
            (key for key in bins if room[key] >= need and admits[(pod_id, key[0])]),
            key=lambda key: (key != here, room[key], key),
        )
        tried: list[int] = []
        for key in options:
            if key != here and room[key] in tried:
                continue  # the same room elsewhere: the same packings of what is left
            if key != here:
                tried.append(room[key])
            room[key] -= need
            chosen[pod_id] = key
            if search(i + 1):
                return True
            room[key] += need
            del chosen[pod_id]
        return False

    return dict(chosen) if search(0) else None


def _sequence(
    gaps: _Gaps, pods: list[Pod], target: dict[str, GpuKey], members: tuple[GpuKey, ...], freed: GpuKey, why: str
) -> bool:
    """Apply a packing on trial as moves that each fit where they land when applied: any share whose place has
    room goes (ids in order); when none can (a cycle), the smallest waiting share that can is parked: on the GPU
    being freed, else on another GPU of the set, else in the best-fit gap outside it; it moves on once its place
    has room. True when every share is where the packing puts it."""
    index = {pod.spec.pod_id: pod for pod in pods}
    waiting = sorted(pod_id for pod_id, key in target.items() if _gpu_of(gaps.trial, index[pod_id]) != key)
    model = gaps.cluster.nodes[freed[0]].gpu_model
    outside = set(members)
    for _ in range(2 * len(pods) + 2):
        if not waiting:
            return True
        ready = [pod_id for pod_id in waiting if gaps.room(index[pod_id], target[pod_id])]
        if ready:
            pod_id = ready[0]
            gaps.move(index[pod_id], target[pod_id], why)
            waiting.remove(pod_id)
            continue
        if not _park(gaps, [index[pod_id] for pod_id in waiting], target, members, freed, model, outside, why):
            return False
    return not waiting


def _park(
    gaps: _Gaps,
    waiting: list[Pod],
    target: dict[str, GpuKey],
    members: tuple[GpuKey, ...],
    freed: GpuKey,
    model: str,
    outside: set[GpuKey],
    why: str,
) -> bool:
    """Park the smallest waiting share that can be parked (see :func:`_sequence`); False if none can."""
    for pod in sorted(waiting, key=lambda p: (p.spec.gpu_milli, p.spec.pod_id)):
        here, there = _gpu_of(gaps.trial, pod), target[pod.spec.pod_id]
        spots = [freed] + [key for key in members if key != freed]
        spot = next((key for key in spots if key not in (here, there) and gaps.room(pod, key)), None)
        if spot is None:
            spot = gaps.best_fit(pod, model, outside)
        if spot is not None:
            gaps.move(pod, spot, f"{why} (parked on GPU {spot[1]} of {spot[0]} until its place has room)")
            return True
    return False


def _repack(
    cluster: ClusterState,
    gaps: _Gaps,
    budget: int,
    before: dict[str, tuple[int, bool]],
    fragmenter: Fragmenter | None,
) -> None:
    """Free whole GPUs by re-packing the shares of a few partly used GPUs together: a set of at most
    ``REPACK_SET`` GPUs of one model (consecutive in the pool, most free first) whose free milli adds up to a
    GPU is packed into all but one of them (:func:`_pack`), the moves ordered so none over-commits
    (:func:`_sequence`); kept only within the budget and if it lowers FGD fragmentation, else undone."""
    trial = gaps.trial
    for model in sorted(gaps.lists):
        failed: dict[tuple[GpuKey, ...], bool] = {}
        for _ in range(REPACK_TRIES):
            if len(trial.moves) >= budget:
                return
            pool = _repack_pool(gaps, model)
            members = next((found for found in _repack_sets(gaps, pool) if found not in failed), None)
            if members is None:
                break
            if _repack_set(cluster, gaps, members, budget, fragmenter):
                _record(gaps, before)
            else:
                failed[members] = True


def _repack_set(
    cluster: ClusterState, gaps: _Gaps, members: tuple[GpuKey, ...], budget: int, fragmenter: Fragmenter | None
) -> bool:
    """Try to free one GPU of ``members`` (the first, or one of the two holding the fewest shares, then least
    used) by re-packing all their shares into the others: of the packings found, the one that moves the fewest
    shares first. On trial; kept if within the budget and less fragmented, else undone."""
    trial = gaps.trial
    pods = sorted((pod for key in members for pod in gaps.shares.get(key, ())), key=lambda p: p.spec.pod_id)
    at = {pod.spec.pod_id: _gpu_of(trial, pod) for pod in pods}
    nodes = cluster.nodes
    others = sorted(
        members[1:], key=lambda key: (len(gaps.shares.get(key, ())), GPU_MILLI - nodes[key[0]].gpu_free[key[1]], key)
    )
    found: list[tuple[int, int, GpuKey, dict[str, GpuKey]]] = []
    for rank, freed in enumerate((members[0], *others[:2])):
        target = _pack(gaps, pods, [key for key in members if key != freed], at)
        if target is not None:
            moving = sum(1 for pod_id, key in target.items() if at[pod_id] != key)
            if moving <= budget - len(trial.moves):
                found.append((moving, rank, freed, target))
    names = ", ".join(f"GPU {index} of {node_id}" for node_id, index in members)
    best: tuple[int, int] | None = None  # (moves with the parked ones, rank) of the best sequence that works
    for moving, rank, freed, target in sorted(found, key=lambda entry: entry[:2]):
        if best is not None and moving >= best[0]:
            break  # a sequence never takes fewer moves than its packing
        mark, moves = len(gaps.journal), len(trial.moves)
        gaps.seen = {}
        why = f"re-packing the shares of {names} so GPU {freed[1]} of {freed[0]} is freed whole"
        if (
            _sequence(gaps, pods, target, members, freed, why)
            and nodes[freed[0]].gpu_free[freed[1]] >= GPU_MILLI
            and len(trial.moves) <= budget
            and _less_fragmented(cluster, fragmenter, gaps.seen)  # it must lower FGD fragmentation where it moves
        ):
            taken = len(trial.moves) - moves
            if taken == moving:  # no share parked: nothing can do better
                return True
            if best is None or taken < best[0]:
                best = (taken, rank)
        gaps.undo_to(mark)
    if best is None:
        return False
    _, rank, freed, target = next(entry for entry in found if entry[1] == best[1])
    gaps.seen = {}
    why = f"re-packing the shares of {names} so GPU {freed[1]} of {freed[0]} is freed whole"
    return _sequence(gaps, pods, target, members, freed, why)


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
            _record(gaps, before)
            break
        if len(trial.moves) >= budget:
            return


def _relieve_across(cluster: ClusterState, trial: Trial, budget: int, before: dict[str, tuple[int, bool]]) -> None:
    """Make room for the first waiting GPU pods (queue order, at most ``RELIEVE_PODS``) on nodes whose GPUs
    they could use but whose CPU or memory is taken: move at most ``RELIEVE_MOVES`` movable pods of any kind
    (whole-GPU, shares, CPU-only) off such a node to other nodes of its GPU model where they fit, without
    leaving idle GPUs there short of CPU for the waiting pods (:func:`_landing`). The node needing the fewest
    moves wins (then id); a node made ready for one waiting pod is not used again in the plan, and pods
    are not moved twice. On trial: the queue takes the room (the fold places after the moves)."""
    heads = sorted(cluster.queue.heads(), key=lambda head: head[0])
    shapes = [group[2] for _, group in heads if group[2].num_gpu]
    if not shapes:
        return
    # A node with idle GPUs and less CPU or memory than every waiting GPU pod asks for strands its GPUs.
    least = (min(shape.cpu_milli for shape in shapes), min(shape.memory_mib for shape in shapes))
    claimed: set[str] = set()
    tried = 0
    movers = [
        pod
        for pod in movable_pods(cluster)
        if pod.spec.gang_id is None
        and (pod.spec.num_gpu == 1 or (pod.spec.num_gpu > 1 and pod.spec.gpu_milli >= GPU_MILLI))
    ]
    for _, group in heads:
        shape = group[2]
        if not shape.num_gpu or (shape.num_gpu > 1 and shape.gpu_milli < GPU_MILLI):
            continue
        for _ in range(cluster.queue.count(group)):
            if tried >= RELIEVE_PODS or len(trial.moves) >= budget:
                return
            tried += 1
            ready = _unclaimed_fit(cluster, shape, claimed)  # room an earlier step made: the queue takes it
            node_id = ready
            if node_id is None:
                node_id = _room_across(cluster, trial, shape, budget - len(trial.moves), claimed, least, before)
            if node_id is None and SWAP:
                node_id = _room_by_swap(cluster, trial, shape, claimed, least, movers, before)
            if node_id is None:
                break  # the next pod of this shape would find no more
            claimed.add(node_id)


def _unclaimed_fit(cluster: ClusterState, shape: PodShape, claimed: set[str]) -> str | None:
    """A node (least id) the shape fits now and that is not kept for another waiting pod, or None."""
    found = [
        node_id
        for group in cluster.index.feasible(shape)
        for node_id in group.node_ids
        if node_id not in claimed and _admits(cluster, cluster.nodes[node_id], shape)
    ]
    return min(found) if found else None


def _room_across(
    cluster: ClusterState,
    trial: Trial,
    shape: PodShape,
    budget: int,
    claimed: set[str],
    least: tuple[int, int],
    before: dict[str, tuple[int, bool]],
) -> str | None:
    """Move movable pods off the node where the shape fits after the fewest moves (then node id), each to a
    landing of its own (:func:`_landing`); on trial. The node, or None (nothing moved)."""
    best: tuple[int, str, tuple[Pod, ...]] | None = None
    limit = min(RELIEVE_MOVES, budget)
    for node_id in sorted(cluster.nodes):
        node = cluster.nodes[node_id]
        if node_id in claimed or not _admits(cluster, node, shape):
            continue
        if shape.gpu_models and node.gpu_model not in shape.gpu_models:
            continue
        if not _gpus_fit(node, shape) or _fits(node, shape):
            continue  # only a node whose GPUs the pod could take but whose CPU or memory is short
        present = (lookup(cluster.pods, pod_id) for pod_id in sorted(node.pods))
        movable = [
            pod
            for pod in present
            if pod is not None
            and pod.spec.movable
            and pod.spec.gang_id is None
            and pod.spec.pod_id not in trial.at
            and (pod.spec.num_gpu <= 1 or pod.spec.gpu_milli >= GPU_MILLI)  # no fractional multi-GPU pod
        ]
        if not movable or not _fits_without(node, shape, movable):
            continue
        movable.sort(key=lambda p: (-p.spec.cpu_milli, -p.spec.memory_mib, p.spec.pod_id))
        subsets = 0
        for size in range(1, (best[0] - 1 if best is not None else limit) + 1):
            for chosen in combinations(movable, size):
                subsets += 1
                if subsets > RELIEVE_SUBSETS:
                    break
                if not _fits_without(node, shape, list(chosen)):
                    continue
                mark = len(trial.moves)
                ok = all(_land(cluster, trial, pod, node_id, claimed, least, "") for pod in chosen)
                ok = ok and _fits(node, shape)
                trial.undo_to(mark)
                if ok:
                    best = (size, node_id, chosen)
                    break
            if (best is not None and best[1] == node_id) or subsets > RELIEVE_SUBSETS:
                break
        if best is not None and best[0] == 1:
            break  # one move: nothing does better (ties on node id)
    if best is None:
        return None
    _, node_id, chosen = best
    node = cluster.nodes[node_id]
    mark = len(trial.moves)
    seen: dict[str, tuple[int, bool]] = {}
    idle = _whole_free(node)
    why = (
        f"moving it off {node_id} so a waiting pod ({shape.num_gpu} GPU(s), {shape.cpu_milli} mCPU) fits there: "
        f"its GPUs{f' ({idle} idle)' if idle else ''} lacked the CPU or memory"
    )
    for pod in chosen:
        if not _land(cluster, trial, pod, node_id, claimed, least, why, seen=seen):
            trial.undo_to(mark)  # it landed while planning; the order is the same
            return None
    if not _fits(node, shape):
        trial.undo_to(mark)
        return None
    for touched, state in seen.items():
        before.setdefault(touched, state)
    return node_id


def _gpus_fit(node: Node, shape: PodShape) -> bool:
    """Whether the node's free GPUs hold the shape's (CPU and memory aside)."""
    if shape.gpu_milli >= GPU_MILLI:
        return sum(1 for milli in node.gpu_free if milli >= GPU_MILLI) >= shape.num_gpu
    return max(node.gpu_free, default=0) >= shape.gpu_milli


def _room_by_swap(
    cluster: ClusterState,
    trial: Trial,
    shape: PodShape,
    claimed: set[str],
    least: tuple[int, int],
    movers: list[Pod],
    before: dict[str, tuple[int, bool]],
) -> str | None:
    """One move: a movable GPU pod whose leaving makes the shape fit its node goes where GPUs are idle (or a
    gap is left) for want of CPU or memory there and it fits (:func:`_landing`); the first by node id, then
    pod id. On trial; the node made ready, or None."""
    # A pod with more CPU or memory than any node short of ``least`` has free lands nowhere (a bound).
    short = [
        node
        for node in cluster.nodes.values()
        if node.schedulable and node.gpu_count and (node.cpu_free < least[0] or node.memory_free < least[1])
    ]
    cpu = max((node.cpu_free for node in short), default=-1)
    memory = max((node.memory_free for node in short), default=-1)
    for pod in movers:
        if pod.spec.cpu_milli > cpu or pod.spec.memory_mib > memory or pod.spec.pod_id in trial.at:
            continue
        node = cluster.nodes[pod.node_id]  # type: ignore[index]
        if node.node_id in claimed or (shape.gpu_models and node.gpu_model not in shape.gpu_models):
            continue
        if not _fits_without(node, shape, [pod]) or not _admits(cluster, node, shape):
            continue
        mark = len(trial.moves)
        seen: dict[str, tuple[int, bool]] = {}
        why = (
            f"moving it off {node.node_id} so a waiting pod ({shape.num_gpu} GPU(s), {shape.cpu_milli} mCPU) "
            "fits there, to a GPU that lacked the CPU or memory for that pod"
        )
        if _land(cluster, trial, pod, node.node_id, claimed, least, why, seen=seen, stranded_only=True):
            if _fits(node, shape):
                for touched, state in seen.items():
                    before.setdefault(touched, state)
                return node.node_id
            trial.undo_to(mark)
    return None


def _fits_without(node: Node, shape: PodShape, pods: list[Pod]) -> bool:
    """Whether the shape would fit the node once ``pods`` (running there) are gone: arithmetic only."""
    cpu, memory = node.cpu_free, node.memory_free
    free = list(node.gpu_free)
    for pod in pods:
        cpu += pod.spec.cpu_milli
        memory += pod.spec.memory_mib
        for share in pod.gpus:
            free[share.index] += share.milli
    if cpu < shape.cpu_milli or memory < shape.memory_mib:
        return False
    if shape.gpu_milli >= GPU_MILLI:
        return sum(1 for milli in free if milli >= GPU_MILLI) >= shape.num_gpu
    return max(free, default=0) >= shape.gpu_milli


def _land(
    cluster: ClusterState,
    trial: Trial,
    pod: Pod,
    away: str,
    claimed: set[str],
    least: tuple[int, int],
    why: str,
    seen: dict[str, tuple[int, bool]] | None = None,
    stranded_only: bool = False,
) -> bool:
    """Move a pod off node ``away`` on trial to its landing (:func:`_landing`); False if it has none."""
    # Without quotas a pod may change GPU model within its own constraint (quota keys follow the model).
    model = None if ACROSS_MODELS and not cluster.quotas_on else cluster.nodes[away].gpu_model
    landing = _landing(cluster, pod, claimed | {away}, model, least, stranded_only)
    if landing is None:
        return False
    if seen is not None:
        for node_id in (away, landing[0]):
            if node_id not in seen:
                node = cluster.nodes[node_id]
                seen[node_id] = (_whole_free(node), not node.pods)
    trial.move(pod, landing[0], landing[1], why)
    return True


def _landing(
    cluster: ClusterState,
    pod: Pod,
    exclude: set[str],
    model: str | None,
    least: tuple[int, int],
    stranded_only: bool = False,
) -> tuple[str, tuple[GpuShare, ...]] | None:
    """Where a pod moved across nodes goes: a node of ``model`` (for a GPU pod) where it fits, that is not
    left with idle GPUs short of the CPU or memory ``least`` the smallest waiting GPU pod asks (unless it
    already was); best fit by GPU, then CPU, then node id."""
    shape = pod.shape._replace(gpu_models=(model,)) if pod.spec.num_gpu and model is not None else pod.shape
    best: tuple[tuple[int, int, str], str] | None = None
    for group in cluster.index.feasible(shape):
        signature = group.signature
        if model is not None and signature.gpu_model != model:
            continue
        node_id = next((n for n in group.node_ids if n not in exclude), None)
        if node_id is None:
            continue
        free = list(signature.gpu_free)
        if shape.num_gpu and shape.gpu_milli < GPU_MILLI:
            gap = min(milli for milli in free if milli >= shape.gpu_milli)
            fit = gap - shape.gpu_milli
            free[free.index(gap)] = fit
        else:
            fit = sum(1 for milli in free if milli >= GPU_MILLI) - shape.num_gpu
            for _ in range(shape.num_gpu if shape.num_gpu else 0):
                free[free.index(max(free))] = 0
        idle_before = sum(1 for milli in signature.gpu_free if milli >= GPU_MILLI)
        idle_after = sum(1 for milli in free if milli >= GPU_MILLI)
        cpu_after = signature.cpu_free - shape.cpu_milli
        memory_after = signature.memory_free - shape.memory_mib
        short_before = signature.cpu_free < least[0] or signature.memory_free < least[1]
        if idle_after and (cpu_after < least[0] or memory_after < least[1]) and not (idle_before and short_before):
            continue  # it would strand that node's idle GPUs
        if stranded_only and not short_before:
            continue  # GPUs a waiting pod could use as they are: not to be taken
        rank = (fit, cpu_after, node_id)
        if best is None or rank < best[0]:
            best = (rank, node_id)
    if best is None:
        return None
    node_id = best[1]
    return node_id, default_gpus(cluster.nodes[node_id].gpu_free, shape)


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
