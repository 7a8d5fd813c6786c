"""The soak's plan, from a seed: the load it produces and the faults it injects, when.

Pure: the same seed, sizes and start time always give the same plan
(:mod:`tests.soak.soak` carries it out).

The load is realistic traces (:func:`rl_export.local.synthetic.trace_events`: evaluations,
labels, skips, retractions) in two projects, and on top of them:

* out of order: each trace's events go out at random moments over ``spread_s``, so labels
  and evaluations often come before their trace; some events are held back far longer;
* late: traces completed between an hour and four days ago;
* deletions, some followed by a later label (accepted, but it changes nothing);
* redeliveries: the same record sent again later, as a producer retry does;
* misrouted: valid events sent to another partition than their trace's (the join
  forwards them);
* dead-letter cases, one of every reason, each marked with a ``rl-soak-expect`` header
  that names the reason the join must give.

The faults: SIGKILLs of whole workers and of single join processes, one broker restart,
store outages (a proxy in front of the store cuts every connection) and one pause of a
whole worker (SIGSTOP, then SIGCONT) longer than the session timeout.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import orjson

from rl_export.local.synthetic import trace_events
from rl_export.model.events import FAMILY_OF_TYPE, EventFamily, RejectReason, format_utc
from rl_export.model.partitioning import Partitioner, partition_for

EXPECT_HEADER = "rl-soak-expect"
"""Header of a record the join must dead-letter: the reason it must give."""

PROJECTS = ("support-bot", "billing-bot")

FaultKind = Literal["kill_worker", "kill_join", "broker_restart", "store_outage", "pause_worker"]


@dataclass(frozen=True)
class Send:
    """One record the load sends ``at`` seconds after it starts."""

    at: float
    family: EventFamily  # which input topic
    key: bytes
    value: bytes
    partition: int | None = None  # None: by key; else this partition (misrouted)
    expect: str | None = None  # the dead-letter reason the join must give
    kind: str = "event"  # event, redelivery, misrouted, deletion, late, or the reason

    @property
    def headers(self) -> list[tuple[str, bytes]]:
        return [(EXPECT_HEADER, self.expect.encode())] if self.expect else []


@dataclass(frozen=True)
class Fault:
    """One fault, ``at`` seconds after the load starts, on worker ``target``.

    ``seconds``: how long an outage or a pause lasts, or how long a killed worker (or the
    broker) stays down before it is started again.
    """

    at: float
    kind: FaultKind
    target: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class SoakSize:
    """How big a soak is."""

    duration_s: float = 600.0  # how long the load runs; the faults fall inside it
    rate: float = 60.0  # events per second, about
    workers: int = 2
    partitions: int = 4
    kills: int = 24  # SIGKILLs, of workers and of single join processes
    outages: int = 2
    outage_s: tuple[float, float] = (10.0, 30.0)
    pause_s: float = 15.0  # longer than the session timeout
    spread_s: float = 15.0  # a trace's events go out within this
    max_event_bytes: int = 64 * 1024
    compaction_interval_s: float = 30.0  # the workers compact (and expire) this often


@dataclass
class SoakPlan:
    seed: int
    size: SoakSize
    sends: list[Send] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for send in self.sends:
            out[send.kind] = out.get(send.kind, 0) + 1
        return dict(sorted(out.items()))


def _event_bytes(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event)


def _invalid(
    reason: RejectReason, n: int, trace: dict[str, Any], at: datetime, size: SoakSize
) -> tuple[EventFamily, bytes, bytes]:
    """A record the join must dead-letter for ``reason``: (family, key, value)."""
    base = {
        "event_id": f"bad-{reason.value}-{n}",
        "event_type": "label.skipped",
        "occurred_at": format_utc(at),
        "org": trace["org"],
        "project": trace["project"],
        "trace_id": trace["trace_id"],
        "labeler": "mallory",
    }
    key = trace["trace_id"].encode()
    if reason is RejectReason.BAD_JSON:
        return EventFamily.LABELS, key, _event_bytes(base)[:-7]
    if reason is RejectReason.UNKNOWN_EVENT_TYPE:
        return EventFamily.LABELS, key, _event_bytes(base | {"event_type": "label.nope"})
    if reason is RejectReason.INVALID:
        rubric = {"correctness": 6, "helpfulness": 3, "efficiency": 3, "safety": 3}
        return (
            EventFamily.LABELS,
            key,
            _event_bytes(base | {"event_type": "label.submitted", "rubric": rubric}),
        )
    if reason is RejectReason.INVALID_RUBRIC:  # a rubric version the project never made
        unknown = {"rubric_version": 9999, "rubric": {"correctness": 3}}
        return (
            EventFamily.LABELS,
            key,
            _event_bytes(base | {"event_type": "label.submitted"} | unknown),
        )
    if reason is RejectReason.OVERSIZED:  # under the topic's limit, over the event limit
        huge = base | {
            "event_type": "trace.completed", "trace_id": f"huge-{n}", "agent_version": "v4",
            "scenario": "oversized",
            "messages": [{"role": "user", "content": "x" * (size.max_event_bytes * 3 // 2)}],
        }  # fmt: skip
        return EventFamily.TRACES, f"huge-{n}".encode(), _event_bytes(huge)
    if reason is RejectReason.FUTURE:
        return (
            EventFamily.LABELS,
            key,
            _event_bytes(base | {"occurred_at": format_utc(at + timedelta(days=30))}),
        )
    if reason is RejectReason.WRONG_TOPIC:
        return EventFamily.TRACES, key, _event_bytes(base)
    if reason is RejectReason.KEY_MISMATCH:
        return EventFamily.LABELS, b"not-" + key, _event_bytes(base)
    if reason is RejectReason.ORG_MISMATCH:  # dead-lettered when its trace is there
        rubric = {"correctness": 5, "helpfulness": 5, "efficiency": 5, "safety": 5}
        return (
            EventFamily.LABELS,
            key,
            _event_bytes(
                base | {"event_type": "label.submitted", "org": "someone-else", "rubric": rubric}
            ),
        )
    raise ValueError(reason)


def _load(rng: random.Random, size: SoakSize, start: datetime) -> list[Send]:
    sends: list[Send] = []
    per_trace = 3.4  # events per synthetic trace, about
    traces = max(1, int(size.duration_s * size.rate / per_trace))
    gap = size.duration_s / traces
    last = size.duration_s - 1.0  # everything is sent within the load's duration
    reasons = list(RejectReason)
    bad = 0
    for index in range(traces):
        begin = index * gap
        completed = start - timedelta(seconds=rng.uniform(3600, 4 * 86400))
        events = trace_events(rng, index, completed)
        project = PROJECTS[1] if rng.random() < 0.25 else PROJECTS[0]
        trace_id = f"soak-{index:07d}"
        for event in events:
            event["project"] = project
            event["trace_id"] = trace_id
            event["event_id"] = event["event_id"].replace(f"tr-{index:08d}", trace_id)
        trace = events[0]
        newest = max(datetime.fromisoformat(e["occurred_at"]) for e in events)
        deleted = rng.random() < 0.05
        if deleted:
            events.append(
                {k: trace[k] for k in ("org", "project", "trace_id")}
                | {"event_id": f"{trace_id}-deleted", "event_type": "trace.deleted",
                   "occurred_at": format_utc(newest + timedelta(hours=1))}
            )  # fmt: skip
            if rng.random() < 0.5:  # a label after the deletion: counted, changes nothing
                events.append(
                    {k: trace[k] for k in ("org", "project", "trace_id")}
                    | {"event_id": f"{trace_id}-after", "event_type": "label.submitted",
                       "occurred_at": format_utc(newest + timedelta(hours=2)),
                       "labeler": "late", "rubric": {"correctness": 1, "helpfulness": 1,
                                                     "efficiency": 1, "safety": 1}}
                )  # fmt: skip
        for event in events:
            at = begin + rng.uniform(0, size.spread_s)
            kind = "deletion" if event["event_type"] == "trace.deleted" else "event"
            if rng.random() < 0.03:  # held back far longer
                at, kind = begin + rng.uniform(size.spread_s, 8 * size.spread_s), "late"
            family = FAMILY_OF_TYPE[event["event_type"]]
            value = _event_bytes(event)
            key = trace_id.encode()
            partition = None
            if rng.random() < 0.02 and size.partitions > 1:
                partition, kind = -1, "misrouted"  # resolved against the home partition below
            sends.append(Send(min(at, last), family, key, value, partition, None, kind))
            if rng.random() < 0.03:  # the producer sends it again, a while later
                again = min(at + rng.uniform(0.5, 60), last)
                sends.append(Send(again, family, key, value, None, None, "redelivery"))
        if rng.random() < 0.1 and not deleted:  # one of each reason, in turn
            reason = reasons[bad % len(reasons)]
            family, key, value = _invalid(reason, bad, trace, newest, size)
            at = min(begin + rng.uniform(0, size.spread_s), last)
            sends.append(Send(at, family, key, value, None, reason.value, reason.value))
            bad += 1
    return sends


def _faults(rng: random.Random, size: SoakSize) -> list[Fault]:
    span = (0.08 * size.duration_s, 0.85 * size.duration_s)
    faults = []
    for _ in range(size.kills):
        kind: FaultKind = "kill_join" if rng.random() < 0.4 else "kill_worker"
        faults.append(
            Fault(rng.uniform(*span), kind, rng.randrange(size.workers), rng.uniform(0.5, 5))
        )
    faults.append(Fault(rng.uniform(0.3, 0.6) * size.duration_s, "broker_restart",
                        seconds=rng.uniform(1, 5)))  # fmt: skip
    slots = sorted(rng.sample(range(size.outages * 2), size.outages))
    width = (span[1] - span[0]) / (size.outages * 2)
    for slot in slots:  # apart from each other
        faults.append(Fault(span[0] + slot * width + rng.uniform(0, width / 2), "store_outage",
                            seconds=rng.uniform(*size.outage_s)))  # fmt: skip
    faults.append(Fault(rng.uniform(*span), "pause_worker", rng.randrange(size.workers),
                        size.pause_s))  # fmt: skip
    return sorted(faults, key=lambda f: f.at)


def make_plan(
    seed: int, size: SoakSize, start: datetime, partitioner: Partitioner = "murmur2"
) -> SoakPlan:
    """The load and the faults of a soak, from its seed (``start``: the load's wall clock)."""
    rng = random.Random(seed)
    sends = sorted(_load(rng, size, start), key=lambda s: s.at)
    resolved = []
    for send in sends:
        if send.partition == -1:  # misrouted: any partition but its trace's
            home = partition_for(send.key, size.partitions, partitioner)
            wrong = (home + rng.randrange(1, size.partitions)) % size.partitions
            resolved.append(
                Send(send.at, send.family, send.key, send.value, wrong, None, "misrouted")
            )
        else:
            resolved.append(send)
    return SoakPlan(seed, size, resolved, _faults(rng, size))
