"""The query index's SQL over corpus records: what is extracted from each record (read by
DuckDB from JSON lines or from an index sidecar's columns, the same expressions either way),
the records table's columns, and the filters (docs/guides/exports.md) as a condition."""

from __future__ import annotations

from typing import Any

from rl_export.formats.filters import Filters
from rl_export.model.events import Rubric

BINS = 10  # the reward histogram's bins over 0..1 (the export package's stats use ten)
RUBRIC_TYPE = (
    "STRUCT(correctness UTINYINT, helpfulness UTINYINT, efficiency UTINYINT, safety UTINYINT)"
)
LABEL_TYPE = (
    f"STRUCT(labeler VARCHAR, rubric {RUBRIC_TYPE}, occurred_at VARCHAR, comment VARCHAR, "
    "rubric_version BIGINT, kind VARCHAR, reward DOUBLE)"
)
"""A ``human_labels`` entry as the index keeps it (the sidecars' ``labels`` entries): a version-0
label's four ratings, another version's reward (docs/guides/rubrics.md)."""
JSON_COLUMNS = {
    "trace_id": "VARCHAR",
    "revision": "BIGINT",
    "deleted": "BOOLEAN",
    "reward": "DOUBLE",
    "passed": "BOOLEAN",
    "labels_count": "BIGINT",
    "agent_version": "VARCHAR",
    "scenario": "VARCHAR",
    "updated_at": "VARCHAR",
    "completed_at": "VARCHAR",
    "labelers": "VARCHAR[]",
    "skipped_by": "VARCHAR[]",
    "human_labels": f"{LABEL_TYPE}[]",
    "labels": f"{LABEL_TYPE}[]",  # record schema 2's name
    "evaluation": "STRUCT(report STRUCT(outcomes "
    "STRUCT(type VARCHAR, decision BOOLEAN, severity BIGINT)[]), "
    "results STRUCT(evaluator VARCHAR, score DOUBLE, passed BOOLEAN)[])",
    "pass_threshold": "DOUBLE",
}
# A report type passes when at least one of its outcomes was decided and none decided false
# (Filters.matches, pass-dimension); the worst severity counts an absent one as 0.
_OUTCOMES = "evaluation.report.outcomes"
_RESULTS = "evaluation.results"
_PASSES = f"list_transform({_RESULTS}, lambda r: r.passed)"
LABEL_SUM = (
    "CASE WHEN x.rubric_version IS NULL THEN "
    + "+".join(f"x.rubric.{d}" for d in Rubric.model_fields)
    + " ELSE x.reward * 20 END"
)
"""A label's reward in twentieths: a version-0 label's ratings summed (4..20, exact), another
version's reward x 20 (the queue's spread is their difference / 20: labeling/queue.py)."""
_LABELS = "list_filter(labels, lambda x: coalesce(x.kind, 'label') = 'label')"
"""A record's labels without its adjudication (a reviewer's decision is no label)."""
EXTRACT = f"""
    trace_id, revision, coalesce(deleted, false) AS deleted, reward, passed,
    labels_count, agent_version, scenario,
    try_cast(updated_at AS TIMESTAMPTZ) AS updated_at,
    try_cast(completed_at AS TIMESTAMPTZ) AS completed_at,
    coalesce(list_max(list_transform({_OUTCOMES}, lambda o: coalesce(o.severity, 0))), 0)
        AS max_severity,
    coalesce(list_filter(
        list_distinct(list_transform(
            list_filter({_OUTCOMES}, lambda o: o.decision IS NOT NULL), lambda o: o.type)),
        lambda t: NOT list_contains(list_transform(
            list_filter({_OUTCOMES}, lambda o: o.decision = false), lambda o: o.type), t)
    ), []) AS pass_dims,
    coalesce(labelers, []) AS labelers, coalesce(skipped_by, []) AS skipped_by,
    coalesce(labels_count, 0) > 0 AS labeled,
    CASE WHEN reward IS NOT NULL THEN least(greatest(floor(reward * {BINS}), 0), {BINS} - 1)
        END::UTINYINT AS bucket,
    epoch_us(try_cast(completed_at AS TIMESTAMPTZ)) AS completed_us,
    CASE WHEN labels IS NULL THEN
            CASE WHEN coalesce(labels_count, 0) < 2 THEN 0.0 END
        WHEN len({_LABELS}) < 2 THEN 0.0
        WHEN list_bool_or(list_transform({_LABELS}, lambda x: ({LABEL_SUM}) IS NULL)) THEN NULL
        ELSE (list_max(list_transform({_LABELS}, lambda x: {LABEL_SUM}))
              - list_min(list_transform({_LABELS}, lambda x: {LABEL_SUM}))) / 20.0
    END AS spread,
    {_LABELS} AS labels,
    list_filter(labels, lambda x: x.kind = 'adjudication')[1] AS adjudication,
    {_RESULTS} AS results, pass_threshold,
    CASE WHEN len({_RESULTS}) > 0 THEN list_avg(list_transform({_RESULTS}, lambda r: r.score))
        END AS eval_reward,
    CASE WHEN len({_RESULTS}) > 0 THEN list_bool_and({_PASSES}) END AS eval_passed,
    CASE WHEN len({_RESULTS}) > 0 THEN list_bool_or({_PASSES}) AND NOT list_bool_and({_PASSES})
        END AS eval_split
"""
# ``bucket`` is the reward's histogram bin and ``labeled`` whether a human label counts,
# computed once at ingest: as expressions in the stats query they cost it three times over.
# ``spread`` is filters.record_spread: NULL (unknown) for a record written before records
# carried ``labels`` that has two or more labels; (greatest - least sum) / 20 as a double.
# A label without a reward (its rubric version unknown to the join) makes the spread unknown.
# ``labels`` (the record's, less its adjudication: ``adjudication``; NULL for a record written
# before records carried labels), ``results`` and ``pass_threshold`` feed the agreement
# report; ``eval_reward``, ``eval_passed`` and ``eval_split`` (the current evaluation's mean
# score, all passed, some passed and some not; NULL without results) the team's queue.
RECORD_COLUMNS = (
    "corpus_id INTEGER, trace_id VARCHAR, revision BIGINT, deleted BOOLEAN, reward DOUBLE, "
    "passed BOOLEAN, labels_count BIGINT, agent_version VARCHAR, scenario VARCHAR, "
    "updated_at TIMESTAMPTZ, completed_at TIMESTAMPTZ, max_severity BIGINT, "
    "pass_dims VARCHAR[], labelers VARCHAR[], skipped_by VARCHAR[], seq BIGINT, "
    "seg INTEGER, off BIGINT, len BIGINT, labeled BOOLEAN, bucket UTINYINT, "
    "completed_us BIGINT, spread DOUBLE, "
    f"labels {LABEL_TYPE}[], adjudication {LABEL_TYPE}, "
    "results STRUCT(evaluator VARCHAR, score DOUBLE, passed BOOLEAN)[], pass_threshold DOUBLE, "
    "eval_reward DOUBLE, eval_passed BOOLEAN, eval_split BOOLEAN"
)


def filter_sql(filters: Filters) -> tuple[str, list[Any]]:
    """The SQL condition (and its parameters) of :meth:`Filters.matches` over the index's
    columns; ``limit`` is the caller's. The unit tests check both agree on random records."""
    if filters.metadata:  # the routes read the corpus itself for these
        raise ValueError("the index holds no metadata: a metadata filter reads the corpus")
    clauses = ["NOT deleted"]
    params: list[Any] = []

    def add(clause: str, value: Any) -> None:
        clauses.append(clause)
        params.append(value)

    if filters.passed is not None:
        add("passed = ?", filters.passed)
    if filters.min_reward is not None:
        add("reward >= ?", filters.min_reward)
    if filters.max_reward is not None:
        add("reward <= ?", filters.max_reward)
    if filters.agent_version is not None:
        add("agent_version = ?", filters.agent_version)
    if filters.scenario is not None:
        add("scenario = ?", filters.scenario)
    if filters.labeled is not None:
        add("(coalesce(labels_count, 0) > 0) = ?", filters.labeled)
    if filters.since is not None:
        add("updated_at >= ?", filters.since)
    if filters.until is not None:
        add("updated_at < ?", filters.until)
    if filters.pass_dimension:
        add("list_has_all(pass_dims, ?::VARCHAR[])", list(filters.pass_dimension))
    if filters.max_severity is not None:
        add("max_severity <= ?", filters.max_severity)
    if filters.min_labels is not None:
        add("coalesce(labels_count, 0) >= ?", filters.min_labels)
    if filters.max_spread is not None:
        add("spread <= ?", filters.max_spread)  # NULL (unknown) never passes
    return " AND ".join(clauses), params
