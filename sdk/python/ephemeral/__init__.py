"""ephemeral: a client of the ephemeral API (standard library only, Python 3.9+).

    from ephemeral import Client, shown
    client = Client(url, api_key)          # or $EPHEMERAL_URL, $EPHEMERAL_API_KEY
    run = client.runs.create(request, wait=120)
    for event in client.runs.events(run.id):
        print(shown(event.text))          # escape sequences shown, never run by the terminal

`python -m ephemeral run request.json` prints the timeline as `ephemeral run` does.
"""

from .client import Client, Event, Run, Runs
from .errors import (ApiError, AuthenticationError, ConflictError, ConnectionError_,
                     EphemeralError, IdempotencyError, InsufficientBalanceError,
                     InternalError, InvalidRequestError, MethodNotAllowedError,
                     NotFoundError, PayloadTooLargeError, RateLimitError,
                     UnavailableError, UnsupportedMediaTypeError)
from .text import shown
from .webhooks import WebhookSignatureError, verify_webhook

__version__ = "0.1.0"
__all__ = [
    "Client", "Event", "Run", "Runs", "ApiError", "AuthenticationError", "ConflictError",
    "ConnectionError_", "EphemeralError", "IdempotencyError", "InsufficientBalanceError",
    "InternalError", "InvalidRequestError", "MethodNotAllowedError", "NotFoundError",
    "PayloadTooLargeError", "RateLimitError", "UnavailableError",
    "UnsupportedMediaTypeError", "WebhookSignatureError", "shown", "verify_webhook",
]
