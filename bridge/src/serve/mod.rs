//! The bridge: accept connections, admit trusted peers, run one agent each.
//!
//! Task ownership is explicit: the accept loop owns a `JoinSet` with one task
//! per incoming connection; shutdown cancels a token every session watches,
//! then waits for all of them so no agent outlives the bridge.

pub mod agent;
pub mod gate;
pub mod hub;
pub mod pump;
pub mod reaper;
pub mod requests;
pub mod session;
pub mod throttle;
pub mod wss;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use iroh::{
    endpoint::{Connection, Incoming, IncomingAddr},
    Endpoint, EndpointId,
};
use thunderbolt_shared::close;
use tokio::{sync::Semaphore, task::JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    serve::gate::{Drop as GateDrop, Gate, RemoteKey},
    serve::hub::{Hub, HubKind, HubLink, Hubs},
    serve::session::{refuse, SessionConfig},
    serve::throttle::LogBudget,
    trust::account::Account,
    trust::{Grant, TrustPolicy},
};

/// Admission settings.
#[derive(Debug, Clone)]
pub struct Admission {
    pub max_agents: usize,
    pub handshake_timeout: Duration,
    pub stream_open_timeout: Duration,
    /// How often trust is re-checked for open sessions (and the account list refreshed).
    pub heartbeat: Duration,
}

/// The admitted connections, so the heartbeat can re-check them.
#[derive(Debug, Default)]
pub struct Sessions {
    map: Mutex<HashMap<usize, (EndpointId, Connection)>>,
}

impl Sessions {
    fn insert(&self, conn: &Connection) -> SessionGuard<'_> {
        let key = conn.stable_id();
        self.map.lock().unwrap_or_else(|p| p.into_inner()).insert(key, (conn.remote_id(), conn.clone()));
        SessionGuard { sessions: self, key }
    }

    /// Closes every session whose peer `trust` no longer admits, with
    /// `membership revoked`. Returns how many were closed.
    pub fn recheck(&self, trust: &dyn TrustPolicy) -> usize {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let mut closed = 0;
        for (peer, conn) in map.values() {
            if trust.check(peer).is_none() {
                info!(peer = %peer.fmt_short(), "closing {peer}: {}", close::REASON_MEMBERSHIP_REVOKED);
                refuse(conn, close::REASON_MEMBERSHIP_REVOKED);
                closed += 1;
            }
        }
        closed
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

struct SessionGuard<'a> {
    sessions: &'a Sessions,
    key: usize,
}

impl Drop for SessionGuard<'_> {
    fn drop(&mut self) {
        self.sessions.map.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.key);
    }
}

/// Everything a connection task needs.
#[derive(Debug)]
struct Shared {
    trust: Arc<dyn TrustPolicy>,
    gate: Arc<Gate>,
    sessions: Sessions,
    /// Resumable sessions, attached or waiting for their client.
    hubs: Arc<Hubs>,
    account: Option<Arc<Account>>,
    admission: Admission,
    agents: Arc<Semaphore>,
    session: Arc<SessionConfig>,
    shutdown: CancellationToken,
    /// A stranger dialing in a loop costs a few log lines, not one per dial.
    refusal_log: Mutex<LogBudget>,
    /// A heartbeat is running (at most one at a time).
    beating: std::sync::atomic::AtomicBool,
}

/// A running bridge.
#[derive(Debug)]
pub struct Bridge {
    endpoint: Endpoint,
    shared: Arc<Shared>,
}

impl Bridge {
    pub fn new(
        endpoint: Endpoint,
        trust: Arc<dyn TrustPolicy>,
        gate: Arc<Gate>,
        account: Option<Arc<Account>>,
        admission: Admission,
        session: SessionConfig,
    ) -> Self {
        let shared = Arc::new(Shared {
            trust,
            gate,
            sessions: Sessions::default(),
            hubs: Arc::new(Hubs::default()),
            account,
            agents: Arc::new(Semaphore::new(admission.max_agents)),
            admission,
            session: Arc::new(session),
            shutdown: CancellationToken::new(),
            refusal_log: Mutex::new(LogBudget::new(
                crate::limits::REFUSAL_LOG_BURST,
                crate::limits::REFUSAL_LOG_PER_SEC,
                std::time::Instant::now(),
            )),
            beating: std::sync::atomic::AtomicBool::new(false),
        });
        Self { endpoint, shared }
    }

    /// Serves until `stop` is cancelled, then ends every session (agents killed
    /// and reaped) and closes the endpoint.
    pub async fn run(self, stop: CancellationToken) {
        let mut tasks = JoinSet::new();
        let mut heartbeat = tokio::time::interval(self.shared.admission.heartbeat);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        heartbeat.reset();
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = heartbeat.tick() => {
                    // Runs as a task so a slow backend never stalls accepting. One
                    // beat at a time: with a backend slower than the heartbeat,
                    // overlapping refreshes could apply an older allowlist after
                    // a newer one; a beat that finds the last still running is skipped.
                    if self.shared.beating.swap(true, std::sync::atomic::Ordering::AcqRel) {
                        debug!("heartbeat skipped: the previous one is still waiting on the backend");
                    } else {
                        let shared = self.shared.clone();
                        tasks.spawn(async move {
                            tokio::select! {
                                _ = beat(&shared) => {}
                                // Shutdown never waits on a hung backend.
                                _ = shared.shutdown.cancelled() => {}
                            }
                            shared.beating.store(false, std::sync::atomic::Ordering::Release);
                        });
                    }
                }
                incoming = self.endpoint.accept() => {
                    let Some(incoming) = incoming else { break };
                    tasks.spawn(handle_incoming(incoming, self.shared.clone()));
                }
                Some(res) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Err(e) = res {
                        if e.is_panic() {
                            warn!("connection task panicked: {e}");
                        }
                    }
                }
            }
        }
        info!("shutting down: ending {} connection(s)", tasks.len());
        self.shared.shutdown.cancel();
        while tasks.join_next().await.is_some() {}
        crate::net::close_endpoint(self.endpoint, crate::limits::ENDPOINT_CLOSE_TIMEOUT).await;
    }
}

/// One heartbeat: refresh the account list, then re-check every open session
/// against both trust layers (so removing a peer from the allow file also ends
/// its session).
async fn beat(shared: &Shared) {
    if let Some(account) = &shared.account {
        account.refresh().await;
    }
    let closed = shared.sessions.recheck(shared.trust.as_ref()) + shared.hubs.recheck(shared.trust.as_ref());
    tracing::debug!(open = shared.sessions.len(), closed, "heartbeat: {}", shared.hubs.summary());
}

fn remote_key(addr: &IncomingAddr) -> RemoteKey {
    match addr {
        IncomingAddr::Relay { endpoint_id, .. } => RemoteKey::Endpoint(*endpoint_id),
        IncomingAddr::Ip(sa) => RemoteKey::Ip(sa.ip()),
        // Custom transports are not configured; key them all together.
        _ => RemoteKey::Ip(std::net::Ipv4Addr::UNSPECIFIED.into()),
    }
}

async fn handle_incoming(incoming: Incoming, shared: Arc<Shared>) {
    let addr = incoming.remote_addr();
    let key = remote_key(&addr);
    let handshake_slot = match shared.gate.admit(key) {
        Ok(permit) => permit,
        Err(GateDrop::HandshakeCap) if !incoming.remote_addr_validated() => {
            // Every slot is young and busy: ask the sender to prove its address
            // (one stateless packet). A real client comes back validated and may
            // find a slot to take over; a spoofed or stalled one never does.
            debug!(%key, "handshake slots full: asking for address validation (QUIC Retry)");
            if let Err(e) = incoming.retry() {
                debug!(%key, "retry failed: {e}");
            }
            return;
        }
        Err(why) => {
            if let Some(suppressed) = shared.gate.should_log_drop() {
                let why = match why {
                    GateDrop::RemoteBudget => "over its connection budget",
                    GateDrop::HandshakeCap => "too many handshakes in flight",
                };
                warn!("dropping connections: {key} {why} ({suppressed} more dropped since the last report)");
            }
            incoming.ignore();
            return;
        }
    };
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
    drop(handshake_slot);
    let peer = conn.remote_id();
    let Some(grant) = shared.trust.check(&peer) else {
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
    admitted(conn, peer, grant, shared).await;
}

async fn admitted(conn: Connection, peer: EndpointId, grant: Grant, shared: Arc<Shared>) {
    let short = peer.fmt_short().to_string();
    info!(peer = %short, "admitted {peer} ({grant})");
    let _path_log = crate::paths::log_changes(&conn, short.clone());
    let _registered = shared.sessions.insert(&conn);
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
    if let Some(resume) = shared.session.resume {
        // The endpoint accepts our protocol's two ALPNs only: the suffix tells them apart.
        if conn.alpn().ends_with(thunderbolt_shared::resume::RESUME_ALPN_SUFFIX) {
            return resumable(conn, peer, send, recv, resume, shared.clone()).await;
        }
    }
    if let Some(window) = shared.session.keep_warm {
        return warm(conn, peer, send, recv, window, shared.clone()).await;
    }
    let Some(permit) = agent_slot(&conn, &peer, &short, &shared).await else { return };
    session::run(conn, send, recv, shared.session.clone(), permit, shared.shutdown.clone()).await;
}

/// A connection speaking `thunderbolt/<p>/r1`: starts a session, or re-attaches
/// to one of this peer's.
async fn resumable(
    conn: Connection,
    peer: EndpointId,
    send: iroh::endpoint::SendStream,
    mut recv: iroh::endpoint::RecvStream,
    resume: hub::ResumeConfig,
    shared: Arc<Shared>,
) {
    let short = peer.fmt_short().to_string();
    let hello = tokio::select! {
        r = tokio::time::timeout(shared.admission.stream_open_timeout, hub::read_hello(&mut recv)) => r,
        _ = shared.shutdown.cancelled() => {
            refuse(&conn, close::REASON_SHUTTING_DOWN);
            return;
        }
    };
    let (token, received, leftover) = match hello {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            info!(peer = %short, "closing: {e}");
            refuse(&conn, hub::REASON_PROTOCOL);
            return;
        }
        Err(_) => {
            info!(peer = %short, "closing: {}", close::REASON_IDLE);
            refuse(&conn, close::REASON_IDLE);
            return;
        }
    };
    if let Some(token) = token {
        // Only the NodeId that started a session finds it.
        let hub = match shared.hubs.find(&token, &peer) {
            Ok(hub) => hub,
            Err(reason) => {
                info!(peer = %short, "refusing a resume: {reason}");
                refuse(&conn, &reason);
                return;
            }
        };
        match hub.attach(conn.clone(), send, recv, received, leftover) {
            Ok(()) => {}
            Err(hub::AttachError::Gone(reason)) => {
                info!(peer = %short, session = hub.short(), "refusing a resume: the session ended ({reason})");
                refuse(&conn, &reason);
            }
            Err(hub::AttachError::Stale { claimed, acked }) => {
                info!(
                    peer = %short,
                    session = hub.short(),
                    "ending the session: {} (the resume holds {claimed} frames, {acked} were acknowledged)",
                    close::REASON_STALE_RESUME
                );
                refuse(&conn, close::REASON_STALE_RESUME);
            }
            Err(hub::AttachError::BadPosition(e)) => {
                info!(peer = %short, session = hub.short(), "closing a resume: {e}");
                refuse(&conn, hub::REASON_PROTOCOL);
            }
        }
        return;
    }
    if received != 0 {
        info!(peer = %short, "closing: a new session cannot have received frames");
        refuse(&conn, hub::REASON_PROTOCOL);
        return;
    }
    let Some(permit) = agent_slot(&conn, &peer, &short, &shared).await else { return };
    let (hub, inbox, outbox) =
        Hub::new(HubKind::Resumable, peer, resume, shared.session.max_frame, Arc::downgrade(&shared.hubs));
    let _registered = shared.hubs.insert(&hub);
    if let Err(e) = hub.attach(conn.clone(), send, recv, 0, leftover) {
        warn!(peer = %short, "could not start a resumable session: {e:?}");
        return;
    }
    debug!(peer = %short, "resumable session");
    run_hub(&hub, inbox, outbox, &short, permit, &shared).await;
}

/// A plain connection with `--keep-warm`: attaches to this peer's warm agent
/// if one waits, else starts one that will outlive the connection.
async fn warm(
    conn: Connection,
    peer: EndpointId,
    mut send: iroh::endpoint::SendStream,
    mut recv: iroh::endpoint::RecvStream,
    window: std::time::Duration,
    shared: Arc<Shared>,
) {
    let short = peer.fmt_short().to_string();
    if let Some(hub) = shared.hubs.warm_for(&peer) {
        match hub.attach_plain(conn.clone(), send, recv) {
            Ok(()) => return,
            // It ended just now: start a fresh one.
            Err(streams) => (send, recv) = streams,
        }
    }
    let Some(permit) = agent_slot(&conn, &peer, &short, &shared).await else { return };
    let buffer = shared.session.resume.map_or(crate::limits::RESUME_BUFFER, |r| r.buffer);
    let cfg = hub::ResumeConfig { grace: window, buffer };
    let (hub, inbox, outbox) =
        Hub::new(HubKind::Warm, peer, cfg, shared.session.max_frame, Arc::downgrade(&shared.hubs));
    let _registered = shared.hubs.insert(&hub);
    if hub.attach_plain(conn.clone(), send, recv).is_err() {
        return;
    }
    run_hub(&hub, inbox, outbox, &short, permit, &shared).await;
}

/// How long an eviction may take to free its slot: the evicted agent gets
/// SIGTERM, then SIGKILL after the grace, and is reaped.
const EVICTION_WAIT: Duration =
    Duration::from_millis(crate::limits::AGENT_TERM_GRACE.as_millis() as u64 + 1000);

/// An agent slot, or the peer is refused with `bridge at capacity` (the log
/// says what holds the slots).
async fn agent_slot(
    conn: &Connection,
    peer: &EndpointId,
    short: &str,
    shared: &Shared,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let permit = take_slot(conn, peer, short, shared).await;
    if permit.is_none() && !shared.shutdown.is_cancelled() {
        warn!(
            peer = %short,
            "refusing: {} ({} agents running; {}; every other session has a client attached)",
            close::REASON_AT_CAPACITY,
            shared.admission.max_agents,
            shared.hubs.summary()
        );
        refuse(conn, close::REASON_AT_CAPACITY);
    }
    permit
}

/// An agent slot. With every slot taken, a detached session is evicted to
/// make room (the requester's own oldest, else the oldest of all; never one
/// with a client attached).
async fn take_slot(
    conn: &Connection,
    peer: &EndpointId,
    short: &str,
    shared: &Shared,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    // Bounded: each round ends one detached session; concurrent newcomers may
    // take the slot it freed, and then the next one goes.
    for _ in 0..shared.admission.max_agents {
        if let Ok(permit) = shared.agents.clone().try_acquire_owned() {
            return Some(permit);
        }
        let victim = shared.hubs.eviction_candidate(peer)?;
        if !victim.evict(&format!("the bridge is at capacity and peer {short} needs a slot")) {
            continue;
        }
        let wait = tokio::time::timeout(EVICTION_WAIT, shared.agents.clone().acquire_owned());
        tokio::select! {
            r = wait => if let Ok(Ok(permit)) = r { return Some(permit) },
            _ = shared.shutdown.cancelled() => {
                refuse(conn, close::REASON_SHUTTING_DOWN);
                return None;
            }
        }
    }
    None
}

/// Runs a hub's session to its end, then lets go of its connection.
async fn run_hub(
    hub: &Arc<Hub>,
    inbox: hub::Inbox,
    outbox: hub::Outbox,
    short: &str,
    permit: tokio::sync::OwnedSemaphorePermit,
    shared: &Shared,
) {
    let link = HubLink(hub.clone());
    session::run_on(link, outbox, inbox, short, shared.session.clone(), permit, shared.shutdown.clone())
        .await;
    hub.release();
}
