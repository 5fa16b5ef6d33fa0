//! One session's state between connections: what it holds for its client,
//! who is attached, why it ended; and the one place a connection is
//! installed into it ([`Hub::install`]) or found lost.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex, MutexGuard, OnceLock, Weak},
    task::Waker,
    time::Duration,
};

use bytes::Bytes;
use iroh::{
    endpoint::{Connection, ConnectionError, VarInt},
    EndpointId,
};
use thunderbolt_shared::{close, resume_bridge::BridgeSession};
use tokio::{
    sync::{mpsc, Notify},
    task::JoinHandle,
    time::Instant,
};
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info};

use super::{
    devices::{Members, Seat},
    link::Outbox,
    registry::Hubs,
    restore::Restoring,
    timing::HubTiming,
    Inbox,
};
use crate::journal::{self, Journal, Journals};
use crate::serve::AgentName;
use crate::{
    ids,
    serve::{pump::Inbound, requests::Requests, session::SessionInfo, taps::Tap},
};

/// How long a warm agent must have been quiet after its client's input ended
/// and its last request was answered before that client is let go: notifications
/// that follow an answer (or answer a client's notification, as an echo does)
/// arrive within it on any live agent; a person waiting at `connect` hardly
/// notices it.
pub const KEPT_WARM_QUIET: Duration = Duration::from_millis(300);

/// Close code and reason when a warm agent's client has finished (its input
/// ended and every request it sent was answered): the connection ends, the
/// agent does not; the next connection of the same peer takes it over.
pub const CLOSE_CODE_KEPT_WARM: u32 = close::CLOSE_CODE_KEPT_WARM;
pub const REASON_KEPT_WARM: &str = close::REASON_KEPT_WARM;

/// Close reason for a connection whose session was resumed on a newer one.
pub const REASON_SUPERSEDED: &str = "session resumed on another connection";

/// Close reason for a resumable stream that broke the protocol.
pub const REASON_PROTOCOL: &str = close::REASON_RESUME_PROTOCOL;

/// Client frames queued for the agent's input pump: a few reads' worth, so a
/// client faster than its agent is slowed by QUIC flow control, not buffered.
/// (What is read ahead of it, to reach the client's acks, is bounded apart.)
const INBOX_QUEUE: usize = 16;

/// Most of the agent's output held that the attached resumable connection
/// has not taken yet: past it the agent waits, as it does on the plain path
/// (where the stream's flow control holds it). The resume buffer is for a
/// client that is away; a client that is there but reads slower than the
/// agent writes should slow the agent, not fill that buffer, because
/// megabytes queued ahead of the path make the journal write out what the
/// client gets a moment later, and take the memory and cycles the path
/// needs (full-duplex echo measured 30 MiB queued and 0.7x the plain path's
/// throughput without this bound). 1 MiB is a hundred writes of the
/// connection's writer ahead, and what QUIC's window holds besides.
pub const UNSENT_MAX: u64 = 1 << 20;

/// Detached sessions one NodeId may leave waiting. A device resumes its own
/// sessions; several detached at once are pages or apps that never will (a
/// reload that did not keep its session state, a closed tab, a killed app).
/// A person's few tabs and a phone that locked fit; past it the oldest is
/// ended, so one device can never hold the bridge's slots with sessions
/// nobody will come back to.
pub const MAX_DETACHED_PER_PEER: usize = 4;

/// Ended sessions remembered, so that a late resume is told why its session
/// ended (expired, evicted, revoked) instead of `unknown session`. A token and
/// a reason each: a few hundred KiB at most.
pub const ENDED_REMEMBERED: usize = 1024;

/// Where a new resumable session is journaled: the folder, and the bridge
/// NodeId and protocol it was reached at (a restart takes back only its own).
pub struct JournalAt<'a> {
    pub journals: &'a Journals,
    pub node: EndpointId,
    pub protocol: &'a str,
}

impl JournalAt<'_> {
    /// The session's journal, or none when it cannot be written (said in the log).
    fn create(
        &self,
        token: &str,
        id: &str,
        grace: Duration,
        owner: EndpointId,
        agent: &AgentName,
    ) -> Option<Journal> {
        let header = journal::Header {
            id: Some(id.to_string()),
            grace_ms: Some(grace.as_millis() as u64),
            journal: journal::JOURNAL_VERSION,
            token_sha256: journal::token_hash(token),
            node: self.node.to_string(),
            owner: owner.to_string(),
            agent: agent.as_str().to_string(),
            protocol: self.protocol.to_string(),
            created_ms: journal::record::unix_ms(std::time::SystemTime::now()),
        };
        match self.journals.create(header) {
            Ok(j) => Some(j),
            Err(e) => {
                tracing::warn!(
                    "cannot write a session journal in {} ({e}): this session will not survive a restart of the bridge",
                    self.journals.dir().display()
                );
                None
            }
        }
    }
}

/// What kind of connections drive a hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HubKind {
    /// `thunderbolt/<p>/r1`: frames counted, replayed after a loss.
    Resumable,
    /// `thunderbolt/<p>/0` with `--keep-warm`: the agent outlives each
    /// connection; nothing is replayed.
    Warm,
}

/// Why a session ended: for the log, and the close a later resume gets.
#[derive(Debug, Clone)]
pub(super) struct Gone {
    pub(super) why: String,
    /// The reason a resume of the ended session is closed with (code 1).
    pub(super) resume_reason: String,
}

impl Gone {
    pub(super) fn new(why: impl Into<String>, resume_reason: impl Into<String>) -> Self {
        Self { why: why.into(), resume_reason: resume_reason.into() }
    }
}

/// One session's state between connections.
#[derive(Debug)]
pub struct Hub {
    /// The first token's first characters: the session's name in logs.
    pub(super) id: String,
    pub(super) kind: HubKind,
    pub(super) owner: EndpointId,
    /// The agent it runs.
    pub(super) agent: AgentName,
    pub(super) peer: String,
    pub(super) cfg: HubTiming,
    pub(super) max_frame: usize,
    pub(super) created: Instant,
    pub(super) state: Mutex<State>,
    /// The session's state changed: attach, detach, an ack, the end.
    pub(super) changed: Notify,
    /// Something for the attached connection's writer: new output, an ack due.
    /// Apart from `changed` so output wakes only the writer, not the session.
    pub(super) output: Notify,
    /// Lines the bridge writes to the agent itself (answers for a vanished
    /// client), ahead of the client's.
    pub(super) inject: mpsc::UnboundedSender<Bytes>,
    /// The registry, told of detaches (it caps detached sessions per peer).
    pub(super) registry: Weak<Hubs>,
    /// Warm: the session's record of the client's requests in flight.
    pub(super) requests: OnceLock<Arc<Requests>>,
    /// The session's tap: told when the client goes away.
    pub(super) tap: OnceLock<Arc<dyn Tap>>,
    /// Whether a connection is attached, kept beside `State::attached` for
    /// the agent's output path to read without the lock.
    pub(super) attached_now: std::sync::atomic::AtomicBool,
    /// This device observes a session others are on (its frames go in
    /// batches): kept beside the session's controller for the writer to read
    /// without the session's lock.
    pub(super) observing: std::sync::atomic::AtomicBool,
    /// What `thunderbolt status` shows of it.
    pub(super) info: Arc<SessionInfo>,
    /// A device that joined another device's session: its seat there.
    pub(super) seat: OnceLock<Seat>,
    /// The device this hub carries (its NodeId and name).
    pub(super) device: OnceLock<thunderbolt_shared::devices::Device>,
}

#[derive(Debug)]
pub(super) struct State {
    /// What the client presents to resume. A warm agent's next session gets
    /// a new one (frames are counted per session). Empty for a session taken
    /// back after a restart until its client presents it (the journal keeps
    /// only its hash).
    pub(super) token: String,
    /// The token's SHA-256 (hex): how a resume finds the session.
    pub(super) token_hash: String,
    /// The session's journal, when it survives a restart of the bridge.
    pub(super) journal: Option<Journal>,
    /// Taking the session back after a restart: the agent's answers to the
    /// bridge's own calls go to the restore, not to the client.
    pub(super) restoring: Option<Restoring>,
    /// The close the session ends with when its agent ends (a session taken
    /// back whose agent could not reload it), instead of how the agent ended.
    pub(super) close_as: Option<String>,
    /// A session taken back after a restart: ids (raw JSON) of the requests
    /// its new agent made and its client has not answered. The client's
    /// answers to any other (the old agent's) are dropped.
    pub(super) asked: Option<HashSet<String>>,
    /// The agent's output by age while a client is attached (its `due()`:
    /// when the journal is next looked at, see [`Hub::journal_output`]).
    pub(super) journal_behind: journal::WriteBehind,
    /// A session taken back after a restart, until its client first
    /// attaches: the agent's frames the journal held (the new agent's are
    /// numbered after them, or after what the client holds if that is more).
    pub(super) restored_at: Option<u64>,
    /// A resumable connection was the last attached and did not close: output
    /// is kept for it (else a warm agent's output with nobody attached is dropped).
    pub(super) resumable: bool,
    /// When the attached client's input ended (a warm agent's stdin stays open).
    pub(super) input_ended: Option<Instant>,
    /// When the agent last wrote (a warm agent's finished client is let go
    /// only once it has been quiet a moment: see [`KEPT_WARM_QUIET`]).
    pub(super) last_output: Option<Instant>,
    /// The `/r1` side of the session for the attached device: the agent's
    /// frames kept for a resend, the device's counted and acknowledged.
    pub(super) r1: BridgeSession<Instant>,
    /// The agent's output ended after this many frames.
    pub(super) end_at: Option<(u64, Instant)>,
    pub(super) inbox: Option<mpsc::Sender<Inbound>>,
    /// The client's frame over the cap being skipped (its index), once its
    /// head went to the agent's pump; a resend of it after a reconnect is not
    /// announced twice.
    pub(super) oversize_at: Option<u64>,
    pub(super) attached: Option<Attachment>,
    pub(super) detached_since: Option<Instant>,
    pub(super) gone: Option<Gone>,
    pub(super) next_conn: u64,
    /// The agent-output side, waiting for room in the log.
    pub(super) writer: Option<Waker>,
    /// How far (in [`ReplayLog::pushed_bytes`]) the attached resumable
    /// connection's writer has taken the output: what lies beyond is not
    /// on its way yet, and is kept short (see [`UNSENT_MAX`]).
    pub(super) sent_mark: Option<u64>,
    /// Warm: ids of the agent's requests the attached client has not answered.
    pub(super) pending: HashSet<String>,
    /// Warm: the client's output is all delivered (the plain stream finished).
    pub(super) plain_done: bool,
    /// Warm: lines the agent wrote while no client was attached (dropped).
    pub(super) dropped: u64,
    /// Times a client resumed it.
    pub(super) resumes: u64,
    /// What the session's devices share (the session's hub only).
    pub(super) members: Members,
    /// A device the agent does not wait for (an observer) whose log was
    /// full: the agent's frames and bytes it did not get, told to it in one
    /// [`METHOD_MISSED`](thunderbolt_shared::devices::METHOD_MISSED) notice
    /// once its log has room again.
    pub(super) missed: Option<(u64, u64)>,
    /// This device's input ended while others were on the session: it is
    /// sent what it was sent so far and an end, then let go.
    pub(super) leaving: bool,
}

#[derive(Debug)]
pub(super) struct Attachment {
    pub(super) id: u64,
    pub(super) conn: Connection,
    pub(super) since: Instant,
    /// `thunderbolt/<p>/r1` (else the plain protocol).
    pub(super) r1: bool,
    pub(super) _task: AbortOnDropHandle<()>,
}

impl State {
    /// The id of the next connection to attach (0 for the session's first).
    pub(super) fn next_id(&mut self) -> u64 {
        self.next_conn += 1;
        self.next_conn - 1
    }

    pub(super) fn is_attached(&self, id: u64) -> bool {
        self.attached.as_ref().is_some_and(|a| a.id == id)
    }
}

/// What a wait on the hub's state does next (see [`Hub::until`]).
pub(super) enum Step<T> {
    Ready(T),
    /// Wait for a change, or until this instant.
    Wait(Option<Instant>),
}

/// Which notifications end a wait.
#[derive(Clone, Copy)]
pub(super) enum Wake {
    /// State changes only (the session core's waits).
    Changed,
    /// State changes and new output or acks due (the connection writers).
    Any,
}

/// A session as `thunderbolt status` sees it.
#[derive(Debug)]
pub struct HubView {
    pub info: Arc<SessionInfo>,
    /// The connection attached now, and whether it speaks `r1`.
    pub attached: Option<(Connection, bool)>,
    /// Nothing attached: how long it waits still.
    pub waiting: Option<Duration>,
    pub warm: bool,
    /// Every device on a resumable session and its role (the first device first).
    pub members: Vec<super::MemberView>,
    pub resumes: u64,
    pub gone: bool,
}

/// Why a connection could not attach.
#[derive(Debug)]
pub enum AttachError {
    /// The session ended; close the connection with this reason.
    Gone(String),
    /// The client holds fewer frames than it already acknowledged: the
    /// session is ended (what it lacks is gone).
    Stale { claimed: u64, acked: u64 },
    /// The client claims frames that were never sent.
    BadPosition(String),
}

/// Tries at a session id no live session has (32 random bits: among a few
/// dozen sessions a second try is already one in tens of millions).
const SESSION_ID_TRIES: usize = 4;

impl Hub {
    /// A new session for `owner`, and the two ends the agent's pumps use;
    /// journaled where `journal` says (it then survives a restart of the bridge).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kind: HubKind,
        owner: EndpointId,
        agent: AgentName,
        cfg: HubTiming,
        max_frame: usize,
        registry: Weak<Hubs>,
        journal: Option<JournalAt<'_>>,
    ) -> (Arc<Self>, Inbox, Outbox) {
        let token = ids::token();
        // Random, not derived from the token (a listing shows it to every
        // device that may join), unique among the sessions alive.
        let taken = |id: &str| registry.upgrade().is_some_and(|h| h.all().iter().any(|s| s.short() == id));
        let mut id = ids::session_id();
        for _ in 0..SESSION_ID_TRIES {
            if !taken(&id) {
                break;
            }
            id = ids::session_id();
        }
        let journal = journal.and_then(|at| at.create(&token, &id, cfg.grace, owner, &agent));
        Self::with_state(kind, id, owner, agent, cfg, max_frame, registry, |st| {
            st.token = token;
            st.journal = journal;
        })
    }

    /// A hub named `id`, its state as `init` leaves it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn with_state(
        kind: HubKind,
        id: String,
        owner: EndpointId,
        agent: AgentName,
        cfg: HubTiming,
        max_frame: usize,
        registry: Weak<Hubs>,
        init: impl FnOnce(&mut State),
    ) -> (Arc<Self>, Inbox, Outbox) {
        let (tx, rx) = mpsc::channel(INBOX_QUEUE);
        let (inject, injected) = mpsc::unbounded_channel();
        let now = Instant::now();
        let info = SessionInfo::new(id.clone(), agent.clone(), owner);
        let mut state = State {
            token: String::new(),
            token_hash: String::new(),
            journal: None,
            restoring: None,
            close_as: None,
            asked: None,
            journal_behind: journal::WriteBehind::default(),
            restored_at: None,
            resumable: false,
            input_ended: None,
            last_output: None,
            r1: BridgeSession::default(),
            end_at: None,
            inbox: Some(tx),
            oversize_at: None,
            attached: None,
            detached_since: Some(now),
            gone: None,
            next_conn: 0,
            writer: None,
            sent_mark: None,
            pending: HashSet::new(),
            plain_done: false,
            dropped: 0,
            resumes: 0,
            members: Members::default(),
            missed: None,
            leaving: false,
        };
        init(&mut state);
        if !state.token.is_empty() {
            state.token_hash = journal::token_hash(&state.token);
        }
        let hub = Arc::new(Self {
            info,
            id,
            kind,
            inject,
            owner,
            agent,
            peer: owner.fmt_short().to_string(),
            cfg,
            max_frame,
            created: now,
            state: Mutex::new(state),
            changed: Notify::new(),
            output: Notify::new(),
            registry,
            requests: OnceLock::new(),
            tap: OnceLock::new(),
            attached_now: false.into(),
            observing: false.into(),
            seat: OnceLock::new(),
            device: OnceLock::new(),
        });
        let outbox = Outbox { hub: hub.clone() };
        (hub, Inbox::new(rx, Some(injected), true, max_frame), outbox)
    }

    /// The first token's first characters, for logs (a token itself is never logged).
    pub fn short(&self) -> &str {
        &self.id
    }

    pub fn agent(&self) -> &AgentName {
        &self.agent
    }

    pub fn owner(&self) -> EndpointId {
        self.owner
    }

    pub fn kind(&self) -> HubKind {
        self.kind
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes everyone waiting on the state (call with the lock released).
    pub(super) fn wake(&self, writer: Option<Waker>) {
        if let Some(w) = writer {
            w.wake();
        }
        self.changed.notify_waiters();
        self.output.notify_waiters();
    }

    /// Runs `check` on the state until it is ready, waiting in between for a
    /// change (`wake`) or the instant it asks for. The one "notify, check the
    /// state, wait" loop of the hub: the notification is armed before the
    /// state is read, so nothing that changes in between is missed.
    pub(super) async fn until<T>(&self, wake: Wake, mut check: impl FnMut(&mut State) -> Step<T>) -> T {
        loop {
            let changed = self.changed.notified();
            let output = self.output.notified();
            tokio::pin!(changed, output);
            changed.as_mut().enable();
            let any = matches!(wake, Wake::Any);
            if any {
                output.as_mut().enable();
            }
            let deadline = match check(&mut self.lock()) {
                Step::Ready(v) => return v,
                Step::Wait(d) => d,
            };
            let sleep = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut changed => {}
                _ = &mut output, if any => {}
                _ = sleep => {}
            }
        }
    }

    /// A run of the agent's output just taken into the replay log. What
    /// matters of it to a restart is journaled at
    /// once; the frames themselves are written at once only while no client
    /// is attached, else once they are [`journal::WRITE_BEHIND`] old and
    /// still unacknowledged (most are acknowledged before, and never
    /// written: see [`crate::journal`]).
    pub(super) fn journal_output(&self, st: &mut State, run: &[u8]) {
        let Some(j) = st.journal.as_mut() else { return };
        j.saw_output(run);
        if st.attached.is_none() {
            self.flush_journal(st);
            return;
        }
        st.journal_behind.output(Instant::now(), st.r1.out.total());
    }

    /// The write-behind's turn (at `journal_behind.due()`): the agent's frames that
    /// are [`journal::WRITE_BEHIND`] old and still unacknowledged are
    /// written; younger ones wait for their own turn ([`journal::WriteBehind`]).
    pub(super) fn journal_turn(&self, st: &mut State) {
        let upto = st.journal_behind.turn(Instant::now());
        if let Some(n) = upto {
            self.write_journal_to(st, n);
        }
    }

    /// Writes the agent's frames the journal lacks and the client has not
    /// acknowledged (those it has are skipped in one record).
    pub(super) fn flush_journal(&self, st: &mut State) {
        st.journal_behind.clear();
        let total = st.r1.out.total();
        self.write_journal_to(st, total);
    }

    /// Writes the agent's frames before `upto` that the journal lacks and the
    /// client has not acknowledged.
    fn write_journal_to(&self, st: &mut State, upto: u64) {
        let st = &mut *st;
        let Some(j) = st.journal.as_mut() else { return };
        let upto = upto.min(st.r1.out.total());
        if j.written_to() >= upto {
            return;
        }
        let from = j.written_to().max(st.r1.out.acked());
        if from < upto {
            let runs = st.r1.out.range(from, upto).unwrap_or_default();
            j.write_output(from, &runs, upto);
        } else {
            // All acknowledged: the journal skips them in one record.
            j.write_output(from, &[], from);
        }
        self.compact_journal(st);
    }

    /// Journals what a restart needs of another device's run on its way to
    /// the agent (this hub is the session's; see `Journal::other_device_run`).
    pub(super) fn journal_other_device(&self, run: &[u8], names_an_id: bool) {
        let mut st = self.lock();
        if let Some(j) = st.journal.as_mut() {
            j.other_device_run(run, names_an_id);
            self.compact_journal(&mut st);
        }
    }

    /// Journals a run of the client's frames before the agent's queue takes
    /// it (`names_an_id`: [`jsonrpc::names_an_id`] of the run).
    pub(super) fn journal_input(&self, st: &mut State, run: &[u8], frames: u64, names_an_id: bool) {
        if let Some(j) = st.journal.as_mut() {
            j.client_run(run, frames, names_an_id);
            self.compact_journal(st);
        }
    }

    /// Rewrites the journal as a snapshot and the output still held, once it
    /// grew far past that (either side's records make it grow).
    pub(super) fn compact_journal(&self, st: &mut State) {
        let due = st.journal.as_ref().is_some_and(|j| j.compact_due(st.r1.out.bytes()));
        if due {
            self.rewrite_journal(st);
        }
    }

    /// Rewrites the journal as a snapshot of the state and the output held.
    pub(super) fn rewrite_journal(&self, st: &mut State) {
        let st = &mut *st;
        let Some(j) = st.journal.as_mut() else { return };
        let snap = journal::Snapshot {
            out_base: st.r1.out.acked(),
            client_frames: st.r1.acks.received(),
            ledger: j.ledger.clone(),
            pending: j.pending.ids(),
            resumes: st.resumes,
        };
        let live = st.r1.out.since(st.r1.out.acked()).unwrap_or_default();
        j.compact(&snap, &live);
    }

    /// Whether no connection is attached and the session still runs (for a
    /// warm hub: its agent waits for the next connection).
    pub fn is_detached(&self) -> bool {
        let st = self.lock();
        self.away_since(&st).is_some()
    }

    /// How long the session has waited without a connection, if it does.
    pub fn detached_for(&self) -> Option<Duration> {
        let st = self.lock();
        self.away_since(&st).map(|t| t.elapsed())
    }

    /// What `thunderbolt status` shows of the session now.
    pub fn view(&self) -> HubView {
        let members = if self.kind == HubKind::Resumable { self.members() } else { Vec::new() };
        let st = self.lock();
        let attached = st.attached.as_ref().map(|a| (a.conn.clone(), a.r1));
        let waiting = self.away_since(&st).map(|since| {
            let (wait, _) = self.cfg.wait(st.resumable || self.kind == HubKind::Resumable);
            (since + wait).saturating_duration_since(Instant::now())
        });
        HubView {
            members,
            info: self.info.clone(),
            attached,
            waiting,
            warm: self.kind == HubKind::Warm,
            resumes: st.resumes,
            gone: st.gone.is_some(),
        }
    }

    pub fn info(&self) -> &Arc<SessionInfo> {
        &self.info
    }

    /// Installs connection `id` as the attached one, its `task` (the path's
    /// reader and writer) owned by the session until the connection is lost
    /// or replaced; a connection attached before is closed. The one way in
    /// for resumable and warm connections alike.
    pub(super) fn install(
        &self,
        mut st: MutexGuard<'_, State>,
        id: u64,
        conn: Connection,
        r1: bool,
        task: JoinHandle<()>,
    ) {
        self.attached_now.store(true, std::sync::atomic::Ordering::Relaxed);
        st.sent_mark = None;
        let old = st.attached.replace(Attachment {
            id,
            conn,
            since: Instant::now(),
            r1,
            _task: AbortOnDropHandle::new(task),
        });
        st.detached_since = None;
        let writer = st.writer.take();
        drop(st);
        if let Some(s) = self.seat.get().and_then(|s| s.session.upgrade()) {
            s.changed.notify_waiters();
        }
        if let Some(old) = old {
            debug!(peer = %self.peer, session = self.short(), "closing the connection this one replaces");
            old.conn.close(VarInt::from_u32(close::CLOSE_CODE_REFUSED), REASON_SUPERSEDED.as_bytes());
        }
        self.wake(writer);
    }

    /// The connection `id` is gone: the client's close ends the session, any
    /// other loss detaches it. A warm agent's session is only ever detached:
    /// kept for a resume when a resumable connection was lost, else the agent
    /// waits for its peer's next connection.
    pub(super) fn lost(self: &Arc<Self>, id: u64, conn: &Connection, why: &str) {
        let mut st = self.lock();
        if !st.is_attached(id) {
            return;
        }
        let attached = st.attached.take();
        st.sent_mark = None;
        self.attached_now.store(false, std::sync::atomic::Ordering::Relaxed);
        let mut detached = false;
        // A device that closes a session others are on leaves it; they go on.
        let mut left = false;
        // The client's own close, or ours (a warm agent's finished client).
        let ended =
            is_client_close(conn) || matches!(conn.close_reason(), Some(ConnectionError::LocallyClosed));
        // A stream can fail before its connection's close is read; the close says what it was.
        let why = if is_client_close(conn) { "the client closed the connection" } else { why };
        if self.kind == HubKind::Warm {
            if st.gone.is_none() {
                st.detached_since = Some(Instant::now());
                detached = true;
                let r1 = attached.as_ref().is_some_and(|a| a.r1);
                if r1 && !ended {
                    st.resumable = true;
                    info!(
                        peer = %self.peer,
                        session = self.short(),
                        "connection lost ({why}); the warm agent keeps running and the session waits {:?} for \
                         the client ({} byte(s) of output held)",
                        self.cfg.wait(true).0,
                        st.r1.out.bytes()
                    );
                } else {
                    st.resumable = false;
                    if let Some(r) = self.requests.get() {
                        // Nobody waits for those answers any more.
                        r.clear();
                    }
                    let answered = self.answer_for_vanished_client(&mut st);
                    info!(
                        peer = %self.peer,
                        "client left ({why}); the agent stays warm {:?} for this peer's next connection{}",
                        self.cfg.wait(false).0,
                        if answered > 0 { format!(" ({answered} of its request(s) answered with an error)") } else { String::new() }
                    );
                }
            }
        } else if st.leaving && self.is_guest() {
            st.gone.get_or_insert_with(|| Gone::new(close::REASON_LEFT, close::REASON_UNKNOWN_SESSION));
            left = true;
        } else if st.leaving {
            left = true;
        } else if is_client_close(conn) && self.is_guest() {
            st.gone
                .get_or_insert_with(|| Gone::new(close::REASON_CLIENT_CLOSED, close::REASON_UNKNOWN_SESSION));
            left = true;
        } else if is_client_close(conn) && !st.members.guests.is_empty() {
            left = true;
        } else if is_client_close(conn) {
            st.gone
                .get_or_insert_with(|| Gone::new(close::REASON_CLIENT_CLOSED, close::REASON_UNKNOWN_SESSION));
        } else if st.gone.is_none() {
            st.detached_since = Some(Instant::now());
            detached = true;
            info!(
                peer = %self.peer,
                session = self.short(),
                "connection lost ({why}); the agent keeps running and the session waits {:?} for the client \
                 ({} byte(s) of output held)",
                self.cfg.wait(true).0,
                st.r1.out.bytes()
            );
        }
        let writer = st.writer.take();
        drop(st);
        self.wake(writer);
        let session = self.session_hub().filter(|s| !Arc::ptr_eq(s, self));
        if left {
            if let Some(s) = self.session_hub() {
                s.member_left(self, "it closed the session");
            }
        } else if let Some(s) = &session {
            // The session counts its devices' absences (its grace, its end).
            s.changed.notify_waiters();
        }
        if detached {
            // The moment a restart would matter most: what the client lacks is on the disk.
            let mut st = self.lock();
            self.flush_journal(&mut st);
            if let Some(j) = st.journal.as_ref() {
                j.sync_behind();
            }
            drop(st);
            if let Some(registry) = self.registry.upgrade() {
                registry.on_detach(&self.owner);
            }
            if let Some(t) = self.tap.get() {
                t.detached();
            }
        }
        // Last: this may be the very task running us.
        drop(attached);
    }
}

/// Whether the peer closed `conn` itself, the way clients end a session: code
/// 0 with the reason `client closed`, exactly. Anything else, code 0 with an
/// empty reason included (what dropping a connection object sends), is a loss.
pub(super) fn is_client_close(conn: &Connection) -> bool {
    matches!(
        conn.close_reason(),
        Some(ConnectionError::ApplicationClosed(ac))
            if ac.error_code.into_inner() == close::CLOSE_CODE_CLIENT as u64
                && &ac.reason[..] == close::REASON_CLIENT_CLOSED.as_bytes()
    )
}
