//! The resumable path (`thunderbolt/<p>/r1`): the client's hello, the
//! welcome, the replay of what it lacks, then frames and acknowledgements
//! both ways on the attached connection.

use std::{collections::VecDeque, sync::Arc, sync::MutexGuard};

use bytes::Bytes;
use iroh::endpoint::{Connection, RecvStream, SendStream, VarInt};
use thunderbolt_shared::{
    close,
    ndjson::room_for_read,
    resume::{control_line_end, Control, Event, Receiver, BRIDGE_READ_AHEAD, MAX_CONTROL_LINE},
    resume_bridge::{FromDevice, ResumeError},
};
use tokio::{io::AsyncReadExt, time::Instant};
use tracing::{debug, info, warn, Instrument};

use super::hub::{
    AttachError, Gone, Hub, HubKind, State, Step, Wake, CLOSE_CODE_KEPT_WARM, REASON_KEPT_WARM,
    REASON_PROTOCOL,
};
use crate::limits::READ_CHUNK;

/// How long an observer's frames may wait to go in one batch. A person
/// watching does not see 20 ms (a frame at 60 Hz is 17); the controller's
/// round trip, on a machine whose cores also send every observer its copy,
/// does: batched, each observer costs a send per few dozen of the
/// controller's small messages, not one each.
pub const OBSERVER_BATCH: std::time::Duration = std::time::Duration::from_millis(20);

/// Most of the agent's output written to a connection in one turn. The
/// acks of the client's frames go between turns, and the client sends
/// nothing new past [`thunderbolt_shared::resume::CLIENT_SEND_BUFFER`]
/// unacknowledged: an ack queued behind a backlog of output (megabytes, when
/// the agent writes faster than the path drains) would stall the client's
/// upload for as long as the backlog takes, and full-duplex sessions would
/// move in bursts. 128 KiB is a millisecond at the speeds a path reaches
/// here, and a handful of frames to the write call.
pub const WRITE_TURN: usize = 128 * 1024;

impl Hub {
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
        self.attach_r1(st, (conn, send, recv), received, leftover)
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
        self.attach_r1(st, (conn, send, recv), 0, leftover)
            .map_err(|_| unreachable!("a fresh session attaches"))
    }

    /// Attaches `streams` with the state locked: the welcome, then the replay
    /// from frame `received` on.
    fn attach_r1(
        self: &Arc<Self>,
        mut st: MutexGuard<'_, State>,
        (conn, send, recv): (Connection, SendStream, RecvStream),
        received: u64,
        leftover: Bytes,
    ) -> Result<(), AttachError> {
        if let Some(g) = &st.gone {
            return Err(AttachError::Gone(g.resume_reason.clone()));
        }
        // The device that started a session others go on with left it (it
        // closed, or stayed away past its grace): its token is spent.
        if st.members.left {
            return Err(AttachError::Gone(close::REASON_UNKNOWN_SESSION.into()));
        }
        if let Some(stale @ ResumeError::Stale { claimed, acked }) = st.r1.stale(received) {
            drop(st);
            self.end_with(
                close::CLOSE_CODE_REFUSED,
                Gone::new(stale.to_string(), close::REASON_STALE_RESUME),
            );
            return Err(AttachError::Stale { claimed, acked });
        }
        // Taken back after a restart: a client that holds more of the old
        // agent's frames than the journal kept gets the new ones numbered
        // after what it holds (nothing it lacks is skipped: it has those).
        if let Some(kept) = st.restart.restored_at.take() {
            if received > kept && st.r1.out.acked() <= kept {
                st.r1.out.rebase(kept, received).map_err(|e| AttachError::BadPosition(e.to_string()))?;
                info!(
                    peer = %self.peer,
                    session = self.short(),
                    "the client holds {} frame(s) of the old agent's past what the journal kept; the new agent's are numbered after them",
                    received - kept
                );
                st.rewrite_journal();
            }
        }
        let token = st.token.clone();
        let welcome = match st.r1.resume(&token, received, self.cfg.wait(true).0) {
            Ok(welcome) => welcome.encode(),
            Err(e) => return Err(AttachError::BadPosition(e.to_string())),
        };
        let id = st.conn.next_id();
        let replay = st.r1.out.total() - received;
        st.conn.resumable = true;
        if id > 0 {
            st.resumes += 1;
            info!(
                peer = %self.peer,
                session = self.short(),
                "session resumed: resending {replay} frame(s), expecting the client's from frame {}",
                st.r1.acks.received()
            );
        }
        // In the connection's span: the log names the agent (`agent{name=…}`).
        let task = tokio::spawn(
            self.clone().serve(id, conn.clone(), send, recv, welcome, received, leftover).in_current_span(),
        );
        self.install(st, id, conn, true, task);
        // A device on a shared session is told its role again when it comes
        // back (a reloaded page knows it from nothing else).
        if id > 0 && self.kind == HubKind::Resumable {
            self.tell_role();
        }
        Ok(())
    }

    /// Runs one attached connection until it is lost.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn serve(
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
        // An observer's frames wait a moment to go in batches (see `OBSERVER_BATCH`).
        let mut waiting_since: Option<Instant> = None;
        loop {
            let next = self
                .until(Wake::Any, |st| {
                    if !st.conn.is_attached(id) {
                        return Step::Ready(Ok(None));
                    }
                    // Output the client has not acknowledged in time goes to the journal.
                    if st.journal.behind.due().is_some_and(|at| Instant::now() >= at) {
                        st.journal_turn();
                    }
                    let now = Instant::now();
                    // A batch is for a trickle of small frames: a backlog of a
                    // whole turn or more goes at once (the interval is a latency
                    // floor for an observer, never a ceiling on its throughput:
                    // one turn per interval held a shared session to ~25 MB/s).
                    let unsent =
                        st.conn.sent_mark.map_or(u64::MAX, |m| st.r1.out.pushed_bytes().saturating_sub(m));
                    let batch = cursor < st.r1.out.total()
                        && unsent < WRITE_TURN as u64
                        && !st.r1.acks.is_due()
                        && st.r1.acks.poll_timeout().is_none_or(|at| now < at)
                        && st.io.end_at.is_none()
                        && self.observing.load(std::sync::atomic::Ordering::Relaxed);
                    if batch {
                        let due = *waiting_since.get_or_insert(now) + OBSERVER_BATCH;
                        if now < due {
                            let wake = [Some(due), st.r1.acks.poll_timeout(), st.journal.behind.due()]
                                .into_iter()
                                .flatten()
                                .min();
                            return Step::Wait(wake);
                        }
                    }
                    waiting_since = None;
                    let mut runs = Vec::new();
                    // Acks go by count or bytes, else after a short delay: never one
                    // per message (a request/response session would pay for it twice).
                    // Ahead of the output: the client's sending waits on it.
                    runs.extend(st.r1.poll_transmit(now).map(|a| a.encode()));
                    if st.conn.sent_mark.is_none() {
                        // This connection's first turn: what it resends is not sent yet.
                        st.conn.sent_mark =
                            Some(st.r1.out.pushed_before(cursor).unwrap_or(st.r1.out.pushed_bytes()));
                    }
                    if cursor < st.r1.out.total() {
                        match st.r1.out.next_runs(cursor, WRITE_TURN) {
                            Ok((r, next)) => {
                                let taken: usize = r.iter().map(Bytes::len).sum();
                                st.conn.sent_mark = st.conn.sent_mark.map(|m| m + taken as u64);
                                runs.extend(r);
                                cursor = next;
                                // The agent may wait for this room (`UNSENT_MAX`).
                                if let Some(w) = st.conn.writer.take() {
                                    w.wake();
                                }
                            }
                            Err(e) => return Step::Ready(Err(format!("{REASON_PROTOCOL}: {e}"))),
                        }
                    }
                    if let Some((n, _)) = st.io.end_at.filter(|(n, _)| *n == cursor && !sent_end) {
                        sent_end = true;
                        runs.push(Control::End(n).encode());
                    }
                    if runs.is_empty() {
                        // A warm agent's client that is done: its input ended, all it
                        // asked was answered and all it was sent is acknowledged.
                        let (done, until) =
                            if st.r1.out.acked() == st.r1.out.total() && st.io.end_at.is_none() {
                                self.client_done(st)
                            } else {
                                (false, None)
                            };
                        if done {
                            return Step::Ready(Ok(Some(Vec::new())));
                        }
                        let wake = [st.r1.acks.poll_timeout(), until, st.journal.behind.due()]
                            .into_iter()
                            .flatten()
                            .min();
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

    /// Takes the client's frames into the agent's queue and its control lines
    /// into the state. Returns why it stopped.
    ///
    /// Frames are read ahead of the agent's queue (up to
    /// [`BRIDGE_READ_AHEAD`] beyond one run), so a control line is applied as
    /// soon as it arrives: the client's acks free the replay log even while the
    /// agent, blocked on output that waits for those acks, reads nothing.
    async fn read_loop(self: &Arc<Self>, id: u64, recv: &mut RecvStream, leftover: Bytes) -> String {
        let mut rx = Receiver::new(self.max_frame);
        rx.push(&leftover);
        let mut events = Vec::new();
        // Runs of frames read but not yet in the agent's queue (with whether
        // each names an id), and the client's end of input in its place after them.
        let mut ahead: VecDeque<(Bytes, u64, bool)> = VecDeque::new();
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
                        let ids = self.names_an_id(&bytes, frames);
                        ahead.push_back((bytes, frames, ids));
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
                    let (bytes, frames, ids) = ahead.pop_front().expect("not empty");
                    ahead_bytes -= bytes.len();
                    if let Err(e) = self.deliver(id, permit, bytes, frames, ids) {
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

    /// Applies one of the client's control lines.
    pub(super) fn control(self: &Arc<Self>, c: Option<Control>) -> Result<(), String> {
        let Some(c) = c else { return Ok(()) };
        // Before the hub's lock: asking about the session's other devices
        // takes the session hub's (the lock order: hub.rs).
        let others = matches!(c, Control::Eof(_)) && self.kind == HubKind::Resumable && self.others_on();
        let mut st = self.lock();
        let said = st.r1.handle_control(&c).map_err(|e| format!("{REASON_PROTOCOL}: {e}"))?;
        match said {
            FromDevice::Acked(_) => {
                self.left_if_done(&st);
                let told = self.tell_missed_if_room(&mut st);
                let writer = st.conn.writer.take();
                drop(st);
                self.wake(writer);
                if told {
                    self.output.notify_waiters();
                }
                // A device that joined: the agent may wait for room in its log.
                if let Some(s) = self.seat.get().and_then(|s| s.session.upgrade()) {
                    let writer = s.lock().conn.writer.take();
                    s.wake(writer);
                }
            }
            FromDevice::Role(role) if self.kind == HubKind::Resumable => {
                drop(st);
                self.ask_role(role)
            }
            FromDevice::Eof(n) => {
                if others {
                    // One device's input ended; the agent's stays open for the others.
                    self.leave_after_eof(&mut st);
                    drop(st);
                    self.output.notify_waiters();
                } else if let Some(session) = self.session_hub().filter(|_| self.is_guest()) {
                    // The last device on the session, one that joined it: its end is the agent's.
                    drop(st);
                    session.lock().io.inbox.take();
                } else if self.kind == HubKind::Warm {
                    // A warm agent's input stays open for the next client.
                    st.io.input_ended = Some(Instant::now());
                    drop(st);
                    self.output.notify_waiters();
                } else if st.io.inbox.take().is_some() {
                    debug!(peer = %self.peer, session = self.short(), "the client's input ended after {n} frames");
                }
            }
            FromDevice::Role(_) | FromDevice::Nothing => {}
        }
        Ok(())
    }
}

/// Reads the client's hello (its first line). Returns it and whatever the
/// client sent after it.
pub async fn read_hello(recv: &mut RecvStream) -> Result<(Control, Bytes), String> {
    let (line, rest) = read_line(recv).await.map_err(|e| format!("{REASON_PROTOCOL}: no hello: {e}"))?;
    match Control::parse(&line) {
        Ok(Some(c @ (Control::Hello { .. } | Control::Join { .. } | Control::List { .. })))
            if line[0] == b'!' =>
        {
            Ok((c, rest))
        }
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
