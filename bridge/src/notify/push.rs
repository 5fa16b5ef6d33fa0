//! Web Push, end to end encrypted: RFC 8030 delivery, RFC 8291 `aes128gcm`
//! payload encryption to the subscription's key, RFC 8292 VAPID.
//!
//! The crypto is `ring`'s: P-256 ECDH and ECDSA, HKDF-SHA-256 and AES-128-GCM
//! from the same audited library the bridge's TLS (rustls) and iroh already
//! run on. The `web-push` crate would build the same message, but through
//! `ece` and OpenSSL: a second crypto stack in a binary that has one.
//!
//! The push service sees the ciphertext, its size, and the VAPID identity
//! (our public key and `sub` contact); only the browser holding the
//! subscription's private key reads the notice.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64, Engine};
use iroh::EndpointId;
use ring::{
    aead, agreement, hkdf,
    rand::{SecureRandom, SystemRandom},
    signature::{self, EcdsaKeyPair, KeyPair},
};
use serde::{Deserialize, Serialize};
use thunderbolt_shared::parse_node_id;
use tracing::warn;

use super::endpoint::Policy;

use crate::{
    devices::now_ms,
    home::{self, Home},
};

/// Record size announced in the header: one record carries the whole notice
/// (push services take at most 4096 bytes of body).
const RECORD_SIZE: u32 = 4096;

/// Longest notice before encryption: 4096 bytes of body, less the header
/// (86), the padding delimiter (1) and the tag (16).
pub const MAX_PAYLOAD: usize = 3993;

/// How long a VAPID token is good for (RFC 8292 allows at most 24 hours).
const VAPID_VALID: Duration = Duration::from_secs(12 * 3600);

/// Subscriptions one device may hold (a browser profile or two, a phone);
/// a new one past it replaces that device's oldest.
pub const MAX_PER_DEVICE: usize = 8;

/// The longest endpoint taken: push services' are 150-500 bytes (FCM's
/// about 180, Mozilla's about 250, Apple's and WNS's under 300); without a
/// cap one device grew `push.json` to 201 MB (finding 7 of issue 33).
pub const MAX_ENDPOINT: usize = 2048;

/// Subscriptions the bridge holds, of every device: 64 devices at their
/// most, far more than one person's browsers. Past it a new one is refused.
pub const MAX_TOTAL: usize = 512;

/// Entries `push.json` keeps: a bridge's own [`MAX_TOTAL`], and as many of
/// another bridge of the same home (acp and mcp), and some room.
const MAX_FILE_ENTRIES: usize = 4 * MAX_TOTAL;

/// The largest `push.json` read: [`MAX_FILE_ENTRIES`] entries of the longest
/// endpoint and their keys, pretty-printed, fit in it with room to spare.
pub const MAX_FILE_BYTES: u64 = (MAX_FILE_ENTRIES as u64) * 3 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("{path}: {why} (it is never replaced: move it away to make a new VAPID key)")]
    BadKey { path: PathBuf, why: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("invalid subscription: {0}")]
    Subscription(String),
    #[error("invalid subscription: {0}")]
    Endpoint(#[from] super::endpoint::EndpointError),
    #[error("encryption failed")]
    Crypto,
}

/// The bridge's VAPID key pair (`iroh/vapid`, PKCS#8 as hex, 0600).
pub struct Vapid {
    key: EcdsaKeyPair,
    rng: SystemRandom,
    /// The `sub` claim: how the push service reaches the sender's operator.
    contact: String,
}

impl std::fmt::Debug for Vapid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vapid").field("public", &self.public_b64()).finish()
    }
}

impl Vapid {
    /// Loads the home's key, making one on first use. One that exists but
    /// does not parse is an error, never replaced (browsers subscribed with
    /// its public key would stop getting notices).
    pub fn load_or_create(home: &Home, contact: String) -> Result<Self, PushError> {
        let rng = SystemRandom::new();
        let dir = home.ensure_iroh_dir().map_err(std::io::Error::other)?;
        let path = dir.join("vapid");
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let parse = |text: &str| -> Result<EcdsaKeyPair, PushError> {
            let der = hex::decode(text.trim())
                .map_err(|_| PushError::BadKey { path: path.clone(), why: "not hex".into() })?;
            EcdsaKeyPair::from_pkcs8(alg, &der, &rng)
                .map_err(|_| PushError::BadKey { path: path.clone(), why: "not a P-256 PKCS#8 key".into() })
        };
        let key = match std::fs::read_to_string(&path) {
            Ok(text) => {
                home::force_file_mode(&path).map_err(std::io::Error::other)?;
                parse(&text)?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let doc = EcdsaKeyPair::generate_pkcs8(alg, &rng).map_err(|_| PushError::Crypto)?;
                let text = format!("{}\n", hex::encode(doc.as_ref()));
                match home::create_new_secure(&path, text.as_bytes()) {
                    Ok(()) => parse(&text)?,
                    // Made by another process in between: use theirs.
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        parse(&std::fs::read_to_string(&path)?)?
                    }
                    Err(e) => {
                        let e =
                            std::io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display()));
                        return Err(e.into());
                    }
                }
            }
            Err(e) => {
                return Err(
                    std::io::Error::new(e.kind(), format!("cannot read {}: {e}", path.display())).into()
                )
            }
        };
        Ok(Self { key, rng, contact })
    }

    /// The public key as browsers take it (`applicationServerKey`): the
    /// uncompressed point, base64url.
    pub fn public_b64(&self) -> String {
        B64.encode(self.key.public_key().as_ref())
    }

    /// `Authorization: vapid t=<JWT>, k=<public key>` for `endpoint`'s origin.
    pub fn authorization(&self, endpoint: &reqwest::Url) -> Result<String, PushError> {
        let aud = endpoint.origin().ascii_serialization();
        let exp = now_ms() / 1000 + VAPID_VALID.as_secs();
        let header = B64.encode(br#"{"typ":"JWT","alg":"ES256"}"#);
        let claims = B64.encode(serde_json::json!({"aud": aud, "exp": exp, "sub": self.contact}).to_string());
        let signed = format!("{header}.{claims}");
        let sig = self.key.sign(&self.rng, signed.as_bytes()).map_err(|_| PushError::Crypto)?;
        Ok(format!("vapid t={signed}.{}, k={}", B64.encode(sig.as_ref()), self.public_b64()))
    }
}

/// A browser's push subscription, as `PushSubscription.toJSON()` gives it.
/// Its `Debug` shows the endpoint's origin only: the rest of the endpoint is
/// a capability and `auth` a secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subscription {
    pub endpoint: String,
    /// The browser's P-256 public key (65 bytes uncompressed), base64url.
    pub p256dh: String,
    /// The 16-byte authentication secret, base64url.
    pub auth: String,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").field("origin", &self.origin()).finish_non_exhaustive()
    }
}

impl Subscription {
    /// Reads and checks `{endpoint, keys: {p256dh, auth}}`: an endpoint that
    /// `policy` admits ([`super::endpoint::check_url`]: https to a public
    /// host) of at most [`MAX_ENDPOINT`] bytes, a P-256 point and 16 bytes
    /// of secret.
    pub fn from_json(v: &serde_json::Value, policy: Policy) -> Result<Self, PushError> {
        let bad = |why: &str| PushError::Subscription(why.to_string());
        let v = v.get("subscription").unwrap_or(v);
        let endpoint = v["endpoint"].as_str().ok_or_else(|| bad("no endpoint"))?;
        if endpoint.len() > MAX_ENDPOINT {
            return Err(bad(&format!("the endpoint is {} bytes, more than {MAX_ENDPOINT}", endpoint.len())));
        }
        let url = reqwest::Url::parse(endpoint).map_err(|e| bad(&format!("endpoint: {e}")))?;
        super::endpoint::check_url(&url, policy)?;
        let key = |name: &str, len: usize| -> Result<String, PushError> {
            let text = v["keys"][name].as_str().ok_or_else(|| bad(&format!("no keys.{name}")))?;
            if text.len() > 4 * len {
                return Err(bad(&format!("keys.{name} is too long")));
            }
            let bytes = decode_b64(text).ok_or_else(|| bad(&format!("keys.{name} is not base64url")))?;
            if bytes.len() != len {
                return Err(bad(&format!("keys.{name} is {} bytes, not {len}", bytes.len())));
            }
            Ok(B64.encode(bytes))
        };
        let p256dh = key("p256dh", 65)?;
        let auth = key("auth", 16)?;
        let sub = Self { endpoint: url.to_string(), p256dh, auth };
        if sub.endpoint.len() > MAX_ENDPOINT {
            return Err(bad(&format!("the endpoint is more than {MAX_ENDPOINT} bytes")));
        }
        Ok(sub)
    }

    /// Whether a stored subscription still checks out under `policy`.
    pub fn check(&self, policy: Policy) -> Result<(), PushError> {
        let v = serde_json::json!({"endpoint": self.endpoint, "keys": {"p256dh": self.p256dh, "auth": self.auth}});
        Self::from_json(&v, policy).map(|_| ())
    }

    /// The endpoint's origin, the only part of it logs show (the rest is a
    /// capability: whoever has it can push to the browser).
    pub fn origin(&self) -> String {
        reqwest::Url::parse(&self.endpoint).map(|u| u.origin().ascii_serialization()).unwrap_or_default()
    }
}

/// base64url with or without padding (browsers send either), or plain base64.
fn decode_b64(text: &str) -> Option<Vec<u8>> {
    let t = text.trim().trim_end_matches('=');
    B64.decode(t).ok().or_else(|| base64::engine::general_purpose::STANDARD_NO_PAD.decode(t).ok())
}

/// `notice` encrypted to `sub` (RFC 8291): the body of the push request.
pub fn encrypt(sub: &Subscription, notice: &[u8]) -> Result<Vec<u8>, PushError> {
    if notice.len() > MAX_PAYLOAD {
        return Err(PushError::Subscription(format!("a notice of {} bytes is too long", notice.len())));
    }
    let rng = SystemRandom::new();
    let ua_public = decode_b64(&sub.p256dh).ok_or(PushError::Crypto)?;
    let auth = decode_b64(&sub.auth).ok_or(PushError::Crypto)?;
    let ours = agreement::EphemeralPrivateKey::generate(&agreement::ECDH_P256, &rng)
        .map_err(|_| PushError::Crypto)?;
    let as_public = ours.compute_public_key().map_err(|_| PushError::Crypto)?;
    let as_public = as_public.as_ref().to_vec();
    let theirs = agreement::UnparsedPublicKey::new(&agreement::ECDH_P256, &ua_public);
    let ecdh: Vec<u8> =
        agreement::agree_ephemeral(ours, &theirs, |secret| secret.to_vec()).map_err(|_| PushError::Crypto)?;
    // IKM = HKDF(salt = auth, ikm = ECDH, info = "WebPush: info\0" || ua_public || as_public, 32)
    let mut info = b"WebPush: info\0".to_vec();
    info.extend_from_slice(&ua_public);
    info.extend_from_slice(&as_public);
    let ikm = hkdf_sha256(&auth, &ecdh, &info, 32)?;
    let mut salt = [0u8; 16];
    rng.fill(&mut salt).map_err(|_| PushError::Crypto)?;
    let cek = hkdf_sha256(&salt, &ikm, b"Content-Encoding: aes128gcm\0", 16)?;
    let nonce = hkdf_sha256(&salt, &ikm, b"Content-Encoding: nonce\0", 12)?;
    // One record, the last: the notice, then the delimiter 0x02 (no padding).
    let mut record = notice.to_vec();
    record.push(2);
    let key = aead::LessSafeKey::new(
        aead::UnboundKey::new(&aead::AES_128_GCM, &cek).map_err(|_| PushError::Crypto)?,
    );
    let nonce = aead::Nonce::try_assume_unique_for_key(&nonce).map_err(|_| PushError::Crypto)?;
    key.seal_in_place_append_tag(nonce, aead::Aad::empty(), &mut record).map_err(|_| PushError::Crypto)?;
    let mut body = Vec::with_capacity(16 + 4 + 1 + as_public.len() + record.len());
    body.extend_from_slice(&salt);
    body.extend_from_slice(&RECORD_SIZE.to_be_bytes());
    body.push(as_public.len() as u8);
    body.extend_from_slice(&as_public);
    body.extend_from_slice(&record);
    Ok(body)
}

/// HKDF-SHA-256: extract with `salt`, expand `info` to `len` bytes.
fn hkdf_sha256(salt: &[u8], ikm: &[u8], info: &[u8], len: usize) -> Result<Vec<u8>, PushError> {
    struct Len(usize);
    impl hkdf::KeyType for Len {
        fn len(&self) -> usize {
            self.0
        }
    }
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(ikm);
    let info = [info];
    let okm = prk.expand(&info, Len(len)).map_err(|_| PushError::Crypto)?;
    let mut out = vec![0u8; len];
    okm.fill(&mut out).map_err(|_| PushError::Crypto)?;
    Ok(out)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stored {
    node_id: String,
    #[serde(flatten)]
    sub: Subscription,
    added_ms: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    subscriptions: Vec<Stored>,
}

/// The home's subscription file (`iroh/push.json`, 0600) as a file: what
/// `thunderbolt iroh deny` edits when it removes a device. A running bridge
/// holds its own in memory ([`Registry`]) and writes through to it.
#[derive(Debug, Clone)]
pub struct Subscriptions {
    path: PathBuf,
}

impl Subscriptions {
    pub fn new(home: &Home) -> Self {
        Self { path: home.iroh_dir().join("push.json") }
    }

    /// Removes all of `owner`'s (its device was revoked); how many.
    pub fn forget(&self, owner: &EndpointId) -> std::io::Result<usize> {
        if !self.path.exists() {
            return Ok(0);
        }
        let owner = owner.to_string();
        home::edit_json(&self.path, |f: &mut File| {
            let before = f.subscriptions.len();
            f.subscriptions.retain(|s| s.node_id != owner);
            before - f.subscriptions.len()
        })
    }
}

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
/// by (device NodeId, endpoint) and bounded ([`MAX_ENDPOINT`],
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

    fn sub() -> Subscription {
        let rng = SystemRandom::new();
        let k = agreement::EphemeralPrivateKey::generate(&agreement::ECDH_P256, &rng).unwrap();
        let p = k.compute_public_key().unwrap();
        Subscription::from_json(
            &serde_json::json!({
                "endpoint": "https://push.example/x",
                "keys": {"p256dh": B64.encode(p.as_ref()), "auth": B64.encode([7u8; 16])}
            }),
            OFF,
        )
        .unwrap()
    }

    const OFF: Policy = Policy { loopback_for_tests: false };

    fn at(endpoint: &str) -> Subscription {
        Subscription { endpoint: endpoint.to_string(), ..sub() }
    }

    fn id(n: u8) -> EndpointId {
        iroh::SecretKey::from_bytes(&[n; 32]).public()
    }

    #[test]
    fn the_body_has_the_rfc8291_header_and_one_record() {
        let s = sub();
        let body = encrypt(&s, b"{\"hi\":1}").unwrap();
        assert_eq!(&body[16..20], &RECORD_SIZE.to_be_bytes());
        assert_eq!(body[20], 65, "keyid is our ephemeral public key");
        assert_eq!(body[21], 4, "an uncompressed point");
        assert_eq!(body.len(), 16 + 4 + 1 + 65 + 8 + 1 + 16);
        assert!(encrypt(&s, &vec![b'x'; MAX_PAYLOAD + 1]).is_err());
    }

    #[test]
    fn subscriptions_are_checked() {
        let ok = serde_json::to_value(sub()).unwrap();
        let json = serde_json::json!({"endpoint": ok["endpoint"], "keys": {"p256dh": ok["p256dh"], "auth": ok["auth"]}});
        assert!(Subscription::from_json(&json, OFF).is_ok());
        let mut plain = json.clone();
        plain["endpoint"] = "http://push.example/x".into();
        assert!(Subscription::from_json(&plain, OFF).unwrap_err().to_string().contains("https"));
        // Loopback only with the tests' switch (it was taken without one).
        let mut local = json.clone();
        local["endpoint"] = "http://127.0.0.1:9/x".into();
        assert!(Subscription::from_json(&local, OFF).is_err(), "loopback is not a push service");
        let tests = Policy { loopback_for_tests: true };
        assert!(Subscription::from_json(&local, tests).is_ok(), "loopback, for the tests' push service");
        let mut long = json.clone();
        long["endpoint"] = format!("https://push.example/{}", "x".repeat(MAX_ENDPOINT)).into();
        let e = Subscription::from_json(&long, OFF).unwrap_err().to_string();
        assert!(e.contains("more than 2048"), "{e}");
        let mut short = json;
        short["keys"]["auth"] = B64.encode([1u8; 8]).into();
        assert!(Subscription::from_json(&short, OFF).is_err());
        assert!(!format!("{:?}", sub()).contains(&sub().auth), "Debug shows no secret");
    }

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

    #[test]
    fn the_vapid_key_is_kept_and_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().to_path_buf());
        let a = Vapid::load_or_create(&home, "mailto:a@b".into()).unwrap();
        let b = Vapid::load_or_create(&home, "mailto:a@b".into()).unwrap();
        assert_eq!(a.public_b64(), b.public_b64());
        let path = dir.path().join("iroh/vapid");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let auth = a.authorization(&"https://push.example/abc".parse().unwrap()).unwrap();
        assert!(auth.starts_with("vapid t=") && auth.contains(&format!(", k={}", a.public_b64())));
        std::fs::write(&path, "garbage").unwrap();
        assert!(matches!(Vapid::load_or_create(&home, String::new()), Err(PushError::BadKey { .. })));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "garbage");
    }
}
