"""The partly used GPUs of each model by free milli, and a share's place among them: best fit or a chain.

:class:`Gaps` follows the trial's moves (every change journalled, so a failed attempt is undone with
them). A share goes into the partly used GPU with the least free milli that holds it (never a fully free
GPU: that would only move the hole), looking at ``SCAN`` gaps; or, when none is large enough, into the
room a smaller movable share leaves by moving first into a gap of its own (a chain at most ``DEPTH`` + 1
moves deep, ``EJECT_SCAN`` gaps looked at). :func:`dry_run` works out, without moving anything, whether
emptying a GPU whose shares each have a gap would lower FGD fragmentation.
"""

from __future__ import annotations

from sortedcontainers import SortedList

from processor.core.defrag_moves import Allowance, Trial, admits
from processor.core.fragmentation import Fragmenter
from processor.core.state import ClusterState, Pod
from schemas.commands import GPU_MILLI
from schemas.events import GpuShare

SCAN = 64  # candidate destination GPUs looked at per share moved
DEPTH = 1  # ejections per chain: 0 or 1 (a chain of two moves; depth 2 measured: no better within noise, 2-4x
# the CPU, and it would need the fold's only recursion)
EJECT_SCAN = 16  # gaps just too small for a share looked at for a chain of two moves

GpuKey = tuple[str, int]  # (node id, GPU index)


class Gaps:
    """The partly used GPUs of each model by free milli, and the shares on every GPU, as trial moves go.

    Every change is journalled, so a failed attempt to empty a GPU is undone with the trial's moves."""

    def __init__(self, cluster: ClusterState, trial: Trial, models: list[str]) -> None:
        self.cluster = cluster
        self.trial = trial
        self.shares: dict[GpuKey, list[Pod]] = {}
        self.journal: list[tuple[Pod, GpuKey, GpuKey]] = []
        # The nodes an attempt touched, as first seen: free GPUs, free CPU, whether no pod ran there.
        self.seen: dict[str, tuple[tuple[int, ...], int, bool]] = {}
        for pod in cluster.pods.values():
            if pod.node_id is not None and pod.shape.is_share:
                self.shares.setdefault((pod.node_id, pod.gpus[0].index), []).append(pod)
        found: dict[str, list[tuple[int, str, int]]] = {model: [] for model in models}
        for node_id, node in cluster.nodes.items():  # any order: each list is sorted once, below
            entries = found.get(node.gpu_model)
            if entries is not None and node.schedulable:
                for index, free in enumerate(node.gpu_free):
                    if 0 < free < GPU_MILLI:
                        entries.append((free, node_id, index))
        self.lists: dict[str, SortedList] = {model: SortedList(entries) for model, entries in found.items()}
        self._starts: dict[tuple[str, int], int] = {}  # (model, milli) -> :meth:`start`
        self._heads: dict[tuple[str, int], list[tuple[int, str, int]]] = {}  # (model, milli) -> :meth:`head`

    def start(self, model: str, need: int) -> int:
        """Where the gaps of at least ``need`` free milli begin in the model's list; kept until a list changes
        (a plan's dry runs ask the same few sizes between its moves)."""
        key = (model, need)
        starts = self._starts
        if key in starts:
            return starts[key]
        position = starts[key] = self.lists[model].bisect_left((need, "", -1))
        return position

    def head(self, model: str, need: int) -> list[tuple[int, str, int]]:
        """The first ``2 * SCAN`` entries from :meth:`start` as a plain list, kept as it is: a dry run reads a
        share's gaps one by one, and a sorted list's item costs a search each. O(SCAN) when a list changed."""
        key = (model, need)
        heads = self._heads
        found = heads.get(key)
        if found is None:
            start = self.start(model, need)
            found = heads[key] = list(self.lists[model].islice(start, start + 2 * SCAN))
        return found

    def _resync(self, key: GpuKey, old_free: int) -> None:
        node = self.cluster.nodes[key[0]]
        entries = self.lists.get(node.gpu_model)
        if entries is None or not node.schedulable:
            return
        self._starts.clear()
        self._heads.clear()
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
        while len(self.journal) > mark:  # measure: the journal's length, down by one a turn
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
        return admits(self.cluster, node, pod.shape)

    def best_fit(self, pod: Pod, model: str, exclude: set[GpuKey]) -> GpuKey | None:
        """The partly used GPU with the least free milli that holds the share (never a fully free GPU)."""
        entries = self.lists[model]
        start = entries.bisect_left((pod.spec.gpu_milli, "", -1))
        allowance = self.trial.allowance(0)  # made when the plan began
        for position in range(start, min(start + SCAN, len(entries))):  # measure: at most SCAN gaps, a look each
            _, node_id, index = entries[position]
            if (node_id, index) not in exclude and self.room(pod, (node_id, index)):
                allowance.spend(position - start + 1)
                return node_id, index
        allowance.spend(min(SCAN, len(entries) - start))
        return None

    def place(self, pod: Pod, model: str, exclude: set[GpuKey], why: str, depth: int = 1) -> bool:
        """Put a share into an existing gap: best fit, or else (``depth`` 1) into a gap a smaller movable share
        leaves by moving first into a best-fit gap of its own (a chain of two moves). On trial; True if placed."""
        spot = self.best_fit(pod, model, exclude)
        if spot is not None:
            self.move(pod, spot, why)
            return True
        if depth <= 0:
            return False
        need = pod.spec.gpu_milli
        entries = self.lists[model]
        end = entries.bisect_left((need, "", -1))
        allowance = self.trial.allowance(0)  # made when the plan began
        # Measure: at most EJECT_SCAN gaps, and the shares on each; every share tried is a look and a trial move.
        for position in range(end - 1, max(end - 1 - EJECT_SCAN, -1), -1):
            free, node_id, index = entries[position]
            key = (node_id, index)
            if key in exclude:
                continue
            others = sorted(self.shares.get(key, ()), key=lambda p: (p.spec.gpu_milli, p.spec.pod_id))
            for other in others:
                if not other.spec.movable or other.spec.gpu_milli >= need or free + other.spec.gpu_milli < need:
                    continue
                if not allowance.look() or not allowance.move(self.trial):
                    return False  # out of work: the attempt fails and is undone
                mark = len(self.journal)
                making = f"{why}: leaving room on GPU {index} of {node_id} for a larger share"
                landing = self.best_fit(other, model, exclude | {key})  # one ejection: no recursion
                if landing is None:
                    continue
                self.move(other, landing, making)
                if self.room(pod, key):
                    self.move(pod, key, why)
                    return True
                self.undo_to(mark)
        return False


def record(gaps: Gaps, before: dict[str, tuple[int, bool]]) -> None:
    for touched_id, (gpu_free, _, empty) in gaps.seen.items():
        before.setdefault(touched_id, (sum(1 for milli in gpu_free if milli >= GPU_MILLI), empty))


Fragments = dict[tuple[tuple[int, ...], int, str], float]
"""A plan's memo of its fragmenter's measure: (free GPU milli, free CPU, GPU model) -> the node's fragmentation.
Nodes alike give the same measure, and a plan's dry runs meet the same few states again and again."""


def dry_run(
    gaps: Gaps, pods: list[Pod], model: str, key: GpuKey, fragmenter: Fragmenter, fragments: Fragments
) -> bool | None:
    """What emptying GPU ``key`` would come to when each of its shares (in order) has a best-fit gap of its
    own, no chain needed: whether the moves would lower fragmentation (:func:`less_fragmented`), worked out
    on copies of the free milli, CPU and memory they change, nothing moved. None when a share would need a
    chain (only trying tells then). The gaps are scanned as :meth:`Gaps.best_fit` would after each move.
    ``fragments``: the plan's memo of ``fragmenter`` (one fragmenter per memo); at most two entries per
    node state a dry run meets."""
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
        start = gaps.start(model, need)
        head = gaps.head(model, need)
        spot = _dry_fit(cluster, entries, start, head, gpu, cpu, memory, pod, source, key, gaps.trial.allowance(0))
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
        before += _measure(fragments, fragmenter, tuple(node.gpu_free), node.cpu_free, node.gpu_model)
        after += _measure(fragments, fragmenter, tuple(free), cpu.get(node_id, node.cpu_free), node.gpu_model)
    return after < before


def _measure(
    fragments: Fragments, fragmenter: Fragmenter, gpu_free: tuple[int, ...], cpu_free: int, model: str
) -> float:
    key = (gpu_free, cpu_free, model)
    if key in fragments:
        return fragments[key]
    value = fragments[key] = fragmenter(gpu_free, cpu_free, model)
    return value


def _dry_fit(
    cluster: ClusterState,
    entries: SortedList,
    start: int,
    head: list[tuple[int, str, int]],
    gpu: dict[GpuKey, int],
    cpu: dict[str, int],
    memory: dict[str, int],
    pod: Pod,
    source: str,
    key: GpuKey,
    allowance: Allowance,
) -> GpuKey | None:
    """:meth:`Gaps.best_fit` of a share on GPU ``key`` (node ``source``) as it would be after the dry run's
    moves so far: the list with the GPUs they changed (``gpu``) filed at their new free milli, the first
    ``SCAN`` entries from the share's size (``head``: the first of them, :meth:`Gaps.head`), room checked against
    the changed CPU and memory. A look per entry examined."""
    spec = pod.spec
    need = spec.gpu_milli
    nodes = cluster.nodes
    moved = (
        sorted(
            (free, node_id, index)
            for (node_id, index), free in gpu.items()
            if need <= free < GPU_MILLI and nodes[node_id].schedulable
        )
        if gpu
        else []
    )
    in_head = start + len(head)
    position = start  # the first entry of at least ``need`` free milli (:meth:`Gaps.start`)
    length = len(entries)  # a dry run changes no list
    taken = 0
    for looked in range(1, SCAN + 1):  # measure: at most SCAN entries
        entry = None
        while position < length:  # measure: the entries left
            listed = head[position - start] if position < in_head else entries[position]  # (an item: a search)
            if (listed[1], listed[2]) not in gpu:
                entry = listed
                break
            position += 1  # a GPU the moves changed: filed at its new free milli instead
        if taken < len(moved) and (entry is None or moved[taken] < entry):
            entry = moved[taken]
            taken += 1
        elif entry is not None:
            position += 1
        else:
            allowance.spend(looked)
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
        if admits(cluster, node, pod.shape):
            allowance.spend(looked)
            return spot
    allowance.spend(SCAN)
    return None
