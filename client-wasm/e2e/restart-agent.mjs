#!/usr/bin/env node
// An ACP agent for the tests that restart the bridge mid-session, built on the
// official SDK. Its sessions live on disk, so a fresh process (the bridge
// starts it again) can take them back with session/resume or session/load.
//
//   node restart-agent.mjs --store DIR --caps resume|load|none [--chunk-ms N] [--images]
//
// DIR/<sessionId>.json holds {cwd, mcpServers, turns: [{prompt, reply}]};
// DIR/calls.log gets one line per call, for the tests to read.
//
// A prompt's text picks the turn:
//   - "stream N": N agent_message_chunk "chunk i/N\n", --chunk-ms apart;
//     session/cancel stops it (stopReason "cancelled");
//   - anything else: one chunk "turn K: <text> (history: <p1|p2|...>|none)".
// A prompt's resource_link blocks with a file:// URI are read, and the turn's
// chunk says so: "read <name>: <size> bytes, sha256 <hex>" for each (or "cannot
// read <uri>: <why>"), so a test learns the agent got the file's bytes. With
// --images it advertises promptCapabilities.image, and each image block is
// described the same way: "image <mime> inline: <size> bytes, sha256 <hex>"
// (and " (<uri>)" when the block names where the file is).
// "show <name> <mime>": the reply names the file <name> of the agent's working
// folder as a resource_link (a file the agent wrote, for the client to fetch).
// A turn is saved only once it ends with end_turn, so one cut short by a
// killed process (or cancelled) is not in the history.
import * as acp from "@agentclientprotocol/sdk";
import { appendFileSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { createHash, randomBytes } from "node:crypto";
import { fileURLToPath, pathToFileURL } from "node:url";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";

const { values: args } = parseArgs({
  options: {
    store: { type: "string" },
    caps: { type: "string", default: "none" },
    "chunk-ms": { type: "string", default: "20" },
    images: { type: "boolean", default: false },
  },
});
if (!args.store || !["resume", "load", "none"].includes(args.caps)) {
  console.error("usage: restart-agent.mjs --store DIR --caps resume|load|none [--chunk-ms N]");
  process.exit(2);
}
const store = args.store;
const chunkMs = Number(args["chunk-ms"]);
mkdirSync(store, { recursive: true });

// stdout carries the protocol, so everything human goes to stderr.
const log = (msg) => console.error(`restart-agent[${process.pid}]: ${msg}`);
const call = (line) => appendFileSync(join(store, "calls.log"), line + "\n");

const file = (id) => join(store, `${id}.json`);
function readSession(id) {
  try {
    return JSON.parse(readFileSync(file(id), "utf8"));
  } catch {
    return null;
  }
}
// Write then rename, so a process killed mid-write leaves the old file whole.
function saveSession(id, session) {
  writeFileSync(file(id) + ".tmp", JSON.stringify(session, null, 2));
  renameSync(file(id) + ".tmp", file(id));
}

// Sessions this process has created, loaded or resumed: a prompt for any
// other is refused, as a real agent would, so a test sees whether the bridge
// really took its sessions back after a restart.
const active = new Set();
const running = new Map(); // sessionId → AbortController of the turn in progress

function takeBack(method, params) {
  const advertised = args.caps === "resume" || (method === "load" && args.caps === "load");
  if (!advertised) throw acp.RequestError.methodNotFound(`session/${method}`);
  const session = readSession(params.sessionId);
  if (!session) throw acp.RequestError.resourceNotFound(params.sessionId);
  // The session now runs with what the client passed this time.
  session.cwd = params.cwd;
  session.mcpServers = params.mcpServers ?? [];
  saveSession(params.sessionId, session);
  active.add(params.sessionId);
  return session;
}

const say = (client, sessionId, sessionUpdate, text) =>
  client.notify(acp.methods.client.session.update, {
    sessionId,
    update: { sessionUpdate, content: { type: "text", text } },
  });

// `sessionCapabilities.resume: {}` is how this SDK's schema advertises session/resume.
const agentCapabilities = { loadSession: args.caps !== "none" };
if (args.caps === "resume") agentCapabilities.sessionCapabilities = { resume: {} };
if (args.images) agentCapabilities.promptCapabilities = { image: true };
const app = acp
  .agent({ name: "restart-agent" })
  .onRequest(acp.methods.agent.initialize, ({ params }) => {
    log(`initialize (caps ${args.caps})`);
    call(`initialize ${JSON.stringify(params.clientInfo ?? null)} ${params.protocolVersion}`);
    return {
      protocolVersion: 1,
      agentCapabilities,
      agentInfo: { name: "restart-agent", version: "1" },
    };
  })
  .onRequest(acp.methods.agent.session.new, ({ params }) => {
    const sessionId = "s-" + randomBytes(4).toString("hex");
    log(`session/new ${sessionId}`);
    call(`new ${sessionId}`);
    saveSession(sessionId, { cwd: params.cwd, mcpServers: params.mcpServers, turns: [] });
    active.add(sessionId);
    return { sessionId };
  })
  .onRequest(acp.methods.agent.session.load, async ({ params, client }) => {
    log(`session/load ${params.sessionId}`);
    call(`load ${params.sessionId}`);
    const session = takeBack("load", params);
    // The spec wants the whole history replayed before the answer.
    for (const turn of session.turns) {
      await say(client, params.sessionId, "user_message_chunk", turn.prompt);
      await say(client, params.sessionId, "agent_message_chunk", turn.reply);
    }
    return {};
  })
  .onRequest(acp.methods.agent.session.resume, ({ params }) => {
    log(`session/resume ${params.sessionId}`);
    call(`resume ${params.sessionId}`);
    takeBack("resume", params); // no history: that is what resume is for
    return {};
  })
  .onRequest(acp.methods.agent.session.prompt, async ({ params, client }) => {
    const { sessionId } = params;
    const text = params.prompt
      .filter((block) => block.type === "text")
      .map((block) => block.text)
      .join("");
    log(`session/prompt ${sessionId} ${JSON.stringify(text)}`);
    call(`prompt ${sessionId} ${text}`);
    const session = active.has(sessionId) ? readSession(sessionId) : null;
    if (!session) throw acp.RequestError.resourceNotFound(sessionId);

    let reply;
    const stream = /^stream (\d+)$/.exec(text.trim());
    if (stream) {
      const n = Number(stream[1]);
      const abort = new AbortController();
      running.set(sessionId, abort);
      reply = "";
      try {
        for (let i = 1; i <= n; i++) {
          if (i > 1) await sleep(chunkMs, undefined, { signal: abort.signal });
          const chunk = `chunk ${i}/${n}\n`;
          await say(client, sessionId, "agent_message_chunk", chunk);
          reply += chunk;
        }
      } catch (err) {
        if (!abort.signal.aborted) throw err;
        log(`session/prompt ${sessionId} cancelled after ${reply.split("\n").length - 1} chunks`);
        return { stopReason: "cancelled" };
      } finally {
        running.delete(sessionId);
      }
    } else if (/^show \S+ \S+$/.test(text.trim())) {
      const [, name, mimeType] = text.trim().split(" ");
      const uri = pathToFileURL(join(process.cwd(), name)).href;
      reply = `here is ${name}`;
      await say(client, sessionId, "agent_message_chunk", reply);
      await client.notify(acp.methods.client.session.update, {
        sessionId,
        update: { sessionUpdate: "agent_message_chunk", content: { type: "resource_link", uri, name, mimeType } },
      });
    } else {
      const history = session.turns.map((turn) => turn.prompt).join("|") || "none";
      reply = `turn ${session.turns.length + 1}: ${text} (history: ${history})`;
      for (const block of params.prompt.filter((b) => b.type === "image")) {
        const bytes = Buffer.from(block.data, "base64");
        const sha = createHash("sha256").update(bytes).digest("hex");
        reply += `\nimage ${block.mimeType} inline: ${bytes.length} bytes, sha256 ${sha}${block.uri ? ` (${block.uri})` : ""}`;
      }
      for (const block of params.prompt.filter((b) => b.type === "resource_link")) {
        try {
          const bytes = readFileSync(fileURLToPath(block.uri));
          const sha = createHash("sha256").update(bytes).digest("hex");
          reply += `\nread ${block.name}: ${bytes.length} bytes, sha256 ${sha}`;
        } catch (err) {
          reply += `\ncannot read ${block.uri}: ${err.message}`;
        }
      }
      await say(client, sessionId, "agent_message_chunk", reply);
    }
    session.turns.push({ prompt: text, reply });
    saveSession(sessionId, session);
    return { stopReason: "end_turn" };
  })
  .onNotification(acp.methods.agent.session.cancel, ({ params }) => {
    log(`session/cancel ${params.sessionId}`);
    call(`cancel ${params.sessionId}`);
    running.get(params.sessionId)?.abort();
  });

const connection = app.connect(
  acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin)),
);
log(`started (caps ${args.caps}, store ${store})`);
// The connection closes when stdin ends; a stream turn's timer must not keep
// the process alive after that.
connection.closed.then(() => {
  log("stdin closed, exiting");
  process.exit(0);
});
