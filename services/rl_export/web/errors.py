"""Errors the HTTP API answers with: each is a status code and a JSON ``{error, detail}``.

Hierarchy::

    ApiError              base: ``status``, ``error`` (a short code), ``detail`` (for people)
    ├── Unauthorized      401 a missing, malformed, unknown or revoked token
    │   └── TokenExpired  401 a token past its expiry (``token_expired``)
    ├── Forbidden         403 a token of another org/project, or without the route's scope
    │   └── RawRequired   403 a redaction weaker than the project's default without ``raw``
    ├── NotFound          404 an unknown trace, job or route
    ├── Conflict          409 the request cannot be granted as things stand (every place of
    │                         a trace is held)
    ├── Invalid           422 a body or parameter the API cannot accept
    ├── TooLarge          413 a request body over the limit
    ├── ClientGone        499 the client disconnected before the answer started (never seen)
    ├── TooMany           429 the caller is over its share of export work (``retry_after_s``)
    └── Unavailable       503 the broker or the object store did not answer; nothing was done
"""

from __future__ import annotations


class ApiError(Exception):
    """An answer other than success; never carries a token or a secret."""

    status = 500
    error = "internal"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class Unauthorized(ApiError):
    status = 401
    error = "unauthorized"


class TokenExpired(Unauthorized):
    error = "token_expired"


class Forbidden(ApiError):
    status = 403
    error = "forbidden"


class RawRequired(Forbidden):
    error = "raw_required"


class NotFound(ApiError):
    status = 404
    error = "not_found"


class Conflict(ApiError):
    status = 409
    error = "conflict"


class Invalid(ApiError):
    status = 422
    error = "invalid"


class TooLarge(ApiError):
    status = 413
    error = "too_large"


class Unavailable(ApiError):
    status = 503
    error = "unavailable"


class TooMany(ApiError):
    status = 429
    error = "too_many_requests"

    def __init__(self, detail: str, retry_after_s: int, kind: str) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s
        self.kind = kind  # what the caller has too much of (a metric label): exports, jobs


class ClientGone(ApiError):
    status = 499  # nginx's "client closed request": only the access log and metrics see it
    error = "client_closed_request"
