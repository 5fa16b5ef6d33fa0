#!/usr/bin/env node
// Measures the browser client (not a test: it prints figures, nothing asserts
// timing). Same setup as the e2e test: local relay, real bridge, headless
// Chromium; everything on 127.0.0.1.
//   - page time from IrohClient.create() to the first reply (ACP initialize);
//   - bulk ndjson through a cat-like agent, browser ⇄ bridge through the relay,
//     next to the native client (`bench relay-bulk`) through the same relay;
//   - each direction alone in the driverless page (upload to a counting agent,
//     download from a streaming one), each next to the native client;
//   - ~200 B round trips through the cat agent, browser and native.
// Then one comparison table, a row per figure (bulk echo, upload, download,
// round trip), each in the driverless page (e2e/bulk.html), through:
//   - ours: this client (pkg/), resumable (`thunderbolt/acp/r1`, the default);
//   - ours, plain: the same client offering `thunderbolt/acp/0` only;
//   - the app's client: the Thunderbolt app's shipped client, loaded from
//     TB_REFERENCE_DIR (default ../shared/reference/thunderbolt-app-client,
//     served by serve.mjs under /reference/app-client/, never copied), plain
//     `thunderbolt/acp/0` (the only protocol it speaks); a failure is printed;
//   - WS ceiling: the same page and bytes through a plain WebSocket to a
//     minimal echo/count/stream server (e2e/ws-ceiling.mjs) on the same host,
//     loopback, plain ws:// like the dev relay: what the browser itself can
//     move. The page sends bulk.mjs's 1 MiB blocks as one message each (the
//     echo returns them so); downloads come in TB_WS_CHUNK-byte messages
//     (default 14556: the largest WebSocket message the relay sends the page,
//     a frame of 10 QUIC datagrams of 1452 B and its 36 B header, as counted
//     with TB_WS_STATS=1; the mean is lower, ~10 KB, as not every batch is full);
//   - WS, relay-sized: the same with every message that size both ways (the
//     per-message cost the relay path pays);
//   - native: `bench relay-bulk` through the same relay;
//   and the ratios ours / WS ceiling and ours / app (MB/s: higher is better
//   for ours; round trips are µs: lower is better for ours). The echo
//   server's own speed, measured with a Node client, is printed under it.
//   Round trips move in 100 µs steps: the page's clock has that grain, as in
//   any page that is not cross-origin isolated. Isolating bulk.html would
//   sharpen it, but noq bounds its receive loop by time (50 µs) read from the
//   same clock, so the client measured could behave unlike the app's page.
// Usage (release binaries recommended):
//   cargo build --release --workspace --bins && client-wasm/build.sh
//   TB_BIN_DIR=target/release node client-wasm/e2e/measure.mjs [MiB] [reps]
//   TB_PROFILE=1 …   also: Chrome's CPU profile of each driverless run (labelled), the
//                    page's self time grouped by where it is spent (wasm, WebSocket, …);
//                    build with `TB_WASM_NAMES=1 client-wasm/build.sh` to see wasm names
//   TB_RESUME=0 …    plain thunderbolt/acp/0 connections in the browser too (native is always plain;
//                    the table's "ours" column is then plain as well)
//   TB_MEASURE_LOGS=DIR TB_RUST_LOG=info …   keep the relay's and bridges' stderr in DIR
//   TB_WS_STATS=1 …  the comparison rows also count the page's WebSocket messages
//                    (mean size each way; costs a listener per message)
//   TB_WS_CHUNK=N …  the WebSocket ceiling's message size (bytes, default 14556)
//   TB_MEASURE_ONLY=files …  only the files rows: putFile and getFile in the driverless page through the relay,
//                    against the same page's WebSocket ceiling and its session stream, each one way (issue 61)
// Two browser rows: one driven by Playwright (as the e2e tests), one in a plain
// Chromium no driver is attached to: Playwright keeps Chrome's Network domain
// on, which copies every WebSocket frame to the driver and halves the page's
// relay throughput. The driverless row is the one users see.
import { spawn, spawnSync, execFile, execFileSync } from "node:child_process";
import { promisify } from "node:util";
import { createWriteStream, mkdtempSync, readFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";
import { chromium } from "playwright-core";
import { startServer } from "../serve.mjs";
import { CHUNK as WS_CHUNK } from "./ws-ceiling.mjs";

// The profile speaks CDP over a WebSocket: Node 20 has one behind a flag.
if (process.env.TB_PROFILE && typeof WebSocket === "undefined") {
  const r = spawnSync(process.execPath, ["--experimental-websocket", ...process.argv.slice(1)], { stdio: "inherit" });
  process.exit(r.status ?? 1);
}

const execFileAsync = promisify(execFile);
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const BIN = resolve(process.env.TB_BIN_DIR || join(ROOT, "target/release"));
const MIB = Number(process.argv[2] || 32);
const REPS = Number(process.argv[3] || 5);
// Small round trips per repetition (browser and native alike).
const RTTS = 1000;
// A native run that fails is tried once more, and counted (printed with the figures).
const nativeFailures = [];
const procs = [];
// However this ends (a failed step throws), the bridges and the relay go with it.
process.on("exit", () => { for (const p of procs) p.child.kill("SIGTERM"); });

function run(cmd, args, env = {}) {
  const child = spawn(cmd, args, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  const p = { child, out: [] };
  createInterface({ input: child.stdout }).on("line", (l) => p.out.push(l));
  // TB_MEASURE_LOGS=DIR keeps each process's stderr there (else it is dropped).
  if (process.env.TB_MEASURE_LOGS) child.stderr.pipe(createWriteStream(join(process.env.TB_MEASURE_LOGS, `${procs.length}-${cmd.split("/").pop()}.log`)));
  else child.stderr.on("data", () => {});
  procs.push(p);
  return p;
}
const until = async (f) => { for (let i = 0; i < 1200; i++) { const v = await f(); if (v) return v; await new Promise((r) => setTimeout(r, 25)); } throw new Error("timeout"); };
const median = (v) => { const s = [...v].sort((a, b) => a - b); const n = s.length; return n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2; };

// The relay's metrics say how many datagrams it dropped (a client that reads its
// WebSocket slower than the other side sends fills its queue at the relay).
const METRICS = `127.0.0.1:${20000 + Math.floor(Math.random() * 40000)}`;
const relay = run(join(BIN, "thunderbolt-relay"), ["--dev", "--bind", "127.0.0.1:0", "--metrics", METRICS]);
const relayDropped = async () => {
  const text = await (await fetch(`http://${METRICS}/metrics`)).text();
  const line = text.split("\n").find((l) => /^\S*send_packets_dropped(_total)?(\{[^}]*\})? /.test(l));
  return line ? Number(line.split(" ").pop()) : NaN;
};
// `f`'s result and the datagrams the relay dropped while it ran.
const withDrops = async (f) => {
  const before = await relayDropped();
  const v = await f();
  return [v, (await relayDropped()) - before];
};
const relayUrl = (await until(() => relay.out.find((l) => l.startsWith("relay listening on ")))).split(" ").pop();
const home = mkdtempSync(join(tmpdir(), "tb-measure-"));
const env = { THUNDERBOLT_HOME: home, THUNDERBOLT_IROH_RELAY_URL: relayUrl, THUNDERBOLT_IROH_DISCOVERY: "off",
  THUNDERBOLT_IROH_PORTMAPPER: "off", THUNDERBOLT_IROH_BIND: "127.0.0.1:0", RUST_LOG: process.env.TB_RUST_LOG || "warn" };
const startBridge = async (agent) => {
  const b = run(join(BIN, "thunderbolt"), ["acp", "--transport", "iroh", "--per-remote-max", "100000", ...(agent ? ["--", ...agent] : [])], env);
  await until(() => b.out.some((l) => l.trim().startsWith("Allow a peer:")));
  return { ...b, ticket: b.out.map((l) => l.trim()).find((l) => l.startsWith("Ticket:")).split(/\s+/)[1] };
};
const builtin = await startBridge();
const server = await startServer(0);
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
// Both browsers: no sandbox (root), nothing that reaches for the network by itself.
const CHROME_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"];
const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROME_FLAGS });
const page = await browser.newPage();
await page.goto(`http://127.0.0.1:${server.address().port}/www/?relay=${encodeURIComponent(relayUrl)}`);
await page.waitForFunction(() => window.ready === true);
const secret = await page.evaluate(() => window.thunderbolt.state.client.secretKeyHex());
const nodeId = await page.evaluate(() => window.thunderbolt.state.client.nodeId());
execFileSync(join(BIN, "thunderbolt"), ["iroh", "allow", nodeId], { env: { ...process.env, ...env } });

// TB_MEASURE_ONLY=files: the files rows alone (issue 61), then done.
if (process.env.TB_MEASURE_ONLY === "files") {
  await filesRows();
  await browser.close();
  server.close();
  for (const p of procs) p.child.kill("SIGTERM");
  process.exit(0);
}

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

// Bulk through a cat agent: browser vs native, same relay, same bridge. One
// bridge per protocol and home at a time: the setup's goes first.
builtin.child.kill("SIGTERM");
await new Promise((r) => (builtin.child.exitCode !== null ? r() : builtin.child.once("exit", r)));
const cat = await startBridge([join(BIN, "test-agent"), "cat"]);
const bytes = MIB * 1024 * 1024;
const browserMBs = [];
const nativeMBs = [];
for (let i = 0; i < REPS; i++) {
  browserMBs.push(await page.evaluate(async ([ticket, total, resume]) => {
    const { bulk } = await import("/e2e/bulk.mjs");
    return bulk(window.thunderbolt.state.client, ticket, total, resume);
  }, [cat.ticket, bytes, process.env.TB_RESUME !== "0"]));
  nativeMBs.push(await native("bulk", cat.ticket, bytes));
}
// The same bulk in a Chromium no driver is attached to (e2e/bulk.html): the
// rows above run with Playwright's Network domain on, which copies every
// WebSocket frame out of the browser. Fresh identity, allowed like the native one.
const plain = await plainBrowserBulk(cat.ticket, bytes);
const plainMBs = plain.mbs;
// The same with the client in a Web Worker: throughput, and how the page's own
// thread fares meanwhile.
const worker = await plainBrowserBulk(cat.ticket, bytes, "bulk", { worker: true });
// Small round trips through the same cat agent, browser (driverless) and native.
// (bulk.html posts every mode's figures as `mbs`: here p50s in µs.)
const rttBrowser = (await plainBrowserBulk(cat.ticket, RTTS, "rtt")).mbs;
const rttNative = await nativeRuns("rtt", cat.ticket, RTTS);
// The comparison table's other clients, through the same bridges.
const cmp = { bulk: {}, upload: {}, download: {}, rtt: {} };
cmp.bulk.ours = plain; cmp.rtt.ours = { mbs: rttBrowser };
await others(cat.ticket, bytes, "bulk");
await others(cat.ticket, RTTS, "rtt");
// Each direction alone, in the same driverless page: an agent that streams
// (download) and one that only counts what it gets (upload).
cat.child.kill("SIGTERM");
await new Promise((r) => (cat.child.exitCode !== null ? r() : cat.child.once("exit", r)));
const streamer = await startBridge([join(BIN, "test-agent"), "stream", String(bytes + 1024 * 1024)]);
const [downMBs, downDrops] = await withDrops(async () => (await plainBrowserBulk(streamer.ticket, bytes, "download")).mbs);
const [downNative, downNativeDrops] = await withDrops(() => nativeRuns("download", streamer.ticket, bytes));
cmp.download.ours = { mbs: downMBs };
await others(streamer.ticket, bytes, "download");
streamer.child.kill("SIGTERM");
await new Promise((r) => (streamer.child.exitCode !== null ? r() : streamer.child.once("exit", r)));
const counter = await startBridge([join(BIN, "test-agent"), "count", String(bytes)]);
const [upMBs, upDrops] = await withDrops(async () => (await plainBrowserBulk(counter.ticket, bytes, "upload")).mbs);
const [upNative, upNativeDrops] = await withDrops(() => nativeRuns("upload", counter.ticket, bytes));
cmp.upload.ours = { mbs: upMBs };
await others(counter.ticket, bytes, "upload");
counter.child.kill("SIGTERM");
// The browser's ceiling: the same page, a plain WebSocket (ws-ceiling.mjs,
// its own process, on 127.0.0.1 like the relay).
const wsBase = await startWsCeiling();
const wsUrl = { bulk: () => `${wsBase}/echo`, rtt: () => `${wsBase}/echo`,
  upload: (n) => `${wsBase}/upload?expect=${n}`, download: (n) => `${wsBase}/download?bytes=${n + 1024 * 1024}&chunk=${WS_CHUNK}` };
for (const [mode, amount] of [["bulk", bytes], ["upload", bytes], ["download", bytes], ["rtt", RTTS]]) {
  cmp[mode].ws = await plainBrowserBulk(wsUrl[mode](amount), amount, mode, { client: "ws" });
  cmp[mode].wsSplit = await plainBrowserBulk(wsUrl[mode](amount), amount, mode, { client: "ws", split: WS_CHUNK });
}
// Is the echo server itself the limit? Its speed with a Node client (3 runs).
const wsCheck = [];
for (let i = 0; i < 3; i++) wsCheck.push(JSON.parse((await execFileAsync(process.execPath, [join(ROOT, "client-wasm/e2e/ws-ceiling.mjs"), "--check", wsBase, String(Math.max(MIB, 32))])).stdout));

const gz = execFileSync("sh", ["-c", `gzip -9 -c ${join(ROOT, "client-wasm/pkg/thunderbolt_client_wasm_bg.wasm")} | wc -c`]).toString().trim();
const raw = execFileSync("sh", ["-c", `wc -c < ${join(ROOT, "client-wasm/pkg/thunderbolt_client_wasm_bg.wasm")}`]).toString().trim();
console.log(`| figure | median (min–max) |`);
console.log(`|---|---|`);
console.log(`| wasm size | ${(raw / 1e6).toFixed(2)} MB raw, ${(gz / 1e6).toFixed(2)} MB gzipped |`);
console.log(`| page: create() → first reply (relay) | ${median(setup).toFixed(1)} ms (${Math.min(...setup).toFixed(1)}–${Math.max(...setup).toFixed(1)}) |`);
console.log(`| bulk ${MIB} MiB browser ⇄ bridge (relay) | ${median(browserMBs).toFixed(1)} MB/s (${Math.min(...browserMBs).toFixed(1)}–${Math.max(...browserMBs).toFixed(1)}) |`);
console.log(`| bulk ${MIB} MiB native ⇄ bridge (same relay) | ${median(nativeMBs).toFixed(1)} MB/s (${Math.min(...nativeMBs).toFixed(1)}–${Math.max(...nativeMBs).toFixed(1)}) |`);
console.log(`| browser / native | ${(median(browserMBs) / median(nativeMBs)).toFixed(2)}× |`);
console.log(`| bulk ${MIB} MiB browser ⇄ bridge (relay), no driver attached | ${median(plainMBs).toFixed(1)} MB/s (${Math.min(...plainMBs).toFixed(1)}–${Math.max(...plainMBs).toFixed(1)}) |`);
console.log(`| browser (no driver) / native | ${(median(plainMBs) / median(nativeMBs)).toFixed(2)}× |`);
console.log(`| bulk ${MIB} MiB, the client in a Web Worker, no driver attached | ${median(worker.mbs).toFixed(1)} MB/s (${Math.min(...worker.mbs).toFixed(1)}–${Math.max(...worker.mbs).toFixed(1)}) |`);
const lagRow = (l) => `p50 ${l.p50.toFixed(1)} ms, p95 ${l.p95.toFixed(1)} ms, max ${l.max.toFixed(0)} ms`;
console.log(`| main thread: a 10 ms timer's lateness during bulk, client on the page | ${lagRow(plain.lag)} |`);
console.log(`| main thread: the same, client in a Web Worker | ${lagRow(worker.lag)} |`);
const spread = (v, d = 1) => `${median(v).toFixed(d)} (${Math.min(...v).toFixed(d)}–${Math.max(...v).toFixed(d)})`;
console.log(`| upload ${MIB} MiB browser → bridge (relay), no driver attached | ${spread(upMBs)} MB/s |`);
console.log(`| upload ${MIB} MiB native → bridge (same relay) | ${spread(upNative)} MB/s |`);
console.log(`| upload browser / native | ${(median(upMBs) / median(upNative)).toFixed(2)}× |`);
console.log(`| download ${MIB} MiB bridge → browser (relay), no driver attached | ${spread(downMBs)} MB/s |`);
console.log(`| download ${MIB} MiB bridge → native (same relay) | ${spread(downNative)} MB/s |`);
console.log(`| download browser / native | ${(median(downMBs) / median(downNative)).toFixed(2)}× |`);
console.log(`| datagrams the relay dropped: upload browser ${upDrops}, native ${upNativeDrops}; download browser ${downDrops}, native ${downNativeDrops} | ${REPS} transfers each |`);
console.log(`| ~200 B round trip p50 (${RTTS} each), browser, no driver attached | ${spread(rttBrowser, 0)} µs |`);
console.log(`| ~200 B round trip p50 (${RTTS} each), native (same relay) | ${spread(rttNative, 0)} µs |`);
console.log(`| round trip browser / native | ${(median(rttBrowser) / median(rttNative)).toFixed(2)}× |`);

// The comparison table.
const cell = (r, d = 1) => (!r ? "—" : r.error ? "failed (below)" : spread(r.mbs, d));
const ratio = (a, b) => (a && b && !a.error && !b.error ? `${(median(a.mbs) / median(b.mbs)).toFixed(2)}×` : "—");
const natives = { bulk: nativeMBs, upload: upNative, download: downNative, rtt: rttNative };
const label = { bulk: `bulk echo ${MIB} MiB, MB/s`, upload: `upload ${MIB} MiB, MB/s`, download: `download ${MIB} MiB, MB/s`, rtt: `~200 B round trip p50 (${RTTS} each), µs` };
console.log("");
console.log(`| figure (driverless page) | ours (resumable) | ours, plain | app's client | WS ceiling | WS, ${WS_CHUNK} B messages | native (same relay) | ours / WS ceiling | ours / app |`);
console.log(`|---|---|---|---|---|---|---|---|---|`);
for (const m of ["bulk", "upload", "download", "rtt"]) {
  const c = cmp[m];
  const d = m === "rtt" ? 0 : 1;
  console.log(`| ${label[m]} | ${cell(c.ours, d)} | ${cell(c.plain, d)} | ${cell(c.app, d)} | ${cell(c.ws, d)} | ${cell(c.wsSplit, d)} | ${spread(natives[m], d)} | ${ratio(c.ours, c.ws)} | ${ratio(c.ours, c.app)} |`);
}
const mbsOf = (k) => spread(wsCheck.map((r) => r[k]), 0);
console.log(`WS ceiling server alone (Node client, ${Math.max(MIB, 32)} MiB, 3 runs): echo ${mbsOf("echo")} MB/s, upload ${mbsOf("upload")} MB/s, download ${mbsOf("download")} MB/s`);
if (process.env.TB_WS_STATS === "1") {
  console.log("WebSocket messages, mean size page → server / server → page (all reps, handshakes included):");
  const mean = (s) => (s.n ? `${Math.round(s.bytes / s.n)} B (max ${s.max}) × ${s.n}` : "none");
  for (const m of ["bulk", "upload", "download", "rtt"]) for (const [k, r] of Object.entries(cmp[m])) if (r && r.ws) console.log(`  ${m} ${k}: ${mean(r.ws.sent)} / ${mean(r.ws.recv)}`);
}
for (const m of ["bulk", "upload", "download", "rtt"]) for (const [k, r] of Object.entries(cmp[m])) if (r && r.error) console.log(`${m}, ${k}: FAILED: ${r.error}`);
for (const f of nativeFailures) console.log(`native run failed and was repeated: ${f}`);
await browser.close();
server.close();
for (const p of procs) p.child.kill("SIGTERM");

/// The comparison table's other browser clients for MODE through TICKET's
/// bridge: ours plain, and the app's (whose failure is kept, not thrown).
async function others(ticket, amount, mode) {
  cmp[mode].plain = await plainBrowserBulk(ticket, amount, mode, { resume: false });
  try {
    cmp[mode].app = await plainBrowserBulk(ticket, amount, mode, { client: "app" });
  } catch (e) {
    cmp[mode].app = { error: String(e.message || e) };
  }
}

/// REPS runs of [`native`], one after the other.
async function nativeRuns(mode, ticket, amount) {
  const out = [];
  for (let i = 0; i < REPS; i++) out.push(await native(mode, ticket, amount));
  return out;
}

/// One `bench relay-bulk` run of MODE through the relay as a fresh allowed
/// identity: MB/s, or for `rtt` the p50 round trip in microseconds.
async function native(mode, ticket, amount) {
  // Not execFileSync: node must keep reading the relay's and bridges' stderr
  // meanwhile, or a full pipe stalls them (their logging blocks).
  const once = async () => Number((await execFileAsync(join(BIN, "bench"), ["relay-bulk", relayUrl, ticket, allowedSecret(), String(amount), "--mode", mode])).stdout.trim());
  try {
    return await once();
  } catch (e) {
    nativeFailures.push(`${mode}: ${String(e.stderr || e.message).split("\n").slice(0, 3).join(" ")}`);
    return await once();
  }
}

/// A fresh identity (made by `thunderbolt iroh id` in a home of its own), allowed
/// by the bridges; returns its secret key as hex.
function allowedSecret() {
  const id = JSON.parse(execFileSync(join(BIN, "thunderbolt"), ["iroh", "id", "--json"], { env: { ...process.env, ...env, THUNDERBOLT_HOME: mkdtempSync(join(tmpdir(), "tb-id-")) } }));
  execFileSync(join(BIN, "thunderbolt"), ["iroh", "allow", id.nodeId], { env: { ...process.env, ...env } });
  return readFileSync(id.identityPath, "utf8").trim();
}

/// Runs e2e/bulk.html in a Chromium started without a driver and returns what
/// it posts back ({mbs, lag, ws}). `opts`: worker (the client in a Web Worker),
/// client (ours, app, ws; for ws TICKET is the ws:// URL), resume (ours;
/// default: TB_RESUME), split (ws: bytes per message).
async function plainBrowserBulk(ticket, total, mode = "bulk", opts = {}) {
  const { worker: inWorker = false, client = "ours", resume = process.env.TB_RESUME !== "0", split = 0 } = opts;
  const secretHex = client === "ws" ? "" : allowedSecret();
  let deliver;
  const result = new Promise((r) => { deliver = r; });
  const sink = createServer((req, res) => {
    let body = "";
    req.on("data", (d) => { body += d; });
    req.on("end", () => { res.writeHead(204, { "access-control-allow-origin": "*" }); res.end(); deliver(JSON.parse(body)); });
  });
  await new Promise((r) => sink.listen(0, "127.0.0.1", r));
  const q = new URLSearchParams({ relay: relayUrl, ticket, secret: secretHex, bytes: String(total), reps: String(REPS), mode, worker: inWorker ? "1" : "0",
    resume: resume ? "1" : "0", client, split: String(split), report: `http://127.0.0.1:${sink.address().port}/` });
  if (process.env.TB_WS_STATS === "1") q.set("wsstats", "1");
  const profile = Boolean(process.env.TB_PROFILE);
  if (profile) q.set("wait", "1");
  const chrome = spawn(CHROMIUM, ["--headless", ...CHROME_FLAGS,
    `--user-data-dir=${mkdtempSync(join(tmpdir(), "tb-chrome-"))}`, ...(profile ? ["--remote-debugging-port=0"] : []),
    `http://127.0.0.1:${server.address().port}/e2e/bulk.html?${q}`], { stdio: ["ignore", "ignore", "pipe"] });
  const stderr = createInterface({ input: chrome.stderr });
  const devtools = profile ? new Promise((r) => stderr.on("line", (l) => { const m = l.match(/DevTools listening on (ws:\S+)/); if (m) r(m[1]); })) : null;
  const timeout = new Promise((_, reject) => setTimeout(() => reject(new Error("bulk.html posted nothing in 10 min")), 600_000).unref());
  try {
    const cdp = profile ? await attachProfiler(await devtools) : null;
    const r = await Promise.race([result, timeout]);
    if (cdp) { printProfile((await cdp.call("Profiler.stop")).profile, `${mode}, ${client}${client === "ours" ? (resume ? " resumable" : " plain") : ""}${inWorker ? ", in a Web Worker" : ""}`); cdp.close(); }
    if (r.error) throw new Error(`bulk.html: ${r.error}`);
    return r;
  } finally {
    chrome.kill("SIGTERM");
    sink.close();
  }
}

/// Attaches to bulk.html over CDP with only the Profiler and Runtime domains,
/// starts sampling, then lets the page begin (it waits for `window.go()`).
async function attachProfiler(browserWs) {
  const port = new URL(browserWs).port;
  const target = await until(async () => {
    const list = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
    return list.find((t) => t.type === "page" && t.url.includes("bulk.html"));
  });
  const ws = new WebSocket(target.webSocketDebuggerUrl);
  await new Promise((r, j) => { ws.onopen = r; ws.onerror = j; });
  let next = 1;
  const waiting = new Map();
  ws.onmessage = (e) => { const m = JSON.parse(e.data); if (m.id && waiting.has(m.id)) { waiting.get(m.id)(m.result); waiting.delete(m.id); } };
  const call = (method, params = {}) => new Promise((r) => { const id = next++; waiting.set(id, r); ws.send(JSON.stringify({ id, method, params })); });
  await call("Profiler.enable");
  await call("Profiler.setSamplingInterval", { interval: 200 });
  // (An answer without a result: the page was not ready to evaluate yet.)
  await until(async () => (await call("Runtime.evaluate", { expression: "typeof window.go === 'function'", returnByValue: true }))?.result?.value);
  await call("Profiler.start");
  await call("Runtime.evaluate", { expression: "window.go()" });
  return { call, close: () => ws.close() };
}

/// Self time per function, top 25, then grouped: ring's crypto and the rest of
/// the wasm module (function names need a `TB_WASM_NAMES=1` build), the
/// browser's WebSocket and copies across the wasm/JS boundary, wasm-bindgen's
/// JS glue, timers, garbage collection, idle.
function printProfile(profile, what) {
  const hits = new Map();
  const total = profile.samples.length;
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const count = new Map();
  for (const id of profile.samples) count.set(id, (count.get(id) || 0) + 1);
  for (const [id, c] of count) {
    const f = byId.get(id).callFrame;
    // An anonymous function in a script: where it is (the glue's closures and imports).
    const where = !f.functionName && f.url && !f.url.endsWith(".wasm") ? `:${f.lineNumber + 1}` : "";
    const name = `${f.functionName || "(anonymous)"} ${f.url.split("/").pop().split("?")[0]}${where}`;
    hits.set(name, (hits.get(name) || 0) + c);
  }
  const rows = [...hits].sort((a, b) => b[1] - a[1]);
  console.log(`\nCPU profile of the driverless ${what} transfers (${total} samples, self time):`);
  for (const [name, c] of rows.slice(0, 25)) console.log(`  ${((100 * c) / total).toFixed(1).padStart(5)} %  ${name}`);
  const groups = {};
  for (const [name, c] of rows) {
    const inWasm = name.endsWith("_bg.wasm");
    const g = name.startsWith("(idle)") ? "idle" : name.startsWith("(garbage collector)") ? "garbage collector"
      : name.startsWith("(program)") ? "browser internals"
      : inWasm && /^(ring\[|ring_core_)/.test(name) ? "crypto in wasm (ring)"
      : inWasm ? "wasm: QUIC, iroh, ours"
      : /^(setTimeout|clearTimeout|queueMicrotask|now|__wbg_now_\w+) /.test(name) ? "timers and microtasks"
      : /^(send|__wbg_new_from_slice|__wbg_data|wasm-to-js|js-to-wasm)/.test(name) ? "WebSocket and JS copies"
      : /(thunderbolt_client_wasm|thunderbolt_acp_client)\.js(:\d+)?$/.test(name) ? "wasm-bindgen JS glue (closures, callbacks)" : "other JS";
    groups[g] = (groups[g] || 0) + c;
  }
  for (const [g, c] of Object.entries(groups).sort((a, b) => b[1] - a[1])) console.log(`  ${((100 * c) / total).toFixed(1).padStart(5)} %  [${g}]`);
  console.log("");
}

/// ws-ceiling.mjs in its own process, on 127.0.0.1 like the relay: its ws:// base URL.
async function startWsCeiling() {
  const ws = run(process.execPath, [join(ROOT, "client-wasm/e2e/ws-ceiling.mjs")]);
  return `ws://127.0.0.1:${(await until(() => ws.out.find((l) => l.startsWith("ws ceiling listening on ")))).split(" ").pop()}`;
}

/// Files through the relay in the driverless page (putFile, getFile: the
/// page hashes or checks every byte) against the same page's WebSocket
/// ceiling for the same bytes one way, and against the same page's session
/// stream (an upload to a counting agent, a download from a streaming one).
async function filesRows() {
  builtin.child.kill("SIGTERM");
  await new Promise((r) => (builtin.child.exitCode !== null ? r() : builtin.child.once("exit", r)));
  const bytes = MIB * 1024 * 1024;
  const counter = await startBridge([join(BIN, "test-agent"), "count", String(bytes)]);
  // A client without files (an older build, the app's) is said to have failed; the rest still runs.
  const tried = (mode) => plainBrowserBulk(counter.ticket, bytes, mode).catch((e) => ({ error: String(e.message || e) }));
  const put = await tried("putfile");
  const get = await tried("getfile");
  const up = await plainBrowserBulk(counter.ticket, bytes, "upload");
  counter.child.kill("SIGTERM");
  await new Promise((r) => (counter.child.exitCode !== null ? r() : counter.child.once("exit", r)));
  const streamer = await startBridge([join(BIN, "test-agent"), "stream", String(bytes + 1024 * 1024)]);
  const down = await plainBrowserBulk(streamer.ticket, bytes, "download");
  streamer.child.kill("SIGTERM");
  const wsBase = await startWsCeiling();
  const wsUp = await plainBrowserBulk(`${wsBase}/upload?expect=${bytes}`, bytes, "upload", { client: "ws" });
  const wsDown = await plainBrowserBulk(`${wsBase}/download?bytes=${bytes + 1024 * 1024}&chunk=${WS_CHUNK}`, bytes, "download", { client: "ws" });
  const spread = (v) => (v ? `${median(v).toFixed(1)} (${Math.min(...v).toFixed(1)}–${Math.max(...v).toFixed(1)})` : "failed");
  const ratio = (a, b) => (a && b ? `${(median(a) / median(b)).toFixed(2)}×` : "—");
  console.log(`| ${MIB} MiB, driverless page, ${REPS} runs | files (/files1, relay) | session stream (relay) | WS ceiling | files / WS ceiling | files / session stream |`);
  console.log(`|---|---|---|---|---|---|`);
  console.log(`| up: putFile / upload, MB/s | ${spread(put.mbs)} | ${spread(up.mbs)} | ${spread(wsUp.mbs)} | ${ratio(put.mbs, wsUp.mbs)} | ${ratio(put.mbs, up.mbs)} |`);
  console.log(`| down: getFile / download, MB/s | ${spread(get.mbs)} | ${spread(down.mbs)} | ${spread(wsDown.mbs)} | ${ratio(get.mbs, wsDown.mbs)} | ${ratio(get.mbs, down.mbs)} |`);
  for (const [what, r] of [["putFile", put], ["getFile", get]]) if (r.error) console.log(`${what}: FAILED: ${r.error}`);
}
