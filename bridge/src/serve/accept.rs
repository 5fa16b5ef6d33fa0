//! The way in: which door each ALPN opens, the ALPN list an agent's
//! endpoint offers (built here only), and the accept loop that owns every
//! connection's task.

use std::sync::Arc;

use thunderbolt_shared::{answer, files, pairing, reach, resume, Protocol};
use tracing::Instrument;

use super::{admit, bridge::Shared, relay_health, served::Served, AgentName};

/// What a connection came for, by its ALPN's suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// `thunderbolt/<p>/0`: a plain session (or a warm agent's).
    Plain,
    /// `thunderbolt/<p>/r1`: a resumable session, new or resumed.
    Resumable,
    /// `thunderbolt/<p>/pair1`: a device pairing with a one-time code.
    Pair,
    /// `thunderbolt/<p>/answer1`: a device answering the agent from a notice.
    Answer,
    /// `thunderbolt/<p>/files1`: a device putting or getting files.
    Files,
    /// `thunderbolt/<p>/reach1`: one of the owner's devices reading or
    /// answering the messages sent to it.
    Reach,
}

impl Door {
    /// The door `alpn` opens. The endpoint accepts only the ALPNs of
    /// [`alpns`], so anything but `/r1`, `/pair1`, `/answer1`, `/files1` and `/reach1` is
    /// the plain one.
    pub fn of(alpn: &[u8]) -> Self {
        if alpn.ends_with(resume::RESUME_ALPN_SUFFIX) {
            Self::Resumable
        } else if alpn.ends_with(pairing::PAIR_ALPN_SUFFIX) {
            Self::Pair
        } else if alpn.ends_with(answer::ANSWER_ALPN_SUFFIX) {
            Self::Answer
        } else if alpn.ends_with(files::FILES_ALPN_SUFFIX) {
            Self::Files
        } else if alpn.ends_with(reach::REACH_ALPN_SUFFIX) {
            Self::Reach
        } else {
            Self::Plain
        }
    }
}

/// The ALPNs an agent's endpoint serves. The server's order decides (rustls
/// picks its first ALPN the client offers): `r1` first when its sessions
/// resume, so a client offering both gets the resumable protocol; then the
/// plain one; then pairing (devices that pair with a one-time code),
/// answering from a notice, files and messages.
pub fn alpns(protocol: &Protocol, resumable: bool) -> Vec<Vec<u8>> {
    let mut v = Vec::with_capacity(6);
    if resumable {
        v.push(resume::resume_alpn(protocol));
    }
    v.push(protocol.alpn());
    v.push(pairing::pair_alpn(protocol));
    v.push(answer::answer_alpn(protocol));
    v.push(files::files_alpn(protocol));
    v.push(reach::reach_alpn(protocol));
    v
}

/// Starts accepting connections for `agent`: each one is admitted in a task
/// of the bridge's tracker (shutdown waits for all of them).
pub(super) fn spawn_accept(shared: &Arc<Shared>, agent: Arc<Served>) {
    let s = shared.clone();
    let name = agent.name();
    let agent_for_relay = agent.clone();
    let accept = async move {
        loop {
            let incoming = tokio::select! {
                i = agent.endpoint.accept() => i,
                _ = agent.stop.cancelled() => break,
                _ = s.shutdown.cancelled() => break,
            };
            let Some(incoming) = incoming else { break };
            let task = admit::admit(incoming, s.clone(), agent.clone());
            s.tasks.spawn(task.in_current_span());
        }
    };
    // Ends with the agent as well as with the bridge: it holds the agent, and
    // with it the endpoint and its sockets, for as long as it runs.
    let relay = {
        let (agent_stop, shutdown) = (agent_for_relay.stop.clone(), shared.shutdown.clone());
        let (ep, relays) = (agent_for_relay.endpoint.clone(), agent_for_relay.relay.relays());
        async move {
            let rehome = crate::net::keep_a_home_relay(ep, relays);
            tokio::select! {
                _ = futures::future::join3(
                    relay_health::watch(agent_for_relay.clone(), agent_stop.clone()),
                    relay_health::probe(agent_for_relay, agent_stop.clone()),
                    async {
                        tokio::select! { _ = rehome => {}, _ = agent_stop.cancelled() => {} }
                    },
                ) => {}
                _ = shutdown.cancelled() => {}
            }
        }
    };
    match name {
        // The single agent's lines are as they always were: no agent name.
        AgentName::Single => {
            shared.tasks.spawn(accept);
            shared.tasks.spawn(relay);
        }
        AgentName::Hosted(name) => {
            let span = tracing::info_span!("agent", name = %name);
            shared.tasks.spawn(accept.instrument(span.clone()));
            shared.tasks.spawn(relay.instrument(span));
        }
    }
}
