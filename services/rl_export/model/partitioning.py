"""Which partition a trace lives on: the producers' partitioner, named by a setting.

The join needs one thing from producers: that one trace's events land on the same partition
number of all three input topics. Any consistent partitioner gives that; which one depends on
the Kafka client a producer uses (``RL_EXPORT_PARTITIONER``):

========== ================================================ ===================================
setting    hash of the key                                  clients whose default it is
========== ================================================ ===================================
murmur2    ``(murmur2(key) & 0x7fffffff) % n``              Java, aiokafka, kafka-python,
                                                            KafkaJS, franz-go
crc32      ``crc32(key) % n``                               librdkafka (``consistent_random``):
                                                            confluent-kafka, node-rdkafka
fnv1a      ``abs(int32(fnv1a_32(key))) % n``                Sarama (``HashPartitioner``)
========== ================================================ ===================================

Everything rl-export produces (snapshots, replay chains, ``produce``, labels from the web
service) and the join's routing check use the configured one, so a trace's events, state and
snapshots meet in one partition.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Literal

from aiokafka.partitioner import murmur2 as _murmur2

Partitioner = Literal["murmur2", "crc32", "fnv1a"]
PARTITIONERS: tuple[Partitioner, ...] = ("murmur2", "crc32", "fnv1a")

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193
_MASK32 = 0xFFFFFFFF


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The Java client's default: murmur2, sign bit cleared."""
    hashed: int = _murmur2(key)
    return (hashed & 0x7FFFFFFF) % partitions


def crc32_partition(key: bytes, partitions: int) -> int:
    """librdkafka's ``consistent`` (and ``consistent_random`` for non-empty keys): CRC32."""
    return zlib.crc32(key) % partitions


def fnv1a_32(key: bytes) -> int:
    """FNV-1a, 32 bits (as Go's ``hash/fnv.New32a``)."""
    hashed = _FNV_OFFSET
    for byte in key:
        hashed = ((hashed ^ byte) * _FNV_PRIME) & _MASK32
    return hashed


def fnv1a_partition(key: bytes, partitions: int) -> int:
    """Sarama's ``HashPartitioner`` (and librdkafka's ``fnv1a``): the hash read as a signed
    32-bit integer, its absolute value modulo the partition count."""
    hashed = fnv1a_32(key)
    signed = hashed - (1 << 32) if hashed & 0x80000000 else hashed
    return abs(signed) % partitions


_HASHES: dict[str, Callable[[bytes, int], int]] = {
    "murmur2": murmur2_partition,
    "crc32": crc32_partition,
    "fnv1a": fnv1a_partition,
}


def partition_for(key: bytes, partitions: int, partitioner: Partitioner = "murmur2") -> int:
    """The partition ``partitioner`` picks for ``key`` among ``partitions``."""
    return _HASHES[partitioner](key, partitions)


def partition_function(partitioner: Partitioner) -> Callable[[bytes, int], int]:
    """``partition_for`` with the partitioner fixed: ``fn(key, partitions)``."""
    return _HASHES[partitioner]


def matching(key: bytes, partition: int, partitions: int) -> list[Partitioner]:
    """The partitioners that would have put ``key`` on ``partition`` (for diagnostics)."""
    return [name for name in PARTITIONERS if _HASHES[name](key, partitions) == partition]


def kafka_partitioner(
    partitioner: Partitioner,
) -> Callable[[bytes | None, list[int], list[int]], int]:
    """An aiokafka producer's ``partitioner=``: keyed messages go where ``partitioner`` says.

    aiokafka calls it with the serialised key and the topic's partition ids (0 .. n-1, in no
    promised order); messages without a key (rl-export never sends one to an input topic) go to
    the lowest available partition.
    """
    hashed = _HASHES[partitioner]

    def choose(key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return min(available or all_partitions)
        return hashed(key, len(all_partitions))

    return choose
