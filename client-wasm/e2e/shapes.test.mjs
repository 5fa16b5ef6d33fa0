// A relay agent (the relay contract, v1) served through `thunderbolt host`:
// the sample service in Python (relay-butler.py, written from the contract)
// holds a conversation with three clients, each in turn: `thunderbolt acp
// connect`, the ACP SDK's client (npm) and the phone page (headless
// Chromium at 390 × 844, by role and name). Each sees its tool card, stops
// a turn (the service gets the stop POST; its late delta is refused) and
// sees a note the service sends between turns.
//
//   (cd client-wasm/e2e && node --test --test-concurrency=1 shapes.test.mjs)
//
// Needs: client-wasm/pkg (client-wasm/build.sh), the workspace binaries
// (cargo build --workspace --bins), Debian chromium, python3, `npm ci` here.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { chmodSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { execFileSync, spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";
import { ROOT, BIN, WAIT_MS, tb, tbEnv, tempHome, run, jsonConnect, pageRig, phoneOn, waitFor } from "./harness.mjs";

const ARTIFACTS = join(ROOT, "client-wasm/e2e/artifacts");
const BUTLER = join(ROOT, "client-wasm/e2e/relay-butler.py");
const NOTE = "Your 8am summary is ready.";

const rig = pageRig({ before, after });
mkdirSync(ARTIFACTS, { recursive: true });
const shot = (p, name) => p.screenshot({ path: join(ARTIFACTS, name) });

/// The host with the butler: its home, the service and its events, the butler's ticket.
let host;
before(async () => {
  const home = tempHome();
  const butler = run("python3", [BUTLER], { THUNDERBOLT_REACH_SOCK: join(home, "reach.sock") });
  const events = () => butler.out.map((l) => JSON.parse(l));
  const listening = await waitFor(() => events().find((e) => e.event === "listening"), "the butler's port")
    .catch((e) => { throw new Error(`${e.message}\n${butler.err}`); });
  mkdirSync(join(home, "agents.d"), { recursive: true, mode: 0o700 });
  const f = join(home, "agents.d", "butler.json");
  writeFileSync(f, JSON.stringify({
    name: "butler", label: "Butler", relay: `http://127.0.0.1:${listening.port}/inbound`,
    commands: [{ name: "status", description: "What the butler is working on" },
      { name: "remind", description: "Set a reminder", argHint: "<when> <what>" }],
  }));
  chmodSync(f, 0o600);
  const h = run(join(BIN, "thunderbolt"), ["host"], { ...tbEnv(home, rig.relay.url), THUNDERBOLT_HOST_NAME: "workstation" });
  await waitFor(() => h.out.some((l) => l.trim().startsWith("Ticket:")), "the host's ticket")
    .catch((e) => { throw new Error(`${e.message}\n${h.err}`); });
  const ticket = h.out.map((l) => l.trim()).find((l) => l.startsWith("Ticket:")).split(/\s+/)[1];
  host = { home, h, butler, events, ticket, port: listening.port };
});

/// What the service saw of `pick`, waited for.
const butlerSaw = (pick, what) => waitFor(() => host.events().find(pick), what)
  .catch((e) => { throw new Error(`${e.message}; the butler said ${JSON.stringify(host.events())}\n${host.butler.err}`); });

/// The service sends a note to `chat` between turns; the host's answer.
async function noteFromButler(chat) {
  const r = await fetch(`http://127.0.0.1:${host.port}/note`, { method: "POST", body: JSON.stringify({ chat, text: NOTE }) });
  return r.json();
}

/// A home of the owner's with `name`'s identity, paired with the host by a code.
function pairedDevice(name) {
  const home = tempHome();
  const code = JSON.parse(tb(host.home, rig.relay.url, ["iroh", "pair", "--json"])).code;
  execFileSync(join(BIN, "thunderbolt"), ["acp", "connect", "--pair", code, "--device-name", name, host.ticket], {
    env: { ...process.env, ...tbEnv(home, rig.relay.url) }, stdio: ["ignore", "ignore", "pipe"],
  });
  return home;
}

/// The stop: the service got the stop POST for `turn` of `chat`, and the
/// delta it sent after it was refused.
async function stoppedAtTheService(chat) {
  const slow = await butlerSaw((e) => e.event === "message" && e.body.chat_id === chat && /slow/.test(e.body.text), "the slow message");
  const turn = slow.body.turn_id;
  const stop = await butlerSaw((e) => e.event === "stop" && e.body.turn_id === turn, "the stop POST");
  assert.deepEqual(stop.body, { v: 1, type: "stop", chat_id: chat, turn_id: turn });
  const late = await butlerSaw((e) => e.event === "late" && e.turn_id === turn, "the late delta's answer");
  assert.deepEqual(late.answer, { error: "no such turn" });
}

test("thunderbolt acp connect: a conversation with tool cards, a stopped turn, a note between turns", async () => {
  const c = jsonConnect(pairedDevice("laptop"), rig.relay.url, [host.ticket]);
  c.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: 1, clientCapabilities: {} } });
  const init = await c.seen((v) => v.id === 1, "initialize");
  assert.equal(init.result.agentInfo.name, "butler");
  c.send({ jsonrpc: "2.0", id: 2, method: "session/new", params: { cwd: "/srv/work", mcpServers: [] } });
  const sid = (await c.seen((v) => v.id === 2, "the session")).result.sessionId;
  const commands = await c.seen((v) => v.params?.update?.sessionUpdate === "available_commands_update", "its commands");
  assert.deepEqual(commands.params.update.availableCommands.map((x) => x.name), ["status", "remind"]);

  c.send({ jsonrpc: "2.0", id: 3, method: "session/prompt", params: { sessionId: sid, prompt: [{ type: "text", text: "the garden" }] } });
  assert.equal((await c.seen((v) => v.id === 3, "the turn's end")).result.stopReason, "end_turn");
  const ups = c.out.filter((v) => v.method === "session/update" && v.params.sessionId === sid).map((v) => v.params.update);
  const card = ups.find((u) => u.sessionUpdate === "tool_call");
  assert.deepEqual([card.kind, card.title, card.rawInput], ["search", "notes", { pattern: "the garden" }]);
  const done = ups.find((u) => u.sessionUpdate === "tool_call_update");
  assert.deepEqual([done.toolCallId, done.status, done.rawOutput], [card.toolCallId, "completed", "3 matches"]);
  assert.equal(done.title, undefined, "an output without a title keeps the card's");
  const said = ups.filter((u) => u.sessionUpdate === "agent_message_chunk").map((u) => u.content.text).join("");
  assert.equal(said, "Looking through your notes… found 3 notes about the garden.");
  const msg = await butlerSaw((e) => e.event === "message" && e.body.chat_id === sid, "the message");
  assert.deepEqual([msg.body.v, msg.body.text, msg.body.cwd, msg.body.origin], [1, "the garden", "/srv/work", "user"]);

  // Stopped: the turn ends cancelled; the service is told; what it sends late is refused.
  c.send({ jsonrpc: "2.0", id: 4, method: "session/prompt", params: { sessionId: sid, prompt: [{ type: "text", text: "a slow one" }] } });
  await c.seen((v) => v.params?.update?.content?.text === "Working on it… ", "the slow turn's first words");
  c.send({ jsonrpc: "2.0", method: "session/cancel", params: { sessionId: sid } });
  assert.equal((await c.seen((v) => v.id === 4, "the stopped turn's end")).result.stopReason, "cancelled");
  await stoppedAtTheService(sid);

  // A note between turns: in the session, as the agent's words.
  const noted = await noteFromButler(sid);
  assert.equal(noted.ok, true, JSON.stringify(noted));
  await c.seen((v) => v.method === "session/update" && v.params.update.content?.text === NOTE, "the note in the session");
  c.child.stdin.end();
  assert.equal(await c.exited, 0, c.err);
});

test("the ACP SDK's client: a conversation with tool cards, a stopped turn, a note between turns", async () => {
  const home = pairedDevice("tablet");
  const child = spawn(join(BIN, "thunderbolt"), ["acp", "connect", host.ticket], {
    env: { ...process.env, ...tbEnv(home, rig.relay.url) }, stdio: ["pipe", "pipe", "pipe"],
  });
  let err = "";
  child.stderr.on("data", (d) => (err += d));
  const updates = [];
  const client = {
    async sessionUpdate(n) { updates.push(n); },
    async requestPermission() { return { outcome: { outcome: "cancelled" } }; },
  };
  const conn = new acp.ClientSideConnection(() => client, acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout)));
  try {
    const init = await conn.initialize({ protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} });
    assert.equal(init.agentCapabilities.loadSession, true);
    const { sessionId } = await conn.newSession({ cwd: "/srv/work", mcpServers: [] });
    const ours = () => updates.filter((n) => n.sessionId === sessionId).map((n) => n.update);

    const r = await conn.prompt({ sessionId, prompt: [{ type: "text", text: "the shed" }] });
    assert.equal(r.stopReason, "end_turn");
    const card = ours().find((u) => u.sessionUpdate === "tool_call");
    assert.deepEqual([card.kind, card.title, card.rawInput], ["search", "notes", { pattern: "the shed" }]);
    assert.ok(ours().some((u) => u.sessionUpdate === "tool_call_update" && u.status === "completed" && u.toolCallId === card.toolCallId));
    assert.match(ours().filter((u) => u.sessionUpdate === "agent_message_chunk").map((u) => u.content.text).join(""), /found 3 notes about the shed\.$/);

    // Stopped through the SDK's cancel.
    const slow = conn.prompt({ sessionId, prompt: [{ type: "text", text: "slow, please" }] });
    await waitFor(() => ours().some((u) => u.content?.text === "Working on it… "), "the slow turn's first words");
    await conn.cancel({ sessionId });
    assert.equal((await slow).stopReason, "cancelled");
    await stoppedAtTheService(sessionId);

    const noted = await noteFromButler(sessionId);
    assert.equal(noted.ok, true, JSON.stringify(noted));
    await waitFor(() => ours().some((u) => u.sessionUpdate === "agent_message_chunk" && u.content.text === NOTE), "the note in the session")
      .catch((e) => { throw new Error(`${e.message}; updates ${JSON.stringify(ours())}\n${err}`); });
  } finally {
    child.stdin.end();
    child.kill("SIGTERM");
  }
});

test("the phone page: a conversation with the tool card shown, the turn stopped by its button, the note in the conversation and in the messages", async () => {
  const { ctx, p } = await phoneOn(rig, host.home);
  try {
    const log = p.getByRole("log", { name: "conversation" });

    await p.getByRole("textbox", { name: "prompt" }).fill("the roses");
    await p.getByRole("button", { name: "Send", exact: true }).click();
    await log.getByText("found 3 notes about the roses.", { exact: false }).waitFor({ timeout: WAIT_MS });
    await log.getByText(/notes/).first().waitFor({ timeout: WAIT_MS });
    assert.match(await p.textContent("#tools"), /notes \(search, completed\)/);
    await shot(p, "relay-agent-turn.png");

    // The turn stopped by the page's button.
    await p.getByRole("textbox", { name: "prompt" }).fill("a slow one");
    await p.getByRole("button", { name: "Send", exact: true }).click();
    await log.getByText("Working on it…", { exact: false }).waitFor({ timeout: WAIT_MS });
    await p.getByRole("button", { name: "Cancel the turn" }).click();
    const chat = await p.evaluate(() => window.thunderbolt.state.sessionId);
    await stoppedAtTheService(chat);
    await p.getByRole("button", { name: "Send", exact: true }).waitFor({ timeout: WAIT_MS });

    // The note: in the conversation, and in the butler's thread of messages.
    const noted = await noteFromButler(chat);
    assert.equal(noted.ok, true, JSON.stringify(noted));
    await log.getByText(NOTE).waitFor({ timeout: WAIT_MS });
    await shot(p, "relay-agent-note.png");
    await p.reload();
    const fold = p.getByRole("button", { name: /^Hosts and sessions/ });
    if (await fold.isVisible() && (await fold.getAttribute("aria-expanded")) === "false") await fold.click();
    const thread = p.getByRole("list", { name: /^messages on / }).getByRole("button", { name: /butler/ });
    await thread.waitFor({ timeout: WAIT_MS });
    assert.match(await thread.textContent(), /8am summary/);
    await shot(p, "relay-agent-messages.png");
  } finally {
    await ctx.close();
  }
});
