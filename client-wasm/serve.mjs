#!/usr/bin/env node
// Tiny static server for the demo page: serves client-wasm/ (www/ and pkg/) on
// loopback with the right MIME types (.wasm must be application/wasm).
//   node client-wasm/serve.mjs [port] [--host ADDR]   then open http://127.0.0.1:<port>/www/
// Also, read-only under /reference/app-client/, the Thunderbolt app's shipped
// client (measure.mjs compares against it), from TB_REFERENCE_DIR (default
// <project root>/../shared/reference/thunderbolt-app-client): served from
// where it is, never copied into the project.
import { createServer } from "node:http";
import { readFile, stat } from "node:fs/promises";
import { extname, join, normalize, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = dirname(fileURLToPath(import.meta.url));
const REFERENCE_PREFIX = "/reference/app-client/";
const REFERENCE_DIR = process.env.TB_REFERENCE_DIR || join(ROOT, "../../shared/reference/thunderbolt-app-client");
const TYPES = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".wasm": "application/wasm",
  ".css": "text/css; charset=utf-8",
  ".json": "application/json",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ts": "text/plain; charset=utf-8",
};

export function startServer(port = 0, host = "127.0.0.1") {
  const server = createServer(async (req, res) => {
    try {
      let path = normalize(decodeURIComponent(new URL(req.url, "http://x").pathname));
      // The app's pairing pages (`thunderbolt iroh pair --app-url <this server>`):
      // the demo page stands in. The browser keeps the #fragment across the redirect.
      if (path === "/settings/agents" || path === "/settings/mcp-servers") {
        res.writeHead(302, { location: "/www/" });
        return res.end();
      }
      if (path.includes("..")) throw Object.assign(new Error("bad path"), { code: "ENOENT" });
      let file = path.startsWith(REFERENCE_PREFIX) ? join(REFERENCE_DIR, path.slice(REFERENCE_PREFIX.length)) : join(ROOT, path);
      if ((await stat(file)).isDirectory()) file = join(file, "index.html");
      const body = await readFile(file);
      res.writeHead(200, { "content-type": TYPES[extname(file)] || "application/octet-stream", "cache-control": "no-store" });
      res.end(body);
    } catch {
      res.writeHead(404, { "content-type": "text/plain" });
      res.end("not found\n");
    }
  });
  return new Promise((resolve) => server.listen(port, host, () => resolve(server)));
}

const USAGE = `usage: node client-wasm/serve.mjs [PORT] [--host ADDR]
  PORT         default 8080 (0: any free port)
  --host ADDR  where to listen (default 127.0.0.1); 0.0.0.0 for a phone on your LAN.
               Over plain http on a LAN the page loads and talks to your agents, but a
               browser gives a service worker, notifications, install to the home screen
               and Web Locks to https and localhost only: for a phone, let
               thunderbolt-relay serve the page over https (docs/browser.md,
               "The page from your relay").`;

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  if (args.includes("--help") || args.includes("-h")) {
    console.log(USAGE);
    process.exit(0);
  }
  const at = args.indexOf("--host");
  const host = at >= 0 ? args[at + 1] : "127.0.0.1";
  const rest = args.filter((_, i) => at < 0 || (i !== at && i !== at + 1));
  const port = Number(rest[0] ?? 8080);
  if (!host || !Number.isInteger(port) || port < 0 || port > 65535 || rest.length > 1) {
    console.error(USAGE);
    process.exit(2);
  }
  const server = await startServer(port, host);
  const shown = host === "0.0.0.0" || host === "::" ? "<this machine's address>" : host.includes(":") ? `[${host}]` : host;
  console.log(`serving ${ROOT} at http://${shown}:${server.address().port}/www/`);
  if (!["127.0.0.1", "localhost", "::1"].includes(host)) {
    console.log("plain http off this machine: no service worker, notifications, install or Web Locks there (they need https); see --help");
  }
}
