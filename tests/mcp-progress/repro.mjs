// A minimal reproduction of the MCP TypeScript SDK's lost progress
// notification, with no bridge in between: a stdio server that writes its
// last `notifications/progress` and the `tools/call` result in one write
// (as any pipe may deliver them to a reader that was busy). The SDK's client
// handles the response first, which removes the call's progress handler, and
// the progress notification that arrived with it is then dropped.
//
//   cd tests/mcp-progress && npm install && node repro.mjs
//
// Prints how many of the 3 progress notices `onprogress` saw (expected 3).

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

// The server: answers initialize, lists one tool, and answers a call with
// two progress notices in writes of their own, then the third together with
// the result in a single write.
const server = `
const rl = require("readline").createInterface({ input: process.stdin });
const out = (m) => JSON.stringify({ jsonrpc: "2.0", ...m }) + "\\n";
rl.on("line", (line) => {
  const m = JSON.parse(line);
  if (m.method === "initialize") {
    process.stdout.write(out({ id: m.id, result: { protocolVersion: m.params.protocolVersion,
      capabilities: { tools: {} }, serverInfo: { name: "repro", version: "1" } } }));
  } else if (m.method === "tools/list") {
    process.stdout.write(out({ id: m.id, result: { tools: [{ name: "slow", inputSchema: { type: "object" } }] } }));
  } else if (m.method === "tools/call") {
    const token = m.params._meta.progressToken;
    const progress = (i) => out({ method: "notifications/progress", params: { progressToken: token, progress: i, total: 3 } });
    process.stdout.write(progress(1));
    setTimeout(() => {
      process.stdout.write(progress(2));
      setTimeout(() => {
        // One write: the last progress notice and the result.
        process.stdout.write(progress(3) + out({ id: m.id, result: { content: [{ type: "text", text: "done" }] } }));
      }, 50);
    }, 50);
  }
});
`;

const client = new Client({ name: "repro", version: "1" });
await client.connect(new StdioClientTransport({ command: process.execPath, args: ["-e", server] }));
let seen = 0;
await client.callTool({ name: "slow", arguments: {} }, undefined, { onprogress: () => seen++ });
await client.close();
console.log(`onprogress saw ${seen} of 3 progress notifications${seen === 3 ? "" : " (the one that shared a read with the result was dropped)"}`);
process.exit(0);
