// ephemeral: a client of the ephemeral API for Node 18+ (ESM, no dependencies: fetch,
// AbortSignal and node:crypto). Types: index.d.ts, over schema.d.ts which openapi-typescript
// generates from core/openapi.json (`npm run generate`).
//
//   import { Client } from "ephemeral";
//   const client = new Client(url, apiKey);            // or $EPHEMERAL_URL, $EPHEMERAL_API_KEY
//   const run = await client.runs.create(request, { wait: 120 });
//   for await (const event of client.runs.events(run.id)) console.log(event.text);
//
// Retries: an exchange that got no answer (refused, dropped, timed out) and a 429 or 503
// answer are retried up to maxRetries times, waiting Retry-After when sent, else an
// exponential back-off. POST /v1/runs is retried only because it carries an
// Idempotency-Key, generated once per create() and sent unchanged on every retry: a retry
// after a lost answer gets the run the first attempt created, never a second one. cancel()
// is not retried after a lost answer (a second cancel of the ended run would be a 409).
import { randomUUID } from "node:crypto";

const RETRY_AFTER_MAX_MS = 60_000;

/** The base of every error this package throws. */
export class EphemeralError extends Error {}

/** No HTTP answer at all (after the retries). */
export class ConnectionError extends EphemeralError {}

/** An HTTP error answer: status, the API's type and field, message, retryAfter (s). */
export class ApiError extends EphemeralError {
  constructor(status, type, message, field = null, retryAfter = null, body = null) {
    super(`${type} (HTTP ${status}${field ? `, field ${field}` : ""}): ${message}`);
    this.name = new.target.name;
    this.status = status;
    this.type = type;
    this.field = field;
    this.retryAfter = retryAfter;
    this.body = body;
    Object.defineProperty(this, "apiMessage", { value: message, enumerable: true });
  }
}
export class InvalidRequestError extends ApiError {}
export class AuthenticationError extends ApiError {}
export class InsufficientBalanceError extends ApiError {}
export class NotFoundError extends ApiError {}
export class MethodNotAllowedError extends ApiError {}
export class ConflictError extends ApiError {}
export class PayloadTooLargeError extends ApiError {}
export class UnsupportedMediaTypeError extends ApiError {}
export class IdempotencyError extends ApiError {}
export class RateLimitError extends ApiError {}
export class InternalError extends ApiError {}
export class UnavailableError extends ApiError {}

const BY_TYPE = {
  invalid_request: InvalidRequestError,
  authentication_error: AuthenticationError,
  insufficient_balance: InsufficientBalanceError,
  not_found: NotFoundError,
  method_not_allowed: MethodNotAllowedError,
  conflict: ConflictError,
  payload_too_large: PayloadTooLargeError,
  unsupported_media_type: UnsupportedMediaTypeError,
  idempotency_error: IdempotencyError,
  rate_limited: RateLimitError,
  internal_error: InternalError,
  unavailable: UnavailableError,
  overloaded: UnavailableError,
  storage_unavailable: UnavailableError,
};
const BY_STATUS = {
  400: InvalidRequestError, 401: AuthenticationError, 402: InsufficientBalanceError,
  404: NotFoundError, 405: MethodNotAllowedError, 409: ConflictError, 413: PayloadTooLargeError,
  415: UnsupportedMediaTypeError, 422: IdempotencyError, 429: RateLimitError,
  500: InternalError, 503: UnavailableError,
};

/** The typed error of an HTTP error answer (body: the decoded JSON or null). */
export function errorFromResponse(status, body, retryAfter = null) {
  const e = body && typeof body.error === "object" && body.error ? body.error : {};
  const type = typeof e.type === "string" ? e.type : `http_${status}`;
  const Cls = BY_TYPE[type] ?? BY_STATUS[status] ?? ApiError;
  return new Cls(status, type, typeof e.message === "string" ? e.message : `HTTP ${status}`,
    typeof e.field === "string" ? e.field : null, retryAfter, body);
}

function retryAfterSeconds(value) {
  if (value == null) return null;
  const n = Number(value);
  return Number.isFinite(n) && n >= 0 ? n : null;
}

/** Narrows an event to its kind: isKind(e, "settled") (types: index.d.ts). */
export function isKind(e, kind) {
  return e != null && e.kind === kind;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function decode(res) {
  const text = await res.text();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

export class Client {
  /**
   * url: the daemon's base URL; apiKey: an organisation member's key. Options:
   * timeoutMs per exchange (a wait adds its own seconds), maxRetries, backoffMs (doubled
   * per attempt), fetch (an implementation of the Fetch API; default the global one).
   */
  constructor(url = process.env.EPHEMERAL_URL, apiKey = process.env.EPHEMERAL_API_KEY,
    { timeoutMs = 60_000, maxRetries = 3, backoffMs = 250, fetch = globalThis.fetch } = {}) {
    if (!url) throw new TypeError("no URL: pass one or set EPHEMERAL_URL");
    const u = new URL(url);
    if (u.protocol !== "http:" && u.protocol !== "https:")
      throw new TypeError(`url ${url}: expected http:// or https://`);
    this.url = url.replace(/\/+$/, "");
    this.apiKey = apiKey;
    this.timeoutMs = timeoutMs;
    this.maxRetries = maxRetries;
    this.backoffMs = backoffMs;
    this._fetch = fetch;
    this.runs = new Runs(this);
  }

  _headers(extra) {
    const h = { Accept: "application/json", "User-Agent": "ephemeral-node" };
    if (this.apiKey) h.Authorization = `Bearer ${this.apiKey}`;
    return Object.assign(h, extra);
  }

  _target(path, query) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query ?? {})) if (v != null) q.set(k, String(v));
    const s = q.toString();
    return this.url + path + (s ? `?${s}` : "");
  }

  /**
   * One API call: {status, body}. Throws the typed ApiError of an error answer, a
   * ConnectionError when no answer came after the retries.
   */
  async request(method, path, { query, body, headers, timeoutMs, retry = true } = {}) {
    const h = this._headers(headers);
    if (body != null) h["Content-Type"] = "application/json";
    const target = this._target(path, query);
    for (let attempt = 0; ; attempt++) {
      let res, data;
      try {
        res = await this._fetch(target, {
          method, headers: h, body, redirect: "error", // the API never redirects: the key stays
          signal: AbortSignal.timeout(timeoutMs ?? this.timeoutMs),
        });
        data = await decode(res);
      } catch (e) {
        if (!retry || attempt >= this.maxRetries)
          throw new ConnectionError(`${method} ${path}: no answer from ${this.url}: ${e.cause?.message ?? e.message}`, { cause: e });
        await sleep(this.backoffMs * 2 ** attempt);
        continue;
      }
      const ra = retryAfterSeconds(res.headers.get("retry-after"));
      if ((res.status === 429 || res.status === 503) && retry && attempt < this.maxRetries) {
        await sleep(Math.min(ra != null ? ra * 1000 : this.backoffMs * 2 ** attempt, RETRY_AFTER_MAX_MS));
        continue;
      }
      if (res.status >= 400) throw errorFromResponse(res.status, data, ra);
      return { status: res.status, body: data };
    }
  }

  /** GET /v1/health (no key needed). */
  async health() {
    return (await this.request("GET", "/v1/health", { retry: false })).body;
  }
}

export class Runs {
  constructor(client) {
    this._c = client;
  }

  /**
   * POST /v1/runs. request: the request v1 (an object, or its JSON text). wait: seconds to
   * hold the answer until the run ends. One Idempotency-Key (given, or a UUID made here)
   * goes with every retry. The run gets httpStatus (201 new, 200 an earlier request's)
   * and idempotencyKey.
   */
  async create(request, { idempotencyKey, wait } = {}) {
    const body = typeof request === "string" ? request : JSON.stringify(request);
    const key = idempotencyKey ?? randomUUID();
    const { status, body: run } = await this._c.request("POST", "/v1/runs", {
      query: { wait }, body, headers: { "Idempotency-Key": key },
      timeoutMs: this._c.timeoutMs + (wait ?? 0) * 1000,
    });
    return Object.assign(run, { httpStatus: status, idempotencyKey: key });
  }

  /** GET /v1/runs/{id}: the run with its events. */
  async get(id) {
    return (await this._c.request("GET", `/v1/runs/${encodeURIComponent(id)}`)).body;
  }

  /** GET /v1/runs, newest first, through every page (next_cursor). */
  async *list({ pageSize } = {}) {
    let cursor;
    do {
      const { body } = await this._c.request("GET", "/v1/runs", { query: { limit: pageSize, cursor } });
      yield* body.data ?? [];
      cursor = body.next_cursor;
    } while (cursor);
  }

  /** POST /v1/runs/{id}/cancel; ConflictError if it had ended. Not retried after a lost answer. */
  async cancel(id) {
    return (await this._c.request("POST", `/v1/runs/${encodeURIComponent(id)}/cancel`, { retry: false })).body;
  }

  /**
   * GET /v1/runs/{id}/events as an async iterator of events, from after lastEventId. Like
   * an EventSource: a dropped stream is resumed with Last-Event-ID (after reconnectDelayMs,
   * default the server's `retry:`), no event lost or repeated; it ends after `settled` or
   * when a reconnect gets 204. Throws ConnectionError after maxRetries reconnects in a row
   * that brought nothing; `signal` stops it.
   */
  async *events(id, { lastEventId, reconnectDelayMs, signal } = {}) {
    const c = this._c;
    const target = c._target(`/v1/runs/${encodeURIComponent(id)}/events`);
    let last = lastEventId;
    let delayMs = 2000;
    let fruitless = 0;
    for (;;) {
      const headers = c._headers({ Accept: "text/event-stream" });
      if (last != null) headers["Last-Event-ID"] = String(last);
      // Keep-alive comments come every 15 s: a longer silence is a dead connection.
      const idle = new AbortController();
      const idleMs = Math.max(c.timeoutMs, 30_000);
      let timer = setTimeout(() => idle.abort(), idleMs);
      const onAbort = () => idle.abort();
      signal?.addEventListener("abort", onAbort);
      let got = false;
      let err;
      try {
        const res = await c._fetch(target, { headers, signal: idle.signal, redirect: "error" });
        if (res.status === 204) return;
        if (res.status !== 200)
          throw errorFromResponse(res.status, await decode(res), retryAfterSeconds(res.headers.get("retry-after")));
        err = new ConnectionError("the stream ended before the run settled");
        const decoder = new TextDecoder();
        let buf = "";
        let data = [];
        for await (const chunk of res.body) {
          clearTimeout(timer);
          timer = setTimeout(() => idle.abort(), idleMs);
          buf += decoder.decode(chunk, { stream: true });
          let nl;
          while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
            const line = buf.slice(0, nl);
            buf = buf.slice(nl + (buf.startsWith("\r\n", nl) ? 2 : 1));
            if (line === "") {
              if (data.length) {
                const event = JSON.parse(data.join("\n"));
                data = [];
                last = event.seq ?? last;
                got = true;
                yield event;
                if (event.kind === "settled") return;
              }
              continue;
            }
            if (line.startsWith(":")) continue;
            const colon = line.indexOf(":");
            const name = colon < 0 ? line : line.slice(0, colon);
            let value = colon < 0 ? "" : line.slice(colon + 1);
            if (value.startsWith(" ")) value = value.slice(1);
            if (name === "data") data.push(value);
            else if (name === "retry" && /^\d+$/.test(value)) delayMs = Number(value);
          }
        }
      } catch (e) {
        if (e instanceof ApiError) throw e;
        if (signal?.aborted) return;
        err = e;
      } finally {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        idle.abort(); // closes the connection if the consumer stopped early
      }
      fruitless = got ? 0 : fruitless + 1;
      if (fruitless > c.maxRetries)
        throw new ConnectionError(`events of ${id}: ${err?.cause?.message ?? err?.message}`, { cause: err });
      await sleep(reconnectDelayMs ?? delayMs);
    }
  }
}

// ------------------------------------------------------------------ webhooks

/** The delivery is not signed by the endpoint's secret, or is too old. */
export class WebhookSignatureError extends EphemeralError {}

async function subtleCrypto() {
  if (globalThis.crypto?.subtle) return globalThis.crypto.subtle;
  return (await import("node:crypto")).webcrypto.subtle; // Node 18 without the global
}

const toHex = (buf) => Array.from(new Uint8Array(buf), (b) => b.toString(16).padStart(2, "0")).join("");

// Compares without an early exit, so the time taken does not say how much matched.
function sameText(a, b) {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return diff === 0;
}

/**
 * Checks a webhook delivery: `header` is its Ephemeral-Signature value
 * ("t=UNIX_SECONDS,v1=HEX"), `body` the raw body as received (string or bytes), `secret`
 * the endpoint's secret. Resolves when one v1 is the HMAC-SHA256 of "<t>.<body>" and t is
 * within toleranceS seconds of now (seconds, default: the clock); rejects with
 * WebhookSignatureError otherwise.
 */
export async function verifyWebhook(secret, header, body, toleranceS = 300, now = Date.now() / 1000) {
  if (!header) throw new WebhookSignatureError("missing Ephemeral-Signature header");
  let t = null;
  const sigs = [];
  for (const part of String(header).split(",")) {
    const i = part.indexOf("=");
    const k = part.slice(0, i).trim(), v = part.slice(i + 1).trim();
    if (i < 0) continue;
    if (k === "t" && /^[0-9]+$/.test(v)) t = Number(v);
    else if (k === "v1") sigs.push(v);
  }
  if (t === null || sigs.length === 0) throw new WebhookSignatureError("malformed Ephemeral-Signature header");
  if (Math.abs(now - t) > toleranceS)
    throw new WebhookSignatureError(`signature timestamp ${t} is more than ${toleranceS} s from now`);
  const enc = new TextEncoder();
  const bytes = typeof body === "string" ? enc.encode(body) : new Uint8Array(body);
  const prefix = enc.encode(`${t}.`);
  const message = new Uint8Array(prefix.length + bytes.length);
  message.set(prefix, 0);
  message.set(bytes, prefix.length);
  const subtle = await subtleCrypto();
  const key = await subtle.importKey("raw", enc.encode(secret), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const expected = toHex(await subtle.sign("HMAC", key, message));
  if (!sigs.some((s) => sameText(s, expected))) throw new WebhookSignatureError("signature does not match");
}

/** The same as verifyWebhook, under the Python SDK's name. */
export const verify_webhook = verifyWebhook;
