"""Columns of the tabular exports (pure): which, in what order, under which header, and the
value of each cell.

``--columns`` (``columns=`` in the API) is a comma list of ``PATH[:HEADER]`` in the order
wanted; ``PATH`` is a record field or a dotted nested key (``rubric.safety``,
``evaluator_scores.tone``, ``evaluation.report``, ``messages.0.content``: a number indexes a
list) and ``HEADER`` renames it. Without it: the metadata columns (``trace_id``, ``org``,
``project``, ``revision``), then every other field of the trajectory record in record order,
then, for a project whose rubric has a version past 0, one ``answers.<question>`` column per
question of its newest version (:func:`question_columns`). A path the record cannot have is
an :class:`~rl_export.model.errors.ExportError` naming it.

``answers.<question>`` is a column of its own (docs/guides/rubrics.md): the answers the trace's
current labels gave that question, in labeler order (a version-0 label answers its four
ratings; an adjudication is no label), as a list: ``["warm", "neutral"]``, ``[3, 4]``. The
means of the numeric answers are the record's ``rubric.<question>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from rl_export.model.codec import dumps
from rl_export.model.errors import ExportError
from rl_export.model.records import TrajectoryRecord
from rl_export.model.rubrics import NAME_PATTERN, V0_NAMES

METADATA_COLUMNS: tuple[str, ...] = ("trace_id", "org", "project", "revision")
RECORD_FIELDS: tuple[str, ...] = tuple(TrajectoryRecord.model_fields)

ANSWERS = "answers"
"""The columns of the answers to one question: ``answers.<question>`` (not a record field)."""
_QUESTION = re.compile(NAME_PATTERN)

# Keys under the record's objects whose set is fixed; objects not named here
# (evaluator_scores: one key per evaluator) take any key, and ``rubric`` any question name.
_FIXED_KEYS: dict[tuple[str, ...], frozenset[str]] = {
    ("evaluation",): frozenset({"evaluation_id", "occurred_at", "results", "report"}),
    ("evaluation", "report"): frozenset({"outcomes", "classifications"}),
}
_OPEN_OBJECTS = frozenset({("evaluator_scores",)})
_LISTS = frozenset(
    {
        ("messages",),
        ("labelers",),
        ("skipped_by",),
        ("attachments",),
        ("evaluation", "results"),
        ("evaluation", "report", "outcomes"),
        ("evaluation", "report", "classifications"),
    }
)


@dataclass(frozen=True)
class Column:
    """One output column: a path into the record and its header."""

    path: tuple[str, ...]
    header: str

    def getter(self) -> Callable[[dict[str, Any]], Any]:
        """:meth:`value` as a function of the record (a plain ``get`` for a top-level
        field: the cells of a large export are most of its work)."""
        if len(self.path) == 1:
            key = self.path[0]
            return lambda record: record.get(key)
        return self.value

    def value(self, record: dict[str, Any]) -> Any:
        """The cell's value: the nested value, or None when a key along the path is absent."""
        if self.path[0] == ANSWERS:
            return answers_to(record, self.path[1])
        value: Any = record
        for key in self.path:
            if isinstance(value, dict):
                value = value.get(key)
            elif isinstance(value, list) and key.isdigit():
                index = int(key)
                value = value[index] if index < len(value) else None
            else:
                return None
            if value is None:
                return None
        return value


def answers_to(record: dict[str, Any], question: str) -> list[Any] | None:
    """The answers the record's current labels gave ``question``, in labeler order (None:
    the record does not say, written before records carried ``human_labels``)."""
    labels = record.get("human_labels")
    if not isinstance(labels, list):
        return None
    found = []
    for label in labels:
        if label.get("kind", "label") != "label":
            continue
        given = label.get("answers")
        if given is None:  # a version-0 rating label
            given = label.get("rubric") if question in V0_NAMES else None
        if isinstance(given, dict) and given.get(question) is not None:
            found.append(given[question])
    return found


def default_columns(questions: Sequence[str] = ()) -> list[Column]:
    """Metadata columns first, then every other record field in record order, then the
    answers to each of ``questions``."""
    rest = [f for f in RECORD_FIELDS if f not in METADATA_COLUMNS]
    return [Column((name,), name) for name in (*METADATA_COLUMNS, *rest)] + [
        Column((ANSWERS, q), f"{ANSWERS}.{q}") for q in questions
    ]


def question_columns(questions: Sequence[str]) -> str | None:
    """The default columns with one per question, as ``--columns`` text (None: no
    questions, the record's default columns)."""
    if not questions:
        return None
    return ",".join(c.header for c in default_columns(questions))


def _check_path(spec: str, path: tuple[str, ...]) -> None:
    if not path or not all(path):
        raise ExportError("columns", f"{spec!r} is not a column (empty name)")
    if path[0] in (ANSWERS, "rubric") and len(path) >= 2:
        if len(path) > 2 or not _QUESTION.match(path[1]):
            raise ExportError("columns", f"no column {'.'.join(path)!r} ({path[0]}.QUESTION, "
                              "QUESTION a question's name)")  # fmt: skip
        return
    if path[0] == ANSWERS:
        raise ExportError("columns", "answers needs a question: answers.QUESTION")
    if path[0] not in RECORD_FIELDS:
        raise ExportError("columns", f"no column {path[0]!r} (fields: {', '.join(RECORD_FIELDS)})")
    for depth in range(1, len(path)):
        parent, key = path[:depth], path[depth]
        if parent in _FIXED_KEYS:
            if key not in _FIXED_KEYS[parent]:
                raise ExportError(
                    "columns",
                    f"no column {'.'.join(path[: depth + 1])!r} ({'.'.join(parent)} has "
                    f"{', '.join(sorted(_FIXED_KEYS[parent]))})",
                )
        elif parent in _LISTS:
            if not key.isdigit():
                raise ExportError(
                    "columns",
                    f"no column {'.'.join(path[: depth + 1])!r} ({'.'.join(parent)} is a list: "
                    f"index it with a number)",
                )
        elif parent in _OPEN_OBJECTS or (len(parent) >= 2 and parent[-1].isdigit()):
            continue  # any key of an open object, or of a list's element
        else:
            raise ExportError(
                "columns", f"no column {'.'.join(path)!r} ({'.'.join(parent)} has no nested keys)"
            )
        if parent[:1] == ("messages",) or parent[:1] == ("attachments",):
            return  # inside messages and attachments anything may be there
        if len(parent) >= 2 and parent[-1].isdigit():
            return


def parse_columns(spec: str | Sequence[str] | None) -> list[Column]:
    """Parse ``PATH[:HEADER],...`` (or a list of such items); None or empty: the defaults."""
    if spec is None:
        return default_columns()
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    items = [i.strip() for i in items]
    if not any(items):
        return default_columns()
    columns: list[Column] = []
    headers: set[str] = set()
    for item in items:
        if not item:
            raise ExportError("columns", f"an empty item in {spec!r}")
        path_text, _, header = item.partition(":")
        path = tuple(path_text.strip().split("."))
        _check_path(item, path)
        header = header.strip() or path_text.strip()
        if header in headers:
            raise ExportError("columns", f"header {header!r} is given twice")
        headers.add(header)
        columns.append(Column(path, header))
    return columns


def csv_cell(value: Any) -> str:
    """A CSV cell: text as is, null empty, booleans ``true``/``false``, numbers as JSON
    writes them, nested values one JSON-encoded cell."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    kind = type(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is float or kind is int:
        return orjson.dumps(value).decode()  # a number has no U+2028 to escape
    return dumps(value).decode()
