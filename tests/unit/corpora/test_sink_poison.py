"""No record stops a sink partition: whatever another producer (or another version of the
join) writes to ``trajectories``, the sink skips what it cannot write, counts it, and commits
the snapshots behind it.

Generated records: bytes, JSON of any shape, snapshots whose fields have the wrong types,
and snapshots whose org or project cannot name a store folder (``..``, ``a/b``, 300
characters, ``_claims``), which the store refused at the commit, stopping the partition for
good, before this. The integration test runs a poison pill through a real worker
(tests/integration/stream/test_poison_pills.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from rl_export.corpora.store import MemoryStore
from tests.unit.corpora.test_sink import TRACES, Trace, chain, feed, make_sink, sample, verified

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
FIELDS = (
    "trace_id", "org", "project", "revision", "deleted", "messages", "human_labels", "labelers",
    "rubric", "evaluation", "updated_at", "labels_count", "reward_source",
)  # fmt: skip
UNNAMABLE = st.sampled_from(["..", ".", "a/b", "", "x" * 300, "_claims", "é", "a b"])


@st.composite
def poison(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "json", "shaped", "unnamable"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "json":
        return orjson.dumps(draw(JSON))
    snapshot: dict[str, Any] = Trace("tr-poison").completed()
    snapshot["messages"] = orjson.loads(snapshot["messages"].data)
    if kind == "unnamable":
        snapshot[draw(st.sampled_from(["org", "project"]))] = draw(UNNAMABLE)
    else:
        for name in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3)):
            snapshot[name] = draw(JSON)
    return orjson.dumps(snapshot)


@hypothesis_settings(max_examples=200, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(st.lists(poison(), min_size=1, max_size=5))
def test_a_snapshot_behind_any_poison_pill_is_committed(poisons: list[bytes]) -> None:
    async def run() -> None:
        store = MemoryStore()
        sink, registry = make_sink(store, max_records=1000, max_age_s=60)
        for offset, value in enumerate(poisons):
            await sink.handle(offset, value, None)  # never raises
        behind = Trace("tr-behind").completed()
        await feed(sink, [(len(poisons), behind)])
        assert await sink.flush() == len(poisons) + 1  # the offset moves past them all
        rows = [row for _, rows in await chain(store, TRACES) for row in rows]
        assert "tr-behind" in {row["trace_id"] for row in rows}
        assert sample(registry, "rl_export_sink_bad_snapshots_total") <= len(poisons)
        assert not any(key.startswith(("..", "/", "_claims")) for key in store.objects)
        await verified(store)

    asyncio.run(run())


async def test_an_org_that_cannot_name_a_folder_is_skipped_and_counted() -> None:
    store = MemoryStore()
    sink, registry = make_sink(store)
    for offset, org in enumerate(["..", "a/b", "x" * 300]):
        snapshot = Trace(f"tr-{offset}").completed()
        snapshot["org"] = org
        await feed(sink, [(offset, snapshot)])
    await feed(sink, [(3, Trace("tr-ok").completed())])
    assert sample(registry, "rl_export_sink_bad_snapshots_total") == 3
    assert await sink.flush() == 4
    assert {row["trace_id"] for _, rows in await chain(store, TRACES) for row in rows} == {"tr-ok"}
