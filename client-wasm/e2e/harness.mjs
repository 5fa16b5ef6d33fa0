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

/// Spawns a process, collecting its stdout lines and stderr text.
export function run(cmd, args, env = {}) {
  const child = spawn(cmd, args, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
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
