"""The pending queue, indexed by group: tenant, preemption setting and request shape.

Pods wait in one sorted list per group (:data:`processor.core.state.QueueGroup`), ordered
by (-priority, arrival, pod_id): highest priority first, FIFO within a priority.
Pods of one group are interchangeable for placement, quota and preemption, so when
capacity frees the retry looks at each group's head only; a group that does not fit is
skipped as a whole, so a big pod never blocks smaller ones behind it and the work per
retry is bounded by the number of distinct groups waiting, not the queue length.

Complexity: ``push``/``remove`` O(log q_s) (q_s = pods of that shape);
``heads`` O(Q) for Q distinct shapes waiting; ``waits_with`` (a preemption setting) O(1).
"""

from __future__ import annotations

import bisect
from typing import Any

from sortedcontainers import SortedList

QueueKey = tuple[int, int, str]  # (-priority, arrival, pod_id)
PodShape = Any  # the group a pod waits in: ``processor.core.state.QueueGroup`` (hashable)


class PendingQueue:
    __slots__ = ("_by_shape", "_heads", "_settings", "size", "version")

    def __init__(self) -> None:
        self._by_shape: dict[PodShape, SortedList] = {}
        # The head of each shape, ordered: the queue's first pod in O(1). Keys are unique (they end
        # with the pod id), so entries never compare shapes. A plain list kept sorted with bisect: it
        # holds one entry per waiting shape (tens to hundreds), where insort's memmove beats a tree.
        self._heads: list[tuple[QueueKey, PodShape]] = []
        # Waiting groups per preemption setting (a group's second field): whether a group of some setting waits
        # is O(1), not a pass over the groups (a storm of releases asks it once per release).
        self._settings: dict[Any, int] = {}
        self.size = 0
        self.version = 0  # moves with every push and remove: what was read of the queue is still true while it stays

    def push(self, shape: PodShape, key: QueueKey) -> None:
        self.version += 1
        pods = self._by_shape.get(shape)
        if pods is None:
            pods = self._by_shape[shape] = SortedList()
            setting = shape[1]
            self._settings[setting] = self._settings.get(setting, 0) + 1
        elif key < pods[0]:
            self._drop_head(pods[0], shape)
        else:
            pods.add(key)
            self.size += 1
            return
        pods.add(key)
        bisect.insort(self._heads, (key, shape))
        self.size += 1

    def remove(self, shape: PodShape, key: QueueKey) -> None:
        self.version += 1
        pods = self._by_shape[shape]
        head = pods[0] == key
        pods.remove(key)
        self.size -= 1
        if head:
            self._drop_head(key, shape)
            if pods:
                bisect.insort(self._heads, (pods[0], shape))
        if not pods:
            del self._by_shape[shape]
            setting = shape[1]
            left = self._settings[setting] - 1
            if left:
                self._settings[setting] = left
            else:
                del self._settings[setting]

    def _drop_head(self, key: QueueKey, shape: PodShape) -> None:
        del self._heads[bisect.bisect_left(self._heads, (key, shape))]

    def first(self) -> tuple[QueueKey, PodShape] | None:
        """The first pod of the whole queue (priority, then FIFO) and its shape. O(1)."""
        return self._heads[0] if self._heads else None

    def count(self, shape: PodShape) -> int:
        """How many pods wait with this shape. O(1)."""
        pods = self._by_shape.get(shape)
        return len(pods) if pods else 0

    def head(self, shape: PodShape) -> QueueKey | None:
        pods = self._by_shape.get(shape)
        return pods[0] if pods else None

    def waits_with(self, setting: Any) -> bool:
        """Whether some group with this preemption setting waits. O(1)."""
        return setting in self._settings

    def heads(self) -> list[tuple[QueueKey, PodShape]]:
        """Each waiting shape with its first pod, unordered (callers sort or heapify)."""
        return [(pods[0], shape) for shape, pods in self._by_shape.items()]

    def position(self, shape: PodShape, key: QueueKey) -> int:
        """How many pods of any shape are ahead of this one. O(Q log q)."""
        return sum(pods.bisect_left(key) for pods in self._by_shape.values())

    def ordered(self) -> list[QueueKey]:
        """Every waiting pod in queue order. O(n log n)."""
        return sorted(key for pods in self._by_shape.values() for key in pods)

    def shape_count(self) -> int:
        return len(self._by_shape)

    def __len__(self) -> int:
        return self.size

    def content(self) -> dict[PodShape, list[QueueKey]]:
        return {shape: list(pods) for shape, pods in self._by_shape.items()}
