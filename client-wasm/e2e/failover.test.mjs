// Relay failover from the browser client: a page (WebSocket relays only, by
// nature) streams lines through a cat agent behind a bridge with two relays,
// and the relay its path goes through (the bridge's home) is killed mid-stream. The client comes back
// through the other relay: every line once and in order, the longest gap
// reported (issue 59: at most 2 s).
//
//   (cd client-wasm/e2e && node --test --test-concurrency=1 failover.test.mjs)
//
// Needs: client-wasm/pkg (client-wasm/build.sh), the workspace binaries,
// Debian chromium, `npm ci` here. FAILOVER_RUNS=N repeats the run N times
// (for the closing note's figures); the suite runs it once.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { startServer } from "../serve.mjs";
import { BIN, WAIT_MS, waitFor, tb, startRelay, startAcpBridge, endAll, launchChromium } from "./harness.mjs";

/// Lines streamed, one every LINE_MS; the relay dies after KILL_AT echoed.
const LINES = Number(process.env.FAILOVER_LINES || 2000);
const LINE_MS = Number(process.env.FAILOVER_LINE_MS || 5);
const KILL_AT = Math.floor(LINES / 3);
/// A loose bound on the longest gap between two echoed lines, so that a slow
/// machine never fails it; the issue's 2 s is measured, and reported, with
/// FAILOVER_RUNS=20 (measured: about 0.5 s with the page homed on the dead
/// relay, 1.6 s homed on the other: its silence watch notices).
const MAX_GAP_MS = 5000;

let server, browser, baseUrl;

before(async () => {
  server = await startServer(0);
  baseUrl = `http://127.0.0.1:${server.address().port}`;
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  server?.close();
  endAll();
});

/// One run: two relays, a bridge on both, a page homed on the first; that
/// relay killed mid-stream. The stream's figures.
async function oneRun() {
  const a = await startRelay();
  const b = await startRelay();
  const bridge = await startAcpBridge(`${a.url},${b.url}`, [join(BIN, "test-agent"), "cat"], [], { env: process.env.FAILOVER_BRIDGE_LOG ? { RUST_LOG: process.env.FAILOVER_BRIDGE_LOG } : {} });
  const ctx = await browser.newContext();
  const p = await ctx.newPage();
  p.on("pageerror", (e) => console.log("page error:", e.message));
  await p.goto(`${baseUrl}/www/?${new URLSearchParams({ relay: a.url })}`);
  await p.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  // The page's own client for the stream: homed on relay A (the ticket adds B).
  const nodeId = await p.evaluate(async ([relay]) => {
    const c = await window.thunderbolt.IrohClient.create(undefined, relay);
    window.fo = { client: c, got: 0, events: [] };
    return c.nodeId();
  }, [a.url]);
  tb(bridge.home, a.url, ["iroh", "allow", nodeId]);
  await p.evaluate(([ticket, lines, lineMs]) => {
    const fo = window.fo;
    fo.done = (async () => {
      const conn = await fo.client.connect(ticket, "thunderbolt/acp/0", undefined, {
        resume: true, onEvent: (e) => fo.events.push(`${e.type}${e.detail ? `: ${e.detail}` : ""} (${fo.killedAt ? `+${(performance.now() - fo.killedAt).toFixed(0)} ms` : "before"})`),
      });
      const reader = conn.readable().getReader();
      const enc = new TextEncoder();
      const writer = (async () => {
        for (let n = 0; n < lines; n++) {
          await conn.send(enc.encode(`{"n":${n}}\n`));
          await new Promise((r) => setTimeout(r, lineMs));
        }
      })();
      const dec = new TextDecoder();
      let buf = "", last = performance.now();
      const gaps = [];
      while (fo.got < lines) {
        const { value, done } = await reader.read();
        if (done) throw new Error(`the stream ended at ${fo.got}; events: ${fo.events.join(" | ")}`);
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          if (!line.trim()) continue;
          const n = JSON.parse(line).n;
          if (n !== fo.got) throw new Error(`line ${n} came where ${fo.got} was due (lost, repeated or reordered)`);
          const now = performance.now();
          gaps.push(now - last);
          last = now;
          fo.got++;
        }
      }
      await writer;
      conn.close();
      gaps.sort((x, y) => x - y);
      return { max: gaps[gaps.length - 1], median: gaps[gaps.length >> 1], events: fo.events };
    })().catch((e) => ({ error: String(e && e.message || e), events: fo.events }));
  }, [bridge.ticket, LINES, LINE_MS]);
  await p.waitForFunction((n) => window.fo.got >= n, KILL_AT, { timeout: WAIT_MS });
  // The relay the bridge is homed on (iroh picks either): the page's path
  // to the bridge goes through it, whichever the page's own home is.
  const status = JSON.parse(tb(bridge.home, a.url, ["status", "--json"]));
  const home = status.bridges[0].agents[0].relay.url;
  const victim = [a, b].find((r) => new URL(r.url).port === new URL(home).port);
  assert.ok(victim, `the bridge's home ${home} is one of ours`);
  victim.child.kill("SIGKILL");
  const killedAt = new Date().toISOString();
  await p.evaluate(() => { window.fo.killedAt = performance.now(); });
  const r = await p.evaluate(() => window.fo.done);
  r.victim = victim === a ? "the bridge's home, the page's first relay" : "the bridge's home, the page's second relay";
  if (process.env.E2E_VERBOSE) console.log(`killed ${victim.url} at ${killedAt}\nbridge:\n${bridge.err}`);
  await ctx.close();
  bridge.child.kill("SIGTERM");
  for (const r of [a, b]) if (r !== victim) r.child.kill("SIGTERM");
  return r;
}

test("the relay the page's stream goes through killed mid-stream: it comes back through the other, every line once and in order", async () => {
  const runs = Number(process.env.FAILOVER_RUNS || 1);
  const maxes = [];
  for (let i = 0; i < runs; i++) {
    const r = await oneRun();
    assert.equal(r.error, undefined, `run ${i + 1}: ${r.error}`);
    assert.ok(r.events.some((e) => e.startsWith("reconnecting")), `the loss was noticed and redialed: ${r.events}`);
    assert.ok(r.events.some((e) => e.startsWith("resumed")), `resumed: ${r.events}`);
    console.log(`run ${i + 1} (${r.victim} killed): longest gap ${r.max.toFixed(0)} ms (median ${r.median.toFixed(1)} ms); ${r.events.join(" | ")}`);
    maxes.push(r.max);
    assert.ok(r.max <= MAX_GAP_MS, `run ${i + 1}: a gap of ${r.max.toFixed(0)} ms`);
  }
  maxes.sort((x, y) => x - y);
  console.log(`longest gaps over ${runs} run(s): median ${maxes[maxes.length >> 1].toFixed(0)} ms, max ${maxes[maxes.length - 1].toFixed(0)} ms`);
});
