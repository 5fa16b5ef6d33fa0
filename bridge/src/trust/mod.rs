//! Who may connect: the policy the bridge asks after every handshake.
//!
//! Kept as a small trait so the account allowlist (refreshed from the backend)
//! and the manual allow file compose, and tests can reason about each alone.

pub mod account;
pub mod allowfile;

use std::sync::Arc;

use iroh::EndpointId;

use crate::trust::allowfile::LiveAllowFile;

/// Why a peer was admitted; revocation re-checks sessions by this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// Listed by the account backend.
    Account,
    /// Listed in the manual allow file.
    Manual,
    /// Named in the agent's manifest (`accept_from`).
    Manifest,
    /// Paired with this agent of the host by a one-time code.
    Paired,
    /// A share's guest: someone else's device, into one session only.
    Shared,
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Grant::Account => "account",
            Grant::Manual => "allow file",
            Grant::Manifest => "the agent's accept_from",
            Grant::Paired => "paired with this agent",
            Grant::Shared => "a share of one session",
        })
    }
}

/// Decides whether a handshake-authenticated peer may use the bridge.
pub trait TrustPolicy: Send + Sync + std::fmt::Debug {
    fn check(&self, peer: &EndpointId) -> Option<Grant>;
}

/// The manual allow file, re-read on each check.
impl TrustPolicy for LiveAllowFile {
    fn check(&self, peer: &EndpointId) -> Option<Grant> {
        self.contains(peer).then_some(Grant::Manual)
    }
}

/// Who may reach a hosted agent (its manifest's `accept_from`): your own
/// devices (`own`: the account and the allow file), peers it names, and the
/// devices that paired with it by a code (`paired`).
#[derive(Debug)]
pub struct AcceptFrom {
    pub own: Option<Arc<dyn TrustPolicy>>,
    pub ids: std::collections::HashSet<EndpointId>,
    pub paired: Option<Arc<dyn TrustPolicy>>,
}

impl TrustPolicy for AcceptFrom {
    fn check(&self, peer: &EndpointId) -> Option<Grant> {
        if let Some(g) = self.own.as_ref().and_then(|o| o.check(peer)) {
            return Some(g);
        }
        if self.ids.contains(peer) {
            return Some(Grant::Manifest);
        }
        self.paired.as_ref().and_then(|p| p.check(peer))
    }
}

/// Account list first (it short-circuits), then the manual file.
#[derive(Debug)]
pub struct Layered {
    pub layers: Vec<Arc<dyn TrustPolicy>>,
}

impl TrustPolicy for Layered {
    fn check(&self, peer: &EndpointId) -> Option<Grant> {
        self.layers.iter().find_map(|l| l.check(peer))
    }
}
