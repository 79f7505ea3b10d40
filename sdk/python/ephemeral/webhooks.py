"""Verifying the signature of a webhook delivery from ephemeral.

Each delivery carries `Ephemeral-Signature: t=UNIX_SECONDS,v1=HEX`, HEX being the
HMAC-SHA256 of "<t>.<raw body>" keyed with the endpoint's secret (returned once by
POST /v1/webhooks). Verify the raw bytes as received, before parsing the JSON.
"""

import hashlib
import hmac
import time
from typing import Optional, Union

from .errors import EphemeralError


class WebhookSignatureError(EphemeralError):
    """The delivery is not signed by the endpoint's secret, or is too old."""


def verify_webhook(secret: str, header: Optional[str], body: Union[bytes, str],
                   tolerance_s: int = 300, now: Optional[float] = None) -> None:
    """Raises WebhookSignatureError unless `header` (the Ephemeral-Signature value) signs
    `body` with `secret` at a time within `tolerance_s` seconds of `now` (default: the
    clock). A header may carry several v1= values (secret rotation): one must match."""
    if not header:
        raise WebhookSignatureError("missing Ephemeral-Signature header")
    if isinstance(body, str):
        body = body.encode("utf-8")
    t = None
    sigs = []
    for part in header.split(","):
        k, _, v = part.strip().partition("=")
        if k == "t" and v.isdigit():
            t = int(v)
        elif k == "v1":
            sigs.append(v)
    if t is None or not sigs:
        raise WebhookSignatureError("malformed Ephemeral-Signature header")
    if now is None:
        now = time.time()
    if abs(now - t) > tolerance_s:
        raise WebhookSignatureError(
            "signature timestamp %d is more than %d s from now" % (t, tolerance_s))
    expected = hmac.new(secret.encode("utf-8"), str(t).encode("ascii") + b"." + body,
                        hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(expected, s) for s in sigs):
        raise WebhookSignatureError("signature does not match")
