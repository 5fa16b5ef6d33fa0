// A plain WebSocket in the shape of the wasm clients (bulk.html?client=ws), so
// bulk.mjs's transfers run unchanged against ws-ceiling.mjs: connect(url)
// opens the WebSocket (the "ticket" is its ws:// URL, which names the mode),
// send(bytes) is one binary message, readable() the messages as Uint8Array
// chunks. The browser's ceiling for the same bytes in the same page.
// `split` (bytes, 0 = off) cuts each send into messages of that size, as the
// relay path carries QUIC datagram batches.
// send() resolves at once, as long as the browser holds less than HIGH bytes
// not yet sent (WebSocket has no drain event: past it, it waits a tick at a time).
const HIGH = 4 * 1024 * 1024;

export function wsClient(split = 0) {
  return {
    async connect(url) {
      const ws = new WebSocket(url);
      ws.binaryType = "arraybuffer";
      await new Promise((res, rej) => { ws.onopen = res; ws.onerror = () => rej(new Error(`WebSocket ${url} failed`)); });
      const enc = new TextEncoder();
      const readable = new ReadableStream({
        start(c) {
          ws.onmessage = (e) => c.enqueue(typeof e.data === "string" ? enc.encode(e.data) : new Uint8Array(e.data));
          ws.onclose = () => { try { c.close(); } catch {} };
          ws.onerror = () => { try { c.error(new Error("WebSocket error")); } catch {} };
        },
      });
      return {
        async send(bytes) {
          if (split > 0) for (let o = 0; o < bytes.length; o += split) ws.send(bytes.subarray(o, Math.min(o + split, bytes.length)));
          else ws.send(bytes);
          while (ws.bufferedAmount > HIGH) await new Promise((r) => setTimeout(r, 0));
        },
        readable: () => readable,
        close: () => ws.close(),
      };
    },
  };
}
