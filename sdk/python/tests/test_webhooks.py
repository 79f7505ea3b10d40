"""verify_webhook: offline (no daemon needed); the live delivery is tests/webhooks.test."""

import hashlib
import hmac
import unittest

from ephemeral import WebhookSignatureError, verify_webhook

SECRET = "whsec_" + "ab" * 24
BODY = b'{"type":"run.ended","run":{"id":"run_1","status":"succeeded"}}'


def sign(secret, t, body):
    mac = hmac.new(secret.encode(), str(t).encode() + b"." + body, hashlib.sha256)
    return "t=%d,v1=%s" % (t, mac.hexdigest())


class VerifyWebhook(unittest.TestCase):
    def test_valid(self):
        verify_webhook(SECRET, sign(SECRET, 1000, BODY), BODY, 300, now=1010)

    def test_forged_secret_rejected(self):
        with self.assertRaises(WebhookSignatureError):
            verify_webhook(SECRET, sign("whsec_forged", 1000, BODY), BODY, 300, now=1000)

    def test_tampered_body_rejected(self):
        with self.assertRaises(WebhookSignatureError):
            verify_webhook(SECRET, sign(SECRET, 1000, BODY), BODY + b" ", 300, now=1000)

    def test_old_timestamp_rejected(self):
        with self.assertRaises(WebhookSignatureError):
            verify_webhook(SECRET, sign(SECRET, 1000, BODY), BODY, 300, now=1301)

    def test_timestamp_swap_rejected(self):
        # A valid v1 with a fresh t pasted in front: the t is part of what is signed.
        v1 = sign(SECRET, 1000, BODY).split(",")[1]
        with self.assertRaises(WebhookSignatureError):
            verify_webhook(SECRET, "t=2000," + v1, BODY, 300, now=2000)

    def test_malformed_rejected(self):
        for h in (None, "", "t=abc,v1=00", "v1=00", "t=1000"):
            with self.assertRaises(WebhookSignatureError):
                verify_webhook(SECRET, h, BODY, 300, now=1000)


if __name__ == "__main__":
    unittest.main()
