//! Who may use the relay. Decided once per client connection, before it is
//! registered; logged without any payload (the relay never sees plaintext
//! anyway: QUIC is end-to-end between endpoints).

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::Mutex,
};

use iroh_base::EndpointId;
use iroh_relay::server::{Access, AccessControl, ClientRequest};
pub use thunderbolt_shared::allow_file::LiveAllowFile;
use thunderbolt_shared::allow_file::Reload;
use tracing::{info, warn};

/// The access policy in force.
#[derive(Debug)]
pub enum RelayAccess {
    Everyone,
    SharedToken(Vec<String>),
    AllowFile(LiveAllowFile),
    Allowlist(HashSet<EndpointId>),
    Denylist(HashSet<EndpointId>),
}

impl RelayAccess {
    pub fn describe(&self) -> String {
        match self {
            RelayAccess::Everyone => "everyone".into(),
            RelayAccess::SharedToken(t) => format!("shared_token ({} token(s))", t.len()),
            RelayAccess::AllowFile(f) => format!("allow_file {}", f.path().display()),
            RelayAccess::Allowlist(ids) => format!("allowlist ({} NodeId(s))", ids.len()),
            RelayAccess::Denylist(ids) => format!("denylist ({} NodeId(s))", ids.len()),
        }
    }

    fn decide(&self, req: &ClientRequest) -> Result<(), &'static str> {
        let id = req.endpoint_id();
        match self {
            RelayAccess::Everyone => Ok(()),
            RelayAccess::SharedToken(tokens) => {
                let presented = req
                    .auth_token()
                    .or_else(|| req.query_pairs().find(|(k, _)| k == "token").map(|(_, v)| v.into_owned()));
                match presented {
                    Some(p) if tokens.iter().any(|t| same(t.as_bytes(), p.as_bytes())) => Ok(()),
                    Some(_) => Err("wrong token"),
                    None => Err("no token"),
                }
            }
            RelayAccess::AllowFile(f) => f.contains(&id).then_some(()).ok_or("not in the allow file"),
            RelayAccess::Allowlist(ids) => ids.contains(&id).then_some(()).ok_or("not in the allowlist"),
            RelayAccess::Denylist(ids) => (!ids.contains(&id)).then_some(()).ok_or("in the denylist"),
        }
    }
}

/// Compares without an early exit, so response timing does not reveal how much
/// of a token was right.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The policy plus who is connected under it, so a policy that changes while
/// the relay runs (the allow file) can end the connections it no longer admits.
#[derive(Debug)]
pub struct Gatekeeper {
    pub policy: RelayAccess,
    /// Endpoint → its live connections (an endpoint may hold a few briefly).
    connected: Mutex<HashMap<EndpointId, usize>>,
}

impl Gatekeeper {
    pub fn new(policy: RelayAccess) -> Self {
        Self { policy, connected: Mutex::new(HashMap::new()) }
    }

    /// Connected endpoints the allow file no longer lists (re-read if it changed).
    /// Empty for every other policy: those cannot change at run time.
    pub fn revoked(&self) -> Vec<EndpointId> {
        let RelayAccess::AllowFile(file) = &self.policy else { return Vec::new() };
        let ids: Vec<EndpointId> =
            self.connected.lock().unwrap_or_else(|p| p.into_inner()).keys().copied().collect();
        ids.into_iter().filter(|id| !file.contains(id)).collect()
    }
}

impl AccessControl for Gatekeeper {
    async fn on_connect(&self, req: &ClientRequest) -> Access {
        let id = req.endpoint_id();
        match self.policy.decide(req) {
            Ok(()) => {
                info!(endpoint = %id.fmt_short(), "client connected: {id}");
                *self.connected.lock().unwrap_or_else(|p| p.into_inner()).entry(id).or_default() += 1;
                Access::Allow
            }
            Err(why) => {
                warn!(endpoint = %id.fmt_short(), "client refused: {id}: {why}");
                Access::Deny { reason: Some(why.to_string()) }
            }
        }
    }

    fn on_disconnect(&self, endpoint_id: EndpointId, _connection_id: iroh_relay::server::ConnectionId) {
        info!(endpoint = %endpoint_id.fmt_short(), "client disconnected");
        let mut connected = self.connected.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = connected.get_mut(&endpoint_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                connected.remove(&endpoint_id);
            }
        }
    }
}

/// A thunderbolt allow file, re-read when it changes (so adding a device
/// admits it without a restart); the reader is the bridge's own.
pub fn live_allow_file(path: PathBuf) -> LiveAllowFile {
    let shown = path.display().to_string();
    LiveAllowFile::new(path, move |r| match r {
        Reload::Loaded(parsed) => {
            for bad in &parsed.bad_lines {
                warn!("{shown}:{}: ignored: {}", bad.line_no, bad.error);
            }
            info!("loaded {} NodeId(s) from {shown}", parsed.ids.len());
        }
        // Fail closed: an unreadable allow file admits nobody.
        Reload::Broken(e) => warn!("{e}; refusing everyone until it is readable"),
    })
}
