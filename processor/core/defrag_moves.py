"""Moves of movable pods on trial, the work allowance of a plan, and the node arithmetic its steps share.

A :class:`Trial` applies moves to the nodes (and the capacity index) and undoes them, newest first; a plan
is made on trial and rolled back, and the fold emits it (:mod:`processor.core.defrag`). Its
:class:`Allowance` bounds the planning work of one ``Defragment`` by its budget B (``max_moves``):
``LOOKS_BASE`` + ``LOOKS`` · B looks and ``TRIAL_MOVES`` · B trial moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from processor.core.fragmentation import Fragmenter
from processor.core.resources import PodShape
from processor.core.state import ClusterState, Node, Pod
from schemas.commands import GPU_MILLI
from schemas.events import GpuShare

LOOKS_BASE = 50_000  # looks (see Allowance) any Defragment may take, whatever its budget
LOOKS = 4_000  # and looks per move of the budget (openb at 1,523 nodes takes at most ~6,000 at a budget of 1)
TRIAL_MOVES = 64  # trial moves made (kept or undone) while planning, in all, per move of the budget
UNBOUNDED = 1 << 60  # the allowance of a command of contract v1 or v2: it plans as its release did


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


def any_movable(cluster: ClusterState) -> bool:
    """Whether a movable pod runs. O(P) at most, no sort."""
    return any(pod.node_id is not None and pod.spec.movable for pod in cluster.pods.values())


def movable_pods(cluster: ClusterState) -> list[Pod]:
    """Running movable pods, by id."""
    return sorted(
        (pod for pod in cluster.pods.values() if pod.node_id is not None and pod.spec.movable),
        key=lambda pod: pod.spec.pod_id,
    )


class Allowance:
    """The work one ``Defragment`` of budget B may do while planning: ``LOOKS_BASE`` + ``LOOKS`` · B looks and
    ``TRIAL_MOVES`` · B trial moves made, kept or undone (:attr:`Trial.made`).

    A look is one candidate examined, O(1) work (measured: ~3 us pure Python on openb): a gap (a free GPU of
    the gap lists, in a best fit, a dry run or a chain), a group of the capacity index in a landing's scan, a
    subset of a node's pods checked, a share a relief or a source GPU would move, a GPU of a re-packing pool or
    a step of a packing, a node listed for a target. A step asks (:meth:`look`) before each attempt, and a scan
    pays (:meth:`spend`) for what it examined; the target's search asks before each trial move
    (:meth:`move`). Once either is spent (``spent``), no step starts another attempt, and the plan is what was
    kept: past the allowance, at most the scan under way (``SCAN`` gaps or the index's groups) and the moves
    of the attempt under way (at most 8 · B: a set re-packing tries three sequences of at most 2 · B moves,
    then redoes the best).

    Not ``bounded`` (a command of contract v1 or v2): unlimited, so such a command plans the moves its
    release planned, however large the cluster (the recorded logs replay byte for byte)."""

    __slots__ = ("looked", "looks", "moves", "spent")

    def __init__(self, budget: int, bounded: bool = True) -> None:
        self.looks = LOOKS_BASE + LOOKS * budget if bounded else UNBOUNDED
        self.moves = TRIAL_MOVES * budget if bounded else UNBOUNDED
        self.looked = 0  # looks spent (a measure for tests and benchmarks)
        self.spent = False

    def look(self, count: int = 1) -> bool:
        """Spend ``count`` looks before a piece of work; False (and spent) if fewer are left."""
        if self.looks < count:
            self.spent = True
            return False
        self.looks -= count
        self.looked += count
        return True

    def spend(self, count: int) -> None:
        """Spend ``count`` looks a scan took (candidates it examined, at most ``SCAN`` gaps or a placement's
        groups); spent once none is left, so the next :meth:`look` refuses: one scan past the allowance at most."""
        self.looks -= count
        self.looked += count
        if self.looks <= 0:
            self.spent = True

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
        # Per shape, the nodes a target's search may make room on (``defrag_target``), kept across a gang's members.
        self.rooms: dict[PodShape, Any] = {}
        self.deferred = False
        self.stale: set[str] = set()  # nodes moved while deferred, not yet filed again
        self.made = 0  # moves made, kept or undone

    def allowance(self, budget: int) -> Allowance:
        """The search work left to this trial, set on first use from the budget (moves left plus made)."""
        if self._allowance is None:
            self._allowance = Allowance(budget + len(self.moves), self.bounded)
        return self._allowance

    def where(self, pod: Pod) -> tuple[str, tuple[GpuShare, ...]]:
        moved = self.at.get(pod.spec.pod_id)
        return moved if moved is not None else (pod.node_id, pod.gpus)  # type: ignore[return-value]

    def move(self, pod: Pod, to_node: str, to_gpus: tuple[GpuShare, ...], why: str) -> None:
        from_node, from_gpus = self.where(pod)
        nodes = self.cluster.nodes
        nodes[from_node].free(pod.spec, from_gpus, pod.started_at)
        nodes[to_node].allocate(pod.spec, to_gpus, pod.started_at)
        self._reindex(from_node)
        self._reindex(to_node)
        self.touched.extend((from_node, to_node))
        self.made += 1
        self.at[pod.spec.pod_id] = (to_node, to_gpus)
        self.moves.append(Move(pod.spec.pod_id, from_node, from_gpus, to_node, to_gpus, why))

    def undo_to(self, mark: int) -> None:
        nodes = self.cluster.nodes
        while len(self.moves) > mark:  # measure: the moves' count, down by one a turn
            move = self.moves.pop()
            pod = self.cluster.pods[move.pod_id]
            nodes[move.to_node].free(pod.spec, move.to_gpus, pod.started_at)
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


def whole_free(node: Node) -> int:
    return sum(1 for milli in node.gpu_free if milli >= GPU_MILLI)


def tally(cluster: ClusterState, moves: list[Move]) -> tuple[int, int]:
    """(whole free GPUs, empty nodes) among the nodes the moves touch, in the state as it is now."""
    touched = sorted({node_id for move in moves for node_id in (move.from_node, move.to_node)})
    nodes = [cluster.nodes[node_id] for node_id in touched]
    return sum(whole_free(node) for node in nodes), sum(1 for node in nodes if not node.pods)


def outcome(cluster: ClusterState, moves: list[Move], before: dict[str, tuple[int, bool]]) -> tuple[int, int]:
    """(whole GPUs freed, nodes emptied) on the nodes the moves touched, against ``before``."""
    gpus = nodes = 0
    for node_id, (whole, empty) in before.items():
        node = cluster.nodes[node_id]
        gpus += whole_free(node) - whole
        nodes += int(not node.pods and not empty)
    return max(gpus, 0), max(nodes, 0)


def admits(cluster: ClusterState, node: Node, shape: PodShape) -> bool:
    return node.schedulable and cluster.capacity.admits(node.node_class, shape)


def fits_without(node: Node, shape: PodShape, pods: Sequence[Pod], trial: Trial | None = None) -> bool:
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


def fewest_covering(amounts: list[int], short: int) -> int | None:
    """The fewest of ``amounts`` (largest first) that add up to ``short``, or None if all of them do not."""
    total = 0
    for count, amount in enumerate(sorted(amounts, reverse=True), start=1):
        total += amount
        if total >= short:
            return count
    return None


def less_fragmented(cluster: ClusterState, fragmenter: Fragmenter | None, seen: dict[str, tuple]) -> bool:
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
