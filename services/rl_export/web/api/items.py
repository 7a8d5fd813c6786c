"""What the Label, workspace and review routes share: the ``traces`` corpus, a known trace,
items (blind, evaluations hidden, redacted) and answers that carry corpus lines as they are."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi.responses import Response

from rl_export.index.follower import Followed
from rl_export.labeling.blind import queue_item
from rl_export.model.codec import dumps
from rl_export.privacy.kinds import parse_kinds
from rl_export.privacy.redact import redactor
from rl_export.web.api.deps import corpus, index_state, query
from rl_export.web.errors import NotFound, Unavailable
from rl_export.web.labels import LabelEvent
from rl_export.web.models import AcceptedOut
from rl_export.web.services import Services

TRACES = "traces"


async def traces_corpus(svc: Services, org: str, project: str) -> Followed:
    return await corpus(svc, org, project, TRACES)


async def known_trace(svc: Services, org: str, project: str, trace_id: str) -> int:
    """The ``traces`` corpus's id in the index, once it holds the trace (404 otherwise; 503
    while the instance has not read the corpus yet)."""
    followed = await traces_corpus(svc, org, project)
    if followed.corpus_id is None or followed.passes == 0:
        raise Unavailable(
            f"this instance is still reading the traces of {org}/{project}; retry in a moment"
        )
    if not await query(svc.index.has_trace, followed.corpus_id, trace_id):
        raise NotFound(f"no trace {trace_id!r} in {org}/{project}")
    return followed.corpus_id


def _items_now(svc: Services, bodies: list[bytes], blinded: bool, evaluations: bool) -> list[bytes]:
    kinds = parse_kinds(svc.settings.redact)  # checked when the settings were loaded
    scrub = redactor(kinds) if kinds else None
    items: list[bytes] = []
    total: dict[str, int] = {}
    for body in bodies:
        item, counts = queue_item(body, blinded=blinded, scrub=scrub, evaluations=evaluations)
        items.append(item)
        for kind, n in counts.items():
            total[kind] = total.get(kind, 0) + n
    for kind, n in total.items():
        if n:
            svc.metrics.redactions.labels(kind).inc(n)
    return items


async def items(
    svc: Services, bodies: list[bytes], *, blinded: bool, evaluations: bool
) -> list[bytes]:
    """Corpus lines as items: blind when asked, evaluations hidden unless ``evaluations``,
    always redacted with the service's default kinds (docs/guides/security.md)."""
    if not bodies:
        return bodies
    return await asyncio.to_thread(_items_now, svc, bodies, blinded, evaluations)


def answer(fields: dict[str, Any], bodies: list[bytes], followed: Followed) -> Response:
    """The answer with the corpus's lines as ``items``, handed on as they are (never parsed)."""
    state = dumps(index_state(followed, time.monotonic()).model_dump())
    head = dumps(fields)[:-1]  # the other fields; ``items`` and ``index`` go after them
    content = b'%b,"items":[%b],"index":%b}' % (head, b",".join(bodies), state)
    return Response(content, media_type="application/json")


async def publish(svc: Services, event: LabelEvent) -> AcceptedOut:
    """Publish a label event (503 unless the broker acknowledged it) and note it for every
    labeler's queue at once."""
    await svc.publisher.publish(event)
    svc.overlay.note(event)
    return AcceptedOut(event_id=event.event_id)
