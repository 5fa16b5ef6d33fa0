#!/usr/bin/env node
// The browser's own ceiling for measure.mjs: a minimal WebSocket server (RFC
// 6455, no dependency) the same driverless page (bulk.html?client=ws) moves
// the same bytes through as it does through the relay. It runs on the same
// host, on loopback, plain ws:// like the dev relay; it cannot stand in for
// the relay's address (the relay only speaks its own protocol).
//
// What a connection does is its path:
//   /echo                    every message back, as it came (bulk, rtt)
//   /upload?expect=N         counts payload bytes; once N have come, one
//                            text message `{"got":N}\n` (as test-agent count)
//   /download?bytes=N&chunk=S  on the client's first message, N bytes in
//                            binary messages of S bytes (the last shorter)
// Client frames must be masked (any key); payload lengths of 7, 16 and 64
// bits; ping answered, close echoed; fragmented messages are put together.
//
//   node ws-ceiling.mjs [port]          serve on 127.0.0.1, print
//                                       `ws ceiling listening on <port>`
//   node ws-ceiling.mjs --check URL MiB  a Node client (unmasked content,
//                                       zero mask key, so the server still
//                                       unmasks every byte) through each mode;
//                                       prints JSON {echo, upload, download} MB/s
import { createServer } from "node:http";
import { createHash } from "node:crypto";
import { connect } from "node:net";
import { fileURLToPath } from "node:url";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
export const accept = (key) => createHash("sha1").update(key + GUID).digest("base64");

/// A server frame header (unmasked) for a payload of `len` bytes.
function header(opcode, len) {
  if (len < 126) return Buffer.from([0x80 | opcode, len]);
  if (len < 65536) { const h = Buffer.alloc(4); h[0] = 0x80 | opcode; h[1] = 126; h.writeUInt16BE(len, 2); return h; }
  const h = Buffer.alloc(10); h[0] = 0x80 | opcode; h[1] = 127; h.writeBigUInt64BE(BigInt(len), 2); return h;
}

/// XOR `mask` (4 bytes) over `data` (a fresh Uint8Array at offset 0), a word at a time.
function unmask(data, mask) {
  const m = mask[0] | (mask[1] << 8) | (mask[2] << 16) | (mask[3] << 24);
  if (m === 0) return;
  const words = data.length >>> 2;
  const w = new Int32Array(data.buffer, data.byteOffset, words);
  for (let i = 0; i < words; i++) w[i] ^= m;
  for (let i = words << 2; i < data.length; i++) data[i] ^= mask[i & 3];
}

/// Parses frames out of a byte stream: `onFrame(opcode, fin, payload)`;
/// `want(len)` says whether a payload is needed (else only its length is
/// counted: the upload mode never reads the bytes it counts).
function frameReader(onFrame, needPayload = () => true, masked = true) {
  let chunks = [];
  let have = 0;
  // Bytes of `chunks` from the front, into one buffer (copies only what spans chunks).
  const take = (n, copy) => {
    let out = copy ? new Uint8Array(n) : null;
    let off = 0;
    while (off < n) {
      const c = chunks[0];
      const k = Math.min(c.length, n - off);
      if (out) out.set(k === c.length ? c : c.subarray(0, k), off);
      off += k;
      if (k === c.length) chunks.shift(); else chunks[0] = c.subarray(k);
    }
    have -= n;
    return out;
  };
  const peek = (n) => (chunks[0].length >= n ? chunks[0].subarray(0, n) : Buffer.concat(chunks, Math.max(n, 0)).subarray(0, n));
  let frame = null; // {opcode, fin, len, mask}
  return (data) => {
    chunks.push(data);
    have += data.length;
    for (;;) {
      if (!frame) {
        if (have < 2) return;
        const b = peek(Math.min(have, 14));
        const fin = (b[0] & 0x80) !== 0;
        const opcode = b[0] & 0x0f;
        const isMasked = (b[1] & 0x80) !== 0;
        let len = b[1] & 0x7f;
        let hl = 2;
        if (len === 126) { if (b.length < 4) return; len = (b[2] << 8) | b[3]; hl = 4; }
        else if (len === 127) { if (b.length < 10) return; len = Number(Buffer.from(b.subarray(2, 10)).readBigUInt64BE(0)); hl = 10; }
        if (masked && !isMasked) throw new Error("unmasked client frame");
        const ml = isMasked ? 4 : 0;
        if (b.length < hl + ml) return;
        const mask = isMasked ? Uint8Array.from(b.subarray(hl, hl + 4)) : null;
        take(hl + ml, false);
        frame = { opcode, fin, len, mask };
      }
      if (have < frame.len) return;
      const want = frame.opcode >= 8 || needPayload(frame.opcode);
      const payload = take(frame.len, want);
      if (payload && frame.mask) unmask(payload, frame.mask);
      const f = frame;
      frame = null;
      onFrame(f.opcode, f.fin, payload, f.len);
    }
  };
}

export function startWsCeiling(port = 0, host = "127.0.0.1") {
  const server = createServer((req, res) => { res.writeHead(426, { "content-type": "text/plain" }); res.end("websocket only\n"); });
  server.on("upgrade", (req, socket) => {
    const key = req.headers["sec-websocket-key"];
    if (!key || String(req.headers.upgrade).toLowerCase() !== "websocket") { socket.end("HTTP/1.1 400 Bad Request\r\n\r\n"); return; }
    socket.setNoDelay(true);
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept(key)}\r\n\r\n`);
    const url = new URL(req.url, "http://x");
    const mode = url.pathname.slice(1);
    const send = (opcode, payload) => {
      socket.cork();
      socket.write(header(opcode, payload.length));
      const ok = socket.write(payload);
      socket.uncork();
      return ok;
    };
    let counted = 0;
    const expect = Number(url.searchParams.get("expect") || 0);
    let streaming = false;
    const stream = () => {
      const total = Number(url.searchParams.get("bytes"));
      const size = Number(url.searchParams.get("chunk") || 16384);
      const payload = Buffer.alloc(size, 97); payload[size - 1] = 10;
      // One framed message, written again and again.
      const whole = Buffer.concat([header(2, size), payload]);
      let sent = 0;
      const pump = () => {
        while (sent < total) {
          const n = Math.min(size, total - sent);
          const ok = n === size ? socket.write(whole) : send(2, payload.subarray(0, n));
          sent += n;
          if (!ok) return socket.once("drain", pump);
        }
      };
      pump();
    };
    // A fragmented message's opcode and parts.
    let parts = null;
    const read = frameReader((opcode, fin, payload, len) => {
      if (opcode === 8) { send(8, payload.subarray(0, Math.min(2, payload.length))); socket.end(); return; }
      if (opcode === 9) { send(10, payload); return; }
      if (opcode === 10) return;
      if (mode === "upload") {
        counted += len;
        if (expect && counted >= expect && counted - len < expect) send(1, Buffer.from(`{"got":${counted}}\n`));
        return;
      }
      if (mode === "download") { if (!streaming) { streaming = true; stream(); } return; }
      // echo (and rtt)
      if (opcode === 0 || !fin) {
        if (opcode !== 0) parts = { opcode, list: [] };
        parts.list.push(payload);
        if (!fin) return;
        payload = Buffer.concat(parts.list);
        opcode = parts.opcode;
        parts = null;
      }
      send(opcode, payload);
    }, () => mode !== "upload");
    socket.on("data", (d) => { try { read(d); } catch { socket.destroy(); } });
    socket.on("error", () => {});
  });
  return new Promise((resolve) => server.listen(port, host, () => resolve(server)));
}

/// A Node client: opens `url`, then `mode(ws)` drives it. ws: {send(u8),
/// onmessage(cb(opcode, payload)), close()}. Client frames are masked with a
/// zero key (valid framing; the server's unmasking still runs over every word).
function nodeClient(url) {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(u.port), u.hostname);
    socket.setNoDelay(true);
    let handshaken = false;
    let pre = Buffer.alloc(0);
    let cb = () => {};
    const read = frameReader((opcode, fin, payload, len) => cb(opcode, payload, len), () => true, false);
    socket.on("connect", () => socket.write(`GET ${u.pathname}${u.search} HTTP/1.1\r\nHost: ${u.host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`));
    socket.on("error", reject);
    const ws = {
      send(payload) {
        const len = payload.length;
        const h = len < 126 ? Buffer.from([0x82, 0x80 | len]) : len < 65536 ? Buffer.from([0x82, 0x80 | 126, len >> 8, len & 255]) : Buffer.concat([Buffer.from([0x82, 0x80 | 127]), (() => { const b = Buffer.alloc(8); b.writeBigUInt64BE(BigInt(len)); return b; })()]);
        socket.cork(); socket.write(Buffer.concat([h, Buffer.alloc(4)])); const ok = socket.write(payload); socket.uncork();
        return ok ? Promise.resolve() : new Promise((r) => socket.once("drain", r));
      },
      onmessage(f) { cb = f; },
      close() { socket.destroy(); },
    };
    socket.on("data", (d) => {
      if (handshaken) return read(d);
      pre = Buffer.concat([pre, d]);
      const end = pre.indexOf("\r\n\r\n");
      if (end < 0) return;
      if (!pre.subarray(0, end).toString().includes(accept("dGhlIHNhbXBsZSBub25jZQ=="))) return reject(new Error("bad handshake"));
      handshaken = true;
      resolve(ws);
      if (pre.length > end + 4) read(pre.subarray(end + 4));
    });
  });
}

/// The server's own speed, measured with the Node client: MB/s per mode.
export async function checkCeiling(base, total) {
  const block = Buffer.alloc(1024 * 1024, 97);
  const out = {};
  {
    const ws = await nodeClient(`${base}/echo`);
    let got = 0;
    const t0 = performance.now();
    const done = new Promise((r) => ws.onmessage((op, p, len) => { got += len; if (got >= total) r(); }));
    for (let sent = 0; sent < total; sent += block.length) await ws.send(block.subarray(0, Math.min(block.length, total - sent)));
    await done;
    out.echo = total / ((performance.now() - t0) / 1000) / 1e6;
    ws.close();
  }
  {
    const ws = await nodeClient(`${base}/upload?expect=${total}`);
    const t0 = performance.now();
    const done = new Promise((r) => ws.onmessage(() => r()));
    for (let sent = 0; sent < total; sent += block.length) await ws.send(block.subarray(0, Math.min(block.length, total - sent)));
    await done;
    out.upload = total / ((performance.now() - t0) / 1000) / 1e6;
    ws.close();
  }
  {
    const ws = await nodeClient(`${base}/download?bytes=${total}&chunk=${CHUNK}`);
    let got = 0;
    let t0;
    const done = new Promise((r) => ws.onmessage((op, p, len) => { got += len; if (got >= total) r(); }));
    t0 = performance.now();
    await ws.send(Buffer.from("\n"));
    await done;
    out.download = total / ((performance.now() - t0) / 1000) / 1e6;
    ws.close();
  }
  return out;
}

/// The download mode's message size (see measure.mjs).
export const CHUNK = Number(process.env.TB_WS_CHUNK || 14556);

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  if (process.argv[2] === "--check") {
    console.log(JSON.stringify(await checkCeiling(process.argv[3], Number(process.argv[4] || 32) * 1024 * 1024)));
  } else {
    const server = await startWsCeiling(Number(process.argv[2] || 0));
    console.log(`ws ceiling listening on ${server.address().port}`);
  }
}
