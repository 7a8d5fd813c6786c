"""Abuse: one token must not freeze the API (DESIGN.md section 10). Every slot of the export
pool is held by exports whose source does not answer; stats, the queue, claims and /readyz
still answer, the subject's next export is a 429 with Retry-After, and a client that leaves
frees its slot. Against the real broker and store, the app served in this process so that
the exports' source can be held (:mod:`tests.harness.slowweb`)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from datetime import UTC, datetime

import httpx
import pytest

from rl_export.corpora.store import open_store
from rl_export.web.tokens import TokenStore
from tests.harness.slowweb import Gate, InProcessWeb
from tests.integration.web.conftest import TRACES, Stack
from tests.integration.webproc import wait_for

pytestmark = pytest.mark.integration

THREADS = 2  # the export pool; one subject's share (2) fills it


@pytest.fixture(scope="module")
def held(stack: Stack) -> Iterator[tuple[InProcessWeb, Gate, dict[str, str]]]:
    gate = Gate()
    limits = {"web_export_threads": THREADS, "web_exports_per_subject": 2,
              "web_jobs_per_subject": 1}  # fmt: skip
    settings = stack.settings.model_copy(update=limits)
    web = InProcessWeb(settings, gate).start()
    tokens = asyncio.run(_tokens(stack))
    try:
        with httpx.Client(base_url=f"{web.base}/api/v1/acme/bot/", timeout=30,
                          headers={"Authorization": f"Bearer {tokens['hog']}"}) as hog:  # fmt: skip

            def indexed() -> bool:
                stats = hog.get("stats", params={"source": "traces"}).json()
                return bool(stats.get("records") == TRACES)

            wait_for("the traces in the index", indexed, 120)
        yield web, gate, tokens
    finally:
        gate.open()
        web.stop()


async def _tokens(stack: Stack) -> dict[str, str]:
    store = open_store(stack.settings.store_url)
    try:
        made = {}
        for subject, scopes in (("hog", ("label", "export")), ("calm", ("label", "export"))):
            _, made[subject] = await TokenStore(store).create(
                "acme", "bot", f"iso-{subject}", scopes, datetime.now(UTC)
            )
        return made
    finally:
        await store.close()


def start_export(web: InProcessWeb, token: str) -> socket.socket:
    """A client that asks for an export and waits (the answer cannot start: its source is
    held); closing the socket is the client going away."""
    sock = socket.create_connection(("127.0.0.1", web.port))
    sock.sendall(
        b"GET /api/v1/acme/bot/export?source=traces&format=trajectory HTTP/1.1\r\n"
        b"Host: 127.0.0.1\r\nAuthorization: Bearer " + token.encode() + b"\r\n\r\n"
    )
    return sock


def test_held_exports_leave_the_api_answering_and_a_leaving_client_frees_its_slot(
    held: tuple[InProcessWeb, Gate, dict[str, str]],
) -> None:
    web, gate, tokens = held
    pool = web.services.exports
    clients = [start_export(web, tokens["hog"]) for _ in range(THREADS)]
    try:
        wait_for("every export thread held at the source", lambda: gate.waiting >= THREADS)
        assert pool.running() == THREADS
        with httpx.Client(base_url=f"{web.base}/api/v1/acme/bot/", timeout=30,
                          headers={"Authorization": f"Bearer {tokens['hog']}"}) as hog:  # fmt: skip
            # The same subject once more: over its share.
            refused = hog.get("export", params={"source": "traces", "format": "trajectory"})
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"] == "too_many_requests"
            assert int(refused.headers["retry-after"]) > 0
            # Everything else still answers, for that subject too.
            for _ in range(5):
                assert hog.get("stats", params={"source": "traces"}).status_code == 200
                assert hog.get("queue", params={"limit": 5}).status_code == 200
                claim = hog.post("queue/claim", json={"limit": 1})
                assert claim.status_code == 200, claim.text
                for item in claim.json()["claims"]:
                    assert hog.delete(f"queue/claims/{item['trace_id']}").status_code == 204
                assert httpx.get(f"{web.base}/readyz", timeout=30).status_code == 200
            # One job at a time for this test's settings: the second is a 429.
            job = {"source": "traces", "format": "trajectory"}
            first = hog.post("exports", json=job)
            assert first.status_code == 202, first.text
            second = hog.post("exports", json=job)
            assert second.status_code == 429, second.text
            assert "retry-after" in second.headers
        # A client that leaves frees its slot (its export is cancelled at the source).
        # (An export may wait on several reads at once: counts are compared, not fixed.)
        before = gate.waiting
        clients.pop().close()
        wait_for("the slot of the client that left", lambda: pool.running() == THREADS - 1)
        wait_for("its reads at the source stopped", lambda: gate.waiting < before)
        after = gate.waiting
        clients.append(start_export(web, tokens["hog"]))
        wait_for("a new export in the freed slot", lambda: pool.running() == THREADS)
        wait_for("its reads at the source", lambda: gate.waiting > after)
    finally:
        for client in clients:
            client.close()
    wait_for("every slot freed", lambda: pool.running() == 0)
    assert web.services.metrics.throttled.labels("exports")._value.get() >= 1
