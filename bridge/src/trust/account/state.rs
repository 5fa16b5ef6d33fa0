//! The account layer of trust as the bridge sees it right now: on or off (and
//! why), and the devices the account lists.

use std::{collections::HashSet, sync::RwLock};

use iroh::EndpointId;

use crate::trust::{Grant, TrustPolicy};

/// Why account trust is off. Shown in the banner and the log as
/// `off (<reason>)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffReason {
    /// Before registration finished.
    Starting,
    /// Neither the environment nor `thunderbolt login` gave a credential.
    NoCredential,
    /// A credential exists but cannot be used (its message says why).
    BadCredential(String),
    /// The backend refused or failed the registration at start.
    RegistrationFailed(String),
    /// A heartbeat found this bridge's NodeId gone from the account's list.
    Revoked,
}

impl std::fmt::Display for OffReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Starting => f.write_str("starting"),
            Self::NoCredential => f.write_str(
                "no credential: set THUNDERBOLT_TOKEN and THUNDERBOLT_CLOUD_URL, or run `thunderbolt login`",
            ),
            Self::BadCredential(why) => f.write_str(why),
            Self::RegistrationFailed(why) => write!(f, "registration failed: {why}"),
            Self::Revoked => {
                f.write_str("this device was revoked on the account (its NodeId left the account list)")
            }
        }
    }
}

/// Account trust's state, for the banner and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccountStatus {
    /// Registered with the account at `base`; `devices` NodeIds listed.
    On {
        base: String,
        devices: usize,
    },
    Off(OffReason),
}

impl std::fmt::Display for AccountStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::On { base, devices } => write!(f, "on (account at {base}, {devices} device(s) listed)"),
            Self::Off(why) => write!(f, "off ({why})"),
        }
    }
}

/// The account layer of trust.
#[derive(Debug)]
pub struct AccountTrust {
    state: RwLock<State>,
    /// Whether a list was ever fetched (until then an empty list says
    /// nothing about who is allowed): what a restore waits for.
    primed: tokio::sync::watch::Sender<bool>,
}

#[derive(Debug, Clone)]
struct State {
    /// The backend's base URL while on; why it is off otherwise.
    on: Result<String, OffReason>,
    ids: HashSet<EndpointId>,
}

impl AccountTrust {
    pub fn off(why: OffReason) -> Self {
        Self {
            state: RwLock::new(State { on: Err(why), ids: HashSet::new() }),
            primed: tokio::sync::watch::channel(false).0,
        }
    }

    /// Whether the account's device list was fetched at least once.
    pub fn is_primed(&self) -> bool {
        *self.primed.borrow()
    }

    /// Returns once the account's device list was fetched (at once if it was).
    pub async fn primed(&self) {
        let mut rx = self.primed.subscribe();
        let _ = rx.wait_for(|p| *p).await;
    }

    pub fn is_enabled(&self) -> bool {
        self.read().on.is_ok()
    }

    pub fn status(&self) -> AccountStatus {
        let s = self.read();
        match &s.on {
            Ok(base) => AccountStatus::On { base: base.clone(), devices: s.ids.len() },
            Err(why) => AccountStatus::Off(why.clone()),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn set(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.state.write().unwrap_or_else(|p| p.into_inner()));
    }

    /// Registered with the account at `base`.
    pub fn enable(&self, base: String) {
        self.set(|s| s.on = Ok(base));
    }

    pub fn disable(&self, why: OffReason) {
        self.set(|s| {
            s.on = Err(why);
            s.ids.clear();
        });
    }

    /// Applies a freshly fetched list. Returns false when the list shows this
    /// bridge was revoked (a non-empty list without our own NodeId): account
    /// trust is then switched off.
    pub fn apply(&self, own: &EndpointId, ids: HashSet<EndpointId>) -> bool {
        if !ids.is_empty() && !ids.contains(own) {
            self.disable(OffReason::Revoked);
            return false;
        }
        self.set(|s| s.ids = ids);
        self.primed.send_replace(true);
        true
    }
}

impl TrustPolicy for AccountTrust {
    fn check(&self, peer: &EndpointId) -> Option<Grant> {
        let s = self.read();
        (s.on.is_ok() && s.ids.contains(peer)).then_some(Grant::Account)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_revocation() {
        let me = iroh::SecretKey::from_bytes(&[1; 32]).public();
        let peer = iroh::SecretKey::from_bytes(&[2; 32]).public();
        let t = AccountTrust::off(OffReason::Starting);
        t.enable("https://a.example/v1/".into());
        assert!(t.apply(&me, [me, peer].into()));
        assert_eq!(t.check(&peer), Some(Grant::Account));
        assert_eq!(t.status(), AccountStatus::On { base: "https://a.example/v1/".into(), devices: 2 });
        // An empty list is not a revocation (new account, or a backend hiccup).
        assert!(t.apply(&me, HashSet::new()));
        assert!(t.is_enabled());
        assert!(t.apply(&me, [me, peer].into()));
        assert!(!t.apply(&me, [peer].into()));
        assert!(!t.is_enabled());
        assert_eq!(t.check(&peer), None);
        assert_eq!(t.status(), AccountStatus::Off(OffReason::Revoked));
    }

    /// The banner's words are part of the CLI: they stay as they were when
    /// the status was a string.
    #[test]
    fn status_words() {
        let on = AccountStatus::On { base: "https://a.example/v1/".into(), devices: 3 };
        assert_eq!(on.to_string(), "on (account at https://a.example/v1/, 3 device(s) listed)");
        assert_eq!(
            AccountStatus::Off(OffReason::RegistrationFailed("x".into())).to_string(),
            "off (registration failed: x)"
        );
        assert_eq!(
            AccountStatus::Off(OffReason::NoCredential).to_string(),
            "off (no credential: set THUNDERBOLT_TOKEN and THUNDERBOLT_CLOUD_URL, or run `thunderbolt login`)"
        );
    }
}
