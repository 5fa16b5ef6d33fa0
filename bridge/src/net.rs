//! Turning the network knobs into an iroh endpoint.
//!
//! Defaults reach the internet (public relays, n0 DNS discovery, portmapper,
//! all interfaces). Tests and offline setups switch each of those off; every
//! wait on the network is bounded so an offline machine still starts and still
//! prints a ticket with direct addresses.

use std::{sync::Arc, time::Duration};

use anyhow::{bail, Context, Result};
use iroh::{
    address_lookup::{DnsAddressLookup, PkarrPublisher, PkarrResolver},
    endpoint::{presets, AckFrequencyConfig, PortmapperConfig, QuicTransportConfig},
    Endpoint, EndpointAddr, RelayMode, RelayUrl, SecretKey, TransportAddr, Watcher,
};
use tracing::{debug, warn};

use crate::limits;

/// How peers are found by NodeId alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Discovery {
    // n0's DNS discovery (publish and resolve).
    N0,
    // Only addresses given in tickets.
    Off,
}

/// A switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// Which relays to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Relays {
    /// n0's public relays.
    Default,
    /// Direct addresses only.
    Disabled,
    /// Only these.
    Custom(Vec<RelayUrl>),
}

impl Relays {
    /// Parses `THUNDERBOLT_IROH_RELAY_URL`: unset/`default`, `disabled`, or comma-separated URLs.
    pub fn parse(value: Option<&str>) -> Result<Self> {
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(Self::Default);
        };
        match v {
            "default" => return Ok(Self::Default),
            "disabled" | "off" | "none" => return Ok(Self::Disabled),
            _ => {}
        }
        let mut urls = Vec::new();
        for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let url: RelayUrl = part
                .parse()
                .with_context(|| format!("invalid relay URL '{part}' in THUNDERBOLT_IROH_RELAY_URL"))?;
            if !matches!(url.scheme(), "http" | "https") {
                bail!("invalid relay URL '{part}': scheme must be http or https");
            }
            urls.push(url);
        }
        if urls.is_empty() {
            bail!("THUNDERBOLT_IROH_RELAY_URL has no URL in it");
        }
        Ok(Self::Custom(urls))
    }

    fn mode(&self) -> RelayMode {
        match self {
            Self::Default => iroh::endpoint::default_relay_mode(),
            Self::Disabled => RelayMode::Disabled,
            Self::Custom(urls) => RelayMode::custom(urls.iter().cloned()),
        }
    }

    /// The relay URLs a peer could reach us through (for offline tickets).
    pub fn urls(&self) -> Vec<RelayUrl> {
        self.mode().relay_map().urls::<Vec<_>>()
    }
}

/// Resolved network settings.
#[derive(Debug, Clone)]
pub struct NetConfig {
    pub relays: Relays,
    pub discovery: Discovery,
    pub portmapper: OnOff,
    pub bind: Option<std::net::SocketAddr>,
    /// Extra trusted roots for relay TLS.
    pub relay_ca: Vec<rustls_pki_types::CertificateDer<'static>>,
}

/// Reads every certificate of a PEM file (a CA bundle may hold several).
pub fn load_ca(path: &std::path::Path) -> Result<Vec<rustls_pki_types::CertificateDer<'static>>> {
    Ok(thunderbolt_shared::pem::certs(path, "THUNDERBOLT_IROH_RELAY_CA")?)
}

impl NetConfig {
    /// Binds an endpoint with `key`, accepting `alpns` (empty for a dial-only
    /// endpoint, as `connect`'s). Its connections get [`bridge_transport`]'s
    /// limits, keep-alives and `idle` timeout, on both sides.
    pub async fn bind(&self, key: SecretKey, alpns: Vec<Vec<u8>>, idle: Duration) -> Result<Endpoint> {
        self.bind_with(key, alpns, bridge_transport(idle)?).await
    }

    async fn bind_with(
        &self,
        key: SecretKey,
        alpns: Vec<Vec<u8>>,
        transport: QuicTransportConfig,
    ) -> Result<Endpoint> {
        let mut b = Endpoint::builder(presets::Minimal)
            .secret_key(key)
            .alpns(alpns)
            .relay_mode(self.relays.mode())
            .transport_config(transport);
        if self.discovery == Discovery::N0 {
            b = b
                .address_lookup(PkarrPublisher::n0_dns())
                .address_lookup(PkarrResolver::n0_dns())
                .address_lookup(DnsAddressLookup::n0_dns());
        }
        b = b.portmapper_config(match self.portmapper {
            OnOff::On => PortmapperConfig::default(),
            OnOff::Off => PortmapperConfig::Disabled,
        });
        let ca = iroh::tls::CaTlsConfig::default().with_extra_roots(self.relay_ca.iter().cloned());
        // iroh's own resolver (the system's nameservers, the public ones
        // behind them, DNS-over-HTTPS with the relays' roots), quiet while
        // nothing answers: see `dns`.
        let doh = ca
            .client_config(Arc::new(rustls::crypto::ring::default_provider()))
            .context("cannot set up TLS for DNS-over-HTTPS")?;
        let resolver =
            iroh::dns::DnsResolver::builder().with_system_defaults().tls_client_config(doh).build();
        b = b.dns_resolver(crate::dns::QuietResolver::wrap(resolver));
        if !self.relay_ca.is_empty() {
            b = b.ca_tls_config(ca);
        }
        if let Some(addr) = self.bind {
            b = b
                .clear_ip_transports()
                .bind_addr(addr)
                .with_context(|| format!("invalid bind address {addr}"))?;
        }
        let ep = b.bind().await.context("cannot bind the iroh endpoint")?;
        Ok(ep)
    }
}

/// What a peer may make the bridge hold, set in QUIC itself: a session is one
/// bidirectional stream, so a peer may open exactly one and no unidirectional
/// ones (left at QUIC's defaults, 100 + 100 streams of 1.25 MB windows let one
/// admitted peer park gigabytes in the bridge), may not send datagrams, and all
/// it sends unread is bounded by the connection window.
///
/// A peer that vanishes without a close (killed, path gone) is noticed after
/// `idle` of silence: both sides send keep-alives every
/// [`limits::KEEP_ALIVE_INTERVAL`] (or a third of `idle` when that is
/// shorter), so a live peer is never idle that long. Each side asks the
/// other to acknowledge within [`limits::ACK_DELAY_ASKED`].
pub fn bridge_transport(idle: Duration) -> Result<QuicTransportConfig> {
    if idle < limits::MIN_IDLE_TIMEOUT {
        anyhow::bail!("an idle timeout of {idle:?} is below the {:?} minimum", limits::MIN_IDLE_TIMEOUT);
    }
    let keep_alive = keep_alive(idle);
    let idle = idle.try_into().with_context(|| format!("--idle-timeout {idle:?} is too long"))?;
    let mut acks = AckFrequencyConfig::default();
    acks.max_ack_delay(Some(limits::ACK_DELAY_ASKED));
    Ok(QuicTransportConfig::builder()
        .max_concurrent_bidi_streams(1u32.into())
        .max_concurrent_uni_streams(0u32.into())
        .stream_receive_window(limits::STREAM_RECEIVE_WINDOW.into())
        .receive_window(limits::CONNECTION_RECEIVE_WINDOW.into())
        .datagram_receive_buffer_size(None)
        .keep_alive_interval(keep_alive)
        .max_idle_timeout(Some(idle))
        .ack_frequency_config(Some(acks))
        .build())
}

/// Keep-alive period for an idle timeout: two keep-alives may be lost in a row
/// before a live path is taken for dead.
pub fn keep_alive(idle: Duration) -> Duration {
    limits::KEEP_ALIVE_INTERVAL.min(idle / 3)
}

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

impl Relays {
    /// The one relay of ours, when exactly one is configured: a browser
    /// reaches the bridge through it alone (said in the banner).
    pub fn only_one(&self) -> Option<&RelayUrl> {
        match self {
            Relays::Custom(urls) if urls.len() == 1 => urls.first(),
            _ => None,
        }
    }
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

/// Closes `ep`, giving it `budget` to flush close frames and drain its
/// connections. Past that the process is about to exit with nothing left to
/// tell anyone (a connection that never reached its peer drains for several
/// probe timeouts): the endpoint is then left to the exit instead of being
/// dropped half-closed, which iroh reports as an error.
pub async fn close_endpoint(ep: Endpoint, budget: Duration) {
    if tokio::time::timeout(budget, ep.close()).await.is_err() {
        debug!("the endpoint did not finish closing within {budget:?}; leaving the rest to the exit");
        std::mem::forget(ep);
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

/// Why the home relay is not connected, in words (its cause first), if it
/// is not (and relays are configured at all). When iroh has nothing to say
/// (no relay chosen yet, no error recorded: how a relay with an untrusted
/// certificate looks from outside), the relays are asked over HTTPS
/// ourselves, so the cause is still named.
pub async fn relay_problem(ep: &Endpoint, net: &NetConfig) -> Option<String> {
    if net.relays == Relays::Disabled {
        return None;
    }
    if let Some(s) = ep.home_relay_status().get().first() {
        if s.is_connected() {
            return None;
        }
        if let Some(r) = s.auth_denied_reason() {
            return Some(format!("{} refused this device: {r}", s.url()));
        }
        if let Some(e) = s.last_error() {
            return Some(format!("{} {}", s.url(), describe_relay_failure(&format!("{e:#}"))));
        }
    }
    let probes = net.relays.urls().into_iter().map(|url| async move {
        let why = probe_relay(&url, &net.relay_ca).await;
        format!("{url} {why}")
    });
    Some(futures::future::join_all(probes).await.join("; "))
}

/// How long asking a silent relay ourselves may take.
const RELAY_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// One HTTPS request to `url`, trusting what the endpoint trusts: the cause
/// (certificate, refused, no such name, no answer) when it fails.
async fn probe_relay(url: &RelayUrl, ca: &[rustls_pki_types::CertificateDer<'static>]) -> String {
    let mut b = reqwest::Client::builder()
        .timeout(RELAY_PROBE_TIMEOUT)
        .connect_timeout(RELAY_PROBE_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none());
    for c in ca {
        if let Ok(cert) = reqwest::Certificate::from_der(c) {
            b = b.add_root_certificate(cert);
        }
    }
    let client = match b.build() {
        Ok(c) => c,
        Err(e) => return format!("did not answer (and could not be asked: {e})"),
    };
    match client.get(url.as_str()).send().await {
        Ok(r) => format!("answers over HTTP ({}), but no relay connection was made yet", r.status()),
        Err(e) => {
            let mut chain = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                chain.push_str(&format!(": {s}"));
                source = s.source();
            }
            if e.is_timeout() && !chain.contains("timed out") {
                chain.push_str(": timed out");
            }
            describe_relay_failure(&chain)
        }
    }
}

/// The home relay's refusal of this endpoint (its access list), in words.
pub fn relay_refusal(ep: &Endpoint) -> Option<String> {
    ep.home_relay_status().get().iter().find_map(|s| {
        s.auth_denied_reason().map(|r| format!("the relay {} refused this device: {r}", s.url()))
    })
}

/// Resolves once the home relay has refused this endpoint (never, if it does
/// not): a dial that only the relay could carry need not wait for its timeout.
pub async fn relay_denied(ep: &Endpoint) {
    use iroh::Watcher;
    let mut w = ep.home_relay_status();
    loop {
        if w.get().iter().any(|s| s.auth_denied_reason().is_some()) {
            return;
        }
        if w.updated().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// A relay failure in words a person can act on: the certificate, a refusal,
/// or the network, first; iroh's own chain after.
pub fn describe_relay_failure(chain: &str) -> String {
    let lower = chain.to_ascii_lowercase();
    let cause = if lower.contains("unknownissuer")
        || lower.contains("unknown issuer")
        || lower.contains("certificate")
    {
        "its TLS certificate is not trusted (a private CA? give it with THUNDERBOLT_IROH_RELAY_CA)"
    } else if lower.contains("connection refused") {
        "nothing listens there (connection refused)"
    } else if lower.contains("dns") || lower.contains("resolve") || lower.contains("lookup") {
        "its name does not resolve"
    } else if lower.contains("timed out") || lower.contains("timeout") {
        "no answer (timed out)"
    } else if lower.contains("401")
        || lower.contains("403")
        || lower.contains("denied")
        || lower.contains("unauthorized")
    {
        "the relay refused this endpoint (its access list)"
    } else {
        ""
    };
    if cause.is_empty() {
        chain.to_string()
    } else {
        format!("{cause} ({chain})")
    }
}

/// `THUNDERBOLT_RELAY_FAILOVER=off`: iroh is left to notice a dead relay by
/// itself (its periodic re-check; the idle timeout for a connection through
/// it). For measuring what the failover gains (the bench), not for use.
pub fn failover_off() -> bool {
    std::env::var("THUNDERBOLT_RELAY_FAILOVER").is_ok_and(|v| v == "off")
}

/// How often an endpoint whose home relay is gone is made to look for
/// another. iroh looks again by itself only at its periodic re-check (every
/// 20–26 s): for that long nobody reaches the bridge through a relay, a
/// browser not at all (n0-computer/iroh#4319). A relay map change makes it
/// run its report at once, which homes the endpoint on the nearest relay that
/// answers (a dead one refuses at once; one that drops packets is given up
/// at the report's own probe timeout).
pub const REHOME_EVERY: Duration = Duration::from_secs(1);

/// ... doubling while none answers, up to this (offline, iroh's report is not
/// run every second for as long as it lasts).
pub const REHOME_MAX: Duration = Duration::from_secs(30);

/// Keeps `ep` homed on a relay that answers, while it has relays of its own
/// to choose from: when its home relay is lost, iroh is made to choose again
/// at once, and again every [`REHOME_EVERY`] until one is home. Runs until
/// the endpoint closes.
pub async fn keep_a_home_relay(ep: Endpoint, relays: Relays) {
    use futures::StreamExt;
    if failover_off() {
        return;
    }
    let Relays::Custom(urls) = &relays else { return };
    if urls.len() < 2 {
        return;
    }
    let map = RelayMode::custom(urls.iter().cloned()).relay_map();
    let mut statuses = ep.home_relay_status().stream();
    // The home relay lost, and when to make iroh look again.
    let mut lost: Option<(RelayUrl, tokio::time::Instant)> = None;
    let mut gap = REHOME_EVERY;
    loop {
        let retry = lost.as_ref().map(|(_, at)| *at);
        tokio::select! {
            s = statuses.next() => {
                let Some(list) = s else { return };
                match list.first() {
                    Some(home) if home.is_connected() => {
                        gap = REHOME_EVERY;
                        if let Some((old, _)) = lost.take() {
                            if old != *home.url() {
                                tracing::info!("relay {old} lost: re-homed on {}", home.url());
                            }
                        }
                    }
                    Some(home) if lost.is_none() => {
                        lost = Some((home.url().clone(), tokio::time::Instant::now()));
                    }
                    _ => {}
                }
            }
            _ = async { tokio::time::sleep_until(retry.expect("set")).await }, if retry.is_some() => {
                let Some((url, at)) = lost.as_mut() else { continue };
                debug!("home relay {url} lost: looking for another");
                // Re-inserting a relay's own configuration changes nothing but
                // makes iroh report (and choose a home) now.
                if let Some(cfg) = map.get(url) {
                    ep.insert_relay(url.clone(), cfg).await;
                }
                *at = tokio::time::Instant::now() + gap;
                gap = (gap * 2).min(REHOME_MAX);
            }
            _ = ep.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_setting_forms() {
        assert_eq!(Relays::parse(None).unwrap(), Relays::Default);
        assert_eq!(Relays::parse(Some("disabled")).unwrap(), Relays::Disabled);
        let r = Relays::parse(Some("https://a.example, http://127.0.0.1:3340")).unwrap();
        let Relays::Custom(urls) = &r else { panic!("{r:?}") };
        assert_eq!(urls.len(), 2);
        assert_eq!(r.urls().len(), 2);
        let e = Relays::parse(Some("https://a.example,ftp://b")).unwrap_err().to_string();
        assert!(e.contains("ftp://b"), "{e}");
        assert!(Relays::parse(Some(" , ")).is_err());
    }
}
