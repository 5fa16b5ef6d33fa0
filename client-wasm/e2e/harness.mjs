// What the node test files share: processes started and collected, waits
// bounded in time, the environment that keeps every thunderbolt process on
// loopback (design §5).
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
export const BIN = process.env.TB_BIN_DIR || join(ROOT, "target/debug");
/// Upper bound for anything we wait on; a passing run never waits it out.
export const WAIT_MS = 30_000;

/// Every process a test file started, to end when it is done.
export const procs = [];

export function waitFor(cond, what, ms = WAIT_MS) {
  return new Promise((res, rej) => {
    const start = Date.now();
    const tick = () => {
      let v;
      try { v = cond(); } catch (e) { return rej(e); }
      if (v) return res(v);
      if (Date.now() - start > ms) return rej(new Error(`timed out waiting for ${what}`));
      setTimeout(tick, 25);
    };
    tick();
  });
}

/// Spawns a process (in `cwd`, if given), collecting its stdout lines and stderr text.
export function run(cmd, args, env = {}, cwd = undefined) {
  const child = spawn(cmd, args, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"], cwd });
  const p = { child, out: [], err: "" };
  createInterface({ input: child.stdout }).on("line", (l) => p.out.push(l));
  child.stderr.on("data", (d) => (p.err += d));
  procs.push(p);
  return p;
}

/// A thunderbolt process's environment: its home, the local relay (or none), every public knob off.
export function tbEnv(home, relayUrl) {
  return {
    THUNDERBOLT_HOME: home,
    THUNDERBOLT_IROH_RELAY_URL: relayUrl || "disabled",
    THUNDERBOLT_IROH_DISCOVERY: "off",
    THUNDERBOLT_IROH_PORTMAPPER: "off",
    THUNDERBOLT_IROH_BIND: "127.0.0.1:0",
    RUST_LOG: "info",
  };
}

export function tempHome() {
  return mkdtempSync(join(tmpdir(), "tb-e2e-"));
}

/// `thunderbolt <args>` to completion, in `home`.
export function tb(home, relayUrl, args) {
  return execFileSync(join(BIN, "thunderbolt"), args, { env: { ...process.env, ...tbEnv(home, relayUrl) } }).toString();
}

export function endAll() {
  for (const p of procs) p.child.kill("SIGTERM");
}

// ---- shared by the page's tests (session.test.mjs): added helpers ----

/// A local relay (`thunderbolt-relay --dev` on a free loopback port): the process and its URL.
export async function startRelay() {
  const r = run(join(BIN, "thunderbolt-relay"), ["--dev", "--bind", "127.0.0.1:0"]);
  const line = await waitFor(() => r.out.find((l) => l.startsWith("relay listening on ")), "a relay");
  return Object.assign(r, { url: line.split(" ").pop() });
}

/// `thunderbolt acp --transport iroh [extra] [-- agent…]` in `home` (a new one
/// unless given), run in `cwd` (the agent's workspace), once its banner is
/// out: the process, its ticket and home.
export async function startAcpBridge(relayUrl, agent = [], extra = [], { home = tempHome(), env = {}, cwd } = {}) {
  const args = ["acp", "--transport", "iroh", ...extra, ...(agent.length ? ["--", ...agent] : [])];
  const p = run(join(BIN, "thunderbolt"), args, { ...tbEnv(home, relayUrl), ...env }, cwd);
  await waitFor(() => p.out.some((l) => l.trim().startsWith("Allow a peer:")), "bridge banner").catch((e) => {
    throw new Error(`${e.message}; stderr:\n${p.err}`);
  });
  const ticket = p.out.map((l) => l.trim()).find((l) => l.startsWith("Ticket:")).split(/\s+/)[1];
  return Object.assign(p, { ticket, home });
}

/// A device's `thunderbolt acp connect <args>` in `home`, its stdin ours:
/// `send(value)` writes a JSON line, `out` collects its stdout lines (parsed
/// when JSON), `seen(pick, what)` waits for one, `err` is its stderr.
export function jsonConnect(home, relayUrl, args) {
  const child = spawn(join(BIN, "thunderbolt"), ["acp", "connect", ...args], {
    env: { ...process.env, ...tbEnv(home, relayUrl) }, stdio: ["pipe", "pipe", "pipe"],
  });
  const p = { child, out: [], err: "" };
  createInterface({ input: child.stdout }).on("line", (l) => { try { p.out.push(JSON.parse(l)); } catch { p.out.push(l); } });
  child.stderr.on("data", (d) => (p.err += d));
  p.send = (v) => child.stdin.write(JSON.stringify(v) + "\n");
  p.seen = (pick, what) => waitFor(() => p.out.find((v) => typeof v === "object" && v !== null && pick(v)), what)
    .catch((e) => { throw new Error(`${e.message}; connect's stdout ${JSON.stringify(p.out)}, stderr:\n${p.err}`); });
  p.exited = new Promise((res) => child.once("exit", (code) => res(code)));
  procs.push(p);
  return p;
}

/// Debian's headless Chromium (CHROMIUM overrides the path), for playwright-core.
export async function launchChromium() {
  const { chromium } = await import("playwright-core");
  return chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
}

/// A test file's page rig: before its tests, a local relay, the page served
/// and Chromium; after them, all of it ended. Its fields are set once the
/// `before` hook ran.
export function pageRig({ before, after }) {
  const rig = {};
  before(async () => {
    const { startServer } = await import("../serve.mjs");
    rig.relay = await startRelay();
    rig.server = await startServer(0);
    rig.baseUrl = `http://127.0.0.1:${rig.server.address().port}`;
    rig.browser = await launchChromium();
  });
  after(async () => {
    await rig.browser?.close();
    rig.server?.close();
    endAll();
  });
  return rig;
}

/// A phone's viewport: the size the pages are made for.
export const PHONE = { viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true, deviceScaleFactor: 1 };

/// A phone (a fresh browser profile at 390 × 844) that opened the pairing
/// link of the bridge or host at `home` (`iroh pair --app-url`): paired as
/// one of the owner's own devices and connected. Its context and page.
export async function phoneOn(rig, home) {
  const minted = JSON.parse(tb(home, rig.relay.url, ["iroh", "pair", "--json", "--app-url", rig.baseUrl]));
  const ctx = await rig.browser.newContext(PHONE);
  const p = await ctx.newPage();
  p.on("pageerror", (e) => console.log("page error:", e.message));
  await p.goto(minted.link);
  await p.waitForFunction(() => document.querySelector("#status").className === "ok" || window.lastError, null, { timeout: WAIT_MS });
  const failed = await p.evaluate(() => window.lastError);
  if (failed !== undefined) throw new Error(`the phone did not connect: ${await p.textContent("#status")}`);
  return { ctx, p };
}
