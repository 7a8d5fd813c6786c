"""Synthetic AgentHub traffic: realistic traces, evaluations and labels for dev and tests.

``generate(n_traces, seed=...)`` returns event dicts in the shape of docs/reference/schemas.md:
multi-turn conversations of a few KB with tool calls, evaluations with reports, labels from
several labelers (with skips and retractions), in shuffled order with some duplicates. The
same seed always gives the same events.

Traffic comes in shapes (:data:`SHAPES`), because what a worker costs depends on them: the
``standard`` shape (one org/project, 1.3 KiB events, about 2.9 per trace) and the ``small``
one (three org/projects, 0.7 KiB events, label-heavy: about 5 events per trace). The
``dev`` shape, what ``rl-export dev`` publishes, is the standard one with a few prompts per
scenario (``prompts``): like an agent run several times on the same task, several
trajectories share a prompt (the system message and the first user message), so that the
``preference`` export of a few minutes of traffic pairs them.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from rl_export.model.codec import dumps
from rl_export.model.events import format_utc

SCENARIOS = [
    "happy_path_wellness_and_social_goals",
    "refund_request_with_missing_order",
    "multi_city_trip_planning",
    "password_reset_locked_account",
    "summarise_quarterly_report",
]
EVALUATORS = ["faithfulness", "helpfulness_judge", "policy_check", "tool_use"]
LABELERS = ["ana", "bo", "chen", "dee"]


@dataclass(frozen=True)
class Shape:
    """What one synthetic trace looks like: its size and how many events of each kind."""

    name: str
    projects: tuple[tuple[str, str], ...] = (("acme", "support-bot"),)
    turns: tuple[int, int] = (2, 4)
    user_words: tuple[int, int] = (8, 40)
    assistant_words: int = 60
    tool_words: int = 30
    tool_call_rate: float = 0.4
    evaluations: tuple[int, ...] = (0, 1, 1, 2)  # drawn from, per trace
    evaluators: tuple[int, int] = (1, 3)
    reasoning_words: int = 20
    labelers: tuple[str, ...] = tuple(LABELERS)
    labels: tuple[int, ...] = (0, 0, 1, 2)  # drawn from, per trace
    # First user messages per scenario, drawn from (several runs of one task share a prompt);
    # 0: every trace's is its own.
    prompts: int = 0


SHAPES: dict[str, Shape] = {
    "standard": Shape("standard"),
    "small": Shape(
        "small",
        projects=(("acme", "support-bot"), ("globex", "triage"), ("initech", "coder")),
        turns=(2, 3),
        user_words=(10, 35),
        assistant_words=60,
        tool_words=20,
        tool_call_rate=0.3,
        evaluations=(0, 1, 1, 1),
        evaluators=(1, 2),
        reasoning_words=10,
        labelers=("ana", "bo", "chen", "dee", "eli", "fay", "gus", "hal"),
        labels=(1, 2, 3, 4),
    ),
}
STANDARD = SHAPES["standard"]
SHAPES["dev"] = Shape("dev", prompts=4)
_WORDS = [
    "plan", "goal", "step", "budget", "weekly", "check", "progress", "habit", "sleep", "walk",
    "friend", "call", "schedule", "review", "order", "refund", "account", "reset", "summary",
    "revenue", "growth", "margin", "city", "flight", "hotel", "route",
]  # fmt: skip


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def _conversation(
    rng: random.Random, turns: int, shape: Shape, first: str | None = None
) -> list[dict[str, Any]]:
    """A conversation of ``turns`` user turns; ``first``: the first user message's text."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful agent."}]
    for turn in range(turns):
        if turn == 0 and first is not None:
            messages.append({"role": "user", "content": first})
        else:
            messages.append({"role": "user", "content": _text(rng, rng.randint(*shape.user_words))})
        if rng.random() < shape.tool_call_rate:
            call_id = f"call_{turn}_{rng.randrange(10**6)}"
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "search", "arguments": '{"q": "plan"}'},
                        }
                    ],
                }
            )
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": _text(rng, shape.tool_words)}
            )
        text = _text(rng, shape.assistant_words)
        messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
    return messages


def _prompt(scenario: str, n: int) -> str:
    """The ``n``-th first user message of a scenario: the same in every trace that draws it."""
    return _text(random.Random(f"{scenario}/{n}"), 20)


def _base(
    rng: random.Random, kind: str, trace: dict[str, str], at: datetime, n: int
) -> dict[str, Any]:
    return {
        "event_id": f"{trace['trace_id']}-{kind}-{n}-{rng.randrange(16**8):08x}",
        "event_type": kind,
        "occurred_at": format_utc(at),
        "org": trace["org"],
        "project": trace["project"],
        "trace_id": trace["trace_id"],
    }


def trace_events(
    rng: random.Random, index: int, completed_at: datetime, shape: Shape = STANDARD
) -> list[dict[str, Any]]:
    """Return every event of one synthetic trace, in the order they happened.

    The trace completes at ``completed_at``; evaluations and labels follow within hours.
    """
    org, project = shape.projects[index % len(shape.projects)]
    trace = {"trace_id": f"tr-{index:08d}", "org": org, "project": project}
    at = completed_at
    events = []
    completed = _base(rng, "trace.completed", trace, at, 0)
    agent_version = rng.choice(["v3", "v4"])
    scenario = rng.choice(SCENARIOS)
    first = _prompt(scenario, rng.randrange(shape.prompts)) if shape.prompts else None
    completed |= {
        "agent_version": agent_version,
        "scenario": scenario,
        "messages": _conversation(rng, rng.randint(*shape.turns), shape, first),
        "metadata": {"latency_ms": rng.randint(200, 9000)},
        "attachments": [],
    }
    events.append(completed)
    for run in range(rng.choice(shape.evaluations)):
        at += timedelta(seconds=rng.randint(1, 600))
        evaluation = _base(rng, "evaluation.finished", trace, at, run)
        results = []
        for name in rng.sample(EVALUATORS, rng.randint(*shape.evaluators)):
            score = round(rng.random(), 3)
            results.append(
                {"evaluator": name, "score": score, "passed": score >= 0.5,
                 "reasoning": _text(rng, shape.reasoning_words)}
            )  # fmt: skip
        evaluation |= {
            "evaluation_id": f"ev-{index}-{run}",
            "results": results,
            "report": {
                "outcomes": [{"type": "goal_met", "turn": 1, "decision": rng.random() < 0.7}],
                "classifications": [],
            },
        }
        events.append(evaluation)
    for n, labeler in enumerate(rng.sample(shape.labelers, rng.choice(shape.labels))):
        at += timedelta(seconds=rng.randint(1, 3600))
        roll = rng.random()
        if roll < 0.15:
            events.append(_base(rng, "label.skipped", trace, at, n) | {"labeler": labeler})
            continue
        label = _base(rng, "label.submitted", trace, at, n)
        label |= {
            "labeler": labeler,
            "rubric": {d: rng.randint(1, 5) for d in ("correctness", "helpfulness",
                                                      "efficiency", "safety")},
        }  # fmt: skip
        events.append(label)
        if roll > 0.9:
            at += timedelta(seconds=5)
            events.append(_base(rng, "label.retracted", trace, at, n) | {"labeler": labeler})
    return events


def generate(
    n_traces: int,
    *,
    seed: int = 7,
    duplicate_rate: float = 0.02,
    shuffle: bool = True,
    start: datetime | None = None,
    shape: Shape = STANDARD,
) -> list[dict[str, Any]]:
    """Return the events of ``n_traces`` traces, shuffled, with some exact duplicates."""
    rng = random.Random(seed)
    start = start or datetime(2026, 1, 1, tzinfo=UTC)
    events = [
        e
        for i in range(n_traces)
        for e in trace_events(rng, i, start + timedelta(seconds=i), shape)
    ]
    events += [rng.choice(events) for _ in range(int(len(events) * duplicate_rate))]
    if shuffle:
        rng.shuffle(events)
    return events


PRINCIPLES = ["no_pii", "no_medical_advice", "stay_on_topic", "cite_sources"]


def scored_trace_events(
    rng: random.Random, index: int, completed_at: datetime, *, deleted: bool = False
) -> list[dict[str, Any]]:
    """Every event of one trace that is always evaluated, with a full report.

    For corpora of known size (the export benchmark): the trace completes (a multi-turn
    conversation with tool calls), one evaluation follows with two or three judges and a
    report (outcomes with severities, classifications with assessments), about a third of
    the traces get a human label, and ``deleted`` ends the trace with ``trace.deleted``.
    """
    trace = {"trace_id": f"tr-{index:08d}", "org": "acme", "project": "support-bot"}
    at = completed_at
    completed = _base(rng, "trace.completed", trace, at, 0)
    completed |= {
        "agent_version": rng.choice(["v3", "v4"]),
        "scenario": rng.choice(SCENARIOS),
        "messages": _conversation(rng, rng.randint(2, 4), STANDARD),
        "metadata": {"latency_ms": rng.randint(200, 9000)},
        "attachments": [],
    }
    events = [completed]
    at += timedelta(seconds=rng.randint(1, 600))
    evaluation = _base(rng, "evaluation.finished", trace, at, 0)
    results = []
    for name in rng.sample(EVALUATORS, rng.randint(2, 3)):
        score = round(rng.random(), 3)
        results.append(
            {"evaluator": name, "score": score, "passed": score >= 0.3, "reasoning": _text(rng, 20)}
        )
    evaluation |= {
        "evaluation_id": f"ev-{index}",
        "results": results,
        "report": {
            "outcomes": [
                {"type": "goal_met", "turn": 1, "decision": rng.random() < 0.7},
                {
                    "type": "compliance",
                    "turn": 2,
                    "decision": rng.random() < 0.9,
                    "severity": rng.choice([0, 0, 0, 1, 2, 3]),
                },
            ],
            "classifications": [
                {
                    "type": "policy",
                    "turn": 1,
                    "assessments": [
                        {
                            "principle_id": p,
                            "decision": rng.random() < 0.9,
                            "explanation": _text(rng, 8),
                        }
                        for p in rng.sample(PRINCIPLES, 2)
                    ],
                }
            ],
        },
    }
    events.append(evaluation)
    if rng.random() < 0.33:
        at += timedelta(seconds=rng.randint(1, 3600))
        label = _base(rng, "label.submitted", trace, at, 0)
        label |= {
            "labeler": rng.choice(LABELERS),
            "rubric": {d: rng.randint(1, 5) for d in ("correctness", "helpfulness",
                                                      "efficiency", "safety")},
        }  # fmt: skip
        events.append(label)
    if deleted:
        at += timedelta(seconds=5)
        events.append(_base(rng, "trace.deleted", trace, at, 0))
    return events


def scored_event_lines(first: int, count: int, seed: int) -> Iterator[tuple[str, bytes]]:
    """The event lines of the benches' scored traces ``first`` .. ``first + count - 1``, as
    ``replay`` takes them (where, line); trace ``i`` is deleted iff ``i % 100 == 99``."""
    rng = random.Random(seed * 1_000_003 + first)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for index in range(first, first + count):
        at = start + timedelta(seconds=index)
        for event in scored_trace_events(rng, index, at, deleted=index % 100 == 99):
            yield f"trace {index}", dumps(event)


def traces_for(records: int) -> int:
    """How many scored traces give ``records`` live ones when one in a hundred is deleted."""
    n = records + records // 99
    while n - n // 100 < records:
        n += 1
    while n - 1 - (n - 1) // 100 >= records:
        n -= 1
    return n
