"""What-if: fold commands on a private copy of a partition's state and return the events, publishing nothing.

:func:`fork` copies what the commands can change and shares the rest, so the live state is never
touched and a what-if on a cluster of 100k pods costs milliseconds, not a full copy:

- ``clusters`` is a :class:`CopyOnAccess` dict: a cluster is forked the first time the fold reads
  it, the others stay shared;
- in a forked cluster, ``nodes`` and ``pods`` are :class:`CopyOnAccess` dicts too: a node or pod is
  copied the first time the fold reads it, so only what a command looks at is copied;
- the idempotency window is an overlay on the live one (:class:`SeenOverlay`);
- the preemption index is shared until the fork first refiles a node, then copied
  (``PreemptionIndex.fork``): a what-if that never preempts never copies it;
- every other field (capacity index, queues, gangs, timers, and any field added later) is copied
  by :func:`structural_copy`, which shares immutable values.

Policy memos: fragmentation-aware policies (``fgd``, ``fgd-plus``, ``fgd-pack``) keep one memo per cluster
name, valid while the cluster's ``typical`` tuple is the same object. The fork gives each copied
cluster a *new* ``typical`` tuple (equal content), so a what-if builds its own memo instead of
filling the live one with entries keyed by the fork's capacity groups (which would keep every
fork's groups alive until the memo's size limit). The live fold's next placement rebuilds its memo
once: only a cache is lost, never a result (`tests/unit/test_whatif.py` checks memory stays flat).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections import OrderedDict
from collections.abc import Callable, ItemsView, Iterator, ValuesView
from typing import Any

from sortedcontainers import SortedList

from processor.core.state import ClusterState, Node, PartitionState, Pod, SeenWindow


class CopyOnAccess(dict):  # type: ignore[type-arg]
    """A dict whose values are copied on first read, so writes through them never reach the original objects.

    Every way of reading a value (``[]``, ``get``, ``pop``, ``setdefault``, ``values``, ``items``,
    ``popitem``) hands out the copy; keys, ``in`` and ``len`` cost nothing.
    """

    __slots__ = ("_copier", "_owned")

    def __init__(self, source: dict[Any, Any], copier: Callable[[Any], Any]) -> None:
        super().__init__(source)
        self._copier = copier
        self._owned: set[Any] = set()

    def _own(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        if key not in self._owned:
            value = self._copier(value)
            dict.__setitem__(self, key, value)
            self._owned.add(key)
        return value

    def _own_all(self) -> None:
        for key in list(dict.keys(self)):
            self._own(key)

    def __getitem__(self, key: Any) -> Any:
        return self._own(key)

    def get(self, key: Any, default: Any = None) -> Any:
        return self._own(key) if dict.__contains__(self, key) else default

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)
        self._owned.add(key)

    def __delitem__(self, key: Any) -> None:
        dict.__delitem__(self, key)
        self._owned.discard(key)

    def pop(self, key: Any, *default: Any) -> Any:
        if dict.__contains__(self, key):
            value = self._own(key)
            self.__delitem__(key)
            return value
        if default:
            return default[0]
        raise KeyError(key)

    def popitem(self) -> tuple[Any, Any]:
        key = next(reversed(dict.keys(self)))
        return key, self.pop(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            return self._own(key)
        self[key] = default
        return default

    def values(self) -> ValuesView[Any]:  # type: ignore[override]
        self._own_all()
        return dict.values(self)

    def items(self) -> ItemsView[Any, Any]:  # type: ignore[override]
        self._own_all()
        return dict.items(self)

    def copy(self) -> dict[Any, Any]:
        self._own_all()
        return dict(dict.items(self))

    def __reduce__(self) -> Any:  # pickling/deepcopy see a plain dict of owned copies
        return (dict, (self.copy(),))


class SeenOverlay:
    """A fork's idempotency window: the live window, read-only, plus the ids the fork adds.

    Copying a window of 100k ids costs ~0.1 s; the fork only ever asks ``in``, adds new ids at the
    end and drops the oldest (``PartitionState.remember``), so it keeps those changes on the side.
    """

    __slots__ = ("_added", "_base", "_dropped")

    def __init__(self, base: SeenWindow) -> None:
        self._base = base
        self._added: OrderedDict[str, None] = OrderedDict()
        self._dropped: dict[str, None] = {}  # the oldest base ids, dropped in order

    def __contains__(self, key: object) -> bool:
        return key in self._added or (key in self._base and key not in self._dropped)

    def __setitem__(self, key: str, value: None) -> None:
        if key not in self:
            self._added[key] = value

    def __len__(self) -> int:
        return len(self._base) - len(self._dropped) + len(self._added)

    def __iter__(self) -> Iterator[str]:
        yield from itertools.islice(self._base, len(self._dropped), None)
        yield from self._added

    def popitem(self, last: bool = True) -> tuple[str, None]:
        if last:
            return self._added.popitem() if self._added else (self._drop_oldest(), None)
        if len(self._dropped) < len(self._base):
            return self._drop_oldest(), None
        return self._added.popitem(last=False)

    def _drop_oldest(self) -> str:
        key = next(itertools.islice(self._base, len(self._dropped), None))
        self._dropped[key] = None
        return key


_IMMUTABLE = (str, int, float, bool, bytes, type(None), frozenset)


def structural_copy(value: Any, memo: dict[int, Any]) -> Any:
    """A deep copy for the fold's own data, ~10x faster than ``copy.deepcopy``.

    Containers (dict, OrderedDict, list, set, SortedList) and plain objects (slots or dataclasses)
    are copied, shared references stay shared (``memo``); tuples are treated as immutable values
    and shared, as the fold's tuples are (signatures, keys, taints). Anything else goes to
    ``copy.deepcopy``.
    """
    if isinstance(value, (*_IMMUTABLE, tuple)):
        return value
    found = memo.get(id(value))
    if found is not None:
        return found
    kind = type(value)
    twin: Any
    if kind is dict or kind is OrderedDict:
        twin = memo[id(value)] = kind()
        for key, item in value.items():
            twin[key] = structural_copy(item, memo)
    elif kind is list:
        twin = memo[id(value)] = [structural_copy(item, memo) for item in value]
    elif kind is set:
        twin = memo[id(value)] = set(value)  # of immutable members
    elif kind is SortedList:
        twin = memo[id(value)] = value.copy()  # of immutable members
    elif dataclasses.is_dataclass(value) and kind.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        return value  # an immutable record (a compiled one cannot even be copied field by field)
    elif hasattr(kind, "__slots__") or hasattr(kind, "__mypyc_attrs__") or dataclasses.is_dataclass(value):
        twin = memo[id(value)] = copy.copy(value)
        names = [f.name for f in dataclasses.fields(value)] if dataclasses.is_dataclass(value) else _slots(kind)
        for name in names:
            if hasattr(value, name):
                setattr(twin, name, structural_copy(getattr(value, name), memo))
    else:
        twin = memo[id(value)] = copy.deepcopy(value)
    return twin


def _slots(kind: type) -> list[str]:
    """The attributes of a class with ``__slots__``, or of a class compiled by mypyc (``__mypyc_attrs__``)."""
    names: list[str] = []
    for klass in kind.__mro__:
        for key in ("__slots__", "__mypyc_attrs__"):
            slots = klass.__dict__.get(key, ())
            names.extend([slots] if isinstance(slots, str) else slots)
    return list(dict.fromkeys(names))


_NODE_ATTRIBUTES = _slots(Node)


def _copy_node(node: Node) -> Node:
    """A node with its own mutable parts (free GPU list, running pods, labels); immutable ones shared."""
    twin = copy.copy(node)
    for name in _NODE_ATTRIBUTES:
        value = getattr(node, name)
        if isinstance(value, (list, dict, set)):
            setattr(twin, name, copy.copy(value))
    # What the node's pods hold per priority: changed in place by allocate/free.
    twin.by_priority = {priority: held.copied() for priority, held in node.by_priority.items()}
    return twin


def _copy_pod(pod: Pod) -> Pod:
    return copy.copy(pod)  # spec, shape and GPUs are immutable values: shared


def fork_cluster(cluster: ClusterState) -> ClusterState:
    """A copy of one cluster that can change freely; see the module docstring."""
    memo: dict[int, Any] = {}
    twin = copy.copy(cluster)
    for spec in dataclasses.fields(cluster):
        value = getattr(cluster, spec.name)
        if spec.name == "nodes":
            setattr(twin, spec.name, CopyOnAccess(value, _copy_node))
        elif spec.name == "pods":
            setattr(twin, spec.name, CopyOnAccess(value, _copy_pod))
        elif spec.name == "preemptible":
            setattr(twin, spec.name, value.fork())  # copied on its first refile, if any
        elif spec.name == "typical":
            setattr(twin, spec.name, tuple(list(value)))  # a new identity: see the module docstring
        else:  # the capacity index, the queues, gangs, ... and whatever comes next
            setattr(twin, spec.name, structural_copy(value, memo))
    return twin


def fork(state: PartitionState) -> PartitionState:
    """A copy of ``state`` that can change freely: each cluster is forked when the fold first reads it.

    The fork shares what it has not copied yet with ``state``, so it is valid while ``state`` does
    not change (the replica folds and forks under one lock, and drops the fork before folding on).

    Not only the commands' own clusters: a command moves the partition's clock, and the timers it
    reaches (time limits, gang timeouts, reservations) fire on whichever cluster they belong to.
    """
    twin = copy.copy(state)
    for spec in dataclasses.fields(state):
        value = getattr(state, spec.name)
        if spec.name == "clusters":
            setattr(twin, spec.name, CopyOnAccess(value, fork_cluster))
        elif spec.name == "seen":
            setattr(twin, spec.name, SeenOverlay(value))
        else:
            setattr(twin, spec.name, structural_copy(value, {}))
    return twin
