"""The Export tab says what a download will hold (issue 56), in headless Chromium: the preference
preview pairs among the matching records (it asked for 5 rows and made them from 5 records:
always empty), the Training set box shows the rows of each split before any download and warns
of a split-by with few values, Enter in the Pin dialog pins, and a background export can be
started at any size."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.integration.web.conftest import Stack, axe_violations, sign_in
from tests.integration.webproc import WebProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def web(browser: Browser, stack: Stack) -> Iterator[WebProcess]:
    process = WebProcess(stack.settings, "web-export-tab").start()
    try:
        yield process
    finally:
        process.stop()


def test_a_preference_preview_of_one_pair_pairs_among_every_record(stack: Stack) -> None:
    with stack.web.client(stack.tokens["export"]) as api:
        answer = api.get("records", params={"source": "evaluator", "format": "preference",
                                            "limit": 1}).json()  # fmt: skip
    assert len(answer["items"]) == 1, answer  # one pair, made among all twelve trajectories
    assert answer["items"][0]["score_chosen"] > answer["items"][0]["score_rejected"]


def test_splits_are_counted_and_warned_about_before_a_download(stack: Stack) -> None:
    with stack.web.client(stack.tokens["export"]) as api:
        by_scenario = api.get("splits", params={"source": "traces", "splits": "train=0.9,eval=0.1",
                                                "split_by": "scenario"}).json()  # fmt: skip
        by_trace = api.get("splits", params={"source": "traces", "splits": "train=0.5,eval=0.5"})
        bad = api.get("splits", params={"source": "traces", "splits": "train=0.9"})
    assert sum(by_scenario["rows"].values()) == 12
    assert by_scenario["values"] == 2  # refund and trip
    assert any("2 distinct values for 2 splits" in w for w in by_scenario["warnings"])
    assert sum(by_trace.json()["rows"].values()) == 12
    assert bad.status_code == 422
    assert "splits" in bad.json()["detail"]


def test_the_export_tab_counts_splits_pins_with_enter_and_exports_in_the_background(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    sign_in(page, web, stack.tokens["admin"])
    page.locator("#tab-export").click()
    page.locator("#source [data-value=evaluator]").click()  # the human labels tie: no pair
    page.locator("#format [data-value=preference]").click()
    expect(page.locator("#preview pre").first).to_be_visible(timeout=30_000)  # pairs, not none
    expect(page.locator("#preview-note")).to_contain_text("pairs from")
    page.locator("#format [data-value=trajectory]").click()

    page.locator("#training-box summary").click()
    expect(page.locator("#training-hint")).not_to_contain_text("--split")  # words, not a flag
    page.locator("#training input[name=splits]").fill("train=0.9,eval=0.1")
    page.locator("#training input[name=split]").fill("train")
    page.locator("#training input[name=split_by]").fill("scenario")
    # GET splits reads the corpus: on a machine busy with the other tests, past the default 5 s.
    expect(page.locator("#training-counts")).to_contain_text("train:", timeout=30_000)
    expect(page.locator("#training-counts")).to_contain_text("2 distinct values")
    expect(page.locator("#training-warnings li").first).to_contain_text("distinct value")
    expect(page.locator("#preview-note")).to_contain_text("rows of split train")
    assert axe_violations(page) == []
    for field in ("splits", "split", "split_by"):
        page.locator(f"#training input[name={field}]").fill("")

    page.locator("#version-pin").click()
    page.locator("#pin-name").fill("issue-56-pin")
    page.keyboard.press("Enter")
    expect(page.locator("#pin-dialog")).to_be_hidden()
    expect(page.locator("#toast")).to_contain_text("Pinned evaluator as issue-56-pin")
    expect(page.locator("#version")).to_have_value("issue-56-pin")
    page.locator("#version").select_option("")

    page.locator("#download-job").click()  # twelve records: far below the sync limit
    expect(page.locator("#job")).to_have_attribute("data-states", "processing,ready",
                                                  timeout=60_000)  # fmt: skip
