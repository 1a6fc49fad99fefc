"""The pending queue, indexed by request shape.

Pods wait in one sorted list per :class:`~processor.core.resources.PodShape`, ordered
by (-priority, arrival, pod_id): highest priority first, FIFO within a priority.
Pods of one shape are interchangeable for placement, so when capacity frees the
retry looks at each shape's head only; a shape that does not fit is skipped as a
whole, so a big pod never blocks smaller ones behind it and the work per retry
is bounded by the number of distinct shapes waiting, not the queue length.

Complexity: ``push``/``remove`` O(log q_s) (q_s = pods of that shape);
``heads`` O(Q) for Q distinct shapes waiting.
"""

from __future__ import annotations

from sortedcontainers import SortedList

from processor.core.resources import PodShape

QueueKey = tuple[int, int, str]  # (-priority, arrival, pod_id)


class PendingQueue:
    __slots__ = ("_by_shape", "_heads", "_size")

    def __init__(self) -> None:
        self._by_shape: dict[PodShape, SortedList] = {}
        # The head of each shape, ordered: the queue's first pod in O(1). Keys are unique (they end
        # with the pod id), so entries never compare shapes.
        self._heads: SortedList = SortedList()
        self._size = 0

    def push(self, shape: PodShape, key: QueueKey) -> None:
        pods = self._by_shape.get(shape)
        if pods is None:
            pods = self._by_shape[shape] = SortedList()
        elif key < pods[0]:
            self._heads.remove((pods[0], shape))
        else:
            pods.add(key)
            self._size += 1
            return
        pods.add(key)
        self._heads.add((key, shape))
        self._size += 1

    def remove(self, shape: PodShape, key: QueueKey) -> None:
        pods = self._by_shape[shape]
        head = pods[0] == key
        pods.remove(key)
        self._size -= 1
        if head:
            self._heads.remove((key, shape))
            if pods:
                self._heads.add((pods[0], shape))
        if not pods:
            del self._by_shape[shape]

    def first(self) -> tuple[QueueKey, PodShape] | None:
        """The first pod of the whole queue (priority, then FIFO) and its shape. O(1)."""
        return self._heads[0] if self._heads else None

    def head(self, shape: PodShape) -> QueueKey | None:
        pods = self._by_shape.get(shape)
        return pods[0] if pods else None

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
        return self._size

    def content(self) -> dict[PodShape, list[QueueKey]]:
        return {shape: list(pods) for shape, pods in self._by_shape.items()}
