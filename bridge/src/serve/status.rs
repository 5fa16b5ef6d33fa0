//! What a running bridge is doing, as `thunderbolt status` shows it, and
//! what its operator can ask of it (end sessions now, re-check trust now).
//! The control API ([`crate::control`]) serves these over its socket, as
//! the [`LocalApi`] its types ([`crate::control::api`]) describe.

use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use iroh::endpoint::Connection;
use thunderbolt_shared::{close, node_id_base32};

use crate::{
    control::api::{
        AgentStatus, DeviceOnSession, LocalApi, RelayProbeStatus, RelayStatus, SessionStatus, Status,
    },
    paths,
    serve::{
        relay_health::RelayState,
        session::SessionInfo,
        sessions::{Hub, MemberView},
        Shared,
    },
};

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as u64
}

/// Path, RTT and bytes of a connection.
fn conn_view(conn: &Connection) -> (String, Option<f64>, u64, u64) {
    let path = match paths::selected(conn) {
        Some((kind, _)) => kind.to_string(),
        None => "none".to_string(),
    };
    let rtt = conn.paths().iter().find(|p| p.is_selected()).map(|p| p.rtt().as_secs_f64() * 1e3);
    let stats = conn.stats();
    (path, rtt, stats.udp_tx.bytes, stats.udp_rx.bytes)
}

fn session(
    info: &SessionInfo,
    state: &str,
    conn: Option<(&Connection, bool)>,
    waits: Option<Duration>,
    resumes: u64,
    device: Option<String>,
) -> SessionStatus {
    let (path, rtt_ms, bytes_sent, bytes_received) = match conn {
        Some((c, _)) => conn_view(c),
        None => ("none".to_string(), None, 0, 0),
    };
    SessionStatus {
        id: info.id.clone(),
        agent: info.agent.to_string(),
        peer: info.peer.to_string(),
        peer_short: info.peer.fmt_short().to_string(),
        device,
        since_ms: ms(info.started),
        state: state.to_string(),
        protocol: conn.map(|(_, r1)| if r1 { "r1" } else { "0" }.to_string()),
        path,
        rtt_ms,
        bytes_sent,
        bytes_received,
        waits_ms: waits.map(|d| d.as_millis() as u64),
        pid: info.pid(),
        resumes,
        restored: info.restored(),
        devices: Vec::new(),
    }
}

/// Every device on a hub's session, as `status` shows it.
fn devices_on(
    hub: &Hub,
    members: &[MemberView],
    devices: Option<&crate::devices::Devices>,
) -> Vec<DeviceOnSession> {
    // A share's guest is shown as one, with its end.
    let share_until = |node: &str| {
        let id = crate::devices::resolve_id(node)?;
        let s = devices?.scope_of(&id);
        s.session.as_ref()?;
        Some(s.until_ms.map_or_else(|| "no end".to_string(), crate::devices::rfc3339))
    };
    members
        .iter()
        .map(|m| DeviceOnSession {
            share_until: share_until(&m.device.node),
            id: format!("{}.{}", hub.short(), m.seat),
            peer: m.device.node.clone(),
            device: m.device.name.clone(),
            role: m.role.as_str().to_string(),
            attached: m.attached.is_some(),
            path: m.attached.as_ref().map_or_else(|| "none".to_string(), |c| conn_view(c).0),
            scope: (!m.verbs.is_all()).then(|| m.verbs.to_string()),
        })
        .collect()
}

/// What the control API asks of a running bridge.
#[derive(Debug, Clone)]
pub struct BridgeHandle {
    pub(crate) shared: Arc<Shared>,
    pub kind: &'static str,
    started: SystemTime,
}

impl BridgeHandle {
    pub(crate) fn new(shared: Arc<Shared>, kind: &'static str) -> Self {
        Self { shared, kind, started: SystemTime::now() }
    }

    pub fn status(&self) -> Status {
        let s = &self.shared;
        let devices = s.stores().map(|st| st.devices.all()).unwrap_or_default();
        let name = |info: &SessionInfo| devices.get(&info.peer).and_then(|d| d.name.clone());
        let mut agents: Vec<AgentStatus> = s
            .served()
            .values()
            .map(|a| {
                let cfg = a.config();
                let relay: RelayState = a.relay.get();
                let id = a.endpoint.id();
                AgentStatus {
                    name: cfg.name.to_string(),
                    label: cfg.label.to_string(),
                    protocol: cfg.protocol.clone(),
                    node_id: id.to_string(),
                    node_id_base32: node_id_base32(&id),
                    ticket: a.ticket().to_string(),
                    live_sessions: a.live_sessions(),
                    relay: RelayStatus {
                        url: relay.url.clone(),
                        connected: relay.connected,
                        since_ms: relay.since.map(ms),
                        drops: relay.drops,
                        relays: relay
                            .relays
                            .iter()
                            .map(|r| RelayProbeStatus {
                                home: relay.url.as_deref() == Some(r.url.as_str()),
                                url: r.url.clone(),
                                reachable: r.reachable,
                                latency_ms: r.latency_ms,
                                since_ms: r.since.map(ms),
                                last_error: r.last_error.clone(),
                            })
                            .collect(),
                        last_error: relay.last_error,
                    },
                }
            })
            .collect();
        agents.sort_by(|a, b| a.name.cmp(&b.name));
        let mut sessions: Vec<SessionStatus> = s
            .sessions
            .snapshot()
            .iter()
            .filter_map(|(_, conn, _, info)| {
                let info = info.as_ref()?;
                Some(session(info, "attached", Some((conn, false)), None, 0, name(info)))
            })
            .collect();
        let stores = s.stores();
        for hub in s.hubs.all() {
            let v = hub.view();
            if v.gone {
                continue;
            }
            let anyone = v.members.iter().any(|m| m.attached.is_some());
            let state = match (&v.attached, v.warm) {
                (Some(_), _) => "attached",
                (None, _) if anyone => "attached",
                (None, true) => "warm",
                (None, false) => "detached",
            };
            let conn = v.attached.as_ref().map(|(c, r1)| (c, *r1));
            let mut x = session(&v.info, state, conn, v.waiting, v.resumes, name(&v.info));
            if v.members.len() > 1 || v.members.iter().any(|m| m.seat > 0) {
                x.devices = devices_on(&hub, &v.members, stores.as_ref().map(|st| &*st.devices));
            }
            sessions.push(x);
        }
        sessions.sort_by_key(|x| x.since_ms);
        Status {
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            kind: self.kind.to_string(),
            started_ms: ms(self.started),
            agents,
            sessions,
            slots_used: s.admission.max_agents - s.agents.available_permits(),
            slots: s.admission.max_agents,
            reach_socket: s.reach.get().map(|r| r.socket().display().to_string()),
        }
    }

    /// Ends the sessions `target` names (a session id, or a peer's NodeId or
    /// device name) now, with code 1 `ended by the host`. Returns how many;
    /// a device name two devices share ends nothing and says so.
    pub fn kick(&self, target: &str) -> Result<usize, crate::devices::Unresolved> {
        let peer = match self.shared.stores() {
            Some(st) => match st.devices.resolve(target) {
                Ok(id) => Some(id),
                Err(crate::devices::Unresolved::Unknown) => None,
                Err(e) => return Err(e),
            },
            None => crate::devices::resolve_id(target),
        };
        let matches = |info: &SessionInfo| info.id == target || peer.is_some_and(|p| p == info.peer);
        let mut n = 0;
        // A share's guest kicked is out for good: its code was spent, and
        // nothing else admits it.
        let mut kicked = Vec::new();
        for (_, conn, _, info) in self.shared.sessions.snapshot() {
            if info.as_ref().is_some_and(|i| matches(i)) {
                let info = info.expect("matched");
                tracing::info!(peer = %info.peer.fmt_short(), session = %info.id, "ending the session: {}", close::REASON_KICKED);
                crate::serve::session::refuse(&conn, close::REASON_KICKED);
                n += 1;
            }
        }
        for hub in self.shared.hubs.all() {
            // `<session>.<seat>`: one device's attachment, the session goes on.
            if let Some(seat) = target.strip_prefix(hub.short()).and_then(|s| s.strip_prefix('.')) {
                let member = match seat {
                    "0" => Some(hub.clone()),
                    s => hub.guests().into_iter().find(|g| g.short().rsplit('.').next() == Some(s)),
                };
                if let Some(m) = member {
                    tracing::info!(peer = %m.owner().fmt_short(), session = hub.short(), "detaching a device from the session: {}", close::REASON_KICKED);
                    kicked.push(m.owner());
                    hub.drop_member(&m, close::REASON_KICKED);
                    n += 1;
                }
                continue;
            }
            // A device named by NodeId or name leaves the sessions it joined too.
            if let Some(p) = peer {
                for g in hub.guests().into_iter().filter(|g| g.owner() == p) {
                    tracing::info!(peer = %p.fmt_short(), session = hub.short(), "detaching a device from the session: {}", close::REASON_KICKED);
                    kicked.push(p);
                    hub.drop_member(&g, close::REASON_KICKED);
                    n += 1;
                }
            }
            if matches(hub.info()) && !hub.view().gone {
                tracing::info!(peer = %hub.info().peer.fmt_short(), session = hub.short(), "ending the session: {}", close::REASON_KICKED);
                hub.kick(close::REASON_KICKED);
                n += 1;
            }
        }
        if let Some(st) = self.shared.stores() {
            if let Some(p) = peer {
                kicked.push(p);
            }
            for id in kicked {
                match st.devices.forget_share(&id) {
                    Ok(true) => {
                        tracing::info!(peer = %id.fmt_short(), "a share's guest was kicked: its access is removed")
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(peer = %id.fmt_short(), "could not remove a kicked share's guest: {e}")
                    }
                }
            }
        }
        Ok(n)
    }

    /// Re-checks every session against its agent's trust now (e.g. after
    /// `iroh deny`) instead of at the next heartbeat. Returns how many ended.
    pub fn recheck(&self) -> usize {
        self.shared.recheck()
    }
}

impl LocalApi for BridgeHandle {
    fn status(&self) -> Status {
        BridgeHandle::status(self)
    }

    fn kick(&self, target: &str) -> Result<usize, String> {
        BridgeHandle::kick(self, target).map_err(|e| format!("'{target}' names no one device: {e}"))
    }

    fn recheck(&self) -> usize {
        BridgeHandle::recheck(self)
    }
}
