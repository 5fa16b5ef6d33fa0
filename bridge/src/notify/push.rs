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

use std::{path::PathBuf, time::Duration};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64, Engine};
use iroh::EndpointId;
use ring::{
    aead, agreement, hkdf,
    rand::{SecureRandom, SystemRandom},
    signature::{self, EcdsaKeyPair, KeyPair},
};
use serde::{Deserialize, Serialize};
use thunderbolt_shared::parse_node_id;

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

#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("{path}: {why} (it is never replaced: move it away to make a new VAPID key)")]
    BadKey { path: PathBuf, why: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("invalid subscription: {0}")]
    Subscription(String),
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
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subscription {
    pub endpoint: String,
    /// The browser's P-256 public key (65 bytes uncompressed), base64url.
    pub p256dh: String,
    /// The 16-byte authentication secret, base64url.
    pub auth: String,
}

impl Subscription {
    /// Reads and checks `{endpoint, keys: {p256dh, auth}}`: an https endpoint
    /// (plain http only to loopback), a P-256 point and 16 bytes of secret.
    pub fn from_json(v: &serde_json::Value) -> Result<Self, PushError> {
        let bad = |why: &str| PushError::Subscription(why.to_string());
        let v = v.get("subscription").unwrap_or(v);
        let endpoint = v["endpoint"].as_str().ok_or_else(|| bad("no endpoint"))?;
        let url = reqwest::Url::parse(endpoint).map_err(|e| bad(&format!("endpoint: {e}")))?;
        match url.scheme() {
            "https" => {}
            "http" if crate::trust::account::credential::is_loopback_host(&url) => {}
            _ => return Err(bad("the endpoint must be https")),
        }
        let key = |name: &str, len: usize| -> Result<String, PushError> {
            let text = v["keys"][name].as_str().ok_or_else(|| bad(&format!("no keys.{name}")))?;
            let bytes = decode_b64(text).ok_or_else(|| bad(&format!("keys.{name} is not base64url")))?;
            if bytes.len() != len {
                return Err(bad(&format!("keys.{name} is {} bytes, not {len}", bytes.len())));
            }
            Ok(B64.encode(bytes))
        };
        let p256dh = key("p256dh", 65)?;
        let auth = key("auth", 16)?;
        Ok(Self { endpoint: url.to_string(), p256dh, auth })
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

/// The push subscriptions of one home (`iroh/push.json`, 0600), each
/// belonging to the NodeId that registered it.
#[derive(Debug, Clone)]
pub struct Subscriptions {
    path: PathBuf,
}

impl Subscriptions {
    pub fn new(home: &Home) -> Self {
        Self { path: home.iroh_dir().join("push.json") }
    }

    /// Adds (or refreshes) `sub` for `owner`.
    pub fn add(&self, owner: &EndpointId, sub: Subscription) -> std::io::Result<()> {
        let owner = owner.to_string();
        home::edit_json(&self.path, |f: &mut File| {
            f.subscriptions.retain(|s| s.sub.endpoint != sub.endpoint);
            let mine = f.subscriptions.iter().filter(|s| s.node_id == owner).count();
            if mine >= MAX_PER_DEVICE {
                if let Some(oldest) = f.subscriptions.iter().position(|s| s.node_id == owner) {
                    f.subscriptions.remove(oldest);
                }
            }
            f.subscriptions.push(Stored { node_id: owner, sub, added_ms: now_ms() });
        })
    }

    /// Removes `owner`'s subscription at `endpoint`; whether there was one.
    pub fn remove(&self, owner: &EndpointId, endpoint: &str) -> std::io::Result<bool> {
        let owner = owner.to_string();
        home::edit_json(&self.path, |f: &mut File| {
            let before = f.subscriptions.len();
            f.subscriptions.retain(|s| !(s.node_id == owner && s.sub.endpoint == endpoint));
            before != f.subscriptions.len()
        })
    }

    /// Removes every subscription at `endpoint` (the push service said it is gone).
    pub fn drop_endpoint(&self, endpoint: &str) -> std::io::Result<()> {
        home::edit_json(&self.path, |f: &mut File| f.subscriptions.retain(|s| s.sub.endpoint != endpoint))
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

    /// How many there are, of every device.
    pub fn count(&self) -> usize {
        home::read_json::<File>(&self.path).map_or(0, |f| f.subscriptions.len())
    }

    /// `owner`'s subscriptions (none when the file is missing or unreadable).
    pub fn of(&self, owner: &EndpointId) -> Vec<Subscription> {
        let file: File = home::read_json(&self.path).unwrap_or_default();
        file.subscriptions
            .into_iter()
            .filter(|s| parse_node_id(&s.node_id).ok().as_ref() == Some(owner))
            .map(|s| s.sub)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub() -> Subscription {
        let rng = SystemRandom::new();
        let k = agreement::EphemeralPrivateKey::generate(&agreement::ECDH_P256, &rng).unwrap();
        let p = k.compute_public_key().unwrap();
        Subscription::from_json(&serde_json::json!({
            "endpoint": "https://push.example/x",
            "keys": {"p256dh": B64.encode(p.as_ref()), "auth": B64.encode([7u8; 16])}
        }))
        .unwrap()
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
        assert!(Subscription::from_json(&json).is_ok());
        let mut plain = json.clone();
        plain["endpoint"] = "http://push.example/x".into();
        assert!(Subscription::from_json(&plain).unwrap_err().to_string().contains("https"));
        let mut local = json.clone();
        local["endpoint"] = "http://127.0.0.1:9/x".into();
        assert!(Subscription::from_json(&local).is_ok(), "loopback, for a local push service");
        let mut short = json;
        short["keys"]["auth"] = B64.encode([1u8; 8]).into();
        assert!(Subscription::from_json(&short).is_err());
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
