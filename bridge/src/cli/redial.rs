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
use iroh::endpoint::{Connection, ConnectionError, RecvStream, SendStream, VarInt};
use thunderbolt_shared::{
    close::{self, AgentEnd, Refusal},
    ndjson::room_for_read,
    resume::{self, escape_counted, Control, Event, Receiver, ACK_DELAY_MS},
    resume_client::{ClientSession, WelcomeError},
    Protocol, Target,
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::Notify,
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use thunderbolt_shared::silence::{self, Silence, Verdict};

use crate::{
    cli::connect::describe_close,
    limits,
    net::{ClientEndpoint, RelayCheck},
    signals::Terminate,
};

/// Most bytes of our input held until the bridge acknowledges them: past it we
/// stop reading input (the local client waits) until acks make room; a run
/// larger than this goes out alone, once everything before it was
/// acknowledged. The protocol's rule ([`resume::CLIENT_SEND_BUFFER`]): it is
/// what lets the bridge always read as far as our acks.
pub const SEND_BUFFER: usize = resume::CLIENT_SEND_BUFFER;

/// First pause between starting redials; doubled after each start.
const REDIAL_FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Longest pause between starting redials: a path that comes back is found
/// within about this long (plus one handshake).
const REDIAL_MAX_BACKOFF: Duration = Duration::from_secs(1);

/// One redial attempt's limit: covers a handshake over a slow relay path with
/// a retransmission or two.
const REDIAL_ATTEMPT: Duration = Duration::from_secs(5);

/// Redial attempts in flight at once (each is one handshake's state): past
/// it, the oldest gives way to the next (a fresh attempt's Initial goes out
/// at once; an old one waits for QUIC's retransmission).
const REDIAL_IN_FLIGHT: usize = 4;

/// A redial that has not got through from the current endpoint within this
/// goes on from a fresh one (once): whatever holds the old endpoint's sends
/// back (see [`ClientEndpoint`]) holds no fresh one.
const REDIAL_RENEW_AFTER: Duration = Duration::from_secs(2);

/// How long the bridge's welcome may take after our hello (one round trip).
const WELCOME_TIMEOUT: Duration = Duration::from_secs(10);

/// How a resumable session ended.
#[derive(Debug)]
pub enum Finish {
    /// The agent ended and everything it said was delivered; how, if the bridge said.
    AgentEnded(Option<AgentEnd>),
    /// A warm agent's bridge let us go: we are done, the agent runs on.
    KeptWarm,
    /// We were told to stop (this signal) and closed the session.
    Interrupted(&'static str),
    /// Our input ended while other devices were on the session: we left it,
    /// with everything we were sent; it goes on for them.
    Left,
}

/// Why one connection stopped carrying the session.
enum ConnEnd {
    Lost(String),
    /// The bridge lost the connection but answered a fresh one (this one).
    Moved(Connection, String),
    /// The relay its path went through died (it was closed by us).
    RelayGone(String),
    Protocol(String),
    Closed(ConnectionError),
    Stopped(&'static str),
    LocalOutputClosed,
}

/// The session as this client keeps it: the protocol's side of it
/// ([`ClientSession`]: frames, acks, token, hello and welcome; `Deref`s to
/// it), and what is this client's own.
#[derive(Debug, Default)]
struct State {
    r1: ClientSession,
    /// The ticket names several relays of the bridge's: the one our path goes
    /// through is watched, to move to another at once when it dies (with one,
    /// or n0's, there is nowhere to move to faster than the idle timeout).
    relay_checks: bool,
    /// The agent ended after this many frames.
    end_at: Option<u64>,
}

thunderbolt_shared::holds_client_session!(State, r1);

impl State {
    fn all_delivered(&self) -> bool {
        self.end_at == Some(self.ack.received())
    }
}

/// Runs a session over `first` (a connection that negotiated r1), redialing
/// `target` after losses; `join` joins another device's session first.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    ep: &ClientEndpoint,
    target: &Target,
    protocol: &Protocol,
    first: Connection,
    local_in: Box<dyn AsyncRead + Unpin + Send>,
    local_out: Box<dyn AsyncWrite + Unpin + Send>,
    term: &mut Terminate,
    join: Option<Control>,
) -> Result<Finish> {
    let mut input = LocalInput { r: local_in, buf: BytesMut::new(), done: false, held: None };
    let mut output = local_out;
    let alpn = resume::resume_alpn(protocol);
    let relay_checks = target.endpoint_addr().relay_urls().count() > 1;
    let st = RefCell::new(State { r1: ClientSession::new(join), relay_checks, ..State::default() });
    let mut conn = first;
    let mut attached_before = false;
    let mut check = RelayCheck::new(&ep.current());
    let result = loop {
        let end =
            carry(&conn, &st, &mut input, &mut output, term, attached_before, protocol, &check, ep, target)
                .await;
        attached_before = attached_before || st.borrow().token().is_some();
        match end {
            Ok(ConnEnd::Stopped(which)) => {
                conn.close(
                    VarInt::from_u32(close::CLOSE_CODE_CLIENT),
                    close::REASON_CLIENT_CLOSED.as_bytes(),
                );
                break Ok(Finish::Interrupted(which));
            }
            Ok(ConnEnd::Protocol(e)) => {
                conn.close(
                    VarInt::from_u32(close::CLOSE_CODE_CLIENT),
                    close::REASON_CLIENT_CLOSED.as_bytes(),
                );
                break Err(anyhow!("the bridge broke the resume protocol: {e}"));
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
            Ok(end @ (ConnEnd::Lost(_) | ConnEnd::RelayGone(_))) => {
                let (why, relay_gone) = match end {
                    ConnEnd::RelayGone(why) => (why, true),
                    ConnEnd::Lost(why) => (why, false),
                    _ => unreachable!(),
                };
                if st.borrow().all_delivered() {
                    // Everything arrived; only the bridge's word on how the agent ended was lost.
                    break Ok(Finish::AgentEnded(None));
                }
                if st.borrow().token().is_none() {
                    break Err(anyhow!("connection lost before the session started: {why}"));
                }
                let grace = st.borrow().grace();
                warn!("connection lost ({why}); reconnecting (the bridge keeps the session {grace:?})");
                // The old endpoint may hold a queue for the dead relay that
                // holds back every relay's sends: redial from a fresh one.
                let renewed = relay_gone && renew(ep, &why).await;
                let redial = redial(ep, target, &alpn, Instant::now() + grace, renewed);
                tokio::pin!(redial);
                let next = tokio::select! {
                    c = &mut redial => c,
                    which = term.recv() => {
                        info!("{which}: giving up the session");
                        break Ok(Finish::Interrupted(which));
                    }
                };
                match next {
                    Ok(c) => conn = c,
                    Err(e) => break Err(e),
                }
                check = RelayCheck::new(&ep.current());
            }
            Ok(ConnEnd::Moved(fresh, why)) => {
                if st.borrow().all_delivered() {
                    fresh.close(
                        VarInt::from_u32(close::CLOSE_CODE_CLIENT),
                        close::REASON_CLIENT_CLOSED.as_bytes(),
                    );
                    break Ok(Finish::AgentEnded(None));
                }
                warn!("connection lost ({why}); resuming over the new one");
                conn = fresh;
                check = RelayCheck::new(&ep.current());
            }
        }
    };
    let _ = output.shutdown().await;
    result
}

/// The bridge closed the connection: how the session ended.
fn closed(err: &ConnectionError, st: &State, protocol: &Protocol) -> Result<Finish> {
    if crate::cli::connect::kept_warm(err) {
        info!("done: the agent stays warm for the next connection");
        return Ok(Finish::KeptWarm);
    }
    if let ConnectionError::ApplicationClosed(ac) = err {
        let code = ac.error_code.into_inner();
        if code == close::CLOSE_CODE_CLIENT as u64 && &ac.reason[..] == close::REASON_LEFT.as_bytes() {
            return Ok(Finish::Left);
        }
        if let Some(end) = AgentEnd::from_close(code, &ac.reason) {
            return Ok(Finish::AgentEnded(Some(end)));
        }
        if let (Some(Control::Join { id, .. }), Some(Refusal::UnknownSession)) =
            (st.joining(), Refusal::from_close(code, &ac.reason))
        {
            bail!(
                "no session '{id}' this device may join: `thunderbolt sessions <ticket>` lists those it may"
            );
        }
        if let Some(gone) = Refusal::from_close(code, &ac.reason).filter(Refusal::is_session_gone) {
            if st.all_delivered() {
                return Ok(Finish::AgentEnded(None));
            }
            bail!("{}", gone.describe());
        }
    }
    Err(anyhow!(describe_close(err, protocol)))
}

/// A fresh endpoint for `ep` (see [`ClientEndpoint`]); whether it was made.
async fn renew(ep: &ClientEndpoint, why: &str) -> bool {
    match ep.renew(why).await {
        Ok(_) => true,
        Err(e) => {
            warn!("could not make a fresh endpoint ({e:#}); redialing from the old one");
            false
        }
    }
}

/// Redials until a connection with the resumable protocol is made, or
/// `deadline`. Attempts are staggered and overlap: a handshake whose first
/// packet went out while the path was still down waits for QUIC's
/// retransmission (a second or more), while a fresh attempt started after
/// the path came back gets through in one round trip. Each attempt goes to
/// every address of the ticket at once (each of its relays, its direct
/// addresses). Not through after [`REDIAL_RENEW_AFTER`], it goes on from a
/// fresh endpoint, unless `renewed` already.
async fn redial(
    ep: &ClientEndpoint,
    target: &Target,
    alpn: &[u8],
    deadline: Instant,
    mut renewed: bool,
) -> Result<Connection> {
    let mut attempts = tokio::task::JoinSet::new();
    let mut in_flight = std::collections::VecDeque::new();
    let mut gap = REDIAL_FIRST_BACKOFF;
    let started = Instant::now();
    let mut next_start = started;
    let mut last = String::from("no attempt made");
    loop {
        let now = Instant::now();
        if now >= deadline {
            bail!("could not reach the bridge again while it kept the session (last attempt: {last})");
        }
        if !renewed && now >= started + REDIAL_RENEW_AFTER {
            // Once, whether or not a fresh one could be made.
            renew(ep, &format!("no redial got through within {REDIAL_RENEW_AFTER:?}")).await;
            renewed = true;
            // The old endpoint's attempts went with it.
            attempts.abort_all();
            in_flight.clear();
            next_start = now;
        }
        if now >= next_start {
            in_flight.retain(|a: &tokio::task::AbortHandle| !a.is_finished());
            if in_flight.len() >= REDIAL_IN_FLIGHT {
                if let Some(oldest) = in_flight.pop_front() {
                    oldest.abort();
                }
            }
            let (ep, addr, alpn) = (ep.current(), target.endpoint_addr(), alpn.to_vec());
            in_flight.push_back(
                attempts.spawn(
                    async move { tokio::time::timeout(REDIAL_ATTEMPT, ep.connect(addr, &alpn)).await },
                ),
            );
            next_start = now + gap;
            gap = (gap * 2).min(REDIAL_MAX_BACKOFF);
        }
        let mut wake = next_start.min(deadline);
        if !renewed {
            wake = wake.min(started + REDIAL_RENEW_AFTER);
        }
        tokio::select! {
            Some(r) = attempts.join_next(), if !attempts.is_empty() => match r {
                Ok(Ok(Ok(c))) => return Ok(c),
                Ok(Ok(Err(e))) => {
                    let text = format!("{e:#}");
                    if close::is_alpn_refusal(&text) {
                        bail!("the bridge no longer offers resumable sessions (it was restarted with --no-resume?)");
                    }
                    debug!("redial failed: {text}");
                    last = text;
                }
                Ok(Err(_)) => last = "timed out".into(),
                Err(e) if e.is_cancelled() => {}
                Err(e) => last = e.to_string(),
            },
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Datagrams `conn` has received (relayed ones too): anything the bridge
/// sends on it, its acknowledgements included, counts.
fn heard(conn: &Connection) -> u64 {
    conn.stats().udp_rx.datagrams
}

/// Resolves with a fresh connection to the bridge, and why, once `conn` is
/// dead while the bridge itself answers: a bridge killed (a crash, an OOM
/// kill, a power cut) and started again at once forgets the connection, and
/// cannot tell us (QUIC's stateless reset needs a key that outlives the
/// process; iroh makes a new one each run), so `conn` would wait for its idle
/// timeout. A bridge that stays silent is asked for a word first; only a
/// connection that hears nothing back is redialed beside, and one that hears
/// again before a fresh one gets through carries on (a path that came back).
async fn bridge_forgot(
    conn: &Connection,
    st: &RefCell<State>,
    wake: &Notify,
    ep: &ClientEndpoint,
    target: &Target,
    alpn: &[u8],
) -> (Connection, String) {
    let start = Instant::now();
    let clock = move || Instant::now() - start;
    let mut w = Silence::new(clock(), heard(conn));
    loop {
        let silent_for = watch(conn, &mut w, start, st, wake, false).await;
        let silent_since = Instant::now() - silent_for;
        debug!("nothing heard from the bridge for {silent_for:?}: dialing it afresh beside");
        // Never a fresh endpoint here: that would close `conn` with the old one.
        let deadline = Instant::now() + st.borrow().grace().max(REDIAL_ATTEMPT);
        tokio::select! {
            biased;
            _ = watch(conn, &mut w, start, st, wake, true) => debug!("the bridge is heard again: carrying on"),
            r = redial(ep, target, alpn, deadline, true) => match r {
                Ok(fresh) => {
                    let why = format!(
                        "the bridge answers a new connection but nothing on this one for {:.1} s: it lost it (restarted?)",
                        silent_since.elapsed().as_secs_f64()
                    );
                    return (fresh, why);
                }
                // Unreachable as well: the loss, if it is one, is the idle timeout's to call.
                Err(e) => {
                    debug!("a fresh dial beside a silent connection failed: {e:#}");
                    std::future::pending::<()>().await;
                }
            },
        }
    }
}

/// The round-trip time of `conn`'s selected path (none yet: zero, the
/// least wait [`Silence`] gives a probe applies).
fn selected_rtt(conn: &Connection) -> Duration {
    conn.paths().iter().find(|p| p.is_selected()).map(|p| p.rtt()).unwrap_or_default()
}

/// Watches `conn` ([`Silence`]): asks the bridge for a word when it is
/// silent, and returns once the connection is suspect, with how long it was
/// silent; `until_heard` instead returns once it is heard again.
/// Its clock counts from `start`.
async fn watch(
    conn: &Connection,
    w: &mut Silence,
    start: Instant,
    st: &RefCell<State>,
    wake: &Notify,
    until_heard: bool,
) -> Duration {
    let clock = move || Instant::now() - start;
    loop {
        tokio::time::sleep(silence::TICK).await;
        match w.tick(clock(), heard(conn), selected_rtt(conn)) {
            Verdict::Probe => {
                st.borrow_mut().probe_due = true;
                wake.notify_one();
            }
            Verdict::Suspect { silent_for } if !until_heard => return silent_for,
            Verdict::Fine if until_heard => return Duration::ZERO,
            _ => {}
        }
    }
}

/// Carries the session over `conn` until it ends or is lost.
#[allow(clippy::too_many_arguments)]
async fn carry(
    conn: &Connection,
    st: &RefCell<State>,
    input: &mut LocalInput,
    output: &mut (dyn AsyncWrite + Unpin + Send),
    term: &mut Terminate,
    resumed: bool,
    protocol: &Protocol,
    check: &RelayCheck,
    ep: &ClientEndpoint,
    target: &Target,
) -> Result<ConnEnd> {
    let _path_log = crate::paths::log_changes(conn, conn.remote_id().fmt_short().to_string());
    let (mut send, mut recv) = match conn.open_bi().await {
        Ok(s) => s,
        Err(e) => return Ok(lost_or_closed(conn, e.to_string())),
    };
    let hello = st.borrow().hello();
    if let Err(e) = send.write_all(&hello.encode()).await {
        return Ok(lost_or_closed(conn, e.to_string()));
    }
    let first = tokio::select! {
        r = tokio::time::timeout(WELCOME_TIMEOUT, crate::serve::sessions::read_line(&mut recv)) => r,
        err = conn.closed() => return Ok(classify(err)),
    };
    let (line, leftover) = match first {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return Ok(lost_or_closed(conn, e)),
        Err(_) => return Ok(ConnEnd::Lost("the bridge did not answer our hello".into())),
    };
    let replay = match st.borrow_mut().welcome(&line) {
        Ok(w) => w.replay,
        Err(WelcomeError::NotAWelcome) => bail!(
            "the bridge answered with something other than a welcome: it does not speak {}",
            String::from_utf8_lossy(&resume::resume_alpn(protocol))
        ),
        Err(e) => bail!("{e}"),
    };
    if resumed {
        info!("reconnected: session resumed (resending {} chunk(s))", replay.len());
    } else {
        info!(bridge = %conn.remote_id().fmt_short(), "connected (resumable session)");
    }

    let ack_wake = Notify::new();
    let room = Notify::new();
    // The download writes our output itself (no hand-off on the reply path);
    // it is never dropped mid-write, only stopped at its next read, so a line
    // is either delivered and counted or neither.
    let stop = CancellationToken::new();
    let alpn = resume::resume_alpn(protocol);
    let upload = upload(&mut send, st, input, replay, &ack_wake, &room);
    let download = download(&mut recv, leftover, st, output, &ack_wake, &room, &stop, resumed);
    tokio::pin!(upload, download);
    let end = tokio::select! {
        biased;
        err = conn.closed() => classify(err),
        r = &mut download => return Ok(down_end(conn, r)),
        r = &mut upload => match r {
            Err(Up::Lost(e)) => lost_or_closed(conn, e),
        },
        // A relay that died takes the path through it along: redial now
        // (through another relay), not at the idle timeout.
        (_, why) = crate::paths::relay_gone(conn, check), if st.borrow().relay_checks => {
            // Closed here (the bridge, unreachable through it, takes it as a
            // loss): its dead path must not stay the one our next dial uses.
            conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), b"path lost");
            ConnEnd::RelayGone(why)
        }
        // A bridge that forgot the connection (killed and started again)
        // answers a fresh one: move there now, not at the idle timeout.
        (fresh, why) = bridge_forgot(conn, st, &ack_wake, ep, target, &alpn) => {
            conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), b"connection lost by the bridge");
            ConnEnd::Moved(fresh, why)
        }
        which = term.recv() => {
            info!("{which}: closing the session");
            return Ok(ConnEnd::Stopped(which));
        }
    };
    stop.cancel();
    tokio::select! {
        r = &mut download => {
            if let ConnEnd::LocalOutputClosed = down_end(conn, r) {
                return Ok(ConnEnd::LocalOutputClosed);
            }
        }
        which = term.recv() => {
            info!("{which}: closing the session");
            return Ok(ConnEnd::Stopped(which));
        }
    }
    Ok(end)
}

fn down_end(conn: &Connection, r: Result<std::convert::Infallible, Down>) -> ConnEnd {
    match r {
        Err(Down::LocalClosed) => ConnEnd::LocalOutputClosed,
        Err(Down::Protocol(e)) => {
            warn!("{e}; closing the session");
            ConnEnd::Protocol(e)
        }
        Err(Down::Lost(e)) => lost_or_closed(conn, e),
    }
}

/// The bridge's close ends the session; anything else (a timeout, a reset,
/// a path gone) is a loss to recover from.
fn classify(err: ConnectionError) -> ConnEnd {
    match err {
        ConnectionError::ApplicationClosed(_) => bridge_closed(err),
        e => ConnEnd::Lost(e.to_string()),
    }
}

/// A connection error that came with the bridge's close is a close; any
/// other is a loss.
fn lost_or_closed(conn: &Connection, why: String) -> ConnEnd {
    match conn.close_reason() {
        Some(err @ ConnectionError::ApplicationClosed(_)) => bridge_closed(err),
        _ => ConnEnd::Lost(why),
    }
}

/// The bridge closed the connection: the end of the session, unless it is
/// restarting and keeps the session (then it is redialed like a lost path).
fn bridge_closed(err: ConnectionError) -> ConnEnd {
    if let ConnectionError::ApplicationClosed(ac) = &err {
        let kept =
            Refusal::from_close(ac.error_code.into_inner(), &ac.reason).is_some_and(|r| r.is_session_kept());
        if kept {
            return ConnEnd::Lost("the bridge is restarting and keeps the session".into());
        }
    }
    ConnEnd::Closed(err)
}

enum Up {
    Lost(String),
}

/// Our side of the stream: the replay first, then new input, acks and eof.
async fn upload(
    send: &mut SendStream,
    st: &RefCell<State>,
    input: &mut LocalInput,
    mut replay: Vec<Bytes>,
    ack_wake: &Notify,
    room: &Notify,
) -> Result<std::convert::Infallible, Up> {
    let lost = |e: iroh::endpoint::WriteError| Up::Lost(e.to_string());
    send.write_all_chunks(&mut replay).await.map_err(lost)?;
    // Armed at the first frame awaiting its ack and kept across turns of the
    // loop, so the ack goes out ACK_DELAY_MS after that frame at the latest (a
    // timer made afresh each turn would wait as long as frames kept coming).
    let ack_timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(ack_timer);
    let mut ack_armed = false;
    loop {
        let ack = st.borrow_mut().next_ack();
        if let Some(a) = ack {
            send.write_all(&a.encode()).await.map_err(lost)?;
            continue;
        }
        let (has_room, input_open, ack_pending) = {
            let s = st.borrow();
            let held = s.out.bytes();
            let room = match input.held_len() {
                // A run that does not fit waits until it fits, or goes alone.
                Some(n) => held == 0 || held + n <= SEND_BUFFER,
                None => held < SEND_BUFFER,
            };
            (room, s.eof_at().is_none(), s.ack.pending())
        };
        if !ack_pending {
            ack_armed = false;
        } else if !ack_armed {
            ack_timer.as_mut().reset(tokio::time::Instant::now() + Duration::from_millis(ACK_DELAY_MS));
            ack_armed = true;
        }
        tokio::select! {
            biased;
            _ = ack_wake.notified() => {}
            r = input.next_run(), if has_room && input_open => {
                let mut chunks = Vec::with_capacity(2);
                {
                    let mut s = st.borrow_mut();
                    match r {
                        Some((run, lines)) if s.out.bytes() > 0 && s.out.bytes() + run.len() > SEND_BUFFER => {
                            input.hold(run, lines);
                            continue;
                        }
                        Some((run, lines)) => {
                            s.out.push_counted(run.clone(), lines);
                            chunks.push(run);
                        }
                        None => {
                            let eof = s.input_ended();
                            debug!("our input ended after {} frames", s.out.total());
                            chunks.push(eof.encode());
                        }
                    }
                }
                send.write_all_chunks(&mut chunks).await.map_err(lost)?;
            }
            _ = room.notified(), if !has_room => {}
            _ = &mut ack_timer, if ack_armed => {
                ack_armed = false;
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
#[allow(clippy::too_many_arguments)]
async fn download(
    recv: &mut RecvStream,
    leftover: Bytes,
    st: &RefCell<State>,
    output: &mut (dyn AsyncWrite + Unpin + Send),
    ack_wake: &Notify,
    room: &Notify,
    stop: &CancellationToken,
    resumed: bool,
) -> Result<std::convert::Infallible, Down> {
    let mut rx = Receiver::new(limits::MAX_FRAME);
    rx.push(&leftover);
    let mut events = Vec::new();
    // After a resume the bridge may have restarted: its word on that is said here too.
    let mut watch = if resumed { RESTORED_WATCH_FRAMES } else { 0 };
    // A write per message (a bulk run in one): see `output`.
    let mut output = super::output::Messages::new(output);
    // The frames of one read, between the control lines it held: written as
    // one read, after its control lines are seen (acks are for our upload).
    let mut pieces: Vec<Bytes> = Vec::new();
    loop {
        rx.drain(&mut events);
        let (mut frames, mut len) = (0, 0);
        for ev in events.drain(..) {
            match ev {
                Event::Data { bytes, frames: n } => {
                    say_devices(&bytes);
                    if watch > 0 {
                        watch = watch.saturating_sub(n);
                        if say_restored(&bytes) {
                            watch = 0;
                        }
                    }
                    frames += n;
                    len += bytes.len();
                    pieces.push(bytes);
                }
                Event::Control(Some(Control::Ack(n))) => {
                    st.borrow_mut()
                        .acked(n)
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
                Event::BadControl(bad) => {
                    // What came before it is delivered, as it always was.
                    let _ = output.pieces(&pieces).await;
                    return Err(Down::Protocol(format!("the bridge sent {bad}")));
                }
            }
        }
        if !pieces.is_empty() {
            output.pieces(&pieces).await.map_err(|_| Down::LocalClosed)?;
            pieces.clear();
            let mut s = st.borrow_mut();
            let was_pending = s.ack.pending();
            if s.ack.took(frames, len) || s.all_delivered() {
                s.ack_due = true;
                ack_wake.notify_one();
            } else if !was_pending {
                // The upload side arms its ack timer for the first frame
                // not yet acknowledged: it may be asleep without one.
                ack_wake.notify_one();
            }
        }
        let buf = rx.buf_mut();
        // A whole chunk of room for every read (the bridge keeps a quarter
        // chunk, for its many small sessions: `room_for_read`): a backlog
        // comes in reads as large as the plain path's and goes to our output
        // in as few writes (with a quarter, 14 against 21 KB a write).
        if buf.capacity() - buf.len() < limits::READ_CHUNK {
            buf.reserve(limits::READ_CHUNK);
        }
        let read = tokio::select! {
            r = recv.read_buf(buf) => r,
            _ = stop.cancelled() => return Err(Down::Lost("stopped".into())),
        };
        match read {
            // The bridge never finishes its stream mid-session: wait for the close.
            Ok(0) => {
                stop.cancelled().await;
                return Err(Down::Lost("stopped".into()));
            }
            Ok(_) => {}
            Err(e) => return Err(Down::Lost(e.to_string())),
        }
    }
}

/// How many frames after a resume are looked at for the bridge's word that it
/// restarted (it comes right after what the old agent had written and the
/// client lacked: at most the resume buffer's worth, usually a few).
const RESTORED_WATCH_FRAMES: u64 = 100_000;

/// Says on stderr what a restarted bridge took back, when `run` holds its
/// notification ([`thunderbolt_shared::restart::METHOD_RESTORED`]). Whether it did.
fn say_restored(run: &[u8]) -> bool {
    // Built once: every run is searched for a while after a resume.
    static NEEDLE: std::sync::LazyLock<memchr::memmem::Finder<'static>> = std::sync::LazyLock::new(|| {
        memchr::memmem::Finder::new(thunderbolt_shared::restart::METHOD_RESTORED.as_bytes())
    });
    let Some(at) = NEEDLE.find(run) else { return false };
    let start = memchr::memrchr(b'\n', &run[..at]).map_or(0, |i| i + 1);
    let end = memchr::memchr(b'\n', &run[at..]).map_or(run.len(), |i| at + i);
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&run[start..end]) else { return false };
    if v["method"] != thunderbolt_shared::restart::METHOD_RESTORED {
        return false;
    }
    let p = &v["params"];
    let aborted = p["aborted"].as_array().map_or(0, Vec::len);
    let aborted = match aborted {
        0 => String::new(),
        n => format!("; {n} request(s) in flight answered '{}'", thunderbolt_shared::restart::TURN_ABORTED),
    };
    if let Some(failed) = p["failed"].as_str() {
        warn!("the bridge restarted and cannot continue the session: {failed}{aborted}");
        return true;
    }
    let sessions: Vec<String> = p["sessions"]
        .as_array()
        .map(|s| {
            s.iter()
                .map(|s| {
                    format!(
                        "{} ({})",
                        s["sessionId"].as_str().unwrap_or("?"),
                        s["how"].as_str().unwrap_or("?")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let sessions = if sessions.is_empty() {
        "no ACP session to reload".to_string()
    } else {
        format!("ACP session(s) {}", sessions.join(", "))
    };
    info!("the bridge restarted and took the session back: {sessions}{aborted}");
    true
}

/// Says on stderr what the bridge tells of the other devices on the session
/// (a role that changed, a question another device answered).
fn say_devices(run: &[u8]) {
    use thunderbolt_shared::devices::{notice, Notice, Role};
    // Built once: every run from the bridge is searched.
    static NEEDLE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"_thunderbolt/"));
    if NEEDLE.find(run).is_none() {
        return;
    }
    for line in thunderbolt_shared::ndjson::lines(run) {
        match notice(line) {
            Some(Notice::Role { role: Role::Controller, .. }) => {
                info!("this device controls the session: what you send goes to the agent")
            }
            Some(Notice::Role { role: Role::Observer, controller }) => info!(
                "this device observes the session ({} controls it): your requests are refused, your answers to the agent's questions go on",
                controller.label()
            ),
            Some(Notice::Answered { id, by }) => info!("{} answered the agent's request {id}", by.label()),
            Some(Notice::Prompted { id, by }) => info!("{} sent the agent a prompt (its request {id})", by.label()),
            Some(Notice::TurnEnded { id, by, stop_reason }) => info!(
                "the turn {} started (its request {id}) ended: {}",
                by.label(),
                stop_reason.as_deref().unwrap_or("with an error")
            ),
            Some(Notice::Missed { frames, bytes }) => warn!(
                "this device fell behind the session (it stopped reading) and missed {frames} of the agent's \
                 message(s), {bytes} bytes: the agent did not wait for it; to see them, join again with \
                 --history all (the session keeps its last 1 MiB)"
            ),
            None => {}
        }
    }
}

/// Local input, cut into runs of whole lines. Outlives connections: its
/// buffer keeps a line read in part, and reading is cancel-safe.
struct LocalInput {
    r: Box<dyn AsyncRead + Unpin + Send>,
    buf: BytesMut,
    done: bool,
    /// A run read but not sent yet (it did not fit the send buffer), and its
    /// count of lines.
    held: Option<(Bytes, u64)>,
}

impl LocalInput {
    /// Keeps `run` to be returned by the next [`Self::next_run`].
    fn hold(&mut self, run: Bytes, lines: u64) {
        self.held = Some((run, lines));
    }

    fn held_len(&self) -> Option<usize> {
        self.held.as_ref().map(|(run, _)| run.len())
    }

    /// The next run of whole lines, escaped, with its count of lines; `None`
    /// once the input ended. At the end an unterminated last line gets its
    /// newline (as the plain protocol's bridge does).
    async fn next_run(&mut self) -> Option<(Bytes, u64)> {
        if let Some(run) = self.held.take() {
            return Some(run);
        }
        loop {
            if self.done {
                return None;
            }
            if let Some(i) = memchr::memrchr(b'\n', &self.buf) {
                return Some(escape_counted(self.buf.split_to(i + 1).freeze()));
            }
            room_for_read(&mut self.buf, limits::READ_CHUNK);
            let n = match self.r.read_buf(&mut self.buf).await {
                Ok(n) => n,
                Err(e) => {
                    warn!("reading our input failed: {e}; ending it");
                    0
                }
            };
            if n == 0 {
                self.done = true;
                if !self.buf.is_empty() {
                    self.buf.extend_from_slice(b"\n");
                    return Some(escape_counted(self.buf.split().freeze()));
                }
            }
        }
    }
}
