// The Node client against a live ephemerald (started by tests/sdk-typescript.test with
// model calls replayed): the product page's request end to end, an idempotent retry after
// a dropped answer, event resumption after a cut stream, cancel, typed errors, paging.
// Environment: EPH_TEST_URL, EPH_TEST_KEY, EPH_TEST_STATE (read with sqlite3), EPH_SRCDIR.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import http from "node:http";
import { join } from "node:path";
import { randomUUID } from "node:crypto";
import { after, describe, test } from "node:test";

import * as eph from "../src/index.js";

const { EPH_TEST_URL: URL_, EPH_TEST_KEY: KEY, EPH_TEST_STATE: STATE, EPH_SRCDIR: SRC } = process.env;
const live = Boolean(URL_ && KEY && STATE);
const transcript = (name) => join(SRC ?? "", "tests", "transcripts", name);
const requestWith = (prompt, name, timeout = 60) => ({
  prompt, model: `replay:${transcript(name)}`, shell: true, timeout_seconds: timeout, max_cost_micros: 40000,
});
const sq = (db, sql) => execFileSync("sqlite3", ["-batch", "-noheader", join(STATE, db), sql]).toString().trim();

// An HTTP proxy in front of the daemon that fails the way networks fail: dropAnswerOf (a
// "METHOD /path" prefix): the first such request reaches the daemon, its answer is thrown
// away and the client's connection destroyed; cutStreamAfter: the first event stream is
// cut after that many events. Records each request's method, url and headers.
function proxy({ dropAnswerOf, cutStreamAfter } = {}) {
  const upstream = new URL(URL_);
  const requests = [];
  const server = http.createServer((req, res) => {
    requests.push({ line: `${req.method} ${req.url}`, headers: req.headers });
    const drop = dropAnswerOf && `${req.method} ${req.url}`.startsWith(dropAnswerOf);
    if (drop) dropAnswerOf = undefined;
    const cut = req.url.includes("/events") ? cutStreamAfter : undefined;
    if (cut) cutStreamAfter = undefined;
    const up = http.request({
      host: upstream.hostname, port: upstream.port, method: req.method, path: req.url,
      headers: { ...req.headers, connection: "close" },
    }, (ur) => {
      if (drop) { // the daemon answered: the answer is lost on the way
        ur.resume();
        ur.on("end", () => req.socket.destroy());
        return;
      }
      res.writeHead(ur.statusCode, ur.headers);
      if (!cut) { ur.pipe(res); return; }
      let pending = "";
      let events = 0;
      ur.setEncoding("utf8");
      ur.on("data", (d) => {
        pending += d;
        let i;
        while ((i = pending.indexOf("\n\n")) >= 0) {
          const block = pending.slice(0, i + 2);
          pending = pending.slice(i + 2);
          if (events >= cut) return;
          const isEvent = block.includes("event: ");
          if (isEvent) events++;
          res.write(block, () => {
            if (isEvent && events >= cut) { ur.destroy(); req.socket.destroy(); }
          });
        }
      });
      ur.on("end", () => res.end());
    });
    up.on("error", () => req.socket.destroy());
    req.pipe(up);
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => {
    resolve({ url: `http://127.0.0.1:${server.address().port}`, requests, close: () => { server.closeAllConnections?.(); server.close(); } });
  }));
}

async function collect(iter) {
  const out = [];
  for await (const x of iter) out.push(x);
  return out;
}

describe("offline", () => {
  test("errors are typed by the API's type, then by status", () => {
    const e = eph.errorFromResponse(400, { error: { type: "invalid_request", message: "m", field: "f" } });
    assert.ok(e instanceof eph.InvalidRequestError && e instanceof eph.ApiError && e instanceof Error);
    assert.deepEqual([e.status, e.type, e.field, e.apiMessage], [400, "invalid_request", "f", "m"]);
    const r = eph.errorFromResponse(429, null, 2);
    assert.ok(r instanceof eph.RateLimitError);
    assert.equal(r.retryAfter, 2);
  });
});

describe("the key stays with the daemon", () => {
  test("a redirect is refused, never followed with the key", async () => {
    const seen = [];
    const listen = (handler) => new Promise((resolve) => {
      const s = http.createServer(handler).listen(0, "127.0.0.1", () => resolve(s));
    });
    const elsewhere = await listen((req, res) => { seen.push(req.headers.authorization); res.end("{}"); });
    const redirector = await listen((req, res) => {
      res.writeHead(307, { Location: `http://127.0.0.1:${elsewhere.address().port}${req.url}` });
      res.end();
    });
    try {
      const c = new eph.Client(`http://127.0.0.1:${redirector.address().port}`, "eph_secret", { maxRetries: 0 });
      await assert.rejects(c.runs.get("run_x"), eph.ConnectionError);
      await assert.rejects(eph.Client.prototype.health.call(c), eph.ConnectionError);
      assert.deepEqual(seen, []);
    } finally {
      elsewhere.close();
      redirector.close();
    }
  });
});

describe("against ephemerald", { skip: !live && "run through tests/sdk-typescript.test" }, () => {
  const client = new eph.Client(URL_, KEY);
  const open = [];
  after(() => open.forEach((p) => p.close()));

  test("the product page's request end to end", async () => {
    const request = JSON.parse(readFileSync(join(SRC, "examples", "sandbox-proof", "request.json"), "utf8"));
    const run = await client.runs.create(request, { wait: 120 });
    assert.equal(run.httpStatus, 201);
    assert.match(run.id, /^run_[0-9a-f]{32}$/);
    assert.equal(run.status, "succeeded");
    assert.equal(run.usage.reserved_micros, 40000);
    assert.equal(run.usage.billed_micros + run.usage.released_micros, 40000);
    const kinds = run.events.map((e) => e.kind);
    assert.equal(kinds[0], "reserved");
    assert.equal(kinds.at(-1), "settled");
    assert.equal(kinds.filter((k) => k === "tool_call").length, 4);
    assert.match(JSON.stringify(run.events), /2 3 5 7 11 13/);
    assert.ok(run.output.answer);
    const got = await client.runs.get(run.id);
    const streamed = await collect(client.runs.events(run.id));
    assert.deepEqual(streamed.map((e) => [e.seq, e.kind, e.text]), got.events.map((e) => [e.seq, e.kind, e.text]));
    const settled = streamed.find((e) => eph.isKind(e, "settled"));
    assert.equal(settled.data.billed_micros, got.usage.billed_micros);
  });

  test("an idempotent retry after a dropped answer: one run, one reservation", async () => {
    const p = await proxy({ dropAnswerOf: "POST /v1/runs" });
    open.push(p);
    const marker = `idem-${randomUUID()}`;
    const c = new eph.Client(p.url, KEY, { backoffMs: 50 });
    const run = await c.runs.create(requestWith(marker, "short-sleep.jsonl"));
    const posts = p.requests.filter((r) => r.line.startsWith("POST /v1/runs"));
    assert.equal(posts.length, 2);
    assert.equal(posts[0].headers["idempotency-key"], posts[1].headers["idempotency-key"]);
    assert.equal(posts[0].headers["idempotency-key"], run.idempotencyKey);
    assert.equal(run.httpStatus, 200); // the first attempt's run, not a new 201
    assert.equal(sq("ephemeral.sqlite", `SELECT count(*) FROM runs WHERE request LIKE '%${marker}%'`), "1");
    assert.equal(sq("ledger.sqlite", `SELECT count(*) FROM entries WHERE kind = 'reserve' AND run_id = '${run.id}'`), "1");
    await assert.rejects(c.runs.create(requestWith(`${marker}-other`, "short-sleep.jsonl"), { idempotencyKey: run.idempotencyKey }),
      (e) => e instanceof eph.IdempotencyError && e.status === 422 && e.type === "idempotency_error");
    await collect(client.runs.events(run.id));
  });

  test("events() resumes a cut stream with Last-Event-ID, none lost or repeated", async () => {
    const run = await client.runs.create(requestWith("resume", "short-sleep.jsonl"));
    const p = await proxy({ cutStreamAfter: 2 });
    open.push(p);
    const c = new eph.Client(p.url, KEY);
    const events = await collect(c.runs.events(run.id, { reconnectDelayMs: 0 }));
    const seqs = events.map((e) => e.seq);
    assert.deepEqual(seqs, seqs.map((_, i) => i + 1));
    assert.equal(events.at(-1).kind, "settled");
    const streams = p.requests.filter((r) => r.line.includes("/events"));
    assert.ok(streams.length >= 2, JSON.stringify(p.requests));
    assert.equal(streams[0].headers["last-event-id"], undefined);
    assert.equal(streams[1].headers["last-event-id"], "2");
    const tail = await collect(client.runs.events(run.id, { lastEventId: 3 }));
    assert.deepEqual(tail.map((e) => e.seq), seqs.slice(3));
    assert.deepEqual(await collect(client.runs.events(run.id, { lastEventId: seqs.at(-1) })), []); // 204
  });

  test("cancel", async () => {
    const run = await client.runs.create(requestWith("cancel me", "sleep.jsonl"));
    let last;
    for await (const e of client.runs.events(run.id)) {
      if (e.kind === "tool_call") assert.equal((await client.runs.cancel(run.id)).id, run.id);
      last = e;
    }
    assert.equal(last.kind, "settled");
    const final = await client.runs.get(run.id);
    assert.equal(final.status, "cancelled");
    assert.equal(final.usage.billed_micros + final.usage.released_micros, 40000);
    // The daemon marks a run settled moments after its settled event is out, and answers a
    // cancel in between with 200 (see the report of issue 18): poll, bounded.
    const deadline = Date.now() + 10_000;
    for (;;) {
      const e = await client.runs.cancel(run.id).then(() => null, (err) => err);
      if (e) { assert.ok(e instanceof eph.ConflictError && e.status === 409, String(e)); break; }
      assert.ok(Date.now() < deadline, "cancel of a settled run never got 409");
      await new Promise((r) => setTimeout(r, 50));
    }
  });

  test("typed errors carry the API's type and field", async () => {
    await assert.rejects(client.runs.create({ prompt: "x", shell: true, timeout_seconds: 0, max_cost_micros: 1000 }),
      (e) => e instanceof eph.InvalidRequestError && e.status === 400 && e.type === "invalid_request" && e.field === "timeout_seconds");
    await assert.rejects(client.runs.create({ prompt: "x", timeout_seconds: 5, max_cost_micros: 1000, colour: "red" }),
      (e) => e instanceof eph.InvalidRequestError && e.field === "colour");
    await assert.rejects(client.runs.create({ prompt: "x", timeout_seconds: 5, max_cost_micros: 5000000 }),
      (e) => e instanceof eph.InsufficientBalanceError && e.field === "max_cost_micros");
    await assert.rejects(client.runs.get("run_does_not_exist"), eph.NotFoundError);
    await assert.rejects(new eph.Client(URL_, `eph_${"0".repeat(48)}`).runs.get("run_x"),
      (e) => e instanceof eph.AuthenticationError && e.status === 401);
    const dead = await new Promise((resolve) => {
      const s = http.createServer().listen(0, "127.0.0.1", () => { const port = s.address().port; s.close(() => resolve(port)); });
    });
    await assert.rejects(new eph.Client(`http://127.0.0.1:${dead}`, KEY, { maxRetries: 1, backoffMs: 10 }).health(), eph.ConnectionError);
  });

  test("list() iterates every page", async () => {
    for (let i = 0; i < 3; i++) await client.runs.create(requestWith(`list ${i}`, "short-sleep.jsonl"), { wait: 60 });
    const all = (await collect(client.runs.list({ pageSize: 1000 }))).map((r) => r.id);
    const paged = (await collect(client.runs.list({ pageSize: 2 }))).map((r) => r.id);
    assert.ok(all.length >= 3);
    assert.deepEqual(paged, all);
  });
});
