"""The Label page as a team uses it, in headless Chromium, against two web instances of one
project (DESIGN.md sections 7 and 8): the page on one instance, its teammates through the API
of the other.

Each case of issue 46 is played and shows the fixed behaviour: an undo claims the trace again
before showing it (and says so when no place is left); a skip can be undone; a save after the
claim lapsed claims again, or asks before counting over the target (default: not saved); the
keyboard sequences people type rate what they meant; an admin who came for the settings holds
no trace until they start; leaving the Label tab or hiding the browser tab gives the claim back;
the header names the labeler; and axe-core finds no serious or critical violation on any tab.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.integration.web.conftest import (
    Stack,
    axe_violations,
    current_trace,
    press_action,
    sign_in,
)
from tests.integration.web.test_team import make_tokens, over_target, project_events
from tests.integration.webproc import WebProcess, wait_for
from tests.integration.workers import publish

pytestmark = pytest.mark.integration

T = TypeVar("T")
DIMENSIONS = ("correctness", "helpfulness", "efficiency", "safety")
# Through the worker, the sink and the index: minutes on a loaded machine, seconds otherwise.
CORPUS_S = 180.0
KEYS = {"↓": "ArrowDown", "↑": "ArrowUp", "→": "ArrowRight", "←": "ArrowLeft"}


def off_loop(work: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to its end on a thread of its own (Playwright's loop runs here)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


@pytest.fixture(scope="module")
def web(browser: Browser, stack: Stack) -> Iterator[WebProcess]:
    """The page's instance; the teammates use the stack's (after the browser: without one
    there is nothing to start)."""
    process = WebProcess(stack.settings, "web-label-page").start()
    try:
        yield process
    finally:
        process.stop()


def team(stack: Stack, web: WebProcess, project: str, traces: int, labelers: list[str],
         **settings: Any) -> dict[str, str]:  # fmt: skip
    """A project of its own: its traces, the lead's (admin) and labelers' tokens, its settings,
    and both instances indexing it."""
    off_loop(publish(stack.settings, project_events(project, traces)))
    tokens = off_loop(make_tokens(stack, project, ["lead", *labelers]))
    with web.client(tokens["lead"], project=project) as lead:
        assert lead.put("labeling", json=settings).status_code == 200
    for instance in (web, stack.web):
        with instance.client(tokens["lead"], project=project) as api:

            def ready(api: httpx.Client = api) -> bool:
                stats = api.get("stats", params={"source": "traces"}).json()
                known = api.get("labeling").json()
                return bool(stats.get("records") == traces and all(
                    known[k] == v for k, v in settings.items()))  # fmt: skip

            wait_for(f"{project} on every instance", ready, 120)
    return tokens


def teammate(stack: Stack, tokens: dict[str, str], who: str, project: str) -> httpx.Client:
    """A labeler on the other instance."""
    return stack.web.client(tokens[who], project=project)


def traces_of(web: WebProcess, lead: str, project: str) -> dict[str, dict[str, Any]]:
    with web.client(lead, project=project) as api:
        items = api.get("records", params={"source": "traces", "limit": 100}).json()["items"]
    return {r["trace_id"]: r for r in items}


def press(page: Page, keys: str) -> None:
    for key in keys.split():
        if key in ("Enter", "s", "u"):
            press_action(page, key)
        else:
            page.keyboard.press(KEYS.get(key, key))


def ratings(page: Page) -> list[int | None]:
    found: list[int | None] = []
    for row in page.locator("#dimensions .dimension").all():
        chosen = row.locator("button[aria-checked=true]")
        found.append(int(chosen.inner_text()) if chosen.count() else None)
    return found


def test_undo_claims_the_trace_again_before_showing_it(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    project = "lp-undo"
    tokens = team(stack, web, project, 1, ["bo", "cy"], labels_per_trace=1, lease_s=600)
    before = (over_target(web), over_target(stack.web))
    sign_in(page, web, tokens["bo"], project)
    expect(page.locator("#who-text")).to_have_text("Signed in as bo (label)")
    expect(page.locator("#messages li").first).to_be_visible()
    trace_id = current_trace(page)
    press(page, "4 4 3 2 Enter")
    expect(page.locator("#undo-text")).to_have_text(f"Saved {trace_id} (reward 0.65).")
    expect(page.locator("#undo-what")).to_have_text("Undo save")
    expect(page.locator("#label-empty")).to_be_visible()
    # U: the label is retracted, the trace claimed again (a fresh lease) and shown as it was.
    press_action(page, "u")
    expect(page.locator("#trace-meta .tag").first).to_have_text(trace_id)
    expect(page.locator("#claim-info")).to_contain_text("Claimed for you until")
    expect(page.locator("#reward-value")).to_have_text("0.65")
    expect(page.locator("#undo-line")).to_be_hidden()
    # The place is bo's again: cy finds nothing to claim, by queue or by name.
    with teammate(stack, tokens, "cy", project) as cy:
        assert cy.post("queue/claim", json={}).json()["items"] == []
        assert cy.put(f"queue/claims/{trace_id}").status_code == 409
    press_action(page, "Enter")
    expect(page.locator("#undo-line")).to_be_visible()  # (its text is still the first save's)
    expect(page.locator("#undo-text")).to_have_text(f"Saved {trace_id} (reward 0.65).")
    wait_for("bo's label, alone", lambda: traces_of(web, tokens["lead"], project)[trace_id]
             ["labelers"] == ["bo"], CORPUS_S)  # fmt: skip
    assert (over_target(web), over_target(stack.web)) == before
    # cy labels it anyway through the API (no claim: over the target, the API's exception);
    # bo's undo now finds no place left: the page says so and stays where it is.
    with teammate(stack, tokens, "cy", project) as cy:
        rubric = dict.fromkeys(DIMENSIONS, 3)
        assert cy.post("labels", json={"trace_id": trace_id, "rubric": rubric}).status_code == 202
    wait_for("cy's label on the page's instance", lambda: traces_of(web, tokens["lead"], project)
             [trace_id]["labelers"] == ["bo", "cy"], CORPUS_S)  # fmt: skip
    press_action(page, "u")
    expect(page.locator("#toast")).to_contain_text(
        f"Label of {trace_id} retracted, but every place of it is held by teammates now"
    )
    expect(page.locator("#label-empty")).to_be_visible()
    expect(page.locator("#claim-info")).to_be_hidden()


def test_skip_then_undo_brings_the_skipped_trace_back_claimed(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    project = "lp-skip"
    tokens = team(stack, web, project, 2, ["bo", "cy"], labels_per_trace=1, lease_s=600)
    sign_in(page, web, tokens["bo"], project)
    expect(page.locator("#messages li").first).to_be_visible()
    skipped = current_trace(page)
    press_action(page, "s")
    expect(page.locator("#trace-meta .tag").first).not_to_have_text(skipped)
    shown = current_trace(page)
    expect(page.locator("#undo-text")).to_have_text(f"Skipped {skipped}.")
    expect(page.locator("#undo-what")).to_have_text("Undo skip")
    press_action(page, "u")
    expect(page.locator("#trace-meta .tag").first).to_have_text(skipped)
    expect(page.locator("#claim-info")).to_contain_text("Claimed for you until")
    # The trace shown until then was given back (the page holds one trace at a time), and the
    # skipped one is bo's: cy gets the other.
    with teammate(stack, tokens, "cy", project) as cy:

        def claimed() -> list[str]:
            got = cy.post("queue/claim", json={"limit": 2}).json()
            return [i["trace_id"] for i in got["items"]]

        assert wait_for("cy to get the trace the page gave back", claimed, 10) == [shown]
    press(page, "5 5 4 4 Enter")
    expect(page.locator("#undo-text")).to_have_text(f"Saved {skipped} (reward 0.90).")
    wait_for("bo's label on the trace he skipped", lambda: traces_of(
        web, tokens["lead"], project)[skipped]["labelers"] == ["bo"], CORPUS_S)  # fmt: skip


def test_a_save_after_the_claim_lapsed_claims_again_or_asks_first(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    project = "lp-lapse"
    tokens = team(stack, web, project, 2, ["bo", "cy"], labels_per_trace=1, lease_s=30)
    before = over_target(web)
    page.clock.install()  # the page's clock runs on; the second case moves it forward
    sign_in(page, web, tokens["bo"], project)
    expect(page.locator("#messages li").first).to_be_visible()
    first = current_trace(page)
    press(page, "4 4 4 4")
    # The lease ends (30 s: the shortest there is) and cy takes the place on the other instance.
    expect(page.locator("#claim-info")).to_have_class(re.compile("expired"), timeout=45_000)
    expect(page.locator("#claim-info")).to_contain_text("saving claims it again first")
    with teammate(stack, tokens, "cy", project) as cy:
        wait_for("cy to claim the lapsed place",
                 lambda: cy.put(f"queue/claims/{first}").status_code == 200, 30)  # fmt: skip
    press_action(page, "Enter")
    dialog = page.locator("#over-dialog")
    expect(dialog).to_be_visible()
    expect(page.locator("#over-text")).to_contain_text(
        f"Your claim on {first} lapsed and its place is held by a teammate now"
    )
    expect(page.locator("#over-text")).to_contain_text("over the team's target (1 label per trace)")
    expect(page.locator("#over-cancel")).to_be_focused()  # the default: do not save
    page.keyboard.press("Enter")
    expect(dialog).to_be_hidden()
    expect(page.locator("#toast")).to_contain_text(f"Not saved: a teammate holds {first} now")
    expect(page.locator("#trace-meta .tag").first).not_to_have_text(first)
    second = current_trace(page)
    # The page's clock says this claim lapsed too, while the store still holds it for bo: Enter
    # claims it again (a renewal) and saves, within the target.
    page.clock.fast_forward(35_000)
    expect(page.locator("#claim-info")).to_have_class(re.compile("expired"))
    press(page, "3 3 3 3 Enter")
    expect(page.locator("#undo-text")).to_have_text(f"Saved {second} (reward 0.60).")
    with teammate(stack, tokens, "cy", project) as cy:
        rubric = dict.fromkeys(DIMENSIONS, 2)
        assert cy.post("labels", json={"trace_id": first, "rubric": rubric}).status_code == 202

    def settled() -> bool:
        found = traces_of(web, tokens["lead"], project)
        return found[first]["labelers"] == ["cy"] and found[second]["labelers"] == ["bo"]

    wait_for("cy's label alone on the first, bo's on the second", settled, CORPUS_S)
    assert over_target(web) == before


@pytest.fixture(scope="module")
def keys_tokens(stack: Stack, web: WebProcess) -> dict[str, str]:
    """One project for every sequence: nothing is saved, each page claims its trace anew."""
    return team(stack, web, "lp-keys", 1, ["bo"], labels_per_trace=1, lease_s=600)


@pytest.mark.parametrize(
    ("keys", "meant"),
    [
        ("1 5 5 3", [1, 5, 5, 3]),  # digits only
        ("1 ↓ 5 ↓ 5 ↓ 3", [1, 5, 5, 3]),  # a digit, then an arrow: the move is made once
        ("2 → 4 → 4 → 2", [2, 4, 4, 2]),
        ("↓ ↓ 4 ↑ ↑ 2", [None, 2, 4, None]),  # arrows, then digits
        ("1 ↓ ↓ 5", [1, None, 5, None]),  # a dimension passed over on purpose
        ("3 3 3 3 ↑ ↑ 5", [3, 5, 3, 3]),  # correcting an earlier dimension
        ("4 4 ↑ 2 ↓ ↓ 1", [4, 2, None, 1]),
    ],
)
def test_the_keys_people_type_rate_what_they_meant(
    web: WebProcess, page: Page, keys_tokens: dict[str, str], keys: str, meant: list[int | None]
) -> None:
    sign_in(page, web, keys_tokens["bo"], "lp-keys")
    expect(page.locator("#messages li").first).to_be_visible()
    press(page, keys)
    assert ratings(page) == meant


def test_the_issues_sequence_saves_the_ratings_meant_and_focus_is_no_rating(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    """``1 ↓ 5 ↓ 5 ↓ 3`` saved ``[1, null, 5, 3]`` before; and the keyboard's place on "1" of an
    unrated dimension is a dashed ring, not the fill of a chosen rating."""
    project = "lp-keys-save"
    tokens = team(stack, web, project, 1, ["bo"], labels_per_trace=1, lease_s=600)
    sign_in(page, web, tokens["bo"], project)
    expect(page.locator("#messages li").first).to_be_visible()
    trace_id = current_trace(page)
    page.keyboard.press("2")
    page.keyboard.press("ArrowUp")  # back on correctness, rated 2; helpfulness is unrated
    page.keyboard.press("ArrowDown")
    focused = page.evaluate("""() => {
        const el = document.activeElement, style = getComputedStyle(el);
        const chosen = getComputedStyle(document.querySelector(
            '#dimensions button[aria-checked=true]'));
        return {dim: el.dataset.dim, value: el.dataset.value, outline: style.outlineStyle,
                background: style.backgroundColor, chosen: chosen.backgroundColor};
    }""")
    assert (focused["dim"], focused["value"]) == ("helpfulness", "1")
    assert focused["outline"] == "dashed"
    assert focused["background"] != focused["chosen"]
    page.keyboard.press("ArrowUp")
    press(page, "1 ↓ 5 ↓ 5 ↓ 3 Enter")
    expect(page.locator("#undo-text")).to_have_text(f"Saved {trace_id} (reward 0.70).")

    def saved() -> dict[str, Any] | None:
        record = traces_of(web, tokens["lead"], project)[trace_id]
        return record if record["labelers"] == ["bo"] else None

    record = wait_for("bo's label", saved, CORPUS_S)
    assert record["rubric"] == dict(zip(DIMENSIONS, [1.0, 5.0, 5.0, 3.0], strict=True))


def test_an_admin_visiting_the_settings_holds_no_trace_and_other_tabs_hold_none(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    project = "lp-admin"
    tokens = team(stack, web, project, 1, ["bo", "cy"], labels_per_trace=1, lease_s=600)
    sign_in(page, web, tokens["lead"], project)
    expect(page.locator("#who-text")).to_have_text("Signed in as lead (admin)")
    expect(page.locator("#label-start")).to_be_visible()
    expect(page.locator("#team-count")).to_have_text("Team: 1 trace short of 1 label each")
    expect(page.locator("#claim-info")).to_be_hidden()
    with teammate(stack, tokens, "bo", project) as bo:
        got = bo.post("queue/claim", json={}).json()
        assert len(got["items"]) == 1  # the admin's visit held nothing
        trace_id = got["items"][0]["trace_id"]
    # A new target: the team's count follows at once.
    page.locator("#queue-options summary").click()
    page.locator("#labeling-form input[name=labels_per_trace]").fill("2")
    page.locator("#labeling-save").click()
    expect(page.locator("#toast")).to_have_text("Team settings saved.")
    expect(page.locator("#team-count")).to_have_text("Team: 1 trace short of 2 labels each")
    with teammate(stack, tokens, "bo", project) as bo:
        wait_for("the new target on the other instance",
                 lambda: bo.get("labeling").json()["labels_per_trace"] == 2)  # fmt: skip
    # The admin starts labeling: the second place is theirs.
    page.locator("#label-start-button").click()
    expect(page.locator("#trace-meta .tag").first).to_have_text(trace_id)
    expect(page.locator("#claim-info")).to_contain_text("Claimed for you until")
    with teammate(stack, tokens, "cy", project) as cy:
        assert cy.post("queue/claim", json={}).json()["items"] == []
    # The Export tab holds no trace: the claim is given back at once, and cy gets the place.
    page.locator("#tab-export").click()
    with teammate(stack, tokens, "cy", project) as cy:
        wait_for("cy to get the place the admin left",
                 lambda: cy.post("queue/claim", json={}).json()["items"], 10)  # fmt: skip
    # Back on the Label tab the page claims its trace again; taken, it says so and moves on.
    page.locator("#tab-label").click()
    expect(page.locator("#toast")).to_contain_text(
        f"A teammate took {trace_id} while you were away"
    )
    expect(page.locator("#label-empty")).to_be_visible()


def seen(page: Page, state: str) -> None:
    """Make the page hidden or visible, as Chromium does when another browser tab is chosen."""
    page.evaluate(
        """(state) => {
            Object.defineProperty(document, "visibilityState", {configurable: true,
                                                                 get: () => state});
            document.dispatchEvent(new Event("visibilitychange"));
        }""",
        state,
    )


def test_a_hidden_tab_gives_its_claim_back_after_a_while(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    project = "lp-hidden"
    tokens = team(stack, web, project, 1, ["bo", "cy"], labels_per_trace=1, lease_s=600)
    page.clock.install()
    sign_in(page, web, tokens["bo"], project)
    expect(page.locator("#messages li").first).to_be_visible()
    trace_id = current_trace(page)
    seen(page, "hidden")
    with teammate(stack, tokens, "cy", project) as cy:
        page.clock.fast_forward(30_000)  # a short look elsewhere keeps the claim
        assert cy.post("queue/claim", json={}).json()["items"] == []
        page.clock.fast_forward(31_000)  # a minute away gives it back
        wait_for("cy to get the trace of the hidden tab",
                 lambda: cy.post("queue/claim", json={}).json()["items"], 10)  # fmt: skip
    seen(page, "visible")
    expect(page.locator("#toast")).to_contain_text(
        f"A teammate took {trace_id} while you were away"
    )
    expect(page.locator("#label-empty")).to_be_visible()


def test_axe_finds_no_serious_or_critical_violation_on_any_tab(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    project = "lp-axe"
    tokens = team(stack, web, project, 3, ["bo"], labels_per_trace=2, lease_s=600)
    with teammate(stack, tokens, "bo", project) as bo:
        first = bo.get("queue").json()["items"][0]["trace_id"]
        rubric = dict.fromkeys(DIMENSIONS, 4)
        assert bo.post("labels", json={"trace_id": first, "rubric": rubric}).status_code == 202
    page.goto(f"{web.base}/acme/{project}/rl-export")
    expect(page.locator("#token-input")).to_be_focused()
    assert axe_violations(page) == []
    page.keyboard.type(tokens["lead"])
    page.keyboard.press("Enter")
    expect(page.locator("#label-start")).to_be_visible()
    assert axe_violations(page) == []
    page.locator("#label-start-button").click()
    expect(page.locator("#messages li").first).to_be_visible()
    press(page, "4 5")
    assert axe_violations(page) == []
    page.locator("#tab-export").click()
    expect(page.locator("#preview-note")).to_contain_text("records")
    assert axe_violations(page) == []
    page.locator("#tab-agreement").click()
    expect(page.locator("#agreement-dimensions tbody tr")).to_have_count(5)
    assert axe_violations(page) == []


def test_a_token_of_another_project_is_asked_for_again_with_the_reason(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    sign_in(page, web, stack.tokens["other"])  # acme/other's, on acme/bot's page
    expect(page.locator("#token-error")).to_contain_text("this token is for acme/other")
    expect(page.locator("#token-input")).to_be_focused()
    expect(page.locator("#panel-label")).to_be_hidden()
