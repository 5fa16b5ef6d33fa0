//! Resumable sessions (`thunderbolt/<p>/r1`; the wire is specified in
//! [`thunderbolt_shared::resume`]): one agent that outlives the connections
//! that drive it.
//!
//! A [`Hub`] stands between the session core ([`crate::serve::session`], which sees
//! it as its [`Link`]) and whichever connection is attached right now:
//! - the agent's output goes into the hub's replay log ([`Outbox`]); the
//!   attached connection's writer sends it on, and an acknowledgement from the
//!   client frees it. The log holds at most the resume buffer: past that the
//!   agent waits (its stdout blocks) until acks make room, whether a client is
//!   attached or not. A client that is away holds its agent still, never ends
//!   its session early;
//! - the client's frames come off the attached connection into one queue the
//!   agent's input pump reads ([`Inbox`]), counted so a resuming client knows
//!   what to resend. The connection is read ahead of that queue (up to
//!   [`BRIDGE_READ_AHEAD`]), so the client's acks are always read, even while
//!   the agent reads nothing because it waits for those very acks;
//! - a connection lost without the client's close detaches the session: the
//!   agent runs on, and the session ends only if nobody re-attaches within
//!   the grace period. Only the NodeId that started the session can attach.
//!
//! Detached sessions cannot pin the bridge: [`Hubs`] evicts them, the oldest
//! first, when a slot is needed, and keeps at most [`MAX_DETACHED_PER_PEER`]
//! per NodeId. A later resume of an ended session learns why it ended
//! (expired, evicted, revoked, …) from the close reason.
//!
//! With `--keep-warm` plain (`thunderbolt/<p>/0`) sessions run through a hub
//! too ([`HubKind::Warm`]): a connection's end, whatever it was, detaches the
//! session, and the next plain connection from the same NodeId attaches to the
//! running agent instead of spawning one (so `session/load` of an in-memory
//! session works). Nothing is replayed there: output the agent writes while no
//! client is attached is dropped (it answers requests of a connection that is
//! gone, and must never be read as answers to the next one's), and every
//! request the agent sent that the vanished client did not answer, or sends
//! while none is attached, is answered for it with a JSON-RPC error
//! ([`thunderbolt_shared::jsonrpc::client_gone`]) so the agent never hangs.
//!
//! The hub never holds a connection's tasks past its detach: each attached
//! connection runs in one task the hub owns (aborted when it is replaced or
//! the session ends).

use std::{
    collections::{HashMap, HashSet, VecDeque},
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, OnceLock, Weak},
    task::{Context, Poll, Waker},
    time::Duration,
};

use bytes::Bytes;
use iroh::{
    endpoint::{Connection, ConnectionError, RecvStream, SendStream, VarInt},
    EndpointId,
};
use thunderbolt_shared::{
    close,
    jsonrpc::{self, Kind},
    ndjson::{room_for_read, OVERSIZE_PEEK},
    resume::{
        control_line_end, AckPolicy, Control, Event, Receiver, ReplayLog, ACK_DELAY_MS, BRIDGE_READ_AHEAD,
        MAX_CONTROL_LINE,
    },
};
use tokio::{
    io::{AsyncReadExt, AsyncWrite},
    sync::{mpsc, Notify},
    time::Instant,
};
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;
use tracing::{debug, info, warn};

use crate::{
    limits::READ_CHUNK,
    serve::pump::Inbound,
    serve::requests::Requests,
    serve::session::{Link, SessionInfo},
    trust::TrustPolicy,
};

/// How long sessions wait for their client and how much they keep meanwhile.
#[derive(Debug, Clone, Copy)]
pub struct ResumeConfig {
    /// How long a session whose connection was lost waits for its client.
    pub grace: Duration,
    /// Most bytes of agent output held for the client (unacknowledged).
    pub buffer: usize,
}

/// One hub's waits: what [`ResumeConfig`] says, plus a warm agent's window
/// and the agent's `idle_stop`.
#[derive(Debug, Clone, Copy)]
pub struct HubTiming {
    /// How long a lost resumable connection's session waits for its client.
    pub grace: Duration,
    pub buffer: usize,
    /// A warm agent: how long it waits for the next connection of its peer.
    pub warm: Option<Duration>,
    /// The longest an agent runs with nothing attached, whatever the above say.
    pub idle_stop: Option<Duration>,
}

impl HubTiming {
    pub fn resume(r: ResumeConfig) -> Self {
        Self { grace: r.grace, buffer: r.buffer, warm: None, idle_stop: None }
    }

    /// How long a session waits with nothing attached: the grace while a
    /// resume may come, else the warm window; never past `idle_stop`.
    fn wait(&self, resumable: bool) -> (Duration, &'static str) {
        let (d, why) = match (resumable, self.warm) {
            (true, Some(w)) => (self.grace.max(w), "grace"),
            (true, None) => (self.grace, "grace"),
            (false, Some(w)) => (w, "keep_warm"),
            (false, None) => (self.grace, "grace"),
        };
        match self.idle_stop {
            Some(i) if i < d => (i, "idle_stop"),
            _ => (d, why),
        }
    }
}

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

/// An unguessable session token (128 random bits, hex).
pub fn new_token() -> String {
    random_hex(16)
}

/// `n` random bytes from the OS, hex (tokens).
pub fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).expect("the OS random source works");
    hex::encode(b)
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
struct Gone {
    why: String,
    /// The reason a resume of the ended session is closed with (code 1).
    resume_reason: String,
}

impl Gone {
    fn new(why: impl Into<String>, resume_reason: impl Into<String>) -> Self {
        Self { why: why.into(), resume_reason: resume_reason.into() }
    }
}

/// One session's state between connections.
#[derive(Debug)]
pub struct Hub {
    /// The first token's first characters: the session's name in logs.
    id: String,
    kind: HubKind,
    owner: EndpointId,
    /// The agent it runs (its name; empty for the single-agent bridge).
    agent: Arc<str>,
    peer: String,
    cfg: HubTiming,
    max_frame: usize,
    created: Instant,
    state: Mutex<State>,
    /// The session's state changed: attach, detach, an ack, the end.
    changed: Notify,
    /// Something for the attached connection's writer: new output, an ack due.
    /// Apart from `changed` so output wakes only the writer, not the session.
    output: Notify,
    /// Lines the bridge writes to the agent itself (answers for a vanished
    /// client), ahead of the client's.
    inject: mpsc::UnboundedSender<Bytes>,
    /// The registry, told of detaches (it caps detached sessions per peer).
    registry: Weak<Hubs>,
    /// Warm: the session's record of the client's requests in flight.
    requests: OnceLock<Arc<Requests>>,
    /// The session's notices: told when the client goes away.
    notices: OnceLock<Arc<crate::notify::session::SessionNotices>>,
    /// Whether a connection is attached, kept beside `State::attached` for
    /// the agent's output path to read without the lock.
    attached_now: std::sync::atomic::AtomicBool,
    /// What `thunderbolt status` shows of it.
    info: Arc<SessionInfo>,
}

#[derive(Debug)]
struct State {
    /// What the client presents to resume. A warm agent's next session gets
    /// a new one (frames are counted per session).
    token: String,
    /// A resumable connection was the last attached and did not close: output
    /// is kept for it (else a warm agent's output with nobody attached is dropped).
    resumable: bool,
    /// When the attached client's input ended (a warm agent's stdin stays open).
    input_ended: Option<Instant>,
    /// When the agent last wrote (a warm agent's finished client is let go
    /// only once it has been quiet a moment: see [`KEPT_WARM_QUIET`]).
    last_output: Option<Instant>,
    out: ReplayLog,
    /// The agent's output ended after this many frames.
    end_at: Option<(u64, Instant)>,
    /// Frames taken from the client (into the agent's queue).
    ack: AckPolicy,
    ack_due: bool,
    /// When a pending ack is due at the latest.
    ack_at: Option<Instant>,
    inbox: Option<mpsc::Sender<Inbound>>,
    /// The client's frame over the cap being skipped (its index), once its
    /// head went to the agent's pump; a resend of it after a reconnect is not
    /// announced twice.
    oversize_at: Option<u64>,
    attached: Option<Attached>,
    detached_since: Option<Instant>,
    gone: Option<Gone>,
    next_conn: u64,
    /// The agent-output side, waiting for room in the log.
    writer: Option<Waker>,
    /// Warm: ids of the agent's requests the attached client has not answered.
    pending: HashSet<String>,
    /// Warm: the client's output is all delivered (the plain stream finished).
    plain_done: bool,
    /// Warm: lines the agent wrote while no client was attached (dropped).
    dropped: u64,
    /// Times a client resumed it.
    resumes: u64,
}

#[derive(Debug)]
struct Attached {
    id: u64,
    conn: Connection,
    since: Instant,
    /// `thunderbolt/<p>/r1` (else the plain protocol).
    r1: bool,
    _task: AbortOnDropHandle<()>,
}

impl State {
    fn is_attached(&self, id: u64) -> bool {
        self.attached.as_ref().is_some_and(|a| a.id == id)
    }
}

/// What a wait on the hub's state does next (see [`Hub::until`]).
enum Step<T> {
    Ready(T),
    /// Wait for a change, or until this instant.
    Wait(Option<Instant>),
}

/// Which notifications end a wait.
#[derive(Clone, Copy)]
enum Wake {
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

impl Hub {
    /// A new session for `owner`, and the two ends the agent's pumps use.
    pub fn new(
        kind: HubKind,
        owner: EndpointId,
        agent: Arc<str>,
        cfg: HubTiming,
        max_frame: usize,
        registry: Weak<Hubs>,
    ) -> (Arc<Self>, Inbox, Outbox) {
        let (tx, rx) = mpsc::channel(INBOX_QUEUE);
        let (inject, injected) = mpsc::unbounded_channel();
        let now = Instant::now();
        let token = new_token();
        let info = SessionInfo::new(token[..8].to_string(), agent.clone(), owner);
        let hub = Arc::new(Self {
            info,
            id: token[..8].to_string(),
            kind,
            inject,
            owner,
            agent,
            peer: owner.fmt_short().to_string(),
            cfg,
            max_frame,
            created: now,
            state: Mutex::new(State {
                token,
                resumable: false,
                input_ended: None,
                last_output: None,
                out: ReplayLog::new(),
                end_at: None,
                ack: AckPolicy::at(0),
                ack_due: false,
                ack_at: None,
                inbox: Some(tx),
                oversize_at: None,
                attached: None,
                detached_since: Some(now),
                gone: None,
                next_conn: 0,
                writer: None,
                pending: HashSet::new(),
                plain_done: false,
                dropped: 0,
                resumes: 0,
            }),
            changed: Notify::new(),
            output: Notify::new(),
            registry,
            requests: OnceLock::new(),
            notices: OnceLock::new(),
            attached_now: false.into(),
        });
        let outbox = Outbox { hub: hub.clone() };
        (hub, Inbox::new(rx, Some(injected), true, max_frame), outbox)
    }

    /// The first token's first characters, for logs (a token itself is never logged).
    pub fn short(&self) -> &str {
        &self.id
    }

    pub fn agent(&self) -> &Arc<str> {
        &self.agent
    }

    pub fn owner(&self) -> EndpointId {
        self.owner
    }

    pub fn kind(&self) -> HubKind {
        self.kind
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes everyone waiting on the state (call with the lock released).
    fn wake(&self, writer: Option<Waker>) {
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
    async fn until<T>(&self, wake: Wake, mut check: impl FnMut(&mut State) -> Step<T>) -> T {
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

    /// Whether no connection is attached and the session still runs (for a
    /// warm hub: its agent waits for the next connection).
    pub fn is_detached(&self) -> bool {
        let st = self.lock();
        st.attached.is_none() && st.gone.is_none()
    }

    /// How long the session has waited without a connection, if it does.
    pub fn detached_for(&self) -> Option<Duration> {
        let st = self.lock();
        if st.gone.is_some() || st.attached.is_some() {
            return None;
        }
        st.detached_since.map(|t| t.elapsed())
    }

    /// What `thunderbolt status` shows of the session now.
    pub fn view(&self) -> HubView {
        let st = self.lock();
        let attached = st.attached.as_ref().map(|a| (a.conn.clone(), a.r1));
        let waiting = match (&st.attached, st.detached_since, &st.gone) {
            (None, Some(since), None) => {
                let (wait, _) = self.cfg.wait(st.resumable || self.kind == HubKind::Resumable);
                Some((since + wait).saturating_duration_since(Instant::now()))
            }
            _ => None,
        };
        HubView {
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

    /// Ends the session now: the host's operator asked (`thunderbolt kick`).
    /// A later resume finds no such session.
    pub fn kick(&self, reason: &str) {
        self.end_closing(close::CLOSE_CODE_REFUSED, reason, Gone::new(reason, close::REASON_UNKNOWN_SESSION));
    }

    /// Attaches a connection whose client holds the first `received` frames of
    /// the agent's output; `leftover` is what it sent after its hello. A
    /// connection attached before is closed.
    pub fn attach(
        self: &Arc<Self>,
        conn: Connection,
        send: SendStream,
        recv: RecvStream,
        received: u64,
        leftover: Bytes,
    ) -> Result<(), AttachError> {
        let st = self.lock();
        self.attach_r1(st, conn, send, recv, received, leftover)
    }

    /// A warm agent's next session (`thunderbolt/<p>/r1`, a new hello): it
    /// takes the agent over from whatever connection had it, with frames
    /// counted from zero and a token of its own. The streams come back when
    /// the session ended meanwhile.
    pub fn attach_fresh(
        self: &Arc<Self>,
        conn: Connection,
        send: SendStream,
        recv: RecvStream,
        leftover: Bytes,
    ) -> Result<(), (SendStream, RecvStream, Bytes)> {
        let mut st = self.lock();
        if st.gone.is_some() {
            return Err((send, recv, leftover));
        }
        self.next_session(&mut st);
        self.attach_r1(st, conn, send, recv, 0, leftover)
            .map_err(|_| unreachable!("a fresh session attaches"))
    }

    /// Warm: the agent goes to a new session of its peer. Whatever the last
    /// one left (output not taken, the agent's requests to it) is settled:
    /// the output dropped, the requests answered for it.
    fn next_session(&self, st: &mut State) {
        let answered = self.answer_for_vanished_client(st);
        if let Some(r) = self.requests.get() {
            r.clear();
        }
        if answered > 0 {
            debug!(peer = %self.peer, "{answered} request(s) of the agent's, left by the last client, answered with an error");
        }
        st.token = new_token();
        st.out = ReplayLog::new();
        st.ack = AckPolicy::at(0);
        st.ack_due = false;
        st.ack_at = None;
        st.oversize_at = None;
        st.input_ended = None;
        st.plain_done = false;
        st.resumable = false;
    }

    #[allow(clippy::too_many_arguments)]
    fn attach_r1(
        self: &Arc<Self>,
        mut st: MutexGuard<'_, State>,
        conn: Connection,
        send: SendStream,
        recv: RecvStream,
        received: u64,
        leftover: Bytes,
    ) -> Result<(), AttachError> {
        if let Some(g) = &st.gone {
            return Err(AttachError::Gone(g.resume_reason.clone()));
        }
        if received < st.out.acked() {
            let acked = st.out.acked();
            drop(st);
            let why = format!(
                "a resume claimed {received} of the agent's frames, but the client had acknowledged {acked} \
                 (a stale copy of its session state): those are gone"
            );
            self.end_with(close::CLOSE_CODE_REFUSED, Gone::new(why, close::REASON_STALE_RESUME));
            return Err(AttachError::Stale { claimed: received, acked });
        }
        st.out.ack(received).map_err(|e| AttachError::BadPosition(e.to_string()))?;
        let id = st.next_conn;
        st.next_conn += 1;
        st.ack.resumed();
        st.ack_due = false;
        st.ack_at = None;
        let welcome = Control::Welcome {
            session: st.token.clone(),
            received: st.ack.received(),
            grace_ms: self.cfg.wait(true).0.as_millis() as u64,
        }
        .encode();
        let replay = st.out.total() - received;
        st.resumable = true;
        if id > 0 {
            st.resumes += 1;
            info!(
                peer = %self.peer,
                session = self.short(),
                "session resumed: resending {replay} frame(s), expecting the client's from frame {}",
                st.ack.received()
            );
        }
        let task = tokio::spawn(
            self.clone().serve(id, conn.clone(), send, recv, welcome, received, leftover).in_current_span(),
        );
        self.attached_now.store(true, std::sync::atomic::Ordering::Relaxed);
        let old = st.attached.replace(Attached {
            id,
            conn,
            since: Instant::now(),
            r1: true,
            _task: AbortOnDropHandle::new(task),
        });
        st.detached_since = None;
        let writer = st.writer.take();
        drop(st);
        if let Some(old) = old {
            debug!(peer = %self.peer, session = self.short(), "closing the connection this resume replaces");
            old.conn.close(VarInt::from_u32(close::CLOSE_CODE_REFUSED), REASON_SUPERSEDED.as_bytes());
        }
        self.wake(writer);
        Ok(())
    }

    /// Runs one attached connection until it is lost.
    #[allow(clippy::too_many_arguments)]
    async fn serve(
        self: Arc<Self>,
        id: u64,
        conn: Connection,
        mut send: SendStream,
        mut recv: RecvStream,
        welcome: Bytes,
        from: u64,
        leftover: Bytes,
    ) {
        let why = tokio::select! {
            r = self.write_loop(id, &mut send, welcome, from, &conn) => match r {
                Ok(()) => return,
                Err(e) => e,
            },
            e = self.read_loop(id, &mut recv, leftover) => {
                if e.starts_with(REASON_PROTOCOL) {
                    warn!(peer = %self.peer, session = self.short(), "{e}; closing the connection");
                    conn.close(VarInt::from_u32(close::CLOSE_CODE_REFUSED), REASON_PROTOCOL.as_bytes());
                }
                e
            }
            err = conn.closed() => err.to_string(),
        };
        self.lost(id, &conn, &why);
    }

    /// The connection `id` is gone: the client's close ends the session, any
    /// other loss detaches it. A warm agent's session is only ever detached:
    /// kept for a resume when a resumable connection was lost, else the agent
    /// waits for its peer's next connection.
    fn lost(&self, id: u64, conn: &Connection, why: &str) {
        let mut st = self.lock();
        if !st.is_attached(id) {
            return;
        }
        let attached = st.attached.take();
        self.attached_now.store(false, std::sync::atomic::Ordering::Relaxed);
        let mut detached = false;
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
                        st.out.bytes()
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
                st.out.bytes()
            );
        }
        let writer = st.writer.take();
        drop(st);
        self.wake(writer);
        if detached {
            if let Some(registry) = self.registry.upgrade() {
                registry.on_detach(&self.owner);
            }
            if let Some(n) = self.notices.get() {
                n.detached();
            }
        }
        // Last: this may be the very task running us.
        drop(attached);
    }

    /// Ends a detached session to make room; `why` says for what.
    pub fn evict(&self, why: &str) -> bool {
        let Some(waited) = self.detached_for() else { return false };
        info!(
            peer = %self.peer,
            session = self.short(),
            "evicting a detached session (started {}s ago, detached for {}s): {why}",
            self.created.elapsed().as_secs(),
            waited.as_secs()
        );
        self.end_with(
            close::CLOSE_CODE_REFUSED,
            Gone::new(format!("evicted: {why}"), close::REASON_SESSION_EVICTED),
        );
        true
    }

    /// Warm: answers every request of the agent's that the client can no longer
    /// answer (sent and unanswered, or never sent) and forgets undelivered
    /// output. Returns how many were answered.
    fn answer_for_vanished_client(&self, st: &mut State) -> usize {
        let mut ids: Vec<String> = st.pending.drain().collect();
        let unsent = st.out.since(st.out.acked()).unwrap_or_default();
        for run in &unsent {
            for line in run.split_inclusive(|b| *b == b'\n') {
                let head = jsonrpc::peek_head(&line[..line.len().min(OVERSIZE_PEEK)]);
                if let (Kind::Request, Some(id)) = (head.kind, head.id) {
                    ids.push(id);
                }
            }
        }
        let total = st.out.total();
        let _ = st.out.ack(total);
        for id in &ids {
            let _ = self.inject.send(jsonrpc::client_gone(id).into());
        }
        ids.len()
    }

    /// Warm: attaches a plain connection to the running agent.
    /// The streams come back when the session ended meanwhile.
    pub fn attach_plain(
        self: &Arc<Self>,
        conn: Connection,
        send: SendStream,
        recv: RecvStream,
    ) -> Result<(), (SendStream, RecvStream)> {
        let mut st = self.lock();
        if st.gone.is_some() {
            return Err((send, recv));
        }
        let id = st.next_conn;
        st.next_conn += 1;
        if id > 0 {
            let took_over =
                if st.attached.is_some() { ", taking it over from the older connection" } else { "" };
            info!(
                peer = %self.peer,
                "attached to the warm agent{took_over} ({} message(s) it wrote meanwhile were dropped)",
                std::mem::take(&mut st.dropped)
            );
            self.next_session(&mut st);
        }
        // In the connection's span: the log names the agent (`agent{name=…}`).
        let task = tokio::spawn(self.clone().serve_plain(id, conn.clone(), send, recv).in_current_span());
        self.attached_now.store(true, std::sync::atomic::Ordering::Relaxed);
        let old = st.attached.replace(Attached {
            id,
            conn,
            since: Instant::now(),
            r1: false,
            _task: AbortOnDropHandle::new(task),
        });
        st.detached_since = None;
        let writer = st.writer.take();
        drop(st);
        if let Some(old) = old {
            old.conn.close(VarInt::from_u32(close::CLOSE_CODE_REFUSED), REASON_SUPERSEDED.as_bytes());
        }
        self.wake(writer);
        Ok(())
    }

    async fn serve_plain(
        self: Arc<Self>,
        id: u64,
        conn: Connection,
        mut send: SendStream,
        mut recv: RecvStream,
    ) {
        let why = tokio::select! {
            e = self.write_plain(id, &mut send, &conn) => e,
            e = self.read_plain(id, &mut recv) => e,
            err = conn.closed() => err.to_string(),
        };
        self.lost(id, &conn, &why);
    }

    /// Warm: the agent's output as it comes, nothing kept once written; at the
    /// agent's end the stream is finished and its delivery awaited. Once the
    /// client's input ended and the agent answered all it asked, the stream is
    /// finished too, and the connection closed with [`REASON_KEPT_WARM`].
    async fn write_plain(&self, id: u64, send: &mut SendStream, conn: &Connection) -> String {
        let mut cursor = self.lock().out.total();
        loop {
            let next = self
                .until(Wake::Any, |st| {
                    if !st.is_attached(id) {
                        return Step::Ready(None);
                    }
                    let runs = st.out.since(cursor).unwrap_or_default();
                    cursor = st.out.total();
                    let end = st.end_at.is_some_and(|(n, _)| n == cursor);
                    let (finished, until) =
                        if runs.is_empty() { self.client_done(st) } else { (false, None) };
                    if runs.is_empty() && !end && !finished {
                        return Step::Wait(until);
                    }
                    Step::Ready(Some((runs, end, finished)))
                })
                .await;
            let Some((mut runs, end, finished)) = next else { return "replaced".into() };
            if finished && !end {
                let _ = send.finish();
                let _ = send.stopped().await;
                info!(peer = %self.peer, "the client finished; the agent stays warm for its next connection");
                conn.close(VarInt::from_u32(CLOSE_CODE_KEPT_WARM), REASON_KEPT_WARM.as_bytes());
                std::future::pending::<()>().await;
            }
            if !runs.is_empty() {
                if let Err(e) = send.write_all_chunks(&mut runs).await {
                    return e.to_string();
                }
                let mut st = self.lock();
                let _ = st.out.ack(cursor);
                let writer = st.writer.take();
                drop(st);
                if let Some(w) = writer {
                    w.wake();
                }
                continue;
            }
            if end {
                let _ = send.finish();
                let _ = send.stopped().await;
                self.lock().plain_done = true;
                self.changed.notify_waiters();
                std::future::pending::<()>().await;
            }
        }
    }

    /// Warm: the client's lines, whole, into the agent's queue; its answers to
    /// the agent's requests are noted. The client finishing its stream closes
    /// the agent's input, as on the plain protocol.
    async fn read_plain(&self, id: u64, recv: &mut RecvStream) -> String {
        let mut rx = Receiver::plain(self.max_frame);
        let mut events = Vec::new();
        loop {
            rx.drain(&mut events);
            for ev in events.drain(..) {
                if let Event::Data { bytes, frames } = ev {
                    let permit = self.reserve().await;
                    if let Err(e) = self.deliver(id, permit, bytes, frames) {
                        return e;
                    }
                }
            }
            let buf = rx.buf_mut();
            room_for_read(buf, READ_CHUNK);
            match recv.read_buf(buf).await {
                Ok(0) => {
                    // A warm agent's input stays open for the next client.
                    self.lock().input_ended = Some(Instant::now());
                    debug!(peer = %self.peer, "the client finished its stream (the warm agent's input stays open)");
                    self.output.notify_waiters();
                    std::future::pending::<()>().await;
                }
                Ok(_) => {}
                Err(e) => return e.to_string(),
            }
        }
    }

    /// Sends the welcome, then the agent's output from frame `cursor` on, acks
    /// and the end, as they come.
    async fn write_loop(
        &self,
        id: u64,
        send: &mut SendStream,
        welcome: Bytes,
        mut cursor: u64,
        conn: &Connection,
    ) -> Result<(), String> {
        let werr = |e: iroh::endpoint::WriteError| e.to_string();
        send.write_all(&welcome).await.map_err(werr)?;
        let mut sent_end = false;
        loop {
            let next = self
                .until(Wake::Any, |st| {
                    if !st.is_attached(id) {
                        return Step::Ready(Ok(None));
                    }
                    let mut runs = if cursor < st.out.total() {
                        match st.out.since(cursor) {
                            Ok(r) => r,
                            Err(e) => return Step::Ready(Err(format!("{REASON_PROTOCOL}: {e}"))),
                        }
                    } else {
                        Vec::new()
                    };
                    cursor = st.out.total();
                    // Acks go by count or bytes, else after a short delay: never one
                    // per message (a request/response session would pay for it twice).
                    if st.ack_at.is_some_and(|at| Instant::now() >= at) {
                        st.ack_due = true;
                    }
                    if st.ack_due {
                        st.ack_due = false;
                        st.ack_at = None;
                        runs.extend(st.ack.ack().map(|a| a.encode()));
                    }
                    if let Some((n, _)) = st.end_at.filter(|(n, _)| *n == cursor && !sent_end) {
                        sent_end = true;
                        runs.push(Control::End(n).encode());
                    }
                    if runs.is_empty() {
                        // A warm agent's client that is done: its input ended, all it
                        // asked was answered and all it was sent is acknowledged.
                        let (done, until) = if st.out.acked() == st.out.total() && st.end_at.is_none() {
                            self.client_done(st)
                        } else {
                            (false, None)
                        };
                        if done {
                            return Step::Ready(Ok(Some(Vec::new())));
                        }
                        let wake = match (st.ack_at, until) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                        Step::Wait(wake)
                    } else {
                        Step::Ready(Ok(Some(runs)))
                    }
                })
                .await?;
            let Some(mut runs) = next else { return Ok(()) };
            if runs.is_empty() {
                info!(peer = %self.peer, session = self.short(), "the client finished; the agent stays warm for its next connection");
                conn.close(VarInt::from_u32(CLOSE_CODE_KEPT_WARM), REASON_KEPT_WARM.as_bytes());
                return Err(REASON_KEPT_WARM.into());
            }
            send.write_all_chunks(&mut runs).await.map_err(werr)?;
        }
    }

    /// Whether every request the attached client sent was answered (always,
    /// for a session that does not track them).
    fn requests_idle(&self) -> bool {
        self.requests.get().is_none_or(|r| r.is_empty())
    }

    /// Whether a warm agent's attached client is done with it: its input
    /// ended, every request it sent was answered, and the agent has been
    /// quiet for [`KEPT_WARM_QUIET`] since (a notification or two may follow
    /// a last answer). Else, when to look again.
    fn client_done(&self, st: &State) -> (bool, Option<Instant>) {
        let Some(ended) = st.input_ended.filter(|_| self.kind == HubKind::Warm) else { return (false, None) };
        if !self.requests_idle() {
            return (false, None);
        }
        let quiet_at = st.last_output.map_or(ended, |o| o.max(ended)) + KEPT_WARM_QUIET;
        if Instant::now() >= quiet_at {
            (true, None)
        } else {
            (false, Some(quiet_at))
        }
    }

    /// Takes the client's frames into the agent's queue and its control lines
    /// into the state. Returns why it stopped.
    ///
    /// Frames are read ahead of the agent's queue (up to
    /// [`BRIDGE_READ_AHEAD`] beyond one run), so a control line is applied as
    /// soon as it arrives: the client's acks free the replay log even while the
    /// agent, blocked on output that waits for those acks, reads nothing.
    async fn read_loop(&self, id: u64, recv: &mut RecvStream, leftover: Bytes) -> String {
        let mut rx = Receiver::new(self.max_frame);
        rx.push(&leftover);
        let mut events = Vec::new();
        // Runs of frames read but not yet in the agent's queue, and the
        // client's end of input in its place after them.
        let mut ahead: VecDeque<(Bytes, u64)> = VecDeque::new();
        let mut ahead_bytes = 0usize;
        let mut eof_after: Option<u64> = None;
        let mut finished = false;
        loop {
            rx.drain(&mut events);
            for ev in events.drain(..) {
                match ev {
                    Event::Data { .. } | Event::Control(Some(Control::Eof(_))) if eof_after.is_some() => {
                        return format!("{REASON_PROTOCOL}: more after the client's eof");
                    }
                    Event::Data { bytes, frames } => {
                        ahead_bytes += bytes.len();
                        ahead.push_back((bytes, frames));
                    }
                    // The end of input is ordered with the frames: it applies
                    // once those before it are in the agent's queue.
                    Event::Control(Some(Control::Eof(n))) => eof_after = Some(n),
                    Event::Control(c) => {
                        if let Err(e) = self.control(c) {
                            return e;
                        }
                    }
                    Event::BadControl(bad) => return format!("{REASON_PROTOCOL}: {bad}"),
                }
            }
            if ahead.is_empty() {
                if let Some(n) = eof_after.take() {
                    if let Err(e) = self.control(Some(Control::Eof(n))) {
                        return e;
                    }
                }
                if finished {
                    // A client never finishes its stream mid-session (it says
                    // eof); a finished one is lost once its connection is.
                    std::future::pending::<()>().await;
                }
            }
            // One run is always taken however large (a frame up to the cap);
            // beyond that, the read-ahead bound.
            let can_read = !finished && (ahead.len() <= 1 || ahead_bytes < BRIDGE_READ_AHEAD);
            let buf = rx.buf_mut();
            tokio::select! {
                biased;
                permit = self.reserve(), if !ahead.is_empty() => {
                    let (bytes, frames) = ahead.pop_front().expect("not empty");
                    ahead_bytes -= bytes.len();
                    if let Err(e) = self.deliver(id, permit, bytes, frames) {
                        return e;
                    }
                }
                r = async { room_for_read(buf, READ_CHUNK); recv.read_buf(buf).await }, if can_read => match r {
                    Ok(0) => finished = true,
                    Ok(_) => {}
                    Err(e) => return e.to_string(),
                },
            }
        }
    }

    /// Room for one run in the agent's queue; `None` once the agent's input
    /// is closed (frames are then counted and dropped).
    async fn reserve(&self) -> Option<mpsc::OwnedPermit<Inbound>> {
        let inbox = self.lock().inbox.clone()?;
        inbox.reserve_owned().await.ok()
    }

    /// Puts one run of the client's frames into the agent's queue and counts
    /// them, together and only while connection `id` is the attached one. A
    /// frame over the cap comes in pieces (`frames` 0 until its end): only its
    /// head goes on, once.
    fn deliver(
        &self,
        id: u64,
        permit: Option<mpsc::OwnedPermit<Inbound>>,
        bytes: Bytes,
        frames: u64,
    ) -> Result<(), String> {
        let len = bytes.len();
        let mut st = self.lock();
        if !st.is_attached(id) {
            return Err("replaced by a newer connection".into());
        }
        if self.kind == HubKind::Warm && frames > 0 && !st.pending.is_empty() {
            // The client's answers to the agent's requests.
            for line in bytes.split_inclusive(|b| *b == b'\n') {
                if let Some(id) = jsonrpc::response_id(line) {
                    st.pending.remove(&*String::from_utf8_lossy(id));
                }
            }
        }
        let at = st.ack.received();
        let item = match (frames, st.oversize_at) {
            (0, Some(n)) if n == at => None,
            (0, _) => {
                st.oversize_at = Some(at);
                Some(Inbound::Oversized(bytes.slice(..bytes.len().min(OVERSIZE_PEEK))))
            }
            // The end of the frame being skipped.
            (_, Some(n)) if n == at => {
                st.oversize_at = None;
                None
            }
            _ => Some(Inbound::Lines(bytes)),
        };
        if let (Some(p), Some(item)) = (permit, item) {
            p.send(item);
        }
        // Frames after the agent's input closed are counted (and dropped)
        // so the client's replay buffer drains.
        let was_pending = st.ack.pending();
        if st.ack.took(frames, len) {
            st.ack_due = true;
            drop(st);
            self.output.notify_waiters();
        } else if !was_pending && st.ack.pending() {
            st.ack_at = Some(Instant::now() + Duration::from_millis(ACK_DELAY_MS));
            drop(st);
            self.output.notify_waiters();
        }
        Ok(())
    }

    /// Applies one of the client's control lines.
    fn control(&self, c: Option<Control>) -> Result<(), String> {
        match c {
            Some(Control::Ack(n)) => {
                let mut st = self.lock();
                st.out.ack(n).map_err(|e| format!("{REASON_PROTOCOL}: ack {e}"))?;
                let writer = st.writer.take();
                drop(st);
                self.wake(writer);
            }
            Some(Control::Eof(n)) => {
                let mut st = self.lock();
                if st.ack.received() != n {
                    return Err(format!(
                        "{REASON_PROTOCOL}: eof after {n} frames, but {} arrived",
                        st.ack.received()
                    ));
                }
                if self.kind == HubKind::Warm {
                    // A warm agent's input stays open for the next client.
                    st.input_ended = Some(Instant::now());
                    drop(st);
                    self.output.notify_waiters();
                } else if st.inbox.take().is_some() {
                    debug!(peer = %self.peer, session = self.short(), "the client's input ended after {n} frames");
                }
            }
            // Hellos mid-stream, welcomes, ends and unknown kinds mean nothing here.
            _ => {}
        }
        Ok(())
    }

    /// Ends the session towards its client (if one is attached).
    fn end(&self, code: u32, reason: &str) {
        // A resume after an agent's end, or after the client's own close, finds
        // a session that is simply over; the bridge's other closes say why.
        let resume_reason =
            if code == close::CLOSE_CODE_REFUSED { reason } else { close::REASON_UNKNOWN_SESSION };
        self.end_with(code, Gone::new(reason, resume_reason));
    }

    /// Ends the session: the attached connection is closed with `code` and,
    /// for a refusal, the reason a later resume gets too (else `why`, e.g.
    /// how the agent ended).
    fn end_with(&self, code: u32, gone: Gone) {
        let text = if code == close::CLOSE_CODE_REFUSED { &gone.resume_reason } else { &gone.why }.clone();
        self.end_closing(code, &text, gone);
    }

    /// Ends the session, closing the attached connection with `code` and `text`.
    fn end_closing(&self, code: u32, text: &str, gone: Gone) {
        let mut st = self.lock();
        st.gone.get_or_insert(gone);
        let attached = st.attached.take();
        self.attached_now.store(false, std::sync::atomic::Ordering::Relaxed);
        let writer = st.writer.take();
        drop(st);
        if let Some(a) = &attached {
            a.conn.close(VarInt::from_u32(code), text.as_bytes());
        }
        self.wake(writer);
    }

    /// Releases the attached connection's task (the session is over).
    pub fn release(&self) {
        let attached = self.lock().attached.take();
        self.attached_now.store(false, std::sync::atomic::Ordering::Relaxed);
        drop(attached);
    }

    /// Why the session ended and what a resume of it is told, once it did.
    fn gone(&self) -> Option<Gone> {
        self.lock().gone.clone()
    }
}

/// Whether the peer closed `conn` itself, the way clients end a session: code
/// 0 with the reason `client closed`, exactly. Anything else, code 0 with an
/// empty reason included (what dropping a connection object sends), is a loss.
fn is_client_close(conn: &Connection) -> bool {
    matches!(
        conn.close_reason(),
        Some(ConnectionError::ApplicationClosed(ac))
            if ac.error_code.into_inner() == close::CLOSE_CODE_CLIENT as u64
                && &ac.reason[..] == close::REASON_CLIENT_CLOSED.as_bytes()
    )
}

/// The session core's view of a hub.
#[derive(Debug, Clone)]
pub struct HubLink(pub Arc<Hub>);

impl Link for HubLink {
    type Out = Outbox;

    fn gone(&self) -> impl Future<Output = String> + Send {
        let hub = self.0.clone();
        async move {
            hub.until(Wake::Changed, |st| {
                if let Some(g) = &st.gone {
                    return Step::Ready(g.why.clone());
                }
                let Some(since) = st.detached_since else { return Step::Wait(None) };
                let (wait, why) = hub.cfg.wait(st.resumable || hub.kind == HubKind::Resumable);
                let at = since + wait;
                if Instant::now() < at {
                    return Step::Wait(Some(at));
                }
                let why = match (why, hub.kind) {
                    ("idle_stop", _) => format!("nothing attached for {wait:?} (idle_stop)"),
                    (_, HubKind::Resumable) => format!("the client did not come back within {wait:?}"),
                    (_, HubKind::Warm) => format!("no client for {wait:?} (keep-warm)"),
                };
                st.gone = Some(Gone::new(why.clone(), close::REASON_SESSION_EXPIRED));
                Step::Ready(why)
            })
            .await
        }
    }

    fn gone_reason(&self) -> Option<String> {
        self.0.gone().map(|g| g.why)
    }

    fn close(&self, code: u32, reason: &str) {
        self.0.end(code, reason);
    }

    fn finish(&self, _out: &mut Outbox) {
        let mut st = self.0.lock();
        st.end_at = Some((st.out.total(), Instant::now()));
        drop(st);
        self.0.changed.notify_waiters();
        self.0.output.notify_waiters();
    }

    /// Delivered once the client acknowledged the end. A client attached for
    /// `linger` since the end (or since it attached) without acknowledging it
    /// is not waited for longer, as on the plain protocol; a detached one is
    /// waited for within the grace (it may come back for the tail).
    fn delivered(&self, _out: &mut Outbox, linger: Duration) -> impl Future<Output = bool> + Send {
        let hub = self.0.clone();
        async move {
            hub.until(Wake::Changed, |st| {
                let Some((end, ended_at)) = st.end_at else { return Step::Wait(None) };
                let done = match &st.attached {
                    Some(a) if a.r1 => st.out.acked() >= end,
                    // The plain stream was taken whole.
                    Some(_) => st.plain_done,
                    // Nobody to deliver to, unless a resume may still come for it.
                    None => !(st.resumable || hub.kind == HubKind::Resumable),
                };
                if done {
                    return Step::Ready(true);
                }
                match &st.attached {
                    Some(a) => {
                        let at = a.since.max(ended_at) + linger;
                        if Instant::now() >= at {
                            Step::Ready(false)
                        } else {
                            Step::Wait(Some(at))
                        }
                    }
                    None => Step::Wait(None),
                }
            })
            .await
        }
    }

    fn track(&self, requests: &Arc<Requests>, notices: &Arc<crate::notify::session::SessionNotices>) {
        let _ = self.0.requests.set(requests.clone());
        let _ = self.0.notices.set(notices.clone());
    }

    fn info(&self) -> Option<Arc<SessionInfo>> {
        Some(self.0.info.clone())
    }

    fn attached(&self) -> crate::notify::session::Attached {
        let hub = Arc::downgrade(&self.0);
        Box::new(move || {
            hub.upgrade().is_some_and(|h| h.attached_now.load(std::sync::atomic::Ordering::Relaxed))
        })
    }

    fn agent_started(&self, pid: Option<u32>) {
        self.0.info.set_pid(pid);
    }
}

/// Where the agent's output goes: the hub's replay log. Writes wait for room
/// (acks make room), whether a client is attached or not: an agent whose
/// client is away is held still until it comes back or the grace runs out.
#[derive(Debug)]
pub struct Outbox {
    hub: Arc<Hub>,
}

impl AsyncWrite for Outbox {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let hub = &self.hub;
        let mut st = hub.lock();
        if let Some(g) = &st.gone {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, g.why.clone())));
        }
        if hub.kind == HubKind::Warm {
            // A resumable session that may come back keeps what it is sent.
            let attached = st.attached.is_some() || st.resumable;
            for line in buf.split_inclusive(|b| *b == b'\n') {
                let head = jsonrpc::peek_head(&line[..line.len().min(OVERSIZE_PEEK)]);
                match (head.kind, head.id, attached) {
                    (Kind::Request, Some(id), true) => {
                        st.pending.insert(id);
                    }
                    (Kind::Request, Some(id), false) => {
                        let _ = hub.inject.send(jsonrpc::client_gone(&id).into());
                    }
                    (_, _, false) => st.dropped += 1,
                    _ => {}
                }
            }
            if !attached {
                return Poll::Ready(Ok(buf.len()));
            }
        }
        let held = st.out.bytes();
        if held > 0 && held + buf.len() > hub.cfg.buffer {
            st.writer = Some(cx.waker().clone());
            if st.attached.is_none() && hub.kind == HubKind::Resumable {
                debug!(
                    peer = %hub.peer,
                    session = hub.short(),
                    "the resume buffer is full ({held} bytes held) and the client is away: the agent waits"
                );
            }
            return Poll::Pending;
        }
        // The pump writes whole lines only: each write is one run of frames.
        st.out.push(Bytes::copy_from_slice(buf));
        st.last_output = Some(Instant::now());
        drop(st);
        hub.output.notify_waiters();
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Where the agent's input comes from: the client's frames, from whichever
/// connection carried them, after the bridge's own answers for a vanished
/// client. Ends when the client said its input ended.
pub type Inbox = crate::serve::pump::QueueReader;

/// Reads the client's hello (its first line). Returns it and whatever the
/// client sent after it.
pub async fn read_hello(recv: &mut RecvStream) -> Result<(Option<String>, u64, Bytes), String> {
    let (line, rest) = read_line(recv).await.map_err(|e| format!("{REASON_PROTOCOL}: no hello: {e}"))?;
    match Control::parse(&line) {
        Ok(Some(Control::Hello { session, received })) if line[0] == b'!' => Ok((session, received, rest)),
        Err(bad) => Err(format!("{REASON_PROTOCOL}: {bad}")),
        _ => Err(format!("{REASON_PROTOCOL}: the first line is not a hello")),
    }
}

/// Reads the first line of a resumable stream (a control line, short): the
/// hello on the bridge's side, the welcome on the client's. Returns it and
/// what followed it. A line is judged by its length alone, however the stream
/// split it ([`control_line_end`]).
pub async fn read_line(recv: &mut RecvStream) -> Result<(Bytes, Bytes), String> {
    let mut buf = bytes::BytesMut::with_capacity(MAX_CONTROL_LINE);
    loop {
        if let Some(nl) = control_line_end(&buf).map_err(|e| e.to_string())? {
            let line = buf.split_to(nl + 1).freeze();
            return Ok((line, buf.freeze()));
        }
        buf.reserve(MAX_CONTROL_LINE);
        match recv.read_buf(&mut buf).await {
            Ok(0) => return Err("the stream ended".into()),
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The resumable and warm sessions alive (attached or not), by token, and
/// what a late resume of an ended one is told.
#[derive(Debug, Default)]
pub struct Hubs {
    map: Mutex<HashMap<String, Arc<Hub>>>,
    /// Recently ended sessions: token, owner, the close a resume gets.
    ended: Mutex<VecDeque<(String, EndpointId, String)>>,
}

impl Hubs {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Hub>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `hub` until the guard is dropped.
    pub fn insert(&self, hub: &Arc<Hub>) -> HubGuard<'_> {
        self.lock().insert(hub.id.clone(), hub.clone());
        HubGuard { hubs: self, hub: hub.clone() }
    }

    /// The session `token` of agent `agent` if `peer` owns it; else the
    /// reason to close a resume of it with. (A scan: a bridge holds a few
    /// dozen sessions at most, and a token is compared whole.)
    pub fn find(&self, token: &str, peer: &EndpointId, agent: &str) -> Result<Arc<Hub>, String> {
        let found = self
            .lock()
            .values()
            .find(|h| h.owner == *peer && &*h.agent == agent && h.lock().token == token)
            .cloned();
        if let Some(h) = found {
            return Ok(h);
        }
        let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        Err(ended
            .iter()
            .rev()
            .find(|(t, owner, _)| t == token && owner == peer)
            .map_or_else(|| close::REASON_UNKNOWN_SESSION.to_string(), |(_, _, r)| r.clone()))
    }

    /// The warm agent of `peer`'s at `agent`, with or without a connection
    /// (a newer connection takes it over from an older one).
    pub fn warm_for(&self, peer: &EndpointId, agent: &str) -> Option<Arc<Hub>> {
        self.lock()
            .values()
            .filter(|h| h.kind == HubKind::Warm && h.owner == *peer && &*h.agent == agent)
            .find(|h| h.lock().gone.is_none())
            .cloned()
    }

    /// Ends every session of `agent` with `reason` (code 1). Returns how many.
    pub fn end_agent(&self, agent: &str, reason: &str) -> usize {
        let hubs: Vec<Arc<Hub>> = self.lock().values().filter(|h| &*h.agent == agent).cloned().collect();
        for h in &hubs {
            info!(peer = %h.peer, session = h.short(), "ending the session: {reason}");
            h.end(close::CLOSE_CODE_REFUSED, reason);
        }
        hubs.len()
    }

    /// The detached session to end when a slot is needed for `requester`:
    /// its own that waited longest, else the one that waited longest of all.
    /// Never one with a connection attached.
    pub fn eviction_candidate(&self, requester: &EndpointId) -> Option<Arc<Hub>> {
        self.oldest_detached(Some(requester)).or_else(|| self.oldest_detached(None))
    }

    /// The detached session that waited longest, of `owner`'s (or of all).
    pub fn oldest_detached(&self, owner: Option<&EndpointId>) -> Option<Arc<Hub>> {
        self.lock()
            .values()
            .filter(|h| owner.is_none_or(|o| h.owner == *o))
            .filter_map(|h| h.detached_for().map(|d| (h.clone(), d)))
            .max_by_key(|(_, d)| *d)
            .map(|(h, _)| h)
    }

    /// A session of `owner`'s detached: beyond [`MAX_DETACHED_PER_PEER`] the
    /// oldest of its detached sessions are ended.
    fn on_detach(&self, owner: &EndpointId) {
        let mut theirs: Vec<(Arc<Hub>, Duration)> = self
            .lock()
            .values()
            .filter(|h| h.owner == *owner)
            .filter_map(|h| h.detached_for().map(|d| (h.clone(), d)))
            .collect();
        if theirs.len() <= MAX_DETACHED_PER_PEER {
            return;
        }
        theirs.sort_by_key(|(_, d)| std::cmp::Reverse(*d));
        let excess = theirs.len() - MAX_DETACHED_PER_PEER;
        for (hub, _) in theirs.into_iter().take(excess) {
            hub.evict(&format!(
                "peer {} has more than {MAX_DETACHED_PER_PEER} detached sessions",
                owner.fmt_short()
            ));
        }
    }

    /// Ends every session (attached or not) whose owner its agent's trust
    /// (`trust_of` the agent's name) no longer admits.
    pub fn recheck(&self, trust_of: impl Fn(&str) -> Option<Arc<dyn TrustPolicy>>) -> usize {
        let hubs: Vec<Arc<Hub>> = self.lock().values().cloned().collect();
        let mut ended = 0;
        for hub in hubs {
            let admitted = trust_of(&hub.agent).is_some_and(|t| t.check(&hub.owner).is_some());
            if !admitted {
                info!(peer = %hub.peer, session = hub.short(), "ending the session: {}", close::REASON_MEMBERSHIP_REVOKED);
                hub.end(close::CLOSE_CODE_REFUSED, close::REASON_MEMBERSHIP_REVOKED);
                ended += 1;
            }
        }
        ended
    }

    /// Every session now.
    pub fn all(&self) -> Vec<Arc<Hub>> {
        self.lock().values().cloned().collect()
    }

    /// Sessions waiting for their client (resumable) or for a next client (warm).
    pub fn detached(&self) -> usize {
        self.lock().values().filter(|h| h.is_detached()).count()
    }

    /// The detached and warm sessions, named, for the log: `2 detached
    /// (ab12cd34 of 5f3e9a…, 42 s; …), 1 warm (…)`.
    pub fn summary(&self) -> String {
        let mut detached = Vec::new();
        let mut warm = Vec::new();
        for h in self.lock().values() {
            if let Some(d) = h.detached_for() {
                let entry = format!("{} of {}, {}s", h.short(), h.peer, d.as_secs());
                match h.kind {
                    HubKind::Resumable => detached.push(entry),
                    HubKind::Warm => warm.push(entry),
                }
            }
        }
        let list = |v: &[String]| if v.is_empty() { String::new() } else { format!(" ({})", v.join("; ")) };
        format!("{} detached{}, {} warm{}", detached.len(), list(&detached), warm.len(), list(&warm))
    }

    fn remember(&self, hub: &Hub) {
        let reason =
            hub.gone().map_or_else(|| close::REASON_UNKNOWN_SESSION.to_string(), |g| g.resume_reason);
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        if ended.len() >= ENDED_REMEMBERED {
            ended.pop_front();
        }
        ended.push_back((hub.lock().token.clone(), hub.owner, reason));
    }
}

pub struct HubGuard<'a> {
    hubs: &'a Hubs,
    hub: Arc<Hub>,
}

impl Drop for HubGuard<'_> {
    fn drop(&mut self) {
        self.hubs.lock().remove(&self.hub.id);
        self.hubs.remember(&self.hub);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn how_long_a_session_waits_with_nothing_attached() {
        let s = Duration::from_secs;
        let t = HubTiming { grace: s(300), buffer: 1, warm: None, idle_stop: None };
        assert_eq!(t.wait(true), (s(300), "grace"));
        let warm = HubTiming { warm: Some(s(120)), ..t };
        assert_eq!(warm.wait(false), (s(120), "keep_warm"), "a warm agent's next connection");
        assert_eq!(warm.wait(true), (s(300), "grace"), "a lost resumable connection may come back");
        let capped = HubTiming { idle_stop: Some(s(60)), ..warm };
        assert_eq!(capped.wait(true), (s(60), "idle_stop"));
        assert_eq!(capped.wait(false), (s(60), "idle_stop"));
        let loose = HubTiming { idle_stop: Some(s(900)), ..warm };
        assert_eq!(loose.wait(false), (s(120), "keep_warm"), "idle_stop only ever shortens");
    }
}
