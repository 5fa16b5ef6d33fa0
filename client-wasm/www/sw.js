// The demo page's service worker (a module service worker: it imports the wasm
// client statically, as a service worker cannot import() at run time). The
// notices are sw-notices.js's; this adds answering a permission's notice from
// its Allow / Deny action with no page open (docs/browser.md, "Answering from
// the notice without opening a tab"): the worker dials the agent's bridge with
// this browser's own identity (the page's secret key, from IndexedDB) on
// `thunderbolt/<p>/answer1`, sends one line
// `{"session","request","token","result"}` and reads one back,
// `{"answered":true}` or `{"answered":false,"error":…}`.
import init, { IrohClient } from "../pkg/thunderbolt_client_wasm.js";
import { loadForWorker } from "./keystore.js";
import "./sw-notices.js";

/// The whole attempt, from loading the module to the bridge's answer: short
/// enough that opening the page afterwards still counts as the tap's doing
/// (a browser lets a notice's tap open a window for some seconds only).
const ANSWER_MS = 7000;
/// The bridge's answer is one short line.
const MAX_REPLY = 4096;

let loaded = null;

/// The optionId an action picks from a permission notice's `options`
/// (`[{optionId, name, kind}]`, ACP's kinds): Allow the first `allow_*`,
/// Deny the first `reject_*`; `null` when the notice has none such.
function optionFor(notice, action) {
  const prefix = action === "allow" ? "allow" : action === "deny" ? "reject" : null;
  const options = Array.isArray(notice.options) ? notice.options : [];
  const o = prefix && options.find((x) => x && typeof x.kind === "string" && x.kind.startsWith(prefix));
  return o && typeof o.optionId === "string" ? o.optionId : null;
}
self.optionFor = optionFor;

function within(ms, what, promise) {
  let timer;
  const late = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms); });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/// Answers the notice's question with `action` (`allow`, `deny`) from here.
/// `null` when the notice cannot be answered from here (no token, no
/// options to pick from: the page answers it); else `{answered, error?}`.
/// A message's question (an agent's permission prompt, `event: "message"`)
/// is answered on the host's messages door instead (`…/reach1`).
async function answerFromNotice(notice, action) {
  if (notice.event === "message") {
    if (!notice.thread || !notice.message || !notice.node || (action !== "allow" && action !== "deny")) return null;
    const line = { op: "answer", thread: notice.thread, question: notice.message, behavior: action };
    return oneLine(notice, "reach1", line, (reply) => reply && reply.ok === true);
  }
  const optionId = optionFor(notice, action);
  if (!notice.answer || !notice.session || typeof notice.request !== "string" || !notice.node || !optionId) return null;
  const line = {
    session: notice.session, request: notice.request, token: notice.answer,
    result: { outcome: { outcome: "selected", optionId } },
  };
  return oneLine(notice, "answer1", line, (reply) => reply && reply.answered === true);
}

/// Dials the agent the notice names on `thunderbolt/<p>/<door>` with this
/// browser's identity, sends `request` as one line and reads one back:
/// `{answered: true}` when `ok(reply)`, else `{answered: false, error}`.
async function oneLine(notice, door, request, ok) {
  const keys = await loadForWorker().catch(() => undefined);
  if (!keys || !keys.secret) return { answered: false, error: "this browser's identity is not stored for the service worker yet (open the page once)" };
  const agent = (keys.agents || []).find((a) => a.node === notice.node);
  const relay = (agent ? agent.relay : keys.relay) || undefined;
  // The agent's ticket names its relay too; a bare NodeId is dialed through ours.
  const target = (agent && agent.ticket) || notice.node;
  const protocol = /^[a-z0-9-]+$/.test(notice.protocol || "") ? notice.protocol : "acp";
  const line = JSON.stringify(request) + "\n";
  // What is open, to close whichever way the attempt ends (a late client, made
  // after the attempt was given up, is closed by the attempt itself).
  const job = { client: null, conn: null, over: false };
  const end = () => {
    job.over = true;
    if (job.conn) job.conn.close();
    const c = job.client;
    job.client = null;
    // The page's NodeId must not stay on the relay from here: the page's own
    // endpoint would take turns with it.
    return c ? within(1000, "closing the client", c.shutdown()).catch(() => {}) : undefined;
  };
  const attempt = async () => {
    loaded = loaded || init();
    await loaded;
    job.client = await IrohClient.create(keys.secret, relay);
    if (job.over) return end();
    job.conn = await job.client.connect(target, `thunderbolt/${protocol}/${door}`, ANSWER_MS - 1000);
    if (job.over) return end();
    await job.conn.send(new TextEncoder().encode(line));
    await job.conn.finish();
    const reader = job.conn.readable().getReader();
    const dec = new TextDecoder();
    let text = "";
    while (!text.includes("\n") && text.length <= MAX_REPLY) {
      const { value, done } = await reader.read();
      if (done) break;
      text += dec.decode(value, { stream: true });
    }
    let reply;
    try {
      reply = JSON.parse(text.split("\n")[0]);
    } catch {
      return { answered: false, error: text ? "the bridge's answer is unreadable" : "the bridge closed without an answer" };
    }
    return ok(reply)
      ? { answered: true }
      : { answered: false, error: String((reply && reply.error) || "not answered") };
  };
  try {
    return await within(ANSWER_MS, "answering from the notice", attempt());
  } catch (e) {
    // A refusal (not allowlisted, no such door) or a dial that failed, in the client's words.
    return { answered: false, error: String((e && (e.reason || e.message)) || e) };
  } finally {
    await end();
  }
}
self.answerFromNotice = answerFromNotice;
