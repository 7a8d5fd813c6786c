"""The three partitioners: published test vectors for the hashes, and how they route keys.

The integration tests (tests/integration/stream/test_clients.py) check each one against the
partition librdkafka itself picks for the same key.
"""

from __future__ import annotations

import zlib

import pytest

from rl_export.model.partitioning import (
    PARTITIONERS,
    fnv1a_32,
    fnv1a_partition,
    kafka_partitioner,
    matching,
    partition_for,
)


@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"", 0x811C9DC5), (b"a", 0xE40C292C), (b"foobar", 0xBF9CF968)],
)
def test_fnv1a_32_matches_the_published_vectors(data: bytes, expected: int) -> None:
    assert fnv1a_32(data) == expected


def test_crc32_is_the_ieee_polynomial() -> None:
    assert zlib.crc32(b"123456789") == 0xCBF43926  # the CRC-32 check value
    assert partition_for(b"123456789", 1000, "crc32") == 0xCBF43926 % 1000


def test_fnv1a_reads_the_hash_as_a_signed_32_bit_integer_as_sarama_does() -> None:
    # 0xBF9CF968 has its top bit set: int32 is -1080231576, Sarama takes its absolute value.
    assert fnv1a_partition(b"foobar", 7) == 1080231576 % 7
    assert fnv1a_partition(b"foobar", 7) != 0xBF9CF968 % 7


@pytest.mark.parametrize(
    ("data", "java_int"),
    [(b"21", -973932308), (b"foobar", -790332482), (b"abc", 479470107)],
)
def test_murmur2_matches_the_java_clients_vectors(data: bytes, java_int: int) -> None:
    """Kafka's own UtilsTest.testMurmur2 values (a Java int), sign bit cleared, modulo n."""
    assert partition_for(data, 1000, "murmur2") == (java_int & 0x7FFFFFFF) % 1000


@pytest.mark.parametrize("name", PARTITIONERS)
def test_every_partitioner_is_deterministic_and_in_range(name: str) -> None:
    keys = [f"tr-{i:08d}".encode() for i in range(500)]
    first = [partition_for(k, 8, name) for k in keys]  # type: ignore[arg-type]
    assert first == [partition_for(k, 8, name) for k in keys]  # type: ignore[arg-type]
    assert set(first) == set(range(8))  # 500 keys reach every one of 8 partitions


def test_the_partitioners_disagree_on_most_keys() -> None:
    keys = [f"tr-{i:08d}".encode() for i in range(200)]
    same = sum(partition_for(k, 8, "murmur2") == partition_for(k, 8, "crc32") for k in keys)
    assert same < 60  # about 1 in 8 by chance


def test_matching_names_the_partitioners_that_would_route_a_key_there() -> None:
    key = b"tr-00000001"
    partition = partition_for(key, 8, "crc32")
    assert "crc32" in matching(key, partition, 8)
    assert all(partition_for(key, 8, n) == partition for n in matching(key, partition, 8))


def test_the_aiokafka_partitioner_routes_keys_and_sends_keyless_messages_somewhere() -> None:
    choose = kafka_partitioner("fnv1a")
    assert choose(b"foobar", [0, 1, 2, 3, 4, 5, 6], [0, 1]) == fnv1a_partition(b"foobar", 7)
    assert choose(None, [0, 1, 2], [2, 1]) == 1
