//! Reaching a bridge: a dial with its timeout and the words for what went
//! wrong (a relay out of reach, another identity), through the resumable
//! protocol with the plain one as a fallback, and a listing of sessions.
//! Apart from the client's endpoint (client.rs), which every dial uses and
//! which knows nothing of what is dialed.

use std::{rc::Rc, time::Duration};

use iroh::{endpoint::Connection, TransportAddr};
use js_sys::Reflect;
use thunderbolt_shared::{
    resume::{resume_alpn, Control},
    words, Protocol, Target,
};
use wasm_bindgen::prelude::*;

use crate::{
    client::{open_plain, ClientInner, ConnInner},
    errors::{classify_text, ErrorKind, DEFAULT_DIAL_TIMEOUT_MS},
    js::{input_error, js_error, op_error},
};

/// How long the bridge may take to answer a listing.
const LISTING_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest listing read (a few dozen sessions take a few KiB).
const MAX_LISTING: usize = 1 << 20;

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
