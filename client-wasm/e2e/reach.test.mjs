// Your agent reaches you: an MCP client written with the official SDK (npm)
// runs `thunderbolt reach` and messages the owner; the phone page (headless
// Chromium at 390 × 844, by role and name) shows the thread and answers it;
// `get_replies` hands the answer back once, and not again after the MCP
// server and the bridge were restarted.
//
//   (cd client-wasm/e2e && node --test --test-concurrency=1 reach.test.mjs)
//
// Needs: client-wasm/pkg (client-wasm/build.sh), the workspace binaries
// (cargo build --workspace --bins), Debian chromium, `npm ci` here.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { ROOT, BIN, WAIT_MS, tbEnv, startAcpBridge, pageRig, phoneOn, waitFor, procs } from "./harness.mjs";

const ARTIFACTS = join(ROOT, "client-wasm/e2e/artifacts");
const AGENT = join(ROOT, "client-wasm/e2e/restart-agent.mjs");

const rig = pageRig({ before, after });
mkdirSync(ARTIFACTS, { recursive: true });
const shot = (p, name) => p.screenshot({ path: join(ARTIFACTS, name) });

/// The SDK's client on `thunderbolt reach --agent-name claude` in `home`.
async function mcp(home) {
  const transport = new StdioClientTransport({
    command: join(BIN, "thunderbolt"),
    args: ["reach", "--agent-name", "claude"],
    env: { ...process.env, ...tbEnv(home, rig.relay.url) },
    stderr: "pipe",
  });
  const client = new Client({ name: "reach-test", version: "1.0.0" });
  await client.connect(transport);
  return client;
}

/// A client written from Claude Code's channel contract alone: raw JSON-RPC
/// lines on `thunderbolt reach --channel`'s stdio. `got` holds every line it
/// was sent; `seen(pick, what)` waits for one.
function channelClient(home) {
  const child = spawn(join(BIN, "thunderbolt"), ["reach", "--channel", "--agent-name", "claude"], {
    env: { ...process.env, ...tbEnv(home, rig.relay.url) }, stdio: ["pipe", "pipe", "pipe"],
  });
  const c = { child, got: [], err: "" };
  createInterface({ input: child.stdout }).on("line", (l) => c.got.push(JSON.parse(l)));
  child.stderr.on("data", (d) => (c.err += d));
  c.send = (v) => child.stdin.write(JSON.stringify({ jsonrpc: "2.0", ...v }) + "\n");
  c.seen = (pick, what) => waitFor(() => c.got.find(pick), what).catch((e) => {
    throw new Error(`${e.message}; it got ${JSON.stringify(c.got)}; stderr:\n${c.err}`);
  });
  procs.push(c);
  return c;
}

/// A bridge running the SDK's ACP agent, and a phone page paired with it and connected.
async function pairedPhone() {
  const { relay } = rig;
  const store = mkdtempSync(join(tmpdir(), "tb-e2e-store-"));
  const agent = [process.execPath, AGENT, "--store", store];
  const b = await startAcpBridge(relay.url, agent);
  const { ctx, p } = await phoneOn(rig, b.home);
  return { b, agent, ctx, p };
}

const text = (r) => (r.content || []).map((c) => c.text).join("\n");

test("a message sent through the MCP SDK shows on the phone, its answer comes back once, and not again after both restart", async () => {
  const { relay } = rig;
  // The phone pairs by its link and connects.
  const paired = await pairedPhone();
  const { agent, ctx, p } = paired;
  let b = paired.b;
  const home = b.home;

  // The tools, and who a message reaches.
  let client = await mcp(home);
  const tools = (await client.listTools()).tools.map((t) => t.name).sort();
  assert.deepEqual(tools, ["get_replies", "send_message", "status"]);
  const status = await client.callTool({ name: "status", arguments: {} });
  assert.equal(status.isError, undefined, text(status));
  assert.equal(status.structuredContent.devices.length, 1, text(status));

  // The agent asks.
  const asked = "The deploy to staging is green. Ship it to production?";
  const sent = await client.callTool({ name: "send_message", arguments: { text: asked } });
  assert.equal(sent.isError, undefined, text(sent));
  const id = sent.structuredContent.id;
  assert.match(id, /^m-\d+$/);

  // The person opens the app: the thread is in the list, beside the sessions.
  await p.reload();
  const thread = p.getByRole("list", { name: /^messages on / }).getByRole("button", { name: /claude/ });
  await thread.waitFor({ timeout: WAIT_MS });
  assert.match(await thread.textContent(), /Ship it to production\?/);
  await shot(p, "reach-list.png");
  await thread.click();
  const dialog = p.getByRole("dialog", { name: "claude" });
  await dialog.getByRole("log", { name: "messages" }).getByText(asked).waitFor({ timeout: WAIT_MS });

  // The agent waits for the answer; the person types it.
  const waiting = client.callTool({ name: "get_replies", arguments: { wait_s: 25 } });
  await dialog.getByRole("textbox", { name: "Reply" }).fill("yes, ship it");
  await dialog.getByRole("button", { name: "Send reply" }).click();
  await dialog.getByRole("log", { name: "messages" }).getByText("yes, ship it").waitFor({ timeout: WAIT_MS });
  await shot(p, "reach-thread.png");
  const got = await waiting;
  assert.equal(got.isError, undefined, text(got));
  assert.equal(got.structuredContent.replies.length, 1, text(got));
  assert.equal(got.structuredContent.replies[0].text, "yes, ship it");
  assert.equal(got.structuredContent.replies[0].replyTo, id, "it answers the message shown");
  assert.match(text(got), /yes, ship it/);
  const again = await client.callTool({ name: "get_replies", arguments: {} });
  assert.deepEqual(again.structuredContent.replies, [], text(again));

  // The MCP server and the bridge restart: the answer is not handed out twice.
  await client.close();
  b.child.kill("SIGTERM");
  await new Promise((res) => b.child.once("exit", res));
  b = await startAcpBridge(relay.url, agent, [], { home });
  client = await mcp(home);
  const after = await client.callTool({ name: "get_replies", arguments: {} });
  assert.equal(after.isError, undefined, text(after));
  assert.deepEqual(after.structuredContent.replies, [], text(after));
  assert.match(text(after), /no replies yet/);

  // Back from the thread: the conversation is where it was.
  await dialog.getByRole("button", { name: "Back" }).click();
  assert.equal(await dialog.isVisible(), false);
  await client.close();
  await ctx.close();
});

test("Claude Code's channel: a permission prompt is answered Allow on the phone and comes back as the verdict; a chat \"yes\" does not approve", async () => {
  const { b, ctx, p } = await pairedPhone();
  const c = channelClient(b.home);
  c.send({ id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "claude-code", version: "2.1.81" } } });
  const init = await c.seen((m) => m.id === 1, "initialize's answer");
  assert.deepEqual(init.result.capabilities.experimental, { "claude/channel": {}, "claude/channel/permission": {} });
  c.send({ method: "notifications/initialized" });
  c.send({
    method: "notifications/claude/channel/permission_request",
    params: { request_id: "tbxkq", tool_name: "Bash", description: "run the test suite", input_preview: '{"command":"npm test"}' },
  });

  // The phone: the question, in the agent's thread, with Allow and Deny.
  await p.reload();
  const thread = p.getByRole("list", { name: /^messages on / }).getByRole("button", { name: /claude/ });
  await thread.waitFor({ timeout: WAIT_MS });
  await thread.click();
  const dialog = p.getByRole("dialog", { name: "claude" });
  const answer = dialog.getByRole("group", { name: "answer Bash" });
  await answer.waitFor({ timeout: WAIT_MS });
  assert.match(await dialog.getByRole("log", { name: "messages" }).textContent(), /Bash: run the test suite.*npm test/s);
  await shot(p, "reach-question.png");

  // "yes" typed in the thread reaches the session as a message, and is no verdict.
  await dialog.getByRole("textbox", { name: "Reply" }).fill("yes");
  await dialog.getByRole("button", { name: "Send reply" }).click();
  const chat = await c.seen((m) => m.method === "notifications/claude/channel", "the reply as a channel message");
  assert.equal(chat.params.content, "yes");
  assert.equal(chat.params.meta.thread, "claude");
  assert.ok(!c.got.some((m) => m.method === "notifications/claude/channel/permission"), "a chat yes approves nothing");
  assert.equal(await answer.getByRole("button", { name: "Allow" }).isEnabled(), true, "the question still waits");

  // Allow: the verdict, once, with the request's id.
  await answer.getByRole("button", { name: "Allow" }).click();
  const verdict = await c.seen((m) => m.method === "notifications/claude/channel/permission", "the verdict").catch(async (e) => { throw new Error(`${e.message}\nthread state: ${await p.textContent("#thread-state")}\nbridge: ${b.err.slice(-3000)}`); });
  assert.deepEqual(verdict.params, { request_id: "tbxkq", behavior: "allow" });
  await dialog.getByText(/^Allowed by /).waitFor({ timeout: WAIT_MS });
  await shot(p, "reach-allowed.png");
  assert.equal(c.got.filter((m) => m.method === "notifications/claude/channel/permission").length, 1);
  c.child.stdin.end();
  await ctx.close();
});
