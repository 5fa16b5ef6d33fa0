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
mod dial;
mod outcome;
mod page;
mod streams;
mod watch;

use devices::*;
pub use dial::{connect_either, transport, DEFAULT_IDLE_TIMEOUT, MIN_IDLE_TIMEOUT};
use dial::{redial, LOCALLY_CLOSED};
use outcome::*;

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
                crate::relays::renew(&client, generation).await;
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
