//! The browser side of the resumable protocol (`thunderbolt/<p>/r1`, specified
//! in `thunderbolt_shared::resume`): `connectProtocol` sessions that survive a
//! lost connection, and a page reload when the page keeps `sessionState()`.
//!
//! One driver task owns the connection of the moment and redials after a
//! loss (bounded backoff, within the grace the bridge announced). The page
//! sees one stream of messages: each delivered once, in order. A frame
//! counts as held once the page has *taken* it from `messages()`: that count
//! is what acknowledgements and resumes use, so a reloaded page that stored
//! `sessionState()` after each message gets exactly the ones it had not
//! taken. Frames already queued for the page when a connection drops are not
//! queued twice (the replay skips them).

use std::{cell::RefCell, collections::VecDeque, rc::Rc, time::Duration};

use bytes::{Bytes, BytesMut};
use futures::{channel::mpsc, FutureExt, StreamExt};
use iroh::{
    endpoint::{
        ConnectOptions, Connection, ConnectionError, QuicTransportConfig, RecvStream, SendStream, VarInt,
    },
    EndpointAddr,
};
use js_sys::{Function, Object, Promise};
use thunderbolt_shared::{
    close,
    devices::{Role, METHOD_ANSWERED, METHOD_ROLE},
    resume::{Control, Event, Receiver, MAX_CONTROL_LINE},
    resume_client::ClientSession,
    silence::{self, Silence, Verdict},
};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::{
    client::ClientInner,
    errors::{Ending, ErrorKind},
    js::{ending, js_error, set, set_agent_end},
};

mod devices;
mod outcome;
mod streams;
mod watch;

use devices::*;
use outcome::*;

/// First pause between starting redials; doubled after each start.
const REDIAL_FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// Longest pause between starting redials.
const REDIAL_MAX_BACKOFF: Duration = Duration::from_secs(2);
/// One redial attempt's limit (a relay handshake with a retransmission or two).
const REDIAL_ATTEMPT: Duration = Duration::from_secs(10);
/// The first redial attempt's limit; doubled per attempt up to [`REDIAL_ATTEMPT`].
/// Short: after a relay was lost the bridge is homed on another within a few
/// hundred ms, and a handshake started before that waits for QUIC's
/// retransmission (~1 s).
const REDIAL_FIRST_ATTEMPT: Duration = Duration::from_millis(500);
/// How long a resumable connection may be silent before it is taken for lost
/// (and redialed), unless `options.idleTimeoutMs` says otherwise: as the bridge.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// A redial not through within this from the endpoint the lost connection
/// went out from goes on from a fresh one (once; see `ClientInner::renew`).
const REDIAL_RENEW_AFTER: Duration = Duration::from_secs(2);

/// Why a connection was lost when this page's own endpoint closed it.
const LOCALLY_CLOSED: &str = "closed by this page's endpoint";
/// Shortest idle timeout accepted: a few round trips through a relay.
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_millis(300);
/// Keep-alive period (a third of the idle timeout when that is shorter).
const KEEP_ALIVE: Duration = Duration::from_secs(3);

/// The transport of resumable connections: keep-alives and an idle timeout
/// so a dead path is noticed in seconds.
pub fn transport(idle: Duration) -> Result<QuicTransportConfig, String> {
    let idle_t = idle.try_into().map_err(|_| "the idle timeout is too long".to_string())?;
    Ok(QuicTransportConfig::builder()
        .keep_alive_interval(KEEP_ALIVE.min(idle / 3))
        .max_idle_timeout(Some(idle_t))
        .build())
}
/// How long the welcome may take after our hello.
const WELCOME_TIMEOUT: Duration = Duration::from_secs(15);

/// Where a stored session resumes (from `sessionState()`).
#[derive(Debug, Clone)]
pub struct Restore {
    pub token: String,
    pub received: u64,
}

/// What the driver knows about the session.
#[derive(Default)]
struct State {
    /// The protocol's side of the session ([`ClientSession`]: frames, acks,
    /// token, hello and welcome; `State` `Deref`s to it).
    r1: ClientSession<n0_future::time::Instant>,
    /// The lost connection's relay died: redial from a fresh endpoint.
    renew: bool,
    /// Frames queued for the page (taken or not).
    queued: u64,
    /// How the session ended, once it did (what `closed()` resolves with).
    ended: Option<JsValue>,
    conn: Option<Connection>,
    closing: bool,
    /// The bridge broke the protocol (a bad ack): why; the session ends.
    broken: Option<String>,
    /// The error the session ended with (what `attach` rejects with).
    error: Option<JsValue>,
    /// This device's role as the bridge last said it.
    role: Option<Role>,
    /// The role the page asked for, until the bridge says it has it.
    want: Option<Role>,
    /// `want` is to be sent on the current connection.
    role_due: bool,
}

thunderbolt_shared::holds_client_session!(State, r1, n0_future::time::Instant);

/// A resumable session.
pub struct Resumable {
    st: RefCell<State>,
    /// Messages for the page (the driver pushes, `messages()` pulls), each
    /// with its size on the wire (what acks count).
    inbox: RefCell<VecDeque<(Result<JsValue, JsValue>, usize)>>,
    inbox_wake: RefCell<Option<futures::channel::oneshot::Sender<()>>>,
    /// Our frames and end of input, to the driver.
    outgoing: mpsc::UnboundedSender<Outgoing>,
    /// Wakes the driver: an ack is due, or the page took frames.
    poke: mpsc::UnboundedSender<()>,
    on_event: Option<Function>,
    /// This device's NodeId (a refusal's words name it).
    me: String,
    ended_wake: RefCell<Vec<futures::channel::oneshot::Sender<()>>>,
    /// The byte API: lines go to the page as bytes, not parsed.
    raw: bool,
    /// The byte API: what the page wrote after its last newline.
    partial: RefCell<BytesMut>,
}

enum Outgoing {
    Frame(Bytes),
    Eof,
}

impl Resumable {
    /// Starts the driver on `first` (a connection that negotiated r1).
    pub fn start(
        client: Rc<ClientInner>,
        addr: EndpointAddr,
        alpn: Vec<u8>,
        first: Connection,
        restore: Option<Restore>,
        on_event: Option<Function>,
        transport: QuicTransportConfig,
        raw: bool,
        join: Option<Control>,
    ) -> Rc<Self> {
        let (outgoing, out_rx) = mpsc::unbounded();
        let (poke, poke_rx) = mpsc::unbounded();
        let mut st = State { r1: ClientSession::new(join), ..State::default() };
        if let Some(r) = restore {
            st.queued = r.received;
            st.r1 = ClientSession::restored(r.token, r.received);
        }
        let me = Rc::new(Self {
            st: RefCell::new(st),
            inbox: RefCell::new(VecDeque::new()),
            inbox_wake: RefCell::new(None),
            outgoing,
            poke,
            on_event,
            me: client.ep().id().to_string(),
            ended_wake: RefCell::new(Vec::new()),
            raw,
            partial: RefCell::new(BytesMut::new()),
        });
        wasm_bindgen_futures::spawn_local(
            me.clone().drive(client, addr, alpn, first, out_rx, poke_rx, transport),
        );
        me
    }

    fn event(&self, kind: &str, detail: Option<&str>) {
        if let Some(f) = &self.on_event {
            let v: JsValue = Object::new().into();
            set(&v, "type", kind.into());
            if let Some(d) = detail {
                set(&v, "detail", d.into());
            }
            let _ = f.call1(&JsValue::NULL, &v);
        }
    }

    /// Resolves once the bridge welcomed the session (a join was accepted);
    /// rejects with the error it ended with otherwise.
    pub async fn welcomed(&self) -> Result<(), JsValue> {
        loop {
            {
                let st = self.st.borrow();
                if st.token().is_some() {
                    return Ok(());
                }
                if st.ended.is_some() {
                    return Err(st
                        .error
                        .clone()
                        .unwrap_or_else(|| js_error(&ErrorKind::SessionGone, "the session has ended")));
                }
            }
            let (tx, rx) = futures::channel::oneshot::channel();
            self.ended_wake.borrow_mut().push(tx);
            let _ = rx.await;
        }
    }

    fn wake_waiters(&self) {
        for w in self.ended_wake.borrow_mut().drain(..) {
            let _ = w.send(());
        }
    }

    fn push_message(&self, m: Result<JsValue, JsValue>, bytes: usize) {
        self.inbox.borrow_mut().push_back((m, bytes));
        if let Some(w) = self.inbox_wake.borrow_mut().take() {
            let _ = w.send(());
        }
    }

    /// The next message for the page; counts it as taken.
    pub async fn next_message(self: &Rc<Self>) -> Option<Result<JsValue, JsValue>> {
        loop {
            if let Some((m, bytes)) = self.inbox.borrow_mut().pop_front() {
                if m.is_ok() {
                    self.st.borrow_mut().delivered(1, bytes, n0_future::time::Instant::now());
                    // The driver writes the ack, or arms its timer.
                    let _ = self.poke.unbounded_send(());
                }
                return Some(m);
            }
            if self.st.borrow().ended.is_some() {
                return None;
            }
            let (tx, rx) = futures::channel::oneshot::channel();
            *self.inbox_wake.borrow_mut() = Some(tx);
            let _ = rx.await;
        }
    }

    /// The messages for the page as a `ReadableStream` (taking one counts it as held).
    pub fn readable(self: &Rc<Self>) -> web_sys::ReadableStream {
        let s =
            futures::stream::unfold(self.clone(), |r| async move { r.next_message().await.map(|m| (m, r)) });
        wasm_streams::ReadableStream::from_stream(s).into_raw()
    }

    /// Queues one frame (a whole line); it is delivered exactly once, across reconnects.
    pub fn send(&self, line: Bytes) -> Result<(), JsValue> {
        if self.st.borrow().ended.is_some() {
            return Err(js_error(&ErrorKind::SessionGone, "the session has ended"));
        }
        self.outgoing
            .unbounded_send(Outgoing::Frame(line))
            .map_err(|_| js_error(&ErrorKind::SessionGone, "the session has ended"))
    }

    /// The byte API: whole lines go out as frames; the rest waits for its newline.
    pub fn send_bytes(&self, data: &[u8]) -> Result<(), JsValue> {
        let run = {
            let mut partial = self.partial.borrow_mut();
            partial.extend_from_slice(data);
            match partial.iter().rposition(|b| *b == b'\n') {
                Some(i) => partial.split_to(i + 1).freeze(),
                None => return Ok(()),
            }
        };
        self.send(thunderbolt_shared::resume::escape_run(run))
    }

    pub fn finish(&self) {
        let rest = self.partial.borrow_mut().split();
        if !rest.is_empty() {
            let mut line = rest;
            line.extend_from_slice(b"\n");
            let _ = self.send(thunderbolt_shared::resume::escape_run(line.freeze()));
        }
        let _ = self.outgoing.unbounded_send(Outgoing::Eof);
    }

    /// Ends the session at once (code 0: the bridge ends the agent).
    pub fn close(&self) {
        let mut st = self.st.borrow_mut();
        st.closing = true;
        if let Some(c) = &st.conn {
            c.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_CLIENT_CLOSED.as_bytes());
        }
        drop(st);
        let _ = self.poke.unbounded_send(());
    }

    /// The current connection's path kind (`"none"` between connections).
    pub fn path(&self) -> &'static str {
        self.st.borrow().conn.as_ref().map_or("none", crate::client::path_kind)
    }

    /// `{session, received}` to store, for resuming after a reload.
    pub fn state(&self) -> JsValue {
        let st = self.st.borrow();
        let v: JsValue = Object::new().into();
        if let Some(t) = st.token() {
            set(&v, "session", t.into());
        }
        set(&v, "received", JsValue::from_f64(st.acks.received() as f64));
        v
    }

    /// Resolves with how the session ended (`{kind, code?, reason, …}`).
    pub fn closed(self: &Rc<Self>) -> Promise {
        let me = self.clone();
        future_to_promise(async move {
            loop {
                if let Some(v) = me.st.borrow().ended.clone() {
                    return Ok(v);
                }
                let (tx, rx) = futures::channel::oneshot::channel();
                me.ended_wake.borrow_mut().push(tx);
                let _ = rx.await;
            }
        })
    }

    fn end(&self, how: JsValue, error: Option<JsValue>) {
        {
            let mut st = self.st.borrow_mut();
            if st.ended.is_some() {
                return;
            }
            st.ended = Some(how);
            st.conn = None;
            st.error = error.clone();
        }
        if let Some(e) = error {
            self.push_message(Err(e), 0);
        } else if let Some(w) = self.inbox_wake.borrow_mut().take() {
            let _ = w.send(());
        }
        self.wake_waiters();
    }

    async fn drive(
        self: Rc<Self>,
        client: Rc<ClientInner>,
        addr: EndpointAddr,
        alpn: Vec<u8>,
        first: Connection,
        mut out_rx: mpsc::UnboundedReceiver<Outgoing>,
        mut poke_rx: mpsc::UnboundedReceiver<()>,
        transport: QuicTransportConfig,
    ) {
        let mut conn = first;
        // The endpoint `conn` went out from (see `ClientInner::renew`).
        let mut generation = client.generation();
        let mut resumed = false;
        loop {
            self.st.borrow_mut().conn = Some(conn.clone());
            let lost = self.carry(&client.ep(), &conn, &mut out_rx, &mut poke_rx, resumed).await;
            let why = match lost {
                Ok(why) => why,
                Err((how, err)) => return self.end(how, err),
            };
            if self.st.borrow().closing {
                return self.end(closed_obj("closed", Some(0), close::REASON_CLIENT_CLOSED), None);
            }
            // Closed here, not by the bridge: by another session of this page
            // that replaced the endpoint (`ClientInner::renew` closes the old
            // one), a move to redial from the fresh one; or by the client's
            // shutdown, when the endpoint is still the one it went out from.
            if why == LOCALLY_CLOSED && client.generation() == generation {
                return self.end(closed_obj("closed", Some(0), close::REASON_CLIENT_CLOSED), None);
            }
            let grace = self.st.borrow().redial_budget();
            self.event("reconnecting", Some(&why));
            // Moved: the endpoint is a fresh one already.
            let renewed = std::mem::take(&mut self.st.borrow_mut().renew) || why == LOCALLY_CLOSED;
            if renewed {
                client.renew(generation).await;
            }
            match redial(&client, &addr, &alpn, grace, &transport, renewed).await {
                Ok((c, g)) => {
                    conn = c;
                    generation = g;
                    resumed = true;
                }
                Err(e) => {
                    let msg = format!(
                        "the session is gone: could not reach the bridge again within {} s ({e})",
                        grace.as_secs()
                    );
                    self.event("gone", Some(&msg));
                    return self.end(
                        closed_obj("session_gone", None, &msg),
                        Some(js_error(&ErrorKind::SessionGone, &msg)),
                    );
                }
            }
        }
    }

    /// Carries the session over `conn`. `Ok(why)`: lost, redial; `Err`: ended.
    async fn carry(
        &self,
        ep: &iroh::Endpoint,
        conn: &Connection,
        out_rx: &mut mpsc::UnboundedReceiver<Outgoing>,
        poke_rx: &mut mpsc::UnboundedReceiver<()>,
        resumed: bool,
    ) -> Result<String, (JsValue, Option<JsValue>)> {
        let (mut send, mut recv) = match conn.open_bi().await {
            Ok(s) => s,
            Err(e) => return self.conn_end(e),
        };
        let hello = self.st.borrow().hello();
        if send.write_all(&hello.encode()).await.is_err() {
            return self.conn_end(conn.closed().await);
        }
        // The welcome: the first line.
        let mut rx = Receiver::new(usize::MAX / 2);
        let mut buf = BytesMut::new();
        let welcome = loop {
            if let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                let line = buf.split_to(nl + 1);
                rx.push(&buf);
                break line;
            }
            if buf.len() > MAX_CONTROL_LINE {
                break BytesMut::new();
            }
            let Ok(read) = n0_future::time::timeout(WELCOME_TIMEOUT, recv.read_chunk(64 * 1024)).await else {
                return Ok("the bridge did not answer our hello".into());
            };
            match read {
                Ok(Some(c)) => buf.extend_from_slice(&c),
                _ => return self.conn_end(conn.closed().await),
            }
        };
        let replay = {
            let mut st = self.st.borrow_mut();
            match st.welcome(&welcome) {
                Ok(w) => {
                    st.role_due = st.want.is_some();
                    w.replay
                }
                Err(e) => {
                    let msg = e.to_string();
                    return Err((closed_obj("frame", None, &msg), Some(js_error(&ErrorKind::Frame, &msg))));
                }
            }
        };
        // Frames from the page's count on; those already queued for it are skipped.
        let index = self.st.borrow().acks.received();
        self.wake_waiters();
        if resumed {
            self.event("resumed", None);
        }
        if send.write_all_chunks(&mut replay.clone()).await.is_err() {
            return self.conn_end(conn.closed().await);
        }

        let upload = self.upload(&mut send, out_rx, poke_rx);
        let download = self.download(&mut recv, &mut rx, index);
        let closed = conn.closed();
        // A relay that died may hold this endpoint's sends back: the redial
        // goes out from a fresh one.
        let relay_lost = crate::relays::path_lost(ep, conn).map(|why| {
            self.st.borrow_mut().renew = true;
            why
        });
        let silent = self.silent(conn);
        futures::pin_mut!(upload, download, closed, relay_lost, silent);
        // Whichever stops first: the connection is over either way.
        let over = futures::future::select(upload, futures::future::select(download, closed));
        let lost = futures::future::select(relay_lost, silent).map(|e| e.factor_first().0);
        if let futures::future::Either::Right((lost, _)) = futures::future::select(over, lost).await {
            // Its relay is gone, and the path with it, or the bridge does not
            // answer on it (killed and started again, it forgot it): redial
            // now, not at the idle timeout. Not `client closed`: should the
            // bridge hear it, it takes it for a loss.
            conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), b"path lost");
            return Ok(lost);
        }
        if let Some(msg) = self.st.borrow_mut().broken.take() {
            conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), b"protocol error");
            return Err((closed_obj("frame", None, &msg), Some(js_error(&ErrorKind::Frame, &msg))));
        }
        self.conn_end(conn.closed().await)
    }
}

/// Redials until a connection with the resumable protocol is made, or the
/// grace is over. The first attempts are cut short (1 s, then doubling): a
/// handshake started while the path was down waits for QUIC's
/// retransmission, while a fresh one after the path came back goes through
/// in one round trip. (Overlapping attempts, as `connect` makes, cost the
/// browser module more code than they win here.)
async fn redial(
    client: &Rc<ClientInner>,
    addr: &EndpointAddr,
    alpn: &[u8],
    grace: Duration,
    transport: &QuicTransportConfig,
    mut renewed: bool,
) -> Result<(Connection, u32), String> {
    use n0_future::time::Instant;
    let start = Instant::now();
    let deadline = start + grace;
    let renew_at = start + REDIAL_RENEW_AFTER;
    let mut backoff = REDIAL_FIRST_BACKOFF;
    let mut attempt_limit = REDIAL_FIRST_ATTEMPT;
    let mut last = String::from("no attempt");
    while Instant::now() < deadline {
        if !renewed && Instant::now() >= renew_at {
            // Once: whatever holds the old endpoint's sends back holds no fresh one.
            client.renew(client.generation()).await;
            renewed = true;
        }
        let (generation, ep) = (client.generation(), client.ep());
        let mut limit = attempt_limit;
        if !renewed {
            limit = limit.min(renew_at.saturating_duration_since(Instant::now())).max(REDIAL_FIRST_BACKOFF);
        }
        let opts = ConnectOptions::new().with_transport_config(transport.clone());
        let dial = async {
            let connecting =
                ep.connect_with_opts(addr.clone(), alpn, opts).await.map_err(|e| e.to_string())?;
            connecting.await.map_err(|e| e.to_string())
        };
        match n0_future::time::timeout(limit, dial).await {
            Ok(Ok(c)) => return Ok((c, generation)),
            Ok(Err(e)) => {
                last = e;
                n0_future::time::sleep(backoff).await;
                backoff = (backoff * 2).min(REDIAL_MAX_BACKOFF);
            }
            Err(_) => last = "timed out".into(),
        }
        attempt_limit = (attempt_limit * 2).min(REDIAL_ATTEMPT);
    }
    Err(last)
}

/// Dials with the resumable ALPN first and the plain one (if any) as a fallback.
pub async fn connect_either(
    client: &ClientInner,
    addr: EndpointAddr,
    resume_alpn: &[u8],
    plain_alpn: Option<Vec<u8>>,
    transport: QuicTransportConfig,
) -> Result<Connection, String> {
    let opts = ConnectOptions::new()
        .with_additional_alpns(plain_alpn.into_iter().collect())
        .with_transport_config(transport);
    let connecting =
        client.ep().connect_with_opts(addr, resume_alpn, opts).await.map_err(|e| e.to_string())?;
    connecting.await.map_err(|e| e.to_string())
}
