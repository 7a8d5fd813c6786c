"""The RL Export page end to end, in headless Chromium (Debian's, driven by Playwright),
against the running services: broker, store, worker and web service.

A keyboard-only label reaches the corpus, the Export tab's counts and its preview; the open
Export tab follows labels given elsewhere; skip and undo persist; the source and format
toggles change the preview; downloads parse (JSON Lines, and CSV with chosen, renamed and
reordered columns); a large export runs as a job behind the floating indicator; a transcript
holding markup shows it as text. The team's flow: the Label tab claims one trace at a time and
shows the claim, the team's progress and the labeler's own count; an admin changes the team's
settings there; the Agreement tab shows the report. The Content-Security-Policy refuses a
script planted in the page. Each tab is photographed: into a temporary folder, or into
docs/screenshots/ for the README and the docs site with ``make screenshots``
(``RL_EXPORT_SCREENSHOTS`` names the folder), so a test run leaves the checkout as it was.
"""

from __future__ import annotations

import asyncio
import csv
import io
import os
import tempfile
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import open_store
from rl_export.model.codec import iter_lines, loads
from tests.integration.web.conftest import SCRIPT, Stack, current_trace, press_action, sign_in
from tests.integration.webproc import WebProcess, wait_for
from tests.integration.workers import publish

T = TypeVar("T")
SCREENSHOTS = Path(
    os.environ.get("RL_EXPORT_SCREENSHOTS") or Path(tempfile.gettempdir()) / "rl-export-screenshots"
)


def latest(stack: Stack, corpus: str) -> dict[str, dict[str, Any]]:
    async def read() -> dict[str, dict[str, Any]]:
        store = open_store(stack.settings.store_url)
        try:
            reader = CorpusReader(store, CorpusRef("acme", "bot", corpus))
            return {r["trace_id"]: r async for r in reader.records(latest_only=True)}
        finally:
            await store.close()

    # Playwright's sync API keeps an event loop running on this thread: read on another.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, read()).result()


@pytest.fixture(scope="module")
def web(browser: Browser, stack: Stack) -> Iterator[WebProcess]:
    """An instance of its own: exports of more than 5 records run as background jobs (after
    the browser: without one there is nothing to start)."""
    process = WebProcess(stack.settings, "web-page", RL_EXPORT_WEB_SYNC_EXPORT_MAX_RECORDS="5")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def clear_queue_head(web: WebProcess, token: str, keep: Any) -> None:
    """Skip (through the API) the traces at the head of this labeler's queue until the first
    one ``keep(record)`` accepts."""
    with web.client(token) as client:
        for record in client.get("queue", params={"limit": 100}).json()["items"]:
            if keep(record):
                return
            assert client.post("skips", json={"trace_id": record["trace_id"]}).status_code == 202
    raise AssertionError("no trace in the queue fits")


def unlabeled(web: WebProcess, token: str) -> set[str]:
    """The traces nobody has labeled, from the export preview: queue items are blind."""
    with web.client(token) as client:
        items = client.get("records", params={"source": "traces", "limit": 100}).json()["items"]
    return {r["trace_id"] for r in items if r["labels_count"] == 0}


def stat(page: Page, name: str) -> int:
    return int(page.locator(f"#stat-{name}").inner_text().replace(",", ""))


def arrow_to(page: Page, tab: str, key: str = "ArrowRight") -> None:
    """From the focused tab, the arrow key over the tab list until ``tab`` is selected (the
    list: Label, Compare, My labels, Review when the token may review, Rubric, Export,
    Agreement)."""
    for _ in range(7):
        if page.locator(f"#tab-{tab}").get_attribute("aria-selected") == "true":
            return
        page.keyboard.press(key)
    expect(page.locator(f"#tab-{tab}")).to_have_attribute("aria-selected", "true")


def test_label_a_trajectory_by_keyboard_alone(stack: Stack, web: WebProcess, page: Page) -> None:
    token = stack.tokens["page"]
    fresh = unlabeled(web, token)
    clear_queue_head(web, token, lambda r: r["trace_id"] in fresh)
    sign_in(page, web, token)
    # The Export tab first, to see its numbers change: Tab to the tab list, arrow over.
    expect(page.locator("#messages li").first).to_be_visible()
    page.locator("#tab-label").focus()
    arrow_to(page, "export")
    expect(page.locator("#preview-note")).to_contain_text("records")
    labeled_before = stat(page, "labeled")
    records_before = stat(page, "records")
    arrow_to(page, "label", "ArrowLeft")

    trace_id = current_trace(page)
    left_before = page.locator("#queue-count").inner_text()
    for key in ("4", "4", "3", "5"):  # the shortcuts work from the tab list too
        page.keyboard.press(key)
    expect(page.locator("#reward-value")).to_have_text("0.80")
    expect(page.locator("#reward-verdict")).to_contain_text("Pass")
    page.keyboard.press("ArrowUp")
    page.keyboard.press("5")  # the focused dimension (efficiency) again: 4+4+5+5
    expect(page.locator("#reward-value")).to_have_text("0.90")
    press_action(page, "Enter")
    expect(page.locator("#undo-line")).to_contain_text(f"Saved {trace_id}")
    expect(page.locator("#trace-meta .tag").first).not_to_have_text(trace_id)
    assert page.locator("#queue-count").inner_text() != left_before

    record = wait_for("the label in the human corpus",
                      lambda: latest(stack, "human").get(trace_id))  # fmt: skip
    assert record["labelers"] == ["pat"]
    assert record["rubric"] == {"correctness": 4.0, "helpfulness": 4.0, "efficiency": 5.0,
                                "safety": 5.0}  # fmt: skip
    assert record["reward"] == 0.9

    # The web's index follows the corpora (every RL_EXPORT_WEB_INDEX_POLL_S) and the open tab
    # follows the index (every 5 s): the tab may open before the index has the label.
    page.locator("#tab-label").focus()
    arrow_to(page, "export")
    expect(page.locator("#stat-labeled")).to_have_text(str(labeled_before + 1), timeout=30_000)
    expect(page.locator("#stat-records")).to_have_text(str(records_before + 1))
    expect(page.locator("#preview-note")).to_contain_text(f"of {records_before + 1} records")
    # Only what changed in the last minutes: the new label is in the preview.
    page.locator("#filters-box summary").click()
    page.locator("#filters input[name=scenario]").fill(record["scenario"])
    since = datetime.now(UTC) - timedelta(minutes=5)
    page.locator("#filters input[name=since]").fill(since.strftime("%Y-%m-%dT%H:%M"))
    expect(page.locator("#preview")).to_contain_text(trace_id)
    expect(page.locator("#preview")).to_contain_text('"pat"')


def test_the_export_tab_follows_the_corpora_while_it_is_open(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    """A label given elsewhere (here through the API) reaches the open tab's numbers and its
    preview with no click: the tab asks for them again every few seconds."""
    token = stack.tokens["follow"]
    export_tab(page, web, token)
    expect(page.locator("#stats-asof")).to_contain_text("As of")
    labeled_before = stat(page, "labeled")
    records_before = stat(page, "records")
    fresh = unlabeled(web, token)
    with web.client(token) as client:
        queue = client.get("queue", params={"limit": 100}).json()["items"]
        trace_id = next(r["trace_id"] for r in queue if r["trace_id"] in fresh)
        response = client.post("labels", json={"trace_id": trace_id, "rubric": {
            "correctness": 5, "helpfulness": 5, "efficiency": 4, "safety": 5}})  # fmt: skip
        assert response.status_code == 202, response.text

    expect(page.locator("#stat-labeled")).to_have_text(str(labeled_before + 1), timeout=60_000)
    expect(page.locator("#stat-records")).to_have_text(str(records_before + 1))
    expect(page.locator("#preview-note")).to_contain_text(f"of {records_before + 1} records")
    assert page.locator("#tab-export").get_attribute("aria-selected") == "true"


def test_skip_and_undo_persist(stack: Stack, web: WebProcess, page: Page) -> None:
    token = stack.tokens["undo-page"]
    sign_in(page, web, token)
    expect(page.locator("#messages li").first).to_be_visible()
    skipped = current_trace(page)
    press_action(page, "s")
    expect(page.locator("#trace-meta .tag").first).not_to_have_text(skipped)
    wait_for("the skip in the traces corpus",
             lambda: "uma" in latest(stack, "traces")[skipped]["skipped_by"])  # fmt: skip

    rated = current_trace(page)
    for key in ("2", "3", "2", "4"):
        page.keyboard.press(key)
    press_action(page, "Enter")
    expect(page.locator("#trace-meta .tag").first).not_to_have_text(rated)
    wait_for("the label in the traces corpus",
             lambda: "uma" in latest(stack, "traces")[rated]["labelers"])  # fmt: skip
    press_action(page, "u")
    expect(page.locator("#trace-meta .tag").first).to_have_text(rated)
    expect(page.locator("#reward-value")).to_have_text("0.55")  # the ratings come back
    wait_for("the retraction in the traces corpus",
             lambda: "uma" not in latest(stack, "traces")[rated]["labelers"])  # fmt: skip
    with web.client(token) as client:
        queue = [r["trace_id"] for r in client.get("queue", params={"limit": 100}).json()["items"]]
    assert rated in queue
    assert skipped not in queue


def export_tab(page: Page, web: WebProcess, token: str) -> None:
    sign_in(page, web, token)
    page.locator("#tab-export").click()
    expect(page.locator("#preview-note")).to_contain_text("records")


def choose(page: Page, group: str, name: str) -> None:
    page.locator(f"#{group} button", has_text=name).first.click()


def two_trip_records(page: Page, web: WebProcess, token: str, format_name: str) -> None:
    """The Export tab on the evaluator corpus's two ``trip`` records (a direct download)."""
    export_tab(page, web, token)
    choose(page, "source", "Evaluator score")
    choose(page, "format", format_name)
    page.locator("#filters-box summary").click()
    page.locator("#filters input[name=scenario]").fill("trip")
    expect(page.locator("#stat-records")).to_have_text("2")


def test_source_and_format_toggles_change_the_preview(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    export_tab(page, web, stack.tokens["page"])
    choose(page, "source", "Human labels")
    expect(page.locator("#preview pre").first).to_contain_text('"reward_source": "human"')
    human = page.locator("#preview").inner_text()
    human_records = stat(page, "records")
    choose(page, "source", "Evaluator score")
    # The instance's first look at the evaluator corpus waits for the index's first pass.
    expect(page.locator("#preview pre").first).to_contain_text(
        '"reward_source": "evaluator"', timeout=30_000
    )
    assert page.locator("#preview").inner_text() != human
    assert stat(page, "records") != human_records
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "export.png"))
    choose(page, "format", "Prompt/completion")
    expect(page.locator("#preview pre").first).to_contain_text('"prompt": [')
    expect(page.locator("#preview pre").first).not_to_contain_text('"rubric"')
    choose(page, "format", "KTO")
    expect(page.locator("#preview pre").first).to_contain_text('"label": ')


def test_download_gives_valid_json_lines(stack: Stack, web: WebProcess, page: Page) -> None:
    two_trip_records(page, web, stack.tokens["page"], "Messages")
    with page.expect_download() as download:
        page.locator("#download").click()
    assert download.value.suggested_filename == "acme-bot-evaluator-messages.jsonl"
    data = Path(download.value.path()).read_bytes()
    rows = list(iter_lines(data))
    assert len(rows) == 2
    assert all(set(r) == {"messages"} for r in rows)
    expect(page.locator("#job")).to_be_hidden()


def test_the_redact_control_scrubs_the_preview_and_the_download(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    key, mail, phone = "AKIAIOSFODNN7EXAMPLE", "jane.doe@acme-corp.com", "(415) 555-2671"
    two_trip_records(page, web, stack.tokens["page"], "Messages")
    # By default secrets only: the key goes, the customer's words stay.
    expect(page.locator("#redact-kinds input[value=secrets]")).to_be_checked()
    expect(page.locator("#redact-kinds input[value=email]")).not_to_be_checked()
    expect(page.locator("#redactions")).to_have_text("Redacted from this preview: 1 secret.")
    expect(page.locator("#preview")).to_contain_text("[REDACTED:SECRETS]")
    expect(page.locator("#preview")).to_contain_text(mail)
    page.get_by_label("E-mail").check()
    page.get_by_label("Phone").check()
    expect(page.locator("#redactions")).to_have_text(
        "Redacted from this preview: 1 secret, 1 e-mail address, 1 phone number."
    )
    preview = page.locator("#preview").inner_text()
    assert "[REDACTED:EMAIL]" in preview
    assert all(v not in preview for v in (key, mail, phone))
    with page.expect_download() as download:
        page.locator("#download").click()
    data = Path(download.value.path()).read_text()
    assert "[REDACTED:PHONE]" in data
    assert all(v not in data for v in (key, mail, phone))
    for kind in ("email", "phone", "secrets"):
        page.locator(f"#redact-kinds input[value={kind}]").uncheck()
    # This token has no raw scope: the service refuses less than the default, and the page
    # checks the default again, locks it, and shows the redacted text.
    secrets = page.locator("#redact-kinds input[value=secrets]")
    expect(secrets).to_be_checked()
    expect(secrets).to_be_disabled()
    expect(page.locator("#redactions")).to_have_text("Redacted from this preview: 1 secret.")
    expect(page.locator("#preview")).to_contain_text("[REDACTED:SECRETS]")
    assert key not in page.locator("#preview").inner_text()


def test_a_csv_with_chosen_renamed_and_reordered_columns(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    two_trip_records(page, web, stack.tokens["page"], "CSV")
    page.locator("#columns-open").click()
    dialog = page.locator("#columns-dialog")
    expect(dialog).to_be_visible()
    for box in dialog.locator("input[type=checkbox]").all():
        box.uncheck()
    dialog.get_by_label("include trace_id").check()
    dialog.get_by_label("include reward", exact=True).check()
    dialog.get_by_label("header of reward", exact=True).fill("score")
    dialog.get_by_label("move reward up").click()  # above trace_id, which comes first
    for _ in range(12):
        if dialog.locator(".col-item").first.get_attribute("data-path") == "reward":
            break
        dialog.get_by_label("move reward up").click()
    dialog.get_by_label("keys of rubric").click()  # the keys replace the whole rubric
    for key in ("correctness", "helpfulness", "efficiency"):
        dialog.get_by_label(f"include rubric.{key}").uncheck()
    expect(dialog.get_by_label("include rubric.safety")).to_be_checked()
    dialog.get_by_label("header of rubric.safety").fill("safety")
    page.locator("#columns-apply").click()
    expect(page.locator("#preview th")).to_have_text(["score", "trace_id", "safety"])
    with page.expect_download() as download:
        page.locator("#download").click()
    assert download.value.suggested_filename.endswith(".csv")
    table = list(csv.reader(io.StringIO(Path(download.value.path()).read_text())))
    assert table[0] == ["score", "trace_id", "safety"]
    assert sorted(row[1] for row in table[1:]) == ["tr-010", "tr-011"]


def test_a_large_export_runs_as_a_job_behind_the_floating_indicator(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    export_tab(page, web, stack.tokens["page"])
    choose(page, "source", "Evaluator score")
    choose(page, "format", "Trajectory")
    expect(page.locator("#preview pre").first).to_contain_text('"reward_source": "evaluator"')
    records = stat(page, "records")
    assert records > 5  # over this instance's direct-download limit
    page.locator("#download").click()
    indicator = page.locator("#job")
    expect(indicator).to_be_visible()
    expect(page.locator("#job-title")).to_have_text("Export ready", timeout=60_000)
    assert indicator.get_attribute("data-states") == "processing,ready"
    expect(page.locator("#job-body")).to_contain_text(f"{records} rows")
    with page.expect_download() as download:
        page.locator("#job-download").click()
    rows = list(iter_lines(Path(download.value.path()).read_bytes()))
    assert len(rows) == records
    assert {r["reward_source"] for r in rows} == {"evaluator"}


def test_an_admin_pins_a_version_and_the_tab_reads_it(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    export_tab(page, web, stack.tokens["admin"])
    choose(page, "source", "Evaluator score")
    expect(page.locator("#preview pre").first).to_contain_text('"reward_source": "evaluator"')
    records = stat(page, "records")
    page.locator("#version-pin").click()
    page.locator("#pin-name").fill("page-v1")
    page.locator("#pin-note").fill("pinned from the page")
    page.locator("#pin-save").click()
    expect(page.locator("#toast")).to_contain_text("Pinned evaluator as page-v1")
    expect(page.locator("#version")).to_have_value("page-v1")
    expect(page.locator("#version-note")).to_contain_text("pinned from the page")
    assert stat(page, "records") == records
    # A name taken is said in the dialog, which stays open.
    page.locator("#version-pin").click()
    page.locator("#pin-name").fill("page-v1")
    page.locator("#pin-save").click()
    expect(page.locator("#pin-error")).to_contain_text("already exists")
    page.keyboard.press("Escape")
    # Another source has versions of its own; coming back, the latest is read again.
    choose(page, "source", "Human labels")
    expect(page.locator("#version")).to_have_value("")
    assert page.locator("#version option").all_inner_texts() == ["Latest (live)"]
    # An export token lists versions but cannot pin.
    page.evaluate("localStorage.clear()")
    export_tab(page, web, stack.tokens["page"])
    choose(page, "source", "Evaluator score")
    expect(page.locator("#version-pin")).to_be_hidden()
    page.locator("#version").select_option("page-v1")
    expect(page.locator("#version-note")).to_contain_text("traces deleted since are left out")
    with web.client(stack.tokens["page"]) as client:
        pinned = client.get("stats", params={"source": "evaluator", "version": "page-v1"})
    expect(page.locator("#stat-records")).to_have_text(f"{pinned.json()['records']:,}")
    with web.client(stack.tokens["admin"]) as admin:
        assert admin.delete("versions/page-v1", params={"corpus": "evaluator"}).status_code == 200


def test_the_training_set_box_splits_and_deduplicates_the_preview_and_the_download(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    two_trip_records(page, web, stack.tokens["page"], "Trajectory")
    page.locator("#training-box summary").click()
    page.locator("#training input[name=splits]").fill("train=0.5,eval")  # not a split list
    expect(page.locator("#export-error")).to_contain_text("splits")
    params = {"source": "evaluator", "format": "trajectory", "scenario": "trip",
              "splits": "train=0.5,eval=0.5", "dedup": "exact"}  # fmt: skip
    with web.client(stack.tokens["page"]) as client:  # the split with fewer of the 2 rows
        rows = {name: client.get("export", params={**params, "split": name}).content
                for name in ("train", "eval")}  # fmt: skip
        name = min(rows, key=lambda n: len(rows[n].splitlines()))
        expected = client.get("export", params={**params, "split": name})
        preview = client.get("records", params={**params, "split": name, "limit": 5})
    assert expected.status_code == 200, expected.text
    assert len(expected.content.splitlines()) < 2  # so the download shows the split was kept
    page.locator("#training input[name=splits]").fill("train=0.5,eval=0.5")
    page.locator("#training input[name=split]").fill(name)
    page.locator("#training select[name=dedup]").select_option("exact")
    expect(page.locator("#export-error")).to_be_hidden()
    expect(page.locator("#training-summary")).to_have_text(f"split {name}, exact dedup")
    expect(page.locator("#stat-records")).to_have_text("2")  # the stats count every record
    assert preview.json()["items"] == [loads(line) for line in expected.content.splitlines()]
    with page.expect_download() as download:
        page.locator("#download").click()
    assert Path(download.value.path()).read_bytes() == expected.content
    page.locator("#training select[name=dedup]").select_option("")
    page.locator("#training input[name=split]").fill("")
    page.locator("#training input[name=splits]").fill("")
    expect(page.locator("#training-summary")).to_have_text("")


def test_a_transcript_holding_markup_shows_it_as_text(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    token = stack.tokens["xss"]
    clear_queue_head(web, token, lambda r: r["trace_id"] == "tr-009")
    sign_in(page, web, token)
    expect(page.locator("#trace-meta .tag").first).to_have_text("tr-009")
    messages = page.locator("#messages")
    expect(messages).to_contain_text(SCRIPT)
    assert messages.locator("script, img").count() == 0
    assert page.evaluate("window.pwned") is None


def test_the_page_shell_needs_no_token_and_holds_no_data(stack: Stack) -> None:
    web = stack.web
    html = httpx.get(f"{web.base}/acme/bot/rl-export").text
    assert "<title>RL Export" in html
    assert "Label trajectories or export evaluator-scored traces as JSONL" in html
    assert "tr-0" not in html
    assert httpx.get(f"{web.base}/static/rl_export.js").status_code == 200
    assert httpx.get(f"{web.base}/acme/bot/rl-export/../../x").status_code == 404


# --- labeling as a team ---------------------------------------------------------------------


def off_loop(work: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to its end on a thread of its own (Playwright's loop runs here)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


def test_the_label_tab_claims_one_trace_at_a_time_and_shows_the_team(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    from tests.integration.web.test_team import make_tokens, project_events

    project = "team-page"
    off_loop(publish(stack.settings, project_events(project, 4)))
    tokens = off_loop(make_tokens(stack, project, ["lead", "ana", "bo"]))
    with web.client(tokens["lead"], project=project) as lead:
        assert lead.put("labeling", json={"labels_per_trace": 1, "lease_s": 600}).status_code == 200
        wait_for("the project's traces in the index",
                 lambda: lead.get("stats", params={"source": "traces"}).json()["records"] == 4,
                 120)  # fmt: skip
    sign_in(page, web, tokens["ana"], project)
    expect(page.locator("#messages li").first).to_be_visible()
    claimed = current_trace(page)
    expect(page.locator("#claim-info")).to_contain_text("Claimed for you until")
    expect(page.locator("#team-count")).to_have_text("Team: 4 traces short of 1 label each")
    expect(page.locator("#own-count")).to_have_text("You: 0 labeled")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "label.png"))
    # Another labeler gets another trace: the page's claim holds.
    with web.client(tokens["bo"], project=project) as bo:
        theirs = bo.post("queue/claim", json={"limit": 3}).json()
        assert claimed not in [i["trace_id"] for i in theirs["items"]]
        assert len(theirs["items"]) == 3
    # Saving ends the claim and claims the next: nothing is left unclaimed now.
    for key in ("4", "4", "4", "4"):
        page.keyboard.press(key)
    press_action(page, "Enter")
    expect(page.locator("#undo-line")).to_contain_text(f"Saved {claimed}")
    expect(page.locator("#label-empty-title")).to_have_text("Nothing to claim right now")
    expect(page.locator("#team-count")).to_have_text("Team: 3 traces short of 1 label each")
    expect(page.locator("#own-count")).to_have_text("You: 1 labeled")
    # The settings are shown, not editable, to a labeler.
    page.locator("#queue-options summary").click()
    expect(page.locator("#labeling-form input[name=labels_per_trace]")).to_be_disabled()
    expect(page.locator("#labeling-save")).to_be_hidden()


def test_an_admin_changes_the_team_settings_on_the_page(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    from tests.integration.web.test_team import make_tokens, project_events

    project = "team-admin"
    off_loop(publish(stack.settings, project_events(project, 2)))
    tokens = off_loop(make_tokens(stack, project, ["lead"]))
    sign_in(page, web, tokens["lead"], project)
    page.locator("#queue-options summary").click()
    form = page.locator("#labeling-form")
    expect(form.locator("input[name=labels_per_trace]")).to_be_enabled()
    form.locator("input[name=labels_per_trace]").fill("3")
    form.locator("select[name=order]").select_option("uncertain")
    form.locator("input[name=adjudicate_spread]").fill("0.4")
    form.locator("select[name=pair_on]").select_option("scenario")
    form.locator("input[name=comparisons_per_pair]").fill("2")
    page.locator("#labeling-save").click()
    expect(page.locator("#toast")).to_have_text("Team settings saved.")
    with web.client(tokens["lead"], project=project) as lead:
        saved = lead.get("labeling").json()
    assert (saved["labels_per_trace"], saved["order"], saved["adjudicate_spread"]) == (
        3, "uncertain", 0.4)  # fmt: skip
    assert (saved["pair_on"], saved["pair_versions"], saved["comparisons_per_pair"]) == (
        "scenario", "different", 2)  # fmt: skip
    # Out of range: the browser refuses to send it (the API would answer 422 naming lease_s).
    form.locator("input[name=lease_s]").fill("5")
    page.locator("#labeling-save").click()
    assert form.locator("input[name=lease_s]").evaluate("e => e.validity.rangeUnderflow")
    with web.client(tokens["lead"], project=project) as lead:
        assert lead.get("labeling").json()["lease_s"] == 600


def test_the_agreement_tab_shows_the_report(stack: Stack, web: WebProcess, page: Page) -> None:
    """Over a project whose labelers rated the same traces (the CLI test's known table)."""
    from tests.integration.labeling.test_agreement_cli import events
    from tests.integration.web.test_team import make_tokens

    project = "agree-page"
    moved = [{**e, "project": project, "trace_id": f"{project}-{e['trace_id']}",
              "event_id": f"{project}-{e['event_id']}"} for e in events()]  # fmt: skip
    off_loop(publish(stack.settings, moved))
    token = off_loop(make_tokens(stack, project, ["lead"]))["lead"]
    with web.client(token, project=project) as api:

        def complete() -> dict[str, Any] | None:
            found: dict[str, Any] = api.get("agreement").json()
            return found if found["labeled"] == 7 else None

        report = wait_for("every label in the index", complete)
    sign_in(page, web, token, project)
    page.locator("#tab-agreement").click()
    rows = page.locator("#agreement-dimensions tbody tr")
    expect(rows).to_have_count(5)
    expect(page.locator("#agreement-counts")).to_contain_text(f"Traces: {report['traces']}")
    expect(rows.first).to_contain_text("Correctness")
    labelers = page.locator("#agreement-labelers tbody tr")
    expect(labelers).to_have_count(len(report["labelers_detail"]))
    expect(page.locator("#agreement-evaluators tbody tr")).to_have_count(len(report["evaluators"]))
    alpha = report["dimensions"]["correctness"]["alpha"]
    expect(rows.first).to_contain_text(f"{alpha:.3f}")
    page.screenshot(path=str(SCREENSHOTS / "agreement.png"), full_page=True)


def test_the_policy_refuses_a_script_planted_in_the_page(
    stack: Stack, web: WebProcess, page: Page
) -> None:
    """Escaping keeps markup out of the page; the Content-Security-Policy is the second wall:
    even a script element that got in (here put there by hand) does not run, nor does an
    inline event handler."""
    response = page.goto(f"{web.base}/acme/bot/rl-export")
    assert response is not None
    headers = response.headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text
            else None)  # fmt: skip
    page.evaluate("""() => {
        window.planted = "not run";
        const s = document.createElement("script");
        s.textContent = "window.planted = 'ran'";
        document.body.append(s);
        const img = document.createElement("img");
        img.setAttribute("onerror", "window.planted = 'ran too'");
        img.src = "data:,not-an-image";
        document.body.append(img);
    }""")
    page.wait_for_timeout(300)
    assert page.evaluate("window.planted") == "not run"
    assert refused  # Chromium says it refused them
