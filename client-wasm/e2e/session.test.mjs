// The phone page on a session several devices share, and its conversation:
// headless Chromium at 390 × 844 driving client-wasm/www/ by role and name,
// against a real `thunderbolt` bridge through a real local relay, with the
// CLI (`thunderbolt acp connect`) as the person's laptop.
//
//   (cd client-wasm/e2e && node --test --test-concurrency=1 session.test.mjs)
//
// Needs: client-wasm/pkg (client-wasm/build.sh), the workspace binaries
// (cargo build --workspace --bins), Debian chromium, `npm ci` here.
// Screenshots go to client-wasm/e2e/artifacts/ (gitignored).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, readFileSync, writeFileSync, chmodSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { join } from "node:path";
import { startServer } from "../serve.mjs";
import { ROOT, BIN, WAIT_MS, waitFor, run, tb, tbEnv, tempHome, endAll, startRelay, startAcpBridge, jsonConnect, launchChromium } from "./harness.mjs";

const ARTIFACTS = join(ROOT, "client-wasm/e2e/artifacts");
const ASK_AGENT = [process.execPath, join(ROOT, "client-wasm/e2e/ask-agent.mjs")];
const PHONE = { viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true, deviceScaleFactor: 1 };

let relay, server, browser, baseUrl;

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  relay = await startRelay();
  server = await startServer(0);
  baseUrl = `http://127.0.0.1:${server.address().port}`;
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  server?.close();
  endAll();
});

const shot = (p, name) => p.screenshot({ path: join(ARTIFACTS, name) });

/// A phone (a fresh browser profile at 390 × 844) that opened the pairing
/// link of `b` (`thunderbolt iroh pair --app-url`): paired as one of the
/// owner's own devices, connected, its session started.
async function pairedPhone(b) {
  const minted = JSON.parse(tb(b.home, relay.url, ["iroh", "pair", "--json", "--app-url", baseUrl]));
  const ctx = await browser.newContext(PHONE);
  const p = await ctx.newPage();
  p.on("pageerror", (e) => console.log("page error:", e.message));
  await p.goto(minted.link);
  await connected(p);
  return p;
}

async function connected(p) {
  await p.waitForFunction(() => document.querySelector("#status").className === "ok" || window.lastError, null, { timeout: WAIT_MS });
  assert.equal(await p.evaluate(() => window.lastError), undefined, await p.textContent("#status"));
}

/// Sends a prompt from the page's box; resolves with the agent's reply, once its turn ended.
async function prompt(p, text) {
  await p.getByRole("textbox", { name: "prompt" }).fill(text);
  await p.getByRole("button", { name: "Send", exact: true }).click();
  return turnDone(p);
}

async function turnDone(p) {
  await p.waitForFunction(() => document.querySelector("#reply")?.dataset.stopReason, null, { timeout: WAIT_MS });
  return p.textContent("#reply");
}

const conversationOf = (p) => p.getByRole("log", { name: "conversation" });
/// While a conversation is shown the list of hosts and sessions is folded
/// into one button: unfolded here (a tap, as a person would).
async function unfoldList(p) {
  const fold = p.getByRole("button", { name: /^Hosts and sessions/ });
  if (await fold.isVisible() && (await fold.getAttribute("aria-expanded")) === "false") await fold.click();
}
const control = (p) => p.getByRole("region", { name: "control of the session" });

/// The laptop: another of the owner's own devices (paired by a one-time code),
/// its home with the CLI's identity.
function pairedLaptop(b) {
  const home = tempHome();
  const code = JSON.parse(tb(b.home, relay.url, ["iroh", "pair", "--json"])).code;
  // Pairs, then opens (and at once leaves, its input empty) a session of its own.
  execFileSync(join(BIN, "thunderbolt"), ["acp", "connect", "--pair", code, "--device-name", "laptop", b.ticket], {
    env: { ...process.env, ...tbEnv(home, relay.url) }, stdio: ["ignore", "ignore", "pipe"],
  });
  return home;
}

/// The id of the page's session, as the laptop lists it (`thunderbolt sessions`).
async function phoneSession(laptopHome, b) {
  return waitFor(() => {
    const list = JSON.parse(tb(laptopHome, relay.url, ["sessions", b.ticket, "--json"])).sessions;
    const s = list.find((x) => x.state === "attached" && x.startedBy.name !== "laptop");
    return s && s.id;
  }, "the phone's session in the laptop's list");
}

/// The laptop's `connect --attach <id>` (taking control unless `observe`),
/// once the bridge told it its role.
async function attach(laptopHome, b, id, observe = false) {
  const laptop = jsonConnect(laptopHome, relay.url, ["--attach", id, ...(observe ? ["--observe"] : []), "--history", "now", b.ticket]);
  const told = await laptop.seen((v) => v.method === "_thunderbolt/role", "the laptop's role");
  assert.equal(told.params.role, observe ? "observer" : "controller");
  return laptop;
}

test("the laptop takes control and then leaves: the page is told it controls the session again, and its prompt reaches the agent", async () => {
  const b = await startAcpBridge(relay.url, ASK_AGENT);
  const p = await pairedPhone(b);
  try {
    assert.match(await prompt(p, "before the laptop"), /^You said: before the laptop; pid \d+$/);
    const laptopHome = pairedLaptop(b);
    const laptop = await attach(laptopHome, b, await phoneSession(laptopHome, b));
    // The page observes: who is in control, one button to take it back, no Send.
    await control(p).getByText("Laptop is in control").waitFor({ timeout: WAIT_MS });
    await p.getByRole("button", { name: "Take control" }).waitFor({ timeout: WAIT_MS });
    assert.equal(await p.getByRole("button", { name: "Send", exact: true }).isVisible(), false, "no Send while the laptop controls");
    await conversationOf(p).getByText("Laptop is in control: this device watches").waitFor({ timeout: WAIT_MS });
    await shot(p, "session-observer.png");
    // The laptop's input ends: it leaves, and control comes back to the page.
    laptop.child.stdin.end();
    assert.equal(await laptop.exited, 0, laptop.err);
    await control(p).getByText("You are in control").waitFor({ timeout: WAIT_MS });
    await conversationOf(p).getByText("You are in control again: your prompts go to the agent").waitFor({ timeout: WAIT_MS });
    assert.equal(await p.getByRole("button", { name: "Take control" }).isVisible(), false);
    assert.match(await prompt(p, "after the laptop left"), /^You said: after the laptop left; pid \d+$/);
  } finally {
    await p.context().close();
    b.child.kill("SIGTERM");
  }
});

test("the page watching: the laptop's prompt shows as the laptop's, with the agent's reply, and its turn ends", async () => {
  const b = await startAcpBridge(relay.url, ASK_AGENT);
  const p = await pairedPhone(b);
  let laptop;
  try {
    assert.match(await prompt(p, "first from the phone"), /^You said: first from the phone; pid \d+$/);
    const laptopHome = pairedLaptop(b);
    laptop = await attach(laptopHome, b, await phoneSession(laptopHome, b));
    await control(p).getByText("Laptop is in control").waitFor({ timeout: WAIT_MS });
    laptop.send({ jsonrpc: "2.0", id: 0, method: "session/prompt", params: { sessionId: "any", prompt: [{ type: "text", text: "from the laptop" }] } });
    await laptop.seen((v) => v.id === 0 && v.result?.stopReason === "end_turn", "the laptop's answer");
    // The page: the laptop's words in a bubble of the laptop's, the reply, the turn over.
    const theirs = conversationOf(p).locator(".bubble.other").filter({ hasText: "from the laptop" });
    await theirs.waitFor({ timeout: WAIT_MS });
    assert.match(await theirs.textContent(), /^Laptop\s*from the laptop$/);
    assert.match(await turnDone(p), /^You said: from the laptop; pid \d+$/);
    assert.equal(await p.evaluate(() => document.querySelector("#reply").dataset.stopReason), "end_turn");
    await shot(p, "session-watching-the-laptop.png");
  } finally {
    laptop?.child.stdin.end();
    await p.context().close();
    b.child.kill("SIGTERM");
  }
});

test("the page observing: Take control makes it the controller (the laptop is told it observes) and its prompt goes through; Give back hands control to the laptop", async () => {
  const b = await startAcpBridge(relay.url, ASK_AGENT);
  const p = await pairedPhone(b);
  let laptop;
  try {
    const laptopHome = pairedLaptop(b);
    laptop = await attach(laptopHome, b, await phoneSession(laptopHome, b));
    const take = p.getByRole("button", { name: "Take control" });
    await take.click({ timeout: WAIT_MS });
    await control(p).getByText("You are in control").waitFor({ timeout: WAIT_MS });
    await waitFor(() => laptop.err.includes("this device observes the session"), "the laptop told it observes")
      .catch((e) => { throw new Error(`${e.message}:\n${laptop.err}`); });
    assert.match(await prompt(p, "mine again"), /^You said: mine again; pid \d+$/);
    // The laptop sees the agent's side of the page's turn.
    await laptop.seen((v) => v.params?.update?.content?.text?.startsWith("You said: mine again"), "the page's reply at the laptop");
    // Given back: the laptop, still attached, controls the session again (and is told so).
    const controls = (v) => typeof v === "object" && v !== null && v.method === "_thunderbolt/role" && v.params.role === "controller";
    const told = laptop.out.filter(controls).length;
    await p.getByRole("button", { name: "Give back to Laptop" }).click();
    await control(p).getByText("Laptop is in control").waitFor({ timeout: WAIT_MS });
    await waitFor(() => laptop.out.filter(controls).length > told, "the laptop told it controls again");
    await take.click();
    await control(p).getByText("You are in control").waitFor({ timeout: WAIT_MS });
    assert.match(await prompt(p, "and again"), /^You said: and again; pid \d+$/);
  } finally {
    laptop?.child.stdin.end();
    await p.context().close();
    b.child.kill("SIGTERM");
  }
});

test("a question the laptop answered becomes a line saying so, with no buttons left to tap", async () => {
  const b = await startAcpBridge(relay.url, ASK_AGENT);
  const p = await pairedPhone(b);
  let laptop;
  try {
    const laptopHome = pairedLaptop(b);
    laptop = await attach(laptopHome, b, await phoneSession(laptopHome, b), true);
    await p.getByRole("textbox", { name: "prompt" }).fill("permission");
    await p.getByRole("button", { name: "Send", exact: true }).click();
    const allow = p.getByRole("button", { name: "Allow", exact: true });
    await allow.waitFor({ timeout: WAIT_MS });
    await shot(p, "session-question.png");
    // The laptop got the same question and answers it first.
    const asked = await laptop.seen((v) => v.method === "session/request_permission", "the question at the laptop");
    laptop.send({ jsonrpc: "2.0", id: asked.id, result: { outcome: { outcome: "selected", optionId: "reject-once" } } });
    const line = conversationOf(p).getByText("laptop answered", { exact: true });
    await line.waitFor({ timeout: WAIT_MS });
    assert.equal(await allow.count(), 0, "no Allow left");
    assert.equal(await p.getByRole("button", { name: "Deny", exact: true }).count(), 0, "no Deny left");
    assert.equal(await p.locator(".request").count(), 0, "no open card");
    assert.match(await turnDone(p), /^unknown: -32601; permission: selected reject-once; pid \d+$/, "the laptop's answer is the one the agent got");
    await shot(p, "session-question-answered.png");
    // Kept so across a reload.
    await p.reload();
    await connected(p);
    await conversationOf(p).getByText("laptop answered", { exact: true }).waitFor({ timeout: WAIT_MS });
    assert.equal(await p.getByRole("button", { name: "Allow", exact: true }).count(), 0);
    // A tap that raced the laptop's answer (sent before the page heard of it):
    // the line says it was not used, never nothing (the component, on its own).
    const late = await p.evaluate(async () => {
      const { Conversation } = await import("./conversation.js");
      const c = new Conversation(document.createElement("div"), { label: () => "Asker", controller: () => null, answer: () => {}, log: () => {} });
      c.question({ id: "q", method: "session/request_permission", params: { toolCall: { title: "Delete it" }, options: [] } });
      c.settle("q", "answered", "you answered: Allow", "you");
      c.answeredElsewhere("q", "laptop");
      return c.root.querySelector(".asked").textContent;
    });
    assert.equal(late, "Delete it · laptop answered first: your answer (Allow) was not used");
  } finally {
    laptop?.child.stdin.end();
    await p.context().close();
    b.child.kill("SIGTERM");
  }
});

test("the conversation first: your prompts and every reply appended, kept across a reload (bounded); the settings sheet open on the first visit only", async () => {
  const b = await startAcpBridge(relay.url, ASK_AGENT);
  // The first visit: the settings sheet is open (how to pair, the ticket, this browser) until the first connection.
  const ctx = await browser.newContext(PHONE);
  const p = await ctx.newPage();
  p.on("pageerror", (e) => console.log("page error:", e.message));
  try {
    await p.goto(`${baseUrl}/www/`);
    await p.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
    await p.getByRole("textbox", { name: "Ticket or NodeId of the bridge" }).waitFor({ timeout: WAIT_MS });
    await shot(p, "session-first-visit.png");
    const minted = JSON.parse(tb(b.home, relay.url, ["iroh", "pair", "--json", "--app-url", baseUrl]));
    await p.goto(minted.link);
    await connected(p);
    const settings = p.locator("#settings");
    assert.equal(await settings.evaluate((d) => d.open), false, "folded once connected");
    assert.equal(await p.getByRole("textbox", { name: "Ticket or NodeId of the bridge" }).isVisible(), false);
    const conv = conversationOf(p);
    assert.match(await prompt(p, "first message"), /^You said: first message; pid \d+$/);
    assert.match(await prompt(p, "second message"), /^You said: second message; pid \d+$/);
    const order = async () => conv.evaluate((c) => {
      const t = c.innerText;
      return ["first message", "You said: first message", "second message", "You said: second message"].map((s) => t.indexOf(s));
    });
    const before = await order();
    assert.ok(before.every((i, k) => i >= 0 && (k === 0 || i > before[k - 1])), `prompts and replies in order: ${before}`);
    await shot(p, "session-conversation.png");
    await p.reload();
    await connected(p);
    assert.match(await p.textContent("#status"), /^resumed after the reload/);
    const after = await order();
    assert.ok(after.every((i, k) => i >= 0 && (k === 0 || i > after[k - 1])), `the same conversation after the reload: ${after}`);
    assert.equal(await conv.locator(".bubble.you").count(), 2);
    // Appended, not replaced.
    assert.match(await prompt(p, "third message"), /^You said: third message; pid \d+$/);
    assert.deepEqual(await conv.locator(".bubble.you").allTextContents(), ["first message", "second message", "third message"]);
    assert.equal(await conv.getByText(/^You said: (first|second|third) message; pid \d+$/).count(), 3);
    // Settings: one tap away.
    await p.getByText("Settings", { exact: true }).click();
    assert.equal(await settings.evaluate((d) => d.open), true);
    await p.getByRole("textbox", { name: "Ticket or NodeId of the bridge" }).waitFor({ timeout: WAIT_MS });
    await shot(p, "session-settings.png");
    // What the device keeps is bounded: 250 more blocks leave the newest 200 (at most 256 KiB).
    const kept = await p.evaluate(() => {
      const c = window.thunderbolt.conversation;
      for (let i = 0; i < 250; i++) c.note(`filler ${i} ${"x".repeat(2000)}`);
      c.save();
      const raw = localStorage.getItem(c.storeKey);
      const blocks = JSON.parse(raw).blocks;
      return { n: blocks.length, bytes: raw.length, last: blocks[blocks.length - 1].text.slice(0, 10) };
    });
    assert.ok(kept.n <= 200 && kept.bytes <= 256 * 1024, JSON.stringify({ n: kept.n, bytes: kept.bytes }));
    assert.equal(kept.last, "filler 249");
  } finally {
    await p.context().close();
    b.child.kill("SIGTERM");
  }
});

/// A long conversation: 2000 messages (1000 prompts, each with a Markdown reply)
/// appended to the live page, then the page reloaded and scrolled. Figures, not
/// asserted as timings: the time per message appended (first hundred against
/// last: appending must not draw the rest again), the time from the reload to
/// the transcript's first paint, the JS heap and DOM size, what the device kept.
test("a 2000-message transcript: appended without drawing the rest again, reloaded from what the device keeps (bounded), scrolled end to end", async () => {
  const b = await startAcpBridge(relay.url, ASK_AGENT);
  const p = await pairedPhone(b);
  try {
    // Time to the transcript's first paint after a load: the first frame in
    // which the conversation has a block, from the navigation's start.
    await p.addInitScript(() => {
      const seen = () => {
        if (document.getElementById("conversation")?.querySelector(".turn")) window.transcriptPaintMs = performance.now();
        else requestAnimationFrame(seen);
      };
      requestAnimationFrame(seen);
    });
    const TURNS = 1000;
    const appended = await p.evaluate(async (TURNS) => {
      // A reply as agents write them: emphasis, a list, inline code, a code block.
      const reply = (i) => `Reply **${i}**: done.\n\n- checked \`src/${i}.rs\`\n- ran the tests\n\n\`\`\`sh\ncargo test -p part${i}\n\`\`\`\n`;
      const c = window.thunderbolt.conversation;
      const frame = () => new Promise((r) => requestAnimationFrame(() => r()));
      const batches = [];
      let first = null;
      for (let i = 0; i < TURNS; i += 100) {
        const t0 = performance.now();
        for (let k = i; k < i + 100; k++) {
          c.startTurn(`message ${k}`, `long-${k}`);
          c.agentText(reply(k));
          c.endTurn(`long-${k}`, "end_turn");
          if (k === 100) first = document.querySelector("#conversation .turn:last-of-type");
        }
        c.drawReplies();
        await frame();
        batches.push((performance.now() - t0) / 200);
      }
      c.save();
      return { batches, firstStillShown: first.isConnected, turns: document.querySelectorAll("#conversation .turn").length, nodes: document.getElementsByTagName("*").length };
    }, TURNS);
    assert.equal(appended.turns, TURNS, "all 2000 messages on the page");
    assert.ok(appended.firstStillShown, "the first message's element was kept, not drawn again");
    const conv = conversationOf(p);
    await conv.getByText("message 999", { exact: true }).waitFor({ timeout: WAIT_MS });
    const cdp = await p.context().newCDPSession(p);
    const metric = async (name) => (await cdp.send("Performance.getMetrics")).metrics.find((m) => m.name === name).value;
    await cdp.send("Performance.enable");
    const liveHeap = await metric("JSHeapUsedSize");

    await p.reload();
    await connected(p);
    await p.waitForFunction(() => window.transcriptPaintMs !== undefined, null, { timeout: WAIT_MS });
    const paintMs = await p.evaluate(() => window.transcriptPaintMs);
    const kept = await p.evaluate(() => {
      const raw = localStorage.getItem(window.thunderbolt.conversation.storeKey);
      return { bytes: raw.length, blocks: JSON.parse(raw).blocks.length, turns: document.querySelectorAll("#conversation .turn").length };
    });
    // Bounded: the newest turns that fit in 200 blocks and 256 KiB; the newest shown, in order.
    assert.ok(kept.blocks <= 200 && kept.bytes <= 256 * 1024, JSON.stringify(kept));
    assert.ok(kept.turns >= 100, `a long tail of the conversation came back: ${JSON.stringify(kept)}`);
    const newest = conv.getByText("message 999", { exact: true });
    await newest.scrollIntoViewIfNeeded();
    assert.ok(await newest.isVisible());
    const oldest = TURNS - kept.turns;
    // Scrolled to the top: the oldest kept message; to the end again: the newest and its reply.
    await p.evaluate(() => window.scrollTo(0, 0));
    await conv.getByText(`message ${oldest}`, { exact: true }).waitFor({ timeout: WAIT_MS });
    const top = await conv.getByText(`message ${oldest}`, { exact: true }).boundingBox();
    assert.ok(top && top.y < 844 * 3, `the oldest kept message near the top: ${JSON.stringify(top)}`);
    await p.evaluate(() => window.scrollTo(0, document.scrollingElement.scrollHeight));
    await conv.getByText("cargo test -p part999").waitFor({ timeout: WAIT_MS });
    assert.ok(await conv.getByText("cargo test -p part999").isVisible(), "the newest reply's code block in view at the end");
    const reloadHeap = await metric("JSHeapUsedSize");
    const nodes = await p.evaluate(() => document.getElementsByTagName("*").length);
    await shot(p, "session-transcript-2000.png");
    const figures = {
      messages: 2 * TURNS,
      appendMsPerMessage: { first100: +appended.batches[0].toFixed(3), last100: +appended.batches.at(-1).toFixed(3), all: appended.batches.map((x) => +x.toFixed(3)) },
      liveDomElements: appended.nodes,
      liveJsHeapMB: +(liveHeap / 1e6).toFixed(1),
      reload: { transcriptFirstPaintMs: Math.round(paintMs), keptBlocks: kept.blocks, keptBytes: kept.bytes, turnsShown: kept.turns, domElements: nodes, jsHeapMB: +(reloadHeap / 1e6).toFixed(1) },
    };
    writeFileSync(join(ARTIFACTS, "transcript-2000.json"), JSON.stringify(figures, null, 2));
    console.log(`a 2000-message transcript: ${JSON.stringify(figures)}`);
  } finally {
    await p.context().close();
    b.child.kill("SIGTERM");
  }
});

/// A fresh phone on the page itself, no link opened (the settings sheet is
/// where to paste), ready.
async function freshPhone() {
  const ctx = await browser.newContext(PHONE);
  const p = await ctx.newPage();
  p.on("pageerror", (e) => console.log("page error:", e.message));
  await p.goto(`${baseUrl}/www/?${new URLSearchParams({ relay: relay.url })}`);
  await p.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  return { ctx, p };
}

test("what the workstation printed, pasted into the ticket field: the CLI's pairing line, the pairing link and the code alone each pair and connect", async () => {
  const b = await startAcpBridge(relay.url, ASK_AGENT);
  try {
    for (const which of ["command", "link"]) {
      const minted = JSON.parse(tb(b.home, relay.url, ["iroh", "pair", "--json", "--app-url", baseUrl]));
      const { ctx, p } = await freshPhone();
      try {
        await p.getByRole("textbox", { name: "Ticket or NodeId of the bridge" }).fill(minted[which]);
        await p.getByRole("button", { name: "Connect", exact: true }).click();
        await connected(p);
        assert.match(await p.textContent("#paired-as"), /^paired as /, `paired by the pasted ${which}`);
        assert.equal(await p.evaluate(() => window.thunderbolt.state.ticket), minted.ticket);
        assert.match(await prompt(p, `hello from the ${which}`), new RegExp(`^You said: hello from the ${which}; pid \\d+$`));
      } finally {
        await ctx.close();
      }
    }
    // The code alone: a fresh page cannot know which workstation it is for, and says so.
    const minted = JSON.parse(tb(b.home, relay.url, ["iroh", "pair", "--json"]));
    const { ctx, p } = await freshPhone();
    try {
      const field = p.getByRole("textbox", { name: "Ticket or NodeId of the bridge" });
      const connect = p.getByRole("button", { name: "Connect", exact: true });
      await field.fill(minted.code);
      await connect.click();
      await p.waitForFunction(() => /does not say which workstation/.test(document.querySelector("#status").textContent), null, { timeout: WAIT_MS });
      // Once the page has tried that workstation (refused: not paired yet), the code pairs it.
      await field.fill(b.ticket);
      await connect.click();
      await p.waitForFunction(() => /not allowlisted/.test(document.querySelector("#status").textContent), null, { timeout: WAIT_MS });
      await p.evaluate(() => { window.lastError = undefined; });
      await field.fill(minted.code);
      await connect.click();
      await connected(p);
      assert.match(await p.textContent("#paired-as"), /^paired as /, "paired by the code alone");
      assert.match(await prompt(p, "hello from the code"), /^You said: hello from the code; pid \d+$/);
    } finally {
      await ctx.close();
    }
  } finally {
    b.child.kill("SIGTERM");
  }
});

test("the host restarted mid-turn: the turn says it was not finished, its prompt is back in the box, and Send again sends it", async () => {
  const home = tempHome();
  const store = join(tempHome(), "store");
  const agent = [process.execPath, join(ROOT, "client-wasm/e2e/restart-agent.mjs"), "--store", store, "--caps", "load", "--chunk-ms", "150"];
  let b = await startAcpBridge(relay.url, agent, [], { home });
  const p = await pairedPhone(b);
  try {
    await p.getByRole("textbox", { name: "prompt" }).fill("stream 12");
    await p.getByRole("button", { name: "Send", exact: true }).click();
    await p.waitForFunction(() => (document.querySelector("#reply")?.textContent || "").includes("chunk 2/12"), null, { timeout: WAIT_MS });
    b.child.kill("SIGTERM");
    await new Promise((r) => b.child.once("exit", r));
    b = await startAcpBridge(relay.url, agent, [], { home });
    const again = p.getByRole("button", { name: "Send again" });
    await again.waitFor({ timeout: WAIT_MS });
    await conversationOf(p).getByText(/not finished: the host restarted/).waitFor({ timeout: WAIT_MS });
    assert.equal(await p.getByRole("textbox", { name: "prompt" }).inputValue(), "stream 12", "the aborted prompt is back in the box");
    await shot(p, "session-restarted.png");
    await again.click();
    await p.waitForFunction(() => document.querySelector("#reply")?.dataset.stopReason === "end_turn", null, { timeout: WAIT_MS });
    assert.match(await p.textContent("#reply"), /chunk 12\/12/);
    assert.equal(await p.getByRole("button", { name: "Send again" }).count(), 0);
    assert.match(readFileSync(join(store, "calls.log"), "utf8"), /load /);
  } finally {
    await p.context().close();
    b.child.kill("SIGTERM");
  }
});

test("the host restarted and its agent cannot take the session back: the page says so once, in plain words", async () => {
  const home = tempHome();
  const store = join(tempHome(), "store");
  const agent = [process.execPath, join(ROOT, "client-wasm/e2e/restart-agent.mjs"), "--store", store, "--caps", "none"];
  let b = await startAcpBridge(relay.url, agent, [], { home });
  const p = await pairedPhone(b);
  try {
    assert.match(await prompt(p, "hello"), /hello/);
    b.child.kill("SIGTERM");
    await new Promise((r) => b.child.once("exit", r));
    b = await startAcpBridge(relay.url, agent, [], { home });
    await p.waitForFunction(() => /host restarted/.test(document.querySelector("#status").textContent), null, { timeout: WAIT_MS });
    const status = await p.textContent("#status");
    assert.equal(status.split("host restarted").length - 1, 1, `said once: ${status}`);
    // The conversation says it once too, and what to do.
    await conversationOf(p).getByText("Session over: start a new session to go on").waitFor({ timeout: WAIT_MS });
    const said = await conversationOf(p).innerText();
    assert.equal(said.split("restarted").length - 1, 1, `the restart said once: ${said}`);
  } finally {
    await p.context().close();
    b.child.kill("SIGTERM");
  }
});

test("one scan of a host's pairing link: every ACP agent of the host is one tap away, and each answers", async () => {
  const home = tempHome();
  mkdirSync(join(home, "agents.d"), { mode: 0o700 });
  const agents = [["coder", "acp", "Coder", ASK_AGENT], ["reviewer", "acp", "Reviewer", ASK_AGENT], ["files", "mcp", "Files", [join(BIN, "test-agent"), "cat"]]];
  for (const [name, protocol, label, command] of agents) {
    const f = join(home, "agents.d", `${name}.json`);
    writeFileSync(f, JSON.stringify({ name, protocol, label, command }));
    chmodSync(f, 0o600);
  }
  const host = run(join(BIN, "thunderbolt"), ["host"], tbEnv(home, relay.url));
  await waitFor(() => host.out.filter((l) => l.trim().startsWith("Ticket:")).length === 3, "the host's three tickets")
    .catch((e) => { throw new Error(`${e.message}\n${host.err}`); });
  const minted = JSON.parse(tb(home, relay.url, ["iroh", "pair", "--json", "--app-url", baseUrl]));
  const ctx = await browser.newContext(PHONE);
  const p = await ctx.newPage();
  p.on("pageerror", (e) => console.log("page error:", e.message));
  try {
    await p.goto(minted.link);
    await connected(p);
    assert.equal((await p.evaluate(() => window.paired && window.paired.agents && window.paired.agents.length)), 3, "the pairing answer names the three agents");
    assert.match(await prompt(p, "hello"), /^You said: hello; pid \d+$/);
    // Both ACP agents are in the list, by the names the host gave them (the
    // MCP one, which this page cannot talk to, is not).
    const nav = p.getByRole("navigation", { name: "your agents" });
    await unfoldList(p);
    await nav.getByRole("button", { name: "Coder" }).waitFor({ timeout: WAIT_MS });
    await nav.getByRole("button", { name: "Reviewer" }).waitFor({ timeout: WAIT_MS });
    assert.equal(await nav.getByRole("button", { name: "Files" }).count(), 0);
    await shot(p, "host-agents-after-one-scan.png");
    // The other one, by a tap: it answers too, without another code.
    const other = nav.locator("button[aria-current=false]");
    assert.equal(await other.count(), 1);
    const ticket = await other.getAttribute("data-ticket");
    await other.click();
    await p.waitForFunction((t) => window.thunderbolt?.state.ticket === t && document.querySelector("#status").className === "ok", ticket, { timeout: WAIT_MS });
    assert.match(await prompt(p, "and you"), /^You said: and you; pid \d+$/);
  } finally {
    await ctx.close();
    host.child.kill("SIGTERM");
  }
});

test("the list: the laptop's session at another agent of the host, waiting for an answer, shown first and joined from the list; control taken, the question answered on the phone, control given back", async () => {
  const home = tempHome();
  mkdirSync(join(home, "agents.d"), { mode: 0o700 });
  for (const [name, label] of [["coder", "Coder"], ["reviewer", "Reviewer"]]) {
    const f = join(home, "agents.d", `${name}.json`);
    writeFileSync(f, JSON.stringify({ name, protocol: "acp", label, command: ASK_AGENT }));
    chmodSync(f, 0o600);
  }
  const host = run(join(BIN, "thunderbolt"), ["host"], { ...tbEnv(home, relay.url), THUNDERBOLT_HOST_NAME: "workstation" });
  await waitFor(() => host.out.filter((l) => l.trim().startsWith("Ticket:")).length === 2, "the host's two tickets")
    .catch((e) => { throw new Error(`${e.message}\n${host.err}`); });
  const minted = JSON.parse(tb(home, relay.url, ["iroh", "pair", "--json", "--app-url", baseUrl]));
  const reviewer = minted.agents.find((a) => a.name === "reviewer").ticket;
  // The laptop: one of the owner's own devices (a code of its own), its
  // session at the reviewer left asking for a permission.
  const laptopHome = tempHome();
  const code = JSON.parse(tb(home, relay.url, ["iroh", "pair", "--json"])).code;
  execFileSync(join(BIN, "thunderbolt"), ["acp", "connect", "--pair", code, "--device-name", "laptop", reviewer], {
    env: { ...process.env, ...tbEnv(laptopHome, relay.url) }, stdio: ["ignore", "ignore", "pipe"],
  });
  const laptop = jsonConnect(laptopHome, relay.url, [reviewer]);
  const ctx = await browser.newContext(PHONE);
  const p = await ctx.newPage();
  p.on("pageerror", (e) => console.log("page error:", e.message));
  try {
    laptop.send({ jsonrpc: "2.0", id: 0, method: "initialize", params: { protocolVersion: 1 } });
    laptop.send({ jsonrpc: "2.0", id: 1, method: "session/new", params: { cwd: "/", mcpServers: [] } });
    const sid = (await laptop.seen((v) => v.id === 1, "the laptop's session")).result.sessionId;
    laptop.send({ jsonrpc: "2.0", id: 2, method: "session/prompt", params: { sessionId: sid, prompt: [{ type: "text", text: "permission" }] } });
    const unknown = await laptop.seen((v) => v.method === "x_unknown/thing", "the reviewer's first request");
    laptop.send({ jsonrpc: "2.0", id: unknown.id, error: { code: -32601, message: "not here" } });
    await laptop.seen((v) => v.method === "session/request_permission", "the reviewer's question at the laptop");
    // The phone scans the host's link: its own session with the first agent.
    await p.goto(minted.link);
    await connected(p);
    await unfoldList(p);
    const sessions = p.getByRole("list", { name: "sessions on workstation" });
    const theirs = sessions.getByRole("button", { name: /^Reviewer · Laptop's needs your answer/ });
    await theirs.waitFor({ timeout: WAIT_MS });
    assert.equal(await sessions.getByRole("button").first().getAttribute("data-session"), await theirs.getAttribute("data-session"), "the one that needs an answer first");
    await shot(p, "list-needs-your-answer.png");
    // A tap joins it (the page's own session is kept, to resume later): its
    // history, the laptop in control, the question waiting.
    await theirs.click();
    await p.waitForFunction(() => /^joined/.test(document.querySelector("#status")?.textContent || ""), null, { timeout: WAIT_MS });
    assert.equal(await p.textContent("#agent-name"), "Reviewer");
    await control(p).getByText("Laptop is in control").waitFor({ timeout: WAIT_MS });
    await p.getByRole("button", { name: "Take control" }).click();
    await control(p).getByText("You are in control").waitFor({ timeout: WAIT_MS });
    await p.getByRole("button", { name: "Allow", exact: true }).click({ timeout: WAIT_MS });
    // The reviewer's turn goes on with the phone's answer; the laptop sees it end.
    const ended = await laptop.seen((v) => v.id === 2 && v.result, "the laptop's turn, answered from the phone");
    assert.equal(ended.result.stopReason, "end_turn");
    await conversationOf(p).getByText(/allow/).first().waitFor({ timeout: WAIT_MS });
    await shot(p, "list-joined-and-answered.png");
    // Given back: the laptop, still attached, is in control again.
    await p.getByRole("button", { name: "Give back to Laptop" }).click();
    await control(p).getByText("Laptop is in control").waitFor({ timeout: WAIT_MS });
  } finally {
    laptop.child.stdin.end();
    await ctx.close();
    host.child.kill("SIGTERM");
  }
});

test("three hosts of five agents each in one list, by the names the hosts gave; one host off is shown unreachable and the others answer", async () => {
  const hosts = [];
  for (const letter of ["A", "B", "C"]) {
    const home = tempHome();
    mkdirSync(join(home, "agents.d"), { mode: 0o700 });
    for (let i = 1; i <= 5; i++) {
      const f = join(home, "agents.d", `agent${i}.json`);
      writeFileSync(f, JSON.stringify({ name: `agent${i}`, protocol: "acp", label: `${letter}${i} helper`, command: ASK_AGENT }));
      chmodSync(f, 0o600);
    }
    const host = run(join(BIN, "thunderbolt"), ["host"], { ...tbEnv(home, relay.url), THUNDERBOLT_HOST_NAME: `workstation-${letter}` });
    hosts.push({ letter, home, host });
  }
  for (const h of hosts) {
    await waitFor(() => h.host.out.filter((l) => l.trim().startsWith("Ticket:")).length === 5, `host ${h.letter}'s five tickets`)
      .catch((e) => { throw new Error(`${e.message}\n${h.host.err}`); });
  }
  const ctx = await browser.newContext(PHONE);
  const p = await ctx.newPage();
  p.on("pageerror", (e) => console.log("page error:", e.message));
  try {
    // One scan per host.
    for (const h of hosts) {
      const minted = JSON.parse(tb(h.home, relay.url, ["iroh", "pair", "--json", "--app-url", baseUrl]));
      await p.goto(minted.link);
      await connected(p);
      assert.equal(await p.evaluate(() => window.paired.host), `workstation-${h.letter}`);
    }
    // Host B goes off; the page is opened again (a new visit asks every host).
    hosts[1].host.child.kill("SIGKILL");
    await p.reload();
    await connected(p);
    const nav = p.getByRole("navigation", { name: "your agents" });
    await unfoldList(p);
    for (const h of hosts) {
      const group = nav.getByRole("group", { name: `workstation-${h.letter}` });
      await group.waitFor({ timeout: WAIT_MS });
      for (let i = 1; i <= 5; i++) await group.getByRole("button", { name: `${h.letter}${i} helper`, exact: true }).waitFor({ timeout: WAIT_MS });
      assert.equal(await group.getByRole("list", { name: `agents of workstation-${h.letter}` }).getByRole("button").count(), 5, `host ${h.letter}: its five agents`);
    }
    const state = (letter) => nav.getByRole("group", { name: `workstation-${letter}` }).locator(".host-state");
    await p.waitForFunction(() => [...document.querySelectorAll(".host-state")].every((e) => e.textContent !== "checking…"), null, { timeout: WAIT_MS });
    assert.match(await state("A").textContent(), /^reachable · /);
    assert.match(await state("C").textContent(), /^reachable · /);
    assert.equal(await state("B").textContent(), "unreachable");
    await shot(p, "hosts-list.png");
    // An agent of another host, by a tap: it answers.
    await nav.getByRole("group", { name: "workstation-A" }).getByRole("button", { name: "A3 helper", exact: true }).click();
    await p.waitForFunction(() => document.querySelector("#agent-name").textContent === "A3 helper" && document.querySelector("#status").className === "ok", null, { timeout: WAIT_MS });
    assert.match(await prompt(p, "hello A3"), /^You said: hello A3; pid \d+$/);
  } finally {
    await ctx.close();
    for (const h of hosts) h.host.child.kill("SIGTERM");
  }
});

test("the host killed mid-turn (SIGKILL) and started again at once: the page notices without waiting for its idle timeout and offers the turn again", async () => {
  const home = tempHome();
  const store = join(tempHome(), "store");
  const agent = [process.execPath, join(ROOT, "client-wasm/e2e/restart-agent.mjs"), "--store", store, "--caps", "load", "--chunk-ms", "150"];
  let b = await startAcpBridge(relay.url, agent, [], { home });
  const minted = JSON.parse(tb(b.home, relay.url, ["iroh", "pair", "--json", "--app-url", baseUrl]));
  const ctx = await browser.newContext(PHONE);
  const p = await ctx.newPage();
  try {
    // An idle timeout of a minute: only the page's silence watch can notice in time.
    await p.goto(`${minted.link}&idle=60000`);
    await connected(p);
    await p.getByRole("textbox", { name: "prompt" }).fill("stream 12");
    await p.getByRole("button", { name: "Send", exact: true }).click();
    await p.waitForFunction(() => (document.querySelector("#reply")?.textContent || "").includes("chunk 2/12"), null, { timeout: WAIT_MS });
    b.child.kill("SIGKILL");
    await new Promise((r) => b.child.once("exit", r));
    const restarting = Date.now();
    b = await startAcpBridge(relay.url, agent, [], { home });
    const ready = Date.now();
    await p.getByRole("button", { name: "Send again" }).waitFor({ timeout: WAIT_MS });
    console.log(`the page offered the turn again ${((Date.now() - restarting) / 1000).toFixed(2)} s after the restart began (${((Date.now() - ready) / 1000).toFixed(2)} s after the bridge was ready)`);
    assert.match(await p.evaluate(() => window.lastLoss || ""), /nothing heard from the bridge/);
    await conversationOf(p).getByText(/not finished: the host restarted/).waitFor({ timeout: WAIT_MS });
  } finally {
    await ctx.close();
    b.child.kill("SIGTERM");
  }
});

test("one session of a page goes silent and the page's endpoint is renewed: its other session, to another bridge, moves to the fresh endpoint and goes on", async () => {
  const a = await startAcpBridge(relay.url, ASK_AGENT);
  const b = await startAcpBridge(relay.url, ASK_AGENT);
  const p = await pairedPhone(a);
  try {
    const minted = JSON.parse(tb(b.home, relay.url, ["iroh", "pair", "--json", "--app-url", baseUrl]));
    await p.goto(minted.link);
    await connected(p);
    await p.evaluate(async ([ta, tb]) => {
      const client = window.thunderbolt.state.client;
      window.ev = { a: [], b: [] };
      const open = async (ticket, k) => {
        const c = await client.connectProtocol(ticket, "acp", undefined, undefined, { idleTimeoutMs: 1500, onEvent: (e) => window.ev[k].push(e.type) });
        const r = c.messages().getReader();
        await c.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: 1 } });
        const { value } = await r.read();
        if (value.id !== 1) throw new Error("no initialize reply");
        return { c, r };
      };
      window.sa = await open(ta, "a");
      window.sb = await open(tb, "b");
    }, [a.ticket, b.ticket]);
    // Bridge A stops answering: A's session hears nothing, takes the path
    // for dead and redials from a fresh endpoint, closing the old one, on
    // which B's session was going on.
    await p.evaluate(() => {
      // B's next message, or how its session ended.
      window.bNext = window.sb.r.read().then((v) => (v.done ? "ended" : v.value), (e) => `ended: ${e.message || e}`);
      window.bNext.then((v) => (window.bOver = typeof v === "string"));
    });
    process.kill(a.child.pid, "SIGSTOP");
    try {
      await p.waitForFunction(() => window.ev.a.includes("reconnecting"), null, { timeout: WAIT_MS });
      await p.waitForFunction(() => window.ev.b.includes("resumed") || window.bOver, null, { timeout: WAIT_MS });
      const r = await p.evaluate(async () => {
        if (window.bOver) return { over: await window.bNext, events: window.ev.b };
        await window.sb.c.send({ jsonrpc: "2.0", id: 2, method: "initialize", params: { protocolVersion: 1 } });
        const v = await window.bNext;
        return { id: v.id, events: window.ev.b };
      });
      assert.deepEqual(r, { id: 2, events: ["reconnecting", "resumed"] }, "B's session goes on from the fresh endpoint");
    } finally {
      process.kill(a.child.pid, "SIGCONT");
    }
    await p.evaluate(() => { window.sa.c.close(); window.sb.c.close(); });
  } finally {
    await p.context().close();
    a.child.kill("SIGTERM");
    b.child.kill("SIGTERM");
  }
});

test("the laptop's session picked up on the phone: the page lists it, joins it with its history, takes control and goes on with it", async () => {
  const b = await startAcpBridge(relay.url, ASK_AGENT);
  const laptopHome = pairedLaptop(b);
  const laptop = jsonConnect(laptopHome, relay.url, [b.ticket]);
  try {
    laptop.send({ jsonrpc: "2.0", id: 0, method: "initialize", params: { protocolVersion: 1 } });
    laptop.send({ jsonrpc: "2.0", id: 1, method: "session/new", params: { cwd: "/", mcpServers: [] } });
    const sid = (await laptop.seen((v) => v.id === 1, "the laptop's session")).result.sessionId;
    laptop.send({ jsonrpc: "2.0", id: 2, method: "session/prompt", params: { sessionId: sid, prompt: [{ type: "text", text: "started on the laptop" }] } });
    await laptop.seen((v) => v.id === 2 && v.result, "the laptop's turn");
    const p = await pairedPhone(b);
    try {
      const join = p.getByRole("button", { name: "Join Laptop's session" });
      await join.waitFor({ timeout: WAIT_MS });
      await shot(p, "session-pick-up-offered.png");
      await join.click();
      // Its history: the laptop's turn; then the laptop in control, one tap to take it.
      await conversationOf(p).getByText(/You said: started on the laptop/).waitFor({ timeout: WAIT_MS });
      await control(p).getByText("Laptop is in control").waitFor({ timeout: WAIT_MS });
      // The history's turn is the laptop's, not the agent's on its own.
      const earlier = conversationOf(p).locator("article.turn", { hasText: "You said: started on the laptop" });
      assert.equal(await earlier.locator(".bubble.other").textContent(), "a prompt from Laptop");
      await p.getByRole("button", { name: "Take control" }).click();
      await control(p).getByText("You are in control").waitFor({ timeout: WAIT_MS });
      assert.match(await prompt(p, "finished on the phone"), /^You said: finished on the phone; pid \d+$/);
      await shot(p, "session-picked-up.png");
      // The laptop saw the phone's turn, and is told it watches now.
      await laptop.seen((v) => v.params?.update?.content?.text?.startsWith("You said: finished on the phone"), "the phone's reply at the laptop");
    } finally {
      await p.context().close();
    }
  } finally {
    laptop.child.stdin.end();
    b.child.kill("SIGTERM");
  }
});
