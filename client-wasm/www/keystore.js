// What the service worker needs to answer a notice by itself, kept by the page
// in IndexedDB (a service worker cannot read localStorage): this browser's
// secret key (so the worker dials with the page's NodeId, the one the bridge
// allows), the relay the page uses, and the agents it knows (their tickets and
// relays, by NodeId). One record; the page writes it whenever any of that
// changes. Nothing here is ever logged.

const DB = "thunderbolt-iroh";
const STORE = "service-worker";
const KEY = "identity";

function openDb() {
  return new Promise((resolve, reject) => {
    const r = indexedDB.open(DB, 1);
    r.onupgradeneeded = () => r.result.createObjectStore(STORE);
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
  });
}

async function inStore(mode, use) {
  const db = await openDb();
  try {
    return await new Promise((resolve, reject) => {
      const tx = db.transaction(STORE, mode);
      const r = use(tx.objectStore(STORE));
      tx.oncomplete = () => resolve(r.result);
      tx.onerror = () => reject(tx.error);
      tx.onabort = () => reject(tx.error);
    });
  } finally {
    db.close();
  }
}

/// `{secret, relay, agents: [{node, ticket, relay}]}`.
export function saveForWorker(record) {
  return inStore("readwrite", (s) => s.put(record, KEY));
}

/// The record the page saved, or `undefined`.
export function loadForWorker() {
  return inStore("readonly", (s) => s.get(KEY));
}
