"""The Compare tab in headless Chromium against two web instances (DESIGN.md section 12): two
labelers compare keyboard-only, each on an instance of their own, until every pair has its
target; no pair gets more; the page shows nobody else's choice; a transcript's markup is text;
U undoes a choice; and axe-core finds no serious or critical violation on the Compare tab nor on
the Agreement tab's ratings."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from rl_export.model.pairs import pair_id
from tests.integration.web.conftest import SCRIPT, Stack, axe_violations
from tests.integration.web.test_label_page import off_loop
from tests.integration.web.test_team import make_tokens, project_events
from tests.integration.webproc import WebProcess, wait_for
from tests.integration.workers import publish
from tests.records import PROMPT, SYSTEM

pytestmark = pytest.mark.integration

TRACES = 6  # one prompt, v1 and v2 alternating: 9 pairs
PROJECT = "cmp-page"


@pytest.fixture(scope="module")
def second(browser: Browser, stack: Stack) -> Iterator[WebProcess]:
    web = WebProcess(stack.settings, "web-cmp-page").start()
    try:
        yield web
    finally:
        web.stop()


def seed(stack: Stack, webs: list[WebProcess]) -> dict[str, str]:
    events = project_events(PROJECT, TRACES)
    for event in events:
        if event["event_type"] == "trace.completed":
            number = int(event["trace_id"].rsplit("-", 1)[1])
            event["agent_version"] = f"v{1 + number % 2}"
            if number == 3:  # markup in an answer: the page shows it as text
                event["messages"] = [SYSTEM, PROMPT, {"role": "assistant", "content": SCRIPT}]
    off_loop(publish(stack.settings, events))  # Playwright's loop runs on this thread
    tokens = off_loop(make_tokens(stack, PROJECT, ["lead", "pana", "pbo"]))
    for web in webs:
        with web.client(tokens["lead"], project=PROJECT) as api:

            def indexed(api: object = api) -> bool:
                stats = api.get("stats", params={"source": "traces"}).json()  # type: ignore[attr-defined]
                return bool(stats.get("records") == TRACES)

            wait_for(f"the traces of {PROJECT}", indexed, 180)
    return tokens


def open_compare(page: Page, web: WebProcess, token: str) -> None:
    """Sign in by keyboard on the Compare tab."""
    page.goto(f"{web.base}/acme/{PROJECT}/rl-export#compare")
    expect(page.locator("#token-input")).to_be_focused()
    page.keyboard.type(token)
    page.keyboard.press("Enter")


def shown_pair(page: Page) -> str | None:
    """The pair the page shows (None: its queue is empty)."""
    work, empty = page.locator("#compare-work"), page.locator("#compare-empty")
    expect(
        page.locator("#compare-work:not([hidden]), #compare-empty:not([hidden])")
    ).to_be_visible()
    expect(work).not_to_have_attribute("aria-busy", "true")
    if empty.is_visible():
        return None
    a = page.locator("#compare-a-meta .tag").inner_text()
    b = page.locator("#compare-b-meta .tag").inner_text()
    return pair_id(*sorted((a, b)))


def test_two_labelers_compare_keyboard_only_on_two_instances(
    stack: Stack, second: WebProcess, browser: Browser
) -> None:
    webs = [stack.web, second]
    tokens = seed(stack, webs)
    pages = []
    for web, who in zip(webs, ("pana", "pbo"), strict=True):
        context = browser.new_context(viewport={"width": 1360, "height": 860})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error, errors=errors: errors.append(str(error)))
        open_compare(page, web, tokens[who])
        pages.append((who, page, errors))
    try:
        done: Counter[str] = Counter()
        keys = "ABTX"
        # U: the first choice of pana is undone, and the same pair comes back, claimed.
        who, page, _ = pages[0]
        first = shown_pair(page)
        assert first is not None
        page.keyboard.press("2")
        page.keyboard.press("A")
        expect(page.locator("#compare-undo-line")).to_be_visible()
        shown_pair(page)
        page.keyboard.press("U")
        # The undo's request is under way when the key's handler returns: the pair shown
        # just after may still be the next one.
        wait_for("the undone pair back", lambda: shown_pair(page) == first, timeout_s=30)
        # Markup in a transcript is text, never run.
        text = " ".join(p.locator("#panel-compare").inner_text() for _, p, _ in pages)
        assert all(p.evaluate("() => window.pwned === undefined") for _, p, _ in pages)
        assert axe_violations(page) == []
        open_pages = list(pages)
        turn = 0
        while open_pages:
            for entry in list(open_pages):
                who, page, _ = entry
                pair = shown_pair(page)
                if pair is None:
                    open_pages.remove(entry)
                    continue
                # Blind: nothing on the tab names the other labeler.
                other = "pbo" if who == "pana" else "pana"
                panel = page.locator("#panel-compare").inner_text()
                assert other not in panel
                text += panel
                page.keyboard.press(keys[turn % len(keys)])
                turn += 1
                done[pair] += 1
                expect(page.locator("#compare-undo-text")).to_contain_text(pair)
        assert SCRIPT in text  # the markup, shown as text
        pairs = (TRACES // 2) ** 2
        assert len(done) == pairs
        assert set(done.values()) == {1}  # every pair to its target (1), none over it
        for web in webs:
            with web.client(tokens["lead"], project=PROJECT) as api:
                queue = api.get("compare/queue").json()
                assert queue["team_remaining"] == 0
        # The Agreement tab's ratings (the lead's: scope export), axe-clean.
        lead = browser.new_context(viewport={"width": 1360, "height": 860}).new_page()
        pages.append(("lead", lead, []))
        lead.goto(f"{second.base}/acme/{PROJECT}/rl-export#agreement")
        expect(lead.locator("#token-input")).to_be_focused()
        lead.keyboard.type(tokens["lead"])
        lead.keyboard.press("Enter")
        expect(lead.locator("#ratings-table tbody tr").first).to_be_visible()
        expect(lead.locator("#ratings-error")).to_be_hidden()
        assert axe_violations(lead) == []
    finally:
        for _, page, errors in pages:
            page.context.close()
            assert errors == []


def test_the_agreement_tab_draws_each_versions_interval_as_text_and_to_scale(
    stack: Stack, second: WebProcess, browser: Browser
) -> None:
    """The ratings the API gives (here a fixed answer: votes cannot reach this branch's
    corpora) are drawn: a bar per version, its interval to scale, every name as text."""
    tokens = off_loop(make_tokens(stack, PROJECT, ["lead"]))
    answer = {
        "ratings": [
            {"agent_version": SCRIPT, "rating": 1100.0, "ci95": [1050.0, 1150.0],
             "comparisons": 40},
            {"agent_version": "v1", "rating": 900.0, "ci95": [850.0, 950.0], "comparisons": 40},
            {"agent_version": "v0", "rating": None, "ci95": None, "comparisons": 3},
        ],
        "agreement": {"pairs": 12, "percent": 0.75, "alpha": 0.5},
    }  # fmt: skip
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.route("**/comparisons/ratings*", lambda route: route.fulfill(
            status=200, content_type="application/json", body=json.dumps(answer)))  # fmt: skip
        page.goto(f"{second.base}/acme/{PROJECT}/rl-export#agreement")
        expect(page.locator("#token-input")).to_be_focused()
        page.keyboard.type(tokens["lead"])
        page.keyboard.press("Enter")
        bars = page.locator("#ratings-bars li")
        expect(bars).to_have_count(3)
        expect(bars.nth(0)).to_contain_text(SCRIPT)  # the name, as text
        assert page.evaluate("() => window.pwned === undefined")
        expect(bars.nth(0).locator(".rating-track")).to_have_attribute(
            "aria-label", "rating 1100, 95 % interval 1050 to 1150"
        )
        expect(bars.nth(2)).to_contain_text("no finite rating yet")
        # To scale: the first interval lies right of the second, as wide.
        first = bars.nth(0).locator(".rating-ci").bounding_box()
        other = bars.nth(1).locator(".rating-ci").bounding_box()
        assert first is not None
        assert other is not None
        assert first["x"] > other["x"] + other["width"]
        assert abs(first["width"] - other["width"]) < 2
        expect(page.locator("#ratings-agreement")).to_contain_text("75 %")
        expect(page.locator("#ratings-table tbody tr")).to_have_count(3)
        assert axe_violations(page) == []
    finally:
        context.close()
    assert errors == []


def test_a_hidden_tab_gives_its_pair_back_after_a_while(
    stack: Stack, second: WebProcess, browser: Browser
) -> None:
    from tests.integration.web.test_label_page import seen

    project = "cmp-hidden"
    events = project_events(project, 2)
    for event in events:
        if event["event_type"] == "trace.completed":
            event["agent_version"] = f"v{event['trace_id'][-1]}"
    off_loop(publish(stack.settings, events))
    tokens = off_loop(make_tokens(stack, project, ["lead", "hbo", "hcy"]))
    for web in (stack.web, second):
        with web.client(tokens["lead"], project=project) as api:

            def indexed(api: Any = api) -> bool:
                return bool(api.get("stats", params={"source": "traces"}).json()
                            .get("records") == 2)  # fmt: skip

            wait_for(f"the traces of {project}", indexed, 180)
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    page = context.new_page()
    try:
        page.clock.install()
        page.goto(f"{second.base}/acme/{project}/rl-export#compare")
        expect(page.locator("#token-input")).to_be_focused()
        page.keyboard.type(tokens["hbo"])
        page.keyboard.press("Enter")
        expect(page.locator("#compare-work")).to_be_visible()
        seen(page, "hidden")
        with stack.web.client(tokens["hcy"], project=project) as cy:
            page.clock.fast_forward(30_000)  # a short look elsewhere keeps the claim
            assert cy.post("compare/claim", json={}).json()["items"] == []
            page.clock.fast_forward(31_000)  # a minute away gives it back
            wait_for("cy to get the pair of the hidden tab",
                     lambda: cy.post("compare/claim", json={}).json()["items"], 10)  # fmt: skip
        seen(page, "visible")
        expect(page.locator("#toast")).to_contain_text("A teammate took the pair")
        expect(page.locator("#compare-empty")).to_be_visible()
    finally:
        context.close()
