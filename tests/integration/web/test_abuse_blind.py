"""Abuse: a labeler must not see how others rated a trace, nor a trace's secrets (DESIGN.md
section 10). With ``labels_per_trace=3``, two labelers label a trace; the third's queue and
claim items carry none of their names, ratings or comments, and the trace's secret is
redacted for that ``label``-only token. Nor anything that counts their work: the items of
two traces alike but for their ids, one with no label and one with two, are the same bytes
but for the trace's own id and handle."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.integration.web.conftest import Stack
from tests.integration.web.test_team import make_tokens, project_events
from tests.integration.webproc import wait_for
from tests.integration.workers import publish
from tests.records import conversation, trace_events

pytestmark = pytest.mark.integration

PROJECT = "abuse-blind"
SECRET = "AKIAIOSFODNN7EXAMPLE"
FIRST = {"correctness": 1, "helpfulness": 2, "efficiency": 1, "safety": 2}
SECOND = {"correctness": 2, "helpfulness": 1, "efficiency": 2, "safety": 1}
COMMENTS = {"blind-ana": "ana-says-zebra-wrong", "blind-bo": "bo-says-quokka-wrong"}


def planted() -> list[dict[str, Any]]:
    messages = conversation(0)
    messages[1] = {"role": "user", "content": f"Deploy with my key {SECRET} please."}
    return project_events(PROJECT, 1, messages=messages)


def leaks(text: str) -> list[str]:
    """What of the first two labelers, or of the secret, a response's text shows."""
    return [s for s in (*COMMENTS, *COMMENTS.values(), SECRET) if s in text]


def test_the_third_labeler_sees_neither_the_others_labels_nor_the_secret(stack: Stack) -> None:
    asyncio.run(publish(stack.settings, planted()))
    tokens = asyncio.run(make_tokens(stack, PROJECT, ["lead", "blind-ana", "blind-bo", "cy"]))

    def client(who: str) -> httpx.Client:
        return stack.web.client(tokens[who], project=PROJECT)

    trace_id = f"{PROJECT}-tr-000"
    with client("lead") as lead:
        assert lead.put("labeling", json={"labels_per_trace": 3}).status_code == 200
        assert lead.get("labeling").json()["blind"] is True
        wait_for("the trace in the index", lambda: lead.get(
            "stats", params={"source": "traces"}).json().get("records") == 1)  # fmt: skip
    for who, rubric in (("blind-ana", FIRST), ("blind-bo", SECOND)):
        with client(who) as labeler:
            body = {"trace_id": trace_id, "rubric": rubric, "comment": COMMENTS[who]}
            response = labeler.post("labels", json=body)
            assert response.status_code == 202, response.text

    def labeled_twice() -> dict[str, Any] | None:
        with client("lead") as lead:
            items = lead.get("records", params={"source": "traces"}).json()["items"]
        return next((r for r in items if r["labels_count"] == 2), None)

    shown = wait_for("both labels in the traces corpus", labeled_twice, 120)
    assert set(leaks(str(shown))) >= set(COMMENTS)  # the records hold them: the check can fail

    with client("cy") as cy:
        queue = cy.get("queue")
        assert queue.status_code == 200, queue.text
        claim = cy.post("queue/claim", json={"limit": 1})
        assert claim.status_code == 200, claim.text
    for answer in (queue, claim):
        (item,) = answer.json()["items"]
        assert item["trace_id"] == trace_id
        assert leaks(answer.text) == []
        for field in ("human_labels", "labelers", "labels_count", "rubric", "skipped_by",
                      "revision", "updated_at"):  # fmt: skip
            assert item[field] is None, field
        assert "[REDACTED:SECRETS]" in answer.text
        assert item["messages"]  # the rest is there, but the evaluators' verdict: not before
        assert item["evaluation"] is None  # a label of cy's (show_evaluations after_label)

    # An admin may show the labels; the secret stays redacted for a label-only token.
    with client("lead") as lead:
        answer = lead.put("labeling", json={"blind": False})
        assert answer.json()["blind"] is False
    with client("cy") as cy:
        seen = cy.post("queue/claim", json={"limit": 1})
    assert seen.status_code == 200, seen.text
    assert leaks(seen.text) == [*COMMENTS, *COMMENTS.values()]
    assert seen.json()["items"][0]["labelers"] == ["blind-ana", "blind-bo"]


def test_blind_is_a_boolean_setting(stack: Stack) -> None:
    tokens = asyncio.run(make_tokens(stack, PROJECT + "-2", ["lead"]))
    with stack.web.client(tokens["lead"], project=PROJECT + "-2") as lead:
        response = lead.put("labeling", json={"blind": "maybe"})
        assert response.status_code == 422, response.text
        assert response.json()["detail"].startswith("blind")
        assert lead.get("labeling").json()["blind"] is True


def twins(project: str) -> list[dict[str, Any]]:
    """Two traces of ``project`` alike but for their ids (``<project>-zero`` and
    ``<project>-two``); the second labeled by two labelers through Kafka."""
    rubric = {"correctness": 2, "helpfulness": 5, "efficiency": 1, "safety": 4}
    events = []
    for name, labels in (("zero", ()), ("two", (rubric, rubric))):
        for item in trace_events(0, score=0.4, passed=False, labels=labels):
            events.append({**item, "project": project, "trace_id": f"{project}-{name}",
                           "event_id": f"{project}-{name}-{item['event_id']}"})  # fmt: skip
    return events


def test_blind_items_of_a_trace_with_two_labels_and_one_with_none_are_the_same_bytes(
    stack: Stack,
) -> None:
    project = PROJECT + "-count"
    asyncio.run(publish(stack.settings, twins(project)))
    tokens = asyncio.run(make_tokens(stack, project, ["lead", "cy"]))
    zero, two = f"{project}-zero", f"{project}-two"
    with stack.web.client(tokens["lead"], project=project) as lead:
        assert lead.put("labeling", json={"labels_per_trace": 3}).status_code == 200

        def both_there() -> bool:
            items = lead.get("records", params={"source": "traces"}).json().get("items", [])
            return {r["trace_id"]: r["labels_count"] for r in items} == {zero: 0, two: 2}

        wait_for("both traces, one labeled twice, in the index", both_there, 120)
    with stack.web.client(tokens["cy"], project=project) as cy:
        queue = cy.get("queue")
        assert queue.status_code == 200, queue.text
        claim = cy.post("queue/claim", json={"limit": 2})
        assert claim.status_code == 200, claim.text
    for answer in (queue, claim):
        items = {item["trace_id"]: item for item in answer.json()["items"]}
        assert set(items) == {zero, two}
        # The trace's own content apart (its id, and the handle that digests it), the same
        # bytes: nothing in them counts, dates or orders the two labels.
        seen = [
            json.dumps({**items[t], "trace_id": "T", "handle": "H"}).replace(t, "T")
            for t in (zero, two)
        ]
        assert seen[0] == seen[1]
        assert items[zero]["handle"] != items[two]["handle"]
