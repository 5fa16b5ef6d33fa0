//! Admission, top-down: one connection from its first packet to its session.
//!
//! 1. the [`gate`](super::gate): the remote's budget and the handshake cap,
//!    before any crypto;
//! 2. the handshake (bounded by `--handshake-timeout`);
//! 3. the [door](super::accept::Door) its ALPN names: a pairing goes to
//!    [`pair`](super::pair), a session on;
//! 4. trust: the agent's [`TrustPolicy`](crate::trust::TrustPolicy) admits
//!    the peer or it is refused `not allowlisted`; an allowed device is
//!    charged its own budget ([`Gate::proved`](super::gate::Gate::proved),
//!    `bridge at capacity` past it) instead of its address's (an answer from
//!    a notice goes to [`answer`](super::answer) here, and files to
//!    [`files`](super::files): they need no slot);
//! 5. the session is registered (so a revocation or removal finds it), trust
//!    asked once more, and its stream awaited;
//! 6. [`enter`](super::enter): attach to the session the connection names, or
//!    start a new one in a [slot](super::slots).

use std::{sync::Arc, time::Duration};

use iroh::{
    endpoint::{Connection, Incoming, IncomingAddr},
    EndpointId,
};
use thunderbolt_shared::close;
use tracing::{debug, info, warn};

use super::{
    accept::Door,
    bridge::Shared,
    enter,
    gate::{Drop as GateDrop, RemoteKey},
    served::{AgentConfig, Served, REASON_AGENT_REMOVED},
    session::{refuse, SessionInfo},
};
use crate::{
    devices::scope::{Verb, Verbs},
    ids,
    trust::Grant,
};
use thunderbolt_shared::files as files_wire;

/// Admission settings.
#[derive(Debug, Clone)]
pub struct Admission {
    pub max_agents: usize,
    /// Live sessions one guest (a peer that is not one of your own devices)
    /// may hold across every agent ([`crate::limits::per_device_cap`]).
    pub max_per_device: usize,
    /// Live sessions all guests together may hold ([`crate::limits::guests_cap`]).
    pub max_guests: usize,
    pub handshake_timeout: Duration,
    pub stream_open_timeout: Duration,
    /// How often trust is re-checked for open sessions (and the account list refreshed).
    pub heartbeat: Duration,
}

fn remote_key(addr: &IncomingAddr) -> RemoteKey {
    match addr {
        IncomingAddr::Relay { endpoint_id, .. } => RemoteKey::Endpoint(*endpoint_id),
        IncomingAddr::Ip(sa) => RemoteKey::Ip(sa.ip()),
        // Custom transports are not configured; key them all together.
        _ => RemoteKey::Ip(std::net::Ipv4Addr::UNSPECIFIED.into()),
    }
}

/// Takes one incoming connection of `agent`'s endpoint through admission.
pub(super) async fn admit(incoming: Incoming, shared: Arc<Shared>, agent: Arc<Served>) {
    let addr = incoming.remote_addr();
    let key = remote_key(&addr);
    let validated = incoming.remote_addr_validated();
    let handshake_slot = match shared.gate.admit(key, validated) {
        Ok(permit) => permit,
        Err(why @ (GateDrop::HandshakeCap | GateDrop::Unvalidated)) if !validated => {
            // Ask the sender to prove its address (one stateless packet). A
            // real client comes back validated: to a slot it may take over,
            // or to a handshake past its address's budget; a spoofed or
            // stalled one never holds state.
            let why = match why {
                GateDrop::Unvalidated => {
                    "over its address's budget, but an allowed device dialed from it lately"
                }
                _ => "handshake slots full",
            };
            debug!(%key, "{why}: asking for address validation (QUIC Retry)");
            if let Err(e) = incoming.retry() {
                debug!(%key, "retry failed: {e}");
            }
            return;
        }
        Err(why) => {
            if let Some(suppressed) = shared.gate.should_log_drop() {
                let why = match why {
                    GateDrop::RemoteBudget | GateDrop::Unvalidated => "over its connection budget",
                    GateDrop::HandshakeCap => "too many handshakes in flight",
                };
                warn!("dropping connections: {key} {why} ({suppressed} more dropped since the last report)");
            }
            incoming.ignore();
            return;
        }
    };
    if handshake_slot.receipt().past_budget() {
        debug!(%key, "handshake past the address's budget: an allowed device dialed from it lately");
    }
    debug!(%key, in_flight = shared.gate.handshakes_in_flight(), "handshake started");
    let from = format!("{addr:?}");
    let accepting = match incoming.accept() {
        Ok(a) => a,
        Err(e) => {
            debug!(%from, "incoming connection failed before the handshake: {e}");
            return;
        }
    };
    let conn = tokio::select! {
        r = tokio::time::timeout(shared.admission.handshake_timeout, accepting) => match r {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                debug!(%from, "handshake failed: {e}");
                return;
            }
            Err(_) => {
                info!(%from, "dropping connection: {}", close::REASON_HANDSHAKE_TIMEOUT);
                return;
            }
        },
        _ = handshake_slot.evicted() => {
            debug!(%from, "dropping a stalled handshake: its slot went to a newer connection");
            return;
        }
        _ = shared.shutdown.cancelled() => return,
    };
    let receipt = handshake_slot.receipt();
    drop(handshake_slot);
    let peer = conn.remote_id();
    // The agent as it is now: a manifest changed later applies to later sessions.
    let cfg = agent.config();
    let door = match Door::of(conn.alpn()) {
        Door::Pair => return super::pair::pair(conn, peer, &cfg, &shared).await,
        // A manifest that switched resuming off since this handshake began.
        Door::Resumable if cfg.session.resume.is_none() => Door::Plain,
        door => door,
    };
    let Some(grant) = cfg.trust.check(&peer) else {
        // A device whose scope ran out is told so, not taken for a stranger.
        if shared.stores().is_some_and(|s| s.devices.expired(&peer)) {
            info!(peer = %peer.fmt_short(), "refused {peer}: {} (its scope's --for ran out; thunderbolt devices scope gives it more)", close::REASON_SCOPE_EXPIRED);
            refuse(&conn, close::REASON_SCOPE_EXPIRED);
            return;
        }
        let budget =
            shared.refusal_log.lock().unwrap_or_else(|p| p.into_inner()).take(std::time::Instant::now());
        if let Some(suppressed) = budget {
            let more = if suppressed > 0 {
                format!(" ({suppressed} more refused since the last report)")
            } else {
                String::new()
            };
            info!(
                peer = %peer.fmt_short(),
                "refused {peer}: not allowlisted (to admit it: thunderbolt iroh allow {peer}){more}"
            );
        }
        refuse(&conn, close::REASON_NOT_ALLOWLISTED);
        return;
    };
    // An allowed device's dial is charged to the device, not to its address
    // (acpx and scripts dial once per prompt; strangers share the address).
    if let Err(over) = shared.gate.proved(peer, receipt) {
        if let Some(suppressed) = shared.gate.should_log_drop() {
            warn!(
                peer = %peer.fmt_short(),
                "refused {peer}: {} ({over}; {suppressed} more dropped or refused since the last report)",
                close::REASON_AT_CAPACITY
            );
        }
        refuse(&conn, close::REASON_AT_CAPACITY);
        return;
    }
    if door == Door::Answer {
        return super::answer::answer(conn, peer, &cfg, &shared).await;
    }
    let verbs = shared.verbs(&cfg, &peer);
    if door == Door::Files {
        if !verbs.has(Verb::Files) {
            info!(peer = %peer.fmt_short(), "refused {peer}'s files: {} (its scope: {verbs})", files_wire::REASON_NOT_PERMITTED);
            refuse(&conn, files_wire::REASON_NOT_PERMITTED);
            return;
        }
        return super::files::serve(conn, peer, shared, agent, cfg).await;
    }
    if door == Door::Reach {
        let scope = shared.stores().map(|s| s.devices.scope_of(&peer));
        if let Some(scope) = scope.filter(|s| !s.reads_messages()) {
            info!(peer = %peer.fmt_short(), "refused {peer}'s messages: its scope is {}", scope.describe());
            refuse(&conn, thunderbolt_shared::reach::REASON_NOT_OWN);
            return;
        }
        return super::reach_door::serve(conn, peer, grant, &shared).await;
    }
    admitted(conn, door, peer, grant, verbs, shared, agent, cfg).await;
}

/// What a connection's session runs with, from admission to its end.
pub(super) struct Admitted {
    pub(super) shared: Arc<Shared>,
    pub(super) agent: Arc<Served>,
    pub(super) cfg: Arc<AgentConfig>,
    pub(super) peer: EndpointId,
    pub(super) short: String,
    /// The plain session's (a hub has its own).
    pub(super) info: Arc<SessionInfo>,
    /// Why the peer was let in (guests have a cap of their own).
    pub(super) grant: Grant,
    /// What its scope lets it do here, as of its admission.
    pub(super) verbs: Verbs,
    /// A share's guest: the one session it may see and join.
    pub(super) share: Option<String>,
}

#[allow(clippy::too_many_arguments)]
async fn admitted(
    conn: Connection,
    door: Door,
    peer: EndpointId,
    grant: Grant,
    verbs: Verbs,
    shared: Arc<Shared>,
    agent: Arc<Served>,
    cfg: Arc<AgentConfig>,
) {
    let short = peer.fmt_short().to_string();
    let device = shared.stores().and_then(|s| s.devices.name_of(&peer));
    let named = device.as_deref().map(|d| format!(", device \"{d}\"")).unwrap_or_default();
    info!(peer = %short, "admitted {peer} ({grant}{named})");
    // Devices are the allow file's and the account's; a peer a manifest names is neither.
    let how = match grant {
        Grant::Account => Some(crate::devices::How::Account),
        Grant::Manual => Some(crate::devices::How::Allow),
        Grant::Paired => Some(crate::devices::How::Pairing),
        Grant::Shared => Some(crate::devices::How::Share),
        Grant::Manifest => None,
    };
    if let (Some(stores), Some(how)) = (shared.stores(), how) {
        tokio::task::spawn_blocking(move || stores.devices.seen(&peer, how));
    }
    let _path_log = crate::paths::log_changes(&conn, short.clone());
    let info = SessionInfo::new(ids::session_id(), cfg.name.clone(), peer);
    // A plain session is the connection itself; the others' own hubs say what they are.
    let plain = door == Door::Plain && cfg.session.keep_warm.is_none();
    let _registered = shared.sessions.insert(&conn, &agent, plain.then_some(&info));
    // Removed while this connection was in its handshake: after the insert,
    // so either the removal's close finds it or this sees the removal.
    if agent.stop.is_cancelled() {
        info!(peer = %short, "closing: {REASON_AGENT_REMOVED}");
        refuse(&conn, REASON_AGENT_REMOVED);
        return;
    }
    if !still_admitted(&conn, &agent, &peer, &short) {
        return;
    }
    let stream = tokio::select! {
        r = tokio::time::timeout(shared.admission.stream_open_timeout, conn.accept_bi()) => r,
        _ = shared.shutdown.cancelled() => {
            refuse(&conn, close::REASON_SHUTTING_DOWN);
            return;
        }
    };
    let (send, recv) = match stream {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            info!(peer = %short, "peer left before opening a stream: {e}");
            return;
        }
        Err(_) => {
            info!(peer = %short, "closing: {}", close::REASON_IDLE);
            refuse(&conn, close::REASON_IDLE);
            return;
        }
    };
    let share = shared.stores().and_then(|s| s.devices.scope_of(&peer).session);
    let a = Admitted { shared: shared.clone(), agent, cfg, peer, short, info, grant, verbs, share };
    enter::enter(conn, door, send, recv, a).await;
}

/// Whether `peer` is still admitted at `agent`, asked once its session is
/// registered: a deny (or an allow-file edit, a revocation) that lands between
/// the handshake's check and the registration finds nothing to end, so the
/// registered session looks again itself. Refuses the connection if not.
pub(super) fn still_admitted(conn: &Connection, agent: &Served, peer: &EndpointId, short: &str) -> bool {
    if agent.config().trust.check(peer).is_some() {
        return true;
    }
    info!(peer = %short, "closing {peer}: {} (while it was being admitted)", close::REASON_MEMBERSHIP_REVOKED);
    refuse(conn, close::REASON_MEMBERSHIP_REVOKED);
    false
}
