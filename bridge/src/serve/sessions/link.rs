//! The session core's view of a hub: a [`Link`] whose output goes into the
//! hub's replay log ([`Outbox`]) and whose input is the hub's queue of the
//! client's frames ([`Inbox`]).

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use thunderbolt_shared::{
    close,
    jsonrpc::{self, Kind},
    ndjson::{Run, OVERSIZE_PEEK},
};
use tokio::{io::AsyncWrite, time::Instant};
use tracing::debug;

use super::hub::{Gone, Hub, HubKind, Step, Wake};
use crate::serve::{
    requests::Requests,
    session::{Link, SessionInfo},
    taps::{Presence, Tap},
};

/// The session core's view of a hub.
#[derive(Debug, Clone)]
pub struct HubLink(pub Arc<Hub>);

impl Link for HubLink {
    type Out = Outbox;

    fn gone(&self) -> impl Future<Output = String> + Send {
        let hub = self.0.clone();
        async move {
            loop {
                let gone = hub
                    .until(Wake::Changed, |st| {
                        if let Some(g) = &st.gone {
                            return Step::Ready(Some(g.why.clone()));
                        }
                        let (wait, why) = hub.cfg.wait(st.conn.resumable || hub.kind == HubKind::Resumable);
                        // Devices that stay away while others go on leave after their
                        // grace (outside this lock: a device's leaving takes it).
                        let (due, next) = hub.members_away(st, wait);
                        if !due.is_empty() {
                            return Step::Ready(None);
                        }
                        let Some(since) = hub.away_since(st) else { return Step::Wait(next) };
                        let at = since + wait;
                        if Instant::now() < at {
                            return Step::Wait(Some(next.map_or(at, |n| n.min(at))));
                        }
                        let why = match (why, hub.kind) {
                            ("idle_stop", _) => format!("nothing attached for {wait:?} (idle_stop)"),
                            (_, HubKind::Resumable) => {
                                format!("the client did not come back within {wait:?}")
                            }
                            (_, HubKind::Warm) => format!("no client for {wait:?} (keep-warm)"),
                        };
                        st.gone = Some(Gone::new(why.clone(), close::REASON_SESSION_EXPIRED));
                        Step::Ready(Some(why))
                    })
                    .await;
                match gone {
                    Some(why) => return why,
                    None => hub.expire_members(),
                }
            }
        }
    }

    fn gone_reason(&self) -> Option<String> {
        self.0.gone().map(|g| g.why)
    }

    fn close(&self, code: u32, reason: &str) {
        // A journaled session outlives the bridge: its client is told to come back.
        if reason == close::REASON_SHUTTING_DOWN && self.0.keep_for_restart() {
            return;
        }
        // A session taken back whose agent could not reload it ends with why.
        let close_as = self.0.lock().restart.close_as.clone();
        match close_as {
            Some(why) if code == close::CLOSE_CODE_AGENT_ENDED => self.0.end(close::CLOSE_CODE_REFUSED, &why),
            _ => self.0.end(code, reason),
        }
    }

    fn finish(&self, _out: &mut Outbox) {
        let mut st = self.0.lock();
        let now = Instant::now();
        st.io.end_at = Some((st.r1.out.total(), now));
        for g in &st.members.guests {
            let mut gs = g.lock();
            gs.io.end_at = Some((gs.r1.out.total(), now));
            drop(gs);
            g.output.notify_waiters();
        }
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
                let Some((end, ended_at)) = st.io.end_at else { return Step::Wait(None) };
                // Every attached device that joined has the end too (or lingered).
                let guests_done = st.members.guests.iter().all(|g| {
                    let gs = g.lock();
                    gs.conn.attached.is_none() || gs.io.end_at.is_some_and(|(n, _)| gs.r1.out.acked() >= n)
                });
                let done = match &st.conn.attached {
                    _ if st.members.left => guests_done,
                    Some(a) if a.r1 => st.r1.out.acked() >= end && guests_done,
                    // The plain stream was taken whole.
                    Some(_) => st.warm.plain_done,
                    // Nobody to deliver to, unless a resume may still come for it.
                    None => !(st.conn.resumable || hub.kind == HubKind::Resumable),
                };
                if done {
                    return Step::Ready(true);
                }
                let since = st.conn.attached.as_ref().map(|a| a.since).or_else(|| {
                    st.members.guests.iter().any(|g| g.lock().conn.attached.is_some()).then_some(ended_at)
                });
                match since {
                    Some(since) => {
                        let at = since.max(ended_at) + linger;
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

    fn info(&self) -> Option<Arc<SessionInfo>> {
        Some(self.0.info.clone())
    }

    fn presence(&self) -> Presence {
        let hub = Arc::downgrade(&self.0);
        Box::new(move || {
            hub.upgrade().is_some_and(|h| {
                h.attached_now.load(std::sync::atomic::Ordering::Relaxed)
                    || (h.lock().members.joined && h.any_attached())
            })
        })
    }

    fn observe(&self, requests: &Arc<Requests>, tap: Option<&Arc<dyn Tap>>) {
        let _ = self.0.requests.set(requests.clone());
        if let Some(t) = tap {
            let _ = self.0.tap.set(t.clone());
        }
    }
}

/// Where the agent's output goes: the hub's replay log. Writes wait for room
/// (acks make room), whether a client is attached or not: an agent whose
/// client is away is held still until it comes back or the grace runs out.
#[derive(Debug)]
pub struct Outbox {
    pub(super) hub: Arc<Hub>,
}

impl crate::serve::pump::RunSink for Outbox {
    /// The run goes into the log as it is, sharing the pump's read buffer:
    /// the agent's output is not copied once more on its way (the buffer is
    /// shared by the runs read into it, so what the log pins is about what it
    /// counts; see `thunderbolt_shared::ndjson::READ_ROOM_DIVISOR`).
    fn write_run(&mut self, run: Run) -> impl Future<Output = io::Result<()>> + Send {
        let hub = self.hub.clone();
        std::future::poll_fn(move |cx| Outbox::push(&hub, cx, &run.bytes, Some(&run)).map_ok(|_| ()))
    }
}

impl Outbox {
    /// Puts one run of whole lines into the log, once there is room; `owned`
    /// is `buf` as a `Bytes` to keep as it is (else it is copied), with what
    /// the pump's check saw of its lines.
    fn push(
        hub: &Arc<Hub>,
        cx: &mut Context<'_>,
        buf: &[u8],
        owned: Option<&Run>,
    ) -> Poll<io::Result<usize>> {
        let mut st = hub.lock();
        if let Some(g) = &st.gone {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::BrokenPipe, g.why.clone())));
        }
        if hub.kind == HubKind::Warm {
            // A resumable session that may come back keeps what it is sent.
            let attached = st.conn.attached.is_some() || st.conn.resumable;
            for line in thunderbolt_shared::ndjson::lines(buf) {
                let head = jsonrpc::peek_head(&line[..line.len().min(OVERSIZE_PEEK)]);
                match (head.kind, head.id, attached) {
                    (Kind::Request, Some(id), true) => {
                        st.warm.pending.insert(id);
                    }
                    (Kind::Request, Some(id), false) => {
                        let _ = hub.inject.send(jsonrpc::client_gone(&id).into());
                    }
                    (_, _, false) => st.warm.dropped += 1,
                    _ => {}
                }
            }
            if !attached {
                return Poll::Ready(Ok(buf.len()));
            }
        }
        // The controller's log (an observer's skips what does not fit, see
        // `devices::feed`). And for the attached connection to take what it
        // was given (`UNSENT_MAX`).
        let held = hub.held(&st);
        let unsent = st.conn.sent_mark.map_or(0, |m| st.r1.out.pushed_bytes().saturating_sub(m));
        if (held > 0 && held + buf.len() > hub.cfg.buffer)
            || (unsent > 0 && unsent + buf.len() as u64 > super::hub::UNSENT_MAX)
        {
            st.conn.writer = Some(cx.waker().clone());
            if st.conn.attached.is_none() && hub.kind == HubKind::Resumable {
                debug!(
                    peer = %hub.peer,
                    session = hub.short(),
                    "the resume buffer is full ({held} bytes held) and the client is away: the agent waits"
                );
            }
            return Poll::Pending;
        }
        // The pump writes whole lines only: each write is one run of frames.
        let (mut run, mut seen) = match owned {
            Some(r) => (r.bytes.clone(), Some((r.lines, r.flagged))),
            None => (Bytes::copy_from_slice(buf), None),
        };
        // Taking the session back after a restart: the agent's answers to the
        // bridge's own calls, and the history it streams, are not the client's
        // (filtered once the run is taken: a write that waits for room comes again).
        if let Some(r) = st.restart.restoring.as_mut() {
            match r.filter(run) {
                None => return Poll::Ready(Ok(buf.len())),
                Some(kept) => {
                    run = kept;
                    seen = None;
                }
            }
        }
        let (lines, names_an_id) = seen
            .unwrap_or_else(|| (memchr::memchr_iter(b'\n', &run).count() as u64, jsonrpc::names_an_id(&run)));
        let routes =
            if hub.kind == HubKind::Resumable { hub.route_answers(&mut st, &run, names_an_id) } else { None };
        if !st.members.left && !st.leaving {
            let waited = Hub::first_is_waited_for(&st);
            let view = match &routes {
                None => Some((run.clone(), lines)),
                Some(r) => r.view(0),
            };
            if let Some((run, lines)) = view {
                super::devices::feed(&mut st, hub.cfg.buffer, &run, lines, waited);
            }
        }
        if let Some(asked) = st.restart.asked.as_mut() {
            Hub::note_asked(asked, &run);
        }
        st.journal_output(&run);
        let guests = if hub.kind == HubKind::Resumable {
            hub.share_output(&mut st, &run, lines, names_an_id, routes.as_ref());
            (!st.members.guests.is_empty()).then(|| st.members.guests.clone())
        } else {
            None
        };
        st.io.last_output = Some(Instant::now());
        drop(st);
        hub.output.notify_waiters();
        // The first device's writer first: the others' copies follow it.
        for g in guests.iter().flatten() {
            g.output.notify_waiters();
        }
        if let Some(r) = routes {
            r.tell_turns_ended();
        }
        Poll::Ready(Ok(buf.len()))
    }
}

impl AsyncWrite for Outbox {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Outbox::push(&self.hub, cx, buf, None)
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
