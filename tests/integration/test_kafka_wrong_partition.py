"""One writer per cluster on the real broker: commands a non-murmur2 client put on the wrong partition, or keyed
other than their cluster, are dead-lettered WRONG_PARTITION and never folded; a partition count changed under a
processor stops it (issue #21)."""

from __future__ import annotations

import logging
import socket
import time
import urllib.request
import zlib

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from kafka_support import (
    RDKAFKA_LOG,
    BackgroundProcessor,
    check_exactly_once,
    command_stream,
    dead_letter,
    decode_events,
    kafka_config,
    new_topics,
    publish,
    read_topic,
)

from logs.kafka_placement import parse_placement
from producers.publisher import CommandPublisher
from schemas import COMMAND, registry
from schemas.commands import AddNode, Command, Release, SubmitPod
from schemas.partitioner import partition_for

pytestmark = pytest.mark.integration

PARTITIONS = 3


def _crc32_cluster() -> str:
    """A cluster name that librdkafka's default partitioner (consistent_random: CRC32 of the key) sends to another
    partition than Kafka's murmur2 (what gpufold expects)."""
    for index in range(100):
        name = f"java-{chr(ord('a') + index % 26)}{index // 26 or ''}"
        if zlib.crc32(name.encode()) % PARTITIONS != partition_for(name.encode(), PARTITIONS):
            return name
    raise AssertionError("no cluster name with different CRC32 and murmur2 partitions")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_librdkafka_default_partitioner_and_a_wrong_key_are_refused_not_folded(kafka_bootstrap: str) -> None:
    topics = new_topics(kafka_bootstrap, "wrongpart", PARTITIONS)
    cluster = _crc32_cluster()
    home = partition_for(cluster.encode(), PARTITIONS)
    encode = registry().codec(COMMAND).encode
    node = AddNode("n1", 64_000, 512_000, "A100", 8)
    pod = SubmitPod("p1", num_gpu=1, gpu_milli=1000, cpu_milli=1000, memory_mib=1024)
    # 1. The right way: gpufold's publisher (murmur2, keyed by cluster).
    with CommandPublisher(kafka_config(kafka_bootstrap), topics.commands) as publisher:
        publisher.publish(Command("ok-node", cluster, 1_000, node, "test"))
        publisher.publish(Command("ok-pod", cluster, 1_001, pod, "test"))
    # 2. A librdkafka producer left on its default partitioner (consistent_random = CRC32): the same node and pod
    # again, which, folded on another partition, would be a second state of the same cluster.
    delivered: list[int] = []
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "logger": RDKAFKA_LOG})
    for command in (Command("crc-node", cluster, 1_002, node, "test"), Command("crc-pod", cluster, 1_003, pod, "test")):
        producer.produce(topics.commands, encode(command.to_avro()), cluster.encode(),
                         on_delivery=lambda error, message: delivered.append(message.partition()))  # fmt: skip
    # 3. The right partition, but a key that is not the body's cluster.
    release = Command("bad-key", cluster, 1_004, Release("p1"), "test")
    producer.produce(topics.commands, encode(release.to_avro()), b"another-cluster", partition=home)
    assert producer.flush(30) == 0
    stray = delivered[0]
    assert delivered == [stray, stray] and stray != home, "the default partitioner must have used another partition"

    port = _free_port()
    with BackgroundProcessor(kafka_bootstrap, topics, instance_id="wrongpart", metrics_port=port,
                             metrics_every=0.1, stop_when_idle=3) as background:  # fmt: skip
        assert background.wait(120) == 0
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'gpufold_processor_refused_total{code="WRONG_PARTITION"} 3.0' in metrics
    assert background.runner.processor.refused() == {"WRONG_PARTITION": 3}

    letters = read_topic(kafka_bootstrap, topics.dead_letters)
    crc = [dead_letter(record.value) for record in letters[stray]]
    wanted = [(0, "WRONG_PARTITION", cluster.encode()), (1, "WRONG_PARTITION", cluster.encode())]
    assert [(d["offset"], d["code"], d["key"]) for d in crc] == wanted
    assert f"belongs on partition {home}" in crc[0]["error"]
    assert f"this record is on partition {stray}" in crc[0]["error"]
    keyed = [dead_letter(record.value) for record in letters[home]]
    assert [(d["offset"], d["code"], d["key"]) for d in keyed] == [(2, "WRONG_PARTITION", b"another-cluster")]
    assert "with key b'another-cluster'" in keyed[0]["error"]

    events = read_topic(kafka_bootstrap, topics.events)
    assert events[stray] == [], "nothing of the stray commands was folded"
    home_events = decode_events([record.value for record in events[home]])  # type: ignore[misc]
    assert {event.command_id for event in home_events} == {"ok-node", "ok-pod"}  # the wrong key released nothing
    assert [event.type_name for event in home_events if event.command_id == "ok-pod"][-1] == "PodScheduled"
    check_exactly_once(kafka_bootstrap, topics)


def test_a_changed_partition_count_stops_the_processor(kafka_bootstrap: str, caplog: pytest.LogCaptureFixture) -> None:
    """The group's committed offsets record the partition count; once the topic has more partitions (clusters
    now map elsewhere) the processor refuses to fold, says why, and exits non-zero."""
    topics = new_topics(kafka_bootstrap, "repartition", 2)
    group = topics.commands + ".group"
    stream = command_stream(200, clusters=4, seed=3)
    publish(kafka_bootstrap, topics, stream[:100])
    with BackgroundProcessor(kafka_bootstrap, topics, instance_id="repart", stop_when_idle=2) as background:
        assert background.wait(120) == 0
    reader = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group, "logger": RDKAFKA_LOG})
    try:
        committed = reader.committed([TopicPartition(topics.commands, p) for p in range(2)], 10)
    finally:
        reader.close()
    recorded = [parse_placement(tp.metadata) for tp in committed]
    assert [(placed.partitions, placed.checked_from) for placed in recorded if placed] == [(2, 0), (2, 0)]
    events_before = sum(len(records) for records in read_topic(kafka_bootstrap, topics.events).values())

    admin = AdminClient(kafka_config(kafka_bootstrap).client())
    admin.create_partitions([NewPartitions(topics.commands, 3)])[topics.commands].result(30)
    deadline = time.monotonic() + 30
    while len(admin.list_topics(topics.commands, timeout=10).topics[topics.commands].partitions) < 3:
        assert time.monotonic() < deadline, "the new partition did not show"
        time.sleep(0.2)
    publish(kafka_bootstrap, topics, stream[100:])
    refusing = BackgroundProcessor(kafka_bootstrap, topics, instance_id="repart", stop_when_idle=5)
    with caplog.at_level(logging.ERROR, logger="gpufold.processor"), refusing as background:
        assert background.wait(120) == 3
    refusal = [record.getMessage() for record in caplog.records if "refusing to fold" in record.getMessage()]
    assert refusal and "has 3 partitions, but had 2" in refusal[0] and "new commands topic" in refusal[0]
    events_after = sum(len(records) for records in read_topic(kafka_bootstrap, topics.events).values())
    assert events_after == events_before, "nothing was folded once the partition count changed"
