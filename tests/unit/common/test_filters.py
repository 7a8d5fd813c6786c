"""The filters of DESIGN.md section 4: parsing, errors that name the filter, matching."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rl_export.common.errors import ConfigError, FilterError
from rl_export.common.filters import (
    FILTER_NAMES,
    Filters,
    filters_from_json,
    parse_filters,
)
from tests.records import record


def test_both_spellings_and_every_filter_parse() -> None:
    parsed = parse_filters(
        {
            "passed": "true",
            "min-reward": "0.25",
            "max_reward": "0.9",
            "pass-dimension": ["goal_met", "tone"],
            "max_severity": "2",
            "agent-version": "v4",
            "scenario": "refund",
            "since": "2026-01-01T00:00:00+02:00",
            "until": "2026-02-01T00:00:00Z",
            "labeled": "false",
            "limit": "10",
        }
    )
    assert parsed == Filters(
        passed=True,
        min_reward=0.25,
        max_reward=0.9,
        pass_dimension=("goal_met", "tone"),
        max_severity=2,
        agent_version="v4",
        scenario="refund",
        since=datetime(2025, 12, 31, 22, tzinfo=UTC),
        until=datetime(2026, 2, 1, tzinfo=UTC),
        labeled=False,
        limit=10,
    )
    assert set(FILTER_NAMES) == {n.replace("_", "-") for n in Filters.model_fields}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"min-reward": "abc"}, "min-reward: 'abc' is not a number"),
        ({"max_reward": "nan"}, "max-reward: 'nan' is not a finite number"),
        ({"min-reward": "1.5"}, "min-reward: 1.5 is outside 0..1"),
        ({"since": "yesterday"}, "since: expected an RFC 3339 date-time"),
        ({"until": "2026-01-01"}, "until: expected an RFC 3339 date-time"),
        ({"passed": "maybe"}, "passed: 'maybe' is not true or false"),
        ({"max-severity": "-1"}, "max-severity: '-1' is not an integer >= 0"),
        ({"limit": "ten"}, "limit: 'ten' is not an integer >= 0"),
        ({"scenario": "  "}, "scenario: is empty"),
        ({"scenario": ["a", "b"]}, "scenario: given more than once"),
        ({"min-reward": "0.8", "max-reward": "0.2"}, "min-reward: 0.8 is above max-reward 0.2"),
        ({"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "since: "),
        ({"colour": "red"}, "colour: not a filter"),
    ],
)
def test_malformed_filters_name_the_filter_and_the_problem(
    values: dict[str, str], message: str
) -> None:
    with pytest.raises(FilterError) as caught:
        parse_filters(values)
    assert str(caught.value).startswith(message)
    assert isinstance(caught.value, ConfigError)
    assert "\n" not in str(caught.value)


def test_non_strict_parsing_ignores_other_parameters() -> None:
    parsed = parse_filters({"source": "human", "format": "csv", "passed": "1"}, strict=False)
    assert parsed == Filters(passed=True)


@pytest.mark.parametrize("sep", ["_", "-"])
def test_to_params_is_the_inverse_of_parse_filters(sep: str) -> None:
    filters = parse_filters(
        {
            "passed": "false",
            "min-reward": "0.1",
            "pass-dimension": ["a", "b"],
            "since": "2026-01-01T00:00:00.5Z",
            "limit": "3",
            "labeled": "true",
        }
    )
    params = filters.to_params(sep=sep)
    assert all(sep in k or ("-" not in k and "_" not in k) for k in params)
    assert parse_filters(params) == filters
    assert Filters().to_params() == {}


def outcome(kind: str, decision: bool | None, severity: int = 0) -> dict[str, object]:
    return {"type": kind, "turn": 1, "decision": decision, "severity": severity}


def test_matching_each_filter() -> None:
    outcomes = [outcome("goal_met", True), outcome("goal_met", None), outcome("tone", True, 1)]
    good = record("a", reward=0.9, passed=True, labels=2, outcomes=outcomes)
    bad = record("b", reward=0.2, passed=False, scenario="other", agent_version="v3",
                 updated_at="2026-03-01T00:00:00.5Z", outcomes=[
                     outcome("goal_met", False), outcome("tone", None, 4)])  # fmt: skip
    unscored = record("c", reward=None, passed=None, source=None)
    cases = [
        (Filters(passed=True), [good]),
        (Filters(passed=False), [bad]),
        (Filters(min_reward=0.5), [good]),
        (Filters(max_reward=0.5), [bad]),
        (Filters(min_reward=0.2, max_reward=0.2), [bad]),
        (Filters(pass_dimension=("goal_met",)), [good]),
        (Filters(pass_dimension=("tone",)), [good]),  # bad's tone was never decided
        (Filters(pass_dimension=("missing",)), []),
        (Filters(max_severity=1), [good, unscored]),  # no evaluation: severity 0
        (Filters(max_severity=4), [good, bad, unscored]),
        (Filters(agent_version="v3"), [bad]),
        (Filters(scenario="refund"), [good, unscored]),
        (Filters(since=datetime(2026, 2, 1, tzinfo=UTC)), [bad]),
        (Filters(until=datetime(2026, 2, 1, tzinfo=UTC)), [good, unscored]),
        (Filters(until=datetime(2026, 3, 1, 0, 0, 0, 500000, tzinfo=UTC)), [good, unscored]),
        (Filters(labeled=True), [good]),
        (Filters(labeled=False), [bad, unscored]),
        (Filters(limit=1), [good, bad, unscored]),  # limit is the export's business
        (Filters(), [good, bad, unscored]),
    ]
    for filters, expected in cases:
        got = [r["trace_id"] for r in (good, bad, unscored) if filters.matches(r)]
        assert got == [r["trace_id"] for r in expected], filters
    tombstone = {"trace_id": "d", "revision": 4, "deleted": True}
    assert not Filters().matches(tombstone)


def test_corpus_spec_filters_read_json_values() -> None:
    assert filters_from_json({"passed": True, "min_reward": 0.5}) == Filters(
        passed=True, min_reward=0.5
    )
    assert filters_from_json({"pass-dimension": ["goal_met"]}).pass_dimension == ("goal_met",)
    with pytest.raises(FilterError, match="passed: 'yes please'"):
        filters_from_json({"passed": "yes please"})
    with pytest.raises(FilterError, match="scenario: "):
        filters_from_json({"scenario": {"nested": 1}})
