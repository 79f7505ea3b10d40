// verifyWebhook, offline: a valid signature passes; a forged secret, a tampered body, an
// old timestamp, a swapped timestamp and malformed headers are rejected.
import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { test } from "node:test";

import { verifyWebhook, verify_webhook, WebhookSignatureError } from "../src/index.js";

const SECRET = "whsec_" + "ab".repeat(24);
const BODY = '{"type":"run.ended","run":{"id":"run_1","status":"succeeded"}}';
const sign = (secret, t, body) => `t=${t},v1=${createHmac("sha256", secret).update(`${t}.${body}`).digest("hex")}`;
const rejected = (p) => assert.rejects(p, WebhookSignatureError);

test("a valid signature verifies (string and bytes)", async () => {
  await verifyWebhook(SECRET, sign(SECRET, 1000, BODY), BODY, 300, 1010);
  await verify_webhook(SECRET, sign(SECRET, 1000, BODY), new TextEncoder().encode(BODY), 300, 1000);
});
test("a forged signature is rejected", () => rejected(verifyWebhook(SECRET, sign("whsec_forged", 1000, BODY), BODY, 300, 1000)));
test("a tampered body is rejected", () => rejected(verifyWebhook(SECRET, sign(SECRET, 1000, BODY), BODY + " ", 300, 1000)));
test("an old timestamp is rejected", () => rejected(verifyWebhook(SECRET, sign(SECRET, 1000, BODY), BODY, 300, 1301)));
test("a fresh t in front of an old v1 is rejected", () =>
  rejected(verifyWebhook(SECRET, `t=2000,${sign(SECRET, 1000, BODY).split(",")[1]}`, BODY, 300, 2000)));
test("malformed headers are rejected", async () => {
  for (const h of [null, "", "t=abc,v1=00", "v1=00", "t=1000"]) await rejected(verifyWebhook(SECRET, h, BODY, 300, 1000));
});
