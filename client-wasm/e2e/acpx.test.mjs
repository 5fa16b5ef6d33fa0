// A real ACP client from npm, acpx, against a warm agent of `thunderbolt host`.
//
// acpx keeps named sessions and starts its agent command once per invocation
// (with its queue-owner TTL at 1 s every invocation really starts it), ends
// the command's stdin when done, then SIGTERM after 100 ms and SIGKILL after
// 1.6 s. Its agent command here is `thunderbolt acp connect <ticket>` with no
// flags. The host's agent is kept warm: every invocation must find the saved
// session through `session/load`, and one agent process serves them all.
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, writeFileSync, readdirSync, readFileSync, chmodSync } from "node:fs";
import { join } from "node:path";
import { BIN, ROOT, WAIT_MS, waitFor, run, tbEnv, tempHome, tb, endAll } from "./harness.mjs";

const ACPX = join(ROOT, "client-wasm/e2e/node_modules/.bin/acpx");

after(endAll);

test("acpx: three invocations of a saved session, one warm agent, session/load every time", async () => {
  const hostHome = tempHome();
  const clientHome = tempHome();
  const acpxHome = tempHome();
  const agents = join(hostHome, "agents.d");
  mkdirSync(agents, { mode: 0o700 });
  const manifest = join(agents, "warm.json");
  writeFileSync(manifest, JSON.stringify({ name: "warm", command: [join(BIN, "thunderbolt"), "acp", "serve"], keep_warm: 120 }));
  chmodSync(manifest, 0o600);
  const clientId = JSON.parse(tb(clientHome, null, ["iroh", "id", "--json"])).nodeId;
  tb(hostHome, null, ["iroh", "allow", clientId]);
  const host = run(join(BIN, "thunderbolt"), ["host"], tbEnv(hostHome, null));
  await waitFor(() => host.out.some((l) => l.includes("Allow a peer:")), "the host's banner").catch((e) => {
    throw new Error(`${e.message}\n${host.err}`);
  });
  const ticket = host.out.map((l) => l.trim()).find((l) => l.startsWith("Ticket:")).split(/\s+/)[1];

  // acpx's own state and config: TTL 1 s.
  mkdirSync(join(acpxHome, ".acpx"));
  writeFileSync(join(acpxHome, ".acpx", "config.json"), JSON.stringify({ ttl: 1 }));
  const env = { ...process.env, ...tbEnv(clientHome, null), HOME: acpxHome };
  const agentCmd = `${join(BIN, "thunderbolt")} acp connect ${ticket}`;
  const acpx = (...args) =>
    execFileSync(ACPX, ["--approve-all", "--verbose", "--agent", agentCmd, ...args], { env, cwd: acpxHome, timeout: WAIT_MS, stdio: ["ignore", "pipe", "pipe"] });

  acpx("sessions", "ensure", "--name", "s1");
  const sessionFile = () => {
    const dir = join(acpxHome, ".acpx", "sessions");
    const f = readdirSync(dir).find((n) => n.endsWith(".json"));
    return JSON.parse(readFileSync(join(dir, f), "utf8"));
  };
  const acpSession = sessionFile().acp_session_id;
  assert.ok(acpSession, "acpx saved the session");
  // Each invocation's connect has gone before the next one starts (its
  // connection ends, the agent stays warm): counted in the host's log.
  const leftCount = () => (host.err.match(/stays warm/g) || []).length;
  await waitFor(() => leftCount() >= 1, "the first connection gone");
  for (let i = 1; i <= 3; i++) {
    const before = leftCount();
    let out;
    try {
      out = acpx("--format", "quiet", "prompt", "-s", "s1", `hello number ${i}`);
    } catch (e) {
      throw new Error(`acpx failed: ${e.stderr}\nhost:\n${host.err}`);
    }
    assert.match(out.toString(), new RegExp(`hello number ${i}`), `invocation ${i}'s reply`);
    await waitFor(() => leftCount() > before, `invocation ${i}'s connection gone`, WAIT_MS).catch((e) => {
      throw new Error(`${e.message}\n${host.err}`);
    });
  }
  // session/load found it every time: acpx falls back to session/new (and
  // saves its new id) when a load fails.
  assert.equal(sessionFile().acp_session_id, acpSession, "the saved session was loaded, not replaced");
  assert.equal((host.err.match(/agent started/g) || []).length, 1, `one agent process for all:\n${host.err}`);
  host.child.kill("SIGTERM");
});
