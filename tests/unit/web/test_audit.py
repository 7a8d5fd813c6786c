"""The raw-access audit log: create-only entries under ``_audit/<org>/<project>/``, read back
in time order, from a time on, and never another project's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rl_export.corpora.store import MemoryStore
from rl_export.web import audit
from rl_export.web.audit import AuditEntry

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def entry(minutes: int, project: str = "bot", rows: int | None = 3) -> AuditEntry:
    return AuditEntry(
        time=T0 + timedelta(minutes=minutes), org="acme", project=project, subject="rae",
        token_id="0123456789ab", route="export", filters={"scenario": "trip"}, kinds=[],
        rows=rows,
    )  # fmt: skip


async def test_entries_are_create_only_objects_read_in_time_order() -> None:
    store = MemoryStore()
    keys = [await audit.append(store, entry(m)) for m in (5, 0, 10)]
    await audit.append(store, entry(1, project="other"))
    assert all(k.startswith("_audit/acme/bot/") for k in keys)
    assert len(set(keys)) == 3
    read = await audit.read(store, "acme", "bot")
    assert [e.time for e in read] == [T0, T0 + timedelta(minutes=5), T0 + timedelta(minutes=10)]
    assert read[0] == entry(0)
    since = await audit.read(store, "acme", "bot", T0 + timedelta(minutes=5))
    assert [e.time for e in since] == [T0 + timedelta(minutes=5), T0 + timedelta(minutes=10)]
    assert await audit.read(store, "acme", "bot", T0 + timedelta(days=1)) == []
    assert [e.project for e in await audit.read(store, "acme", "other")] == ["other"]
