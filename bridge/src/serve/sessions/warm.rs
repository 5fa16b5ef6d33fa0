//! The warm path (`--keep-warm`, `thunderbolt/<p>/0`): a plain connection
//! drives a running agent that outlives it; nothing is replayed, and what the
//! agent asked a client that is gone is answered for it.

use std::sync::Arc;

use iroh::endpoint::{Connection, RecvStream, SendStream, VarInt};
use thunderbolt_shared::{
    jsonrpc::{self, Kind},
    ndjson::{room_for_read, OVERSIZE_PEEK},
    resume::{Event, Receiver},
    resume_bridge::BridgeSession,
};
use tokio::{io::AsyncReadExt, time::Instant};
use tracing::{debug, info, Instrument};

use super::hub::{Hub, HubKind, State, Step, Wake, CLOSE_CODE_KEPT_WARM, KEPT_WARM_QUIET, REASON_KEPT_WARM};
use crate::{ids, limits::READ_CHUNK};

impl Hub {
    /// Warm: the agent goes to a new session of its peer. Whatever the last
    /// one left (output not taken, the agent's requests to it) is settled:
    /// the output dropped, the requests answered for it.
    pub(super) fn next_session(&self, st: &mut State) {
        let answered = self.answer_for_vanished_client(st);
        if let Some(r) = self.requests.get() {
            r.clear();
        }
        if answered > 0 {
            debug!(peer = %self.peer, "{answered} request(s) of the agent's, left by the last client, answered with an error");
        }
        st.token = ids::token();
        st.token_hash = crate::journal::token_hash(&st.token);
        st.r1 = BridgeSession::default();
        st.conn.sent_mark = None;
        st.io.oversize_at = None;
        st.io.input_ended = None;
        st.warm.plain_done = false;
        st.conn.resumable = false;
    }

    /// Warm: answers every request of the agent's that the client can no longer
    /// answer (sent and unanswered, or never sent) and forgets undelivered
    /// output. Returns how many were answered.
    pub(super) fn answer_for_vanished_client(&self, st: &mut State) -> usize {
        let mut ids: Vec<String> = st.warm.pending.drain().collect();
        let unsent = st.r1.out.since(st.r1.out.acked()).unwrap_or_default();
        for run in &unsent {
            for line in thunderbolt_shared::ndjson::lines(run) {
                let head = jsonrpc::peek_head(&line[..line.len().min(OVERSIZE_PEEK)]);
                if let (Kind::Request, Some(id)) = (head.kind, head.id) {
                    ids.push(id);
                }
            }
        }
        let total = st.r1.out.total();
        let _ = st.r1.out.ack(total);
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
        let id = st.conn.next_id();
        if id > 0 {
            let took_over =
                if st.conn.attached.is_some() { ", taking it over from the older connection" } else { "" };
            info!(
                peer = %self.peer,
                "attached to the warm agent{took_over} ({} message(s) it wrote meanwhile were dropped)",
                std::mem::take(&mut st.warm.dropped)
            );
            self.next_session(&mut st);
        }
        // In the connection's span: the log names the agent (`agent{name=…}`).
        let task = tokio::spawn(self.clone().serve_plain(id, conn.clone(), send, recv).in_current_span());
        self.install(st, id, conn, false, task);
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
        let mut cursor = self.lock().r1.out.total();
        loop {
            let next = self
                .until(Wake::Any, |st| {
                    if !st.conn.is_attached(id) {
                        return Step::Ready(None);
                    }
                    let runs = st.r1.out.since(cursor).unwrap_or_default();
                    cursor = st.r1.out.total();
                    let end = st.io.end_at.is_some_and(|(n, _)| n == cursor);
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
                let _ = st.r1.out.ack(cursor);
                let writer = st.conn.writer.take();
                drop(st);
                if let Some(w) = writer {
                    w.wake();
                }
                continue;
            }
            if end {
                let _ = send.finish();
                let _ = send.stopped().await;
                self.lock().warm.plain_done = true;
                self.changed.notify_waiters();
                std::future::pending::<()>().await;
            }
        }
    }

    /// Warm: the client's lines, whole, into the agent's queue; its answers to
    /// the agent's requests are noted. The client finishing its stream closes
    /// the agent's input, as on the plain protocol.
    async fn read_plain(self: &Arc<Self>, id: u64, recv: &mut RecvStream) -> String {
        let mut rx = Receiver::plain(self.max_frame);
        let mut events = Vec::new();
        loop {
            rx.drain(&mut events);
            for ev in events.drain(..) {
                if let Event::Data { bytes, frames } = ev {
                    let permit = self.reserve().await;
                    if let Err(e) = self.deliver(id, permit, bytes, frames, false) {
                        return e;
                    }
                }
            }
            let buf = rx.buf_mut();
            room_for_read(buf, READ_CHUNK);
            match recv.read_buf(buf).await {
                Ok(0) => {
                    // A warm agent's input stays open for the next client.
                    self.lock().io.input_ended = Some(Instant::now());
                    debug!(peer = %self.peer, "the client finished its stream (the warm agent's input stays open)");
                    self.output.notify_waiters();
                    std::future::pending::<()>().await;
                }
                Ok(_) => {}
                Err(e) => return e.to_string(),
            }
        }
    }

    /// Whether every request the attached client sent was answered (always,
    /// for a session that does not track them).
    pub(super) fn requests_idle(&self) -> bool {
        self.requests.get().is_none_or(|r| r.is_empty())
    }

    /// Whether a warm agent's attached client is done with it: its input
    /// ended, every request it sent was answered, and the agent has been
    /// quiet for [`KEPT_WARM_QUIET`] since (a notification or two may follow
    /// a last answer). Else, when to look again.
    pub(super) fn client_done(&self, st: &State) -> (bool, Option<Instant>) {
        let Some(ended) = st.io.input_ended.filter(|_| self.kind == HubKind::Warm) else {
            return (false, None);
        };
        if !self.requests_idle() {
            return (false, None);
        }
        let quiet_at = st.io.last_output.map_or(ended, |o| o.max(ended)) + KEPT_WARM_QUIET;
        if Instant::now() >= quiet_at {
            (true, None)
        } else {
            (false, Some(quiet_at))
        }
    }
}
