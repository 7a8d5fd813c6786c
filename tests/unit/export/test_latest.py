"""The latest view in bounded memory agrees with the reader's latest view, whatever spills."""

from __future__ import annotations

from typing import Any

import pytest

from rl_export.corpora.commits import ChainError
from rl_export.corpora.identity import NotARecordError, line_identity
from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import MemoryStore
from rl_export.export.latest import LatestView
from rl_export.model.codec import dumps_line, loads
from rl_export.model.errors import NoDataError
from tests.exportdata import ORG, PROJECT, FirstCommitLate, build_story


async def reader_latest(store: MemoryStore, ref: CorpusRef) -> list[dict[str, Any]]:
    reader = CorpusReader(store, ref)
    return [r async for r in reader.records(latest_only=True)]


async def view_rows(view: LatestView) -> list[dict[str, Any]]:
    await view.open()
    return [loads(line) async for batch in view.lines() for line in batch]


@pytest.mark.parametrize("compacted", [True, False])
@pytest.mark.parametrize("spill_at", [1, 2, 200_000])
@pytest.mark.parametrize("source", ["human", "evaluator", "traces"])
async def test_the_view_is_the_readers_latest_view(
    compacted: bool, spill_at: int, source: str
) -> None:
    store = MemoryStore()
    await build_story(store, compact_between=compacted)
    ref = CorpusRef(ORG, PROJECT, source)
    view = LatestView(store, ref, spill_at=spill_at)
    rows = await view_rows(view)
    expected = await reader_latest(store, ref)
    key = lambda r: r["trace_id"]  # noqa: E731
    assert sorted(rows, key=key) == sorted(expected, key=key)
    assert view.total == len(rows)
    assert len({r["trace_id"] for r in rows}) == len(rows)
    assert not any(r.get("deleted") for r in rows)
    if spill_at == 1 and view.tail_lines > 1:
        assert view.runs >= 1  # the index really went to disk
    ids = {r["trace_id"] for r in rows}
    assert "tr-004" not in ids  # deleted before the compaction
    # Deleted after it, by the second replay: its chain knows what the first one's holds (or,
    # compacted, the compaction's holdings), and a deletion gets a tombstone in any case.
    assert "tr-003" not in ids


async def test_a_corrupt_shard_fails_the_view() -> None:
    store = MemoryStore()
    await build_story(store)
    ref = CorpusRef(ORG, PROJECT, "evaluator")
    shard = next(k for k in store.objects if k.startswith(f"{ref.root}/data/replay-after"))
    store.objects[shard] = store.objects[shard].replace(b'"reward"', b'"rewarD"', 1)
    with pytest.raises(ChainError, match="sha256"):
        await view_rows(LatestView(store, ref))


async def test_no_data_says_so() -> None:
    with pytest.raises(NoDataError, match="no data for acme/bot/human"):
        await LatestView(MemoryStore(), CorpusRef("acme", "bot", "human")).open()


async def test_a_first_commit_landing_while_the_view_opens_is_read_not_an_empty_view() -> None:
    """The view found no chain, then saw the corpus exists: it looks for the chains again
    rather than answer with no records (an export of a new corpus was a 200 with nothing)."""
    store = FirstCommitLate()
    await build_story(store, compact_between=False)  # commits only: the view's first look
    ref = CorpusRef(ORG, PROJECT, "evaluator")
    assert not await store.list(ref.compacted_prefix())
    expected = await reader_latest(store, ref)
    store.looked = False
    rows = await view_rows(LatestView(store, ref))
    assert store.looked
    assert len(rows) == len(expected) > 0


@pytest.mark.parametrize(
    "row",
    [
        {"trace_id": "a", "org": "o", "project": "p", "reward_source": None, "revision": 7},
        {"trace_id": 'we"ird\u2028 {id} [x]', "revision": 12, "messages": []},
        {
            "trace_id": "t",
            "org": "o",
            "project": "p",
            "reward_source": "human",
            "revision": 3,
            "deleted": True,
        },
        {"trace_id": "n", "messages": [{"revision": 99}], "revision": 4},  # nested first
        {"revision": 5, "trace_id": "order"},  # not the project's order: parsed in full
        {"trace_id": "x", "revision": 1, "content": 'ends "deleted":true}'},
    ],
)
def test_line_identity_agrees_with_parsing(row: dict[str, Any]) -> None:
    got = line_identity(dumps_line(row))
    assert got == (row["trace_id"], row["revision"], row.get("deleted") is True)


@pytest.mark.parametrize("line", [b"[1]\n", b'{"trace_id": 3, "revision": 1}\n', b"{nope\n"])
def test_line_identity_refuses_what_is_not_a_record(line: bytes) -> None:
    with pytest.raises(NotARecordError):
        line_identity(line)


@pytest.mark.parametrize(
    "row",
    [
        {"trace_id": "a", "org": "o", "project": "p", "reward_source": None, "revision": 7},
        {"trace_id": "a", "org": "o", "project": "p", "reward_source": "human", "revision": 7,
         "deleted": True},
        {"trace_id": 'we"ird\u2028 {id} [x]', "revision": 12, "messages": []},
        {"trace_id": "caf\u00e9 \U0001f600", "revision": 3, "messages": []},
        {"trace_id": "back\\slash", "revision": 3},
        {"trace_id": "n", "messages": [{"revision": 99}], "revision": 4},
        {"trace_id": "o", "org": "{o}", "project": "p", "reward_source": None, "revision": 2},
        {"revision": 5, "trace_id": "order"},
        {"trace_id": "x", "revision": 1, "content": 'ends "deleted":true}'},
        {"trace_id": "y" * 600, "revision": 8},
    ],
)  # fmt: skip
def test_line_key_is_the_line_identity_with_the_id_as_utf8(row: dict[str, Any]) -> None:
    from rl_export.corpora.identity import line_key

    line = b"..." + dumps_line(row)
    expected = line_identity(dumps_line(row))
    key, revision, deleted = line_key(line, 3, len(line) - 1)
    assert (key.decode(), revision, deleted) == expected
    assert key == row["trace_id"].encode()


def test_keys_sort_as_the_ids_do() -> None:
    from rl_export.corpora.identity import key_of

    ids = ["a", "b", "\u00e9", "\uffff", "\U0001f600", "\ud7ff", "\ue000", "Z", "a\u2028"]
    assert sorted(ids, key=key_of) == sorted(ids)


def test_block_identities_are_the_line_identities() -> None:
    from rl_export.corpora.identity import block_identities

    rows: list[dict[str, Any]] = [
        {"trace_id": "a", "org": "o", "project": "p", "reward_source": None, "revision": 7},
        {"trace_id": 'we"ird\u2028 {id}', "revision": 12, "messages": []},
        {"trace_id": "t", "revision": 3, "deleted": True},
        {"trace_id": "n", "messages": [{"revision": 99}], "revision": 4},
        {"trace_id": "x" * 600, "revision": 8},  # the revision is past the head
        {"revision": 5, "trace_id": "order"},
    ]
    block = b"".join(dumps_line(r) for r in rows)
    assert list(block_identities(block)) == [line_identity(dumps_line(r)) for r in rows]


@pytest.mark.parametrize(("start", "count"), [(0, 1), (3, 9), (7, 2), (8, 8), (5, 20), (0, 0)])
def test_all_set_reads_bit_ranges(start: int, count: int) -> None:
    from rl_export.export.runs import all_set, set_bit

    bits = bytearray(8)
    for n in range(start, start + count):
        set_bit(bits, n)
    assert all_set(bits, start, count)
    if count:
        cleared = bytearray(bits)
        last = start + count - 1
        cleared[last >> 3] &= ~(1 << (last & 7)) & 0xFF
        assert not all_set(cleared, start, count)
