"""The filters of DESIGN.md section 4: parsing, errors that name the filter, matching."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rl_export.formats.filters import (
    FILTER_NAMES,
    Filters,
    filters_from_json,
    parse_filters,
    record_spread,
)
from rl_export.model.errors import ConfigError, FilterError
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
            "min_labels": "2",
            "max-spread": "0.15",
            "metadata": ["tier=gold", "region=eu=west"],
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
        min_labels=2,
        max_spread=0.15,
        metadata=(("tier", "gold"), ("region", "eu=west")),
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
        ({"min-labels": "-2"}, "min-labels: '-2' is not an integer >= 0"),
        ({"limit": "9" * 26}, "limit: 99999999999999999999999999 is over 9223372036854775807"),
        ({"max-severity": "9223372036854775808"}, "max-severity: 9223372036854775808 is over"),
        ({"limit": "1" * 5000}, "limit: '1111111111"),
        ({"min_labels": "1.5"}, "min-labels: '1.5' is not an integer >= 0"),
        ({"max-spread": "wide"}, "max-spread: 'wide' is not a number"),
        ({"max_spread": "1.2"}, "max-spread: 1.2 is outside 0..1 (a spread is a difference"),
        ({"max-spread": "inf"}, "max-spread: 'inf' is not a finite number"),
        ({"scenario": "  "}, "scenario: is empty"),
        ({"scenario": ["a", "b"]}, "scenario: given more than once"),
        ({"min-reward": "0.8", "max-reward": "0.2"}, "min-reward: 0.8 is above max-reward 0.2"),
        ({"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "since: "),
        ({"colour": "red"}, "colour: not a filter"),
        ({"metadata": "tier"}, "metadata: expected KEY=VALUE (e.g. tier=gold), got 'tier'"),
        ({"metadata": ["=gold"]}, "metadata: expected KEY=VALUE"),
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
            "min-labels": "2",
            "max-spread": "0.1",
            "metadata": ["tier=gold", "lang=de"],
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


def labels(*sums: tuple[int, int, int, int]) -> list[dict[str, object]]:
    """Current labels as records carry them, one per labeler, with these four ratings."""
    names = ("correctness", "helpfulness", "efficiency", "safety")
    return [
        {"labeler": f"l{n}", "rubric": dict(zip(names, ratings, strict=True)), "comment": None,
         "occurred_at": "2026-01-02T00:00:00Z"}
        for n, ratings in enumerate(sums)
    ]  # fmt: skip


def legacy(trace_id: str, count: int) -> dict[str, object]:
    """A record written before records carried ``labels``: ``count`` labels, ratings unknown."""
    value = record(trace_id, labels=count)
    del value["human_labels"]
    return value


def labeled(trace_id: str, *ratings: tuple[int, int, int, int]) -> dict[str, object]:
    value = record(trace_id, labels=min(len(ratings), 2))
    value["human_labels"] = labels(*ratings)
    value["labels_count"] = len(ratings)
    value["labelers"] = [f"l{n}" for n in range(len(ratings))]
    return value


def test_spread_is_the_largest_difference_of_two_labelers_rewards() -> None:
    assert record_spread(labeled("a")) == 0.0  # no label
    assert record_spread(labeled("a", (1, 2, 3, 4))) == 0.0  # one label: 0
    # Rewards 16/20, 10/20 and 13/20: the spread is 6/20.
    assert record_spread(labeled("a", (4, 4, 4, 4), (1, 3, 3, 3), (4, 3, 3, 3))) == 0.3
    # Written before records carried labels: known for fewer than two labels only.
    assert record_spread(legacy("a", 0)) == 0.0
    assert record_spread(legacy("a", 1)) == 0.0
    assert record_spread(legacy("a", 2)) is None
    assert record_spread(record("a", labels=2)) == 0.05  # ana 16/20, bo 17/20


def test_min_labels_and_max_spread_match() -> None:
    none, one = labeled("none"), labeled("one", (5, 5, 5, 5))
    close = labeled("close", (4, 4, 4, 4), (4, 4, 4, 3))  # spread 1/20 = 0.05
    apart = labeled("apart", (5, 5, 5, 5), (1, 1, 1, 1), (5, 5, 5, 4))  # 16/20 = 0.8
    old = legacy("old", 2)  # two labels, no `labels`: spread unknown
    rows = (none, one, close, apart, old)
    cases = [
        (Filters(min_labels=0), rows),
        (Filters(min_labels=1), (one, close, apart, old)),
        (Filters(min_labels=2), (close, apart, old)),
        (Filters(min_labels=3), (apart,)),
        (Filters(max_spread=0.0), (none, one)),
        (Filters(max_spread=0.05), (none, one, close)),  # exactly 0.05 passes
        (Filters(max_spread=0.04), (none, one)),
        (Filters(max_spread=0.8), (none, one, close, apart)),  # unknown never matches
        (Filters(min_labels=2, max_spread=0.1), (close,)),
    ]
    for filters, expected in cases:
        got = [r["trace_id"] for r in rows if filters.matches(r)]
        assert got == [r["trace_id"] for r in expected], filters
        # A record holding only the fields the filter reads matches as the whole one does.
        fields = filters.fields()
        assert [r["trace_id"] for r in rows if filters.matches(
            {k: v for k, v in r.items() if k in fields})] == got  # fmt: skip


def test_corpus_specs_take_min_labels_and_max_spread() -> None:
    from rl_export.formats.specs import CorpusSpec

    spec = CorpusSpec.model_validate(
        {"name": "agreed", "source": "human", "filter": {"min-labels": 2, "max_spread": 0.1}}
    )
    assert spec.filter == Filters(min_labels=2, max_spread=0.1)
    assert CorpusSpec.model_validate(spec.model_dump()) == spec
    with pytest.raises(ValueError, match="filter max-spread: 'x' is not a number"):
        CorpusSpec.model_validate({"name": "x", "source": "human", "filter": {"max-spread": "x"}})


def test_metadata_filters_compare_top_level_values_as_text() -> None:
    meta = {"tier": "gold", "n": 3, "beta": True, "empty": "", "nested": {"a": 1}}
    rec = record("a", metadata=meta)
    assert parse_filters({"metadata": ["tier=gold"]}).matches(rec)
    assert parse_filters({"metadata": ["tier=gold", "n=3", "beta=true", "empty="]}).matches(rec)
    assert parse_filters({"metadata": ['nested={"a":1}']}).matches(rec)
    assert not parse_filters({"metadata": ["tier=Gold"]}).matches(rec)
    assert not parse_filters({"metadata": ["tier=gold", "n=4"]}).matches(rec)  # every one holds
    assert not parse_filters({"metadata": ["region=eu"]}).matches(rec)  # absent key
    assert not parse_filters({"metadata": ["a=1"]}).matches(rec)  # nested keys are not top-level
    older = {k: v for k, v in rec.items() if k != "metadata"}  # a record from before the field
    assert not parse_filters({"metadata": ["tier=gold"]}).matches(older)
    assert Filters(metadata=(("tier", "gold"),)).fields() == {"deleted", "metadata"}


def test_corpus_specs_take_metadata_as_a_list_or_an_object() -> None:
    wanted = Filters(metadata=(("tier", "gold"), ("n", "3")))
    assert filters_from_json({"metadata": ["tier=gold", "n=3"]}) == wanted
    assert filters_from_json({"metadata": {"tier": "gold", "n": 3}}) == wanted
