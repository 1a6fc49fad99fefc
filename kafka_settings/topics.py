"""The four gpufold topics and their idempotent creation (``gpufold topics create``).

=================  ==========================================================================
commands           the source of truth: keyed by cluster, kept forever (``retention.ms=-1``)
events             the fold's output, same partition count as commands (partition p -> p), forever
snapshots          compacted, one key per partition (the latest snapshot survives compaction)
dead letters       undecodable command records with their position and error, forever
=================  ==========================================================================

Production defaults: 12 partitions, replication factor 3, ``min.insync.replicas=2`` (with producers on
``acks=all`` a write survives the loss of one broker). A single-broker development cluster needs
``--replication-factor 1`` (min ISR then defaults to 1). The partition count is fixed for good: the
cluster -> partition mapping (murmur2 of the key) must never change under a running system.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from schemas.topics import Topics

DEFAULT_PARTITIONS = 12
DEFAULT_REPLICATION_FACTOR = 3
DEFAULT_MIN_INSYNC_REPLICAS = 2
SNAPSHOT_MAX_BYTES = 64 * 1024 * 1024
"""Largest snapshot record (a partition's whole state, incl. up to 100k remembered command ids)."""


# UNKNOWN_TOPIC_OR_PART, LEADER_NOT_AVAILABLE, NOT_LEADER_FOR_PARTITION; and librdkafka's local _UNKNOWN_PARTITION
# (-190): a client that has not yet fetched the metadata of a topic created a moment ago.
_LEADERLESS = frozenset({3, 5, 6, -190})


class TopicError(RuntimeError):
    """A topic cannot be created, or exists with an incompatible layout."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str]


def topic_specs(
    topics: Topics,
    partitions: int = DEFAULT_PARTITIONS,
    replication_factor: int = DEFAULT_REPLICATION_FACTOR,
    min_insync_replicas: int | None = None,
) -> list[TopicSpec]:
    """The specs of the four topics (``min_insync_replicas`` defaults to min(2, replication factor))."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    if replication_factor < 1:
        raise ValueError(f"replication factor must be >= 1, got {replication_factor}")
    if min_insync_replicas is None:
        min_insync_replicas = min(DEFAULT_MIN_INSYNC_REPLICAS, replication_factor)
    if not 1 <= min_insync_replicas <= replication_factor:
        raise ValueError(
            f"min.insync.replicas must be between 1 and the replication factor {replication_factor}, "
            f"got {min_insync_replicas}"
        )
    isr = str(min_insync_replicas)
    forever = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete", "min.insync.replicas": isr}
    snapshots = {
        "cleanup.policy": "compact",
        "min.insync.replicas": isr,
        "max.message.bytes": str(SNAPSHOT_MAX_BYTES),
        "min.cleanable.dirty.ratio": "0.1",
        "segment.ms": str(6 * 3600 * 1000),
    }
    return [
        TopicSpec(topics.commands, partitions, replication_factor, forever),
        TopicSpec(topics.events, partitions, replication_factor, dict(forever)),
        TopicSpec(topics.snapshots, partitions, replication_factor, snapshots),
        TopicSpec(topics.dead_letters, partitions, replication_factor, dict(forever)),
    ]


def create_topics(admin_config: dict[str, Any], specs: list[TopicSpec], timeout: float = 30.0) -> dict[str, str]:
    """Create the topics that are missing; returns ``{name: "created" | "exists"}``.

    Idempotent: an existing topic is left alone if its partition count matches, and is an error otherwise.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(admin_config)
    new = [
        NewTopic(s.name, num_partitions=s.partitions, replication_factor=s.replication_factor, config=s.config)
        for s in specs
    ]
    result: dict[str, str] = {}
    for name, future in admin.create_topics(new, request_timeout=timeout).items():
        try:
            future.result(timeout)
            result[name] = "created"
        except KafkaException as error:
            kafka_error = error.args[0]
            if kafka_error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise TopicError(f"cannot create topic {name}: {kafka_error.str()}") from None
            result[name] = "exists"
    existing = [s for s in specs if result[s.name] == "exists"]
    if existing:
        metadata = admin.list_topics(timeout=timeout).topics
        for spec in existing:
            found = metadata.get(spec.name)
            count = len(found.partitions) if found is not None else 0
            if count != spec.partitions:
                raise TopicError(
                    f"topic {spec.name} exists with {count} partitions, expected {spec.partitions}: "
                    "the partition count of gpufold topics can never change"
                )
    return result


def watermark_offsets(consumer: Any, tp: Any, timeout: float = 30.0) -> tuple[int, int]:
    """``consumer.get_watermark_offsets`` retried while a new or moving partition has no leader yet."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=max(deadline - time.monotonic(), 1.0))
            return low, high
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            retriable = error is not None and (error.retriable() or error.code() in _LEADERLESS)
            if not retriable or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
