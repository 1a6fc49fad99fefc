"""Which partition a command goes to: Kafka's default partitioner, so local and Kafka logs agree.

Kafka's Java producer (and librdkafka with ``partitioner=murmur2``) maps a keyed
record to ``(murmur2(key) & 0x7fffffff) % partitions``. Using the same function
here means a cluster lands on the same partition number in the embedded log and
on a Kafka topic with the same partition count, on every machine (no salted
``hash()``). Note librdkafka's own default is ``consistent_random`` (CRC32): a
confluent-kafka producer must set ``partitioner: murmur2_random`` (or pass the
partition computed here) to agree.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: the 32-bit MurmurHash2 of the bytes, as a signed Java int. O(len)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    end = length - length % 4
    for i in range(0, end, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = length % 4
    if tail == 3:
        h ^= data[end + 2] << 16
    if tail >= 2:
        h ^= data[end + 1] << 8
    if tail >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for a non-null key."""
    if partitions < 1:
        raise ValueError(f"partition count must be >= 1, got {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def cluster_partition(cluster: str, partitions: int) -> int:
    """The partition of a cluster's commands (the key is the cluster name in UTF-8)."""
    return partition_for(cluster.encode(), partitions)
