//! `connect`'s endpoint: renewed when the old one may be stuck behind a dead
//! relay, the old one closed in the background.

use std::time::Duration;

use anyhow::Result;
use iroh::{Endpoint, SecretKey};
use tracing::debug;

use super::{close_endpoint, keep_a_home_relay, NetConfig};

/// `connect`'s endpoint, which a fresh one replaces when the old one may be
/// stuck. iroh sends every relay datagram of an endpoint through one queue,
/// which waits whenever one relay's own queue (64 datagrams) is full; a relay
/// that died refuses every reconnection at once and sleeps its backoff in
/// between, and never empties its queue (it drops what it holds only after 3
/// s of one dial; it gives up only after 60 s idle). A connection that still
/// sent through the dead relay until its death was noticed fills that queue
/// easily, and from then on nothing leaves the endpoint through any relay:
/// the redial to the live one never goes out (issue 59). A fresh endpoint
/// (same key, so the same device to the bridge) has none of that; the old
/// one is closed in the background. Each endpoint keeps a home relay of its
/// own ([`keep_a_home_relay`]).
pub struct ClientEndpoint {
    net: NetConfig,
    key: SecretKey,
    idle: Duration,
    now: std::sync::Mutex<(Endpoint, tokio_util::task::AbortOnDropHandle<()>)>,
    /// Old endpoints, closing.
    closing: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// How long an old endpoint gets to close (in the background): its
/// connections drain for three probe timeouts at most.
const OLD_ENDPOINT_CLOSE: Duration = Duration::from_secs(10);

impl ClientEndpoint {
    /// Binds a dial-only endpoint with `key` (see [`NetConfig::bind`]).
    pub async fn bind(net: &NetConfig, key: SecretKey, idle: Duration) -> Result<Self> {
        let ep = net.bind(key.clone(), vec![], idle).await?;
        let rehome = Self::rehome(&ep, net);
        Ok(Self {
            net: net.clone(),
            key,
            idle,
            now: std::sync::Mutex::new((ep, rehome)),
            closing: std::sync::Mutex::new(Vec::new()),
        })
    }

    fn rehome(ep: &Endpoint, net: &NetConfig) -> tokio_util::task::AbortOnDropHandle<()> {
        tokio_util::task::AbortOnDropHandle::new(tokio::spawn(keep_a_home_relay(
            ep.clone(),
            net.relays.clone(),
        )))
    }

    /// The endpoint to dial from now.
    pub fn current(&self) -> Endpoint {
        self.now.lock().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    /// A fresh endpoint in place of the current one, which is closed in the
    /// background (`why` is logged).
    pub async fn renew(&self, why: &str) -> Result<Endpoint> {
        let ep = self.net.bind(self.key.clone(), vec![], self.idle).await?;
        let rehome = Self::rehome(&ep, &self.net);
        let (old, _old_rehome) =
            std::mem::replace(&mut *self.now.lock().unwrap_or_else(|p| p.into_inner()), (ep.clone(), rehome));
        debug!("dialing from a fresh endpoint: {why}");
        let closing = tokio::spawn(close_endpoint(old, OLD_ENDPOINT_CLOSE));
        let mut all = self.closing.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|c| !c.is_finished());
        all.push(closing);
        Ok(ep)
    }

    /// Closes the current endpoint within `budget`, and waits (as long) for
    /// old ones still closing.
    pub async fn close(self, budget: Duration) {
        let (ep, rehome) = self.now.into_inner().unwrap_or_else(|p| p.into_inner());
        drop(rehome);
        let old = self.closing.into_inner().unwrap_or_else(|p| p.into_inner());
        let old = async {
            for c in old {
                let _ = c.await;
            }
        };
        let (_, done) = tokio::join!(close_endpoint(ep, budget), tokio::time::timeout(budget, old));
        if done.is_err() {
            debug!("an old endpoint did not finish closing within {budget:?}");
        }
    }
}
