"""The FastAPI application: routes, error answers, the body limit and request metrics.

Every error is JSON ``{error, detail}`` (:class:`~rl_export.web.models.ErrorOut`) with the
status of docs/concepts/web-service.md; bad input of any kind is a 4xx, never a 500: a body over
``web_max_body_bytes`` is 413 before it is read, a body or parameter that does not validate
is 422 naming the field (a query parameter the route does not know included), and a broker
or store that does not answer is 503. Every response carries the security headers of
docs/concepts/web-service.md (:class:`SecurityHeaders`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rl_export import __version__
from rl_export.model.errors import ConfigError, StoreError
from rl_export.runtime.metrics import WebMetrics
from rl_export.runtime.net import parse_networks
from rl_export.web.api.routes import (
    agreement,
    caller,
    compare,
    export,
    jobs,
    label,
    review,
    rubric,
    trainingset,
    versions,
    workspace,
)
from rl_export.web.errors import ApiError, Invalid, TooMany
from rl_export.web.models import ErrorOut
from rl_export.web.pages import router as pages_router
from rl_export.web.pages import static_files
from rl_export.web.proxies import TrustedProxies
from rl_export.web.services import Services

log = logging.getLogger(__name__)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "A missing, unknown or revoked token."},
    403: {
        "model": ErrorOut,
        "description": "A token of another org/project or scope (raw_required: less "
        "redaction than the default without the raw scope).",
    },
    404: {"model": ErrorOut, "description": "An unknown trace or job."},
    413: {"model": ErrorOut, "description": "A request body over the limit."},
    422: {"model": ErrorOut, "description": "A body or parameter that cannot be accepted."},
    429: {
        "model": ErrorOut,
        "description": "Over the caller's share of export work; retry after `Retry-After` s.",
    },
    503: {"model": ErrorOut, "description": "The broker or the store did not answer."},
}


def _error(status: int, error: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


def _validation_detail(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            message = "is not a field of this request"
            if where.endswith("labeler"):
                message += " (the labeler is always the token's subject)"
        parts.append(f"{where}: {message}")
    return "; ".join(parts) or "invalid request"


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with 413, by Content-Length or while reading."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = _error(413, "too_large", f"the request body is over {self.limit} bytes")
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.limit:
                    await too_large(scope, receive, send)
                    return
        seen = 0
        started = False

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLarge(self.limit)
            return message

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited, watch)
        except _BodyTooLarge:
            if not started:
                await too_large(scope, receive, send)


class _BodyTooLarge(StarletteHTTPException):
    """Raised while the body is read (FastAPI lets HTTP exceptions from there through)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over {limit} bytes")


CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
"""The pages hold an API token: no injected or inline script may run (only the page's own
file), and no other site may frame them. Sent with every response, pages or not."""

SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
]


class SecurityHeaders:
    """Add :data:`SECURITY_HEADERS` to every HTTP response (docs/concepts/web-service.md)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(n, v) for n, v in SECURITY_HEADERS if n not in names]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, secured)


def known_query(dependant: Dependant) -> frozenset[str]:
    """The query parameters a route declares, its dependencies' included (by alias)."""
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= known_query(sub)
    return frozenset(names)


async def refuse_unknown_query(request: Request) -> None:
    """422 for a query parameter the route does not know (docs/concepts/web-service.md): a
    misspelled filter must never export unfiltered data."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    cached = _KNOWN.get(id(route))
    if cached is not None and cached[0] is route:
        known = cached[1]
    else:
        known = known_query(route.dependant)
        _KNOWN[id(route)] = (route, known)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        names = ", ".join(sorted(known)) or "none"
        raise Invalid(f"{unknown[0]}: unknown query parameter (this route takes: {names})")


# By id: routes are not hashable (starlette >= 1.0); the route is kept to check the id's owner.
_KNOWN: dict[int, tuple[APIRoute, frozenset[str]]] = {}


class RequestMetrics:
    """Count and time requests by route template (``other`` when no route matched)."""

    def __init__(self, app: ASGIApp, metrics: WebMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "other"
            method = scope.get("method", "GET")
            self.metrics.requests.labels(template, method, str(status)).inc()
            self.metrics.latency.labels(template, method).observe(time.perf_counter() - began)


def create_app(services: Services) -> FastAPI:
    """The application over a services container (started and stopped with the app)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await services.start()
        try:
            yield
        finally:
            await services.stop()

    app = FastAPI(
        title="rl-export",
        version=__version__,
        summary="Label trajectories and export evaluator-scored traces for fine-tuning and RLHF.",
        openapi_url="/api/v1/openapi.json",
        docs_url=None,  # Swagger UI loads from a CDN: the document itself is enough
        redoc_url=None,
        lifespan=lifespan,
        responses=ERROR_RESPONSES,
        dependencies=[Depends(refuse_unknown_query)],
    )
    app.state.services = services
    app.include_router(export.router)
    app.include_router(jobs.router)
    app.include_router(label.router)
    app.include_router(agreement.router)
    app.include_router(caller.router)
    app.include_router(versions.router)
    app.include_router(rubric.router)
    app.include_router(workspace.router)
    app.include_router(review.router)
    app.include_router(compare.router)
    app.include_router(trainingset.router)
    app.include_router(pages_router)
    app.mount("/static", static_files(), name="static")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        answer = _error(exc.status, exc.error, exc.detail)
        if isinstance(exc, TooMany):
            services.metrics.throttled.labels(exc.kind).inc()
            answer.headers["Retry-After"] = str(exc.retry_after_s)
        return answer

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, "invalid", _validation_detail(exc))

    @app.exception_handler(ConfigError)
    async def bad_parameter(request: Request, exc: ConfigError) -> JSONResponse:
        return _error(422, "invalid", str(exc))

    @app.exception_handler(StoreError)
    async def store_down(request: Request, exc: StoreError) -> JSONResponse:
        log.error("store error on %s: %s", request.url.path, exc)
        return _error(503, "unavailable", "the object store did not answer; retry")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        names = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
        return _error(exc.status_code, names.get(exc.status_code, "http_error"), str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _error(500, "internal", "an unexpected error (logged on the server)")

    app.add_middleware(BodyLimit, limit=services.settings.web_max_body_bytes)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(RequestMetrics, metrics=services.metrics)
    # Outermost: every layer, and the access log, sees the client behind a listed proxy.
    trusted = parse_networks(services.settings.web_trusted_proxies)
    app.add_middleware(TrustedProxies, trusted=trusted)
    return app
