// The demo page's service worker: shows the bridge's notices (Web Push, end
// to end encrypted: the browser decrypts them before this runs) and tells the
// open pages, which list them.
self.addEventListener("push", (event) => {
  let notice;
  try {
    notice = event.data ? event.data.json() : null;
  } catch {
    notice = null;
  }
  if (!notice) notice = { title: "thunderbolt", body: event.data ? event.data.text() : "a notice from your workstation" };
  event.waitUntil((async () => {
    const pages = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
    for (const p of pages) p.postMessage({ type: "thunderbolt-notice", notice });
    await self.registration.showNotification(notice.title || "thunderbolt", {
      body: notice.text ? `${notice.body}\n${notice.text}` : notice.body,
      // One notice per session and kind on screen: a newer one replaces it.
      tag: `${notice.session || ""}-${notice.event || ""}`,
      data: notice,
    });
  })());
});

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  event.waitUntil((async () => {
    const pages = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
    if (pages.length) return pages[0].focus();
    return self.clients.openWindow(self.registration.scope);
  })());
});
