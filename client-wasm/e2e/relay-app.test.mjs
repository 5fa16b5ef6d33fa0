// The page from your relay (issue 57): `thunderbolt-relay` with TLS on
// loopback serves client-wasm's www/ and pkg/ under /app/ (app_dir), and a
// phone-sized Chromium that trusts the relay's certificate (by its key's hash,
// the way a test CA would be trusted, service workers included) loads the app
// from the relay's own https origin: the page and its service worker run, the
// relay is the page's default, the pairing paths lead to the page, nothing
// outside the app's files is served, and a prompt goes through that relay to
// a bridge.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { request } from "node:https";
import { join } from "node:path";
import { ROOT, BIN, WAIT_MS, waitFor, run, tb, tempHome, endAll, startAcpBridge } from "./harness.mjs";

const ARTIFACTS = join(ROOT, "client-wasm/e2e/artifacts");
const PHONE = { viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true, deviceScaleFactor: 1 };

let relay, origin, browser, ca, certDir;

/// A test CA and a certificate it signed for 127.0.0.1 and localhost; returns
/// the CA's path and the base64 SHA-256 of the server key's SPKI (what
/// Chromium's --ignore-certificate-errors-spki-list takes).
function makeCerts(dir) {
  const ossl = (...args) => execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "pipe", "pipe"] });
  ossl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
    "-subj", "/CN=thunderbolt test CA", "-keyout", "ca.key", "-out", "ca.pem");
  ossl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
    "-subj", "/CN=127.0.0.1", "-keyout", "relay.key", "-out", "relay.csr");
  writeFileSync(join(dir, "ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
  ossl("x509", "-req", "-in", "relay.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
    "-extfile", "ext.cnf", "-out", "relay.pem");
  const spki = execFileSync("sh", ["-c",
    "openssl x509 -in relay.pem -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64"],
  { cwd: dir }).toString().trim();
  return { ca: join(dir, "ca.pem"), spki };
}

/// A GET (or other method) with the path sent exactly as given (no
/// normalisation of `..` or `%2e`, as a browser would do), trusting the test CA.
function raw(path, method = "GET") {
  const { port } = new URL(origin);
  return new Promise((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, path, method, ca: readFileSync(ca) }, (res) => {
      let body = "";
      res.on("data", (d) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  certDir = tempHome();
  const certs = makeCerts(certDir);
  ca = certs.ca;
  // The bridge and `thunderbolt iroh pair` trust the relay through the CA.
  process.env.THUNDERBOLT_IROH_RELAY_CA = ca;
  const config = join(certDir, "relay.toml");
  writeFileSync(config, [
    `http_bind_addr = "127.0.0.1:0"`,
    `app_dir = ${JSON.stringify(join(ROOT, "client-wasm"))}`,
    `[tls]`,
    `hostname = "127.0.0.1"`,
    `https_bind_addr = "127.0.0.1:0"`,
    `cert_mode = "Manual"`,
    `manual_cert_path = ${JSON.stringify(join(certDir, "relay.pem"))}`,
    `manual_key_path = ${JSON.stringify(join(certDir, "relay.key"))}`,
    "",
  ].join("\n"));
  relay = run(join(BIN, "thunderbolt-relay"), ["--config", config]);
  const line = await waitFor(() => relay.out.find((l) => l.startsWith("relay listening on https://")), "the relay")
    .catch((e) => { throw new Error(`${e.message}; stderr:\n${relay.err}`); });
  origin = line.split(" ").pop();
  const { chromium } = await import("playwright-core");
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync", `--ignore-certificate-errors-spki-list=${certs.spki}`],
  });
});

after(async () => {
  await browser?.close();
  endAll();
});

test("the relay's https origin serves the page: it loads, its service worker runs, and the relay is its default", async () => {
  const ctx = await browser.newContext(PHONE);
  const p = await ctx.newPage();
  const errors = [];
  p.on("pageerror", (e) => errors.push(e.message));
  try {
    const started = Date.now();
    const res = await p.goto(`${origin}/app/www/`);
    assert.equal(res.status(), 200);
    await p.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
    const readyMs = Date.now() - started;
    // The service worker: registered from the relay's origin, and active.
    const sw = await p.evaluate(async () => {
      const reg = await navigator.serviceWorker.ready;
      return { scope: reg.scope, active: Boolean(reg.active), url: reg.active && reg.active.scriptURL };
    });
    assert.equal(sw.active, true);
    assert.equal(sw.scope, `${origin}/app/www/`);
    // No relay field filled in by anyone: the page homes on the relay it came from.
    assert.equal(await p.inputValue("#relay"), origin);
    assert.equal(await p.evaluate(() => window.thunderbolt.state.clientRelay), origin);
    assert.deepEqual(errors, []);
    await p.screenshot({ path: join(ARTIFACTS, "relay-served-page.png") });
    console.log(`# page ready ${readyMs} ms after navigation (module and wasm from the relay); service worker ${sw.url}`);
  } finally {
    await ctx.close();
  }
});

test("the app's files have their types, the pairing paths lead to the page, and nothing else is served", async () => {
  const types = {
    "/app/www/": "text/html; charset=utf-8",
    "/app/www/app.js": "text/javascript; charset=utf-8",
    "/app/www/manifest.json": "application/json",
    "/app/www/icon.svg": "image/svg+xml",
    "/app/www/icon-192.png": "image/png",
    "/app/pkg/thunderbolt_client_wasm_bg.wasm": "application/wasm",
    "/app/relay.json": "application/json",
  };
  for (const [path, type] of Object.entries(types)) {
    const r = await raw(path);
    assert.equal(r.status, 200, path);
    assert.equal(r.headers["content-type"], type, path);
  }
  assert.deepEqual(JSON.parse((await raw("/app/relay.json")).body), { thunderbolt_relay: true });
  const head = await raw("/app/www/app.js", "HEAD");
  assert.equal(head.status, 200);
  assert.ok(Number(head.headers["content-length"]) > 1000);
  assert.equal(head.body, "");
  for (const path of ["/app/settings/agents", "/app/settings/mcp-servers?ticket=x", "/app/", "/app/www"]) {
    const r = await raw(path);
    assert.equal(r.status, 302, path);
    assert.equal(r.headers.location, path.includes("?") ? "/app/www/?ticket=x" : "/app/www/", path);
  }
  // A browser keeps the #fragment (the pairing code) across the redirect, onto the page.
  const ctx = await browser.newContext(PHONE);
  const p = await ctx.newPage();
  try {
    await p.goto(`${origin}/app/settings/agents#relay=${encodeURIComponent(origin)}`);
    assert.equal(new URL(p.url()).pathname, "/app/www/");
    await p.waitForFunction(() => window.ready === true, null, { timeout: WAIT_MS });
  } finally {
    await ctx.close();
  }
  for (const path of [
    "/app/../Cargo.toml",
    "/app/%2e%2e/Cargo.toml",
    "/app/%2E%2E/%2E%2E/Cargo.toml",
    "/app/www/../../relay-selfhost/src/main.rs",
    "/app/www/..%2f..%2frelay-selfhost%2fsrc%2fmain.rs",
    "/app/www%2f..%2fserve.mjs",
    "/app/serve.mjs",
    "/app/e2e/harness.mjs",
    "/app/www/.",
    "/app/www/./app.js",
    "//app/www/app.js",
    "/app/www/app.js/..",
  ]) {
    const r = await raw(path);
    assert.ok(r.status === 404 || r.status === 400, `${path}: ${r.status}`);
    assert.doesNotMatch(r.body, /\[package\]|fn main|import /, path);
  }
  // Only GET and HEAD.
  assert.equal((await raw("/app/www/app.js", "POST")).status, 404);
  assert.equal((await raw("/app/www/app.js", "PUT")).status, 404);
});

test("a phone paired through a link to the relay's page (the link `iroh pair` makes by itself) talks to a bridge through that relay", async () => {
  const b = await startAcpBridge(origin, [process.execPath, join(ROOT, "client-wasm/e2e/ask-agent.mjs")]);
  const ctx = await browser.newContext(PHONE);
  const p = await ctx.newPage();
  p.on("pageerror", (e) => console.log("page error:", e.message));
  try {
    // No --app-url: `iroh pair` finds that its relay serves the app, and links there.
    const minted = JSON.parse(tb(b.home, origin, ["iroh", "pair", "--json"]));
    assert.ok(minted.link && minted.link.startsWith(`${origin}/app/settings/agents#`), minted.link);
    await p.goto(minted.link);
    await p.waitForFunction(() => document.querySelector("#status").className === "ok" || window.lastError, null, { timeout: WAIT_MS });
    assert.equal(await p.evaluate(() => window.lastError), undefined, await p.textContent("#status"));
    // The link names the relay too (as the bridge writes it, with a slash).
    assert.equal((await p.evaluate(() => window.thunderbolt.state.clientRelay)).replace(/\/$/, ""), origin);
    await p.getByRole("textbox", { name: "prompt" }).fill("from the relay's page");
    await p.getByRole("button", { name: "Send", exact: true }).click();
    await p.waitForFunction(() => document.querySelector("#reply")?.dataset.stopReason, null, { timeout: WAIT_MS });
    assert.match(await p.textContent("#reply"), /^You said: from the relay's page; pid \d+$/);
  } finally {
    await ctx.close();
    b.child.kill("SIGTERM");
  }
});
