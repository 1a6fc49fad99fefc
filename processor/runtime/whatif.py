"""What-if: fold commands on a private copy of a partition's state and return the events, publishing nothing.

:func:`fork` copies what the commands can change and shares the rest, so the live state is never
touched and a what-if on a cluster of 100k pods costs milliseconds, not a full copy:

- ``clusters`` is a :class:`CopyOnAccess` dict: a cluster is forked the first time the fold reads
  it, the others stay shared;
- in a forked cluster, ``nodes`` and ``pods`` are :class:`CopyOnAccess` dicts too: a node or pod is
  copied the first time the fold reads it, so only what a command looks at is copied;
- the capacity index is rebuilt from the nodes' signatures;
- every other field (queue, counters, and any field added later) is deep-copied.

Policy memos: fragmentation-aware policies (``fgd``, ``fgd-plus``) keep one memo per cluster
name, valid while the cluster's ``typical`` tuple is the same object. The fork gives each copied
cluster a *new* ``typical`` tuple (equal content), so a what-if builds its own memo instead of
filling the live one with entries keyed by the fork's capacity groups (which would keep every
fork's groups alive until the memo's size limit). The live fold's next placement rebuilds its memo
once: only a cache is lost, never a result (`tests/unit/test_whatif.py` checks memory stays flat).
"""

from __future__ import annotations

import copy
import dataclasses
from collections import OrderedDict
from collections.abc import Callable, ItemsView, ValuesView
from typing import Any

from processor.core.state import ClusterState, Node, PartitionState, Pod


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


def _copy_node(node: Node) -> Node:
    """A node with its own mutable parts (free GPU list, running pods, labels); immutable ones shared."""
    twin = copy.copy(node)
    for name in Node.__slots__:
        value = getattr(node, name)
        if isinstance(value, (list, dict, set)):
            setattr(twin, name, copy.copy(value))
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
        elif spec.name == "index":
            # Rebuilt from the node signatures (the index's own equality check): a deep copy of its
            # sorted groups costs ~30x more. Placement never depends on the index's insertion order
            # (ties break on node id), which is what makes a snapshot restore decide alike too.
            signatures = {node_id: value.signature_of(node_id) for node_id in cluster.nodes if node_id in value}
            setattr(twin, spec.name, value.rebuilt(signatures))  # type: ignore[arg-type]
        elif spec.name == "typical":
            setattr(twin, spec.name, tuple(list(value)))  # a new identity: see the module docstring
        else:
            setattr(twin, spec.name, copy.deepcopy(value, memo))
    return twin


def fork(state: PartitionState) -> PartitionState:
    """A copy of ``state`` that can change freely: each cluster is forked when the fold first reads it.

    Not only the commands' own clusters: a command moves the partition's clock, and the timers it
    reaches (time limits, gang timeouts, reservations) fire on whichever cluster they belong to.
    """
    twin = copy.copy(state)
    for spec in dataclasses.fields(state):
        value = getattr(state, spec.name)
        if spec.name == "clusters":
            setattr(twin, spec.name, CopyOnAccess(value, fork_cluster))
        elif spec.name == "seen":
            setattr(twin, spec.name, OrderedDict(value))  # C-speed copy of up to 100k ids
        else:
            setattr(twin, spec.name, copy.deepcopy(value))
    return twin
