"""A running stack for the web service's tests: the real broker and SeaweedFS (session), then
for this package a worker (join and sink) and a web service, on topics and a store prefix of
their own, seeded with traces through Kafka, and API tokens in the store. Tests share it, so
each labels its own traces under its own subject.

The page's browser tests share the browser (Debian's chromium driven by Playwright), a fresh
context per test, and axe-core's scan (fetched by ``make install`` into ``.cache/axe-core/``)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from rl_export.corpora.store import open_store
from rl_export.local.broker import LocalKafka
from rl_export.local.seaweed import LocalS3
from rl_export.runtime.settings import Settings
from rl_export.web.tokens import Scope, TokenStore
from tests.integration.conftest import run_settings, unique
from tests.integration.webproc import WebProcess, wait_for
from tests.integration.workers import WorkerProcess, publish
from tests.records import conversation, trace_events

SCRIPT = "<script>window.pwned = true</script><img src=x onerror=alert(1)>"
# tr-011's second user turn: a secret (redacted by default) and personal data (on request).
PLANTED = "Mail jane.doe@acme-corp.com or call (415) 555-2671; my key is AKIAIOSFODNN7EXAMPLE."
TRACES = 12
FAILED_TURNS = {
    7: [{"type": "goal_met", "turn": 2, "decision": False}],
    8: [{"type": "tone", "turn": 9, "decision": False}],
}


def seed_events() -> list[dict[str, Any]]:
    """tr-000 .. tr-011 of acme/bot: scored 0.05 .. 0.95, every third labeled by someone
    else, tr-009's transcript holds markup, tr-010 and tr-011 are of another scenario;
    tr-007's report fails its second turn, tr-008's a turn its conversation lacks; tr-011
    holds a secret and personal data."""
    events: list[dict[str, Any]] = []
    for n in range(TRACES):
        messages = None
        if n == 9:
            messages = [
                {"role": "system", "content": "You are a careful agent."},
                {"role": "user", "content": f"Please echo this: {SCRIPT}"},
                {"role": "assistant", "content": [{"type": "text", "text": SCRIPT}]},
            ]
        if n == 11:
            messages = conversation(n)  # its second user turn says it all
            messages[5] = {"role": "user", "content": PLANTED}
        events += trace_events(
            n, score=round(0.05 + n * 0.08, 2), passed=n >= 6, minute=n,
            labels=({"correctness": 4, "helpfulness": 4, "efficiency": 3, "safety": 5},)
            if n % 3 == 0 else (),
            messages=messages, scenario="trip" if n >= 10 else "refund",
            outcomes=FAILED_TURNS.get(n),
        )  # fmt: skip
    return events


@dataclass
class Stack:
    settings: Settings
    worker: WorkerProcess
    web: WebProcess
    tokens: dict[str, str] = field(default_factory=dict)
    token_ids: dict[str, str] = field(default_factory=dict)


def stack_settings(kafka: LocalKafka, s3: LocalS3, data_dir: Path, **extra: Any) -> Settings:
    run = unique("w")
    return run_settings(
        kafka,
        run,
        data_dir,
        f"s3://{s3.bucket}/{run}",
        shard_max_age_s=1.0,
        join_processes=1,
        web_index_poll_s=0.25,
        web_token_cache_s=0.5,
        # The tests' many 401s all come from 127.0.0.1: the flood test has an instance of its
        # own with a low limit (test_abuse_requests.py).
        web_auth_failures_per_minute=100_000,
        web_publish_timeout_s=5.0,
        web_export_heartbeat_s=0.3,
        # acme/bot is shared by many labelers' tests that each walk the whole queue: room for
        # ten labels per trace. The team's tests set their own projects' settings.
        labels_per_trace=10,
        **extra,
    )


async def make_tokens(settings: Settings) -> tuple[dict[str, str], dict[str, str]]:
    store = open_store(settings.store_url)
    tokens = TokenStore(store)
    now = datetime.now(UTC)
    wanted: dict[str, tuple[str, str, str, tuple[Scope, ...]]] = {
        "admin": ("acme", "bot", "ana", ("admin",)),
        "label": ("acme", "bot", "bo", ("label",)),
        "export": ("acme", "bot", "cy", ("export",)),
        "labeler": ("acme", "bot", "dee", ("label", "export")),
        "other": ("acme", "other", "ana", ("admin",)),
        "revoked": ("acme", "bot", "eve", ("admin",)),
        "queue": ("acme", "bot", "flo", ("label",)),
        "undo": ("acme", "bot", "gus", ("label",)),
        "fuzz": ("acme", "bot", "hal", ("label", "export")),
        "page": ("acme", "bot", "pat", ("label", "export")),
        "undo-page": ("acme", "bot", "uma", ("label", "export")),
        "xss": ("acme", "bot", "xen", ("label", "export")),
        "follow": ("acme", "bot", "fay", ("label", "export")),
        "raw": ("acme", "bot", "rae", ("export", "raw")),
    }
    out: dict[str, str] = {}
    ids: dict[str, str] = {}
    try:
        for name, (org, project, subject, scopes) in wanted.items():
            record, token = await tokens.create(org, project, subject, scopes, now)
            out[name], ids[name] = token, record.id
    finally:
        await store.close()
    return out, ids


def start_stack(settings: Settings, **web_env: str) -> Stack:
    worker = WorkerProcess(settings, "worker").start()
    try:
        asyncio.run(publish(settings, seed_events()))
        web = WebProcess(settings, "web", **web_env).start()
    except BaseException:
        worker.stop()
        raise
    stack = Stack(settings, worker, web)
    stack.tokens, stack.token_ids = asyncio.run(make_tokens(settings))
    with web.client(stack.tokens["admin"]) as api:

        def seeded() -> bool:
            stats = api.get("stats", params={"source": "traces"}).json()
            return bool(stats.get("records") == TRACES)

        wait_for("the seeded traces in the index", seeded, timeout_s=120)
    return stack


@pytest.fixture(scope="package")
def stack(kafka: LocalKafka, s3: LocalS3, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Stack]:  # fmt: skip
    settings = stack_settings(kafka, s3, tmp_path_factory.mktemp("web"))
    made = start_stack(settings)
    try:
        yield made
    finally:
        made.web.stop()
        made.worker.stop()


# --- the browser ----------------------------------------------------------------------------

CHROMIUM = next(
    (p for p in ("/usr/bin/chromium", shutil.which("chromium")) if p and Path(p).exists()), None
)
# Printed once by pytest's summary (identical skip reasons are grouped into one line).
MISSING = ("BROWSER TESTS NOT RUN: Debian's chromium is not installed (make install installs it "
           "with apt-get when run as root; CI does)")  # fmt: skip
AXE = next((Path(__file__).resolve().parents[3] / ".cache" / "axe-core").glob("*/axe.min.js"), None)
NO_AXE = ("ACCESSIBILITY CHECKS NOT RUN: axe-core is not in .cache/axe-core/ (make install fetches "
          "it with npm pack)")  # fmt: skip


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if CHROMIUM is None:
        pytest.skip(MISSING)
    with sync_playwright() as playwright:
        # Never Playwright's own browser download: the system's chromium. launch() gives it a
        # fresh temporary profile (user-data dir) of its own, removed when it closes.
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1360, "height": 860}, accept_downloads=True)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield opened
    finally:
        context.close()
    assert not errors, errors


def sign_in(page: Page, web: WebProcess, token: str, project: str = "bot") -> None:
    """Open the page and give it the token, by keyboard: the page asks for it once."""
    page.goto(f"{web.base}/acme/{project}/rl-export")
    expect(page.locator("#token-input")).to_be_focused()
    page.keyboard.type(token)
    page.keyboard.press("Enter")


def press_action(page: Page, key: str) -> None:
    """Press a Label page key that acts (Enter saves, S skips, U undoes) once the page has
    finished the previous one: a key pressed while it is under way is dropped by design (a
    double Enter saves once), and the work area says so with ``aria-busy``."""
    expect(page.locator("#label-work")).not_to_have_attribute("aria-busy", "true")
    page.keyboard.press(key)


def current_trace(page: Page) -> str:
    return page.locator("#trace-meta .tag").first.inner_text()


def axe_violations(page: Page) -> list[str]:
    """axe-core's serious and critical violations of the page as it is (WCAG 2.x A and AA,
    and best practices), one line each. Injected through the DevTools protocol, which the
    page's Content-Security-Policy does not govern (it refuses any script of the page's own)."""
    if AXE is None:
        pytest.skip(NO_AXE)
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(AXE.read_text())
    found: list[dict[str, Any]] = page.evaluate(
        """async () => (await axe.run(document, {resultTypes: ["violations"]})).violations
            .filter((v) => v.impact === "serious" || v.impact === "critical")
            .map((v) => ({id: v.id, impact: v.impact,
                          nodes: v.nodes.slice(0, 3).map((n) => n.target.join(" ") + ": "
                                                         + (n.failureSummary || ""))}))"""
    )
    return [f"{v['impact']} {v['id']}: {'; '.join(v['nodes'])}" for v in found]
