//! Account trust: the devices of the account this bridge is logged in to are
//! admitted without `iroh allow`.
//!
//! Present only when a credential exists: `THUNDERBOLT_TOKEN` (a personal access
//! token, sent as `x-api-key`) with `THUNDERBOLT_CLOUD_URL`, or the credential
//! stored by `thunderbolt login` (a session token, sent as `Authorization:
//! Bearer`). At start the bridge registers itself (`POST {base}/devices/bridge`)
//! and primes the allowlist (`GET {base}/devices/allowlist`); the heartbeat
//! refreshes it. No failure here ever stops the bridge: account trust is
//! switched off (or keeps its last good list) with a log line saying why, and
//! the manual allow file keeps working.
//!
//! Split by concern: [`credential`] (where the token comes from),
//! [`backend`] (the HTTP contract), [`state`] (the trust layer it feeds); this
//! module starts and refreshes them.

pub mod backend;
pub mod credential;
pub mod state;

use iroh::EndpointId;
use tracing::{info, warn};

pub use backend::{Backend, BackendError};
pub use credential::{credential_path, load_credential, store_credential, Credential, CredentialError};
pub use state::{AccountStatus, AccountTrust, OffReason};

/// The account side of a running bridge: the backend and the trust it feeds.
#[derive(Debug)]
pub struct Account {
    pub backend: Backend,
    pub trust: std::sync::Arc<AccountTrust>,
    pub own: EndpointId,
}

impl Account {
    /// Registers the bridge and primes the list. Never fails: problems switch
    /// account trust off (registration) or leave the list empty until the next
    /// heartbeat (the first fetch), each with a log line.
    pub async fn start(backend: Backend, own: EndpointId, name: &str) -> Self {
        let trust = std::sync::Arc::new(AccountTrust::off(OffReason::Starting));
        let base = backend.base().to_string();
        match backend.register(&own, name).await {
            Ok(()) => {
                info!("registered this bridge with the account at {base} as '{name}'");
                trust.enable(base.clone());
            }
            Err(e) => {
                warn!("account trust is off for this run: registering the bridge failed: {e}");
                trust.disable(OffReason::RegistrationFailed(e.to_string()));
                return Self { backend, trust, own };
            }
        }
        let me = Self { backend, trust, own };
        me.refresh().await;
        me
    }

    /// One heartbeat refresh. A failure keeps the last good list.
    pub async fn refresh(&self) {
        if !self.trust.is_enabled() {
            return;
        }
        match self.backend.allowlist().await {
            Ok(ids) => self.apply(ids),
            Err(e) => warn!("account allowlist refresh failed, keeping the last good list: {e}"),
        }
    }

    /// Applies a freshly fetched list to this NodeId's account trust.
    fn apply(&self, ids: std::collections::HashSet<EndpointId>) {
        let n = ids.len();
        if self.trust.apply(&self.own, ids) {
            tracing::debug!("account allowlist refreshed: {n} device(s)");
        } else {
            warn!(
                node = %self.own.fmt_short(),
                "this bridge is no longer on its account's device list: it was revoked. \
                 Account trust is off; account sessions are being closed; peers in the \
                 manual allow file keep working"
            );
        }
    }
}

/// One heartbeat for every NodeId a host registered (each hosted agent is a
/// device of the account): the list is fetched once, with the first
/// account's credential (they share one), and applied to each. A NodeId the
/// account no longer lists turns off that agent's account trust only.
pub async fn refresh_all(accounts: &[std::sync::Arc<Account>]) {
    let enabled: Vec<&std::sync::Arc<Account>> = accounts.iter().filter(|a| a.trust.is_enabled()).collect();
    let Some(first) = enabled.first() else { return };
    match first.backend.allowlist().await {
        Ok(ids) => {
            for a in enabled {
                a.apply(ids.clone());
            }
        }
        Err(e) => warn!("account allowlist refresh failed, keeping the last good list: {e}"),
    }
}

/// The name the bridge registers under and that paired devices list its
/// agents under: `THUNDERBOLT_HOST_NAME` when set (two hosts on one machine, or
/// a hostname that says nothing to a person), else the hostname, else "Bridge".
pub fn device_name() -> String {
    if let Some(n) = std::env::var("THUNDERBOLT_HOST_NAME").ok().filter(|n| !n.trim().is_empty()) {
        return n.trim().to_string();
    }
    // The kernel's own copy (Linux), then what `hostname` prints (elsewhere).
    let from_proc = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    let name = from_proc.or_else(|| {
        let out = std::process::Command::new("hostname").stderr(std::process::Stdio::null()).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    });
    match name.map(|n| n.trim().to_string()) {
        Some(n) if !n.is_empty() => n,
        _ => "Bridge".to_string(),
    }
}
