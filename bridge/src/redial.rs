//! `connect`'s side of the resumable protocol (`thunderbolt/<p>/r1`, specified
//! in [`thunderbolt_shared::resume`]): one session over as many connections as
//! it takes.
//!
//! Local input is read into whole lines by one task and local output written
//! by another; both outlive the connections, so what sits on our stdio sees
//! one unbroken stream. Each line sent is kept until the bridge acknowledges
//! it and resent after a reconnect from where the bridge's welcome says it
//! stopped; each line received is counted, and the count is what our hello
//! asks the bridge to resume from. A lost connection (anything but a close
//! from the bridge) is redialed with a bounded backoff for as long as the
//! bridge keeps the session (the grace its welcome announced).

use std::{cell::RefCell, time::Duration};

use anyhow::{anyhow, bail, Result};
use bytes::{Bytes, BytesMut};
use iroh::{
    endpoint::{Connection, ConnectionError, RecvStream, SendStream, VarInt},
    Endpoint,
};
use thunderbolt_shared::{
    close::{self, AgentEnd, Refusal},
    resume::{
        self, escape_run, AckPolicy, Control, Event, Receiver, ReplayLog, ACK_DELAY_MS, MAX_CONTROL_LINE,
    },
    Protocol, Target,
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::{mpsc, Notify},
    time::Instant,
};
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info, warn};

use crate::{connect::describe_close, limits, signals::Terminate};

/// Most bytes of our input held until the bridge acknowledges them: past it we
/// stop reading input (the local client waits) until acks make room. The
/// bridge's default buffer for the other direction.
pub const SEND_BUFFER: usize = limits::RESUME_BUFFER;

/// First pause between redials; doubled after each failed attempt.
const REDIAL_FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Longest pause between redials: a path that comes back is found within
/// about this long.
const REDIAL_MAX_BACKOFF: Duration = Duration::from_secs(2);

/// One redial attempt's limit: a dial that has not reached the bridge by now
/// is abandoned for a fresh one (a path may have come back meanwhile).
const REDIAL_ATTEMPT: Duration = Duration::from_secs(5);

/// How long the bridge's welcome may take after our hello (one round trip).
const WELCOME_TIMEOUT: Duration = Duration::from_secs(10);

/// How a resumable session ended.
#[derive(Debug)]
pub enum Finish {
    /// The agent ended and everything it said was delivered; how, if the bridge said.
    AgentEnded(Option<AgentEnd>),
    /// We were told to stop (a signal) and closed the session.
    Stopped,
}

/// Why one connection stopped carrying the session.
enum ConnEnd {
    Lost(String),
    Closed(ConnectionError),
    Stopped,
    LocalOutputClosed,
}

#[derive(Debug, Default)]
struct State {
    /// Our frames, kept until acknowledged.
    out: ReplayLog,
    /// The bridge's frames delivered to our output.
    ack: AckPolicy,
    ack_due: bool,
    token: Option<String>,
    grace: Duration,
    /// Our input ended after this many frames.
    eof_at: Option<u64>,
    /// The agent ended after this many frames.
    end_at: Option<u64>,
}

impl State {
    fn all_delivered(&self) -> bool {
        self.end_at == Some(self.ack.received())
    }
}

/// Runs a session over `first` (a connection that negotiated r1), redialing
/// `target` after losses.
pub async fn run(
    ep: &Endpoint,
    target: &Target,
    protocol: &Protocol,
    first: Connection,
    local_in: Box<dyn AsyncRead + Unpin + Send>,
    local_out: Box<dyn AsyncWrite + Unpin + Send>,
    term: &mut Terminate,
) -> Result<Finish> {
    let (in_tx, mut in_rx) = mpsc::channel::<Bytes>(4);
    let _reader = AbortOnDropHandle::new(tokio::spawn(read_lines(local_in, in_tx)));
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(16);
    let writer = tokio::spawn(write_out(local_out, out_rx));
    let alpn = resume::resume_alpn(protocol);
    let st = RefCell::new(State::default());
    let mut conn = first;
    let mut attached_before = false;
    let result = loop {
        let end = carry(&conn, &st, &mut in_rx, &out_tx, term, attached_before, protocol).await;
        attached_before = attached_before || st.borrow().token.is_some();
        match end {
            Ok(ConnEnd::Stopped) => {
                conn.close(
                    VarInt::from_u32(close::CLOSE_CODE_CLIENT),
                    close::REASON_CLIENT_CLOSED.as_bytes(),
                );
                break Ok(Finish::Stopped);
            }
            Ok(ConnEnd::LocalOutputClosed) => {
                conn.close(
                    VarInt::from_u32(close::CLOSE_CODE_CLIENT),
                    close::REASON_CLIENT_CLOSED.as_bytes(),
                );
                break Err(anyhow!("our output was closed: the session is closed"));
            }
            Ok(ConnEnd::Closed(err)) => break closed(&err, &st.borrow(), protocol),
            Err(e) => {
                conn.close(
                    VarInt::from_u32(close::CLOSE_CODE_CLIENT),
                    close::REASON_CLIENT_CLOSED.as_bytes(),
                );
                break Err(e);
            }
            Ok(ConnEnd::Lost(why)) => {
                if st.borrow().all_delivered() {
                    // Everything arrived; only the bridge's word on how the agent ended was lost.
                    break Ok(Finish::AgentEnded(None));
                }
                if st.borrow().token.is_none() {
                    break Err(anyhow!("connection lost before the session started: {why}"));
                }
                let grace = st.borrow().grace;
                warn!("connection lost ({why}); reconnecting (the bridge keeps the session {grace:?})");
                let redial = redial(ep, target, &alpn, Instant::now() + grace);
                tokio::pin!(redial);
                let next = tokio::select! {
                    c = &mut redial => c,
                    which = term.recv() => {
                        info!("{which}: giving up the session");
                        break Ok(Finish::Stopped);
                    }
                };
                match next {
                    Ok(c) => conn = c,
                    Err(e) => break Err(e),
                }
            }
        }
    };
    // Whatever was delivered reaches our output before we go.
    drop(out_tx);
    let _ = writer.await;
    result
}

/// The bridge closed the connection: how the session ended.
fn closed(err: &ConnectionError, st: &State, protocol: &Protocol) -> Result<Finish> {
    if let ConnectionError::ApplicationClosed(ac) = err {
        let code = ac.error_code.into_inner();
        if let Some(end) = AgentEnd::from_close(code, &ac.reason) {
            return Ok(Finish::AgentEnded(Some(end)));
        }
        if Refusal::from_close(code, &ac.reason) == Some(Refusal::UnknownSession) {
            if st.all_delivered() {
                return Ok(Finish::AgentEnded(None));
            }
            bail!("the session is gone: the bridge no longer holds it (its grace ran out, or the bridge restarted)");
        }
    }
    Err(anyhow!(describe_close(err, protocol)))
}

/// Redials until a connection with the resumable protocol is made, or `deadline`.
async fn redial(ep: &Endpoint, target: &Target, alpn: &[u8], deadline: Instant) -> Result<Connection> {
    let mut backoff = REDIAL_FIRST_BACKOFF;
    let mut last = String::from("no attempt made");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("could not reach the bridge again while it kept the session (last attempt: {last})");
        }
        match tokio::time::timeout(left.min(REDIAL_ATTEMPT), ep.connect(target.endpoint_addr(), alpn)).await {
            Ok(Ok(c)) => return Ok(c),
            Ok(Err(e)) => {
                let text = format!("{e:#}");
                if close::is_alpn_refusal(&text) {
                    bail!(
                        "the bridge no longer offers resumable sessions (it was restarted with --no-resume?)"
                    );
                }
                last = text;
            }
            Err(_) => last = "timed out".into(),
        }
        debug!("redial failed ({last}); next in {backoff:?}");
        tokio::time::sleep(backoff.min(deadline.saturating_duration_since(Instant::now()))).await;
        backoff = (backoff * 2).min(REDIAL_MAX_BACKOFF);
    }
}

/// Carries the session over `conn` until it ends or is lost.
#[allow(clippy::too_many_arguments)]
async fn carry(
    conn: &Connection,
    st: &RefCell<State>,
    in_rx: &mut mpsc::Receiver<Bytes>,
    out_tx: &mpsc::Sender<Bytes>,
    term: &mut Terminate,
    resumed: bool,
    protocol: &Protocol,
) -> Result<ConnEnd> {
    let (mut send, mut recv) = match conn.open_bi().await {
        Ok(s) => s,
        Err(e) => return Ok(lost_or_closed(conn, e.to_string())),
    };
    let hello = {
        let s = st.borrow();
        Control::Hello { session: s.token.clone(), received: s.ack.received() }
    };
    if let Err(e) = send.write_all(&hello.encode()).await {
        return Ok(lost_or_closed(conn, e.to_string()));
    }
    let first = tokio::select! {
        r = tokio::time::timeout(WELCOME_TIMEOUT, read_line(&mut recv)) => r,
        err = conn.closed() => return Ok(classify(err)),
    };
    let (line, leftover) = match first {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return Ok(lost_or_closed(conn, e)),
        Err(_) => return Ok(ConnEnd::Lost("the bridge did not answer our hello".into())),
    };
    let Some(Control::Welcome { session, received, grace_ms }) = Control::parse(&line) else {
        bail!(
            "the bridge answered with something other than a welcome: it does not speak {}",
            String::from_utf8_lossy(&resume::resume_alpn(protocol))
        );
    };
    let replay = {
        let mut s = st.borrow_mut();
        if s.token.as_ref().is_some_and(|t| *t != session) {
            bail!("the bridge resumed a different session");
        }
        s.out.ack(received).map_err(|e| anyhow!("the bridge's resume point is wrong: {e}"))?;
        s.ack.resumed();
        s.ack_due = false;
        s.token = Some(session);
        s.grace = Duration::from_millis(grace_ms);
        let mut replay = s.out.since(received).expect("acked up to here");
        if let Some(n) = s.eof_at {
            replay.push(Control::Eof(n).encode());
        }
        replay
    };
    if resumed {
        info!("reconnected: session resumed (resending {} chunk(s))", replay.len());
    } else {
        info!(bridge = %conn.remote_id().fmt_short(), "connected (resumable session)");
    }

    let ack_wake = Notify::new();
    let room = Notify::new();
    let upload = upload(&mut send, st, in_rx, replay, &ack_wake, &room);
    let download = download(&mut recv, leftover, st, out_tx, &ack_wake, &room);
    tokio::pin!(upload, download);
    let end = tokio::select! {
        biased;
        err = conn.closed() => classify(err),
        r = &mut download => match r {
            Err(Down::LocalClosed) => ConnEnd::LocalOutputClosed,
            Err(Down::Protocol(e)) => return Err(anyhow!(e)),
            Err(Down::Lost(e)) => lost_or_closed(conn, e),
        },
        r = &mut upload => match r {
            Err(Up::Lost(e)) => lost_or_closed(conn, e),
        },
        which = term.recv() => {
            info!("{which}: closing the session");
            ConnEnd::Stopped
        }
    };
    Ok(end)
}

/// The bridge's close ends the session; anything else (a timeout, a reset,
/// a path gone) is a loss to recover from.
fn classify(err: ConnectionError) -> ConnEnd {
    match err {
        ConnectionError::ApplicationClosed(_) => ConnEnd::Closed(err),
        e => ConnEnd::Lost(e.to_string()),
    }
}

/// A connection error that came with the bridge's close is a close; any
/// other is a loss.
fn lost_or_closed(conn: &Connection, why: String) -> ConnEnd {
    match conn.close_reason() {
        Some(err @ ConnectionError::ApplicationClosed(_)) => ConnEnd::Closed(err),
        _ => ConnEnd::Lost(why),
    }
}

enum Up {
    Lost(String),
}

/// Our side of the stream: the replay first, then new input, acks and eof.
async fn upload(
    send: &mut SendStream,
    st: &RefCell<State>,
    in_rx: &mut mpsc::Receiver<Bytes>,
    mut replay: Vec<Bytes>,
    ack_wake: &Notify,
    room: &Notify,
) -> Result<std::convert::Infallible, Up> {
    let lost = |e: iroh::endpoint::WriteError| Up::Lost(e.to_string());
    send.write_all_chunks(&mut replay).await.map_err(lost)?;
    loop {
        let ack = {
            let mut s = st.borrow_mut();
            if s.ack_due {
                s.ack_due = false;
                s.ack.ack()
            } else {
                None
            }
        };
        if let Some(a) = ack {
            send.write_all(&a.encode()).await.map_err(lost)?;
            continue;
        }
        let (has_room, input_open, ack_pending) = {
            let s = st.borrow();
            (s.out.bytes() < SEND_BUFFER, s.eof_at.is_none(), s.ack.pending())
        };
        tokio::select! {
            biased;
            _ = ack_wake.notified() => {}
            r = in_rx.recv(), if has_room && input_open => {
                let mut chunks = Vec::with_capacity(2);
                {
                    let mut s = st.borrow_mut();
                    match r {
                        Some(run) => {
                            s.out.push(run.clone());
                            chunks.push(run);
                            // Acks ride along with our messages.
                            if s.ack.pending() {
                                s.ack_due = false;
                                chunks.extend(s.ack.ack().map(|a| a.encode()));
                            }
                        }
                        None => {
                            let n = s.out.total();
                            s.eof_at = Some(n);
                            debug!("our input ended after {n} frames");
                            chunks.push(Control::Eof(n).encode());
                        }
                    }
                }
                send.write_all_chunks(&mut chunks).await.map_err(lost)?;
            }
            _ = room.notified(), if !has_room => {}
            _ = tokio::time::sleep(Duration::from_millis(ACK_DELAY_MS)), if ack_pending => {
                st.borrow_mut().ack_due = true;
            }
        }
    }
}

enum Down {
    Lost(String),
    LocalClosed,
    Protocol(String),
}

/// The bridge's side: frames to our output (counted once delivered to the
/// writer), acks, the agent's end.
async fn download(
    recv: &mut RecvStream,
    leftover: Bytes,
    st: &RefCell<State>,
    out_tx: &mpsc::Sender<Bytes>,
    ack_wake: &Notify,
    room: &Notify,
) -> Result<std::convert::Infallible, Down> {
    let mut rx = Receiver::new(limits::MAX_FRAME);
    rx.push(&leftover);
    let mut events = Vec::new();
    loop {
        rx.drain(&mut events);
        for ev in events.drain(..) {
            match ev {
                Event::Data { bytes, frames } => {
                    let len = bytes.len();
                    let permit = out_tx.reserve().await.map_err(|_| Down::LocalClosed)?;
                    permit.send(bytes);
                    let mut s = st.borrow_mut();
                    if s.ack.took(frames, len) || s.all_delivered() {
                        s.ack_due = true;
                        ack_wake.notify_one();
                    }
                }
                Event::Control(Some(Control::Ack(n))) => {
                    st.borrow_mut()
                        .out
                        .ack(n)
                        .map_err(|e| Down::Protocol(format!("bad ack from the bridge: {e}")))?;
                    room.notify_one();
                }
                Event::Control(Some(Control::End(n))) => {
                    let mut s = st.borrow_mut();
                    debug!("the agent ended after {n} frames");
                    s.end_at = Some(n);
                    if s.all_delivered() {
                        s.ack_due = true;
                        ack_wake.notify_one();
                    }
                }
                Event::Control(_) => {}
            }
        }
        let buf = rx.buf_mut();
        buf.reserve(limits::READ_CHUNK);
        match recv.read_buf(buf).await {
            // The bridge never finishes its stream mid-session: wait for the close.
            Ok(0) => std::future::pending::<()>().await,
            Ok(_) => {}
            Err(e) => return Err(Down::Lost(e.to_string())),
        }
    }
}

/// Reads the first line (a control line, short); returns it and what followed.
pub async fn read_line(recv: &mut RecvStream) -> Result<(Bytes, Bytes), String> {
    let mut buf = BytesMut::with_capacity(MAX_CONTROL_LINE);
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

/// Local input, cut into runs of whole lines. At the end an unterminated last
/// line gets its newline (as the bridge's plain protocol does).
async fn read_lines(mut input: Box<dyn AsyncRead + Unpin + Send>, tx: mpsc::Sender<Bytes>) {
    let mut buf = BytesMut::with_capacity(limits::READ_CHUNK);
    loop {
        buf.reserve(limits::READ_CHUNK);
        let n = match input.read_buf(&mut buf).await {
            Ok(n) => n,
            Err(e) => {
                warn!("reading our input failed: {e}; ending it");
                0
            }
        };
        let run = if n == 0 {
            if !buf.is_empty() && buf.last() != Some(&b'\n') {
                buf.extend_from_slice(b"\n");
            }
            buf.split().freeze()
        } else {
            match memchr::memrchr(b'\n', &buf) {
                Some(i) => buf.split_to(i + 1).freeze(),
                None => continue,
            }
        };
        if !run.is_empty() && tx.send(escape_run(run)).await.is_err() {
            return;
        }
        if n == 0 {
            return;
        }
    }
}

/// Local output: everything delivered, in order, flushed as it comes.
async fn write_out(mut out: Box<dyn AsyncWrite + Unpin + Send>, mut rx: mpsc::Receiver<Bytes>) {
    while let Some(b) = rx.recv().await {
        if out.write_all(&b).await.is_err() || out.flush().await.is_err() {
            // Dropping the receiver tells the download side.
            return;
        }
    }
    let _ = out.shutdown().await;
}
