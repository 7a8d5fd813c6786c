"""Pairs to compare and the comparison queue's rules (docs/guides/labeling.md#6-comparisons), pure.

A *pair* is two traces of one project, ``trace_a < trace_b``, named by :func:`pair_id`. The
pairs offered share a key (:func:`pair_key`: the prompt, the messages up to and including
the first user message compared exactly, or the scenario: setting ``pair_on``) and differ in
``agent_version`` (setting ``pair_versions``: ``different``, or ``any``).

Which pairs of a group sharing a key (:func:`pairs_of`): every pair of a small group. A
scenario may hold thousands of traces and its pairs are millions, more than any team
compares, so each trace is paired with at most ``partners`` traces that follow it in a fixed
shuffle of its group (by the hash of the trace id), those the version rule allows: a group
of n traces gives at most n x ``partners`` pairs, every trace is in some, and a new trace
changes only the pairs of its neighbours.

The comparison queue of labeler C follows the trace queue's rules (section 8) with
``comparisons_per_pair`` k in place of ``labels_per_trace``: the pairs C has not compared
whose current comparisons plus other labelers' unexpired claims are fewer than k
(:func:`in_queue`), in the project's order (:func:`order_key`; ``uncertain``: the pairs whose
two evaluator rewards are closest first, pairs without both last). Claims are the trace
queue's (:mod:`rl_export.labeling.claims`), keyed by pair id in the project's comparison
space (:func:`compare_space`), so they never touch a trace's places.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from rl_export.labeling.settings import LabelingSettings, Order
from rl_export.model import pairs as model_pairs
from rl_export.model.events import Choice
from rl_export.model.pairs import pair_id

CHOICES: tuple[Choice, ...] = ("a", "b", "tie", "both_bad")
FLIPPED: dict[Choice, Choice] = {"a": "b", "b": "a", "tie": "tie", "both_bad": "both_bad"}
OUTCOMES: dict[str, Choice] = {"win": "a", "loss": "b", "tie": "tie", "both_bad": "both_bad"}
"""A ``comparisons`` entry's outcome, for the trace that holds it, as the choice it stands
for when that trace is ``trace_a`` (``FLIPPED`` of it when it is ``trace_b``)."""
COMPARE_SPACE = "compare"


def compare_space(project: str) -> str:
    """The claims' project key of a project's comparison places (``<project>/compare``: no
    project name, which has no slash, can take it)."""
    return f"{project}/{COMPARE_SPACE}"


def ordered(first: str, second: str, choice: Choice) -> tuple[str, str, Choice]:
    """``(trace_a, trace_b, choice)`` with ``trace_a < trace_b``: a client that gave the two
    the other way round has its ``a`` and ``b`` flipped. ValueError for one trace twice."""
    if first == second:
        raise ValueError("a pair is two different traces")
    return model_pairs.ordered(first, second, choice)


def prompt_of(messages: Any) -> list[Any] | None:
    """The messages up to and including the first user message (None: no user message)."""
    if not isinstance(messages, list):
        return None
    for n, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return messages[: n + 1]
    return None


def prompt_key(messages: Any) -> str | None:
    """A digest of :func:`prompt_of`: equal exactly when the prompts are (keys sorted: JSON
    objects are equal whatever the order of their keys)."""
    prompt = prompt_of(messages)
    if prompt is None:
        return None
    return hashlib.sha256(orjson.dumps(prompt, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def pair_key(record: Mapping[str, Any], settings: LabelingSettings) -> str | None:
    """What the traces of a pair share, by ``pair_on`` (None: the trace is in no pair)."""
    if settings.pair_on == "scenario":
        scenario = record.get("scenario")
        return scenario if isinstance(scenario, str) else None
    return prompt_key(record.get("messages"))


@dataclass(frozen=True, slots=True)
class PairTrace:
    """What pairing needs of a trace: its key, version, evaluator reward (mean score of its
    current evaluation; None without one) and when it completed (epoch µs)."""

    trace_id: str
    key: str
    agent_version: str | None
    eval_reward: float | None
    completed_us: int


@dataclass(frozen=True, slots=True)
class Pair:
    """A pair to compare: ``completed_us`` is the later trace's (the pair exists from then),
    ``gap`` the difference of their evaluator rewards (None unless both have one)."""

    pair_id: str
    trace_a: str
    trace_b: str
    gap: float | None
    completed_us: int


def _shuffle_key(trace: PairTrace) -> bytes:
    return hashlib.sha256(trace.trace_id.encode()).digest()


def _pair(x: PairTrace, y: PairTrace) -> Pair:
    a, b = (x, y) if x.trace_id < y.trace_id else (y, x)
    gap = None
    if a.eval_reward is not None and b.eval_reward is not None:
        gap = abs(a.eval_reward - b.eval_reward)
    return Pair(pair_id(a.trace_id, b.trace_id), a.trace_id, b.trace_id, gap,
                max(a.completed_us, b.completed_us))  # fmt: skip


def pairs_of(traces: Iterable[PairTrace], settings: LabelingSettings, partners: int) -> list[Pair]:
    """The pairs of ``traces`` (see the module), in no particular order."""
    groups: dict[str, list[PairTrace]] = {}
    for trace in traces:
        groups.setdefault(trace.key, []).append(trace)
    different = settings.pair_versions == "different"
    window = 8 * partners  # how far ahead a trace looks for partners of another version
    out: list[Pair] = []
    for group in groups.values():
        if len(group) < 2:
            continue
        group.sort(key=_shuffle_key)
        for n, trace in enumerate(group):
            found = 0
            for other in group[n + 1 : n + 1 + window]:
                if different and other.agent_version == trace.agent_version:
                    continue
                out.append(_pair(trace, other))
                found += 1
                if found >= partners:
                    break
    return out


def in_queue(labeler: str, voters: Collection[str], holders: Collection[str], k: int) -> bool:
    """Whether the pair is in ``labeler``'s queue: not compared by them, and its current
    comparisons plus others' places (``holders``: claims and fresh votes) fewer than k."""
    if labeler in voters:
        return False
    return len((set(voters) | set(holders)) - {labeler}) < k


def short(voters: Collection[str], k: int) -> bool:
    """Whether the pair's current comparisons are fewer than its target (``team_remaining``)."""
    return len(voters) < k


def order_key(order: Order, labeler: str) -> Any:
    """The queue's order as a sort key over :class:`Pair` (ties: older first, then pair id).
    ``uncertain``: the closest evaluator rewards first, pairs without both last; ``random``:
    a fixed shuffle of its own per labeler."""
    if order == "newest":
        return lambda p: (-p.completed_us, p.pair_id)
    if order == "uncertain":
        return lambda p: (p.gap is None, p.gap or 0.0, p.completed_us, p.pair_id)
    if order == "random":
        salt = labeler.encode() + b"\n"
        return lambda p: (hashlib.sha256(salt + p.pair_id.encode()).digest(), p.pair_id)
    return lambda p: (p.completed_us, p.pair_id)


def voters_of(record: Mapping[str, Any]) -> dict[str, set[str]]:
    """A trace record's current comparisons as ``pair_id -> labelers`` (every pair the
    trace is in, as ``trace_a`` or ``trace_b``)."""
    found: dict[str, set[str]] = {}
    for entry in record.get("comparisons") or ():
        if isinstance(entry, Mapping):
            pid, labeler = entry.get("pair_id"), entry.get("labeler")
            if isinstance(pid, str) and isinstance(labeler, str):
                found.setdefault(pid, set()).add(labeler)
    return found


def choice_of(entry: Mapping[str, Any], trace_id: str) -> Choice | None:
    """The choice a ``comparisons`` entry of trace ``trace_id``'s record stands for."""
    choice = OUTCOMES.get(str(entry.get("outcome")))
    other = entry.get("other")
    if choice is None or not isinstance(other, str):
        return None
    return choice if trace_id < other else FLIPPED[choice]


def head(
    pairs: Sequence[Pair], labeler: str, *, voters: Mapping[str, Collection[str]],
    holders: Mapping[str, Collection[str]], settings: LabelingSettings, limit: int,
) -> list[Pair]:  # fmt: skip
    """The first ``limit`` pairs of ``labeler``'s queue, ``pairs`` being in the queue's order."""
    k = settings.comparisons_per_pair
    out: list[Pair] = []
    for pair in pairs:
        if in_queue(labeler, voters.get(pair.pair_id, ()), holders.get(pair.pair_id, ()), k):
            out.append(pair)
            if len(out) >= limit:
                break
    return out
