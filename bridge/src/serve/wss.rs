//! `--transport wss`: the reference's loopback WebSocket transport, so a
//! desktop app that reaches a bridge at `ws://127.0.0.1:<port>/?token=…` works
//! with ours too.
//!
//! Loopback only (it spawns processes), one fresh random token per run, the
//! app's origins only. The HTTP upgrade is checked by hand so every refusal is
//! the plain HTTP status the contract names (404 path, 426 not a WebSocket
//! request, 403 origin, 401 token) and nothing is spawned for any of them;
//! the WebSocket protocol itself is `tokio-websockets`.
//!
//! A session is the iroh one with other framing: each text (or binary) frame
//! is one JSON-RPC message, becomes one line on the agent's stdin, and each
//! line the agent writes becomes one text frame. The session core
//! ([`crate::serve::session`]) runs it unchanged through [`WsLink`], so the checks
//! (JSON, frame cap) and every way a session ends are the same as over iroh;
//! only the close codes are WebSocket ones.

use std::{
    collections::BTreeMap,
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use bytes::{Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use thunderbolt_shared::close::{self, AgentEnd};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::{mpsc, Semaphore},
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;
use tokio_websockets::{CloseCode, Limits, Message};
use tracing::{info, warn};

use crate::serve::{
    pump::Inbound,
    session::{self, Link, SessionConfig},
    throttle::LogBudget,
};
use thunderbolt_shared::ndjson::OVERSIZE_PEEK;

/// Default ports of the reference: ACP 8839, MCP 8840.
pub fn default_port(protocol: &thunderbolt_shared::Protocol) -> u16 {
    if *protocol == thunderbolt_shared::Protocol::mcp() {
        8840
    } else {
        8839
    }
}

/// Origins the Thunderbolt desktop app connects from; `THUNDERBOLT_APP_ORIGIN`
/// adds more (comma-separated).
pub const APP_ORIGINS: [&str; 3] = ["http://localhost:1420", "tauri://localhost", "http://tauri.localhost"];

/// Longest HTTP upgrade request read: browsers send well under 2 KiB.
const MAX_REQUEST: usize = 16 * 1024;

/// Frames queued towards the socket: a slow browser slows the agent, it is not buffered.
const OUT_QUEUE: usize = 64;

/// Most connections waiting for their WebSocket upgrade at once (accepted, the
/// upgrade not yet answered). Any local user can connect to the port, and each
/// connection holds a descriptor (and up to [`MAX_REQUEST`] of request) until
/// its upgrade or its deadline (`--handshake-timeout`): 1100 connections that
/// never sent a byte took every descriptor the bridge had, so no agent could
/// start and no app connect (issue 56). The app opens one at a time; 64 is far
/// beyond that and a small share of the 1024 descriptors a process gets by
/// default. At the cap the oldest waiting connection is closed for the
/// newcomer, rather than the newcomer refused: refusing would let 64 idle
/// connections, renewed at each deadline, lock the app out, where eviction
/// takes a flood at the attacker's own rate (an honest upgrade on loopback is
/// answered within a millisecond of its connection).
pub const MAX_WAITING_UPGRADES: usize = 64;

/// The WebSocket close codes of the contract.
const WS_NORMAL: u16 = 1000;
const WS_GOING_AWAY: u16 = 1001;
const WS_INTERNAL: u16 = 1011;
const WS_OVERLOAD: u16 = 1013;

/// What one run of the wss bridge serves with.
pub struct WssServer {
    pub listener: TcpListener,
    pub token: String,
    pub origins: Vec<String>,
    pub agents: Arc<Semaphore>,
    pub max_agents: usize,
    pub handshake_timeout: Duration,
    pub session: Arc<SessionConfig>,
}

/// Largest frame the WebSocket library takes whole (see `connection`).
fn oversize_limit(max_frame: usize) -> usize {
    max_frame.saturating_mul(2).min(crate::limits::MAX_FRAME)
}

/// A fresh 32-byte token, hex.
pub fn new_token() -> String {
    crate::ids::random_hex(32)
}

/// The allowed origins: the app's, plus `extra` (comma-separated).
pub fn origins(extra: Option<&str>) -> Vec<String> {
    let mut v: Vec<String> = APP_ORIGINS.iter().map(|s| s.to_string()).collect();
    for o in extra.unwrap_or("").split(',').map(str::trim).filter(|o| !o.is_empty()) {
        v.push(o.trim_end_matches('/').to_string());
    }
    v
}

impl WssServer {
    /// Serves until `stop`, then ends every session (agents killed and reaped).
    pub async fn run(self, stop: CancellationToken) {
        let me = Arc::new(self);
        let shutdown = CancellationToken::new();
        let waiting = Arc::new(Waiting::new(MAX_WAITING_UPGRADES));
        let mut tasks = JoinSet::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                r = me.listener.accept() => match r {
                    Ok((stream, from)) => {
                        // Taken here, in the order of accept: the oldest is evicted at the cap.
                        let slot = waiting.enter(from);
                        let (me, shutdown) = (me.clone(), shutdown.clone());
                        tasks.spawn(async move { me.connection(stream, from, slot, shutdown).await });
                    }
                    Err(e) => {
                        warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        info!("shutting down: ending {} connection(s)", tasks.len());
        shutdown.cancel();
        while tasks.join_next().await.is_some() {}
    }

    async fn connection(
        &self,
        mut stream: TcpStream,
        from: std::net::SocketAddr,
        slot: WaitingSlot,
        shutdown: CancellationToken,
    ) {
        let _ = stream.set_nodelay(true);
        let upgrade = tokio::select! {
            r = tokio::time::timeout(self.handshake_timeout, self.upgrade(&mut stream)) => r,
            // Evicted for a newer connection at the cap: closed unanswered (the
            // eviction is logged, with a budget).
            _ = slot.evicted.cancelled() => return,
        };
        match upgrade {
            Ok(Ok(())) => {}
            Ok(Err(refusal)) => {
                info!(%from, "refused: {} {}", refusal.status, refusal.why);
                let _ = stream.write_all(refusal.response().as_bytes()).await;
                let _ = stream.shutdown().await;
                return;
            }
            Err(_) => {
                info!(%from, "dropping connection: {}", close::REASON_HANDSHAKE_TIMEOUT);
                return;
            }
        }
        drop(slot);
        // Frames a little over the cap still reach the pump, which answers them as
        // over iroh (-32600 with their id) and goes on; only a frame past twice
        // the cap (the library must hold a whole frame) ends the socket.
        let limits = Limits::default().max_payload_len(Some(oversize_limit(self.session.max_frame)));
        let ws = tokio_websockets::ServerBuilder::new().limits(limits).serve(stream);
        let peer = from.to_string();
        let Ok(permit) = self.agents.clone().try_acquire_owned() else {
            warn!(%from, "refusing: {} ({} agents running)", close::REASON_AT_CAPACITY, self.max_agents);
            let mut ws = ws;
            let _ = ws
                .send(Message::close(CloseCode::try_from(WS_OVERLOAD).ok(), close::REASON_AT_CAPACITY))
                .await;
            let _ = tokio::time::timeout(Duration::from_secs(2), ws.next()).await;
            return;
        };
        info!(%from, "WebSocket session opened");
        let (link, out, input) = WsLink::start(ws, self.session.max_frame);
        session::run_on(link, out, input, &peer, self.session.clone(), permit, shutdown).await;
    }

    /// Reads and checks the HTTP upgrade request; answers it with 101 when it passes.
    async fn upgrade(&self, stream: &mut TcpStream) -> Result<(), Refusal> {
        let mut buf = BytesMut::with_capacity(2048);
        let (path, headers) = loop {
            if buf.len() > MAX_REQUEST {
                return Err(Refusal::new(431, "Request Header Fields Too Large", "request too large"));
            }
            let n = stream
                .read_buf(&mut buf)
                .await
                .map_err(|e| Refusal::new(400, "Bad Request", &e.to_string()))?;
            if n == 0 {
                return Err(Refusal::new(400, "Bad Request", "connection closed mid-request"));
            }
            let mut hs = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut hs);
            match req.parse(&buf) {
                Ok(httparse::Status::Complete(_)) => {
                    if req.method != Some("GET") {
                        return Err(Refusal::new(405, "Method Not Allowed", "not a GET"));
                    }
                    let path = req.path.unwrap_or("").to_string();
                    let headers: Vec<(String, String)> = req
                        .headers
                        .iter()
                        .map(|h| {
                            (h.name.to_ascii_lowercase(), String::from_utf8_lossy(h.value).trim().to_string())
                        })
                        .collect();
                    break (path, headers);
                }
                Ok(httparse::Status::Partial) => continue,
                Err(e) => return Err(Refusal::new(400, "Bad Request", &e.to_string())),
            }
        };
        let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        let (route, query) = path.split_once('?').unwrap_or((&path, ""));
        if route != "/" {
            return Err(Refusal::new(404, "Not Found", &format!("unknown path {route}")));
        }
        let is_upgrade = header("upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket"))
            && header("connection")
                .is_some_and(|c| c.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")));
        let key = header("sec-websocket-key");
        let (true, Some(key)) = (is_upgrade, key) else {
            return Err(Refusal::new(426, "Upgrade Required", "not a WebSocket upgrade"));
        };
        let origin = header("origin").unwrap_or("");
        if !self.origins.iter().any(|o| o == origin.trim_end_matches('/')) {
            let shown = if origin.is_empty() { "(none)".to_string() } else { origin.to_string() };
            return Err(Refusal::new(403, "Forbidden", &format!("forbidden origin: {shown}")));
        }
        let token = query.split('&').find_map(|kv| kv.strip_prefix("token="));
        match token {
            Some(t) if constant_time_eq(t.as_bytes(), self.token.as_bytes()) => {}
            Some(_) => return Err(Refusal::new(401, "Unauthorized", "invalid token")),
            None => return Err(Refusal::new(401, "Unauthorized", "missing token")),
        }
        let accept = accept_key(key);
        let response = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
        );
        stream
            .write_all(response.as_bytes())
            .await
            .map_err(|e| Refusal::new(400, "Bad Request", &e.to_string()))
    }
}

/// The connections waiting for their upgrade, oldest first, at most `cap`.
struct Waiting {
    cap: usize,
    state: Mutex<WaitingState>,
}

struct WaitingState {
    next: u64,
    /// By arrival: the first is the oldest.
    slots: BTreeMap<u64, (CancellationToken, std::net::SocketAddr, Instant)>,
    /// Evictions said in the log: a flood is a few lines and a count.
    log: LogBudget,
}

/// One connection's place among those waiting; given back when dropped.
struct WaitingSlot {
    waiting: Arc<Waiting>,
    id: u64,
    /// Cancelled when a newer connection took its place.
    evicted: CancellationToken,
}

impl Waiting {
    fn new(cap: usize) -> Self {
        let log = LogBudget::new(5, 0.2, Instant::now());
        Self { cap, state: Mutex::new(WaitingState { next: 0, slots: BTreeMap::new(), log }) }
    }

    /// A place for a connection from `from`; at the cap, the oldest waiting is evicted for it.
    fn enter(self: &Arc<Self>, from: std::net::SocketAddr) -> WaitingSlot {
        let now = Instant::now();
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while s.slots.len() >= self.cap {
            let Some((_, (evict, old, since))) = s.slots.pop_first() else { break };
            evict.cancel();
            if let Some(unlogged) = s.log.take(now) {
                let more = if unlogged > 0 {
                    format!(" ({unlogged} more since the last line)")
                } else {
                    String::new()
                };
                warn!(
                    %from,
                    "{} connections wait for their WebSocket upgrade, the most: closed the oldest (from {old}, \
                     {:.1?} without an upgrade) for this one{more}",
                    self.cap,
                    now.saturating_duration_since(since),
                );
            }
        }
        let id = s.next;
        s.next += 1;
        let evicted = CancellationToken::new();
        s.slots.insert(id, (evicted.clone(), from, now));
        WaitingSlot { waiting: self.clone(), id, evicted }
    }
}

impl Drop for WaitingSlot {
    fn drop(&mut self) {
        self.waiting.state.lock().unwrap_or_else(|p| p.into_inner()).slots.remove(&self.id);
    }
}

/// A refused upgrade: a plain HTTP answer.
struct Refusal {
    status: u16,
    text: &'static str,
    why: String,
}

impl Refusal {
    fn new(status: u16, text: &'static str, why: &str) -> Self {
        Self { status, text, why: why.to_string() }
    }

    fn response(&self) -> String {
        let body = format!("{}\n", self.why);
        format!(
            "HTTP/1.1 {} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.status,
            self.text,
            body.len()
        )
    }
}

/// Compares without stopping at the first difference (the token is a secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `Sec-WebSocket-Accept` for a client's key (RFC 6455 §4.2.2).
fn accept_key(key: &str) -> String {
    use base64::Engine;
    let mut sha = sha1_smol::Sha1::new();
    sha.update(key.as_bytes());
    sha.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(sha.digest().bytes())
}

/// What the session core sees of a WebSocket.
pub struct WsLink {
    state: Arc<Mutex<LinkState>>,
    gone: CancellationToken,
    /// Ordered after the output: frames, then the close.
    out: mpsc::Sender<Out>,
    delivered: Arc<tokio::sync::Notify>,
}

#[derive(Default)]
struct LinkState {
    gone_why: Option<String>,
    flushed: bool,
}

enum Out {
    Line(Bytes),
    Flush,
    Close(u16, String),
}

impl WsLink {
    fn start<S>(ws: tokio_websockets::WebSocketStream<S>, max_frame: usize) -> (Self, WsOut, WsIn)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sink, mut stream) = ws.split();
        let state = Arc::new(Mutex::new(LinkState::default()));
        let gone = CancellationToken::new();
        let delivered = Arc::new(tokio::sync::Notify::new());
        let (out_tx, mut out_rx) = mpsc::channel::<Out>(OUT_QUEUE);
        let (in_tx, in_rx) = mpsc::channel::<Inbound>(OUT_QUEUE);
        let set_gone = {
            let (state, gone) = (state.clone(), gone.clone());
            move |why: String| {
                state.lock().unwrap_or_else(|p| p.into_inner()).gone_why.get_or_insert(why);
                gone.cancel();
            }
        };
        // Socket → agent: each data frame one line.
        let reader_gone = set_gone.clone();
        tokio::spawn(async move {
            let why = loop {
                match stream.next().await {
                    Some(Ok(m)) if m.is_text() || m.is_binary() => {
                        let payload = m.into_payload();
                        let item = if payload.len() > max_frame {
                            // Answered by the pump like any line over the cap.
                            let head = &payload[..payload.len().min(OVERSIZE_PEEK)];
                            Inbound::Oversized(Bytes::copy_from_slice(head))
                        } else {
                            let mut line = BytesMut::from(&*payload);
                            // A JSON text holds newlines only as whitespace: keep it one line.
                            for b in line.iter_mut() {
                                if *b == b'\n' || *b == b'\r' {
                                    *b = b' ';
                                }
                            }
                            line.extend_from_slice(b"\n");
                            Inbound::Lines(line.freeze())
                        };
                        if in_tx.send(item).await.is_err() {
                            break "the agent's input is closed".to_string();
                        }
                    }
                    Some(Ok(m)) if m.is_close() => {
                        break match m.as_close() {
                            Some((code, reason)) => {
                                format!("closed by the client ({}: {reason})", u16::from(code))
                            }
                            None => "closed by the client".to_string(),
                        };
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => break format!("socket error: {e}"),
                    None => break "socket closed".to_string(),
                }
            };
            reader_gone(why);
        });
        // Agent → socket: each line one text frame; then the close.
        let writer_state = state.clone();
        let writer_delivered = delivered.clone();
        let writer_gone = set_gone;
        tokio::spawn(async move {
            while let Some(o) = out_rx.recv().await {
                let r = match o {
                    Out::Line(l) => sink.send(Message::text(l)).await,
                    Out::Flush => {
                        let r = sink.flush().await;
                        writer_state.lock().unwrap_or_else(|p| p.into_inner()).flushed = true;
                        writer_delivered.notify_waiters();
                        r
                    }
                    Out::Close(code, reason) => {
                        let _ = sink.send(Message::close(CloseCode::try_from(code).ok(), &reason)).await;
                        let _ = sink.flush().await;
                        return;
                    }
                };
                if let Err(e) = r {
                    writer_gone(format!("socket error: {e}"));
                    return;
                }
            }
        });
        let link = Self { state, gone, out: out_tx.clone(), delivered };
        (
            link,
            WsOut { tx: out_tx, pending: BytesMut::new(), sending: None },
            WsIn::new(in_rx, None, false, max_frame),
        )
    }
}

impl Link for WsLink {
    type Out = WsOut;

    fn gone(&self) -> impl Future<Output = String> + Send {
        let (gone, state) = (self.gone.clone(), self.state.clone());
        async move {
            gone.cancelled().await;
            state.lock().unwrap_or_else(|p| p.into_inner()).gone_why.clone().unwrap_or_default()
        }
    }

    fn gone_reason(&self) -> Option<String> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).gone_why.clone()
    }

    /// Maps the session's codes to the contract's WebSocket ones.
    fn close(&self, code: u32, reason: &str) {
        let end = (code == close::CLOSE_CODE_AGENT_ENDED)
            .then(|| AgentEnd::from_close(code as u64, reason.as_bytes()))
            .flatten();
        let ws_code = match code {
            close::CLOSE_CODE_AGENT_ENDED => {
                if end.is_some_and(|e| e.is_success()) {
                    WS_NORMAL
                } else {
                    WS_INTERNAL
                }
            }
            _ if reason == close::REASON_AT_CAPACITY => WS_OVERLOAD,
            _ if reason == close::REASON_SHUTTING_DOWN => WS_GOING_AWAY,
            _ => WS_INTERNAL,
        };
        // The reference's reason exactly, without the agent's stderr line: a
        // WebSocket close reason is at most 123 bytes.
        let reason = end.map_or_else(|| reason.to_string(), |e| e.exit_reason());
        // The queue may be full of output for a client that stopped reading: never wait here.
        let tx = self.out.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(2), tx.send(Out::Close(ws_code, reason))).await;
        });
    }

    fn finish(&self, out: &mut WsOut) {
        // Lines still being handed over go first, then the flush marker.
        let pending = out.sending.take();
        let tx = self.out.clone();
        tokio::spawn(async move {
            if let Some(f) = pending {
                let _ = f.await;
            }
            let _ = tx.send(Out::Flush).await;
        });
    }

    fn delivered(&self, _out: &mut WsOut, linger: Duration) -> impl Future<Output = bool> + Send {
        let (state, delivered) = (self.state.clone(), self.delivered.clone());
        let flushed = async move {
            loop {
                let n = delivered.notified();
                tokio::pin!(n);
                n.as_mut().enable();
                if state.lock().unwrap_or_else(|p| p.into_inner()).flushed {
                    return;
                }
                n.await;
            }
        };
        async move { tokio::time::timeout(linger, flushed).await.is_ok() }
    }

    /// The contract: the agent's stdin gone ends the session, 1011.
    fn input_closed(&self) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .gone_why
            .get_or_insert(REASON_STDIN_CLOSED.into());
        self.close(0, REASON_STDIN_CLOSED);
        self.gone.cancel();
    }
}

/// Close reason (1011) when the agent's stdin is gone.
const REASON_STDIN_CLOSED: &str = "agent stdin closed";

/// Lines being handed to the socket's writer (`Err`: the socket is gone).
type Handing = Pin<Box<dyn Future<Output = Result<(), ()>> + Send>>;

/// The agent's output (runs of whole lines) into frames, one per line.
pub struct WsOut {
    tx: mpsc::Sender<Out>,
    pending: BytesMut,
    sending: Option<Handing>,
}

impl crate::serve::pump::RunSink for WsOut {}

impl AsyncWrite for WsOut {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        // Finish handing over what an earlier write split off before taking more.
        if let Some(f) = self.sending.as_mut() {
            match f.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(r) => {
                    self.sending = None;
                    r.map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "socket gone"))?;
                }
            }
        }
        self.pending.extend_from_slice(buf);
        let mut lines = Vec::new();
        while let Some(i) = thunderbolt_shared::ndjson::memchr_newline(&self.pending) {
            let mut line = self.pending.split_to(i + 1);
            line.truncate(i);
            if !line.iter().all(u8::is_ascii_whitespace) {
                lines.push(line.freeze());
            }
        }
        if !lines.is_empty() {
            let tx = self.tx.clone();
            let mut f: Handing = Box::pin(async move {
                for l in lines {
                    tx.send(Out::Line(l)).await.map_err(|_| ())?;
                }
                Ok(())
            });
            if let Poll::Ready(r) = f.as_mut().poll(cx) {
                r.map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "socket gone"))?;
            } else {
                self.sending = Some(f);
            }
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(f) = self.sending.as_mut() {
            match f.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(_) => self.sending = None,
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

/// The client's frames as ndjson for the agent's input pump. A closed socket
/// ends the session by `gone`, not by end of input.
pub type WsIn = crate::serve::pump::QueueReader;

/// Binds `127.0.0.1:port` (0 for a free one).
pub async fn bind(port: u16) -> Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", port)).await.with_context(|| {
        format!("cannot listen on 127.0.0.1:{port} (in use? pick another with --port, or 0)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_key_matches_the_rfc_example() {
        assert_eq!(accept_key("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }

    #[test]
    fn extra_origins_are_added() {
        let o = origins(Some("http://localhost:5173/, https://app.example"));
        assert!(o.contains(&"http://localhost:1420".to_string()));
        assert!(o.contains(&"http://localhost:5173".to_string()));
        assert!(o.contains(&"https://app.example".to_string()));
    }

    #[test]
    fn at_the_cap_the_oldest_waiting_connection_is_evicted_and_a_slot_given_back_frees_a_place() {
        let w = Arc::new(Waiting::new(2));
        let from: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        let a = w.enter(from);
        let b = w.enter(from);
        assert!(!a.evicted.is_cancelled() && !b.evicted.is_cancelled());
        let c = w.enter(from);
        assert!(a.evicted.is_cancelled(), "the oldest went for the newcomer");
        assert!(!b.evicted.is_cancelled() && !c.evicted.is_cancelled());
        drop(b); // upgraded (or refused): its place is free again
        let d = w.enter(from);
        assert!(!c.evicted.is_cancelled() && !d.evicted.is_cancelled());
        assert_eq!(w.state.lock().unwrap().slots.len(), 2);
        drop(a); // an evicted slot dropped late takes nobody's place with it
        assert_eq!(w.state.lock().unwrap().slots.len(), 2);
    }

    #[test]
    fn refusals_are_plain_http() {
        let r = Refusal::new(403, "Forbidden", "forbidden origin: http://evil.example").response();
        assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"));
        assert!(r.ends_with("forbidden origin: http://evil.example\n"));
    }
}
