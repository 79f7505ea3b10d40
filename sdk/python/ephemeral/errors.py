"""Typed errors of the ephemeral API.

Every refusal of the API is a JSON body {"error": {"type", "message", "field"}}; the client
raises the subclass of ApiError named by `type` (falling back on the HTTP status), carrying
the type, the field the API names (or None), the message and the status. A request that got
no answer at all raises ConnectionError_.
"""

from typing import Any, Dict, Optional


class EphemeralError(Exception):
    """The base of every error this package raises."""


class ConnectionError_(EphemeralError):
    """No HTTP answer: the daemon is unreachable or the connection dropped, after retries."""


class ApiError(EphemeralError):
    """An HTTP error answer of the API.

    status: the HTTP status (int); type: the API's error type ("invalid_request", ...);
    field: the request field or header at fault, or None; message: the API's text;
    retry_after: seconds from a Retry-After header, or None; body: the decoded JSON body.
    """

    def __init__(self, status: int, type: str, message: str, field: Optional[str] = None,
                 retry_after: Optional[float] = None, body: Any = None):
        super().__init__("%s (HTTP %d%s): %s" % (type, status,
                                                 ", field %s" % field if field else "", message))
        self.status = status
        self.type = type
        self.message = message
        self.field = field
        self.retry_after = retry_after
        self.body = body


class InvalidRequestError(ApiError):
    """400: the request is malformed or a field is invalid (see .field)."""


class AuthenticationError(ApiError):
    """401: no API key, or one the daemon does not know (or revoked)."""


class InsufficientBalanceError(ApiError):
    """402: the organisation's balance is below max_cost_micros."""


class NotFoundError(ApiError):
    """404: no such run (or it belongs to another organisation)."""


class MethodNotAllowedError(ApiError):
    """405: the route exists with other methods."""


class ConflictError(ApiError):
    """409: e.g. cancelling a run that has already ended."""


class PayloadTooLargeError(ApiError):
    """413: the body is larger than the daemon's max_body_bytes."""


class UnsupportedMediaTypeError(ApiError):
    """415: the body is not application/json."""


class IdempotencyError(ApiError):
    """422: the Idempotency-Key was used before with another body."""


class RateLimitError(ApiError):
    """429: the run queue is full; retry after .retry_after seconds."""


class InternalError(ApiError):
    """500: the daemon failed (see its log)."""


class UnavailableError(ApiError):
    """503: the daemon is draining or cannot take the run now (unavailable), is overloaded,
    or its storage is failing (storage_unavailable); .type tells which, .retry_after when."""


_BY_TYPE = {
    "invalid_request": InvalidRequestError,
    "authentication_error": AuthenticationError,
    "insufficient_balance": InsufficientBalanceError,
    "not_found": NotFoundError,
    "method_not_allowed": MethodNotAllowedError,
    "conflict": ConflictError,
    "payload_too_large": PayloadTooLargeError,
    "unsupported_media_type": UnsupportedMediaTypeError,
    "idempotency_error": IdempotencyError,
    "rate_limited": RateLimitError,
    "internal_error": InternalError,
    "unavailable": UnavailableError,
    "overloaded": UnavailableError,
    "storage_unavailable": UnavailableError,
}
_BY_STATUS = {
    400: InvalidRequestError, 401: AuthenticationError, 402: InsufficientBalanceError,
    404: NotFoundError, 405: MethodNotAllowedError, 409: ConflictError,
    413: PayloadTooLargeError, 415: UnsupportedMediaTypeError, 422: IdempotencyError,
    429: RateLimitError, 500: InternalError, 503: UnavailableError,
}


def from_response(status: int, body: Any, retry_after: Optional[float] = None) -> ApiError:
    """The typed error for an HTTP error answer (body: the decoded JSON, or None)."""
    err: Dict[str, Any] = {}
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
    etype = err.get("type") if isinstance(err.get("type"), str) else "http_%d" % status
    cls = _BY_TYPE.get(etype) or _BY_STATUS.get(status) or ApiError
    message = err.get("message") if isinstance(err.get("message"), str) else "HTTP %d" % status
    field = err.get("field") if isinstance(err.get("field"), str) else None
    return cls(status, etype, message, field, retry_after, body)
