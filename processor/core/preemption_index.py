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

Kept incrementally, lazily, in two tiers. Every node change goes through ``ClusterState.reindex``,
which marks the node (:meth:`PreemptionIndex.touch`, O(1)), so placements that never meet a
preemption pay only the mark. A search first moves the marked nodes to the *pending* tier
(:meth:`PreemptionIndex.refresh`, a few µs each): buckets keyed by a cheap summary
(:func:`pending_entry`: the node's type, its lowest priority level and, at that level, the pods
holding GPUs, the largest GPU milli of one pod and its latest start, and the GPU milli free) from
which the search bounds every node of a bucket at once, from below, in (victim priority, victims,
work lost). Only the pending nodes whose bound could tie or beat the best plan found are filed in
the exact classes (:meth:`PreemptionIndex.promote`, the costly step: a class key and sorted-run
inserts, tens of µs); the others stay pending until they change or a later search needs them. So a
search after a mass change (10,000 nodes filled) files a few nodes, not all of them. And it moves
to the pending tier only the nodes still marked: past :data:`EAGER_AFTER` marked nodes, each newly marked
node moves the oldest marked one there at once (:meth:`PreemptionIndex.touch`), so the first search after
a mass change pays for at most that many, and a placement pays a few µs only when it marks a node while
that many are marked already (a node marked again costs nothing more). Derived data: not in snapshots; a
restore reindexes, hence marks, every node.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Mapping

from sortedcontainers import SortedList

from processor.core.node import Node
from processor.core.resources import NodeClass

ClassKey = tuple
"""(GPU model, node class, CPU, memory, GPU count, CPU free, memory free, per level (priority, CPU,
memory, pods with GPUs, GPU milli sizes of its pods), per GPU (free, held per level) in sorted order)."""

Stream = tuple[int, int]
"""(priority level, GPU milli of one pod): a node's latest start of such a pod is its place in the run."""

Content = dict[ClassKey, tuple[list[str], dict[Stream, list[tuple[int, str]]]]]
"""The classes as plain data: class -> (node ids, stream -> (minus latest start, node id) entries)."""


PendingKey = tuple[str, NodeClass, int, int, int, int, int, int, int, int]
"""A pending bucket: what its nodes have alike, from which a search bounds them all at once. In order: GPU model,
node class, CPU, memory, GPU count; ``level``, the lowest priority level held; at that level ``gpu_pods``, the pods
holding GPUs, and ``largest_gpu_milli``, the most GPU milli one pod holds; ``gpu_free``, the GPU milli free on the
node, and ``most_free``, the most free on one GPU. A plain tuple, built for every node pended (a NamedTuple costs
~1 µs more each, BENCHMARKS.md "Named state: as fast"); its readers unpack it into these names."""


def pending_entry(node: Node) -> tuple[PendingKey, int]:
    """A node's pending bucket and its latest pod start at its lowest level (-1: none recorded). O(L + G),
    O(1) but for the sum of free GPU milli on a node with one level (``Node.by_priority`` keeps the rest)."""
    by_priority = node.by_priority
    if len(by_priority) == 1:
        (low,) = by_priority
    else:
        low = min(by_priority)
    held = by_priority[low]
    gpu_free = node.gpu_free
    free = sum(gpu_free)
    key = (
        node.gpu_model,
        node.node_class,
        node.cpu_milli,
        node.memory_mib,
        node.gpu_count,
        low,
        held.gpu_pods,
        held.largest_gpu_milli,
        free,
        max(gpu_free) if free else 0,
    )
    return key, held.latest_start


class PendingBucket:
    """Pending nodes alike in :data:`PendingKey`: node id -> minus its latest start; and, built when read and
    then kept, the (minus latest start, node id) entries sorted (plain ints in the dict: a mass change
    allocates no tuple per node here)."""

    __slots__ = ("_ordered", "members")

    def __init__(self) -> None:
        self.members: dict[str, int] = {}
        self._ordered: list[tuple[int, str]] | None = []

    def ordered(self) -> list[tuple[int, str]]:
        """The entries, latest start first (then node id). O(n log n) after a bulk change, else O(1)."""
        if self._ordered is None:
            self._ordered = sorted([(minus_latest, node_id) for node_id, minus_latest in self.members.items()])
        return self._ordered

    def add(self, members: dict[str, int]) -> None:
        self.members.update(members)
        ordered = self._ordered
        if ordered is not None:
            if len(members) <= 8 or 16 * len(members) < len(ordered):  # few, or few beside many
                for node_id, minus_latest in members.items():
                    insort(ordered, (minus_latest, node_id))
            elif len(ordered) < len(members):  # many at once into few: sorted when next read
                self._ordered = None
            else:  # many into more: two sorted runs, which the sort merges in one pass
                ordered.extend(sorted([(minus_latest, node_id) for node_id, minus_latest in members.items()]))
                ordered.sort()

    def add_one(self, node_id: str, minus_latest: int) -> None:
        self.members[node_id] = minus_latest
        ordered = self._ordered
        if ordered is not None:
            insort(ordered, (minus_latest, node_id))

    def remove(self, node_id: str) -> None:
        minus_latest = self.members.pop(node_id)
        ordered = self._ordered
        if ordered is not None:
            del ordered[bisect_left(ordered, (minus_latest, node_id))]

    def first(self) -> str:
        """Any node of the bucket (the first added)."""
        return next(iter(self.members))

    def copied(self) -> PendingBucket:
        twin = PendingBucket()
        twin.members = dict(self.members)
        twin._ordered = None if self._ordered is None else list(self._ordered)
        return twin


def class_key(node: Node) -> ClassKey:
    """What makes two nodes alike for a victim search, start times left out. O(L · G log G)."""
    by_priority = node.by_priority
    levels = sorted(by_priority)
    summary = []
    columns = [node.gpu_free]
    for level in levels:
        held = by_priority[level]
        summary.append((level, held.cpu_milli, held.memory_mib, held.gpu_pods, tuple(sorted(held.latest_starts))))
        columns.append(held.gpu_milli)
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


EAGER_AFTER = 1024
"""Marked nodes beyond which each newly marked one moves the oldest marked node to its pending bucket at once
(:meth:`PreemptionIndex.touch`), so a search after a mass change refreshes at most this many: a bounded,
amortised share of the work, paid only by clusters whose changes outrun their searches. Read when an index is
made (tests set it low to cover that path on small clusters)."""


class PreemptionIndex:
    """Schedulable nodes that run pods, by class, or pending in buckets (see the module docstring)."""

    __slots__ = (
        "_filed",
        "_marked",
        "_pending_of",
        "_shared",
        "bucket_changes",
        "by_label",
        "classes",
        "dirty",
        "eager_after",
        "filings",
        "last_runs",
        "last_tiers",
        "moves",
        "pending",
    )

    def __init__(self) -> None:
        self.classes: dict[ClassKey, VictimClass] = {}
        self.dirty: dict[str, None] = {}  # nodes changed since the last refresh
        self._marked: deque[str] = deque()  # the same nodes, oldest mark first
        self.eager_after = EAGER_AFTER
        # node id -> (its class key, the (level, milli, latest start) entries filed for it)
        self._filed: dict[str, tuple[ClassKey, tuple[tuple[int, int, int], ...]]] = {}
        # Nodes not filed in a class yet, by bucket; node id -> its bucket
        self.pending: dict[PendingKey, PendingBucket] = {}
        self._pending_of: dict[str, PendingKey] = {}
        # Label (key, value) -> the pending buckets whose node class has it, in ``pending``'s order: a search
        # for a pod with a node selector reads the buckets of its rarest label, not every bucket.
        self.by_label: dict[tuple[str, str], dict[PendingKey, None]] = {}
        self._shared = False  # classes, _filed and pending belong to the index this one was forked from
        # Classes and runs made or dropped so far: a reading of the classes holds while it stays the same (a run
        # read is a class's own sorted list, which filing and unfiling a node of an existing class change in place;
        # a run emptied that way stays in the reading, empty). A search keeps its reading for a shape here
        # (``preemption._filed_runs``), for the next search of that shape.
        self.filings = 0
        self.last_runs: tuple[object, int, int, int | None, list] | None = None
        # Pending buckets made or dropped so far: a screen of the buckets for a shape holds while it stays the same
        # (``preemption._pending_tiers`` keeps its last here).
        self.bucket_changes = 0
        self.last_tiers: tuple[object, int, int, list | None] | None = None
        # Moves of nodes between classes, buckets and neither so far (refresh, promote, an eager pend, a fork's
        # copy): a scan of the runs and buckets in progress holds while it stays the same (``NextPlans``).
        self.moves = 0

    def fork(self) -> PreemptionIndex:
        """A copy for a what-if fork, O(marked nodes): it reads the original's classes until its first
        refile copies them; valid while the original does not change (as the fork itself)."""
        twin = PreemptionIndex()
        twin._share(self)
        twin.dirty = dict(self.dirty)
        twin._marked = deque(self._marked)
        twin.eager_after = self.eager_after
        return twin

    def _share(self, other: PreemptionIndex) -> None:
        self.classes, self._filed, self.pending, self._pending_of, self.by_label = (
            other.classes,
            other._filed,
            other.pending,
            other._pending_of,
            other.by_label,
        )
        self._shared = True

    def touch(self, node_id: str, nodes: Mapping[str, Node] | None = None) -> None:
        """The node changed (capacity, pods, schedulability, class): refile it before the next search. O(1);
        given the nodes, past :attr:`eager_after` marked nodes, a newly marked one moves the oldest marked to
        its pending bucket (a few µs; a node marked again before then costs nothing more). Not in a what-if
        fork that still shares the tiers (that would copy them)."""
        dirty = self.dirty
        if node_id in dirty:
            return
        dirty[node_id] = None
        self._marked.append(node_id)
        if nodes is not None and len(dirty) > self.eager_after and not self._shared:
            oldest = self._marked.popleft()
            del dirty[oldest]
            self._pend(oldest, nodes)

    def _own(self) -> None:
        """A fork's first change: its own copy of what it shared. O(n)."""
        if self._shared:
            self.filings += 1  # new lists: a reading of the old ones is not kept
            self.moves += 1
            self.classes = {key: group.copied() for key, group in self.classes.items()}
            self._filed = dict(self._filed)
            self.pending = {key: bucket.copied() for key, bucket in self.pending.items()}
            self._pending_of = dict(self._pending_of)
            self.by_label = {pair: dict(keys) for pair, keys in self.by_label.items()}
            self._shared = False

    def buckets(self, selector: tuple[tuple[str, str], ...]) -> list[tuple[PendingKey, PendingBucket]]:
        """The pending buckets whose nodes may match a node selector, in ``pending``'s order: all of them for no
        selector, else those carrying its rarest label. O(B) for the B buckets returned."""
        pending = self.pending
        if not selector:
            return list(pending.items())
        by_label = self.by_label
        rarest: dict[PendingKey, None] | None = None
        for pair in selector:
            keys = by_label.get(pair)
            if keys is None:
                return []
            if rarest is None or len(keys) < len(rarest):
                rarest = keys
        return [(key, pending[key]) for key in rarest] if rarest is not None else []

    def _new_bucket(self, key: PendingKey) -> PendingBucket:
        self.bucket_changes += 1
        bucket = self.pending[key] = PendingBucket()
        by_label = self.by_label
        for pair in key[1][0]:
            keys = by_label.get(pair)
            if keys is None:
                by_label[pair] = {key: None}
            else:
                keys[key] = None
        return bucket

    def _drop_bucket(self, key: PendingKey) -> None:
        self.bucket_changes += 1
        del self.pending[key]
        by_label = self.by_label
        for pair in key[1][0]:
            keys = by_label[pair]
            del keys[key]
            if not keys:
                del by_label[pair]

    def _pend(self, node_id: str, nodes: Mapping[str, Node]) -> None:
        """One node out of its class or bucket and, if it runs pods and is schedulable, into its pending
        bucket (what :meth:`refresh` does for each marked node; the caller unmarked it)."""
        self.moves += 1
        pending = self.pending
        was = self._pending_of.pop(node_id, None)
        if was is not None:
            bucket = pending[was]
            bucket.remove(node_id)
            if not bucket.members:
                self._drop_bucket(was)
        elif node_id in self._filed:
            self._unfile(node_id)
        node = nodes[node_id] if node_id in nodes else None  # noqa: SIM401 (a fork copies on read)
        if node is None or not node.by_priority or node.cordoned or node.failed:
            return
        key, latest = pending_entry(node)
        self._pending_of[node_id] = key
        found = pending.get(key)
        bucket = self._new_bucket(key) if found is None else found
        bucket.add_one(node_id, -latest)

    def refresh(self, nodes: Mapping[str, Node]) -> None:
        """Move every node changed since the last refresh out of its class or bucket and, if it runs pods
        and is schedulable, into its pending bucket. O(changed nodes), O(log n) for those that were filed."""
        if not self.dirty:
            return
        self._own()
        self.moves += 1
        pending, pending_of, filed = self.pending, self._pending_of, self._filed
        added: dict[PendingKey, dict[str, int]] = {}
        for node_id in self.dirty:  # the order does not matter: the content is canonical
            was = pending_of.pop(node_id, None)
            if was is not None:
                bucket = pending[was]
                bucket.remove(node_id)
                if not bucket.members:
                    self._drop_bucket(was)
            elif node_id in filed:
                self._unfile(node_id)
            if node_id not in nodes:
                continue
            node = nodes[node_id]
            if not node.by_priority or node.cordoned or node.failed:  # node.schedulable, inline
                continue
            key, latest = pending_entry(node)
            pending_of[node_id] = key
            into = added.get(key)
            if into is None:
                added[key] = {node_id: -latest}
            else:
                into[node_id] = -latest
        for key, members in added.items():
            found = pending.get(key)
            (self._new_bucket(key) if found is None else found).add(members)
        self.dirty.clear()
        self._marked.clear()

    def promote(self, node_ids: list[str], nodes: Mapping[str, Node]) -> None:
        """File pending nodes in their classes (after :meth:`refresh`). O(log n) each."""
        self._own()
        self.moves += 1
        pending, pending_of = self.pending, self._pending_of
        for node_id in node_ids:
            key = pending_of.pop(node_id)
            bucket = pending[key]
            bucket.remove(node_id)
            if not bucket.members:
                self._drop_bucket(key)
            self._file(nodes[node_id])

    def _file(self, node: Node) -> None:
        key = class_key(node)
        group = self.classes.get(key)
        if group is None:
            group = self.classes[key] = VictimClass()
            self.filings += 1
        node_id = node.node_id
        group.node_ids.add(node_id)
        entries = []
        streams = group.streams
        for level, held in node.by_priority.items():
            for milli, started in held.latest_starts.items():
                entries.append((level, milli, started))
                stream = streams.get((level, milli))
                if stream is None:
                    stream = streams[(level, milli)] = SortedList()
                    self.filings += 1
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
            self.filings += 1
            return
        for level, milli, started in entries:
            stream = group.streams[(level, milli)]
            stream.remove((-started, node_id))
            if not stream:
                del group.streams[(level, milli)]

    @classmethod
    def rebuilt(cls, nodes: Mapping[str, Node]) -> PreemptionIndex:
        """A fresh index from the nodes, every node filed in its class, for checking the incremental one."""
        index = cls()
        for node_id in sorted(nodes):
            index.touch(node_id)
        index.refresh(nodes)
        index.promote(sorted(index._pending_of), nodes)
        return index

    def content(self, nodes: Mapping[str, Node]) -> Content:
        """The classes as plain data (class -> node ids, streams), pending nodes filed as a search would file
        them, for equality checks; the index itself is left as it is."""
        twin = PreemptionIndex()
        twin._share(self)
        twin.promote(sorted(self._pending_of), nodes)
        return {
            key: (list(group.node_ids), {stream: list(entries) for stream, entries in group.streams.items()})
            for key, group in twin.classes.items()
        }

    def pending_content(self) -> dict[str, tuple[PendingKey, int]]:
        """Pending nodes, bucket by bucket -> (bucket, latest start), for checking against :func:`pending_entry`
        (a node in no bucket but marked pending, or in two, makes :meth:`content` fail or differ)."""
        return {
            node_id: (key, -minus_latest)
            for key, bucket in self.pending.items()
            for node_id, minus_latest in bucket.members.items()
        }
