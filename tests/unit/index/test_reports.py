"""Agreement reports kept warm (index/reports.py): kept while the corpus does not change,
answered while a new one is computed when it did (within the age), one computation at a time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rl_export.index.reports import Reports

KEY = (1, "{}")


class Corpus:
    """A corpus whose change count the test moves, and a report computation it counts
    (each waits until the test lets it finish)."""

    def __init__(self) -> None:
        self.changes = 0
        self.computed = 0
        self.release = asyncio.Event()

    async def compute(self) -> dict[str, Any]:
        self.computed += 1
        number = self.computed
        await self.release.wait()
        return {"report": number}


async def test_a_report_is_kept_until_its_corpus_changes() -> None:
    corpus, clock = Corpus(), [0.0]
    reports = Reports(8, max_age_s=0.0, clock=lambda: clock[0])
    corpus.release.set()
    first = await reports.get(KEY, lambda: corpus.changes, corpus.compute)
    again = await reports.get(KEY, lambda: corpus.changes, corpus.compute)
    assert (first.kept.report, again.kept.report, corpus.computed) == ({"report": 1},) * 2 + (1,)
    assert not again.updating
    corpus.changes += 1  # no age allowed: the request waits for the new report
    assert (await reports.get(KEY, lambda: corpus.changes, corpus.compute)).kept.report == {
        "report": 2
    }


async def changed_since(seconds: float) -> tuple[Corpus, Reports]:
    """A report computed, then, ``seconds`` later, a change of its corpus (the next
    computation waits until the test releases it)."""
    corpus, clock = Corpus(), [100.0]
    reports = Reports(8, max_age_s=30.0, clock=lambda: clock[0])
    corpus.release.set()
    await reports.get(KEY, lambda: corpus.changes, corpus.compute)
    corpus.release.clear()
    corpus.changes += 1
    clock[0] += seconds
    return corpus, reports


async def test_a_changed_corpus_answers_the_kept_report_while_one_new_one_is_computed() -> None:
    corpus, reports = await changed_since(10.0)
    answers = [await reports.get(KEY, lambda: corpus.changes, corpus.compute) for _ in range(5)]
    assert [(a.kept.report, a.updating) for a in answers] == [({"report": 1}, True)] * 5
    await asyncio.sleep(0)
    assert corpus.computed == 2  # one background computation for the five requests
    corpus.release.set()
    await asyncio.sleep(0.01)
    fresh = await reports.get(KEY, lambda: corpus.changes, corpus.compute)
    assert (fresh.kept.report, fresh.updating, corpus.computed) == ({"report": 2}, False, 2)


async def test_a_report_older_than_the_age_is_not_answered_and_waiters_share_one() -> None:
    corpus, reports = await changed_since(31.0)
    waiting = [
        asyncio.create_task(reports.get(KEY, lambda: corpus.changes, corpus.compute))
        for _ in range(3)
    ]
    await asyncio.sleep(0.01)
    assert not any(t.done() for t in waiting)
    corpus.release.set()
    found = await asyncio.gather(*waiting)
    assert [a.kept.report for a in found] == [{"report": 2}] * 3
    assert corpus.computed == 2


async def test_a_failed_computation_is_computed_again_by_the_next_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = []

    async def failing() -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the index went away")
        return {"report": len(calls)}

    reports = Reports(8, max_age_s=30.0)
    with pytest.raises(RuntimeError):
        await reports.get(KEY, lambda: 0, failing)
    assert (await reports.get(KEY, lambda: 0, failing)).kept.report == {"report": 2}
    assert "agreement report failed: RuntimeError" in caplog.text


async def test_closing_cancels_what_is_under_way() -> None:
    corpus = Corpus()
    reports = Reports(8, max_age_s=30.0)
    waiting = asyncio.create_task(reports.get(KEY, lambda: corpus.changes, corpus.compute))
    await asyncio.sleep(0.01)
    await reports.close()
    with pytest.raises(asyncio.CancelledError):
        await waiting
