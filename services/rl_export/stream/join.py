"""The join: merge one event into a trace's state and say what to emit (DESIGN.md section 3).

Pure functions only: no Kafka, no clock but the ``now`` passed in. The batch processor
(:mod:`rl_export.stream.processor`, which the worker and ``replay`` both run) calls
:func:`merge` for every decoded event and acts on the :class:`MergeResult` (store the
state, send the snapshot, dead-letter rejections).

The rules, in one place:

* "Latest" is the greatest ``(occurred_at, event_id)``: the latest ``trace.completed`` is the
  trace, the latest ``evaluation.finished`` is the current evaluation, and per labeler the
  latest ``label.submitted`` / ``label.retracted`` is the current label (a retraction means
  none). Skips are per labeler and permanent.
* ``revision`` is the number of distinct accepted events; a repeated ``event_id`` is a
  duplicate: nothing changes and the current snapshot is emitted again, same revision.
* Events that come before their trace wait in ``pending`` (with their original bytes); when
  the trace arrives, those whose org/project differ are rejected and never count.
* Once a ``trace.deleted`` is accepted the state keeps only a tombstone: later events count
  in ``revision`` but change nothing and emit nothing.
* Rewards are computed from integer sums (human) and in evaluator-name order (evaluator), so
  the result does not depend on arrival order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import orjson

from rl_export.common.codec import RawJson
from rl_export.common.events import (
    BaseEvent,
    EvaluationFinished,
    EventRejection,
    LabelRetracted,
    LabelSkipped,
    LabelSubmitted,
    RejectReason,
    TraceCompleted,
    TraceDeleted,
    format_utc,
    redecode,
)
from rl_export.common.records import RULES_VERSION

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
RUBRIC_DIMENSIONS = ("correctness", "helpfulness", "efficiency", "safety")
STATE_VERSION = 2  # 1: messages inside the JSON; 2: messages on a line of their own

# (occurred_at in microseconds since the epoch, event_id): total order of "latest".
OrderKey = tuple[int, str]


def micros(value: datetime) -> int:
    """Return microseconds since the epoch, exactly (no float rounding)."""
    delta = value - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(value: int) -> datetime:
    return EPOCH + timedelta(microseconds=value)


def order_key(event: BaseEvent) -> OrderKey:
    return (micros(event.occurred_at), event.event_id)


@dataclass(slots=True)
class RawEvent:
    """Where an event came from, with its original bytes (kept for the dead-letter topic).

    Not frozen, as one is made per event (frozen dataclasses are five times slower to make).
    """

    value: bytes
    topic: str = ""
    partition: int = -1
    offset: int = -1
    timestamp_ms: int | None = None


@dataclass
class Pending:
    """An event accepted before its trace arrived, waiting to be checked against it."""

    event_id: str
    raw: RawEvent


@dataclass
class TraceView:
    """The current ``trace.completed``: what the records need of it (no raw spans)."""

    key: OrderKey
    agent_version: str
    scenario: str
    messages: RawJson  # serialised once, when this trace.completed won; never parsed again
    attachments: list[dict[str, Any]]


@dataclass
class EvaluationView:
    """The current evaluation, as the records show it."""

    key: OrderKey
    evaluation_id: str
    results: list[dict[str, Any]]
    report: dict[str, Any]


@dataclass
class LabelView:
    """A labeler's latest label event; ``rubric`` is None when it was a retraction."""

    key: OrderKey
    rubric: tuple[int, int, int, int] | None


@dataclass
class TraceState:
    """Everything the table keeps for one ``trace_id``."""

    trace_id: str
    org: str | None = None
    project: str | None = None
    seen: set[str] = field(default_factory=set)
    pending: list[Pending] = field(default_factory=list)
    first_pending_at: float | None = None
    trace: TraceView | None = None
    evaluation: EvaluationView | None = None
    labels: dict[str, LabelView] = field(default_factory=dict)
    skipped_by: set[str] = field(default_factory=set)
    updated_at: int = 0
    deleted_at: float | None = None
    deleted_revision: int = 0

    @property
    def revision(self) -> int:
        return len(self.seen)

    @property
    def deleted(self) -> bool:
        return self.deleted_at is not None

    @property
    def is_orphan(self) -> bool:
        """Events are waiting but the trace never came (yet)."""
        return self.trace is None and not self.deleted


Outcome = Literal["accepted", "duplicate", "pending", "rejected", "ignored"]


@dataclass
class MergeResult:
    """What merging one event did, and what the caller must do about it.

    ``emits`` says the trace's current snapshot must be sent; ``snapshot`` is that snapshot
    unless the caller asked :func:`merge` not to build it (the worker builds one per trace
    per batch instead of one per event).
    """

    state: TraceState
    outcome: Outcome
    snapshot: dict[str, Any] | None = None
    rejected: list[tuple[RawEvent, EventRejection]] = field(default_factory=list)
    accepted: int = 0  # events newly accepted (pending ones that joined the trace included)
    emits: bool = False


@dataclass(frozen=True)
class JoinConfig:
    """The settings the rules depend on."""

    human_pass_threshold: float = 0.7


def merge(
    state: TraceState | None,
    event: BaseEvent,
    raw: RawEvent,
    *,
    now: float,
    config: JoinConfig,
    build_snapshot: bool = True,
) -> MergeResult:
    """Merge ``event`` into ``state`` (None for a new trace); return the new state and effects.

    ``now`` is the worker's clock (seconds since the epoch), used only for retention.
    With ``build_snapshot=False`` the result says whether a snapshot is due (``emits``)
    without building it; :func:`current_snapshot` builds it later.
    """
    result = _merge(state, event, raw, now=now)
    if result.emits and build_snapshot:
        result.snapshot = current_snapshot(result.state, config)
    return result


def _merge(state: TraceState | None, event: BaseEvent, raw: RawEvent, *, now: float) -> MergeResult:
    st = state if state is not None else TraceState(trace_id=event.trace_id)

    if event.event_id in st.seen or any(p.event_id == event.event_id for p in st.pending):
        return MergeResult(st, "duplicate", emits=st.trace is not None or st.deleted)

    if st.trace is None and not st.deleted:
        if not isinstance(event, TraceCompleted):
            st.pending.append(Pending(event.event_id, raw))
            if st.first_pending_at is None:
                st.first_pending_at = now
            return MergeResult(st, "pending")
        return _arrive(st, event, raw, now=now)

    if (event.org, event.project) != (st.org, st.project):
        return MergeResult(st, "rejected", rejected=[(raw, _org_mismatch(event, st))])

    if st.deleted:
        _count(st, event)
        return MergeResult(st, "ignored", accepted=1)

    _apply(st, event, now)
    _settle_tombstone(st)
    return MergeResult(st, "accepted", accepted=1, emits=True)


def _org_mismatch(event: BaseEvent, st: TraceState) -> EventRejection:
    return EventRejection(
        RejectReason.ORG_MISMATCH,
        f"event is for {event.org}/{event.project} but trace {st.trace_id} belongs to "
        f"{st.org}/{st.project}",
    )


def _arrive(st: TraceState, trace: TraceCompleted, raw: RawEvent, *, now: float) -> MergeResult:
    """The first ``trace.completed``: fix org/project, then settle the waiting events."""
    st.org, st.project = trace.org, trace.project
    _apply(st, trace, now)
    result = MergeResult(st, "accepted", accepted=1)
    waiting, st.pending, st.first_pending_at = st.pending, [], None
    for item in waiting:
        decoded = redecode(item.raw.value)
        if isinstance(decoded, EventRejection):  # only if the rules changed in between
            result.rejected.append((item.raw, decoded))
        elif (decoded.org, decoded.project) != (st.org, st.project):
            result.rejected.append((item.raw, _org_mismatch(decoded, st)))
        elif st.deleted:
            _count(st, decoded)
            result.accepted += 1
        else:
            _apply(st, decoded, now)
            result.accepted += 1
    _settle_tombstone(st)
    result.emits = True
    return result


def _settle_tombstone(st: TraceState) -> None:
    """Fix the revision a deleted trace's tombstone carries: the one it was deleted at."""
    if st.deleted and st.deleted_revision == 0:
        st.deleted_revision = st.revision


def _count(st: TraceState, event: BaseEvent) -> None:
    st.seen.add(event.event_id)
    st.updated_at = max(st.updated_at, micros(event.occurred_at))


def _apply(st: TraceState, event: BaseEvent, now: float) -> None:
    """Apply an accepted event of a trace that exists (or is arriving) and is not deleted."""
    _count(st, event)
    key = order_key(event)
    if isinstance(event, TraceCompleted):
        if st.trace is None or key > st.trace.key:
            st.trace = TraceView(
                key=key,
                agent_version=event.agent_version,
                scenario=event.scenario,
                messages=RawJson(orjson.dumps(event.messages)),
                attachments=[a.model_dump(mode="json") for a in event.attachments],
            )
    elif isinstance(event, TraceDeleted):
        st.deleted_at = now
        st.trace = None
        st.evaluation = None
        st.labels.clear()
        st.skipped_by.clear()
    elif isinstance(event, EvaluationFinished):
        if st.evaluation is None or key > st.evaluation.key:
            st.evaluation = EvaluationView(
                key=key,
                evaluation_id=event.evaluation_id,
                results=[r.model_dump(mode="json", exclude_unset=True) for r in event.results],
                report=event.report.model_dump(mode="json"),
            )
    elif isinstance(event, LabelSubmitted | LabelRetracted):
        current = st.labels.get(event.labeler)
        if current is None or key > current.key:
            rubric = None
            if isinstance(event, LabelSubmitted):
                r = event.rubric
                rubric = (r.correctness, r.helpfulness, r.efficiency, r.safety)
            st.labels[event.labeler] = LabelView(key, rubric)
    elif isinstance(event, LabelSkipped):
        st.skipped_by.add(event.labeler)


def current_snapshot(st: TraceState, config: JoinConfig) -> dict[str, Any] | None:
    """Return the snapshot to emit for ``st``: None before the trace exists.

    A deleted trace's snapshot is its tombstone, with the revision it was deleted at.
    """
    if st.deleted:
        return {
            "trace_id": st.trace_id,
            "org": st.org,
            "project": st.project,
            "revision": st.deleted_revision,
            "deleted": True,
        }
    if st.trace is None:
        return None
    return snapshot(st, config)


def human_reward(labels: dict[str, LabelView], threshold: float) -> dict[str, Any] | None:
    """Human reward, rubric means and pass flag over the current labels (None: no labels)."""
    current = [v.rubric for v in labels.values() if v.rubric is not None]
    if not current:
        return None
    n = len(current)
    sums = [sum(r[i] for r in current) for i in range(4)]
    reward = sum(sums) / (20 * n)
    return {
        "reward": reward,
        "passed": reward >= threshold,
        "rubric": {d: s / n for d, s in zip(RUBRIC_DIMENSIONS, sums, strict=True)},
        "labelers": sorted(k for k, v in labels.items() if v.rubric is not None),
    }


def evaluator_reward(evaluation: EvaluationView | None) -> dict[str, Any] | None:
    """Evaluator reward: mean score in evaluator-name order; passed if every result passed."""
    if evaluation is None or not evaluation.results:
        return None
    ordered = sorted(evaluation.results, key=lambda r: (r["evaluator"], r["score"]))
    total = 0.0
    for result in ordered:
        total += result["score"]
    return {
        "reward": total / len(ordered),
        "passed": all(r["passed"] for r in ordered),
        "scores": {r["evaluator"]: r["score"] for r in ordered},
    }


def snapshot(st: TraceState, config: JoinConfig) -> dict[str, Any]:
    """The full snapshot of a live trace: every field any corpus or format needs.

    ``human`` and ``evaluator`` hold ``{reward, passed}`` when the trajectory is ready for
    that source, else None. :func:`rl_export.common.records.render` turns a snapshot into the
    record of one corpus.
    """
    assert st.trace is not None
    human = human_reward(st.labels, config.human_pass_threshold)
    evaluator = evaluator_reward(st.evaluation)
    evaluation = st.evaluation
    return {
        "trace_id": st.trace_id,
        "org": st.org,
        "project": st.project,
        "revision": st.revision,
        "deleted": False,
        "human": None if human is None else {"reward": human["reward"], "passed": human["passed"]},
        "evaluator": None
        if evaluator is None
        else {"reward": evaluator["reward"], "passed": evaluator["passed"]},
        "rubric": None if human is None else human["rubric"],
        "labels_count": 0 if human is None else len(human["labelers"]),
        "labelers": [] if human is None else human["labelers"],
        "skipped_by": sorted(st.skipped_by),
        "evaluator_scores": None if evaluator is None else evaluator["scores"],
        "evaluation": None
        if evaluation is None
        else {
            "evaluation_id": evaluation.evaluation_id,
            "occurred_at": format_utc(from_micros(evaluation.key[0])),
            "results": evaluation.results,
            "report": evaluation.report,
        },
        "messages": st.trace.messages,
        "agent_version": st.trace.agent_version,
        "scenario": st.trace.scenario,
        "attachments": st.trace.attachments,
        "completed_at": format_utc(from_micros(st.trace.key[0])),
        "updated_at": format_utc(from_micros(st.updated_at)),
        "pass_threshold": config.human_pass_threshold,
        "rules_version": RULES_VERSION,
    }


# --- state (de)serialisation: compact JSON, versioned ------------------------------------


def dump_state(st: TraceState) -> bytes:
    """Serialise a state for the table (orjson; sets sorted so equal states are equal bytes).

    The state is one line of JSON; a trace's messages follow on a second line, as the bytes
    they were serialised to, so that loading a state never parses a conversation.
    """
    head = orjson.dumps(
        {
            "v": STATE_VERSION,
            "id": st.trace_id,
            "org": st.org,
            "project": st.project,
            "seen": sorted(st.seen),
            "pending": [
                [
                    p.event_id,
                    p.raw.value.decode(),
                    p.raw.topic,
                    p.raw.partition,
                    p.raw.offset,
                    p.raw.timestamp_ms,
                ]
                for p in st.pending
            ],
            "first_pending_at": st.first_pending_at,
            "trace": None
            if st.trace is None
            else [
                list(st.trace.key),
                st.trace.agent_version,
                st.trace.scenario,
                st.trace.attachments,
            ],
            "evaluation": None
            if st.evaluation is None
            else [
                list(st.evaluation.key),
                st.evaluation.evaluation_id,
                st.evaluation.results,
                st.evaluation.report,
            ],
            "labels": {
                k: [list(v.key), None if v.rubric is None else list(v.rubric)]
                for k, v in sorted(st.labels.items())
            },
            "skipped_by": sorted(st.skipped_by),
            "updated_at": st.updated_at,
            "deleted_at": st.deleted_at,
            "deleted_revision": st.deleted_revision,
        }
    )
    return head if st.trace is None else head + b"\n" + st.trace.messages.data


def _key(value: list[Any]) -> OrderKey:
    return (int(value[0]), str(value[1]))


def load_state(data: bytes) -> TraceState:
    """Inverse of :func:`dump_state` (reads version 1 states too)."""
    head, _, messages = data.partition(b"\n")
    d = orjson.loads(head)
    version = d.get("v")
    if version not in (1, STATE_VERSION):
        raise ValueError(f"unknown trace state version {version!r}")
    trace = d["trace"]
    view = None
    if trace is not None:
        if version == 1:  # [key, agent_version, scenario, messages, attachments]
            messages, trace = orjson.dumps(trace[3]), trace[:3] + trace[4:]
        view = TraceView(_key(trace[0]), trace[1], trace[2], RawJson(messages), trace[3])
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
        else EvaluationView(_key(evaluation[0]), *evaluation[1:]),
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
    head = orjson.loads(data.partition(b"\n")[0])
    deleted_at = head.get("deleted_at")
    if deleted_at is not None:
        return "tombstone", float(deleted_at)
    first_pending_at = head.get("first_pending_at")
    if head.get("trace") is None and first_pending_at is not None:
        return "orphan", float(first_pending_at)
    return None


def expired(
    st: TraceState, now: float, orphan_retention_s: float, tombstone_retention_s: float
) -> str | None:
    """Say why a state may be dropped now (``"orphan"`` or ``"tombstone"``), or None."""
    if st.deleted and st.deleted_at is not None and now - st.deleted_at >= tombstone_retention_s:
        return "tombstone"
    if (
        st.is_orphan
        and st.first_pending_at is not None
        and now - st.first_pending_at >= orphan_retention_s
    ):
        return "orphan"
    return None
