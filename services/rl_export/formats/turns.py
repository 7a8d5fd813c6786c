"""Turns of a conversation and per-turn loss masks from an evaluation's report (pure).

docs/guides/exports.md, "Turns and per-turn masks": a report outcome's ``turn`` is 1-based; turn
*n* is the *n*-th user message and every message after it up to the next user message (the
agent's reply: assistant messages, tool calls, tool results); messages before the first user
message (system prompts) belong to no turn.

``--mask-failed-turns`` gives every assistant message a ``"weight"``: 0 when its turn has an
outcome with ``decision: false`` (of any type, or only of the types ``--mask-types`` names),
else 1. That is OpenAI's chat fine-tuning convention (``weight`` only on assistant messages,
0 or 1); verl and TRL users turn it into a loss mask. Nothing else of a message changes,
with one exception the validator forces: a ``weight`` key that arrived on a message of
another role is dropped (OpenAI refuses ``weight`` outside assistant messages).

A failing outcome whose turn is outside the conversation (0, negative, or past the last
user message) masks nothing and is counted (:attr:`Weighed.outside`), so an export can say
how many it met. An outcome without a turn is about the whole run: it masks nothing and is
not counted (filter such runs with ``--passed`` or ``--pass-dimension``).

Public interface::

    class TurnMask(types: frozenset[str] | None = None)    # None: every outcome type
        def failing_turns(report) -> list[int]
    def parse_mask_types(text) -> frozenset[str] | None
    def turn_numbers(messages) -> list[int]                 # 0: no turn
    def weigh(messages, report, mask) -> Weighed            # (messages, outside)
    def outside_turns(messages, report, mask) -> int        # weigh's count, without weighing
    def report_of(record) -> dict | None                    # the current evaluation's report
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

WEIGHT = "weight"


def _is_user(message: Any) -> bool:
    # dict, not the Mapping ABC: messages are parsed JSON, and the ABC's check costs several
    # times the rest of a message's weighing in an export.
    return isinstance(message, dict) and message.get("role") == "user"


def turn_numbers(messages: Sequence[Any]) -> list[int]:
    """The turn of every message, in order: 1 for the first user message and the messages
    after it up to the next user message, 2 for the second, ...; 0 before the first."""
    turn = 0
    out = []
    for message in messages:
        if _is_user(message):
            turn += 1
        out.append(turn)
    return out


def parse_mask_types(text: str | Iterable[str] | None) -> frozenset[str] | None:
    """``goal_met,tool_use`` (or a list) -> the outcome types that mask; None or nothing
    given -> every type. Raises ValueError for an empty name between commas."""
    if text is None:
        return None
    items = text.split(",") if isinstance(text, str) else list(text)
    names = [item.strip() for item in items]
    if any(not name for name in names):
        raise ValueError(f"{text!r} has an empty outcome type (give TYPE,TYPE,...)")
    return frozenset(names) or None


@dataclass(frozen=True, slots=True)
class TurnMask:
    """Which outcomes mask a turn: ``decision: false`` ones, of every type (``types`` None)
    or of the types named."""

    types: frozenset[str] | None = None

    def failing(self, outcome: Any) -> bool:
        """Whether an outcome says its turn went wrong (and is of a type that masks)."""
        if not isinstance(outcome, dict) or outcome.get("decision") is not False:
            return False
        return self.types is None or outcome.get("type") in self.types

    def failing_turns(self, report: Any) -> list[int]:
        """The turns of the report's failing outcomes (as given: maybe outside the
        conversation), in report order; outcomes without an integer turn left out."""
        outcomes = report.get("outcomes") if isinstance(report, dict) else None
        if not isinstance(outcomes, list):
            return []
        turns = []
        for outcome in outcomes:
            if self.failing(outcome):
                turn = outcome.get("turn")
                if isinstance(turn, int) and not isinstance(turn, bool):
                    turns.append(turn)
        return turns


class Weighed(NamedTuple):
    """A conversation with its weights, and how many failing outcomes fell outside it."""

    messages: list[Any]
    outside: int


def _users(messages: Sequence[Any]) -> int:
    return sum(1 for message in messages if _is_user(message))


def outside_turns(messages: Sequence[Any], report: Any, mask: TurnMask) -> int:
    """How many failing outcomes of ``report`` name a turn the conversation does not have
    (what :func:`weigh` counts, without weighing)."""
    failing = mask.failing_turns(report)
    if not failing:
        return 0
    users = _users(messages)
    return sum(1 for turn in failing if not 1 <= turn <= users)


def weigh(messages: Sequence[Any], report: Any, mask: TurnMask) -> Weighed:
    """The messages with a ``weight`` on every assistant message (see the module).

    The list and the messages that get or lose a weight are copies; the others are the
    objects given. ``report`` is the evaluation's report (None when there is none: every
    weight is then 1).
    """
    failing = mask.failing_turns(report)
    users = _users(messages)
    masked = {turn for turn in failing if 1 <= turn <= users}
    outside = sum(1 for turn in failing if not 1 <= turn <= users)
    out: list[Any] = []
    turn = 0
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        role = message.get("role")
        if role == "user":
            turn += 1
        if role == "assistant":
            out.append({**message, WEIGHT: 0 if turn in masked else 1})
        elif WEIGHT in message:
            out.append({k: v for k, v in message.items() if k != WEIGHT})
        else:
            out.append(message)
    return Weighed(out, outside)


def report_of(record: Mapping[str, Any]) -> Any:
    """The current evaluation's report of a trajectory record (None without one)."""
    evaluation = record.get("evaluation")
    return evaluation.get("report") if isinstance(evaluation, dict) else None
