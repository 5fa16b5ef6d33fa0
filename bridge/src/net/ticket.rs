//! The address a ticket carries: waiting (bounded) until the endpoint knows
//! how it is reached, with every relay of ours in it.

use std::time::Duration;

use iroh::{Endpoint, EndpointAddr, TransportAddr, Watcher};
use tracing::{debug, warn};

use super::{relay_problem, NetConfig, Relays};
use crate::limits;

/// Waits (bounded) until the endpoint knows how it can be reached, then returns
/// its address, and why the relay is not reached when it is not. Never
/// hangs: without a relay we return direct addresses only.
pub async fn reachable_addr(ep: &Endpoint, net: &NetConfig) -> (EndpointAddr, Option<String>) {
    let mut w = ep.watch_addr();
    let direct = tokio::time::timeout(limits::DIRECT_ADDR_TIMEOUT, async {
        loop {
            if w.get().ip_addrs().next().is_some() {
                break;
            }
            if w.updated().await.is_err() {
                break;
            }
        }
    });
    if direct.await.is_err() {
        debug!("no direct address after {:?}", limits::DIRECT_ADDR_TIMEOUT);
    }
    let mut problem = None;
    if net.relays != Relays::Disabled {
        problem = wait_online(ep, net, limits::RELAY_ONLINE_TIMEOUT).await;
    }
    (ticket_addr(ep.addr(), &net.relays), problem)
}

/// `addr` (an endpoint's own: its home relay and direct addresses) with
/// every relay of our own it is configured with: a ticket printed while one
/// relay is home still reaches the bridge through another after that one
/// died. (n0's public relays are left to n0's discovery: every ticket would
/// otherwise grow by all of them.)
pub fn ticket_addr(addr: EndpointAddr, relays: &Relays) -> EndpointAddr {
    match relays {
        Relays::Custom(urls) if urls.len() > 1 => {
            let extra: Vec<TransportAddr> = urls.iter().cloned().map(TransportAddr::Relay).collect();
            addr.with_addrs(extra)
        }
        _ => addr,
    }
}

/// Waits for the home relay; when it does not come, says why (logged, and returned).
async fn wait_online(ep: &Endpoint, net: &NetConfig, timeout: Duration) -> Option<String> {
    if tokio::time::timeout(timeout, ep.online()).await.is_ok() {
        return None;
    }
    let problem = relay_problem(ep, net).await;
    let why = problem.as_deref().map(|w| format!(": {w}")).unwrap_or_default();
    warn!(
        "no relay reachable within {timeout:?}{why}; browsers cannot reach this bridge until one is. \
         The ticket carries direct addresses only (works on this host and LAN); the relay is retried \
         in the background"
    );
    problem
}
