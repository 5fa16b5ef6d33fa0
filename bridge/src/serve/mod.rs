//! The serving core: accept connections, admit trusted peers, run one agent
//! per session.
//!
//! One bridge serves one agent or many ([`crate::host`]): each agent on an
//! endpoint of its own (its own NodeId, so every client, including those that
//! pick no agent, reaches it by its ticket), all through one admission: one
//! gate, one handshake cap, one pool of agent slots, one registry of
//! sessions, one heartbeat. What differs per agent ([`AgentConfig`]: who may
//! reach it, how its sessions run) is looked up per connection.
//!
//! A connection's walk, one room each, in order:
//! [`accept`] (the door its ALPN opens, the accept loop) → [`gate`] (rate
//! limits before any crypto) → [`admit`] (handshake, trust, registration) →
//! [`enter`] (attach to a running session or start one, in a [`slots`] slot)
//! → [`sessions`] (a hub that outlives its connections, when resumable or
//! warm) → [`session`] (one agent process, every way it ends) over
//! [`pump`] (ndjson both ways) and [`agent`] (the process, reaped by
//! [`reaper`]). Beside the walk: [`bridge`] (the running bridge, its
//! heartbeat and the host's changes), [`served`] (an agent as served),
//! [`taps`] (what observes a session: status, notices), [`extension`] (the
//! bridge's own `_thunderbolt/` methods), [`pair`] (the pairing door),
//! [`files`] (the files door),
//! [`status`] (what the local API reads), [`stderr`] (the agent's stderr:
//! logged, its last line kept), [`wss`] (the loopback WebSocket transport),
//! [`relay_health`], [`requests`], [`throttle`].
//!
//! Task ownership is explicit: each agent's accept loop and every connection
//! task run on one `TaskTracker`; shutdown cancels a token every session
//! watches, then waits for all of them so no agent outlives the bridge.

pub mod accept;
pub mod admit;
pub mod agent;
pub mod answer;
pub mod bridge;
pub mod enter;
pub mod extension;
pub mod files;
pub mod gate;
pub mod joining;
pub mod pair;
pub mod pump;
pub mod reach_door;
pub mod reaper;
pub mod relay_health;
pub mod requests;
pub mod served;
pub mod session;
pub mod sessions;
pub mod share;
pub mod slots;
pub mod standing;
pub mod status;
pub mod stderr;
pub mod taps;
pub mod throttle;
pub mod wss;

pub use admit::Admission;
pub(crate) use bridge::Shared;
pub use bridge::{Bridge, Change, Stores};
pub use served::{AgentConfig, AgentName, Served, REASON_AGENT_REMOVED};
