//! A browser's push subscription: read from what the page sends, and checked
//! (an endpoint the policy admits, within its length, a P-256 key and a
//! 16-byte secret). Separate because it is untrusted input from a device,
//! checked once here whether it comes from the page or from `push.json`.

use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64, Engine};
use serde::{Deserialize, Serialize};

use super::{PushError, MAX_ENDPOINT};
use crate::notify::endpoint::Policy;

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
    /// `policy` admits ([`crate::notify::endpoint::check_url`]: https to a public
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
        crate::notify::endpoint::check_url(&url, policy)?;
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
pub(super) fn decode_b64(text: &str) -> Option<Vec<u8>> {
    let t = text.trim().trim_end_matches('=');
    B64.decode(t).ok().or_else(|| base64::engine::general_purpose::STANDARD_NO_PAD.decode(t).ok())
}

#[cfg(test)]
mod tests {
    use base64::{engine::general_purpose::URL_SAFE_NO_PAD as B64, Engine};

    use super::*;
    use crate::notify::push::test_support::{sub, OFF};

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
}
