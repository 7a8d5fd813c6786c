"""The structural fields: the only strings redaction does not scan (DESIGN.md section 10).

Redaction denies by default: every string of a record or of a row any format writes is
scanned, keys of free-form objects included, wherever it sits and whatever its key, except
the fields named here. They hold ids, names, enum values and datetimes that the join and the
formats put there, never free text:

``trace_id``, ``org``, ``project``, ``reward_source``, ``agent_version``, ``scenario``,
``event_id``, ``evaluation_id``, ``labeler`` (and the lists of labelers), evaluator names (an
evaluation result's ``evaluator``, the keys of ``evaluator_scores``), a message's ``role``, a
tool call's ``id``, ``type`` and function ``name``, ``tool_call_id``, a content part's
``type``, ``rubric_version``, ``choice``, the datetimes ``completed_at``, ``updated_at`` and
``occurred_at``; numbers, booleans and null are no strings. Rows of other formats carry some
of them under their own names (``id``, ``trace_chosen``, ``data_source``, ``extra_info``).

:data:`STRUCTURAL` is that list as a tree, the one place it is written;
:mod:`rl_export.privacy.redact` walks records by it, and its line path skips a top-level field
only when :func:`scalar_field` says the tree makes it structural. How to read the tree:

- :data:`ID`: a structural string (an id, a name, an enum, a datetime);
- :data:`FREE`: free text, scanned whole (a field of the layout: its key is ours);
- a dict: an object whose named fields follow their own spec; every other field (an
  unknown extra field) is free text, its key and its value scanned whole;
- :class:`Each`: a list whose items follow one spec;
- :class:`Names`: an object whose keys are structural names and whose values follow a spec;
- :data:`JSON_TEXT`: a string holding JSON (tool-call arguments), scanned as the JSON it holds,
  keys included, and written back as JSON.

A value whose type is not the one its spec expects (a string where a list of parts is
allowed, an object where an id should be) is free text, scanned whole.

Pure: no imports beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Union


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


ID: Final = _Marker("ID")
"""A structural string: never scanned."""
JSON_TEXT: Final = _Marker("JSON_TEXT")
"""A string holding JSON: its strings and keys are scanned, and it stays JSON."""


@dataclass(frozen=True, slots=True)
class Each:
    """A list whose items follow ``item``."""

    item: Spec


@dataclass(frozen=True, slots=True)
class Names:
    """An object whose keys are structural names; its values follow ``value`` (None: free)."""

    value: Spec = None


Spec = Union[_Marker, dict[str, "Spec"], Each, Names, None]  # noqa: UP007 - a recursive alias
"""Where a value sits: None is free text (everything in it scanned)."""

FREE: Final = None
"""Free text: a field of the layout whose key is ours and whose value is scanned whole."""

_CALL: dict[str, Spec] = {
    "id": ID,
    "type": ID,
    "function": {"name": ID, "arguments": JSON_TEXT},
}
MESSAGE: dict[str, Spec] = {
    "role": ID,
    "tool_call_id": ID,
    "tool_calls": Each(_CALL),
    "function_call": {"name": ID, "arguments": JSON_TEXT},  # the legacy single call
    "content": Each({"type": ID, "text": FREE}),  # a part: its type; all else is free
    "name": FREE,
    "refusal": FREE,
    "reasoning_content": FREE,
    "metadata": FREE,
    "weight": FREE,
}
MESSAGES: Final = Each(MESSAGE)
_LABEL: dict[str, Spec] = {
    "labeler": ID,
    "occurred_at": ID,
    "rubric_version": ID,
    "rubric": FREE,
    "comment": FREE,
    "kind": FREE,
    "answers": FREE,
}
_RESULT: dict[str, Spec] = {"evaluator": ID, "score": FREE, "passed": FREE, "reasoning": FREE}

STRUCTURAL: Final[dict[str, Spec]] = {
    # a trajectory record's (and an event's) own fields
    "trace_id": ID,
    "org": ID,
    "project": ID,
    "reward_source": ID,
    "agent_version": ID,
    "scenario": ID,
    "event_id": ID,
    "evaluation_id": ID,
    "labeler": ID,
    "rubric_version": ID,
    "choice": ID,
    "completed_at": ID,
    "updated_at": ID,
    "occurred_at": ID,
    "labelers": Each(ID),
    "skipped_by": Each(ID),
    "evaluator_scores": Names(),
    "evaluation": {
        "evaluation_id": ID,
        "occurred_at": ID,
        "results": Each(_RESULT),
        "report": FREE,
    },
    "human_labels": Each(_LABEL),
    "labels": Each(_LABEL),  # record schema 2's name of human_labels
    "revision": FREE,
    "reward": FREE,
    "passed": FREE,
    "rubric": FREE,
    "labels_count": FREE,
    "attachments": FREE,
    "pass_threshold": FREE,
    "rules_version": FREE,
    "metadata": FREE,
    "deleted": FREE,
    # the conversations of every format
    "messages": MESSAGES,
    "conversation": MESSAGES,
    "prompt": MESSAGES,
    "completion": MESSAGES,
    "chosen": MESSAGES,
    "rejected": MESSAGES,
    # the record's structural fields as other formats name them, and their own fields
    "results": Each(_RESULT),  # executions
    "report": FREE,
    "id": ID,  # executions: the trace id
    "trace_chosen": ID,  # preference
    "trace_rejected": ID,
    "score_chosen": FREE,
    "score_rejected": FREE,
    "label": FREE,  # kto
    "data_source": ID,  # rl_prompts: the scenario
    "ability": FREE,
    "reward_model": FREE,
    "extra_info": {
        "trace_id": ID,
        "agent_version": ID,
        "reward": FREE,
        "passed": FREE,
        "index": FREE,
    },
}
"""The structural fields of a record or a row of any format, by where they sit, and the
other keys of that layout (:data:`FREE`: their values are scanned, the keys are ours)."""


def layout_words() -> frozenset[str]:
    """Every key the layout names, and JSON's own words: what a gate on JSON text would best
    not open for (it finds them in every line)."""
    words = {"true", "false", "null"}

    def walk(spec: Spec) -> None:
        if isinstance(spec, dict):
            words.update(spec)
            for sub in spec.values():
                walk(sub)
        elif isinstance(spec, Each):
            walk(spec.item)
        elif isinstance(spec, Names):
            walk(spec.value)

    walk(STRUCTURAL)
    return frozenset(words)


def is_scalar(value: Any) -> bool:
    """Whether a JSON value holds no string to scan where its spec is :data:`ID`."""
    return value is None or isinstance(value, str | int | float | bool)


def scalar_field(key: str) -> bool:
    """Whether a top-level field named ``key`` is structural when its value is a scalar (the
    line path skips such a field's bytes)."""
    return STRUCTURAL.get(key) is ID
