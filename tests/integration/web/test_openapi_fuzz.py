"""Schemathesis against the running service: requests generated from the OpenAPI document
(valid and invalid ones) to every route never get a server error nor an answer that breaks
the document."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.integration.web.conftest import Stack

BASE = "/api/v1/{org}/{project}/"
# Every check but positive_data_acceptance, which expects any request the document allows to
# be accepted: filters are text parsed by the filters' own parser, and some rules cannot be
# written in OpenAPI (min_reward <= max_reward, since before until, a trace that exists).
EXCLUDED = [schemathesis.checks.positive_data_acceptance]
OPERATIONS = [
    ("GET", "stats"), ("GET", "records"), ("GET", "export"), ("POST", "exports"),
    ("GET", "exports"), ("GET", "exports/{job_id}"), ("GET", "exports/{job_id}/download"),
    ("GET", "queue"),
    ("POST", "queue/claim"), ("DELETE", "queue/claims/{trace_id}"), ("GET", "labeling"),
    ("PUT", "labeling"), ("POST", "labels"), ("POST", "skips"), ("DELETE", "labels/{trace_id}"),
    ("GET", "agreement"), ("GET", "whoami"), ("PUT", "queue/claims/{trace_id}"),
    ("GET", "versions"), ("POST", "versions"), ("DELETE", "versions/{name}"),
    ("GET", "rubric"), ("PUT", "rubric"), ("POST", "rubric/preview"), ("GET", "mylabels"),
    ("GET", "traces/{trace_id}"), ("GET", "review/queue"), ("POST", "review/claim"),
    ("DELETE", "review/claims/{trace_id}"), ("GET", "splits"),
    ("GET", "compare/queue"), ("POST", "compare/claim"), ("PUT", "compare/claims/{pair_id}"),
    ("DELETE", "compare/claims/{pair_id}"), ("POST", "comparisons"),
    ("DELETE", "comparisons/{pair_id}"), ("GET", "comparisons/ratings"),
]  # fmt: skip
# Changing acme/bot's labeling settings would change the other tests' queues, and its versions
# other tests' retention: an admin of a project of its own fuzzes them.
ADMIN_OF_ITS_OWN = {("PUT", "labeling"), ("POST", "versions"), ("DELETE", "versions/{name}"),
                    ("PUT", "rubric"), ("POST", "rubric/preview")}  # fmt: skip
TARGET = {"project": "bot"}


@pytest.fixture(scope="module")
def api_schema(stack: Stack) -> Any:
    schema = schemathesis.openapi.from_url(stack.web.base + "/api/v1/openapi.json")

    @schema.hook
    def map_path_parameters(context: Any, path: dict[str, Any] | None) -> dict[str, Any] | None:
        # Mostly the org/project the token is for, so requests get past the token check;
        # the others are answered 403 (tests/integration/web/test_api.py covers them).
        if path and "org" in path and len(str(path.get("project", ""))) % 4 != 0:
            path["org"], path["project"] = "acme", TARGET["project"]
        return path

    return schema


# pytest 9 and schemathesis's own pytest plugin (``from_fixture``) disagree on node ids, so
# each operation is one test that runs the operation's Hypothesis strategy itself.
@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_generated_requests_get_documented_answers(
    api_schema: Any, stack: Stack, method: str, path: str
) -> None:
    operation = api_schema[BASE + path][method]
    own = (method, path) in ADMIN_OF_ITS_OWN
    token = stack.tokens["other" if own else "fuzz"]
    TARGET["project"] = "other" if own else "bot"

    @given(case=operation.as_strategy())
    @settings(
        max_examples=30,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def check(case: Any) -> None:
        case.call_and_validate(
            headers={"Authorization": f"Bearer {token}"}, excluded_checks=EXCLUDED
        )

    check()


def test_every_route_of_the_document_is_fuzzed(api_schema: Any) -> None:
    documented = {
        (method.upper(), path.removeprefix(BASE))
        for path, item in api_schema.raw_schema["paths"].items()
        for method in item
        if method in ("get", "put", "post", "delete", "patch")
    }
    assert documented == set(OPERATIONS)
