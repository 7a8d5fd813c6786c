"""The training formats of docs/guides/exports.md: pure renderers from the trajectory record.

Public interface (the export, the sink and the web service rely on these names)::

    JSONL_FORMATS = ("trajectory", "prompt_completion", "messages", "kto", "preference",
                     "executions", "rl_prompts")
    PAIR_FORMATS = ("reward_pairs",)          # of source comparisons only
    TABULAR_FORMATS = ("csv", "json", "parquet", "zip")
    CORPUS_FORMATS      # the JSON Lines formats a streaming corpus can hold (not preference,
                        # not rl_prompts)
    MASK_FORMATS = ("messages", "prompt_completion")     # --mask-failed-turns applies to these
    CHAT_FORMATS = ("messages", "prompt_completion", "preference", "kto")   # --chat-style
    COMPLETIONS = ("turn", "rest")                        # preference --completion
    FORMAT_COLUMNS      # format -> the columns of its rows, in order (trajectory: the record)
    def render_row(fmt: str, record: dict, *, mask=None, chat=HF, tools=False) -> dict | None
    def trace_tools(record) -> list | None   # metadata.tools, when a list of objects
    def trace_index(trace_id: str) -> int    # rl_prompts extra_info.index
    def corpus_row(fmt: str, record: dict, *, mask=None, chat=HF, tools=False) -> dict | None
    def row_fields(fmt: str, pair_by=(), *, mask=False, chat=HF, tools=False)
        -> tuple[frozenset, frozenset] | None
    def preference_pairs(records: Iterable[dict], *, pair_by=(), margin=0.0, max_pairs=1,
                         completion="turn", chat=HF, tools=False) -> Iterator[dict]
    def prompt_split(messages, *, at="last") -> tuple[list, list] | None
    def first_reply(messages) -> list      # the messages before the next user message

``render_row`` gives a record's row in a per-record format, or None when the record has no
row in it (``prompt_completion`` and ``kto`` need a user turn and something after it; ``kto``
needs a ``passed`` verdict; ``rl_prompts`` a user message). The chat formats
(:data:`CHAT_FORMATS`) give their messages in a chat style (:mod:`rl_export.formats.chat`,
``hf`` by default: string content, tool-call arguments as objects); ``raw`` passes them
through exactly as received, as every other format does. A
:class:`~rl_export.formats.turns.TurnMask` (``messages`` and ``prompt_completion`` only) puts
a ``weight`` on each assistant message (:func:`~rl_export.formats.turns.weigh`), which every
chat style keeps. The whole conversation is restyled before it is split, so ``--system
merge`` folds its system messages into the first user message; ``preference`` restyles the
prompt (merging) and each completion (whose system messages, if any, stay).
``rl_prompts`` rows are verl's RL data rows; their ``extra_info.index`` is derived from the
trace id (:func:`trace_index`), so a trace has the same index in every file and two traces
never share one (in practice: 63 bits of a SHA-256).

A record's messages may be a :class:`~rl_export.model.codec.RawJson` (the sink's records):
formats that keep the whole conversation copy those bytes as they are; formats that split it
(or weigh it) parse them.

``corpus_row`` is the row a streaming corpus of that format holds: ``trace_id`` and
``revision`` first (what the latest view, tombstones, compaction and ``shards verify`` key
on), then the format's columns. ``rl-export export`` writes :func:`render_row`'s rows, with
exactly the documented columns.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rl_export.formats.chat import HF, Chat
from rl_export.formats.turns import TurnMask, report_of, weigh
from rl_export.model.codec import RawJson, dumps

JSONL_FORMATS: tuple[str, ...] = (
    "trajectory",
    "prompt_completion",
    "messages",
    "kto",
    "preference",
    "executions",
    "rl_prompts",
)
PAIR_FORMATS: tuple[str, ...] = ("reward_pairs",)
"""JSON Lines formats of source ``comparisons`` only (:mod:`rl_export.export.comparisons`),
beside its ``preference`` and ``kto``."""
TABULAR_FORMATS: tuple[str, ...] = ("csv", "json", "parquet", "zip")
ALL_FORMATS: tuple[str, ...] = JSONL_FORMATS + TABULAR_FORMATS
CORPUS_FORMATS: tuple[str, ...] = tuple(
    f for f in JSONL_FORMATS if f not in ("preference", "rl_prompts")
)
"""The formats a streaming corpus (``RL_EXPORT_CORPORA``) may hold: preference pairs need
the whole latest view, and ``rl_prompts`` is a file for verl (Parquet, or JSON Lines) made
from the latest view, so both are an export only."""
MASK_FORMATS: tuple[str, ...] = ("messages", "prompt_completion")
"""The formats ``--mask-failed-turns`` applies to (docs/guides/exports.md)."""
CHAT_FORMATS: tuple[str, ...] = ("messages", "prompt_completion", "preference", "kto")
"""The formats whose messages take a chat style (``--chat-style``, ``--system``)."""
Completion = Literal["turn", "rest"]
COMPLETIONS: tuple[str, ...] = ("turn", "rest")
"""``preference --completion``: the agent's reply to the prompt's user message (up to the
next user message), or everything after the prompt."""

CorpusFormat = Literal["trajectory", "prompt_completion", "messages", "kto", "executions"]

EXECUTION_COLUMNS: tuple[str, ...] = (
    "id",
    "conversation",
    "report",
    "results",
    "reward",
    "passed",
    "reward_source",
    "evaluator_scores",
    "rubric",
    "labels_count",
    "scenario",
    "agent_version",
    "org",
    "project",
    "revision",
    "completed_at",
    "updated_at",
)

FORMAT_COLUMNS: dict[str, tuple[str, ...]] = {
    "prompt_completion": ("prompt", "completion", "reward", "passed", "trace_id"),
    "messages": ("messages",),
    "kto": ("prompt", "completion", "label"),
    "preference": (
        "prompt",
        "chosen",
        "rejected",
        "score_chosen",
        "score_rejected",
        "trace_chosen",
        "trace_rejected",
    ),
    "executions": EXECUTION_COLUMNS,
    "rl_prompts": ("data_source", "prompt", "ability", "reward_model", "extra_info"),
    "reward_pairs": ("prompt", "chosen", "rejected", "margin"),
}
"""The columns of each format's rows, in order (``trajectory`` rows are the record)."""

EMPTY_REPORT: dict[str, list[Any]] = {"outcomes": [], "classifications": []}


def _messages(record: dict[str, Any]) -> Any:
    """The record's messages as stored (a list, or RawJson in the sink)."""
    return record["messages"]


def _message_list(record: dict[str, Any]) -> list[Any]:
    messages = record["messages"]
    if isinstance(messages, RawJson):
        messages = messages.value()
    if not isinstance(messages, list):
        raise ValueError(f"messages of {record.get('trace_id')!r} is not a list")
    return messages


def prompt_split(
    messages: Sequence[Any], *, at: Literal["first", "last"] = "last"
) -> tuple[list[Any], list[Any]] | None:
    """Split a conversation after its first or last user turn: (prompt, the rest).

    None when there is no user turn. The messages themselves are not copied or changed.
    """
    index = None
    for n, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            index = n
            if at == "first":
                break
    if index is None:
        return None
    return list(messages[: index + 1]), list(messages[index + 1 :])


def first_reply(messages: Sequence[Any]) -> list[Any]:
    """The messages before the first user message (after a prompt: the agent's reply)."""
    out = []
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            break
        out.append(message)
    return out


def _weighed(record: dict[str, Any], mask: TurnMask) -> list[Any]:
    return weigh(_message_list(record), report_of(record), mask).messages


def _chat_messages(record: dict[str, Any], mask: TurnMask | None, chat: Chat) -> Any:
    """The record's whole conversation, weighed and in the chat style (as stored, maybe
    RawJson, when neither changes it)."""
    if mask is None and chat.as_received:
        return _messages(record)
    messages = _message_list(record) if mask is None else _weighed(record, mask)
    return messages if chat.as_received else chat.apply(messages)


def trace_tools(record: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The tools a trace's agent had: its ``metadata.tools`` when that is a non-empty list
    of objects (tool schemas, OpenAI's shape), else None."""
    metadata = record.get("metadata")
    tools = metadata.get("tools") if isinstance(metadata, dict) else None
    if isinstance(tools, list) and tools and all(isinstance(t, dict) for t in tools):
        return tools
    return None


def _with_tools(row: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    tools = trace_tools(record)
    return row if tools is None else {**row, "tools": tools}


def render_row(
    fmt: str,
    record: dict[str, Any],
    *,
    mask: TurnMask | None = None,
    chat: Chat = HF,
    tools: bool = False,
) -> dict[str, Any] | None:
    """A live trajectory record's row in a per-record format, or None when it has none.

    ``mask`` weighs the assistant messages of ``messages`` and ``prompt_completion`` rows
    (ValueError for another format); ``chat`` is the chat style of the
    :data:`CHAT_FORMATS` (other formats ignore it); ``tools`` adds the trace's tools
    (:func:`trace_tools`, a list) to a chat format's row as ``tools`` when it has any (what
    a chat template renders it with).
    Raises ValueError for ``preference`` (pairs: :func:`preference_pairs`) and for a format
    that does not exist.
    """
    if mask is not None and fmt not in MASK_FORMATS:
        raise ValueError(f"turn masks apply to {' and '.join(MASK_FORMATS)}, not {fmt!r}")
    if fmt == "trajectory":
        return record
    if fmt == "messages":
        row = {"messages": _chat_messages(record, mask, chat)}
        return _with_tools(row, record) if tools else row
    if fmt == "rl_prompts":
        return rl_prompts_row(record)
    if fmt == "executions":
        evaluation = record.get("evaluation")
        return {
            "id": record["trace_id"],
            "conversation": _messages(record),
            "report": evaluation["report"] if evaluation else EMPTY_REPORT,
            "results": evaluation["results"] if evaluation else [],
            "reward": record.get("reward"),
            "passed": record.get("passed"),
            "reward_source": record.get("reward_source"),
            "evaluator_scores": record.get("evaluator_scores"),
            "rubric": record.get("rubric"),
            "labels_count": record.get("labels_count", 0),
            "scenario": record.get("scenario"),
            "agent_version": record.get("agent_version"),
            "org": record.get("org"),
            "project": record.get("project"),
            "revision": record.get("revision"),
            "completed_at": record.get("completed_at"),
            "updated_at": record.get("updated_at"),
        }
    if fmt in ("prompt_completion", "kto"):
        messages = _chat_messages(record, mask, chat)
        if isinstance(messages, RawJson):
            messages = messages.value()
        split = prompt_split(messages, at="last")
        if split is None or not split[1]:
            return None  # no user turn, or nothing after it: nothing to learn from
        prompt, completion = split
        if fmt == "kto":
            passed = record.get("passed")
            if not isinstance(passed, bool):
                return None  # the traces corpus has no verdict
            row = {"prompt": prompt, "completion": completion, "label": passed}
        else:
            row = {
                "prompt": prompt,
                "completion": completion,
                "reward": record.get("reward"),
                "passed": record.get("passed"),
                "trace_id": record["trace_id"],
            }
        return _with_tools(row, record) if tools else row
    if fmt == "preference":
        raise ValueError("preference pairs records: use preference_pairs, not render_row")
    raise ValueError(f"unknown format {fmt!r} (formats: {', '.join(JSONL_FORMATS)})")


def trace_index(trace_id: str) -> int:
    """An ``rl_prompts`` row's ``extra_info.index``: the first 63 bits of the SHA-256 of the
    trace id, a non-negative int64 that is the same in every file (verl keys samples on it)."""
    digest = hashlib.sha256(trace_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def rl_prompts_row(record: dict[str, Any]) -> dict[str, Any] | None:
    """verl's RL data row of a record (docs/guides/exports.md, ``rl_prompts``), or None when
    the conversation has no user message. ``prompt`` is the messages up to and including
    the first user message, as received; ``extra_info.index`` is :func:`trace_index`."""
    split = prompt_split(_message_list(record), at="first")
    if split is None:
        return None
    return {
        "data_source": record.get("scenario"),
        "prompt": split[0],
        "ability": "agent",
        "reward_model": {"style": "model", "ground_truth": None},
        "extra_info": {
            "trace_id": record["trace_id"],
            "agent_version": record.get("agent_version"),
            "reward": record.get("reward"),
            "passed": record.get("passed"),
            "index": trace_index(record["trace_id"]),
        },
    }


_EXECUTION_FIELDS = frozenset(
    ["trace_id", "evaluation"]
    + [c for c in EXECUTION_COLUMNS if c not in ("id", "conversation", "report", "results")]
)
_ROW_FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "trajectory": (frozenset(), frozenset()),  # the record is the row: its line, as stored
    "messages": (frozenset(), frozenset({"messages"})),
    "executions": (_EXECUTION_FIELDS, frozenset({"messages"})),
    "prompt_completion": (frozenset({"messages", "reward", "passed", "trace_id"}), frozenset()),
    "kto": (frozenset({"messages", "passed"}), frozenset()),
    "preference": (frozenset({"messages", "reward", "trace_id"}), frozenset()),
    "rl_prompts": (
        frozenset({"messages", "scenario", "trace_id", "agent_version", "reward", "passed"}),
        frozenset(),
    ),
}


def row_fields(
    fmt: str,
    pair_by: Sequence[str] = (),
    *,
    mask: bool = False,
    chat: Chat = HF,
    tools: bool = False,
) -> tuple[frozenset[str], frozenset[str]] | None:
    """The top-level record fields a format's rows are made of, as ``(parsed, raw)``: a
    record holding only these (``raw`` ones as :class:`~rl_export.model.codec.RawJson`,
    copied as stored) renders as the whole record does. None for a format not listed.
    With ``mask`` (turn masks) the messages and the evaluation are parsed; with a chat
    style that changes them (a chat format), the messages; with ``tools`` (a chat
    format's rows with the trace's tools), the metadata."""
    found = _ROW_FIELDS.get(fmt)
    if found is None:
        return None
    parsed, raw = found
    if tools and fmt in CHAT_FORMATS:
        parsed = parsed | {"metadata"}
    if fmt == "preference":
        parsed = parsed | set(pair_by)
    if mask:
        parsed, raw = parsed | {"messages", "evaluation"}, raw - {"messages"}
    if fmt in CHAT_FORMATS and not chat.as_received and "messages" in raw:
        parsed, raw = parsed | {"messages"}, raw - {"messages"}
    return parsed, raw


def corpus_row(
    fmt: str,
    record: dict[str, Any],
    *,
    mask: TurnMask | None = None,
    chat: Chat = HF,
    tools: bool = False,
) -> dict[str, Any] | None:
    """The row a streaming corpus of ``fmt`` holds for a live record (None: no row).

    ``trace_id`` and ``revision`` come first in every format, so the latest view,
    tombstones, compaction and ``shards verify`` work the same for every corpus.
    """
    if fmt == "trajectory" and mask is None:
        return record
    row = render_row(fmt, record, mask=mask, chat=chat, tools=tools)
    if row is None:
        return None
    return {"trace_id": record["trace_id"], "revision": record["revision"], **row}


def export_row(fmt: str, row: dict[str, Any]) -> dict[str, Any]:
    """A corpus row of a non-trajectory corpus as an export writes it (identity dropped
    where the format does not have it)."""
    columns = FORMAT_COLUMNS[fmt]
    return {k: row[k] for k in columns if k in row}


# --- preference pairs -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    """What pairing needs of one trajectory: its group, reward and identity."""

    group: bytes  # digest of the prompt (and the pair-by values)
    reward: float
    trace_id: str
    position: int = -1  # where the export found it (its place in the latest view)


def preference_group(
    record: dict[str, Any],
    pair_by: Sequence[str] = (),
    completion: Completion = "turn",
    *,
    tools: bool = False,
) -> tuple[bytes, list[Any], list[Any]] | None:
    """(group digest, prompt, completion) of a record for ``preference``; None when it
    cannot pair: no reward, no user turn, or no completion after the first user turn.

    The prompt is the messages up to and including the first user turn (system messages
    included), compared exactly: two prompts are the same when their JSON is byte for byte
    the same. ``pair_by`` fields narrow the group further. The completion is the agent's
    reply to that user message (``turn``: up to the next user message) or everything after
    the prompt (``rest``), as stored. With ``tools`` (rows for a chat template) the trace's
    tools are part of the prompt: trajectories pair only when their agents had the same.
    """
    reward = record.get("reward")
    if not isinstance(reward, int | float) or isinstance(reward, bool):
        return None
    split = prompt_split(_message_list(record), at="first")
    if split is None or not split[1]:
        return None
    prompt, rest = split
    if completion == "turn":
        rest = first_reply(rest)
        if not rest:
            return None
    digest = hashlib.sha256(dumps(prompt))
    for field in pair_by:
        digest.update(b"\0" + dumps(record.get(field)))
    if tools and (given := trace_tools(record)) is not None:
        digest.update(b"\0tools\0" + dumps(given))
    return digest.digest()[:16], prompt, rest


def pair_candidates(
    candidates: Iterable[Candidate], *, margin: float = 0.0, max_pairs: int = 1
) -> Iterator[tuple[Candidate, Candidate]]:
    """Pairs (chosen, rejected) of candidates in the same group; deterministic.

    Within a group, trajectories are taken from the highest reward down (ties by
    ``trace_id``); each is paired with the lowest-reward trajectories still free, while the
    reward gap is at least ``margin`` and not zero (equal rewards never pair), until it is in
    ``max_pairs`` pairs. Two trajectories pair at most once (a trajectory takes its lows
    once, in one pass). Groups come out in digest order.
    """
    if max_pairs < 1:
        raise ValueError(f"max_pairs must be at least 1, got {max_pairs}")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    groups: dict[bytes, list[Candidate]] = {}
    for candidate in candidates:
        groups.setdefault(candidate.group, []).append(candidate)
    for group in sorted(groups):
        members = sorted(groups[group], key=lambda c: (c.reward, c.trace_id))
        left = [max_pairs] * len(members)
        start = 0  # lows before it have no pairs left
        for high in range(len(members) - 1, -1, -1):
            if not left[high]:
                continue
            top = members[high].reward
            while start < high and not left[start]:
                start += 1
            for low in range(start, high):
                gap = top - members[low].reward
                if gap <= 0 or gap < margin:
                    break  # the lows after it are closer still
                if not left[low]:
                    continue
                left[low] -= 1
                left[high] -= 1
                yield members[high], members[low]
                if not left[high]:
                    break


def preference_pairs(
    records: Iterable[dict[str, Any]],
    *,
    pair_by: Sequence[str] = (),
    margin: float = 0.0,
    max_pairs: int = 1,
    completion: Completion = "turn",
    chat: Chat = HF,
    tools: bool = False,
) -> Iterator[dict[str, Any]]:
    """``preference`` rows from live trajectory records (held in memory: the export streams
    large corpora through :func:`pair_candidates` and a second pass instead); ``tools``:
    rows for a chat template (:func:`preference_group`, and ``tools`` on the rows)."""
    split: dict[str, tuple[list[Any], list[Any]]] = {}
    kept_tools: dict[str, list[dict[str, Any]] | None] = {}
    candidates = []
    for record in records:
        grouped = preference_group(record, pair_by, completion, tools=tools)
        if grouped is None:
            continue
        group, prompt, rest = grouped
        split[record["trace_id"]] = (prompt, rest)
        kept_tools[record["trace_id"]] = trace_tools(record) if tools else None
        candidates.append(Candidate(group, float(record["reward"]), record["trace_id"]))
    for chosen, rejected in pair_candidates(candidates, margin=margin, max_pairs=max_pairs):
        yield preference_row(
            split[chosen.trace_id][0],
            chosen,
            split[chosen.trace_id][1],
            rejected,
            split[rejected.trace_id][1],
            chat=chat,
            tools=kept_tools[chosen.trace_id],
        )


def preference_row(
    prompt: list[Any],
    chosen: Candidate,
    chosen_rest: list[Any],
    rejected: Candidate,
    rejected_rest: list[Any],
    *,
    chat: Chat = HF,
    tools: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One ``preference`` row, its messages in the chat style (the system mode applies to
    the prompt; a completion's system messages, if any, stay as they are); ``tools``: the
    pair's (its trajectories had the same), as ``tools``."""
    if not chat.as_received:
        keep = Chat(chat.style, split=chat.split)
        prompt = chat.apply(prompt)
        chosen_rest, rejected_rest = keep.apply(chosen_rest), keep.apply(rejected_rest)
    return {
        "prompt": prompt,
        "chosen": chosen_rest,
        "rejected": rejected_rest,
        "score_chosen": chosen.reward,
        "score_rejected": rejected.reward,
        "trace_chosen": chosen.trace_id,
        "trace_rejected": rejected.trace_id,
    } | ({} if tools is None else {"tools": tools})
