//! One admitted connection: its stream, its agent process, and their lifecycle.
//!
//! Lifecycle is 1:1 and ends one of three ways:
//! - the agent exits: we finish our send stream (so its last response is never
//!   truncated), wait for the peer to take the data and close, and are done;
//! - the peer goes away (or is revoked, or the bridge shuts down): the agent is
//!   terminated and reaped;
//! - the peer breaks the framing (a line over the cap): the connection is closed
//!   with a reason and the agent terminated.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use iroh::endpoint::{Connection, RecvStream, SendStream, VarInt};
use thunderbolt_shared::{close, ndjson::MAX_FRAME_LEN};
use tokio::{
    io::AsyncReadExt,
    process::Child,
    sync::{mpsc, OwnedSemaphorePermit},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    agent::{self, AgentCommand},
    limits,
    pump::{self, PumpError},
};

/// Closes `conn` as a refusal with one of the contract's reasons.
pub fn refuse(conn: &Connection, reason: &str) {
    conn.close(VarInt::from_u32(close::CLOSE_CODE_REFUSED), reason.as_bytes());
}

/// Settings every session shares.
#[derive(Debug)]
pub struct SessionConfig {
    pub agent: AgentCommand,
    pub max_frame: usize,
    pub term_grace: Duration,
    pub finish_linger: Duration,
}

impl SessionConfig {
    pub fn new(agent: AgentCommand) -> Self {
        Self {
            agent,
            max_frame: MAX_FRAME_LEN,
            term_grace: limits::AGENT_TERM_GRACE,
            finish_linger: limits::FINISH_LINGER,
        }
    }
}

/// How a session ended, for the log.
#[derive(Debug)]
pub enum End {
    AgentExited(Option<i32>),
    PeerGone(String),
    Refused(String),
    Shutdown,
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::AgentExited(Some(c)) => write!(f, "agent exited with code {c}"),
            End::AgentExited(None) => write!(f, "agent exited"),
            End::PeerGone(why) => write!(f, "peer gone ({why})"),
            End::Refused(reason) => write!(f, "closed: {reason}"),
            End::Shutdown => write!(f, "bridge shutting down"),
        }
    }
}

/// Runs the agent for an admitted connection whose stream is open. `permit`
/// holds the agent slot until the process is reaped.
pub async fn run(
    conn: Connection,
    send: SendStream,
    recv: RecvStream,
    cfg: Arc<SessionConfig>,
    permit: OwnedSemaphorePermit,
    shutdown: CancellationToken,
) -> End {
    let peer = conn.remote_id().fmt_short().to_string();
    let mut child = match cfg.agent.spawn() {
        Ok(c) => c,
        Err(e) => {
            warn!(peer = %peer, "failed to spawn '{}': {e}", cfg.agent.argv0());
            let reason = close::failed_to_spawn(&cfg.agent.argv0());
            refuse(&conn, &reason);
            return End::Refused(reason);
        }
    };
    let pid = child.id();
    info!(peer = %peer, pid, "agent started: {}", cfg.agent.redacted());
    let end = pump_until_end(&conn, send, recv, &mut child, &cfg, &peer, &shutdown).await;
    agent::terminate(&mut child, cfg.term_grace).await;
    drop(permit);
    info!(peer = %peer, pid, "session ended: {end}");
    end
}

async fn pump_until_end(
    conn: &Connection,
    send: SendStream,
    recv: RecvStream,
    child: &mut Child,
    cfg: &SessionConfig,
    peer: &str,
    shutdown: &CancellationToken,
) -> End {
    let stdin = child.stdin.take().expect("stdin piped");
    let stdout = child.stdout.take().expect("stdout piped");
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(log_stderr(stderr, peer.to_string()));
    }
    let (reply_tx, reply_rx) = mpsc::channel::<Bytes>(REPLY_QUEUE);

    // Peer → agent runs on its own: its normal end (peer finished sending) is not
    // the end of the session; only its errors are.
    let max = cfg.max_frame;
    let (inbound_err_tx, mut inbound_err) = mpsc::channel::<PumpError>(1);
    let inbound = tokio::spawn(async move {
        // The agent's stdin stays open until the error is queued: closing it lets
        // the agent exit, and that must not be mistaken for a normal end.
        let mut stdin = stdin;
        if let Err(e) = pump::peer_to_agent(recv, &mut stdin, reply_tx, max).await {
            let _ = inbound_err_tx.send(e).await;
        }
        drop(stdin);
    });
    let _inbound_guard = AbortOnDrop(inbound);

    let outbound = pump::agent_to_peer(stdout, send, reply_rx, max, peer);
    tokio::pin!(outbound);

    tokio::select! {
        // Errors first: when the peer broke the framing, the agent exiting as a
        // consequence is not the session's normal end.
        biased;
        Some(e) = inbound_err.recv() => inbound_failed(e, conn, outbound, child, cfg, peer).await,
        res = &mut outbound => {
            let mut send = match res {
                Ok(send) => send,
                Err(e @ PumpError::TooLong(..)) => return frame_too_large(conn, peer, e),
                Err(e) => return peer_gone(conn, e),
            };
            // Agent closed stdout: finish at once so the peer gets everything, give
            // the agent a moment to exit on its own, then the peer time to close.
            let _ = send.finish();
            let status = tokio::time::timeout(limits::AGENT_EXIT_AFTER_EOF, child.wait()).await;
            let code = status.ok().and_then(|s| s.ok()).and_then(|s| s.code());
            let linger = async {
                let _ = send.stopped().await;
                conn.closed().await;
            };
            if tokio::time::timeout(cfg.finish_linger, linger).await.is_err() {
                debug!(peer = %peer, "peer did not close within {:?} after the agent ended", cfg.finish_linger);
            }
            End::AgentExited(code)
        }
        err = conn.closed() => End::PeerGone(err.to_string()),
        _ = shutdown.cancelled() => {
            refuse(conn, close::REASON_SHUTTING_DOWN);
            End::Shutdown
        }
    }
}

/// A line over the frame cap: the session ends with a reason.
fn frame_too_large(conn: &Connection, peer: &str, e: PumpError) -> End {
    warn!(peer = %peer, "{e}; ending the session");
    refuse(conn, close::REASON_FRAME_TOO_LARGE);
    End::Refused(close::REASON_FRAME_TOO_LARGE.into())
}

/// The peer → agent direction failed.
async fn inbound_failed<F>(
    e: PumpError,
    conn: &Connection,
    outbound: std::pin::Pin<&mut F>,
    child: &mut Child,
    cfg: &SessionConfig,
    peer: &str,
) -> End
where
    F: std::future::Future<Output = Result<SendStream, PumpError>>,
{
    match e {
        e @ PumpError::TooLong(..) => frame_too_large(conn, peer, e),
        // Agent stdin closed: the agent is exiting; let outbound finish the session.
        PumpError::Write(..) => {
            if let Ok(mut send) = outbound.await {
                let _ = send.finish();
                let _ = tokio::time::timeout(cfg.finish_linger, conn.closed()).await;
            }
            End::AgentExited(child.try_wait().ok().flatten().and_then(|s| s.code()))
        }
        e => peer_gone(conn, e),
    }
}

/// The peer went away; the connection's close reason (e.g. the client's
/// `client closed`) says more than the stream error that noticed it.
fn peer_gone(conn: &Connection, e: PumpError) -> End {
    End::PeerGone(conn.close_reason().map(|r| r.to_string()).unwrap_or_else(|| e.to_string()))
}

/// Parse errors queued for the peer while the agent's output is being written.
/// A small bound: a peer flooding garbage is slowed down, not buffered.
const REPLY_QUEUE: usize = 64;

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Agent stderr goes to our log, line by line, tagged with the peer; never to
/// the peer. Lines are cut at [`limits::MAX_STDERR_LINE`] so memory stays bounded.
async fn log_stderr(mut stderr: tokio::process::ChildStderr, peer: String) {
    let mut buf: Vec<u8> = Vec::with_capacity(limits::MAX_STDERR_LINE);
    let mut chunk = vec![0u8; limits::MAX_STDERR_LINE];
    let emit = |line: &[u8]| {
        let text = String::from_utf8_lossy(line);
        info!(peer = %peer, "agent stderr: {}", text.trim_end());
    };
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                if !buf.is_empty() {
                    emit(&buf);
                }
                return;
            }
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            emit(&buf[..pos]);
            buf.drain(..=pos);
        }
        if buf.len() >= limits::MAX_STDERR_LINE {
            emit(&buf);
            buf.clear();
        }
    }
}
