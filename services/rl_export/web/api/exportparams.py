"""An export's parameters as the export routes check them: each bad one a 422 naming it.

The direct export (``GET export``), the preview and background jobs (``POST exports``) take
the same parameters: format and columns, chat style and completion, the turn mask, the
training set (split, dedup), a pinned version, and the redaction asked for, which decides
whether the read is raw (the ``raw`` scope, and an audit entry before any data leaves:
docs/guides/security.md).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import orjson

from rl_export.export import (
    Dedup,
    ExportSummary,
    Split,
    check_export,
    parse_chat_style,
    parse_completion,
    parse_dedup,
    parse_mask,
    parse_split,
    source_ref,
)
from rl_export.export.requests import check_template, parse_on_unrenderable
from rl_export.export.templated import TemplateChoice
from rl_export.export.versions import pinned
from rl_export.formats.chat import HF, Chat
from rl_export.formats.filters import Filters
from rl_export.formats.render import Completion
from rl_export.formats.templates import load_template
from rl_export.formats.turns import TurnMask
from rl_export.model.errors import (
    ExportError,
    StoreError,
    VersionError,
)
from rl_export.privacy.kinds import counts_header, parse_kinds
from rl_export.runtime.metrics import REDACTION_KINDS
from rl_export.web import audit
from rl_export.web.audit import AuditEntry
from rl_export.web.errors import Invalid, NotFound, RawRequired, Unavailable
from rl_export.web.services import Services
from rl_export.web.tokens import Caller

REDACTIONS_HEADER = "X-RL-Export-Redactions"
DUPLICATES_HEADER = "X-RL-Export-Duplicates-Removed"
SKIPPED_HEADER = "X-RL-Export-Skipped"
"""A chat template's rows left out, by reason, as JSON."""


def checked_export(
    fmt: str,
    columns: str | list[str] | None,
    *,
    mask: TurnMask | None = None,
    file: str = "jsonl",
    redact: str | None = None,
    chat: Chat = HF,
    completion: Completion = "turn",
    template: bool = False,
) -> Any:
    try:
        return check_export(fmt, columns=columns, mask=mask, file=file, redact=redact,
                            chat=chat, completion=completion, template=template)  # fmt: skip
    except ExportError as exc:
        raise Invalid(str(exc)) from None


def template_choice(
    svc: Services, fmt: str, chat: Chat, chat_template: str | None, on_unrenderable: str | None
) -> TemplateChoice | None:
    """The chat template a request names (a registered one or a built-in: never a path),
    loaded and compiled; 422 naming the parameter for anything wrong."""
    try:
        action = parse_on_unrenderable(on_unrenderable, chat_template is not None)
        if chat_template is None:
            return None
        check_template(fmt, chat)
        loaded = load_template(chat_template, folder=svc.settings.chat_templates, files=False)
    except ExportError as exc:
        raise Invalid(f"{exc.setting.replace('-', '_')}: {exc.detail}") from None
    # Rendered here, in threads, for a direct export or a preview: no pool of processes.
    return TemplateChoice(loaded, action, processes=1)


def chat_options(
    fmt: str, chat_style: str | None, system: str | None, completion: str | None
) -> tuple[Chat, Completion]:
    """The chat style and preference completion of a request; 422 naming the parameter
    when one does not apply to the format."""
    try:
        return (parse_chat_style(fmt, chat_style, system),
                parse_completion(fmt, completion))  # fmt: skip
    except ExportError as exc:
        raise Invalid(f"{exc.setting.replace('-', '_')}: {exc.detail}") from None


def turn_mask(fmt: str, mask_failed_turns: bool, mask_types: str | list[str] | None) -> Any:
    """The turn mask of a request; 422 naming the parameter when it does not apply."""
    try:
        return parse_mask(fmt, mask_failed_turns, mask_types)
    except ExportError as exc:
        raise Invalid(f"{exc.setting.replace('-', '_')}: {exc.detail}") from None


def training_options(
    *, split: str | None, splits: str | None, split_by: str | None, split_salt: str | None,
    dedup: str | None, dedup_threshold: str | None, dedup_on: str | None,
) -> tuple[Split | None, Dedup | None]:  # fmt: skip
    """A request's split and dedup; 422 naming the parameter for a bad one."""
    try:
        return (parse_split(split, splits, split_by, split_salt),
                parse_dedup(dedup, dedup_threshold, dedup_on))  # fmt: skip
    except ExportError as exc:
        raise Invalid(f"{exc.setting.replace('-', '_')}: {exc.detail}") from None


async def version_at(
    svc: Services, org: str, project: str, source: str, version: str | None
) -> Any:
    """The view position of ``version`` (None: the latest view); 404 for an unknown one."""
    if version is None:
        return None
    try:
        return (await pinned(svc.store, source_ref(org, project, source), version, None)).at
    except VersionError as exc:
        raise (Invalid if "is not valid" in exc.detail else NotFound)(exc.detail) from None


def asked_kinds(svc: Services, redact: str | list[str] | None) -> tuple[str, ...]:
    """The kinds a request asks to redact (the service's default when it names none)."""
    try:
        return parse_kinds(redact if redact is not None else svc.settings.redact)
    except ExportError as exc:
        raise Invalid(str(exc)) from None


def weaker_than_default(svc: Services, kinds: tuple[str, ...]) -> bool:
    """Whether redacting ``kinds`` redacts less than the project's default
    (``RL_EXPORT_REDACT``)."""
    return not set(parse_kinds(svc.settings.redact)) <= set(kinds)


def require_raw(svc: Services, caller: Caller, kinds: tuple[str, ...]) -> None:
    """403 ``raw_required`` unless the caller holds the ``raw`` scope."""
    if caller.allows("raw"):
        return
    svc.metrics.auth_failures.labels("scope").inc()
    asked = ",".join(kinds) or "none"
    default = ",".join(parse_kinds(svc.settings.redact))
    raise RawRequired(
        f"redact={asked} redacts less than this project's default ({default}): that needs a "
        "token with the raw scope"
    )


def needs_raw(svc: Services, caller: Caller, kinds: tuple[str, ...]) -> bool:
    """Whether a read redacts less than the project's default (``RL_EXPORT_REDACT``): then
    it needs the ``raw`` scope (403 ``raw_required`` without it) and is audited."""
    if not weaker_than_default(svc, kinds):
        return False
    require_raw(svc, caller, kinds)
    return True


async def audit_read(
    svc: Services,
    caller: Caller,
    route: str,
    filters: Filters,
    kinds: tuple[str, ...],
    *,
    rows: int | None,
    job: str | None = None,
) -> None:
    """Append the raw read to the project's audit log before its data leaves (503 when the
    store does not take the entry: nothing unaudited is served) and count it."""
    entry = AuditEntry(
        time=datetime.now(UTC), org=caller.org, project=caller.project, subject=caller.subject,
        token_id=caller.token_id, route=route, filters=filters.to_params(), kinds=list(kinds),
        rows=rows, job=job,
    )  # fmt: skip
    try:
        await audit.append(svc.store, entry)
    except StoreError:
        raise Unavailable("the audit log could not be written, so nothing was read") from None
    svc.metrics.raw_reads.labels(route).inc()


def count_skipped(headers: Any, summary: ExportSummary | None) -> None:
    """Say which rows a chat template left out, by reason (JSON): with a template only."""
    if summary is not None and summary.template is not None:
        headers[SKIPPED_HEADER] = orjson.dumps(summary.unrenderable).decode()


def count_redactions(svc: Services, headers: Any, counts: dict[str, int]) -> None:
    """Say what was replaced: the header, and the metric (of the redaction kinds; a zip's
    ``unscanned`` attachments are in the header only)."""
    headers[REDACTIONS_HEADER] = counts_header(counts)
    for kind, n in counts.items():
        if n and kind in REDACTION_KINDS:
            svc.metrics.redactions.labels(kind).inc(n)


def disposition(name: str) -> str:
    return f"attachment; filename=\"{name}\"; filename*=UTF-8''{quote(name)}"


EXPORT_CONTENT: dict[str, dict[str, Any]] = {
    "application/x-ndjson": {}, "text/csv": {}, "application/json": {}, "application/zip": {},
    "application/vnd.apache.parquet": {},
}  # fmt: skip


async def question_columns_of(
    svc: Services, org: str, project: str, fmt: str, columns: str | None
) -> str | None:
    """A tabular export's columns: as asked, or (none asked) the record's with one
    ``answers.<question>`` per question of the project's newest rubric version, once it has a
    version past 0 (docs/guides/rubrics.md). 503 when the store does not answer."""
    from rl_export.export.columns import question_columns
    from rl_export.formats.render import TABULAR_FORMATS

    if columns or fmt not in TABULAR_FORMATS:
        return columns
    try:
        latest = await svc.rubrics.latest(org, project)
    except StoreError as exc:
        raise Unavailable(f"the object store did not answer ({exc}); retry") from None
    if latest.version == 0:
        return columns
    return question_columns([q.name for q in latest.spec.questions])
