// A phone paired with a scope (`iroh pair --scope observe`) opens its pairing
// link in headless Chromium at 390 × 844: it starts nothing, finds the
// laptop's session in its list, joins it and watches: no prompt box, no
// Send, no Take control, and the agent's question shown without Allow and
// Deny. Widened with `thunderbolt devices scope --scope answer`, its next
// listing gives it the question's buttons, and its Allow reaches the agent.
//
//   (cd client-wasm/e2e && node --test --test-concurrency=1 scopes.test.mjs)
//
// Needs: client-wasm/pkg (client-wasm/build.sh), the workspace binaries
// (cargo build --workspace --bins), Debian chromium, `npm ci` here.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { execFileSync } from "node:child_process";
import { ROOT, BIN, WAIT_MS, PHONE, tb, tbEnv, tempHome, jsonConnect, pageRig, phoneOn, startAcpBridge } from "./harness.mjs";

const ARTIFACTS = join(ROOT, "client-wasm/e2e/artifacts");
const ASK_AGENT = [process.execPath, join(ROOT, "client-wasm/e2e/ask-agent.mjs")];

const rig = pageRig({ before, after });
mkdirSync(ARTIFACTS, { recursive: true });
const shot = (p, name) => p.screenshot({ path: join(ARTIFACTS, name) });
const conversationOf = (p) => p.getByRole("log", { name: "conversation" });

test("a phone that may only watch joins the laptop's session from its list and has no button it may not use; widened, it answers", async () => {
  const b = await startAcpBridge(rig.relay.url, ASK_AGENT);
  // The laptop: one of the owner's own devices, its session left asking for a permission.
  const laptopHome = tempHome();
  const code = JSON.parse(tb(b.home, rig.relay.url, ["iroh", "pair", "--json"])).code;
  execFileSync(join(BIN, "thunderbolt"), ["acp", "connect", "--pair", code, "--device-name", "laptop", b.ticket], {
    env: { ...process.env, ...tbEnv(laptopHome, rig.relay.url) }, stdio: ["ignore", "ignore", "pipe"],
  });
  const laptop = jsonConnect(laptopHome, rig.relay.url, [b.ticket]);
  laptop.send({ jsonrpc: "2.0", id: 0, method: "initialize", params: { protocolVersion: 1 } });
  laptop.send({ jsonrpc: "2.0", id: 1, method: "session/new", params: { cwd: "/", mcpServers: [] } });
  const sid = (await laptop.seen((v) => v.id === 1, "the laptop's session")).result.sessionId;
  laptop.send({ jsonrpc: "2.0", id: 2, method: "session/prompt", params: { sessionId: sid, prompt: [{ type: "text", text: "permission" }] } });
  const unknown = await laptop.seen((v) => v.method === "x_unknown/thing", "the agent's first request");
  laptop.send({ jsonrpc: "2.0", id: unknown.id, error: { code: -32601, message: "not here" } });
  await laptop.seen((v) => v.method === "session/request_permission", "the agent's question at the laptop");

  const minted = JSON.parse(tb(b.home, rig.relay.url, ["iroh", "pair", "--json", "--app-url", rig.baseUrl, "--scope", "observe", "--name", "kitchen tablet"]));
  assert.deepEqual(minted.scope.verbs, ["observe"]);
  const ctx = await rig.browser.newContext(PHONE);
  const p = await ctx.newPage();
  p.on("pageerror", (e) => console.log("page error:", e.message));
  try {
    await p.goto(minted.link);
    await p.waitForFunction(() => /^paired: this device may watch only/.test(document.querySelector("#status")?.textContent || "") || window.lastError, null, { timeout: WAIT_MS });
    assert.equal(await p.evaluate(() => window.lastError), undefined, await p.textContent("#status"));
    assert.equal(await p.getByRole("button", { name: /^New session/ }).count(), 0, "no New session: it may not start one");
    const theirs = p.getByRole("button", { name: /Laptop's/ });
    await theirs.waitFor({ timeout: WAIT_MS });
    await shot(p, "scope-watch-only-list.png");

    await theirs.click();
    await p.waitForFunction(() => /^joined/.test(document.querySelector("#status")?.textContent || ""), null, { timeout: WAIT_MS });
    const card = conversationOf(p).getByText("This device may not answer the agent: another of your devices can.");
    await card.waitFor({ timeout: WAIT_MS });
    assert.equal(await p.getByRole("button", { name: "Allow", exact: true }).count(), 0, "no Allow");
    assert.equal(await p.getByRole("button", { name: "Take control" }).count(), 0, "no Take control");
    assert.equal(await p.getByRole("button", { name: "Send", exact: true }).count(), 0, "no Send");
    assert.equal(await p.getByRole("textbox", { name: "prompt" }).count(), 0, "no prompt box");
    await shot(p, "scope-watch-only-joined.png");

    // The owner lets it answer: its next listing says so, and the question gets its buttons.
    tb(b.home, rig.relay.url, ["devices", "scope", "kitchen tablet", "--scope", "answer"]);
    // A reload asks the host at once (the list asks every 30 s) and takes the joined session back.
    await p.reload();
    await p.getByRole("button", { name: "Allow", exact: true }).click({ timeout: WAIT_MS });
    const ended = await laptop.seen((v) => v.id === 2 && v.result, "the laptop's turn, answered from the tablet");
    assert.equal(ended.result.stopReason, "end_turn");
    assert.equal(await p.getByRole("button", { name: "Take control" }).count(), 0, "still no Take control: it may not prompt");
    await shot(p, "scope-answer-joined.png");
  } finally {
    laptop.child.stdin.end();
    await ctx.close();
    b.child.kill("SIGTERM");
  }
});

test("the owner shares the session from the page; another person's phone opens the link, is told it is a guest of whose session until when, watches only, and is ended by kick", async () => {
  const b = await startAcpBridge(rig.relay.url, ASK_AGENT);
  const { ctx, p } = await phoneOn(rig, b.home);
  const ctx2 = await rig.browser.newContext(PHONE);
  const q = await ctx2.newPage();
  q.on("pageerror", (e) => console.log("guest page error:", e.message));
  try {
    await p.getByRole("button", { name: "Share", exact: true }).click();
    const sheet = p.getByRole("dialog", { name: "Share this session" });
    await sheet.getByRole("radio", { name: "Watch", exact: true }).check();
    await sheet.getByRole("button", { name: "Create link" }).click();
    await sheet.getByText(/^Watch only, until .* It works once, for one device\.$/).waitFor({ timeout: WAIT_MS });
    const link = await sheet.getByRole("textbox", { name: "Link for their device" }).inputValue();
    assert.match(link, /#ticket=.*&pair=[0-9a-f]{32}/);
    await shot(p, "share-sheet.png");
    await sheet.getByRole("button", { name: "Close" }).click();

    // Someone else's phone: a fresh browser that never paired with this workstation.
    await q.goto(link);
    await q.waitForFunction(() => /^joined/.test(document.querySelector("#status")?.textContent || "") || window.lastError, null, { timeout: WAIT_MS });
    assert.equal(await q.evaluate(() => window.lastError), undefined, await q.textContent("#status"));
    const guest = q.getByRole("note").filter({ hasText: /^You are a guest of .*'s session until .*: you see this session only\.$/ });
    await guest.waitFor({ timeout: WAIT_MS });
    assert.equal(await q.getByRole("textbox", { name: "prompt" }).count(), 0, "no prompt box: it watches");
    assert.equal(await q.getByRole("button", { name: "Share", exact: true }).isVisible(), false, "a watcher shares nothing");
    assert.equal(await q.getByRole("button", { name: /^New session/ }).count(), 0);

    // The owner prompts; the guest sees the agent's question, without buttons.
    await p.getByRole("textbox", { name: "prompt" }).fill("permission");
    await p.getByRole("button", { name: "Send", exact: true }).click();
    await conversationOf(q).getByText("Only the session's owner answers the agent.").waitFor({ timeout: WAIT_MS });
    await shot(q, "share-guest.png");

    // The owner sees who watches (the workstation's status too), and ends it from the page.
    const st = JSON.parse(tb(b.home, rig.relay.url, ["status", "--json"]));
    assert.ok(st.bridges[0].sessions.flatMap((s) => s.devices || []).find((d) => d.shareUntil), JSON.stringify(st));
    const guests = p.getByRole("list", { name: "guests on this session" });
    await guests.getByText(/ · a guest, watching · since /).waitFor({ timeout: WAIT_MS });
    await shot(p, "share-owner-sees-guest.png");
    await guests.getByRole("button", { name: /^End .*'s share$/ }).click();
    await q.waitForFunction(() => /ended by the host/.test(document.querySelector("#status")?.textContent || ""), null, { timeout: WAIT_MS });
    await guests.waitFor({ state: "hidden", timeout: WAIT_MS });
    // For good: the guest's device is no longer let in.
    const after = JSON.parse(tb(b.home, rig.relay.url, ["iroh", "list", "--json"]));
    assert.equal(after.devices.filter((d) => d.how === "share").length, 0, JSON.stringify(after));
  } finally {
    await ctx2.close();
    await ctx.close();
    b.child.kill("SIGTERM");
  }
});
