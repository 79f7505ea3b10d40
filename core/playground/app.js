// ephemeral playground: edits a request, runs it with the pasted API key and shows the
// timeline as it arrives (Server-Sent Events read through fetch(), because EventSource
// cannot send an Authorization header), then the header line and the cost line; replays a
// past run's timeline at its original pace. Every call goes through the TypeScript SDK
// (sdk/typescript, served as /playground/ephemeral.js): an ES module, no build step.
import { Client, ConflictError } from "/playground/ephemeral.js";

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
  const tens = Math.floor((Math.abs(micros) + 5) / 10);
  const neg = micros < 0 && tens > 0; // -4 micros is $0.00, as the CLI prints it
  let s = Math.floor(tens / 100000) + "." + String(tens % 100000).padStart(5, "0");
  while (s.length > s.indexOf(".") + 3 && s.endsWith("0")) s = s.slice(0, -1);
  return (neg ? "-$" : "$") + s;
}

// Parts of a total (the cost line's model, web, compute) as they add up to the total as
// shown: each rounded down to tens of micros, the tens left over to the largest remainders
// (the earlier on a tie); the CLI's eph_dollars_split (sdk/support/format.c).
function splitDollars(parts) {
  if (parts.some((p) => p < 0)) return parts.map((p) => Math.sign(p) * Math.floor((Math.abs(p) + 5) / 10) * 10);
  const shown = parts.map((p) => Math.floor(p / 10) * 10);
  const sum = parts.reduce((a, b) => a + b, 0);
  let left = Math.floor((sum + 5) / 10) - shown.reduce((a, b) => a + b, 0) / 10;
  const order = parts.map((p, i) => i).sort((a, b) => (parts[b] % 10) - (parts[a] % 10) || a - b);
  for (const i of order) if (left > 0 && parts[i] % 10) { shown[i] += 10; left--; }
  return shown;
}

// "$0.00035 billed, $0.03965 released": released shown as the reservation shown less billed
// shown, so the two add up to the budget (the CLI's eph_format_settled).
function settled(billed, released) {
  const b = Math.floor((billed + 5) / 10) * 10;
  const r = Math.floor((billed + released + 5) / 10) * 10 - b;
  return dollars(b) + " billed, " + dollars(r) + " released";
}

function key() { return $("apikey").value.trim(); }

// One client per call: the key field may change between calls.
function client() { return new Client(location.origin, key(), { maxRetries: 2 }); }

// crypto.randomUUID() exists only in a secure context (https, localhost); a page served
// over plain http elsewhere still needs a unique Idempotency-Key.
function idempotencyKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

const METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

// The request v1 from the form: what is left empty is not sent (the daemon's defaults, and
// anything not granted is not available). Bad values go as typed: the daemon names the field.
function requestBody() {
  const body = {
    prompt: $("prompt").value,
    shell: $("shell").checked,
    web: $("web").checked,
    timeout_seconds: parseInt($("timeout").value, 10) || 0,
    max_cost_micros: Math.round(parseFloat($("budget").value) * 1e6) || 0,
  };
  const model = $("model").value.trim();
  if (model) body.model = model;
  const files = Array.from($("files").children, (it) => ({
    path: it.querySelector("input").value.trim(), content: it.querySelector("textarea").value }));
  if (files.length) body.files = files;
  const conns = Array.from($("conns").children, (it) => {
    const name = it.querySelector("input[type=text]").value.trim();
    const methods = Array.from(it.querySelectorAll(".methods input:checked"), (m) => m.value);
    return methods.length ? { name, methods } : name;
  });
  if (conns.length) body.connections = conns;
  if ($("zdr").checked) body.zero_data_retention = true;
  return body;
}

function removable(item) {
  const x = document.createElement("button");
  x.type = "button";
  x.className = "ghost small";
  x.textContent = "Remove";
  x.addEventListener("click", () => { item.remove(); showBody(); });
  return x;
}

function addFile(path = "", content = "") {
  const item = document.createElement("div");
  item.className = "item file";
  const line = document.createElement("div");
  line.className = "line";
  const p = document.createElement("input");
  p.type = "text";
  p.placeholder = "path in scratch, e.g. data/notes.txt";
  p.spellcheck = false;
  p.value = path;
  line.append(p, removable(item));
  const c = document.createElement("textarea");
  c.rows = 3;
  c.spellcheck = false;
  c.placeholder = "content (UTF-8)";
  c.value = content;
  item.append(line, c);
  item.addEventListener("input", showBody);
  $("files").append(item);
  showBody();
  return item;
}

function addConnection(name = "", methods = []) {
  const item = document.createElement("div");
  item.className = "item conn";
  const line = document.createElement("div");
  line.className = "line";
  const n = document.createElement("input");
  n.type = "text";
  n.placeholder = "connection name";
  n.spellcheck = false;
  n.value = name;
  line.append(n, removable(item));
  const ms = document.createElement("div");
  ms.className = "methods";
  for (const m of METHODS) {
    const l = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.value = m;
    box.checked = methods.includes(m);
    l.append(box, m);
    ms.append(l);
  }
  item.append(line, ms);
  item.addEventListener("input", showBody);
  item.addEventListener("change", showBody);
  $("conns").append(item);
  showBody();
  return item;
}

function showBody() { $("body").textContent = JSON.stringify(requestBody(), null, 2); }

function loadExample() {
  $("prompt").value = EXAMPLE.prompt;
  $("shell").checked = EXAMPLE.shell;
  $("web").checked = EXAMPLE.web;
  $("budget").value = (EXAMPLE.max_cost_micros / 1e6).toString();
  $("timeout").value = EXAMPLE.timeout_seconds;
  $("zdr").checked = false;
  $("model").value = "";
  $("files").innerHTML = "";
  $("conns").innerHTML = "";
  showBody();
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
  const parts = splitDollars([u.model_micros || 0, u.web_micros || 0, u.compute_micros || 0]);
  line.textContent = "Model " + dollars(parts[0]) + " · Web " + dollars(parts[1]) + " · Compute " + dollars(parts[2]);
  const settle = document.createElement("span");
  settle.className = "settle";
  settle.textContent = settled(u.billed_micros || 0, u.released_micros || 0);
  cost.append(line, settle);
  cost.hidden = false;
}

// Follows the run's events through the SDK (fetch() underneath, since EventSource cannot
// send an Authorization header); it resumes with Last-Event-ID when the connection drops,
// so no event is shown twice or lost. Leaving the loop closes the stream.
async function follow(c, id, my) {
  for await (const ev of c.runs.events(id)) {
    if (my !== view) return;
    addEvent(ev);
    setHeader("running", id, 0, reserved);
  }
}

let current = null; // the id of the run this page started and follows, while it runs

function showCancel(id) {
  current = id;
  const b = $("cancel");
  b.hidden = !id;
  b.disabled = false;
}

// POST /v1/runs/{id}/cancel; a run that ended meanwhile (409) is no error: its end shows.
async function cancel() {
  if (!current) return;
  $("cancel").disabled = true;
  try {
    await client().runs.cancel(current);
  } catch (e) {
    if (!(e instanceof ConflictError)) { $("formerror").textContent = e.message; $("cancel").disabled = false; }
  }
}

async function run() {
  $("formerror").textContent = "";
  if (!key()) { $("formerror").textContent = "Paste an API key first."; return; }
  const btn = $("run");
  btn.disabled = true;
  const my = clearRun();
  const c = client();
  try {
    const created = await c.runs.create(requestBody(), { idempotencyKey: idempotencyKey() });
    setHeader("queued", created.id, 0, created.usage && created.usage.reserved_micros);
    showCancel(created.id);
    refreshRuns();
    await follow(c, created.id, my);
    if (my === view) showFinal(await c.runs.get(created.id));
    refreshRuns();
  } catch (e) {
    $("formerror").textContent = e.message;
    if (my === view) setHeader("idle", "", 0, 0);
  } finally {
    showCancel(null);
    btn.disabled = false;
  }
}

// Replays a stored timeline with its recorded gaps (divided by the chosen speed).
async function replay(id) {
  const my = clearRun();
  const speed = parseFloat($("speed").value) || 1;
  const r = await client().runs.get(id);
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

// Past runs, newest first, 8 a page: "Older runs" follows next_cursor. A refresh starts
// again from the first page; an answer of an older refresh is dropped.
let cursor = null;
let listing = 0;

async function loadRuns(more) {
  if (!key()) return;
  const my = more ? listing : ++listing;
  let page;
  try {
    page = (await client().request("GET", "/v1/runs", { query: { limit: 8, cursor: more ? cursor : null } })).body;
  } catch (e) { return; }
  if (my !== listing) return;
  const ul = $("runs");
  if (!more) ul.innerHTML = "";
  cursor = page.next_cursor;
  $("more").hidden = !cursor;
  if (!more && !page.data.length) { ul.innerHTML = '<li class="empty">No runs yet.</li>'; return; }
  for (const r of page.data) {
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

function refreshRuns() { return loadRuns(false); }

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
  for (const id of ["prompt", "shell", "web", "budget", "timeout", "zdr", "model"]) $(id).addEventListener("input", showBody);
  $("run").addEventListener("click", run);
  $("cancel").addEventListener("click", cancel);
  $("addfile").addEventListener("click", () => addFile().querySelector("input").focus());
  $("addconn").addEventListener("click", () => addConnection().querySelector("input").focus());
  $("more").addEventListener("click", () => loadRuns(true));
  $("example").addEventListener("click", loadExample);
  $("refresh").addEventListener("click", refreshRuns);
  loadExample();
  refreshRuns();
}
init();
