"""Snapshots on the ``trajectories`` topic: their encoding (the record layout and its
header), decoding, and :class:`SnapshotLines`, which makes every corpus's line of a snapshot
from one encoding.

The records themselves (their models, :func:`~rl_export.model.records.render` and the
tombstone) are :mod:`rl_export.model.records`'.
"""

from __future__ import annotations

from typing import Any

import orjson

from rl_export.model.codec import RawJson, dumps, dumps_line, escape_separators
from rl_export.model.records import (
    HUMAN_KEY,
    HUMAN_LABELS,
    LEGACY_KEY,
    LEGACY_LABELS,
    RECORD_FIELDS,
    RECORD_KEYS,
    UNSCORED,
    CorpusSource,
    record_fields,
    render,
)


def _native_reader() -> Any:
    """The join's native core's reader of the record layout, when the core is built."""
    try:
        from rl_export_native import read_record
    except ImportError:
        return None
    return read_record


_read_record = _native_reader()

# What SnapshotLines leaves as holes in a snapshot's shared encoding, in record order: the
# fields in which corpora differ (``_scored``), and the messages (RawJson, most of the bytes).
_SCORED_FIELDS = tuple(k for k in RECORD_FIELDS if k in ("reward_source", "reward", "passed"))
_HOLE_FIELDS = tuple(k for k in RECORD_FIELDS if k in _SCORED_FIELDS or k == "messages")
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
        "_parts",
        "_record_at",
        "_snapshot",
        "_updated_at",
        "_value",
        "deleted",
        "evaluator",
        "human",
        "memo",
        "org",
        "project",
        "record_fields",
        "revision",
        "trace_id",
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
        self.record_fields: dict[str, Any] | None = None
        # What a consumer derives once per snapshot for all the corpora (the sink: the
        # snapshot's index sidecar row).
        self.memo: Any = None

    def fields(self) -> dict[str, Any]:
        """The snapshot's record fields but the messages (and the scored ones, which each
        corpus has its own of): for the index sidecars. Read from the record layout without
        its messages when the header says where they are, else the whole snapshot."""
        if self.record_fields is not None:
            return self.record_fields
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
                self.record_fields = found
                return found
        self.record_fields = self.snapshot
        return self.record_fields

    @classmethod
    def from_record(cls, value: bytes, record_at: bytes) -> SnapshotLines | None:
        """The lines of a snapshot in the record layout, from its ``rl-export-record-at``
        header; None when the value does not fit the header (then it is decoded whole).

        The join's native core reads what the join writes (``rl_export_native.read_record``,
        the same answer: ``tests/unit/stream/test_native.py``); the rest is read here.
        """
        if _read_record is not None:
            found = _read_record(value, record_at)
            if found is not None:
                a, b, c, d, messages = found[7:]
                return cls._of_record(value, found[:7], a, b, c, d, messages)
        try:
            a, b, c, d, *messages_at = map(int, record_at.split(b","))
        except ValueError:
            return None
        if messages_at and not (
            len(messages_at) == 2 and c < messages_at[0] <= messages_at[1] <= d
            and value.startswith(_MESSAGES, messages_at[0] - len(_MESSAGES))
        ):  # fmt: skip
            return None
        if value.find(HUMAN_KEY, c, d) < 0 and value.find(LEGACY_KEY, c, d) >= 0:
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
        fields = (head["trace_id"], head["org"], head["project"], revision, tail.get("human"),
                  tail.get("evaluator"), updated_at)  # fmt: skip
        pair = (messages_at[0], messages_at[1]) if messages_at else None
        return cls._of_record(value, fields, a, b, c, d, pair)

    @classmethod
    def _of_record(  # noqa: PLR0917 - the header's offsets, in its order
        cls, value: bytes, fields: tuple[Any, ...], a: int, b: int, c: int, d: int,
        messages_at: tuple[int, int] | None,
    ) -> SnapshotLines:  # fmt: skip
        """The lines of a value in the record layout, checked and read: its identity,
        revision, rewards and ``updated_at``, and the header's offsets."""
        lines = cls.__new__(cls)
        lines._snapshot = None
        lines._value = value
        (lines.trace_id, lines.org, lines.project, lines.revision, lines.human, lines.evaluator,
         lines._updated_at) = fields  # fmt: skip
        lines.deleted = False
        lines._parts = [
            value[:a], b"", value[a + 4 : b], b"", value[b + 4 : c], b"", value[c + 4 : d], b"",
            b"}", b"\n",
        ]  # fmt: skip
        lines._record_at = (c, d, *messages_at) if messages_at else None
        lines.record_fields = None
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
            return UNSCORED
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
        return self.snapshot.get(key) if key in RECORD_KEYS else None

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
        data = dumps({k: holes[k] if k in holes else snapshot[k] for k in record_fields(snapshot)})
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
_UNSCORED_VALUES = [dumps(UNSCORED[k]) for k in _SCORED_FIELDS]


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
    data = dumps({k: _HOLE if k in _HOLES else snapshot[k] for k in record_fields(snapshot)})
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
