//! Whether an endpoint's home relay is reachable, told the truth about: a
//! bridge that a browser cannot reach (browsers come only through the relay)
//! must never look healthy. Every change is one log line at the default level
//! (connected; lost or unreachable, with the cause), and [`RelayHealth`] keeps
//! what `thunderbolt status` shows: connected or not, since when, how many
//! times it dropped, the last error.

use std::{
    sync::{Arc, Mutex},
    time::SystemTime,
};

use futures::StreamExt;
use iroh::Watcher;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{net::describe_relay_failure as describe, serve::Served};

/// The home relay as last seen.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RelayState {
    /// The home relay's URL; `None` with relays disabled or before one is picked.
    pub url: Option<String>,
    pub connected: bool,
    /// Since when it is connected (or not).
    pub since: Option<SystemTime>,
    /// Times a connection to it was lost.
    pub drops: u64,
    /// The most recent failure, in words.
    pub last_error: Option<String>,
    /// Every relay the endpoint is configured with, as last probed.
    pub relays: Vec<RelayProbe>,
}

/// One configured relay, as the last probe found it.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RelayProbe {
    pub url: String,
    /// Whether it took a connection at the last probe (`None` before one).
    pub reachable: Option<bool>,
    /// How long its TCP handshake took, at the last probe that reached it.
    pub latency_ms: Option<f64>,
    /// Since when it is reachable (or not).
    pub since: Option<SystemTime>,
    pub last_error: Option<String>,
}

/// How often every configured relay is probed for `status` (a TCP
/// handshake each: nothing a relay notices).
pub const RELAY_PROBE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// A relay that does not take a connection within this is unreachable.
pub const RELAY_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Probes every relay `agent`'s endpoint is configured with, now and every
/// [`RELAY_PROBE_EVERY`], until `stop`.
pub async fn probe(agent: Arc<Served>, stop: CancellationToken) {
    let urls = agent.relay.relays().urls();
    if urls.is_empty() {
        return;
    }
    loop {
        for url in &urls {
            let t0 = std::time::Instant::now();
            let (host, port) =
                (url.host_str().unwrap_or_default().to_string(), url.port_or_known_default().unwrap_or(443));
            let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
            let r =
                tokio::time::timeout(RELAY_PROBE_TIMEOUT, tokio::net::TcpStream::connect((host, port))).await;
            let (ok, error) = match r {
                Ok(Ok(_)) => (true, None),
                Ok(Err(e)) => (false, Some(describe(&e.to_string()))),
                Err(_) => (false, Some(format!("no answer within {RELAY_PROBE_TIMEOUT:?}"))),
            };
            let latency = ok.then(|| t0.elapsed().as_secs_f64() * 1e3);
            agent.relay.update(|s| {
                let text = url.to_string();
                let i = match s.relays.iter().position(|r| r.url == text) {
                    Some(i) => i,
                    None => {
                        s.relays.push(RelayProbe { url: text, ..RelayProbe::default() });
                        s.relays.len() - 1
                    }
                };
                let r = &mut s.relays[i];
                if r.reachable != Some(ok) {
                    r.since = Some(SystemTime::now());
                }
                r.reachable = Some(ok);
                if latency.is_some() {
                    r.latency_ms = latency;
                }
                if error.is_some() {
                    r.last_error = error;
                }
            });
        }
        tokio::select! {
            _ = tokio::time::sleep(RELAY_PROBE_EVERY) => {}
            // The home relay was lost: what the others are worth is wanted now.
            _ = agent.relay.2.notified() => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Shared between the watcher and whoever reports it.
#[derive(Debug, Default)]
pub struct RelayHealth(Mutex<RelayState>, std::sync::OnceLock<crate::net::Relays>, tokio::sync::Notify);

impl RelayHealth {
    /// The relays the endpoint is configured with.
    pub fn relays(&self) -> crate::net::Relays {
        self.1.get().cloned().unwrap_or(crate::net::Relays::Default)
    }

    pub fn get(&self) -> RelayState {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn update(&self, f: impl FnOnce(&mut RelayState)) {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// The relay the endpoint is set up with, before any is reached.
    pub fn configured(&self, relays: &crate::net::Relays) {
        let _ = self.1.set(relays.clone());
        let first = relays.urls().first().map(|u| u.to_string());
        self.update(|s| {
            if s.url.is_none() {
                s.url = first;
                s.since = Some(SystemTime::now());
                if s.url.is_some() && !s.connected {
                    s.last_error = Some("not reached yet".into());
                }
            }
        });
    }
}

/// Follows `agent`'s endpoint's home relay until `stop`.
pub async fn watch(agent: Arc<Served>, stop: CancellationToken) {
    let mut statuses = agent.endpoint.home_relay_status().stream();
    loop {
        let next = tokio::select! {
            s = statuses.next() => s,
            _ = stop.cancelled() => return,
        };
        let Some(list) = next else { return };
        let Some(status) = list.first() else { continue };
        let url = status.url().to_string();
        let connected = status.is_connected();
        let error = status
            .auth_denied_reason()
            .map(|r| format!("the relay refused this bridge: {r}"))
            .or_else(|| status.last_error().map(|e| describe(&format!("{e:#}"))));
        let before = agent.relay.get();
        agent.relay.update(|s| {
            if s.connected != connected || s.url.as_deref() != Some(&url) {
                s.since = Some(SystemTime::now());
            }
            if s.connected && !connected {
                s.drops += 1;
            }
            s.url = Some(url.clone());
            s.connected = connected;
            if error.is_some() {
                s.last_error = error.clone();
            }
        });
        if before.connected && !connected {
            agent.relay.2.notify_one();
        }
        match (before.connected, connected) {
            (false, true) => info!("relay {url}: connected"),
            (true, false) => warn!(
                "relay {url}: connection lost{} (browsers cannot reach this bridge until it is back; retrying)",
                error.as_deref().map(|e| format!(": {e}")).unwrap_or_default()
            ),
            (false, false) if error.is_some() && error != before.last_error => warn!(
                "relay {url}: unreachable: {} (browsers cannot reach this bridge; retrying)",
                error.as_deref().unwrap_or_default()
            ),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_come_first() {
        assert!(describe("tls: invalid peer certificate: UnknownIssuer")
            .starts_with("its TLS certificate is not trusted"));
        assert!(describe("io: Connection refused (os error 111)").starts_with("nothing listens there"));
        assert_eq!(describe("something else"), "something else");
    }
}
