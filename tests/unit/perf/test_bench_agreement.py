"""``make bench-agreement``'s synthetic input has the shape it claims, and its figures are the
report's (a small run: the benchmark itself is 1,000,000 traces)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rl_export.formats.filters import Filters
from rl_export.index.labelqueries import agreement_input
from rl_export.index.queryindex import CorpusKey, QueryIndex
from rl_export.labeling.agreement import agreement_report
from tests.perf.bench_agreement import EVALUATORS, print_table, records_of, run, synthetic_input


def test_the_synthetic_input_has_the_claimed_shape() -> None:
    data = synthetic_input(traces=3000, multi=600, single=900)
    per_trace = np.bincount(data.label_trace, minlength=data.traces)
    assert np.count_nonzero(per_trace >= 2) == 600
    assert np.count_nonzero(per_trace == 1) == 900
    # Each trace's labelers are distinct (one current label per labeler).
    pairs = data.label_trace * len(data.labelers) + data.label_labeler
    assert len(np.unique(pairs)) == len(pairs)
    report = agreement_report(data, resamples=50)
    # Labelers who mostly agree, and judges from close to the humans to noisy.
    for alpha in report.dimensions:
        assert alpha[1].alpha is not None
        assert alpha[1].alpha > 0.5
    rho = {e.evaluator: e.spearman or 0.0 for e in report.evaluators}
    assert list(rho) == sorted(EVALUATORS)
    assert rho["goal_met"] > rho["helpfulness_judge"] > rho["tone_judge"] > 0


def test_a_run_prints_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    result = run(2, baseline=True, traces=2000, multi=400, single=600)
    assert (result["traces"], result["multi_labeled"]) == (2000, 400)
    assert result["report"]["n"] == 2
    assert set(result["package_s"]) == {"correctness", "helpfulness", "efficiency", "safety",
                                        "reward"}  # fmt: skip
    assert set(result["first_reports"]["filters"]) == {
        "no filter", "labeled=true", "min_labels=2", "scenario=refund"}  # fmt: skip
    print_table(result)
    out = capsys.readouterr().out
    assert "2,000 traces, 400 multi-labeled" in out
    assert "baseline, krippendorff.alpha point estimates only" in out
    assert "the first report of a filter through the query index" in out


def test_the_traces_as_records_give_the_report_of_the_input(tmp_path: Path) -> None:
    # Step 4 times the index's input: it must be the input step 2 times, as records.
    data = synthetic_input(traces=1500, multi=300, single=450)
    index = QueryIndex(tmp_path / "index", threads=1)
    try:
        cid = index.corpus_id(CorpusKey("acme", "bot", "traces"))
        index.ingest(cid, b"".join(records_of(data)), {"s": 1})
        through = agreement_report(agreement_input(index, cid, Filters()), resamples=50)
    finally:
        index.close()
    direct = agreement_report(data, resamples=50)
    assert through.dimensions == direct.dimensions
    assert through.evaluators == direct.evaluators
    assert (through.traces, through.labeled, through.multi_labeled) == (1500, 750, 300)
