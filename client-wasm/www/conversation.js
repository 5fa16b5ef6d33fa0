// The conversation with one agent, as this device shows and keeps it: your
// prompts, the agent's replies, its tool calls and plan, each question and what
// became of it (answered here, answered on another device, left unanswered by
// a restart), and what happened to the session (who controls it, what this
// device missed). One per agent (its ticket), across its sessions, each
// session marked where it starts.
//
// Built block by block: a new message appends one element, a streamed chunk
// extends one, a question answered replaces one; nothing already shown is
// drawn again. Kept on the device in localStorage, bounded: the newest
// KEEP_BLOCKS blocks and at most KEEP_BYTES of JSON per agent (the oldest go
// first), each reply or tool output kept to its first KEEP_TEXT characters.
//
// Blocks: {k: "turn", n, prompt: {text, id} | null, from, items, reply, stop,
// end, endKind, open}; {k: "note", n, text, kind}; {k: "session", n, text}.
// A turn's items, in the order they came: {k: "tools", calls: {id: call}},
// {k: "plan", entries}, {k: "q", id, method, params, state: "open" |
// "answered" | "inert", outcome}.

import { renderInto } from "./markdown.js";

const PREFIX = "thunderbolt_iroh_conversation:";
export const KEEP_BLOCKS = 200;
export const KEEP_BYTES = 256 * 1024;
export const KEEP_TEXT = 32 * 1024;
/// Blocks kept on the page itself (the oldest leave the page past this).
const SHOW_BLOCKS = 1000;
/// Pixels from the end within which the reader counts as at the end (a new
/// message then scrolls into view): a line or two of slack.
const FOLLOW_SLACK = 160;

const key = (id) => JSON.stringify(id);

/// A size in bytes as a person reads it.
export function size(n) {
  if (!(n >= 0)) return "";
  if (n < 1000) return `${n} B`;
  if (n < 1e6) return `${(n / 1e3).toFixed(n < 1e4 ? 1 : 0)} kB`;
  return `${(n / 1e6).toFixed(n < 1e7 ? 1 : 0)} MB`;
}

export function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  Object.assign(e, props);
  e.append(...children.filter((c) => c !== null && c !== undefined && c !== false));
  return e;
}

/// A tool call's content as text: its text blocks, diffs (path and new text), terminals by id.
export function contentText(content) {
  const out = [];
  for (const c of content || []) {
    if (c.type === "content" && c.content) out.push(c.content.type === "text" ? c.content.text : `[${c.content.type}]`);
    else if (c.type === "diff") out.push(`${c.path}\n${c.newText ?? ""}`);
    else if (c.type === "terminal") out.push(`[terminal ${c.terminalId}]`);
  }
  return out.join("\n");
}

const cut = (s) => (typeof s === "string" && s.length > KEEP_TEXT ? `${s.slice(0, KEEP_TEXT)}… (cut: kept on this device to ${KEEP_TEXT} characters)` : s);

/// A block as it is stored: long texts cut.
function stored(b) {
  if (b.k !== "turn") return b;
  return {
    ...b,
    reply: cut(b.reply),
    items: b.items.map((i) => {
      if (i.k === "tools") {
        const calls = {};
        for (const [id, c] of Object.entries(i.calls)) calls[id] = { ...c, content: c.content && [{ type: "content", content: { type: "text", text: cut(contentText(c.content)) } }] };
        return { ...i, calls };
      }
      if (i.k === "q" && i.params && i.params.toolCall && i.params.toolCall.content) {
        const tc = i.params.toolCall;
        return { ...i, params: { ...i.params, toolCall: { ...tc, content: [{ type: "content", content: { type: "text", text: cut(contentText(tc.content)) } }] } } };
      }
      return i;
    }),
  };
}

export class Conversation {
  /// `root`: the element it lives in. `hooks`: {label() (the agent's name),
  /// controller() (who else prompts, when this device observes), answer(q,
  /// result) (a question answered here), log(text)}.
  constructor(root, hooks) {
    this.root = root;
    this.hooks = hooks;
    this.blocks = [];
    this.views = new Map(); // n → the block's elements
    this.storeKey = null;
    this.seq = 0;
    this.ids = {}; // "reply" | "tools" | "plan" → the element carrying that id
    this.toDraw = new Set(); // turns whose reply grew since it was last drawn
    // What carries the id `reply` while there is no turn (a hidden element of the page's, if any).
    this.noReply = document.getElementById("reply");
    this.ids.reply = this.noReply;
  }

  // ---- storage ----

  /// Shows the conversation kept for `ticket` (and keeps it there from now on).
  open(ticket, again = false) {
    const k = ticket ? PREFIX + ticket : null;
    if (k === this.storeKey && !again) return;
    this.storeKey = k;
    let blocks = [];
    try {
      blocks = (k && JSON.parse(localStorage.getItem(k) || "null")?.blocks) || [];
    } catch {
      blocks = [];
    }
    this.blocks = blocks;
    this.seq = blocks.reduce((m, b) => Math.max(m, b.n || 0), 0);
    this.views.clear();
    this.toDraw.clear(); // the replies of the conversation shown before are not drawn here
    this.root.replaceChildren(...blocks.map((b) => this.draw(b)));
    this.claimIds();
  }

  /// Draws the conversation shown again (what this device may do changed:
  /// its questions get or lose their buttons).
  redraw() {
    this.views.clear();
    this.root.replaceChildren(...this.blocks.map((b) => this.draw(b)));
  }

  /// Writes it to the device, bounded (KEEP_BLOCKS, KEEP_BYTES).
  save() {
    if (!this.storeKey) return;
    let blocks = this.blocks.slice(-KEEP_BLOCKS).map(stored);
    let text = JSON.stringify({ v: 1, blocks });
    while (text.length > KEEP_BYTES && blocks.length > 1) {
      blocks = blocks.slice(Math.ceil(blocks.length / 4));
      text = JSON.stringify({ v: 1, blocks });
    }
    try {
      localStorage.setItem(this.storeKey, text);
    } catch (e) {
      // Full: keep the newest half, else nothing of it.
      try {
        localStorage.setItem(this.storeKey, JSON.stringify({ v: 1, blocks: blocks.slice(Math.floor(blocks.length / 2)) }));
      } catch {
        this.hooks.log(`the conversation could not be kept on this device: ${(e && e.name) || "error"}`);
      }
    }
  }

  // ---- blocks ----

  push(b) {
    b.n = ++this.seq;
    this.blocks.push(b);
    const node = this.draw(b);
    this.root.append(node);
    while (this.blocks.length > SHOW_BLOCKS) {
      const old = this.blocks.shift();
      const v = this.views.get(old.n);
      if (v) v.root.remove();
      this.views.delete(old.n);
    }
    this.claimIds();
    return b;
  }

  /// The newest turn, when it is still going (notes may have come after it
  /// started; a new session ends it).
  current() {
    for (let i = this.blocks.length - 1; i >= 0; i--) {
      const b = this.blocks[i];
      if (b.k === "turn") return b.open ? b : null;
      if (b.k === "session") return null;
    }
    return null;
  }

  /// The turn the agent's output belongs to: the one going, else a new one
  /// (another device's prompt, seen while this device observes).
  turn() {
    return this.current() || this.push({ k: "turn", prompt: null, from: this.hooks.controller(), items: [], reply: "", stop: null, end: null, open: true });
  }

  /// Your prompt, sent as request `id`: a new turn.
  startTurn(text, id, files = []) {
    for (const b of this.blocks) if (b.k === "turn" && b.open && !b.prompt) b.open = false;
    return this.push({ k: "turn", prompt: { text, id, files }, from: null, items: [], reply: "", stop: null, end: null, open: true });
  }

  /// Another device's prompt (request `id` of device `from`; `text` what it
  /// asked, when the bridge told it): a new turn, shown as theirs.
  otherTurn(from, text, id) {
    for (const b of this.blocks) if (b.k === "turn" && b.open && !b.prompt) b.open = false;
    return this.push({ k: "turn", prompt: null, from, said: text, other: key(id), items: [], reply: "", stop: null, end: null, open: true });
  }

  /// The turn another device's prompt `id` started, still going.
  otherTurnOf(id) {
    for (let i = this.blocks.length - 1; i >= 0; i--) {
      const b = this.blocks[i];
      if (b.k === "session") return null;
      if (b.k === "turn" && b.other === key(id) && b.open) return b;
    }
    return null;
  }

  /// The turn of this session that prompt `id` started.
  turnOf(id) {
    for (let i = this.blocks.length - 1; i >= 0; i--) {
      const b = this.blocks[i];
      if (b.k === "session") return null;
      if (b.k === "turn" && b.prompt && key(b.prompt.id) === key(id)) return b;
    }
    return null;
  }

  note(text, kind = "") {
    return this.push({ k: "note", text, kind });
  }

  /// A new session starts: what the last one left open is over.
  session(text) {
    this.inertAll("the session ended");
    for (const b of this.blocks) if (b.k === "turn") b.open = false;
    return this.push({ k: "session", text });
  }

  // ---- what the agent sends ----

  /// A chunk of the agent's reply: the reply's Markdown drawn again once a
  /// frame at most (only its last blocks: markdown.js's renderInto), and at
  /// once when the turn ends.
  /// A file the agent named in its reply (a `resource_link`): a button that
  /// fetches it from the workstation and shows it in place.
  agentFile(link) {
    const t = this.turn();
    (t.files ||= []).push(link);
    const v = this.views.get(t.n);
    v.agent.hidden = false;
    v.agentFiles.append(this.drawAgentFile(link));
    v.agentFiles.hidden = false;
    this.follow();
  }

  drawAgentFile(link) {
    const view = el("div", { className: "file-view" });
    const open = el("button", { type: "button" }, `Open ${link.name}`);
    open.onclick = () => this.hooks.openFile(link, view, open);
    return el("li", {}, el("div", {}, open, view));
  }

  agentText(text) {
    const t = this.turn();
    t.reply += text;
    const v = this.views.get(t.n);
    v.agent.hidden = false;
    this.toDraw.add(t);
    if (this.toDraw.size === 1) requestAnimationFrame(() => this.drawReplies());
    this.follow();
  }

  /// Draws the replies that grew.
  drawReplies() {
    for (const t of this.toDraw) {
      const v = this.views.get(t.n);
      if (v) renderInto(v.reply, t.reply);
    }
    this.toDraw.clear();
  }

  tool(u) {
    const t = this.turn();
    let item = t.items.find((i) => i.k === "tools");
    if (!item) {
      item = { k: "tools", calls: {} };
      t.items.push(item);
    }
    const c = { ...(item.calls[u.toolCallId] || {}) };
    for (const f of ["title", "kind", "status", "content", "locations"]) if (u[f] !== undefined && u[f] !== null) c[f] = u[f];
    item.calls[u.toolCallId] = c;
    this.redrawItem(t, item);
  }

  plan(entries) {
    const t = this.turn();
    let item = t.items.find((i) => i.k === "plan");
    if (!item) {
      item = { k: "plan", entries: [] };
      t.items.push(item);
    }
    item.entries = entries || [];
    this.redrawItem(t, item);
  }

  /// A question of the agent's (shown once, whatever resends it).
  question(req) {
    if (this.find(req.id)) return;
    const t = this.turn();
    const item = { k: "q", id: req.id, method: req.method, params: req.params || {}, state: "open", outcome: "" };
    t.items.push(item);
    this.redrawItem(t, item);
  }

  /// The questions nobody answered yet, oldest first.
  openQuestions() {
    const out = [];
    for (const b of this.blocks) if (b.k === "turn") for (const i of b.items) if (i.k === "q" && i.state === "open") out.push(i);
    return out;
  }

  /// The question `id` of this session (an agent numbers its questions
  /// afresh in each session), with its turn.
  find(id) {
    for (let i = this.blocks.length - 1; i >= 0; i--) {
      const b = this.blocks[i];
      if (b.k === "session") return null;
      if (b.k !== "turn") continue;
      const q = b.items.find((x) => x.k === "q" && key(x.id) === key(id));
      if (q) return { turn: b, q };
    }
    return null;
  }

  /// What became of a question: answered here (`by` "you"), elsewhere, or never.
  settle(id, state, outcome, by = null) {
    const f = this.find(id);
    if (!f) return null;
    Object.assign(f.q, { state, outcome, by });
    this.redrawItem(f.turn, f.q);
    return f.q;
  }

  /// Another device answered first: a question still open becomes a line
  /// saying who; one this device answered too says its answer was not used.
  answeredElsewhere(id, who) {
    const f = this.find(id);
    if (!f) return null;
    const outcome = f.q.state === "answered" && f.q.by === "you"
      ? `${who} answered first: your answer (${f.q.outcome.replace(/^you answered: /, "")}) was not used`
      : `${who} answered`;
    Object.assign(f.q, { state: "answered", by: who, outcome });
    this.redrawItem(f.turn, f.q);
    return f.q;
  }

  /// Every question still open can no longer be answered (`why`).
  inertAll(why) {
    for (const b of this.blocks) {
      if (b.k !== "turn") continue;
      for (const q of b.items) {
        if (q.k === "q" && q.state === "open") {
          Object.assign(q, { state: "inert", outcome: `not answered: ${why}` });
          this.redrawItem(b, q);
        }
      }
    }
  }

  /// The turn of request `id` (or `turn`) ended (`stop`: the agent's stopReason).
  endTurn(id, stop, turn = null) {
    const t = turn || (id !== undefined && this.turnOf(id)) || this.current();
    if (!t) return;
    t.stop = stop;
    t.open = false;
    if (stop !== "end_turn") {
      t.end = { cancelled: "cancelled", max_tokens: "stopped: the agent reached its token limit", max_turn_requests: "stopped: too many requests in one turn", refusal: "the agent refused" }[stop] || `ended: ${stop}`;
      t.endKind = stop === "cancelled" ? "" : "warn";
    }
    this.redrawEnd(t);
  }

  /// The turn of request `id` (or `turn`) ended without an answer: `text` says why.
  failTurn(id, text, kind = "error", turn = null) {
    const t = turn || (id !== undefined && this.turnOf(id)) || this.current();
    if (!t) return null;
    Object.assign(t, { open: false, end: text, endKind: kind });
    if (!t.stop) t.stop = "error";
    this.redrawEnd(t);
    return t;
  }

  /// Ends every turn still going (the session is over).
  closeTurns(text) {
    for (const b of this.blocks) {
      if (b.k === "turn" && b.open) {
        Object.assign(b, { open: false, end: b.prompt ? text : b.end, endKind: "warn" });
        this.redrawEnd(b);
      }
    }
  }

  // ---- drawing ----

  draw(b) {
    let root;
    if (b.k === "note") root = el("p", { className: `note ${b.kind || ""}` }, b.text);
    else if (b.k === "session") root = el("div", { className: "divider" }, b.text);
    else return this.drawTurn(b);
    this.views.set(b.n, { root });
    return root;
  }

  drawTurn(b) {
    const v = { items: new Map() };
    v.root = el("article", { className: "turn" });
    if (b.prompt) {
      const you = el("div", { className: "bubble you" }, b.prompt.text);
      const files = b.prompt.files || [];
      if (files.length) you.append(el("ul", { className: "files", ariaLabel: "attached" }, ...files.map((f) => el("li", {}, `${f.name} · ${size(f.size)}`))));
      v.root.append(you);
    }
    else if (b.said) v.root.append(el("div", { className: "bubble other" }, el("div", { className: "who" }, b.from || "another device"), b.said));
    else v.root.append(el("div", { className: "bubble other" }, b.from ? `a prompt from ${b.from}` : "the agent, on its own"));
    v.activity = el("div", { className: "activity" });
    for (const i of b.items) {
      const e = this.drawItem(i);
      v.items.set(i, e);
      v.activity.append(e);
    }
    v.reply = el("div", { className: "msg md" });
    renderInto(v.reply, b.reply);
    if (b.stop) v.reply.dataset.stopReason = b.stop;
    v.agentFiles = el("ul", { className: "files" }, ...(b.files || []).map((f) => this.drawAgentFile(f)));
    v.agentFiles.hidden = !(b.files || []).length;
    v.agent = el("div", { className: "bubble agent" }, el("div", { className: "who" }, this.hooks.label()), v.reply, v.agentFiles);
    v.agent.hidden = !b.reply && v.agentFiles.hidden;
    v.end = el("div", { className: "turn-end" });
    v.root.append(v.activity, v.agent, v.end);
    this.views.set(b.n, v);
    this.fillEnd(b, v);
    return v.root;
  }

  /// The newest turn's reply, tool calls and plan carry the ids `reply`,
  /// `tools` and `plan` (what "the reply" means to a script).
  claimIds() {
    let t = null;
    for (let i = this.blocks.length - 1; i >= 0 && !t; i--) if (this.blocks[i].k === "turn") t = this.blocks[i];
    const v = t && this.views.get(t.n);
    const want = { reply: v ? v.reply : this.noReply, tools: null, plan: null };
    if (v) {
      for (const [item, e] of v.items) {
        if (item.k === "tools") want.tools = e;
        if (item.k === "plan") want.plan = e;
      }
    }
    for (const [id, e] of Object.entries(want)) {
      if (this.ids[id] && this.ids[id] !== e) this.ids[id].removeAttribute("id");
      if (e) e.id = id;
      this.ids[id] = e;
    }
  }

  redrawItem(t, item) {
    const v = this.views.get(t.n);
    if (!v) return;
    const e = this.drawItem(item);
    const old = v.items.get(item);
    if (old) old.replaceWith(e);
    else v.activity.append(e);
    v.items.set(item, e);
    this.claimIds();
    this.follow();
  }

  redrawEnd(t) {
    const v = this.views.get(t.n);
    if (!v) return;
    if (this.toDraw.has(t)) this.drawReplies();
    if (t.stop) v.reply.dataset.stopReason = t.stop;
    this.fillEnd(t, v);
  }

  fillEnd(b, v) {
    v.end.className = `turn-end ${b.endKind || ""}`;
    v.end.textContent = b.end || (b.open && b.prompt ? `${this.hooks.label()} is working…` : "");
    v.end.hidden = !v.end.textContent;
  }

  drawItem(i) {
    if (i.k === "tools") {
      return el("ul", { className: "tools", ariaLabel: "tool calls" }, ...Object.entries(i.calls).map(([id, t]) => el("li", { className: "tool" },
        `${t.title || id}`, " ", el("span", { className: "status" }, `(${[t.kind, t.status].filter(Boolean).join(", ")})`),
        contentText(t.content) ? el("pre", { className: "mono" }, contentText(t.content)) : null)));
    }
    if (i.k === "plan") {
      return el("ol", { className: "plan", ariaLabel: "plan" }, ...i.entries.map((e) => {
        const li = el("li", { className: "plan-entry" }, e.content, " ", el("span", { className: "status" }, `(${e.status}${e.priority ? `, ${e.priority}` : ""})`));
        li.dataset.status = e.status;
        return li;
      }));
    }
    if (i.state !== "open") return this.askedLine(i);
    return i.method === "session/request_permission" ? this.permissionCard(i) : this.elicitationCard(i);
  }

  /// A question no longer open: what it was, and what became of it.
  askedLine(q) {
    const what = q.method === "session/request_permission"
      ? (q.params.toolCall && q.params.toolCall.title) || "a permission"
      : q.params.message || "a question";
    const line = el("div", { className: `asked ${q.state}` }, el("span", { className: "what" }, what), " · ", el("span", { className: "outcome" }, q.outcome));
    line.dataset.request = key(q.id);
    return line;
  }

  permissionCard(r) {
    const tc = r.params.toolCall || {};
    const known = this.knownTool(tc.toolCallId);
    const title = tc.title || known.title || "the agent asks for permission";
    const kind = tc.kind || known.kind;
    const text = contentText(tc.content || known.content);
    const card = el("div", { className: "request" },
      el("h3", {}, title),
      el("div", { className: "kind" }, `${this.hooks.label()} asks permission${kind ? ` · ${kind}` : ""}`),
      text ? el("pre", {}, text) : null);
    card.dataset.request = key(r.id);
    card.dataset.method = r.method;
    if (!this.mayAnswer()) {
      card.append(el("p", { className: "note" }, this.hooks.noAnswer ? this.hooks.noAnswer() : "This device may not answer the agent."));
      return card;
    }
    const options = el("div", { className: "options" });
    for (const o of r.params.options || []) {
      const b = el("button", { type: "button", textContent: o.name, className: /^reject/.test(o.kind || "") ? "deny" : "primary" });
      b.dataset.optionId = o.optionId;
      b.onclick = () => this.hooks.answer(r, { outcome: { outcome: "selected", optionId: o.optionId } }, `you answered: ${o.name}`);
      options.append(b);
    }
    card.append(options);
    return card;
  }

  knownTool(id) {
    for (let i = this.blocks.length - 1; i >= 0; i--) {
      const b = this.blocks[i];
      if (b.k !== "turn") continue;
      const tools = b.items.find((x) => x.k === "tools");
      if (tools && tools.calls[id]) return tools.calls[id];
    }
    return {};
  }

  /// Whether this device may answer the agent (its scope): a card for one
  /// that may not says so instead of showing buttons the bridge would drop.
  mayAnswer() {
    return !this.hooks.mayAnswer || this.hooks.mayAnswer();
  }

  elicitationCard(r) {
    const p = r.params;
    const card = el("form", { className: "request" }, el("h3", {}, p.message || "the agent asks"),
      el("div", { className: "kind" }, `${this.hooks.label()} asks for input`));
    card.dataset.request = key(r.id);
    card.dataset.method = r.method;
    if (p.mode === "url") card.append(el("a", { href: p.url, target: "_blank", rel: "noopener", textContent: p.url }));
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
    if (!this.mayAnswer()) {
      card.append(el("p", { className: "note" }, this.hooks.noAnswer ? this.hooks.noAnswer() : "This device may not answer the agent."));
      return card;
    }
    const submit = el("button", { type: "submit", className: "primary", textContent: p.mode === "url" ? "Done" : "Submit" });
    const decline = el("button", { type: "button", className: "deny", textContent: "Decline" });
    decline.onclick = () => this.hooks.answer(r, { action: "decline" }, "you declined");
    card.append(el("div", { className: "options" }, submit, decline));
    card.onsubmit = (e) => {
      e.preventDefault();
      if (p.mode === "url") return this.hooks.answer(r, { action: "accept" }, "you answered: Done");
      const content = {};
      for (const [name, s, input] of fields) {
        if (s.type === "boolean") content[name] = input.checked;
        else if (input.value === "") continue;
        else if (s.type === "number") content[name] = Number(input.value);
        else if (s.type === "integer") content[name] = parseInt(input.value, 10);
        else if (s.type === "array") content[name] = input.value.split(",").map((v) => v.trim()).filter(Boolean);
        else content[name] = input.value;
      }
      const said = Object.entries(content).map(([k, v]) => `${k}: ${Array.isArray(v) ? v.join(", ") : v}`).join(", ");
      this.hooks.answer(r, { action: "accept", content }, `you answered${said ? `: ${said}` : ""}`);
    };
    return card;
  }

  /// Keeps the newest message in view while the reader is at the end.
  /// Where the reader is comes from scroll events (`watchScroll`), not from
  /// reading the layout here: that read, once per message, made each append
  /// lay out the whole transcript (0.5 ms a message at 200, 1.3 at 2000).
  follow() {
    if (this.atEnd === undefined) this.watchScroll();
    if (!this.atEnd || this.following) return;
    this.following = true;
    requestAnimationFrame(() => {
      this.following = false;
      const doc = document.scrollingElement || document.documentElement;
      doc.scrollTop = doc.scrollHeight;
    });
  }

  /// Keeps `atEnd` (the reader within FOLLOW_SLACK of the end) up to date.
  watchScroll() {
    const doc = document.scrollingElement || document.documentElement;
    const check = () => {
      this.atEnd = doc.scrollHeight - doc.scrollTop - window.innerHeight < FOLLOW_SLACK;
    };
    check();
    addEventListener("scroll", check, { passive: true });
    addEventListener("resize", check, { passive: true });
  }
}
