"""Read-your-writes: the latest label action per labeler and trace, skips for good, a TTL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rl_export.model.events import LabelSubmitted, Rubric
from rl_export.web.labels import label_retracted, label_skipped, label_submitted
from rl_export.web.overlay import Overlay

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RUBRIC = Rubric(correctness=3, helpfulness=3, efficiency=3, safety=3).model_dump()


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def label(trace: str, labeler: str = "ana", minute: int = 0) -> LabelSubmitted:
    return label_submitted("acme", "bot", trace, labeler, rubric=RUBRIC, comment=None,
                           now=T0 + timedelta(minutes=minute))  # fmt: skip


def test_labels_and_skips_hide_retractions_bring_back() -> None:
    overlay = Overlay(ttl_s=60)
    overlay.note(label("t1"))
    overlay.note(label_skipped("acme", "bot", "t2", "ana", T0))
    overlay.note(label("t3"))
    overlay.note(label_retracted("acme", "bot", "t3", "ana", T0 + timedelta(minutes=1)))
    assert overlay.ask("acme", "bot", "ana") == (["t1", "t2"], ["t3"])
    assert overlay.ask("acme", "bot", "bo") == ([], [])
    assert overlay.ask("acme", "other", "ana") == ([], [])


def test_the_latest_action_wins_whatever_the_order_they_arrive_in() -> None:
    overlay = Overlay(ttl_s=60)
    overlay.note(label_retracted("acme", "bot", "t1", "ana", T0 + timedelta(minutes=2)))
    overlay.note(label("t1", minute=1))  # older: no change
    assert overlay.ask("acme", "bot", "ana") == ([], ["t1"])
    overlay.note(label("t1", minute=3))
    assert overlay.ask("acme", "bot", "ana") == (["t1"], [])


def test_a_retraction_does_not_undo_a_skip() -> None:
    overlay = Overlay(ttl_s=60)
    overlay.note(label_skipped("acme", "bot", "t1", "ana", T0))
    overlay.note(label_retracted("acme", "bot", "t1", "ana", T0 + timedelta(minutes=1)))
    assert overlay.ask("acme", "bot", "ana") == (["t1"], [])


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    overlay = Overlay(ttl_s=60, clock=clock)
    overlay.note(label("t1"))
    clock.now = 59
    assert overlay.ask("acme", "bot", "ana") == (["t1"], [])
    clock.now = 61
    assert overlay.ask("acme", "bot", "ana") == ([], [])
    overlay.note(label("t2"))
    clock.now = 200
    overlay.expire()
    assert overlay.ask("acme", "bot", "ana") == ([], [])


def test_an_adjudication_is_no_label_of_the_reviewer() -> None:
    overlay = Overlay(ttl_s=60)
    overlay.note(label_submitted("acme", "bot", "t1", "rev", rubric=RUBRIC, comment=None,
                                 now=T0, kind="adjudication"))  # fmt: skip
    assert overlay.fresh("acme", "bot") == {}
    assert overlay.ask("acme", "bot", "rev") == ([], [])
