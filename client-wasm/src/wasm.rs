//! The wasm-bindgen surface: `IrohClient`, `IrohConnection` (bytes) and
//! `FramedConnection` (JSON-RPC messages as ndjson frames).

use std::{rc::Rc, time::Duration};

use futures::StreamExt;
use iroh::{RelayMap, RelayUrl, SecretKey};
use js_sys::{Promise, Reflect, Uint8Array};
use thunderbolt_shared::{
    close,
    devices::{History, Role},
    jsonrpc::is_json,
    ndjson::{encode_frame, is_blank, LineFramer, MAX_FRAME_LEN, MIN_FRAME_LEN},
    pairing,
    resume::{resume_alpn, Control},
    Protocol,
};
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::{
    client::{bind, open_plain, path_kind, ClientInner, ConnInner},
    dialing::{dial, dial_conn, listing},
    errors::ErrorKind,
    js::{input_error, js_error, op_error, opt, parse_frame},
};

/// One iroh endpoint (one NodeId), shared by all its connections.
#[wasm_bindgen]
pub struct IrohClient {
    inner: Rc<ClientInner>,
}

#[wasm_bindgen]
impl IrohClient {
    /// Creates the client. `secretHex`: 64 hex chars to keep a stable NodeId
    /// (store `secretKeyHex()` and pass it back); omitted → a new identity.
    /// `relayUrl`: the relay to use; omitted → n0's public relays. The relays a
    /// dialed ticket names are added to it (the endpoint homes on the nearest
    /// that answers, and on another when its own is lost).
    pub async fn create(
        secret_hex: Option<String>,
        relay_url: Option<String>,
    ) -> Result<IrohClient, JsValue> {
        console_error_panic_hook::set_once();
        let secret = match secret_hex.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            Some(h) => {
                let bytes: [u8; 32] = hex::decode(h)
                    .ok()
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| input_error("secretHex must be 64 hex characters"))?;
                SecretKey::from_bytes(&bytes)
            }
            None => SecretKey::generate(),
        };
        let relay: Option<RelayUrl> = match relay_url.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            Some(u) => Some(u.parse().map_err(|e| input_error(format!("invalid relayUrl '{u}': {e}")))?),
            None => None,
        };
        let relays = match &relay {
            Some(u) => RelayMap::from(u.clone()),
            None => iroh::endpoint::default_relay_mode().relay_map(),
        };
        let ep = bind(&secret, &relays)
            .await
            .map_err(|e| js_error(&ErrorKind::Network, &format!("cannot start the iroh endpoint: {e}")))?;
        let inner = Rc::new(ClientInner::new(ep, secret, relay, relays));
        crate::relays::keep_a_home_relay(&inner);
        Ok(IrohClient { inner })
    }

    /// This client's NodeId (64 hex chars): what the bridge must allow.
    #[wasm_bindgen(js_name = nodeId)]
    pub fn node_id(&self) -> String {
        self.inner.ep().id().to_string()
    }

    /// The secret key as 64 hex chars, to persist for a stable NodeId.
    #[wasm_bindgen(js_name = secretKeyHex)]
    pub fn secret_key_hex(&self) -> String {
        hex::encode(self.inner.secret().to_bytes())
    }

    /// Dials `target` (ticket or NodeId) with `alpn` and opens the session's stream.
    /// For `thunderbolt/<p>/0` the resumable `thunderbolt/<p>/r1` is offered first
    /// (unless `options.resume` is `false`; `options` as for `connectProtocol`):
    /// the bytes read and written are the same, whole lines carried across
    /// reconnects.
    #[wasm_bindgen(unchecked_return_type = "Promise<IrohConnection>")]
    pub fn connect(
        &self,
        target: String,
        alpn: String,
        timeout_ms: Option<u32>,
        options: JsValue,
    ) -> Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            let opts = ResumeOptions::parse(&options)?;
            let r1 =
                alpn.strip_suffix("/0").filter(|p| p.starts_with("thunderbolt/")).map(|p| format!("{p}/r1"));
            let (Some(r1), true) = (r1, opts.resume) else {
                let c = dial(&inner, &target, alpn.into_bytes(), timeout_ms).await?;
                return Ok(IrohConnection { inner: Framed::Plain(c) }.into());
            };
            let r1 = r1.into_bytes();
            let (conn, addr) = dial_conn(
                &inner,
                &target,
                &r1,
                Some((Some(alpn.into_bytes()), opts.transport.clone())),
                timeout_ms,
            )
            .await?;
            if conn.alpn() != r1.as_slice() {
                let c = open_plain(conn, &inner).await?;
                return Ok(IrohConnection { inner: Framed::Plain(c) }.into());
            }
            let r = crate::resumable::Resumable::start(
                inner.clone(),
                addr,
                r1,
                conn,
                opts.restore,
                opts.on_event,
                opts.transport,
                true,
                None,
            );
            Ok(IrohConnection { inner: Framed::Resumable(r) }.into())
        })
    }

    /// Dials `target` for a protocol by name (`acp`, `mcp`): the ALPN is derived
    /// (`thunderbolt/<protocol>/0`, with `thunderbolt/<protocol>/r1` offered first
    /// unless `options.resume` is `false`) and messages are framed as ndjson.
    /// `maxFrame`: the longest message sent or received, in bytes (default
    /// 32 MiB, the ACP SDK's own limit; set it to what the bridge's
    /// `--max-frame` is). `options`: `{ resume?: boolean, session?: {session,
    /// received} (a stored sessionState()), onEvent?: ({type, detail}) => void,
    /// idleTimeoutMs?: number }` (silence after which a resumable connection is
    /// taken for lost and redialed; default 10 000, at least 300).
    #[wasm_bindgen(js_name = connectProtocol, unchecked_return_type = "Promise<FramedConnection>")]
    pub fn connect_protocol(
        &self,
        target: String,
        protocol: String,
        timeout_ms: Option<u32>,
        max_frame: Option<u32>,
        options: JsValue,
    ) -> Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            let p: Protocol = protocol.parse().map_err(input_error)?;
            let max_frame = frame_limit(max_frame)?;
            let ResumeOptions { resume, transport, on_event, restore } = ResumeOptions::parse(&options)?;
            if !resume {
                let c = dial(&inner, &target, p.alpn(), timeout_ms).await?;
                return Ok(FramedConnection { inner: Framed::Plain(c), max_frame }.into());
            }
            let r1 = resume_alpn(&p);
            let (conn, addr) =
                dial_conn(&inner, &target, &r1, Some((Some(p.alpn()), transport.clone())), timeout_ms)
                    .await?;
            if conn.alpn() != r1.as_slice() {
                // A bridge without resume: the plain protocol, as before.
                let c = open_plain(conn, &inner).await?;
                return Ok(FramedConnection { inner: Framed::Plain(c), max_frame }.into());
            }
            let r = crate::resumable::Resumable::start(
                inner.clone(),
                addr,
                r1,
                conn,
                restore,
                on_event,
                transport,
                false,
                None,
            );
            Ok(FramedConnection { inner: Framed::Resumable(r), max_frame }.into())
        })
    }

    /// The resumable sessions of the bridge's agent this device may join:
    /// its own, and, when it is one of the owner's own devices (paired by a
    /// code, or the account's), those the owner's other own devices started.
    /// `protocol`: `acp` (default) or `mcp`. Resolves with the bridge's list
    /// (`[{id, agent, startedBy: {node, name?}, sinceMs, state, attached:
    /// [{node, name?, role}], acpSessions, lastActivityMs, activity?}]`;
    /// `activity`: `asking`, `working` or `idle`); a refusal rejects with
    /// `kind: "closed"` and the bridge's `reason`.
    #[wasm_bindgen(
        unchecked_return_type = "Promise<Array<{id: string, agent: string, startedBy: {node: string, name?: string}, sinceMs: number, state: string, attached: Array<{node: string, name?: string, role: string}>, acpSessions: string[], lastActivityMs: number, activity?: string}>>"
    )]
    pub fn sessions(&self, target: String, protocol: Option<String>, timeout_ms: Option<u32>) -> Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            let v = listing(&inner, &target, protocol, false, timeout_ms).await?;
            Ok(Reflect::get(&v, &"sessions".into()).unwrap_or_default())
        })
    }

    /// The host the bridge's agent runs on, in one round trip: `{sessions,
    /// agents?, host?}`, the sessions of every agent of the host this device
    /// may join (as `sessions()`, each with its `agent`'s name), every agent
    /// it reaches (`[{name, label, protocol, ticket}]`) and the host's name.
    /// A single bridge, or one that predates host listings, answers with its
    /// own sessions and no `agents`.
    #[wasm_bindgen(
        js_name = hostSessions,
        unchecked_return_type = "Promise<{sessions: Array<any>, agents?: Array<{name: string, label: string, protocol: string, ticket: string}>, host?: string}>"
    )]
    pub fn host_sessions(
        &self,
        target: String,
        protocol: Option<String>,
        timeout_ms: Option<u32>,
    ) -> Promise {
        let inner = self.inner.clone();
        future_to_promise(async move { listing(&inner, &target, protocol, true, timeout_ms).await })
    }

    /// Joins session `id` (from `sessions()`) as one more device on it: a
    /// resumable session of this device's own (its own `sessionState()`, it
    /// resumes like any other) that sees the session's frames. `options`:
    /// `{ observe?: boolean (default false: take control), history?: "all"
    /// (default: the session from its start, as far as the bridge keeps it)
    /// | "now", protocol?: "acp" | "mcp", timeoutMs?, maxFrame?, onEvent?,
    /// idleTimeoutMs? }` (as for `connectProtocol`). Resolves once the bridge
    /// let it join; rejects with `kind: "closed"` and its `reason`
    /// (`unknown session`, `too many devices`, …) otherwise.
    #[wasm_bindgen(unchecked_return_type = "Promise<FramedConnection>")]
    pub fn attach(&self, target: String, id: String, options: JsValue) -> Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            let p: Protocol = opt(&options, "protocol")
                .as_string()
                .as_deref()
                .unwrap_or("acp")
                .parse()
                .map_err(input_error)?;
            let max_frame = frame_limit(opt(&options, "maxFrame").as_f64().map(|n| n as u32))?;
            let history = match opt(&options, "history").as_string() {
                None => History::All,
                Some(h) => History::parse(&h)
                    .ok_or_else(|| input_error("options.history must be \"all\" or \"now\""))?,
            };
            let join =
                Control::Join { id: id.clone(), observe: opt(&options, "observe").is_truthy(), history };
            let ResumeOptions { transport, on_event, .. } = ResumeOptions::parse(&options)?;
            let timeout_ms = opt(&options, "timeoutMs").as_f64().map(|n| n as u32);
            let r1 = resume_alpn(&p);
            let (conn, addr) =
                dial_conn(&inner, &target, &r1, Some((None, transport.clone())), timeout_ms).await?;
            let r = crate::resumable::Resumable::start(
                inner.clone(),
                addr,
                r1,
                conn,
                None,
                on_event,
                transport,
                false,
                Some(join),
            );
            r.welcomed().await.map_err(|e| {
                if Reflect::get(&e, &"reason".into()).ok().and_then(|r| r.as_string()).as_deref()
                    == Some(close::REASON_UNKNOWN_SESSION)
                {
                    let msg = format!("no session '{id}' this device may join: it ended, or it is not one of this device's nor (for a device paired by a code or the account's) of the owner's other devices");
                    js_error(&ErrorKind::Closed { code: close::CLOSE_CODE_REFUSED as u64, reason: close::REASON_UNKNOWN_SESSION.into() }, &msg)
                } else {
                    e
                }
            })?;
            Ok(FramedConnection { inner: Framed::Resumable(r), max_frame }.into())
        })
    }

    /// Pairs this client with a bridge using a one-time code (the `pair=` of a
    /// pairing link, beside its `ticket=`): afterwards this NodeId is allowed
    /// there and connects as usual. `name`: what the device is listed as
    /// (`iroh list`); `protocol`: `acp` (default) or `mcp`. Resolves with
    /// `{paired: true, name, agents}` (`agents`: from a host, every agent this
    /// device may reach now, each `{name, label, protocol, ticket}`); a refused
    /// code rejects with `kind: "closed"` and the bridge's `reason`
    /// (`pairing code expired`, `pairing code already used`, …).
    #[wasm_bindgen(
        unchecked_return_type = "Promise<{paired: boolean, name?: string, agents?: {name: string, label: string, protocol: string, ticket: string}[]}>"
    )]
    pub fn pair(
        &self,
        target: String,
        secret: String,
        name: Option<String>,
        protocol: Option<String>,
        timeout_ms: Option<u32>,
    ) -> Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            let p: Protocol = protocol.as_deref().unwrap_or("acp").parse().map_err(input_error)?;
            let c = dial(&inner, &target, pairing::pair_alpn(&p), timeout_ms).await?;
            c.write(&pairing::request(&secret, name.as_deref().unwrap_or_default())).await?;
            let _ = c.send.lock().await.finish();
            let mut recv = c.take_recv()?;
            let answer =
                recv.read_to_end(pairing::MAX_PAIR_ANSWER).await.map_err(|e| op_error(&c.conn, &c.me, e))?;
            c.close();
            let text = String::from_utf8_lossy(&answer);
            js_sys::JSON::parse(text.trim())
                .map_err(|_| input_error("the bridge's pairing answer is unreadable"))
        })
    }

    /// Closes the endpoint and every connection of this client.
    /// Puts a file on the workstation over this device's own connection to
    /// the agent at `target` (`thunderbolt/<p>/files1`): hashed here, checked
    /// there group by group, resumed from what the bridge holds when put
    /// again. `options`: `{mime?, session?, protocol?, timeoutMs?,
    /// onProgress?: (done, total) => void}`. Resolves with the receipt: `uri`
    /// (`file://` on the workstation) goes in a prompt as a `resource_link`.
    /// A refusal rejects with `kind: "closed"` and the bridge's `reason`.
    #[wasm_bindgen(
        js_name = putFile,
        unchecked_return_type = "Promise<{name: string, size: number, hash: string, uri: string, mime?: string, sent: number, resumedFrom: number}>"
    )]
    pub fn put_file(&self, target: String, bytes: Uint8Array, name: String, options: JsValue) -> Promise {
        let inner = self.inner.clone();
        let bytes = bytes.to_vec();
        future_to_promise(async move {
            let text = |k: &str| opt(&options, k).as_string();
            let args = crate::files::PutArgs {
                name,
                mime: text("mime"),
                session: text("session"),
                protocol: text("protocol"),
                timeout_ms: opt(&options, "timeoutMs").as_f64().map(|v| v as u32),
                on_progress: opt(&options, "onProgress").dyn_into().ok(),
            };
            crate::files::put(&inner, &target, bytes, args).await
        })
    }

    /// Gets a file from the workstation by its `file://` URI (inside the
    /// agent's workspace, or one this device put): `{name, size, hash,
    /// bytes, resumedFrom}`, every byte checked against the hash; a cut path
    /// is dialed again and only the rest asked for (`resumedFrom`: where the
    /// last resume started, 0 without one). `options`: `{protocol?,
    /// timeoutMs?, onProgress?}`.
    #[wasm_bindgen(
        js_name = getFile,
        unchecked_return_type = "Promise<{name: string, size: number, hash: string, bytes: Uint8Array, resumedFrom: number}>"
    )]
    pub fn get_file(&self, target: String, uri: String, options: JsValue) -> Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            let protocol = opt(&options, "protocol").as_string();
            let timeout_ms = opt(&options, "timeoutMs").as_f64().map(|v| v as u32);
            let on_progress = opt(&options, "onProgress").dyn_into().ok();
            crate::files::get(&inner, &target, uri, protocol, timeout_ms, on_progress).await
        })
    }

    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn shutdown(&self) -> Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            inner.ep().close().await;
            Ok(JsValue::UNDEFINED)
        })
    }
}

/// `finish`, `close`, `closed`, `sessionState`, `path` and `resumable`, the same on both connection classes
/// (wasm-bindgen classes cannot share an impl, so a macro writes it once).
macro_rules! session_controls {
    ($class:ident) => {
        #[wasm_bindgen]
        impl $class {
            /// Ends our side of the stream (the agent sees end of input).
            #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
            pub fn finish(&self) -> Promise {
                let inner = self.inner.clone();
                future_to_promise(async move {
                    inner.finish().await?;
                    Ok(JsValue::UNDEFINED)
                })
            }

            /// Closes the session (code 0, `client closed`); the bridge ends the agent.
            pub fn close(&self) {
                self.inner.close();
            }

            /// Resolves with `{kind, code, reason}` when the connection closes. After the
            /// agent ended: `kind: "agent"`, code 2, and `exitCode` or `signal`.
            #[wasm_bindgen(unchecked_return_type = "Promise<{kind: string, code?: number, reason: string, exitCode?: number, signal?: number}>")]
            pub fn closed(&self) -> Promise {
                self.inner.closed()
            }

            /// `{session, received}` of a resumable session (store it after each message
            /// taken to resume after a page reload: `connectProtocol(..., {session})`);
            /// `null` on the plain protocol.
            #[wasm_bindgen(js_name = sessionState)]
            pub fn session_state(&self) -> JsValue {
                match &self.inner {
                    Framed::Plain(_) => JsValue::NULL,
                    Framed::Resumable(r) => r.state(),
                }
            }

            /// The path the session's data takes now: `"relay"` (always, in a
            /// browser: it has no UDP), `"direct"`, or `"none"` while a
            /// resumable session is reconnecting.
            #[wasm_bindgen(getter)]
            pub fn path(&self) -> String {
                self.inner.path().to_string()
            }

            /// Whether this session resumes after a lost connection (the bridge speaks r1).
            #[wasm_bindgen(getter)]
            pub fn resumable(&self) -> bool {
                matches!(self.inner, Framed::Resumable(_))
            }

            /// Takes control of the session this device shares with others: its
            /// frames go to the agent, and the device that had control becomes
            /// an observer. The bridge answers with a `role` event (`onEvent`);
            /// asked again after a reconnect until it did. Throws on the plain protocol.
            #[wasm_bindgen(js_name = takeControl)]
            pub fn take_control(&self) -> Result<(), JsValue> {
                self.inner.resumable()?.set_role(Role::Controller)
            }

            /// Steps down to observer: nobody controls the session until a device takes control.
            pub fn observe(&self) -> Result<(), JsValue> {
                self.inner.resumable()?.set_role(Role::Observer)
            }

            /// This device's role on a session several devices share, as the bridge
            /// last said it: `"controller"`, `"observer"`, or `undefined` until it
            /// said one (a session nobody joined).
            #[wasm_bindgen(getter)]
            pub fn role(&self) -> Option<String> {
                match &self.inner {
                    Framed::Resumable(r) => r.role(),
                    Framed::Plain(_) => None,
                }
            }
        }
    };
}

session_controls!(IrohConnection);
session_controls!(FramedConnection);

/// One session: raw bytes in both directions.
#[wasm_bindgen]
pub struct IrohConnection {
    inner: Framed,
}

#[wasm_bindgen]
impl IrohConnection {
    /// Writes bytes; resolves once they are handed to QUIC.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn send(&self, data: Uint8Array) -> Promise {
        let inner = self.inner.clone();
        let bytes = data.to_vec();
        future_to_promise(async move {
            match &inner {
                Framed::Plain(c) => c.write(&bytes).await?,
                Framed::Resumable(r) => r.send_bytes(&bytes)?,
            }
            Ok(JsValue::UNDEFINED)
        })
    }

    /// The bytes from the bridge, as a `ReadableStream<Uint8Array>`. Can be taken once.
    #[wasm_bindgen(unchecked_return_type = "ReadableStream<Uint8Array>")]
    pub fn readable(&self) -> Result<web_sys::ReadableStream, JsValue> {
        match &self.inner {
            Framed::Plain(c) => {
                let s = c.chunks()?.map(|r| r.map(|b| Uint8Array::from(&b[..]).into()));
                Ok(wasm_streams::ReadableStream::from_stream(s).into_raw())
            }
            Framed::Resumable(r) => Ok(r.readable()),
        }
    }
}

/// `options` of `connect` and `connectProtocol`.
struct ResumeOptions {
    resume: bool,
    transport: iroh::endpoint::QuicTransportConfig,
    on_event: Option<js_sys::Function>,
    restore: Option<crate::resumable::Restore>,
}

/// `maxFrame`: the default, or at least the smallest frame limit.
fn frame_limit(max_frame: Option<u32>) -> Result<usize, JsValue> {
    match max_frame {
        None => Ok(MAX_FRAME_LEN),
        Some(n) if n >= MIN_FRAME_LEN as u32 => Ok(n as usize),
        Some(n) => Err(input_error(format!("maxFrame {n} is below {MIN_FRAME_LEN} bytes"))),
    }
}

impl ResumeOptions {
    fn parse(options: &JsValue) -> Result<Self, JsValue> {
        let get = |k: &str| opt(options, k);
        let resume = get("resume").as_bool().unwrap_or(true);
        let idle = match get("idleTimeoutMs").as_f64() {
            None => crate::resumable::DEFAULT_IDLE_TIMEOUT,
            Some(ms) if ms >= crate::resumable::MIN_IDLE_TIMEOUT.as_millis() as f64 && ms.is_finite() => {
                Duration::from_millis(ms as u64)
            }
            Some(_) => return Err(input_error("idleTimeoutMs must be a number of at least 300")),
        };
        let transport = crate::resumable::transport(idle).map_err(input_error)?;
        let on_event = get("onEvent").dyn_into::<js_sys::Function>().ok();
        let stored = get("session");
        let restore = if stored.is_object() {
            let token = Reflect::get(&stored, &"session".into()).ok().and_then(|v| v.as_string());
            let received = Reflect::get(&stored, &"received".into()).ok().and_then(|v| v.as_f64());
            match (token, received) {
                (Some(token), Some(r)) if r >= 0.0 => {
                    Some(crate::resumable::Restore { token, received: r as u64 })
                }
                _ => return Err(input_error("options.session must be a stored sessionState()")),
            }
        } else {
            None
        };
        Ok(Self { resume, transport, on_event, restore })
    }
}

/// A framed session: one connection, or a resumable session over many.
#[derive(Clone)]
enum Framed {
    Plain(Rc<ConnInner>),
    Resumable(Rc<crate::resumable::Resumable>),
}

impl Framed {
    fn resumable(&self) -> Result<&crate::resumable::Resumable, JsValue> {
        match self {
            Framed::Resumable(r) => Ok(r),
            Framed::Plain(_) => {
                Err(input_error("only a resumable session is shared by devices (the bridge speaks r1)"))
            }
        }
    }

    fn path(&self) -> &'static str {
        match self {
            Framed::Plain(c) => path_kind(&c.conn),
            Framed::Resumable(r) => r.path(),
        }
    }

    async fn finish(&self) -> Result<(), JsValue> {
        match self {
            Framed::Plain(c) => c.finish().await,
            Framed::Resumable(r) => {
                r.finish();
                Ok(())
            }
        }
    }

    fn close(&self) {
        match self {
            Framed::Plain(c) => c.close(),
            Framed::Resumable(r) => r.close(),
        }
    }

    fn closed(&self) -> Promise {
        match self {
            Framed::Plain(c) => c.closed(),
            Framed::Resumable(r) => r.closed(),
        }
    }
}

/// One session carrying JSON-RPC messages, one ndjson frame each.
#[wasm_bindgen]
pub struct FramedConnection {
    inner: Framed,
    max_frame: usize,
}

#[wasm_bindgen]
impl FramedConnection {
    /// Sends one message: an object (serialized with `JSON.stringify`) or a
    /// string holding one JSON value. Frames over `maxFrame` are rejected.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn send(&self, message: JsValue) -> Promise {
        let inner = self.inner.clone();
        let max_frame = self.max_frame;
        future_to_promise(async move {
            let text = match message.as_string() {
                Some(s) => {
                    if !is_json(s.as_bytes()) {
                        return Err(js_error(&ErrorKind::Frame, "the string is not one JSON value"));
                    }
                    s
                }
                None => js_sys::JSON::stringify(&message)
                    .map_err(|_| js_error(&ErrorKind::Frame, "the message cannot be serialized as JSON"))?
                    .as_string()
                    .ok_or_else(|| js_error(&ErrorKind::Frame, "the message serializes to nothing"))?,
            };
            let mut buf = bytes::BytesMut::new();
            encode_frame(text.trim().as_bytes(), &mut buf, max_frame)
                .map_err(|e| js_error(&ErrorKind::Frame, &e.to_string()))?;
            match &inner {
                Framed::Plain(c) => c.write(&buf).await?,
                Framed::Resumable(r) => r.send(buf.freeze())?,
            }
            Ok(JsValue::UNDEFINED)
        })
    }

    /// The messages from the bridge, parsed, as a `ReadableStream<any>`. Can be
    /// taken once. A frame over `maxFrame` or a line that is not JSON errors the
    /// stream (and closes the session).
    #[wasm_bindgen(unchecked_return_type = "ReadableStream<any>")]
    pub fn messages(&self) -> Result<web_sys::ReadableStream, JsValue> {
        let conn = match &self.inner {
            Framed::Plain(c) => c.clone(),
            Framed::Resumable(r) => return Ok(r.readable()),
        };
        let chunks = conn.chunks()?;
        let inner = conn.clone();
        let framed = futures::stream::unfold(
            (Box::pin(chunks), LineFramer::new(self.max_frame), std::collections::VecDeque::new(), false),
            move |(mut chunks, mut framer, mut ready, mut done)| {
                let inner = inner.clone();
                async move {
                    loop {
                        if let Some(item) = ready.pop_front() {
                            return Some((item, (chunks, framer, ready, done)));
                        }
                        if done {
                            return None;
                        }
                        match chunks.next().await {
                            Some(Ok(bytes)) => framer.push(&bytes),
                            Some(Err(e)) => {
                                ready.push_back(Err(e));
                                done = true;
                                continue;
                            }
                            None => {
                                done = true;
                                if let Some(rest) = framer.finish() {
                                    ready.push_back(parse_frame(&rest));
                                }
                                continue;
                            }
                        }
                        loop {
                            match framer.next_frame() {
                                Ok(Some(f)) if is_blank(&f) => {}
                                Ok(Some(f)) => ready.push_back(parse_frame(&f)),
                                Ok(None) => break,
                                Err(e) => {
                                    inner.close();
                                    ready.push_back(Err(js_error(&ErrorKind::Frame, &e.to_string())));
                                    done = true;
                                    break;
                                }
                            }
                        }
                    }
                }
            },
        );
        Ok(wasm_streams::ReadableStream::from_stream(framed).into_raw())
    }
}
