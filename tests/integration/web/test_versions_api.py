"""``GET/POST versions``, ``DELETE versions/{name}`` and ``version=`` on ``stats`` and
``export`` through a running stack (DESIGN.md sections 5 and 7): a version pinned through the
API reads the same bytes after new traffic; scopes, a name taken, an unknown version."""

from __future__ import annotations

import asyncio

import pytest

from rl_export.model.codec import loads
from tests.integration.web.conftest import Stack
from tests.integration.webproc import wait_for
from tests.integration.workers import publish
from tests.records import trace_events

pytestmark = pytest.mark.integration


def test_a_version_pinned_through_the_api_reads_the_same_bytes(stack: Stack) -> None:
    name = "api-v1"
    with stack.web.client(stack.tokens["admin"]) as admin, \
            stack.web.client(stack.tokens["export"]) as reader:  # fmt: skip
        refused = reader.post("versions", json={"corpus": "evaluator", "name": name})
        assert refused.status_code == 403
        made = admin.post("versions", json={"corpus": "evaluator", "name": name, "note": "api"})
        assert made.status_code == 201, made.text
        assert (made.json()["name"], made.json()["note"]) == (name, "api")
        taken = admin.post("versions", json={"corpus": "evaluator", "name": name})
        assert taken.status_code == 409
        assert "already exists" in taken.json()["detail"]
        odd = admin.post("versions", json={"corpus": "evaluator", "name": name, "x": 1})
        assert odd.status_code == 422
        listed = reader.get("versions", params={"corpus": "evaluator"}).json()["items"]
        assert name in [v["name"] for v in listed]
        everything = reader.get("versions").json()["items"]  # every corpus of the project
        assert (name, "evaluator") in [(v["name"], v["corpus"]) for v in everything]

        params = {"source": "evaluator", "format": "trajectory"}
        pinned = reader.get("export", params={**params, "version": name})
        assert pinned.status_code == 200, pinned.text
        counted = reader.get("stats", params={"source": "evaluator", "version": name}).json()
        assert counted["records"] == len(pinned.content.splitlines())

        # New traffic: the latest view moves, the version does not.
        before = reader.get("stats", params={"source": "evaluator"}).json()["records"]
        asyncio.run(publish(stack.settings, trace_events(90, score=0.5, passed=True)))
        wait_for("the new trace in the evaluator corpus", lambda: reader.get(
            "stats", params={"source": "evaluator"}).json()["records"] > before,
            timeout_s=120)  # fmt: skip
        again = reader.get("export", params={**params, "version": name})
        assert again.content == pinned.content
        assert reader.get("export", params=params).content != pinned.content
        # The preview and a background job read the version too.
        preview = reader.get("records", params={**params, "version": name, "limit": 3})
        assert preview.status_code == 200, preview.text
        assert preview.json()["items"] == [loads(line) for line in pinned.content.splitlines()[:3]]
        started = reader.post("exports", json={**params, "version": name})
        assert started.status_code == 202, started.text
        job = started.json()["id"]
        wait_for("the job", lambda: reader.get(f"exports/{job}").json()["status"] != "processing",
                 timeout_s=60)  # fmt: skip
        assert reader.get(f"exports/{job}").json()["status"] == "ready"
        assert reader.get(f"exports/{job}/download").content == pinned.content
        refused = reader.post("exports", json={**params, "version": "nope"})
        assert refused.status_code == 404
        assert reader.get("records", params={**params, "version": "nope"}).status_code == 404

        unknown = reader.get("export", params={**params, "version": "nope"})
        assert unknown.status_code == 404
        assert "no version 'nope'" in unknown.json()["detail"]
        assert reader.get("stats", params={"source": "evaluator", "version": "nope"}
                          ).status_code == 404  # fmt: skip
        assert reader.delete(f"versions/{name}", params={"corpus": "evaluator"}
                             ).status_code == 403  # fmt: skip
        gone = admin.delete(f"versions/{name}", params={"corpus": "evaluator"})
        assert gone.status_code == 200, gone.text
        assert admin.delete(f"versions/{name}", params={"corpus": "evaluator"}
                            ).status_code == 404  # fmt: skip
        assert admin.delete(f"versions/{name}").status_code == 422  # corpus is required
