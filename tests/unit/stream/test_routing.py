"""What the join says about events that arrive on another partition than their trace's."""

from __future__ import annotations

import random

from rl_export.model.partitioning import partition_for
from rl_export.stream.routing import NO_MATCH, MisrouteLog

PARTITIONS = 8


def test_fnv1a_traffic_is_named() -> None:
    log = MisrouteLog("murmur2", PARTITIONS)
    keys = [f"tr-{n}".encode() for n in range(300)]
    noted = 0
    for key in keys:
        arrived = partition_for(key, PARTITIONS, "fnv1a")
        if arrived != partition_for(key, PARTITIONS, "murmur2"):
            log.note(key, arrived, now=100.0)
            noted += 1
    assert log.report(now=159.0) is None  # once a minute
    warning = log.report(now=161.0)
    assert warning is not None
    assert warning.startswith(f"{noted} events in the last 61s arrived on another partition")
    assert "RL_EXPORT_PARTITIONER=murmur2" in warning
    assert warning.endswith("RL_EXPORT_PARTITIONER=fnv1a would route these events directly")
    assert log.report(now=400.0) is None  # nothing since the last warning


def test_random_partitions_match_no_one_partitioner() -> None:
    log = MisrouteLog("murmur2", PARTITIONS)
    rng = random.Random(5)
    labels = []
    for n in range(400):
        key = f"tr-{n}".encode()
        arrived = rng.randrange(PARTITIONS)
        if arrived != partition_for(key, PARTITIONS):
            labels.append(log.note(key, arrived, now=0.0))
    assert labels.count(NO_MATCH) > len(labels) / 2
    warning = log.report(now=60.0)
    assert warning is not None
    assert "match no one partitioner" in warning
    assert "would route" not in warning
