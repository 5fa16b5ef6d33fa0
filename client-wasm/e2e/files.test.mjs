// Files on the phone page: a photo attached from the page reaches a real ACP
// agent (the SDK's, restart-agent.mjs) as a resource_link it reads, and the
// files the agent names are opened in place. Headless Chromium at 390 × 844
// driving client-wasm/www/ by role and name, against a real `thunderbolt`
// bridge through a real local relay.
//
//   (cd client-wasm/e2e && node --test --test-concurrency=1 files.test.mjs)
//
// Needs: client-wasm/pkg (client-wasm/build.sh), the workspace binaries
// (cargo build --workspace --bins), Debian chromium, `npm ci` here.
// Screenshots go to client-wasm/e2e/artifacts/ (gitignored).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, writeFileSync, readdirSync, statSync } from "node:fs";
import { createHash, randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { ROOT, WAIT_MS, startAcpBridge, pageRig, phoneOn, waitFor } from "./harness.mjs";

const ARTIFACTS = join(ROOT, "client-wasm/e2e/artifacts");
const AGENT = join(ROOT, "client-wasm/e2e/restart-agent.mjs");
// A 2×2 PNG (red, green, blue, white): small, but an image a browser decodes.
const PNG = Buffer.from(
  "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVQI12P4z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg==",
  "base64",
);

const rig = pageRig({ before, after });
mkdirSync(ARTIFACTS, { recursive: true });

const shot = (p, name) => p.screenshot({ path: join(ARTIFACTS, name) });

/// A bridge running restart-agent.mjs (with `agentArgs`) in `work`, and a
/// phone page paired with it by its link, connected.
async function pairedPhone(agentArgs, work) {
  const store = mkdtempSync(join(tmpdir(), "tb-e2e-store-"));
  const { relay } = rig;
  const b = await startAcpBridge(relay.url, [process.execPath, AGENT, "--store", store, ...agentArgs], [], { cwd: work });
  const { ctx, p } = await phoneOn(rig, b.home);
  return { b, ctx, p };
}

test("a photo attached on the phone reaches the agent as a resource_link it reads; the agent's report and chart open in place", async () => {
  const work = mkdtempSync(join(tmpdir(), "tb-e2e-work-"));
  writeFileSync(join(work, "report.md"), "# Report\n\nAll 12 tests pass.\n");
  writeFileSync(join(work, "chart.png"), PNG);
  const { b, ctx, p } = await pairedPhone([], work);

  // A photo from the camera roll (600 KiB: several chunk groups and a progress bar).
  const photo = randomBytes(600 * 1024);
  const [chooser] = await Promise.all([
    p.waitForEvent("filechooser"),
    p.getByRole("button", { name: "Attach a photo or file" }).click(),
  ]);
  await chooser.setFiles({ name: "photo.jpg", mimeType: "image/jpeg", buffer: photo });
  const attachments = p.getByRole("list", { name: "attachments" });
  await attachments.getByText("photo.jpg · 614 kB ✓").waitFor({ timeout: WAIT_MS });
  await p.getByRole("textbox", { name: "prompt" }).fill("what is in this photo?");
  await shot(p, "files-attached.png");
  await p.getByRole("button", { name: "Send", exact: true }).click();
  await p.waitForFunction(() => document.querySelector("#reply")?.dataset.stopReason, null, { timeout: WAIT_MS });
  const sha = createHash("sha256").update(photo).digest("hex");
  assert.match(await p.textContent("#reply"), new RegExp(`read photo\\.jpg: ${photo.length} bytes, sha256 ${sha}`));
  // The prompt in the transcript says what went with it; the box is empty again.
  await p.getByRole("list", { name: "attached" }).getByText("photo.jpg · 614 kB").waitFor();
  assert.equal(await attachments.isVisible(), false);
  // It landed on the workstation, in this device's files folder.
  const landed = readdirSync(join(b.home, "files/_bridge"), { recursive: true }).map(String);
  assert.ok(landed.some((f) => f.endsWith("photo.jpg")), landed.join(", "));

  // The agent names a file it wrote: opened in place.
  await p.getByRole("textbox", { name: "prompt" }).fill("show report.md text/markdown");
  await p.getByRole("button", { name: "Send", exact: true }).click();
  await p.getByRole("button", { name: "Open report.md" }).click();
  await p.getByText("All 12 tests pass.").waitFor({ timeout: WAIT_MS });
  await p.getByRole("textbox", { name: "prompt" }).fill("show chart.png image/png");
  await p.getByRole("button", { name: "Send", exact: true }).click();
  await p.getByRole("button", { name: "Open chart.png" }).click();
  const img = p.getByRole("img", { name: "chart.png" });
  await img.waitFor({ timeout: WAIT_MS });
  await p.waitForFunction(() => document.querySelector("img[alt='chart.png']")?.naturalWidth === 2, null, { timeout: WAIT_MS });
  await shot(p, "files-opened.png");

  // A file outside the agent's workspace is not reached, and the page says why.
  await p.getByRole("textbox", { name: "prompt" }).fill("show ../../etc/passwd text/plain");
  await p.getByRole("button", { name: "Send", exact: true }).click();
  await p.getByRole("button", { name: "Open ../../etc/passwd" }).click();
  await p.getByText("../../etc/passwd could not be opened: outside the agent's workspace").waitFor({ timeout: WAIT_MS });
  await ctx.close();
});

test("a small image goes inline to an agent that takes images; a file picked before a reload arrives after it, only its missing part sent again; the session's files go with it", async () => {
  const { b, ctx, p } = await pairedPhone(["--images"], mkdtempSync(join(tmpdir(), "tb-e2e-work-")));
  const pick = async (file) => {
    const [chooser] = await Promise.all([p.waitForEvent("filechooser"), p.getByRole("button", { name: "Attach a photo or file" }).click()]);
    await chooser.setFiles(file);
  };
  const attachments = p.getByRole("list", { name: "attachments" });

  // The agent advertised promptCapabilities.image: a small picture goes in the prompt itself.
  await pick({ name: "dot.png", mimeType: "image/png", buffer: PNG });
  await attachments.getByText(`dot.png · ${PNG.length} B ✓`).waitFor({ timeout: WAIT_MS });
  await p.getByRole("textbox", { name: "prompt" }).fill("what is this?");
  await p.getByRole("button", { name: "Send", exact: true }).click();
  await p.waitForFunction(() => document.querySelector("#reply")?.dataset.stopReason, null, { timeout: WAIT_MS });
  const png = createHash("sha256").update(PNG).digest("hex");
  assert.match(await p.textContent("#reply"), new RegExp(`image image/png inline: ${PNG.length} bytes, sha256 ${png} \\(file://[^)]*dot\\.png\\)`));

  // A 32 MiB file; the page is reloaded once the bridge holds a part of it
  // (the page moves tens of MB/s at most: the rest is still on its way).
  const big = randomBytes(32 * 1024 * 1024);
  await pick({ name: "big.bin", mimeType: "application/octet-stream", buffer: big });
  const held = () => {
    try {
      return readdirSync(join(b.home, "files"), { recursive: true }).map(String).filter((f) => f.includes(".partial/"))
        .some((f) => statSync(join(b.home, "files", f)).size >= 1024 * 1024);
    } catch {
      return false; // not there yet, or settled between the listing and the look
    }
  };
  await waitFor(held, "a part of big.bin on the workstation");
  await p.reload();
  await p.waitForFunction(() => window.resumedAfterReload === true, null, { timeout: WAIT_MS });
  await attachments.getByText("big.bin · 34 MB ✓").waitFor({ timeout: WAIT_MS });
  const receipt = await p.evaluate(() => window.thunderbolt.state.attachments[0].receipt);
  assert.ok(receipt.resumedFrom >= 1024 * 1024, `resumed at ${receipt.resumedFrom}`);
  assert.ok(receipt.sent < big.length - receipt.resumedFrom + 512 * 1024, `sent ${receipt.sent} of ${big.length}`);
  await shot(p, "files-after-reload.png");
  await p.getByRole("textbox", { name: "prompt" }).fill("and this?");
  await p.getByRole("button", { name: "Send", exact: true }).click();
  await p.waitForFunction(() => /and this\?/.test(document.querySelector("#reply")?.textContent || "") && document.querySelector("#reply")?.dataset.stopReason, null, { timeout: WAIT_MS });
  const sha = createHash("sha256").update(big).digest("hex");
  assert.match(await p.textContent("#reply"), new RegExp(`read big\\.bin: ${big.length} bytes, sha256 ${sha}`));
  // Nothing kept in the browser once it arrived.
  assert.deepEqual(await p.evaluate(async () => (await import("./keystore.js")).keptUploads()), []);
  // They landed in the session's own folder, which goes with the session.
  const sessionId = await p.evaluate(() => window.thunderbolt.state.sessionId);
  const folder = join(b.home, "files/_bridge", readdirSync(join(b.home, "files/_bridge")).find((d) => d !== ".partial") || "", sessionId);
  assert.deepEqual(readdirSync(folder).sort(), ["big.bin", "dot.png"]);
  await p.getByRole("button", { name: "End session" }).click();
  await waitFor(() => !existsSync(folder), "the session's files to go with it");
  await ctx.close();
});

test("a file the page fetches survives the host restarting mid-way: asked again from the last group checked, every byte checked", async () => {
  const work = mkdtempSync(join(tmpdir(), "tb-e2e-work-"));
  const big = randomBytes(64 * 1024 * 1024);
  const path = join(work, "build.tar");
  writeFileSync(path, big);
  const { b, ctx, p } = await pairedPhone([], work);
  const agent = b.child.spawnargs.slice(b.child.spawnargs.indexOf("--") + 1);
  // The get starts; the page keeps what it says.
  await p.evaluate((uri) => {
    window.got = null;
    window.gotBytes = 0;
    const s = window.thunderbolt.state;
    s.client.getFile(s.ticket, uri, { onProgress: (done) => { window.gotBytes = done; } }).then(async (f) => {
      const sha = Array.from(new Uint8Array(await crypto.subtle.digest("SHA-256", f.bytes)), (x) => x.toString(16).padStart(2, "0")).join("");
      window.got = { size: f.size, sha, resumedFrom: f.resumedFrom };
    }, (e) => { window.got = { error: e.message }; });
  }, pathToFileURL(path).href);
  await p.waitForFunction(() => window.gotBytes >= 4 * 1024 * 1024 || window.got, null, { timeout: WAIT_MS });
  assert.equal(await p.evaluate(() => window.got), null, "the get was still under way when the host stopped");
  // The host restarts, on the same identity and workspace.
  b.child.kill("SIGTERM");
  await new Promise((res) => b.child.once("exit", res));
  const again = await startAcpBridge(rig.relay.url, agent, [], { home: b.home, cwd: work });
  await p.waitForFunction(() => window.got, null, { timeout: 2 * WAIT_MS });
  const got = await p.evaluate(() => window.got);
  assert.equal(got.error, undefined, `${got.error}\nbridge:\n${again.err.slice(-2000)}`);
  assert.equal(got.size, big.length);
  assert.equal(got.sha, createHash("sha256").update(big).digest("hex"), "every byte as on the workstation");
  assert.ok(got.resumedFrom >= 1024 * 1024, `asked again from ${got.resumedFrom}, not from the start`);
  console.log(`the get was asked again from byte ${got.resumedFrom} of ${big.length}`);
  await ctx.close();
});
