//! The bridge: accept connections, admit trusted peers, run one agent each.
//!
//! One bridge serves one agent or many ([`crate::host`]): each agent on an
//! endpoint of its own (its own NodeId, so every client, including those that
//! pick no agent, reaches it by its ticket), all through one admission here:
//! one gate, one handshake cap, one pool of agent slots, one registry of
//! sessions, one heartbeat. What differs per agent ([`AgentConfig`]: who may
//! reach it, how its sessions run) is looked up per connection.
//!
//! Task ownership is explicit: each agent's accept loop and every connection
//! task run on one `TaskTracker`; shutdown cancels a token every session
//! watches, then waits for all of them so no agent outlives the bridge.

pub mod agent;
pub mod gate;
pub mod hub;
pub mod pair;
pub mod pump;
pub mod reaper;
pub mod relay_health;
pub mod requests;
pub mod session;
pub mod status;
pub mod throttle;
pub mod wss;

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, RwLock,
    },
    time::Duration,
};

use iroh::{
    endpoint::{Connection, Incoming, IncomingAddr},
    Endpoint, EndpointId,
};
use thunderbolt_shared::close;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{debug, info, warn, Instrument};

use crate::{
    serve::gate::{Drop as GateDrop, Gate, RemoteKey},
    serve::hub::{Hub, HubKind, HubLink, Hubs},
    serve::session::{refuse, SessionConfig, SessionInfo},
    serve::throttle::LogBudget,
    trust::account::Account,
    trust::{Grant, TrustPolicy},
};

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

/// Close reason for the sessions of an agent the host stopped serving (its
/// manifest was removed, or changed its identity or protocol).
pub const REASON_AGENT_REMOVED: &str = close::REASON_AGENT_REMOVED;

/// One agent as the bridge serves it: who may reach it and how its sessions
/// run. Swapped whole when its manifest changes: new sessions get the new one,
/// running sessions keep the one they started with.
#[derive(Debug)]
pub struct AgentConfig {
    /// Its name, in the log (empty for the single-agent bridge, whose log
    /// lines stay as they always were).
    pub name: Arc<str>,
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
    stop: CancellationToken,
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

    pub fn name(&self) -> Arc<str> {
        self.config().name.clone()
    }

    /// Sessions of this agent with an agent process now.
    pub fn live_sessions(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// One of this agent's `max_sessions`, or `None` when all are taken.
    fn take_session(self: &Arc<Self>, cfg: &AgentConfig) -> Option<LiveGuard> {
        let max = cfg.max_sessions.unwrap_or(usize::MAX);
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| LiveGuard(self.clone()))
    }
}

/// A live session of an agent: counted until dropped.
struct LiveGuard(Arc<Served>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An admitted connection: its peer, the connection, the agent it reached,
/// and for a plain session what `status` shows of it (a hub has its own).
type PlainSession = (EndpointId, Connection, Arc<Served>, Option<Arc<SessionInfo>>);

/// The admitted plain connections, so the heartbeat can re-check them.
#[derive(Debug, Default)]
pub struct Sessions {
    map: Mutex<HashMap<usize, PlainSession>>,
}

impl Sessions {
    fn insert(
        &self,
        conn: &Connection,
        agent: &Arc<Served>,
        info: Option<&Arc<SessionInfo>>,
    ) -> SessionGuard<'_> {
        let key = conn.stable_id();
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (conn.remote_id(), conn.clone(), agent.clone(), info.cloned()));
        SessionGuard { sessions: self, key }
    }

    /// A copy of every entry, to look at without holding the lock.
    fn snapshot(&self) -> Vec<PlainSession> {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    /// Closes every session whose peer its agent's trust no longer admits,
    /// with `membership revoked`. Returns how many were closed.
    pub fn recheck(&self) -> usize {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let mut closed = 0;
        // A hub's connection is re-checked with its hub (`Hubs::recheck`).
        for (peer, conn, agent, _) in map.values().filter(|(_, _, _, info)| info.is_some()) {
            if agent.config().trust.check(peer).is_none() {
                info!(peer = %peer.fmt_short(), "closing {peer}: {}", close::REASON_MEMBERSHIP_REVOKED);
                refuse(conn, close::REASON_MEMBERSHIP_REVOKED);
                closed += 1;
            }
        }
        closed
    }

    /// Closes every session of `agent` with `reason`.
    fn close_agent(&self, agent: &Arc<Served>, reason: &str) -> usize {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let mut n = 0;
        for (_, conn, a, _) in map.values() {
            if Arc::ptr_eq(a, agent) {
                refuse(conn, reason);
                n += 1;
            }
        }
        n
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
pub(crate) struct Shared {
    gate: Arc<Gate>,
    pub(crate) sessions: Sessions,
    /// Resumable and warm sessions, attached or waiting for their client.
    pub(crate) hubs: Arc<Hubs>,
    pub(crate) admission: Admission,
    pub(crate) agents: Arc<Semaphore>,
    /// Live sessions per NodeId, for [`Admission::max_per_device`].
    per_device: Arc<PerDevice>,
    /// The agents served now, by name.
    served: RwLock<HashMap<Arc<str>, Arc<Served>>>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// A stranger dialing in a loop costs a few log lines, not one per dial.
    refusal_log: Mutex<LogBudget>,
    /// A heartbeat is running (at most one at a time).
    beating: std::sync::atomic::AtomicBool,
    /// The home's devices, pairing codes and allow file (absent in tests of
    /// the bare serving core).
    stores: RwLock<Option<Arc<Stores>>>,
}

/// What a bridge keeps in its home beside its identities.
#[derive(Debug)]
pub struct Stores {
    pub devices: Arc<crate::devices::Devices>,
    pub pairings: crate::pairing::Pairings,
    /// Wrong pairing codes per device (memory only).
    pub pair_throttle: Mutex<crate::pairing::Throttle>,
    pub allow_file: std::path::PathBuf,
}

impl Stores {
    pub fn new(home: &crate::home::Home) -> Arc<Self> {
        Arc::new(Self {
            devices: Arc::new(crate::devices::Devices::new(home)),
            pairings: crate::pairing::Pairings::new(home),
            pair_throttle: Mutex::default(),
            allow_file: home.allowlist_path(),
        })
    }
}

/// What a running bridge is asked to change (the host's folder watch).
#[derive(Debug)]
pub enum Change {
    /// Serve this agent too.
    Add(Arc<Served>),
    /// New sessions of the agent named so run with this.
    Replace(AgentConfig),
    /// Stop serving this agent: its sessions end with [`REASON_AGENT_REMOVED`].
    Remove(Arc<str>),
}

/// A running bridge.
#[derive(Debug)]
pub struct Bridge {
    shared: Arc<Shared>,
    changes: Option<mpsc::UnboundedReceiver<Change>>,
    handle: status::BridgeHandle,
}

impl Bridge {
    /// A bridge serving one agent on `endpoint` (the single-agent commands).
    pub fn new(
        endpoint: Endpoint,
        trust: Arc<dyn TrustPolicy>,
        gate: Arc<Gate>,
        account: Option<Arc<Account>>,
        admission: Admission,
        session: SessionConfig,
    ) -> Self {
        let protocol = String::new();
        let agent = Served::new(
            endpoint,
            AgentConfig {
                name: "".into(),
                label: protocol.clone().into(),
                protocol,
                trust,
                session: Arc::new(session),
                max_sessions: None,
                account,
                bridge_identity: false,
                own_devices: true,
            },
        );
        let mut b = Self::empty(gate, admission, "bridge");
        b.shared.served.write().unwrap_or_else(|p| p.into_inner()).insert("".into(), agent);
        b.changes = None;
        b
    }

    /// The single agent serves `protocol` (for `thunderbolt status`).
    pub fn serving(self, protocol: &thunderbolt_shared::Protocol) -> Self {
        for agent in self.shared.served().values() {
            let cfg = agent.config();
            agent.replace(AgentConfig {
                name: cfg.name.clone(),
                label: protocol.as_str().into(),
                protocol: protocol.to_string(),
                trust: cfg.trust.clone(),
                session: cfg.session.clone(),
                max_sessions: cfg.max_sessions,
                account: cfg.account.clone(),
                bridge_identity: cfg.bridge_identity,
                own_devices: cfg.own_devices,
            });
        }
        self
    }

    /// The home whose devices, pairing codes and allow file this bridge uses:
    /// devices pair with it, names show in the log and in `status`, and an
    /// allow-file edit is applied to live sessions within a second.
    pub fn with_home(self, home: &crate::home::Home) -> Self {
        *self.shared.stores.write().unwrap_or_else(|p| p.into_inner()) = Some(Stores::new(home));
        self
    }

    /// The relays the endpoints are configured with (what `status` says is
    /// unreachable before iroh picks one).
    pub fn relays(self, relays: &crate::net::Relays) -> Self {
        for agent in self.shared.served().values() {
            agent.relay.configured(relays);
        }
        self
    }

    /// What the control API drives: status, kick, recheck.
    pub fn handle(&self) -> status::BridgeHandle {
        self.handle.clone()
    }

    /// A bridge serving `agents`, to which the returned sender adds, changes
    /// and removes agents while it runs.
    pub fn host(
        gate: Arc<Gate>,
        admission: Admission,
        agents: Vec<Arc<Served>>,
    ) -> (Self, mpsc::UnboundedSender<Change>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut b = Self::empty(gate, admission, "host");
        {
            let mut served = b.shared.served.write().unwrap_or_else(|p| p.into_inner());
            for a in agents {
                served.insert(a.name(), a);
            }
        }
        b.changes = Some(rx);
        (b, tx)
    }

    fn empty(gate: Arc<Gate>, admission: Admission, kind: &'static str) -> Self {
        let shared = Arc::new(Shared {
            gate,
            sessions: Sessions::default(),
            hubs: Arc::new(Hubs::default()),
            agents: Arc::new(Semaphore::new(admission.max_agents)),
            per_device: Arc::default(),
            admission,
            served: RwLock::new(HashMap::new()),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            refusal_log: Mutex::new(LogBudget::new(
                crate::limits::REFUSAL_LOG_BURST,
                crate::limits::REFUSAL_LOG_PER_SEC,
                std::time::Instant::now(),
            )),
            beating: std::sync::atomic::AtomicBool::new(false),
            stores: RwLock::new(None),
        });
        let handle = status::BridgeHandle::new(shared.clone(), kind);
        Self { shared, changes: None, handle }
    }

    /// Serves until `stop` is cancelled, then ends every session (agents killed
    /// and reaped) and closes the endpoints.
    pub async fn run(mut self, stop: CancellationToken) {
        let shared = self.shared.clone();
        let initial: Vec<Arc<Served>> = shared.served().into_values().collect();
        for agent in initial {
            spawn_accept(&shared, agent);
        }
        let mut heartbeat = tokio::time::interval(shared.admission.heartbeat);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        heartbeat.reset();
        let mut changes = self.changes.take();
        // An edited allow file (`iroh deny`, or by hand) applies to live
        // sessions within a second, not at the next heartbeat.
        let mut allow_tick = tokio::time::interval(ALLOW_FILE_CHECK);
        allow_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The devices file too: a device paired with one agent is granted there.
        let allow_stamp = |s: &Shared| {
            use std::os::unix::fs::MetadataExt;
            let stores = s.stores()?;
            let stamp = |p: &std::path::Path| {
                std::fs::metadata(p).ok().map(|m| (m.len(), m.mtime(), m.mtime_nsec(), m.ino()))
            };
            Some((stamp(&stores.allow_file), stamp(stores.devices.path())))
        };
        let mut last_allow = allow_stamp(&shared);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = allow_tick.tick() => {
                    let now = allow_stamp(&shared);
                    if now != last_allow {
                        last_allow = now;
                        let ended = self.handle.recheck();
                        if ended > 0 {
                            info!("the allow file changed: {ended} session(s) no longer allowed were ended");
                        }
                    }
                }
                _ = heartbeat.tick() => {
                    // Runs as a task so a slow backend never stalls accepting. One
                    // beat at a time: with a backend slower than the heartbeat,
                    // overlapping refreshes could apply an older allowlist after
                    // a newer one; a beat that finds the last still running is skipped.
                    if shared.beating.swap(true, Ordering::AcqRel) {
                        debug!("heartbeat skipped: the previous one is still waiting on the backend");
                    } else {
                        let s = shared.clone();
                        shared.tasks.spawn(async move {
                            tokio::select! {
                                _ = beat(&s) => {}
                                // Shutdown never waits on a hung backend.
                                _ = s.shutdown.cancelled() => {}
                            }
                            s.beating.store(false, Ordering::Release);
                        });
                    }
                }
                change = async { changes.as_mut()?.recv().await }, if changes.is_some() => match change {
                    Some(c) => apply(&shared, c),
                    None => changes = None,
                },
            }
        }
        let served = shared.served();
        info!("shutting down: ending {} connection(s)", shared.tasks.len());
        shared.shutdown.cancel();
        shared.tasks.close();
        shared.tasks.wait().await;
        for agent in served.into_values() {
            crate::net::close_endpoint(agent.endpoint.clone(), crate::limits::ENDPOINT_CLOSE_TIMEOUT).await;
        }
    }
}

impl Shared {
    pub(crate) fn stores(&self) -> Option<Arc<Stores>> {
        self.stores.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn served(&self) -> HashMap<Arc<str>, Arc<Served>> {
        self.served.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Ends every session whose peer its agent's trust no longer admits, and
    /// drops the push subscriptions of devices no agent admits any more (the
    /// heartbeat, an allow-file edit, `iroh deny`). Returns how many sessions ended.
    pub(crate) fn recheck(&self) -> usize {
        let served = self.served();
        let trust_of = |name: &str| served.get(name).map(|a| a.config().trust.clone());
        crate::notify::Notifier::forget_revoked(
            served.values().filter_map(|a| a.config().session.notify.clone()),
        );
        self.sessions.recheck() + self.hubs.recheck(trust_of)
    }
}

/// Starts accepting connections for `agent`.
fn spawn_accept(shared: &Arc<Shared>, agent: Arc<Served>) {
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
            let task = handle_incoming(incoming, s.clone(), agent.clone());
            s.tasks.spawn(task.in_current_span());
        }
    };
    // Ends with the agent as well as with the bridge: it holds the agent, and
    // with it the endpoint and its sockets, for as long as it runs.
    let relay = {
        let (agent_stop, shutdown) = (agent_for_relay.stop.clone(), shared.shutdown.clone());
        async move {
            tokio::select! {
                _ = relay_health::watch(agent_for_relay, agent_stop) => {}
                _ = shutdown.cancelled() => {}
            }
        }
    };
    if name.is_empty() {
        shared.tasks.spawn(accept);
        shared.tasks.spawn(relay);
    } else {
        let span = tracing::info_span!("agent", name = %name);
        shared.tasks.spawn(accept.instrument(span.clone()));
        shared.tasks.spawn(relay.instrument(span));
    }
}

/// Applies one change the host asked for.
fn apply(shared: &Arc<Shared>, change: Change) {
    match change {
        Change::Add(agent) => {
            let name = agent.name();
            shared.served.write().unwrap_or_else(|p| p.into_inner()).insert(name, agent.clone());
            spawn_accept(shared, agent);
        }
        Change::Replace(config) => {
            let name = config.name.clone();
            match shared.served().get(&name) {
                Some(agent) => agent.replace(config),
                None => warn!(agent = %name, "asked to change an agent that is not served"),
            }
        }
        Change::Remove(name) => {
            let Some(agent) = shared.served.write().unwrap_or_else(|p| p.into_inner()).remove(&name) else {
                return;
            };
            agent.stop.cancel();
            let plain = shared.sessions.close_agent(&agent, REASON_AGENT_REMOVED);
            let hubs = shared.hubs.end_agent(&name, REASON_AGENT_REMOVED);
            info!(agent = %name, "no longer served: {} session(s) ended ({REASON_AGENT_REMOVED})", plain + hubs);
            // The endpoint outlives its sessions' closes long enough to send them.
            let s = shared.clone();
            shared.tasks.spawn(async move {
                let until_idle = async {
                    while agent.live_sessions() > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                };
                let _ = tokio::time::timeout(crate::limits::AGENT_TERM_GRACE * 2, until_idle).await;
                drop(s);
                // Never left behind (as at exit): the host goes on, and a
                // forgotten endpoint would keep its sockets for good. Past the
                // budget it is dropped, which aborts what is left of it.
                let ep = agent.endpoint.clone();
                drop(agent);
                if tokio::time::timeout(REMOVED_ENDPOINT_CLOSE_TIMEOUT, ep.close()).await.is_err() {
                    debug!(agent = %name, "the removed agent's endpoint did not close within {REMOVED_ENDPOINT_CLOSE_TIMEOUT:?}; dropping it");
                }
            });
        }
    }
}

/// How long a removed agent's endpoint may take to close (its peers told,
/// its connections drained: iroh's own bound is about 3 s) before it is
/// dropped: the host keeps running, so this is not cut short like the close
/// at exit, but it must end so the endpoint's sockets are released.
const REMOVED_ENDPOINT_CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// One heartbeat: refresh the account list, then re-check every open session
/// against its agent's trust (so removing a peer from the allow file also ends
/// its session).
async fn beat(shared: &Shared) {
    let accounts: Vec<Arc<Account>> =
        shared.served().values().filter_map(|a| a.config().account.clone()).collect();
    crate::trust::account::refresh_all(&accounts).await;
    let closed = shared.recheck();
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

async fn handle_incoming(incoming: Incoming, shared: Arc<Shared>, agent: Arc<Served>) {
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
    let receipt = handshake_slot.receipt();
    drop(handshake_slot);
    let peer = conn.remote_id();
    // The agent as it is now: a manifest changed later applies to later sessions.
    let cfg = agent.config();
    if conn.alpn().ends_with(thunderbolt_shared::pairing::PAIR_ALPN_SUFFIX) {
        return crate::serve::pair::pair(conn, peer, &cfg, &shared).await;
    }
    let Some(grant) = cfg.trust.check(&peer) else {
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
    // An allowed device's dial does not spend its address's budget (acpx and
    // scripts dial once per prompt).
    shared.gate.refund(receipt);
    admitted(conn, peer, grant, shared, agent, cfg).await;
}

/// What a connection's session runs with, from admission to its end.
struct Admitted {
    shared: Arc<Shared>,
    agent: Arc<Served>,
    cfg: Arc<AgentConfig>,
    peer: EndpointId,
    short: String,
    /// The plain session's (a hub has its own).
    info: Arc<SessionInfo>,
    /// Why the peer was let in (guests have a cap of their own).
    grant: Grant,
}

async fn admitted(
    conn: Connection,
    peer: EndpointId,
    grant: Grant,
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
        Grant::Manifest => None,
    };
    if let (Some(stores), Some(how)) = (shared.stores(), how) {
        tokio::task::spawn_blocking(move || stores.devices.seen(&peer, how));
    }
    let _path_log = crate::paths::log_changes(&conn, short.clone());
    let info = SessionInfo::new(hub::random_hex(4), cfg.name.clone(), peer);
    // A plain session is the connection itself; the others' own hubs say what they are.
    let r1 =
        cfg.session.resume.is_some() && conn.alpn().ends_with(thunderbolt_shared::resume::RESUME_ALPN_SUFFIX);
    let plain = !r1 && cfg.session.keep_warm.is_none();
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
    let a = Admitted { shared: shared.clone(), agent, cfg, peer, short, info, grant };
    if let Some(resume) = a.cfg.session.resume {
        // The endpoint accepts our protocol's two ALPNs only: the suffix tells them apart.
        if conn.alpn().ends_with(thunderbolt_shared::resume::RESUME_ALPN_SUFFIX) {
            return resumable(conn, send, recv, resume, a).await;
        }
    }
    if let Some(window) = a.cfg.session.keep_warm {
        return warm(conn, send, recv, window, a).await;
    }
    let Some(slot) = agent_slot(&conn, &a).await else { return };
    let session = a.cfg.session.clone();
    session::run(conn, send, recv, session, slot.permit, a.shared.shutdown.clone(), Some(a.info.clone()))
        .await;
    drop(slot.live);
}

/// Whether `peer` is still admitted at `agent`, asked once its session is
/// registered: a deny (or an allow-file edit, a revocation) that lands between
/// the handshake's check and the registration finds nothing to end, so the
/// registered session looks again itself. Refuses the connection if not.
fn still_admitted(conn: &Connection, agent: &Served, peer: &EndpointId, short: &str) -> bool {
    if agent.config().trust.check(peer).is_some() {
        return true;
    }
    info!(peer = %short, "closing {peer}: {} (while it was being admitted)", close::REASON_MEMBERSHIP_REVOKED);
    refuse(conn, close::REASON_MEMBERSHIP_REVOKED);
    false
}

/// A connection speaking `thunderbolt/<p>/r1`: starts a session, or re-attaches
/// to one of this peer's.
async fn resumable(
    conn: Connection,
    send: iroh::endpoint::SendStream,
    mut recv: iroh::endpoint::RecvStream,
    resume: hub::ResumeConfig,
    a: Admitted,
) {
    let (shared, short) = (&a.shared, a.short.as_str());
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
        // Only the NodeId that started a session finds it, and only at its agent.
        let hub = match shared.hubs.find(&token, &a.peer, &a.cfg.name) {
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
    if let Some(window) = a.cfg.session.keep_warm {
        // A new session from a peer whose warm agent waits takes that agent over.
        if let Some(hub) = shared.hubs.warm_for(&a.peer, &a.cfg.name) {
            match hub.attach_fresh(conn.clone(), send, recv, leftover) {
                Ok(()) => return,
                // It ended just now: start a fresh one.
                Err((s, r, l)) => return start_resumable(conn, s, r, l, resume, Some(window), a).await,
            }
        }
        return start_resumable(conn, send, recv, leftover, resume, Some(window), a).await;
    }
    start_resumable(conn, send, recv, leftover, resume, None, a).await
}

/// A new resumable session (warm when `warm` is set: its agent outlives it).
async fn start_resumable(
    conn: Connection,
    send: iroh::endpoint::SendStream,
    recv: iroh::endpoint::RecvStream,
    leftover: bytes::Bytes,
    resume: hub::ResumeConfig,
    warm: Option<Duration>,
    a: Admitted,
) {
    let Some(slot) = agent_slot(&conn, &a).await else { return };
    let kind = if warm.is_some() { HubKind::Warm } else { HubKind::Resumable };
    let (hub, inbox, outbox) = Hub::new(
        kind,
        a.peer,
        a.cfg.name.clone(),
        hub_timing(&a.cfg, resume, warm),
        a.cfg.session.max_frame,
        Arc::downgrade(&a.shared.hubs),
    );
    let _registered = a.shared.hubs.insert(&hub);
    if !still_admitted(&conn, &a.agent, &a.peer, &a.short) {
        return;
    }
    if let Err(e) = hub.attach(conn.clone(), send, recv, 0, leftover) {
        warn!(peer = %a.short, "could not start a resumable session: {e:?}");
        return;
    }
    debug!(peer = %a.short, "resumable session");
    run_hub(&hub, inbox, outbox, slot, &a).await;
}

/// How long a hub waits with nothing attached: the resume grace (or, for a
/// warm agent, its keep-warm window), capped by the agent's `idle_stop`.
fn hub_timing(cfg: &AgentConfig, resume: hub::ResumeConfig, warm: Option<Duration>) -> hub::HubTiming {
    hub::HubTiming { grace: resume.grace, buffer: resume.buffer, warm, idle_stop: cfg.session.idle_stop }
}

/// A plain connection with `--keep-warm`: takes over this peer's warm agent
/// if one runs, else starts one that will outlive the connection.
async fn warm(
    conn: Connection,
    mut send: iroh::endpoint::SendStream,
    mut recv: iroh::endpoint::RecvStream,
    window: std::time::Duration,
    a: Admitted,
) {
    if let Some(hub) = a.shared.hubs.warm_for(&a.peer, &a.cfg.name) {
        match hub.attach_plain(conn.clone(), send, recv) {
            Ok(()) => return,
            // It ended just now: start a fresh one.
            Err(streams) => (send, recv) = streams,
        }
    }
    let Some(slot) = agent_slot(&conn, &a).await else { return };
    let resume = a.cfg.session.resume.unwrap_or(hub::ResumeConfig {
        grace: crate::limits::RESUME_GRACE,
        buffer: crate::limits::RESUME_BUFFER,
    });
    let (hub, inbox, outbox) = Hub::new(
        HubKind::Warm,
        a.peer,
        a.cfg.name.clone(),
        hub_timing(&a.cfg, resume, Some(window)),
        a.cfg.session.max_frame,
        Arc::downgrade(&a.shared.hubs),
    );
    let _registered = a.shared.hubs.insert(&hub);
    if !still_admitted(&conn, &a.agent, &a.peer, &a.short) {
        return;
    }
    if hub.attach_plain(conn.clone(), send, recv).is_err() {
        return;
    }
    run_hub(&hub, inbox, outbox, slot, &a).await;
}

/// How often the allow file is looked at (one `stat`) for a change to apply
/// to live sessions: a revoked device is out within about this.
const ALLOW_FILE_CHECK: Duration = Duration::from_secs(1);

/// How long an eviction may take to free its slot: the evicted agent gets
/// SIGTERM, then SIGKILL after the grace, and is reaped.
const EVICTION_WAIT: Duration =
    Duration::from_millis(crate::limits::AGENT_TERM_GRACE.as_millis() as u64 + 1000);

/// A session's hold on an agent slot (bridge-wide) and on one of its agent's
/// `max_sessions`.
struct Slot {
    permit: tokio::sync::OwnedSemaphorePermit,
    live: LiveGuard,
    /// Dropped with the session, after the agent was reaped.
    _device: DeviceGuard,
}

/// Live sessions of guests (peers that are not your own devices), per NodeId
/// and together, across every agent of the bridge.
#[derive(Debug, Default)]
struct PerDevice {
    counts: Mutex<(HashMap<EndpointId, usize>, usize)>,
    /// Told whenever a guest's session ends.
    freed: tokio::sync::Notify,
}

impl PerDevice {
    /// One more session for guest `peer`, unless it holds `each` already or
    /// all guests hold `all`. `Err(true)`: `peer` itself is at its cap.
    fn try_take(self: &Arc<Self>, peer: &EndpointId, each: usize, all: usize) -> Result<DeviceGuard, bool> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let (map, total) = &mut *c;
        let mine = map.get(peer).copied().unwrap_or(0);
        if mine >= each {
            return Err(true);
        }
        if *total >= all {
            return Err(false);
        }
        map.insert(*peer, mine + 1);
        *total += 1;
        Ok(DeviceGuard(Some((self.clone(), *peer))))
    }
}

/// One of a guest's live sessions: counted until dropped (empty for your own devices).
#[derive(Debug)]
struct DeviceGuard(Option<(Arc<PerDevice>, EndpointId)>);

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        let Some((per, peer)) = self.0.take() else { return };
        {
            let mut c = per.counts.lock().unwrap_or_else(|p| p.into_inner());
            let (map, total) = &mut *c;
            *total = total.saturating_sub(1);
            if let Some(n) = map.get_mut(&peer) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    map.remove(&peer);
                }
            }
        }
        per.freed.notify_waiters();
    }
}

/// A guest's hold on one of [`Admission::max_per_device`] (and of the
/// guests' [`Admission::max_guests`]); your own devices need none. A guest at
/// its cap gives up its own longest-detached session for the new one (as the
/// bridge-wide slots do); with none detached it is refused.
async fn device_slot(a: &Admitted) -> Option<DeviceGuard> {
    if matches!(a.grant, Grant::Account | Grant::Manual) {
        return Some(DeviceGuard(None));
    }
    let per = &a.shared.per_device;
    let (each, all) = (a.shared.admission.max_per_device, a.shared.admission.max_guests);
    // Bounded: each round ends one of its detached sessions.
    for _ in 0..=each {
        let freed = per.freed.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        let own_cap = match per.try_take(&a.peer, each, all) {
            Ok(g) => return Some(g),
            Err(own_cap) => own_cap,
        };
        let victim = a.shared.hubs.oldest_detached(Some(&a.peer))?;
        let why = if own_cap {
            format!("guest {} is at its {each} live sessions and opened another", a.short)
        } else {
            format!("guests hold {all} sessions, the most they may, and guest {} opened another", a.short)
        };
        if !victim.evict(&why) {
            continue;
        }
        tokio::select! {
            r = tokio::time::timeout(EVICTION_WAIT, freed) => if r.is_err() { return None },
            _ = a.shared.shutdown.cancelled() => return None,
        }
    }
    None
}

/// An agent slot, or the peer is refused with `bridge at capacity` (the log
/// says what holds the slots).
async fn agent_slot(conn: &Connection, a: &Admitted) -> Option<Slot> {
    let Some(device) = device_slot(a).await else {
        if !a.shared.shutdown.is_cancelled() {
            warn!(
                peer = %a.short,
                "refusing: {} (a guest, {}: at most {} live sessions each and {} for all guests, so your own devices always get in; none of its own is detached)",
                close::REASON_AT_CAPACITY,
                a.grant,
                a.shared.admission.max_per_device,
                a.shared.admission.max_guests
            );
        }
        refuse(conn, close::REASON_AT_CAPACITY);
        return None;
    };
    let Some(live) = a.agent.take_session(&a.cfg) else {
        warn!(
            peer = %a.short,
            "refusing: {} (the agent's max_sessions, {}, are all live)",
            close::REASON_AT_CAPACITY,
            a.cfg.max_sessions.unwrap_or(0)
        );
        refuse(conn, close::REASON_AT_CAPACITY);
        return None;
    };
    let permit = take_slot(conn, &a.peer, &a.short, &a.shared).await;
    if permit.is_none() && !a.shared.shutdown.is_cancelled() {
        warn!(
            peer = %a.short,
            "refusing: {} ({} agents running; {}; every other session has a client attached)",
            close::REASON_AT_CAPACITY,
            a.shared.admission.max_agents,
            a.shared.hubs.summary()
        );
        refuse(conn, close::REASON_AT_CAPACITY);
    }
    let permit = permit?;
    // Removed since its admission (a slot may have been awaited): no agent for it.
    if a.agent.stop.is_cancelled() {
        refuse(conn, REASON_AGENT_REMOVED);
        return None;
    }
    Some(Slot { permit, live, _device: device })
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
async fn run_hub(hub: &Arc<Hub>, inbox: hub::Inbox, outbox: hub::Outbox, slot: Slot, a: &Admitted) {
    let link = HubLink(hub.clone());
    let session = a.cfg.session.clone();
    session::run_on(link, outbox, inbox, &a.short, session, slot.permit, a.shared.shutdown.clone()).await;
    hub.release();
    drop(slot.live);
}
