"""Exports of source ``comparisons`` (docs/guides/comparisons.md): people's choices between
two trajectories of one prompt as training rows.

The ``comparisons`` corpus holds pair records (votes, no messages); the messages are the two
traces' records in the ``traces`` corpus. So an export reads the pair records' latest view
once (each live pair's winner and margin: a few words per pair in memory), then the
``traces`` corpus's latest view once, keeping the prompt and completion of the traces the
pairs name (memory: the traces in pairs, not the corpus), and writes the rows pair by pair.

* The winner is the trace more current votes prefer (``a`` against ``b``); a pair whose
  votes for the two are equal (ties, ``both_bad`` only, or as many each way) has no winner
  and no row (counted in the summary's ``skipped``).
* The two traces must share the prompt (the messages up to and including the first user
  message, compared exactly): a pair made on the scenario whose prompts differ is skipped.
* ``preference``: ``{prompt, chosen, rejected, score_chosen, score_rejected, trace_chosen,
  trace_rejected}``, the scores being each side's share of the pair's votes.
  ``reward_pairs``: ``{prompt, chosen, rejected, margin}``, margin = the mean strength of
  the winning votes (a vote that gave none counts as 1). ``kto``: two rows a pair, the
  winner's completion ``label: true``, the loser's ``false``.
* Training-set options: filters apply to both traces (a pair is kept when both match);
  ``--split`` hashes a key both traces share, the prompt (``--split-by trace_id``, the
  default) or a field both have the same value of (else the pair is skipped), so a pair's
  rows never straddle splits; ``--dedup exact`` drops a row equal to one written before;
  redaction applies to the traces' messages. ``--version`` pins the pair records' position;
  the traces are read at their latest (a trace deleted since is gone from both anyway).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.store import ObjectStore
from rl_export.export.dedup import Dedup
from rl_export.export.latest import ViewPosition
from rl_export.export.scan import ExportSummary, Progress, Scan, open_view
from rl_export.export.splits import Split, split_value
from rl_export.formats.chat import HF, Chat
from rl_export.formats.filters import Filters
from rl_export.formats.render import (
    Candidate,
    Completion,
    first_reply,
    preference_row,
    prompt_split,
)
from rl_export.model.codec import dumps, dumps_line
from rl_export.model.errors import ExportError
from rl_export.privacy.kinds import add_counts
from rl_export.privacy.redact import Redactor

PAIR_FORMATS: tuple[str, ...] = ("preference", "reward_pairs", "kto")
"""The training formats of source ``comparisons`` (``trajectory`` gives the pair records)."""


@dataclass(frozen=True, slots=True)
class Decided:
    """A live pair with a winner: who won, each side's share of the votes, the margin."""

    chosen: str
    rejected: str
    score_chosen: float
    score_rejected: float
    margin: float


def decide(record: dict[str, Any]) -> Decided | None:
    """The winner of a pair record, or None when the votes do not prefer one trace."""
    wins_a, wins_b = int(record["wins_a"]), int(record["wins_b"])
    if wins_a == wins_b:
        return None
    total = wins_a + wins_b + int(record["ties"]) + int(record["both_bad"])
    side = "a" if wins_a > wins_b else "b"
    strengths = [v.get("strength") or 1 for v in record["votes"] if v["choice"] == side]
    chosen, rejected = (record["trace_a"], record["trace_b"])[:: 1 if side == "a" else -1]
    win, lose = (wins_a, wins_b)[:: 1 if side == "a" else -1]
    return Decided(chosen, rejected, win / total, lose / total, sum(strengths) / len(strengths))


def _halves(record: dict[str, Any], completion: Completion) -> tuple[list[Any], list[Any]] | None:
    """(prompt, completion) of a trace's record, as ``preference`` cuts them; None when it
    has no user turn or nothing after it."""
    messages = record.get("messages")
    if not isinstance(messages, list):
        return None
    split = prompt_split(messages, at="first")
    if split is None or not split[1]:
        return None
    prompt, rest = split
    if completion == "turn":
        rest = first_reply(rest)
    return (prompt, rest) if rest else None


async def comparison_chunks(
    store: ObjectStore,
    ref: CorpusRef,
    *,
    format: str,
    filters: Filters,
    summary: ExportSummary,
    redactor: Redactor | None = None,
    chat: Chat = HF,
    completion: Completion = "turn",
    split: Split | None = None,
    dedup: Dedup | None = None,
    progress: Progress | None = None,
    at: ViewPosition | None = None,
) -> AsyncGenerator[bytes, None]:
    """The rows of ``format`` made from the comparisons corpus ``ref`` (module docstring),
    as JSON Lines chunks. ExportError for a format or option that does not apply."""
    if format not in PAIR_FORMATS:
        raise ExportError("format", f"source comparisons exports {', '.join(PAIR_FORMATS)} or "
                          f"trajectory (the pair records), not {format}")  # fmt: skip
    if dedup is not None and dedup.mode != "exact":
        raise ExportError("dedup", "source comparisons deduplicates exact rows only")
    summary.format = format
    view = await open_view(store, ref, progress, at)
    summary.position = view.position.to_json()
    summary.erased = view.erased
    decided: list[tuple[str, Decided]] = []
    async for batch in Scan(view, Filters(), ExportSummary(), progress).lines():
        for _, record in batch:
            summary.scanned += 1
            pair = decide(record)
            if pair is None:
                summary.skipped += 1
            else:
                decided.append((record["pair_id"], pair))
    needed = {t for _, p in decided for t in (p.chosen, p.rejected)}
    halves: dict[str, tuple[list[Any], list[Any], str]] = {}
    traces = await open_view(store, CorpusRef(ref.org, ref.project, "traces"), None)
    scan = Scan(traces, filters.model_copy(update={"limit": None}), ExportSummary(), None)
    async for batch in scan.lines():
        for _, stored in batch:
            if stored["trace_id"] not in needed:
                continue
            record = stored
            if redactor is not None:
                record, counts = redactor.record(stored)
                add_counts(summary.redactions, counts)
            cut = _halves(record, completion)
            if cut is not None:
                by = None if split is None or split.by == "trace_id" else split.by
                key = "" if by is None else split_value(record, by)
                halves[record["trace_id"]] = (cut[0], cut[1], key)
    seen: set[bytes] = set()
    out: list[bytes] = []
    for _, pair in sorted(decided, key=lambda item: item[0]):
        if filters.limit is not None and summary.records >= filters.limit:
            break
        chosen, rejected = halves.get(pair.chosen), halves.get(pair.rejected)
        if chosen is None or rejected is None or chosen[0] != rejected[0]:
            summary.skipped += 1  # a trace filtered out, without a prompt, or another prompt
            continue
        summary.matched += 1
        if split is not None:
            if chosen[2] != rejected[2]:
                summary.skipped += 1  # the two differ in the field split by
                continue
            key = chosen[2] if split.by != "trace_id" else (
                hashlib.sha256(dumps(chosen[0])).hexdigest())  # the prompt's  # fmt: skip
            if split.of_value(key) != split.name:
                summary.split_left_out += 1
                continue
        rows = _rows(format, pair, chosen[0], chosen[1], rejected[1], chat)
        if dedup is not None:
            digest = hashlib.sha256(b"".join(dumps(r) for r in rows)).digest()
            if digest in seen:
                summary.duplicates_removed += 1
                continue
            seen.add(digest)
        out += [dumps_line(r) for r in rows]
        summary.records += 1
        if len(out) >= 1000:
            chunk = b"".join(out)
            summary.bytes += len(chunk)
            yield chunk
            out = []
    if out:
        chunk = b"".join(out)
        summary.bytes += len(chunk)
        yield chunk


def _rows(  # noqa: PLR0917 - a pair's three message lists
    format: str, pair: Decided, prompt: list[Any], chosen: list[Any], rejected: list[Any],
    chat: Chat,
) -> list[dict[str, Any]]:  # fmt: skip
    """A pair's rows in ``format``: one, or two for ``kto``."""
    row = preference_row(
        prompt, Candidate(b"", pair.score_chosen, pair.chosen), chosen,
        Candidate(b"", pair.score_rejected, pair.rejected), rejected, chat=chat,
    )  # fmt: skip
    if format == "preference":
        return [row]
    if format == "reward_pairs":
        return [{"prompt": row["prompt"], "chosen": row["chosen"], "rejected": row["rejected"],
                 "margin": pair.margin}]  # fmt: skip
    return [
        {"prompt": row["prompt"], "completion": row["chosen"], "label": True},
        {"prompt": row["prompt"], "completion": row["rejected"], "label": False},
    ]
