// The demo page's notices, in its service worker: shows the bridge's notices
// (Web Push, end to end encrypted: the browser decrypts them before this
// runs), tells the open pages, opens the page at the request a notice is
// about, and withdraws a notice once its request was answered or its session
// ended. A plain script (no import or export), so that it runs as a module
// (sw.js imports it, and adds `self.answerFromNotice`: a notice's Allow / Deny
// answered with no page open) and as a classic script (sw-classic.js, for
// browsers without module service workers: there, an action opens the page).
//
// A notice (docs/browser.md, "Notices"): {title, body, text?, agent, label,
// event, detail, session, at, node?, request?, options?, answer?}. `event` is
// `needs_answer`, `finished` or `stopped`, or, to withdraw what was shown, `answered`
// (with `request`, or without: every question of the session) or `ended`; or
// `message` (with `thread` and `message`): a message from the workstation, whose
// tap opens its thread.

/// One notice per question on screen (by its request id when the notice has
/// one), one per session for the rest: a newer one replaces it.
function tagOf(n) {
  // A thread's messages: one notice per thread, the newest.
  if (n.event === "message") return `tb:reach:${n.thread || ""}`;
  const what = n.event === "needs_answer" || n.event === "answered" ? (n.request ?? "needs_answer") : n.event;
  return `tb:${n.session || ""}:${what}`;
}

/// Where a tap opens the page: at the notice's request, and with the answer
/// of the action tapped (`allow`, `deny`), which the page gives at once.
function noticeUrl(n, action = "") {
  const q = new URLSearchParams({ open: "1", notice: n.session || "" });
  if (n.node) q.set("node", n.node);
  if (n.request !== undefined) q.set("request", n.request);
  if (n.event === "message" && n.thread) q.set("thread", n.thread);
  if (n.event === "message" && n.message) q.set("message", n.message);
  if (n.event === "needs_answer" && n.detail) q.set("method", n.detail);
  if (action) q.set("answer", action);
  return `${self.registration.scope}#${q}`;
}
self.noticeUrl = noticeUrl;
self.tagOf = tagOf;

/// Whether a visible page is attached to the notice's session (then it shows
/// the question itself, and no notice is shown). Each page answers at once;
/// one that does not within a second counts as not attached.
async function attachedPage(pages, notice) {
  const visible = pages.filter((p) => p.visibilityState === "visible");
  const answers = visible.map((p) => new Promise((resolve) => {
    const ch = new MessageChannel();
    const timer = setTimeout(() => resolve(false), 1000);
    ch.port1.onmessage = (e) => { clearTimeout(timer); resolve(!!(e.data && e.data.attached)); };
    p.postMessage({ type: "thunderbolt-attached?", notice }, [ch.port2]);
  }));
  return (await Promise.all(answers)).some(Boolean);
}

/// The notices' work (each push's, and a notice shown again after a tap),
/// one after another in the order it came. Chromium forgets a notice that
/// getNotifications() reads while the notice's showNotification() is still
/// under way (its record is written, the notice not on screen yet: the read
/// deletes the record as one no longer shown), so nothing here may read the
/// notices while one is being shown: two pushes at once (two questions, or a
/// question and its withdrawal) would leave a notice on screen that no
/// withdrawal finds any more.
let queue = Promise.resolve();
function serially(work) {
  const done = queue.then(work);
  queue = done.catch(() => {});
  return done;
}

/// Resolves once no notice's work is queued or under way: the notices are
/// safe to read (for the tests, which read them from outside and would make
/// Chromium forget one being shown just the same).
self.noticesSettled = async () => {
  for (let seen = null; seen !== queue;) {
    seen = queue;
    await seen;
  }
};

/// Withdraws what was shown: replaced by tag (so a screen that still shows it
/// says it was answered), then closed.
async function withdraw(notice) {
  const shown = await self.registration.getNotifications();
  const mine = shown.filter((n) => {
    const d = n.data || {};
    if ((d.session || "") !== (notice.session || "")) return false;
    // A session's end takes back what it asked, not why its agent stopped.
    if (notice.event === "ended") return d.event !== "stopped";
    return d.event === "needs_answer" && (notice.request === undefined || d.request === notice.request);
  });
  for (const n of mine) {
    await self.registration.showNotification(n.title, {
      body: notice.event === "ended" ? "the session ended" : "answered",
      tag: n.tag, silent: true, data: { ...n.data, withdrawn: true },
    });
    for (const again of await self.registration.getNotifications({ tag: n.tag })) again.close();
  }
}

self.addEventListener("push", (event) => {
  let notice;
  try {
    notice = event.data ? event.data.json() : null;
  } catch {
    notice = null;
  }
  if (!notice) notice = { title: "thunderbolt", body: event.data ? event.data.text() : "a notice from your workstation" };
  event.waitUntil(serially(async () => {
    const pages = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
    for (const p of pages) p.postMessage({ type: "thunderbolt-notice", notice });
    // The pages hear what became of it (shown or not), once it is decided.
    const done = (shown) => { for (const p of pages) p.postMessage({ type: "thunderbolt-notice-done", notice, shown }); };
    if (notice.event === "answered" || notice.event === "ended") return withdraw(notice).then(() => done(false));
    if (await attachedPage(pages, notice)) return done(false);
    // A permission, or a message that asks (an agent's permission prompt): Allow and Deny.
    const permission = (notice.event === "needs_answer" && notice.detail === "session/request_permission")
      || (notice.event === "message" && Array.isArray(notice.options));
    await self.registration.showNotification(notice.title || "thunderbolt", {
      // The agent's own words (`text`), unless the body says them already
      // (a worded notice's body starts with them).
      body: notice.text && !String(notice.body || "").includes(notice.text) ? `${notice.body}\n${notice.text}` : notice.body,
      tag: tagOf(notice),
      renotify: true,
      requireInteraction: notice.event === "needs_answer" || permission,
      icon: "icon-192.png",
      data: { ...notice, url: noticeUrl(notice) },
      actions: permission ? [{ action: "allow", title: "Allow" }, { action: "deny", title: "Deny" }] : [],
    });
    done(true);
  }));
});

/// A notice tapped, or one of its actions: a page of the app that is open
/// goes to the request (and answers it); with none open, an action is
/// answered here when the notice allows it (`self.answerFromNotice`, sw.js),
/// else, or when that fails, the page is opened at the request. Resolves with
/// what was done: `{how: "page" | "answered" | "opened" | "shown again", why?}`
/// (kept as `self.lastClick` for the tests; `why`: why answering here failed).
async function clicked(data, action) {
  const url = noticeUrl(data, action);
  const pages = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  const page = pages.find((p) => p.url.startsWith(self.registration.scope));
  if (page) {
    // Focusing may be refused (no user activation); the page still goes there.
    await page.focus().catch(() => {});
    page.postMessage({ type: "thunderbolt-open", open: Object.fromEntries(new URLSearchParams(new URL(url).hash.slice(1))) });
    return { how: "page" };
  }
  let why;
  if (action && self.answerFromNotice) {
    const r = await self.answerFromNotice(data, action).catch((e) => ({ answered: false, error: String((e && e.message) || e) }));
    if (r && r.answered) return { how: "answered" };
    if (r) why = r.error || "not answered";
  }
  try {
    await self.clients.openWindow(url);
    return { how: "opened", why };
  } catch {
    // Opening a window needs the tap's user activation, which a long attempt
    // may have outlived: the notice comes back, and a tap on it opens the page.
    await serially(() => self.registration.showNotification(data.title || "thunderbolt", {
      body: why ? `could not answer from here (${why}): tap to open` : data.body,
      tag: tagOf(data), requireInteraction: true, icon: "icon-192.png",
      data,
    }));
    return { how: "shown again", why };
  }
}

self.addEventListener("notificationclick", (event) => {
  const n = event.notification;
  n.close();
  const action = event.action === "allow" || event.action === "deny" ? event.action : "";
  const work = clicked(n.data || {}, action);
  self.lastClick = work;
  // waitUntil throws for an event the browser did not dispatch itself.
  try {
    event.waitUntil(work);
  } catch {
    // the work goes on regardless
  }
});
