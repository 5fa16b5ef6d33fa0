//! `thunderbolt sessions <ticket>`: asks the bridge which sessions this
//! device may join (`--attach`), and prints them.
//!
//! Apart from `connect`'s session: a one-off exchange on its own
//! connection, with a printout of its own.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use iroh::endpoint::VarInt;
use thunderbolt_shared::{close, resume, Protocol};

use super::{
    describe_close,
    dial::{dial_one, with_relay_hint, Dial},
    not_ourselves, CLOSE_FLUSH_TIMEOUT,
};
use crate::{home::Home, identity, limits};

/// The longest listing a bridge may send (a few hundred bytes per session,
/// a few dozen sessions at most).
const MAX_LISTING: usize = 1 << 20;

/// How long the bridge may take to answer a listing once connected.
const LISTING_TIMEOUT: Duration = Duration::from_secs(10);

/// `thunderbolt sessions <ticket>`: the sessions of the bridge's agent this
/// device may join, one per line (or the bridge's JSON).
pub async fn sessions(home: &Home, args: crate::cli::args::SessionsArgs) -> Result<()> {
    use thunderbolt_shared::devices::Activity;
    let protocol: Protocol = args.protocol.parse().map_err(|e| anyhow!("--protocol: {e}"))?;
    let net = args.net.config()?;
    let target = with_relay_hint(args.target.parse()?, &net.relays);
    let (key, _) = identity::load_or_create(home, &Protocol::acp())?;
    not_ourselves(home, &target, &key, &protocol)?;
    let ep = net.bind(key, vec![], limits::IDLE_TIMEOUT).await?;
    let d = Dial { ep: &ep, target: &target, protocol: &protocol, net: &net };
    let result = list_sessions(d, args.dial_timeout, args.host).await;
    crate::net::close_endpoint(ep, CLOSE_FLUSH_TIMEOUT).await;
    let listing = result?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&listing)?);
        return Ok(());
    }
    if let Some(agents) = &listing.agents {
        let name = listing.host.as_deref().unwrap_or("the host");
        println!("{name}: {} agent(s) you reach", agents.len());
        for a in agents {
            println!(
                "  {} ({}, {}): thunderbolt {} connect {}",
                a.name, a.label, a.protocol, a.protocol, a.ticket
            );
        }
    } else if args.host {
        println!("(not a host of several agents, or an older version: this agent's sessions only)");
    }
    if listing.sessions.is_empty() {
        let of = if listing.agents.is_some() { "the host" } else { "this agent" };
        println!(
            "no session of {of} you may join (start one with `thunderbolt {protocol} connect <ticket>`)"
        );
        return Ok(());
    }
    let now = crate::devices::now_ms();
    let ago = |ms: u64| {
        let s = now.saturating_sub(ms) / 1000;
        match s {
            0..=59 => format!("{s}s"),
            60..=3599 => format!("{}m", s / 60),
            _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        }
    };
    for s in &listing.sessions {
        let attached: Vec<String> =
            s.attached.iter().map(|a| format!("{} ({})", a.device.label(), a.role.as_str())).collect();
        let mut state =
            if attached.is_empty() { s.state.clone() } else { format!("attached: {}", attached.join(", ")) };
        match s.activity {
            Some(Activity::Asking) => state.push_str("; needs an answer"),
            Some(Activity::Working) => state.push_str("; working"),
            Some(Activity::Idle) => state.push_str("; idle"),
            None => {}
        }
        println!(
            "{}  {}  started by {} {} ago; {}; last activity {} ago{}",
            s.id,
            s.agent,
            s.started_by.label(),
            ago(s.since_ms),
            state,
            ago(s.last_activity_ms),
            if s.acp_sessions.is_empty() {
                String::new()
            } else {
                format!("; ACP {}", s.acp_sessions.join(", "))
            }
        );
    }
    println!(
        "join one: thunderbolt {protocol} connect --attach <id> [--observe] [--history all|now] <ticket>"
    );
    Ok(())
}

/// Asks the bridge for its listing.
async fn list_sessions(
    d: Dial<'_>,
    dial_timeout: u64,
    host: bool,
) -> Result<thunderbolt_shared::devices::Listing> {
    let Dial { target, protocol, .. } = d;
    let conn = dial_one(d, &resume::resume_alpn(protocol), dial_timeout, || {
        anyhow!(
            "{} offers no resumable sessions (it runs with --no-resume, or predates them): nothing to join",
            target.id()
        )
    })
    .await?;
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(&resume::Control::List { host }.encode()).await?;
        anyhow::Ok(recv.read_to_end(MAX_LISTING).await?)
    };
    let answer = tokio::time::timeout(LISTING_TIMEOUT, exchange).await;
    let refused = conn.close_reason();
    conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_CLIENT_CLOSED.as_bytes());
    let answer = match (answer, refused) {
        (Ok(Ok(a)), _) if !a.is_empty() => a,
        (_, Some(err)) => bail!("{}", describe_close(&err, protocol)),
        (Ok(Ok(_)), None) => {
            bail!("the bridge answered nothing: it does not list sessions (an older version?)")
        }
        (Ok(Err(e)), None) => bail!("the listing failed: {e:#}"),
        (Err(_), None) => bail!("the bridge did not answer within {LISTING_TIMEOUT:?}"),
    };
    serde_json::from_slice(answer.trim_ascii())
        .map_err(|e| anyhow!("the bridge's listing is unreadable: {e}"))
}
