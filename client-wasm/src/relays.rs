//! Several relays: every relay a dialed ticket names becomes one of ours
//! (`ClientInner::add_relays`), the endpoint is kept homed on one that
//! answers, and a resumable connection whose relay was lost is dropped at
//! once to be redialed through another (as the bridge's own client does:
//! `bridge/src/net.rs` `keep_a_home_relay`, `bridge/src/paths.rs` `relay_gone`).

use std::{
    rc::{Rc, Weak},
    time::Duration,
};

use futures::{Stream, StreamExt};
use iroh::{
    endpoint::{Connection, RelayStatus},
    Endpoint, EndpointAddr, RelayConfig, RelayUrl, TransportAddr,
};
use n0_watcher::Watcher;

use crate::client::ClientInner;

impl ClientInner {
    /// Makes every relay `addr` names one of ours (a ticket of a bridge with
    /// several relays names them all), so that one lost leaves the others.
    /// Into the endpoint's map only (its clones share it): iroh weighs them at
    /// its next report, which [`keep_a_home_relay`] makes at once when there
    /// is no home relay that answers; one that does is kept.
    pub(crate) fn add_relays(&self, addr: &EndpointAddr) {
        for url in addr.relay_urls() {
            if !self.relays.contains(url) {
                self.relays.insert(url.clone(), RelayConfig::from(url.clone()).into());
            }
        }
    }
}

/// How often an endpoint whose home relay is gone is made to look for
/// another (as the bridge's `REHOME_EVERY`): iroh looks again by itself only
/// at its periodic re-check, 20–26 s later.
const REHOME_EVERY: Duration = Duration::from_secs(1);

/// ... doubling while none answers, up to this: a phone offline does not run
/// iroh's report every second for as long as it is offline.
const REHOME_MAX: Duration = Duration::from_secs(30);

/// A fresh endpoint in place of the one of `generation` (see
/// [`ClientInner::replace_endpoint`]), kept homed on a relay like the first.
pub(crate) async fn renew(client: &Rc<ClientInner>, generation: u32) {
    if client.replace_endpoint(generation).await {
        keep_a_home_relay(client);
    }
}

/// Keeps the client's endpoint homed on a relay that answers, while it has
/// several: when its home relay is lost, iroh is made to choose again at once
/// (re-inserting a relay's own configuration changes nothing but makes it run
/// its report now, which homes it on the nearest relay that answers), and
/// again every [`REHOME_EVERY`] until one is home; so too when its first
/// report found none (the relay it was given is down, a ticket named others).
/// Ends with the client.
pub(crate) fn keep_a_home_relay(client: &Rc<ClientInner>) {
    // The task holds neither the client nor its endpoint: it ends when they go.
    let statuses = client.ep().home_relay_status().stream();
    let generation = client.generation();
    wasm_bindgen_futures::spawn_local(rehome(Rc::downgrade(client), generation, statuses));
}

async fn rehome(
    client: Weak<ClientInner>,
    generation: u32,
    mut statuses: impl Stream<Item = Vec<RelayStatus>> + Unpin,
) {
    use n0_future::time::{timeout, Instant};
    // While no home relay answers: when to make iroh look again.
    let mut look: Option<Instant> = None;
    let mut gap = REHOME_EVERY;
    loop {
        let next = match look {
            None => Ok(statuses.next().await),
            Some(at) => timeout(at.saturating_duration_since(Instant::now()), statuses.next()).await,
        };
        // A fresh endpoint has a task of its own.
        let Some(c) = client.upgrade().filter(|c| c.generation() == generation && !c.ep().is_closed()) else {
            return;
        };
        match next {
            Ok(None) => return,
            Ok(Some(list)) => {
                let home = list.first();
                if home.is_some_and(RelayStatus::is_connected) {
                    look = None;
                    gap = REHOME_EVERY;
                    continue;
                }
                if look.is_some() {
                    continue;
                }
                look = Some(Instant::now() + gap);
                // None chosen yet: the first report is given its time. Lost: look now.
                if home.is_none() {
                    continue;
                }
            }
            Err(_) => {
                gap = (gap * 2).min(REHOME_MAX);
                look = Some(Instant::now() + gap);
            }
        }
        if c.relays.len() > 1 {
            if let Some(cfg) = c.relays.relays::<Vec<_>>().pop() {
                c.ep().insert_relay(cfg.url.clone(), cfg).await;
            }
        }
    }
}

/// Resolves, saying why, once the relay `conn`'s selected path goes through
/// is this endpoint's home relay and that was lost: what a browser can know
/// (it cannot probe a relay itself). The caller drops the connection and
/// redials, through another relay, instead of waiting out the idle timeout.
pub(crate) async fn path_lost(ep: &Endpoint, conn: &Connection) -> String {
    let mut statuses = ep.home_relay_status().stream();
    // The home relay last seen connected: one that merely became home is
    // "connecting" at first, and is not lost.
    let mut up: Option<RelayUrl> = None;
    while let Some(list) = statuses.next().await {
        let Some(home) = list.first() else { continue };
        let url = home.url();
        if home.is_connected() {
            up = Some(url.clone());
        } else if up.as_ref() == Some(url)
            && conn
                .paths()
                .iter()
                .any(|p| p.is_selected() && matches!(p.remote_addr(), TransportAddr::Relay(u) if u == url))
        {
            return format!("the relay it went through ({url}) was lost");
        }
    }
    futures::future::pending().await
}
