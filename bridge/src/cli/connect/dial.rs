//! Reaching the bridge: the resumable ALPN offered first (the plain one
//! beside it), a dial given up when the relay refused us, and a failure
//! told in words that say what to do; then the connection handed to the
//! session pump ([`super::pipe`]).
//!
//! Apart from the command and the pump: working out why a dial failed reads
//! the relay, discovery and the ticket, and is most of what can go wrong
//! before a session starts.

use std::time::Duration;

use anyhow::{anyhow, Result};
use iroh::{
    endpoint::{ConnectOptions, Connection, VarInt},
    EndpointAddr, TransportAddr,
};
use thunderbolt_shared::{
    close::{self, is_alpn_refusal},
    resume, words, EndpointTicket, Protocol, Target,
};
use tracing::debug;

use super::pipe::pipe;
use crate::{cli::args::ConnectArgs, net::Relays};

/// A refused connection is closed by the bridge right after the handshake, so
/// "connected" is only said once the bridge sent data or this many handshake
/// durations passed without a refusal (bounded both ways below).
const ADMISSION_SETTLE_FACTOR: u32 = 3;
const ADMISSION_SETTLE_MIN: Duration = Duration::from_millis(200);
const ADMISSION_SETTLE_MAX: Duration = Duration::from_secs(2);

/// `dial`, given up early when it can only go through the relay and the
/// relay refused this device (the reason is then found by [`unreachable`]).
async fn relay_or_bust<T>(
    ep: &iroh::Endpoint,
    target: &Target,
    dial: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    if target.endpoint_addr().ip_addrs().next().is_some() {
        return dial.await;
    }
    tokio::select! {
        r = dial => r,
        _ = crate::net::relay_denied(ep) => Err(anyhow!("the relay refused this device")),
    }
}

/// What a dial is: from this endpoint, to that bridge, for a protocol, with
/// these network settings (what a failure's words are worked out from).
#[derive(Clone, Copy)]
pub(super) struct Dial<'a> {
    pub(super) ep: &'a iroh::Endpoint,
    pub(super) target: &'a Target,
    pub(super) protocol: &'a Protocol,
    pub(super) net: &'a crate::net::NetConfig,
}

/// Why a dial failed (`err`: iroh's words, `None` for our own timeout), in
/// one line that says what to do.
async fn unreachable(d: Dial<'_>, secs: u64, err: Option<String>) -> anyhow::Error {
    let Dial { ep, target, protocol, net } = d;
    let id = target.id();
    let text = err.unwrap_or_default();
    if is_alpn_refusal(&text) {
        return anyhow!(
            "{id} does not serve {protocol} (ALPN {} refused): is it {}?",
            String::from_utf8_lossy(&protocol.alpn()),
            protocol.with_article("bridge")
        );
    }
    if words::is_identity_mismatch(&text) {
        return anyhow!(words::OTHER_IDENTITY);
    }
    // The relay turned this device away: nothing reaches the bridge through it.
    if let Some(why) = crate::net::relay_refusal(ep) {
        return anyhow!("{why}: ask its operator to allow this device ({}), or use another relay", ep.id());
    }
    let no_addr = target.endpoint_addr().addrs.is_empty();
    if no_addr && matches!(target, Target::Ticket(_)) {
        return anyhow!(words::NO_ADDRESS);
    }
    if no_addr {
        let discovery = if net.discovery == crate::net::Discovery::Off {
            "discovery is off (THUNDERBOLT_IROH_DISCOVERY=off)"
        } else {
            "discovery found none"
        };
        return anyhow!(
            "could not connect to {id}: a bare NodeId carries no address and {discovery}: use the \
             ticket from the bridge's banner, or --relay-url with the bridge's relay"
        );
    }
    let problem = crate::net::relay_problem(ep, net).await;
    let timed_out = text.is_empty() || text.to_ascii_lowercase().contains("timed out");
    if let (Some(p), true, Some(url)) = (&problem, timed_out, net.relays.urls().first()) {
        // Never out of this device at all: the page's words, then what we found.
        return anyhow!("{}; {p}", words::relay_unreachable(url.as_str()));
    }
    let relay = problem.map(|p| format!("; the relay: {p}")).unwrap_or_default();
    if timed_out {
        return anyhow!(
            "could not reach {id} within {secs}s: is the bridge running, and does the ticket carry a \
             reachable address or relay?{relay}"
        );
    }
    anyhow!("could not connect to {id}: {text}{relay}")
}

/// One connection with `alpn` for a one-off exchange (a pairing, a listing),
/// within `dial_timeout` seconds; a bridge that refuses the ALPN gets
/// `refused`'s words, any other failure [`unreachable`]'s.
pub(super) async fn dial_one(
    d: Dial<'_>,
    alpn: &[u8],
    dial_timeout: u64,
    refused: impl FnOnce() -> anyhow::Error,
) -> Result<Connection> {
    let Dial { ep, target, .. } = d;
    let dial = tokio::time::timeout(
        Duration::from_secs(dial_timeout),
        relay_or_bust(ep, target, async {
            ep.connect(target.endpoint_addr(), alpn).await.map_err(anyhow::Error::from)
        }),
    );
    match dial.await {
        Err(_) => Err(unreachable(d, dial_timeout, None).await),
        Ok(Err(e)) if is_alpn_refusal(&format!("{e:#}")) => Err(refused()),
        Ok(Err(e)) => Err(unreachable(d, dial_timeout, Some(format!("{e:#}"))).await),
        Ok(Ok(c)) => Ok(c),
    }
}

/// A bare NodeId carries no address. With relays of our own (`--relay-url`, e.g. a
/// self-hosted relay) the bridge is assumed to use them, as the browser client
/// does, so a NodeId dials without discovery; with n0's relays discovery finds it.
pub(super) fn with_relay_hint(target: Target, relays: &Relays) -> Target {
    match (&target, relays) {
        (Target::NodeId(id), Relays::Custom(urls)) => Target::Ticket(EndpointTicket::new(
            EndpointAddr::new(*id).with_addrs(urls.iter().cloned().map(TransportAddr::Relay)),
        )),
        _ => target,
    }
}

pub(super) async fn dial_and_pipe(
    d: Dial<'_>,
    client: &crate::net::ClientEndpoint,
    args: ConnectArgs,
    reached: &mut bool,
) -> Result<()> {
    let Dial { ep, target, protocol, .. } = d;
    let alpn = protocol.alpn();
    debug!(target = %target.id(), "dialing");
    let dial_started = tokio::time::Instant::now();
    let dial = async {
        if args.no_resume {
            return ep.connect(target.endpoint_addr(), &alpn).await.map_err(anyhow::Error::from);
        }
        // The resumable protocol first; a bridge without it picks the plain one.
        let opts = ConnectOptions::new().with_additional_alpns(vec![alpn.clone()]);
        let connecting =
            ep.connect_with_opts(target.endpoint_addr(), &resume::resume_alpn(protocol), opts).await?;
        Ok(connecting.await?)
    };
    let dial =
        tokio::time::timeout(Duration::from_secs(args.dial_timeout), relay_or_bust(ep, target, dial)).await;
    let conn = match dial {
        Err(_) => return Err(unreachable(d, args.dial_timeout, None).await),
        Ok(Err(e)) => return Err(unreachable(d, args.dial_timeout, Some(format!("{e:#}"))).await),
        Ok(Ok(c)) => c,
    };
    *reached = true;
    debug!(bridge = %conn.remote_id().fmt_short(), "handshake done");
    let settle =
        (dial_started.elapsed() * ADMISSION_SETTLE_FACTOR).clamp(ADMISSION_SETTLE_MIN, ADMISSION_SETTLE_MAX);
    let join = args.attach.as_ref().map(|id| resume::Control::Join {
        id: id.clone(),
        observe: args.observe,
        history: args.history.into(),
    });
    let result = pipe(client, target, &conn, protocol, args.command, settle, join).await;
    conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_CLIENT_CLOSED.as_bytes());
    result
}
