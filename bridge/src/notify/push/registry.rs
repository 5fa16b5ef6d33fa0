//! The running bridge's subscriptions, in memory: loaded once, bounded per
//! device and in all, looked up without reading the file, and each change
//! written through to `push.json` in order. Separate from the file's format
//! because lookups happen on every notice and must not touch the disk.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use iroh::EndpointId;
use thunderbolt_shared::parse_node_id;
use tracing::warn;

use super::{
    file::{File, Stored},
    Subscription, MAX_FILE_BYTES, MAX_FILE_ENTRIES, MAX_PER_DEVICE, MAX_TOTAL,
};
use crate::{
    devices::now_ms,
    home::{self, Home},
    notify::endpoint::Policy,
};

/// Why a subscription was not taken.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    #[error("the bridge holds {MAX_TOTAL} push subscriptions, its most; none can be added now")]
    Full,
    #[error("the bridge could not save the subscription")]
    Save(#[source] std::io::Error),
}

/// One device's subscription, as the bridge holds it.
#[derive(Debug, Clone)]
struct Entry {
    owner: EndpointId,
    sub: Subscription,
    added_ms: u64,
}

/// A change, written through to the file as it was made in memory: the
/// file may hold another bridge's of the same home too, which it keeps.
#[derive(Debug)]
enum Change {
    Put(Entry),
    Drop(EndpointId, String),
    Forget(Vec<EndpointId>),
}

/// The bridge's push subscriptions, in memory: loaded once from
/// `iroh/push.json` at start, written through on each change (0600), keyed
/// by (device NodeId, endpoint) and bounded ([`MAX_ENDPOINT`](super::MAX_ENDPOINT),
/// [`MAX_PER_DEVICE`], [`MAX_TOTAL`]). Looking one up never reads the file.
#[derive(Debug, Clone)]
pub struct Registry {
    inner: Arc<RegistryInner>,
}

#[derive(Debug)]
struct RegistryInner {
    path: PathBuf,
    entries: Mutex<Vec<Entry>>,
    /// Bumped on every change, so a session knows when to look again.
    generation: AtomicU64,
    /// Writes go one at a time, in the order their changes were made.
    writing: tokio::sync::Mutex<()>,
}

impl Registry {
    /// Loads `iroh/push.json`: entries whose NodeId, endpoint or keys do not
    /// check out under `policy` are left out (and out of the file at its next
    /// write), and so is what is past the caps. A file larger than any
    /// bridge writes ([`MAX_FILE_BYTES`]) is moved aside and not read.
    pub fn load(home: &Home, policy: Policy) -> Self {
        let path = home.iroh_dir().join("push.json");
        let entries = Self::read(&path, policy);
        Self {
            inner: Arc::new(RegistryInner {
                path,
                entries: Mutex::new(entries),
                generation: AtomicU64::new(0),
                writing: tokio::sync::Mutex::new(()),
            }),
        }
    }

    fn read(path: &std::path::Path, policy: Policy) -> Vec<Entry> {
        match std::fs::metadata(path) {
            Ok(m) if m.len() > MAX_FILE_BYTES => {
                let aside = path.with_extension("json.too-large");
                let moved = std::fs::rename(path, &aside);
                warn!(
                    "{} is {} bytes, more than a bridge ever writes ({MAX_FILE_BYTES}): not read{}; its devices \
                     subscribe again from their page",
                    path.display(),
                    m.len(),
                    match moved {
                        Ok(()) => format!(", moved to {}", aside.display()),
                        Err(e) => format!(" (could not move it aside: {e})"),
                    }
                );
                return Vec::new();
            }
            Ok(_) => {}
            Err(_) => return Vec::new(),
        }
        let file: File = match home::read_json(path) {
            Ok(f) => f,
            Err(e) => {
                warn!("push subscriptions not loaded: {e}");
                return Vec::new();
            }
        };
        let mut out: Vec<Entry> = Vec::new();
        let mut skipped = 0usize;
        for s in file.subscriptions {
            let owner = match parse_node_id(&s.node_id) {
                Ok(o) => o,
                Err(_) => {
                    skipped += 1;
                    continue;
                }
            };
            let ok = Subscription::check(&s.sub, policy).is_ok()
                && out.len() < MAX_TOTAL
                && out.iter().filter(|e| e.owner == owner).count() < MAX_PER_DEVICE
                && !out.iter().any(|e| e.owner == owner && e.sub.endpoint == s.sub.endpoint);
            if ok {
                out.push(Entry { owner, sub: s.sub, added_ms: s.added_ms });
            } else {
                skipped += 1;
            }
        }
        if skipped > 0 {
            warn!(
                "{skipped} push subscription(s) in {} left out (not valid now, or past a cap)",
                path.display()
            );
        }
        out
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.inner.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes whenever a subscription is added or removed.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    fn changed(&self) {
        self.inner.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Adds (or refreshes) `owner`'s `sub`. Another device's subscription to
    /// the same endpoint is its own and stays; past [`MAX_PER_DEVICE`] the
    /// device's oldest is replaced; past [`MAX_TOTAL`] it is refused.
    pub async fn add(&self, owner: &EndpointId, sub: Subscription) -> Result<(), AddError> {
        let entry = Entry { owner: *owner, sub, added_ms: now_ms() };
        let mut changes = Vec::new();
        {
            let mut e = self.entries();
            if let Some(same) =
                e.iter_mut().find(|x| x.owner == *owner && x.sub.endpoint == entry.sub.endpoint)
            {
                same.sub = entry.sub.clone();
            } else {
                let mine = e.iter().filter(|x| x.owner == *owner).count();
                if mine >= MAX_PER_DEVICE {
                    if let Some(oldest) = e.iter().position(|x| x.owner == *owner) {
                        let old = e.remove(oldest);
                        changes.push(Change::Drop(old.owner, old.sub.endpoint));
                    }
                } else if e.len() >= MAX_TOTAL {
                    return Err(AddError::Full);
                }
                e.push(entry.clone());
            }
        }
        changes.push(Change::Put(entry.clone()));
        self.changed();
        let saved = self.write(changes).await;
        if saved.is_err() {
            // Not kept unsaved: the device is told it failed, so it must not count.
            self.entries().retain(|x| !(x.owner == *owner && x.sub.endpoint == entry.sub.endpoint));
            self.changed();
        }
        saved.map_err(AddError::Save)
    }

    /// Removes `owner`'s subscription at `endpoint` (and only its own).
    pub async fn remove(&self, owner: &EndpointId, endpoint: &str) -> std::io::Result<()> {
        self.entries().retain(|x| !(x.owner == *owner && x.sub.endpoint == endpoint));
        self.changed();
        self.write(vec![Change::Drop(*owner, endpoint.to_string())]).await
    }

    /// Removes every subscription of the owners `gone` says are gone (their
    /// device was revoked); how many there were, of whom.
    pub async fn forget_where(&self, gone: impl Fn(&EndpointId) -> bool) -> Vec<(EndpointId, usize)> {
        let mut removed: Vec<(EndpointId, usize)> = Vec::new();
        {
            let mut e = self.entries();
            e.retain(|x| {
                if !gone(&x.owner) {
                    return true;
                }
                match removed.iter_mut().find(|(o, _)| *o == x.owner) {
                    Some((_, n)) => *n += 1,
                    None => removed.push((x.owner, 1)),
                }
                false
            });
        }
        if !removed.is_empty() {
            self.changed();
            let owners = removed.iter().map(|(o, _)| *o).collect();
            if let Err(e) = self.write(vec![Change::Forget(owners)]).await {
                warn!("push subscriptions of revoked devices were not removed from the file: {e}");
            }
        }
        removed
    }

    /// Every device that has a subscription now.
    pub fn owners(&self) -> Vec<EndpointId> {
        let mut v: Vec<EndpointId> = self.entries().iter().map(|x| x.owner).collect();
        v.sort();
        v.dedup();
        v
    }

    /// How many there are, of every device.
    pub fn count(&self) -> usize {
        self.entries().len()
    }

    /// Whether `owner` has any.
    pub fn has(&self, owner: &EndpointId) -> bool {
        self.entries().iter().any(|x| x.owner == *owner)
    }

    /// `owner`'s subscriptions.
    pub fn of(&self, owner: &EndpointId) -> Vec<Subscription> {
        self.entries().iter().filter(|x| x.owner == *owner).map(|x| x.sub.clone()).collect()
    }

    /// Applies `changes` to the file, in order, off the runtime's threads.
    async fn write(&self, changes: Vec<Change>) -> std::io::Result<()> {
        let _turn = self.inner.writing.lock().await;
        let path = self.inner.path.clone();
        tokio::task::spawn_blocking(move || {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            // A file grown past any cap (an older bridge's) is replaced, not parsed.
            if std::fs::metadata(&path).is_ok_and(|m| m.len() > MAX_FILE_BYTES) {
                let _ = std::fs::remove_file(&path);
            }
            home::edit_json(&path, |f: &mut File| {
                for c in changes {
                    apply(f, c);
                }
                // What another bridge of this home left stays, within the caps.
                f.subscriptions.truncate(MAX_FILE_ENTRIES);
            })
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

fn apply(f: &mut File, c: Change) {
    match c {
        Change::Put(e) => {
            let owner = e.owner.to_string();
            f.subscriptions.retain(|s| !(s.node_id == owner && s.sub.endpoint == e.sub.endpoint));
            f.subscriptions.push(Stored { node_id: owner, sub: e.sub, added_ms: e.added_ms });
        }
        Change::Drop(owner, endpoint) => {
            let owner = owner.to_string();
            f.subscriptions.retain(|s| !(s.node_id == owner && s.sub.endpoint == endpoint));
        }
        Change::Forget(owners) => {
            let owners: Vec<String> = owners.iter().map(|o| o.to_string()).collect();
            f.subscriptions.retain(|s| !owners.contains(&s.node_id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::push::test_support::{at, id, sub, OFF};

    fn stored(dir: &std::path::Path) -> String {
        std::fs::read_to_string(dir.join("iroh/push.json")).unwrap_or_default()
    }

    #[tokio::test]
    async fn subscriptions_are_each_devices_own_and_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().to_path_buf());
        let r = Registry::load(&home, OFF);
        let (a, b) = (id(1), id(2));
        r.add(&a, at("https://push.example/same")).await.unwrap();
        r.add(&b, at("https://push.example/same")).await.unwrap();
        assert_eq!((r.of(&a).len(), r.of(&b).len()), (1, 1), "b's subscription did not take a's");
        r.remove(&b, "https://push.example/same").await.unwrap();
        assert_eq!((r.of(&a).len(), r.of(&b).len()), (1, 0), "b's unsubscribe removed its own only");
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(dir.path().join("iroh/push.json")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(stored(dir.path()).matches("/same").count(), 1);
        // A device's ninth replaces its oldest.
        for n in 0..MAX_PER_DEVICE + 1 {
            r.add(&b, at(&format!("https://push.example/b{n}"))).await.unwrap();
        }
        assert_eq!(r.of(&b).len(), MAX_PER_DEVICE);
        assert!(!r.of(&b).iter().any(|s| s.endpoint.ends_with("/b0")));
        // Loaded again: the same, and what no longer checks out is left out.
        let again = Registry::load(&home, OFF);
        assert_eq!((again.of(&a).len(), again.of(&b).len()), (1, MAX_PER_DEVICE));
        let gone = again.forget_where(|o| *o == b).await;
        assert_eq!(gone, vec![(b, MAX_PER_DEVICE)]);
        assert!(!stored(dir.path()).contains("/b1"));
        assert_eq!(Registry::load(&home, OFF).count(), 1);
    }

    #[tokio::test]
    async fn the_total_is_capped_and_loading_skips_what_is_not_valid() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().to_path_buf());
        let r = Registry::load(&home, OFF);
        for n in 0..MAX_TOTAL {
            let owner = id((n / MAX_PER_DEVICE) as u8);
            r.add(&owner, at(&format!("https://push.example/{n}"))).await.unwrap();
        }
        let e = r.add(&id(255), at("https://push.example/over")).await.unwrap_err();
        assert!(matches!(e, AddError::Full), "{e}");
        assert!(e.to_string().contains("512 push subscriptions"), "{e}");
        // A device at its own cap still replaces its oldest.
        r.add(&id(0), at("https://push.example/newest")).await.unwrap();
        assert_eq!(r.count(), MAX_TOTAL);

        // A file of an older bridge: a loopback endpoint and a long one are left out.
        let old = serde_json::json!({"subscriptions": [
            {"nodeId": id(1).to_string(), "endpoint": "http://127.0.0.1:9/x", "p256dh": sub().p256dh, "auth": sub().auth, "addedMs": 1},
            {"nodeId": id(1).to_string(), "endpoint": format!("https://push.example/{}", "y".repeat(3000)), "p256dh": sub().p256dh, "auth": sub().auth, "addedMs": 1},
            {"nodeId": id(1).to_string(), "endpoint": "https://push.example/fine", "p256dh": sub().p256dh, "auth": sub().auth, "addedMs": 1},
        ]});
        std::fs::write(dir.path().join("iroh/push.json"), old.to_string()).unwrap();
        let r = Registry::load(&home, OFF);
        assert_eq!(
            r.of(&id(1)).iter().map(|s| s.endpoint.as_str()).collect::<Vec<_>>(),
            ["https://push.example/fine"]
        );
        // One grown past any cap is moved aside, not read.
        std::fs::write(dir.path().join("iroh/push.json"), vec![b' '; MAX_FILE_BYTES as usize + 1]).unwrap();
        assert_eq!(Registry::load(&home, OFF).count(), 0);
        assert!(dir.path().join("iroh/push.json.too-large").exists());
    }
}
