"""Rubrics on the page (issue 56), in headless Chromium against two web instances of one project:
the page on one, teammates through the API of the other.

An admin defines a rubric with one question of each kind in the Rubric tab (guidelines and a
title that are hostile markup among them: nothing runs); a labeler labels with it keyboard-only,
sees the guidelines beside the item and each level's meaning on focus, and sees the evaluators'
verdict only once they saved; reopens a label from My labels and changes it; a reviewer decides
a disputed trace in the Review tab. Then the records, the CSV export's columns and the agreement
report are checked against the answers given (the alphas against the ``krippendorff`` package),
and axe-core finds no serious or critical violation on any of the new views.
"""

from __future__ import annotations

import asyncio
import csv
import io
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import httpx
import krippendorff
import numpy as np
import pytest
from playwright.sync_api import Browser, Page, expect

from rl_export.corpora.store import open_store
from rl_export.web.tokens import Scope, TokenStore
from tests.integration.web.conftest import (
    Stack,
    axe_violations,
    current_trace,
    press_action,
    sign_in,
)
from tests.integration.web.test_team import project_events
from tests.integration.webproc import WebProcess, wait_for
from tests.integration.workers import publish

pytestmark = pytest.mark.integration

PROJECT = "rubric-page"
TRACES = 4
CORPUS_S = 180.0
HOSTILE_TITLE = "Tone <img src=x onerror=window.pwned=1>"
GUIDELINES = (
    "# Rate the *answer*\n\nA **4** is right and complete. <script>window.pwned = 1</script>\n\n"
    "[click me](javascript:window.pwned=1) or read [the handbook](https://handbook.example/rate)."
)
# What the labelers answer (pat on the page, bo and cy through the API), trace by trace.
TONES = {"rude": Fraction(0), "neutral": Fraction(1, 2), "warm": Fraction(1)}
GIVEN: dict[str, dict[str, Any]] = {}  # pat's answers by trace, as the tests go on


def reward(answers: dict[str, Any]) -> Fraction:
    """The rubric's rule written out: quality 1..4 weight 2, tone by its reward, solved 0/1."""
    top = 2 * Fraction(answers["quality"]) + TONES[answers["tone"]] + int(answers["solved"])
    return top / Fraction(2 * 4 + 1 + 1)


def off_loop(work: Any) -> Any:
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


async def make_tokens(stack: Stack, people: dict[str, tuple[Scope, ...]]) -> dict[str, str]:
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
def web(browser: Browser, stack: Stack) -> Iterator[WebProcess]:
    process = WebProcess(stack.settings, "web-rubric-page").start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def tokens(stack: Stack, web: WebProcess) -> dict[str, str]:
    off_loop(publish(stack.settings, project_events(PROJECT, TRACES)))
    made: dict[str, str] = off_loop(make_tokens(stack, {
        "lead": ("admin",), "pat": ("label", "export"), "bo": ("label",), "cy": ("label",),
        "rev": ("review", "export"),
    }))  # fmt: skip
    for instance in (web, stack.web):
        with instance.client(made["lead"], project=PROJECT) as api:
            assert api.put("labeling", json={"labels_per_trace": 3}).status_code == 200

            def ready(api: httpx.Client = api) -> bool:
                stats = api.get("stats", params={"source": "traces"}).json()
                return bool(stats.get("records") == TRACES
                            and api.get("labeling").json()["labels_per_trace"] == 3)  # fmt: skip

            wait_for(f"{PROJECT} on every instance", ready, 120)
    return made


def no_script_ran(page: Page) -> None:
    assert page.evaluate("() => window.pwned") is None


def record(api: httpx.Client, trace_id: str, source: str = "traces") -> dict[str, Any]:
    items = api.get("records", params={"source": source, "limit": 100}).json()["items"]
    return next((r for r in items if r["trace_id"] == trace_id), {})


def test_an_admin_defines_a_rubric_of_every_kind(
    stack: Stack, web: WebProcess, page: Page, tokens: dict[str, str]
) -> None:
    alerts: list[str] = []
    page.on("dialog", lambda dialog: (alerts.append(dialog.message), dialog.dismiss()))
    sign_in(page, web, tokens["lead"], PROJECT)
    expect(page.locator("#who-text")).to_contain_text("lead")  # signed in: the page started
    page.locator("#tab-rubric").click()
    expect(page.locator("#rubric-version")).to_contain_text("version 0")
    page.locator("#rubric-guidelines").fill(GUIDELINES)
    # The default's four ratings become one question of each kind.
    questions = page.locator("#rubric-questions > li")
    expect(questions).to_have_count(4)
    first = questions.nth(0)
    first.get_by_label("question 1 name").fill("quality")
    first.get_by_label("question 1 title").fill("Quality")
    first.get_by_label("question 1 highest value").fill("4")
    first.get_by_label("question 1 highest value").dispatch_event("change")
    first.get_by_label("question 1 weight").fill("2")
    page.get_by_label("question 1 level 1 title").fill("Broken")
    page.get_by_label("question 1 level 1 description").fill("Wrong or harmful")
    page.get_by_label("question 1 level 4 title").fill("Great")
    page.get_by_label("question 1 level 4 description").fill("Right and complete")
    page.get_by_label("question 2 kind").select_option("choice")
    page.get_by_label("question 2 name").fill("tone")
    page.get_by_label("question 2 title").fill(HOSTILE_TITLE)
    for k, (value, title, score) in enumerate(
        (("rude", "Rude", "0"), ("neutral", "Neutral", "0.5"))
    ):
        page.get_by_label(f"question 2 option {k + 1} value").fill(value)
        page.get_by_label(f"question 2 option {k + 1} title").fill(title)
        page.get_by_label(f"question 2 option {k + 1} reward").fill(score)
    page.locator("#rubric-questions > li").nth(1).get_by_role(
        "button", name="Add an option"
    ).click()
    page.get_by_label("question 2 option 3 value").fill("warm")
    page.get_by_label("question 2 option 3 title").fill("Warm")
    page.get_by_label("question 2 option 3 reward").fill("1")
    page.get_by_label("question 3 kind").select_option("boolean")
    page.get_by_label("question 3 name").fill("solved")
    page.get_by_label("question 3 title").fill("Solved?")
    page.get_by_label("question 4 kind").select_option("text")
    page.get_by_label("question 4 name").fill("notes")
    page.get_by_label("question 4 title").fill("Notes")
    page.locator("#rubric-preview-button").click()
    preview = page.locator("#rubric-preview-guidelines")
    expect(preview.locator("a")).to_have_attribute("href", "https://handbook.example/rate")
    expect(preview).to_contain_text("[click me](javascript:")  # left as text
    expect(page.locator("#rubric-preview-questions .dimension")).to_have_count(4)
    expect(page.locator("#rubric-error")).to_be_hidden()
    assert axe_violations(page) == []
    page.locator("#rubric-save").click()
    expect(page.locator("#rubric-version")).to_contain_text("version 1")
    no_script_ran(page)
    assert alerts == []
    with web.client(tokens["lead"], project=PROJECT) as api:
        rubric = api.get("rubric").json()
    assert rubric["version"] == 1
    assert [(q["name"], q["kind"]) for q in rubric["questions"]] == [
        ("quality", "rating"),
        ("tone", "choice"),
        ("solved", "boolean"),
        ("notes", "text"),
    ]
    assert rubric["questions"][0]["levels"]["4"] == {
        "title": "Great",
        "description": "Right and complete",
    }
    assert rubric["questions"][1]["title"] == HOSTILE_TITLE
    assert [o["reward"] for o in rubric["questions"][1]["options"]] == [0, 0.5, 1]


def test_label_with_the_rubric_by_keyboard_and_see_the_evaluators_after_saving(
    stack: Stack, web: WebProcess, page: Page, tokens: dict[str, str]
) -> None:
    given = GIVEN
    sign_in(page, web, tokens["pat"], PROJECT)
    expect(page.locator("#messages li").first).to_be_visible()
    expect(page.locator("#guidelines h1")).to_have_text("Rate the answer")
    expect(page.locator("#guidelines a")).to_have_count(1)
    expect(page.locator("#dimensions .dimension")).to_have_count(4)
    expect(page.locator("#dimensions .dim-name").nth(1)).to_contain_text(HOSTILE_TITLE)  # as text
    # The first rating has the focus: its level's meaning shows (and on hover, its title).
    expect(page.locator("#dimensions .dimension").first.locator(".level-note")).to_have_text(
        "Broken: Wrong or harmful"
    )
    expect(page.locator("#evaluator")).to_contain_text("Hidden until you save")
    assert axe_violations(page) == []
    plans = [("3", "3", "y", "slow but right"), ("4", "2", "n", ""), ("1", "1", "y", "rude")]
    for quality, tone, solved, notes in plans:
        trace_id = current_trace(page)
        expect(page.locator("#evaluator")).to_contain_text("Hidden until you save")
        page.keyboard.press(quality)
        page.keyboard.press(tone)
        page.keyboard.press(solved)
        expect(page.locator("#dimensions textarea")).to_be_focused()  # the text question
        page.keyboard.type(notes)
        page.keyboard.press("Escape")
        press_action(page, "Enter")
        expect(page.locator("#undo-line")).to_contain_text(f"Saved {trace_id}")
        answers: dict[str, Any] = {"quality": int(quality),
                                   "tone": ["rude", "neutral", "warm"][int(tone) - 1],
                                   "solved": solved == "y"}  # fmt: skip
        if notes:
            answers["notes"] = notes
        given[trace_id] = answers
        # The verdict of the trace just saved shows; the next trace's stays hidden.
        expect(page.locator("#last-evaluator")).to_contain_text(trace_id)
        expect(page.locator("#last-evaluator")).to_contain_text("judge")
        expect(page.locator("#trace-meta .tag").first).not_to_have_text(trace_id)  # the next
        expect(page.locator("#label-work")).not_to_have_attribute("aria-busy", "true")
    no_script_ran(page)
    with web.client(tokens["lead"], project=PROJECT) as api:

        def recorded() -> bool:
            return all(record(api, t).get("labels_count") == 1 for t in given)

        wait_for("pat's labels in the corpus", recorded, CORPUS_S)
        for trace_id, answers in given.items():
            (entry,) = record(api, trace_id)["human_labels"]
            assert (entry["labeler"], entry["rubric_version"], entry["answers"]) == (
                "pat",
                1,
                answers,
            )
            assert entry["reward"] == float(reward(answers))


def given_by_pat() -> dict[str, dict[str, Any]]:
    if not GIVEN:
        pytest.skip("needs the labeling test's labels")
    return GIVEN


def test_reopen_a_label_from_my_labels_and_change_it(
    stack: Stack, web: WebProcess, page: Page, tokens: dict[str, str]
) -> None:
    given = given_by_pat()
    trace_id = sorted(given)[0]
    sign_in(page, web, tokens["pat"], PROJECT)
    expect(page.locator("#messages li").first).to_be_visible()
    page.locator("#tab-mylabels").click()
    rows = page.locator("#mylabels-table tbody tr")
    expect(rows).to_have_count(len(given), timeout=60_000)
    assert axe_violations(page) == []
    page.locator("#mylabels-q").fill(trace_id)
    page.keyboard.press("Enter")
    expect(rows).to_have_count(1)
    rows.first.get_by_role("button", name=f"Open {trace_id}").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#tab-label")).to_have_attribute("aria-selected", "true")
    expect(page.locator("#trace-meta .tag").first).to_have_text(trace_id)
    expect(page.locator("#rate-mode")).to_contain_text("Your label")
    old = given[trace_id]
    checked = page.locator("#dimensions .dimension").first.locator("button[aria-checked=true]")
    expect(checked).to_have_text(str(old["quality"]))
    expect(page.locator("#evaluator")).to_contain_text("judge")  # labeled: shown
    changed = 4 if old["quality"] != 4 else 2
    page.keyboard.press(str(changed))
    press_action(page, "Enter")
    expect(page.locator("#undo-line")).to_contain_text(f"Saved {trace_id}")
    with web.client(tokens["lead"], project=PROJECT) as api:

        def replaced() -> bool:
            labels = record(api, trace_id).get("human_labels") or []
            return [e["answers"]["quality"] for e in labels] == [changed]

        wait_for("the changed label in the corpus", replaced, CORPUS_S)
    given[trace_id] = {**old, "quality": changed}


def teammates_label(stack: Stack, tokens: dict[str, str], given: dict[str, dict[str, Any]]
                    ) -> dict[str, dict[str, dict[str, Any]]]:  # fmt: skip
    """bo and cy label pat's traces through the other instance; one of them far from pat."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for n, (trace_id, answers) in enumerate(sorted(given.items())):
        theirs = {
            "bo": {"quality": max(1, answers["quality"] - 1), "tone": answers["tone"],
                   "solved": answers["solved"]},
            "cy": {"quality": 4 if n == 0 else answers["quality"], "tone": "warm",
                   "solved": not answers["solved"] if n == 0 else answers["solved"]},
        }  # fmt: skip
        for who, answer in theirs.items():
            with stack.web.client(tokens[who], project=PROJECT) as api:
                sent = api.post("labels", json={"trace_id": trace_id, "rubric_version": 1,
                                                "rubric": answer})  # fmt: skip
                assert sent.status_code == 202, sent.text
        out[trace_id] = {"pat": answers, **theirs}
    return out


def test_review_a_disputed_trace_and_the_reports_agree_with_the_answers(
    stack: Stack, web: WebProcess, page: Page, tokens: dict[str, str]
) -> None:
    given = given_by_pat()
    labels = teammates_label(stack, tokens, given)
    with web.client(tokens["lead"], project=PROJECT) as api:

        def all_in() -> bool:
            return all(record(api, t).get("labels_count") == 3 for t in labels)

        wait_for("three labels on each trace", all_in, CORPUS_S)
    sign_in(page, web, tokens["rev"], PROJECT)
    expect(page.locator("#tab-review")).to_be_visible()
    page.locator("#tab-review").click()
    page.locator("#review-start-button").click()
    expect(page.locator("#review-meta .tag").first).to_be_visible(timeout=60_000)
    disputed = page.locator("#review-meta .tag").first.inner_text()
    expect(page.locator("#review-labels tbody tr")).to_have_count(3)
    for who in ("pat", "bo", "cy"):
        expect(page.locator("#review-labels tbody")).to_contain_text(who)
    assert axe_violations(page) == []
    page.keyboard.press("3")
    page.keyboard.press("2")
    page.keyboard.press("y")
    page.keyboard.type("bo is closest")
    page.keyboard.press("Escape")
    page.keyboard.press("Enter")
    expect(page.locator("#toast")).to_contain_text(f"Decision on {disputed} saved")
    no_script_ran(page)
    decision = {"quality": 3, "tone": "neutral", "solved": True, "notes": "bo is closest"}
    with web.client(tokens["lead"], project=PROJECT) as api:

        def decided() -> bool:
            return record(api, disputed, "human").get("reward") == float(reward(decision))

        wait_for("the decision as the human reward", decided, CORPUS_S)
        human = record(api, disputed, "human")
        assert human["labels_count"] == 3
        adjudication = [e for e in human["human_labels"] if e.get("kind") == "adjudication"]
        assert [(e["labeler"], e["answers"]) for e in adjudication] == [("rev", decision)]
        # Every other trace: the exact mean of its labels' rewards.
        for trace_id, answers in labels.items():
            if trace_id == disputed:
                continue
            mean = sum((reward(a) for a in answers.values()), Fraction(0)) / 3
            assert record(api, trace_id, "human")["reward"] == float(mean)

        # The CSV export: a column per question, each cell the labels' answers.
        text = api.get("export", params={"source": "traces", "format": "csv"}).text
        rows = {r["trace_id"]: r for r in csv.DictReader(io.StringIO(text))}
        for name in ("answers.quality", "answers.tone", "answers.solved", "answers.notes"):
            assert name in rows[disputed]
        for trace_id, answers in labels.items():
            by_labeler = sorted(answers.items())
            cell = rows[trace_id]["answers.quality"]
            assert cell == str([a["quality"] for _, a in by_labeler]).replace(" ", "")

        # The agreement report, per question, against the krippendorff package.
        report = api.get("agreement").json()
        assert report["adjudicated"] == 1
        by = report["by_question"]
        assert by["rubric_version"] == 1
        order = ["pat", "bo", "cy"]
        traces = sorted(labels)
        for name, level, code in (
            ("quality", "ordinal", lambda a: a["quality"]),
            ("tone", "nominal", lambda a: ["rude", "neutral", "warm"].index(a["tone"])),
            ("solved", "nominal", lambda a: int(a["solved"])),
        ):
            table = np.array([[code(labels[t][who]) for t in traces] for who in order], float)
            found = by["questions"][name]
            assert found["level"] == level
            assert found["units"] == len(traces)
            values = table[~np.isnan(table)]
            if len(np.unique(values)) < 2:
                assert found["alpha"] is None
            else:
                expected = krippendorff.alpha(table, level_of_measurement=level)
                assert math.isclose(found["alpha"], expected, abs_tol=1e-9), (name, found)
        assert by["questions"]["notes"]["level"] is None

    # The Agreement tab shows the same, question by question, and says the decision is apart.
    page.locator("#tab-agreement").click()
    expect(page.locator("#agreement-questions-title")).to_contain_text("rubric version 1")
    expect(page.locator("#agreement-questions tbody tr")).to_have_count(5)  # four and reward
    expect(page.locator("#agreement-adjudicated")).to_contain_text("1 trace decided")
    assert axe_violations(page) == []


def test_the_keys_overlay_lists_every_key(
    stack: Stack, web: WebProcess, page: Page, tokens: dict[str, str]
) -> None:
    sign_in(page, web, tokens["pat"], PROJECT)
    expect(page.locator("#who-text")).to_contain_text("pat")
    page.locator("#tab-label").focus()
    page.keyboard.press("?")
    dialog = page.locator("#keys-dialog")
    expect(dialog).to_be_visible()
    for key in ("Enter", "Esc"):
        expect(dialog).to_contain_text(key)
    expect(page.locator("#keys-close")).to_be_focused()
    assert axe_violations(page) == []
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
