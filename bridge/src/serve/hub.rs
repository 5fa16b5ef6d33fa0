//! Resumable sessions (`thunderbolt/<p>/r1`; the wire is specified in
//! [`thunderbolt_shared::resume`]): one agent that outlives the connections
//! that drive it.
//!
//! A [`Hub`] stands between the session core ([`crate::serve::session`], which sees
//! it as its [`Link`]) and whichever connection is attached right now:
//! - the agent's output goes into the hub's replay log ([`Outbox`]); the
//!   attached connection's writer sends it on, and an acknowledgement from the
//!   client frees it. While no connection is attached the log keeps growing,
//!   up to the resume buffer: past that the session ends;
//! - the client's frames come off the attached connection into one queue the
//!   agent's input pump reads ([`Inbox`]), counted so a resuming client knows
//!   what to resend;
//! - a connection lost without the client's close detaches the session: the
//!   agent runs on, and the session ends only if nobody re-attaches within
//!   the grace period. Only the NodeId that started the session can attach.
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
    collections::{HashMap, HashSet},
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard},
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
    ndjson::OVERSIZE_PEEK,
    resume::{AckPolicy, Control, Event, Receiver, ReplayLog, ACK_DELAY_MS, MAX_CONTROL_LINE},
};
use tokio::{
    io::{AsyncReadExt, AsyncWrite},
    sync::{mpsc, Notify},
    time::Instant,
};
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info, warn};

use crate::{
    limits::READ_CHUNK,
    serve::session::{Link, SessionConfig},
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

/// Close reason for a connection whose session was resumed on a newer one.
pub const REASON_SUPERSEDED: &str = "session resumed on another connection";

/// Close reason for a resumable stream that broke the protocol.
pub const REASON_PROTOCOL: &str = "resume protocol error";

/// Client frames queued for the agent's input pump: a few reads' worth, so a
/// client faster than its agent is slowed by QUIC flow control, not buffered.
const INBOX_QUEUE: usize = 16;

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

/// One session's state between connections.
#[derive(Debug)]
pub struct Hub {
    token: String,
    kind: HubKind,
    owner: EndpointId,
    peer: String,
    /// For a warm hub, `grace` is the keep-warm window.
    cfg: ResumeConfig,
    max_frame: usize,
    state: Mutex<State>,
    /// The session's state changed: attach, detach, an ack, the end.
    changed: Notify,
    /// Something for the attached connection's writer: new output, an ack due.
    /// Apart from `changed` so output wakes only the writer, not the session.
    output: Notify,
    /// Lines the bridge writes to the agent itself (answers for a vanished
    /// client), ahead of the client's.
    inject: mpsc::UnboundedSender<Bytes>,
}

#[derive(Debug)]
struct State {
    out: ReplayLog,
    /// The agent's output ended after this many frames.
    end_at: Option<u64>,
    /// Frames taken from the client (into the agent's queue).
    ack: AckPolicy,
    ack_due: bool,
    inbox: Option<mpsc::Sender<Bytes>>,
    attached: Option<Attached>,
    detached_since: Option<Instant>,
    gone: Option<String>,
    next_conn: u64,
    /// The agent-output side, waiting for room in the log.
    writer: Option<Waker>,
    /// Warm: ids of the agent's requests the attached client has not answered.
    pending: HashSet<String>,
    /// Warm: the client's output is all delivered (the plain stream finished).
    plain_done: bool,
    /// Warm: lines the agent wrote while no client was attached (dropped).
    dropped: u64,
}

#[derive(Debug)]
struct Attached {
    id: u64,
    conn: Connection,
    _task: AbortOnDropHandle<()>,
}

impl State {
    fn is_attached(&self, id: u64) -> bool {
        self.attached.as_ref().is_some_and(|a| a.id == id)
    }
}

impl Hub {
    /// A new session for `owner`, and the two ends the agent's pumps use.
    pub fn new(
        kind: HubKind,
        owner: EndpointId,
        cfg: ResumeConfig,
        max_frame: usize,
    ) -> (Arc<Self>, Inbox, Outbox) {
        let (tx, rx) = mpsc::channel(INBOX_QUEUE);
        let (inject, injected) = mpsc::unbounded_channel();
        let hub = Arc::new(Self {
            token: new_token(),
            kind,
            inject,
            owner,
            peer: owner.fmt_short().to_string(),
            cfg,
            max_frame,
            state: Mutex::new(State {
                out: ReplayLog::new(),
                end_at: None,
                ack: AckPolicy::at(0),
                ack_due: false,
                inbox: Some(tx),
                attached: None,
                detached_since: Some(Instant::now()),
                gone: None,
                next_conn: 0,
                writer: None,
                pending: HashSet::new(),
                plain_done: false,
                dropped: 0,
            }),
            changed: Notify::new(),
            output: Notify::new(),
        });
        let outbox = Outbox { hub: hub.clone() };
        (hub, Inbox::new(rx, Some(injected), true), outbox)
    }

    /// The token's first characters, for logs (the token itself is never logged).
    fn short(&self) -> &str {
        &self.token[..8]
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

    /// Resolves on either notification (a writer's wait). Enable it before
    /// reading the state so nothing is missed in between.
    fn notified_any(&self) -> NotifiedAny<'_> {
        NotifiedAny { a: Box::pin(self.changed.notified()), b: Box::pin(self.output.notified()) }
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
    ) -> Result<(), String> {
        let mut st = self.lock();
        if let Some(why) = &st.gone {
            return Err(format!("the session ended ({why})"));
        }
        st.out.ack(received).map_err(|e| e.to_string())?;
        let id = st.next_conn;
        st.next_conn += 1;
        st.ack.resumed();
        st.ack_due = false;
        let welcome = Control::Welcome {
            session: self.token.clone(),
            received: st.ack.received(),
            grace_ms: self.cfg.grace.as_millis() as u64,
        }
        .encode();
        let replay = st.out.total() - received;
        if id > 0 {
            info!(
                peer = %self.peer,
                session = self.short(),
                "session resumed: resending {replay} frame(s), expecting the client's from frame {}",
                st.ack.received()
            );
        }
        let task =
            tokio::spawn(self.clone().serve(id, conn.clone(), send, recv, welcome, received, leftover));
        let old = st.attached.replace(Attached { id, conn, _task: AbortOnDropHandle::new(task) });
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
            r = self.write_loop(id, &mut send, welcome, from) => match r {
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
    /// other loss detaches it.
    fn lost(&self, id: u64, conn: &Connection, why: &str) {
        let mut st = self.lock();
        if !st.is_attached(id) {
            return;
        }
        let clean = matches!(
            conn.close_reason(),
            Some(ConnectionError::ApplicationClosed(ac)) if ac.error_code.into_inner() == close::CLOSE_CODE_CLIENT as u64
        );
        let attached = st.attached.take();
        if self.kind == HubKind::Warm {
            if st.gone.is_none() {
                st.detached_since = Some(Instant::now());
                let answered = self.answer_for_vanished_client(&mut st);
                info!(
                    peer = %self.peer,
                    "client left ({why}); the agent stays warm {:?} for this peer's next connection{}",
                    self.cfg.grace,
                    if answered > 0 { format!(" ({answered} of its request(s) answered with an error)") } else { String::new() }
                );
            }
        } else if clean {
            st.gone.get_or_insert_with(|| close::REASON_CLIENT_CLOSED.to_string());
        } else if st.gone.is_none() {
            st.detached_since = Some(Instant::now());
            info!(
                peer = %self.peer,
                session = self.short(),
                "connection lost ({why}); the agent keeps running and the session waits {:?} for the client \
                 ({} byte(s) of output held)",
                self.cfg.grace,
                st.out.bytes()
            );
        }
        let writer = st.writer.take();
        drop(st);
        self.wake(writer);
        // Last: this may be the very task running us.
        drop(attached);
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
            info!(
                peer = %self.peer,
                "attached to the warm agent ({} message(s) it wrote meanwhile were dropped)",
                std::mem::take(&mut st.dropped)
            );
        }
        let task = tokio::spawn(self.clone().serve_plain(id, conn.clone(), send, recv));
        let old = st.attached.replace(Attached { id, conn, _task: AbortOnDropHandle::new(task) });
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
            e = self.write_plain(id, &mut send) => e,
            e = self.read_plain(id, &mut recv) => e,
            err = conn.closed() => err.to_string(),
        };
        self.lost(id, &conn, &why);
    }

    /// Warm: the agent's output as it comes, nothing kept once written; at the
    /// agent's end the stream is finished and its delivery awaited.
    async fn write_plain(&self, id: u64, send: &mut SendStream) -> String {
        let mut cursor = self.lock().out.total();
        loop {
            let notified = self.notified_any();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (mut runs, end) = {
                let st = self.lock();
                if !st.is_attached(id) {
                    return "replaced".into();
                }
                let runs = st.out.since(cursor).unwrap_or_default();
                cursor = st.out.total();
                (runs, st.end_at.is_some_and(|n| n == cursor))
            };
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
            notified.await;
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
                if let Event::Data { bytes, frames } = &ev {
                    if *frames > 0 {
                        let mut st = self.lock();
                        for line in bytes.split_inclusive(|b| *b == b'\n') {
                            let head = jsonrpc::peek_head(&line[..line.len().min(OVERSIZE_PEEK)]);
                            if let (Kind::Response, Some(id)) = (head.kind, head.id) {
                                st.pending.remove(&id);
                            }
                        }
                    }
                }
                if let Err(e) = self.take(id, ev).await {
                    return e;
                }
            }
            let buf = rx.buf_mut();
            buf.reserve(READ_CHUNK);
            match recv.read_buf(buf).await {
                Ok(0) => {
                    if self.lock().inbox.take().is_some() {
                        debug!(peer = %self.peer, "the client finished its stream: closing the agent's input");
                    }
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
    ) -> Result<(), String> {
        let werr = |e: iroh::endpoint::WriteError| e.to_string();
        send.write_all(&welcome).await.map_err(werr)?;
        let mut sent_end = false;
        let mut controls = Vec::new();
        loop {
            let notified = self.notified_any();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (mut runs, ack_pending) = {
                let mut st = self.lock();
                if !st.is_attached(id) {
                    return Ok(());
                }
                let runs = if cursor < st.out.total() {
                    let runs = st.out.since(cursor).map_err(|e| format!("{REASON_PROTOCOL}: {e}"))?;
                    cursor = st.out.total();
                    runs
                } else {
                    Vec::new()
                };
                // Acks go by count or bytes, else after a short delay: never one
                // per message (a request/response session would pay for it twice).
                if st.ack_due {
                    st.ack_due = false;
                    controls.extend(st.ack.ack());
                }
                if let Some(n) = st.end_at.filter(|n| *n == cursor && !sent_end) {
                    sent_end = true;
                    controls.push(Control::End(n));
                }
                (runs, st.ack.pending())
            };
            if runs.is_empty() && controls.is_empty() {
                if ack_pending {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep(Duration::from_millis(ACK_DELAY_MS)) => self.lock().ack_due = true,
                    }
                } else {
                    notified.await;
                }
                continue;
            }
            for c in controls.drain(..) {
                runs.push(c.encode());
            }
            send.write_all_chunks(&mut runs).await.map_err(werr)?;
        }
    }

    /// Takes the client's frames into the agent's queue and its control lines
    /// into the state. Returns why it stopped.
    async fn read_loop(&self, id: u64, recv: &mut RecvStream, leftover: Bytes) -> String {
        let mut rx = Receiver::new(self.max_frame);
        rx.push(&leftover);
        let mut events = Vec::new();
        loop {
            rx.drain(&mut events);
            for ev in events.drain(..) {
                if let Err(e) = self.take(id, ev).await {
                    return e;
                }
            }
            let buf = rx.buf_mut();
            buf.reserve(READ_CHUNK);
            match recv.read_buf(buf).await {
                // A client never finishes its stream mid-session (it says eof);
                // a finished one is lost once its connection is.
                Ok(0) => std::future::pending::<()>().await,
                Ok(_) => {}
                Err(e) => return e.to_string(),
            }
        }
    }

    async fn take(&self, id: u64, ev: Event) -> Result<(), String> {
        match ev {
            Event::Data { bytes, frames } => {
                let inbox = self.lock().inbox.clone();
                let len = bytes.len();
                // Reserve first so the count and the queue change together, under
                // the lock, and only while this connection is still the attached one.
                let permit = match &inbox {
                    Some(tx) => tx.reserve().await.ok(),
                    None => None,
                };
                let mut st = self.lock();
                if !st.is_attached(id) {
                    return Err("replaced by a newer connection".into());
                }
                if let Some(p) = permit {
                    p.send(bytes);
                }
                // Frames after the agent's input closed are counted (and dropped)
                // so the client's replay buffer drains.
                if st.ack.took(frames, len) {
                    st.ack_due = true;
                    drop(st);
                    self.output.notify_waiters();
                }
            }
            Event::Control(Some(Control::Ack(n))) => {
                let mut st = self.lock();
                st.out.ack(n).map_err(|e| format!("{REASON_PROTOCOL}: ack {e}"))?;
                let writer = st.writer.take();
                drop(st);
                self.wake(writer);
            }
            Event::Control(Some(Control::Eof(n))) => {
                let mut st = self.lock();
                if st.ack.received() != n {
                    return Err(format!(
                        "{REASON_PROTOCOL}: eof after {n} frames, but {} arrived",
                        st.ack.received()
                    ));
                }
                if st.inbox.take().is_some() {
                    debug!(peer = %self.peer, session = self.short(), "the client's input ended after {n} frames");
                }
            }
            // Hellos mid-stream, welcomes, ends and unknown kinds mean nothing here.
            Event::Control(_) => {}
        }
        Ok(())
    }

    /// Ends the session towards its client (if one is attached).
    fn end(&self, code: u32, reason: &str) {
        let mut st = self.lock();
        st.gone.get_or_insert_with(|| reason.to_string());
        let attached = st.attached.take();
        let writer = st.writer.take();
        drop(st);
        if let Some(a) = &attached {
            a.conn.close(VarInt::from_u32(code), reason.as_bytes());
        }
        self.wake(writer);
    }

    /// Releases the attached connection's task (the session is over).
    pub fn release(&self) {
        let attached = self.lock().attached.take();
        drop(attached);
    }
}

/// Two `Notified`s as one future (see [`Hub::notified_any`]).
struct NotifiedAny<'a> {
    a: Pin<Box<tokio::sync::futures::Notified<'a>>>,
    b: Pin<Box<tokio::sync::futures::Notified<'a>>>,
}

impl NotifiedAny<'_> {
    fn enable(self: Pin<&mut Self>) {
        let me = self.get_mut();
        me.a.as_mut().enable();
        me.b.as_mut().enable();
    }
}

impl Future for NotifiedAny<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let me = self.get_mut();
        if me.a.as_mut().poll(cx).is_ready() || me.b.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// The session core's view of a hub.
#[derive(Debug, Clone)]
pub struct HubLink(pub Arc<Hub>);

impl Link for HubLink {
    type Out = Outbox;

    fn gone(&self) -> impl Future<Output = String> + Send {
        let hub = self.0.clone();
        async move {
            loop {
                let notified = hub.changed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let deadline = {
                    let st = hub.lock();
                    if let Some(why) = &st.gone {
                        return why.clone();
                    }
                    st.detached_since.map(|t| (t, t + hub.cfg.grace))
                };
                match deadline {
                    None => notified.await,
                    Some((since, at)) => {
                        tokio::select! {
                            _ = notified => {}
                            _ = tokio::time::sleep_until(at) => {
                                let mut st = hub.lock();
                                if st.detached_since == Some(since) && st.gone.is_none() {
                                    let why = match hub.kind {
                                        HubKind::Resumable => format!("the client did not come back within {:?}", hub.cfg.grace),
                                        HubKind::Warm => format!("no client for {:?} (--keep-warm)", hub.cfg.grace),
                                    };
                                    st.gone = Some(why.clone());
                                    return why;
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    fn gone_reason(&self) -> Option<String> {
        self.0.lock().gone.clone()
    }

    fn close(&self, code: u32, reason: &str) {
        self.0.end(code, reason);
    }

    fn finish(&self, _out: &mut Outbox) {
        let mut st = self.0.lock();
        st.end_at = Some(st.out.total());
        drop(st);
        self.0.changed.notify_waiters();
        self.0.output.notify_waiters();
    }

    fn delivered(&self, _out: &mut Outbox) -> impl Future<Output = ()> + Send {
        let hub = self.0.clone();
        async move {
            loop {
                let notified = hub.changed.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                {
                    let st = hub.lock();
                    let done = match hub.kind {
                        HubKind::Resumable => st.end_at.is_some_and(|n| st.out.acked() >= n),
                        // Nobody to deliver to, or the plain stream was taken whole.
                        HubKind::Warm => st.plain_done || st.attached.is_none(),
                    };
                    if done {
                        return;
                    }
                }
                notified.await;
            }
        }
    }

    fn linger(&self, cfg: &SessionConfig) -> Duration {
        // The client may be between connections when the agent ends.
        cfg.finish_linger.max(self.0.cfg.grace)
    }
}

/// Where the agent's output goes: the hub's replay log. Writes wait for room
/// while a client is attached (acks make room); with none attached, output
/// past the resume buffer ends the session.
#[derive(Debug)]
pub struct Outbox {
    hub: Arc<Hub>,
}

impl AsyncWrite for Outbox {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let hub = &self.hub;
        let mut st = hub.lock();
        if let Some(why) = &st.gone {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, why.clone())));
        }
        if hub.kind == HubKind::Warm {
            let attached = st.attached.is_some();
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
            if st.attached.is_some() {
                st.writer = Some(cx.waker().clone());
                return Poll::Pending;
            }
            let why = format!(
                "the agent wrote more than the resume buffer ({} bytes) while the client was away",
                hub.cfg.buffer
            );
            warn!(peer = %hub.peer, session = hub.short(), "{why}; ending the session");
            st.gone = Some(why.clone());
            drop(st);
            hub.changed.notify_waiters();
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, why)));
        }
        // The pump writes whole lines only: each write is one run of frames.
        st.out.push(Bytes::copy_from_slice(buf));
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
        Some(Control::Hello { session, received }) if line[0] == b'!' => Ok((session, received, rest)),
        _ => Err(format!("{REASON_PROTOCOL}: the first line is not a hello")),
    }
}

/// Reads the first line of a resumable stream (a control line, short): the
/// hello on the bridge's side, the welcome on the client's. Returns it and
/// what followed it.
pub async fn read_line(recv: &mut RecvStream) -> Result<(Bytes, Bytes), String> {
    let mut buf = bytes::BytesMut::with_capacity(MAX_CONTROL_LINE);
    loop {
        if let Some(nl) = thunderbolt_shared::ndjson::memchr_newline(&buf) {
            let line = buf.split_to(nl + 1).freeze();
            return Ok((line, buf.freeze()));
        }
        if buf.len() > MAX_CONTROL_LINE {
            return Err(format!("no line end within {MAX_CONTROL_LINE} bytes"));
        }
        buf.reserve(MAX_CONTROL_LINE);
        match recv.read_buf(&mut buf).await {
            Ok(0) => return Err("the stream ended".into()),
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The resumable sessions alive (attached or not), by token.
#[derive(Debug, Default)]
pub struct Hubs {
    map: Mutex<HashMap<String, Arc<Hub>>>,
}

impl Hubs {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Hub>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `hub` until the guard is dropped.
    pub fn insert(&self, hub: &Arc<Hub>) -> HubGuard<'_> {
        self.lock().insert(hub.token.clone(), hub.clone());
        HubGuard { hubs: self, token: hub.token.clone() }
    }

    /// The session `token` if `peer` owns it.
    pub fn find(&self, token: &str, peer: &EndpointId) -> Option<Arc<Hub>> {
        self.lock().get(token).filter(|h| h.owner == *peer).cloned()
    }

    /// A warm agent of `peer`'s that no connection drives now.
    pub fn warm_for(&self, peer: &EndpointId) -> Option<Arc<Hub>> {
        self.lock()
            .values()
            .find(|h| {
                h.kind == HubKind::Warm && h.owner == *peer && {
                    let st = h.lock();
                    st.attached.is_none() && st.gone.is_none()
                }
            })
            .cloned()
    }

    /// Ends every session (attached or not) whose owner `trust` no longer admits.
    pub fn recheck(&self, trust: &dyn TrustPolicy) -> usize {
        let hubs: Vec<Arc<Hub>> = self.lock().values().cloned().collect();
        let mut ended = 0;
        for hub in hubs {
            if trust.check(&hub.owner).is_none() {
                info!(peer = %hub.peer, session = hub.short(), "ending the session: {}", close::REASON_MEMBERSHIP_REVOKED);
                hub.end(close::CLOSE_CODE_REFUSED, close::REASON_MEMBERSHIP_REVOKED);
                ended += 1;
            }
        }
        ended
    }

    /// Sessions waiting for their client.
    pub fn detached(&self) -> usize {
        self.lock().values().filter(|h| h.lock().attached.is_none()).count()
    }
}

pub struct HubGuard<'a> {
    hubs: &'a Hubs,
    token: String,
}

impl Drop for HubGuard<'_> {
    fn drop(&mut self) {
        self.hubs.lock().remove(&self.token);
    }
}
