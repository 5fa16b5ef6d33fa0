// The bulk echo both browser rows of measure.mjs run: `total` bytes of 16 KiB
// ndjson lines written through a fresh connection while the echo is read
// back; returns MB/s from the first write to the last byte read.
export async function bulk(client, ticket, total, resume) {
  const conn = await client.connect(ticket, "thunderbolt/acp/0", undefined, { resume });
  const line = new Uint8Array(16 * 1024).fill(97); line[0] = 34; line[line.length - 2] = 34; line[line.length - 1] = 10;
  const block = new Uint8Array(line.length * 64);
  for (let k = 0; k < 64; k++) block.set(line, k * line.length);
  const reader = conn.readable().getReader();
  const t0 = performance.now();
  const writer = (async () => { for (let sent = 0; sent < total; sent += block.length) await conn.send(block.subarray(0, Math.min(block.length, total - sent))); })();
  let got = 0;
  while (got < total) { const { value, done } = await reader.read(); if (done) throw new Error(`ended at ${got}`); got += value.length; }
  await writer;
  const mbs = total / ((performance.now() - t0) / 1000) / 1e6;
  conn.close();
  return mbs;
}
