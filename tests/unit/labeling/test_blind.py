"""Blind, redacted queue items: no other labeler's names, ratings, comments or human reward."""

from __future__ import annotations

from typing import Any

import orjson

from rl_export.labeling.blind import HUMAN_FIELDS, blind, queue_item
from rl_export.privacy.redact import redactor
from tests.records import record as make_record

SECRET = "AKIAIOSFODNN7EXAMPLE"


def labeled(**extra: Any) -> dict[str, Any]:
    record = make_record("tr-1", source=None, reward=None, passed=None)
    record.update(
        rubric={"correctness": 2.0, "helpfulness": 3.0, "efficiency": 4.0, "safety": 5.0},
        labels_count=2, labelers=["ana-7", "bo-7"], skipped_by=["cy-7"],
        labels=[
            {"labeler": "ana-7", "rubric": {"correctness": 1, "helpfulness": 2, "efficiency": 3,
                                          "safety": 4}, "comment": "ana thinks it is wrong",
             "occurred_at": "2026-12-01T00:00:00Z"},
            {"labeler": "bo-7", "rubric": {"correctness": 3, "helpfulness": 4, "efficiency": 5,
                                         "safety": 5}, "comment": None,
             "occurred_at": "2026-12-01T00:01:00Z"},
        ],
        **extra,
    )  # fmt: skip
    return record


def test_blind_nulls_every_field_that_carries_another_labeler() -> None:
    record = labeled(human_labels=[{"labeler": "ana-7"}])
    out = blind(record)
    for name in HUMAN_FIELDS:
        assert out[name] is None, name
    text = orjson.dumps(out).decode()
    for leak in ("ana-7", "bo-7", "cy-7", "thinks it is wrong"):
        assert leak not in text
    assert out["messages"] == record["messages"]
    assert out["evaluation"] == record["evaluation"]
    assert record["labelers"] == ["ana-7", "bo-7"]  # the input is left as it was


def test_blind_hides_a_human_reward_and_keeps_an_evaluator_one() -> None:
    human = blind(labeled(reward_source="human", reward=0.7, passed=True))
    assert (human["reward"], human["passed"]) == (None, None)
    judged = blind(labeled(reward_source="evaluator", reward=0.7, passed=True))
    assert (judged["reward"], judged["passed"]) == (0.7, True)


def test_blind_adds_no_field_a_record_lacks() -> None:
    record = {"trace_id": "t", "messages": []}
    assert blind(record) == record


def test_a_queue_item_is_blind_and_redacted() -> None:
    record = labeled()
    record["messages"] = [{"role": "user", "content": f"my key is {SECRET}"}]
    line = orjson.dumps(record)
    item, counts = queue_item(line, blinded=True, scrub=redactor(("secrets",)))
    out = orjson.loads(item)
    assert SECRET not in item.decode()
    assert "[REDACTED:SECRETS]" in out["messages"][0]["content"]
    assert counts == {"secrets": 1}
    assert out["labelers"] is None
    assert out["labels"] is None


def test_an_item_that_is_not_blind_keeps_the_labels_and_is_still_redacted() -> None:
    record = labeled()
    record["labels"][0]["comment"] = f"key {SECRET}"
    item, counts = queue_item(orjson.dumps(record), blinded=False, scrub=redactor(("secrets",)))
    out = orjson.loads(item)
    assert out["labelers"] == ["ana-7", "bo-7"]
    assert SECRET not in out["labels"][0]["comment"]
    assert counts == {"secrets": 1}


def test_a_project_that_redacts_nothing_only_blinds() -> None:
    record = labeled()
    record["messages"] = [{"role": "user", "content": SECRET}]
    item, counts = queue_item(orjson.dumps(record), blinded=True, scrub=None)
    assert SECRET in item.decode()
    assert counts == {}
    assert orjson.loads(item)["rubric"] is None
