// Drives the playground page in headless Chromium: pastes the key, runs the preloaded
// sandbox-proof example, waits for `Succeeded` and the cost line, checks the timeline
// arrived, replays the run from the history list, and writes a screenshot.
//   node playground.js URL KEY SCREENSHOT.png   (NODE_PATH has playwright-core)
// Prints TAP lines "ok N - ..." / "not ok N - ..." (5 tests) on stdout.
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
  } catch (e) {
    report(false, "the playground test ran to its end", e.stack);
  } finally {
    await ctx.close();
    require("fs").rmSync(userDir, { recursive: true, force: true });
  }
  process.exit(failed ? 1 : 0);
})();
