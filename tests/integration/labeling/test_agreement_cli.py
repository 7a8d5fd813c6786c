"""``rl-export agreement`` over a real store: events with known labels go through ``replay``
(the join and the sink) into SeaweedFS, and the command's report equals the test's own
computation from those labels (and alpha equals the ``krippendorff`` package's)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from typing import Any

import krippendorff
import numpy as np
import pytest
from scipy import stats

from rl_export.corpora.store import S3Store
from rl_export.labeling.agreement import DIMENSIONS, AgreementInput, agreement_report
from rl_export.labeling.questions import QuestionsBuilder, with_questions
from rl_export.local.seaweed import LocalS3
from rl_export.model.rubrics import V0_NAMES, VERSION_0
from tests.exportdata import ORG, PROJECT, replay_events
from tests.factories import event

pytestmark = pytest.mark.integration

LABELERS = ("ana", "bo", "cy", "dee")
# Per trace: each labeler's four ratings (None: no label), the judges' (score, passed).
TRACES: list[tuple[dict[str, tuple[int, int, int, int]], dict[str, tuple[float, bool]]]] = [
    ({"ana": (5, 5, 4, 5), "bo": (5, 4, 4, 5), "cy": (4, 5, 4, 5)}, {"judge": (0.9, True)}),
    ({"ana": (2, 1, 2, 3), "bo": (2, 2, 1, 3)}, {"judge": (0.2, False), "tone": (0.6, True)}),
    ({"ana": (3, 3, 3, 4), "cy": (4, 3, 3, 3), "dee": (3, 3, 2, 4)}, {"judge": (0.5, False)}),
    ({"bo": (1, 1, 2, 1), "dee": (2, 1, 1, 1)}, {"judge": (0.1, False), "tone": (0.9, True)}),
    ({"ana": (4, 4, 5, 4), "dee": (2, 3, 3, 3)}, {"judge": (0.7, True), "tone": (0.3, False)}),
    ({"cy": (5, 5, 5, 5)}, {"judge": (0.95, True)}),
    ({"bo": (3, 2, 3, 3)}, {"tone": (0.5, True)}),
    ({}, {"judge": (0.4, False)}),
]


def label(trace: str, who: str, ratings: tuple[int, ...]) -> dict[str, Any]:
    rubric = dict(zip(DIMENSIONS, ratings, strict=True))
    return event("label.submitted", f"{trace}-{who}", "2026-01-01T00:02:00Z", trace_id=trace,
                 labeler=who, rubric=rubric)  # fmt: skip


def events() -> list[dict[str, Any]]:
    """The traces' events, with a retracted label (it must not count), a skip and a
    deleted trace (it must not appear)."""
    out = []
    for n, (labels, results) in enumerate(TRACES):
        trace = f"ag-{n}"
        out.append(event("trace.completed", f"{trace}-c", "2026-01-01T00:00:00Z", trace_id=trace))
        given = [{"evaluator": e, "score": s, "passed": p, "reasoning": "r"}
                 for e, (s, p) in results.items()]  # fmt: skip
        out.append(event("evaluation.finished", f"{trace}-e", "2026-01-01T00:01:00Z",
                         trace_id=trace, evaluation_id=f"ev-{n}", results=given))  # fmt: skip
        for who, ratings in labels.items():
            out.append(label(trace, who, ratings))
    out.append(label("ag-7", "eve", (1, 1, 1, 1)))
    out.append(event("label.retracted", "ag-7-eve-r", "2026-01-01T00:03:00Z", trace_id="ag-7",
                     labeler="eve"))  # fmt: skip
    out.append(event("label.skipped", "ag-6-dee-s", "2026-01-01T00:03:00Z", trace_id="ag-6",
                     labeler="dee"))  # fmt: skip
    out.append(event("trace.completed", "gone-c", "2026-01-01T00:00:00Z", trace_id="gone"))
    out.append(label("gone", "ana", (1, 5, 1, 5)))
    out.append(event("trace.deleted", "gone-d", "2026-01-01T00:04:00Z", trace_id="gone"))
    return out


def expected(keep: list[int]) -> dict[str, Any]:
    """The report of the traces ``keep``, computed from the test's own table (the evaluators
    named by the results of those traces)."""
    evaluators = tuple(dict.fromkeys(e for n in keep for e in TRACES[n][1]))
    label_trace, label_labeler, ratings = [], [], []
    result_trace, result_evaluator, result_score, result_passed = [], [], [], []
    for place, n in enumerate(keep):
        labels, results = TRACES[n]
        for who, given in sorted(labels.items()):
            label_trace.append(place)
            label_labeler.append(LABELERS.index(who))
            ratings.append(given)
        for name, (score, passed) in results.items():
            result_trace.append(place)
            result_evaluator.append(evaluators.index(name))
            result_score.append(score)
            result_passed.append(passed)
    skips = [1 if (who == "dee" and 6 in keep) else 0 for who in LABELERS]
    data = AgreementInput(
        traces=len(keep), labelers=LABELERS, label_trace=np.array(label_trace, np.int64),
        label_labeler=np.array(label_labeler, np.int64),
        ratings=np.array(ratings, np.int8).reshape(-1, 4),
        pass_threshold=np.full(len(keep), 0.7), skips=np.array(skips, np.int64),
        evaluators=evaluators, result_trace=np.array(result_trace, np.int64),
        result_evaluator=np.array(result_evaluator, np.int64),
        result_score=np.array(result_score), result_passed=np.array(result_passed, np.bool_),
    )  # fmt: skip
    report: dict[str, Any] = agreement_report(data).model_dump(mode="json")
    # Per question of version 0, the only version here (labeling/questions.py, whose alphas
    # the unit tests hold to the krippendorff package's); nobody decided a trace.
    builder = QuestionsBuilder()
    for n in keep:
        builder.add({"human_labels": [
            {"labeler": who, "rubric": dict(zip(V0_NAMES, given, strict=True))}
            for who, given in sorted(TRACES[n][0].items())]})  # fmt: skip
    return with_questions(report, builder, {0: VERSION_0}, None)


def reliability(keep: list[int], pick: Any) -> np.ndarray[Any, Any]:
    """Labelers x traces with >= 2 labels, ``pick(ratings)`` or NaN: the package's input."""
    units = [n for n in keep if len(TRACES[n][0]) >= 2]
    data = np.full((len(LABELERS), len(units)), np.nan)
    for column, n in enumerate(units):
        for who, given in TRACES[n][0].items():
            data[LABELERS.index(who), column] = pick(given)
    return data


@pytest.fixture(scope="module")
def store_url(s3: LocalS3) -> str:
    prefix = f"agreement-{uuid.uuid4().hex[:8]}"

    async def write() -> None:
        store = S3Store(s3.bucket, prefix)
        try:
            await replay_events(store, events(), "agreement")
        finally:
            await store.close()

    asyncio.run(write())
    return f"s3://{s3.bucket}/{prefix}"


def agreement(store_url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "rl_export.cli", "agreement", "--store", store_url,
            "--org", ORG, "--project", PROJECT, *flags]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_the_report_is_the_tests_own_computation(store_url: str) -> None:
    result = agreement(store_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1  # one JSON object
    report = json.loads(result.stdout)
    assert report == expected(list(range(len(TRACES))))
    assert (report["traces"], report["labeled"], report["multi_labeled"]) == (8, 7, 5)
    # Independently of the report's own code: the package's alphas and scipy's rho.
    for n, dimension in enumerate(DIMENSIONS):
        data = reliability(list(range(len(TRACES))), lambda r, n=n: r[n])
        alpha = krippendorff.alpha(data, level_of_measurement="ordinal", value_domain=range(1, 6))
        assert report["dimensions"][dimension]["alpha"] == pytest.approx(alpha, abs=1e-9)
    rewards = reliability(list(range(len(TRACES))), lambda r: sum(r) / 20)
    alpha = krippendorff.alpha(rewards, level_of_measurement="interval")
    assert report["dimensions"]["reward"]["alpha"] == pytest.approx(alpha, abs=1e-9)
    assert report["dimensions"]["reward"]["units"] == 5
    judged = [n for n in range(len(TRACES)) if "judge" in TRACES[n][1] and TRACES[n][0]]
    human = [sum(map(sum, TRACES[n][0].values())) / (20 * len(TRACES[n][0])) for n in judged]
    rho = stats.spearmanr([TRACES[n][1]["judge"][0] for n in judged], human).statistic
    judge = report["evaluators"][0]
    assert (judge["evaluator"], judge["traces"]) == ("judge", len(judged))
    assert judge["spearman"] == pytest.approx(rho, abs=1e-12)
    detail = {d["labeler"]: d for d in report["labelers_detail"]}
    assert detail["dee"]["skips"] == 1
    assert "eve" not in detail  # retracted: no label; "gone" deleted: ana has 4 labels
    assert detail["ana"]["labels"] == 4


def test_filters_narrow_the_traces(store_url: str) -> None:
    result = agreement(store_url, "--min-labels", "3")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == expected([0, 2])
    # Spreads (sums / 20): ag-0 19-18 = 1/20, ag-1 0, ag-2 13-12 = 1/20, ag-3 0, ag-4 17-11
    # = 6/20; one label or none: 0.
    result = agreement(store_url, "--max-spread", "0.1", "--min-labels", "2")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == expected([0, 1, 2, 3])


def test_bad_flags_are_one_line_and_exit_2(store_url: str) -> None:
    result = agreement(store_url, "--max-spread", "wide")
    assert result.returncode == 2
    assert result.stderr.strip() == "rl-export: error: max-spread: 'wide' is not a number"
    result = agreement(store_url, "--min-labels", "-1")
    assert result.returncode == 2
    assert result.stderr.strip() == "rl-export: error: min-labels: '-1' is not an integer >= 0"
    nobody = [sys.executable, "-m", "rl_export.cli", "agreement", "--store", store_url,
              "--org", ORG, "--project", "nobody"]  # fmt: skip
    result = subprocess.run(nobody, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "rl-export: error: --org/--project: no traces corpus for acme/nobody in s3://"
    )
    assert "Traceback" not in result.stderr
