//! The client's endpoint and the plain connections it dials: `ClientInner`
//! (one NodeId, its relays, a fresh endpoint in place of a stuck one) and
//! `ConnInner` (one connection's bidirectional stream, read as chunks). What
//! is dialed and how is dialing.rs's.

use std::{cell::RefCell, rc::Rc, time::Duration};

use futures::lock::Mutex as AsyncMutex;
use iroh::{
    endpoint::{presets, Connection, RecvStream, SendStream, VarInt},
    Endpoint, RelayMap, RelayMode, RelayUrl, SecretKey,
};
use js_sys::{Object, Promise};
use thunderbolt_shared::close;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::{
    errors::{classify_text, Ending, ErrorKind},
    js::{conn_error, ending, input_error, js_error, op_error, set, set_agent_end},
};

/// Most bytes per read: large enough for bulk transfers, small enough to
/// keep each JS chunk cheap. A read takes everything the stream holds up to
/// this (`RecvStream::read`), not one QUIC frame (`read_chunk`, ~1.2 KB
/// through a relay): one JS chunk per wake-up, not one per packet.
pub(crate) const READ_CHUNK: usize = 256 * 1024;

/// After the bridge finished its stream, how long a reader waits for it to say
/// how the agent ended (ours closes one round trip later; an older bridge never
/// does, and the stream then simply ends).
const AGENT_END_WAIT: Duration = Duration::from_secs(5);

pub(crate) struct ClientInner {
    /// The endpoint dialed from now; a fresh one may replace it ([`ClientInner::replace_endpoint`]).
    ep: RefCell<Endpoint>,
    /// How many times it was replaced.
    generation: std::cell::Cell<u32>,
    secret: SecretKey,
    pub(crate) relay: Option<RelayUrl>,
    /// The endpoint's relay map (the very one: a `RelayMap`'s clones share
    /// their contents): the relay given (or n0's) and every relay a dialed
    /// ticket named.
    pub(crate) relays: RelayMap,
}

/// An endpoint with `secret` homed on one of `relays` (the very map: a
/// `RelayMap`'s clones share their contents).
pub(crate) async fn bind(
    secret: &SecretKey,
    relays: &RelayMap,
) -> Result<Endpoint, iroh::endpoint::BindError> {
    Endpoint::builder(presets::Minimal)
        .crypto_provider(crate::crypto::browser_crypto())
        .add_custom_transport(std::sync::Arc::new(crate::batching::Batching))
        .secret_key(secret.clone())
        .relay_mode(RelayMode::Custom(relays.clone()))
        .bind()
        .await
}

impl ClientInner {
    /// The client of `ep`, bound with `secret` on `relays` (the very map the
    /// endpoint uses); `relay`: the one given, if any.
    pub(crate) fn new(ep: Endpoint, secret: SecretKey, relay: Option<RelayUrl>, relays: RelayMap) -> Self {
        Self { ep: RefCell::new(ep), generation: Default::default(), secret, relay, relays }
    }

    /// The secret key of this client's NodeId.
    pub(crate) fn secret(&self) -> &SecretKey {
        &self.secret
    }

    /// The endpoint to dial from now.
    pub(crate) fn ep(&self) -> Endpoint {
        self.ep.borrow().clone()
    }

    /// Which endpoint is current (see [`ClientInner::replace_endpoint`]).
    pub(crate) fn generation(&self) -> u32 {
        self.generation.get()
    }

    /// A fresh endpoint (same key, same relays) in place of the one of
    /// `generation`, unless another session replaced it already. iroh sends
    /// every relay datagram of an endpoint through one queue, which waits
    /// whenever one relay's own queue is full: a relay that died with a
    /// stream going through it holds every relay's sends back for seconds
    /// (as `connect`'s `ClientEndpoint` says). The old endpoint is closed,
    /// and its connections with it: every session of this client redials.
    /// Whether it was replaced (then the new one is to be kept homed:
    /// `relays::renew`).
    pub(crate) async fn replace_endpoint(&self, generation: u32) -> bool {
        if self.generation() != generation {
            return false;
        }
        let Ok(fresh) = bind(&self.secret, &self.relays).await else { return false };
        if self.generation() != generation {
            fresh.close().await;
            return false;
        }
        let old = self.ep.replace(fresh);
        self.generation.set(generation.wrapping_add(1));
        wasm_bindgen_futures::spawn_local(async move { old.close().await });
        true
    }
}

pub(crate) struct ConnInner {
    pub(crate) conn: Connection,
    /// This device's NodeId (the words of a refusal name it).
    pub(crate) me: String,
    pub(crate) send: AsyncMutex<SendStream>,
    recv: RefCell<Option<RecvStream>>,
}

pub(crate) async fn open_plain(conn: Connection, client: &ClientInner) -> Result<Rc<ConnInner>, JsValue> {
    let me = client.ep().id().to_string();
    let (send, recv) = conn.open_bi().await.map_err(|e| conn_error(&e, &me))?;
    Ok(Rc::new(ConnInner { conn, me, send: AsyncMutex::new(send), recv: RefCell::new(Some(recv)) }))
}

impl ConnInner {
    pub(crate) async fn write(&self, bytes: &[u8]) -> Result<(), JsValue> {
        let mut send = self.send.lock().await;
        send.write_all(bytes).await.map_err(|e| op_error(&self.conn, &self.me, e))
    }

    pub(crate) fn take_recv(&self) -> Result<RecvStream, JsValue> {
        self.recv.borrow_mut().take().ok_or_else(|| input_error("the stream can only be read once"))
    }

    /// A stream of byte chunks; ends when the bridge finished its side. If
    /// the bridge then says the agent failed (a non-zero exit code, a
    /// signal), the stream errors with `kind: "agent"` after the last chunk.
    pub(crate) fn chunks(
        self: &Rc<Self>,
    ) -> Result<impl futures::Stream<Item = Result<Vec<u8>, JsValue>>, JsValue> {
        let recv = self.take_recv()?;
        let me = self.clone();
        let buf = vec![0u8; READ_CHUNK];
        Ok(futures::stream::unfold(Some((recv, me, buf)), |state| async move {
            let (mut recv, me, mut buf) = state?;
            match recv.read(&mut buf).await {
                Ok(Some(n)) => Some((Ok(buf[..n].to_vec()), Some((recv, me, buf)))),
                Ok(None) => me.agent_failure().await.map(|e| (Err(e), None)),
                Err(e) => match me.conn.close_reason().map(|c| ending(&c)) {
                    // The agent's end was announced: what came before it was everything.
                    Some(Ending::Agent(end)) if end.is_success() => None,
                    _ => Some((Err(op_error(&me.conn, &me.me, e)), None)),
                },
            }
        }))
    }

    /// At the end of the bridge's stream: the typed error when the bridge says
    /// the agent failed; `None` when it exited 0 or nothing was said in time.
    async fn agent_failure(&self) -> Option<JsValue> {
        let err = n0_future::time::timeout(AGENT_END_WAIT, self.conn.closed()).await.ok()?;
        match ending(&err) {
            Ending::Agent(end) if !end.is_success() => {
                Some(js_error(&ErrorKind::Agent(end), &end.describe()))
            }
            _ => None,
        }
    }

    pub(crate) fn close(&self) {
        self.conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_CLIENT_CLOSED.as_bytes());
    }

    /// Resolves with `{kind, code, reason}` once the connection is closed.
    pub(crate) fn closed(self: &Rc<Self>) -> Promise {
        let me = self.clone();
        future_to_promise(async move {
            let err = me.conn.closed().await;
            let v: JsValue = Object::new().into();
            match ending(&err) {
                Ending::Agent(end) => {
                    set(&v, "kind", "agent".into());
                    set_agent_end(&v, &end);
                }
                Ending::Closed { code, reason } => {
                    set(&v, "kind", "closed".into());
                    set(&v, "code", JsValue::from_f64(code as f64));
                    set(&v, "reason", reason.as_str().into());
                }
                Ending::Local => {
                    set(&v, "kind", "closed".into());
                    set(&v, "code", JsValue::from_f64(close::CLOSE_CODE_CLIENT as f64));
                    set(&v, "reason", close::REASON_CLIENT_CLOSED.into());
                }
                Ending::Lost(text) => {
                    set(&v, "kind", classify_text(&text).name().into());
                    set(&v, "reason", text.into());
                }
            }
            Ok(v)
        })
    }

    /// Finishes our send side: the bridge's agent sees end of input.
    pub(crate) async fn finish(&self) -> Result<(), JsValue> {
        let mut send = self.send.lock().await;
        send.finish().map_err(|e| op_error(&self.conn, &self.me, e))
    }
}

/// The kind of path `conn` sends on now: `"relay"` or `"direct"` (a browser
/// has no UDP, so always the relay there).
pub(crate) fn path_kind(conn: &Connection) -> &'static str {
    match conn.paths().iter().find(|p| p.is_selected()) {
        Some(p) if p.is_ip() => "direct",
        Some(_) => "relay",
        None => "none",
    }
}
