//! One session's state between connections: what it holds for its client,
//! who is attached, why it ended; and the one place a connection is
//! installed into it ([`Hub::install`]) or found lost. The state itself,
//! field by field, is in [`state`](super::state).
//!
//! # Lock order
//!
//! Each hub's `State` is behind one `std` mutex (`Hub::lock`), never
//! held across an `.await`. Two hubs' locks are held at once only on a
//! shared session ([`devices`](super::devices)), and then in one order: **the
//! session's hub first, then one guest's** (a device's hub that joined it);
//! never a guest's and then its session's, and never two guests' at once
//! (each guest's is let go before the next one's is taken). Code running
//! on a guest that needs its session's state lets its own lock go first
//! (`control` on an ack or an eof, `deliver`, `tell_role`).
//!
//! Where both are held, the session's state locked and each guest's taken
//! in turn: the agent's output fed to each device (`Outbox::push`:
//! `held`, `share_output`), the agent's end (`HubLink::finish`,
//! `delivered`), who is away (`away_since`, `members_away`), a new seat
//! (`make_seat_for`), control passing on (`member_left`,
//! `next_controller`), and what `status` shows (`members`, `any_attached`).
//!
//! Around the hubs' locks: the registry's ([`Hubs`]: its map, the ended
//! sessions) are taken before a hub's, never under one; under a hub's only
//! locks that take no hub's are taken (the session's `Requests`, what
//! [`SessionInfo`] observes).

use std::{
    sync::{Arc, Mutex, MutexGuard, OnceLock, Weak},
    task::Waker,
    time::Duration,
};

use bytes::Bytes;
use iroh::{
    endpoint::{Connection, ConnectionError, VarInt},
    EndpointId,
};
use thunderbolt_shared::close;
use tokio::{
    sync::{mpsc, Notify},
    task::JoinHandle,
    time::Instant,
};
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info};

pub use super::state::JournalAt;
pub(super) use super::state::{Gone, State};
use super::{devices::Seat, link::Outbox, registry::Hubs, state::Attachment, timing::HubTiming, Inbox};
use crate::journal;
use crate::serve::AgentName;
use crate::{
    ids,
    serve::{requests::Requests, session::SessionInfo, taps::Tap},
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

/// What kind of connections drive a hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HubKind {
    /// `thunderbolt/<p>/r1`: frames counted, replayed after a loss.
    Resumable,
    /// `thunderbolt/<p>/0` with `--keep-warm`: the agent outlives each
    /// connection; nothing is replayed.
    Warm,
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
    /// Everything that changes (see [`State`]), behind one lock. Lock order
    /// (the module's doc): a session's hub before a guest's, never the
    /// reverse, one guest at a time; the registry's locks before any hub's.
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
    /// Whether a connection is attached, kept beside `Conn::attached` for
    /// the agent's output path to read without the lock.
    pub(super) attached_now: std::sync::atomic::AtomicBool,
    /// This device observes a session others are on (its frames go in
    /// batches): kept beside the session's controller for the writer to read
    /// without the session's lock.
    pub(super) observing: std::sync::atomic::AtomicBool,
    /// What this device's scope lets it do here ([`Verbs`] as bits): read
    /// on every run of its frames, set again by a recheck when the scope
    /// changes, so a narrowed scope holds from the next frame on.
    ///
    /// [`Verbs`]: crate::devices::scope::Verbs
    pub(super) verbs: std::sync::atomic::AtomicU8,
    /// The device asked for ACP's multi-client events (`session/attach`),
    /// and the `clientId` it chose, if any.
    pub(super) multi_client: std::sync::atomic::AtomicBool,
    pub(super) client_id: Mutex<Option<String>>,
    /// This device is someone else's, on the session by a share.
    pub(super) share_guest: std::sync::atomic::AtomicBool,
    /// Mints shares of this session for its devices (`_thunderbolt/share`).
    pub(crate) sharer: OnceLock<Arc<crate::serve::share::Sharer>>,
    /// What `thunderbolt status` shows of it.
    pub(super) info: Arc<SessionInfo>,
    /// A device that joined another device's session: its seat there.
    pub(super) seat: OnceLock<Seat>,
    /// The device this hub carries (its NodeId and name).
    pub(super) device: OnceLock<thunderbolt_shared::devices::Device>,
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
            st.journal.file = journal;
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
        let mut state = State::new(tx, now);
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
            verbs: crate::devices::scope::Verbs::ALL.to_bits().into(),
            multi_client: false.into(),
            client_id: Mutex::new(None),
            sharer: OnceLock::new(),
            share_guest: false.into(),
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

    /// Journals what a restart needs of another device's run on its way to
    /// the agent (this hub is the session's; see `Journal::other_device_run`).
    pub(super) fn journal_other_device(&self, run: &[u8], names_an_id: bool) {
        let mut st = self.lock();
        if let Some(j) = st.journal.file.as_mut() {
            j.other_device_run(run, names_an_id);
            st.compact_journal();
        }
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
        let attached = st.conn.attached.as_ref().map(|a| (a.conn.clone(), a.r1));
        let waiting = self.away_since(&st).map(|since| {
            let (wait, _) = self.cfg.wait(st.conn.resumable || self.kind == HubKind::Resumable);
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
        st.conn.sent_mark = None;
        let old = st.conn.attached.replace(Attachment {
            id,
            conn,
            since: Instant::now(),
            r1,
            _task: AbortOnDropHandle::new(task),
        });
        st.conn.detached_since = None;
        let writer = st.conn.writer.take();
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
        if !st.conn.is_attached(id) {
            return;
        }
        let attached = st.conn.attached.take();
        st.conn.sent_mark = None;
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
                st.conn.detached_since = Some(Instant::now());
                detached = true;
                let r1 = attached.as_ref().is_some_and(|a| a.r1);
                if r1 && !ended {
                    st.conn.resumable = true;
                    info!(
                        peer = %self.peer,
                        session = self.short(),
                        "connection lost ({why}); the warm agent keeps running and the session waits {:?} for \
                         the client ({} byte(s) of output held)",
                        self.cfg.wait(true).0,
                        st.r1.out.bytes()
                    );
                } else {
                    st.conn.resumable = false;
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
            st.conn.detached_since = Some(Instant::now());
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
        let writer = st.conn.writer.take();
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
            st.flush_journal();
            if let Some(j) = st.journal.file.as_ref() {
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
