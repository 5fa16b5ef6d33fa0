//! An agent as the bridge serves it: its name, who may reach it and how its
//! sessions run ([`AgentConfig`], swapped whole when its manifest changes),
//! on its endpoint ([`Served`]).

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc, RwLock,
};

use iroh::Endpoint;
use thunderbolt_shared::close;
use tokio_util::sync::CancellationToken;

use crate::{
    serve::{relay_health, session::SessionConfig},
    trust::{account::Account, TrustPolicy},
};

/// Close reason for the sessions of an agent the host stopped serving (its
/// manifest was removed, or changed its identity or protocol).
pub const REASON_AGENT_REMOVED: &str = close::REASON_AGENT_REMOVED;

/// Which agent a session belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AgentName {
    /// The single-agent bridge's one agent (`thunderbolt acp --transport
    /// iroh -- …`): its log lines name no agent, and it pairs with the codes
    /// `iroh pair` mints for that bridge.
    Single,
    /// One of a host's agents, by its manifest's `name`.
    Hosted(Arc<str>),
}

impl AgentName {
    pub fn hosted(name: &str) -> Self {
        Self::Hosted(name.into())
    }

    /// What `status` and the log show: the manifest's name, empty for the
    /// single agent (as it always was on the wire).
    pub fn as_str(&self) -> &str {
        match self {
            Self::Single => "",
            Self::Hosted(n) => n,
        }
    }

    /// The name a device's scope gives it: a host's agent by its
    /// manifest's name, a single-agent bridge's by its protocol (`acp`).
    pub fn scope_name(&self, protocol: &str) -> String {
        self.manifest_name().unwrap_or(protocol).to_string()
    }

    /// The manifest's name of a host's agent.
    pub fn manifest_name(&self) -> Option<&str> {
        match self {
            Self::Single => None,
            Self::Hosted(n) => Some(n),
        }
    }
}

impl std::fmt::Display for AgentName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One agent as the bridge serves it: who may reach it and how its sessions
/// run. Swapped whole when its manifest changes: new sessions get the new one,
/// running sessions keep the one they started with.
#[derive(Debug)]
pub struct AgentConfig {
    /// Its name (in the log: a hosted agent's lines carry it).
    pub name: AgentName,
    /// Shown to people (`thunderbolt status`).
    pub label: Arc<str>,
    /// `acp`, `mcp`.
    pub protocol: String,
    pub trust: Arc<dyn TrustPolicy>,
    pub session: Arc<SessionConfig>,
    /// Live sessions of this agent at once, beside the bridge-wide agent cap.
    pub max_sessions: Option<usize>,
    /// The account side of this agent's NodeId, when account trust is on.
    pub account: Option<Arc<Account>>,
    /// A host's agent on the protocol's single-agent bridge identity
    /// (`"identity": "acp"`): codes minted for that bridge (`iroh pair`) pair
    /// with it too.
    pub bridge_identity: bool,
    /// Whether it admits your own devices (the allow file, the account): a
    /// code minted for the single-agent bridge then adds the device to the
    /// allow file, as that bridge would.
    pub own_devices: bool,
}

/// An agent on its endpoint.
#[derive(Debug)]
pub struct Served {
    pub endpoint: Endpoint,
    config: RwLock<Arc<AgentConfig>>,
    /// Its sessions with an agent running (for `max_sessions`).
    live: AtomicUsize,
    /// Cancelled when the host stops serving it.
    pub(crate) stop: CancellationToken,
    /// How its endpoint's home relay is doing.
    pub relay: relay_health::RelayHealth,
}

impl Served {
    pub fn new(endpoint: Endpoint, config: AgentConfig) -> Arc<Self> {
        Arc::new(Self {
            endpoint,
            config: RwLock::new(Arc::new(config)),
            live: AtomicUsize::new(0),
            stop: CancellationToken::new(),
            relay: relay_health::RelayHealth::default(),
        })
    }

    pub fn config(&self) -> Arc<AgentConfig> {
        self.config.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// New sessions run with `config` from now on.
    pub fn replace(&self, config: AgentConfig) {
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
    }

    pub fn name(&self) -> AgentName {
        self.config().name.clone()
    }

    /// Its ticket as served now: its relay and direct addresses, with every
    /// relay of ours it is configured with.
    pub fn ticket(&self) -> thunderbolt_shared::EndpointTicket {
        thunderbolt_shared::EndpointTicket::new(crate::net::ticket_addr(
            self.endpoint.addr(),
            &self.relay.relays(),
        ))
    }

    /// Sessions of this agent with an agent process now.
    pub fn live_sessions(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// One of this agent's `max_sessions`, or `None` when all are taken.
    pub(crate) fn take_session(self: &Arc<Self>, cfg: &AgentConfig) -> Option<LiveGuard> {
        let max = cfg.max_sessions.unwrap_or(usize::MAX);
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| LiveGuard(self.clone()))
    }
}

/// A live session of an agent: counted until dropped.
pub(crate) struct LiveGuard(Arc<Served>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}
