"""Rubrics, the labeler's workspace and review through the HTTP API, on the real stack
(docs/guides/rubrics.md; DESIGN.md sections 2, 4, 7 and 11): versions made by PUT rubric,
labels checked against theirs (422) and kept with theirs after a change, records and rewards as
the rule says (checked against a computation written out here), a label published past the API
that does not fit dead-lettered with invalid_rubric, My labels, the evaluators shown only after
a label, and the review queue, its scope and a decision that becomes the human reward."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import httpx
import pytest

from rl_export.corpora.store import open_store
from rl_export.web.tokens import Scope, TokenStore
from tests.factories import event
from tests.integration.web.conftest import Stack
from tests.integration.web.test_team import project_events
from tests.integration.webproc import wait_for
from tests.integration.workers import TopicReader, publish

pytestmark = pytest.mark.integration

PROJECT = "rb-api"
CORPUS_S = 180.0
RUBRIC: dict[str, Any] = {
    "guidelines": "# How to rate\n\n<script>window.pwned = 1</script> [docs](javascript:alert(1))"
    " and [the wiki](https://wiki.example/rate).",
    "questions": [
        {"name": "quality", "title": "Quality", "kind": "rating", "min": 1, "max": 4, "weight": 2,
         "levels": {"1": {"title": "Broken", "description": "wrong answer"},
                    "4": {"title": "Great", "description": "right and complete"}}},
        {"name": "tone", "title": "Tone", "kind": "choice", "options": [
            {"value": "rude", "title": "Rude", "reward": 0},
            {"value": "neutral", "title": "Neutral", "reward": 0.5},
            {"value": "warm", "title": "Warm", "reward": 1}]},
        {"name": "solved", "title": "Solved?", "kind": "boolean", "weight": 0.5, "required": False},
        {"name": "notes", "title": "Notes", "kind": "text"},
    ],
}  # fmt: skip


def reward(answers: dict[str, Any]) -> Fraction:
    """The rule of docs/guides/rubrics.md, written out for RUBRIC."""
    tones = {"rude": Fraction(0), "neutral": Fraction(1, 2), "warm": Fraction(1)}
    top = 2 * Fraction(answers["quality"]) + tones[answers["tone"]]
    bottom = Fraction(2 * 4 + 1)
    if "solved" in answers:
        top += Fraction(1, 2) * int(answers["solved"])
        bottom += Fraction(1, 2)
    return top / bottom


async def tokens_for(stack: Stack, people: dict[str, tuple[Scope, ...]]) -> dict[str, str]:
    store = open_store(stack.settings.store_url)
    made = TokenStore(store)
    out = {}
    try:
        for subject, scopes in people.items():
            _, out[subject] = await made.create("acme", PROJECT, subject, scopes, datetime.now(UTC))
    finally:
        await store.close()
    return out


@pytest.fixture(scope="module")
def tokens(stack: Stack) -> dict[str, str]:
    asyncio.run(publish(stack.settings, project_events(PROJECT, 4)))
    made = asyncio.run(tokens_for(stack, {
        "lead": ("admin",), "ana": ("label",), "bo": ("label",), "rev": ("review",),
        "boss": ("admin",),
    }))  # fmt: skip
    with stack.web.client(made["lead"], project=PROJECT) as lead:
        wait_for("the project's traces", lambda: lead.get(
            "stats", params={"source": "traces"}).json().get("records") == 4, 120)  # fmt: skip
    return made


def client(stack: Stack, tokens: dict[str, str], who: str) -> httpx.Client:
    return stack.web.client(tokens[who], project=PROJECT)


def record_of(api: httpx.Client, trace_id: str, source: str = "traces") -> dict[str, Any]:
    items = api.get("records", params={"source": source, "format": "trajectory",
                                       "limit": 100}).json()["items"]  # fmt: skip
    return next(r for r in items if r["trace_id"] == trace_id)


def test_rubric_versions_labels_and_records(stack: Stack, tokens: dict[str, str]) -> None:
    trace = f"{PROJECT}-tr-000"
    with client(stack, tokens, "lead") as lead, client(stack, tokens, "ana") as ana, \
            client(stack, tokens, "bo") as bo:  # fmt: skip
        assert lead.get("rubric").json()["version"] == 0
        made = lead.put("rubric", json=RUBRIC)
        assert made.status_code == 200, made.text
        assert (made.json()["version"], made.json()["created"]) == (1, True)
        html = made.json()["guidelines_html"]
        assert "<script" not in html
        assert 'href="javascript' not in html  # left as text
        assert '<a href="https://wiki.example/rate"' in html
        again = lead.put("rubric", json=RUBRIC).json()
        assert (again["version"], again["created"]) == (1, False)
        assert ana.put("rubric", json=RUBRIC).status_code == 403  # admin only
        bad = lead.put("rubric", json={**RUBRIC, "questions": RUBRIC["questions"][3:]})
        assert bad.status_code == 422
        assert "at least one question" in bad.json()["detail"]
        assert ana.get("rubric").json()["questions"][1]["options"][2]["value"] == "warm"

        first = {"quality": 3, "tone": "warm", "solved": False, "notes": "slow but right"}
        for body, needle in (
            ({"quality": 5, "tone": "warm", "solved": True}, "rubric.quality: 5 is outside"),
            ({"quality": 2, "tone": "hot", "solved": True}, "rubric.tone"),
            ({"tone": "warm"}, "rubric.quality: required"),
            ({"quality": 2, "tone": "warm", "solved": 1}, "rubric.solved: true or false"),
        ):
            answer = ana.post("labels", json={"trace_id": trace, "rubric_version": 1,
                                              "rubric": body})  # fmt: skip
            assert answer.status_code == 422, answer.text
            assert needle in answer.json()["detail"]
        unknown = ana.post("labels", json={"trace_id": trace, "rubric_version": 7, "rubric": first})
        assert unknown.status_code == 422
        assert "no rubric version 7" in unknown.json()["detail"]
        assert ana.post("labels", json={"trace_id": trace, "rubric_version": 1, "rubric": first,
                                        "comment": "needle-42"}).status_code == 202  # fmt: skip

        # The rubric changes; bo's page still has version 1: the label keeps it.
        second = {**RUBRIC, "questions": [{**RUBRIC["questions"][0], "max": 10}]}
        assert lead.put("rubric", json=second).json()["version"] == 2
        late = {"quality": 1, "tone": "neutral"}
        assert bo.post("labels", json={"trace_id": trace, "rubric_version": 1,
                                       "rubric": late}).status_code == 202  # fmt: skip

        def labeled() -> bool:
            return record_of(lead, trace)["labels_count"] == 2

        wait_for("both labels in the corpus", labeled, CORPUS_S)
        record = record_of(lead, trace, "human")
        entries = {e["labeler"]: e for e in record["human_labels"]}
        assert {k: e["rubric_version"] for k, e in entries.items()} == {"ana": 1, "bo": 1}
        assert entries["ana"]["answers"] == first
        assert entries["ana"]["comment"] == "needle-42"
        assert entries["ana"]["reward"] == float(reward(first))
        assert entries["bo"]["reward"] == float(reward(late))
        assert record["reward"] == float((reward(first) + reward(late)) / 2)
        assert record["rubric"]["quality"] == 2.0
        assert record["rubric"]["notes"] is None

        # My labels: newest first, searched by the comment, paged by cursor.
        def mine() -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = ana.get("mylabels").json()["items"]
            return items

        wait_for("ana's label in My labels", lambda: len(mine()) == 1, CORPUS_S)
        (item,) = mine()
        assert (item["trace_id"], item["rubric_version"], item["kind"]) == (trace, 1, "label")
        assert ana.get("mylabels", params={"q": "NEEDLE"}).json()["items"][0]["trace_id"] == trace
        assert ana.get("mylabels", params={"q": "nothing-like-it"}).json()["items"] == []
        assert ana.get("mylabels", params={"cursor": "%%%"}).status_code == 422


def test_a_label_past_the_api_that_does_not_fit_is_dead_lettered(
    stack: Stack, tokens: dict[str, str]
) -> None:
    trace = f"{PROJECT}-tr-003"
    with client(stack, tokens, "lead") as lead:
        if lead.get("rubric").json()["latest"] == 0:
            lead.put("rubric", json=RUBRIC)
    base = {"trace_id": trace, "org": "acme", "project": PROJECT, "labeler": "zed"}
    bad = event("label.submitted", f"{PROJECT}-bad-1", "2026-01-01T00:30:00Z", **base,
                rubric_version=1, rubric={"quality": 9, "tone": "warm"})  # fmt: skip
    missing = event("label.submitted", f"{PROJECT}-bad-2", "2026-01-01T00:30:01Z", **base,
                    rubric_version=99, rubric={"quality": 1})  # fmt: skip
    asyncio.run(publish(stack.settings, [bad, missing]))
    reader = TopicReader(stack.settings, stack.settings.topic_dead_letter)

    def ours(records: list[Any]) -> list[tuple[bytes, str]]:
        found = []
        for r in records:
            headers = dict(r.headers)
            if PROJECT.encode() + b"-bad-" in (r.value or b""):
                found.append((headers["rl-export-reason"], headers["rl-export-detail"].decode()))
        return found

    records = asyncio.run(reader.read_until(lambda rs: len(ours(rs)) == 2, timeout_s=120))
    found = sorted(ours(records))
    assert [reason for reason, _ in found] == [b"invalid_rubric", b"invalid_rubric"]
    details = " | ".join(detail for _, detail in found)
    assert "rubric.quality: 9 is outside 1..4" in details
    assert f"rubric version 99 of acme/{PROJECT} does not exist" in details


def test_evaluations_show_once_the_labeler_labeled(stack: Stack, tokens: dict[str, str]) -> None:
    trace = f"{PROJECT}-tr-001"
    with client(stack, tokens, "bo") as bo:
        before = bo.get(f"traces/{trace}").json()
        assert before["evaluations_shown"] is False
        assert before["labeled"] is False
        assert before["item"]["evaluation"] is None
        assert before["item"]["evaluator_scores"] is None
        claimed = bo.post("queue/claim", json={"limit": 10}).json()
        assert claimed["items"]
        assert all(i["evaluation"] is None for i in claimed["items"])
        answers = dict.fromkeys(("correctness", "helpfulness", "efficiency", "safety"), 3)
        assert bo.post("labels", json={"trace_id": trace, "rubric": answers}).status_code == 202
        after = bo.get(f"traces/{trace}").json()  # the instance knows at once (its overlay)
        assert after["evaluations_shown"] is True
        assert after["labeled"] is True
        assert after["item"]["evaluation"]["results"][0]["evaluator"] == "judge"
        assert bo.get("traces/no-such-trace").status_code == 404


def test_review_queue_scope_and_a_decision(stack: Stack, tokens: dict[str, str]) -> None:
    trace = f"{PROJECT}-tr-002"
    low = dict.fromkeys(("correctness", "helpfulness", "efficiency", "safety"), 1)
    high = dict.fromkeys(("correctness", "helpfulness", "efficiency", "safety"), 5)
    with client(stack, tokens, "lead") as lead, client(stack, tokens, "ana") as ana, \
            client(stack, tokens, "bo") as bo, client(stack, tokens, "rev") as rev, \
            client(stack, tokens, "boss") as boss:  # fmt: skip
        assert ana.post("labels", json={"trace_id": trace, "rubric": low}).status_code == 202
        assert bo.post("labels", json={"trace_id": trace, "rubric": high}).status_code == 202
        assert boss.get("review/queue").status_code == 403  # admin does not imply review
        assert ana.post("labels", json={"trace_id": trace, "rubric": high,
                                        "kind": "adjudication"}).status_code == 403  # fmt: skip

        def disputed() -> bool:
            items = rev.get("review/queue", params={"min_spread": 0.5}).json()["items"]
            return any(i["trace_id"] == trace for i in items)

        wait_for("the disputed trace in the review queue", disputed, CORPUS_S)
        claim = rev.post("review/claim", json={"limit": 1, "min_spread": 0.5}).json()
        assert [c["trace_id"] for c in claim["claims"]] == [trace]
        (item,) = claim["items"]
        assert {e["labeler"] for e in item["human_labels"]} == {"ana", "bo"}  # not blind
        decision = dict.fromkeys(("correctness", "helpfulness", "efficiency", "safety"), 4)
        assert rev.post("labels", json={"trace_id": trace, "rubric": decision,
                                        "kind": "adjudication", "comment": "bo is closer"}
                        ).status_code == 202  # fmt: skip
        assert not disputed()  # decided: gone from the queue at once

        def decided() -> bool:
            return record_of(lead, trace, "human")["reward"] == 0.8

        wait_for("the decision as the human reward", decided, CORPUS_S)
        record = record_of(lead, trace, "human")
        assert record["labelers"] == ["ana", "bo"]
        assert record["labels_count"] == 2
        kinds = [(e["labeler"], e.get("kind", "label")) for e in record["human_labels"]]
        assert kinds == [("ana", "label"), ("bo", "label"), ("rev", "adjudication")]
