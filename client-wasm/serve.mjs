#!/usr/bin/env node
// Tiny static server for the demo page: serves client-wasm/ (www/ and pkg/) on
// loopback with the right MIME types (.wasm must be application/wasm).
//   node client-wasm/serve.mjs [port]      then open http://127.0.0.1:<port>/www/
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

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const server = await startServer(Number(process.argv[2] || 8080));
  const { port } = server.address();
  console.log(`serving ${ROOT} at http://127.0.0.1:${port}/www/`);
}
