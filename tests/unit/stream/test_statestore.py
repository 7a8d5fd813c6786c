"""The join's per-partition stores and the changelog table, without a broker.

:class:`MemoryPartition` and :class:`RocksPartition` pass one contract; a RocksDB store keeps
its data and changelog position across reopening; :class:`ChangelogTable` holds a batch's
writes (and reads them back) until ``take_changes`` applies them to the right partition.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rl_export.stream.statestore import (
    ChangelogTable,
    MemoryPartition,
    PartitionStore,
    RocksPartition,
    StoreLockedError,
)


@dataclass(frozen=True)
class At:
    partition: int


@pytest.fixture(params=["memory", "rocks"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PartitionStore]:
    made: PartitionStore = (
        MemoryPartition() if request.param == "memory" else RocksPartition(tmp_path / "p0")
    )
    yield made
    made.close()


# --- the store contract -----------------------------------------------------------------


def test_a_new_store_is_empty_at_position_zero(store: PartitionStore) -> None:
    assert store.get(b"a") is None
    assert list(store.items()) == []
    assert store.count() == 0
    assert store.changelog_next == 0


def test_put_get_and_delete(store: PartitionStore) -> None:
    store.put(b"a", b"1")
    store.put(b"b", b"2")
    store.put(b"a", b"3")
    assert store.get(b"a") == b"3"
    assert store.get(b"b") == b"2"
    store.delete(b"a")
    store.delete(b"missing")  # deleting an absent key is not an error
    assert store.get(b"a") is None
    assert sorted(store.items()) == [(b"b", b"2")]


def test_get_many_reads_keys_together_in_order(store: PartitionStore) -> None:
    store.write({b"a": b"1", b"c": b"3"})
    assert store.get_many([b"c", b"missing", b"a"]) == [b"3", None, b"1"]
    assert store.get_many([]) == []


def test_write_applies_puts_and_deletes(store: PartitionStore) -> None:
    store.put(b"old", b"x")
    store.put(b"kept", b"y")
    store.write({b"new": b"1", b"old": None, b"kept": b"z", b"never": None})
    assert sorted(store.items()) == [(b"kept", b"z"), (b"new", b"1")]
    assert store.get(b"old") is None


def test_count_follows_distinct_keys(store: PartitionStore) -> None:
    # RocksPartition.count is RocksDB's estimate: exact for distinct puts and real deletes.
    for i in range(5):
        store.put(b"k%d" % i, b"v")
    assert store.count() == 5
    store.delete(b"k0")
    assert store.count() == 4


def test_set_changelog_next(store: PartitionStore) -> None:
    store.set_changelog_next(42)
    assert store.changelog_next == 42


def test_clear_wipes_data_and_position(store: PartitionStore) -> None:
    store.put(b"a", b"1")
    store.set_changelog_next(9)
    store.clear()
    assert list(store.items()) == []
    assert store.get(b"a") is None
    assert store.changelog_next == 0
    store.put(b"b", b"2")  # still usable afterwards
    assert store.get(b"b") == b"2"


# --- RocksDB persistence ----------------------------------------------------------------


def test_the_expiry_index_is_written_with_the_states(store: PartitionStore) -> None:
    assert store.indexed  # a new store's index is complete: it holds nothing
    store.write({b"a": b"1", b"b": b"2"}, {b"a": b"orphan 1.0"})
    store.write({b"b": None}, {b"b": None, b"c": b"tombstone 2.0"})
    assert sorted(store.marks()) == [(b"a", b"orphan 1.0"), (b"c", b"tombstone 2.0")]
    store.write({}, {b"a": None})
    assert list(store.marks()) == [(b"c", b"tombstone 2.0")]
    store.clear()
    assert list(store.marks()) == []


def test_rocks_keeps_its_expiry_index_across_reopen(tmp_path: Path) -> None:
    first = RocksPartition(tmp_path / "p0")
    first.write({b"a": b"1"}, {b"a": b"orphan 1.0"})
    first.close()
    again = RocksPartition(tmp_path / "p0")
    try:
        assert again.indexed
        assert list(again.marks()) == [(b"a", b"orphan 1.0")]
    finally:
        again.close()


_KILLED_WHILE_CLOSING = """
import os, sys
from pathlib import Path
from rl_export.stream.statestore import RocksPartition

left = int(sys.argv[2])  # flushes and closes that run before the SIGKILL

class Dying:
    def __init__(self, handle):
        self.handle = handle

    def __getattr__(self, name):
        attr = getattr(self.handle, name)
        if name not in ("flush", "close"):
            return attr

        def step(*args, **kwargs):
            global left
            if left == 0:
                os.kill(os.getpid(), 9)
            left -= 1
            return attr(*args, **kwargs)

        return step

store = RocksPartition(Path(sys.argv[1]))
store.write({b"a": b"1"}, {b"a": b"orphan 1.0"})
store.set_changelog_next(42)
store.db, store.meta, store.expiry = Dying(store.db), Dying(store.meta), Dying(store.expiry)
store.close()
os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 4])
def test_a_store_killed_while_closing_never_has_its_position_ahead(
    tmp_path: Path, steps: int
) -> None:
    """Closing a column family's handle flushes it alone: the states go first, the position
    last, so a kill anywhere in close() leaves the states at or ahead of the position."""
    import subprocess
    import sys

    path = tmp_path / "p0"
    run = subprocess.run([sys.executable, "-c", _KILLED_WHILE_CLOSING, str(path), str(steps)],
                         check=False)  # fmt: skip
    assert run.returncode == -9
    store = RocksPartition(path)
    try:
        if store.changelog_next == 42:
            assert store.get(b"a") == b"1"
        else:
            assert store.changelog_next == 0
    finally:
        store.close()


def test_a_store_written_before_the_expiry_index_says_so(tmp_path: Path) -> None:
    """An older store (states, a position, no expiry column family) is not ``indexed``: the
    join scans it once and marks it."""
    from rocksdict import Options, Rdict

    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    old = Rdict(str(tmp_path / "p0"), options, column_families={"meta": Options(raw_mode=True)})
    old.put(b"a", b"1")
    meta = old.get_column_family("meta")
    meta.put(b"changelog_next", b"7")
    meta.close()
    old.close()

    store = RocksPartition(tmp_path / "p0")
    try:
        assert not store.indexed
        assert store.changelog_next == 7
        assert store.get(b"a") == b"1"
        store.set_indexed()
    finally:
        store.close()
    store = RocksPartition(tmp_path / "p0")
    try:
        assert store.indexed
    finally:
        store.close()


def test_rocks_keeps_data_and_position_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "partition-3"
    first = RocksPartition(path)
    first.write({b"a": b"1", b"b": b"2"})
    first.delete(b"b")
    first.set_changelog_next(17)
    first.close()

    second = RocksPartition(path)
    try:
        assert list(second.items()) == [(b"a", b"1")]
        assert second.changelog_next == 17
    finally:
        second.close()


def test_rocks_clear_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "partition-0"
    first = RocksPartition(path)
    first.put(b"a", b"1")
    first.set_changelog_next(5)
    first.clear()
    first.close()

    second = RocksPartition(path)
    try:
        assert list(second.items()) == []
        assert second.changelog_next == 0
    finally:
        second.close()


def test_a_store_open_elsewhere_is_reported_as_locked_and_opens_once_closed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "partition-1"
    first = RocksPartition(path)
    with pytest.raises(StoreLockedError, match="open in another process"):
        RocksPartition(path)
    first.close()
    RocksPartition(path).close()


# --- ChangelogTable ---------------------------------------------------------------------


@pytest.fixture
def table(tmp_path: Path) -> Iterator[ChangelogTable]:
    made = ChangelogTable("memory://", tmp_path)
    made.open(0)
    made.open(1)
    yield made
    made.close_all()


def test_held_writes_are_read_back_but_not_stored(table: ChangelogTable) -> None:
    table.stores[0].put(b"gone", b"old")
    table.put(b"a", b"1", At(0))
    table.delete(b"gone", At(0))
    assert table.get(b"a", At(0)) == b"1"
    assert table.get(b"gone", At(0)) is None  # the held delete hides the stored value
    assert table.stores[0].get(b"a") is None
    assert table.stores[0].get(b"gone") == b"old"


def test_take_changes_applies_the_last_write_per_key(table: ChangelogTable) -> None:
    table.stores[1].put(b"gone", b"old")
    table.put(b"a", b"1", At(0))
    table.put(b"a", b"2", At(0))
    table.put(b"b", b"x", At(1))
    table.delete(b"gone", At(1))

    assert table.take_changes() == {0: {b"a": b"2"}, 1: {b"b": b"x", b"gone": None}}
    assert list(table.stores[0].items()) == [(b"a", b"2")]
    assert list(table.stores[1].items()) == [(b"b", b"x")]
    assert table.take_changes() == {}
    assert len(table) == 2


def test_the_expiry_index_goes_to_the_store_not_to_the_changelog(table: ChangelogTable) -> None:
    table.put(b"a", b"1", At(0))
    table.mark(b"a", b"orphan 1.0", At(0))
    table.mark(b"z", None, At(1))  # a mark alone still reaches its store
    assert table.take_changes() == {0: {b"a": b"1"}}
    assert list(table.stores[0].marks()) == [(b"a", b"orphan 1.0")]
    assert list(table.stores[1].marks()) == []


def test_writes_are_routed_by_the_message_partition(table: ChangelogTable) -> None:
    table.put(b"k", b"zero", At(0))
    table.put(b"k", b"one", At(1))
    assert table.get(b"k", At(0)) == b"zero"
    assert table.get(b"k", At(1)) == b"one"
    table.take_changes()
    assert table.stores[0].get(b"k") == b"zero"
    assert table.stores[1].get(b"k") == b"one"
    assert sorted(table.items()) == [(b"k", b"one"), (b"k", b"zero")]


def test_the_worker_message_type_names_the_partition(table: ChangelogTable) -> None:
    from rl_export.stream.processor import InMessage

    message = InMessage(topic="t", partition=1, offset=0, key=b"k", value=b"{}")
    table.put(b"k", b"v", message)
    assert table.take_changes() == {1: {b"k": b"v"}}


def test_close_drops_the_store_and_its_held_changes(table: ChangelogTable) -> None:
    table.put(b"a", b"1", At(0))
    table.put(b"b", b"2", At(1))
    table.close(0)
    assert 0 not in table.stores
    assert table.take_changes() == {1: {b"b": b"2"}}
    table.close(0)  # closing an unowned partition is a no-op


class CountingStore(MemoryPartition):
    """Counts the reads that reach the store."""

    def __init__(self) -> None:
        super().__init__()
        self.gets: list[bytes] = []

    def get(self, key: bytes) -> bytes | None:
        self.gets.append(key)
        return super().get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        self.gets += keys
        return super().get_many(keys)


def test_a_prefetch_reads_a_batch_once_and_its_gets_find_it(table: ChangelogTable) -> None:
    store = table.stores[0] = CountingStore()
    store.write({b"a": b"1", b"b": b"2"})
    table.put(b"w", b"held", At(0))  # the batch's own write: never read from the store
    table.prefetch({0: [b"a", b"new", b"w", b"a"]})
    assert store.gets == [b"a", b"new"]  # once each, together
    assert table.get(b"a", At(0)) == b"1"
    assert table.get(b"new", At(0)) is None  # known to be absent: not read again
    assert table.get(b"w", At(0)) == b"held"
    assert table.get(b"b", At(0)) == b"2"  # not prefetched: read alone
    assert store.gets == [b"a", b"new", b"b"]
    table.prefetch({0: [b"a"]})  # now in the read cache
    assert store.gets == [b"a", b"new", b"b"]


def test_what_the_cache_held_at_the_prefetch_is_not_read_again_when_the_cache_turns_over(
    tmp_path: Path,
) -> None:
    table = ChangelogTable("memory://", tmp_path, cache_bytes=1_000)
    store = table.stores[0] = CountingStore()
    store.write({b"a": b"1", b"b": b"2"})
    table.prefetch({0: [b"a", b"b"]})
    table.get(b"a", At(0))
    table.get(b"b", At(0))
    table.take_changes()  # the next batch: a and b are in the read cache
    table.prefetch({0: [b"a", b"b", b"c"]})
    assert store.gets == [b"a", b"b", b"c"]  # only c was read
    for n in range(20):  # the batch's other lookups drop both generations
        table.cache.put(f"other{n}".encode(), b"x" * 100)
    assert table.cache.split([b"a", b"b"]) == ({}, [b"a", b"b"])
    assert table.get(b"a", At(0)) == b"1"
    assert table.get(b"b", At(0)) == b"2"
    assert store.gets == [b"a", b"b", b"c"]  # pinned by the prefetch, not read one by one


def test_the_read_cache_splits_keys_into_what_it_holds_and_what_it_does_not() -> None:
    from rl_export.stream.statestore import ReadCache

    cache = ReadCache(limit_bytes=10_000)
    cache.put(b"old", b"1")
    cache._old, cache._young = cache._young, {}  # a generation later
    cache.put(b"young", b"2")
    held, missing = cache.split([b"x", b"young", b"old", b"x", b"y"])
    assert held == {b"young": b"2", b"old": b"1"}
    assert missing == [b"x", b"y"]  # each once, in order
    assert b"old" not in cache._young  # a split moves nothing


def test_a_write_after_the_prefetch_wins_and_the_prefetch_ends_with_the_batch(
    table: ChangelogTable,
) -> None:
    store = table.stores[0] = CountingStore()
    store.write({b"a": b"old"})
    table.prefetch({0: [b"a", b"b"]})
    table.put(b"a", b"new", At(0))
    assert table.get(b"a", At(0)) == b"new"
    table.take_changes()
    store.put(b"b", b"restored")  # e.g. by a restore between two batches
    assert table.get(b"b", At(0)) == b"restored"  # not the absence prefetched before


def test_rocksdb_tables_keep_a_store_per_partition(tmp_path: Path) -> None:
    table = ChangelogTable("rocksdb://", tmp_path)
    try:
        store = table.open(2)
        assert isinstance(store, RocksPartition)
        assert store.path == tmp_path / "partition-2"
        assert table.open(2) is store
        table.put(b"a", b"1", At(2))
        table.take_changes()
        assert store.get(b"a") == b"1"
    finally:
        table.close_all()


def test_the_read_cache_keeps_the_newest_values_within_its_budget() -> None:
    from rl_export.stream.statestore import ReadCache

    cache = ReadCache(limit_bytes=10_000)
    for n in range(200):
        cache.put(f"k{n}".encode(), b"x" * 100)
    assert cache.get(b"k199") == b"x" * 100  # the newest are kept
    assert cache.get(b"k0") is None  # the oldest went with a generation
    held = sum(cache.get(f"k{n}".encode()) is not None for n in range(200))
    assert 10_000 // 2 // 210 <= held <= 10_000 // 200  # between half and all of the budget
    cache.discard(b"k199")
    assert cache.get(b"k199") is None
    cache.clear()
    assert cache.get(b"k198") is None
    assert ReadCache(0).get(b"k") is None


def test_the_table_never_serves_a_stale_value_from_its_cache(tmp_path: Path) -> None:
    from rl_export.stream.statestore import ChangelogTable

    table = ChangelogTable("rocksdb://", tmp_path, cache_bytes=1 << 20)
    store = table.open(0)

    class At:
        partition = 0

    at = At()
    table.put(b"a", b"1", at)
    assert table.get(b"a", at) == b"1"  # the batch's own write
    table.take_changes()
    assert table.get(b"a", at) == b"1"
    table.put(b"a", b"2", at)
    table.take_changes()
    assert table.get(b"a", at) == b"2"  # written through
    table.delete(b"a", at)
    table.take_changes()
    assert table.get(b"a", at) is None
    store.put(b"b", b"before")
    assert table.get(b"b", at) == b"before"  # now cached
    # A restore writes to a store it has just opened; opening empties the cache.
    table.close(0)
    store = table.open(0)
    store.put(b"b", b"restored")
    assert table.get(b"b", at) == b"restored"
    table.close_all()
