"""A trace state's bytes in the join's table: versioned, pure.

Version 3 (written now) is framed: one version byte (3), the length of a JSON head (4 bytes,
little-endian), the head, then the JSON the state keeps as is, one after another, their
lengths listed in the head: the attachments, the trace's metadata (when the trace's head has a
sixth item; states kept before metadata was kept have none), the evaluation's view and
scores, the raw bytes of each waiting event. Loading parses the head only. The head's
fifteenth item is the adjudication and the sixteenth the trace's pairs (comparisons), each
only in a state that has one, so other states keep their bytes. The conversation
is kept apart (the join's table has a key of its own for it); :func:`dump_state` puts it
last.
Versions 1 and 2 were one JSON object (conversation inline in 1, on a second line in 2);
they are still read.
"""

from __future__ import annotations

import struct
from typing import Any

import orjson

from rl_export.model.codec import RawJson
from rl_export.stream.comparisons import dump_pairs, load_pairs
from rl_export.stream.join import (
    EvaluationView,
    LabelView,
    OrderKey,
    Pending,
    RawEvent,
    TraceState,
    TraceView,
    evaluation_view,
    trace_view,
)

STATE_VERSION = 3  # 1, 2: one JSON object (messages inline; on a second line); 3: framed

_HEAD_LENGTH = struct.Struct("<I")


def dump_state(st: TraceState) -> bytes:
    """Serialise a whole state (its conversation last); equal states give equal bytes."""
    head, conversation = dump_state_parts(st)
    return head + conversation


def dump_state_parts(st: TraceState) -> tuple[bytes, bytes]:
    """The state without its conversation, and the conversation (b"" when there is none)."""
    segments: list[bytes] = []
    trace = st.trace
    trace_head = None
    if trace is not None:
        segments.append(trace.attachments.data)
        trace_head = [*trace.key, trace.agent_version, trace.scenario, trace.completed_at]
        if trace.metadata is not None:  # a sixth item: the metadata is the next segment
            segments.append(trace.metadata.data)
            trace_head.append(1)
    evaluation = st.evaluation
    evaluation_head = None
    if evaluation is not None:
        segments.append(evaluation.view.data)
        segments.append(b"" if evaluation.scores is None else evaluation.scores.data)
        evaluation_head = [*evaluation.key, evaluation.evaluation_id, evaluation.reward,
                           evaluation.passed]  # fmt: skip
    pending = []
    for p in st.pending:
        raw = p.raw
        segments.append(raw.value)
        pending.append([p.event_id, raw.topic, raw.partition, raw.offset, raw.timestamp_ms])
    fields = [
        st.trace_id, st.org, st.project, sorted(st.seen), st.first_pending_at, trace_head,
        evaluation_head,
        [_label_item(k, v) for k, v in sorted(st.labels.items())],
        sorted(st.skipped_by), st.updated_at, st.deleted_at, st.deleted_revision, pending,
        [len(s) for s in segments],
    ]  # fmt: skip
    if st.adjudication is not None or st.pairs:  # 15th, 16th items only then: other states
        fields.append(None if st.adjudication is None else _label_item(*st.adjudication))
    if st.pairs:  # keep their bytes
        fields.append(dump_pairs(st.pairs))
    head = orjson.dumps(fields)
    conversation = b"" if trace is None else trace.messages.data
    return b"".join([b"\x03", _HEAD_LENGTH.pack(len(head)), head, *segments]), conversation


def _label_item(labeler: str, view: LabelView) -> list[Any]:
    """A label in the head: ``[labeler, micros, event_id]``, then a version-0 rating label's
    four ratings, or another label's ``{"v": version, "a": answers}``, and its comment when
    it has one (a retraction has neither; states written before comments were kept end after
    the ratings and load with none)."""
    item: list[Any] = [labeler, *view.key, *(view.rubric or ())]
    if view.answers is not None:
        item.append({"v": view.version, "a": view.answers})
    if view.comment is not None:
        item.append(view.comment)
    return item


def _label_view(item: list[Any]) -> LabelView:
    """Inverse of :func:`_label_item` (without the labeler)."""
    key = (item[1], item[2])
    if len(item) > 3 and isinstance(item[3], dict):
        comment = item[4] if len(item) > 4 else None
        return LabelView(key, None, comment, item[3]["a"], item[3]["v"])
    return LabelView(
        key,
        (item[3], item[4], item[5], item[6]) if len(item) > 3 else None,
        item[7] if len(item) > 7 else None,
    )


def load_state(data: bytes, conversation: bytes | None = None) -> TraceState:
    """Inverse of :func:`dump_state`, or of :func:`dump_state_parts` given both parts.

    Reads versions 1 and 2 too. A state whose trace's conversation is neither in ``data``
    nor given has an empty one (the caller reads it from where it is kept).
    """
    if data[:1] == b"{":
        return _load_json_state(data)
    if data[:1] != b"\x03":
        raise ValueError(f"unknown trace state version {data[:1]!r}")
    (length,) = _HEAD_LENGTH.unpack_from(data, 1)
    start = 5 + length
    d = orjson.loads(data[5:start])
    (trace_id, org, project, seen, first_pending_at, trace_head, evaluation_head, labels,
     skipped_by, updated_at, deleted_at, deleted_revision, pending_heads,
     sizes) = d[:14]  # fmt: skip
    adjudication = None if len(d) < 15 or d[14] is None else (d[14][0], _label_view(d[14]))
    segments = []
    for size in sizes:
        segments.append(data[start : start + size])
        start += size
    rest = data[start:] if conversation is None else conversation
    taken = 0
    trace = None
    if trace_head is not None:
        at, eid, agent_version, scenario, completed_at, *kept = trace_head
        # States written before the join kept metadata have five items and no segment.
        metadata = RawJson(segments[1]) if kept else None
        trace = TraceView((at, eid), agent_version, scenario, RawJson(rest),
                          RawJson(segments[0]), completed_at, metadata)  # fmt: skip
        taken = 2 if kept else 1
    evaluation = None
    if evaluation_head is not None:
        at, eid, evaluation_id, reward, passed = evaluation_head
        scores = segments[taken + 1]
        evaluation = EvaluationView(
            (at, eid), evaluation_id, RawJson(segments[taken]),
            RawJson(scores) if scores else None, reward, passed,
        )  # fmt: skip
        taken += 2
    pending = [
        Pending(p[0], RawEvent(raw, p[1], p[2], p[3], p[4]))
        for p, raw in zip(pending_heads, segments[taken:], strict=True)
    ]
    return TraceState(
        trace_id=trace_id,
        org=org,
        project=project,
        seen=set(seen),
        pending=pending,
        first_pending_at=first_pending_at,
        trace=trace,
        evaluation=evaluation,
        labels={
            item[0]: LabelView(
                (item[1], item[2]),
                (item[3], item[4], item[5], item[6]) if len(item) > 3 else None,
                item[7] if len(item) > 7 else None,
            )
            if len(item) < 4 or type(item[3]) is not dict
            else _label_view(item)
            for item in labels
        },  # a version-0 label (or a retraction) made here: one call less per label
        skipped_by=set(skipped_by),
        updated_at=updated_at,
        deleted_at=deleted_at,
        deleted_revision=deleted_revision,
        adjudication=adjudication,
        pairs=load_pairs(d[15]) if len(d) > 15 else None,
    )


def _key(value: list[Any]) -> OrderKey:
    return (int(value[0]), str(value[1]))


def _load_json_state(data: bytes) -> TraceState:
    """A state of version 1 or 2 (one JSON object; version 2: the messages on a second line)."""
    head, _, messages = data.partition(b"\n")
    d = orjson.loads(head)
    version = d.get("v")
    if version not in (1, 2):
        raise ValueError(f"unknown trace state version {version!r}")
    trace = d["trace"]
    view = None
    if trace is not None:
        if version == 1:  # [key, agent_version, scenario, messages, attachments]
            messages, trace = orjson.dumps(trace[3]), trace[:3] + trace[4:]
        view = trace_view(_key(trace[0]), trace[1], trace[2], RawJson(messages), trace[3])
    evaluation = d["evaluation"]
    return TraceState(
        trace_id=d["id"],
        org=d["org"],
        project=d["project"],
        seen=set(d["seen"]),
        pending=[
            Pending(p[0], RawEvent(p[1].encode(), p[2], p[3], p[4], p[5])) for p in d["pending"]
        ],
        first_pending_at=d["first_pending_at"],
        trace=view,
        evaluation=None
        if evaluation is None
        else evaluation_view(_key(evaluation[0]), *evaluation[1:]),
        labels={
            k: LabelView(_key(v[0]), None if v[1] is None else (v[1][0], v[1][1], v[1][2], v[1][3]))
            for k, v in d["labels"].items()
        },
        skipped_by=set(d["skipped_by"]),
        updated_at=d["updated_at"],
        deleted_at=d["deleted_at"],
        deleted_revision=d["deleted_revision"],
    )


def expiry_since(data: bytes) -> tuple[str, float] | None:
    """Why, and since when, a stored state may expire (``tombstone``/``orphan``), or None.

    What ``load_state(data)`` says through ``deleted_at`` and ``is_orphan`` /
    ``first_pending_at``, read from the state's head alone: a restore asks it of every
    state it applies.
    """
    if data[:1] == b"\x03":
        (length,) = _HEAD_LENGTH.unpack_from(data, 1)
        fields = orjson.loads(data[5 : 5 + length])
        first_pending_at, trace, deleted_at = fields[4], fields[5], fields[10]
    else:  # versions 1 and 2: one JSON object on the first line
        head = orjson.loads(data.partition(b"\n")[0])
        first_pending_at, trace = head.get("first_pending_at"), head.get("trace")
        deleted_at = head.get("deleted_at")
    if deleted_at is not None:
        return "tombstone", float(deleted_at)
    if trace is None and first_pending_at is not None:
        return "orphan", float(first_pending_at)
    return None
