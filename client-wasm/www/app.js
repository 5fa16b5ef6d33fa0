// Demo page for the thunderbolt-iroh browser client: pairs with a bridge, runs
// ACP initialize + session/new, streams the agent's reply to a prompt, shows
// and answers what the agent asks (permissions, elicitations), shows its tool
// calls and plan, shows a lost connection being redialed, and keeps its
// session per device: any later tab of this browser takes it back.
import init, { IrohClient } from "../pkg/thunderbolt_client_wasm.js";
import { saveForWorker } from "./keystore.js";

const SECRET_KEY = "thunderbolt_iroh_client_secret";
const RELAY_KEY = "thunderbolt_iroh_relay_url";
const TICKET_KEY = "thunderbolt_iroh_ticket";
// Per ticket, in localStorage (the device's, not the tab's): the live session
// to take back, with what the agent asked that is not answered yet.
const SESSION_PREFIX = "thunderbolt_iroh_session:";
// The agents this browser connected to: [{ticket, label, relay, at}].
const AGENTS_KEY = "thunderbolt_iroh_agents";
// The methods the page answers with a form; any other request from the agent
// is answered "method not found" at once, so no agent waits on the page.
const ASKS = ["session/request_permission", "elicitation/create"];
const $ = (id) => document.getElementById(id);

const state = {
  client: null, clientRelay: null, conn: null, sessionId: null, nextId: 1, pending: new Map(),
  agent: "agent", label: "", userClosed: false, ticket: "",
  // What the agent asked and nobody answered yet: [{id, method, params}].
  requests: [],
  tools: {}, plan: [],
  // The bridge's own short id of the session, learnt from a notice that opened the page.
  bridgeSession: null,
  // Releases this tab's Web Lock on the ticket's session.
  release: null,
  // A notice's request to show (and answer) once it is there.
  focus: null,
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

/// The NodeId (64 hex) a ticket or NodeId names, read in JavaScript: an
/// `endpoint…` ticket is base32 of a postcard record whose first field (after
/// its version byte) is the 32-byte id. `null` when it does not parse.
function nodeOf(target) {
  const t = (target || "").trim().toLowerCase();
  if (/^[0-9a-f]{64}$/.test(t)) return t;
  const b32 = t.startsWith("endpoint") ? t.slice(8) : t;
  if (!/^[a-z2-7]+$/.test(b32)) return null;
  const abc = "abcdefghijklmnopqrstuvwxyz234567";
  const bytes = [];
  let bits = 0, acc = 0;
  for (const c of b32) {
    acc = (acc << 5) | abc.indexOf(c);
    bits += 5;
    if (bits >= 8) { bits -= 8; bytes.push((acc >> bits) & 255); acc &= (1 << bits) - 1; }
  }
  const id = t.startsWith("endpoint") ? (bytes[0] === 0 ? bytes.slice(1, 33) : []) : bytes;
  if (id.length !== 32) return null;
  return id.map((b) => b.toString(16).padStart(2, "0")).join("");
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
  await mirrorForWorker();
  $("node-id").textContent = client.nodeId();
  $("allow-cmd").textContent = `thunderbolt iroh allow ${client.nodeId()}`;
  return client;
}

/// What the service worker needs to answer a notice with no page open (it
/// cannot read localStorage): the secret key, the relay, and the agents by
/// NodeId, mirrored into IndexedDB (www/keystore.js). Never logged.
async function mirrorForWorker() {
  const agents = JSON.parse(localStorage.getItem(AGENTS_KEY) || "[]")
    .map((a) => ({ node: nodeOf(a.ticket), ticket: a.ticket, relay: a.relay ?? "" }))
    .filter((a) => a.node);
  try {
    await saveForWorker({ secret: localStorage.getItem(SECRET_KEY), relay: localStorage.getItem(RELAY_KEY) || "", agents });
  } catch (e) {
    // No IndexedDB (a private window of some browsers): a notice's action opens the page instead.
    log("·", `the service worker cannot be given this browser's identity: ${(e && e.name) || "error"}`);
  }
}

// ---- the session, per ticket, in the device's storage ----

function loadSession(ticket) {
  try {
    return ticket ? JSON.parse(localStorage.getItem(SESSION_PREFIX + ticket) || "null") : null;
  } catch {
    return null;
  }
}

/// Every saved session, the most recently used first.
function savedSessions() {
  const out = [];
  for (let i = 0; i < localStorage.length; i++) {
    const k = localStorage.key(i);
    if (k.startsWith(SESSION_PREFIX)) {
      const s = loadSession(k.slice(SESSION_PREFIX.length));
      if (s) out.push(s);
    }
  }
  return out.sort((a, b) => (b.at || 0) - (a.at || 0));
}

/// What the next tab needs to take the session back: the client's own state
/// (after every message the page has handled), and the page's.
function save() {
  const s = state.conn && state.conn.sessionState();
  if (!s || !state.ticket) return;
  localStorage.setItem(SESSION_PREFIX + state.ticket, JSON.stringify({
    state: s, sessionId: state.sessionId, nextId: state.nextId, agent: state.agent, label: state.label,
    reply: $("reply").textContent, ticket: state.ticket, relay: state.clientRelay,
    requests: state.requests, tools: state.tools, plan: state.plan, bridgeSession: state.bridgeSession,
    at: Date.now(),
  }));
}

function forget(ticket = state.ticket) {
  if (ticket) localStorage.removeItem(SESSION_PREFIX + ticket);
}

/// This tab's Web Lock on a ticket's session: a release function, or `null`
/// when another tab of this browser holds it.
function lockSession(ticket) {
  if (!navigator.locks) return Promise.resolve(() => {});
  return new Promise((resolve) => {
    navigator.locks.request(`thunderbolt-session ${ticket}`, { ifAvailable: true }, (lock) => {
      if (!lock) return resolve(null);
      return new Promise((release) => resolve(release));
    });
  });
}

/// Another tab drives this session: say so, and take it over once that tab lets go.
function busyElsewhere(ticket) {
  setStatus("this session is open in another tab of this browser: carry on there, or close that tab and this one takes it over", "warn");
  window.busyElsewhere = true;
  navigator.locks.request(`thunderbolt-session ${ticket}`, () => new Promise((release) => {
    window.busyElsewhere = false;
    const saved = loadSession(ticket);
    if (state.conn || $("ticket").value.trim() !== ticket || !saved) {
      release();
      if (!state.conn) setStatus("the other tab let go of the session: connect to start one");
      return;
    }
    connect(saved, release);
  }));
}

function rememberAgent() {
  const list = JSON.parse(localStorage.getItem(AGENTS_KEY) || "[]").filter((a) => a.ticket !== state.ticket);
  list.unshift({ ticket: state.ticket, label: state.label || state.agent, relay: state.clientRelay, at: Date.now() });
  localStorage.setItem(AGENTS_KEY, JSON.stringify(list.slice(0, 20)));
  renderAgents();
  mirrorForWorker();
}

/// The agents this browser knows, one button each, named by its label.
function renderAgents() {
  const list = JSON.parse(localStorage.getItem(AGENTS_KEY) || "[]");
  const ul = $("agent-list");
  ul.replaceChildren();
  $("agents").hidden = list.length === 0;
  const seen = new Map();
  for (const a of list) seen.set(a.label, (seen.get(a.label) || 0) + 1);
  for (const a of list) {
    const li = document.createElement("li");
    const b = document.createElement("button");
    const node = nodeOf(a.ticket);
    b.textContent = seen.get(a.label) > 1 && node ? `${a.label} · ${node.slice(0, 6)}` : a.label;
    b.dataset.ticket = a.ticket;
    b.onclick = () => openAgent(a);
    li.append(b);
    ul.append(li);
  }
}

/// One tap: the agent's session taken back, or a new one. Another agent's
/// live session is left to the bridge to resume later (the page reloads; a
/// reload never ends a session).
function openAgent(a) {
  if (state.conn && state.ticket === a.ticket) return;
  if (state.conn) {
    localStorage.setItem(TICKET_KEY, a.ticket);
    location.hash = new URLSearchParams({ ticket: a.ticket, "open-agent": "1", ...(a.relay ? { relay: a.relay } : {}) }).toString();
    location.reload();
    return;
  }
  $("ticket").value = a.ticket;
  if (a.relay !== undefined && a.relay !== null) $("relay").value = a.relay;
  connect(loadSession(a.ticket));
}

// ---- JSON-RPC ----

function request(method, params) {
  const id = state.nextId++;
  const msg = { jsonrpc: "2.0", id, method, params };
  log("→", msg);
  return new Promise((resolve, reject) => {
    state.pending.set(id, { resolve, reject });
    state.conn.send(msg).then(save, reject);
  });
}

/// Answers a request of the agent's (a result, or an error).
function respond(id, result, error) {
  const msg = error ? { jsonrpc: "2.0", id, error } : { jsonrpc: "2.0", id, result };
  log("→", msg);
  return state.conn.send(msg).then(save);
}

const key = (id) => JSON.stringify(id);

function agentRequest(req) {
  const known = ASKS.includes(req.method)
    && !(req.method === "elicitation/create" && req.params && req.params.mode && !["form", "url"].includes(req.params.mode));
  if (!known) {
    respond(req.id, undefined, { code: -32601, message: `${req.method}: this client does not handle it` });
    return;
  }
  if (!state.requests.some((r) => key(r.id) === key(req.id))) {
    state.requests.push({ id: req.id, method: req.method, params: req.params || {} });
  }
  renderRequests();
}

/// The user's answer to one of the agent's requests; the notices about it are withdrawn.
async function answer(req, result) {
  state.requests = state.requests.filter((r) => key(r.id) !== key(req.id));
  renderRequests();
  await respond(req.id, result);
  withdrawNotices((d) => d.event === "needs_answer" && (d.request === undefined || d.request === key(req.id)));
}

function onMessage(value) {
  log("←", value);
  if (value.method !== undefined && value.id !== undefined) {
    agentRequest(value);
  } else if (value.method === "session/update") {
    onUpdate((value.params && value.params.update) || {});
  } else if (value.method === "_thunderbolt/restored") {
    onRestored(value.params || {});
  } else if (value.id !== undefined && state.pending.has(value.id)) {
    const p = state.pending.get(value.id);
    state.pending.delete(value.id);
    value.error ? p.reject(Object.assign(new Error(value.error.message), { rpc: value.error })) : p.resolve(value.result);
  } else if (value.result && value.result.stopReason) {
    // The answer to a prompt sent before a reload (or from a tab now closed).
    $("reply").dataset.stopReason = value.result.stopReason;
    $("send").disabled = false;
    $("cancel").disabled = true;
  }
}

/// The workstation's bridge restarted under the session and took it back
/// (docs/protocol.md, "Sessions that survive a restart of the bridge").
function onRestored(p) {
  window.restored = p;
  const aborted = (p.aborted || []).length;
  if (p.failed) {
    setStatus(`host restarted: ${p.failed}`, "error");
    return;
  }
  const how = (p.sessions || []).map((s) => `${s.how}${s.error ? ` (${s.error})` : ""}`).join(", ");
  setStatus(`host restarted, session restored${how ? ` (${how})` : ""}${aborted ? ` · ${aborted} turn(s) aborted: send again` : ""} · ${state.agent} · session ${state.sessionId}`, "ok");
  $("send").disabled = false;
  $("cancel").disabled = true;
}

function onUpdate(u) {
  switch (u.sessionUpdate) {
    case "agent_message_chunk":
      if (u.content && u.content.type === "text") $("reply").textContent += u.content.text;
      break;
    case "tool_call":
    case "tool_call_update": {
      const id = u.toolCallId;
      const t = { ...(state.tools[id] || {}) };
      for (const f of ["title", "kind", "status", "content", "locations"]) if (u[f] !== undefined && u[f] !== null) t[f] = u[f];
      state.tools[id] = t;
      renderTools();
      break;
    }
    case "plan":
      state.plan = u.entries || [];
      renderPlan();
      break;
    default:
      break;
  }
}

// ---- what the page shows ----

/// A tool call's content as text: its text blocks, diffs (path and new
/// text), terminals by id.
function contentText(content) {
  const out = [];
  for (const c of content || []) {
    if (c.type === "content" && c.content) out.push(c.content.type === "text" ? c.content.text : `[${c.content.type}]`);
    else if (c.type === "diff") out.push(`${c.path}\n${c.newText ?? ""}`);
    else if (c.type === "terminal") out.push(`[terminal ${c.terminalId}]`);
  }
  return out.join("\n");
}

function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  Object.assign(e, props);
  e.append(...children.filter((c) => c !== null && c !== undefined));
  return e;
}

function renderTools() {
  $("tools").replaceChildren(...Object.entries(state.tools).map(([id, t]) => el("li", { className: "tool" },
    `${t.title || id}`, " ", el("span", { className: "status" }, `(${[t.kind, t.status].filter(Boolean).join(", ")})`),
    contentText(t.content) ? el("pre", { className: "mono" }, contentText(t.content)) : null)));
}

function renderPlan() {
  $("plan").replaceChildren(...state.plan.map((e) => el("li", { className: "plan-entry" },
    e.content, " ", el("span", { className: "status" }, `(${e.status}${e.priority ? `, ${e.priority}` : ""})`))));
}

function renderRequests() {
  const box = $("requests");
  box.replaceChildren(...state.requests.map((r) => (r.method === "session/request_permission" ? permissionCard(r) : elicitationCard(r))));
  save();
  applyFocus();
}

function permissionCard(r) {
  const tc = r.params.toolCall || {};
  const known = state.tools[tc.toolCallId] || {};
  const title = tc.title || known.title || "the agent asks for permission";
  const kind = tc.kind || known.kind;
  const text = contentText(tc.content || known.content);
  const card = el("div", { className: "request" },
    el("h3", {}, title),
    el("div", { className: "kind" }, `${state.label || state.agent} asks permission${kind ? ` · ${kind}` : ""}`),
    text ? el("pre", {}, text) : null);
  card.dataset.request = key(r.id);
  card.dataset.method = r.method;
  const options = el("div", { className: "options" });
  for (const o of r.params.options || []) {
    const b = el("button", { textContent: o.name, className: /^reject/.test(o.kind || "") ? "deny" : "primary" });
    b.dataset.optionId = o.optionId;
    b.onclick = () => answer(r, { outcome: { outcome: "selected", optionId: o.optionId } });
    options.append(b);
  }
  card.append(options);
  return card;
}

function elicitationCard(r) {
  const p = r.params;
  const card = el("form", { className: "request" }, el("h3", {}, p.message || "the agent asks"),
    el("div", { className: "kind" }, `${state.label || state.agent} asks for input`));
  card.dataset.request = key(r.id);
  card.dataset.method = r.method;
  if (p.mode === "url") {
    card.append(el("a", { href: p.url, target: "_blank", rel: "noopener", textContent: p.url }));
  }
  const schema = p.requestedSchema || { properties: {} };
  const required = new Set(schema.required || []);
  const fields = [];
  for (const [name, s] of Object.entries(schema.properties || {})) {
    const label = s.title || name;
    let input;
    if (s.type === "boolean") {
      input = el("input", { type: "checkbox", name, checked: s.default === true });
    } else if (s.type === "string" && (s.enum || s.oneOf)) {
      const values = s.enum ? s.enum.map((v, i) => [v, (s.enumNames || [])[i] || v]) : s.oneOf.map((o) => [o.const, o.title || o.const]);
      input = el("select", { name }, ...values.map(([v, t]) => el("option", { value: v, textContent: t, selected: v === s.default })));
    } else if (s.type === "number" || s.type === "integer") {
      input = el("input", { type: "number", name, step: s.type === "integer" ? "1" : "any" });
      if (s.minimum !== undefined) input.min = s.minimum;
      if (s.maximum !== undefined) input.max = s.maximum;
      if (s.default !== undefined) input.value = s.default;
    } else {
      input = el("input", { type: "text", name, value: s.default ?? "" });
      if (s.type === "array") input.placeholder = "comma-separated";
    }
    input.required = required.has(name) && s.type !== "boolean";
    fields.push([name, s, input]);
    card.append(s.type === "boolean"
      ? el("label", {}, input, ` ${label}`)
      : el("label", {}, label, s.description ? el("small", {}, ` (${s.description})`) : null, input));
  }
  const submit = el("button", { type: "submit", className: "primary", textContent: p.mode === "url" ? "Done" : "Submit" });
  const decline = el("button", { type: "button", className: "deny", textContent: "Decline" });
  decline.onclick = () => answer(r, { action: "decline" });
  card.append(el("div", { className: "options" }, submit, decline));
  card.onsubmit = (e) => {
    e.preventDefault();
    if (p.mode === "url") return answer(r, { action: "accept" });
    const content = {};
    for (const [name, s, input] of fields) {
      if (s.type === "boolean") content[name] = input.checked;
      else if (input.value === "") continue;
      else if (s.type === "number") content[name] = Number(input.value);
      else if (s.type === "integer") content[name] = parseInt(input.value, 10);
      else if (s.type === "array") content[name] = input.value.split(",").map((v) => v.trim()).filter(Boolean);
      else content[name] = input.value;
    }
    answer(r, { action: "accept", content });
  };
  return card;
}

/// A notice's request: shown (scrolled to, its first button focused), and
/// answered when the notice's action said so (Allow / Deny).
function applyFocus() {
  const f = state.focus;
  if (!f || !state.conn) return;
  const r = state.requests.find((x) => (f.request ? key(x.id) === f.request : !f.method || x.method === f.method));
  if (!r) return;
  state.focus = null;
  const card = [...$("requests").children].find((c) => c.dataset.request === key(r.id));
  if (card) {
    card.scrollIntoView({ block: "center" });
    const b = card.querySelector("button");
    if (b) b.focus();
  }
  if (f.answer && r.method === "session/request_permission") {
    const kinds = f.answer === "allow" ? ["allow_once", "allow_always"] : ["reject_once", "reject_always"];
    const opts = r.params.options || [];
    const o = kinds.map((k) => opts.find((x) => x.kind === k)).find(Boolean);
    if (o) answer(r, { outcome: { outcome: "selected", optionId: o.optionId } });
  }
}

// ---- the session ----

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
    sessionEnded();
  }
}

/// The session is over: nothing it asked can be answered any more.
function sessionEnded() {
  forget();
  if (state.requests.length) log("·", `the session ended with ${state.requests.length} question(s) unanswered`);
  state.requests = [];
  $("requests").replaceChildren();
  withdrawNotices(() => true);
  if (state.release) state.release();
  state.release = null;
  $("send").disabled = true;
  $("cancel").disabled = true;
  $("disconnect").disabled = true;
  $("notify").disabled = true;
  $("notify-off").disabled = true;
  $("connect").disabled = false;
}

/// Connects (or, with `saved`, takes back the session a closed tab or a
/// reload left). `release`: this tab's lock on it, when already taken.
async function connect(saved = null, release = null) {
  const ticket = $("ticket").value.trim();
  if (!ticket) return setStatus("paste the bridge's ticket first", "error");
  if (state.conn) return;
  $("connect").disabled = true;
  release = release || (await lockSession(ticket));
  if (!release) {
    $("connect").disabled = false;
    return busyElsewhere(ticket);
  }
  // The lock was waited for: what the other tab left is the newest state.
  if (saved) saved = loadSession(ticket) || saved;
  state.release = release;
  setStatus(saved ? "resuming the session…" : "connecting…");
  try {
    await ensureClient();
    localStorage.setItem(TICKET_KEY, ticket);
    const onEvent = (e) => {
      window.events = [...(window.events || []), e.type];
      if (e.type === "reconnecting") {
        const restarting = e.detail === "bridge restarting: session kept";
        setStatus(`reconnecting… (${restarting ? "the host is restarting; it keeps the session" : "connection lost; the bridge keeps the session"})`, "warn");
      }
      if (e.type === "resumed") setStatus(`resumed · ${state.agent} · session ${state.sessionId}`, "ok");
    };
    state.userClosed = false;
    const idle = Number(param("idle")) || undefined; // ?idle=MS: notice a lost path sooner
    const conn = await state.client.connectProtocol(ticket, "acp", undefined, undefined, { onEvent, session: saved && saved.state, idleTimeoutMs: idle });
    state.conn = conn;
    state.ticket = ticket;
    if (saved) {
      Object.assign(state, {
        sessionId: saved.sessionId, nextId: saved.nextId, agent: saved.agent, label: saved.label || saved.agent,
        requests: saved.requests || [], tools: saved.tools || {}, plan: saved.plan || [],
        bridgeSession: state.bridgeSession || saved.bridgeSession || null,
      });
      $("reply").textContent = saved.reply || "";
      renderTools();
      renderPlan();
      renderRequests();
    } else {
      Object.assign(state, { requests: [], tools: {}, plan: [] });
    }
    pump(conn);
    if (saved) {
      setStatus(`resumed after the reload · ${state.agent} · session ${state.sessionId}`, "ok");
      window.resumedAfterReload = true;
    } else {
      const init = await request("initialize", {
        protocolVersion: 1,
        clientCapabilities: { elicitation: { form: {}, url: {} } },
        clientInfo: { name: "thunderbolt-demo-page", version: "1" },
      });
      const session = await request("session/new", { cwd: "/", mcpServers: [] });
      state.agent = init.agentInfo ? init.agentInfo.name : "agent";
      state.label = (init.agentInfo && (init.agentInfo.title || init.agentInfo.name)) || "agent";
      state.sessionId = session.sessionId;
      setStatus(`connected · ${state.agent} · session ${state.sessionId}`, "ok");
    }
    save();
    rememberAgent();
    $("send").disabled = false;
    $("cancel").disabled = false;
    $("disconnect").disabled = false;
    $("notify").disabled = false;
    $("notify-off").disabled = false;
    applyFocus();
    // Already allowed: keep this browser's subscription registered with this bridge.
    if (typeof Notification !== "undefined" && Notification.permission === "granted") subscribe(false);
    else setNotify("not on: “notify me” asks the browser, then registers this browser with the bridge");
  } catch (err) {
    if (err.kind === "session_gone") forget(ticket);
    if (!state.conn) {
      if (state.release) state.release();
      state.release = null;
    }
    setStatus(describe(err), "error");
    lastError(err);
    $("connect").disabled = false;
  }
}

async function send() {
  const text = $("prompt").value;
  $("reply").textContent = "";
  delete $("reply").dataset.stopReason;
  state.tools = {};
  state.plan = [];
  renderTools();
  renderPlan();
  $("send").disabled = true;
  $("cancel").disabled = false;
  try {
    const res = await request("session/prompt", { sessionId: state.sessionId, prompt: [{ type: "text", text }] });
    $("reply").dataset.stopReason = res.stopReason;
  } catch (err) {
    // A turn the host's restart aborted: the restored notice that follows says so.
    const aborted = err.rpc && err.rpc.message === "turn aborted: the host restarted";
    if (!state.userClosed && !aborted) setStatus(describe(err), "error");
  } finally {
    $("send").disabled = !state.conn;
  }
}

/// Cancels the prompt turn (ACP `session/cancel`): every question of it is
/// answered `cancelled` first, as ACP asks of the client.
async function cancelTurn() {
  if (!state.conn) return;
  for (const r of [...state.requests]) {
    await answer(r, r.method === "session/request_permission" ? { outcome: { outcome: "cancelled" } } : { action: "cancel" });
  }
  const msg = { jsonrpc: "2.0", method: "session/cancel", params: { sessionId: state.sessionId } };
  log("→", msg);
  await state.conn.send(msg);
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

// ---- notices ----

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
    const reg = await registerWorker();
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

/// The service worker: sw.js, a module (it answers a notice's Allow / Deny by
/// itself), or, in a browser without module service workers, sw-classic.js
/// (the same notices; an action opens the page, which answers).
function registerWorker() {
  return navigator.serviceWorker.register("./sw.js", { type: "module" })
    .catch(() => navigator.serviceWorker.register("./sw-classic.js"));
}

function b64urlBytes(text) {
  const b = atob(text.replace(/-/g, "+").replace(/_/g, "/"));
  return Uint8Array.from(b, (c) => c.charCodeAt(0));
}

/// Whether a notice is about this tab's session: by the agent's NodeId when
/// the notice names it, else by the bridge's session id once a notice told
/// it, else (a notice that names neither) yes.
function noticeIsOurs(d) {
  const node = nodeOf(state.ticket);
  if (d.node && node) return d.node === node;
  if (d.session && state.bridgeSession) return d.session === state.bridgeSession;
  return true;
}

/// Closes the notices of this session that `which` picks (answered here, or the session over).
async function withdrawNotices(which) {
  if (!("serviceWorker" in navigator)) return;
  const reg = await navigator.serviceWorker.getRegistration("./sw.js");
  if (!reg || !reg.getNotifications) return;
  for (const n of await reg.getNotifications()) {
    const d = n.data || {};
    if (noticeIsOurs(d) && which(d)) n.close();
  }
}

/// A notice the service worker got: listed on the page.
function showNotice(n) {
  const li = document.createElement("li");
  li.textContent = `${n.at ? n.at.slice(11, 19) : ""} ${n.title || ""}: ${n.body || ""}`;
  $("notices").prepend(li);
  // (not window.notices: that is the #notices list, by its id)
  window.noticesSeen = [...(window.noticesSeen || []), n];
}

/// A notice tapped (or its action): the page at its request. `o`: {notice,
/// node, request, method, answer}, from the service worker.
function openFromNotice(o) {
  const all = savedSessions();
  const saved = (o.node && all.find((s) => nodeOf(s.ticket) === o.node)) || all[0] || null;
  state.focus = { request: o.request || null, method: o.method || null, answer: o.answer || null };
  if (o.notice) state.bridgeSession = o.notice;
  if (state.conn) {
    if (!saved || saved.ticket === state.ticket) return applyFocus();
    return openAgent({ ticket: saved.ticket, relay: saved.relay });
  }
  if (!saved) return setStatus("that notice's session is not in this browser any more: connect to start one", "warn");
  $("ticket").value = saved.ticket;
  if (saved.relay !== undefined && saved.relay !== null) $("relay").value = saved.relay;
  window.openedFromNotice = o;
  connect(saved);
}

function defaultDeviceName() {
  const ua = navigator.userAgent;
  const browser = /Firefox\//.test(ua) ? "Firefox" : /Edg\//.test(ua) ? "Edge" : /Chrom/.test(ua) ? "Chrome" : /Safari\//.test(ua) ? "Safari" : "Browser";
  const os = /Android/.test(ua) ? "Android" : /iPhone|iPad/.test(ua) ? "iOS" : /Mac/.test(ua) ? "macOS" : /Windows/.test(ua) ? "Windows" : /Linux/.test(ua) ? "Linux" : "";
  return os ? `${browser} on ${os}` : browser;
}

$("connect").onclick = () => connect(loadSession($("ticket").value.trim()));
$("send").onclick = send;
$("cancel").onclick = cancelTurn;
$("disconnect").onclick = disconnect;
$("notify").onclick = () => subscribe(true);
$("notify-off").onclick = unsubscribe;
if ("serviceWorker" in navigator) {
  navigator.serviceWorker.addEventListener("message", (e) => {
    const m = e.data || {};
    if (m.type === "thunderbolt-notice") showNotice(m.notice);
    if (m.type === "thunderbolt-notice-done") window.noticesDone = [...(window.noticesDone || []), m.shown];
    // The service worker shows no notice while this page is visible and attached to its session.
    if (m.type === "thunderbolt-attached?" && e.ports[0]) {
      e.ports[0].postMessage({ attached: !!state.conn && document.visibilityState === "visible" && noticeIsOurs(m.notice || {}) });
    }
    if (m.type === "thunderbolt-open") openFromNotice(m.open || {});
  });
  navigator.serviceWorker.startMessages();
  // Registered on every visit: the notices' taps and actions need it even
  // before “notify me” (a subscription made elsewhere, or a reinstall).
  registerWorker().catch((e) => log("·", `service worker: ${e.message}`));
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
// in its #fragment, which no server sees; `?ticket=&relay=` work too. A
// notice's tap opens `#open=1&notice=…&node=…&request=…&method=…&answer=…`.
const params = new URLSearchParams(location.search);
const frag = new URLSearchParams(location.hash.slice(1));
const param = (k) => frag.get(k) || params.get(k);
const opened = frag.get("open") ? Object.fromEntries(frag) : null;
$("relay").value = param("relay") ?? localStorage.getItem(RELAY_KEY) ?? "";
$("ticket").value = param("ticket") || localStorage.getItem(TICKET_KEY) || "";
$("device-name").value = defaultDeviceName();
const code = frag.get("pair");
// The code is spent by this visit, a notice's answer is given once: a reload must not repeat either.
if (code || opened || frag.get("ticket")) history.replaceState(null, "", location.pathname + location.search);
// For scripts and tests: the module's API and the page's state.
window.thunderbolt = { IrohClient, state, describe, showNotice, request, nodeOf };
renderAgents();
await ensureClient();
window.ready = true;
const saved = loadSession($("ticket").value.trim());
if (code && $("ticket").value) pairAndConnect($("ticket").value.trim(), code);
else if (opened) openFromNotice(opened);
else if (saved || frag.get("open-agent")) connect(saved);
