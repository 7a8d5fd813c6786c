"""The filters of docs/guides/exports.md, in one place: parsed from flags or query parameters, and
matched against trajectory records by the CLI, the HTTP API and streaming corpus specs.

Public interface (the web service and the corpus specs rely on these names)::

    FILTER_NAMES: tuple[str, ...]            # the names, CLI spelling ("min-reward", ...)
    class Filters(BaseModel, frozen):        # every field None / () when not given
        passed: bool | None
        min_reward: float | None             # reward >= min_reward (0..1)
        max_reward: float | None             # reward <= max_reward (0..1)
        pass_dimension: tuple[str, ...]      # every decided outcome of each type is true
        max_severity: int | None             # worst outcome severity <= N (absent = 0)
        agent_version: str | None
        scenario: str | None
        since: datetime | None               # updated_at >= since (inclusive)
        until: datetime | None               # updated_at < until (exclusive)
        labeled: bool | None                 # at least one current human label
        min_labels: int | None               # labels_count >= N
        max_spread: float | None             # record_spread(record) <= X (unknown: no match)
        metadata: tuple[tuple[str, str], ...] # (KEY, VALUE): metadata[KEY], as text, == VALUE
        limit: int | None                    # at most N rows (applied by the export)
        def matches(record: Mapping) -> bool # every given filter holds (limit aside)
        def fields() -> frozenset[str]       # the record fields matches reads
        def to_params(*, sep="_") -> dict[str, str | list[str]]   # inverse of parse_filters
        def is_empty() -> bool
    def parse_filters(values: Mapping[str, str | Sequence[str]], *, strict=True) -> Filters
    def record_spread(record: Mapping) -> float | None   # what max-spread compares
    class FilterError(ConfigError)           # .setting is the filter's name ("min-reward")

``parse_filters`` accepts both spellings (``min-reward`` and ``min_reward``), a string or a
list of strings per name (the repeatable ``pass-dimension`` and ``metadata KEY=VALUE`` take
several), and raises one
:class:`FilterError` naming the filter and the problem, e.g. ``min-reward: 'abc' is not a
number``. With ``strict=False`` names that are not filters are ignored (a query string also
carries ``source``, ``format``, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict

from rl_export.model.errors import FilterError
from rl_export.model.events import Rubric, format_utc, parse_rfc3339

FILTER_NAMES: tuple[str, ...] = (
    "passed",
    "min-reward",
    "max-reward",
    "pass-dimension",
    "max-severity",
    "agent-version",
    "scenario",
    "since",
    "until",
    "labeled",
    "min-labels",
    "max-spread",
    "metadata",
    "limit",
)
_REPEATABLE = frozenset({"pass-dimension", "metadata"})

__all__ = [
    "FILTER_NAMES", "FilterError", "Filters", "parse_filters", "record_spread", "worst_severity",
]  # fmt: skip


class Filters(BaseModel):
    """A set of filters; a field left at None (or ``()``) does not filter."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    passed: bool | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    pass_dimension: tuple[str, ...] = ()
    max_severity: int | None = None
    agent_version: str | None = None
    scenario: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    labeled: bool | None = None
    min_labels: int | None = None
    max_spread: float | None = None
    metadata: tuple[tuple[str, str], ...] = ()
    limit: int | None = None

    def is_empty(self) -> bool:
        """True when no filter (nor limit) is set."""
        return self == _EMPTY

    def matches(self, record: Mapping[str, Any]) -> bool:
        """True when the trajectory record passes every filter (``limit`` is the caller's).

        A tombstone never matches. A record whose reward or ``passed`` is null (the
        ``traces`` corpus) fails ``passed``, ``min-reward`` and ``max-reward``; one whose
        spread is unknown (:func:`record_spread`) fails ``max-spread``.
        """
        if record.get("deleted"):
            return False
        if self.passed is not None and record.get("passed") is not self.passed:
            return False
        if self.min_reward is not None or self.max_reward is not None:
            reward = record.get("reward")
            if reward is None:
                return False
            if self.min_reward is not None and reward < self.min_reward:
                return False
            if self.max_reward is not None and reward > self.max_reward:
                return False
        if self.agent_version is not None and record.get("agent_version") != self.agent_version:
            return False
        if self.scenario is not None and record.get("scenario") != self.scenario:
            return False
        if self.labeled is not None and (bool(record.get("labels_count")) is not self.labeled):
            return False
        if self.min_labels is not None and (record.get("labels_count") or 0) < self.min_labels:
            return False
        if self.max_spread is not None:
            spread = record_spread(record)
            if spread is None or spread > self.max_spread:
                return False
        if self.metadata:
            metadata = record.get("metadata")
            if not isinstance(metadata, Mapping):
                return False
            for key, value in self.metadata:
                if key not in metadata or metadata_text(metadata[key]) != value:
                    return False
        if self.since is not None or self.until is not None:
            stamp = _updated_at(record)
            if stamp is None:
                return False
            if self.since is not None and stamp < self.since:
                return False
            if self.until is not None and stamp >= self.until:
                return False
        if self.pass_dimension or self.max_severity is not None:
            outcomes = _outcomes(record)
            for dimension in self.pass_dimension:
                decided = [o.get("decision") for o in outcomes if o.get("type") == dimension]
                decided = [d for d in decided if d is not None]
                if not decided or not all(d is True for d in decided):
                    return False
            if self.max_severity is not None and worst_severity(outcomes) > self.max_severity:
                return False
        return True

    def fields(self) -> frozenset[str]:
        """The top-level record fields :meth:`matches` reads (``deleted`` always): a record
        holding only these matches as the whole record does."""
        wanted = {"deleted"}
        for field, name in _FIELDS:
            if getattr(self, field) not in (None, ()):
                wanted.add(name)
        if self.min_reward is not None or self.max_reward is not None:
            wanted.add("reward")
        if self.max_spread is not None:
            wanted.update(("human_labels", "labels_count"))
        return frozenset(wanted)

    def to_params(self, *, sep: str = "_") -> dict[str, str | list[str]]:
        """The filters that are set, as :func:`parse_filters` reads them back.

        ``sep="_"`` gives query-parameter names (``min_reward``), ``sep="-"`` flag names.
        """
        out: dict[str, str | list[str]] = {}
        for name in FILTER_NAMES:
            value = getattr(self, name.replace("-", "_"))
            if value is None or value == ():
                continue
            key = name.replace("-", sep)
            if isinstance(value, bool):
                out[key] = "true" if value else "false"
            elif isinstance(value, datetime):
                out[key] = format_utc(value)
            elif name == "metadata":
                out[key] = [f"{k}={v}" for k, v in value]
            elif isinstance(value, tuple):
                out[key] = list(value)
            else:
                out[key] = repr(value) if isinstance(value, float) else str(value)
        return out


_EMPTY = Filters()
_FIELDS = (
    ("passed", "passed"),
    ("agent_version", "agent_version"),
    ("scenario", "scenario"),
    ("labeled", "labels_count"),
    ("min_labels", "labels_count"),
    ("since", "updated_at"),
    ("until", "updated_at"),
    ("pass_dimension", "evaluation"),
    ("max_severity", "evaluation"),
    ("metadata", "metadata"),
)  # (filter, the record field it reads); min/max reward read reward


_DIMENSIONS = tuple(Rubric.model_fields)  # correctness, helpfulness, efficiency, safety


def record_spread(record: Mapping[str, Any]) -> float | None:
    """The largest difference between two current labelers' rewards (a version-0 label's four
    ratings summed / 20, another rubric version's ``reward``; an adjudication is no label): 0
    with fewer than two labels; None when unknown (a record with two or more labels written
    before records carried ``human_labels``, or a label without a reward).

    Computed as (greatest - least) / 20 of each label's reward in twentieths (a version-0
    label's sum, an integer; another's reward x 20), so that it equals the query index's SQL
    to the bit and a spread of exactly X passes ``max-spread X``.
    """
    labels = record.get("human_labels")
    if not isinstance(labels, list):
        return 0.0 if (record.get("labels_count") or 0) < 2 else None
    labels = [x for x in labels if x.get("kind", "label") == "label"]
    if len(labels) < 2:
        return 0.0
    sums = [label_twentieths(label) for label in labels]
    known = [s for s in sums if s is not None]
    if len(known) < len(sums):
        return None
    return (max(known) - min(known)) / 20


def label_twentieths(label: Mapping[str, Any]) -> float | None:
    """A ``human_labels`` entry's reward x 20: a version-0 label's ratings summed (an integer),
    another version's ``reward`` x 20; None when it has no reward."""
    if "answers" in label:
        reward = label.get("reward")
        return None if reward is None else reward * 20
    return sum(label["rubric"][d] for d in _DIMENSIONS)  # type: ignore[no-any-return]


def metadata_text(value: Any) -> str:
    """A metadata value as the ``metadata`` filter compares it: a string as it is, anything
    else as its compact JSON (``true``, ``3``, ``1.5``, ``null``)."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _updated_at(record: Mapping[str, Any]) -> datetime | None:
    value = record.get("updated_at")
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        return None
    try:
        return parse_rfc3339(value)
    except ValueError:
        return None


def _outcomes(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    evaluation = record.get("evaluation")
    if not isinstance(evaluation, Mapping):
        return []
    report = evaluation.get("report")
    if not isinstance(report, Mapping):
        return []
    outcomes = report.get("outcomes")
    return [o for o in outcomes if isinstance(o, dict)] if isinstance(outcomes, list) else []


def worst_severity(outcomes: Sequence[Mapping[str, Any]]) -> int:
    """The worst (greatest) severity of a report's outcomes; absent means 0, none means 0."""
    worst = 0
    for outcome in outcomes:
        severity = outcome.get("severity")
        if isinstance(severity, int) and not isinstance(severity, bool) and severity > worst:
            worst = severity
    return worst


# --- parsing --------------------------------------------------------------------------------


def parse_bool(name: str, text: str) -> bool:
    """``true``/``1``/``yes`` or ``false``/``0``/``no``; FilterError naming ``name`` else."""
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise FilterError(name, f"{text!r} is not true or false")


def _unit_number(name: str, text: str, why: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise FilterError(name, f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise FilterError(name, f"{text!r} is not a finite number")
    if not 0.0 <= value <= 1.0:
        raise FilterError(name, f"{text} is outside 0..1 ({why})")
    return value


def _reward(name: str, text: str) -> float:
    return _unit_number(name, text, "rewards are 0..1")


def _spread(name: str, text: str) -> float:
    return _unit_number(name, text, "a spread is a difference of two rewards, 0..1")


COUNT_MAX = 2**63 - 1
"""The largest count a filter takes: what a signed 64-bit integer (the index's) holds."""


def _count(name: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:  # not an integer (or thousands of digits)
        raise FilterError(name, f"{text[:40]!r} is not an integer >= 0") from None
    if value < 0:
        raise FilterError(name, f"{text!r} is not an integer >= 0")
    if value > COUNT_MAX:
        raise FilterError(name, f"{text[:40]} is over {COUNT_MAX} (the largest count)")
    return value


def _text(name: str, text: str) -> str:
    if not text.strip():
        raise FilterError(name, "is empty")
    return text


def _pair(name: str, text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise FilterError(name, f"expected KEY=VALUE (e.g. tier=gold), got {text!r}")
    return key.strip(), value


def _datetime(name: str, text: str) -> datetime:
    try:
        return parse_rfc3339(text.strip())
    except ValueError as exc:
        raise FilterError(
            name,
            f"expected an RFC 3339 date-time with an offset, e.g. 2026-01-31T12:00:00Z, "
            f"got {text!r}" + ("" if "expected" in str(exc) else f" ({exc})"),
        ) from None


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "passed": parse_bool,
    "min-reward": _reward,
    "max-reward": _reward,
    "pass-dimension": _text,
    "max-severity": _count,
    "agent-version": _text,
    "scenario": _text,
    "since": _datetime,
    "until": _datetime,
    "labeled": parse_bool,
    "min-labels": _count,
    "max-spread": _spread,
    "metadata": _pair,
    "limit": _count,
}


def canonical_name(name: str) -> str | None:
    """The CLI spelling of a filter name given either way (``min_reward``), or None."""
    spelled = name.strip().lstrip("-").replace("_", "-")
    return spelled if spelled in _PARSERS else None


def parse_filters(values: Mapping[str, str | Sequence[str]], *, strict: bool = True) -> Filters:
    """Parse flag or query values into :class:`Filters`; raise :class:`FilterError`.

    ``values`` maps a name (``min-reward`` or ``min_reward``) to a string or a list of
    strings. Only ``pass-dimension`` may be given more than once. Names that are not
    filters raise, unless ``strict`` is false.
    """
    fields: dict[str, Any] = {}
    for raw_name, raw in values.items():
        name = canonical_name(raw_name)
        if name is None:
            if strict:
                raise FilterError(raw_name, f"not a filter (filters: {', '.join(FILTER_NAMES)})")
            continue
        texts = [raw] if isinstance(raw, str) else list(raw)
        if not all(isinstance(t, str) for t in texts):
            raise FilterError(name, f"expected text, got {raw!r}")
        if not texts:
            continue
        field = name.replace("-", "_")
        parsed = [_PARSERS[name](name, t) for t in texts]
        if name in _REPEATABLE:
            fields[field] = (*fields.get(field, ()), *parsed)
            continue
        if len(parsed) > 1 or field in fields:
            raise FilterError(name, "given more than once")
        fields[field] = parsed[0]
    minimum, maximum = fields.get("min_reward"), fields.get("max_reward")
    if minimum is not None and maximum is not None and minimum > maximum:
        raise FilterError("min-reward", f"{minimum} is above max-reward {maximum}")
    since, until = fields.get("since"), fields.get("until")
    if since is not None and until is not None and since >= until:
        raise FilterError("since", f"{format_utc(since)} is not before until {format_utc(until)}")
    return Filters(**fields)


def filters_from_json(value: Mapping[str, Any]) -> Filters:
    """:func:`parse_filters` of a JSON object (a corpus spec's ``filter``): JSON values,
    booleans and numbers included, are read as their text."""
    texts: dict[str, str | list[str]] = {}
    for name, item in value.items():
        if canonical_name(name) == "metadata" and isinstance(item, Mapping):
            # {"tier": "gold"} is metadata=tier=gold
            texts[name] = [f"{k}={metadata_text(v)}" for k, v in item.items()]
        elif isinstance(item, list):
            texts[name] = [filter_text(name, v) for v in item]
        else:
            texts[name] = filter_text(name, item)
    return parse_filters(texts)


def filter_text(name: str, value: Any) -> str:
    """A filter's JSON value as its text (``true``, ``0.5``); FilterError for null, objects."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise FilterError(canonical_name(name) or name, f"{value!r} is not a filter value")
