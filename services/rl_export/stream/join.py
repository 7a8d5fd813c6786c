"""The join: merge one event into a trace's state and say what to emit
(docs/concepts/join-rules.md).

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
  in ``revision`` but change nothing and emit nothing. A tombstone's revision is
  :data:`~rl_export.model.records.ERASED_REVISION`, greater than any record's, so it hides
  the trace on every chain, a replay's or another run's included.
* A ``trace.deleted`` of a trace the join has no trace for (backfilled by ``replay``, seeded,
  expired from the table, written by another run) does not wait in silence: it emits the
  tombstone of the deletion's org/project at once, and waits like any early event, so the
  trace, if it comes, arrives deleted (and the deletion, if its org/project is not the
  trace's, is rejected then, as any early event of another org).
* Rewards are computed from integer sums (human) and in evaluator-name order (evaluator), so
  the result does not depend on arrival order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

from rl_export.model.codec import RawJson, dumps
from rl_export.model.events import (
    PAIR_EVENT_TYPES,
    BaseEvent,
    EventRejection,
    RejectReason,
    format_micros,
)
from rl_export.model.eventview import EventView, reread_event, view_of
from rl_export.model.records import ERASED_REVISION, RULES_VERSION
from rl_export.model.rubrics import KnownRubrics
from rl_export.model.snapshots import Headers, encode_snapshot
from rl_export.stream import comparisons
from rl_export.stream.comparisons import Effects, Pair
from rl_export.stream.humans import (
    RUBRIC_DIMENSIONS,
    Adjudication,
    LabelView,
    OrderKey,
    Scope,
    entries_reward,
    human_reward,
    label_details,
    plain,
)

__all__ = ["RUBRIC_DIMENSIONS", "LabelView", "OrderKey"]  # kept here for their old importers


def order_key(event: EventView) -> OrderKey:
    return (event.micros, event.event_id)


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


class Origin(Protocol):
    """Where an event came from (a :class:`RawEvent`, or the join's own message): its
    original bytes, kept for a waiting event and for the dead-letter topic."""

    @property
    def value(self) -> bytes: ...
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp_ms(self) -> int | None: ...


@dataclass(slots=True)
class Pending:
    """An event accepted before its trace arrived, waiting to be checked against it."""

    event_id: str
    raw: Origin


@dataclass(slots=True)
class TraceView:
    """The current ``trace.completed``: what the records need of it (no raw spans).

    What the snapshot shows as JSON is kept as JSON: the messages (serialised once, when
    this ``trace.completed`` won, and never parsed again) and the attachments.
    """

    key: OrderKey
    agent_version: str
    scenario: str
    messages: RawJson
    attachments: RawJson
    completed_at: str  # ``occurred_at`` of this event, as records show it
    # The trace's ``metadata`` object as received; None in a state kept before the join kept
    # it (its records then lack the field: unknown, not empty).
    metadata: RawJson | None = None


@dataclass(slots=True)
class EvaluationView:
    """The current evaluation, kept as the snapshot shows it.

    ``view`` is the snapshot's ``evaluation`` object (id, time, results, report) as JSON and
    ``scores`` its ``evaluator_scores``; the evaluator reward is computed once, when the
    evaluation is applied (None: it has no results, so the trajectory is not ready).
    """

    key: OrderKey
    evaluation_id: str
    view: RawJson
    scores: RawJson | None
    reward: float | None
    passed: bool | None


@dataclass(slots=True)
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
    adjudication: Adjudication | None = None  # the latest adjudication (any reviewer)
    pairs: dict[str, Pair] | None = None  # its pairs by other trace (stream/comparisons.py)

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


@dataclass(slots=True)
class MergeResult:
    """What merging one event did, and what the caller must do about it.

    ``emits`` says the trace's current snapshot must be sent; ``snapshot`` is that snapshot
    unless the caller asked :func:`merge` not to build it (the worker builds one per trace
    per batch instead of one per event).
    """

    state: TraceState
    outcome: Outcome
    snapshot: dict[str, Any] | None = None
    rejected: Sequence[tuple[Origin, EventRejection]] = ()
    accepted: int = 0  # events newly accepted (pending ones that joined the trace included)
    emits: bool = False
    effects: Effects | None = None  # what pair events ask of the batch (comparisons.py)

    def owed(self) -> Effects:
        if self.effects is None:
            self.effects = Effects()
        return self.effects


@dataclass(frozen=True)
class JoinConfig:
    """The settings the rules depend on, and the rubric versions known (labels of versions
    other than 0 are scored by theirs: the batch processor reads them before it builds a
    snapshot that needs them)."""

    human_pass_threshold: float = 0.7
    rubrics: KnownRubrics = field(default_factory=KnownRubrics)


def merge(
    state: TraceState | None,
    event: EventView | BaseEvent,
    raw: Origin,
    *,
    now: float,
    config: JoinConfig,
    build_snapshot: bool = True,
) -> MergeResult:
    """Merge ``event`` into ``state`` (None for a new trace); return the new state and effects.

    ``event`` is the view :func:`~rl_export.model.eventview.read_event` gives (a model the
    pydantic path decoded is turned into one). ``now`` is the worker's clock (seconds since
    the epoch), used only for retention. With ``build_snapshot=False`` the result says
    whether a snapshot is due (``emits``) without building it; :func:`current_snapshot`
    builds it later.
    """
    view = view_of(event) if isinstance(event, BaseEvent) else event
    result = _merge(state, view, raw, now=now)
    if result.emits and build_snapshot:
        result.snapshot = current_snapshot(result.state, config)
    return result


def _merge(state: TraceState | None, event: EventView, raw: Origin, *, now: float) -> MergeResult:
    st = state if state is not None else TraceState(trace_id=event.trace_id)

    event_id = event.event_id
    if event_id in st.seen or (st.pending and any(p.event_id == event_id for p in st.pending)):
        emits = st.trace is not None or st.deleted or waiting_deletion(st) is not None
        result = MergeResult(st, "duplicate", emits=emits)
        if st.pairs and event_id in st.seen:  # what the event made this trace send, again
            comparisons.resend(st, event, raw.value, result.owed(), _micros(now))
        return result

    if st.trace is None and not st.deleted:
        if event.event_type != "trace.completed":
            st.pending.append(Pending(event.event_id, raw))
            if st.first_pending_at is None:
                st.first_pending_at = now
            # A deletion does not wait in silence: its tombstone goes out now (see above).
            return MergeResult(st, "pending", emits=event.event_type == "trace.deleted")
        return _arrive(st, event, raw, now=now)

    if (event.org, event.project) != (st.org, st.project):
        result = MergeResult(st, "rejected", rejected=[(raw, _org_mismatch(event, st))])
        if event.pair is not None:
            comparisons.on_rejected(event, result.owed(), _micros(now))
        return result

    if st.deleted:
        _count(st, event)
        result = MergeResult(st, "ignored", accepted=1)
        if event.pair is not None:
            comparisons.on_ignored(st, event, result.owed(), _micros(now))
        return result

    result = MergeResult(st, "accepted", accepted=1, emits=True)
    _apply(st, event, now, result, raw.value)
    _settle_tombstone(st)
    return result


def _org_mismatch(event: EventView, st: TraceState) -> EventRejection:
    return EventRejection(
        RejectReason.ORG_MISMATCH,
        f"event is for {event.org}/{event.project} but trace {st.trace_id} belongs to "
        f"{st.org}/{st.project}",
    )


def _arrive(st: TraceState, trace: EventView, raw: Origin, *, now: float) -> MergeResult:
    """The first ``trace.completed``: fix org/project, then settle the waiting events."""
    st.org, st.project = trace.org, trace.project
    rejected: list[tuple[Origin, EventRejection]] = []
    result = MergeResult(st, "accepted", rejected=rejected, accepted=1)
    _apply(st, trace, now, result, raw.value)
    waiting, st.pending, st.first_pending_at = st.pending, [], None
    for item in waiting:
        decoded = reread_event(item.raw.value)
        if isinstance(decoded, EventRejection):  # only if the rules changed in between
            rejected.append((item.raw, decoded))
        elif (decoded.org, decoded.project) != (st.org, st.project):
            rejected.append((item.raw, _org_mismatch(decoded, st)))
            if decoded.pair is not None:
                comparisons.on_rejected(decoded, result.owed(), _micros(now))
        elif st.deleted:
            _count(st, decoded)
            result.accepted += 1
            if decoded.pair is not None:
                comparisons.on_ignored(st, decoded, result.owed(), _micros(now))
        else:
            _apply(st, decoded, now, result, item.raw.value)
            result.accepted += 1
    _settle_tombstone(st)
    result.emits = True
    return result


def _settle_tombstone(st: TraceState) -> None:
    """Note the revision the trace was deleted at (kept in the state, for the record; its
    tombstone carries :data:`ERASED_REVISION`)."""
    if st.deleted and st.deleted_revision == 0:
        st.deleted_revision = st.revision


def waiting_deletion(st: TraceState) -> EventView | None:
    """The latest ``trace.deleted`` waiting for a trace that has not come (None: none)."""
    if st.trace is not None or st.deleted:
        return None
    for item in reversed(st.pending):
        decoded = reread_event(item.raw.value)
        if not isinstance(decoded, EventRejection) and decoded.event_type == "trace.deleted":
            return decoded
    return None


def _count(st: TraceState, event: EventView) -> None:
    st.seen.add(event.event_id)
    if event.event_type != comparisons.VOID:  # the join's own notice: no input event
        st.updated_at = max(st.updated_at, event.micros)


def _micros(now: float) -> int:
    return int(now * 1_000_000)


def _apply(st: TraceState, event: EventView, now: float, result: MergeResult, raw: bytes) -> None:
    """Apply an accepted event of a trace that exists (or is arriving) and is not deleted;
    ``raw`` is its value (a comparison's mirror is made of it)."""
    _count(st, event)
    key = (event.micros, event.event_id)
    kind = event.event_type
    if kind in {"label.submitted", "label.retracted"}:
        if event.kind == "adjudication":  # the trace's decision: the latest of any reviewer
            if st.adjudication is None or key > st.adjudication[1].key:
                st.adjudication = (event.labeler, LabelView(
                    key, None, event.comment, event.answers, event.rubric_version))  # fmt: skip
            return
        current = st.labels.get(event.labeler)
        if current is None or key > current.key:
            st.labels[event.labeler] = LabelView(
                key, event.rubric, event.comment, event.answers, event.rubric_version
            )
    elif kind == "label.skipped":
        st.skipped_by.add(event.labeler)
    elif kind == "trace.completed":
        if st.trace is None or key > st.trace.key:
            st.trace = trace_view(
                key, event.agent_version, event.scenario, RawJson(event.messages),
                event.attachments or [], metadata=RawJson(event.metadata),
            )  # fmt: skip
    elif kind == "evaluation.finished":
        if st.evaluation is None or key > st.evaluation.key:
            st.evaluation = evaluation_view(
                key, event.evaluation_id, event.results or [], event.report or {}
            )
    elif kind == "trace.deleted":
        st.deleted_at = now
        st.trace = None
        st.evaluation = None
        st.labels.clear()
        st.skipped_by.clear()
        st.adjudication = None
        if st.pairs:
            comparisons.on_deleted(st, result.owed(), _micros(now))
    elif kind in PAIR_EVENT_TYPES:
        comparisons.apply(st, event, raw, result.owed())


def trace_view(
    key: OrderKey, agent_version: str, scenario: str, messages: RawJson,
    attachments: list[dict[str, Any]], *, metadata: RawJson | None = None,
) -> TraceView:  # fmt: skip
    """The view of a ``trace.completed`` that won."""
    completed_at = format_micros(key[0])
    return TraceView(key, agent_version, scenario, messages, _json(attachments), completed_at,
                     metadata)  # fmt: skip


def evaluation_view(
    key: OrderKey, evaluation_id: str, results: list[dict[str, Any]], report: dict[str, Any]
) -> EvaluationView:
    """The view of an ``evaluation.finished`` that won, with its evaluator reward."""
    view = _json(
        {
            "evaluation_id": evaluation_id,
            "occurred_at": format_micros(key[0]),
            "results": results,
            "report": report,
        }
    )
    scored = evaluator_reward(results)
    if scored is None:
        return EvaluationView(key, evaluation_id, view, None, None, None)
    reward, passed, scores = scored
    return EvaluationView(key, evaluation_id, view, _json(scores), reward, passed)


def evaluator_reward(
    results: list[dict[str, Any]],
) -> tuple[float, bool, dict[str, float]] | None:
    """Evaluator reward, pass flag and scores of an evaluation's results (None: no results).

    The mean score is summed in evaluator-name order, so it does not depend on the order the
    results came in; it passes when every result passed.
    """
    if not results:
        return None
    ordered = sorted(results, key=lambda r: (r["evaluator"], r["score"]))
    total = 0.0
    for result in ordered:
        total += result["score"]
    scores = {r["evaluator"]: r["score"] for r in ordered}
    return total / len(ordered), all(r["passed"] for r in ordered), scores


def _json(value: Any) -> RawJson:
    return RawJson(dumps(value))


def current_snapshot(st: TraceState, config: JoinConfig) -> dict[str, Any] | None:
    """Return the snapshot to emit for ``st``: None before the trace exists (unless a
    deletion waits for it: then its tombstone).

    A deleted trace's snapshot is its tombstone, at :data:`ERASED_REVISION`. The values are
    plain (what JSON gives back), but for the messages (:class:`RawJson`).
    """
    return _snapshot(st, config, _parsed)


def snapshot_from_record(
    record: dict[str, Any], rubrics: KnownRubrics | None = None
) -> dict[str, Any]:
    """The snapshot a ``traces`` corpus record was rendered from (a live one).

    A ``traces`` record has ``reward_source``, ``reward`` and ``passed`` null, but keeps what
    they are computed from: the current labels' rubric means and count (or, for labels of
    other rubric versions than 0 and adjudications, each label's answers and version in
    ``human_labels``: ``rubrics`` must know those versions,
    :func:`~rl_export.stream.humans.record_versions`), the pass threshold and the current
    evaluation's results. The rewards are computed again by the rules above (integer sums,
    recovered from the means, for version-0 human rewards; the same functions for the
    others), so ``render(snapshot_from_record(r), source)`` is the record the stream wrote
    for that source at that revision, byte for byte.
    """
    snap = {k: v for k, v in record.items() if k not in ("reward_source", "reward", "passed")}
    snap["deleted"] = False
    snap["human"] = None
    count = record.get("labels_count") or 0
    rubric = record.get("rubric")
    entries = record.get("human_labels")
    if entries and any("answers" in e for e in entries):
        scope = Scope(record["org"], record["project"], rubrics or KnownRubrics())
        exact = entries_reward(entries, scope)
        if exact is not None:
            reward = float(exact)
            snap["human"] = {"reward": reward, "passed": reward >= record["pass_threshold"]}
    elif count and isinstance(rubric, dict):
        sums = [round(rubric[d] * count) for d in RUBRIC_DIMENSIONS]
        reward = sum(sums) / (20 * count)
        snap["human"] = {"reward": reward, "passed": reward >= record["pass_threshold"]}
    evaluation = record.get("evaluation")
    snap["evaluator"] = None
    if evaluation is not None:
        scored = evaluator_reward(evaluation["results"])
        if scored is not None:
            snap["evaluator"] = {"reward": scored[0], "passed": scored[1]}
    return snap


def encode_current(st: TraceState, config: JoinConfig) -> tuple[bytes, Headers] | None:
    """``encode_snapshot(current_snapshot(st, config))``, without parsing what the state
    keeps as JSON (evaluation, scores, attachments): those go into the value as they are."""
    snapshot = _snapshot(st, config, _fragment)
    return None if snapshot is None else encode_snapshot(snapshot)


def _parsed(value: RawJson) -> Any:
    return value.value()


def _fragment(value: RawJson) -> Any:
    return orjson.Fragment(value.data)


def _snapshot(st: TraceState, config: JoinConfig, json: Any) -> dict[str, Any] | None:
    """The snapshot of ``st``; ``json`` says how what is kept as JSON goes into it.

    ``human`` and ``evaluator`` hold ``{reward, passed}`` when the trajectory is ready for
    that source, else None. :func:`rl_export.model.records.render` turns a snapshot into the
    record of one corpus.
    """
    if st.deleted:
        return _tombstone(st.trace_id, st.org, st.project)
    trace = st.trace
    if trace is None:
        deletion = waiting_deletion(st)
        if deletion is None:
            return None
        return _tombstone(st.trace_id, deletion.org, deletion.project)
    # Labels of rubric versions other than 0, or an adjudication, are scored with the
    # versions' rules (``scope``); version-0 rating labels as before rubrics (None).
    scope = None if plain(st.labels, st.adjudication) else Scope(
        st.org or "", st.project or "", config.rubrics)  # fmt: skip
    human = human_reward(st.labels, st.adjudication, config.human_pass_threshold, scope)
    compared = None if st.pairs is None else comparisons.entries(st)
    evaluation = st.evaluation
    scored = evaluation is not None and evaluation.scores is not None
    return {
        "trace_id": st.trace_id,
        "org": st.org,
        "project": st.project,
        "revision": st.revision,
        "deleted": False,
        "human": None
        if human is None or human["reward"] is None
        else {"reward": human["reward"], "passed": human["passed"]},
        "evaluator": {"reward": evaluation.reward, "passed": evaluation.passed}  # type: ignore[union-attr]
        if scored
        else None,
        "rubric": None if human is None else human["rubric"],
        "labels_count": 0 if human is None else len(human["labelers"]),
        "labelers": [] if human is None else human["labelers"],
        "skipped_by": sorted(st.skipped_by),
        "evaluator_scores": json(evaluation.scores) if scored else None,  # type: ignore[union-attr]
        "evaluation": None if evaluation is None else json(evaluation.view),
        "messages": trace.messages,
        "agent_version": trace.agent_version,
        "scenario": trace.scenario,
        "attachments": json(trace.attachments),
        "completed_at": trace.completed_at,
        "updated_at": format_micros(st.updated_at),
        "pass_threshold": config.human_pass_threshold,
        "rules_version": RULES_VERSION,
        "human_labels": label_details(st.labels, st.adjudication, scope),
        **({} if trace.metadata is None else {"metadata": json(trace.metadata)}),
        **({} if compared is None else {"comparisons": compared}),
    }


def _tombstone(trace_id: str, org: str | None, project: str | None) -> dict[str, Any]:
    """A deleted trace's snapshot: wins over any revision of the trace (see the module)."""
    return {"trace_id": trace_id, "org": org, "project": project, "revision": ERASED_REVISION,
            "deleted": True}  # fmt: skip


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
