// A stand-in push service (RFC 8030) and webhook receiver for the bridge's
// notification tests, written against the RFCs with Node's own crypto: it
// shares no code with the bridge.
//
// On start it makes browser-side subscription keys (P-256 ECDH + a 16-byte
// auth secret) for two endpoints and prints one JSON line:
//   {"port": P, "subscriptions": {"ok": <PushSubscription.toJSON()>, "gone": …}}
// Then one JSON line per request it gets:
//   - POST /push/ok: the body decrypted (RFC 8291 aes128gcm) with the "ok"
//     subscription's private key, the VAPID JWT (RFC 8292) verified against
//     the key in its `k=`, and the headers: answered 201;
//   - POST /push/gone: recorded, answered 410 (the subscription has expired);
//   - POST /hook: the body and its content type, answered 200.
// Anything that does not check out is reported with "error" (and answered 400).
import { createServer } from "node:http";
import crypto from "node:crypto";

const b64u = (buf) => Buffer.from(buf).toString("base64url");

function subscriber() {
  const ecdh = crypto.createECDH("prime256v1");
  ecdh.generateKeys();
  return { ecdh, auth: crypto.randomBytes(16) };
}
const subs = { ok: subscriber(), gone: subscriber() };

// RFC 8291 §3.4 and RFC 8188 §2: one aes128gcm record.
function decrypt(sub, body) {
  if (body.length < 21) throw new Error(`body of ${body.length} bytes is too short`);
  const salt = body.subarray(0, 16);
  const rs = body.readUInt32BE(16);
  const idlen = body[20];
  const keyid = body.subarray(21, 21 + idlen);
  const ciphertext = body.subarray(21 + idlen);
  if (idlen !== 65 || keyid[0] !== 4) throw new Error(`keyid is not an uncompressed P-256 point (${idlen} bytes)`);
  if (ciphertext.length > rs) throw new Error(`more than one record (${ciphertext.length} > rs ${rs})`);
  const uaPublic = sub.ecdh.getPublicKey();
  const secret = sub.ecdh.computeSecret(keyid);
  const keyInfo = Buffer.concat([Buffer.from("WebPush: info\0"), uaPublic, keyid]);
  const ikm = Buffer.from(crypto.hkdfSync("sha256", secret, sub.auth, keyInfo, 32));
  const cek = Buffer.from(crypto.hkdfSync("sha256", ikm, salt, Buffer.from("Content-Encoding: aes128gcm\0"), 16));
  const nonce = Buffer.from(crypto.hkdfSync("sha256", ikm, salt, Buffer.from("Content-Encoding: nonce\0"), 12));
  const d = crypto.createDecipheriv("aes-128-gcm", cek, nonce);
  d.setAuthTag(ciphertext.subarray(ciphertext.length - 16));
  const plain = Buffer.concat([d.update(ciphertext.subarray(0, ciphertext.length - 16)), d.final()]);
  let end = plain.length - 1;
  while (end >= 0 && plain[end] === 0) end--;
  if (plain[end] !== 2) throw new Error("the last record does not end with the 0x02 delimiter");
  return JSON.parse(plain.subarray(0, end).toString("utf8"));
}

// RFC 8292 §2-3: "vapid t=<JWT>, k=<public key>", ES256 over P-256.
function vapid(header, origin) {
  const m = /^vapid t=([^,\s]+),\s*k=([A-Za-z0-9_-]+)$/.exec(header || "");
  if (!m) throw new Error(`Authorization is not "vapid t=…, k=…": ${header}`);
  const [, jwt, k] = m;
  const raw = Buffer.from(k, "base64url");
  if (raw.length !== 65 || raw[0] !== 4) throw new Error("k is not an uncompressed P-256 point");
  const key = crypto.createPublicKey({
    key: { kty: "EC", crv: "P-256", x: b64u(raw.subarray(1, 33)), y: b64u(raw.subarray(33)) },
    format: "jwk",
  });
  const [h, p, s] = jwt.split(".");
  const head = JSON.parse(Buffer.from(h, "base64url"));
  if (head.alg !== "ES256" || head.typ !== "JWT") throw new Error(`JWT header ${JSON.stringify(head)}`);
  const ok = crypto.verify("sha256", Buffer.from(`${h}.${p}`), { key, dsaEncoding: "ieee-p1363" }, Buffer.from(s, "base64url"));
  if (!ok) throw new Error("the VAPID signature does not verify");
  const claims = JSON.parse(Buffer.from(p, "base64url"));
  const now = Math.floor(Date.now() / 1000);
  if (claims.aud !== origin) throw new Error(`aud ${claims.aud} is not ${origin}`);
  if (!(claims.exp > now && claims.exp <= now + 24 * 3600)) throw new Error(`exp ${claims.exp} is not within 24 h of ${now}`);
  if (!/^(mailto:|https:)/.test(claims.sub || "")) throw new Error(`sub ${claims.sub} is not a contact`);
  return { k, aud: claims.aud, exp: claims.exp, sub: claims.sub, expiresIn: claims.exp - now };
}

const server = createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const body = Buffer.concat(chunks);
    const rec = { path: req.url, method: req.method };
    let status = 200;
    try {
      if (req.url === "/hook") {
        rec.kind = "hook";
        rec.contentType = req.headers["content-type"];
        rec.title = req.headers["title"];
        rec.body = body.toString("utf8");
      } else if (req.url === "/push/ok" || req.url === "/push/gone") {
        rec.kind = "push";
        rec.ttl = Number(req.headers["ttl"]);
        rec.urgency = req.headers["urgency"];
        rec.topic = req.headers["topic"];
        rec.encoding = req.headers["content-encoding"];
        if (rec.encoding !== "aes128gcm") throw new Error(`Content-Encoding ${rec.encoding}`);
        if (!(Number.isInteger(rec.ttl) && rec.ttl >= 0)) throw new Error(`TTL ${req.headers["ttl"]}`);
        if (!["very-low", "low", "normal", "high"].includes(rec.urgency)) throw new Error(`Urgency ${rec.urgency}`);
        rec.vapid = vapid(req.headers["authorization"], `http://127.0.0.1:${server.address().port}`);
        rec.bodyBytes = body.length;
        if (req.url === "/push/gone") {
          status = 410;
        } else {
          rec.notice = decrypt(subs.ok, body);
          status = 201;
        }
      } else {
        status = 404;
      }
    } catch (e) {
      rec.error = String(e && e.message ? e.message : e);
      status = 400;
    }
    rec.status = status;
    process.stdout.write(JSON.stringify(rec) + "\n");
    res.writeHead(status);
    res.end();
  });
});

server.listen(0, "127.0.0.1", () => {
  const port = server.address().port;
  const json = (name) => ({
    endpoint: `http://127.0.0.1:${port}/push/${name}`,
    expirationTime: null,
    keys: { p256dh: b64u(subs[name].ecdh.getPublicKey()), auth: b64u(subs[name].auth) },
  });
  process.stdout.write(JSON.stringify({ port, subscriptions: { ok: json("ok"), gone: json("gone") } }) + "\n");
});
// The test ends us by closing our stdin.
process.stdin.on("end", () => process.exit(0));
process.stdin.resume();
