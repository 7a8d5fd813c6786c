"""The API's dependencies: the services, the caller (token, org/project, scope), the filters.

A route states what it needs in its signature: ``caller: LabelCaller`` checks the bearer token
(401), that it is for the path's org/project (403) and that it holds the ``label`` scope
(403), and gives the caller, whose subject is the labeler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Path, Query, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from rl_export.formats.filters import Filters, parse_filters
from rl_export.formats.specs import SAFE_NAME
from rl_export.index.follower import Followed
from rl_export.index.queryindex import BodiesGone, CorpusKey
from rl_export.model.errors import FilterError, StoreError
from rl_export.web.errors import (
    Forbidden,
    Invalid,
    TokenExpired,
    TooMany,
    Unauthorized,
    Unavailable,
)
from rl_export.web.models import IndexState
from rl_export.web.services import Services
from rl_export.web.tokens import EXPLICIT, Caller, Scope, TokenRejected

T = TypeVar("T")

_bearer = HTTPBearer(
    auto_error=False,
    description="An API token from `rl-export tokens create` (rlx_...).",
)

OrgPath = Annotated[str, Path(pattern=SAFE_NAME.pattern, description="The organisation.")]
ProjectPath = Annotated[str, Path(pattern=SAFE_NAME.pattern, description="The project.")]


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


Svc = Annotated[Services, Depends(services)]


async def caller(
    *,
    request: Request,
    org: OrgPath,
    project: ProjectPath,
    svc: Svc,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> Caller:
    """The token's caller, for this org/project; 401 or 403 otherwise.

    A token that verifies is served whatever its address did. Only unknown ones (an id with
    no record, a wrong secret, a malformed token, none at all) count against the client's
    address (``RL_EXPORT_WEB_TRUSTED_PROXIES`` says when it is not the peer); over its
    limit, its unknown tokens get 429, and whether an id is a token at all is then asked of
    the listing of token ids (one a second for every address together), never of the
    token's record, so a flood costs the store nothing per token and another address's
    tokens are not touched."""
    failures = svc.metrics.auth_failures
    limit = svc.auth_limit
    address = request.client.host if request.client is not None else "unknown"
    if credentials is None:
        failures.labels("missing").inc()
        limit.note(address)
        raise Unauthorized("a bearer token is required (Authorization: Bearer rlx_...)")
    token = credentials.credentials
    try:
        wait_s = limit.retry_after(address)
        if wait_s and not svc.tokens.known(token) and not await svc.tokens.listed(token):
            raise TokenRejected("unknown", "unknown token")
        found = await svc.tokens.verify(token)
    except TokenRejected as exc:
        if exc.reason in THROTTLED:
            wait_s = limit.retry_after(address)
            if wait_s:
                failures.labels("throttled").inc()
                raise TooMany(
                    f"too many requests with a missing or invalid token from your address; "
                    f"retry in {wait_s} s",
                    wait_s,
                    "auth",
                ) from None
            limit.note(address)
        failures.labels(exc.reason).inc()
        if exc.reason == "expired":
            raise TokenExpired(exc.detail) from None
        raise Unauthorized(exc.detail) from None
    except StoreError:
        raise Unavailable("the object store holding the tokens did not answer; retry") from None
    if (found.org, found.project) != (org, project):
        failures.labels("project").inc()
        raise Forbidden(f"this token is for {found.org}/{found.project}, not {org}/{project}")
    return found


THROTTLED = frozenset({"unknown", "malformed"})
"""The reasons a token is refused that count against its address's limit: it names no
token. A revoked or expired token is a known one: always its own 401."""


def check_scope(who: Caller, scope: Scope, svc: Services) -> Caller:
    """``who``, if it holds ``scope``; 403 naming the scope otherwise."""
    if not who.allows(scope):
        svc.metrics.auth_failures.labels("scope").inc()
        also = "" if scope in EXPLICIT else " (or admin)"
        raise Forbidden(
            f"this token has the scopes {', '.join(who.scopes)}; this needs {scope}{also}"
        )
    return who


def require(scope: Scope) -> Callable[..., Awaitable[Caller]]:
    async def check(who: Annotated[Caller, Depends(caller)], svc: Svc) -> Caller:
        return check_scope(who, scope, svc)

    return check


AnyCaller = Annotated[Caller, Depends(caller)]
"""A caller of this org/project whatever its scopes (the route checks the one it needs)."""
LabelCaller = Annotated[Caller, Depends(require("label"))]
ReviewCaller = Annotated[Caller, Depends(require("review"))]
ExportCaller = Annotated[Caller, Depends(require("export"))]
AdminCaller = Annotated[Caller, Depends(require("admin"))]

_Text = Annotated[str | None, Query()]


def filters(
    *,
    passed: Annotated[str | None, Query(description="true or false")] = None,
    min_reward: Annotated[str | None, Query(description="reward >= this (0..1)")] = None,
    max_reward: Annotated[str | None, Query(description="reward <= this (0..1)")] = None,
    pass_dimension: Annotated[
        list[str] | None,
        Query(description="Repeatable: every decided outcome of this report type is true."),
    ] = None,
    max_severity: Annotated[str | None, Query(description="Worst severity <= N")] = None,
    agent_version: _Text = None,
    scenario: _Text = None,
    since: Annotated[str | None, Query(description="updated_at >= (RFC 3339)")] = None,
    until: Annotated[str | None, Query(description="updated_at < (RFC 3339)")] = None,
    labeled: Annotated[str | None, Query(description="At least one human label")] = None,
    min_labels: Annotated[str | None, Query(description="At least N current human labels")] = None,
    max_spread: Annotated[
        str | None,
        Query(
            description="The largest difference between two labelers' rewards is at most "
            "this (0..1; one label: 0; records without `labels` and two or more labels: "
            "unknown, never match)"
        ),
    ] = None,
    metadata: Annotated[
        list[str] | None,
        Query(
            description="Repeatable KEY=VALUE: the trace's top-level metadata KEY equals "
            "VALUE (compared as text)"
        ),
    ] = None,
    limit: Annotated[str | None, Query(description="At most N records")] = None,
) -> Filters:
    """The filters of docs/guides/exports.md from the query string; 422 naming a bad one."""
    values: dict[str, str | list[str]] = {
        name: value
        for name, value in {
            "passed": passed, "min_reward": min_reward, "max_reward": max_reward,
            "pass_dimension": pass_dimension, "max_severity": max_severity,
            "agent_version": agent_version, "scenario": scenario, "since": since,
            "until": until, "labeled": labeled, "min_labels": min_labels,
            "max_spread": max_spread, "metadata": metadata, "limit": limit,
        }.items()
        if value is not None
    }  # fmt: skip
    try:
        return parse_filters(values)
    except FilterError as exc:
        raise Invalid(str(exc)) from None


FiltersQuery = Annotated[Filters, Depends(filters)]


async def corpus(svc: Services, org: str, project: str, name: str) -> Followed:
    """The corpus in this instance's index, after its first pass (or the wait's end)."""
    key = CorpusKey(org, project, name)
    return await svc.indexer.ready(key, svc.settings.web_index_wait_s)


def stamp(epoch: float) -> str:
    """An instant of the API's answers: UTC, milliseconds, ``Z``."""
    return (
        datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def index_state(followed: Followed, now: float) -> IndexState:
    return IndexState(
        ready=followed.passes > 0, lag_s=round(followed.lag_s(now), 3), indexed=followed.live,
        error=followed.error,
    )  # fmt: skip


async def query(fn: Callable[..., T], *args: Any) -> T:
    """Run an index query off the event loop; once more if a segment went away under it.
    A body whose store object expired is a 503 (the corpus is being read again)."""
    try:
        try:
            return await asyncio.to_thread(fn, *args)
        except FileNotFoundError:
            return await asyncio.to_thread(fn, *args)
    except BodiesGone as exc:
        raise Unavailable(f"{exc}; retry in a few seconds") from None
    except StoreError as exc:
        raise Unavailable(f"the object store did not answer ({exc}); retry") from None
