"""Which partition a trace's events, snapshots and state live on: the producers' partitioner."""

from __future__ import annotations

from aiokafka.partitioner import murmur2


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2, as in the Java client) picks."""
    hashed: int = murmur2(key)
    return (hashed & 0x7FFFFFFF) % partitions
