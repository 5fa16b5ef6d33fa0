//! Which path a connection's data takes: through the relay, or direct (UDP
//! between the two machines, hole-punched through NATs when needed). iroh
//! starts on whichever works first and moves to a direct path when it finds
//! one; users see it in the log, when chosen and whenever it changes.

use futures::StreamExt;
use iroh::{
    endpoint::{Connection, PathEvent},
    RelayUrl, TransportAddr,
};
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info, Instrument};

/// The kind of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    Relay,
    Direct,
}

impl PathKind {
    pub fn of(addr: &TransportAddr) -> Self {
        if addr.is_relay() {
            Self::Relay
        } else {
            Self::Direct
        }
    }
}

impl std::fmt::Display for PathKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Relay => "relay",
            Self::Direct => "direct",
        })
    }
}

/// The path `conn` sends on now, if one is selected.
pub fn selected(conn: &Connection) -> Option<(PathKind, TransportAddr)> {
    conn.paths()
        .iter()
        .find(|p| p.is_selected())
        .map(|p| (PathKind::of(p.remote_addr()), p.remote_addr().clone()))
}

/// Logs `conn`'s path now and each time it changes, until the connection
/// closes or the handle is dropped. `peer` names the other side in the log.
pub fn log_changes(conn: &Connection, peer: String) -> AbortOnDropHandle<()> {
    let mut events = conn.path_events();
    let first = selected(conn);
    AbortOnDropHandle::new(tokio::spawn(
        async move {
            let mut last = first.as_ref().map(|(k, _)| *k);
            if let Some((kind, addr)) = first {
                info!(peer = %peer, "path: {kind} ({addr})");
            }
            while let Some(event) = events.next().await {
                match event {
                    PathEvent::Selected { remote_addr, .. } => {
                        let kind = PathKind::of(&remote_addr);
                        match last.replace(kind) {
                            Some(was) if was != kind => {
                                info!(peer = %peer, "path changed: {kind} ({remote_addr}), was {was}")
                            }
                            Some(_) => debug!(peer = %peer, "path: {kind} ({remote_addr})"),
                            None => info!(peer = %peer, "path: {kind} ({remote_addr})"),
                        }
                    }
                    PathEvent::Lagged { missed, .. } => debug!(peer = %peer, "{missed} path event(s) missed"),
                    _ => {}
                }
            }
        }
        .in_current_span(),
    ))
}

/// Resolves, with the relay and why, once the relay `conn`'s selected path
/// goes through is gone: it refuses, or does not answer its `/ping` in time
/// ([`crate::net::RelayCheck`]: a relay that went silent, a TCP black hole,
/// still takes TCP connections) while nothing came in on the connection
/// meanwhile. Asked every [`crate::net::RELAY_CHECK_EVERY`], only while the
/// path is a relay's: a dead relay takes its paths with it, and QUIC by
/// itself notices only at the idle timeout (10 s by default). The caller
/// drops the connection and redials (through another relay, once the bridge
/// re-homed on it).
pub async fn relay_gone(conn: &Connection, check: &crate::net::RelayCheck) -> (RelayUrl, String) {
    use crate::net::Answer;
    if crate::net::failover_off() {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(crate::net::RELAY_CHECK_EVERY).await;
        let Some((PathKind::Relay, TransportAddr::Relay(url))) = selected(conn) else { continue };
        let heard = conn.stats().udp_rx.datagrams;
        match check.ping(&url).await {
            Answer::Refused(why) => return (url, format!("the relay it went through is gone: {why}")),
            // A relay slow to answer (its uplink full, a busy machine) that
            // still carries the connection is not gone.
            Answer::Silent(why) if conn.stats().udp_rx.datagrams == heard => {
                return (url, format!("the relay it went through is gone: {why}"));
            }
            Answer::Silent(why) => debug!("{why}, but the connection through it still carries: not gone"),
            Answer::Alive | Answer::Unknown(_) => {}
        }
    }
}
