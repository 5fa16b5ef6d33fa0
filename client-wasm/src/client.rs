//! The client's endpoint and the plain connections it dials: `ClientInner`
//! (one NodeId, its relays, a fresh endpoint in place of a stuck one), the
//! dial itself, a listing, and `ConnInner` (one connection's bidirectional
//! stream, read as chunks).

use std::{cell::RefCell, rc::Rc, time::Duration};

use futures::lock::Mutex as AsyncMutex;
use iroh::{
    endpoint::{presets, Connection, RecvStream, SendStream, VarInt},
    Endpoint, RelayMap, RelayMode, RelayUrl, SecretKey, TransportAddr,
};
use js_sys::{Object, Promise, Reflect};
use thunderbolt_shared::{
    close,
    resume::{resume_alpn, Control},
    words, Protocol, Target,
};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::{
    errors::{classify_text, Ending, ErrorKind, DEFAULT_DIAL_TIMEOUT_MS},
    js::{conn_error, ending, input_error, js_error, op_error, set, set_agent_end},
};

/// Most bytes per read: large enough for bulk transfers, small enough to
/// keep each JS chunk cheap. A read takes everything the stream holds up to
/// this (`RecvStream::read`), not one QUIC frame (`read_chunk`, ~1.2 KB
/// through a relay): one JS chunk per wake-up, not one per packet.
pub(crate) const READ_CHUNK: usize = 256 * 1024;

/// How long the bridge may take to answer a listing.
const LISTING_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest listing read (a few dozen sessions take a few KiB).
const MAX_LISTING: usize = 1 << 20;

/// After the bridge finished its stream, how long a reader waits for it to say
/// how the agent ended (ours closes one round trip later; an older bridge never
/// does, and the stream then simply ends).
const AGENT_END_WAIT: Duration = Duration::from_secs(5);

pub(crate) struct ClientInner {
    /// The endpoint dialed from now; a fresh one may replace it ([`ClientInner::renew`]).
    ep: RefCell<Endpoint>,
    /// How many times it was replaced.
    generation: std::cell::Cell<u32>,
    secret: SecretKey,
    relay: Option<RelayUrl>,
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

    /// Which endpoint is current (see [`ClientInner::renew`]).
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
    pub(crate) async fn renew(self: &Rc<Self>, generation: u32) {
        if self.generation() != generation {
            return;
        }
        let Ok(fresh) = bind(&self.secret, &self.relays).await else { return };
        if self.generation() != generation {
            fresh.close().await;
            return;
        }
        let old = self.ep.replace(fresh);
        self.generation.set(generation.wrapping_add(1));
        crate::relays::keep_a_home_relay(self);
        wasm_bindgen_futures::spawn_local(async move { old.close().await });
    }
}

pub(crate) struct ConnInner {
    pub(crate) conn: Connection,
    /// This device's NodeId (the words of a refusal name it).
    pub(crate) me: String,
    pub(crate) send: AsyncMutex<SendStream>,
    recv: RefCell<Option<RecvStream>>,
}

/// Asks the bridge at `target` for its listing (of the `host`, or of its
/// agent): the answer as a JS object with a `sessions` array.
pub(crate) async fn listing(
    inner: &ClientInner,
    target: &str,
    protocol: Option<String>,
    host: bool,
    timeout_ms: Option<u32>,
) -> Result<JsValue, JsValue> {
    let p: Protocol = protocol.as_deref().unwrap_or("acp").parse().map_err(input_error)?;
    let c = dial(inner, target, resume_alpn(&p), timeout_ms).await?;
    c.write(&Control::List { host }.encode()).await?;
    let mut recv = c.take_recv()?;
    let answer = match n0_future::time::timeout(LISTING_TIMEOUT, recv.read_to_end(MAX_LISTING)).await {
        Ok(Ok(a)) if !a.is_empty() => Ok(a),
        Ok(Err(e)) => Err(op_error(&c.conn, &c.me, e)),
        _ => Err(js_error(&ErrorKind::Frame, "the bridge did not answer the listing (an older version?)")),
    };
    c.close();
    js_sys::JSON::parse(String::from_utf8_lossy(&answer?).trim())
        .ok()
        .filter(|v| Reflect::get(v, &"sessions".into()).is_ok_and(|s| s.is_array()))
        .ok_or_else(|| js_error(&ErrorKind::Frame, "the bridge's listing is unreadable"))
}

pub(crate) async fn dial(
    client: &ClientInner,
    target: &str,
    alpn: Vec<u8>,
    timeout_ms: Option<u32>,
) -> Result<Rc<ConnInner>, JsValue> {
    let (conn, _) = dial_conn(client, target, &alpn, None, timeout_ms).await?;
    open_plain(conn, client).await
}

/// Dials `target` with `alpn` (and `fallback` as a second choice); returns the
/// connection and the address dialed.
pub(crate) async fn dial_conn(
    client: &ClientInner,
    target: &str,
    alpn: &[u8],
    fallback: Option<(Option<Vec<u8>>, iroh::endpoint::QuicTransportConfig)>,
    timeout_ms: Option<u32>,
) -> Result<(Connection, iroh::EndpointAddr), JsValue> {
    let target: Target = target.parse().map_err(input_error)?;
    let mut addr = target.endpoint_addr();
    // A bare NodeId carries no address: assume the bridge uses our relay.
    if addr.relay_urls().next().is_none() {
        if let Some(r) = &client.relay {
            addr = addr.with_addrs([TransportAddr::Relay(r.clone())]);
        }
    }
    client.add_relays(&addr);
    let ms = timeout_ms.unwrap_or(DEFAULT_DIAL_TIMEOUT_MS);
    // Whether the relay was reached: a dial that never got that far says so.
    let online = std::cell::Cell::new(false);
    let fut = async {
        client.ep().online().await;
        online.set(true);
        match fallback {
            Some((plain, transport)) => {
                crate::resumable::connect_either(client, addr.clone(), alpn, plain, transport).await
            }
            None => client.ep().connect(addr.clone(), alpn).await.map_err(|e| e.to_string()),
        }
    };
    match n0_future::time::timeout(Duration::from_millis(ms as u64), fut).await {
        Err(_) if !online.get() => {
            let relay =
                client.relay.as_ref().map_or_else(|| "(n0's public relays)".into(), |r| r.to_string());
            Err(js_error(&ErrorKind::Timeout, &words::relay_unreachable(&relay)))
        }
        Err(_) => {
            Err(js_error(&ErrorKind::Timeout, &format!("could not reach {} within {ms} ms", target.id())))
        }
        Ok(Err(text)) if words::is_identity_mismatch(&text) => {
            Err(js_error(&ErrorKind::Network, words::OTHER_IDENTITY))
        }
        Ok(Err(text)) => {
            Err(js_error(&classify_text(&text), &format!("could not connect to {}: {text}", target.id())))
        }
        Ok(Ok(c)) => Ok((c, addr)),
    }
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
