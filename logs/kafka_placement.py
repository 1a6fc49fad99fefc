"""The commands topic's partition count, recorded in the metadata of each committed offset (issue #21).

Each command must be on partition murmur2(cluster) mod N (see :class:`logs.port.Placement`); N changing under a
running system would remap clusters. So every offset the processor commits carries, in its ``metadata``, the count
N its group first saw, and the processor refuses to fold when the topic's count is not that one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from logs.port import PartitionCountChanged, Placement

PLACEMENT_MARK = "gpufold-placement"
"""The ``metadata`` of each committed offset is ``{"gpufold-placement": 1, "partitions": N, "checked_from": C}``: the
commands topic's partition count when the group first committed that partition, and the offset from which its
commands are checked (see :class:`~logs.port.Placement`), committed in the same transaction."""


def placement_metadata(placement: Placement) -> str:
    return json.dumps(
        {PLACEMENT_MARK: 1, "partitions": placement.partitions, "checked_from": placement.checked_from},
        sort_keys=True,
    )


def parse_placement(metadata: str | None) -> Placement | None:
    """The placement recorded in a committed offset's metadata; None if none (an older processor's commit)."""
    if not metadata:
        return None
    try:
        data = json.loads(metadata)
        if isinstance(data, dict) and data.get(PLACEMENT_MARK) == 1:
            return Placement(int(data["partitions"]), int(data["checked_from"]))
    except (ValueError, KeyError, TypeError):
        pass
    return None


def topic_partitions(consumer: Consumer, topic: str, timeout: float) -> list[int]:
    """The partitions of ``topic`` (KafkaException with UNKNOWN_TOPIC_OR_PART, retriable, while it has none)."""
    metadata = consumer.list_topics(topic, timeout=timeout).topics[topic]
    if metadata.error is not None:
        raise KafkaException(metadata.error)
    return sorted(metadata.partitions)


def recorded_placement(
    consumer: Consumer, topic: str, group_id: str, partition: int, retrying: Callable[..., Any]
) -> Placement:
    """The partition's :class:`Placement`: the topic's partition count now, checked against the one each
    partition's committed offset recorded; where none was recorded (a new group, or offsets committed by a
    processor older than the check) the check starts at the committed offset. ``retrying(what, call, *args)``
    retries transient errors."""
    count = len(retrying(f"reading the metadata of {topic}", topic_partitions, consumer, topic, 10))
    tps = [TopicPartition(topic, p) for p in range(max(count, partition + 1))]
    committed = retrying("reading the committed offsets", consumer.committed, tps, 10)
    recorded = {tp.partition: parse_placement(tp.metadata) for tp in committed}
    changed = sorted(p for p, placed in recorded.items() if placed is not None and placed.partitions != count)
    if changed:
        was = recorded[changed[0]].partitions  # type: ignore[union-attr]
        raise PartitionCountChanged(
            f"{topic} has {count} partitions, but had {was} when group {group_id} first committed "
            f"partition(s) {changed}: murmur2(cluster) mod {count} sends clusters to other partitions than the "
            f"ones holding their history, and folding on would split their states. Refusing to fold. To change "
            "the partition count, publish every command again into a new commands topic and fold that one from "
            "the start with a new group (README: 'Changing the partition count')."
        )
    return recorded.get(partition) or Placement(count, max(committed[partition].offset, 0))
