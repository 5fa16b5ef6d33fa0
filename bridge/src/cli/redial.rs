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
    resume::{self, escape_counted, Control, Event, Receiver},
    resume_client::{AfterClose, ClientSession, WelcomeError},
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

mod dial;
mod ending;
mod notices;
mod streams;
mod watch;

use dial::*;
use ending::*;
use notices::*;
use streams::*;
use watch::*;

use crate::{
    cli::connect::describe_close,
    limits,
    net::{ClientEndpoint, RelayCheck},
    signals::Terminate,
};

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

/// The session as this client keeps it: the protocol's side of it
/// ([`ClientSession`]: frames, acks, token, hello and welcome; `Deref`s to
/// it), and what is this client's own.
#[derive(Debug, Default)]
struct State {
    r1: ClientSession<Instant>,
    /// The ticket names several relays of the bridge's: the one our path goes
    /// through is watched, to move to another at once when it dies (with one,
    /// or n0's, there is nowhere to move to faster than the idle timeout).
    relay_checks: bool,
}

thunderbolt_shared::holds_client_session!(State, r1, Instant);

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
    let mut input = LocalInput::new(local_in);
    let mut output = local_out;
    let alpn = resume::resume_alpn(protocol);
    let relay_checks = target.endpoint_addr().relay_urls().count() > 1;
    let st = RefCell::new(State { r1: ClientSession::new(join), relay_checks });
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
                let grace = st.borrow().redial_budget();
                if st.borrow().token().is_none() {
                    warn!("connection lost before the bridge's welcome ({why}); dialing again for up to {grace:?}");
                } else {
                    warn!("connection lost ({why}); reconnecting (the bridge keeps the session {grace:?})");
                }
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
