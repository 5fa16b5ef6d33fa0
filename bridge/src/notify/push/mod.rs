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

mod encrypt;
mod file;
mod registry;
mod subscription;
mod vapid;

use std::path::PathBuf;

pub use encrypt::encrypt;
pub use file::Subscriptions;
pub use registry::{AddError, Registry};
pub use subscription::Subscription;
pub use vapid::Vapid;

/// Longest notice before encryption: 4096 bytes of body, less the header
/// (86), the padding delimiter (1) and the tag (16).
pub const MAX_PAYLOAD: usize = 3993;

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

/// What the tests of subscriptions, encryption and the registry share: a
/// valid subscription (to a fresh key) at any endpoint, and device ids.
#[cfg(test)]
mod test_support {
    use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64, Engine};
    use iroh::EndpointId;
    use ring::{agreement, rand::SystemRandom};

    use super::Subscription;
    use crate::notify::endpoint::Policy;

    pub(super) fn sub() -> Subscription {
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

    pub(super) const OFF: Policy = Policy { loopback_for_tests: false };

    pub(super) fn at(endpoint: &str) -> Subscription {
        Subscription { endpoint: endpoint.to_string(), ..sub() }
    }

    pub(super) fn id(n: u8) -> EndpointId {
        iroh::SecretKey::from_bytes(&[n; 32]).public()
    }
}
