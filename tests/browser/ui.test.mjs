// The operator's page (`tower_webhook::admin::ui`) in headless Chromium, against the
// receiver example in inbox mode: sign in, counts, search, an event with markup in its
// body shown as text, lists filtered, pause and resume a source, forms posted from other
// pages refused, requeue a dead event (one, then a type after a confirmation) and see it
// processed, erase an event's body (after a confirmation) and see its key still stop a
// redelivery, and sign out. Then fan-out: the receiver with two processors, one failing
// every attempt; its dead route requeued alone from the event page runs that processor
// again and not the other. Then schemas: an invalid event on the Invalid page and its
// event page, its errors (never a value of its body) beside its body, never run.
//
// Run by tests/browser.rs (`cargo test --all-features --test browser -- --ignored`), which
// builds the receiver and gives each run a fresh database. By hand:
//
//   RECEIVER_BIN=target/debug/examples/receiver WEBHOOK_SQLITE=/tmp/ui.db node --test tests/browser/
//
// Environment: RECEIVER_BIN (required); DATABASE_URL (a postgres:// URL) or WEBHOOK_SQLITE;
// CHROMIUM (default /usr/bin/chromium); SCREENSHOTS, a folder for the pages' screenshots.

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHmac } from "node:crypto";
import { createInterface } from "node:readline";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const SECRET = "whsec_browser_test_0123456789abcdef";
const TOKEN = "operator-browser-token-0123456789";
const FAILS = "invoice.payment_failed";
const DOOMED = "charge.disputed"; // fails too: its dead event is deleted
// Erased from the event page; tests/browser.rs checks the database after the run.
const ERASED = "evt_erased";
const CANARY = "erase-canary-4f1c";
const MARKUP = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">';

/** The receiver example in inbox mode on the test's database, with `env` on top. */
async function startReceiver(env) {
  const bin = process.env.RECEIVER_BIN;
  assert.ok(bin, "RECEIVER_BIN names the receiver example's binary");
  const child = spawn(bin, [], {
    env: {
      ...process.env,
      WEBHOOK_MODE: "inbox",
      WEBHOOK_SCHEME: "stripe",
      WEBHOOK_SECRETS: SECRET,
      WEBHOOK_ADMIN_TOKEN: TOKEN,
      BIND: "127.0.0.1:0",
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines = [];
  createInterface({ input: child.stdout }).on("line", (line) => lines.push(line));
  const stderr = createInterface({ input: child.stderr });
  const first = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("the receiver did not start in 30 s")), 30000);
    stderr.once("line", (line) => { clearTimeout(timer); resolve(line); });
    child.once("exit", (code) => reject(new Error(`the receiver exited: ${code}`)));
  });
  stderr.on("line", () => {}); // read on: a closed pipe would end the receiver
  const url = first.split(/\s+/).pop();
  assert.match(url, /^http:\/\/127\.0\.0\.1:\d+\/webhooks$/, first);
  const stop = () => new Promise((resolve) => {
    if (child.exitCode !== null) return resolve();
    child.once("exit", resolve);
    child.kill("SIGTERM");
  });
  return { base: url.replace(/\/webhooks$/, ""), webhooks: url, lines, stop };
}

/** Posts a Stripe-signed event. */
async function deliver(receiver, id, type, extra = {}) {
  const body = JSON.stringify({ id, type, livemode: false, data: { object: { id: "in_1", ...extra } } });
  const t = Math.floor(Date.now() / 1000);
  const v1 = createHmac("sha256", SECRET).update(`${t}.${body}`).digest("hex");
  const response = await fetch(receiver.webhooks, {
    method: "POST",
    headers: { "content-type": "application/json", "stripe-signature": `t=${t},v1=${v1}` },
    body,
  });
  assert.equal(response.status, 204, `delivering ${id}`);
}

/** Waits until `check` holds (polling), at most `ms`. */
async function eventually(what, check, ms = 20000) {
  const until = Date.now() + ms;
  for (;;) {
    if (await check()) return;
    if (Date.now() > until) throw new Error(`timed out waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

const printed = (receiver, line) => eventually(`the receiver printed "${line}"`, () => receiver.lines.includes(line));
const times = (receiver, line) => receiver.lines.filter((l) => l === line).length;

/** The number in the overview's count of `state`. */
async function count(page, state) {
  return Number(await page.locator(`#counts .${state} dd`).innerText());
}

/** Reloads `url` until the event page says `state`. */
async function stateBecomes(page, url, state) {
  await eventually(`the event is ${state}`, async () => {
    await page.goto(url);
    return (await page.locator("#fields .state").innerText()) === state;
  });
}

async function screenshot(page, name) {
  const folder = process.env.SCREENSHOTS;
  if (!folder) return;
  mkdirSync(folder, { recursive: true });
  await page.screenshot({ path: join(folder, name), fullPage: true });
}

test("the operator's page in Chromium", async (t) => {
  let receiver = await startReceiver({ WEBHOOK_FAIL_TYPES: `${FAILS},${DOOMED}`, WEBHOOK_MAX_ATTEMPTS: "1" });
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox"],
  });
  t.after(async () => {
    await browser.close();
    await receiver.stop();
  });
  const context = await browser.newContext({ viewport: { width: 1180, height: 820 } });
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", (error) => errors.push(error));
  page.on("console", (message) => {
    if (message.text().includes("Content Security Policy")) errors.push(message.text());
  });
  let ui = `${receiver.base}/admin/ui`;

  await deliver(receiver, "evt_ok_1", "charge.succeeded");
  await deliver(receiver, "evt_ok_2", "customer.updated");
  await deliver(receiver, "evt_markup", "charge.succeeded", { description: MARKUP });
  await deliver(receiver, "evt_dead_1", FAILS);
  await deliver(receiver, "evt_dead_2", FAILS);
  for (const id of ["evt_ok_1", "evt_ok_2", "evt_markup"]) await printed(receiver, `handled ${id}`);
  for (const id of ["evt_dead_1", "evt_dead_2"]) await printed(receiver, `failed ${id}`);

  await t.test("signs in with the token once, then by its cookie", async () => {
    const refused = await page.goto(ui);
    assert.equal(refused.status(), 401);
    const wrong = await page.goto(`${ui}?token=a-guess`);
    assert.equal(wrong.status(), 401);
    const signedIn = await page.goto(`${ui}?token=${TOKEN}`);
    assert.equal(signedIn.status(), 200);
    assert.equal(page.url(), ui, "the token left the address bar");
    const [cookie] = await context.cookies(ui);
    assert.equal(cookie.httpOnly, true);
    assert.equal(cookie.sameSite, "Strict");
    const left = cookie.expires - Date.now() / 1000;
    assert.ok(left > 0 && left <= 12 * 3600 + 5, `expires within 12 h: ${cookie.expires}`);
    assert.ok(!cookie.value.includes(TOKEN) && !cookie.value.includes(Buffer.from(TOKEN).toString("base64url").slice(0, 16)));
    assert.equal(await page.evaluate(() => document.cookie), "", "no script reads the cookie");
    const script = await page.evaluate(() => fetch(document.scripts[0].src).then((r) => r.status));
    assert.equal(script, 200, "the page's own script loads");
  });

  await t.test("shows the counts by state and the dead by source", async () => {
    await eventually("the overview counts 3 processed and 2 dead", async () => {
      await page.goto(ui);
      return (await count(page, "processed")) === 3 && (await count(page, "dead")) === 2;
    });
    const stripe = page.locator("#sources tbody tr", { hasText: "stripe" });
    assert.equal(await stripe.locator("td").nth(2).innerText(), "2");
  });

  await t.test("finds an event by its id alone and shows a body with markup as text", async () => {
    await page.goto(ui);
    await page.fill("header form.search input[name=id]", "evt_markup");
    await page.click("header form.search button");
    await page.waitForURL(/\/admin\/ui\/event\?source=stripe&id=evt_markup$/);
    assert.equal(await page.locator("#fields .state").innerText(), "processed");
    const body = await page.locator("pre.body").innerText();
    const asJson = JSON.stringify(MARKUP).slice(1, -1); // its quotes escaped
    assert.ok(body.includes(asJson), `the markup is shown as text: ${body}`);
    assert.ok(body.includes('\n  "data": {'), `the JSON is indented: ${body}`);
    assert.equal(await page.evaluate(() => window.__pwned), undefined, "the body's script did not run");
    assert.equal(await page.locator("main script, main img").count(), 0, "no element came from the body");
    await page.click("text=raw text");
    assert.ok((await page.locator("pre.body").innerText()).startsWith('{"id":"evt_markup"'));
    await page.goto(`${ui}/event?source=stripe&id=evt_markup`);
    await screenshot(page, "operators-page-event.png");
  });

  await t.test("erases an event's body after a confirmation, and its key still stops a redelivery", async () => {
    await deliver(receiver, ERASED, "charge.succeeded", { description: CANARY });
    await printed(receiver, `handled ${ERASED}`);
    const url = `${ui}/event?source=stripe&id=${ERASED}`;
    await page.goto(url);
    assert.equal(await page.locator("#body .state").innerText(), "stored");
    assert.ok((await page.locator("pre.body").innerText()).includes(CANARY));
    await page.click("#actions form[action$='/erase-body'] button");
    assert.equal(await page.locator("main h1").innerText(), "Erase body");
    assert.ok((await page.locator("main p").first().innerText()).includes("cannot be undone"));
    const elsewhere = await context.newPage();
    await elsewhere.goto(url);
    assert.equal(await elsewhere.locator("#body .state").innerText(), "stored", "nothing erased before the confirmation");
    await elsewhere.close();
    await page.click("main form button");
    await page.waitForURL(/&done=erased$/);
    assert.ok((await page.locator(".flash").innerText()).startsWith("Erased: its body"));
    assert.equal(await page.locator("#fields .state").innerText(), "processed", "the event stays");
    assert.equal(await page.locator("#body .state").innerText(), "erased");
    assert.ok((await page.locator("#body").innerText()).includes("Erased on request"));
    assert.equal(await page.locator("pre.body").count(), 0);
    assert.ok(!(await page.content()).includes(CANARY), "no byte of the body on the page");
    assert.equal(await page.locator("#actions form[action$='/erase-body']").count(), 0, "nothing left to erase");
    await deliver(receiver, ERASED, "charge.succeeded", { description: CANARY });
    await new Promise((resolve) => setTimeout(resolve, 1000)); // a second run would show by now
    assert.equal(times(receiver, `handled ${ERASED}`), 1, "the redelivery is a duplicate");
    await page.goto(url);
    assert.equal(await page.locator("#body .state").innerText(), "erased", "the redelivery stored no body");
    // tests/browser.rs then reads the database: no body row of it, its event row kept.
  });

  await t.test("lists dead events, filtered by type", async () => {
    await page.goto(`${ui}/events?state=dead`);
    assert.equal(await page.locator("tbody tr").count(), 2);
    await page.fill("form.filters input[name=type]", "charge.succeeded");
    await page.click("form.filters button");
    assert.equal(await page.locator("tbody tr").count(), 0);
    await page.fill("form.filters input[name=type]", FAILS);
    await page.click("form.filters button");
    assert.equal(await page.locator("tbody tr").count(), 2);
    assert.ok((await page.locator("td.error").first().innerText()).includes("WEBHOOK_FAIL_TYPES"));
    await screenshot(page, "operators-page-dead.png");
  });

  await t.test("pauses and resumes a source", async () => {
    await page.goto(ui);
    const pause = page.locator("form[action$='/pause']");
    await pause.locator("input[name=source]").fill("stripe");
    await pause.locator("button").click();
    assert.ok((await page.locator(".flash").innerText()).startsWith("Paused"));
    assert.equal(await page.locator("#pauses tbody tr").count(), 1);
    await deliver(receiver, "evt_held", "charge.succeeded");
    await eventually("the overview counts 1 paused", async () => {
      await page.goto(ui);
      return (await count(page, "paused")) === 1;
    });
    await new Promise((resolve) => setTimeout(resolve, 1000));
    assert.equal(times(receiver, "handled evt_held"), 0, "a paused source's event waits");
    await screenshot(page, "operators-page-overview.png");
    await page.click("#pauses button:has-text('Resume')");
    assert.ok((await page.locator(".flash").innerText()).startsWith("Resumed"));
    await printed(receiver, "handled evt_held");
    assert.equal(await page.locator("#pauses tbody tr").count(), 0);
  });

  await t.test("a form on another page cannot pause a source", async () => {
    // Another site (attacker.test) and another origin of the same site (127.0.0.1 on
    // another port), each a page that posts the pause form to the receiver at once.
    const attack = `<form method="post" action="${ui}/pause"><input name="source" value="stripe"></form>` +
      "<script>document.forms[0].submit()</script>";
    for (const [origin, status, why] of [
      ["http://attacker.test", 401, "the SameSite=Strict cookie is not sent from another site"],
      ["http://127.0.0.1:9", 403, "the page refuses a POST whose Sec-Fetch-Site is not same-origin"],
    ]) {
      await page.route(`${origin}/`, (route) => route.fulfill({ contentType: "text/html", body: attack }));
      const [response] = await Promise.all([
        page.waitForResponse((r) => r.url() === `${ui}/pause`),
        page.goto(`${origin}/`),
      ]);
      assert.equal(response.status(), status, why);
      await page.unroute(`${origin}/`);
    }
    await page.goto(ui);
    assert.equal(await page.locator("#pauses tbody tr").count(), 0, "nothing was paused");
  });

  const dead1 = () => `${ui}/event?source=stripe&id=evt_dead_1`;
  await t.test("a requeued event of a failing type fails again", async () => {
    await page.goto(dead1());
    await page.click("#actions button");
    assert.ok((await page.locator(".flash").innerText()).startsWith("Requeued"));
    await eventually("evt_dead_1 failed twice", () => times(receiver, "failed evt_dead_1") === 2);
    await stateBecomes(page, dead1(), "dead");
  });

  await t.test("deletes the dead events of a type after a count and a confirmation", async () => {
    await deliver(receiver, "evt_doomed", DOOMED);
    await printed(receiver, "failed evt_doomed");
    const doomed = `${ui}/event?source=stripe&id=evt_doomed`;
    await stateBecomes(page, doomed, "dead");
    await page.goto(`${ui}/events?state=dead`);
    const form = page.locator("form[action$='/delete-dead']");
    await form.locator("input[name=type]").fill(DOOMED);
    await form.locator("button").click();
    const counted = await page.locator("main p").first().innerText();
    assert.ok(counted.startsWith(`1 dead events of type ${DOOMED}`), counted);
    await page.click("main form button");
    assert.equal(await page.locator(".flash").innerText(), "Deleted 1 dead event.");
    assert.equal((await page.goto(doomed)).status(), 404, "deleted");
    await stateBecomes(page, dead1(), "dead"); // another type's dead event stays
  });

  await t.test("after a restart without the failing type, a requeued dead event is processed", async () => {
    await receiver.stop();
    receiver = await startReceiver({});
    ui = `${receiver.base}/admin/ui`; // a new port: cookies are per host, the sign-in holds
    await page.goto(dead1());
    assert.equal(await page.locator("#fields .state").innerText(), "dead");
    await page.click("#actions button");
    await printed(receiver, "handled evt_dead_1");
    await stateBecomes(page, dead1(), "processed");
    // Its history: dead at its one attempt, requeued, dead again, requeued, processed.
    const outcomes = await page.locator("#attempts .outcome").allInnerTexts();
    assert.deepEqual(outcomes, ["dead", "dead", "processed"]);
    const errors = await page.locator("#attempts td.error").allInnerTexts();
    assert.ok(errors[0].includes("WEBHOOK_FAIL_TYPES") && errors[1].includes("WEBHOOK_FAIL_TYPES"), `${errors}`);
    // The headers it came with, the signature among them.
    const names = await page.locator("#headers tbody td:first-child").allInnerTexts();
    assert.ok(names.includes("stripe-signature") && names.includes("content-type"), `${names}`);
  });

  await t.test("requeues the dead events of a type after a count and a confirmation", async () => {
    await page.goto(`${ui}/events?state=dead`);
    const form = page.locator("form[action$='/requeue-matching']");
    await form.locator("input[name=type]").fill(FAILS);
    await form.locator("button").click();
    assert.ok((await page.locator("main p").first().innerText()).startsWith("1 dead events match"));
    assert.equal(times(receiver, "handled evt_dead_2"), 0, "nothing before the confirmation");
    await page.click("main form button");
    assert.equal(await page.locator(".flash").innerText(), "Requeued 1 event.");
    await printed(receiver, "handled evt_dead_2");
  });

  await t.test("signs out with the button on the page, and the old cookie no longer opens it", async () => {
    await page.goto(`${ui}/events?state=dead`);
    const [old] = await context.cookies(ui);
    await page.click("header form.logout button");
    assert.ok((await page.locator("body").innerText()).includes("signed out"));
    assert.deepEqual(await context.cookies(ui), [], "the cookie is cleared");
    assert.equal((await page.goto(ui)).status(), 401, "signed out");
    await context.addCookies([old]); // the same value, replayed
    assert.equal((await page.goto(ui)).status(), 401, "the session was revoked");
    await context.clearCookies();
    assert.equal((await page.goto(`${ui}?token=${TOKEN}`)).status(), 200, "signs in again");
    assert.equal(await page.locator("header form.logout button").count(), 1);
  });

  assert.deepEqual(errors, [], "no script error on any page");
});

test("fan-out: one processor's route requeued alone from the event page", async (t) => {
  // The same database as the test before: its events' `default` routes are orphaned now.
  const receiver = await startReceiver({
    WEBHOOK_PROCESSORS: "ledger,flaky",
    WEBHOOK_FAIL_PROCESSORS: "flaky",
    WEBHOOK_MAX_ATTEMPTS: "1",
  });
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox"],
  });
  t.after(async () => {
    await browser.close();
    await receiver.stop();
  });
  const page = await (await browser.newContext({ viewport: { width: 1180, height: 820 } })).newPage();
  const errors = [];
  page.on("pageerror", (error) => errors.push(error));
  const ui = `${receiver.base}/admin/ui`;
  const id = "evt_fan_out";
  const url = `${ui}/event?source=stripe&id=${id}`;
  const route = (name) => page.locator(`#routes tr[data-processor=${name}]`);
  const flakyAttempts = async () =>
    (await page.locator("#attempts tbody tr", { has: page.locator("td.processor", { hasText: "flaky" }) }).count());

  await deliver(receiver, id, "charge.succeeded");
  await printed(receiver, `handled ${id} ledger`);
  await printed(receiver, `failed ${id} flaky`);
  assert.equal((await page.goto(`${ui}?token=${TOKEN}`)).status(), 200);
  await eventually("flaky's route is dead and ledger's processed", async () => {
    await page.goto(url);
    return (await route("flaky").locator(".state").innerText()) === "dead" &&
      (await route("ledger").locator(".state").innerText()) === "processed";
  });
  assert.equal(await flakyAttempts(), 1, "flaky's one attempt in the history");
  assert.ok((await route("flaky").locator("td.error").innerText()).includes("WEBHOOK_FAIL_PROCESSORS"));
  await screenshot(page, "operators-page-routes.png");

  await route("flaky").locator("button", { hasText: "Requeue" }).click();
  assert.ok((await page.locator(".flash").innerText()).startsWith("Requeued that processor's route"));
  await eventually(`failed ${id} flaky printed twice`, () => times(receiver, `failed ${id} flaky`) === 2);
  await eventually("flaky's route is dead again, with two attempts in its history", async () => {
    await page.goto(url);
    return (await route("flaky").locator(".state").innerText()) === "dead" && (await flakyAttempts()) === 2;
  });
  assert.equal(await route("ledger").locator(".state").innerText(), "processed");
  await new Promise((resolve) => setTimeout(resolve, 1000)); // a stray run of ledger would show by now
  assert.equal(times(receiver, `handled ${id} ledger`), 1, "ledger's route did not run again");
  const outcomes = await page.locator("#attempts tbody tr").evaluateAll((rows) =>
    rows.map((row) => `${row.querySelector("td.processor").innerText} ${row.querySelector(".outcome").innerText}`));
  assert.deepEqual(outcomes.filter((o) => o.startsWith("ledger")), ["ledger processed"]);
  assert.deepEqual(outcomes.filter((o) => o.startsWith("flaky")), ["flaky dead", "flaky dead"]);

  await t.test("the dead list filters by processor and names each row's", async () => {
    await page.goto(`${ui}/events?state=dead`);
    await page.selectOption("form.filters select[name=processor]", "flaky");
    await page.click("form.filters button");
    const rows = page.locator("tbody tr", { hasText: id });
    assert.equal(await rows.count(), 1);
    assert.equal(await rows.locator("td.processor").innerText(), "flaky");
    await page.selectOption("form.filters select[name=processor]", "ledger");
    await page.click("form.filters button");
    assert.equal(await page.locator("tbody tr", { hasText: id }).count(), 0);
  });

  await t.test("the overview counts each processor's routes", async () => {
    await page.goto(ui);
    assert.equal(await page.locator("#processors tr[data-processor=flaky] td.dead").innerText(), "1");
    assert.equal(await page.locator("#processors tr[data-processor=ledger] td.processed").innerText(), "1");
  });

  assert.deepEqual(errors, [], "no script error on any page");
});

test("schemas: an invalid event listed with its errors, shown beside its body, never run", async (t) => {
  // The same database as the tests before; the fixtures' schemas (invoice.paid's wants an
  // integer amount_paid, a currency and a customer).
  const schemas = new URL("../fixtures/schemas/schemas", import.meta.url).pathname;
  const receiver = await startReceiver({ WEBHOOK_SCHEMAS: schemas });
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox"],
  });
  t.after(async () => {
    await browser.close();
    await receiver.stop();
  });
  const page = await (await browser.newContext({ viewport: { width: 1180, height: 820 } })).newPage();
  const errors = [];
  page.on("pageerror", (error) => errors.push(error));
  const ui = `${receiver.base}/admin/ui`;
  const canary = "invalid-canary-9d2e"; // a value of the body: shown in the body, never in an error
  const bad = "evt_invalid_amount";
  const good = "evt_valid_invoice";

  await deliver(receiver, bad, "invoice.paid", { amount_paid: canary });
  await deliver(receiver, good, "invoice.paid", { amount_paid: 1200, currency: "eur", customer: "cus_1" });
  await printed(receiver, `handled ${good}`);
  assert.equal((await page.goto(`${ui}?token=${TOKEN}`)).status(), 200);
  assert.equal(await count(page, "invalid"), 1, "the overview counts the invalid event");

  await page.click("nav a:text-is('Invalid')");
  await page.waitForURL(/\/admin\/ui\/invalid$/);
  const rows = page.locator("tbody tr");
  assert.equal(await rows.count(), 1, "one invalid event listed");
  const row = rows.first();
  assert.equal(await row.locator("code").first().innerText(), bad);
  const listed = await row.locator("ul.errors").innerText();
  assert.ok(listed.includes("/data/object/amount_paid"), listed);
  assert.ok(listed.includes("/data/object"), listed); // currency and customer are missing
  assert.ok(!listed.includes(canary), "an error never quotes the body");
  await screenshot(page, "operators-page-invalid.png");

  await row.locator("a").first().click();
  await page.waitForURL(/\/admin\/ui\/event\?/);
  assert.equal(await page.locator("#fields .state").innerText(), "invalid");
  const why = await page.locator("#validation ul.errors").innerText();
  assert.ok(why.includes("/data/object/amount_paid"), why);
  assert.ok(!why.includes(canary), "an error never quotes the body");
  assert.ok((await page.locator("#body").innerText()).includes(canary), "the body is shown beside its errors");

  await new Promise((resolve) => setTimeout(resolve, 1000)); // a stray run would show by now
  assert.equal(times(receiver, `handled ${bad}`), 0, "the invalid event never reached the processor");
  assert.deepEqual(errors, [], "no script error on any page");
});
