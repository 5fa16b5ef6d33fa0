//! The bridge: accept connections, admit trusted peers, run one agent each.
//!
//! Task ownership is explicit: the accept loop owns a `JoinSet` with one task
//! per incoming connection; shutdown cancels a token every session watches,
//! then waits for all of them so no agent outlives the bridge.

use std::{sync::Arc, time::Duration};

use iroh::{
    endpoint::{Connection, Incoming},
    Endpoint, EndpointId,
};
use thunderbolt_shared::close;
use tokio::{sync::Semaphore, task::JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    session::{self, refuse, SessionConfig},
    trust::{Grant, TrustPolicy},
};

/// Admission settings.
#[derive(Debug, Clone)]
pub struct Admission {
    pub max_agents: usize,
    pub handshake_timeout: Duration,
    pub stream_open_timeout: Duration,
}

impl Default for Admission {
    fn default() -> Self {
        Self {
            max_agents: crate::limits::MAX_LIVE_AGENTS,
            handshake_timeout: crate::limits::HANDSHAKE_TIMEOUT,
            stream_open_timeout: crate::limits::STREAM_OPEN_TIMEOUT,
        }
    }
}

/// Everything a connection task needs.
#[derive(Debug)]
struct Shared {
    trust: Arc<dyn TrustPolicy>,
    admission: Admission,
    agents: Arc<Semaphore>,
    session: Arc<SessionConfig>,
    shutdown: CancellationToken,
}

/// A running bridge.
#[derive(Debug)]
pub struct Bridge {
    endpoint: Endpoint,
    shared: Arc<Shared>,
}

impl Bridge {
    pub fn new(
        endpoint: Endpoint,
        trust: Arc<dyn TrustPolicy>,
        admission: Admission,
        session: SessionConfig,
    ) -> Self {
        let shared = Arc::new(Shared {
            trust,
            agents: Arc::new(Semaphore::new(admission.max_agents)),
            admission,
            session: Arc::new(session),
            shutdown: CancellationToken::new(),
        });
        Self { endpoint, shared }
    }

    /// Serves until `stop` is cancelled, then ends every session (agents killed
    /// and reaped) and closes the endpoint.
    pub async fn run(self, stop: CancellationToken) {
        let mut tasks = JoinSet::new();
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                incoming = self.endpoint.accept() => {
                    let Some(incoming) = incoming else { break };
                    tasks.spawn(handle_incoming(incoming, self.shared.clone()));
                }
                Some(res) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Err(e) = res {
                        if e.is_panic() {
                            warn!("connection task panicked: {e}");
                        }
                    }
                }
            }
        }
        info!("shutting down: ending {} connection(s)", tasks.len());
        self.shared.shutdown.cancel();
        while tasks.join_next().await.is_some() {}
        let _ = tokio::time::timeout(crate::limits::ENDPOINT_CLOSE_TIMEOUT, self.endpoint.close()).await;
    }
}

async fn handle_incoming(incoming: Incoming, shared: Arc<Shared>) {
    let from = format!("{:?}", incoming.remote_addr());
    let accepting = match incoming.accept() {
        Ok(a) => a,
        Err(e) => {
            debug!(%from, "incoming connection failed before the handshake: {e}");
            return;
        }
    };
    let conn = tokio::select! {
        r = tokio::time::timeout(shared.admission.handshake_timeout, accepting) => match r {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                debug!(%from, "handshake failed: {e}");
                return;
            }
            Err(_) => {
                info!(%from, "dropping connection: {}", close::REASON_HANDSHAKE_TIMEOUT);
                return;
            }
        },
        _ = shared.shutdown.cancelled() => return,
    };
    let peer = conn.remote_id();
    let Some(grant) = shared.trust.check(&peer) else {
        info!(
            peer = %peer.fmt_short(),
            "refused {peer}: not allowlisted (to admit it: thunderbolt iroh allow {peer})"
        );
        refuse(&conn, close::REASON_NOT_ALLOWLISTED);
        return;
    };
    admitted(conn, peer, grant, shared).await;
}

async fn admitted(conn: Connection, peer: EndpointId, grant: Grant, shared: Arc<Shared>) {
    let short = peer.fmt_short().to_string();
    info!(peer = %short, "admitted {peer} ({grant})");
    let stream = tokio::select! {
        r = tokio::time::timeout(shared.admission.stream_open_timeout, conn.accept_bi()) => r,
        _ = shared.shutdown.cancelled() => {
            refuse(&conn, close::REASON_SHUTTING_DOWN);
            return;
        }
    };
    let (send, recv) = match stream {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            info!(peer = %short, "peer left before opening a stream: {e}");
            return;
        }
        Err(_) => {
            info!(peer = %short, "closing: {}", close::REASON_IDLE);
            refuse(&conn, close::REASON_IDLE);
            return;
        }
    };
    let Ok(permit) = shared.agents.clone().try_acquire_owned() else {
        warn!(peer = %short, "refusing: {} ({} agents running)", close::REASON_AT_CAPACITY, shared.admission.max_agents);
        refuse(&conn, close::REASON_AT_CAPACITY);
        return;
    };
    session::run(conn, send, recv, shared.session.clone(), permit, shared.shutdown.clone()).await;
}
