#!/usr/bin/env node
// A small ACP agent for the browser tests: it asks the client things and says
// what it was answered. One JSON-RPC message per line on stdio.
//
// A prompt's text picks what it does:
//   - "permission": a tool call and a plan (session/update), a request the
//     client cannot know (it must answer -32601), then
//     session/request_permission with the options Allow and Deny;
//   - "elicit": elicitation/create with a form of three fields;
//   - "permission on signal": the tool call at once, the permission request
//     only when this process gets SIGUSR1 (the test sends it once the page
//     is gone).
// The turn's reply (agent_message_chunk) names every answer, then the prompt
// is answered `end_turn`. Every answer is also written to stderr (the
// bridge's log).
import { createInterface } from "node:readline";

let next = 1;
const waiting = new Map(); // our request id → resolve
let sessionId = null;

function send(msg) {
  process.stdout.write(JSON.stringify({ jsonrpc: "2.0", ...msg }) + "\n");
}

function ask(method, params) {
  const id = `ask-${next++}`;
  send({ id, method, params });
  return new Promise((resolve) => waiting.set(id, resolve));
}

function update(u) {
  send({ method: "session/update", params: { sessionId, update: u } });
}

const TOOL = {
  toolCallId: "call-1",
  title: "Delete the build folder",
  kind: "delete",
  status: "pending",
  content: [{ type: "content", content: { type: "text", text: "rm -rf ./build" } }],
};

async function permission() {
  const r = await ask("session/request_permission", {
    sessionId,
    toolCall: TOOL,
    options: [
      { optionId: "allow-once", name: "Allow", kind: "allow_once" },
      { optionId: "reject-once", name: "Deny", kind: "reject_once" },
    ],
  });
  if (r.error) return `permission: error ${r.error.code}`;
  const o = r.result.outcome;
  return `permission: ${o.outcome}${o.optionId ? ` ${o.optionId}` : ""}`;
}

async function turn(id, text) {
  const said = [];
  if (text === "permission" || text === "permission on signal") {
    update({ sessionUpdate: "tool_call", ...TOOL });
    update({
      sessionUpdate: "plan",
      entries: [
        { content: "Look at the build folder", priority: "high", status: "completed" },
        { content: "Delete it", priority: "medium", status: "in_progress" },
      ],
    });
    if (text === "permission on signal") {
      process.stderr.write(`ask-agent ${process.pid}: waiting for SIGUSR1\n`);
      await new Promise((resolve) => process.once("SIGUSR1", resolve));
    } else {
      const u = await ask("x_unknown/thing", { sessionId });
      said.push(`unknown: ${u.error ? u.error.code : "answered"}`);
    }
    said.push(await permission());
  } else if (text === "elicit") {
    const r = await ask("elicitation/create", {
      sessionId,
      mode: "form",
      message: "Which branch should I push?",
      requestedSchema: {
        type: "object",
        properties: {
          branch: { type: "string", title: "Branch" },
          force: { type: "boolean", title: "Force push" },
          retries: { type: "integer", title: "Retries" },
        },
        required: ["branch"],
      },
    });
    said.push(r.error ? `elicitation: error ${r.error.code}` : `elicitation: ${r.result.action} ${JSON.stringify(r.result.content || null)}`);
  } else {
    said.push(`You said: ${text}`);
  }
  said.push(`pid ${process.pid}`);
  const line = said.join("; ");
  process.stderr.write(`ask-agent ${process.pid}: ${line}\n`);
  update({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: line } });
  send({ id, result: { stopReason: "end_turn" } });
}

createInterface({ input: process.stdin }).on("line", (line) => {
  let m;
  try {
    m = JSON.parse(line);
  } catch {
    return;
  }
  if (m.method === undefined && waiting.has(m.id)) {
    const resolve = waiting.get(m.id);
    waiting.delete(m.id);
    return resolve(m);
  }
  switch (m.method) {
    case "initialize":
      return send({ id: m.id, result: { protocolVersion: 1, agentCapabilities: {}, agentInfo: { name: "asker", title: "Asker", version: "1" } } });
    case "session/new":
      sessionId = `ask-${process.pid}`;
      return send({ id: m.id, result: { sessionId } });
    case "session/prompt": {
      const text = (m.params.prompt || []).filter((p) => p.type === "text").map((p) => p.text).join("");
      return void turn(m.id, text);
    }
    case "session/cancel":
      return;
    default:
      if (m.id !== undefined && typeof m.method === "string") send({ id: m.id, error: { code: -32601, message: `${m.method}: not here` } });
  }
});
// The bridge ends us by closing stdin.
process.stdin.on("end", () => process.exit(0));
