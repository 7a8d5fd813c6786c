"""The erasure log's keys: they name the trace, so a pinned read lists them and fetches
none; entries that do not (an id too long for a key, or an older log) are read."""

from __future__ import annotations

import pytest

from rl_export.corpora.commits import ChainError
from rl_export.corpora.erasures import (
    ID_IN_KEY,
    erased_traces,
    erasure_key,
    erasures_prefix,
    record_erasures,
)
from rl_export.corpora.store import MemoryStore
from rl_export.model.codec import dumps
from tests.harness.stores import CountingStore

HOSTILE = ["tr-1", "a/b/../c", "ünïcødé 🚀", "x.json", "=" * 5, "t" * ID_IN_KEY]


async def test_ids_come_from_the_keys_whatever_their_characters() -> None:
    store = CountingStore()
    await record_erasures(store, "acme", "bot", "snapshots-0",
                          [(n, trace_id, 2) for n, trace_id in enumerate(HOSTILE)])  # fmt: skip
    keys = await store.list(erasures_prefix("acme", "bot"))
    assert len(keys) == len(HOSTILE)
    assert all(k.count("/") == 4 and k.endswith(".json") for k in keys)  # nothing escapes
    assert await erased_traces(store, "acme", "bot") == frozenset(HOSTILE)
    assert store.gets == 0
    # The same deletion written again by another corpus: the same key, nothing added.
    await record_erasures(store, "acme", "bot", "snapshots-0", [(0, HOSTILE[0], 2)])
    assert len(await store.list(erasures_prefix("acme", "bot"))) == len(HOSTILE)


async def test_entries_whose_key_names_no_trace_are_read() -> None:
    store = CountingStore()
    long_id = "t" * (ID_IN_KEY + 1)
    await record_erasures(store, "acme", "bot", "snapshots-1", [(7, long_id, 3)])
    assert erasure_key("acme", "bot", "snapshots-1", 7, long_id).endswith(
        "/00000000000000000007.json"
    )
    # An entry of the log before ids were named in keys.
    body = {"trace_id": "tr-old", "org": "acme", "project": "bot", "revision": 1}
    await store.put(f"{erasures_prefix('acme', 'bot')}snapshots-1/{9:020d}.json", dumps(body))
    assert await erased_traces(store, "acme", "bot") == {long_id, "tr-old"}
    assert store.gets == 2


async def test_an_unreadable_entry_is_an_error_not_a_trace_shown() -> None:
    store = MemoryStore()
    await store.put(f"{erasures_prefix('acme', 'bot')}snapshots-1/{9:020d}.json", b"[1]")
    with pytest.raises(ChainError, match="not an erasure entry"):
        await erased_traces(store, "acme", "bot")
