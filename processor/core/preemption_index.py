"""The preemption index: nodes that run pods, grouped into classes that a victim search treats alike.

A priority-preemption search (``processor.core.preemption``) needs, per node, the lowest victim
priority that makes room and a lower bound on the victims and the work they would lose. Both come
from the node's per-priority sums (``Node.by_priority``); all but the work bound depend only on
the node's type, its free capacity and what each priority level holds, GPU by GPU — not on start
times. Nodes equal in all that form a class (:func:`class_key`; GPU indexes are put in a canonical
order, which changes no fit), so the search asks each class once, not each node: a 10,000-node
cluster full of a handful of pod shapes has a few dozen classes.

The work bound of a node is a minimum, over the (priority level, GPU milli of one pod) pairs of
its summary, of a function that falls as that pair's latest start rises. So each class keeps, per
pair, its nodes sorted by that latest start, latest first (:attr:`VictimClass.streams`), and the
search merges these sorted runs to meet nodes in the order of their bound, stopping once no bound
can win, without computing the bound of the nodes it never reaches.

Kept incrementally, lazily: every node change goes through ``ClusterState.reindex``, which marks
the node (:meth:`PreemptionIndex.touch`, O(1)); a search first refiles the marked nodes
(:meth:`PreemptionIndex.refresh`, O(log n) each), so placements that never meet a preemption pay
only the mark. Derived data: not in snapshots; a restore reindexes, hence marks, every node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from sortedcontainers import SortedList

from processor.core.resources import NodeClass


class Node(Protocol):
    """What the index reads of a node (``processor.core.state.Node``, which imports this module)."""

    node_id: str
    gpu_model: str
    node_class: NodeClass
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    cpu_free: int
    memory_free: int
    gpu_free: list[int]
    by_priority: dict[int, list]

    @property
    def schedulable(self) -> bool: ...


ClassKey = tuple
"""(GPU model, node class, CPU, memory, GPU count, CPU free, memory free, per level (priority, CPU,
memory, pods with GPUs, GPU milli sizes of its pods), per GPU (free, held per level) in sorted order)."""

Stream = tuple[int, int]
"""(priority level, GPU milli of one pod): a node's latest start of such a pod is its place in the run."""


def class_key(node: Node) -> ClassKey:
    """What makes two nodes alike for a victim search, start times left out. O(L · G log G)."""
    by_priority = node.by_priority
    levels = sorted(by_priority)
    summary = []
    columns = [node.gpu_free]
    for level in levels:
        held = by_priority[level]
        summary.append((level, held[0], held[1], held[5], tuple(sorted(held[4]))))
        columns.append(held[2])
    return (
        node.gpu_model,
        node.node_class,
        node.cpu_milli,
        node.memory_mib,
        node.gpu_count,
        node.cpu_free,
        node.memory_free,
        tuple(summary),
        tuple(sorted(zip(*columns, strict=True))),
    )


class VictimClass:
    """The nodes of one class, by id; and per stream, (minus the latest start, node id), sorted."""

    __slots__ = ("node_ids", "streams")

    def __init__(self) -> None:
        self.node_ids: SortedList = SortedList()
        self.streams: dict[Stream, SortedList] = {}

    def copied(self) -> VictimClass:
        twin = VictimClass()
        twin.node_ids = self.node_ids.copy()
        twin.streams = {stream: entries.copy() for stream, entries in self.streams.items()}
        return twin


class PreemptionIndex:
    """Schedulable nodes that run pods, by class (see the module docstring)."""

    __slots__ = ("_filed", "_shared", "classes", "dirty")

    def __init__(self) -> None:
        self.classes: dict[ClassKey, VictimClass] = {}
        self.dirty: dict[str, None] = {}  # nodes changed since the last refresh
        # node id -> (its class key, the (level, milli, latest start) entries filed for it)
        self._filed: dict[str, tuple[ClassKey, tuple[tuple[int, int, int], ...]]] = {}
        self._shared = False  # classes and _filed belong to the index this one was forked from

    def fork(self) -> PreemptionIndex:
        """A copy for a what-if fork, O(marked nodes): it reads the original's classes until its first
        refile copies them; valid while the original does not change (as the fork itself)."""
        twin = PreemptionIndex()
        twin.classes, twin._filed, twin._shared = self.classes, self._filed, True
        twin.dirty = dict(self.dirty)
        return twin

    def touch(self, node_id: str) -> None:
        """The node changed (capacity, pods, schedulability, class): refile it before the next search. O(1)."""
        self.dirty[node_id] = None

    def refresh(self, nodes: Mapping[str, Node]) -> None:
        """Refile every node changed since the last refresh. O(changed nodes · log n)."""
        if not self.dirty:
            return
        if self._shared:  # first change of a fork: its own copy now
            self.classes = {key: group.copied() for key, group in self.classes.items()}
            self._filed = dict(self._filed)
            self._shared = False
        for node_id in self.dirty:  # the order does not matter: the content is canonical
            self._unfile(node_id)
            node = nodes.get(node_id)
            if node is not None and node.by_priority and node.schedulable:
                self._file(node)
        self.dirty.clear()

    def _file(self, node: Node) -> None:
        key = class_key(node)
        group = self.classes.get(key)
        if group is None:
            group = self.classes[key] = VictimClass()
        node_id = node.node_id
        group.node_ids.add(node_id)
        entries = []
        streams = group.streams
        for level, held in node.by_priority.items():
            for milli, started in held[4].items():
                entries.append((level, milli, started))
                stream = streams.get((level, milli))
                if stream is None:
                    stream = streams[(level, milli)] = SortedList()
                stream.add((-started, node_id))
        self._filed[node_id] = (key, tuple(entries))

    def _unfile(self, node_id: str) -> None:
        filed = self._filed.pop(node_id, None)
        if filed is None:
            return
        key, entries = filed
        group = self.classes[key]
        group.node_ids.remove(node_id)
        if not group.node_ids:
            del self.classes[key]
            return
        for level, milli, started in entries:
            stream = group.streams[(level, milli)]
            stream.remove((-started, node_id))
            if not stream:
                del group.streams[(level, milli)]

    @classmethod
    def rebuilt(cls, nodes: Mapping[str, Node]) -> PreemptionIndex:
        """A fresh index from the nodes, for checking the incremental one."""
        index = cls()
        for node_id in sorted(nodes):
            index.touch(node_id)
        index.refresh(nodes)
        return index

    def content(self) -> dict[ClassKey, tuple[list[str], dict[Stream, list[tuple[int, str]]]]]:
        """The index as plain data (class -> node ids, streams), for equality checks."""
        return {
            key: (list(group.node_ids), {stream: list(entries) for stream, entries in group.streams.items()})
            for key, group in self.classes.items()
        }
