"""The raw-access audit log (docs/guides/security.md): who read what with a redaction weaker than
the project's default.

Each read appends one create-only object ``_audit/<org>/<project>/<time>-<random>.json``
(``put_if_absent``: an entry is never overwritten, and a reader of the store sees every one),
holding the time, the token's subject and id, the route, the filters, the redaction kinds
and the rows read (null for a background job: its status counts them). Keys sort by time, so
``rl-export audit --since`` lists only the keys after the time it asks for.

The entry is written before any data leaves (a direct export is made whole first), so a
store that does not take the entry refuses the read (503) instead of serving it unaudited.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from rl_export.corpora.store import ObjectStore
from rl_export.model.codec import dumps, loads
from rl_export.model.events import UtcDatetime

PREFIX = "_audit/"
_STAMP = "%Y%m%dT%H%M%S.%fZ"


class AuditEntry(BaseModel):
    """One raw read."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    time: UtcDatetime
    org: str
    project: str
    subject: str
    token_id: str
    route: str
    filters: dict[str, Any]
    kinds: list[str]
    rows: int | None
    job: str | None = None


def folder(org: str, project: str) -> str:
    return f"{PREFIX}{org}/{project}/"


def entry_key(entry: AuditEntry) -> str:
    stamp = entry.time.astimezone(UTC).strftime(_STAMP)
    return f"{folder(entry.org, entry.project)}{stamp}-{secrets.token_hex(6)}.json"


async def append(store: ObjectStore, entry: AuditEntry) -> str:
    """Write the entry as a new object; return its key."""
    key = entry_key(entry)
    await store.put_if_absent(key, dumps(entry.model_dump(mode="json")))
    return key


async def read(
    store: ObjectStore, org: str, project: str, since: datetime | None = None
) -> list[AuditEntry]:
    """The project's entries at or after ``since``, oldest first."""
    prefix = folder(org, project)
    start_after = ""
    if since is not None:
        # Keys sort by time: start just before the first key of that microsecond.
        start_after = f"{prefix}{since.astimezone(UTC).strftime(_STAMP)}"[:-1]
    out = []
    for key in sorted(await store.list(prefix, start_after=start_after)):
        entry = AuditEntry.model_validate(loads(await store.get(key)))
        if since is None or entry.time >= since:
            out.append(entry)
    return out


__all__ = ["PREFIX", "AuditEntry", "append", "read"]
