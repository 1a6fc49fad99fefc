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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from math import comb

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
LOOKS = 2_000  # subsets of pods looked at (and landings sought), in all, per move of the budget
TRIAL_MOVES = 64  # trial moves made (kept or undone) while planning, in all, per move of the budget
UNBOUNDED = 1 << 62  # the allowance of a command of contract v1 or v2: it plans as its release did
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
    looks: int = 0  # the work planning took (:class:`Allowance`): looks spent
    trial_moves: int = 0  # and trial moves made, kept or undone


def movable_pods(cluster: ClusterState) -> list[Pod]:
    """Running movable pods, by id."""
    return sorted(
        (pod for pod in cluster.pods.values() if pod.node_id is not None and pod.spec.movable),
        key=lambda pod: pod.spec.pod_id,
    )


class Allowance:
    """The work one ``Defragment`` may do while planning, per move of its budget: ``LOOKS`` looks and
    ``TRIAL_MOVES`` trial moves made, kept or undone (:attr:`Trial.made`). A look is one bounded piece of
    search: a subset of pods checked, a source GPU's dry run per share (at most ``SCAN`` gaps), a node relieved
    per share, a step of a set's packing or a GPU of its pool, a landing sought (one placement's scan), or a
    node listed for a target. A step asks before each attempt (and the target's search before each trial
    move); once either is spent (``spent``), no step starts another attempt and the plan is what was kept.

    Not ``bounded`` (a command of contract v1 or v2): unlimited, so such a command plans the moves its
    release planned, however large the cluster (the recorded logs replay byte for byte)."""

    __slots__ = ("looked", "looks", "moves", "spent")

    def __init__(self, budget: int, bounded: bool = True) -> None:
        self.looks = LOOKS * budget if bounded else UNBOUNDED
        self.moves = TRIAL_MOVES * budget if bounded else UNBOUNDED
        self.looked = 0  # looks spent (a measure for tests and benchmarks)
        self.spent = False

    def look(self, count: int = 1) -> bool:
        """Spend ``count`` looks; False (and spent) if fewer are left."""
        if self.looks < count:
            self.spent = True
            return False
        self.looks -= count
        self.looked += count
        return True

    def move(self, trial: Trial) -> bool:
        """Whether the trial may make another move; False (and spent) once it made its allowance."""
        if trial.made >= self.moves:
            self.spent = True
            return False
        return True


class Trial:
    """Moves applied to nodes and the index, undone by :meth:`rollback` (newest first).

    While ``deferred``, a move leaves the capacity index (and the preemption index's marks) as they were and
    notes the node; :meth:`flush` files the noted nodes. For planning steps that read nodes, never the index:
    a move tried and undone then costs no index update at all."""

    def __init__(self, cluster: ClusterState, bounded: bool = True) -> None:
        self.cluster = cluster
        self.bounded = bounded  # whether its search has an allowance (:class:`Allowance`)
        self.moves: list[Move] = []
        # The trial's view of where moved pods are: pod id -> (node, gpus).
        self.at: dict[str, tuple[str, tuple[GpuShare, ...]]] = {}
        self._allowance: Allowance | None = None
        self.touched: list[str] = []  # the nodes of every move made or undone, in order
        self._rooms: dict[PodShape, _Rooms] = {}
        self.deferred = False
        self.stale: set[str] = set()  # nodes moved while deferred, not yet filed again
        self.made = 0  # moves made, kept or undone

    def allowance(self, budget: int) -> Allowance:
        """The search work left to this trial, set on first use from the budget (moves left plus made)."""
        if self._allowance is None:
            self._allowance = Allowance(budget + len(self.moves), self.bounded)
        return self._allowance

    def rooms(
        self, shape: PodShape, allowance: Allowance
    ) -> tuple[SortedList, dict[str, tuple[int, list[Pod]]]] | None:
        """The nodes :func:`make_room` may make room on for the shape, by their bound (:class:`_Rooms`); a
        look per node listed (all of them the first time, those trial moves touched since then), or None if
        the allowance cannot pay for it."""
        rooms = self._rooms.get(shape)
        if rooms is None:
            if not allowance.look(len(self.cluster.nodes)):
                return None
            rooms = self._rooms[shape] = _Rooms(self.cluster, self, shape)
        else:
            if not allowance.look(len(self.touched) - rooms.seen):
                return None
            rooms.refresh(self.cluster, self, shape)
        return rooms.order, rooms.known

    def where(self, pod: Pod) -> tuple[str, tuple[GpuShare, ...]]:
        moved = self.at.get(pod.spec.pod_id)
        return moved if moved is not None else (pod.node_id, pod.gpus)  # type: ignore[return-value]

    def move(self, pod: Pod, to_node: str, to_gpus: tuple[GpuShare, ...], why: str) -> None:
        from_node, from_gpus = self.where(pod)
        nodes = self.cluster.nodes
        nodes[from_node].free(pod.spec, from_gpus)
        nodes[to_node].allocate(pod.spec, to_gpus, pod.started_at)
        self._reindex(from_node)
        self._reindex(to_node)
        self.touched.extend((from_node, to_node))
        self.made += 1
        self.at[pod.spec.pod_id] = (to_node, to_gpus)
        self.moves.append(Move(pod.spec.pod_id, from_node, from_gpus, to_node, to_gpus, why))

    def undo_to(self, mark: int) -> None:
        nodes = self.cluster.nodes
        while len(self.moves) > mark:
            move = self.moves.pop()
            pod = self.cluster.pods[move.pod_id]
            nodes[move.to_node].free(pod.spec, move.to_gpus)
            nodes[move.from_node].allocate(pod.spec, move.from_gpus, pod.started_at)
            self._reindex(move.to_node)
            self._reindex(move.from_node)
            self.touched.extend((move.to_node, move.from_node))
            if move.from_node == pod.node_id and move.from_gpus == pod.gpus:
                self.at.pop(move.pod_id, None)
            else:
                self.at[move.pod_id] = (move.from_node, move.from_gpus)

    def _reindex(self, node_id: str) -> None:
        if self.deferred:
            self.stale.add(node_id)
        else:
            self.cluster.reindex(self.cluster.nodes[node_id])

    def flush(self) -> None:
        """File the nodes moved while deferred (in id order) and stop deferring."""
        self.deferred = False
        for node_id in sorted(self.stale):
            self.cluster.reindex(self.cluster.nodes[node_id])
        self.stale.clear()

    def rollback(self) -> None:
        self.undo_to(0)
        self.flush()


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


def consolidate(cluster: ClusterState, budget: int, bounded: bool = True) -> Plan:
    """Free whole GPUs by emptying the cheapest GPUs that hold only movable shares (module docstring); within
    the work allowance of the budget if ``bounded`` (:class:`Allowance`)."""
    movable = [pod for pod in movable_pods(cluster) if pod.shape.is_share]
    if not movable:
        return _across_only(cluster, budget, bounded)
    models = sorted({cluster.nodes[pod.node_id].gpu_model for pod in movable})  # type: ignore[index]
    trial = Trial(cluster, bounded)
    allowance = trial.allowance(budget)
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
    trial.deferred = True  # the steps up to moving pods across nodes read the nodes, never the index
    try:
        # Measure: the sources left; each one tried spends a look per share (its dry run: at most SCAN gaps
        # per share) and, when tried on trial, moves of the allowance.
        for _, _, node_id, index in sources:
            key = (node_id, index)
            pods = sorted(gaps.shares.get(key, ()), key=lambda p: (-p.spec.gpu_milli, p.spec.pod_id))
            if key in receivers or not pods or len(pods) > budget - len(trial.moves):
                continue
            if not allowance.look(len(pods)):
                break
            node = cluster.nodes[node_id]
            if fragmenter is not None and _dry_run(gaps, pods, node.gpu_model, key, fragmenter) is False:
                continue  # its moves would be undone (not less fragmented): known without making them
            if not allowance.move(trial):
                break
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
        trial.flush()
        _relieve_across(cluster, trial, budget, before)  # last: it moves pods the gaps do not follow
        plan = Plan(list(trial.moves))
        plan.gpus_freed, plan.nodes_freed = _outcome(cluster, plan.moves, before)
        plan.looks, plan.trial_moves = allowance.looked, trial.made
        if not plan.moves:
            plan.note = "no GPU holding only movable shares could be emptied within the budget with less fragmentation"
        return plan
    finally:
        trial.rollback()


def _across_only(cluster: ClusterState, budget: int, bounded: bool) -> Plan:
    """No movable share runs: only moving pods across nodes for the first waiting pods can help."""
    trial = Trial(cluster, bounded)
    allowance = trial.allowance(budget)
    before: dict[str, tuple[int, bool]] = {}
    try:
        _relieve_across(cluster, trial, budget, before)
        plan = Plan(list(trial.moves))
        plan.gpus_freed, plan.nodes_freed = _outcome(cluster, plan.moves, before)
        plan.looks, plan.trial_moves = allowance.looked, trial.made
        if not plan.moves:
            plan.note = "no movable GPU-share pod runs, and no move lets a waiting pod start: nothing was moved"
        return plan
    finally:
        trial.rollback()


def _record(gaps: _Gaps, before: dict[str, tuple[int, bool]]) -> None:
    for touched_id, (gpu_free, _, empty) in gaps.seen.items():
        before.setdefault(touched_id, (sum(1 for milli in gpu_free if milli >= GPU_MILLI), empty))


# ---------------------------------------------------------------- re-packing a set of GPUs


def _repack_pool(gaps: _Gaps, model: str, allowance: Allowance) -> list[GpuKey]:
    """The partly used GPUs of a model whose shares are all movable, most free milli first (then key), at most
    ``REPACK_POOL``; a GPU holding one share larger than ``REPACK_RIGID`` is left out (it can only take tiny
    shares, and its own share fits nowhere but an empty GPU). A look per GPU looked at."""
    pool: list[GpuKey] = []
    entries = gaps.lists[model]
    for position in range(len(entries) - 1, -1, -1):  # measure: the position, down to 0
        if not allowance.look():
            break
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


def _pack(
    gaps: _Gaps, pods: list[Pod], bins: list[GpuKey], at: dict[str, GpuKey], limit: int
) -> tuple[dict[str, GpuKey] | None, int]:
    """A packing of the shares ``pods`` into the GPUs ``bins``: depth-first, largest share first, each trying
    the GPU it is on first and then the fullest GPU that holds it (best fit); GPU model, selector, taints and
    the CPU and memory of every node at the end respected. At most ``limit`` steps (``REPACK_STEPS`` or what
    the allowance has left); (the packing or None if none found, the steps taken)."""
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
        if steps > limit:  # the measure: steps left, down by one per call
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

    found = search(0)
    return (dict(chosen) if found else None), min(steps, limit)


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
    allowance = trial.allowance(budget)
    for model in sorted(gaps.lists):
        failed: dict[tuple[GpuKey, ...], bool] = {}
        pool: list[GpuKey] | None = None
        for _ in range(REPACK_TRIES):
            if len(trial.moves) >= budget or not allowance.move(trial):
                return
            if pool is None:
                pool = _repack_pool(gaps, model, allowance)
            if not allowance.look(len(pool) + 1):  # drawing the sets of the pool (O(REPACK_POOL) each)
                return
            members = next((found for found in _repack_sets(gaps, pool) if found not in failed), None)
            if members is None:
                break
            if _repack_set(cluster, gaps, members, budget, fragmenter):
                _record(gaps, before)
                pool = None  # shares moved: draw the pool again
            else:
                failed[members] = True  # everything undone: the same pool


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
    allowance = trial.allowance(budget)
    for rank, freed in enumerate((members[0], *others[:2])):
        limit = min(REPACK_STEPS, allowance.looks)
        target, steps = _pack(gaps, pods, [key for key in members if key != freed], at, limit)
        allowance.look(steps)  # a look per step of the packing (at most what was left)
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
    for node_id in sorted(cluster.nodes):  # measure: the nodes left; each attempt on one spends the allowance
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
            allowance = trial.allowance(budget)
            if not allowance.move(trial) or not allowance.look(len(pods)):  # a gap sought per share at most
                return
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
        next((n for n in group.node_ids if n not in claimed and _admits(cluster, cluster.nodes[n], shape)), None)
        for group in cluster.index.feasible(shape)
    ]  # each group's first node not kept (ids ascending): at most len(claimed) + 1 looked at per group
    return min((node_id for node_id in found if node_id is not None), default=None)


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
    allowance = trial.allowance(budget)
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
        # Fewer pods than it takes to cover the CPU (or memory) short, CPU-heaviest first, cannot do it.
        cpu_short, memory_short = shape.cpu_milli - node.cpu_free, shape.memory_mib - node.memory_free
        fewest = max(
            (_fewest_covering([pod.spec.cpu_milli for pod in movable], cpu_short) or 0) if cpu_short > 0 else 0,
            (_fewest_covering([pod.spec.memory_mib for pod in movable], memory_short) or 0) if memory_short > 0 else 0,
        )
        subsets = 0
        for size in range(1, (best[0] - 1 if best is not None else limit) + 1):
            if size < fewest:
                subsets += comb(len(movable), size)  # all fail: counted, as trying each would
                if subsets > RELIEVE_SUBSETS:
                    break
                continue
            for chosen in combinations(movable, size):
                subsets += 1
                if subsets > RELIEVE_SUBSETS or not allowance.look():
                    break
                if not _fits_without(node, shape, list(chosen)):
                    continue
                if not allowance.move(trial):
                    break
                mark = len(trial.moves)
                ok = all(_land(cluster, trial, pod, node_id, claimed, least, "") for pod in chosen)
                ok = ok and _fits(node, shape)
                trial.undo_to(mark)
                if ok:
                    best = (size, node_id, chosen)
                    break
            if (best is not None and best[1] == node_id) or subsets > RELIEVE_SUBSETS or allowance.spent:
                break
        if (best is not None and best[0] == 1) or allowance.spent:
            break  # one move: nothing does better (ties on node id); or out of work
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
    allowance = trial.allowance(0)  # made when the plan began
    for pod in movers:
        if pod.spec.cpu_milli > cpu or pod.spec.memory_mib > memory or pod.spec.pod_id in trial.at:
            continue
        node = cluster.nodes[pod.node_id]  # type: ignore[index]
        if node.node_id in claimed or (shape.gpu_models and node.gpu_model not in shape.gpu_models):
            continue
        if not _fits_without(node, shape, [pod]) or not _admits(cluster, node, shape):
            continue
        if not allowance.look() or not allowance.move(trial):
            return None
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


def _fits_without(node: Node, shape: PodShape, pods: Sequence[Pod], trial: Trial | None = None) -> bool:
    """Whether the shape would fit the node once ``pods`` (running there, where ``trial`` has them) are gone:
    arithmetic only."""
    cpu, memory = node.cpu_free, node.memory_free
    free = list(node.gpu_free)
    for pod in pods:
        cpu += pod.spec.cpu_milli
        memory += pod.spec.memory_mib
        for share in trial.where(pod)[1] if trial is not None else pod.gpus:
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


def _dry_run(gaps: _Gaps, pods: list[Pod], model: str, key: GpuKey, fragmenter: Fragmenter) -> bool | None:
    """What emptying GPU ``key`` would come to when each of its shares (in order) has a best-fit gap of its
    own, no chain needed: whether the moves would lower fragmentation (:func:`_less_fragmented`), worked out
    on copies of the free milli, CPU and memory they change, nothing moved. None when a share would need a
    chain (only trying tells then). The gaps are scanned as :meth:`_Gaps.best_fit` would after each move."""
    cluster = gaps.cluster
    nodes = cluster.nodes
    entries = gaps.lists[model]
    source = key[0]
    gpu: dict[GpuKey, int] = {}  # free milli of the GPUs the moves change
    cpu: dict[str, int] = {}  # free CPU and memory of the nodes they change
    memory: dict[str, int] = {}
    for pod in pods:
        spec = pod.spec
        need = spec.gpu_milli
        spot = _dry_fit(cluster, entries, gpu, cpu, memory, pod, source, key)
        if spot is None:
            return None
        gpu[key] = gpu.get(key, nodes[source].gpu_free[key[1]]) + need
        gpu[spot] = gpu.get(spot, nodes[spot[0]].gpu_free[spot[1]]) - need
        if spot[0] != source:
            for node_id, sign in ((source, 1), (spot[0], -1)):
                cpu[node_id] = cpu.get(node_id, nodes[node_id].cpu_free) + sign * spec.cpu_milli
                memory[node_id] = memory.get(node_id, nodes[node_id].memory_free) + sign * spec.memory_mib
    before = after = 0.0
    for node_id in sorted({source, *(spot[0] for spot in gpu)}):
        node = nodes[node_id]
        free = list(node.gpu_free)
        for (at, index), milli in gpu.items():
            if at == node_id:
                free[index] = milli
        before += fragmenter(tuple(node.gpu_free), node.cpu_free, node.gpu_model)
        after += fragmenter(tuple(free), cpu.get(node_id, node.cpu_free), node.gpu_model)
    return after < before


def _dry_fit(
    cluster: ClusterState,
    entries: SortedList,
    gpu: dict[GpuKey, int],
    cpu: dict[str, int],
    memory: dict[str, int],
    pod: Pod,
    source: str,
    key: GpuKey,
) -> GpuKey | None:
    """:meth:`_Gaps.best_fit` of a share on GPU ``key`` (node ``source``) as it would be after the dry run's
    moves so far: the list with the GPUs they changed (``gpu``) filed at their new free milli, the first
    ``SCAN`` entries from the share's size, room checked against the changed CPU and memory."""
    spec = pod.spec
    need = spec.gpu_milli
    nodes = cluster.nodes
    moved = sorted(
        (free, node_id, index)
        for (node_id, index), free in gpu.items()
        if need <= free < GPU_MILLI and nodes[node_id].schedulable
    )
    position = entries.bisect_left((need, "", -1))
    taken = 0
    for _ in range(SCAN):
        while position < len(entries) and (entries[position][1], entries[position][2]) in gpu:
            position += 1  # a GPU the moves changed: filed at its new free milli instead
        entry = entries[position] if position < len(entries) else None
        if taken < len(moved) and (entry is None or moved[taken] < entry):
            entry = moved[taken]
            taken += 1
        elif entry is not None:
            position += 1
        else:
            return None
        spot = (entry[1], entry[2])
        if spot == key:
            continue
        node = nodes[spot[0]]
        if gpu.get(spot, node.gpu_free[spot[1]]) < need:
            continue
        if spot[0] != source and (
            cpu.get(spot[0], node.cpu_free) < spec.cpu_milli or memory.get(spot[0], node.memory_free) < spec.memory_mib
        ):
            continue
        if _admits(cluster, node, pod.shape):
            return spot
    return None


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
    return max(free, default=0) >= shape.gpu_milli  # a node without GPUs holds no share


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
    listed = trial.rooms(shape, allowance)
    if listed is None:
        return None  # out of work before a node was searched
    order, known = listed
    reachable: dict[tuple[PodShape, str], tuple[int, str]] = {}
    best: tuple[int, str, list[Pod]] | None = None
    for bound, node_id in order:
        if best is not None and (bound > best[0] or (bound == best[0] and node_id > best[1])):
            break  # sorted: no node left can need fewer moves, or as few with a smaller id
        if not allowance.look():
            break  # out of work: the best found so far
        movable = known[node_id][1]
        least = _least_moves(cluster, trial, cluster.nodes[node_id], shape, movable, reachable)
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
        destination = _destination(cluster, pod, {node_id}, cluster.nodes[node_id].gpu_model)
        if destination is None:  # it fitted while planning this node; the order is the same
            return None
        trial.move(pod, destination[0], destination[1], why)
    return node_id


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
        for node_id in sorted(cluster.nodes):
            self.file(cluster, trial, shape, node_id)

    def file(self, cluster: ClusterState, trial: Trial, shape: PodShape, node_id: str) -> None:
        node = cluster.nodes[node_id]
        if not _admits(cluster, node, shape) or (shape.gpu_models and node.gpu_model not in shape.gpu_models):
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
    cluster: ClusterState, pod: Pod, node_id: str, reachable: dict[tuple[PodShape, str], tuple[int, str]]
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
) -> int | None:
    """A lower bound on the moves that make the shape fit the node, or None if moving every pod that could
    leave (:func:`_can_leave`; every movable pod if ``reachable`` is None) would not do it. Arithmetic on the
    node's free CPU, memory and GPUs and on what those pods hold there: the CPU short takes at least as many
    pods as the CPU-heaviest ones it takes to cover it; likewise memory; whole GPUs, as many pods as it takes,
    most GPUs freed first, where a GPU is freed only if every pod on it leaves; a share, the fewest pods on one
    GPU that leave it room."""
    leaving = movable if reachable is None else [p for p in movable if _can_leave(cluster, p, node.node_id, reachable)]
    least = 1
    short = shape.cpu_milli - node.cpu_free
    if short > 0:
        count = _fewest_covering([pod.spec.cpu_milli for pod in leaving], short)
        if count is None:
            return None
        least = max(least, count)
    short = shape.memory_mib - node.memory_free
    if short > 0:
        count = _fewest_covering([pod.spec.memory_mib for pod in leaving], short)
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
        count = _fewest_covering(counts, short)
    else:
        if max(free, default=0) >= shape.gpu_milli:
            return least
        count = None
        for index, milli in enumerate(free):
            if milli + held[index] >= shape.gpu_milli:
                on_it = [
                    gpu.milli for gpus in (placed or [p.gpus for p in leaving]) for gpu in gpus if gpu.index == index
                ]
                option = _fewest_covering(on_it, shape.gpu_milli - milli)
                if option is not None and (count is None or option < count):
                    count = option
    if count is None:
        return None
    return max(least, count)


def _fewest_covering(amounts: list[int], short: int) -> int | None:
    """The fewest of ``amounts`` (largest first) that add up to ``short``, or None if all of them do not."""
    total = 0
    for count, amount in enumerate(sorted(amounts, reverse=True), start=1):
        total += amount
        if total >= short:
            return count
    return None


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
        for chosen in combinations(movable, size):
            tried += 1
            if tried > TARGET_SUBSETS or not allowance.look():
                return None
            if not all(_can_leave(cluster, pod, node_id, reachable) for pod in chosen) or not _fits_without(
                node, shape, chosen, trial
            ):
                continue
            mark = len(trial.moves)
            ok = True
            for pod in sorted(chosen, key=lambda p: (-p.spec.gpu_milli_total, p.spec.pod_id)):
                if not allowance.move(trial):
                    trial.undo_to(mark)
                    return None
                destination = _destination(cluster, pod, {node_id}, node.gpu_model)
                if destination is None:
                    ok = False
                    break
                trial.move(pod, destination[0], destination[1], "")
            fits = ok and _fits(node, shape)
            trial.undo_to(mark)
            if fits:
                return sorted(chosen, key=lambda p: (-p.spec.gpu_milli_total, p.spec.pod_id))
    return None
