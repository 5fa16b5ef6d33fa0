// MCP progress notifications through `thunderbolt mcp connect`, against the
// same server reached directly (issue 40). Not part of the test run: a
// measurement to rerun.
//
//   cd tests/mcp-progress && npm install && node measure.mjs [RUNS] [STEPS] [STEP_SECS]
//   (TB_BIN=path/to/thunderbolt; default ../../target/debug/thunderbolt)
//
// Each run calls server-everything's `trigger-long-running-operation` with a
// progress token, counts the progress notifications the SDK's `onprogress`
// saw, and counts the reads of the client's stdin (the child's stdout) in
// which the last progress notification and the result arrived together: the
// MCP SDK's client handles a notification one step later than a response,
// and handling the response removes the progress handler, so a progress line
// sharing a read with the result is lost (see docs/protocol.md).
// Everything stays on loopback: relays, discovery and the portmapper are off.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const RUNS = Number(process.argv[2] ?? 20);
const STEPS = Number(process.argv[3] ?? 6);
// Seconds between two progress notices (server-everything sleeps this long per step).
const STEP_SECS = Number(process.argv[4] ?? 0.5);
const tb = process.env.TB_BIN ?? path.join(here, "../../target/debug/thunderbolt");
const server = [path.join(here, "node_modules/@modelcontextprotocol/server-everything/dist/index.js"), "stdio"];
const knobs = {
  THUNDERBOLT_IROH_RELAY_URL: "disabled",
  THUNDERBOLT_IROH_DISCOVERY: "off",
  THUNDERBOLT_IROH_PORTMAPPER: "off",
  THUNDERBOLT_IROH_BIND: "127.0.0.1:0",
  RUST_LOG: "warn",
};
const homeEnv = (home) => ({ ...process.env, ...knobs, THUNDERBOLT_HOME: home });

/// One call with progress over `transport`: progress notices seen, and
/// whether the last one shared a read with the result.
async function once(transport) {
  const client = new Client({ name: "progress-measure", version: "1" });
  await client.connect(transport);
  let shared = false;
  transport._process.stdout.on("data", (chunk) => {
    const text = chunk.toString();
    if (text.includes("notifications/progress") && text.includes('"result"')) shared = true;
  });
  let progress = 0;
  await client.callTool(
    { name: "trigger-long-running-operation", arguments: { duration: STEPS * STEP_SECS, steps: STEPS } },
    undefined,
    { onprogress: () => progress++ },
  );
  await client.close();
  return { progress, shared };
}

async function measure(label, params) {
  let complete = 0;
  let shared = 0;
  let notices = 0;
  for (let i = 0; i < RUNS; i++) {
    const r = await once(new StdioClientTransport(params));
    complete += r.progress === STEPS ? 1 : 0;
    shared += r.shared ? 1 : 0;
    notices += r.progress;
  }
  console.log(
    `${label}: ${complete}/${RUNS} runs got all ${STEPS} progress notices (${notices}/${RUNS * STEPS} in all); ` +
      `the last one shared a read with the result in ${shared}/${RUNS}`,
  );
}

const bridgeHome = mkdtempSync(path.join(tmpdir(), "tb-bridge-"));
const clientHome = mkdtempSync(path.join(tmpdir(), "tb-client-"));
let bridge;
try {
  const id = JSON.parse(execFileSync(tb, ["iroh", "id", "--json"], { env: homeEnv(clientHome) }))["nodeId"];
  execFileSync(tb, ["iroh", "allow", id], { env: homeEnv(bridgeHome), stdio: "ignore" });
  bridge = spawn(tb, ["mcp", "--transport", "iroh", "--", process.execPath, ...server], {
    env: homeEnv(bridgeHome),
    stdio: ["ignore", "pipe", "ignore"],
  });
  // The banner's Ticket: line (on stdout) is what connect dials.
  const ticket = await new Promise((resolve, reject) => {
    const lines = createInterface({ input: bridge.stdout });
    lines.on("line", (l) => {
      const m = l.match(/Ticket:\s+(\S+)/);
      if (m) resolve(m[1]);
    });
    bridge.on("exit", (code) => reject(new Error(`the bridge exited (${code})`)));
  });
  console.error(`bridge ticket ${ticket.slice(0, 24)}…`);
  await measure("direct", { command: process.execPath, args: server });
  await measure("through the bridge", { command: tb, args: ["mcp", "connect", ticket], env: homeEnv(clientHome) });
} finally {
  bridge?.kill("SIGTERM");
  rmSync(bridgeHome, { recursive: true, force: true });
  rmSync(clientHome, { recursive: true, force: true });
}
