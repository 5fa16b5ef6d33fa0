//! The bridge's VAPID identity (RFC 8292): its P-256 key, made once and never
//! replaced, and the signed token each push request carries. Separate because
//! it is the one long-lived secret of Web Push, kept on disk, while the rest
//! of push is per notice or per subscription.

use std::time::Duration;

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64, Engine};
use ring::{
    rand::SystemRandom,
    signature::{self, EcdsaKeyPair, KeyPair},
};

use super::PushError;
use crate::{
    devices::now_ms,
    home::{self, Home},
};

/// How long a VAPID token is good for (RFC 8292 allows at most 24 hours).
const VAPID_VALID: Duration = Duration::from_secs(12 * 3600);

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

#[cfg(test)]
mod tests {
    use super::*;

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
