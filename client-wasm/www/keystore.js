// What the service worker needs to answer a notice by itself, kept by the page
// in IndexedDB (a service worker cannot read localStorage): this browser's
// secret key (so the worker dials with the page's NodeId, the one the bridge
// allows), the relay the page uses, and the agents it knows (their tickets and
// relays, by NodeId). One record; the page writes it whenever any of that
// changes. Nothing here is ever logged.
//
// And, in a database of their own (the worker never opens it), the files a
// person picked that have not reached the workstation yet: a reload of the
// page puts them again from where the bridge's copy stopped.

const DB = "thunderbolt-iroh";
const STORE = "service-worker";
const KEY = "identity";
const UPLOADS = { db: "thunderbolt-uploads", store: "files" };

function openDb({ db: name, store } = { db: DB, store: STORE }) {
  return new Promise((resolve, reject) => {
    const r = indexedDB.open(name, 1);
    r.onupgradeneeded = () => r.result.createObjectStore(store);
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
  });
}

async function inStore(mode, use, where = { db: DB, store: STORE }) {
  const db = await openDb(where);
  try {
    return await new Promise((resolve, reject) => {
      const tx = db.transaction(where.store, mode);
      const r = use(tx.objectStore(where.store));
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

/// Keeps a picked file until it has arrived: `{ticket, file}` under the
/// attachment's id (a File is stored whole: the page's copy, not a path).
export function keepUpload(id, record) {
  return inStore("readwrite", (s) => s.put(record, id), UPLOADS);
}

/// The kept `{ticket, file}`, or `undefined`.
export function keptUpload(id) {
  return inStore("readonly", (s) => s.get(id), UPLOADS);
}

export function dropUpload(id) {
  return inStore("readwrite", (s) => s.delete(id), UPLOADS);
}

/// Every kept upload's id.
export function keptUploads() {
  return inStore("readonly", (s) => s.getAllKeys(), UPLOADS);
}
