// The bulk transfers the browser rows of measure.mjs run, each through a
// fresh connection, in MB/s: `bulk`, `total` bytes of 16 KiB ndjson lines
// written while a cat agent's echo is read back (first write to last byte);
// `upload`, the same lines to an agent that says `{"got":N}` once it has them
// all (test-agent count); `download`, what an agent streams (test-agent
// stream), from its first byte to the last; `rtt`, `total` round trips of a
// ~200 B request through a cat agent, their p50 in microseconds.
// `client` is anything with this client's connect(ticket, alpn, timeout,
// {resume}) → {send, readable, close}: ours, the app's (which takes the first
// two arguments only), or ws-client.mjs's plain WebSocket.
function block() {
  const line = new Uint8Array(16 * 1024).fill(97); line[0] = 34; line[line.length - 2] = 34; line[line.length - 1] = 10;
  const b = new Uint8Array(line.length * 64);
  for (let k = 0; k < 64; k++) b.set(line, k * line.length);
  return b;
}

export async function upload(client, ticket, total, resume) {
  const conn = await client.connect(ticket, "thunderbolt/acp/0", undefined, { resume });
  const b = block();
  const reader = conn.readable().getReader();
  const t0 = performance.now();
  for (let sent = 0; sent < total; sent += b.length) await conn.send(b.subarray(0, Math.min(b.length, total - sent)));
  const { done } = await reader.read();
  if (done) throw new Error("the count agent ended");
  const mbs = total / ((performance.now() - t0) / 1000) / 1e6;
  conn.close();
  return mbs;
}

export async function download(client, ticket, total, resume) {
  const conn = await client.connect(ticket, "thunderbolt/acp/0", undefined, { resume });
  const reader = conn.readable().getReader();
  // A plain connection's stream reaches the bridge with its first bytes (a
  // blank line, which the bridge skips), as the native client's does.
  await conn.send(new Uint8Array([10]));
  let { value, done } = await reader.read();
  const t0 = performance.now();
  // The clock starts at the first chunk: it is not counted.
  const first = value ? value.length : 0;
  let got = first;
  while (!done && got < total) { ({ value, done } = await reader.read()); if (value) got += value.length; }
  if (got < total) throw new Error(`ended at ${got}`);
  const mbs = (got - first) / ((performance.now() - t0) / 1000) / 1e6;
  conn.close();
  return mbs;
}

export async function bulk(client, ticket, total, resume) {
  const conn = await client.connect(ticket, "thunderbolt/acp/0", undefined, { resume });
  const block_ = block();
  const reader = conn.readable().getReader();
  const t0 = performance.now();
  const writer = (async () => { for (let sent = 0; sent < total; sent += block_.length) await conn.send(block_.subarray(0, Math.min(block_.length, total - sent))); })();
  let got = 0;
  while (got < total) { const { value, done } = await reader.read(); if (done) throw new Error(`ended at ${got}`); got += value.length; }
  await writer;
  const mbs = total / ((performance.now() - t0) / 1000) / 1e6;
  conn.close();
  return mbs;
}

// The bench's small request (tests/src/bin/bench/measure.rs SMALL_REQUEST).
const SMALL = new TextEncoder().encode('{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"sess-1","prompt":[{"type":"text","text":"What does this function do? Please explain briefly, with an example."}]}}\n');

export async function rtt(client, ticket, total, resume) {
  const conn = await client.connect(ticket, "thunderbolt/acp/0", undefined, { resume });
  const reader = conn.readable().getReader();
  const us = [];
  for (let i = 0; i < total; i++) {
    const t0 = performance.now();
    await conn.send(SMALL);
    for (let got = 0; got < SMALL.length;) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`ended after ${i} round trips`);
      got += value.length;
    }
    us.push((performance.now() - t0) * 1000);
  }
  conn.close();
  us.sort((a, b) => a - b);
  return us[Math.floor(us.length / 2)];
}

// Files (`thunderbolt/<p>/files1`, issue 61). `putfile`: `total` fresh random
// bytes put with IrohClient.putFile, timed from the call (the page hashes them
// first, as it does for a user) to the bridge's receipt (every group checked,
// the file synced there); new bytes each run, so nothing resumes. `getfile`:
// one file of `total` bytes put once (not timed), then fetched with getFile,
// timed from the call (the bridge hashes the file first) to the last group
// checked in the page.
function randomBytes(total) {
  const bytes = new Uint8Array(total);
  // getRandomValues fills at most 64 KiB per call.
  for (let o = 0; o < total; o += 65536) crypto.getRandomValues(bytes.subarray(o, Math.min(o + 65536, total)));
  return bytes;
}

export async function putfile(client, ticket, total) {
  const bytes = randomBytes(total);
  const t0 = performance.now();
  const r = await client.putFile(ticket, bytes, "bench.bin", {});
  const mbs = total / ((performance.now() - t0) / 1000) / 1e6;
  // `sent` counts the encoding: every byte, and the tree's parent nodes (64 B per 16 KiB).
  if (r.size !== total || r.sent < total || r.resumedFrom !== 0) throw new Error(`put ${r.size} bytes, sent ${r.sent}, of ${total}, resumed at ${r.resumedFrom}`);
  return mbs;
}

const stored = new Map();
export async function getfile(client, ticket, total) {
  if (!stored.has(total)) stored.set(total, (await client.putFile(ticket, randomBytes(total), "bench-get.bin", {})).uri);
  const t0 = performance.now();
  const f = await client.getFile(ticket, stored.get(total), {});
  const mbs = total / ((performance.now() - t0) / 1000) / 1e6;
  if (f.bytes.length !== total) throw new Error(`got ${f.bytes.length} of ${total} bytes`);
  return mbs;
}
