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
import { mkdirSync, mkdtempSync, writeFileSync, readdirSync } from "node:fs";
import { createHash, randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ROOT, WAIT_MS, tb, startAcpBridge, pageRig } from "./harness.mjs";

const ARTIFACTS = join(ROOT, "client-wasm/e2e/artifacts");
const AGENT = join(ROOT, "client-wasm/e2e/restart-agent.mjs");
const PHONE = { viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true, deviceScaleFactor: 1 };
// A 2×2 PNG (red, green, blue, white): small, but an image a browser decodes.
const PNG = Buffer.from(
  "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVQI12P4z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg==",
  "base64",
);

const rig = pageRig({ before, after });
mkdirSync(ARTIFACTS, { recursive: true });

const shot = (p, name) => p.screenshot({ path: join(ARTIFACTS, name) });

test("a photo attached on the phone reaches the agent as a resource_link it reads; the agent's report and chart open in place", async () => {
  const work = mkdtempSync(join(tmpdir(), "tb-e2e-work-"));
  writeFileSync(join(work, "report.md"), "# Report\n\nAll 12 tests pass.\n");
  writeFileSync(join(work, "chart.png"), PNG);
  const store = mkdtempSync(join(tmpdir(), "tb-e2e-store-"));
  const { relay, baseUrl, browser } = rig;
  const b = await startAcpBridge(relay.url, [process.execPath, AGENT, "--store", store], [], { cwd: work });
  const minted = JSON.parse(tb(b.home, relay.url, ["iroh", "pair", "--json", "--app-url", baseUrl]));
  const ctx = await browser.newContext(PHONE);
  const p = await ctx.newPage();
  p.on("pageerror", (e) => console.log("page error:", e.message));
  await p.goto(minted.link);
  await p.waitForFunction(() => document.querySelector("#status").className === "ok" || window.lastError, null, { timeout: WAIT_MS });
  assert.equal(await p.evaluate(() => window.lastError), undefined, await p.textContent("#status"));

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
