//! One admitted connection: its stream, its agent process, and their lifecycle.
//!
//! Lifecycle is 1:1, and every way it ends is bounded in time:
//! - the agent ends (closes its stdout, or exits): we finish our send stream so
//!   its last response is never truncated, wait (bounded) until the peer has
//!   acknowledged everything, then close with code 2 and how the agent ended
//!   (`agent exited (code N)`, `agent killed by signal N (NAME)`, then for an
//!   agent that failed ` — ` and its last stderr line). An agent that
//!   exited while a process it started still holds its stdout, or that closed
//!   its stdin but keeps running, is given a short, named time and then cut off;
//! - the peer goes away (or is revoked, or the bridge shuts down): the agent is
//!   terminated and reaped.
//!
//! Either way the agent's whole process group is killed at the end (whatever it
//! left running goes too), the agent is reaped and its slot freed. Bad frames
//! never end a session: the pump answers them (see [`crate::serve::pump`]).

use std::{future::Future, sync::Arc, time::Duration};

use bytes::Bytes;
use iroh::endpoint::{Connection, RecvStream, SendStream, VarInt};
use thunderbolt_shared::{
    close::{self, AgentEnd},
    ndjson::MAX_FRAME_LEN,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    sync::{mpsc, OwnedSemaphorePermit},
    time::Instant,
};
use tokio_util::{sync::CancellationToken, task::AbortOnDropHandle};
use tracing::Instrument;
use tracing::{debug, info, warn};

use crate::{
    limits,
    serve::agent::{self, AgentProcess, Launcher},
    serve::pump::{self, PumpError},
    serve::requests::Requests,
    serve::stderr::Stderr,
    serve::taps::{Observers, Presence, Tap, TapSource},
};

/// Closes `conn` as a refusal with one of the contract's reasons.
pub fn refuse(conn: &Connection, reason: &str) {
    conn.close(VarInt::from_u32(close::CLOSE_CODE_REFUSED), reason.as_bytes());
}

/// The peer's side of a session as the session core sees it: one plain
/// connection, or a resumable session that outlives its connections
/// ([`crate::serve::hub`]).
pub trait Link: Send + Sync {
    /// Where the agent's output goes.
    type Out: pump::RunSink + 'static;
    /// Resolves when the peer is gone for good, with why.
    fn gone(&self) -> impl Future<Output = String> + Send;
    /// Why the peer went away, once it did and said so.
    fn gone_reason(&self) -> Option<String>;
    /// Ends the session towards the peer with a close code and reason.
    fn close(&self, code: u32, reason: &str);
    /// The agent's output is all in `out`: tell the peer nothing more comes.
    fn finish(&self, out: &mut Self::Out);
    /// Resolves with true once the peer holds everything written to `out`, or
    /// with false when it gave up waiting: a peer attached for `linger`
    /// without taking the end is not waited for longer (a link whose peer
    /// may be between connections waits for it within its own bounds).
    fn delivered(&self, out: &mut Self::Out, linger: Duration) -> impl Future<Output = bool> + Send;
    /// The agent's stdin is closed (it cannot hear the peer any more). A link
    /// whose contract ends the session then does so (wss); by default the
    /// session goes on until the agent ends.
    fn input_closed(&self) {}
    /// The session as `thunderbolt status` shows it (whose it is, its id,
    /// its agent's pid): what its observers are opened with.
    fn info(&self) -> Option<Arc<SessionInfo>> {
        None
    }
    /// Where the ACP session ids the client names are noted: a plain
    /// link's, whose files go when its connection does. A hub notes them
    /// itself, for every device on it.
    fn names_sessions_into(&self) -> Option<Arc<SessionInfo>> {
        None
    }
    /// Whether a client is attached now, asked when the agent needs one (a
    /// plain connection is attached for as long as the session lives).
    fn presence(&self) -> Presence {
        Box::new(|| true)
    }
    /// The session's record of the peer's requests in flight, for a link
    /// whose peers change (a warm agent's next client did not send them), and
    /// its tap, for a link that can tell it the client went away.
    fn observe(&self, _requests: &Arc<Requests>, _tap: Option<&Arc<dyn Tap>>) {}
}

/// What `thunderbolt status` shows of a session beside its connection.
#[derive(Debug)]
pub struct SessionInfo {
    /// Short and unique among the bridge's sessions: what `thunderbolt kick` takes.
    pub id: String,
    /// The agent it runs.
    pub agent: crate::serve::AgentName,
    pub peer: iroh::EndpointId,
    pub started: std::time::SystemTime,
    /// The agent process's pid; 0 before it started.
    pid: std::sync::atomic::AtomicU32,
    /// What looks at its lines, and answers the agent for the client from a
    /// notice (set once its agent runs).
    observers: std::sync::OnceLock<std::sync::Weak<Observers>>,
    /// Taken back after the bridge restarted (from its journal).
    restored: std::sync::atomic::AtomicBool,
    /// The ACP session ids its client named (a few, bounded): what a plain
    /// session's end takes its files folders for.
    acp_sessions: std::sync::Mutex<Vec<String>>,
}

impl SessionInfo {
    pub fn new(id: String, agent: crate::serve::AgentName, peer: iroh::EndpointId) -> Arc<Self> {
        Arc::new(Self {
            id,
            agent,
            peer,
            started: std::time::SystemTime::now(),
            pid: 0.into(),
            observers: std::sync::OnceLock::new(),
            restored: false.into(),
            acp_sessions: Default::default(),
        })
    }

    /// Notes the ACP session ids a run of the client's lines names.
    pub fn note_acp_sessions(&self, run: &[u8], names_an_id: bool) {
        let mut seen = self.acp_sessions.lock().unwrap_or_else(|p| p.into_inner());
        crate::serve::sessions::devices::acp_sessions::note_acp_sessions(&mut seen, run, names_an_id);
    }

    /// The ACP session ids its client named.
    pub fn acp_sessions(&self) -> Vec<String> {
        self.acp_sessions.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The running session's observers (to answer the agent from a notice).
    pub fn observers(&self) -> Option<Arc<Observers>> {
        self.observers.get()?.upgrade()
    }

    pub fn pid(&self) -> Option<u32> {
        Some(self.pid.load(std::sync::atomic::Ordering::Relaxed)).filter(|p| *p != 0)
    }

    /// Whether the session was taken back after the bridge restarted.
    pub fn restored(&self) -> bool {
        self.restored.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn set_restored(&self) {
        self.restored.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn set_pid(&self, pid: Option<u32>) {
        self.pid.store(pid.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }
}

/// A session that is exactly one connection (`thunderbolt/<p>/0`).
pub struct Plain(pub Connection, pub Option<Arc<SessionInfo>>);

impl Link for Plain {
    type Out = SendStream;

    fn gone(&self) -> impl Future<Output = String> + Send {
        let conn = self.0.clone();
        async move { conn.closed().await.to_string() }
    }

    fn gone_reason(&self) -> Option<String> {
        self.0.close_reason().map(|r| r.to_string())
    }

    fn close(&self, code: u32, reason: &str) {
        self.0.close(VarInt::from_u32(code), reason.as_bytes());
    }

    fn info(&self) -> Option<Arc<SessionInfo>> {
        self.1.clone()
    }

    fn names_sessions_into(&self) -> Option<Arc<SessionInfo>> {
        self.1.clone()
    }

    fn finish(&self, out: &mut SendStream) {
        let _ = out.finish();
    }

    async fn delivered(&self, out: &mut SendStream, linger: Duration) -> bool {
        matches!(tokio::time::timeout(linger, out.stopped()).await, Ok(Ok(_)))
    }
}

/// Settings every session shares.
#[derive(Debug)]
pub struct SessionConfig {
    /// Starts each session's agent.
    pub agent: Arc<dyn Launcher>,
    pub max_frame: usize,
    pub term_grace: Duration,
    pub finish_linger: Duration,
    /// Resumable sessions, unless switched off.
    pub resume: Option<crate::serve::sessions::ResumeConfig>,
    /// `--keep-warm`: plain sessions' agents outlive their connection this long.
    pub keep_warm: Option<Duration>,
    /// The longest an agent runs with nothing attached (a hosted agent's
    /// `idle_stop`), whatever the grace or keep-warm window say.
    pub idle_stop: Option<Duration>,
    /// What observes its sessions (the owner's notices), when anything does.
    pub taps: Option<Arc<dyn TapSource>>,
}

impl SessionConfig {
    pub fn new(agent: impl Launcher + 'static) -> Self {
        Self {
            agent: Arc::new(agent),
            max_frame: MAX_FRAME_LEN,
            term_grace: limits::AGENT_TERM_GRACE,
            finish_linger: limits::FINISH_LINGER,
            resume: None,
            keep_warm: None,
            idle_stop: None,
            taps: None,
        }
    }
}

/// How a session ended, for the log.
#[derive(Debug)]
pub enum End {
    /// The agent ended; `None` when its status could not be read.
    AgentEnded(Option<AgentEnd>),
    PeerGone(String),
    Refused(String),
    Shutdown,
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::AgentEnded(Some(e)) => write!(f, "{e}"),
            End::AgentEnded(None) => write!(f, "agent ended"),
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
    info: Option<Arc<SessionInfo>>,
) -> End {
    let peer = conn.remote_id().fmt_short().to_string();
    let input = pump::ByteSource::new(recv, cfg.max_frame);
    run_on(Plain(conn, info), send, input, &peer, cfg, permit, shutdown).await
}

/// Runs the agent for a session's `link`: its output goes to `out`, its input
/// comes from `input`.
pub async fn run_on<L: Link>(
    link: L,
    out: L::Out,
    input: impl pump::Source + 'static,
    peer: &str,
    cfg: Arc<SessionConfig>,
    permit: OwnedSemaphorePermit,
    shutdown: CancellationToken,
) -> End {
    let peer = peer.to_string();
    let agent::Started { stdin, stdout, stderr, mut process } = match cfg.agent.start() {
        Ok(c) => c,
        Err(e) => {
            warn!(peer = %peer, "failed to spawn '{}': {e}", cfg.agent.argv0());
            let reason = close::failed_to_spawn(&cfg.agent.argv0());
            link.close(close::CLOSE_CODE_REFUSED, &reason);
            return End::Refused(reason);
        }
    };
    let pid = process.id();
    if let Some(info) = link.info() {
        info.set_pid(pid);
    }
    info!(peer = %peer, pid, "agent started: {}", cfg.agent.redacted());
    let mut stderr = stderr.map(|e| Stderr::spawn(e, peer.clone()));
    let agent = Agent { stdin, stdout, process: process.as_mut(), stderr: stderr.as_mut() };
    let end = drive(&link, out, input, agent, &cfg, &peer, &shutdown).await;
    process.terminate(cfg.term_grace).await;
    process.clean_up();
    drop(permit);
    if let Some(stderr) = stderr {
        // What the agent wrote last is worth a moment; a process that escaped
        // the group and holds stderr open is not worth more.
        stderr.drain(limits::STDERR_DRAIN).await;
    }
    info!(peer = %peer, pid, "session ended: {end}");
    end
}

/// The running agent as [`drive`] uses it.
struct Agent<'a, I, O> {
    stdin: I,
    stdout: O,
    process: &'a mut dyn AgentProcess,
    stderr: Option<&'a mut Stderr>,
}

/// Pumps both directions until the session's end, then ends it towards the peer.
async fn drive<L: Link, I, O>(
    link: &L,
    send: L::Out,
    recv: impl pump::Source + 'static,
    agent: Agent<'_, I, O>,
    cfg: &SessionConfig,
    peer: &str,
    shutdown: &CancellationToken,
) -> End
where
    I: AsyncWrite + Unpin + Send + 'static,
    O: AsyncRead + Unpin + Send,
{
    let Agent { stdin, stdout, process: child, stderr } = agent;
    let (reply_tx, reply_rx) = mpsc::channel::<Bytes>(REPLY_QUEUE);
    let (agent_tx, agent_rx) = mpsc::channel::<Bytes>(REPLY_QUEUE);
    let info = link.info();
    let tap = cfg.taps.as_ref().zip(info.as_ref()).map(|(t, i)| t.open(i, link.presence()));
    let methods = cfg.taps.as_ref().and_then(|t| t.methods());
    let observers = Arc::new(Observers::new(info.as_ref().map(|i| i.peer), methods, tap));
    observers.answer_into(agent_tx.clone());
    if let Some(i) = &info {
        let _ = i.observers.set(Arc::downgrade(&observers));
    }
    if let Some(i) = link.names_sessions_into() {
        observers.names_into(i);
    }
    let requests = observers.requests.clone();
    link.observe(&requests, observers.tap());

    // Peer → agent runs on its own: its normal end (peer finished sending) is not
    // the end of the session; only its errors are.
    let max = cfg.max_frame;
    let (inbound_err_tx, mut inbound_err) = mpsc::channel::<PumpError>(1);
    let inbound_observers = observers.clone();
    let inbound_peer = peer.to_string();
    let _inbound = AbortOnDropHandle::new(tokio::spawn(
        async move {
            let mut stdin = stdin;
            if let Err(e) = pump::peer_to_agent(
                recv,
                &mut stdin,
                reply_tx,
                agent_rx,
                max,
                &inbound_peer,
                &inbound_observers,
            )
            .await
            {
                let _ = inbound_err_tx.send(e).await;
            }
        }
        // The agent's log prefix (`agent{name=…}`) goes with it.
        .in_current_span(),
    ));

    let stop_reading = CancellationToken::new();
    let outbound =
        pump::agent_to_peer(stdout, send, reply_rx, agent_tx, max, peer, stop_reading.clone(), &observers);
    tokio::pin!(outbound);

    let mut status: Option<Option<AgentEnd>> = None;
    let mut exited_at: Option<Instant> = None;
    // Once set, the agent's output is cut off at this instant.
    let mut cut_off: Option<Instant> = None;
    let mut send = loop {
        let deadline = async {
            match cut_off {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => {
                link.close(close::CLOSE_CODE_REFUSED, close::REASON_SHUTTING_DOWN);
                return End::Shutdown;
            }
            why = link.gone() => return End::PeerGone(why),
            Some(e) = inbound_err.recv() => match e {
                PumpError::Write(..) => {
                    debug!(peer = %peer, "the agent's stdin is closed");
                    link.input_closed();
                    cut_off.get_or_insert(Instant::now() + limits::AGENT_EXIT_AFTER_EOF);
                }
                e => return peer_gone(link, e),
            },
            s = child.wait(), if status.is_none() => {
                status = Some(s);
                exited_at = Some(Instant::now());
                let drain = Instant::now() + limits::STDOUT_DRAIN_AFTER_EXIT;
                cut_off = Some(cut_off.map_or(drain, |c| c.min(drain)));
            }
            res = &mut outbound => match res {
                Ok(send) => break send,
                Err(e) => return peer_gone(link, e),
            },
            _ = deadline => {
                match status {
                    Some(_) => warn!(
                        peer = %peer,
                        "the agent exited but its stdout is still open (held by a process it started); \
                         ending the session"
                    ),
                    None => warn!(
                        peer = %peer,
                        "the agent closed its stdin but kept running for {:?}; ending it",
                        limits::AGENT_EXIT_AFTER_EOF
                    ),
                }
                cut_off = None;
                stop_reading.cancel();
            }
        }
    };

    // Everything the agent said is handed to the stream. With no request of
    // the peer's unanswered, finish at once so the peer gets it all, then learn
    // how the agent ended; else learn that first (at once, normally: an agent
    // closes its stdout by exiting) and answer each request with it.
    let answer_first = !requests.is_empty();
    if !answer_first {
        link.finish(&mut send);
    }
    let status = match status {
        Some(s) => s,
        None => {
            let wait = tokio::time::timeout(limits::AGENT_EXIT_AFTER_EOF, child.wait());
            match or_ended(link, shutdown, wait).await {
                Err(end) => return end,
                Ok(Ok(s)) => s,
                Ok(Err(_)) => {
                    debug!(peer = %peer, "the agent closed its stdout but did not exit; ending it");
                    child.terminate(cfg.term_grace).await;
                    child.try_wait().flatten()
                }
            }
        }
    };
    // An agent that failed is told with its last stderr line, where it says
    // why. The pipe closes with the agent, normally; one held by a process it
    // started is waited for no longer after the exit than a drain.
    let status = match (status, stderr) {
        (Some(end), Some(stderr)) if !end.is_success() => {
            let until = exited_at.unwrap_or_else(Instant::now) + limits::STDERR_DRAIN;
            match or_ended(link, shutdown, stderr.last_line(until)).await {
                Err(end) => return end,
                Ok(line) => Some(end.with_stderr(line)),
            }
        }
        (status, _) => status,
    };
    if let (Some(end), Some(tap)) = (&status, observers.tap()) {
        tap.agent_ended(end);
    }
    let how = status.map_or_else(|| "agent ended".to_string(), |s| s.reason());
    if answer_first {
        info!(peer = %peer, "answering {} request(s) the agent left unanswered ({how})", requests.len());
        let answers = requests.answer_all(status.as_ref());
        use tokio::io::AsyncWriteExt;
        match or_ended(link, shutdown, send.write_all(&answers)).await {
            Err(end) => return end,
            Ok(Err(e)) => debug!(peer = %peer, "could not write the answers: {e}"),
            Ok(Ok(())) => {}
        }
        link.finish(&mut send);
    }

    // Let the peer take the data, then tell it how the agent ended (a peer
    // that closes first, as clients that predate the close did, ends it too).
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => {
            link.close(close::CLOSE_CODE_REFUSED, close::REASON_SHUTTING_DOWN);
            return End::Shutdown;
        }
        _ = link.gone() => {}
        delivered = link.delivered(&mut send, cfg.finish_linger) => {
            if !delivered {
                debug!(peer = %peer, "peer did not take the agent's last output within {:?}", cfg.finish_linger);
            }
            link.close(close::CLOSE_CODE_AGENT_ENDED, &how);
        }
    }
    End::AgentEnded(status)
}

/// Runs `fut` unless the bridge shuts down (the peer is told) or the peer
/// leaves first; those end the session.
async fn or_ended<T>(
    link: &impl Link,
    shutdown: &CancellationToken,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, End> {
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => {
            link.close(close::CLOSE_CODE_REFUSED, close::REASON_SHUTTING_DOWN);
            Err(End::Shutdown)
        }
        why = link.gone() => Err(End::PeerGone(why)),
        v = fut => Ok(v),
    }
}

/// The peer went away; the connection's close reason (e.g. the client's
/// `client closed`) says more than the stream error that noticed it.
fn peer_gone(link: &impl Link, e: PumpError) -> End {
    End::PeerGone(link.gone_reason().unwrap_or_else(|| e.to_string()))
}

/// Bridge-written lines queued for either side (parse and size errors). A small
/// bound: a peer flooding garbage is slowed down, not buffered.
const REPLY_QUEUE: usize = 64;
