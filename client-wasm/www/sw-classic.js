// The demo page's service worker for browsers without module service workers
// (the page registers it when sw.js, a module, is refused): the notices of
// sw-notices.js, with no wasm client, so a notice's Allow / Deny opens the
// page at the request and the page answers.
importScripts("./sw-notices.js");
