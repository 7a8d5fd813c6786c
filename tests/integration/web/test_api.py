"""The HTTP API of ``rl-export web`` against a running service, the real broker, SeaweedFS and
a real worker: every route, auth, bad input, labels reaching the corpora and the stats, skips,
retractions, exports and export jobs, read-your-writes across instances, a broker that is
down, and the metrics."""

from __future__ import annotations

import asyncio
import csv
import io
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pyarrow.parquet as pq
import pytest

from rl_export.corpora.layout import CorpusRef
from rl_export.corpora.reader import CorpusReader
from rl_export.corpora.store import open_store
from rl_export.model.codec import iter_lines
from rl_export.runtime.net import free_port
from rl_export.web.tokens import TokenStore, split_token
from tests.integration.web.conftest import TRACES, Stack
from tests.integration.webproc import WebProcess, wait_for

RUBRIC = {"correctness": 5, "helpfulness": 4, "efficiency": 4, "safety": 5}

# Every route of DESIGN.md section 7: (method, path relative to /api/v1/acme/bot/, body).
ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "stats?source=evaluator", None),
    ("GET", "records?source=evaluator&format=trajectory&limit=2", None),
    ("GET", "export?source=evaluator&format=trajectory", None),
    ("POST", "exports", {"source": "evaluator", "format": "trajectory"}),
    ("GET", f"exports/{'0' * 32}", None),
    ("GET", f"exports/{'0' * 32}/download", None),
    ("GET", "queue?limit=1", None),
    ("POST", "labels", {"trace_id": "tr-000", "rubric": RUBRIC}),
    ("POST", "skips", {"trace_id": "tr-000"}),
    ("DELETE", "labels/tr-000", None),
    ("PUT", "queue/claims/tr-000", None),
]
EXPORT_ROUTES = ROUTES[:6]
LABEL_ROUTES = ROUTES[6:]


def call(client: httpx.Client, method: str, path: str, body: Any = None) -> httpx.Response:
    return client.request(method, path, json=body)


def assert_error(response: httpx.Response, status: int, error: str, *needles: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "detail"}, body
    assert body["error"] == error, body
    for needle in needles:
        assert needle in body["detail"], body


def latest(stack: Stack, corpus: str) -> dict[str, dict[str, Any]]:
    """The corpus's latest record per trace, read with the trainers' reader."""

    async def read() -> dict[str, dict[str, Any]]:
        store = open_store(stack.settings.store_url)
        try:
            reader = CorpusReader(store, CorpusRef("acme", "bot", corpus))
            return {r["trace_id"]: r async for r in reader.records(latest_only=True)}
        finally:
            await store.close()

    return asyncio.run(read())


def queue_ids(client: httpx.Client) -> list[str]:
    response = client.get("queue", params={"limit": 100})
    assert response.status_code == 200, response.text
    return [r["trace_id"] for r in response.json()["items"]]


@pytest.fixture
def admin(stack: Stack) -> Iterator[httpx.Client]:
    with stack.web.client(stack.tokens["admin"]) as client:
        yield client


@pytest.fixture
def raw(stack: Stack) -> Iterator[httpx.Client]:
    with stack.web.client(stack.tokens["raw"]) as client:
        yield client


# --- the OpenAPI document -----------------------------------------------------------------


def test_openapi_document_needs_no_token_and_describes_every_route(stack: Stack) -> None:
    response = httpx.get(stack.web.base + "/api/v1/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    base = "/api/v1/{org}/{project}/"
    expected = {
        ("get", "stats"), ("get", "records"), ("get", "export"), ("post", "exports"),
        ("get", "exports"), ("get", "exports/{job_id}"), ("get", "exports/{job_id}/download"),
        ("get", "queue"),
        ("post", "labels"), ("post", "skips"), ("delete", "labels/{trace_id}"),
        ("put", "queue/claims/{trace_id}"), ("get", "whoami"),
    }  # fmt: skip
    documented = {(m, p.removeprefix(base)) for p, ops in paths.items() for m in ops}
    assert expected <= documented
    for method, path in expected:
        operation = paths[base + path][method]
        assert operation["security"], (method, path)
        assert {"401", "403", "422"} <= set(operation["responses"]), (method, path)


# --- auth ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_every_route_needs_a_token(stack: Stack, method: str, path: str, body: Any) -> None:
    with stack.web.client() as anonymous:
        assert_error(call(anonymous, method, path, body), 401, "unauthorized", "bearer token")
    for bad in ("not-a-token", f"rlx_{'a' * 12}_{'b' * 43}"):
        with stack.web.client(bad) as unknown:
            assert_error(call(unknown, method, path, body), 401, "unauthorized")


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_a_token_of_another_project_is_refused(
    stack: Stack, method: str, path: str, body: Any
) -> None:
    with stack.web.client(stack.tokens["other"]) as other:
        assert_error(call(other, method, path, body), 403, "forbidden", "acme/other")


@pytest.mark.parametrize(("method", "path", "body"), EXPORT_ROUTES)
def test_export_routes_need_the_export_scope(
    stack: Stack, method: str, path: str, body: Any
) -> None:
    with stack.web.client(stack.tokens["label"]) as labeler:
        assert_error(call(labeler, method, path, body), 403, "forbidden", "needs export")
    with stack.web.client(stack.tokens["export"]) as exporter:
        assert call(exporter, method, path, body).status_code in (200, 202, 404)


@pytest.mark.parametrize(("method", "path", "body"), LABEL_ROUTES)
def test_label_routes_need_the_label_scope(stack: Stack, method: str, path: str, body: Any) -> None:
    with stack.web.client(stack.tokens["export"]) as exporter:
        assert_error(call(exporter, method, path, body), 403, "forbidden", "needs label")


def test_whoami_answers_any_scope_with_the_tokens_subject_and_scopes(stack: Stack) -> None:
    for name, subject, scopes in (("export", "cy", ["export"]), ("label", "bo", ["label"]),
                                  ("admin", "ana", ["admin"])):  # fmt: skip
        with stack.web.client(stack.tokens[name]) as client:
            answer = client.get("whoami")
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"subject": subject, "org": "acme", "project": "bot",
                                     "scopes": scopes}  # fmt: skip
    with stack.web.client() as anonymous:
        assert_error(anonymous.get("whoami"), 401, "unauthorized", "bearer token")
    with stack.web.client(stack.tokens["other"]) as other:
        assert_error(other.get("whoami"), 403, "forbidden", "acme/other")


def test_admin_and_combined_scopes_reach_both_tabs(stack: Stack) -> None:
    for name in ("admin", "labeler"):
        with stack.web.client(stack.tokens[name]) as client:
            assert client.get("queue").status_code == 200
            assert client.get("stats", params={"source": "human"}).status_code == 200


def test_a_revoked_token_stops_working_within_the_cache_time(stack: Stack) -> None:
    with stack.web.client(stack.tokens["revoked"]) as client:
        assert client.get("queue").status_code == 200

        async def revoke() -> None:
            store = open_store(stack.settings.store_url)
            try:
                await TokenStore(store).revoke(stack.token_ids["revoked"], datetime.now(UTC))
            finally:
                await store.close()

        asyncio.run(revoke())
        time.sleep(stack.settings.web_token_cache_s + 0.2)
        assert_error(client.get("queue"), 401, "unauthorized", "revoked")


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        ("POST", "labels", {"trace_id": "tr-001", "rubric": RUBRIC | {"safety": 0}}, 422,
         "rubric.safety"),
        ("POST", "labels", {"trace_id": "tr-001", "rubric": RUBRIC | {"correctness": 6}}, 422,
         "rubric.correctness"),
        ("POST", "labels", {"trace_id": "tr-001", "rubric": RUBRIC | {"efficiency": "4"}}, 422,
         "rubric.efficiency"),
        ("POST", "labels", {"trace_id": "tr-001", "rubric": {"correctness": 4}}, 422, "rubric"),
        ("POST", "labels", {"trace_id": "tr-001", "rubric": RUBRIC, "labeler": "mallory"}, 422,
         "token's subject"),
        ("POST", "labels", {"trace_id": "", "rubric": RUBRIC}, 422, "trace_id"),
        ("POST", "labels", {"rubric": RUBRIC}, 422, "trace_id"),
        ("POST", "skips", {"trace_id": "tr-001", "colour": "red"}, 422, "colour"),
        ("GET", "stats?source=evaluator&min_reward=abc", None, 422, "min-reward: 'abc'"),
        ("GET", "stats?source=evaluator&since=yesterday", None, 422, "since"),
        ("GET", "stats?source=evaluator&passed=maybe", None, 422, "passed"),
        ("GET", "stats?source=evaluator&min_reward=0.9&max_reward=0.1", None, 422, "above"),
        ("GET", "stats?source=nowhere", None, 422, "source"),
        ("GET", "stats", None, 422, "source"),
        ("GET", "records?source=human&format=yaml", None, 422, "format"),
        ("GET", "records?source=human&format=csv&columns=nope", None, 422, "nope"),
        ("GET", "records?source=human&format=trajectory&columns=trace_id", None, 422, "columns"),
        ("GET", "records?source=human&limit=500", None, 422, "limit"),
        ("GET", "export?source=human&format=csv&columns=rubric.Kind-ness", None, 422,
         "rubric.Kind-ness"),
        ("GET", "export?source=human&format=parquet&max_severity=-1", None, 422,
         "max-severity"),
        ("GET", "queue?limit=0", None, 422, "limit"),
        ("GET", "queue?limit=1000", None, 422, "limit"),
        ("POST", "exports", {"source": "human", "format": "xml"}, 422, "format"),
        ("GET", "records?source=human&format=messages&chat_style=chatml", None, 422,
         "chat_style"),
        ("GET", "export?source=human&format=csv&chat_style=raw", None, 422,
         "chat_style: only applies"),
        ("GET", "records?source=human&format=messages&completion=rest", None, 422,
         "completion: only applies"),
        ("POST", "exports", {"source": "human", "format": "trajectory", "system": "merge"}, 422,
         "system: only applies"),
        ("POST", "exports", {"source": "human", "format": "kto", "system": "drop"}, 422,
         "system"),
        ("POST", "exports", {"source": "human", "format": "csv", "columns": "nope"}, 422,
         "nope"),
        ("POST", "exports", {"source": "human", "format": "csv", "filters": {"colour": "red"}},
         422, "colour"),
        ("POST", "exports", {"source": "human", "format": "csv",
                             "filters": {"min_reward": "x"}}, 422, "min-reward"),
        ("POST", "labels", {"trace_id": "tr-999", "rubric": RUBRIC}, 404, "tr-999"),
        ("POST", "skips", {"trace_id": "tr-999"}, 404, "tr-999"),
        ("DELETE", "labels/tr-999", None, 404, "tr-999"),
        ("GET", f"exports/{'f' * 32}", None, 404, "no export job"),
        ("GET", "exports/not-a-job", None, 404, "no export job"),
        ("GET", f"exports/{'f' * 32}/download", None, 404, "no export job"),
    ],
)  # fmt: skip
def test_bad_input_is_a_4xx_that_names_the_problem(
    admin: httpx.Client, case: tuple[str, str, Any, int, str]
) -> None:
    method, path, body, status, needle = case
    response = call(admin, method, path, body)
    error = {404: "not_found", 422: "invalid"}[status]
    assert_error(response, status, error, needle)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "stats?source=human&min_labels=2&bogus=1"),
        ("GET", "stats?source=human&min_label=2"),  # a misspelled filter
        ("GET", "records?source=human&colour=red"),
        ("GET", "export?source=human&format=messages&pased=true"),
        ("GET", "queue?limit=3&bogus=1"),
        ("GET", "agreement?bogus=1"),
        ("GET", "labeling?bogus=1"),
        ("GET", "exports/abc?bogus=1"),
    ],
)
def test_an_unknown_query_parameter_is_refused_by_name(
    admin: httpx.Client, method: str, path: str
) -> None:
    """A misspelled filter must never export unfiltered data (DESIGN.md section 7)."""
    unknown = path.rsplit("&", 1)[-1].rsplit("?", 1)[-1].split("=", maxsplit=1)[0]
    response = call(admin, method, path)
    assert_error(response, 422, "invalid", f"{unknown}: unknown query parameter")


def test_known_new_filters_apply_to_the_stats(admin: httpx.Client) -> None:
    every = admin.get("stats", params={"source": "traces"}).json()["records"]
    labeled = admin.get("stats", params={"source": "traces", "labeled": "true"}).json()["records"]
    once = admin.get("stats", params={"source": "traces", "min_labels": "1"}).json()["records"]
    assert once == labeled < every
    agreeing = admin.get("stats", params={"source": "traces", "max_spread": "0"}).json()
    assert agreeing["records"] <= every


def test_an_export_job_takes_filters_as_json_values(admin: httpx.Client) -> None:
    body = {"source": "evaluator", "format": "messages",
            "filters": {"passed": True, "min_reward": 0.5, "pass_dimension": []}}  # fmt: skip
    response = admin.post("exports", json=body)
    assert response.status_code == 202, response.text
    bad = admin.post("exports", json={**body, "filters": {"passed": None}})
    assert_error(bad, 422, "invalid", "passed")


def test_every_answer_carries_the_security_headers(stack: Stack, admin: httpx.Client) -> None:
    for response in (admin.get("stats", params={"source": "human"}),
                     admin.get("nowhere"),
                     httpx.get(f"{stack.web.base}/acme/bot/rl-export")):  # fmt: skip
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy
        assert "frame-ancestors 'none'" in policy
        assert "unsafe-inline" not in policy


def test_malformed_json_and_oversized_bodies_are_refused(admin: httpx.Client) -> None:
    response = admin.post("labels", content=b'{"trace_id": "tr-001", "rubric": ',
                          headers={"content-type": "application/json"})  # fmt: skip
    assert_error(response, 422, "invalid")
    big = {"trace_id": "tr-001", "rubric": RUBRIC, "comment": "x" * (1024 * 1024 + 10)}
    assert_error(admin.post("labels", json=big), 413, "too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while read
        yield b'{"trace_id": "tr-001", "comment": "'
        for _ in range(80):
            yield b"y" * 16384
        yield b'"}'

    response = admin.post("skips", content=chunks(), headers={"content-type": "application/json"})
    assert_error(response, 413, "too_large")


# --- labels, skips and retractions --------------------------------------------------------


def test_a_label_leaves_the_queue_at_once_and_reaches_the_corpora_and_the_stats(
    stack: Stack, admin: httpx.Client
) -> None:
    before = admin.get("stats", params={"source": "human"}).json()
    labeled_before = admin.get("stats", params={"source": "traces", "labeled": "true"}).json()
    assert "tr-001" in queue_ids(admin)

    response = admin.post("labels", json={"trace_id": "tr-001", "rubric": RUBRIC,
                                          "comment": "clear and correct"})  # fmt: skip
    assert response.status_code == 202, response.text
    event_id = response.json()["event_id"]
    assert uuid.UUID(event_id)
    assert "tr-001" not in queue_ids(admin)  # read-your-writes: before the corpora know

    def in_corpus() -> dict[str, Any] | None:
        record = latest(stack, "human").get("tr-001")
        return record if record and "ana" in record["labelers"] else None

    record = wait_for("the label in the human corpus", in_corpus)
    assert record["rubric"] == {k: float(v) for k, v in RUBRIC.items()}
    assert record["reward"] == sum(RUBRIC.values()) / 20
    assert record["passed"] is True

    def counted() -> bool:
        after = admin.get("stats", params={"source": "human"}).json()
        labeled = admin.get("stats", params={"source": "traces", "labeled": "true"}).json()
        return (after["records"] == before["records"] + 1
                and after["human_labeled"] == before["human_labeled"] + 1
                and labeled["records"] == labeled_before["records"] + 1)  # fmt: skip

    wait_for("the label in the stats", counted)
    preview = admin.get("records", params={"source": "human", "limit": 100}).json()["items"]
    assert any(r["trace_id"] == "tr-001" and "ana" in r["labelers"] for r in preview)


def test_a_skip_leaves_the_queue_and_reaches_the_traces_corpus(stack: Stack) -> None:
    with stack.web.client(stack.tokens["label"]) as bo:
        assert "tr-002" in queue_ids(bo)
        response = bo.post("skips", json={"trace_id": "tr-002"})
        assert response.status_code == 202, response.text
        assert uuid.UUID(response.json()["event_id"])
        assert "tr-002" not in queue_ids(bo)
        wait_for("the skip in the traces corpus",
                 lambda: "bo" in latest(stack, "traces")["tr-002"]["skipped_by"])  # fmt: skip
        assert "tr-002" not in queue_ids(bo)  # and it stays out once the corpora know


def test_a_retraction_brings_the_trace_back_and_removes_the_label(stack: Stack) -> None:
    with stack.web.client(stack.tokens["undo"]) as gus:
        response = gus.post("labels", json={"trace_id": "tr-004", "rubric": RUBRIC})
        assert response.status_code == 202, response.text
        assert "tr-004" not in queue_ids(gus)
        wait_for("the label in the traces corpus",
                 lambda: "gus" in latest(stack, "traces")["tr-004"]["labelers"])  # fmt: skip
        response = gus.delete("labels/tr-004")
        assert response.status_code == 202, response.text
        assert "tr-004" in queue_ids(gus)  # at once
        wait_for("the retraction in the traces corpus",
                 lambda: "gus" not in latest(stack, "traces")["tr-004"]["labelers"])  # fmt: skip
        assert "tr-004" in queue_ids(gus)


def test_the_queue_is_oldest_first_with_what_is_left(stack: Stack) -> None:
    with stack.web.client(stack.tokens["queue"]) as flo:
        body = flo.get("queue", params={"limit": 3}).json()
        items = body["items"]
        assert len(items) == 3
        assert body["remaining"] >= 3
        completed = [r["completed_at"] for r in items]
        assert completed == sorted(completed)
        assert all(r["reward_source"] is None and r["messages"] for r in items)
        assert body["index"]["ready"] is True


# --- exports ------------------------------------------------------------------------------


def jsonl(data: bytes) -> list[dict[str, Any]]:
    rows = list(iter_lines(data))
    assert all(isinstance(r, dict) for r in rows)
    return rows


def test_direct_exports_in_every_kind_of_format(admin: httpx.Client) -> None:
    response = admin.get("export", params={"source": "evaluator", "format": "trajectory"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    assert "acme-bot-evaluator-trajectory.jsonl" in response.headers["content-disposition"]
    rows = jsonl(response.content)
    assert len(rows) == TRACES
    assert {r["trace_id"] for r in rows} == {f"tr-{n:03d}" for n in range(TRACES)}

    response = admin.get("export", params={"source": "evaluator", "format": "prompt_completion",
                                           "passed": "true"})  # fmt: skip
    rows = jsonl(response.content)
    assert rows
    assert all(
        set(r) == {"prompt", "completion", "reward", "passed", "trace_id"} and r["passed"]
        for r in rows
    )

    response = admin.get(
        "export",
        params={
            "source": "evaluator",
            "format": "csv",
            "columns": "trace_id:id,reward,scenario:kind",
        },
    )
    assert response.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(response.text)))
    assert len(table) == TRACES
    assert list(table[0]) == ["id", "reward", "kind"]

    response = admin.get("export", params={"source": "evaluator", "format": "parquet",
                                           "scenario": "trip"})  # fmt: skip
    assert response.headers["content-type"] == "application/vnd.apache.parquet"
    assert pq.read_table(io.BytesIO(response.content)).num_rows == 2


def test_the_preview_follows_format_and_filters(admin: httpx.Client) -> None:
    params = {"source": "evaluator", "limit": 3}
    trajectories = admin.get("records", params=params).json()["items"]
    assert len(trajectories) == 3
    assert "messages" in trajectories[0]
    rows = admin.get("records", params=params | {"format": "prompt_completion"}).json()["items"]
    assert set(rows[0]) == {"prompt", "completion", "reward", "passed", "trace_id"}
    table = admin.get(
        "records", params=params | {"format": "csv", "columns": "trace_id:id,rubric.safety"}
    ).json()
    assert table["columns"] == ["id", "rubric.safety"]
    assert set(table["items"][0]) == {"id", "rubric.safety"}
    trip = admin.get("records", params=params | {"scenario": "trip"}).json()["items"]
    assert {r["scenario"] for r in trip} == {"trip"}


def test_an_export_job_goes_from_processing_to_ready_with_a_file_that_parses(
    admin: httpx.Client,
) -> None:
    response = admin.post("exports", json={"source": "evaluator", "format": "messages",
                                           "filters": {"passed": "true"}})  # fmt: skip
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["status"] == "processing"
    assert job["progress"] == 0
    seen = {job["status"]}

    def finished() -> dict[str, Any] | None:
        status = admin.get(f"exports/{job['id']}").json()
        seen.add(status["status"])
        return status if status["status"] != "processing" else None

    done = wait_for("the job to finish", finished, every_s=0.1)
    assert done["status"] == "ready", done
    assert done["progress"] == 1.0
    assert done["download"].endswith(f"/exports/{job['id']}/download")
    response = httpx.get(str(admin.base_url.join(done["download"])), headers=admin.headers)
    assert response.status_code == 200
    assert "acme-bot-evaluator-messages.jsonl" in response.headers["content-disposition"]
    rows = jsonl(response.content)
    assert len(rows) == done["records"] == 6  # tr-006 .. tr-011 passed
    assert all(set(r) == {"messages"} for r in rows)


def test_a_job_that_matches_nothing_is_an_empty_file_and_a_failed_one_says_why(
    stack: Stack, admin: httpx.Client
) -> None:
    def finish(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
        response = client.post("exports", json=body)
        assert response.status_code == 202, response.text
        job_id = response.json()["id"]

        def done() -> dict[str, Any] | None:
            status = client.get(f"exports/{job_id}").json()
            return status if status["status"] != "processing" else None

        found: dict[str, Any] = wait_for("the job to finish", done, every_s=0.1)
        return found

    empty = finish(admin, {"source": "human", "format": "trajectory",
                           "filters": {"scenario": "none"}})  # fmt: skip
    assert empty["status"] == "ready"
    assert empty["records"] == 0
    assert admin.get(empty["download"].split("/bot/", 1)[1]).content == b""
    # acme/other has no corpus at all: the job fails, and says so.
    with stack.web.client(stack.tokens["other"], project="other") as other:
        failed = finish(other, {"source": "human", "format": "csv"})
        assert failed["status"] == "failed"
        assert "no data for acme/other/human" in failed["error"]
        assert failed["download"] is None
        assert_error(other.get(f"exports/{failed['id']}/download"), 404, "not_found", "failed")


def weights_by_trace(rows: list[dict[str, Any]]) -> dict[str, list[int | None]]:
    """The weights of each ``messages`` row, by the trace its tool call names (call_<n>)."""
    return {
        f"tr-{int(r['messages'][2]['tool_calls'][0]['id'].split('_')[1]):03d}":
        [m.get("weight") for m in r["messages"]]
        for r in rows if len(r["messages"]) > 2 and r["messages"][2].get("tool_calls")
    }  # fmt: skip


def test_turn_masks_and_rl_prompts_in_exports_previews_and_jobs(admin: httpx.Client) -> None:
    params = {"source": "evaluator", "format": "messages", "mask_failed_turns": "true"}
    response = admin.get("export", params=params)
    assert response.status_code == 200, response.text
    weights = weights_by_trace(jsonl(response.content))
    assert weights["tr-007"] == [None, None, 1, None, 1, None, 0]  # its second turn failed
    assert weights["tr-008"] == [None, None, 1, None, 1, None, 1]  # turn 9: outside
    assert all(w == [None, None, 1, None, 1, None, 1] for t, w in weights.items()
               if t != "tr-007")  # fmt: skip
    preview = admin.get("records", params=params | {"limit": 20}).json()["items"]
    assert weights_by_trace(preview) == weights
    only_tone = admin.get("export", params=params | {"mask_types": "tone"})
    assert weights_by_trace(jsonl(only_tone.content))["tr-007"][-1] == 1
    for bad, needle in (
        ({"format": "kto"}, "mask_failed_turns: only applies"),
        ({"mask_failed_turns": "maybe"}, "mask_failed_turns"),
        ({"mask_failed_turns": "false", "mask_types": "tone"}, "mask_types: only applies"),
        ({"file": "parquet"}, "mask-failed-turns: verl's Parquet messages have no weight"),
        (
            {"format": "kto", "file": "parquet", "mask_failed_turns": "false"},
            "file: parquet files are for rl_prompts and messages",
        ),
        ({"format": "rl_prompts", "file": "xml"}, "file"),
    ):
        for route in ("export", "records"):
            if route == "records" and "file" in bad:
                continue  # a preview is rows, not a file
            assert_error(admin.get(route, params=params | bad), 422, "invalid", needle)

    response = admin.get("export", params={"source": "evaluator", "format": "rl_prompts",
                                           "file": "parquet", "passed": "false"})  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/vnd.apache.parquet"
    assert "acme-bot-evaluator-rl_prompts.parquet" in response.headers["content-disposition"]
    table = pq.read_table(io.BytesIO(response.content))
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model",
                                  "extra_info"]  # fmt: skip
    assert table.num_rows == 6  # tr-000 .. tr-005 failed

    def job(body: dict[str, Any]) -> dict[str, Any]:
        response = admin.post("exports", json={"source": "evaluator"} | body)
        assert response.status_code == 202, response.text
        job_id = response.json()["id"]

        def done() -> dict[str, Any] | None:
            status = admin.get(f"exports/{job_id}").json()
            return status if status["status"] != "processing" else None

        found: dict[str, Any] = wait_for("the job to finish", done, every_s=0.1)
        assert found["status"] == "ready", found
        return found

    masked = job({"format": "messages", "mask_failed_turns": True, "mask_types": ["tone"]})
    assert masked["turns_outside"] == 1  # tr-008's tone outcome, turn 9
    assert job({"format": "messages"})["turns_outside"] is None
    prompts = job({"format": "rl_prompts", "file": "parquet"})
    assert prompts["file_name"].endswith("-rl_prompts.parquet")
    download = admin.get(prompts["download"].split("/bot/", 1)[1])
    assert pq.read_table(io.BytesIO(download.content)).num_rows == prompts["records"] == TRACES
    assert_error(admin.post("exports", json={"source": "evaluator", "format": "kto",
                                             "mask_failed_turns": True}),
                 422, "invalid", "mask_failed_turns")  # fmt: skip


def test_chat_templates_in_exports_previews_and_jobs(admin: httpx.Client) -> None:
    """chat_template= names a built-in (or registered) template: the rows made for it, the
    ones it leaves out counted in X-RL-Export-Skipped and the job's status; a path, an
    unknown name or a format without messages is a 422 naming the parameter."""
    params = {"source": "evaluator", "format": "messages", "chat_template": "mistral_v03_tools"}
    response = admin.get("export", params=params)
    assert response.status_code == 200, response.text
    assert orjson.loads(response.headers["X-RL-Export-Skipped"]) == {}
    rows = jsonl(response.content)
    assert len(rows) == TRACES
    ids = [c["id"] for row in rows for m in row["messages"] for c in m.get("tool_calls") or []]
    assert ids
    assert all(len(i) == 9 and i.isalnum() for i in ids)  # what Mistral's template accepts
    assert not any(m["role"] == "system" for row in rows for m in row["messages"])  # merged
    dropping = admin.get("export", params=params | {"chat_template": "chatml"})
    assert dropping.status_code == 200, dropping.text
    left = orjson.loads(dropping.headers["X-RL-Export-Skipped"])
    assert left == {"drops tool calls": TRACES - len(jsonl(dropping.content))}
    preview = admin.get("records", params=params | {"format": "kto", "limit": 5})
    assert preview.status_code == 200, preview.text
    assert preview.json()["items"]
    assert "X-RL-Export-Skipped" in preview.headers
    for bad, needle in (
        ({"chat_template": "/etc/passwd"}, "chat_template: '/etc/passwd' is not a template name"),
        ({"chat_template": "nope"}, "chat_template: no chat template 'nope'"),
        ({"format": "trajectory"}, "chat_template: only applies to --format messages"),
        ({"chat_style": "openai"}, "chat_template: makes the messages"),
        ({"chat_template": "chatml", "on_unrenderable": "fail"}, "on-unrenderable: a messages row"),
    ):
        assert_error(admin.get("export", params=params | bad), 422, "invalid", needle)
    response = admin.post("exports", json={"source": "evaluator", "format": "prompt_completion",
                                           "chat_template": "chatml"})  # fmt: skip
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]

    def done() -> dict[str, Any] | None:
        status = admin.get(f"exports/{job_id}").json()
        return status if status["status"] != "processing" else None

    status: dict[str, Any] = wait_for("the job to finish", done, every_s=0.1)
    assert status["status"] == "ready", status
    assert status["adaptations"] == []
    assert status["unrenderable"] == {"drops tool calls": TRACES - status["records"]}


# --- instances share nothing but Kafka and the store --------------------------------------


def test_another_instance_hides_a_fresh_label_before_the_corpora_show_it(stack: Stack) -> None:
    # Its index reads the corpora every 30 s: only the labels topic can tell it in time.
    other = WebProcess(stack.settings, "web-2", RL_EXPORT_WEB_INDEX_POLL_S="30").start()
    try:
        with other.client(stack.tokens["queue"]) as there, \
                stack.web.client(stack.tokens["queue"]) as here:  # fmt: skip
            assert "tr-005" in queue_ids(there)
            assert here.post("labels", json={"trace_id": "tr-005", "rubric": RUBRIC}
                             ).status_code == 202  # fmt: skip
            wait_for(
                "the other instance to hide the label",
                lambda: "tr-005" not in queue_ids(there),
                timeout_s=5,
                every_s=0.1,
            )
    finally:
        other.stop()


def test_a_broker_that_is_down_is_a_503_and_records_nothing(stack: Stack) -> None:
    dead = f"127.0.0.1:{free_port()}"
    other = WebProcess(stack.settings, "web-3", RL_EXPORT_KAFKA_BOOTSTRAP=dead,
                       RL_EXPORT_WEB_PUBLISH_TIMEOUT_S="3").start()  # fmt: skip
    try:
        with other.client(stack.tokens["labeler"]) as dee:
            assert dee.get("stats", params={"source": "human"}).status_code == 200
            wait_for(
                "the traces in the other index", lambda: dee.get("queue").json()["remaining"] > 0
            )
            started = time.monotonic()
            response = dee.post("labels", json={"trace_id": "tr-007", "rubric": RUBRIC})
            assert_error(response, 503, "unavailable", dead, "did not acknowledge", "retry")
            assert time.monotonic() - started < 20
            assert "tr-007" in queue_ids(dee)  # nothing was noted either
    finally:
        other.stop()
    time.sleep(2)
    assert "dee" not in latest(stack, "traces")["tr-007"]["labelers"]


# --- metrics ------------------------------------------------------------------------------


def test_metrics_count_requests_by_route_and_report_the_index(
    stack: Stack, admin: httpx.Client
) -> None:
    admin.get("stats", params={"source": "evaluator"})
    with stack.web.client() as anonymous:
        assert anonymous.get("queue").status_code == 401
    text = stack.web.metrics()
    assert ('rl_export_web_requests_total{method="GET",route="/api/v1/{org}/{project}/stats",'
            'status="200"}') in text  # fmt: skip
    assert 'rl_export_web_request_duration_seconds_bucket{le="0.1",method="GET",' in text
    assert 'rl_export_web_index_records{corpus="evaluator"} 12.0' in text
    assert 'rl_export_web_index_lag_seconds{corpus="traces"}' in text
    assert 'rl_export_web_auth_failures_total{reason="missing"}' in text
    assert "tr-0" not in text
    assert "rlx_" not in text


def test_nothing_logged_holds_a_token(stack: Stack) -> None:
    log = stack.web.log_path.read_text()
    assert "GET /api/v1/acme/bot/stats" in log  # the access log is on in these tests
    for token in stack.tokens.values():
        parts = split_token(token)
        assert parts is not None
        assert token not in log
        assert parts[1] not in log  # the secret


def test_the_jsonl_exports_are_strict(admin: httpx.Client) -> None:
    data = admin.get("export", params={"source": "traces", "format": "trajectory"}).content
    assert data.endswith(b"\n")
    for line in data.splitlines():
        assert orjson.loads(line)
        assert b"\n" not in line


# --- redaction ----------------------------------------------------------------------------

KEY, MAIL, PHONE = "AKIAIOSFODNN7EXAMPLE", "jane.doe@acme-corp.com", "(415) 555-2671"


def redactions(response: httpx.Response) -> dict[str, int]:
    counts: dict[str, int] = orjson.loads(response.headers["x-rl-export-redactions"])
    return counts


def test_the_preview_redacts_secrets_by_default_and_says_what_it_removed(
    admin: httpx.Client, stack: Stack
) -> None:
    params = {"source": "evaluator", "scenario": "trip", "limit": 5}
    default = admin.get("records", params=params)
    assert default.status_code == 200, default.text
    assert redactions(default) == {"secrets": 1}
    body = default.text
    assert KEY not in body
    assert "[REDACTED:SECRETS]" in body
    assert MAIL in body  # personal data only when asked for

    everything = admin.get("records", params=params | {"redact": "all", "format": "messages"})
    assert redactions(everything) == {
        "secrets": 1, "email": 1, "phone": 1, "credit_card": 0, "iban": 0, "ip": 0}  # fmt: skip
    assert all(v not in everything.text for v in (KEY, MAIL, PHONE))
    with stack.web.client(stack.tokens["raw"]) as raw:  # less than the default needs raw
        table = raw.get("records", params=params | {"redact": "email", "format": "csv",
                                                    "columns": "trace_id,messages"})  # fmt: skip
        assert redactions(table) == {"email": 1}
        assert MAIL not in table.text
        assert KEY in table.text  # only the kinds asked for

        verbatim = raw.get("records", params=params | {"redact": "none"})
        assert redactions(verbatim) == {}
        assert KEY in verbatim.text


def test_direct_exports_redact_in_every_format_and_count_in_the_header(
    admin: httpx.Client, stack: Stack
) -> None:
    params = {"source": "evaluator", "scenario": "trip", "redact": "pii,secrets"}
    for fmt in ("trajectory", "messages", "executions", "csv", "json"):
        response = admin.get("export", params=params | {"format": fmt})
        assert response.status_code == 200, response.text
        assert redactions(response)["email"] == 1, fmt
        assert redactions(response)["secrets"] == 1, fmt
        assert all(v not in response.text for v in (KEY, MAIL, PHONE)), fmt
    parquet = admin.get("export", params=params | {"format": "parquet"})
    table = pq.read_table(io.BytesIO(parquet.content)).to_pylist()
    assert all(v not in str(table) for v in (KEY, MAIL, PHONE))
    with stack.web.client(stack.tokens["raw"]) as raw:
        verbatim = raw.get("export", params={"source": "evaluator", "scenario": "trip",
                                             "format": "trajectory", "redact": "none"})  # fmt: skip
    assert "x-rl-export-redactions" not in verbatim.headers
    assert KEY in verbatim.text
    assert MAIL in verbatim.text


def test_an_unknown_kind_is_a_422_naming_redact(admin: httpx.Client) -> None:
    for path, params in (("export", {}), ("records", {})):
        response = admin.get(path, params={"source": "evaluator", "redact": "secrets,emails"}
                             | params)  # fmt: skip
        assert_error(response, 422, "invalid", "redact", "'emails'")
    response = admin.post("exports", json={"source": "evaluator", "format": "messages",
                                           "redact": ["passwords"]})  # fmt: skip
    assert_error(response, 422, "invalid", "redact", "'passwords'")


def test_a_job_reports_its_redactions_and_the_metric_counts_them(
    stack: Stack, raw: httpx.Client
) -> None:
    body = {"source": "evaluator", "format": "trajectory", "filters": {"scenario": "trip"},
            "redact": "pii"}  # fmt: skip
    admin = raw  # pii without secrets is less than the default: a token with raw

    def counted() -> dict[str, float]:
        text = stack.web.metrics()
        return {kind: float(next(
            (x for x in text.splitlines()
             if x.startswith(f'rl_export_redactions_total{{kind="{kind}"}}')), "0 0").split()[-1])
            for kind in ("email", "phone")}  # fmt: skip

    before = counted()  # other tests on this stack count theirs too
    response = admin.post("exports", json=body)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]

    def finished() -> dict[str, Any] | None:
        status = admin.get(f"exports/{job_id}").json()
        return status if status["status"] != "processing" else None

    done = wait_for("the job to finish", finished, every_s=0.1)
    assert done["status"] == "ready", done
    assert done["redactions"] == {
        "email": 1, "phone": 1, "credit_card": 0, "iban": 0, "ip": 0}  # fmt: skip
    data = admin.get(done["download"].split("/bot/", 1)[1]).text
    assert MAIL not in data
    assert PHONE not in data
    assert KEY in data  # secrets were not asked for

    after = counted()  # this job's, and those of any other test's exports meanwhile
    assert all(after[kind] >= before[kind] + 1 for kind in ("email", "phone")), (before, after)


def test_splits_dedup_and_metadata_in_direct_exports_previews_and_jobs(
    stack: Stack, admin: httpx.Client
) -> None:
    splits = "train=0.5,eval=0.3,test=0.2"
    got: dict[str, set[str]] = {}
    for name in ("train", "eval", "test"):
        response = admin.get("export", params={"source": "evaluator", "split": name,
                                               "splits": splits, "dedup": "exact"})  # fmt: skip
        assert response.status_code == 200, response.text
        assert response.headers["x-rl-export-duplicates-removed"] == "0"  # no two alike
        got[name] = {r["trace_id"] for r in jsonl(response.content)}
    assert sum(len(v) for v in got.values()) == TRACES
    assert set().union(*got.values()) == {f"tr-{n:03d}" for n in range(TRACES)}
    assert_error(admin.get("export", params={"source": "evaluator", "split": "dev",
                                             "splits": splits}),
                 422, "invalid", "split: 'dev' is not one of --splits")  # fmt: skip
    assert_error(admin.get("export", params={"source": "evaluator", "dedup": "near",
                                             "dedup_threshold": "1.5"}),
                 422, "invalid", "dedup_threshold: '1.5' is outside (0, 1]")  # fmt: skip
    # Metadata: the index holds none, so stats and the preview read the corpus itself.
    assert_error(admin.get("stats", params={"source": "evaluator", "metadata": "tier"}), 422,
                 "invalid", "metadata: expected KEY=VALUE")  # fmt: skip
    params = {"source": "evaluator", "metadata": "tier=gold"}
    assert admin.get("stats", params=params).json()["records"] == 0
    assert admin.get("records", params=params).json()["items"] == []
    rows = jsonl(admin.get("export", params={"source": "evaluator"}).content)
    assert all(r["metadata"] == {} for r in rows)  # the seeded traces have none
    # A job: what the dedup removed in its status, its lineage beside its file.
    response = admin.post("exports", json={"source": "evaluator", "format": "messages",
                                           "split": "train", "splits": splits,
                                           "dedup": "near", "dedup_threshold": 0.9})  # fmt: skip
    assert response.status_code == 202, response.text
    job = response.json()
    done = wait_for("the job", lambda: (s := admin.get(f"exports/{job['id']}").json())[
        "status"] != "processing" and s, every_s=0.1)  # fmt: skip
    assert done["status"] == "ready", done
    assert done["duplicates_removed"] == 0
    assert done["split_left_out"] == TRACES - len(got["train"])
    assert done["records"] == len(got["train"])

    async def manifest() -> dict[str, Any]:
        store = open_store(stack.settings.store_url)
        try:
            prefix = f"_exports/acme/bot/{job['id']}/"
            keys = await store.list(prefix)
            (key,) = [k for k in keys if k.endswith(".manifest.json")]
            return orjson.loads(await store.get(key))  # type: ignore[no-any-return]
        finally:
            await store.close()

    lineage = asyncio.run(manifest())
    assert lineage["split"]["name"] == "train"
    assert lineage["dedup"] == {"mode": "near", "on": "conversation", "threshold": 0.9}
    assert lineage["rows"] == done["records"]
    assert_error(admin.post("exports", json={"source": "evaluator", "format": "messages",
                                             "split": "train"}),
                 422, "invalid", "splits: --split needs --splits")  # fmt: skip
