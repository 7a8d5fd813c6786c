"""``GET agreement`` through a running stack equals ``rl-export agreement`` over the same
store and the test's own computation (tests/integration/labeling/test_agreement_cli.py): the
events go through Kafka, the worker and the web service's index."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest

from rl_export.corpora.store import open_store
from rl_export.web.tokens import Scope, TokenStore
from tests.integration.labeling.test_agreement_cli import TRACES, events, expected
from tests.integration.web.conftest import Stack
from tests.integration.webproc import wait_for
from tests.integration.workers import publish

pytestmark = pytest.mark.integration

PROJECT = "agree"


def moved(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The test's events in acme/agree, trace ids of their own on the shared stack."""
    return [{**e, "project": PROJECT, "trace_id": f"{PROJECT}-{e['trace_id']}",
             "event_id": f"{PROJECT}-{e['event_id']}"} for e in items]  # fmt: skip


async def token(stack: Stack, scopes: tuple[Scope, ...]) -> str:
    store = open_store(stack.settings.store_url)
    try:
        _, made = await TokenStore(store).create("acme", PROJECT, "lead", scopes,
                                                 datetime.now(UTC))  # fmt: skip
    finally:
        await store.close()
    return made


@pytest.fixture(scope="module")
def agree(stack: Stack) -> str:
    asyncio.run(publish(stack.settings, moved(events())))
    return asyncio.run(token(stack, ("export",)))


def test_the_api_gives_the_tests_own_report_and_the_commands(stack: Stack, agree: str) -> None:
    with stack.web.client(agree, project=PROJECT) as api:

        def complete() -> dict[str, Any] | None:
            answer = api.get("agreement")
            assert answer.status_code == 200, answer.text
            found: dict[str, Any] = answer.json()
            return found if found["labeled"] == 7 and found["traces"] == 8 else None

        report = wait_for("every label in the index", complete, 120)
        assert report.pop("index")["ready"] is True
        assert datetime.fromisoformat(report.pop("computed_at")) <= datetime.now(UTC)
        assert report.pop("updating") in (True, False)  # the corpus may move meanwhile
        assert report == expected(list(range(len(TRACES))))
        narrowed = api.get("agreement", params={"min_labels": "3"}).json()
        for field in ("index", "computed_at", "updating"):
            narrowed.pop(field)
        assert narrowed == expected([0, 2])
        assert api.get("agreement", params={"bogus": "1"}).status_code == 422
        assert api.get("agreement", params={"max_spread": "wide"}).status_code == 422
    argv = [sys.executable, "-m", "rl_export.cli", "agreement", "--store",
            stack.settings.store_url, "--org", "acme", "--project", PROJECT]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == report


def test_agreement_needs_the_export_scope(stack: Stack, agree: str) -> None:
    labeler = asyncio.run(token(stack, ("label",)))
    with stack.web.client(labeler, project=PROJECT) as api:
        assert api.get("agreement").status_code == 403
