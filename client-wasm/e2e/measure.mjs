#!/usr/bin/env node
// Measures the browser client (not a test: it prints figures, nothing asserts
// timing). Same setup as the e2e test: local relay, real bridge, headless
// Chromium; everything on 127.0.0.1.
//   - page time from IrohClient.create() to the first reply (ACP initialize);
//   - bulk ndjson through a cat-like agent, browser ⇄ bridge through the relay,
//     next to the native client (`bench relay-bulk`) through the same relay.
// Usage (release binaries recommended):
//   cargo build --release --workspace --bins && client-wasm/build.sh
//   TB_BIN_DIR=target/release node client-wasm/e2e/measure.mjs [MiB] [reps]
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";
import { startServer } from "../serve.mjs";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const BIN = resolve(process.env.TB_BIN_DIR || join(ROOT, "target/release"));
const MIB = Number(process.argv[2] || 32);
const REPS = Number(process.argv[3] || 5);
const procs = [];

function run(cmd, args, env = {}) {
  const child = spawn(cmd, args, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  const p = { child, out: [] };
  createInterface({ input: child.stdout }).on("line", (l) => p.out.push(l));
  child.stderr.on("data", () => {});
  procs.push(p);
  return p;
}
const until = async (f) => { for (let i = 0; i < 1200; i++) { const v = f(); if (v) return v; await new Promise((r) => setTimeout(r, 25)); } throw new Error("timeout"); };
const median = (v) => { const s = [...v].sort((a, b) => a - b); const n = s.length; return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2; };

const relay = run(join(BIN, "thunderbolt-relay"), ["--dev", "--bind", "127.0.0.1:0"]);
const relayUrl = (await until(() => relay.out.find((l) => l.startsWith("relay listening on ")))).split(" ").pop();
const home = mkdtempSync(join(tmpdir(), "tb-measure-"));
const env = { THUNDERBOLT_HOME: home, THUNDERBOLT_IROH_RELAY_URL: relayUrl, THUNDERBOLT_IROH_DISCOVERY: "off",
  THUNDERBOLT_IROH_PORTMAPPER: "off", THUNDERBOLT_IROH_BIND: "127.0.0.1:0", RUST_LOG: "warn" };
const startBridge = async (agent) => {
  const b = run(join(BIN, "thunderbolt"), ["acp", "--transport", "iroh", "--per-remote-max", "100000", ...(agent ? ["--", ...agent] : [])], env);
  await until(() => b.out.some((l) => l.trim().startsWith("Allow a peer:")));
  return { ...b, ticket: b.out.map((l) => l.trim()).find((l) => l.startsWith("Ticket:")).split(/\s+/)[1] };
};
const builtin = await startBridge();
const server = await startServer(0);
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"] });
const page = await browser.newPage();
await page.goto(`http://127.0.0.1:${server.address().port}/www/?relay=${encodeURIComponent(relayUrl)}`);
await page.waitForFunction(() => window.ready === true);
const secret = await page.evaluate(() => window.thunderbolt.state.client.secretKeyHex());
const nodeId = await page.evaluate(() => window.thunderbolt.state.client.nodeId());
execFileSync(join(BIN, "thunderbolt"), ["iroh", "allow", nodeId], { env: { ...process.env, ...env } });

// create() → first reply, each with a fresh client (same secret, so allowed).
const setup = [];
for (let i = 0; i < REPS + 1; i++) {
  const ms = await page.evaluate(async ([ticket, secret, relay]) => {
    const t0 = performance.now();
    const c = await window.thunderbolt.IrohClient.create(secret, relay);
    const conn = await c.connectProtocol(ticket, "acp");
    const r = conn.messages().getReader();
    await conn.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: 1 } });
    await r.read();
    const dt = performance.now() - t0;
    conn.close();
    await c.shutdown();
    return dt;
  }, [builtin.ticket, secret, relayUrl]);
  if (i > 0) setup.push(ms); // the first one warms the page's wasm and caches
}

// Bulk through a cat agent: browser vs native, same relay, same bridge.
const cat = await startBridge([join(BIN, "test-agent"), "cat"]);
const bytes = MIB * 1024 * 1024;
const browserMBs = [];
const nativeMBs = [];
for (let i = 0; i < REPS; i++) {
  browserMBs.push(await page.evaluate(async ([ticket, total, resume]) => {
    const client = window.thunderbolt.state.client;
    const conn = await client.connect(ticket, "thunderbolt/acp/0", undefined, { resume });
    const line = new Uint8Array(16 * 1024).fill(97); line[0] = 34; line[line.length - 2] = 34; line[line.length - 1] = 10;
    const block = new Uint8Array(line.length * 64);
    for (let k = 0; k < 64; k++) block.set(line, k * line.length);
    const reader = conn.readable().getReader();
    const t0 = performance.now();
    const writer = (async () => { for (let sent = 0; sent < total; sent += block.length) await conn.send(block.subarray(0, Math.min(block.length, total - sent))); })();
    let got = 0;
    while (got < total) { const { value, done } = await reader.read(); if (done) throw new Error(`ended at ${got}`); got += value.length; }
    await writer;
    const mbs = total / ((performance.now() - t0) / 1000) / 1e6;
    conn.close();
    return mbs;
  }, [cat.ticket, bytes, process.env.TB_RESUME !== "0"]));
  const key = execFileSync(join(BIN, "thunderbolt"), ["iroh", "id", "--json"], { env: { ...process.env, ...env, THUNDERBOLT_HOME: mkdtempSync(join(tmpdir(), "tb-n-")) } });
  const nativeHome = JSON.parse(key).identityPath;
  const { readFileSync } = await import("node:fs");
  const hex = readFileSync(nativeHome, "utf8").trim();
  const nid = JSON.parse(key).nodeId;
  execFileSync(join(BIN, "thunderbolt"), ["iroh", "allow", nid], { env: { ...process.env, ...env } });
  nativeMBs.push(Number(execFileSync(join(BIN, "bench"), ["relay-bulk", relayUrl, cat.ticket, hex, String(bytes)]).toString().trim()));
}
const gz = execFileSync("sh", ["-c", `gzip -9 -c ${join(ROOT, "client-wasm/pkg/thunderbolt_client_wasm_bg.wasm")} | wc -c`]).toString().trim();
const raw = execFileSync("sh", ["-c", `wc -c < ${join(ROOT, "client-wasm/pkg/thunderbolt_client_wasm_bg.wasm")}`]).toString().trim();
console.log(`| figure | median (min–max) |`);
console.log(`|---|---|`);
console.log(`| wasm size | ${(raw / 1e6).toFixed(2)} MB raw, ${(gz / 1e6).toFixed(2)} MB gzipped |`);
console.log(`| page: create() → first reply (relay) | ${median(setup).toFixed(1)} ms (${Math.min(...setup).toFixed(1)}–${Math.max(...setup).toFixed(1)}) |`);
console.log(`| bulk ${MIB} MiB browser ⇄ bridge (relay) | ${median(browserMBs).toFixed(1)} MB/s (${Math.min(...browserMBs).toFixed(1)}–${Math.max(...browserMBs).toFixed(1)}) |`);
console.log(`| bulk ${MIB} MiB native ⇄ bridge (same relay) | ${median(nativeMBs).toFixed(1)} MB/s (${Math.min(...nativeMBs).toFixed(1)}–${Math.max(...nativeMBs).toFixed(1)}) |`);
console.log(`| browser / native | ${(median(browserMBs) / median(nativeMBs)).toFixed(2)}× |`);
await browser.close();
server.close();
for (const p of procs) p.child.kill("SIGTERM");
