// The bulk transfers of bulk.mjs with the client in a Web Worker (a module
// worker: the same ES module, WebSocket and timers are there too). Posted one
// message {secret, relay, ticket, total, reps, mode, resume}; answers {mbs}
// or {error}.
import init, { IrohClient } from "../pkg/thunderbolt_client_wasm.js";
import { bulk, upload, download, rtt, putfile, getfile } from "./bulk.mjs";

self.onmessage = async (e) => {
  const { secret, relay, ticket, total, reps, mode, resume } = e.data;
  try {
    await init();
    const client = await IrohClient.create(secret, relay);
    const run = { bulk, upload, download, rtt, putfile, getfile }[mode || "bulk"];
    const mbs = [];
    for (let i = 0; i < reps; i++) mbs.push(await run(client, ticket, total, resume));
    self.postMessage({ mbs });
  } catch (err) {
    self.postMessage({ error: String((err && err.message) || err) });
  }
};
