"""Errors the HTTP API answers with: each is a status code and a JSON ``{error, detail}``.

Hierarchy::

    ApiError              base: ``status``, ``error`` (a short code), ``detail`` (for people)
    ├── Unauthorized      401 a missing, malformed, unknown or revoked token
    ├── Forbidden         403 a token of another org/project, or without the route's scope
    ├── NotFound          404 an unknown trace, job or route
    ├── Conflict          409 the request cannot be granted as things stand (every place of
    │                         a trace is held)
    ├── Invalid           422 a body or parameter the API cannot accept
    ├── TooLarge          413 a request body over the limit
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


class Forbidden(ApiError):
    status = 403
    error = "forbidden"


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
