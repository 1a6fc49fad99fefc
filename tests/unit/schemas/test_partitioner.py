"""Kafka's murmur2 partitioner: the same cluster maps to the same partition locally and on Kafka."""

from __future__ import annotations

import confluent_kafka
import pytest

from schemas.partitioner import cluster_partition, murmur2, partition_for

# From Kafka's own tests (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2)
# and from the values other Kafka clients check against the Java implementation.
KAFKA_MURMUR2 = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
    (b"1", -1993445489),
    (b"12", 126087238),
    (b"123", -267702483),
    (b"1234", -1614185708),
    (b"12345", -1188365604),
]


@pytest.mark.parametrize(("key", "expected"), KAFKA_MURMUR2)
def test_murmur2_matches_kafka(key: bytes, expected: int) -> None:
    """murmur2 returns the signed 32-bit value of Kafka's Utils.murmur2 for every tail length."""
    assert murmur2(key) == expected


def test_partition_is_positive_murmur2_mod_count() -> None:
    """The partition is toPositive(murmur2(key)) % partitions, as in Kafka's BuiltInPartitioner."""
    assert partition_for(b"foobar", 7) == (-790332482 & 0x7FFFFFFF) % 7
    assert cluster_partition("foobar", 7) == partition_for(b"foobar", 7)
    assert {partition_for(b"any", 1)} == {0}


def test_partition_count_must_be_positive() -> None:
    """Zero partitions is a caller error, not a division by zero."""
    with pytest.raises(ValueError, match=">= 1"):
        partition_for(b"x", 0)


def test_librdkafka_murmur2_partitioner_agrees() -> None:
    """A confluent-kafka producer with partitioner=murmur2 (on librdkafka's mock cluster) picks the same partitions."""
    producer = confluent_kafka.Producer({"test.mock.num.brokers": 1, "partitioner": "murmur2", "log_level": 0})
    delivered: dict[bytes, int] = {}
    keys = [f"cluster-{i}".encode() for i in range(64)] + [b"", b"lab", "gpu-\u00e9".encode()]
    for key in keys:
        producer.produce(
            "partitioned", key=key, value=b"x", on_delivery=lambda _e, m: delivered.update({m.key(): m.partition()})
        )
    assert producer.flush(10) == 0
    partitions = len(producer.list_topics("partitioned", timeout=5).topics["partitioned"].partitions)
    assert partitions > 1
    assert delivered == {key: partition_for(key, partitions) for key in keys}
