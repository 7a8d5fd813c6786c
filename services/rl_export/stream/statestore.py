"""The join's table: one key-value store per partition, backed by a compacted changelog topic.

The table maps ``trace_id`` bytes to a serialised :class:`~rl_export.stream.join.TraceState`. Each
input partition the worker owns has its own store (RocksDB through rocksdict in production,
a dict in tests and with ``RL_EXPORT_STATE_STORE=memory://``), and every write is also sent
to the same partition of the changelog topic, so that any worker can rebuild a partition.

How the pieces keep each other right:

* The join writes the store first and queues the changelog record; the batch's producer
  flush waits for the changelog acknowledgements before the input offsets are committed.
  A crash before that commit redelivers the batch, and the join rewrites every state it
  touches (a redelivered event rewrites its state too), so the changelog catches up.
* Each store remembers ``changelog_next``: the changelog offset after the last record it
  reflects (set only from acknowledged writes, so it never runs ahead of the store).
* On assignment a partition is restored by reading its changelog from ``changelog_next``
  to the end. A store that is ahead of the changelog (the topic was recreated) or that has
  data but no position is wiped and rebuilt from the beginning.
* Beside the states each store keeps the *expiry index*: for the few states that may expire
  (orphans, tombstones), why and since when (``mark``). It is written in the same atomic
  write as the states, and rebuilt from the restored values when the changelog is replayed,
  so a restart reads it instead of every state. A store written before it had the index
  (``indexed`` false) gets it from one scan.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition

from rl_export.kafka.client import KafkaConnection, connection_of
from rl_export.kafka.retrying import stop_quietly

log = logging.getLogger(__name__)

_POSITION_KEY = b"changelog_next"
_INDEXED_KEY = b"expiry_indexed"  # the expiry column family is complete


class At(Protocol):
    """The message a table access belongs to (the join's ``InMessage``): it names the partition."""

    @property
    def partition(self) -> int: ...


Changes = dict[bytes, bytes | None]
"""Writes to a store: a value, or None to delete the key."""


class PartitionStore(Protocol):
    """The state of one partition, with its changelog position and expiry index."""

    changelog_next: int
    indexed: bool  # the expiry index is complete

    def get(self, key: bytes) -> bytes | None: ...
    def get_many(self, keys: list[bytes]) -> list[bytes | None]: ...
    def put(self, key: bytes, value: bytes) -> None: ...
    def delete(self, key: bytes) -> None: ...
    def write(self, changes: Changes, marks: Changes | None = None) -> None: ...
    def items(self) -> Iterator[tuple[bytes, bytes]]: ...
    def marks(self) -> Iterator[tuple[bytes, bytes]]: ...
    def count(self) -> int: ...
    def set_changelog_next(self, offset: int) -> None: ...
    def set_indexed(self) -> None: ...
    def clear(self) -> None: ...
    def close(self) -> None: ...


class MemoryPartition:
    """A dict: nothing survives the process, so every assignment restores from offset 0."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.expiry: dict[bytes, bytes] = {}
        self.changelog_next = 0
        self.indexed = True

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return [self.data.get(key) for key in keys]

    def put(self, key: bytes, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: bytes) -> None:
        self.data.pop(key, None)

    def write(self, changes: Changes, marks: Changes | None = None) -> None:
        for target, writes in ((self.data, changes), (self.expiry, marks or {})):
            for key, value in writes.items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        yield from list(self.data.items())

    def marks(self) -> Iterator[tuple[bytes, bytes]]:
        yield from list(self.expiry.items())

    def count(self) -> int:
        return len(self.data)

    def set_changelog_next(self, offset: int) -> None:
        self.changelog_next = offset

    def set_indexed(self) -> None:
        self.indexed = True

    def clear(self) -> None:
        self.data.clear()
        self.expiry.clear()
        self.changelog_next = 0

    def close(self) -> None:
        self.data.clear()
        self.expiry.clear()


class StoreLockedError(Exception):
    """Another process has the partition's RocksDB open (a sibling join process that has
    not yet let go of a partition the group moved to us)."""


MIB = 1024 * 1024
# What every partition's RocksDB of a process shares: memtables are bounded together (the
# write buffer manager flushes the largest when the sum passes its limit) and so are the
# cached blocks, however many partitions the process owns.
_MEMTABLES_MIB = 8
_BLOCK_CACHE_MIB = 8
_shared: dict[str, Any] = {}


def _rocks_options() -> Any:
    """The options of a partition's store (created once per process, then shared).

    * Bloom filters in the SST files: a trace seen for the first time (a miss) costs about
      a microsecond instead of ten, and a catching-up join sees one in every four or five
      events. (Not in the memtables: each new memtable zeroes its filter, which cost more
      than the misses it saved.)
    * No write-ahead log: the changelog topic is the durable copy (as in Kafka Streams). A
      crash loses the writes not yet flushed, data and position alike, because the column
      families flush together (atomic flush); restore replays the rest.
    * No compression: the states are small and rewritten often; snappy on every flush cost
      the join more CPU than the disk it saved is worth.
    * Level 0 is compacted at eight files, not four: states are rewritten often, so each
      compaction merges away more overwritten versions. On the small shape in process
      (``make profile``) the compaction thread's CPU fell from 0.55 to 0.22-0.29 s per
      110,000 events (about 3 µs per event); reads, which now check up to eight level-0
      files' bloom filters, cost no measurable more.
    """
    from rocksdict import (
        BlockBasedOptions,
        Cache,
        DBCompressionType,
        Options,
        WriteBufferManager,
    )

    if "options" not in _shared:
        cache = _shared["cache"] = Cache(_BLOCK_CACHE_MIB * MIB)
        manager = _shared["manager"] = WriteBufferManager(_MEMTABLES_MIB * MIB, False)
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)
        table.set_block_cache(cache)
        # Index and filter blocks in the (bounded) cache too, not beside it.
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        options.set_atomic_flush(True)
        options.set_block_based_table_factory(table)
        options.set_write_buffer_size(4 * MIB)
        options.set_compression_type(DBCompressionType.none())
        options.set_write_buffer_manager(manager)
        options.set_level_zero_file_num_compaction_trigger(8)
        _shared["options"] = options
    return _shared["options"]


class RocksPartition:
    """RocksDB (rocksdict) in ``path``; the changelog position and the ``indexed`` flag live in
    the ``meta`` column family, the expiry index in ``expiry``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._open()

    def _open(self) -> None:
        from rocksdict import Options, Rdict, WriteOptions

        try:
            self.db = Rdict(
                str(self.path), _rocks_options(),
                column_families={"meta": Options(raw_mode=True),
                                 "expiry": Options(raw_mode=True)},
            )  # fmt: skip
        except Exception as exc:  # rocksdict raises a bare Exception with RocksDB's message
            if str(self.path / "LOCK") in str(exc):  # its lock file is taken
                raise StoreLockedError(f"{self.path} is open in another process") from exc
            raise
        unlogged = WriteOptions()
        unlogged.disable_wal = True  # type: ignore[method-assign,assignment] # a property
        self.db.set_write_options(unlogged)
        self.meta = self.db.get_column_family("meta")
        self.expiry = self.db.get_column_family("expiry")
        stored = self.meta.get(_POSITION_KEY)
        self.changelog_next = 0 if stored is None else int(stored)
        self.indexed = self.meta.get(_INDEXED_KEY) is not None
        if not self.indexed and next(iter(self.db.keys()), None) is None:
            self.set_indexed()  # empty: nothing to index

    def _estimate(self) -> int:
        value = self.db.property_int_value("rocksdb.estimate-num-keys")
        return int(value or 0)

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self.db.get(key)
        return value

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """One multi-get: RocksDB looks the keys up together (None where a key is not)."""
        values = self.db.get(list[Any](keys))  # a list in, a list out
        assert isinstance(values, list)
        return values

    def put(self, key: bytes, value: bytes) -> None:
        self.db.put(key, value)

    def delete(self, key: bytes) -> None:
        self.db.delete(key)

    def write(self, changes: Changes, marks: Changes | None = None) -> None:
        """Apply a batch's writes, states and expiry index, in one atomic RocksDB write."""
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for key, value in changes.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        if marks:
            expiry = self.db.get_column_family_handle("expiry")
            for key, value in marks.items():
                if value is None:
                    batch.delete(key, expiry)
                else:
                    batch.put(key, value, expiry)
        self.db.write(batch)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        yield from self.db.items()

    def marks(self) -> Iterator[tuple[bytes, bytes]]:
        yield from self.expiry.items()

    def count(self) -> int:
        return self._estimate()  # RocksDB's estimate: exact counts need a full scan

    def set_changelog_next(self, offset: int) -> None:
        self.meta.put(_POSITION_KEY, str(offset).encode())
        self.changelog_next = offset

    def set_indexed(self) -> None:
        self.meta.put(_INDEXED_KEY, b"1")
        self.indexed = True

    def clear(self) -> None:
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self._open()

    def close(self) -> None:
        """Flush and close: the states first, the changelog position last.

        Closing a column family's handle flushes that column family alone, and the handles
        hold the database (and its lock) too, so they are closed before it. A process killed
        between two of these steps must never leave a position ahead of the states it
        covers (the restore would then skip them: the soak lost states that way); states
        ahead of their position are only applied again.
        """
        self.db.flush()
        self.expiry.close()
        self.meta.close()
        self.db.close()


class ReadCache:
    """The table's recently read and written values, bounded in bytes (two generations).

    A RocksDB read from Python costs microseconds (the binding, then the memtables and the
    files); a trace's state and conversation are read again whenever another of its events
    comes. Values go into a young generation; when it holds half the budget it becomes the
    old one and the previous old one is dropped, so the cache keeps between half and all of
    the budget of the most recent values, at the cost of two dict lookups.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self._young: dict[bytes, bytes] = {}
        self._old: dict[bytes, bytes] = {}
        self._young_bytes = 0

    def get(self, key: bytes) -> bytes | None:
        value = self._young.get(key)
        if value is None:
            value = self._old.get(key)
            if value is not None:
                self.put(key, value)
        return value

    def put(self, key: bytes, value: bytes) -> None:
        if self.limit <= 0:
            return
        self._young[key] = value
        self._young_bytes += len(value) + len(key) + 100  # the dict entry and the objects
        if self._young_bytes >= self.limit // 2:
            self._old, self._young, self._young_bytes = self._young, {}, 0

    def split(self, keys: Iterable[bytes]) -> tuple[dict[bytes, bytes], list[bytes]]:
        """What it holds of the keys, and the keys it does not hold (each once, in order).

        Nothing moves to the young generation: a lookup does that when it comes.
        """
        young, old = self._young, self._old
        held: dict[bytes, bytes] = {}
        missing: list[bytes] = []
        for key in dict.fromkeys(keys):
            value = young.get(key)
            if value is None:
                value = old.get(key)
            if value is None:
                missing.append(key)
            else:
                held[key] = value
        return held, missing

    def discard(self, key: bytes) -> None:
        self._young.pop(key, None)
        self._old.pop(key, None)

    def clear(self) -> None:
        self._young, self._old, self._young_bytes = {}, {}, 0


class ChangelogTable:
    """The join's table (a :class:`~rl_export.stream.processor.StateTable`) over owned partitions.

    A batch's writes are held (and read back) here until :meth:`take_changes`, called once
    per batch, writes them to each partition's store in one atomic write and hands them to
    the producer for the changelog (the last value per key wins). Reads go through a
    :class:`ReadCache` of ``cache_bytes``, emptied whenever a partition is opened or closed
    (restoring a partition writes to its store directly). What the cache does not hold of a
    batch's keys is read in one multi-get per partition (:meth:`prefetch`) and kept until
    the batch's :meth:`take_changes`.
    """

    def __init__(self, state_store: str, data_dir: Path, cache_bytes: int = 4 * MIB) -> None:
        self.state_store = state_store
        self.data_dir = data_dir
        self.stores: dict[int, PartitionStore] = {}
        self._changes: dict[int, Changes] = {}
        self._marks: dict[int, Changes] = {}
        self._prefetched: dict[int, dict[bytes, bytes | None]] = {}
        self.cache = ReadCache(cache_bytes)

    def open(self, partition: int) -> PartitionStore:
        store = self.stores.get(partition)
        if store is None:
            self.cache.clear()
            if self.state_store == "memory://":
                store = MemoryPartition()
            else:
                store = RocksPartition(self.data_dir / f"partition-{partition}")
            self.stores[partition] = store
        return store

    def close(self, partition: int) -> None:
        store = self.stores.pop(partition, None)
        self._changes.pop(partition, None)
        self._prefetched.pop(partition, None)
        self.cache.clear()
        self._marks.pop(partition, None)
        if store is not None:
            store.close()

    def close_all(self) -> None:
        for partition in list(self.stores):
            self.close(partition)

    def get(self, key: bytes, at: At) -> bytes | None:
        changes = self._changes.get(at.partition)
        if changes is not None and key in changes:
            return changes[key]
        prefetched = self._prefetched.get(at.partition)
        if prefetched is not None and key in prefetched:
            value = prefetched.pop(key)
            if value is not None:
                self.cache.put(key, value)
            return value
        value = self.cache.get(key)
        if value is None:
            value = self.stores[at.partition].get(key)
            if value is not None:
                self.cache.put(key, value)
        return value

    def prefetch(self, keys: Mapping[int, Iterable[bytes]]) -> None:
        """Read a batch's keys (per partition) that neither its writes nor the cache hold.

        One multi-get per partition. The values wait for the batch's :meth:`get` (which
        moves them to the cache) until :meth:`take_changes` or the next prefetch; a key that
        is not in the store waits as None. What the cache held waits beside them: the
        batch's own lookups fill the cache and may drop its older half before they come
        to those keys, which would then be read from the store one by one.
        """
        self._prefetched = {}
        for partition, wanted in keys.items():
            changes = self._changes.get(partition, {})
            cached, missing = self.cache.split(k for k in wanted if k not in changes)
            held: dict[bytes, bytes | None] = dict(cached)
            if missing:
                values = self.stores[partition].get_many(missing)
                held.update(zip(missing, values, strict=True))
            if held:
                self._prefetched[partition] = held

    def put(self, key: bytes, value: bytes, at: At) -> None:
        self._changes.setdefault(at.partition, {})[key] = value

    def delete(self, key: bytes, at: At) -> None:
        self._changes.setdefault(at.partition, {})[key] = None

    def mark(self, key: bytes, value: bytes | None, at: At) -> None:
        self._marks.setdefault(at.partition, {})[key] = value

    def items(self) -> Iterable[tuple[bytes, bytes]]:
        for store in list(self.stores.values()):
            yield from store.items()

    def __len__(self) -> int:
        return sum(store.count() for store in self.stores.values())

    def take_changes(self) -> dict[int, Changes]:
        """Write the held changes to the stores; return them, per partition, for the changelog.

        The expiry index's changes go in the same write; they are not for the changelog.
        """
        changes, self._changes = self._changes, {}
        marks, self._marks = self._marks, {}
        self._prefetched = {}
        cache = self.cache
        for partition in changes.keys() | marks.keys():
            writes = changes.get(partition, {})
            self.stores[partition].write(writes, marks.get(partition))
            for key, value in writes.items():
                if value is None:
                    cache.discard(key)
                else:
                    cache.put(key, value)
        return changes


async def restore(
    kafka: KafkaConnection | str,
    topic: str,
    stores: dict[int, PartitionStore],
    *,
    batch: int = 5000,
    should_stop: Callable[[], bool] | None = None,
    mark_of: Callable[[bytes, bytes], bytes | None] | None = None,
) -> int:
    """Bring each store up to the end of its changelog partition; return records applied.

    Reads committed records only: the join writes its changelog in transactions, and an
    aborted one (a fenced zombie's) must not come back. Each store's position moves with
    what it applied, so a restore cut short by ``should_stop`` (checked between fetches:
    the partitions are being revoked) continues from there next time. ``mark_of(key,
    value)`` gives a restored state's expiry index entry.
    """
    if not stores:
        return 0
    started = time.monotonic()
    consumer = AIOKafkaConsumer(
        **connection_of(kafka).aiokafka(),
        enable_auto_commit=False,
        isolation_level="read_committed",
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    try:
        await consumer.start()
    except BaseException:
        await consumer.stop()  # a client that did not start is closed all the same
        raise
    applied = 0
    try:
        tps = {TopicPartition(topic, p): store for p, store in stores.items()}
        consumer.assign(list(tps))
        ends = await consumer.end_offsets(list(tps))  # read committed: the stable offsets
        begins = await consumer.beginning_offsets(list(tps))
        todo: dict[TopicPartition, int] = {}
        spans: list[str] = []
        for tp, store in tps.items():
            end, begin = ends[tp], begins[tp]
            has_data = store.count() > 0 or next(iter(store.items()), None) is not None
            if store.changelog_next > end or (store.changelog_next == 0 and has_data):
                log.warning(
                    "%s: local state does not match the changelog (at %d, changelog ends at "
                    "%d); rebuilding it", tp, store.changelog_next, end,
                )  # fmt: skip
                store.clear()
            start = max(store.changelog_next, begin)
            spans.append(f"{tp.partition}: {start}..{end}")
            if start < end:
                consumer.seek(tp, start)
                todo[tp] = end
            else:
                store.set_changelog_next(end)
        while todo and not (should_stop is not None and should_stop()):
            # Short waits: a partition whose rest is a transaction marker returns no record,
            # and a long wait would only make every restore that much longer.
            fetched = await consumer.getmany(*todo, timeout_ms=100, max_records=batch)
            for tp, records in fetched.items():
                changes: Changes = {}
                marks: Changes = {}
                for record in records:
                    if record.offset >= todo.get(tp, 0):
                        break
                    if record.key is None:
                        continue
                    changes[record.key] = record.value
                    if mark_of is not None:
                        marks[record.key] = (
                            None if record.value is None else mark_of(record.key, record.value)
                        )
                    applied += 1
                tps[tp].write(changes, marks)  # one write per fetch, in offset order
            # Every partition, not only those that returned records: a fetch that held only
            # transaction markers (or aborted records) moves the position and returns none.
            for tp in list(todo):
                position = await consumer.position(tp)
                tps[tp].set_changelog_next(min(position, todo[tp]))
                if position >= todo[tp]:
                    del todo[tp]
    finally:
        await stop_quietly(consumer.stop, "restore consumer", log)
    log.info(
        "restored partitions %s from %s (%s): %d records in %.1fs%s",
        sorted(stores), topic, ", ".join(spans), applied, time.monotonic() - started,
        " (cut short: the partitions are being revoked)" if todo else "",
    )  # fmt: skip
    return applied
