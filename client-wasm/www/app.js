// The phone page of thunderbolt-iroh: the conversation with an agent on your
// workstation first (conversation.js), the connection out of the way in a
// settings sheet. It pairs with a bridge, runs ACP initialize + session/new,
// streams the agent's replies, shows and answers what the agent asks, shows a
// lost connection being redialed, and keeps its session per device: any later
// tab of this browser takes it back. On a session several devices share it
// follows every event the bridge sends: who controls the session (Take
// control / Watch only), a question answered on another device, what this
// device missed while away, a restart of the host (its unanswered questions
// made inert, the aborted prompt offered again).
import init, { IrohClient } from "../pkg/thunderbolt_client_wasm.js";
import { saveForWorker, keepUpload, keptUpload, dropUpload, keptUploads } from "./keystore.js";
import { Conversation, el, size } from "./conversation.js";
import { Messages } from "./messages.js";

const SECRET_KEY = "thunderbolt_iroh_client_secret";
const RELAY_KEY = "thunderbolt_iroh_relay_url";
const TICKET_KEY = "thunderbolt_iroh_ticket";
// Set at the first connection: from then on the settings sheet starts folded.
const CONNECTED_KEY = "thunderbolt_iroh_connected_once";
// Per ticket, in localStorage (the device's, not the tab's): the live session
// to take back. Its conversation is conversation.js's, per ticket too.
const SESSION_PREFIX = "thunderbolt_iroh_session:";
// The agents this browser connected to: [{ticket, label, relay, at}].
const AGENTS_KEY = "thunderbolt_iroh_agents";
// In sessionStorage across one reload: another agent's session to join
// ({ticket, s}), picked in the list while this page had a session open.
const JOIN_KEY = "thunderbolt_iroh_join";
// The methods the page answers with a form; any other request from the agent
// is answered "method not found" at once, so no agent waits on the page.
const ASKS = ["session/request_permission", "elicitation/create"];
// What the bridge answers for a request in flight when the host restarted
// (shared/src/restart.rs), and for an observer's request (-32003).
const TURN_ABORTED = "turn aborted: the host restarted";
const OBSERVER_REFUSED = -32003;
const $ = (id) => document.getElementById(id);

const state = {
  client: null, clientRelay: null, conn: null, sessionId: null, nextId: 1, pending: new Map(),
  agent: "agent", label: "", userClosed: false, ticket: "",
  // Files picked for the next prompt: {id, name, size, mime, status, done,
  // total, receipt, error, inline}; `inline`: a small image's bytes, for an
  // agent that takes images in a prompt.
  attachments: [],
  // The agent advertised promptCapabilities.image.
  images: false,
  // The id of this device's prompt whose turn is going, else null.
  turn: null,
  // This device's role on a session several devices share (the bridge's
  // `_thunderbolt/role`): "controller" | "observer" | null (not shared), who
  // controls it, and the role asked for and not confirmed yet.
  role: null, controller: null, askedRole: null,
  // The prompt box holds a prompt a restart aborted: Send says "Send again".
  sendAgain: false,
  // A connection is being made (or waits for another tab to let go).
  connecting: false,
  // The bridge's own short id of the session, learnt from a notice that opened the page.
  bridgeSession: null,
  // Releases this tab's Web Lock on the ticket's session.
  release: null,
  // A notice's request to show (and answer) once it is there.
  focus: null,
  // The list unfolded while a conversation is shown.
  listOpen: false,
};

// Messages from the workstation: the threads the hosts' listings name.
const messages = new Messages({ client: () => state.client, log: (text) => log("·", text), onRead: () => renderAgents() });

const conversation = new Conversation($("conversation"), {
  label: () => agentLabel(state.agent || "agent"),
  // Before the bridge says who controls a joined session, its history's
  // turns are the device's that started it.
  controller: () => (state.role === "observer" ? controllerName() : state.role ? null : state.joinedFrom || null),
  answer: (q, result, said) => answer(q, result, said),
  mayAnswer: () => may("answer"),
  noAnswer: () => (guestOf() ? "Only the session's owner answers the agent." : "This device may not answer the agent: another of your devices can."),
  log: (text) => log("·", text),
  openFile: (link, view, button) => openFile(link, view, button),
});

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

/// Describes a client error for people, in the CLI's words: what happened,
/// and what to do. No error kinds, no close codes.
function describe(err) {
  if (!err) return "something went wrong";
  switch (err.kind) {
    case "closed": {
      // The client's words for the bridge's reason: the CLI's, word for word
      // (thunderbolt_shared::words::closed), each saying what to do next.
      return err.message || `the bridge closed the connection: ${err.reason}`;
    }
    case "agent": return err.message; // the CLI's words: `the agent exited with code 3: <its last stderr line>`
    case "session_gone": return `the session is gone (${err.message}): connect to start a new one`;
    case "timeout": return err.message;
    case "alpn": return `the peer is not an ACP bridge: ${err.message}`;
    default: return err.message || String(err);
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
/// The agents this browser knows, newest first (read each time: another tab
/// of the app may have paired with one).
function knownAgents() {
  return JSON.parse(localStorage.getItem(AGENTS_KEY) || "[]");
}

const knownAgent = (ticket) => knownAgents().find((a) => a.ticket === ticket);

/// What this device may do at the agent of `ticket` (its scope, as the
/// bridge last said: in the pairing answer, in each listing); `null`: everything.
function scopeOf(ticket) {
  const a = knownAgent(ticket);
  return a && Array.isArray(a.scope) ? a.scope : null;
}

/// Whether this device may `verb` (observe, prompt, answer, start, files) at
/// the agent shown: what it may not do has no button.
function may(verb, ticket = state.ticket || $("ticket").value.trim()) {
  const s = scopeOf(ticket);
  return !s || s.includes(verb);
}

/// The bridge said what this device may do at the agents of `tickets`
/// (`scope` absent: everything).
function noteScope(tickets, scope) {
  const value = Array.isArray(scope) ? scope.filter((v) => typeof v === "string").slice(0, 8) : undefined;
  noteAgents(tickets, "scope", value);
}

/// This device is a share's guest at the agent of `ticket`: `{session, until, of}`
/// (whose session, until when), or no longer one (`undefined`).
function noteGuest(ticket, guest) {
  const value = guest && typeof guest.session === "string"
    ? { session: guest.session.slice(0, 64), until: String(guest.until || "").slice(0, 40), of: String(guest.of || "").slice(0, 64) }
    : undefined;
  noteAgents([ticket], "guest", value);
}

const guestOf = (ticket = state.ticket || $("ticket").value.trim()) => knownAgent(ticket)?.guest || null;

/// Sets `field` of the known agents of `tickets` (by ticket or NodeId) to `value`.
function noteAgents(tickets, field, value) {
  const list = knownAgents();
  const nodes = new Set(tickets.map(nodeOf).filter(Boolean));
  const answered = may("answer");
  let changed = false;
  for (const a of list) {
    if (!tickets.includes(a.ticket) && !nodes.has(nodeOf(a.ticket))) continue;
    if (JSON.stringify(a[field]) === JSON.stringify(value)) continue;
    a[field] = value;
    changed = true;
  }
  if (!changed) return;
  localStorage.setItem(AGENTS_KEY, JSON.stringify(list));
  renderComposer();
  renderRole();
  renderAgents();
  if (may("answer") !== answered) conversation.redraw();
}

async function mirrorForWorker() {
  const agents = knownAgents()
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

let saveTimer = null;
let savedAt = 0;

/// What the next tab needs to take the session back: the client's own state
/// and the conversation, written together (after every message the page has
/// handled, or at most 250 ms later for a streamed chunk: a tab that goes
/// before that resumes from the same point its conversation was kept at, and
/// is sent what came after again).
function save() {
  clearTimeout(saveTimer);
  saveTimer = null;
  savedAt = Date.now();
  if (state.release) conversation.save();
  const s = state.conn && state.conn.sessionState();
  if (!s || !state.ticket) return;
  localStorage.setItem(SESSION_PREFIX + state.ticket, JSON.stringify({
    state: s, sessionId: state.sessionId, nextId: state.nextId, agent: state.agent, label: state.label,
    ticket: state.ticket, relay: state.clientRelay, bridgeSession: state.bridgeSession,
    turn: state.turn, role: state.role, controller: state.controller, sendAgain: state.sendAgain,
    images: state.images, attachments: savedAttachments(),
    at: Date.now(),
  }));
}

function saveSoon() {
  if (saveTimer) return;
  const wait = 250 - (Date.now() - savedAt);
  if (wait <= 0) save();
  else saveTimer = setTimeout(save, wait);
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
  renderComposer();
  navigator.locks.request(`thunderbolt-session ${ticket}`, () => new Promise((release) => {
    window.busyElsewhere = false;
    renderComposer();
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
  const all = knownAgents();
  // A name the host gave it (its manifest's label) over the one the agent gives itself.
  const named = all.find((a) => a.ticket === state.ticket && a.named);
  const list = all.filter((a) => a.ticket !== state.ticket);
  // Its host, when a pairing named it, stays.
  const host = named && named.host ? { host: named.host, hostName: named.hostName } : {};
  // And what this device may do there, as the bridge last said.
  const scope = scopeOf(state.ticket);
  const guest = guestOf(state.ticket);
  list.unshift({ ticket: state.ticket, label: named ? named.label : state.label || state.agent, named: Boolean(named), relay: state.clientRelay, at: Date.now(), ...host, ...(scope ? { scope } : {}), ...(guest ? { guest } : {}) });
  localStorage.setItem(AGENTS_KEY, JSON.stringify(list.slice(0, 20)));
  renderAgents();
  mirrorForWorker();
}

/// Every ACP agent a pairing answer named (one scan pairs a device with
/// every agent of a host): each is one of this browser's agents from now on,
/// after those it used lately.
function knowAgents(agents, host = null) {
  const list = knownAgents();
  const before = JSON.stringify(list);
  // The host: the name it gave, keyed by the NodeId this page paired through
  // (two hosts may share a name).
  const at = host && host.name ? { host: host.key, hostName: String(host.name).slice(0, 64) } : {};
  for (const a of agents) {
    if (!a || a.protocol !== "acp" || typeof a.ticket !== "string") continue;
    // Known by its NodeId: a ticket with other addresses is the same agent
    // (its sessions are kept under the ticket first used).
    const node = nodeOf(a.ticket);
    const known = list.find((k) => k.ticket === a.ticket || (node && nodeOf(k.ticket) === node));
    if (known) {
      Object.assign(known, { label: a.label || known.label, named: true, ...at });
      continue;
    }
    list.push({ ticket: a.ticket, label: a.label || a.name || "agent", named: true, relay: state.clientRelay, at: Date.now(), ...at });
  }
  if (JSON.stringify(list) === before) return;
  localStorage.setItem(AGENTS_KEY, JSON.stringify(list.slice(0, 20)));
  renderAgents();
  mirrorForWorker();
}

/// The ticket this browser knows an agent by (same NodeId), else `ticket`.
function knownTicket(ticket) {
  const node = nodeOf(ticket);
  const known = knownAgents().find((k) => k.ticket === ticket || (node && nodeOf(k.ticket) === node));
  return known ? known.ticket : ticket;
}

/// The list: every host this browser knows, its live sessions (the ones that
/// need an answer first; yours to open, your other devices' to join) and its
/// agents (a tap starts a session). While a conversation is shown it folds
/// into one line when it is long; the first screen (no session open) shows
/// it whole.
function renderAgents() {
  const list = knownAgents();
  const ul = $("agent-list");
  ul.replaceChildren();
  const current = state.ticket || $("ticket").value.trim();
  const hosts = hostsOf(list);
  const live = new Map(hosts.map((h) => [h.key, liveSessions(h)]));
  const sessions = [...live.values()].flat();
  // One agent, the one shown, and no other session: nothing to pick.
  const threads = hosts.some((h) => hostListed.get(h.key)?.messages?.threads?.length);
  const alone = list.length === 1 && list[0].ticket === current && !sessions.some((x) => !x.shown) && !threads;
  $("agents").hidden = list.length === 0 || alone;
  const seen = new Map();
  for (const a of list) seen.set(a.label, (seen.get(a.label) || 0) + 1);
  const button = (a) => {
    const li = document.createElement("li");
    const b = document.createElement("button");
    const node = nodeOf(a.ticket);
    b.textContent = seen.get(a.label) > 1 && node ? `${a.label} · ${node.slice(0, 6)}` : a.label;
    b.dataset.ticket = a.ticket;
    b.setAttribute("aria-current", String(a.ticket === current));
    b.onclick = () => openAgent(a);
    li.append(b);
    return li;
  };
  const group = (h, named) => {
    const li = document.createElement("li");
    li.className = "host";
    if (named) {
      const head = document.createElement("div");
      head.className = "host-head";
      const name = document.createElement("strong");
      name.textContent = h.name;
      const st = document.createElement("span");
      st.className = "host-state";
      st.dataset.host = h.key;
      st.textContent = hostStates.get(h.key) || "checking…";
      st.classList.toggle("down", st.textContent === "unreachable");
      head.append(name, " ", st);
      li.append(head);
      li.setAttribute("aria-label", h.name);
      li.setAttribute("role", "group");
    }
    const others = live.get(h.key).filter((x) => !x.shown);
    if (others.length) {
      const ss = document.createElement("ul");
      ss.className = "sessions";
      ss.setAttribute("aria-label", `sessions on ${h.name}`);
      ss.append(...others.map(sessionItem));
      li.append(ss);
    }
    const listed = hostListed.get(h.key);
    const threadList = listed && messages.list(h.key, h.name, h.agents[0].ticket, listed.messages);
    if (threadList) li.append(threadList);
    const agents = document.createElement("ul");
    agents.className = "agents";
    agents.setAttribute("aria-label", `agents of ${h.name}`);
    // An agent this device may not start a session at has no button (its own
    // session there, if it has one, still opens).
    agents.append(...h.agents.filter((a) => may("start", a.ticket) || loadSession(a.ticket)).map(button));
    li.append(agents);
    return li;
  };
  ul.classList.toggle("hosts", hosts.length > 1);
  ul.append(...hosts.map((h) => group(h, hosts.length > 1)));
  // Folded while a conversation is shown: one line says what waits.
  const asking = sessions.filter((x) => x.s.activity === "asking" && !x.shown).length;
  const fold = $("list-toggle");
  fold.textContent = `Hosts and sessions${asking ? ` · ${asking} need${asking === 1 ? "s" : ""} you` : ""}`;
  // A short list stays in sight; a long one (more than LIST_SHORT agents
  // and sessions) folds while a conversation is shown.
  const entries = list.length + sessions.filter((x) => !x.shown).length;
  const folds = !!state.conn && entries > LIST_SHORT;
  const open = !folds || state.listOpen;
  fold.hidden = !folds;
  fold.setAttribute("aria-expanded", String(open));
  ul.hidden = !open;
  probeHosts(hosts);
}

/// The known agents by host: a host a pairing named, else each agent alone
/// (paired by a ticket or the allow line: its host is not known).
function hostsOf(list) {
  const by = new Map();
  for (const a of list) {
    const key = a.host || `agent:${a.ticket}`;
    if (!by.has(key)) by.set(key, { key, name: a.hostName || a.label, agents: [] });
    by.get(key).agents.push(a);
  }
  return [...by.values()];
}

/// What each host said last: "reachable · …" or "unreachable".
const hostStates = new Map();
/// Each host's last listing: its sessions, and its agents' names → tickets.
const hostListed = new Map();
/// When each host was last asked (ms), and whether an ask is out.
const hostAsked = new Map();
/// How long a host has to answer before it is shown as unreachable: a dial
/// through a relay takes well under a second; a host that is off never answers.
const HOST_PROBE_MS = 8000;
/// How often a visible list asks its hosts again.
const HOST_REFRESH_MS = 30000;
/// Entries (agents and sessions) a list may have and stay unfolded beside a
/// conversation: a row or two of buttons at 390 px.
const LIST_SHORT = 4;
/// Needs a person first, then what works, then the rest by last activity.
const ACTIVITY_RANK = { asking: 0, working: 1, idle: 2 };

/// A host's live sessions as the list shows them: `{s, ticket, label, mine,
/// shown}` (`shown`: the one this page has open).
function liveSessions(h) {
  const listed = hostListed.get(h.key);
  if (!listed) return [];
  const me = state.client && state.client.nodeId();
  const out = [];
  for (const s of listed.sessions) {
    if (s.state === "warm") continue;
    // Its agent: by the host's name for it, else the host's only agent.
    const ticket = listed.tickets.get(s.agent) || (h.agents.length === 1 ? h.agents[0].ticket : null);
    if (!ticket) continue;
    const known = knownAgent(ticket);
    const mine = s.startedBy.node === me;
    const shown = !!state.conn && state.ticket === ticket && s.attached.some((a) => a.node === me);
    // One of this browser's that it keeps no state of (ended here, the
    // listing older than the end): nothing to open.
    if (mine && !shown && !loadSession(ticket)) continue;
    out.push({ s, ticket, label: (known && known.label) || s.agent || "agent", mine, shown });
  }
  return out.sort((a, b) => (ACTIVITY_RANK[a.s.activity] ?? 3) - (ACTIVITY_RANK[b.s.activity] ?? 3) || b.s.lastActivityMs - a.s.lastActivityMs);
}

/// "2 min ago", from a time in ms since the epoch.
function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

/// Joins another device's session from the list (its agent's ticket known).
function joinFromList(x) {
  joinSession(x.s, x.ticket);
}

/// One session of the list: what it is, who started it, what its agent is
/// doing; a tap opens it (yours) or joins it (another device's).
function sessionItem(x) {
  const { s, label, mine } = x;
  const li = document.createElement("li");
  const b = document.createElement("button");
  b.className = `session ${s.activity || ""}`;
  const doing = { asking: "needs your answer", working: "working", idle: "idle" }[s.activity] || s.state;
  const who = mine ? "yours" : `${cap(deviceName(s.startedBy))}'s`;
  const title = document.createElement("strong");
  title.textContent = `${label} · ${who}`;
  const detail = document.createElement("span");
  detail.textContent = `${doing}${s.state === "detached" ? " · detached" : ""} · ${ago(s.lastActivityMs)}`;
  b.append(title, " ", detail);
  b.dataset.session = s.id;
  b.onclick = () => (mine ? openAgent(knownAgent(x.ticket) || { ticket: x.ticket }) : joinFromList(x));
  li.append(b);
  return li;
}

/// Asks each host (through its first agent) for its agents and sessions in
/// one round trip each, all at once: each host's line changes when its own
/// answer comes, so a host that is off delays nobody.
function probeHosts(hosts) {
  if (!state.client || document.visibilityState === "hidden") return;
  const now = Date.now();
  for (const h of hosts) {
    const asked = hostAsked.get(h.key);
    if (asked && (asked.out || now - asked.at < HOST_REFRESH_MS)) continue;
    hostAsked.set(h.key, { at: now, out: true });
    const timeout = new Promise((_, reject) => setTimeout(() => reject(new Error("no answer")), HOST_PROBE_MS));
    Promise.race([state.client.hostSessions(h.agents[0].ticket, "acp", HOST_PROBE_MS), timeout]).then(
      (listing) => {
        const agents = (listing.agents || []).filter((a) => a && a.protocol === "acp");
        // The host's agents as it serves them now (one added since the scan, a label changed).
        if (agents.length && !h.key.startsWith("agent:")) knowAgents(agents, { key: h.key, name: listing.host || h.name });
        hostListed.set(h.key, { sessions: listing.sessions, messages: listing.messages || null, tickets: new Map(agents.map((a) => [a.name, knownTicket(a.ticket)])) });
        // Its verbs are the device's at every agent of the host that admits it.
        noteScope(h.agents.map((a) => a.ticket), listing.scope);
        const live = listing.sessions.filter((x) => x.state !== "warm").length;
        return `reachable · ${live === 0 ? "no session" : live === 1 ? "1 session" : `${live} sessions`}`;
      },
      () => "unreachable",
    ).then((said) => {
      hostAsked.set(h.key, { at: Date.now(), out: false });
      hostStates.set(h.key, said);
      renderAgents();
    });
  }
}

setInterval(() => probeHosts(hostsOf(knownAgents())), HOST_REFRESH_MS);

/// The name of the agent shown: the one its host gave it (a manifest's
/// label: two manifests of one program are told apart), else the one the
/// agent gives itself.
function agentLabel(fallback = "agent") {
  const ticket = state.ticket || $("ticket").value.trim();
  const known = ticket && knownAgent(ticket);
  return (known && known.named && known.label) || state.label || (known && known.label) || fallback;
}

/// The header names the agent of the conversation shown.
function renderTitle() {
  $("agent-name").textContent = agentLabel("thunderbolt");
}

/// One tap: the agent's session taken back, or a new one. Another agent's
/// live session is left to the bridge to resume later (the page reloads; a
/// reload never ends a session).
function openAgent(a) {
  if (state.conn && state.ticket === a.ticket) {
    // Its session is the one shown: go to the prompt box.
    $("prompt").scrollIntoView({ block: "end" });
    $("prompt").focus();
    return;
  }
  if (state.conn) {
    save();
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

/// Sends a request of ours; `onId` is told its id before it goes.
function request(method, params, onId) {
  const id = state.nextId++;
  const msg = { jsonrpc: "2.0", id, method, params };
  if (onId) onId(id);
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
  conversation.question({ id: req.id, method: req.method, params: req.params || {} });
  applyFocus();
}

/// The person's answer to one of the agent's questions: the card becomes a
/// line saying what was answered, and the notices about it are withdrawn.
async function answer(q, result, said) {
  if (!state.conn) {
    // Never dropped without a word: the question stays, and says why it waits.
    setStatus(window.busyElsewhere ? "this session is open in another tab of this browser: answer there" : "not connected: the question can be answered once the session is back", "warn");
    return;
  }
  conversation.settle(q.id, "answered", said, "you");
  save();
  try {
    await respond(q.id, result);
  } catch (err) {
    conversation.settle(q.id, "inert", `your answer was not sent: ${describe(err)}`);
  }
  withdrawNotices((d) => d.event === "needs_answer" && (d.request === undefined || d.request === key(q.id)));
}

/// A name for a device the bridge told about ({node, name}).
function deviceName(d) {
  if (!d || (!d.node && (!d.name || d.name === "nobody"))) return "nobody";
  if (state.client && d.node === state.client.nodeId()) return "another tab of this browser";
  return d.name || `device ${d.node.slice(0, 8)}`;
}

function controllerName() {
  return deviceName(state.controller);
}

const cap = (s) => s.charAt(0).toUpperCase() + s.slice(1);

/// Returns whether the message must be kept at once (else: within 250 ms).
function onMessage(value) {
  log("←", value);
  if (value.method !== undefined && value.id !== undefined) {
    agentRequest(value);
    return true;
  }
  switch (value.method) {
    case "session/update":
      onUpdate((value.params && value.params.update) || {});
      return false;
    case "_thunderbolt/restored": onRestored(value.params || {}); return true;
    case "_thunderbolt/role": onRole(value.params || {}); return true;
    case "_thunderbolt/answered": onAnswered(value.params || {}); return true;
    case "_thunderbolt/missed": onMissed(value.params || {}); return true;
    case "_thunderbolt/prompted": onPrompted(value.params || {}); return true;
    case "_thunderbolt/turn_ended": onTurnEnded(value.params || {}); return true;
    case "_thunderbolt/joined": onJoined(value.params || {}); return true;
    case "_thunderbolt/left": refreshGuests(); return true;
    default: break;
  }
  if (value.id !== undefined && state.pending.has(value.id)) {
    const p = state.pending.get(value.id);
    state.pending.delete(value.id);
    value.error ? p.reject(Object.assign(new Error(value.error.message), { rpc: value.error })) : p.resolve(value.result);
  } else if (value.id !== undefined && (conversation.turnOf(value.id) || (value.result && value.result.stopReason))) {
    // The answer to a prompt sent before a reload (or from a tab now closed).
    if (value.result && value.result.stopReason) conversation.endTurn(value.id, value.result.stopReason);
    else if (value.error) promptFailed(value.id, Object.assign(new Error(value.error.message), { rpc: value.error }));
    if (key(state.turn) === key(value.id)) state.turn = null;
    renderComposer();
  }
  return true;
}

/// This device's role changed, or the bridge said it again (a join, a
/// resume): the banner, the prompt box, and a line when it changed.
function onRole(p) {
  const before = state.role && `${state.role} ${state.controller && state.controller.node}`;
  const was = state.role;
  state.role = p.role === "controller" ? "controller" : "observer";
  state.joinedFrom = null;
  // Whether this device controlled the session before ("in control again").
  state.hadControl = Boolean(state.hadControl || was === "controller");
  state.controller = p.controller || null;
  state.askedRole = null;
  if (state.role === "observer") state.tookFrom = null;
  if (before !== `${state.role} ${state.controller && state.controller.node}`) {
    if (state.role === "controller") {
      conversation.note(was === "observer" && state.hadControl ? "You are in control again: your prompts go to the agent" : was === "observer" ? "You are in control: your prompts go to the agent" : "You are in control of this session");
    } else {
      const who = controllerName();
      conversation.note(who === "nobody" ? "Nobody is in control of this session: take control to send" : `${cap(who)} is in control: this device watches`, "warn");
    }
  }
  renderRole();
  renderComposer();
}

/// Another device answered one of the agent's questions first.
function onAnswered(p) {
  const q = conversation.answeredElsewhere(p.id, deviceName(p.by));
  if (q) withdrawNotices((d) => d.event === "needs_answer" && d.request === key(p.id));
}

/// Another device sent the agent a prompt: its turn, with what it asked.
function onPrompted(p) {
  const said = Array.isArray(p.prompt) ? p.prompt.map((c) => (c && c.type === "text" ? c.text : `[${(c && c.type) || "content"}]`)).join("\n") : "";
  conversation.otherTurn(cap(deviceName(p.by)), said || (p.truncated ? "(a long prompt, not shown here)" : ""), p.id);
}

/// The turn another device's prompt started is over.
function onTurnEnded(p) {
  const t = conversation.otherTurnOf(p.id);
  if (!t) return;
  if (p.stopReason) conversation.endTurn(undefined, p.stopReason, t);
  else conversation.failTurn(undefined, `the agent answered ${deviceName(p.by)} with an error: ${p.error || "unknown"}`, "warn", t);
  renderComposer();
}

/// This device fell behind the session while away, and was not kept what it missed.
function onMissed(p) {
  const n = Number(p.frames) || 0;
  const bytes = Number(p.bytes) || 0;
  const size = bytes >= 1 << 20 ? `${(bytes / (1 << 20)).toFixed(1)} MB` : `${Math.max(1, Math.round(bytes / 1024))} KB`;
  conversation.note(`This device missed ${n} of the agent's message${n === 1 ? "" : "s"} (${size}) while it was away; what follows is the session as it goes on`, "warn");
}

/// The workstation's bridge restarted under the session and took it back
/// (docs/protocol.md, "Sessions that survive a restart of the bridge"): the
/// old agent's questions cannot be answered any more, and the prompts it was
/// working on are offered again.
function onRestored(p) {
  window.restored = p;
  conversation.inertAll("the host restarted");
  for (const id of p.aborted || []) abortedTurn(id);
  if (p.failed) {
    // The bridge's reason may say "host restarted" itself: said once.
    const why = String(p.failed).replace(/^host restarted: /, "");
    setStatus(`host restarted: ${why}`, "error");
    conversation.note(`The host restarted and could not take the session back: ${why}`, "error");
    state.restoreFailed = why;
    return;
  }
  const how = (p.sessions || []).map((s) => `${s.how}${s.error ? ` (${s.error})` : ""}`).join(", ");
  setStatus(`host restarted, session restored${how ? ` (${how})` : ""} · ${state.agent} · session ${state.sessionId}`, "ok");
  conversation.note("The host restarted and took the session back");
  renderComposer();
}

/// A turn of ours the host's restart cut short: its prompt goes back into the box.
function abortedTurn(id) {
  const t = conversation.turnOf(id);
  if (key(state.turn) === key(id)) state.turn = null;
  if (!t || t.aborted) return;
  t.aborted = true;
  conversation.failTurn(id, "not finished: the host restarted (your prompt is back in the box: Send again)", "warn");
  if (!$("prompt").value.trim()) $("prompt").value = t.prompt.text;
  state.sendAgain = true;
  renderComposer();
}

/// Our prompt got an error instead of an end of turn.
function promptFailed(id, err) {
  if (err.rpc && err.rpc.message === TURN_ABORTED) return abortedTurn(id);
  const t = conversation.turnOf(id);
  if (err.rpc && err.rpc.code === OBSERVER_REFUSED) {
    conversation.failTurn(id, `not sent: ${controllerName()} is in control; take control to send it`, "warn");
    if (t && !$("prompt").value.trim()) $("prompt").value = t.prompt.text;
  } else if (err.rpc) {
    conversation.failTurn(id, `the agent answered with an error: ${err.rpc.message}`);
  } else if (!state.userClosed) {
    conversation.failTurn(id, describe(err));
  }
}

function onUpdate(u) {
  switch (u.sessionUpdate) {
    case "agent_message_chunk":
      if (u.content && u.content.type === "text") conversation.agentText(u.content.text);
      if (u.content && u.content.type === "resource_link" && /^file:\/\//.test(u.content.uri || "")) conversation.agentFile(u.content);
      break;
    case "tool_call":
    case "tool_call_update":
      conversation.tool(u);
      break;
    case "plan":
      conversation.plan(u.entries);
      break;
    default:
      break;
  }
}

// ---- what the page shows around the conversation ----

/// Who controls a shared session, and the one button that changes it.
function renderRole() {
  const box = $("role");
  box.hidden = !state.conn || !state.role;
  if (box.hidden) return;
  const observing = state.role === "observer";
  box.className = observing ? "observer" : "controller";
  $("role-text").textContent = observing ? `${cap(controllerName())} is in control` : "You are in control";
  const take = $("take-control");
  const watch = $("watch-only");
  // A device that may not prompt cannot take control: no button for it.
  take.hidden = !observing || !may("prompt");
  watch.hidden = observing;
  const asking = state.askedRole !== null;
  take.disabled = asking;
  watch.disabled = asking;
  take.textContent = asking && observing ? "Taking control…" : "Take control";
  // Stepping down hands control back to the device it was taken from while
  // that one is attached (the bridge decides; it says who controls then).
  watch.textContent = state.tookFrom ? `Give back to ${cap(state.tookFrom)}` : "Watch only";
}

/// The prompt box while a session is live (Send, or Cancel while a turn of
/// ours is going; no Send while another device controls the session), the
/// Connect button while none is.
function renderComposer() {
  const live = !!state.conn;
  $("composer").hidden = !live;
  const ticket = $("ticket").value.trim();
  // Settings' Connect: while a session is live, only for another bridge's ticket.
  $("connect").hidden = (live && ticket === state.ticket) || !may("start", ticket);
  $("start").hidden = live || state.connecting || !ticket || window.busyElsewhere || !localStorage.getItem(CONNECTED_KEY) || !may("start", ticket);
  if (!$("start").hidden) {
    const known = knownAgent(ticket);
    const label = (known && known.label) || "the agent";
    $("new-session").textContent = loadSession(ticket) ? `Resume the session with ${label}` : `New session with ${label}`;
  }
  $("disconnect").hidden = !live;
  $("disconnect").disabled = !live;
  // A session this device controls (or has alone) can be shown to someone else.
  $("share").hidden = !live || state.role === "observer";
  renderGuest();
  renderGuests();
  $("notify").hidden = !live;
  $("notify-off").hidden = !live;
  // A new identity would pull the client from under a live session.
  $("new-identity").hidden = live;
  const turning = state.turn !== null;
  const send = $("send");
  const prompts = may("prompt");
  $("prompt").hidden = !prompts;
  send.hidden = state.role === "observer" || turning || !prompts;
  const attached = state.attachments.some((a) => a.receipt);
  send.disabled = !live || turning || uploading() || (!$("prompt").value.trim() && !attached);
  // Files go to the workstation of the session's agent, as the one who prompts.
  $("attach").hidden = state.role === "observer" || !prompts || !may("files");
  send.textContent = state.sendAgain ? "Send again" : "Send";
  $("cancel").hidden = !turning;
  $("cancel").disabled = !live || !turning;
  $("prompt").placeholder = state.role === "observer" ? `${cap(controllerName())} is in control: take control to send` : `Message ${agentLabel("the agent")}…`;
}

/// A notice's request: shown (scrolled to, its first button focused), and
/// answered when the notice's action said so (Allow / Deny).
function applyFocus() {
  const f = state.focus;
  if (!f || !state.conn) return;
  const r = conversation.openQuestions().find((x) => (f.request ? key(x.id) === f.request : !f.method || x.method === f.method));
  if (!r) return;
  state.focus = null;
  const card = [...$("conversation").querySelectorAll(".request")].find((c) => c.dataset.request === key(r.id));
  if (card) {
    card.scrollIntoView({ block: "center" });
    const b = card.querySelector("button");
    if (b) b.focus();
  }
  if (f.answer && r.method === "session/request_permission") {
    const kinds = f.answer === "allow" ? ["allow_once", "allow_always"] : ["reject_once", "reject_always"];
    const opts = r.params.options || [];
    const o = kinds.map((k) => opts.find((x) => x.kind === k)).find(Boolean);
    if (o) answer(r, { outcome: { outcome: "selected", optionId: o.optionId } }, `you answered: ${o.name}`);
  }
}

// ---- the session ----

async function pump(conn) {
  const reader = conn.messages().getReader();
  let ending = ["", ""];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      if (onMessage(value)) save();
      else saveSoon();
    }
    ending = [state.leftFor ? `you left it for ${state.leftFor}` : state.userClosed ? "disconnected: you closed the session" : "the agent finished and ended the session", ""];
  } catch (err) {
    for (const p of state.pending.values()) p.reject(err);
    state.pending.clear();
    if (state.leftFor) {
      ending = [`you left it for ${state.leftFor}`, ""];
    } else if (state.userClosed) {
      ending = ["disconnected: you closed the session", ""];
    } else {
      ending = [describe(err), "error"];
      lastError(err);
    }
  } finally {
    if (state.conn === conn) state.conn = null;
    setStatus(...ending);
    // A restart that could not take the session back was said already (onRestored).
    const said = state.restoreFailed ? "start a new session to go on" : ending[0].replace(/^disconnected: /, "");
    state.restoreFailed = null;
    conversation.note(`Session over: ${said}`, ending[1]);
    sessionEnded();
  }
}

/// The session is over: nothing it asked can be answered any more.
function sessionEnded() {
  forget();
  conversation.inertAll("the session ended");
  conversation.closeTurns("the session ended before the turn did");
  Object.assign(state, { turn: null, role: null, controller: null, askedRole: null, sendAgain: false });
  save();
  withdrawNotices(() => true);
  if (state.release) state.release();
  state.release = null;
  $("connect").disabled = false;
  renderRole();
  renderComposer();
  renderAgents();
}

/// Connects (or, with `saved`, takes back the session a closed tab or a
/// reload left). `release`: this tab's lock on it, when already taken.
async function connect(saved = null, release = null) {
  const ticket = $("ticket").value.trim();
  if (!ticket) {
    $("settings").open = true;
    $("ticket").focus();
    return setStatus("paste the bridge's ticket in Settings first, or open a pairing link", "error");
  }
  if (state.conn || state.connecting) return;
  state.connecting = true;
  try {
    await connectNow(ticket, saved, release);
  } finally {
    state.connecting = false;
    renderComposer();
  }
}

async function connectNow(ticket, saved, release, join = null) {
  $("connect").disabled = true;
  renderComposer();
  release = release || (await lockSession(ticket));
  if (!release) {
    $("connect").disabled = false;
    return busyElsewhere(ticket);
  }
  // The lock was waited for: what the other tab left is the newest state.
  if (saved) saved = loadSession(ticket) || saved;
  state.release = release;
  conversation.open(ticket, true);
  setStatus(saved ? "resuming the session…" : "connecting…");
  try {
    await ensureClient();
    localStorage.setItem(TICKET_KEY, ticket);
    const onEvent = (e) => {
      window.events = [...(window.events || []), e.type];
      if (e.type === "reconnecting") {
        window.lastLoss = e.detail;
        const restarting = e.detail === "bridge restarting: session kept";
        setStatus(`reconnecting… (${restarting ? "the host is restarting; it keeps the session" : "connection lost; the bridge keeps the session"})`, "warn");
      }
      if (e.type === "resumed") setStatus(`resumed · ${state.agent} · session ${state.sessionId}`, "ok");
    };
    state.userClosed = false;
    const idle = Number(param("idle")) || undefined; // ?idle=MS: notice a lost path sooner
    const conn = join
      ? await state.client.attach(ticket, join.id, { observe: true, history: "all", onEvent, idleTimeoutMs: idle })
      : await state.client.connectProtocol(ticket, "acp", undefined, undefined, { onEvent, session: saved && saved.state, idleTimeoutMs: idle });
    state.conn = conn;
    state.ticket = ticket;
    if (saved) {
      Object.assign(state, {
        sessionId: saved.sessionId, nextId: saved.nextId, agent: saved.agent, label: saved.label || saved.agent,
        bridgeSession: state.bridgeSession || saved.bridgeSession || null,
        turn: saved.turn ?? null, role: saved.role || null, controller: saved.controller || null, sendAgain: !!saved.sendAgain,
        images: !!saved.images,
      });
      restoreAttachments(saved.attachments || [], ticket);
      // A session kept by an older page: its questions were kept with it.
      for (const r of saved.requests || []) conversation.question(r);
    } else {
      Object.assign(state, { turn: null, role: null, controller: null, sendAgain: false, images: false, attachments: [] });
      renderAttachments();
    }
    // A session this page started (or takes back) was its own to control.
    state.hadControl = !join;
    if (join) {
      // Another device's session: it was set up there (no initialize, no
      // session/new); its history comes first, then this device watches.
      const known = knownAgent(ticket);
      const label = (known && known.label) || join.agent || "agent";
      Object.assign(state, { sessionId: join.acpSessions[0] || null, agent: join.agent || label, label });
      state.joinedFrom = cap(deviceName(join.startedBy));
      conversation.session(`${cap(deviceName(join.startedBy))}'s session with ${agentLabel()}, joined · ${new Date().toLocaleString([], { dateStyle: "medium", timeStyle: "short" })}`);
    }
    renderTitle();
    renderRole();
    renderComposer();
    state.pumping = pump(conn);
    if (join) {
      setStatus(`joined · ${state.agent} · session ${state.sessionId}`, "ok");
    } else if (saved) {
      setStatus(`resumed after the reload · ${state.agent} · session ${state.sessionId}`, "ok");
      window.resumedAfterReload = true;
    } else {
      const init = await request("initialize", {
        protocolVersion: 1,
        clientCapabilities: { elicitation: { form: {}, url: {} } },
        clientInfo: { name: "thunderbolt-phone-page", version: "1" },
      });
      const session = await request("session/new", { cwd: "/", mcpServers: [] });
      state.agent = init.agentInfo ? init.agentInfo.name : "agent";
      state.label = (init.agentInfo && (init.agentInfo.title || init.agentInfo.name)) || "agent";
      state.images = !!(init.agentCapabilities && init.agentCapabilities.promptCapabilities && init.agentCapabilities.promptCapabilities.image);
      state.sessionId = session.sessionId;
      conversation.session(`New session with ${agentLabel()} · ${new Date().toLocaleString([], { dateStyle: "medium", timeStyle: "short" })}`);
      setStatus(`connected · ${state.agent} · session ${state.sessionId}`, "ok");
    }
    save();
    rememberAgent();
    renderTitle();
    renderComposer();
    // Connected: the conversation comes first (and, after the first
    // connection, the settings sheet starts folded).
    localStorage.setItem(CONNECTED_KEY, "1");
    $("settings").open = false;
    applyFocus();
    renderOthers();
    // Already allowed: keep this browser's subscription registered with this bridge.
    if (typeof Notification !== "undefined" && Notification.permission === "granted") subscribe(false);
    else setNotify("not on: “notify me” asks the browser, then registers this browser with the bridge");
  } catch (err) {
    if (err.kind === "session_gone") {
      forget(ticket);
      conversation.inertAll("the session is gone");
      conversation.closeTurns("the session is gone");
      conversation.save();
    }
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
  const arrived = state.attachments.filter((a) => a.receipt);
  const files = arrived.map((a) => a.receipt);
  if (!state.conn || state.turn !== null || (!text.trim() && !files.length) || uploading()) return;
  $("prompt").value = "";
  state.attachments = [];
  renderAttachments();
  state.sendAgain = false;
  let id = null;
  // A file that did not arrive is never referenced: only receipts go in. A
  // small image goes inline to an agent that takes images (with where it is).
  const links = await Promise.all(arrived.map(async (a) => {
    const r = a.receipt;
    if (state.images && a.inline && /^image\//.test(r.mime || "")) return { type: "image", mimeType: r.mime, data: await base64(a.inline), uri: r.uri };
    return { type: "resource_link", uri: r.uri, name: r.name, size: r.size, ...(r.mime ? { mimeType: r.mime } : {}) };
  }));
  const prompt = [{ type: "text", text }, ...links];
  const reply = request("session/prompt", { sessionId: state.sessionId, prompt }, (assigned) => {
    id = assigned;
    state.turn = id;
    conversation.startTurn(text, id, files);
    renderComposer();
  });
  try {
    const res = await reply;
    conversation.endTurn(id, res.stopReason);
  } catch (err) {
    promptFailed(id, err);
  } finally {
    if (key(state.turn) === key(id)) state.turn = null;
    renderComposer();
    save();
  }
}

// ---- files: attached to the next prompt, or the agent's, opened in place ----

/// Largest file attached from the page (it is read into memory to be hashed
/// and sent; the client's own bound is the same).
const MAX_ATTACHMENT = 256 * 1024 * 1024;

function uploading() {
  return state.attachments.some((a) => a.status === "uploading");
}

/// An ACP session id that can name a files folder on the workstation (the
/// bridge's rule, files::store::is_session_id; it refuses any other).
const SESSION_FOLDER = /^[A-Za-z0-9-]{1,64}$/;

/// Largest image sent inline (base64 in the prompt, about 4/3 of its size)
/// to an agent that takes images; larger ones go as a resource_link.
const MAX_INLINE_IMAGE = 1024 * 1024;

/// Puts each picked file on the workstation, a progress bar each; the
/// prompt sent next carries the ones that arrived. Each is kept in
/// IndexedDB until it has: a reload puts it again from where it stopped.
async function attach(files) {
  for (const file of files) {
    const a = { id: crypto.randomUUID(), name: file.name, size: file.size, mime: file.type || undefined, status: "uploading", done: 0, total: file.size, receipt: null, error: null };
    state.attachments.push(a);
    renderAttachments();
    if (file.size > MAX_ATTACHMENT) {
      failed(a, `${file.name} is over the ${MAX_ATTACHMENT >> 20} MiB a page sends`);
      continue;
    }
    try {
      await keepUpload(a.id, { ticket: state.ticket, file });
    } catch {
      // Private windows may refuse: the file is sent, only not kept across a reload.
    }
    save();
    await upload(a, file);
  }
}

/// One attachment's put (first, or again after a reload: the bridge says
/// what it holds and only the rest is sent).
async function upload(a, file) {
  try {
    const bytes = new Uint8Array(await file.arrayBuffer());
    if (a.mime && a.mime.startsWith("image/") && bytes.length <= MAX_INLINE_IMAGE) a.inline = bytes;
    a.receipt = await state.client.putFile(state.ticket, bytes, a.name, {
      mime: a.mime,
      // The session's own folder on the workstation: the files go with the
      // session when it ends (unless the bridge runs with --keep-files).
      session: SESSION_FOLDER.test(state.sessionId || "") ? state.sessionId : undefined,
      onProgress: (done, total) => {
        a.done = done;
        a.total = total;
        renderAttachments();
      },
    });
    a.status = "ready";
    log("·", `${a.name} arrived on the workstation (${a.receipt.sent} bytes sent${a.receipt.resumedFrom ? `, resumed at ${a.receipt.resumedFrom}` : ""})`);
  } catch (err) {
    failed(a, (err && (err.reason || err.message)) || String(err));
    return;
  }
  dropUpload(a.id).catch(() => {});
  renderAttachments();
  save();
}

function failed(a, why) {
  a.status = "failed";
  a.error = why;
  dropUpload(a.id).catch(() => {});
  renderAttachments();
}

/// What a reload needs of the attachments: the ones that arrived (their
/// receipts) and the ones on the way (put again from IndexedDB).
function savedAttachments() {
  return state.attachments
    .filter((a) => a.status === "ready" || a.status === "uploading")
    .map(({ id, name, size, mime, status, receipt }) => ({ id, name, size, mime, status, receipt }));
}

/// After a reload: the arrived ones wait for the next prompt as before, the
/// ones on the way are put again; kept files nothing refers to are dropped.
async function restoreAttachments(saved, ticket) {
  state.attachments = saved.map((a) => ({ ...a, done: 0, total: a.size, error: null }));
  renderAttachments();
  const ids = new Set(saved.map((a) => a.id));
  const kept = new Map();
  for (const id of await keptUploads().catch(() => [])) {
    const record = await keptUpload(id).catch(() => null);
    if (ids.has(id)) kept.set(id, record);
    else if (!record || record.ticket === ticket) dropUpload(id).catch(() => {});
  }
  for (const a of state.attachments.filter((x) => x.status === "uploading")) {
    const record = kept.get(a.id);
    if (!record || !record.file) failed(a, "not kept across the reload: attach it again");
    else await upload(a, record.file);
  }
}

/// Base64 of `bytes` (the browser's own encoder, through a data: URL).
function base64(bytes) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(String(r.result).slice(String(r.result).indexOf(",") + 1));
    r.onerror = () => reject(r.error);
    r.readAsDataURL(new Blob([bytes]));
  });
}

function renderAttachments() {
  const list = $("attachments");
  list.replaceChildren(
    ...state.attachments.map((a) => {
      const li = el("li", { className: a.status }, a.name);
      if (a.status === "uploading") li.append(el("progress", { max: a.total || 1, value: a.done, ariaLabel: `Uploading ${a.name}` }));
      if (a.status === "ready") li.append(` · ${size(a.size)} ✓`);
      if (a.status === "failed") li.append(` · not sent: ${a.error}`);
      const remove = el("button", { type: "button", ariaLabel: `Remove ${a.name}` }, "×");
      remove.disabled = a.status === "uploading";
      remove.onclick = () => {
        state.attachments = state.attachments.filter((x) => x !== a);
        dropUpload(a.id).catch(() => {});
        renderAttachments();
        save();
      };
      li.append(remove);
      return li;
    }),
  );
  list.hidden = !state.attachments.length;
  renderComposer();
}

/// Fetches a file the agent named and shows it: an image inline, text in a
/// box, anything else as a download.
async function openFile(link, view, button) {
  button.disabled = true;
  button.textContent = `Opening ${link.name}…`;
  try {
    const f = await state.client.getFile(state.ticket, link.uri, {});
    const mime = link.mimeType || "";
    const blob = new Blob([f.bytes], { type: mime || "application/octet-stream" });
    const url = URL.createObjectURL(blob);
    let shown;
    if (mime.startsWith("image/")) shown = el("img", { src: url, alt: link.name });
    else if (mime.startsWith("text/") || /\.(md|txt|log|json|csv|diff|patch|rs|js|ts|py)$/i.test(link.name)) shown = el("pre", {}, new TextDecoder().decode(f.bytes.subarray(0, 256 * 1024)));
    else shown = el("a", { href: url, download: link.name }, `Save ${link.name} (${size(f.size)})`);
    view.replaceChildren(shown);
    button.hidden = true;
  } catch (err) {
    button.disabled = false;
    button.textContent = `Open ${link.name}`;
    view.replaceChildren(el("p", { className: "note error" }, `${link.name} could not be opened: ${(err && (err.reason || err.message)) || err}`));
  }
}

/// Cancels the prompt turn (ACP `session/cancel`): every question of it is
/// answered `cancelled` first, as ACP asks of the client.
async function cancelTurn() {
  if (!state.conn) return;
  for (const q of conversation.openQuestions()) {
    await answer(q, q.method === "session/request_permission" ? { outcome: { outcome: "cancelled" } } : { action: "cancel" }, "cancelled with the turn");
  }
  const msg = { jsonrpc: "2.0", method: "session/cancel", params: { sessionId: state.sessionId } };
  log("→", msg);
  await state.conn.send(msg);
}

/// Takes control of a shared session, or steps down (the bridge confirms with a role event).
function askRole(role) {
  if (!state.conn) return;
  try {
    if (role === "controller") {
      // Taken from another device: the bridge gives it back there when this one steps down.
      const from = state.role === "observer" ? controllerName() : null;
      state.tookFrom = from && from !== "nobody" ? from : null;
      state.conn.takeControl();
    } else state.conn.observe();
    state.askedRole = role;
  } catch (err) {
    setStatus(describe(err), "error");
  }
  renderRole();
}

/// The sessions of this agent that the owner's other devices started (the
/// laptop's, to pick up here), one Join button each; none: nothing shown.
async function renderOthers() {
  let box = $("others");
  if (!box) {
    box = document.createElement("nav");
    box.id = "others";
    box.setAttribute("aria-label", "sessions on your other devices");
    box.hidden = true;
    $("role").before(box);
  }
  const ticket = state.ticket;
  let list = [];
  try {
    list = ticket && state.client ? await state.client.sessions(ticket) : [];
  } catch {
    list = [];
  }
  if (ticket !== state.ticket) return;
  const me = state.client && state.client.nodeId();
  const others = list.filter((s) => s.startedBy.node !== me && !s.attached.some((a) => a.node === me) && s.state !== "warm");
  box.replaceChildren(...others.map((s) => {
    const who = cap(deviceName(s.startedBy));
    const li = document.createElement("p");
    li.className = "note";
    const b = document.createElement("button");
    b.textContent = "Join";
    b.setAttribute("aria-label", `Join ${who}'s session`);
    b.onclick = () => joinSession(s);
    li.append(`${who}'s session (${s.state}) `, b);
    return li;
  }));
  box.hidden = others.length === 0;
}

/// Leaves this page's own session and joins `s` (another device's), as an
/// observer with its history: Take control makes it this device's.
async function joinSession(s, ticket = state.ticket) {
  if (state.conn && ticket !== state.ticket) {
    // Another agent's: this page's own session there is left to resume
    // later (a reload never ends a session); the join goes on after it.
    save();
    sessionStorage.setItem(JOIN_KEY, JSON.stringify({ ticket, s }));
    localStorage.setItem(TICKET_KEY, ticket);
    location.hash = new URLSearchParams({ ticket, ...(knownAgent(ticket)?.relay ? { relay: knownAgent(ticket).relay } : {}) }).toString();
    location.reload();
    return;
  }
  $("ticket").value = ticket;
  if (state.conn) {
    state.userClosed = true;
    state.leftFor = `${cap(deviceName(s.startedBy))}'s session`;
    forget(ticket);
    state.conn.close();
    await state.pumping;
    state.leftFor = null;
  }
  if ($("others")) $("others").hidden = true;
  state.connecting = true;
  try {
    await connectNow(ticket, null, null, s);
  } finally {
    state.connecting = false;
    renderComposer();
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
  let res;
  try {
    await ensureClient();
    res = await state.client.pair(ticket, code, name, "acp");
    $("paired-as").textContent = `paired as “${res.name || name}”`;
    window.paired = res;
    if (Array.isArray(res.agents)) knowAgents(res.agents, res.host ? { name: res.host, key: nodeOf(ticket) || ticket } : null);
    if (!knownAgent(ticket)) {
      // A single agent's bridge names no agents: this one is known from now on.
      const list = knownAgents();
      list.unshift({ ticket, label: "the agent", named: false, relay: state.clientRelay, at: Date.now() });
      localStorage.setItem(AGENTS_KEY, JSON.stringify(list.slice(0, 20)));
    }
    noteScope([ticket, ...(res.agents || []).map((a) => a.ticket)], res.scope);
    noteGuest(ticket, res.session ? res : null);
  } catch (err) {
    setStatus(describe(err), "error");
    lastError(err);
    return;
  }
  if (res.session) {
    // A share's guest: it joins the one session it was given.
    localStorage.setItem(CONNECTED_KEY, "1");
    $("settings").open = false;
    // The listing says what the session is (its agent's sessions, who started it).
    const listed = await state.client.sessions(ticket).catch(() => []);
    const s = listed.find((x) => x.id === res.session)
      || { id: res.session, startedBy: { node: "", name: res.of || "the owner" }, acpSessions: [], state: "attached", attached: [] };
    await joinSession(s, ticket);
    return;
  }
  if (!may("start", ticket)) {
    // Nothing of its own to open: it joins what the owner's devices started.
    $("ticket").value = ticket;
    localStorage.setItem(TICKET_KEY, ticket);
    setStatus(`paired: this device may ${res.scope.filter((v) => v !== "observe").join(" and ") || "watch"} only. Pick a session from the list to join it.`);
    // Paired is set up: the settings fold away, as after a first connection.
    localStorage.setItem(CONNECTED_KEY, "1");
    $("settings").open = false;
    renderComposer();
    renderAgents();
    return;
  }
  await connect();
}

/// Whose session this device is a guest of, until when (a share), in a line
/// under the title: the one session it sees.
function renderGuest() {
  const g = guestOf();
  const el = $("guest");
  el.hidden = !g;
  if (!g) return;
  const until = g.until ? new Date(g.until) : null;
  const when = until && !Number.isNaN(until.getTime()) ? until.toLocaleString([], { dateStyle: "medium", timeStyle: "short" }) : "its end";
  el.textContent = `You are a guest of ${g.of ? `${cap(g.of)}'s` : "someone's"} session until ${when}: you see this session only.`;
}

// ---- guests on this session (shares) ----

/// A device joined this session: its seat names the session (`<id>.<n>`);
/// the list of guests is asked for again.
function onJoined(p) {
  if (typeof p.seat === "string") state.sessionOf = p.seat.replace(/\.\d+$/, "");
  refreshGuests();
}

/// The share's guests on this session now, from a listing.
async function refreshGuests() {
  let list = [];
  try {
    list = state.client && state.ticket && state.sessionOf ? await state.client.sessions(state.ticket) : [];
  } catch {
    list = [];
  }
  const s = list.find((x) => x.id === state.sessionOf);
  state.guests = s ? s.attached.filter((a) => a.guest) : [];
  renderGuests();
}

/// Who is on this session by a share (name, watching or driving, since),
/// each with End: the owner's page ends a share at once.
function renderGuests() {
  const ul = $("guests");
  const guests = state.conn && !guestOf() ? state.guests || [] : [];
  ul.replaceChildren(...guests.map((g) => {
    const li = document.createElement("li");
    const who = cap(deviceName(g));
    const what = g.scope && g.scope.includes("prompt") ? "driving" : "watching";
    const since = g.sinceMs ? ` · since ${new Date(g.sinceMs).toLocaleTimeString([], { timeStyle: "short" })}` : "";
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = "End";
    b.setAttribute("aria-label", `End ${who}'s share`);
    b.onclick = async () => {
      b.disabled = true;
      try {
        await request("_thunderbolt/kick", { seat: g.seat });
        state.guests = (state.guests || []).filter((x) => x.seat !== g.seat);
        renderGuests();
      } catch (err) {
        setStatus(`not ended: ${describe(err)}`, "error");
        b.disabled = false;
      }
    };
    li.append(`${who} · a guest, ${what}${since} `, b);
    return li;
  }));
  ul.hidden = guests.length === 0;
}

// ---- sharing ----

/// The share sheet: what the other person may do, and for how long.
function openShare() {
  const drive = $("share-drive");
  drive.disabled = !may("prompt") || !may("answer");
  if (drive.disabled) document.querySelector('input[name="share-how"][value="observe"]').checked = true;
  $("share-result").hidden = true;
  $("share-sheet").hidden = false;
  $("share-make").focus();
}

/// Asks the bridge for a one-time share of this session (never more than
/// this device holds) and shows its link.
async function makeShare() {
  const drive = document.querySelector('input[name="share-how"]:checked').value === "drive";
  $("share-make").disabled = true;
  try {
    const r = await request("_thunderbolt/share", { drive, forSecs: Number($("share-for").value) });
    const params = new URLSearchParams({ ticket: r.ticket, pair: r.code });
    const relay = knownAgent(state.ticket)?.relay || $("relay").value.trim();
    if (relay) params.set("relay", relay);
    const link = `${location.origin}${location.pathname}#${params.toString()}`;
    $("share-link").value = link;
    window.sharedLink = link;
    const until = new Date(r.untilMs).toLocaleTimeString([], { timeStyle: "short" });
    $("share-until").textContent = `${drive ? "Watch and drive" : "Watch only"}, until ${until}. It works once, for one device.`;
    $("share-link").parentElement.hidden = false;
    $("share-copy").hidden = false;
  } catch (err) {
    $("share-until").textContent = `Not shared: ${describe(err)}`;
    $("share-link").parentElement.hidden = true;
    $("share-copy").hidden = true;
  } finally {
    $("share-make").disabled = false;
    $("share-result").hidden = false;
  }
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
  if (!("serviceWorker" in navigator) || typeof PushManager === "undefined" || typeof Notification === "undefined") {
    const why = window.isSecureContext ? "this browser has no Web Push (on iOS: add the page to the home screen first)" : "notifications need the page over https (or on this device's own address)";
    return setNotify(why, "warn");
  }
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
  if (o.thread) return openThreadFromNotice(o);
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

/// A message's notice tapped: its thread shown, on the host of the agent it names.
function openThreadFromNotice(o) {
  const list = knownAgents();
  const a = (o.node && list.find((k) => nodeOf(k.ticket) === o.node)) || list[0];
  if (!a) return setStatus("that message's workstation is not in this browser any more: pair with it again", "warn");
  const h = hostsOf(list).find((x) => x.agents.includes(a));
  window.openedFromNotice = o;
  // A question's Allow / Deny tapped on the notice: given once the thread is there.
  messages.open(a.ticket, h.key, o.thread, h.name).then(() => {
    if (o.message && (o.answer === "allow" || o.answer === "deny")) messages.decide(o.message, o.answer);
  });
}

/// A message pushed while a page is open: the host is asked again for its
/// list, and a thread shown asks for what is new.
function newMessage(n) {
  if (messages.shows(n.thread)) messages.poll();
  const a = n.node && knownAgents().find((k) => nodeOf(k.ticket) === n.node);
  const h = a && hostsOf(knownAgents()).find((x) => x.agents.includes(a));
  if (h && !hostAsked.get(h.key)?.out) hostAsked.delete(h.key);
  probeHosts(hostsOf(knownAgents()));
}

function defaultDeviceName() {
  const ua = navigator.userAgent;
  const browser = /Firefox\//.test(ua) ? "Firefox" : /Edg\//.test(ua) ? "Edge" : /Chrom/.test(ua) ? "Chrome" : /Safari\//.test(ua) ? "Safari" : "Browser";
  const os = /Android/.test(ua) ? "Android" : /iPhone|iPad/.test(ua) ? "iOS" : /Mac/.test(ua) ? "macOS" : /Windows/.test(ua) ? "Windows" : /Linux/.test(ua) ? "Linux" : "";
  return os ? `${browser} on ${os}` : browser;
}

/// What a person may paste into the ticket field besides a ticket or a
/// NodeId: a pairing link (`…#ticket=…&pair=…&relay=…`, or `?ticket=`), or the
/// line `iroh pair` prints for a CLI (`thunderbolt acp connect --pair CODE
/// TICKET`). `{ticket, code?, relay?}`, or null for anything else.
function pastedPairing(text) {
  // A code alone (32 hex digits, as `iroh pair` prints it): it pairs with
  // the workstation this page used last; it does not say which one.
  if (/^[0-9a-f]{32}$/i.test(text)) {
    const ticket = state.ticket || localStorage.getItem(TICKET_KEY);
    if (!ticket) return { error: "a code alone does not say which workstation: paste the whole link or line `thunderbolt iroh pair` printed, or scan its QR code" };
    return { ticket, code: text.toLowerCase(), relay: null };
  }
  if (/^https?:\/\//i.test(text)) {
    try {
      const u = new URL(text);
      const f = new URLSearchParams(u.hash.slice(1));
      const get = (k) => f.get(k) || u.searchParams.get(k);
      if (get("ticket")) return { ticket: get("ticket"), code: get("pair"), relay: get("relay") };
    } catch {}
    return null;
  }
  const words = text.split(/\s+/);
  const ticket = words.find((w) => /^endpoint[a-z0-9]{20,}$/.test(w));
  const at = words.indexOf("--pair");
  if (ticket && words.length > 1) return { ticket, code: at >= 0 ? words[at + 1] : null, relay: null };
  return null;
}

$("connect").onclick = () => {
  const pasted = pastedPairing($("ticket").value.trim());
  if (pasted && pasted.error) return setStatus(pasted.error, "error");
  if (pasted) {
    $("ticket").value = pasted.ticket;
    if (pasted.relay) $("relay").value = pasted.relay;
    if (pasted.code && !state.conn) return pairAndConnect(pasted.ticket, pasted.code);
  }
  const ticket = $("ticket").value.trim();
  // Another bridge while a session is live: this one is left to resume later.
  if (state.conn && ticket && ticket !== state.ticket) return openAgent({ ticket, relay: $("relay").value.trim() });
  connect(loadSession(ticket));
};
$("ticket").oninput = renderComposer;
$("new-session").onclick = () => connect(loadSession($("ticket").value.trim()));
$("close-settings").onclick = () => {
  $("settings").open = false;
  $("settings").scrollIntoView({ block: "nearest" });
};
$("composer").onsubmit = (e) => {
  e.preventDefault();
  send();
};
$("prompt").oninput = renderComposer;
$("prompt").onkeydown = (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
    e.preventDefault();
    send();
  }
};
$("cancel").onclick = cancelTurn;
$("attach").onclick = () => $("attach-input").click();
$("attach-input").onchange = () => {
  const files = [...$("attach-input").files];
  $("attach-input").value = "";
  attach(files);
};
$("list-toggle").onclick = () => {
  state.listOpen = !state.listOpen;
  renderAgents();
};
$("disconnect").onclick = disconnect;
$("share").onclick = openShare;
$("share-make").onclick = makeShare;
$("share-close").onclick = () => ($("share-sheet").hidden = true);
$("share-copy").onclick = async () => {
  try {
    await navigator.clipboard.writeText($("share-link").value);
    $("share-copy").textContent = "Copied";
  } catch {
    // No clipboard (an http page, a denied permission): the link is selected to copy by hand.
    $("share-link").select();
  }
};
$("take-control").onclick = () => askRole("controller");
$("watch-only").onclick = () => askRole("observer");
$("notify").onclick = () => subscribe(true);
$("notify-off").onclick = unsubscribe;
if ("serviceWorker" in navigator) {
  navigator.serviceWorker.addEventListener("message", (e) => {
    const m = e.data || {};
    if (m.type === "thunderbolt-notice") {
      showNotice(m.notice);
      // A message: the list says so now (and a thread shown takes it in).
      if (m.notice && m.notice.event === "message") newMessage(m.notice);
    }
    if (m.type === "thunderbolt-notice-done") window.noticesDone = [...(window.noticesDone || []), m.shown];
    // The service worker shows no notice while this page is visible and attached to its session.
    if (m.type === "thunderbolt-attached?" && e.ports[0]) {
      const n = m.notice || {};
      const shown = n.event === "message" ? messages.shows(n.thread) : !!state.conn && document.visibilityState === "visible" && noticeIsOurs(n);
      e.ports[0].postMessage({ attached: shown });
    }
    if (m.type === "thunderbolt-open") openFromNotice(m.open || {});
  });
  navigator.serviceWorker.startMessages();
  // Registered on every visit: the notices' taps and actions need it even
  // before “notify me” (a subscription made elsewhere, or a reinstall).
  registerWorker().catch((e) => log("·", `service worker: ${e.message}`));
}
$("copy-allow").onclick = async () => {
  try {
    await navigator.clipboard.writeText($("allow-cmd").textContent);
    $("copy-allow").textContent = "copied";
  } catch {
    // No clipboard here (plain http, or refused): select it for a long press.
    getSelection().selectAllChildren($("allow-cmd"));
    $("copy-allow").textContent = "selected: copy it";
  }
};
$("new-identity").onclick = async () => {
  localStorage.removeItem(SECRET_KEY);
  if (state.client) await state.client.shutdown();
  state.client = null;
  await ensureClient();
};
// Kept when the tab goes away (a streamed chunk's save may be waiting).
addEventListener("pagehide", save);
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "hidden") save();
});

// The settings sheet is open on the first visit, until the first connection.
$("settings").open = !localStorage.getItem(CONNECTED_KEY);
if ($("settings").open) setStatus("not connected yet: pair this browser with your workstation (below)");

// A pairing link carries `ticket`, `pair` (and, for a self-hosted relay, `relay`)
// in its #fragment, which no server sees; `?ticket=&relay=` work too. A
// notice's tap opens `#open=1&notice=…&node=…&request=…&method=…&answer=…`.
const params = new URLSearchParams(location.search);
const frag = new URLSearchParams(location.hash.slice(1));
const param = (k) => frag.get(k) || params.get(k);
const opened = frag.get("open") ? Object.fromEntries(frag) : null;
// Loaded from a thunderbolt-relay (it answers ../relay.json, beside www/): that relay is the default.
const ownRelay = () => fetch("../relay.json").then((r) => (r.ok ? r.json() : {})).then((j) => (j.thunderbolt_relay === true ? location.origin : ""), () => "");
$("relay").value = param("relay") ?? localStorage.getItem(RELAY_KEY) ?? await ownRelay();
$("ticket").value = param("ticket") || localStorage.getItem(TICKET_KEY) || "";
$("device-name").value = defaultDeviceName();
const code = frag.get("pair");
// The code is spent by this visit, a notice's answer is given once: a reload must not repeat either.
if (code || opened || frag.get("ticket")) history.replaceState(null, "", location.pathname + location.search);
// For scripts and tests: the module's API and the page's state.
window.thunderbolt = { IrohClient, state, describe, showNotice, request, nodeOf, conversation, messages };
// The last conversation with this ticket's agent, shown before the client
// module has loaded, and until a session is live.
conversation.open($("ticket").value.trim());
renderAgents();
renderTitle();
renderComposer();
await init();
await ensureClient();
window.ready = true;
const saved = loadSession($("ticket").value.trim());
const joining = JSON.parse(sessionStorage.getItem(JOIN_KEY) || "null");
sessionStorage.removeItem(JOIN_KEY);
if (joining && joining.s && joining.ticket === $("ticket").value.trim()) joinSession(joining.s, joining.ticket);
else if (code && $("ticket").value) pairAndConnect($("ticket").value.trim(), code);
else if (opened) openFromNotice(opened);
else if (saved || frag.get("open-agent")) connect(saved);
