"""Fair batches across partitions: records fetched ahead wait per partition, and a batch takes a fair share of each.

A Kafka client hands records over in one queue, in the order its fetches returned them, and a fetch returns whole
producer batches: with a backlog, thousands of one partition's records sit in front of the next partition's (a
processor used to empty one partition before it saw the next). :class:`PartitionQueues` holds what was fetched,
one queue per partition, and :meth:`PartitionQueues.take` cuts a batch with an equal share of every partition that
has records (a partition with fewer gives its unused share to the others), keeping each partition's offset order.
No clock, no I/O: the Kafka adapter decides when to fetch, and pauses a partition whose queue is full
(:meth:`PartitionQueues.full`) so the client's queue shows the records behind it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from logs.port import InputRecord


class PartitionQueues:
    """Fetched-but-not-yet-folded records, one FIFO queue per partition."""

    def __init__(self) -> None:
        self._queues: dict[int, deque[InputRecord]] = {}
        self._count = 0
        self._turn = 0  # which partition leads the next batch (rotates, so no partition is always last)

    def __len__(self) -> int:
        return self._count

    def held(self, partition: int) -> int:
        """Records waiting for ``partition``."""
        queue = self._queues.get(partition)
        return len(queue) if queue is not None else 0

    def add(self, records: Iterable[InputRecord]) -> None:
        queues = self._queues
        added = 0
        for record in records:
            queue = queues.get(record.partition)
            if queue is None:
                queue = queues[record.partition] = deque()
            queue.append(record)
            added += 1
        self._count += added

    def drop(self, partitions: Iterable[int]) -> int:
        """Forget what is held for ``partitions`` (revoked, or rewound to the committed offset); returns how many."""
        dropped = 0
        for partition in partitions:
            queue = self._queues.pop(partition, None)
            if queue is not None:
                dropped += len(queue)
        self._count -= dropped
        return dropped

    def clear(self) -> None:
        self._queues.clear()
        self._count = 0

    def full(self, limit: int) -> list[int]:
        """The partitions holding ``limit`` records or more, in partition order."""
        return sorted(partition for partition, queue in self._queues.items() if len(queue) >= limit)

    def take(self, limit: int) -> list[InputRecord]:
        """Up to ``limit`` records: an equal share of each partition with records, each in offset order."""
        waiting = sorted(partition for partition, queue in self._queues.items() if queue)
        if not waiting or limit <= 0:
            return []
        shares: dict[int, int] = {}
        left = limit
        # Water-filling: the partitions holding least are served first; what they cannot use goes to the rest.
        by_size = sorted(waiting, key=lambda partition: (len(self._queues[partition]), partition))
        for index, partition in enumerate(by_size):
            share = min(len(self._queues[partition]), left // (len(by_size) - index))
            shares[partition] = share
            left -= share
        start = self._turn % len(waiting)
        self._turn += 1
        batch: list[InputRecord] = []
        for partition in waiting[start:] + waiting[:start]:
            queue = self._queues[partition]
            share = shares[partition]
            if share == len(queue):
                batch.extend(queue)
                queue.clear()
            else:
                batch.extend(queue.popleft() for _ in range(share))
        self._count -= len(batch)
        return batch
