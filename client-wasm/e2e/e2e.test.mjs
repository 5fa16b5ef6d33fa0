// End to end: the wasm client in real headless Chromium, against a real
// `thunderbolt` bridge, through a real local relay (`thunderbolt-relay --dev`).
// Everything listens on 127.0.0.1; the bridge has every public knob off.
//
// Needs: client-wasm/pkg (client-wasm/build.sh), the workspace binaries
// (cargo build --workspace --bins), Debian chromium, `npm ci` here.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, readdirSync, readFileSync, existsSync, writeFileSync, chmodSync } from "node:fs";
import { join } from "node:path";
import { spawn, spawnSync } from "node:child_process";
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";
import { startServer } from "../serve.mjs";
import { ROOT, BIN, WAIT_MS, waitFor, run, tbEnv, tempHome, tb, endAll, procs, jsonConnect } from "./harness.mjs";

const ARTIFACTS = join(ROOT, "target/e2e-artifacts");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";

let relayUrl, server, browser, page, baseUrl;
let bridge; // { child, ticket, home, log }
let relayProc; // the relay process (the last test restarts it)

function bridgeEnv(home) {
  return tbEnv(home, relayUrl);
}

async function startBridge(agent = [], extra = [], env = {}) {
  const home = tempHome();
  const args = ["acp", "--transport", "iroh", ...extra, ...(agent.length ? ["--", ...agent] : [])];
  const p = run(join(BIN, "thunderbolt"), args, { ...bridgeEnv(home), ...env });
  await waitFor(() => p.out.some((l) => l.trim().startsWith("Allow a peer:")), "bridge banner").catch((e) => {
    throw new Error(`${e.message}; stderr:\n${p.err}`);
  });
  const ticket = p.out.map((l) => l.trim()).find((l) => l.startsWith("Ticket:")).split(/\s+/)[1];
  return Object.assign(p, { ticket, home });
}

function allow(b, nodeId) {
  tb(b.home, relayUrl, ["iroh", "allow", nodeId]);
}

/// The bridge's agent processes: its children (the built-in agent runs as `thunderbolt acp serve`).
function agentPids(b) {
  const pids = [];
  for (const tid of readdirSync(`/proc/${b.child.pid}/task`)) {
    const f = `/proc/${b.child.pid}/task/${tid}/children`;
    if (existsSync(f)) pids.push(...readFileSync(f, "utf8").split(/\s+/).filter(Boolean).map(Number));
  }
  return pids;
}

function alive(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.split(" ")[2] !== "Z";
  } catch {
    return false;
  }
}

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  const relay = run(join(BIN, "thunderbolt-relay"), ["--dev", "--bind", "127.0.0.1:0"]);
  relayProc = relay;
  await waitFor(() => relay.out.find((l) => l.startsWith("relay listening on ")), "relay");
  relayUrl = relay.out.find((l) => l.startsWith("relay listening on ")).split(" ").pop();
  bridge = await startBridge();
  server = await startServer(0);
  baseUrl = `http://127.0.0.1:${server.address().port}`;
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
  page = await browser.newPage();
  page.on("console", (m) => process.env.E2E_VERBOSE && console.log("page:", m.text()));
  page.on("pageerror", (e) => console.log("page error:", e.message));
  const q = new URLSearchParams({ relay: relayUrl, ticket: bridge.ticket });
  await page.goto(`${baseUrl}/www/?${q}`);
  await page.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
});

after(async () => {
  await browser?.close();
  server?.close();
  endAll();
});

test("a browser NodeId that is not allowed gets `not allowlisted` as a typed error", async () => {
  const nodeId = await page.textContent("#node-id");
  assert.match(nodeId, /^[0-9a-f]{64}$/);
  assert.equal(await page.textContent("#allow-cmd"), `thunderbolt iroh allow ${nodeId}`);
  await page.click("#connect");
  await page.waitForFunction(() => window.lastError, null, { timeout: WAIT_MS });
  const err = await page.evaluate(() => window.lastError);
  assert.deepEqual({ kind: err.kind, code: err.code, reason: err.reason }, { kind: "closed", code: 1, reason: "not allowlisted" });
  assert.match(await page.textContent("#status"), /not allowlisted/);
  assert.deepEqual(agentPids(bridge), [], "nothing may be spawned for a refused peer");
});

test("the ACP exchange streams the reply, with a stable NodeId across reloads", async () => {
  const nodeId = await page.textContent("#node-id");
  allow(bridge, nodeId);
  // The secret lives in localStorage: a reload keeps the NodeId that was just allowed.
  await page.reload();
  await page.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  assert.equal(await page.textContent("#node-id"), nodeId);
  await page.click("#connect");
  await page.waitForFunction(() => document.querySelector("#status").className === "ok", null, { timeout: WAIT_MS });
  await page.fill("#prompt", "hello from chromium");
  await page.click("#send");
  await page.waitForFunction(() => document.querySelector("#reply").dataset.stopReason === "end_turn", null, { timeout: WAIT_MS });
  assert.equal(await page.textContent("#reply"), "You said: hello from chromium");
  const updates = await page.evaluate(() => [...document.querySelectorAll("#log div")].filter((d) => d.textContent.includes("agent_message_chunk")).length);
  assert.ok(updates >= 2, `expected a streamed reply, saw ${updates} update(s)`);
  await page.screenshot({ path: join(ARTIFACTS, "demo-page.png"), fullPage: true });
});

test("two connections from one client work at the same time", async () => {
  const result = await page.evaluate(async (ticket) => {
    const client = window.thunderbolt.state.client;
    const [a, b] = await Promise.all([client.connectProtocol(ticket, "acp"), client.connectProtocol(ticket, "acp")]);
    const ra = a.messages().getReader();
    const rb = b.messages().getReader();
    await Promise.all([
      a.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: 1 } }),
      b.send('{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":1}}'),
    ]);
    const [ma, mb] = await Promise.all([ra.read(), rb.read()]);
    a.close();
    b.close();
    return [ma.value.id, mb.value.id, ma.value.result.protocolVersion, mb.value.result.protocolVersion];
  }, bridge.ticket);
  assert.deepEqual(result, [1, 7, 1, 1]);
});

test("closing the page's connection kills the agent on the bridge", async () => {
  // The connection from the exchange test is still open: its agent is alive.
  const pids = await waitFor(() => { const p = agentPids(bridge); return p.length ? p : null; }, "a live agent");
  await page.click("#disconnect");
  await waitFor(() => pids.every((pid) => !alive(pid)), `agents ${pids} to exit`);
  assert.deepEqual(agentPids(bridge).filter(alive), []);
  await page.waitForFunction(() => !document.querySelector("#connect").disabled, null, { timeout: WAIT_MS });
  assert.equal(await page.textContent("#status"), "disconnected: you closed the session");
});

/// A NodeId (64 hex digits) in the form the app's own form accepts: unpadded
/// RFC 4648 base32, lowercase (52 characters of a-z2-7).
function base32(hex) {
  const abc = "abcdefghijklmnopqrstuvwxyz234567";
  let bits = 0, acc = 0, out = "";
  for (const b of Buffer.from(hex, "hex")) {
    acc = (acc << 8) | b; bits += 8;
    while (bits >= 5) { bits -= 5; out += abc[(acc >> bits) & 31]; }
    acc &= (1 << bits) - 1;
  }
  return bits > 0 ? out + abc[(acc << (5 - bits)) & 31] : out;
}

test("drop-in: the app's module name, and a ticket, a hex NodeId and a base32 NodeId each complete an ACP exchange", async () => {
  const hex = bridge.out.map((l) => l.trim()).find((l) => l.startsWith("NodeId:")).split(/\s+/)[1];
  assert.match(hex, /^[0-9a-f]{64}$/);
  const b32 = base32(hex);
  assert.match(b32, /^[a-z2-7]{52}$/, "the app's form accepts ^[a-z2-7]{52,}$");
  // The CLI's own base32 (`iroh id --json`) is the same spelling as this independent encoder's.
  const id = JSON.parse(tb(bridge.home, relayUrl, ["iroh", "id", "--json"]));
  assert.deepEqual([id.nodeId, id.nodeIdBase32], [hex, b32]);
  const r = await page.evaluate(async (targets) => {
    // As the app imports it: the module under its own file name, initialised by its default export.
    const alias = await import("../pkg/thunderbolt_acp_client.js");
    await alias.default();
    const client = window.thunderbolt.state.client;
    const out = { sameClass: client instanceof alias.IrohClient, replies: [] };
    for (const [i, target] of targets.entries()) {
      const conn = await client.connectProtocol(target, "acp");
      const reader = conn.messages().getReader();
      await conn.send({ jsonrpc: "2.0", id: 100 + i, method: "initialize", params: { protocolVersion: 1 } });
      const { value } = await reader.read();
      out.replies.push([value.id, value.result.protocolVersion]);
      conn.close();
    }
    return out;
  }, [bridge.ticket, hex, b32]);
  assert.deepEqual(r, { sameClass: true, replies: [[100, 1], [101, 1], [102, 1]] });
});

test("32 MiB of varied ndjson through a cat agent arrives intact (SHA-256 both ends)", async () => {
  const cat = await startBridge([join(BIN, "test-agent"), "cat"]);
  allow(cat, await page.textContent("#node-id"));
  const r = await page.evaluate(async ([ticket, total]) => {
    // Lines of ~16 KiB, each different (a counter and pseudo-random text), all valid JSON.
    let seed = 0x9e3779b9;
    const rand = () => { seed ^= seed << 13; seed ^= seed >>> 17; seed ^= seed << 5; return seed >>> 0; };
    const abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 .,;:-_";
    const sent = new Uint8Array(total + 32 * 1024);
    const enc = new TextEncoder();
    let n = 0;
    for (let k = 0; n < total; k++) {
      let text = "";
      for (let j = 0; j < 16000; j++) text += abc[rand() % abc.length];
      const line = enc.encode(`{"n":${k},"d":"${text}"}\n`);
      sent.set(line, n);
      n += line.length;
    }
    const conn = await window.thunderbolt.state.client.connect(ticket, "thunderbolt/acp/0");
    const reader = conn.readable().getReader();
    const writer = (async () => {
      for (let off = 0; off < n; off += 1 << 20) await conn.send(sent.subarray(off, Math.min(n, off + (1 << 20))));
    })();
    const got = new Uint8Array(n);
    let m = 0;
    while (m < n) {
      const { value, done } = await reader.read();
      if (done) break;
      got.set(value.subarray(0, n - m), m);
      m += value.length;
    }
    await writer;
    conn.close();
    const hex = async (b) => [...new Uint8Array(await crypto.subtle.digest("SHA-256", b))].map((x) => x.toString(16).padStart(2, "0")).join("");
    return { sent: n, received: m, same: (await hex(sent.subarray(0, n))) === (await hex(got)) };
  }, [cat.ticket, 32 << 20]);
  assert.ok(r.sent >= 32 << 20, `sent only ${r.sent} bytes`);
  assert.equal(r.received, r.sent);
  assert.equal(r.same, true, "SHA-256 of what arrived differs from what was sent");
});

test("errors are typed: bad input, wrong protocol, bad frames, dial timeout", async () => {
  const r = await page.evaluate(async (ticket) => {
    const client = window.thunderbolt.state.client;
    const out = {};
    try { await client.connectProtocol("not-a-ticket", "acp"); } catch (e) { out.input = e.kind; }
    try { await client.connectProtocol(ticket, "Bad Name"); } catch (e) { out.protocol = e.kind; }
    try { await client.connectProtocol(ticket, "mcp"); } catch (e) { out.alpn = e.kind; }
    // Frames the framed API must refuse before anything is sent.
    const conn = await client.connectProtocol(ticket, "acp", undefined, 64 * 1024);
    try { await conn.send("not json"); } catch (e) { out.notJson = e.kind; }
    try { await conn.send({ big: "x".repeat(100 * 1024) }); } catch (e) { out.tooBig = e.kind; }
    try { await client.connectProtocol(ticket, "acp", undefined, 10); } catch (e) { out.tinyFrame = e.kind; }
    await conn.send({ jsonrpc: "2.0", id: 9, method: "initialize", params: { protocolVersion: 1 } });
    out.stillWorks = (await conn.messages().getReader().read()).value.id;
    conn.close();
    // A NodeId nobody serves: the dial is bounded by its timeout.
    const ghost = (await window.thunderbolt.IrohClient.create(undefined, new URLSearchParams(location.search).get("relay"))).nodeId();
    try { await client.connectProtocol(ghost, "acp", 1500); } catch (e) { out.timeout = e.kind; out.retryable = e.retryable; }
    // The CLI's words: a damaged ticket, and a relay this page never reached
    // (dialing a NodeId, which names no relay of its own).
    try { await client.connectProtocol(ticket.slice(0, 52), "acp"); } catch (e) { out.damaged = [e.kind, e.message]; }
    const stranded = await window.thunderbolt.IrohClient.create(undefined, "http://127.0.0.1:9/");
    try { await stranded.connectProtocol(window.thunderbolt.nodeOf(ticket), "acp", 1500); } catch (e) { out.noRelay = [e.kind, e.message]; }
    // A ticket names the bridge's relay: this client reaches the bridge through it (which does not allow it).
    try { out.viaTicket = (await (await stranded.connectProtocol(ticket, "acp")).closed()).reason; } catch (e) { out.viaTicket = e.reason; }
    await stranded.shutdown();
    return out;
  }, bridge.ticket);
  assert.deepEqual(r, {
    input: "input", protocol: "input", alpn: "alpn", notJson: "frame", tooBig: "frame", tinyFrame: "input", stillWorks: 9,
    timeout: "timeout", retryable: true,
    damaged: ["input", "this ticket is damaged: copy it again, whole (from the bridge's banner, or `thunderbolt iroh id` on its machine)"],
    noRelay: ["timeout", "could not reach the relay http://127.0.0.1:9/: is it running, and does this device trust its certificate? (opening http://127.0.0.1:9/ in a browser shows why)"],
    viaTicket: "not allowlisted",
  });
});

test("a crashed agent reaches the page as a typed error, after everything it wrote and an answer for its request", async () => {
  // Takes one request, writes a notification, then dies of SIGKILL without answering.
  const crashing = await startBridge(["sh", "-c", `read -r l; echo '{"jsonrpc":"2.0","method":"note","params":{"n":1}}'; kill -9 $$`]);
  allow(crashing, await page.textContent("#node-id"));
  const r = await page.evaluate(async (ticket) => {
    const client = window.thunderbolt.state.client;
    const conn = await client.connectProtocol(ticket, "acp");
    const reader = conn.messages().getReader();
    await conn.send({ jsonrpc: "2.0", id: 5, method: "ping" });
    const first = await reader.read();
    const answer = await reader.read();
    const out = { note: first.value.params.n, answer: { id: answer.value.id, agentEnd: answer.value.error.data.agentEnd } };
    try {
      const next = await reader.read();
      out.next = next.done ? "done" : "message";
    } catch (e) {
      out.kind = e.kind; out.code = e.code; out.signal = e.signal; out.reason = e.reason; out.retryable = e.retryable;
    }
    const closed = await conn.closed();
    out.closed = { kind: closed.kind, code: closed.code, signal: closed.signal };
    return out;
  }, crashing.ticket);
  assert.deepEqual(r, {
    note: 1, answer: { id: 5, agentEnd: "agent killed by signal 9 (SIGKILL)" },
    kind: "agent", code: 2, signal: 9, reason: "agent killed by signal 9 (SIGKILL)", retryable: true,
    closed: { kind: "agent", code: 2, signal: 9 },
  });
});

test("a bridge that welcomes the page's resumption as another session ends the session, saying so (as connect does: resume.rs)", async () => {
  const fake = run(join(BIN, "wrong-welcome"), ["--relay-url", relayUrl]);
  await waitFor(() => fake.out.some((l) => l.startsWith("Allow a peer:")), "wrong-welcome's ticket");
  const ticket = fake.out.find((l) => l.startsWith("Ticket: ")).split(" ")[1];
  const how = await page.evaluate(async (ticket) => {
    const conn = await window.thunderbolt.state.client.connectProtocol(ticket, "acp");
    await conn.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: 1 } });
    try {
      return { resolved: await conn.closed() };
    } catch (e) {
      return { kind: e.kind, message: e.message, reason: e.reason };
    }
  }, ticket);
  assert.match(JSON.stringify(how), /the bridge welcomed another session than ours/, JSON.stringify(how));
  await waitFor(() => fake.out.some((l) => l.startsWith("closed: ")), "the page closing the lying connection");
  const hellos = fake.out.filter((l) => l.startsWith("hello: "));
  assert.equal(hellos.length, 2, fake.out.join("\n"));
  assert.match(hellos[0], /"session":null/);
  assert.match(hellos[1], /"session":"the-first-session"/, "the page asked for its own session back");
});

test("a page reload in the middle of a streamed reply resumes the session: the reply completes", async () => {
  const nodeId = await page.textContent("#node-id");
  allow(bridge, nodeId);
  const words = Array.from({ length: 400 }, (_, i) => `w${i}`).join(" ");
  const before = await page.evaluate(async ({ ticket, words }) => {
    const client = window.thunderbolt.state.client;
    const conn = await client.connectProtocol(ticket, "acp");
    const reader = conn.messages().getReader();
    const call = async (id, method, params) => {
      await conn.send({ jsonrpc: "2.0", id, method, params });
      for (;;) {
        const { value } = await reader.read();
        if (value.id === id) return value;
      }
    };
    await call(1, "initialize", { protocolVersion: 1 });
    const sid = (await call(2, "session/new", { cwd: "/", mcpServers: [] })).result.sessionId;
    await conn.send({ jsonrpc: "2.0", id: 3, method: "session/prompt", params: { sessionId: sid, prompt: [{ type: "text", text: words }] } });
    // Take two chunks of the reply, then go away mid-reply (state stored after each message).
    let text = "";
    for (let n = 0; n < 2; ) {
      const { value } = await reader.read();
      sessionStorage.setItem("tb_session", JSON.stringify(conn.sessionState()));
      if (value.method === "session/update") { text += value.params.update.content.text; n++; }
    }
    sessionStorage.setItem("tb_text", text);
    return { resumable: conn.resumable, path: conn.path, state: conn.sessionState() };
  }, { ticket: bridge.ticket, words });
  assert.equal(before.resumable, true);
  assert.equal(before.path, "relay", "a browser has no UDP: its path is the relay");
  assert.match(before.state.session, /^[0-9a-f]{32}$/);
  const agentsBefore = agentPids(bridge).filter(alive);
  await page.reload();
  await page.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  const after = await page.evaluate(async (ticket) => {
    const client = window.thunderbolt.state.client;
    const events = [];
    const session = JSON.parse(sessionStorage.getItem("tb_session"));
    const conn = await client.connectProtocol(ticket, "acp", undefined, undefined, { session, onEvent: (e) => events.push(e.type) });
    const reader = conn.messages().getReader();
    let text = sessionStorage.getItem("tb_text");
    for (;;) {
      const { value } = await reader.read();
      if (value.method === "session/update") text += value.params.update.content.text;
      if (value.id === 3) return { text, stop: value.result.stopReason, events };
    }
  }, bridge.ticket);
  assert.equal(after.stop, "end_turn");
  assert.equal(after.text, `You said: ${words}`, "every chunk once, in order, across the reload");
  const agentsAfter = agentPids(bridge).filter(alive);
  for (const pid of agentsBefore) assert.ok(agentsAfter.includes(pid), "the same agent served the resumed session");
});

test("--transport wss: a page from the app's origin runs an ACP exchange over the printed URL", async () => {
  const home = tempHome();
  const p = run(join(BIN, "thunderbolt"), ["acp", "--transport", "wss", "--port", "0"], bridgeEnv(home));
  const url = await waitFor(() => {
    const l = p.out.map((x) => x.trim()).find((x) => x.startsWith("Paste into the app: "));
    return l && l.slice("Paste into the app: ".length);
  }, "wss banner");
  assert.match(url, /^ws:\/\/127\.0\.0\.1:\d+\/\?token=[0-9a-f]{64}$/);
  // The desktop app's origin: http://localhost:1420.
  const appServer = await startServer(1420, "127.0.0.1");
  const appPage = await browser.newPage();
  try {
    await appPage.goto("http://localhost:1420/www/");
    const r = await appPage.evaluate(async (url) => {
      const ws = new WebSocket(url);
      const inbox = [];
      let wake = null;
      ws.onmessage = (e) => { inbox.push(JSON.parse(e.data)); wake && wake(); };
      await new Promise((res, rej) => { ws.onopen = res; ws.onerror = () => rej(new Error("ws error")); });
      const next = async (pred) => {
        for (;;) {
          const i = inbox.findIndex(pred);
          if (i >= 0) return inbox.splice(i, 1)[0];
          await new Promise((res) => (wake = res));
        }
      };
      ws.send(JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: 1 } }));
      const init = await next((m) => m.id === 1);
      ws.send(JSON.stringify({ jsonrpc: "2.0", id: 2, method: "session/new", params: { cwd: "/", mcpServers: [] } }));
      const sid = (await next((m) => m.id === 2)).result.sessionId;
      ws.send(JSON.stringify({ jsonrpc: "2.0", id: 3, method: "session/prompt", params: { sessionId: sid, prompt: [{ type: "text", text: "hello over wss" }] } }));
      const done = await next((m) => m.id === 3);
      const text = inbox.filter((m) => m.method === "session/update").map((m) => m.params.update.content.text).join("");
      const closed = new Promise((res) => (ws.onclose = (e) => res(e.code)));
      ws.close();
      return { version: init.result.protocolVersion, stop: done.result.stopReason, text, closed: await closed };
    }, url);
    assert.deepEqual({ version: r.version, stop: r.stop, text: r.text }, { version: 1, stop: "end_turn", text: "You said: hello over wss" });
    // A page from any other origin is refused before anything runs.
    const refused = await page.evaluate(async (url) => new Promise((res) => {
      const ws = new WebSocket(url);
      ws.onopen = () => res("open");
      ws.onclose = (e) => res(`closed ${e.code}`);
    }), url);
    assert.equal(refused, "closed 1006", "the demo page's origin (127.0.0.1:<port>) is not the app's");
  } finally {
    await appPage.close();
    appServer.close();
    p.child.kill("SIGTERM");
  }
});

test("thunderbolt host: two agents (ACP and MCP) through one relay, each by its ticket, from one page with the app's API", async () => {
  const home = tempHome();
  mkdirSync(join(home, "agents.d"), { mode: 0o700 });
  for (const [name, protocol] of [["coder", "acp"], ["files", "mcp"]]) {
    const f = join(home, "agents.d", `${name}.json`);
    writeFileSync(f, JSON.stringify({ name, protocol, command: [join(BIN, "test-agent"), "cat"] }));
    chmodSync(f, 0o600);
  }
  tb(home, relayUrl, ["iroh", "allow", await page.textContent("#node-id")]);
  const host = run(join(BIN, "thunderbolt"), ["host"], tbEnv(home, relayUrl));
  await waitFor(() => host.out.some((l) => l.includes("Allow a peer:")), "the host's banner").catch((e) => {
    throw new Error(`${e.message}\n${host.err}`);
  });
  const tickets = host.out.map((l) => l.trim()).filter((l) => l.startsWith("Ticket:")).map((l) => l.split(/\s+/)[1]);
  assert.equal(tickets.length, 2, host.out.join("\n"));
  const r = await page.evaluate(async ([coder, files]) => {
    const client = window.thunderbolt.state.client;
    // The app's byte API, as its shipped client uses it, on the ACP agent.
    const a = await client.connect(coder, "thunderbolt/acp/0");
    const reader = a.readable().getReader();
    await a.send(new TextEncoder().encode('{"jsonrpc":"2.0","method":"to","params":{"agent":"coder"}}\n'));
    let text = "";
    while (!text.includes("\n")) text += new TextDecoder().decode((await reader.read()).value);
    // The message API on the MCP one.
    const m = await client.connectProtocol(files, "mcp");
    await m.send({ jsonrpc: "2.0", method: "to", params: { agent: "files" } });
    const { value } = await m.messages().getReader().read();
    a.close();
    m.close();
    return [JSON.parse(text).params.agent, value.params.agent];
  }, tickets);
  assert.deepEqual(r, ["coder", "files"]);
  host.child.kill("SIGTERM");
});

test("the demo page: its relay field is applied, its ticket and session survive a reload, its endings are worded truthfully", async () => {
  // No journal: its shutdown ends the session (a journaling bridge keeps it for its restart, tested below).
  const b = await startBridge([], ["--no-journal"]);
  const ctx = await browser.newContext();
  const p = await ctx.newPage();
  // No ?relay: the page starts on the public relays (unreachable here) until the field says otherwise.
  await p.goto(`${baseUrl}/www/`);
  await p.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  allow(b, await p.textContent("#node-id"));
  await p.fill("#relay", relayUrl);
  await p.fill("#ticket", b.ticket);
  await p.click("#connect");
  await p.waitForFunction(() => document.querySelector("#status").className === "ok" || window.lastError, null, { timeout: WAIT_MS });
  assert.equal(await p.evaluate(() => window.lastError), undefined, await p.textContent("#status"));
  const sid = await p.evaluate(() => window.thunderbolt.state.sessionId);
  const agents = agentPids(b).filter(alive);
  assert.equal(agents.length, 1);
  // A reload: the ticket and the relay are still there, and the session is taken back.
  await p.reload();
  await p.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  assert.equal(await p.inputValue("#ticket"), b.ticket);
  assert.equal(await p.inputValue("#relay"), relayUrl);
  await p.waitForFunction(() => window.resumedAfterReload && document.querySelector("#status").className === "ok", null, { timeout: WAIT_MS });
  assert.equal(await p.textContent("#status"), `resumed after the reload · thunderbolt-echo · session ${sid}`);
  await p.fill("#prompt", "still the same session");
  await p.click("#send");
  await p.waitForFunction(() => document.querySelector("#reply").dataset.stopReason === "end_turn", null, { timeout: WAIT_MS });
  assert.equal(await p.textContent("#reply"), "You said: still the same session");
  assert.deepEqual(agentPids(b).filter(alive), agents, "one agent, before and after the reload");
  await p.screenshot({ path: join(ARTIFACTS, "demo-page-resumed.png"), fullPage: true });
  // The bridge shutting down is said as such, not as a refusal.
  b.child.kill("SIGTERM");
  await p.waitForFunction(() => document.querySelector("#status").className === "error", null, { timeout: WAIT_MS });
  assert.equal(await p.textContent("#status"), "the bridge shut down: connect again once it runs");
  // An agent that exits: its code, in words.
  const c = await startBridge([join(BIN, "test-agent"), "exit-after", "1", "3"]);
  allow(c, await p.textContent("#node-id"));
  await openSettings(p);
  await p.fill("#ticket", c.ticket);
  await p.click("#connect");
  await p.waitForFunction(() => document.querySelector("#status").textContent.startsWith("the agent exited"), null, { timeout: WAIT_MS });
  assert.equal(await p.textContent("#status"), "the agent exited with code 3");
  await ctx.close();
  c.child.kill("SIGTERM");
});

test("the demo page's “notify me”: the bridge's Web Push key over the session, then subscribed or the browser's refusal in words; --no-push said as such", async () => {
  const b = await startBridge();
  const ctx = await browser.newContext({ permissions: ["notifications"] });
  const p = await ctx.newPage();
  await p.goto(`${baseUrl}/www/?${new URLSearchParams({ relay: relayUrl, ticket: b.ticket })}`);
  await p.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  allow(b, await p.textContent("#node-id"));
  await p.click("#connect");
  await p.waitForFunction(() => document.querySelector("#status").className === "ok", null, { timeout: WAIT_MS });
  // Permission is granted already: the page registers by itself on connect.
  await p.waitForFunction(() => window.notifyStatus && !window.notifyStatus.startsWith("not on: “notify me”"), null, { timeout: WAIT_MS });
  // The key the page got is the bridge's VAPID public key (read from its 0600 file, by Node's crypto).
  const der = Buffer.from(readFileSync(join(b.home, "iroh/vapid"), "utf8").trim(), "hex");
  const jwk = (await import("node:crypto")).createPrivateKey({ key: der, format: "der", type: "pkcs8" }).export({ format: "jwk" });
  const expected = Buffer.concat([Buffer.from([4]), Buffer.from(jwk.x, "base64url"), Buffer.from(jwk.y, "base64url")]).toString("base64url");
  assert.equal(await p.evaluate(() => window.pushKey), expected);
  const status = await p.textContent("#notify-status");
  // Headless Chromium here reaches no push service: the page says so. With one, it is registered.
  assert.match(status, /^on: |^not on: the browser could not subscribe \(/, status);
  if (status.startsWith("on: ")) assert.match(readFileSync(join(b.home, "iroh/push.json"), "utf8"), /"endpoint"/);
  // The prompt still works around it: the extension never reached the agent.
  await p.fill("#prompt", "after notify");
  await p.click("#send");
  await p.waitForFunction(() => document.querySelector("#reply").dataset.stopReason === "end_turn", null, { timeout: WAIT_MS });
  assert.equal(await p.textContent("#reply"), "You said: after notify");
  await p.click("#disconnect");
  b.child.kill("SIGTERM");

  const off = await startBridge([], ["--no-push"]);
  allow(off, await p.textContent("#node-id"));
  await openSettings(p);
  await p.fill("#ticket", off.ticket);
  await p.click("#connect");
  await p.waitForFunction(() => window.notifyStatus && window.notifyStatus.startsWith("this bridge sends no Web Push"), null, { timeout: WAIT_MS });
  await ctx.close();
  off.child.kill("SIGTERM");
});

test("the client runs unchanged in a module Web Worker: 1 MiB echoed through a cat agent from the worker", async () => {
  const b = await startBridge([join(BIN, "test-agent"), "cat"]);
  // A fresh identity for the worker (one NodeId on the relay twice would take turns).
  const { secret, nodeId } = await page.evaluate(async (relay) => {
    const c = await window.thunderbolt.IrohClient.create(undefined, relay);
    const r = { secret: c.secretKeyHex(), nodeId: c.nodeId() };
    await c.shutdown();
    return r;
  }, relayUrl);
  allow(b, nodeId);
  const r = await page.evaluate(([secret, relay, ticket]) => new Promise((res) => {
    const w = new Worker(new URL("/e2e/bulk-worker.mjs", location.href), { type: "module" });
    w.onmessage = (e) => { res(e.data); w.terminate(); };
    w.onerror = (e) => res({ error: e.message || "worker error" });
    w.postMessage({ secret, relay, ticket, total: 1 << 20, reps: 1, mode: "bulk", resume: true });
  }), [secret, relayUrl, b.ticket]);
  assert.equal(r.error, undefined, r.error);
  assert.equal(r.mbs.length, 1);
  assert.ok(r.mbs[0] > 0, `an echo rate: ${r.mbs}`);
  b.child.kill("SIGTERM");
});

test("a pairing link: the demo page pairs, connects and runs an ACP exchange; nobody types its NodeId", async () => {
  const b = await startBridge();
  const minted = JSON.parse(tb(b.home, relayUrl, ["iroh", "pair", "--json", "--app-url", baseUrl]));
  assert.equal(minted.ticket, b.ticket, "the running bridge's ticket");
  assert.ok(minted.link.startsWith(`${baseUrl}/settings/agents#ticket=`), minted.link);
  // A fresh profile: a device the workstation has never seen.
  const ctx = await browser.newContext();
  const phone = await ctx.newPage();
  await phone.goto(minted.link);
  await phone.waitForFunction(() => document.querySelector("#status").className === "ok" || window.lastError, null, { timeout: WAIT_MS });
  const err = await phone.evaluate(() => window.lastError);
  assert.equal(err, undefined, `pairing failed: ${JSON.stringify(err)}\n${b.err}`);
  assert.ok(!phone.url().includes("pair="), `the spent code left the address bar: ${phone.url()}`);
  const nodeId = await phone.textContent("#node-id");
  const name = await phone.inputValue("#device-name");
  assert.match(await phone.textContent("#paired-as"), new RegExp(name));
  await phone.fill("#prompt", "paired in one step");
  await phone.click("#send");
  await phone.waitForFunction(() => document.querySelector("#reply").dataset.stopReason === "end_turn", null, { timeout: WAIT_MS });
  assert.equal(await phone.textContent("#reply"), "You said: paired in one step");
  await phone.screenshot({ path: join(ARTIFACTS, "demo-page-paired.png"), fullPage: true });
  const list = JSON.parse(tb(b.home, relayUrl, ["iroh", "list", "--json"]));
  assert.deepEqual(list.devices.map((d) => [d.nodeId, d.name, d.how]), [[nodeId, name, "pairing"]]);
  // The same link in another fresh profile: the code is spent, and says so.
  const ctx2 = await browser.newContext();
  const late = await ctx2.newPage();
  await late.goto(minted.link);
  await late.waitForFunction(() => window.lastError, null, { timeout: WAIT_MS });
  assert.equal((await late.evaluate(() => window.lastError)).reason, "pairing code already used");
  assert.match(await late.textContent("#status"), /^pairing refused: pairing code already used \(mint a new one/);
  assert.equal(JSON.parse(tb(b.home, relayUrl, ["iroh", "list", "--json"])).devices.length, 1);
  await ctx.close();
  await ctx2.close();
  b.child.kill("SIGTERM");
});

/// A device's `thunderbolt acp connect` (the harness's), on this file's relay.
const connectDevice = (home, args) => jsonConnect(home, relayUrl, args);

const note = (n) => ({ jsonrpc: "2.0", method: "note", params: { sessionId: "s-1", n } });

test("several devices on one session: the page lists the laptop's session, joins it as an observer with its history, is told who answered, takes control (the laptop is told it observes and sees the page's line), resumes it after a reload and leaves it", async () => {
  const b = await startBridge([join(BIN, "test-agent"), "cat"]);
  // Both are the owner's own devices, each paired by a one-time code (an `iroh allow` would not do).
  const code = () => JSON.parse(tb(b.home, relayUrl, ["iroh", "pair", "--json"])).code;
  const laptop = connectDevice(tempHome(), ["--pair", code(), "--device-name", "laptop", b.ticket]);
  laptop.send(note(0));
  await laptop.seen((v) => v.params?.n === 0, "the laptop's first line echoed");
  const ctx = await browser.newContext();
  const phone = await openPage(ctx, null);
  const listed = await phone.evaluate(async ([ticket, code]) => {
    const client = window.thunderbolt.state.client;
    const refused = await client.sessions(ticket).then(() => "listed", (e) => `${e.kind} ${e.code} ${e.reason}`);
    if (refused !== "closed 1 not allowlisted") throw new Error(`an unknown device's listing: ${refused}`);
    await client.pair(ticket, code, "phone");
    const unknown = await client.attach(ticket, "nosuchid").then(() => "joined", (e) => `${e.kind} ${e.code} ${e.reason}`);
    if (unknown !== "closed 1 unknown session") throw new Error(`a join of no session: ${unknown}`);
    return client.sessions(ticket);
  }, [b.ticket, code()]);
  assert.equal(listed.length, 1, JSON.stringify(listed));
  const s = listed[0];
  assert.equal(s.startedBy.name, "laptop", JSON.stringify(s));
  assert.ok(s.attached[0].sinceMs > 0, JSON.stringify(s));
  assert.deepEqual(s.attached, [{ node: s.startedBy.node, name: "laptop", role: "controller", seat: `${s.id}.0`, sinceMs: s.attached[0].sinceMs }]);
  assert.deepEqual(s.acpSessions, ["s-1"]);
  assert.equal(s.state, "attached");
  // It joins as an observer with the whole history: the past line, its role, then live lines.
  const joined = await phone.evaluate(async ([ticket, id]) => {
    const client = window.thunderbolt.state.client;
    window.jEvents = [];
    window.jMsgs = [];
    const conn = await client.attach(ticket, id, { observe: true, history: "all", onEvent: (e) => window.jEvents.push(e) });
    window.jConn = conn;
    (async () => {
      const reader = conn.messages().getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        window.jMsgs.push(value);
      }
    })().catch((e) => (window.jErr = `${e.kind}: ${e.message}`));
    return { resumable: conn.resumable, state: conn.sessionState() };
  }, [b.ticket, s.id]);
  assert.equal(joined.resumable, true);
  assert.equal(typeof joined.state.session, "string", "its own token, to resume with");
  const msgs = () => phone.evaluate(() => window.jMsgs);
  await phone.waitForFunction(() => window.jMsgs.some((m) => m.method === "_thunderbolt/role") || window.jErr, null, { timeout: WAIT_MS });
  let m = await msgs();
  assert.deepEqual(m.map((v) => v.method), ["note", "_thunderbolt/role"], JSON.stringify(m));
  assert.equal(m[0].params.n, 0, "the session's history first");
  assert.deepEqual(m[1].params, { role: "observer", controller: { node: s.startedBy.node, name: "laptop" } });
  assert.equal(await phone.evaluate(() => window.jConn.role), "observer");
  assert.deepEqual(await phone.evaluate(() => window.jEvents),
    [{ type: "role", role: "observer", controller: { node: s.startedBy.node, name: "laptop" } }]);
  laptop.send(note(1));
  await phone.waitForFunction(() => window.jMsgs.some((m) => m.params?.n === 1), null, { timeout: WAIT_MS });
  // An observer's request is refused by the bridge, its role named.
  await phone.evaluate(() => window.jConn.send({ jsonrpc: "2.0", id: "p1", method: "session/prompt", params: { sessionId: "s-1" } }));
  await phone.waitForFunction(() => window.jMsgs.some((m) => m.id === "p1"), null, { timeout: WAIT_MS });
  const refused = (await msgs()).find((v) => v.id === "p1");
  assert.equal(refused.error.code, -32003, JSON.stringify(refused));
  assert.match(refused.error.message, /observer/);
  // A request of the agent's (the cat agent echoes one) answered by the laptop: the page is told who answered.
  laptop.send({ jsonrpc: "2.0", id: "q1", method: "fs/read_text_file", params: { path: "/x" } });
  await phone.waitForFunction(() => window.jMsgs.some((m) => m.id === "q1" && m.method), null, { timeout: WAIT_MS });
  laptop.send({ jsonrpc: "2.0", id: "q1", result: { content: "from the laptop" } });
  await phone.waitForFunction(() => window.jEvents.some((e) => e.type === "answered"), null, { timeout: WAIT_MS });
  const answered = (await phone.evaluate(() => window.jEvents)).find((e) => e.type === "answered");
  assert.deepEqual(answered, { type: "answered", id: "q1", by: { node: s.startedBy.node, name: "laptop" } });
  assert.ok((await msgs()).some((v) => v.method === "_thunderbolt/answered"), "the stream carries it too");
  // The page takes control: it is told, and the laptop is told it observes.
  await phone.evaluate(() => window.jConn.takeControl());
  await phone.waitForFunction(() => window.jConn.role === "controller", null, { timeout: WAIT_MS });
  const took = (await phone.evaluate(() => window.jEvents)).filter((e) => e.type === "role").pop();
  assert.equal(took.role, "controller");
  assert.equal(took.controller.name, "phone");
  await waitFor(() => laptop.err.includes("this device observes the session"), "the laptop told it observes")
    .catch((e) => { throw new Error(`${e.message}:\n${laptop.err}`); });
  const role = await laptop.seen((v) => v.method === "_thunderbolt/role", "the laptop's role notice");
  assert.deepEqual([role.params.role, role.params.controller.name], ["observer", "phone"]);
  // The page's line goes to the agent: both devices see it echoed.
  await phone.evaluate(() => window.jConn.send({ jsonrpc: "2.0", method: "note", params: { sessionId: "s-1", n: 2 } }));
  await laptop.seen((v) => v.params?.n === 2, "the page's line echoed to the laptop");
  await phone.waitForFunction(() => window.jMsgs.some((m) => m.params?.n === 2), null, { timeout: WAIT_MS });
  // A reload: the joined session resumes on its own token, as the controller still.
  const state = await phone.evaluate(() => window.jConn.sessionState());
  assert.equal(state.received, (await msgs()).length, "every message taken counts");
  await phone.reload();
  await phone.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  const after = await phone.evaluate(async ([ticket, session]) => {
    const events = [];
    const conn = await window.thunderbolt.state.client.connectProtocol(ticket, "acp", undefined, undefined, { session, onEvent: (e) => events.push(e.type) });
    window.jConn = conn;
    const reader = conn.messages().getReader();
    await conn.send({ jsonrpc: "2.0", method: "note", params: { sessionId: "s-1", n: 3 } });
    // The bridge tells a resumed device its role first, then what follows.
    const { value: told } = await reader.read();
    const role = conn.role;
    const { value } = await reader.read();
    // Its input ends while the laptop is on the session: it leaves once it has what it was sent (code 0).
    await conn.finish();
    const closed = await conn.closed();
    const end = await reader.read().then((r) => (r.done ? "done" : JSON.stringify(r.value)), (e) => `error ${e.message}`);
    return { told, role, first: value, token: conn.sessionState().session, closed, end, events };
  }, [b.ticket, state]);
  assert.equal(after.token, state.session);
  assert.equal(after.told.method, "_thunderbolt/role", "the resumed page is told its role");
  assert.equal(after.told.params.role, "controller");
  assert.equal(after.role, "controller", "conn.role is known again after the reload");
  assert.ok(after.events.includes("role"), "and onEvent heard it");
  assert.deepEqual(after.first.params, { sessionId: "s-1", n: 3 }, "nothing again, nothing lost");
  await laptop.seen((v) => v.params?.n === 3, "the resumed page's line echoed to the laptop");
  assert.deepEqual(after.closed, { kind: "closed", code: 0, reason: "left the session" });
  assert.equal(after.end, "done");
  await waitFor(() => b.err.includes("phone left the session"), "the bridge saying the page left")
    .catch((e) => { throw new Error(`${e.message}:\n${b.err}`); });
  assert.equal(laptop.child.exitCode, null, "the session goes on with the laptop");
  await ctx.close();
  laptop.child.stdin.end();
  b.child.kill("SIGTERM");
});

test("30 reloads of a page that never keeps its session: another device still gets an agent", async () => {
  // Each reload leaves a resumable session behind without a close; the bridge
  // notices after its idle timeout (2 s here, so the reloads can come fast)
  // and keeps at most four detached per device.
  const b = await startBridge([join(BIN, "test-agent"), "cat"], ["--idle-timeout", "2", "--per-remote-max", "100"]);
  allow(b, await page.textContent("#node-id"));
  // A page with the shared page's secret: the same NodeId on every reload.
  const secret = await page.evaluate(() => window.thunderbolt.state.client.secretKeyHex());
  const reloadCtx = await browser.newContext();
  await reloadCtx.addInitScript((s) => localStorage.setItem("thunderbolt_iroh_client_secret", s), secret);
  const reloading = await reloadCtx.newPage();
  const q = new URLSearchParams({ relay: relayUrl });
  for (let i = 0; i < 30; i++) {
    if (i === 0) await reloading.goto(`${baseUrl}/www/?${q}`);
    else await reloading.reload();
    await reloading.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
    const echoed = await reloading.evaluate(async ([ticket, i]) => {
      const conn = await window.thunderbolt.state.client.connectProtocol(ticket, "acp");
      await conn.send({ jsonrpc: "2.0", method: "reload", params: { i } });
      const { value } = await conn.messages().getReader().read();
      return value.params.i;
    }, [b.ticket, i]);
    assert.equal(echoed, i, `reload ${i} got its own session`);
  }
  await reloadCtx.close();
  // A different device (a fresh profile: its own NodeId).
  const ctx = await browser.newContext();
  const other = await ctx.newPage();
  await other.goto(`${baseUrl}/www/?${q}`);
  await other.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  const otherId = await other.textContent("#node-id");
  assert.notEqual(otherId, await page.textContent("#node-id"));
  allow(b, otherId);
  const got = await other.evaluate(async (ticket) => {
    const conn = await window.thunderbolt.state.client.connectProtocol(ticket, "acp");
    await conn.send({ jsonrpc: "2.0", method: "other", params: { ok: true } });
    const { value } = await conn.messages().getReader().read();
    conn.close();
    return value.params.ok;
  }, b.ticket);
  assert.equal(got, true, "the other device's session works");
  await ctx.close();
  await waitFor(() => b.err.includes("has more than 4 detached sessions"), "evictions in the bridge log").catch((e) => {
    throw new Error(`${e.message}:\n${b.err}`);
  });
  assert.ok(!b.err.includes("bridge at capacity"), `nobody was refused:\n${b.err}`);
  b.child.kill("SIGTERM");
});

// ---- the agent's questions, on the page and from its notices (issue 37) ----

/// The tests' ACP agent that asks things (permission, elicitation) and says what it was answered.
const ASK_AGENT = [process.execPath, join(ROOT, "client-wasm/e2e/ask-agent.mjs")];
/// Kept for people to look at (gitignored).
const PAGE_ARTIFACTS = join(ROOT, "client-wasm/e2e/artifacts");
const SW_SCOPE = () => `${baseUrl}/www/`;

async function openPage(ctx, ticket, extra = {}) {
  const p = await ctx.newPage();
  p.on("pageerror", (e) => console.log("page error:", e.message));
  await p.goto(`${baseUrl}/www/?${new URLSearchParams({ relay: relayUrl, ...(ticket ? { ticket } : {}), ...extra })}`);
  await p.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  return p;
}

async function connected(p) {
  await p.waitForFunction(() => document.querySelector("#status").className === "ok" || window.lastError, null, { timeout: WAIT_MS });
  assert.equal(await p.evaluate(() => window.lastError), undefined, await p.textContent("#status"));
}

/// The page's settings sheet (the ticket, this browser, notifications),
/// unfolded: it is folded once the page has connected.
async function openSettings(p) {
  if (!(await p.evaluate(() => document.querySelector("#settings").open))) await p.getByText("Settings", { exact: true }).click();
}

/// The reply of the turn in flight, once it ended.
async function turnDone(p) {
  await p.waitForFunction(() => document.querySelector("#reply").dataset.stopReason === "end_turn", null, { timeout: WAIT_MS });
  return p.textContent("#reply");
}

/// The stand-in push service (tests/push/service.mjs): the bridge pushes to
/// it as to a browser's, and it decrypts each push with its subscription's key.
async function startPushService() {
  const child = spawn(process.execPath, [join(ROOT, "tests/push/service.mjs")], { stdio: ["pipe", "pipe", "inherit"] });
  const lines = [];
  createInterface({ input: child.stdout }).on("line", (l) => lines.push(JSON.parse(l)));
  const first = await waitFor(() => lines[0], "the push service");
  let seen = 1;
  return {
    ok: first.subscriptions.ok,
    async nextPush() {
      const v = await waitFor(() => {
        while (seen < lines.length) {
          const v = lines[seen++];
          if (v.path === "/push/ok") return v;
        }
        return null;
      }, "a push");
      assert.equal(v.error, undefined, JSON.stringify(v));
      return v;
    },
    stop: () => child.stdin.end(),
  };
}

/// Hands a push to the page's service worker in this browser context, as the
/// browser's push service would (DevTools' ServiceWorker.deliverPushMessage:
/// a real `push` event; headless Chromium here reaches no push service).
async function pushChannel(ctx) {
  const helper = await ctx.newPage(); // about:blank: a handle for the DevTools protocol, not a page of the app
  const cdp = await ctx.newCDPSession(helper);
  const regs = new Map();
  cdp.on("ServiceWorker.workerRegistrationUpdated", (e) => {
    for (const r of e.registrations) if (!r.isDeleted) regs.set(r.scopeURL, r);
  });
  await cdp.send("ServiceWorker.enable");
  const reg = await waitFor(() => regs.get(SW_SCOPE()), "the page's service worker registration");
  return {
    deliver: (notice) => cdp.send("ServiceWorker.deliverPushMessage", {
      origin: baseUrl, registrationId: reg.registrationId, data: JSON.stringify(notice),
    }),
    /// Delivers `notice` until a notice is on screen (`ctx`'s service worker
    /// shows it): one was seen to be lost once in a full run (never when the
    /// test ran alone), then put down to DevTools' delivery to a service
    /// worker that is starting; likelier it was the test's own reading of the
    /// notices while the notice was being shown, which made Chromium forget it
    /// (`notices` now waits for the service worker to settle first). A notice
    /// that never shows after three deliveries fails the test.
    deliverShown: async (ctx, notice, what) => {
      for (let i = 0; ; i++) {
        await cdp.send("ServiceWorker.deliverPushMessage", { origin: baseUrl, registrationId: reg.registrationId, data: JSON.stringify(notice) });
        try {
          return await waitNotices(ctx, (ns) => ns.length === 1, what, i < 2 ? 5000 : WAIT_MS);
        } catch (e) {
          if (i >= 2) throw e;
          console.log(`# ${what}: not shown 5 s after its delivery; delivering it again`);
        }
      }
    },
    /// Closes the helper page (no push can be delivered afterwards).
    close: () => helper.close(),
  };
}

/// The page's service worker is active (bounded: a page that registers none fails here).
async function swReady(p) {
  const ok = await p.evaluate((ms) => Promise.race([navigator.serviceWorker.ready.then(() => true),
    new Promise((resolve) => setTimeout(() => resolve(false), ms))]), WAIT_MS);
  assert.equal(ok, true, "the page registered its service worker");
}

async function serviceWorker(ctx) {
  const sw = ctx.serviceWorkers().find((w) => w.url() === `${SW_SCOPE()}sw.js`);
  return sw || ctx.waitForEvent("serviceworker", { predicate: (w) => w.url() === `${SW_SCOPE()}sw.js`, timeout: WAIT_MS });
}

/// The notices the service worker shows now, read once none is being shown
/// or withdrawn: Chromium forgets a notice that getNotifications() reads
/// while the notice's showNotification() is still under way (sw-notices.js,
/// `serially`), so reading while a push is handled would lose the very
/// notice a test waits for.
async function notices(ctx) {
  const sw = await serviceWorker(ctx);
  return sw.evaluate(async (ms) => {
    if (!self.noticesSettled) throw new Error("the service worker has no noticesSettled()");
    let timer;
    const late = new Promise((resolve) => { timer = setTimeout(() => resolve(false), ms); });
    const settled = await Promise.race([self.noticesSettled().then(() => true), late]);
    clearTimeout(timer);
    if (!settled) throw new Error(`the service worker was still showing or withdrawing notices after ${ms} ms`);
    return (await self.registration.getNotifications()).map((n) => ({
      title: n.title, body: n.body, tag: n.tag, data: n.data, actions: n.actions.map((a) => a.title),
    }));
  }, WAIT_MS);
}

async function waitNotices(ctx, pred, what, ms = WAIT_MS) {
  const start = Date.now();
  for (;;) {
    const ns = await notices(ctx);
    if (pred(ns)) return ns;
    if (Date.now() - start > ms) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(ns)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

test("the agent's questions on the page: a permission answered by its buttons Allow and Deny, and cancelled; an elicitation's form; any other request answered -32601; the tool call and plan shown", async () => {
  const b = await startBridge(ASK_AGENT);
  const ctx = await browser.newContext();
  try {
    const p = await connectedPage(ctx, b);
    await p.fill("#prompt", "permission");
    await p.click("#send");
    const allowButton = p.getByRole("button", { name: "Allow", exact: true });
    await allowButton.waitFor({ timeout: WAIT_MS });
    const card = p.locator(".request");
    assert.equal(await card.locator("h3").textContent(), "Delete the build folder");
    assert.equal(await card.locator(".kind").textContent(), "Asker asks permission · delete");
    assert.equal(await card.locator("pre").textContent(), "rm -rf ./build");
    assert.deepEqual(await card.getByRole("button").allTextContents(), ["Allow", "Deny"], "one button per option, named by its name");
    assert.match(await p.textContent("#tools"), /^Delete the build folder \(delete, pending\)/);
    assert.deepEqual(await p.locator("#plan li").allTextContents(),
      ["Look at the build folder (completed, high)", "Delete it (in_progress, medium)"]);
    await allowButton.click();
    assert.match(await turnDone(p), /^unknown: -32601; permission: selected allow-once; pid \d+$/);
    assert.equal(await p.locator(".request").count(), 0, "an answered question leaves the page");

    // The prompt box empties at each send.
    await p.fill("#prompt", "permission");
    await p.click("#send");
    await p.getByRole("button", { name: "Deny", exact: true }).click({ timeout: WAIT_MS });
    assert.match(await turnDone(p), /^unknown: -32601; permission: selected reject-once; pid \d+$/);

    // Cancelling the turn answers its question `cancelled` (ACP's rule for session/cancel).
    await p.fill("#prompt", "permission");
    await p.click("#send");
    await allowButton.waitFor({ timeout: WAIT_MS });
    await p.getByRole("button", { name: "cancel the turn" }).click();
    assert.match(await turnDone(p), /^unknown: -32601; permission: cancelled; pid \d+$/);

    await p.fill("#prompt", "elicit");
    await p.click("#send");
    const form = p.locator("form.request");
    await form.waitFor({ timeout: WAIT_MS });
    assert.equal(await form.locator("h3").textContent(), "Which branch should I push?");
    await form.getByLabel("Branch").fill("main");
    await form.getByLabel("Force push").check();
    await form.getByLabel("Retries").fill("2");
    await form.getByRole("button", { name: "Submit" }).click();
    assert.match(await turnDone(p), /^elicitation: accept \{"branch":"main","force":true,"retries":2\}; pid \d+$/);
  } finally {
    await ctx.close();
    b.child.kill("SIGTERM");
  }
});

test("one session, two tabs of one browser: the second says the first has it, and takes it over (the same agent) once the first is closed", async () => {
  const b = await startBridge();
  const ctx = await browser.newContext();
  try {
    const p1 = await connectedPage(ctx, b);
    const sid = await p1.evaluate(() => window.thunderbolt.state.sessionId);
    const agents = agentPids(b).filter(alive);
    const p2 = await openPage(ctx, b.ticket);
    await p2.waitForFunction(() => window.busyElsewhere === true, null, { timeout: WAIT_MS });
    assert.match(await p2.textContent("#status"), /^this session is open in another tab of this browser/);
    assert.equal(await p2.isDisabled("#send"), true);
    await p1.close();
    await connected(p2);
    assert.equal(await p2.textContent("#status"), `resumed after the reload · thunderbolt-echo · session ${sid}`);
    await p2.fill("#prompt", "taken over");
    await p2.click("#send");
    assert.equal(await turnDone(p2), "You said: taken over");
    assert.deepEqual(agentPids(b).filter(alive), agents, "one agent, in either tab");
  } finally {
    await ctx.close();
    b.child.kill("SIGTERM");
  }
});

/// A page of `ctx` on `b`'s ticket, its NodeId allowed there, connected.
async function connectedPage(ctx, b) {
  const p = await openPage(ctx, b.ticket);
  allow(b, await p.textContent("#node-id"));
  await p.click("#connect");
  await connected(p);
  return p;
}

/// The ask agent's bridge with the tests' push switch, a fresh browser context
/// whose page is connected to it with the stand-in push service's subscription
/// registered over the session (as the page registers the browser's own, which
/// needs a push service on the internet); `body` gets them, then all is stopped.
async function withSubscribedAsker(body) {
  const svc = await startPushService();
  const b = await startBridge(ASK_AGENT, ["--idle-timeout", "2"], { THUNDERBOLT_TEST_PUSH_LOOPBACK: "1" });
  const ctx = await browser.newContext({ permissions: ["notifications"] });
  try {
    const p1 = await connectedPage(ctx, b);
    await swReady(p1);
    assert.deepEqual(await p1.evaluate((sub) => window.thunderbolt.request("_thunderbolt/push/subscribe", sub), svc.ok), { subscribed: true });
    const push = await pushChannel(ctx);
    const [pid] = agentPids(b);
    await body({ svc, b, ctx, p1, push, pid });
  } finally {
    await ctx.close();
    svc.stop();
    b.child.kill("SIGTERM");
  }
}

/// Starts a turn in which the ask agent will ask permission on SIGUSR1, closes
/// the tab once the turn's tool call shows, lets the agent ask once the bridge
/// found the tab gone, and returns the push that tells of it.
async function askWhileAway({ svc, b, p1, pid }) {
  await p1.fill("#prompt", "permission on signal");
  await p1.click("#send");
  await p1.waitForSelector("#tools li", { timeout: WAIT_MS });
  await p1.close();
  await waitFor(() => b.err.includes("the agent keeps running"), "the bridge to find the tab gone");
  process.kill(pid, "SIGUSR1");
  return svc.nextPush();
}

test("a tab closed while the agent is about to ask: the notice comes through the push service, a new tab opens on the same session with the question waiting, it is answered by the same agent; the notice's Allow action's page answers by itself; each notice is withdrawn once answered", async () => {
  await withSubscribedAsker(async ({ svc, b, ctx, p1, push, pid }) => {
    const losses = () => b.err.split("the agent keeps running").length - 1;

    // The agent is told to ask only once the bridge found the tab gone.
    await p1.fill("#prompt", "permission on signal");
    await p1.click("#send");
    await p1.waitForSelector("#tools li", { timeout: WAIT_MS });
    await p1.close();
    await waitFor(() => losses() >= 1, "the bridge to find the tab gone").catch((e) => { throw new Error(`${e.message}\n${b.err}`); });
    process.kill(pid, "SIGUSR1");
    const got = await svc.nextPush();
    assert.deepEqual([got.notice.event, got.notice.detail], ["needs_answer", "session/request_permission"]);
    const [n] = await push.deliverShown(ctx, got.notice, "the notice on screen");
    assert.match(n.title, /needs your answer/);
    assert.deepEqual(n.actions, ["Allow", "Deny"]);
    assert.ok(n.data.url.startsWith(`${SW_SCOPE()}#open=1&notice=${got.notice.session}`), n.data.url);
    // A tap opens data.url (the service worker's notificationclick; a test
    // cannot tap a system notification): a new tab of the same browser.
    const p2 = await ctx.newPage();
    await p2.goto(n.data.url);
    await connected(p2);
    assert.match(await p2.textContent("#status"), /^resumed after the reload · asker · session ask-\d+$/);
    const card = p2.locator(".request");
    await card.waitFor({ timeout: WAIT_MS });
    assert.equal(await card.locator("h3").textContent(), "Delete the build folder");
    assert.equal(await p2.evaluate(() => document.activeElement.textContent), "Allow", "the page opens at the question");
    await p2.getByRole("button", { name: "Allow", exact: true }).click();
    assert.equal(await turnDone(p2), `permission: selected allow-once; pid ${pid}`);
    assert.deepEqual(agentPids(b).filter(alive), [pid], "the same agent, before and after the tab");
    await waitNotices(ctx, (ns) => ns.length === 0, "the notice withdrawn once answered");
    // The bridge's withdrawal of it, for any other device that still shows it.
    const withdrawn = await svc.nextPush();
    assert.deepEqual([withdrawn.notice.event, withdrawn.notice.session, withdrawn.notice.request], ["answered", got.notice.session, got.notice.request]);

    // Again, and this time the notice's Allow action: the page it opens answers with no further tap.
    await p2.fill("#prompt", "permission on signal");
    await p2.click("#send");
    await p2.waitForSelector("#tools li", { timeout: WAIT_MS });
    await p2.close();
    await waitFor(() => losses() >= 2, "the bridge to find the second tab gone");
    process.kill(pid, "SIGUSR1");
    const again = await svc.nextPush();
    const [n2] = await push.deliverShown(ctx, again.notice, "the second notice");
    const sw = await serviceWorker(ctx);
    const allowUrl = await sw.evaluate((d) => self.noticeUrl(d, "allow"), n2.data);
    assert.ok(allowUrl.endsWith("&answer=allow"), allowUrl);
    const p3 = await ctx.newPage();
    await p3.goto(allowUrl);
    assert.equal(await turnDone(p3), `permission: selected allow-once; pid ${pid}`);
    assert.equal(await p3.locator(".request").count(), 0);
    await waitNotices(ctx, (ns) => ns.length === 0, "the second notice withdrawn");
    assert.deepEqual(agentPids(b).filter(alive), [pid]);
  });
});

test("the service worker's half of withdrawal: an `answered` push replaces that request's notice by tag and closes it, an `ended` one every notice of the session; pushes that come at once are handled in order", async () => {
  const ctx = await browser.newContext({ permissions: ["notifications"] });
  try {
    const p = await openPage(ctx, "");
    await swReady(p);
    const push = await pushChannel(ctx);
    await p.close();
    const asks = { agent: "asker", label: "", title: "the agent needs your answer", body: "it asks: session/request_permission",
      event: "needs_answer", detail: "session/request_permission", session: "ab12cd34", at: new Date().toISOString() };
    // Two pushes at once: the service worker shows them one after the other.
    await push.deliver({ ...asks, request: '"ask-1"' });
    await push.deliver({ ...asks, request: '"ask-2"' });
    const two = await waitNotices(ctx, (ns) => ns.length === 2, "two notices");
    assert.deepEqual(two.map((n) => n.tag).sort(), ['tb:ab12cd34:"ask-1"', 'tb:ab12cd34:"ask-2"']);
    await push.deliver({ event: "answered", session: "ab12cd34", request: '"ask-1"' });
    const left = await waitNotices(ctx, (ns) => ns.length === 1, "ask-1's notice withdrawn");
    assert.equal(left[0].data.request, '"ask-2"');
    await push.deliver({ event: "ended", session: "ab12cd34" });
    await waitNotices(ctx, (ns) => ns.length === 0, "every notice of the session withdrawn");
    // A question and its withdrawal at once (answered on another device right
    // away): handled in the order they came, the question is not left on
    // screen. A third push behind them says when both were handled.
    const quick = { ...asks, session: "ef90ab12" };
    await push.deliver({ ...quick, request: '"ask-3"' });
    await push.deliver({ event: "answered", session: "ef90ab12", request: '"ask-3"' });
    await push.deliver({ ...quick, request: '"ask-4"' });
    const last = await waitNotices(ctx, (ns) => ns.some((n) => n.tag === 'tb:ef90ab12:"ask-4"'), "the third push's notice");
    assert.deepEqual(last.map((n) => n.tag), ['tb:ef90ab12:"ask-4"'], "the question answered at once is not left on screen");
  } finally {
    await ctx.close();
  }
});

test("a notice's Allow action with a page of the app open: that page goes to the question and answers it", async () => {
  const b = await startBridge(ASK_AGENT);
  const ctx = await browser.newContext({ permissions: ["notifications"] });
  try {
    const p = await connectedPage(ctx, b);
    await swReady(p);
    await p.fill("#prompt", "permission");
    await p.click("#send");
    await p.getByRole("button", { name: "Allow", exact: true }).waitFor({ timeout: WAIT_MS });
    // The notice as the push handler shows it (this page is attached, so a push would show none),
    // then its Allow action clicked: the service worker's own notificationclick handler runs
    // (dispatched by the test: a test cannot tap a system notification).
    const sw = await serviceWorker(ctx);
    await sw.evaluate(async () => {
      const data = { event: "needs_answer", detail: "session/request_permission", session: "ef56ab12", title: "Asker needs your answer" };
      await self.registration.showNotification(data.title, {
        tag: self.tagOf(data), data: { ...data, url: self.noticeUrl(data) },
        actions: [{ action: "allow", title: "Allow" }, { action: "deny", title: "Deny" }],
      });
      const [n] = await self.registration.getNotifications();
      self.dispatchEvent(new NotificationEvent("notificationclick", { notification: n, action: "allow" }));
    });
    assert.match(await turnDone(p), /^unknown: -32601; permission: selected allow-once; pid \d+$/);
    assert.equal(await p.locator(".request").count(), 0);
    assert.deepEqual(await notices(ctx), [], "the tapped notice is closed");
    assert.equal(ctx.pages().filter((x) => x.url().startsWith(SW_SCOPE())).length, 1, "no second page opened");
  } finally {
    await ctx.close();
    b.child.kill("SIGTERM");
  }
});

test("no notice while the page is visible and attached to its session (the page lists it instead); one once it is not", async () => {
  const b = await startBridge();
  const ctx = await browser.newContext({ permissions: ["notifications"] });
  try {
    const p = await connectedPage(ctx, b);
    await swReady(p);
    const push = await pushChannel(ctx);
    const asks = { agent: "", label: "", title: "the agent needs your answer", body: "it asks: session/request_permission",
      event: "needs_answer", detail: "session/request_permission", session: "cd34ef56", at: new Date().toISOString() };
    await push.deliver({ ...asks, request: '"a"' });
    await p.waitForFunction(() => (window.noticesDone || []).length === 1, null, { timeout: WAIT_MS });
    assert.deepEqual(await p.evaluate(() => window.noticesDone), [false]);
    assert.deepEqual(await notices(ctx), []);
    assert.equal(await p.locator("#notices li").count(), 1, "listed on the page");
    await p.click("#disconnect");
    await p.waitForFunction(() => !document.querySelector("#connect").disabled, null, { timeout: WAIT_MS });
    await push.deliver({ ...asks, request: '"b"' });
    await p.waitForFunction(() => window.noticesDone.length === 2, null, { timeout: WAIT_MS });
    assert.deepEqual(await p.evaluate(() => window.noticesDone), [false, true]);
    assert.deepEqual((await notices(ctx)).map((n) => n.tag), ['tb:cd34ef56:"b"']);
  } finally {
    await ctx.close();
    b.child.kill("SIGTERM");
  }
});

test("the bridge withdraws a notice once its request was answered", async () => {
  // Contract (docs/browser.md, "Notices"): when the client answers a request
  // the bridge notified, it pushes {"event":"answered","session":…,"request":…}.
  await withSubscribedAsker(async ({ svc, b, ctx, p1, push, pid }) => {
    const asked = await askWhileAway({ svc, b, p1, pid });
    assert.equal(asked.notice.request, '"ask-1"', "the notice names the request");
    await push.deliverShown(ctx, asked.notice, "the notice");
    const p2 = await ctx.newPage();
    await p2.goto(`${baseUrl}/www/?${new URLSearchParams({ relay: relayUrl, ticket: b.ticket })}`);
    await p2.getByRole("button", { name: "Allow", exact: true }).click({ timeout: WAIT_MS });
    const answered = await svc.nextPush();
    assert.deepEqual([answered.notice.event, answered.notice.session, answered.notice.request], ["answered", asked.notice.session, '"ask-1"']);
  });
});

test("the notice's Allow action answers without opening a tab: the service worker dials the bridge with the page's identity and answers, the same agent sees allow", async () => {
  // Contract (docs/browser.md, "Answering from the notice without opening a
  // tab"): the needs_answer push carries `answer` (a one-time token) and the
  // permission's `options`; the service worker dials the agent's NodeId on
  // `thunderbolt/acp/answer1` with the browser's own identity and writes one
  // line {"session","request","token","result"}; the bridge answers
  // {"answered":true} and pushes the usual `answered` withdrawal.
  await withSubscribedAsker(async ({ svc, b, ctx, p1, push, pid }) => {
    const got = await askWhileAway({ svc, b, p1, pid });
    assert.deepEqual([got.notice.event, got.notice.detail, got.notice.request], ["needs_answer", "session/request_permission", '"ask-1"']);
    assert.match(String(got.notice.answer), /^[0-9a-f]{32}$/,
      `the bridge's needs_answer push carries no one-time \`answer\` token (the bridge has no answer door, thunderbolt/acp/answer1, yet): ${JSON.stringify(got.notice)}`);
    assert.deepEqual(got.notice.options, [
      { optionId: "allow-once", name: "Allow", kind: "allow_once" },
      { optionId: "reject-once", name: "Deny", kind: "reject_once" },
    ], "the permission's options, for the service worker to pick from");
    const [n] = await push.deliverShown(ctx, got.notice, "the notice on screen");
    assert.deepEqual(n.actions, ["Allow", "Deny"]);
    assert.equal(n.data.answer, got.notice.answer);
    const sw = await serviceWorker(ctx);
    assert.deepEqual(await sw.evaluate((d) => [self.optionFor(d, "allow"), self.optionFor(d, "deny")], n.data), ["allow-once", "reject-once"]);
    // Nothing of the app open, not even the DevTools helper page.
    await push.close();
    assert.deepEqual(ctx.pages(), [], "no page open before the action");
    // The notice shown with `data` (the push's own, or one with another
    // token), then its Allow action: the service worker's own
    // notificationclick handler, dispatched by the test (a test cannot tap a
    // system notification).
    const click = (data) => sw.evaluate(async (data) => {
      await self.registration.showNotification(data.title, {
        tag: self.tagOf(data), data, actions: [{ action: "allow", title: "Allow" }, { action: "deny", title: "Deny" }],
      });
      const [shown] = await self.registration.getNotifications({ tag: self.tagOf(data) });
      self.dispatchEvent(new NotificationEvent("notificationclick", { notification: shown, action: "allow" }));
      return self.lastClick;
    }, data);
    // First with another token: refused, the notice comes back saying why
    // (no page opens: a dispatched event brings no user activation).
    assert.deepEqual(await click({ ...n.data, answer: "0".repeat(32) }), { how: "shown again", why: "wrong token" });
    assert.deepEqual((await notices(ctx)).map((x) => x.body), ["could not answer from here (wrong token): tap to open"]);
    assert.deepEqual(ctx.pages(), []);
    // Then the notice as the push showed it.
    const done = await click(n.data);
    assert.deepEqual(done, { how: "answered" }, `the service worker did not answer by itself: ${JSON.stringify(done)}`);
    const said = `ask-agent ${pid}: permission: selected allow-once; pid ${pid}`;
    await waitFor(() => b.err.includes(said), "the agent to say it was answered allow").catch((e) => { throw new Error(`${e.message}\n${b.err}`); });
    assert.deepEqual(agentPids(b).filter(alive), [pid], "the same agent");
    assert.deepEqual(ctx.pages(), [], "no page opened");
    assert.deepEqual(await notices(ctx), [], "the notice is gone");
    const answered = await svc.nextPush();
    assert.deepEqual([answered.notice.event, answered.notice.session, answered.notice.request], ["answered", got.notice.session, '"ask-1"']);
  });
});

test("at 390 × 844: nothing overflows sideways, buttons big enough to tap, the log folded, installable (manifest, icons), every agent one tap away by its label", async () => {
  const asker = await startBridge(ASK_AGENT);
  const echo = await startBridge();
  const ctx = await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true, deviceScaleFactor: 2 });
  try {
    const p = await openPage(ctx, echo.ticket);
    const id = await p.textContent("#node-id");
    allow(asker, id);
    allow(echo, id);
    // The page reads a ticket's NodeId as the bridge prints it.
    const hex = echo.out.map((l) => l.trim()).find((l) => l.startsWith("NodeId:")).split(/\s+/)[1];
    assert.equal(await p.evaluate((t) => window.thunderbolt.nodeOf(t), echo.ticket), hex);
    await p.click("#connect");
    await connected(p);
    await p.click("#disconnect");
    await p.waitForFunction(() => !document.querySelector("#connect").disabled, null, { timeout: WAIT_MS });
    await openSettings(p);
    await p.fill("#ticket", asker.ticket);
    await p.click("#connect");
    await connected(p);
    await p.fill("#prompt", "permission");
    await p.click("#send");
    await p.getByRole("button", { name: "Allow", exact: true }).waitFor({ timeout: WAIT_MS });
    assert.deepEqual(await p.locator("#agent-list button").allTextContents(), ["Asker", "Thunderbolt echo agent"]);
    mkdirSync(PAGE_ARTIFACTS, { recursive: true });
    await p.screenshot({ path: join(PAGE_ARTIFACTS, "phone-390x844.png"), fullPage: true });
    const layout = await p.evaluate(() => {
      const w = document.documentElement.clientWidth;
      const wide = [...document.querySelectorAll("body *")]
        .filter((e) => { const r = e.getBoundingClientRect(); return r.width > 0 && (r.right > w + 0.5 || r.left < -0.5); })
        .map((e) => `${e.tagName}#${e.id}.${e.className}`);
      const small = [...document.querySelectorAll("button, summary")].filter((e) => e.offsetParent !== null)
        .filter((e) => { const r = e.getBoundingClientRect(); return r.height < 44 || r.width < 44; }).map((e) => e.textContent);
      return { w, scroll: document.documentElement.scrollWidth, wide, small, logOpen: document.querySelector("#log").closest("details").open };
    });
    assert.equal(layout.w, 390);
    assert.ok(layout.scroll <= layout.w, `the page scrolls sideways: ${layout.scroll} > ${layout.w}`);
    assert.deepEqual(layout.wide, [], "elements past the right edge");
    assert.deepEqual(layout.small, [], "tap targets under 44 × 44 px");
    assert.equal(layout.logOpen, false, "the protocol log is folded away");
    const m = await p.evaluate(async () => {
      const href = document.querySelector("link[rel=manifest]").href;
      const j = await (await fetch(href)).json();
      const icons = [];
      for (const i of j.icons) {
        const r = await fetch(new URL(i.src, href));
        icons.push([i.sizes, r.status, r.headers.get("content-type"), (await r.arrayBuffer()).byteLength > 0]);
      }
      return { name: j.short_name, display: j.display, start: new URL(j.start_url, href).href, icons };
    });
    assert.deepEqual(m, {
      name: "thunderbolt", display: "standalone", start: SW_SCOPE(),
      icons: [["192x192", 200, "image/png", true], ["512x512", 200, "image/png", true], ["any", 200, "image/svg+xml", true]],
    });
    // One tap on the other agent: this session is left to resume later, that one opens.
    const loaded = p.waitForEvent("load", { timeout: WAIT_MS });
    await p.getByRole("button", { name: "Thunderbolt echo agent" }).tap();
    await loaded;
    await p.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
    await connected(p);
    assert.match(await p.textContent("#status"), /^connected · thunderbolt-echo · session /);
    assert.equal(await p.inputValue("#ticket"), echo.ticket);
  } finally {
    await ctx.close();
    asker.child.kill("SIGTERM");
    echo.child.kill("SIGTERM");
  }
});

// Last: it restarts the shared relay.
test("the host restarted under an open page: the page says so, keeps its ACP session and a prompt in it works", async () => {
  // An SDK agent that keeps its sessions on disk, on a bridge of its own home.
  const home = tempHome();
  const store = join(tempHome(), "store");
  const agent = ["node", join(ROOT, "client-wasm/e2e/restart-agent.mjs"), "--store", store, "--caps", "load"];
  const start = async () => {
    const p = run(join(BIN, "thunderbolt"), ["acp", "--transport", "iroh", "--", ...agent], bridgeEnv(home));
    await waitFor(() => p.out.some((l) => l.trim().startsWith("Allow a peer:")), "bridge banner").catch((e) => {
      throw new Error(`${e.message}; stderr:\n${p.err}`);
    });
    return Object.assign(p, { home, ticket: p.out.map((l) => l.trim()).find((l) => l.startsWith("Ticket:")).split(/\s+/)[1] });
  };
  let host = await start();
  const tab = await browser.newPage();
  await tab.goto(`${baseUrl}/www/?${new URLSearchParams({ relay: relayUrl, ticket: host.ticket })}`);
  await tab.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  allow(host, await tab.textContent("#node-id"));
  await tab.click("#connect");
  await tab.waitForFunction(() => document.querySelector("#status").className === "ok", null, { timeout: WAIT_MS });
  await tab.fill("#prompt", "first");
  await tab.click("#send");
  await tab.waitForFunction(() => document.querySelector("#reply").dataset.stopReason === "end_turn", null, { timeout: WAIT_MS });
  assert.equal(await tab.textContent("#reply"), "turn 1: first (history: none)");

  host.child.kill("SIGTERM");
  await new Promise((r) => host.child.once("exit", r));
  assert.match(host.err, /session kept for the bridge's restart/);
  await tab.waitForFunction(() => (window.events || []).includes("reconnecting"), null, { timeout: WAIT_MS });
  assert.equal(await tab.textContent("#status"), "reconnecting… (the host is restarting; it keeps the session)");
  host = await start();
  await tab.waitForFunction(() => /^host restarted, session restored/.test(document.querySelector("#status").textContent), null, { timeout: WAIT_MS });
  const sid = await tab.evaluate(() => window.thunderbolt.state.sessionId);
  assert.equal(await tab.textContent("#status"), `host restarted, session restored (load) · restart-agent · session ${sid}`);
  assert.deepEqual(await tab.evaluate(() => window.restored.sessions), [{ sessionId: sid, how: "load" }]);
  await tab.screenshot({ path: join(ARTIFACTS, "demo-page-host-restarted.png"), fullPage: true });
  await tab.fill("#prompt", "second");
  await tab.click("#send");
  await tab.waitForFunction(() => document.querySelector("#reply").dataset.stopReason === "end_turn", null, { timeout: WAIT_MS });
  assert.equal(await tab.textContent("#reply"), "turn 2: second (history: first)", "the same ACP session, its history intact");
  assert.match(readFileSync(join(store, "calls.log"), "utf8"), new RegExp(`load ${sid}`));
  await tab.close();
  host.child.kill("SIGTERM");
});

test("the relay killed and restarted mid-session: the page's session resumes by itself", async () => {
  allow(bridge, await page.textContent("#node-id"));
  // The page's own session, noticing a lost path after 1.5 s; every status it shows is kept.
  await page.goto(`${baseUrl}/www/?${new URLSearchParams({ relay: relayUrl, ticket: bridge.ticket, idle: 1500 })}`);
  await page.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  await openSettings(page);
  await page.click("#connect");
  await page.waitForFunction(() => document.querySelector("#status").className === "ok", null, { timeout: WAIT_MS });
  await page.evaluate(() => {
    window.statuses = [];
    new MutationObserver(() => window.statuses.push(document.querySelector("#status").textContent))
      .observe(document.querySelector("#status"), { childList: true, characterData: true, subtree: true });
  });
  await page.evaluate(async (ticket) => {
    const client = window.thunderbolt.state.client;
    window.rEvents = [];
    const conn = await client.connectProtocol(ticket, "acp", undefined, undefined, {
      idleTimeoutMs: 1500, onEvent: (e) => window.rEvents.push(e.type),
    });
    window.rConn = conn;
    window.rReader = conn.messages().getReader();
    // The byte API (the app's drop-in) resumes too.
    window.bConn = await client.connect(ticket, "thunderbolt/acp/0", undefined, { idleTimeoutMs: 1500 });
    window.bReader = window.bConn.readable().getReader();
    await conn.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: 1 } });
    const { value } = await window.rReader.read();
    if (value.id !== 1) throw new Error("no initialize reply");
  }, bridge.ticket);
  const agentsBefore = agentPids(bridge).filter(alive);
  const port = new URL(relayUrl).port;
  relayProc.child.kill("SIGKILL");
  await page.waitForFunction(() => window.rEvents.includes("reconnecting"), null, { timeout: WAIT_MS });
  await page.waitForFunction(() => document.querySelector("#status").className === "warn", null, { timeout: WAIT_MS });
  assert.equal(await page.textContent("#status"), "reconnecting… (connection lost; the bridge keeps the session)");
  // Sent while the path is down: delivered after the resume.
  await page.evaluate(() => window.rConn.send({ jsonrpc: "2.0", id: 2, method: "session/new", params: { cwd: "/", mcpServers: [] } }));
  const again = run(join(BIN, "thunderbolt-relay"), ["--dev", "--bind", `127.0.0.1:${port}`]);
  await waitFor(() => again.out.find((l) => l.startsWith("relay listening on ")), "the relay back");
  relayProc = again;
  const r = await page.evaluate(async () => {
    const { value } = await window.rReader.read();
    // A line written in two pieces over the resumed byte connection.
    const enc = new TextEncoder();
    await window.bConn.send(enc.encode('{"jsonrpc":"2.0","id":9,"method":"initi'));
    await window.bConn.send(enc.encode('alize","params":{"protocolVersion":1}}\n'));
    let text = "";
    while (!text.includes("\n")) text += new TextDecoder().decode((await window.bReader.read()).value);
    return {
      id: value.id, sid: value.result && value.result.sessionId, events: window.rEvents,
      bytes: { resumable: window.bConn.resumable, path: window.bConn.path, reply: JSON.parse(text).id },
    };
  });
  assert.deepEqual(r.bytes, { resumable: true, path: "relay", reply: 9 }, "the byte API resumed too");
  assert.equal(r.id, 2, "the message sent while the relay was down was answered");
  assert.match(r.sid, /^sess-/);
  assert.deepEqual(r.events.filter((e) => e !== "reconnecting"), ["resumed"]);
  const agentsAfter = agentPids(bridge).filter(alive);
  for (const pid of agentsBefore) assert.ok(agentsAfter.includes(pid), "the same agent served the resumed session");
  await page.waitForFunction(() => document.querySelector("#status").textContent.startsWith("resumed ·"), null, { timeout: WAIT_MS });
  const sid = await page.evaluate(() => window.thunderbolt.state.sessionId);
  assert.equal(await page.textContent("#status"), `resumed · thunderbolt-echo · session ${sid}`);
  await page.fill("#prompt", "after the outage");
  await page.click("#send");
  await page.waitForFunction(() => document.querySelector("#reply").dataset.stopReason === "end_turn", null, { timeout: WAIT_MS });
  assert.equal(await page.textContent("#reply"), "You said: after the outage");
  await page.evaluate(() => { window.rConn.close(); window.bConn.close(); });
});

/// `p`, or an error after `ms`.
function within(p, ms, what) {
  let timer;
  const late = new Promise((_, rej) => (timer = setTimeout(() => rej(new Error(`timed out waiting for ${what}`)), ms)));
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

test("a bridge with two relays, its home relay killed mid-stream: the page's stream completes once and in order through the other (the same agent); a new page with the old ticket reaches the bridge", async () => {
  const startRelay = async () => {
    const r = run(join(BIN, "thunderbolt-relay"), ["--dev", "--bind", "127.0.0.1:0"]);
    const line = await waitFor(() => r.out.find((l) => l.startsWith("relay listening on ")), "a relay");
    return Object.assign(r, { url: line.split(" ").pop() });
  };
  const relays = [await startRelay(), await startRelay()];
  const both = relays.map((r) => r.url).join(",");
  const cat = await startBridge([join(BIN, "test-agent"), "cat"], [], { THUNDERBOLT_IROH_RELAY_URL: both });
  const same = (a, b) => a.replace(/\/$/, "") === b.replace(/\/$/, "");
  /// The relay the bridge is homed on (iroh picks the nearest), as `thunderbolt status` says.
  const homeRelay = () => {
    const v = JSON.parse(tb(cat.home, both, ["status", "--json"]));
    const url = v.bridges?.[0]?.agents?.[0]?.relay?.url;
    return url && relays.find((r) => same(r.url, url));
  };
  const home = await waitFor(homeRelay, "the bridge's home relay");
  const other = relays.find((r) => r !== home);
  // The page is told the bridge's home relay (its own home then); the ticket names both.
  const tab = await browser.newPage();
  await tab.goto(`${baseUrl}/www/?${new URLSearchParams({ relay: home.url, ticket: cat.ticket })}`);
  await tab.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  allow(cat, await tab.textContent("#node-id"));
  const TOTAL = 3000, KILL_AT = 1000;
  const streaming = tab.evaluate(async ([ticket, total, killAt]) => {
    const fo = (window.fo = { events: [], got: 0, paused: null });
    const conn = await window.thunderbolt.state.client.connectProtocol(ticket, "acp", undefined, undefined, {
      onEvent: (e) => fo.events.push([e.type, Date.now()]),
    });
    fo.conn = conn;
    const reader = conn.messages().getReader();
    const arrivals = [];
    for (let n = 0; n < total; n += 100) {
      // Mid-stream: the next 100 go out once the relay is dead.
      if (n === killAt) await new Promise((r) => (fo.paused = r));
      for (let k = n; k < n + 100; k++) conn.send({ jsonrpc: "2.0", method: "n", params: { n: k } });
      for (let k = n; k < n + 100; k++) {
        const { value, done } = await reader.read();
        if (done) throw new Error(`the stream ended at ${k}`);
        if (value.params.n !== k) throw new Error(`expected ${k}, got ${value.params.n}`);
        fo.got = k + 1;
        if (k >= killAt && arrivals.length < 100) arrivals.push(Date.now());
      }
    }
    return { got: fo.got, events: fo.events, arrivals, killedAt: fo.killedAt };
  }, [cat.ticket, TOTAL, KILL_AT]);
  await tab.waitForFunction(() => window.fo && window.fo.paused, null, { timeout: WAIT_MS });
  const agents = agentPids(cat).filter(alive);
  assert.equal(agents.length, 1);
  const homeNow = homeRelay();
  home.child.kill("SIGKILL");
  await new Promise((r) => home.child.once("exit", r));
  const killedAt = Date.now();
  await tab.evaluate((t) => { window.fo.killedAt = t; window.fo.paused(); }, killedAt);
  const r = await within(streaming, WAIT_MS, "the stream");
  assert.equal(r.got, TOTAL, "every message once and in order");
  const first = r.arrivals[0] - r.killedAt;
  const gap = Math.max(first, ...r.arrivals.slice(1).map((t, i) => t - r.arrivals[i]));
  const events = r.events.map(([type, at]) => `${type} +${at - r.killedAt} ms`).join(", ");
  console.log(`relay ${home.url} killed (the bridge's home ${homeNow === home ? "still" : `no longer: ${homeNow?.url}`}) → ` +
    `the next message ${first} ms later (longest wait ${gap} ms); events: ${events}`);
  if (first >= 5000) {
    for (const x of relays) console.log(`relay ${x.url}:\n${x.err}`);
    console.log(`bridge:\n${cat.err.split("\n").filter((l) => /relay|home|path/i.test(l)).join("\n")}`);
  }
  assert.ok(first < 5000, `the next message came ${first} ms after the kill (not at the idle timeout)`);
  assert.deepEqual(agentPids(cat).filter(alive), agents, "the same agent served the stream");
  await tab.evaluate(() => window.fo.conn.close());
  await waitFor(() => homeRelay() === other, "the bridge homed on the other relay");
  await tab.close();

  // A new page, still told the dead relay, with the ticket printed before the kill.
  const late = await browser.newPage();
  await late.goto(`${baseUrl}/www/?${new URLSearchParams({ relay: home.url, ticket: cat.ticket })}`);
  await late.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  allow(cat, await late.textContent("#node-id"));
  const t0 = Date.now();
  const echo = await within(late.evaluate(async (ticket) => {
    const conn = await window.thunderbolt.state.client.connectProtocol(ticket, "acp");
    const reader = conn.messages().getReader();
    await conn.send({ jsonrpc: "2.0", method: "one", params: { one: 1 } });
    const { value } = await reader.read();
    conn.close();
    return value;
  }, cat.ticket), WAIT_MS, "the new page's answer");
  console.log(`a new page told the dead relay, with the old ticket: its first answer ${Date.now() - t0} ms after it dialed`);
  assert.deepEqual(echo, { jsonrpc: "2.0", method: "one", params: { one: 1 } });
  await late.close();
  cat.child.kill("SIGTERM");
  other.child.kill("SIGTERM");
});

/// `thunderbolt acp connect <args>` in `home`, its input empty: what it said last on stderr, without `error: `.
function cliError(home, args, relay = relayUrl) {
  const r = spawnSync(join(BIN, "thunderbolt"), ["acp", "connect", ...args], {
    env: { ...process.env, ...tbEnv(home, relay) }, input: "", timeout: WAIT_MS,
  });
  const last = r.stderr.toString().trim().split("\n").filter((l) => l.startsWith("error: ")).pop() || r.stderr.toString();
  assert.notEqual(r.status, 0, `connect succeeded: ${r.stderr}`);
  return last.replace(/^error: /, "");
}

test("the page and connect say the same words for the same failure: not allowlisted, a wrong code, a spent code, an agent that died saying why, a relay never reached", async () => {
  const b = await startBridge();
  const dying = await startBridge(["sh", "-c", "echo 'missing API key ANTHROPIC_API_KEY' >&2; exit 3"]);
  const cliHome = tempHome();
  const cliId = JSON.parse(tb(cliHome, relayUrl, ["iroh", "id", "--json"])).nodeId;
  const minted = () => JSON.parse(tb(b.home, relayUrl, ["iroh", "pair", "--json"])).code;
  const wrong = (code) => code.slice(0, -1) + (code.endsWith("A") ? "B" : "A");
  const spent = minted();
  allow(dying, await page.textContent("#node-id"));
  const page_ = await page.evaluate(async ([ticket, dyingTicket, relay, wrongCode, spentCode]) => {
    const { IrohClient, describe } = window.thunderbolt;
    const said = async (p) => { try { await p; return "no error"; } catch (e) { return describe(e); } };
    const c = await IrohClient.create(undefined, relay);
    const out = { id: c.nodeId() };
    // Not allowlisted: the refusal arrives on the session's messages.
    out.notAllowed = await said((async () => { const conn = await c.connectProtocol(ticket, "acp"); await conn.messages().getReader().read(); })());
    out.wrong = await said(c.pair(ticket, wrongCode, "phone"));
    await c.pair(ticket, spentCode, "phone");
    await c.shutdown();
    // Another device with the code this one spent.
    const other = await IrohClient.create(undefined, relay);
    out.spent = await said(other.pair(ticket, spentCode, "tablet"));
    await other.shutdown();
    // A device the dying bridge allows (the page's own client).
    const mine = window.thunderbolt.state.client;
    out.died = await said((async () => { const conn = await mine.connectProtocol(dyingTicket, "acp"); const r = conn.messages().getReader(); for (;;) { const { done } = await r.read(); if (done) return; } })());
    const stranded = await IrohClient.create(undefined, "http://127.0.0.1:9/");
    out.noRelay = await said(stranded.connectProtocol(window.thunderbolt.nodeOf(ticket), "acp", 3000));
    await stranded.shutdown();
    return out;
  }, [b.ticket, dying.ticket, relayUrl, wrong(minted()), spent]);
  const words = {
    notAllowed: cliError(cliHome, [b.ticket]).replace(cliId, page_.id),
    wrong: cliError(cliHome, ["--pair", wrong(minted()), b.ticket]),
    spent: cliError(cliHome, ["--pair", spent, b.ticket]),
  };
  allow(dying, cliId);
  words.died = cliError(cliHome, [dying.ticket]);
  const noRelay = cliError(tempHome(), ["--dial-timeout", "3", JSON.parse(tb(b.home, relayUrl, ["iroh", "id", "--json"])).nodeId], "http://127.0.0.1:9/");
  assert.equal(page_.notAllowed, words.notAllowed);
  assert.match(page_.notAllowed, /not allowlisted: on the bridge's machine run `thunderbolt iroh allow [0-9a-f]{64}`/);
  assert.equal(page_.wrong, words.wrong);
  assert.match(page_.wrong, /^pairing refused: pairing code not recognised \(check the code/);
  assert.equal(page_.spent, words.spent);
  assert.match(page_.spent, /^pairing refused: pairing code already used \(mint a new one/);
  assert.equal(page_.died, words.died);
  assert.equal(page_.died, "the agent exited with code 3: missing API key ANTHROPIC_API_KEY");
  // The CLI says more (what its own probe of the relay found), after the same words.
  assert.ok(noRelay.startsWith(page_.noRelay), `page: ${page_.noRelay}\ncli:  ${noRelay}`);
  assert.match(page_.noRelay, /^could not reach the relay http:\/\/127.0.0.1:9\/: is it running/);
  b.child.kill("SIGTERM");
  dying.child.kill("SIGTERM");
});
