// Drives the playground page in headless Chromium: pastes the key, runs the preloaded
// sandbox-proof example, waits for `Succeeded` and the cost line, checks the timeline
// arrived, replays the run from the history list, writes a screenshot; then fills the whole
// permission table and checks what the daemon's run holds, cancels that run with the Cancel
// button, and pages the history past 8 runs.
//   node playground.js URL KEY SCREENSHOT.png   (NODE_PATH has playwright-core; the
//   environment has SLEEP_MODEL and DONE_MODEL: replay:PATH of a sleeping and an instant run)
// Prints TAP lines "ok N - ..." / "not ok N - ..." (8 tests) on stdout.
"use strict";
const { chromium } = require("playwright-core");

const [url, key, shot] = process.argv.slice(2);
let n = 0, failed = 0;
function report(ok, what, detail) {
  n++;
  console.log((ok ? "ok " : "not ok ") + n + " - " + what);
  if (!ok) { failed++; if (detail) console.log("# " + String(detail).split("\n").join("\n# ")); }
}

(async () => {
  const userDir = require("fs").mkdtempSync(require("os").tmpdir() + "/eph-chromium-");
  const ctx = await chromium.launchPersistentContext(userDir, {
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    viewport: { width: 1400, height: 1050 },
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const errors = [];
  try {
    const page = ctx.pages()[0] || (await ctx.newPage());
    page.on("pageerror", (e) => errors.push(e.message));
    await page.goto(url, { waitUntil: "load" });
    const prompt = await page.inputValue("#prompt");
    report(prompt.includes("first 15 prime numbers") && (await page.isChecked("#shell")) &&
      !(await page.isChecked("#web")) && (await page.inputValue("#budget")) === "0.04",
      "the page opens with the sandbox-proof example preloaded (shell on, web off, $0.04)");

    await page.fill("#apikey", key);
    await page.click("#run");
    await page.waitForSelector(".header.succeeded", { timeout: 60000 });
    await page.waitForSelector("#cost:not([hidden])", { timeout: 10000 });
    const header = await page.$$eval("#header span", (ss) => ss.map((s) => s.textContent).join("  "));
    const cost = await page.textContent("#cost .line");
    const rows = await page.$$eval(".timeline .row", (rs) => rs.map((r) => r.textContent));
    report(/^Succeeded {2}run_[0-9a-f]{32} {2}\$0\.[0-9]+ of \$0\.04$/.test(header) &&
      /^Model \$0\.00033 · Web \$0\.00 · Compute \$0\.[0-9]+$/.test(cost),
      "a run shows `Succeeded  run_…  $X of $0.04` and the cost line", header + "\n" + cost);
    const text = rows.join("\n");
    report(rows.length >= 15 && text.includes("budget of $0.04 reserved") &&
      text.includes("worker started · shell on · web off") && text.includes("$ pwd; whoami") &&
      /\$0\.[0-9]+ billed, \$0\.[0-9]+ released/.test(text) && errors.length === 0,
      "the timeline arrived over SSE: reserved .. shell calls .. billed/released",
      text + "\n" + errors.join("\n"));
    // Live output: each command's output in a collapsible block right under its row.
    const blocks = await page.$$eval(".timeline details.output", (ds) => ds.map((d) => ({
      open: d.open, prev: d.previousElementSibling.textContent, text: d.querySelector("pre").textContent,
      summary: d.querySelector("summary").textContent })));
    const pwd = blocks.find((b) => b.prev.includes("$ pwd; whoami"));
    const primes = blocks.find((b) => b.prev.includes("primes.py"));
    await page.click(".timeline details.output summary");
    const closed = await page.$eval(".timeline details.output", (d) => !d.open);
    report(blocks.length >= 3 && pwd && /\/tmp\/ephemeral-run-\w+\/scratch\nworker\n/.test(pwd.text) &&
      primes && primes.text.includes("2 3 5 7 11 13") && /^output · \d+ lines?$/.test(pwd.summary) && closed,
      "each command's output is shown under its row, collapsible", JSON.stringify(blocks, null, 1));
    await page.screenshot({ path: shot, fullPage: true });

    // Replay from the history at 20x: the same rows again, then the same header.
    await page.selectOption("#speed", "20");
    await page.waitForSelector(".runs button", { timeout: 10000 });
    await page.click(".runs li:first-child button");
    await page.waitForFunction((want) => document.querySelectorAll(".timeline .row").length === want &&
      document.querySelector(".header").classList.contains("succeeded"), rows.length, { timeout: 30000 });
    const again = await page.$$eval(".timeline .row", (rs) => rs.map((r) => r.textContent));
    report(JSON.stringify(again) === JSON.stringify(rows), "Replay re-plays the stored timeline");

    // The whole permission table: what the page sends is what the daemon's run holds.
    const api = async (path, opts = {}) => {
      const r = await fetch(url.replace(/\/$/, "") + path, Object.assign({}, opts, {
        headers: Object.assign({ Authorization: "Bearer " + key, "Content-Type": "application/json" }, opts.headers || {}) }));
      return { status: r.status, body: await r.json() };
    };
    await page.fill("#prompt", "sleep, then say done");
    await page.fill("#model", process.env.SLEEP_MODEL);
    await page.fill("#budget", "0.05");
    await page.fill("#timeout", "60");
    await page.click(".switch:has(#zdr) i"); // the switch, as a user does
    await page.click("#addfile");
    await page.fill("#files .item:nth-child(1) input", "notes/todo.txt");
    await page.fill("#files .item:nth-child(1) textarea", "hello\nworld\n");
    await page.click("#addfile");
    await page.fill("#files .item:nth-child(2) input", "b.txt");
    await page.fill("#files .item:nth-child(2) textarea", "x");
    await page.click("#files .item:nth-child(2) button"); // removed again: not sent
    await page.click("#addconn");
    await page.fill("#conns .item input[type=text]", "crm");
    await page.check("#conns .item input[value=GET]");
    await page.check("#conns .item input[value=POST]");
    const shown = JSON.parse(await page.textContent("#body"));
    await page.click("#run");
    await page.waitForSelector("#cancel:not([hidden])", { timeout: 30000 });
    const id = (await page.textContent("#header .id")).trim();
    const held = (await api("/v1/runs/" + id)).body.request || {};
    const want = { model: process.env.SLEEP_MODEL, shell: true, web: false, files: [{ bytes: 12 }],
      connections: [{ name: "crm", methods: ["GET", "POST"] }], timeout_seconds: 60, max_cost_micros: 50000,
      zero_data_retention: true };
    const got = {};
    for (const k of Object.keys(want)) got[k] = held[k];
    report(/^run_[0-9a-f]{32}$/.test(id) && JSON.stringify(got) === JSON.stringify(want) && !("prompt" in held) &&
      JSON.stringify(shown.files) === JSON.stringify([{ path: "notes/todo.txt", content: "hello\nworld\n" }]),
      "the permission table (model, files inline, a connection with methods, zero data retention, " +
      "timeout, budget) is what the daemon's run holds", JSON.stringify({ id, shown, held }, null, 1));

    // Cancel the sleeping run once its command runs: the page shows `Cancelled`.
    await page.waitForFunction(() => Array.from(document.querySelectorAll(".timeline .row"))
      .some((r) => r.textContent.includes("sleep 30")), null, { timeout: 60000 });
    await page.click("#cancel");
    await page.waitForSelector(".header.cancelled", { timeout: 60000 });
    const after = (await api("/v1/runs/" + id)).body;
    const hidden = await page.isHidden("#cancel");
    report(after.status === "cancelled" && after.usage.billed_micros + after.usage.released_micros === 50000 &&
      hidden && (await page.textContent("#header .status")) === "Cancelled",
      "Cancel ends a running run: `Cancelled`, its reservation settled", JSON.stringify(after.usage));

    // Past runs beyond 8: 10 more through the API, then the history's pages.
    for (let i = 0; i < 10; i++) {
      const r = await api("/v1/runs", { method: "POST", body: JSON.stringify({ prompt: "say done " + i,
        model: process.env.DONE_MODEL, timeout_seconds: 30, max_cost_micros: 10000 }) });
      if (r.status !== 201) throw new Error("POST /v1/runs: " + r.status + " " + JSON.stringify(r.body));
    }
    const all = [];
    for (let cur = null, first = true; first || cur; first = false) {
      const r = (await api("/v1/runs?limit=5" + (cur ? "&cursor=" + encodeURIComponent(cur) : ""))).body;
      all.push(...r.data.map((x) => x.id));
      cur = r.next_cursor;
    }
    const listed = () => page.$$eval(".runs li .rid", (ls) => ls.map((l) => l.textContent.split(" ")[0]));
    await page.click("#refresh");
    await page.waitForFunction((first) => { const l = document.querySelector(".runs li .rid");
      return l && l.textContent.startsWith(first); }, all[0], { timeout: 10000 });
    const page1 = await listed();
    const moreShown = await page.isVisible("#more");
    await page.click("#more");
    await page.waitForFunction((n) => document.querySelectorAll(".runs li .rid").length === n, all.length, { timeout: 10000 });
    const pages = await listed();
    report(all.length === 12 && page1.length === 8 && moreShown && JSON.stringify(pages) === JSON.stringify(all) &&
      (await page.isHidden("#more")) && errors.length === 0,
      "past runs are paged: 8, then `Older runs` shows the rest and disappears",
      JSON.stringify({ all, page1, pages, errors }, null, 1));
  } catch (e) {
    const shown = ctx.pages()[0] ? await ctx.pages()[0].textContent("#formerror").catch(() => "") : "";
    report(false, "the playground test ran to its end", e.stack + "\npage error line: " + shown + "\n" + errors.join("\n"));
  } finally {
    await ctx.close();
    require("fs").rmSync(userDir, { recursive: true, force: true });
  }
  process.exit(failed ? 1 : 0);
})();
