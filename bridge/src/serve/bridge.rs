//! A running bridge: the agents it serves, what every connection shares, the
//! heartbeat and the changes a host asks for while it runs; shutdown that
//! waits for every agent to be reaped.

use std::{
    collections::HashMap,
    sync::{atomic::Ordering, Arc, Mutex, RwLock},
    time::Duration,
};

use tokio::sync::{mpsc, Semaphore};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{debug, info, warn};

use super::{
    accept::spawn_accept,
    admit::Admission,
    gate::Gate,
    served::{AgentConfig, AgentName, Served, REASON_AGENT_REMOVED},
    sessions::{Hubs, PlainSessions, Recheck},
    slots::PerDevice,
    status,
    taps::OnRevoked,
    throttle::LogBudget,
};
use iroh::{Endpoint, EndpointId};

use super::session::SessionConfig;
use crate::{
    devices::scope::Verbs,
    trust::{account::Account, TrustPolicy},
};

/// Everything a connection task needs.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(super) gate: Arc<Gate>,
    pub(crate) sessions: PlainSessions,
    /// Resumable and warm sessions, attached or waiting for their client.
    pub(crate) hubs: Arc<Hubs>,
    pub(crate) admission: Admission,
    pub(crate) agents: Arc<Semaphore>,
    /// Live sessions per NodeId, for [`Admission::max_per_device`].
    pub(super) per_device: Arc<PerDevice>,
    /// The agents served now, by name.
    pub(super) served: RwLock<HashMap<AgentName, Arc<Served>>>,
    pub(super) shutdown: CancellationToken,
    pub(super) tasks: TaskTracker,
    /// A stranger dialing in a loop costs a few log lines, not one per dial.
    pub(super) refusal_log: Mutex<LogBudget>,
    /// A heartbeat is running (at most one at a time).
    pub(super) beating: std::sync::atomic::AtomicBool,
    /// The home's devices, pairing codes and allow file (absent in tests of
    /// the bare serving core).
    pub(super) stores: RwLock<Option<Arc<Stores>>>,
    /// Told after every re-check of trust (the notices' subscriptions).
    on_revoked: RwLock<Option<Arc<dyn OnRevoked>>>,
    /// Where resumable sessions are journaled, so they survive a restart
    /// (`None`: `--no-journal`, or the serving core's tests).
    pub(crate) journals: std::sync::OnceLock<Arc<crate::journal::Journals>>,
    /// Where devices' files go (`None`: the serving core's tests, no home).
    pub(crate) files: std::sync::OnceLock<Arc<super::files::FilesState>>,
    /// The home's messages, when this process took its socket.
    pub(crate) reach: std::sync::OnceLock<Arc<crate::reach::Reach>>,
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
    Remove(AgentName),
}

/// A running bridge.
#[derive(Debug)]
pub struct Bridge {
    shared: Arc<Shared>,
    changes: Option<mpsc::UnboundedReceiver<Change>>,
    handle: status::BridgeHandle,
}

impl Bridge {
    /// A bridge serving one agent on `endpoint` with these settings (the
    /// serving core's tests; the commands start theirs with [`Bridge::serve`]).
    pub fn new(
        endpoint: Endpoint,
        trust: Arc<dyn TrustPolicy>,
        gate: Arc<Gate>,
        account: Option<Arc<Account>>,
        admission: Admission,
        session: SessionConfig,
    ) -> Self {
        let agent = Served::new(
            endpoint,
            AgentConfig {
                name: AgentName::Single,
                label: "".into(),
                protocol: String::new(),
                trust,
                session: Arc::new(session),
                max_sessions: None,
                account,
                bridge_identity: false,
                own_devices: true,
            },
        );
        Self::serve("bridge", gate, admission, vec![agent]).0
    }

    /// The home whose devices, pairing codes and allow file this bridge uses:
    /// devices pair with it, names show in the log and in `status`, and an
    /// allow-file edit is applied to live sessions within a second. With
    /// `keep_files`, the files put for a session stay after it ended.
    pub fn with_home(self, home: &crate::home::Home, keep_files: bool) -> Self {
        *self.shared.stores.write().unwrap_or_else(|p| p.into_inner()) = Some(Stores::new(home));
        let _ = self.shared.files.set(Arc::new(super::files::FilesState {
            store: crate::files::store::Store::new(home.files_dir()),
            home: home.root_path().to_path_buf(),
            in_flight: Arc::default(),
            keep_files,
            workspaces: Default::default(),
            trees: Default::default(),
        }));
        self
    }

    /// Serves the home's messages to its owner's devices (`/reach1`).
    pub fn with_reach(self, reach: Option<Arc<crate::reach::Reach>>) -> Self {
        if let Some(r) = reach {
            let _ = self.shared.reach.set(r);
        }
        self
    }

    /// Journals resumable sessions in `journals`, so they survive a restart
    /// of the bridge; the sessions journaled by its last run are taken back
    /// when it starts.
    pub fn with_journals(self, journals: Option<Arc<crate::journal::Journals>>) -> Self {
        if let Some(j) = journals {
            let _ = self.shared.journals.set(j);
        }
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

    /// Tells `on` after every re-check of trust what no agent admits any
    /// more (the notices drop those devices' push subscriptions).
    pub fn on_revoked(self, on: Option<Arc<dyn OnRevoked>>) -> Self {
        *self.shared.on_revoked.write().unwrap_or_else(|p| p.into_inner()) = on;
        self
    }

    /// What the control API drives: status, kick, recheck.
    pub fn handle(&self) -> status::BridgeHandle {
        self.handle.clone()
    }

    /// A bridge serving `agents` (`kind`: `bridge` for the single-agent
    /// commands, `host`), to which the returned sender adds, changes and
    /// removes agents while it runs.
    pub fn serve(
        kind: &'static str,
        gate: Arc<Gate>,
        admission: Admission,
        agents: Vec<Arc<Served>>,
    ) -> (Self, mpsc::UnboundedSender<Change>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut b = Self::empty(gate, admission, kind);
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
            sessions: PlainSessions::default(),
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
            on_revoked: RwLock::new(None),
            journals: std::sync::OnceLock::new(),
            files: std::sync::OnceLock::new(),
            reach: std::sync::OnceLock::new(),
        });
        let handle = status::BridgeHandle::new(shared.clone(), kind);
        Self { shared, changes: None, handle }
    }

    /// Serves until `stop` is cancelled, then ends every session (agents killed
    /// and reaped) and closes the endpoints.
    pub async fn run(mut self, stop: CancellationToken) {
        let shared = self.shared.clone();
        let initial: Vec<Arc<Served>> = shared.served().into_values().collect();
        for agent in &initial {
            spawn_accept(&shared, agent.clone());
        }
        super::sessions::restore::spawn_all(&shared, &initial);
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
        // The next moment a device's scope runs out: its sessions end then,
        // not at the next heartbeat.
        let next_expiry = |s: &Shared| {
            let now = crate::devices::now_ms();
            let at = s.stores()?.devices.next_expiry(now)?;
            Some(tokio::time::Instant::now() + Duration::from_millis(at - now + 1))
        };
        let mut expiry = next_expiry(&shared);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = allow_tick.tick() => {
                    let now = allow_stamp(&shared);
                    if now != last_allow {
                        last_allow = now;
                        expiry = next_expiry(&shared);
                        let ended = self.handle.recheck();
                        if ended > 0 {
                            info!("the allow file changed: {ended} session(s) no longer allowed were ended");
                        }
                    }
                }
                _ = async { tokio::time::sleep_until(expiry.unwrap_or_else(tokio::time::Instant::now)).await }, if expiry.is_some() => {
                    expiry = next_expiry(&shared);
                    let ended = self.handle.recheck();
                    info!("a device's scope ran out: {ended} of its session(s) ended");
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
        // The sessions, not the tracked tasks: those include each agent's
        // accept loop and relay watch, and a user reading "ending 2
        // connection(s)" with nobody connected would look for two clients.
        let sessions: usize = served.values().map(|a| a.live_sessions()).sum();
        info!("shutting down: ending {sessions} session(s)");
        shared.shutdown.cancel();
        shared.tasks.close();
        shared.tasks.wait().await;
        for agent in served.into_values() {
            crate::net::close_endpoint(agent.endpoint.clone(), crate::limits::ENDPOINT_CLOSE_TIMEOUT).await;
        }
    }
}

impl Shared {
    /// What `peer` may do at the agent `cfg` serves now (its scope; the
    /// owner's everything when it has none or there is no home).
    pub(crate) fn verbs(&self, cfg: &AgentConfig, peer: &EndpointId) -> Verbs {
        self.stores().map_or(Verbs::ALL, |s| s.devices.verbs_at(peer, &cfg.name.scope_name(&cfg.protocol)))
    }

    pub(crate) fn stores(&self) -> Option<Arc<Stores>> {
        self.stores.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn served(&self) -> HashMap<AgentName, Arc<Served>> {
        self.served.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Ends every session whose peer its agent's trust no longer admits, and
    /// drops the push subscriptions of devices no agent admits any more (the
    /// heartbeat, an allow-file edit, `iroh deny`). Returns how many sessions ended.
    pub(crate) fn recheck(&self) -> usize {
        let configs: HashMap<AgentName, Arc<AgentConfig>> =
            self.served().into_iter().map(|(name, a)| (name, a.config())).collect();
        if let Some(on) = self.on_revoked.read().unwrap_or_else(|p| p.into_inner()).clone() {
            let trusts: Vec<_> = configs.values().map(|c| c.trust.clone()).collect();
            on.revoked(Box::new(move |id| trusts.iter().any(|t| t.check(id).is_some())));
        }
        let stores = self.stores();
        let admits = |name: &AgentName, id: &EndpointId| {
            configs.get(name).is_some_and(|c| c.trust.check(id).is_some())
        };
        let verbs =
            |name: &AgentName, id: &EndpointId| configs.get(name).map_or(Verbs::NONE, |c| self.verbs(c, id));
        let reason = |id: &EndpointId| {
            if stores.as_ref().is_some_and(|s| s.devices.expired(id)) {
                thunderbolt_shared::close::REASON_SCOPE_EXPIRED
            } else {
                thunderbolt_shared::close::REASON_MEMBERSHIP_REVOKED
            }
        };
        let share = |id: &EndpointId| stores.as_ref().and_then(|s| s.devices.scope_of(id).session);
        let r = Recheck { admits: &admits, verbs: &verbs, reason: &reason, share: &share };
        self.sessions.recheck(&r) + self.hubs.recheck(&r)
    }
}

/// Applies one change the host asked for.
fn apply(shared: &Arc<Shared>, change: Change) {
    match change {
        Change::Add(agent) => {
            let name = agent.name();
            shared.served.write().unwrap_or_else(|p| p.into_inner()).insert(name, agent.clone());
            spawn_accept(shared, agent.clone());
            super::sessions::restore::spawn_all(shared, std::slice::from_ref(&agent));
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
    // A share's guest whose share ended long ago is nobody's device: it goes.
    if let Some(stores) = shared.stores() {
        let _ = tokio::task::spawn_blocking(move || stores.devices.forget_ended_shares()).await;
    }
    let accounts: Vec<Arc<Account>> =
        shared.served().values().filter_map(|a| a.config().account.clone()).collect();
    crate::trust::account::refresh_all(&accounts).await;
    let closed = shared.recheck();
    tracing::debug!(open = shared.sessions.len(), closed, "heartbeat: {}", shared.hubs.summary());
}

/// How often the allow file is looked at (one `stat`) for a change to apply
/// to live sessions: a revoked device is out within about this.
const ALLOW_FILE_CHECK: Duration = Duration::from_secs(1);
