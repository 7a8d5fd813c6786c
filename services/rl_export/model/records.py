"""Output records (docs/guides/exports.md): the ``trajectory`` format and its tombstone.

These models are the contract trainers read; ``schemas/`` holds their JSON Schemas, generated
by :mod:`rl_export.formats.schemas` and checked against these models by the test suite.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from rl_export.model.codec import RawJson, dumps, dumps_line, escape_separators
from rl_export.model.events import EvaluatorResult, Report, UtcDatetime
from rl_export.model.pairs import COMPARISONS, ComparisonEntry
from rl_export.model.rubrics import V0_NAMES

RULES_VERSION = 1
"""Bumped whenever a join or reward rule changes meaning, so records say which rules made them."""

ERASED_REVISION = 1 << 62
"""The revision of a deleted trace's tombstone (``trace.deleted``): newer than any record's,
on whichever chain it is (a replay's, another run's), so the deletion wins over every
revision of the trace wherever it came from (docs/concepts/join-rules.md)."""

RewardSource = Literal["human", "evaluator"]


def _parsed(value: Any) -> Any:
    """Records carry messages as :class:`RawJson`; validate the value they stand for."""
    return value.value() if isinstance(value, RawJson) else value


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


RubricMean = dict[str, float | None]
"""Per question, the mean of the numeric answers of the current labels of the newest label's
rubric version (version 0: ``correctness``, ``helpfulness``, ``efficiency``, ``safety``, each
1.0..5.0); null for a question none of them answered with a number (a text)."""


class LabelDetail(_Record):
    """One current human label as submitted: who, its answers as numbers (``rubric``: a
    version-0 label's four ratings), the comment, when; for a label of another rubric version
    than 0, or an adjudication, also its version, kind, answers as given, and reward."""

    labeler: str
    rubric: dict[str, float | None] | None = Field(
        description="Each question's answer as a number (a rating's value, a boolean's 1 or "
        "0, a scored choice's reward), null where it has none; version 0: the four ratings."
    )
    comment: str | None
    occurred_at: UtcDatetime
    rubric_version: int | None = Field(
        None, ge=0, description="Absent for a version-0 rating label (docs/guides/rubrics.md)."
    )
    kind: Literal["label", "adjudication"] | None = Field(
        None, description="adjudication: a reviewer's decision, which is the human reward."
    )
    answers: dict[str, bool | int | str] | None = Field(
        None, description="The answers as given, by question name."
    )
    reward: float | None = Field(None, ge=0, le=1, description="This label's own reward.")

    @model_validator(mode="after")
    def _version_0(self) -> LabelDetail:
        """A version-0 rating label's ``rubric`` holds the four ratings, integers 1..5."""
        if self.answers is None:
            ratings = self.rubric or {}
            if sorted(ratings) != sorted(V0_NAMES) or not all(
                v is not None and v == int(v) and 1 <= v <= 5 for v in ratings.values()
            ):
                raise ValueError("a version-0 label's rubric is its four ratings, 1..5")
        return self


class EvaluationView(_Record):
    """The current evaluation, with the judges' reasoning and the report."""

    evaluation_id: str
    occurred_at: UtcDatetime
    results: list[EvaluatorResult]
    report: Report


class TrajectoryRecord(_Record):
    """One snapshot of a trace, rendered for one reward source (or none, for ``traces``)."""

    trace_id: str
    org: str
    project: str
    reward_source: RewardSource | None
    revision: int = Field(ge=1)
    reward: float | None = Field(ge=0, le=1)
    passed: bool | None
    rubric: RubricMean | None
    labels_count: int = Field(ge=0)
    labelers: list[str]
    skipped_by: list[str]
    evaluator_scores: dict[str, float] | None
    evaluation: EvaluationView | None
    messages: Annotated[list[dict[str, Any]], BeforeValidator(_parsed)]
    agent_version: str
    scenario: str
    attachments: list[dict[str, Any]]
    completed_at: UtcDatetime
    updated_at: UtcDatetime
    pass_threshold: float = Field(ge=0, le=1)
    rules_version: int = Field(ge=1)
    human_labels: list[LabelDetail] = Field(
        description="Each current label, sorted by labeler ([] when unlabeled). Schema "
        "version 2 named it `labels` (read as this field); records written before schema "
        "version 2 lack it: unknown, not empty."
    )
    metadata: dict[str, Any] = Field(
        description="The trace's metadata object as received (string values redacted like "
        "other free text). Records written before the join kept it lack the field: unknown, "
        "not empty."
    )
    comparisons: list[ComparisonEntry] | None = Field(
        None, description="The trace's current comparisons (docs/guides/comparisons.md); "
        "absent when it has none."
    )  # fmt: skip


class Tombstone(_Record):
    """A deleted (or no longer ready) trajectory: it hides every earlier revision."""

    trace_id: str
    org: str
    project: str
    reward_source: RewardSource | Literal["comparisons"] | None
    revision: int = Field(ge=1)
    deleted: Literal[True] = True


CorpusSource = RewardSource | Literal["comparisons"] | None
"""A corpus's reward source: ``human``, ``evaluator``, None for the ``traces`` corpus, or
``comparisons`` (pair records: a trace's snapshot is never ready for it)."""


def render(snapshot: dict[str, Any], source: CorpusSource) -> dict[str, Any] | None:
    """Render a join snapshot as the ``trajectory`` record of one corpus.

    Returns the tombstone of a deleted trace, the record when the trajectory is ready for
    ``source`` (always, for the ``traces`` corpus), or None when it is not ready. The sink
    writes a tombstone when a trajectory it holds stops being ready.
    """
    if snapshot["deleted"]:
        return tombstone(snapshot, source)
    scored = _scored(snapshot, source)
    if scored is None:
        return None
    return {k: scored[k] if k in scored else snapshot[k] for k in _fields(snapshot)}


def _fields(snapshot: dict[str, Any]) -> list[str]:
    """The record's fields of a snapshot: all of them, but ``human_labels`` or ``metadata``
    when the snapshot was made from a state or record kept before the field existed (unknown
    there, not empty), and ``comparisons`` when the trace has none."""
    return _FIELD_LISTS[HUMAN_LABELS in snapshot, "metadata" in snapshot, COMPARISONS in snapshot]


# --- record schema 3: ``labels`` became ``human_labels`` -----------------------------------

HUMAN_LABELS = "human_labels"
LEGACY_LABELS = "labels"
"""Record schema 2's name of ``human_labels`` (Hugging Face trainers take a ``labels`` column
for their own loss labels, so schema 3 renamed it). Readers map it: :func:`upgrade_record`,
:func:`upgrade_lines`."""
_LEGACY_KEY = b',"labels":['
_HUMAN_KEY = b',"human_labels":['
LEGACY_KEY_RE = re.compile(re.escape(_LEGACY_KEY))
"""Finds schema 2's key in JSON Lines text (also in a memoryview, which has no ``find``)."""
_BEFORE_LABELS = re.compile(rb'"rules_version":\d+$')


def upgrade_record(record: dict[str, Any]) -> dict[str, Any]:
    """A record of schema 2 (``labels``) as schema 3 (``human_labels``), in place; any other
    record or row as it is. Returns it."""
    if LEGACY_LABELS in record and HUMAN_LABELS not in record and "trace_id" in record:
        record[HUMAN_LABELS] = record.pop(LEGACY_LABELS)
    return record


def upgrade_line(line: bytes) -> bytes:
    """One JSON Lines record line of schema 2 with its ``labels`` key renamed
    ``human_labels`` (the key is the record's last, right after ``rules_version``); any
    other line as it is."""
    at = line.rfind(_LEGACY_KEY)
    if at < 0 or _BEFORE_LABELS.search(line, 0, at) is None:
        return line
    return line[:at] + _HUMAN_KEY + line[at + len(_LEGACY_KEY) :]


def upgrade_lines(data: bytes | memoryview) -> bytes | memoryview:
    """JSON Lines text with every schema-2 record line upgraded (:func:`upgrade_line`); the
    text itself when none holds the old key (one search, no copy)."""
    if LEGACY_KEY_RE.search(data) is None:
        return data
    text = bytes(data)
    return b"\n".join(upgrade_line(line) for line in text.split(b"\n"))


# The scored fields of the ``traces`` corpus, which has no reward source.
_UNSCORED: dict[str, Any] = {"reward_source": None, "reward": None, "passed": None}


def _scored(snapshot: dict[str, Any], source: CorpusSource) -> dict[str, Any] | None:
    """The fields in which the corpora's records of a live snapshot differ, or None when the
    snapshot is not ready for ``source``."""
    if source is None:
        return dict(_UNSCORED)
    reward = snapshot[source] if source != COMPARISONS else None
    if reward is None:
        return None
    return {"reward_source": source, "reward": reward["reward"], "passed": reward["passed"]}


def tombstone(snapshot: dict[str, Any], source: CorpusSource) -> dict[str, Any]:
    """The tombstone of a trace in one corpus: it hides every earlier revision."""
    return {
        "trace_id": snapshot["trace_id"],
        "org": snapshot["org"],
        "project": snapshot["project"],
        "reward_source": source,
        "revision": snapshot["revision"],
        "deleted": True,
    }


# The record's fields, in the documented order (docs/reference/schemas.md).
_RECORD_FIELDS = list(TrajectoryRecord.model_fields)
_RECORD_KEYS = frozenset(_RECORD_FIELDS)
_FIELD_LISTS = {
    (labels, metadata, compared): [
        k for k in _RECORD_FIELDS if (k != HUMAN_LABELS or labels)
        and (k != "metadata" or metadata) and (k != COMPARISONS or compared)
    ]
    for labels in (False, True) for metadata in (False, True) for compared in (False, True)
}  # fmt: skip

# What SnapshotLines leaves as holes in a snapshot's shared encoding, in record order: the
# fields in which corpora differ (``_scored``), and the messages (RawJson, most of the bytes).
_SCORED_FIELDS = tuple(k for k in _RECORD_FIELDS if k in ("reward_source", "reward", "passed"))
_HOLE_FIELDS = tuple(k for k in _RECORD_FIELDS if k in _SCORED_FIELDS or k == "messages")
_HOLES = dict.fromkeys(_HOLE_FIELDS, orjson.Fragment(b"\0"))  # written as is, by orjson
# Where each hole's value goes in the parts of a line: piece, value, piece, ..., newline.
_SCORED_SLOTS = tuple(2 * n + 1 for n, k in enumerate(_HOLE_FIELDS) if k in _SCORED_FIELDS)
_MESSAGES_SLOT = 2 * _HOLE_FIELDS.index("messages") + 1


class SnapshotLines:
    """One snapshot's records (or tombstones) for every corpus, as JSON Lines lines.

    The records of a live snapshot differ between corpora only in ``reward_source``,
    ``reward`` and ``passed``, and the messages, most of the bytes, are the same. So the
    record is encoded once per snapshot with a NUL byte in place of each of those values and
    of the messages (a "hole": JSON escapes NUL in strings and has no other place for it),
    and cut at the holes; each corpus's line joins the pieces with its own values. A value's
    bytes depend only on the value, not on what is around it, so :meth:`line` is byte for
    byte ``dumps_line(render(snapshot, source))`` (the unit tests compare the two); a
    snapshot whose encoding has a NUL byte of its own goes the plain way.

    A snapshot the join wrote in the record layout (:func:`encode_snapshot_record`) comes
    with that cut already made: :meth:`from_record` takes the pieces from the value itself
    and parses only its small parts; the whole snapshot is parsed only if a corpus asks for
    more (a filter, another format).
    """

    __slots__ = (
        "_fields", "_parts", "_record_at", "_snapshot", "_updated_at", "_value", "deleted",
        "evaluator", "human", "memo", "org", "project", "revision", "trace_id",
    )  # fmt: skip

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self._snapshot: dict[str, Any] | None = snapshot
        self._value = b""
        self.trace_id: str = snapshot["trace_id"]
        self.org: str = snapshot["org"]
        self.project: str = snapshot["project"]
        self.revision: int = snapshot["revision"]
        self.deleted: bool = bool(snapshot.get("deleted"))
        self.human: dict[str, Any] | None = snapshot.get("human")
        self.evaluator: dict[str, Any] | None = snapshot.get("evaluator")
        self._updated_at: str | None = snapshot.get("updated_at")
        # The parts of a line, scored values left empty (made when a corpus first needs a
        # line); an empty list when this snapshot's lines are encoded the plain way.
        self._parts: list[bytes] | None = None
        self._record_at: tuple[int, ...] | None = None  # c, d, messages' start and end
        self._fields: dict[str, Any] | None = None
        # What a consumer derives once per snapshot for all the corpora (the sink: the
        # snapshot's index sidecar row).
        self.memo: Any = None

    def fields(self) -> dict[str, Any]:
        """The snapshot's record fields but the messages (and the scored ones, which each
        corpus has its own of): for the index sidecars. Read from the record layout without
        its messages when the header says where they are, else the whole snapshot."""
        if self._fields is not None:
            return self._fields
        if self._snapshot is None and self._record_at is not None:
            c, d, e, f = self._record_at
            value = self._value
            try:
                found = orjson.loads(b"{" + value[c + 5 : e] + b"null" + value[f:d] + b"}")
            except orjson.JSONDecodeError:
                found = None
            if isinstance(found, dict):
                found["trace_id"], found["revision"] = self.trace_id, self.revision
                found["org"], found["project"] = self.org, self.project
                found["deleted"] = False
                self._fields = found
                return found
        self._fields = self.snapshot
        return self._fields

    @classmethod
    def from_record(cls, value: bytes, record_at: bytes) -> SnapshotLines | None:
        """The lines of a snapshot in the record layout, from its ``rl-export-record-at``
        header; None when the value does not fit the header (then it is decoded whole)."""
        try:
            a, b, c, d, *messages_at = map(int, record_at.split(b","))
        except ValueError:
            return None
        if messages_at and not (
            len(messages_at) == 2 and c < messages_at[0] <= messages_at[1] <= d
            and value.startswith(_MESSAGES, messages_at[0] - len(_MESSAGES))
        ):  # fmt: skip
            return None
        if value.find(_HUMAN_KEY, c, d) < 0 and value.find(_LEGACY_KEY, c, d) >= 0:
            return None  # schema 2's layout (labels): decoded whole, which renames it
        if not (
            value.startswith(b"null", a) and value.startswith(b"null", c)
            and value.startswith(_REWARD_NULL, b - len(b',"reward":'))
            and value.startswith(_REVISION, a + 4) and value.startswith(_TAIL, d)
            and value.endswith(b"}") and value[a - len(_SOURCE) : a] == _SOURCE
        ):  # fmt: skip
            return None
        try:
            head = orjson.loads(value[: a - len(_SOURCE)] + b"}")
            tail = orjson.loads(b"{" + value[d + 1 :])
            revision = int(value[a + 4 + len(_REVISION) : b - len(b',"reward":')])
            at = value.rindex(_UPDATED_AT, 0, d) + len(_UPDATED_AT)
            updated_at = value[at : value.index(b'"', at)].decode()
        except (orjson.JSONDecodeError, ValueError):
            return None
        if (
            type(head) is not dict or type(tail) is not dict or tail.get("deleted") is not False
            or not all(type(head.get(k)) is str for k in ("trace_id", "org", "project"))
        ):  # fmt: skip
            return None
        lines = cls.__new__(cls)
        lines._snapshot = None
        lines._value = value
        lines.trace_id, lines.org, lines.project = head["trace_id"], head["org"], head["project"]
        lines.revision = revision
        lines.deleted = False
        lines.human, lines.evaluator = tail.get("human"), tail.get("evaluator")
        lines._updated_at = updated_at
        lines._parts = [
            value[:a], b"", value[a + 4 : b], b"", value[b + 4 : c], b"", value[c + 4 : d], b"",
            b"}", b"\n",
        ]  # fmt: skip
        lines._record_at = (c, d, *messages_at) if messages_at else None
        lines._fields = None
        lines.memo = None
        return lines

    @property
    def snapshot(self) -> dict[str, Any]:
        """The whole snapshot (parsed on first use when it came in the record layout)."""
        if self._snapshot is None:
            self._snapshot = decode_snapshot(self._value)
        return self._snapshot

    @property
    def updated_at(self) -> str:
        """The ``updated_at`` of a :meth:`ready` snapshot's records."""
        if self._updated_at is None:
            stamp: str = self.snapshot["updated_at"]
            return stamp
        return self._updated_at

    def _scored(self, source: CorpusSource) -> dict[str, Any] | None:
        """``_scored(snapshot, source)``, from the fields kept apart."""
        if source is None:
            return _UNSCORED
        reward = {"human": self.human, "evaluator": self.evaluator}.get(source)
        if reward is None:
            return None
        return {"reward_source": source, "reward": reward["reward"], "passed": reward["passed"]}

    def ready(self, source: CorpusSource) -> bool:
        """True when ``render(snapshot, source)`` is a record: not deleted, ready for source."""
        return not self.deleted and self._scored(source) is not None

    def value(self, source: CorpusSource, key: str) -> Any:
        """``render(snapshot, source).get(key)`` of a :meth:`ready` snapshot (for filters)."""
        if key in _SCORED_FIELDS:
            scored = self._scored(source)
            return None if scored is None else scored[key]
        return self.snapshot.get(key) if key in _RECORD_KEYS else None

    def line(self, source: CorpusSource) -> bytes:
        """``dumps_line(render(snapshot, source))`` of a :meth:`ready` snapshot."""
        scored = None if self.deleted else self._scored(source)
        if scored is None:
            raise ValueError(f"the snapshot is not ready for {source!r}")
        if self._parts is None:
            self._parts = self._cut()
        if not self._parts:
            return dumps_line(render(self.snapshot, source))
        parts = self._parts.copy()
        if source is None:
            values = _UNSCORED_VALUES
        else:
            values = _encode_each([scored[k] for k in _SCORED_FIELDS])
        for slot, value in zip(_SCORED_SLOTS, values, strict=True):
            parts[slot] = value
        return b"".join(parts)

    def _cut(self) -> list[bytes]:
        """The record's encoding with holes, cut at them, the messages and the newline put
        in: the parts of every line. [] if the encoding has a NUL byte of its own."""
        holes, snapshot = _HOLES, self.snapshot
        data = dumps({k: holes[k] if k in holes else snapshot[k] for k in _fields(snapshot)})
        pieces = data.split(b"\0")
        if len(pieces) != len(holes) + 1:
            return []
        parts = [b""] * (2 * len(pieces))
        parts[::2] = pieces
        parts[_MESSAGES_SLOT] = _verbatim(snapshot["messages"])
        parts[-1] = b"\n"
        return parts

    def tombstone_line(self, source: CorpusSource) -> bytes:
        """``dumps_line(tombstone(snapshot, source))``: rare, so encoded the plain way."""
        return dumps_line(
            {"trace_id": self.trace_id, "org": self.org, "project": self.project,
             "reward_source": source, "revision": self.revision, "deleted": True}
        )  # fmt: skip


# The record layout's fixed bytes around what :meth:`SnapshotLines.from_record` reads.
_SOURCE = b',"reward_source":'
_REVISION = b',"revision":'
_REWARD_NULL = b',"reward":null'
_UPDATED_AT = b',"updated_at":"'
_TAIL = b',"human":'
_MESSAGES = b',"messages":'


def _encode_each(values: list[Any]) -> list[bytes]:
    """``[dumps(v) for v in values]``, in one call when no value's JSON has a comma.

    The scored values are a source name, a number, a bool or null; the JSON of the list is
    then theirs joined by commas. Any other comma means more pieces than values.
    """
    pieces = dumps(values)[1:-1].split(b",")
    return pieces if len(pieces) == len(values) else [dumps(v) for v in values]


# The scored values of the ``traces`` corpus (no reward source): the same for every snapshot.
_UNSCORED_VALUES = [dumps(_UNSCORED[k]) for k in _SCORED_FIELDS]


def _verbatim(messages: Any) -> bytes:
    """``dumps(messages)``, and the very bytes of a :class:`RawJson` when nothing in them
    needs escaping (no copy of a conversation, most of a record's bytes)."""
    if isinstance(messages, RawJson):
        return escape_separators(messages.data)
    return dumps(messages)


# --- snapshots on the trajectories topic ----------------------------------------------------

HEADER_EVENT_MS = "rl-export-event-ms"
"""Header of a snapshot: the Kafka timestamp (ms) of the event that caused it."""

HEADER_RECORD_AT = "rl-export-record-at"
"""Header of a live snapshot in the record layout: where its scored values and its tail are."""

Headers = list[tuple[str, bytes]]

_HOLE = orjson.Fragment(b"\0")


def encode_snapshot(snapshot: dict[str, Any]) -> tuple[bytes, Headers]:
    """A snapshot as the value of a ``trajectories`` message, and the headers that go with it.

    The value is one JSON object, so any consumer can read the topic. A live snapshot is in
    the record layout (:func:`encode_snapshot_record`) with its ``rl-export-record-at``
    header; a tombstone is the tombstone object, without.
    """
    if not snapshot.get("deleted"):
        encoded = encode_snapshot_record(snapshot)
        if encoded is not None:
            value, record_at = encoded
            return value, [(HEADER_RECORD_AT, record_at)]
    return dumps(snapshot), []


def encode_snapshot_record(snapshot: dict[str, Any]) -> tuple[bytes, bytes] | None:
    """A live snapshot in the record layout, and its ``rl-export-record-at`` header.

    The value is one JSON object: the ``traces`` corpus's record (the record's fields in
    order, ``reward_source``, ``reward`` and ``passed`` null), then ``human``, ``evaluator``
    and ``deleted``. The header gives the byte offsets of the three nulls, of the
    ``,"human":`` that ends the record and of the messages' first and last byte + 1
    (``a,b,c,d,e,f``), so the sink makes every corpus's line from the value's own bytes
    (:meth:`SnapshotLines.from_record`) without encoding it again, and reads the record's
    other fields without parsing the messages. (A sink of before the messages' offsets takes
    six numbers for a header it does not know and parses the value whole: slower, the same.)
    None when the encoding holds a NUL byte of its own.
    """
    data = dumps({k: _HOLE if k in _HOLES else snapshot[k] for k in _fields(snapshot)})
    pieces = data.split(b"\0")
    if len(pieces) != 5:
        return None
    messages = _verbatim(snapshot["messages"])
    tail = dumps({"human": snapshot["human"], "evaluator": snapshot["evaluator"], "deleted": False})
    a = len(pieces[0])
    b = a + 4 + len(pieces[1])
    c = b + 4 + len(pieces[2])
    e = c + 4 + len(pieces[3])
    f = e + len(messages)
    d = f + len(pieces[4]) - 1
    value = b"".join(
        (pieces[0], b"null", pieces[1], b"null", pieces[2], b"null", pieces[3], messages,
         pieces[4][:-1], b",", tail[1:])
    )  # fmt: skip
    return value, f"{a},{b},{c},{d},{e},{f}".encode()


def decode_snapshot(value: bytes) -> dict[str, Any]:
    """The snapshot a ``trajectories`` value holds; messages come back as :class:`RawJson`.

    The value is parsed whole (the sink reads most values without that, through
    :meth:`SnapshotLines.from_record`). Values written as two JSON lines (the snapshot,
    then its messages: the encoding before version 0.2) still decode. Raises ValueError when
    the value is not a snapshot.
    """
    try:
        snapshot = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        if b"\n" not in value:
            raise ValueError(f"not JSON: {exc}") from None
        snapshot = _decode_two_lines(value)
    else:
        if isinstance(snapshot, dict):
            if LEGACY_LABELS in snapshot and HUMAN_LABELS not in snapshot:  # schema 2
                snapshot[HUMAN_LABELS] = snapshot.pop(LEGACY_LABELS)
            if "reward_source" in snapshot:  # the record layout: its record-only fields go
                for key in _SCORED_FIELDS:
                    snapshot.pop(key, None)
            if isinstance(snapshot.get("messages"), list):
                snapshot["messages"] = RawJson(dumps(snapshot["messages"]))
    _check_snapshot(snapshot)
    return snapshot  # type: ignore[no-any-return]


def _decode_two_lines(value: bytes) -> dict[str, Any]:
    head, _, messages = value.partition(b"\n")
    try:
        snapshot = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(snapshot, dict):
        raise ValueError("not a JSON object")
    if not (messages.startswith(b"[") and messages.endswith(b"]")):
        raise ValueError("the second line is not a list of messages")
    snapshot["messages"] = RawJson(messages)
    return snapshot


def _check_snapshot(snapshot: Any) -> None:
    if type(snapshot) is not dict:
        raise ValueError("not a JSON object")
    for key in ("trace_id", "org", "project"):
        if type(snapshot.get(key)) is not str:
            raise ValueError(f"{key} is not a string")
    revision = snapshot.get("revision")
    if type(revision) is not int or not 0 <= revision < 2**63:
        raise ValueError("revision is not a count")
    if type(snapshot.get("deleted", False)) is not bool:
        raise ValueError("deleted is not true or false")
    if not isinstance(snapshot.get("updated_at"), str | None):
        raise ValueError("updated_at is not a time")
    if not snapshot.get("deleted") and type(snapshot.get("messages")) is not RawJson:
        raise ValueError("a live snapshot without messages")
