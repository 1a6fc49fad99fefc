"""Export from Kafka into the Avro container format of ``gpufold.log_export``: time travel on a laptop.

``gpufold log export --bootstrap HOST DIR`` reads the commands (and, if asked, the events,
snapshots and dead letters) of chosen partitions, up to a given offset or event time, with a
group-less ``read_committed`` reader, and writes the same files ``gpufold log export`` writes for
the embedded log. ``gpufold log import`` + ``gpufold replay`` then reproduce production's
``state_hash`` for every exported partition.

A partition is the unit of replay: its state (and ``state_hash``) covers every cluster on it, so
``--clusters`` selects the partitions those clusters live on and exports them whole.

The cut, per partition: every command with offset <= ``until_offset``, or every command before
the first one issued after ``until_ms``. Events are kept for the commands below the cut (and below
the processor's committed offset), dead letters likewise, and snapshots whose position is at or
below the cut. The processor's committed positions go into ``commands.avro``'s metadata (capped at
the cut), so an import with events knows which commands were already folded.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition

from gpufold.log_export import MANIFEST, ROLES, ExportError, topic_of, write_manifest, write_topic
from kafka_settings.config import KafkaConfig
from logs.kafka_reader import KafkaReadError, read_partition
from logs.port import StoredRecord
from schemas import DecodeError
from schemas.dead_letters import decode_dead_letter
from schemas.fastcodec import decode_command, decode_event
from schemas.partitioner import partition_for
from schemas.snapshots import decode_snapshot
from schemas.topics import Topics

log = logging.getLogger("gpufold.export.kafka")


class KafkaExporter:
    """Reads whole topic-partitions from Kafka, committed records only, in offset order."""

    def __init__(self, config: KafkaConfig, topics: Topics, *, group: str = "gpufold-processor", timeout: float = 30.0):
        self.config = config
        self.topics = topics
        self.group = group
        self.timeout = timeout
        try:
            self._reader = Consumer(
                config.client(
                    {"fetch.max.bytes": 64 << 20},
                    {
                        "group.id": f"gpufold-export-{uuid.uuid4().hex}",
                        "enable.auto.commit": False,
                        "isolation.level": "read_committed",
                        "enable.partition.eof": True,
                        "logger": logging.getLogger("gpufold.kafka.rdkafka"),
                    },
                )
            )
            metadata = self._reader.list_topics(topics.commands, timeout=timeout).topics[topics.commands]
        except KafkaException as exc:
            raise ExportError(config.scrub(f"cannot read {topics.commands}: {exc}")) from None
        if metadata.error is not None or not metadata.partitions:
            raise ExportError(f"commands topic {topics.commands} does not exist or has no partitions")
        self.partitions = len(metadata.partitions)

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> KafkaExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, topic: str, partition: int) -> Iterator[StoredRecord]:
        """Every committed record of a topic-partition (none if the topic or partition does not exist)."""
        try:
            yield from read_partition(self._reader, topic, partition, self.timeout, batch=10_000)
        except KafkaReadError as error:
            raise ExportError(self.config.scrub(str(error))) from None

    def committed(self, partitions: list[int]) -> dict[int, int]:
        """The processor group's committed offsets on the commands topic (0 where none)."""
        consumer = Consumer(self.config.client({}, {"group.id": self.group, "enable.auto.commit": False}))
        try:
            tps = [TopicPartition(self.topics.commands, p) for p in partitions]
            return {tp.partition: max(tp.offset, 0) for tp in consumer.committed(tps, self.timeout)}
        finally:
            consumer.close()


def choose_partitions(count: int, partitions: list[int] | None, clusters: list[str] | None) -> list[int]:
    """The partitions to export: those given, those the clusters live on, or all."""
    chosen = set(partitions or ())
    chosen.update(partition_for(cluster.encode(), count) for cluster in clusters or ())
    if not chosen:
        return list(range(count))
    outside = sorted(p for p in chosen if not 0 <= p < count)
    if outside:
        raise ExportError(f"partition(s) {outside} outside 0..{count - 1}")
    return sorted(chosen)


def export_kafka(
    exporter: KafkaExporter,
    out_dir: str | Path,
    *,
    roles: list[str] | None = None,
    partitions: list[int] | None = None,
    clusters: list[str] | None = None,
    until_offset: int | None = None,
    until_ms: int | None = None,
) -> dict[str, int]:
    """Export the chosen partitions up to the cut; returns records per role (see the module docstring)."""
    roles = list(roles or ROLES)
    if "commands" not in roles:
        raise ExportError("an export needs the commands (the source of truth)")
    chosen = choose_partitions(exporter.partitions, partitions, clusters)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # a manifest is only ever written for a complete export
    topics = exporter.topics
    commands: list[StoredRecord] = []
    cuts: dict[int, int] = {}
    for partition in chosen:
        cut = 0
        for record in exporter.read(topics.commands, partition):
            if until_offset is not None and record.offset > until_offset:
                break
            if until_ms is not None and _issued_after(record, until_ms):
                break
            commands.append(record)
            cut = record.offset + 1
        cuts[partition] = cut
    committed = exporter.committed(chosen)
    positions = {p: min(committed.get(p, 0), cuts[p]) for p in chosen}
    metadata = {
        "gpufold.positions": json.dumps({str(p): o for p, o in positions.items()}),
        "gpufold.group": exporter.group,
        "gpufold.source": "kafka",
        "gpufold.partitions_exported": ",".join(map(str, chosen)),
    }
    counts = {
        "commands": write_topic(
            out / "commands.avro",
            role="commands",
            topic=topics.commands,
            partitions=exporter.partitions,
            records=iter(commands),
            metadata=metadata,
        )
    }
    keep: dict[str, Callable[[StoredRecord, int], bool | None]] = {
        "events": lambda r, cut: decode_event(r.value).command_offset < cut,
        "dead-letters": lambda r, cut: decode_dead_letter(r.value).offset < cut,  # type: ignore[arg-type]
        "snapshots": lambda r, cut: decode_snapshot(r.value).next_offset <= cut,  # type: ignore[arg-type]
    }
    for role in roles:
        if role == "commands":
            continue
        topic = topic_of(topics, role)

        def records(topic: str = topic, role: str = role) -> Iterator[StoredRecord]:
            for partition in chosen:
                cut = positions[partition]
                for record in exporter.read(topic, partition):
                    if record.value is None:
                        continue
                    wanted = keep[role](record, cut)
                    if wanted:
                        yield record
                    elif role == "events":
                        break  # events are in command order: the rest are past the cut

        counts[role] = write_topic(
            out / f"{role}.avro", role=role, topic=topic, partitions=exporter.partitions, records=records()
        )
    write_manifest(out, counts, exporter.partitions)  # what log import verifies before writing anything
    return counts


def _issued_after(record: StoredRecord, until_ms: int) -> bool:
    try:
        return decode_command(record.value).issued_at > until_ms  # type: ignore[arg-type]
    except DecodeError:
        return False  # an undecodable record is kept: the processor dead-lettered it in place
