// Demo page for the thunderbolt-iroh browser client: pairs with a bridge, runs
// ACP initialize + session/new, streams the agent's reply to a prompt, shows a
// lost connection being redialed, and resumes its session across a reload.
import init, { IrohClient } from "../pkg/thunderbolt_client_wasm.js";

const SECRET_KEY = "thunderbolt_iroh_client_secret";
const RELAY_KEY = "thunderbolt_iroh_relay_url";
const TICKET_KEY = "thunderbolt_iroh_ticket";
// Per tab (survives a reload, not a closed tab): the live session to resume.
const SESSION_KEY = "thunderbolt_iroh_session";
const $ = (id) => document.getElementById(id);

const state = {
  client: null, clientRelay: null, conn: null, sessionId: null, nextId: 1, pending: new Map(),
  agent: "agent", userClosed: false,
};

function setStatus(text, kind = "") {
  const el = $("status");
  el.textContent = text;
  el.className = kind;
}

function log(dir, msg) {
  const line = document.createElement("div");
  line.textContent = `${dir} ${typeof msg === "string" ? msg : JSON.stringify(msg)}`;
  $("log").append(line);
}

// Refusals at the door, as opposed to a session the bridge ended later.
const ADMISSION = ["not allowlisted", "bridge at capacity", "idle: no data stream opened", "handshake timed out"];

/// Describes a client error for people: what happened, and what to do.
function describe(err) {
  if (!err) return "error";
  switch (err.kind) {
    case "closed":
      if (err.reason === "bridge shutting down") return "the bridge shut down: connect again once it runs";
      if (err.reason === "ended by the host") return "the workstation ended this session (thunderbolt kick)";
      if (err.reason === "membership revoked") return "this device is no longer allowed on the bridge (membership revoked)";
      if (err.code === 1 && (ADMISSION.includes(err.reason) || err.reason.startsWith("failed to spawn")))
        return `refused by the bridge: ${err.reason} (code ${err.code})`;
      return `the bridge ended the session: ${err.reason} (code ${err.code})`;
    case "agent": return `the agent ended: ${err.message}`;
    case "session_gone": return `the session is gone (${err.message}): connect to start a new one`;
    case "timeout": return `could not connect: ${err.message}`;
    case "alpn": return `the peer is not an ACP bridge: ${err.message}`;
    default: return `${err.kind || "error"}: ${err.message || err}`;
  }
}

function lastError(err) {
  window.lastError = { kind: err.kind, code: err.code, reason: err.reason, message: err.message };
}

/// The client for the relay in the field (made again when the field changed).
async function ensureClient() {
  const relay = $("relay").value.trim();
  if (state.client && state.clientRelay === relay) return state.client;
  if (state.client) await state.client.shutdown();
  const client = await IrohClient.create(localStorage.getItem(SECRET_KEY) || undefined, relay || undefined);
  localStorage.setItem(SECRET_KEY, client.secretKeyHex());
  localStorage.setItem(RELAY_KEY, relay);
  Object.assign(state, { client, clientRelay: relay });
  $("node-id").textContent = client.nodeId();
  $("allow-cmd").textContent = `thunderbolt iroh allow ${client.nodeId()}`;
  return client;
}

/// What a reload needs to take the session back: the client's own state
/// (after every message the page has handled), and the page's.
function save() {
  const s = state.conn && state.conn.sessionState();
  if (!s) return;
  sessionStorage.setItem(SESSION_KEY, JSON.stringify({
    state: s, sessionId: state.sessionId, nextId: state.nextId, agent: state.agent,
    reply: $("reply").textContent, ticket: $("ticket").value.trim(),
  }));
}

function forget() {
  sessionStorage.removeItem(SESSION_KEY);
}

function request(method, params) {
  const id = state.nextId++;
  const msg = { jsonrpc: "2.0", id, method, params };
  log("→", msg);
  return new Promise((resolve, reject) => {
    state.pending.set(id, { resolve, reject });
    state.conn.send(msg).then(save, reject);
  });
}

function onMessage(value) {
  log("←", value);
  if (value.method === "session/update") {
    const u = value.params && value.params.update;
    if (u && u.sessionUpdate === "agent_message_chunk" && u.content && u.content.type === "text") {
      $("reply").textContent += u.content.text;
    }
  } else if (value.id !== undefined && state.pending.has(value.id)) {
    const p = state.pending.get(value.id);
    state.pending.delete(value.id);
    value.error ? p.reject(Object.assign(new Error(value.error.message), { rpc: value.error })) : p.resolve(value.result);
  } else if (value.result && value.result.stopReason) {
    // The answer to a prompt sent before a reload.
    $("reply").dataset.stopReason = value.result.stopReason;
    $("send").disabled = false;
  }
}

async function pump(conn) {
  const reader = conn.messages().getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      onMessage(value);
      save();
    }
    setStatus(state.userClosed ? "disconnected: you closed the session" : "the agent finished and ended the session", "");
  } catch (err) {
    for (const p of state.pending.values()) p.reject(err);
    state.pending.clear();
    if (state.userClosed) {
      setStatus("disconnected: you closed the session", "");
    } else {
      setStatus(describe(err), "error");
      lastError(err);
    }
  } finally {
    if (state.conn === conn) state.conn = null;
    forget();
    $("send").disabled = true;
    $("disconnect").disabled = true;
    $("notify").disabled = true;
    $("notify-off").disabled = true;
    $("connect").disabled = false;
  }
}

/// Connects (or, with `saved`, takes back the session a reload left).
async function connect(saved = null) {
  const ticket = $("ticket").value.trim();
  if (!ticket) return setStatus("paste the bridge's ticket first", "error");
  $("connect").disabled = true;
  setStatus(saved ? "resuming the session…" : "connecting…");
  try {
    await ensureClient();
    localStorage.setItem(TICKET_KEY, ticket);
    const onEvent = (e) => {
      window.events = [...(window.events || []), e.type];
      if (e.type === "reconnecting") setStatus("reconnecting… (connection lost; the bridge keeps the session)", "warn");
      if (e.type === "resumed") setStatus(`resumed · ${state.agent} · session ${state.sessionId}`, "ok");
    };
    state.userClosed = false;
    const idle = Number(param("idle")) || undefined; // ?idle=MS: notice a lost path sooner
    const conn = await state.client.connectProtocol(ticket, "acp", undefined, undefined, { onEvent, session: saved && saved.state, idleTimeoutMs: idle });
    state.conn = conn;
    pump(conn);
    if (saved) {
      Object.assign(state, { sessionId: saved.sessionId, nextId: saved.nextId, agent: saved.agent });
      $("reply").textContent = saved.reply || "";
      setStatus(`resumed after the reload · ${state.agent} · session ${state.sessionId}`, "ok");
      window.resumedAfterReload = true;
    } else {
      const init = await request("initialize", { protocolVersion: 1, clientCapabilities: {} });
      const session = await request("session/new", { cwd: "/", mcpServers: [] });
      state.agent = init.agentInfo ? init.agentInfo.name : "agent";
      state.sessionId = session.sessionId;
      setStatus(`connected · ${state.agent} · session ${state.sessionId}`, "ok");
    }
    save();
    $("send").disabled = false;
    $("disconnect").disabled = false;
    $("notify").disabled = false;
    $("notify-off").disabled = false;
    // Already allowed: keep this browser's subscription registered with this bridge.
    if (typeof Notification !== "undefined" && Notification.permission === "granted") subscribe(false);
    else setNotify("not on: “notify me” asks the browser, then registers this browser with the bridge");
  } catch (err) {
    if (err.kind === "session_gone") forget();
    setStatus(describe(err), "error");
    lastError(err);
    $("connect").disabled = false;
  }
}

async function send() {
  const text = $("prompt").value;
  $("reply").textContent = "";
  delete $("reply").dataset.stopReason;
  $("send").disabled = true;
  try {
    const res = await request("session/prompt", { sessionId: state.sessionId, prompt: [{ type: "text", text }] });
    $("reply").dataset.stopReason = res.stopReason;
  } catch (err) {
    if (!state.userClosed) setStatus(describe(err), "error");
  } finally {
    $("send").disabled = !state.conn;
  }
}

function disconnect() {
  state.userClosed = true;
  forget();
  if (state.conn) state.conn.close();
  setStatus("disconnected: you closed the session");
}

/// Pairs with the one-time code of a pairing link, then connects as usual.
async function pairAndConnect(ticket, code) {
  const name = $("device-name").value.trim() || defaultDeviceName();
  setStatus("pairing…");
  try {
    await ensureClient();
    const res = await state.client.pair(ticket, code, name, "acp");
    $("paired-as").textContent = `paired as “${res.name || name}”`;
    window.paired = res;
  } catch (err) {
    setStatus(`pairing failed: ${describe(err)}`, "error");
    lastError(err);
    return;
  }
  await connect();
}

function setNotify(text, kind = "") {
  const el = $("notify-status");
  el.textContent = text;
  el.className = kind;
  window.notifyStatus = text;
}

/// Asks the bridge for its Web Push key, the browser for a subscription with
/// it, and registers the subscription with the bridge over this session's
/// own stream (`_thunderbolt/push/subscribe`). `ask`: may prompt for permission.
async function subscribe(ask = true) {
  let key;
  try {
    key = await request("_thunderbolt/push/key", {});
  } catch (err) {
    const off = err.rpc && err.rpc.code === -32601;
    return setNotify(off ? "this bridge sends no Web Push (started with --no-push, or too old)" : `the bridge did not answer: ${describe(err)}`, "warn");
  }
  window.pushKey = key.applicationServerKey;
  if (!("serviceWorker" in navigator) || typeof PushManager === "undefined" || typeof Notification === "undefined")
    return setNotify("this browser has no Web Push (on iOS: add the page to the home screen first)", "warn");
  try {
    const permission = ask ? await Notification.requestPermission() : Notification.permission;
    if (permission !== "granted") return setNotify(`notifications are ${permission} for this page: allow them in the browser's site settings`, "warn");
    const reg = await navigator.serviceWorker.register("./sw.js");
    await navigator.serviceWorker.ready;
    const sub = (await reg.pushManager.getSubscription())
      || (await reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: b64urlBytes(key.applicationServerKey) }));
    await request("_thunderbolt/push/subscribe", sub.toJSON());
    setNotify("on: this browser is told when the agent needs you or finishes while no device is attached", "ok");
  } catch (err) {
    // Headless and offline browsers reach no push service; say so instead of failing quietly.
    setNotify(`not on: ${err.rpc ? err.message : `the browser could not subscribe (${err.name || "error"}: ${err.message})`}`, "warn");
  }
}

async function unsubscribe() {
  try {
    const reg = "serviceWorker" in navigator ? await navigator.serviceWorker.getRegistration("./sw.js") : null;
    const sub = reg && (await reg.pushManager.getSubscription());
    if (!sub) return setNotify("not on in this browser");
    await request("_thunderbolt/push/unsubscribe", { endpoint: sub.endpoint });
    await sub.unsubscribe();
    setNotify("off: the bridge forgot this browser's subscription");
  } catch (err) {
    setNotify(`could not turn it off: ${err.message}`, "warn");
  }
}

function b64urlBytes(text) {
  const b = atob(text.replace(/-/g, "+").replace(/_/g, "/"));
  return Uint8Array.from(b, (c) => c.charCodeAt(0));
}

/// A notice the service worker got: listed on the page.
function showNotice(n) {
  const li = document.createElement("li");
  li.textContent = `${n.at ? n.at.slice(11, 19) : ""} ${n.title || ""}: ${n.body || ""}`;
  $("notices").prepend(li);
  window.notices = [...(window.notices || []), n];
}

function defaultDeviceName() {
  const ua = navigator.userAgent;
  const browser = /Firefox\//.test(ua) ? "Firefox" : /Edg\//.test(ua) ? "Edge" : /Chrom/.test(ua) ? "Chrome" : /Safari\//.test(ua) ? "Safari" : "Browser";
  const os = /Android/.test(ua) ? "Android" : /iPhone|iPad/.test(ua) ? "iOS" : /Mac/.test(ua) ? "macOS" : /Windows/.test(ua) ? "Windows" : /Linux/.test(ua) ? "Linux" : "";
  return os ? `${browser} on ${os}` : browser;
}

$("connect").onclick = () => connect();
$("send").onclick = send;
$("disconnect").onclick = disconnect;
$("notify").onclick = () => subscribe(true);
$("notify-off").onclick = unsubscribe;
if ("serviceWorker" in navigator) {
  navigator.serviceWorker.addEventListener("message", (e) => e.data && e.data.type === "thunderbolt-notice" && showNotice(e.data.notice));
}
$("copy-allow").onclick = () => navigator.clipboard.writeText($("allow-cmd").textContent);
$("new-identity").onclick = async () => {
  localStorage.removeItem(SECRET_KEY);
  if (state.client) await state.client.shutdown();
  state.client = null;
  await ensureClient();
};

await init();
// A pairing link carries `ticket`, `pair` (and, for a self-hosted relay, `relay`)
// in its #fragment, which no server sees; `?ticket=&relay=` work too.
const params = new URLSearchParams(location.search);
const frag = new URLSearchParams(location.hash.slice(1));
const param = (k) => frag.get(k) || params.get(k);
const saved = JSON.parse(sessionStorage.getItem(SESSION_KEY) || "null");
$("relay").value = param("relay") ?? localStorage.getItem(RELAY_KEY) ?? "";
$("ticket").value = param("ticket") || (saved && saved.ticket) || localStorage.getItem(TICKET_KEY) || "";
$("device-name").value = defaultDeviceName();
const code = frag.get("pair");
// The code is spent by this visit: a reload must not show or retry it.
if (code) history.replaceState(null, "", location.pathname + location.search);
// For scripts and tests: the module's API and the page's state.
window.thunderbolt = { IrohClient, state, describe, showNotice };
await ensureClient();
window.ready = true;
if (code && $("ticket").value) pairAndConnect($("ticket").value.trim(), code);
else if (saved && saved.ticket === $("ticket").value.trim()) connect(saved);
