"""An instance told to warm a project (RL_EXPORT_WEB_WARM) indexes its corpora as it starts
and is ready only then: its first request finds them indexed, where an instance that was not
told indexes a corpus only when first asked for it."""

from __future__ import annotations

from tests.integration.web.conftest import TRACES, Stack
from tests.integration.webproc import WebProcess


def _first_stats(web: WebProcess, token: str, source: str) -> dict[str, object]:
    with web.client(token) as api:
        answer = api.get("stats", params={"source": source})
        assert answer.status_code == 200, answer.text
        index: dict[str, object] = answer.json()["index"]
        return index


def _records(web: WebProcess, token: str, source: str) -> int:
    """The corpus's records now, as the stack's own instance counts them (other tests of
    the session may have added traces to the stack's TRACES)."""
    with web.client(token) as api:
        records: int = api.get("stats", params={"source": source}).json()["records"]
        return records


def test_a_warmed_instance_is_ready_with_its_corpora_indexed(stack: Stack) -> None:
    token = stack.tokens["admin"]
    warm = WebProcess(stack.settings, "web-warm", RL_EXPORT_WEB_WARM=" acme/bot ,",
                      RL_EXPORT_WEB_INDEX_WAIT_S="0")  # fmt: skip
    warm.start()  # returns once /readyz answers 200
    try:
        for source in ("traces", "evaluator"):
            index = _first_stats(warm, token, source)
            assert index["ready"] is True
            assert index["indexed"] == _records(stack.web, token, source) >= TRACES
    finally:
        warm.stop()
    lazy = WebProcess(stack.settings, "web-lazy", RL_EXPORT_WEB_INDEX_WAIT_S="0").start()
    try:  # the same first request to an instance not told: not waited for, not indexed yet
        assert _first_stats(lazy, token, "traces")["ready"] is False
    finally:
        lazy.stop()
