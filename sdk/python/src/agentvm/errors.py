"""Typed errors.

Every non-2xx answer of the API carries ``{"error": {"code", "message"}}``;
the code is kept as is and picks the subclass, so callers can test either
``err.code == "not_found"`` or ``isinstance(err, NotFound)``.
"""

from __future__ import annotations

import json


class AgentVMError(Exception):
    """An error from the agentvm API, or from reaching it (status 0)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        #: HTTP status; 0 when no HTTP answer was received.
        self.status = status
        #: The API's error code (``not_found``, ``conflict``...), or the SDK's
        #: own: ``connection_failed``, ``http`` (an answer that is not the
        #: API's error JSON), ``stream_lost`` (a stream that ended early).
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, code={self.code!r}, message={self.message!r})"


class InvalidArgument(AgentVMError):
    """400 invalid_argument."""


class Unauthorized(AgentVMError):
    """401: a missing or invalid token."""


class Forbidden(AgentVMError):
    """403 forbidden or permission_denied."""


class NotFound(AgentVMError):
    """404 not_found."""


class Conflict(AgentVMError):
    """409 conflict (and the file codes exists, not_empty, is_directory, not_directory)."""


class TooManyRequests(AgentVMError):
    """429: a token holds too many connections at once."""


class InternalError(AgentVMError):
    """500 internal."""


class Unavailable(AgentVMError):
    """503 unavailable (and 502 for a lost buffered exec stream)."""


class InsufficientStorage(AgentVMError):
    """507 insufficient_storage or no_space."""


class ConnectionFailed(AgentVMError):
    """The server could not be reached (status 0, code connection_failed)."""


class StreamLost(AgentVMError):
    """A stream (exec, terminal, events) ended before what it carried did."""

    def __init__(self, message: str) -> None:
        super().__init__(0, "stream_lost", message)


_BY_CODE: dict[str, type[AgentVMError]] = {
    "invalid_argument": InvalidArgument,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "permission_denied": Forbidden,
    "not_found": NotFound,
    "conflict": Conflict,
    "exists": Conflict,
    "not_empty": Conflict,
    "is_directory": Conflict,
    "not_directory": Conflict,
    "state_incompatible": Conflict,
    "too_many_requests": TooManyRequests,
    "unavailable": Unavailable,
    "insufficient_storage": InsufficientStorage,
    "no_space": InsufficientStorage,
    "internal": InternalError,
}

_BY_STATUS: dict[int, type[AgentVMError]] = {
    400: InvalidArgument,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    429: TooManyRequests,
    500: InternalError,
    502: Unavailable,
    503: Unavailable,
    507: InsufficientStorage,
}


def api_error(status: int, code: str, message: str) -> AgentVMError:
    """The typed error for an HTTP status and an API error code."""
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status) or AgentVMError
    return cls(status, code, message)


def error_from_body(status: int, body: str) -> AgentVMError:
    """Decodes an error answer's body (the API's JSON, or any text)."""
    try:
        e = json.loads(body).get("error")
        if isinstance(e, dict) and isinstance(e.get("message"), str) and e["message"]:
            code = e.get("code") if isinstance(e.get("code"), str) else "http"
            return api_error(status, code, e["message"])
    except (ValueError, AttributeError):
        pass
    return api_error(status, "http", body.strip() or f"HTTP {status}")
