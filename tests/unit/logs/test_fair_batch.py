"""Fair batches across partitions (logs.fair_batch): shares, order, and what is dropped."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from logs.fair_batch import PartitionQueues
from logs.port import InputRecord


def _records(partition: int, count: int, start: int = 0) -> list[InputRecord]:
    return [InputRecord(partition, offset, b"k", b"v") for offset in range(start, start + count)]


def test_a_batch_takes_an_equal_share_of_each_backlog() -> None:
    queues = PartitionQueues()
    queues.add(_records(2, 1_000))  # the client handed partition 2's backlog over first
    queues.add(_records(1, 1_000))
    queues.add(_records(0, 1_000))
    batch = queues.take(300)
    assert {p: sum(r.partition == p for r in batch) for p in range(3)} == {0: 100, 1: 100, 2: 100}
    assert len(queues) == 2_700


def test_a_short_queue_gives_its_unused_share_to_the_others() -> None:
    queues = PartitionQueues()
    queues.add(_records(0, 10))
    queues.add(_records(1, 1_000))
    queues.add(_records(2, 1_000))
    batch = queues.take(300)
    assert {p: sum(r.partition == p for r in batch) for p in range(3)} == {0: 10, 1: 145, 2: 145}


def test_drop_forgets_a_partition_and_full_names_the_ones_over_a_limit() -> None:
    queues = PartitionQueues()
    queues.add(_records(0, 5))
    queues.add(_records(1, 50))
    assert queues.full(50) == [1]
    assert queues.drop([1, 7]) == 50
    assert len(queues) == 5 and queues.held(1) == 0
    assert [r.offset for r in queues.take(10)] == [0, 1, 2, 3, 4]
    assert queues.take(10) == []


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=5),
    limit=st.integers(min_value=1, max_value=60),
)
def test_batches_keep_offset_order_lose_nothing_and_are_fair(sizes: list[int], limit: int) -> None:
    queues = PartitionQueues()
    for partition, size in enumerate(sizes):
        queues.add(_records(partition, size))
    seen: dict[int, list[int]] = {p: [] for p in range(len(sizes))}
    while len(queues):
        held = {p: queues.held(p) for p in range(len(sizes))}
        batch = queues.take(limit)
        assert 0 < len(batch) <= limit
        assert len(batch) == min(limit, sum(held.values()))  # never short while records wait
        counts = {p: sum(r.partition == p for r in batch) for p in held}
        waiting = [p for p, n in held.items() if n]
        # Fair: a partition gets less than another only if it had nothing more to give.
        for p in waiting:
            for q in waiting:
                if counts[p] + 1 < counts[q]:
                    assert counts[p] == held[p]
        for record in batch:
            seen[record.partition].append(record.offset)
    assert seen == {p: list(range(size)) for p, size in enumerate(sizes)}
