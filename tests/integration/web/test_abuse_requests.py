"""Abuse: unauthenticated and odd requests (DESIGN.md section 10). A flood of made-up tokens
is throttled per address without reaching the store, and never refuses a token that
verifies, one made during the flood included; a forged ``X-Forwarded-For`` is not an address
unless it comes from a listed proxy; a retraction without a label is a 404 that publishes
nothing; absurd numbers are 422s, never 500s; an expired token is a 401 ``token_expired``;
``/readyz`` tells no internal error; ``tokens create --expires-in``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from rl_export.corpora.store import open_store
from rl_export.web.tokens import TokenStore, split_token
from tests.harness.workers import settings_env
from tests.integration.web.conftest import Stack
from tests.integration.webproc import WebProcess

pytestmark = pytest.mark.integration

FLOOD_LIMIT = 5
HUGE = "9" * 26


def metric(web: WebProcess, name: str) -> float:
    """The sum of a metric's samples on the instance."""
    total = 0.0
    for line in web.metrics().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def flood_web(stack: Stack) -> Iterator[WebProcess]:
    """An instance of its own: the flood holds 127.0.0.1 back for a minute."""
    web = WebProcess(stack.settings, "web-flood",
                     RL_EXPORT_WEB_AUTH_FAILURES_PER_MINUTE=str(FLOOD_LIMIT),
                     RL_EXPORT_WEB_TOKEN_CACHE_S="600").start()  # fmt: skip
    try:
        yield web
    finally:
        web.stop()


def test_a_401_flood_is_throttled_per_address_and_known_tokens_still_work(
    stack: Stack, flood_web: WebProcess
) -> None:
    with flood_web.client(stack.tokens["export"]) as known:
        assert known.get("stats", params={"source": "traces"}).status_code == 200  # cached now
    statuses = []
    for n in range(4 * FLOOD_LIMIT):
        made_up = f"rlx_{n:012x}_" + "A" * 43
        with flood_web.client(made_up) as client:
            answer = client.get("stats", params={"source": "traces"})
        statuses.append(answer.status_code)
        if answer.status_code == 429:
            assert answer.json()["error"] == "too_many_requests"
            assert 1 <= int(answer.headers["retry-after"]) <= 60
    assert statuses[:FLOOD_LIMIT] == [401] * FLOOD_LIMIT
    assert statuses[FLOOD_LIMIT:] == [429] * (3 * FLOOD_LIMIT)
    throttled = metric(flood_web, 'rl_export_web_auth_failures_total{reason="throttled"}')
    assert throttled == 3 * FLOOD_LIMIT
    with flood_web.client(stack.tokens["export"]) as known:  # its check needs no store read
        assert known.get("stats", params={"source": "traces"}).status_code == 200


def new_token(stack: Stack, subject: str) -> str:
    """A fresh export token of acme/bot (no instance has seen it)."""

    async def create() -> str:
        store = open_store(stack.settings.store_url)
        try:
            _, token = await TokenStore(store).create(
                "acme", "bot", subject, ("export",), datetime.now(UTC)
            )
        finally:
            await store.close()
        return token

    return asyncio.run(create())


async def revoke(stack: Stack, token: str) -> None:
    parts = split_token(token)
    assert parts is not None
    store = open_store(stack.settings.store_url)
    try:
        await TokenStore(store).revoke(parts[0], datetime.now(UTC))
    finally:
        await store.close()


def ask(web: WebProcess, token: str, forwarded_for: str | None = None) -> httpx.Response:
    headers = {} if forwarded_for is None else {"X-Forwarded-For": forwarded_for}
    with web.client(token) as client:
        return client.get("stats", params={"source": "traces"}, headers=headers)


def made_up(n: int) -> str:
    return f"rlx_{n:012x}_" + "B" * 43


@pytest.fixture
def web_of_its_own(stack: Stack, request: pytest.FixtureRequest) -> Iterator[WebProcess]:
    """A fresh instance with a low limit (each test floods 127.0.0.1 on its own); tokens are
    trusted for half a second, so a token checked before the flood needs a read after it.
    ``@pytest.mark.parametrize("web_of_its_own", [{...}], indirect=True)`` adds settings."""
    extra: dict[str, str] = getattr(request, "param", {})
    web = WebProcess(stack.settings, f"web-flood-{len(extra)}-{time.monotonic_ns()}",
                     RL_EXPORT_WEB_AUTH_FAILURES_PER_MINUTE=str(FLOOD_LIMIT),
                     RL_EXPORT_WEB_TOKEN_CACHE_S="0.5", **extra).start()  # fmt: skip
    try:
        yield web
    finally:
        web.stop()


def test_a_bad_token_flood_from_one_address_never_refuses_a_token_that_verifies(
    stack: Stack, web_of_its_own: WebProcess
) -> None:
    web = web_of_its_own
    before = new_token(stack, "flood-ana")
    assert ask(web, before).status_code == 200  # checked once, before the flood
    statuses = [ask(web, made_up(n)).status_code for n in range(4 * FLOOD_LIMIT)]
    assert statuses == [401] * FLOOD_LIMIT + [429] * (3 * FLOOD_LIMIT)
    during = new_token(stack, "flood-bo")  # made while the address is over its limit
    time.sleep(1.0)  # the instance's cache of ``before`` has expired: it is read again
    for n in range(3):
        for token in (before, during):
            answer = ask(web, token)
            assert answer.status_code == 200, (n, answer.text)
        assert ask(web, made_up(1000 + n)).status_code == 429  # the flood stays throttled
    # A revoked token is a known one: its own 401, never a 429.
    gone = new_token(stack, "flood-cy")
    asyncio.run(revoke(stack, gone))
    refused = ask(web, gone)
    assert refused.status_code == 401, refused.text
    assert "revoked" in refused.json()["detail"]
    assert metric(web, 'rl_export_web_auth_failures_total{reason="throttled"}') >= 3 * FLOOD_LIMIT


def test_a_forged_x_forwarded_for_is_not_an_address(
    stack: Stack, web_of_its_own: WebProcess
) -> None:
    """No proxy is listed: each request says it comes from elsewhere, all come from here."""
    statuses = [ask(web_of_its_own, made_up(n), forwarded_for=f"203.0.113.{n}").status_code
                for n in range(2 * FLOOD_LIMIT)]  # fmt: skip
    assert statuses == [401] * FLOOD_LIMIT + [429] * FLOOD_LIMIT
    forwarded = {"Forwarded": "for=198.51.100.1"}
    with web_of_its_own.client(made_up(99)) as client:
        again = client.get("stats", params={"source": "traces"}, headers=forwarded)
    assert again.status_code == 429


@pytest.mark.parametrize(
    "web_of_its_own", [{"RL_EXPORT_WEB_TRUSTED_PROXIES": "127.0.0.1"}], indirect=True
)
def test_a_listed_proxys_x_forwarded_for_names_the_client(
    stack: Stack, web_of_its_own: WebProcess
) -> None:
    """127.0.0.1 is a listed proxy: the address is the hop it appended, so one client's flood
    throttles that client alone, and what a client wrote before its proxy's hop is ignored."""
    web = web_of_its_own
    flood = [ask(web, made_up(n), forwarded_for=f"6.6.6.{n}, 203.0.113.1").status_code
             for n in range(2 * FLOOD_LIMIT)]  # fmt: skip
    assert flood == [401] * FLOOD_LIMIT + [429] * FLOOD_LIMIT
    assert ask(web, made_up(500), forwarded_for="203.0.113.2").status_code == 401  # another
    assert ask(web, new_token(stack, "proxied"), forwarded_for="203.0.113.1").status_code == 200


def test_a_retraction_without_a_label_is_404_and_publishes_nothing(stack: Stack) -> None:
    before = metric(stack.web, "rl_export_web_events_published_total")
    with stack.web.client(stack.tokens["queue"]) as flo:
        for _ in range(3):
            answer = flo.delete("labels/tr-005")
            assert answer.status_code == 404, answer.text
            assert "no current label" in answer.json()["detail"]
    assert metric(stack.web, "rl_export_web_events_published_total") == before


ABSURD: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "stats", {"params": {"source": "traces", "limit": HUGE}}),
    ("GET", "stats", {"params": {"source": "traces", "max_severity": HUGE}}),
    ("GET", "stats", {"params": {"source": "traces", "min_labels": "-" + HUGE}}),
    ("GET", "stats", {"params": {"source": "traces", "min_reward": "1e400"}}),
    ("GET", "stats", {"params": {"source": "traces", "limit": "1" * 5000}}),
    ("GET", "records", {"params": {"source": "traces", "limit": HUGE}}),
    ("GET", "agreement", {"params": {"limit": HUGE}}),
    ("GET", "queue", {"params": {"limit": HUGE}}),
    ("GET", "export", {"params": {"source": "traces", "limit": HUGE}}),
    ("POST", "queue/claim", {"json": {"limit": int(HUGE)}}),
    (
        "POST",
        "exports",
        {"json": {"source": "traces", "format": "trajectory", "filters": {"limit": HUGE}}},
    ),
    ("PUT", "labeling", {"json": {"lease_s": int(HUGE)}}),
    ("PUT", "labeling", {"json": {"labels_per_trace": -int(HUGE)}}),
    ("PUT", "labeling", {"json": {"adjudicate_spread": 1e308}}),
    (
        "POST",
        "labels",
        {
            "json": {
                "trace_id": "tr-001",
                "rubric": {
                    "correctness": int(HUGE),
                    "helpfulness": 1,
                    "efficiency": 1,
                    "safety": 1,
                },
            }
        },
    ),
]


@pytest.mark.parametrize(("method", "path", "request_args"), ABSURD)
def test_absurd_numbers_are_422(
    stack: Stack, method: str, path: str, request_args: dict[str, Any]
) -> None:
    with stack.web.client(stack.tokens["admin"]) as admin:
        answer = admin.request(method, path, **request_args)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == "invalid"


def test_the_largest_count_is_accepted(stack: Stack) -> None:
    with stack.web.client(stack.tokens["admin"]) as admin:
        answer = admin.get("stats", params={"source": "traces", "limit": str(2**63 - 1)})
    assert answer.status_code == 200, answer.text


def test_an_expired_token_is_401_token_expired(stack: Stack) -> None:
    async def expired() -> str:
        store = open_store(stack.settings.store_url)
        try:
            _, token = await TokenStore(store).create(
                "acme", "bot", "old", ("label",), datetime.now(UTC) - timedelta(hours=1),
                expires_in=timedelta(minutes=30),
            )  # fmt: skip
            return token
        finally:
            await store.close()

    token = asyncio.run(expired())
    with stack.web.client(token) as old:
        answer = old.get("queue")
    assert answer.status_code == 401
    assert answer.json()["error"] == "token_expired"
    assert token not in answer.text


def test_tokens_are_created_with_an_expiry_that_the_list_shows(stack: Stack) -> None:
    env = settings_env(stack.settings)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "rl_export.cli", "tokens", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60,
                              check=False)  # fmt: skip

    made = cli("create", "--org", "acme", "--project", "bot", "--subject", "exp",
               "--scopes", "label", "--expires-in", "12h")  # fmt: skip
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    token_id = token.split("_")[1]
    default = cli("create", "--org", "acme", "--project", "bot", "--subject", "exp2",
                  "--scopes", "label")  # fmt: skip
    assert default.returncode == 0, default.stderr
    default_id = default.stdout.strip().splitlines()[-1].split("_")[1]
    listed = {line.split()[0]: line for line in cli("list").stdout.splitlines() if line}
    in_90d = (datetime.now(UTC) + timedelta(days=90)).date().isoformat()
    assert "expires 20" in listed[token_id]  # a date, not never
    assert f"expires {in_90d}" in listed[default_id]
    bad = cli("create", "--org", "acme", "--project", "bot", "--subject", "exp3",
              "--scopes", "label", "--expires-in", "1 fortnight")  # fmt: skip
    assert bad.returncode != 0
    assert "--expires-in" in bad.stderr
    assert "Traceback" not in bad.stderr
    with httpx.Client(base_url=f"{stack.web.base}/api/v1/acme/bot/", timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as fresh:  # fmt: skip
        assert fresh.get("labeling").status_code == 200


def test_metrics_are_on_their_own_port_and_readyz_tells_no_internals(stack: Stack) -> None:
    public = httpx.get(f"{stack.web.base}/metrics", timeout=10)
    assert public.status_code == 404
    assert "rl_export_" not in public.text
    assert "rl_export_web_requests_total" in stack.web.metrics()  # the metrics port
    ready = httpx.get(f"{stack.web.base}/readyz", timeout=10)
    assert ready.json() == {"ready": True}
