// Messages from your workstation (docs/browser.md, "Messages from your
// workstation"): what its agents and scripts sent you (`thunderbolt reach`,
// `thunderbolt note`), a thread per sender. The host's listing names each
// thread beside its sessions; a tap shows the thread whole, read and answered
// over the host's messages door (`thunderbolt/<p>/reach1`: one line out, one
// back, no agent started). While a thread is shown the page asks for what is
// new every few seconds, which also tells the host not to push that thread to
// this device meanwhile.
import { el } from "./conversation.js";

/// A dial and its answer: a relay hop or two.
const REACH_MS = 8000;
/// The longest answer read (the host sends at most 768 KiB of text).
const MAX_ANSWER = 2 * 1024 * 1024;
/// How often a shown thread asks for what is new: the host takes a device
/// that stops asking as no longer showing it after 20 s, and pushes again.
const POLL_MS = 4000;
/// Per host and thread, in localStorage: the newest item seen (for "new").
const READ_PREFIX = "thunderbolt_iroh_read:";

const $ = (id) => document.getElementById(id);

/// "14:05", or "3 Dec 14:05" for another day.
function when(at) {
  const d = new Date(at);
  if (isNaN(d)) return "";
  const time = d.toLocaleTimeString([], { timeStyle: "short" });
  return d.toDateString() === new Date().toDateString() ? time : `${d.toLocaleDateString([], { day: "numeric", month: "short" })} ${time}`;
}

export class Messages {
  /// `client()`: the page's IrohClient (or null before it is made).
  constructor({ client, log, onRead }) {
    this.client = client;
    this.log = log || (() => {});
    this.onRead = onRead || (() => {});
    // The thread shown: {ticket, host, name, seq, items, timer, busy}.
    this.shown = null;
    // The connection to the host of the thread shown, and the requests' order.
    this.linked = null;
    this.queue = Promise.resolve();
    $("thread-back").onclick = () => this.close();
    $("thread-reply").onsubmit = (e) => {
      e.preventDefault();
      this.reply();
    };
    $("thread-text").oninput = () => this.renderReply();
    $("thread-text").onkeydown = (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        this.reply();
      }
    };
    document.addEventListener("visibilitychange", () => {
      if (!this.shown) return;
      if (document.visibilityState === "visible") this.poll();
      else clearTimeout(this.shown.timer);
    });
  }

  /// One request on the host's messages door: its answer, or `{error}`.
  /// Requests go one at a time on one connection per host, kept while it is
  /// used (the host lets it go after 30 s of silence): a dial per request
  /// would spend this device's connection budget at the host's gate.
  call(ticket, req) {
    const work = this.queue.then(() => this.exchange(ticket, req));
    this.queue = work.catch(() => {});
    return work;
  }

  async exchange(ticket, req) {
    for (let attempt = 0; ; attempt++) {
      try {
        const link = await this.link(ticket);
        await link.conn.send(new TextEncoder().encode(JSON.stringify(req) + "\n"));
        return JSON.parse(await link.line());
      } catch (e) {
        this.drop();
        // A connection the host let go: once more on a new one.
        if (attempt > 0) return { error: String((e && (e.reason || e.message)) || e) };
      }
    }
  }

  /// The open connection to the host at `ticket`, made if need be.
  async link(ticket) {
    if (this.linked && this.linked.ticket === ticket) return this.linked;
    this.drop();
    const client = this.client();
    if (!client) throw new Error("not started yet");
    const conn = await client.connect(ticket, "thunderbolt/acp/reach1", REACH_MS);
    const reader = conn.readable().getReader();
    const dec = new TextDecoder();
    const link = { ticket, conn, text: "" };
    link.line = async () => {
      while (!link.text.includes("\n")) {
        if (link.text.length > MAX_ANSWER) throw new Error("the host's answer is too long");
        const { value, done } = await reader.read();
        if (done) throw new Error("the host closed the connection");
        link.text += dec.decode(value, { stream: true });
      }
      const at = link.text.indexOf("\n");
      const line = link.text.slice(0, at);
      link.text = link.text.slice(at + 1);
      return line;
    };
    this.linked = link;
    return link;
  }

  drop() {
    if (this.linked) this.linked.conn.close();
    this.linked = null;
  }

  /// Whether the thread `name` is on screen now (then no notice is shown for it).
  shows(name) {
    return !!this.shown && this.shown.name === name && document.visibilityState === "visible";
  }

  /// The newest item of `name` on `host` this browser showed.
  read(host, name) {
    return Number(localStorage.getItem(`${READ_PREFIX}${host}:${name}`) || 0);
  }

  /// A host's threads as the list shows them (from its listing's `messages`):
  /// a button each, its newest item in short, marked when there is news.
  list(host, hostName, ticket, messages) {
    const threads = (messages && Array.isArray(messages.threads) ? messages.threads : []).filter((t) => t && typeof t.name === "string");
    if (!threads.length) return null;
    const ul = el("ul", { className: "threads" });
    ul.setAttribute("aria-label", `messages on ${hostName}`);
    for (const t of threads) {
      const fresh = t.seq > this.read(host, t.name);
      const last = t.last || {};
      const b = el("button", { type: "button", className: `thread${fresh ? " fresh" : ""}` },
        el("strong", {}, t.name, fresh ? el("span", { className: "dot" }, " · new") : null),
        " ",
        el("span", {}, `${last.from === "device" ? "you: " : ""}${last.text || ""} · ${when(last.at)}`));
      b.dataset.thread = t.name;
      b.onclick = () => this.open(ticket, host, t.name, hostName);
      ul.append(el("li", {}, b));
    }
    return ul;
  }

  /// Shows thread `name` of the host reached at `ticket`, whole.
  async open(ticket, host, name, hostName = "") {
    if (this.shown) clearTimeout(this.shown.timer);
    this.shown = { ticket, host, name, seq: 0, items: [], timer: null, busy: false };
    $("thread-name").textContent = name;
    $("thread-host").textContent = hostName ? `on ${hostName}` : "";
    $("thread-items").replaceChildren();
    $("thread-state").textContent = "loading…";
    $("thread").hidden = false;
    document.body.classList.add("thread-open");
    this.renderReply();
    await this.poll();
    $("thread-text").focus({ preventScroll: true });
  }

  close() {
    const s = this.shown;
    if (!s) return;
    clearTimeout(s.timer);
    this.shown = null;
    $("thread").hidden = true;
    document.body.classList.remove("thread-open");
    // The host hears at once that this device no longer shows it; then the connection goes.
    this.call(s.ticket, { op: "threads", since: s.seq }).then(() => this.drop());
    this.onRead();
  }

  /// Asks for what is new in the thread shown (all of it the first time),
  /// then again in POLL_MS while the page is visible.
  async poll() {
    const s = this.shown;
    if (!s || s.busy) return;
    clearTimeout(s.timer);
    s.busy = true;
    const req = { op: "threads", viewing: s.name };
    if (s.seq) req.since = s.seq;
    const r = await this.call(s.ticket, req);
    s.busy = false;
    if (this.shown !== s) return;
    if (r.error) {
      $("thread-state").textContent = `could not reach the host: ${r.error}`;
    } else {
      const t = (r.threads || []).find((x) => x.name === s.name);
      const have = new Set(s.items.map((i) => i.id));
      const fresh = t ? t.items.filter((i) => !have.has(i.id)) : [];
      s.items.push(...fresh);
      if (typeof r.seq === "number") s.seq = r.seq;
      $("thread-state").textContent = s.items.length ? "" : "no messages in this thread";
      if (fresh.length) this.renderItems();
      const newest = s.items.length ? s.items[s.items.length - 1].seq : 0;
      if (newest > this.read(s.host, s.name)) localStorage.setItem(`${READ_PREFIX}${s.host}:${s.name}`, String(newest));
    }
    if (document.visibilityState === "visible") s.timer = setTimeout(() => this.poll(), POLL_MS);
  }

  /// The thread shown, whole (its items are few: the host keeps 200 at most).
  renderItems() {
    const s = this.shown;
    const ol = $("thread-items");
    const answers = new Map(s.items.filter((i) => i.verdict && i.replyTo).map((i) => [i.replyTo, i]));
    ol.replaceChildren(...s.items.map((i) => {
      const mine = i.from === "device";
      const who = mine ? (i.device ? `you (${i.device})` : "you") : s.name;
      const li = el("li", { className: `msg ${mine ? "mine" : "theirs"}${i.ask ? " ask" : ""}` },
        el("p", {}, i.text),
        i.ask && i.ask.preview ? el("pre", {}, i.ask.preview) : null,
        el("small", {}, `${who} · ${when(i.at)}`));
      li.dataset.id = i.id;
      if (i.ask) {
        const done = answers.get(i.id);
        if (done) {
          li.append(el("small", { className: "verdict" }, `${done.verdict.behavior === "allow" ? "Allowed" : "Denied"} by ${done.device || "a device"}`));
        } else {
          const allow = el("button", { type: "button", className: "primary" }, "Allow");
          const deny = el("button", { type: "button", className: "deny" }, "Deny");
          allow.onclick = () => this.decide(i.id, "allow");
          deny.onclick = () => this.decide(i.id, "deny");
          const row = el("div", { className: "answer" }, allow, deny);
          row.setAttribute("role", "group");
          row.setAttribute("aria-label", `answer ${i.ask.tool}`);
          li.append(row);
        }
      }
      return li;
    }));
    ol.lastElementChild?.scrollIntoView({ block: "end" });
  }

  /// Allow or Deny of question `id` of the thread shown: only this makes a
  /// verdict (a reply's text never does).
  async decide(id, behavior) {
    const s = this.shown;
    if (!s) return;
    for (const b of document.querySelectorAll(`#thread-items li[data-id="${CSS.escape(id)}"] .answer button`)) b.disabled = true;
    $("thread-state").textContent = behavior === "allow" ? "allowing…" : "denying…";
    const r = await this.call(s.ticket, { op: "answer", thread: s.name, question: id, behavior });
    if (this.shown !== s) return;
    $("thread-state").textContent = r.ok ? "" : `not answered: ${r.error || "the host did not take it"}`;
    if (r.ok) this.log(`${id} ${behavior === "allow" ? "allowed" : "denied"}`);
    await this.poll();
  }

  renderReply() {
    $("thread-send").disabled = !this.shown || !$("thread-text").value.trim();
  }

  /// Sends the reply box's text to the thread shown, answering its newest message.
  async reply() {
    const s = this.shown;
    const text = $("thread-text").value;
    if (!s || !text.trim()) return;
    const lastMessage = [...s.items].reverse().find((i) => i.from === "agent");
    $("thread-send").disabled = true;
    $("thread-state").textContent = "sending…";
    const r = await this.call(s.ticket, { op: "reply", thread: s.name, text, ...(lastMessage ? { replyTo: lastMessage.id } : {}) });
    if (this.shown !== s) return;
    if (r.ok) {
      $("thread-text").value = "";
      $("thread-state").textContent = "";
      this.log(`reply ${r.id} sent to ${s.name}`);
      await this.poll();
    } else {
      $("thread-state").textContent = `not sent: ${r.error || "the host did not take it"}`;
    }
    this.renderReply();
  }
}
