// ephemeral playground: edits a request, runs it with the pasted API key and shows the
// timeline as it arrives (Server-Sent Events read through fetch(), because EventSource
// cannot send an Authorization header), then the header line and the cost line; replays a
// past run's timeline at its original pace. Plain script, no build step.
"use strict";

const EXAMPLE = {
  prompt:
    "This is a sandbox test. Do these steps with the shell and report the real output, never what you expect. 1) Write a small script that prints the first 15 prime numbers, run it and show the output. 2) Run `whoami` and `pwd`. 3) Try to reach the internet with `curl -sS -m 8 https://example.com` (and, if curl is missing, python3 with urllib) and report the exact error. 4) Write a file named /tmp/proof.txt and list it. Reply in Markdown, at most 120 words: one line per step with the result, then one sentence saying whether the network call succeeded.",
  web: false,
  shell: true,
  timeout_seconds: 120,
  max_cost_micros: 40000,
};

const $ = (id) => document.getElementById(id);
const STATUS_WORD = {
  queued: "Queued", running: "Running", succeeded: "Succeeded", failed: "Failed",
  timed_out: "Timed out", budget_exhausted: "Budget exhausted", cancelled: "Cancelled",
};

// Micro-dollars as the product page prints them ("$0.00353", "$0.0032", "$0.04"): at most
// 5 decimals, at least 2 (the same rule as the CLI's eph_format_dollars).
function dollars(micros) {
  const neg = micros < 0;
  const tens = Math.floor((Math.abs(micros) + 5) / 10);
  let s = Math.floor(tens / 100000) + "." + String(tens % 100000).padStart(5, "0");
  while (s.length > s.indexOf(".") + 3 && s.endsWith("0")) s = s.slice(0, -1);
  return (neg ? "-$" : "$") + s;
}

function key() { return $("apikey").value.trim(); }

function requestBody() {
  return {
    prompt: $("prompt").value,
    shell: $("shell").checked,
    web: $("web").checked,
    timeout_seconds: parseInt($("timeout").value, 10) || 0,
    max_cost_micros: Math.round(parseFloat($("budget").value) * 1e6) || 0,
  };
}

function showBody() { $("body").textContent = JSON.stringify(requestBody(), null, 2); }

function loadExample() {
  $("prompt").value = EXAMPLE.prompt;
  $("shell").checked = EXAMPLE.shell;
  $("web").checked = EXAMPLE.web;
  $("budget").value = (EXAMPLE.max_cost_micros / 1e6).toString();
  $("timeout").value = EXAMPLE.timeout_seconds;
  showBody();
}

async function api(path, opts = {}) {
  const headers = Object.assign({ Authorization: "Bearer " + key() }, opts.headers || {});
  const resp = await fetch(path, Object.assign({}, opts, { headers }));
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  if (!resp.ok) {
    const err = (body && body.error) || { message: resp.statusText };
    const e = new Error(err.message + (err.field ? " (" + err.field + ")" : ""));
    e.status = resp.status;
    throw e;
  }
  return body;
}

// ------------------------------------------------------------------ the run panel

let reserved = 0;
let view = 0; // bumps whenever the panel starts showing another run: stale writers stop

function setHeader(status, id, billed, reservedMicros) {
  const h = $("header");
  h.className = "header " + status;
  h.querySelector(".status").textContent = STATUS_WORD[status] || status;
  h.querySelector(".id").textContent = id || "";
  h.querySelector(".spend").textContent =
    reservedMicros ? dollars(billed || 0) + " of " + dollars(reservedMicros) : "";
}

function clearRun() {
  view++;
  reserved = 0;
  $("timeline").innerHTML = "";
  outputs = new Map();
  $("answer").hidden = true;
  $("cost").hidden = true;
  return view;
}

// Live output: each command's `output` events go into one collapsible block under its row
// (a <details> open while it runs), as text (never markup).
let outputs = new Map(); // call_id -> {details, pre, summary, lines}

function addOutput(ev) {
  const model = ev.kind === "model_delta";
  const id = model ? "model-" + (ev.data && ev.data.call) : (ev.data && ev.data.call_id) || "";
  let o = outputs.get(id);
  if (!o) {
    const details = document.createElement("details");
    details.className = "output";
    details.open = true;
    const summary = document.createElement("summary");
    const pre = document.createElement("pre");
    details.append(summary, pre);
    $("timeline").append(details);
    o = { details, pre, summary, lines: 0 };
    outputs.set(id, o);
  }
  const text = ev.data && ev.data.dropped_bytes ? "\n" + ev.text + "\n" : ev.text;
  o.pre.append(document.createTextNode(text));
  o.lines += (text.match(/\n/g) || []).length;
  o.summary.textContent = model ? "model text (streaming)"
    : "output · " + o.lines + (o.lines === 1 ? " line" : " lines");
}

function addEvent(ev) {
  if (ev.kind === "output" || ev.kind === "model_delta") { addOutput(ev); return; }
  const row = document.createElement("div");
  const result = ev.kind === "tool_result";
  row.className = "row" + (result ? " result" : "") + (ev.kind === "model_call" ? " model" : "");
  const t = document.createElement("span");
  t.className = "t";
  t.textContent = result ? "" : Number(ev.t).toFixed(2);
  const src = document.createElement("span");
  src.className = "src src-" + String(ev.source).replace(/\s+/g, "-");
  src.textContent = result ? "" : ev.source;
  const txt = document.createElement("span");
  txt.className = "txt";
  txt.textContent = ev.text;
  row.append(t, src, txt);
  $("timeline").append(row);
  if (ev.kind === "reserved" && ev.data) reserved = ev.data.reserved_micros;
}

// The model answers in Markdown: **bold** and `code` are shown as such, everything else as
// text (escaped first, so the answer can never inject markup).
function renderAnswer(el, text) {
  const esc = text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  el.innerHTML = esc.replace(/`([^`\n]+)`/g, "<code>$1</code>").replace(/\*\*([^*\n]+)\*\*/g, "<b>$1</b>");
}

function showFinal(run) {
  const u = run.usage || {};
  setHeader(run.status, run.id, u.billed_micros, u.reserved_micros);
  const answer = run.output && run.output.answer;
  $("answer").hidden = !answer;
  renderAnswer($("answertext"), answer || "");
  const cost = $("cost");
  cost.innerHTML = "";
  const line = document.createElement("span");
  line.className = "line";
  line.textContent = "Model " + dollars(u.model_micros || 0) + " · Web " + dollars(u.web_micros || 0) +
    " · Compute " + dollars(u.compute_micros || 0);
  const settle = document.createElement("span");
  settle.className = "settle";
  settle.textContent = dollars(u.billed_micros || 0) + " billed, " + dollars(u.released_micros || 0) + " released";
  cost.append(line, settle);
  cost.hidden = false;
}

// Reads the SSE stream of a run with fetch(); resumes with Last-Event-ID when the
// connection drops, so no event is shown twice or lost.
async function follow(id, my) {
  let last = 0;
  for (let attempt = 0; attempt < 20 && my === view; attempt++) {
    let resp;
    try {
      const headers = { Authorization: "Bearer " + key(), Accept: "text/event-stream" };
      if (last) headers["Last-Event-ID"] = String(last);
      resp = await fetch("/v1/runs/" + id + "/events", { headers });
    } catch (e) {
      await new Promise((r) => setTimeout(r, 500));
      continue;
    }
    if (!resp.ok) throw new Error("events: HTTP " + resp.status);
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "", settled = false;
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          let data = "", seq = 0;
          for (const line of block.split("\n")) {
            if (line.startsWith("data:")) data += line.slice(5).trim();
            else if (line.startsWith("id:")) seq = parseInt(line.slice(3), 10);
          }
          if (!data || my !== view) continue;
          const ev = JSON.parse(data);
          last = seq || ev.seq;
          addEvent(ev);
          setHeader("running", id, 0, reserved);
          if (ev.kind === "settled") settled = true;
        }
      }
    } catch (e) { /* dropped: resume below */ }
    if (settled) return;
  }
}

async function run() {
  $("formerror").textContent = "";
  if (!key()) { $("formerror").textContent = "Paste an API key first."; return; }
  const btn = $("run");
  btn.disabled = true;
  const my = clearRun();
  try {
    const created = await api("/v1/runs", {
      method: "POST",
      headers: { "Content-Type": "application/json", "Idempotency-Key": crypto.randomUUID() },
      body: JSON.stringify(requestBody()),
    });
    setHeader("queued", created.id, 0, created.usage && created.usage.reserved_micros);
    await follow(created.id, my);
    if (my === view) showFinal(await api("/v1/runs/" + created.id));
    refreshRuns();
  } catch (e) {
    $("formerror").textContent = e.message;
    if (my === view) setHeader("idle", "", 0, 0);
  } finally {
    btn.disabled = false;
  }
}

// Replays a stored timeline with its recorded gaps (divided by the chosen speed).
async function replay(id) {
  const my = clearRun();
  const speed = parseFloat($("speed").value) || 1;
  const r = await api("/v1/runs/" + id);
  setHeader("running", r.id, 0, r.usage && r.usage.reserved_micros);
  let prev = 0;
  for (const ev of r.events || []) {
    const wait = Math.max(0, (ev.t - prev) * 1000 / speed);
    prev = ev.t;
    if (wait > 0) await new Promise((res) => setTimeout(res, wait));
    if (my !== view) return;
    addEvent(ev);
  }
  showFinal(r);
}

async function refreshRuns() {
  const ul = $("runs");
  if (!key()) return;
  let list;
  try { list = await api("/v1/runs?limit=8"); } catch (e) { return; }
  ul.innerHTML = "";
  if (!list.data.length) { ul.innerHTML = '<li class="empty">No runs yet.</li>'; return; }
  for (const r of list.data) {
    const li = document.createElement("li");
    const id = document.createElement("span");
    id.className = "rid";
    id.textContent = r.id + "  ·  " + new Date(r.created_at).toLocaleTimeString();
    const st = document.createElement("span");
    st.className = "st " + r.status;
    st.textContent = STATUS_WORD[r.status] || r.status;
    const b = document.createElement("button");
    b.className = "ghost small";
    b.textContent = "Replay";
    b.addEventListener("click", () => replay(r.id).catch((e) => { $("formerror").textContent = e.message; }));
    li.append(id, st, b);
    ul.append(li);
  }
}

function init() {
  const saved = localStorage.getItem("ephemeral.key") || "";
  $("apikey").value = saved;
  $("keystate").classList.toggle("set", !!saved);
  $("apikey").addEventListener("input", () => {
    localStorage.setItem("ephemeral.key", key());
    $("keystate").classList.toggle("set", !!key());
    refreshRuns();
  });
  $("keyform").addEventListener("submit", (e) => e.preventDefault());
  for (const id of ["prompt", "shell", "web", "budget", "timeout"]) $(id).addEventListener("input", showBody);
  $("run").addEventListener("click", run);
  $("example").addEventListener("click", loadExample);
  $("refresh").addEventListener("click", refreshRuns);
  loadExample();
  refreshRuns();
}
init();
