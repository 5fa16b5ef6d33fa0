// Demo page for the thunderbolt-iroh browser client: pairs with a bridge, runs
// ACP initialize + session/new, and streams the agent's reply to a prompt.
import init, { IrohClient } from "../pkg/thunderbolt_client_wasm.js";

const SECRET_KEY = "thunderbolt_iroh_client_secret";
const RELAY_KEY = "thunderbolt_iroh_relay_url";
const $ = (id) => document.getElementById(id);

const state = { client: null, conn: null, sessionId: null, nextId: 1, pending: new Map(), onUpdate: null };

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

/// Describes a client error for people: the bridge's reason when it refused us.
function describe(err) {
  if (err && err.kind === "closed") return `refused by the bridge: ${err.reason} (code ${err.code})`;
  if (err && err.kind === "timeout") return `dial timed out: ${err.message}`;
  if (err && err.kind === "alpn") return `the peer is not an ACP bridge: ${err.message}`;
  return `${(err && err.kind) || "error"}: ${(err && err.message) || err}`;
}

async function startClient() {
  const relay = $("relay").value.trim() || undefined;
  const client = await IrohClient.create(localStorage.getItem(SECRET_KEY) || undefined, relay);
  localStorage.setItem(SECRET_KEY, client.secretKeyHex());
  state.client = client;
  $("node-id").textContent = client.nodeId();
  $("allow-cmd").textContent = `thunderbolt iroh allow ${client.nodeId()}`;
  return client;
}

function request(method, params) {
  const id = state.nextId++;
  const msg = { jsonrpc: "2.0", id, method, params };
  log("→", msg);
  return new Promise((resolve, reject) => {
    state.pending.set(id, { resolve, reject });
    state.conn.send(msg).catch(reject);
  });
}

async function pump(conn) {
  const reader = conn.messages().getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      log("←", value);
      if (value.method === "session/update") {
        state.onUpdate && state.onUpdate(value.params);
      } else if (value.id !== undefined && state.pending.has(value.id)) {
        const p = state.pending.get(value.id);
        state.pending.delete(value.id);
        value.error ? p.reject(Object.assign(new Error(value.error.message), { rpc: value.error })) : p.resolve(value.result);
      }
    }
    setStatus("the bridge ended the session", "");
  } catch (err) {
    for (const p of state.pending.values()) p.reject(err);
    state.pending.clear();
    setStatus(describe(err), "error");
    window.lastError = { kind: err.kind, code: err.code, reason: err.reason, message: err.message };
  } finally {
    $("send").disabled = true;
    $("disconnect").disabled = true;
    $("connect").disabled = false;
  }
}

async function connect() {
  const ticket = $("ticket").value.trim();
  if (!ticket) return setStatus("paste the bridge's ticket first", "error");
  $("connect").disabled = true;
  setStatus("connecting…");
  try {
    const relay = $("relay").value.trim();
    localStorage.setItem(RELAY_KEY, relay);
    if (!state.client) await startClient();
    state.conn = await state.client.connectProtocol(ticket, "acp");
    pump(state.conn);
    const init = await request("initialize", { protocolVersion: 1, clientCapabilities: {} });
    const session = await request("session/new", { cwd: "/", mcpServers: [] });
    state.sessionId = session.sessionId;
    setStatus(`connected · ${init.agentInfo ? init.agentInfo.name : "agent"} · session ${state.sessionId}`, "ok");
    $("send").disabled = false;
    $("disconnect").disabled = false;
  } catch (err) {
    setStatus(describe(err), "error");
    window.lastError = { kind: err.kind, code: err.code, reason: err.reason, message: err.message };
    $("connect").disabled = false;
  }
}

async function send() {
  const text = $("prompt").value;
  $("reply").textContent = "";
  $("send").disabled = true;
  state.onUpdate = (params) => {
    const u = params.update;
    if (u && u.sessionUpdate === "agent_message_chunk" && u.content && u.content.type === "text") {
      $("reply").textContent += u.content.text;
    }
  };
  try {
    const res = await request("session/prompt", { sessionId: state.sessionId, prompt: [{ type: "text", text }] });
    $("reply").dataset.stopReason = res.stopReason;
  } catch (err) {
    setStatus(describe(err), "error");
  } finally {
    $("send").disabled = !state.conn;
  }
}

function disconnect() {
  if (state.conn) state.conn.close();
  state.conn = null;
  setStatus("disconnected");
}

$("connect").onclick = connect;
$("send").onclick = send;
$("disconnect").onclick = disconnect;
$("copy-allow").onclick = () => navigator.clipboard.writeText($("allow-cmd").textContent);
$("new-identity").onclick = async () => {
  localStorage.removeItem(SECRET_KEY);
  if (state.client) await state.client.shutdown();
  state.client = null;
  await startClient();
};

/// Pairs with the one-time code of a pairing link, then connects as usual.
async function pairAndConnect(ticket, code) {
  const name = $("device-name").value.trim() || defaultDeviceName();
  setStatus("pairing…");
  try {
    const res = await state.client.pair(ticket, code, name, "acp");
    $("paired-as").textContent = `paired as “${res.name || name}”`;
    window.paired = res;
  } catch (err) {
    setStatus(`pairing failed: ${describe(err)}`, "error");
    window.lastError = { kind: err.kind, code: err.code, reason: err.reason, message: err.message };
    return;
  }
  await connect();
}

function defaultDeviceName() {
  const ua = navigator.userAgent;
  const browser = /Firefox\//.test(ua) ? "Firefox" : /Edg\//.test(ua) ? "Edge" : /Chrom/.test(ua) ? "Chrome" : /Safari\//.test(ua) ? "Safari" : "Browser";
  const os = /Android/.test(ua) ? "Android" : /iPhone|iPad/.test(ua) ? "iOS" : /Mac/.test(ua) ? "macOS" : /Windows/.test(ua) ? "Windows" : /Linux/.test(ua) ? "Linux" : "";
  return os ? `${browser} on ${os}` : browser;
}

await init();
// A pairing link carries `ticket`, `pair` (and, for a self-hosted relay, `relay`)
// in its #fragment, which no server sees; `?ticket=&relay=` work too.
const params = new URLSearchParams(location.search);
const frag = new URLSearchParams(location.hash.slice(1));
const param = (k) => frag.get(k) || params.get(k);
$("relay").value = param("relay") || localStorage.getItem(RELAY_KEY) || "";
if (param("ticket")) $("ticket").value = param("ticket");
$("device-name").value = defaultDeviceName();
const code = frag.get("pair");
// The code is spent by this visit: a reload must not show or retry it.
if (code) history.replaceState(null, "", location.pathname + location.search);
// For scripts and tests: the module's API and the page's state.
window.thunderbolt = { IrohClient, state, describe };
await startClient();
window.ready = true;
if (code && $("ticket").value) pairAndConnect($("ticket").value.trim(), code);
