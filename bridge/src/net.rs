//! Turning the network knobs into an iroh endpoint.
//!
//! Defaults reach the internet (public relays, n0 DNS discovery, portmapper,
//! all interfaces). Tests and offline setups switch each of those off; every
//! wait on the network is bounded so an offline machine still starts and still
//! prints a ticket with direct addresses.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    sync::Arc,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use iroh::{
    address_lookup::{DnsAddressLookup, PkarrPublisher, PkarrResolver},
    endpoint::{presets, AckFrequencyConfig, BindOpts, PortmapperConfig, QuicTransportConfig},
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
            Self::Custom(urls) => RelayMode::Custom(urls.iter().cloned().map(relay_config).collect()),
        }
    }

    /// The relay URLs a peer could reach us through (for offline tickets).
    pub fn urls(&self) -> Vec<RelayUrl> {
        self.mode().relay_map().urls::<Vec<_>>()
    }
}

/// How we speak to a relay of ours. QUIC address discovery (a UDP probe to
/// the relay, iroh's default) only for an `https` relay: QUIC always uses
/// TLS, so a plain `http` relay cannot answer it, and iroh's report of which
/// relay is nearest waits 3 s for the unanswered probe each time it runs,
/// which is when a relay died and another must become home (issue 59).
fn relay_config(url: RelayUrl) -> iroh::RelayConfig {
    let https = url.scheme() == "https";
    let mut cfg = iroh::RelayConfig::from(url);
    if !https {
        cfg.quic = None;
    }
    cfg
}

/// Ports for the default binding's two sockets (`0.0.0.0` and `[::]`); 0: any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefaultPorts {
    pub v4: u16,
    pub v6: u16,
    /// Whether failing to bind the IPv6 socket fails the endpoint (else it
    /// runs on IPv4 alone, as iroh's default binding does on a host without IPv6).
    pub v6_required: bool,
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
        self.bind_with(key, alpns, bridge_transport(idle)?, None).await
    }

    /// Binds as [`Self::bind`] with no bind address does (every interface,
    /// IPv4 and IPv6), on the given ports.
    pub async fn bind_default_on(
        &self,
        ports: DefaultPorts,
        key: SecretKey,
        alpns: Vec<Vec<u8>>,
        idle: Duration,
    ) -> Result<Endpoint> {
        self.bind_with(key, alpns, bridge_transport(idle)?, Some(ports)).await
    }

    async fn bind_with(
        &self,
        key: SecretKey,
        alpns: Vec<Vec<u8>>,
        transport: QuicTransportConfig,
        ports: Option<DefaultPorts>,
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
        } else if let Some(p) = ports {
            // iroh's default binding, ports chosen: IPv4 required, IPv6 as
            // required as the caller says (iroh's own lets it fail).
            let v6 = BindOpts::default().set_is_required(p.v6_required);
            b = b
                .clear_ip_transports()
                .bind_addr((Ipv4Addr::UNSPECIFIED, p.v4))
                .context("invalid IPv4 bind address")?
                .bind_addr_with_opts((Ipv6Addr::UNSPECIFIED, p.v6), v6)
                .context("invalid IPv6 bind address")?;
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
        .enable_segmentation_offload(SEGMENTATION_OFFLOAD)
        .build())
}

/// Whether a connection may send several datagrams in one GSO batch: no.
/// noq-proto 1.4.0 panics in its connection driver when a probe timeout's two
/// probes share a batch and the first was small (a lone control frame such as
/// RETIRE_CONNECTION_ID): the batch is clipped to that size, the second probe
/// is started inside it anyway, and the frames it must carry overrun it
/// (`advance out of bounds` in `poll_transmit_path_space`). The connection
/// dies without a close and its peer waits out the idle timeout. A probe
/// timeout is routine on a busy machine or a lossy path, and the bench lost
/// 4 connections in 240 smoke runs under load to it; with one datagram per
/// batch every probe starts a datagram of its own, at full size (0 in 150).
/// The price is one send call per datagram: bulk through the bridge ~0.65× on
/// loopback, and about 1.8× the CPU per MB (docs/performance.md, "GSO"). Turn
/// it back on once noq starts a loss probe only in a datagram that can hold it.
pub const SEGMENTATION_OFFLOAD: bool = false;

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
            // The URL leads the line already: reqwest's own words would say it again.
            let e = e.without_url();
            let mut chain = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                // A wrapper that quotes its cause already: the cause once.
                let text = s.to_string();
                if !chain.contains(&text) {
                    chain.push_str(&format!(": {text}"));
                }
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

/// How often a relay in use is asked whether it still answers (the home
/// relay, and the one a connection's path goes through): a dead relay takes
/// its paths with it, and iroh notices one that went silent only at its own
/// ping's timeout (15 s and more).
pub const RELAY_CHECK_EVERY: Duration = Duration::from_millis(500);

/// A relay that does not answer its `/ping` within this is taken for gone
/// (one that refuses is, at once): the first time, when the answer takes a
/// TCP and a TLS handshake too ...
pub const RELAY_CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// ... then [`RELAY_CHECK_RTTS`] times the slowest of its last
/// [`RELAY_CHECK_KEPT`] answers (one round trip each, over the connection
/// kept alive), at least this long, at most [`RELAY_CHECK_TIMEOUT`]: a
/// relay that went silent is noticed within about a second on a fast link.
/// (A busy machine takes that long to answer now and then: a check taken
/// for a death costs a needless move of the home relay.)
pub const RELAY_CHECK_MIN_TIMEOUT: Duration = Duration::from_millis(500);

/// See [`RELAY_CHECK_MIN_TIMEOUT`].
pub const RELAY_CHECK_RTTS: u32 = 8;

/// See [`RELAY_CHECK_MIN_TIMEOUT`].
const RELAY_CHECK_KEPT: usize = 8;

/// How long the name of a relay may take to resolve for a check: a name that
/// does not resolve says nothing about the relay (iroh may still reach it).
const RELAY_CHECK_LOOKUP: Duration = Duration::from_millis(800);

/// A relay found refusing is taken for that for this long by every check in
/// the process (the home relay's and a connection's, several agents'
/// endpoints): the first to notice tells the others. (An answer is not
/// shared: one from before a death would hide it; nor is a slow one, which
/// each check judges for itself.)
const RELAY_CHECK_SHARED: Duration = Duration::from_millis(250);

/// The last relays found gone, when, and why.
static RELAYS_GONE: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<RelayUrl, (tokio::time::Instant, String)>>,
> = std::sync::LazyLock::new(Default::default);

/// One HTTP client for every check in the process (one kept-alive connection
/// per relay, not one per endpoint).
static RELAY_CHECK_CLIENT: std::sync::OnceLock<Option<reqwest::Client>> = std::sync::OnceLock::new();

/// How long each relay's last answers took (every check in the process).
static RELAY_TOOK: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<RelayUrl, std::collections::VecDeque<Duration>>>,
> = std::sync::LazyLock::new(Default::default);

/// Asks relays whether they answer: `GET /ping` (what iroh's own net report
/// asks), over one kept-alive connection per relay. Names resolve through
/// the endpoint's own resolver (what iroh reaches the relay with).
/// Certificates are not checked: only an answer is wanted, and a relay with
/// a private CA answers like any other.
#[derive(Clone)]
pub struct RelayCheck {
    client: Option<reqwest::Client>,
}

/// What a relay's answer to [`RelayCheck::ping`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// It answered.
    Alive,
    /// It refused (nothing takes connections there, or they are reset):
    /// why, in words.
    Refused(String),
    /// It did not answer in time (it may only be slow): why, in words.
    Silent(String),
    /// Nothing can be said (its name did not resolve, no client could be made).
    Unknown(String),
}

/// The relay's name did not resolve: no verdict on the relay.
#[derive(Debug)]
struct Unresolved(String);

impl std::fmt::Display for Unresolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "its name does not resolve: {}", self.0)
    }
}

impl std::error::Error for Unresolved {}

/// reqwest's names, through iroh's resolver.
struct ViaIroh(iroh::dns::DnsResolver);

impl reqwest::dns::Resolve for ViaIroh {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let (dns, name) = (self.0.clone(), name.as_str().to_string());
        Box::pin(async move {
            match dns.lookup_ipv4_ipv6(&name, RELAY_CHECK_LOOKUP).await {
                Ok(ips) => {
                    let addrs: Vec<std::net::SocketAddr> =
                        ips.map(|ip| std::net::SocketAddr::new(ip, 0)).collect();
                    Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
                }
                Err(e) => Err(Box::new(Unresolved(format!("{name}: {e}"))) as Box<_>),
            }
        })
    }
}

impl RelayCheck {
    /// Checks with `ep`'s resolver (the first endpoint's: every endpoint of
    /// the process resolves alike).
    pub fn new(ep: &Endpoint) -> Self {
        let client = RELAY_CHECK_CLIENT.get_or_init(|| Self::client(ep.dns_resolver().ok().cloned())).clone();
        Self { client }
    }

    /// How we ask a relay over HTTP: no proxy, no redirects, its certificate
    /// unchecked (only an answer is wanted), names through `dns` when given.
    pub(crate) fn client(dns: Option<iroh::dns::DnsResolver>) -> Option<reqwest::Client> {
        // The binary installs it first; a library user (a test) may not have.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = reqwest::Client::builder()
            .no_proxy()
            .danger_accept_invalid_certs(true)
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(1)
            .pool_idle_timeout(Duration::from_secs(30))
            .connect_timeout(RELAY_CHECK_TIMEOUT);
        if let Some(dns) = dns {
            b = b.dns_resolver(Arc::new(ViaIroh(dns)));
        }
        b.build().map_err(|e| debug!("relays cannot be checked: {e}")).ok()
    }

    /// How long `url` gets to answer (see [`RELAY_CHECK_MIN_TIMEOUT`]).
    fn timeout(url: &RelayUrl) -> Duration {
        let took = RELAY_TOOK.lock().unwrap_or_else(|p| p.into_inner());
        match took.get(url).and_then(|t| t.iter().max()) {
            Some(slowest) => {
                (*slowest * RELAY_CHECK_RTTS).clamp(RELAY_CHECK_MIN_TIMEOUT, RELAY_CHECK_TIMEOUT)
            }
            None => RELAY_CHECK_TIMEOUT,
        }
    }

    /// Keeps how long `url` took to answer; whether it is its first answer.
    fn answered(url: &RelayUrl, took: Duration) -> bool {
        let mut all = RELAY_TOOK.lock().unwrap_or_else(|p| p.into_inner());
        let t = all.entry(url.clone()).or_default();
        if t.len() == RELAY_CHECK_KEPT {
            t.pop_front();
        }
        t.push_back(took);
        t.len() == 1
    }

    /// Whether `url` answers in time (see [`RELAY_CHECK_TIMEOUT`]); another
    /// check's finding it gone within [`RELAY_CHECK_SHARED`] is taken as is.
    pub async fn ping(&self, url: &RelayUrl) -> Answer {
        let now = tokio::time::Instant::now();
        if let Some((at, why)) = RELAYS_GONE.lock().unwrap_or_else(|p| p.into_inner()).get(url) {
            if now.saturating_duration_since(*at) < RELAY_CHECK_SHARED {
                return Answer::Refused(why.clone());
            }
        }
        let answer = self.ask(url).await;
        if let Answer::Refused(why) = &answer {
            let mut gone = RELAYS_GONE.lock().unwrap_or_else(|p| p.into_inner());
            gone.insert(url.clone(), (tokio::time::Instant::now(), why.clone()));
        }
        answer
    }

    /// `GET /ping` on `url`, within its time.
    async fn ask(&self, url: &RelayUrl) -> Answer {
        let Some(client) = &self.client else { return Answer::Unknown("no HTTP client".into()) };
        let Ok(ping) = url.join("ping") else { return Answer::Unknown(format!("{url} has no /ping")) };
        let (limit, t0) = (Self::timeout(url), tokio::time::Instant::now());
        match tokio::time::timeout(limit, client.get(ping).send()).await {
            Err(_) => {
                // Its connection may be what hangs: the next ping starts afresh.
                RELAY_TOOK.lock().unwrap_or_else(|p| p.into_inner()).remove(url);
                Answer::Silent(format!("{url} does not answer (nothing within {limit:?})"))
            }
            // Any answer at all: an HTTP status is the relay's own.
            Ok(Ok(answer)) => {
                // Read to its end, so that its connection is kept for the next.
                let _ = tokio::time::timeout(limit, answer.bytes()).await;
                let took = t0.elapsed();
                if Self::answered(url, took) {
                    debug!("relay {url} answers its /ping (in {took:?})");
                }
                Answer::Alive
            }
            Ok(Err(e)) => {
                let mut chain = e.to_string();
                let mut source = std::error::Error::source(&e);
                let mut unresolved = false;
                while let Some(s) = source {
                    unresolved |= s.is::<Unresolved>();
                    chain.push_str(&format!(": {s}"));
                    source = s.source();
                }
                if unresolved {
                    Answer::Unknown(chain)
                } else if e.is_timeout() {
                    Answer::Silent(format!("{url} does not answer ({chain})"))
                } else {
                    Answer::Refused(format!("{url} {}", describe_relay_failure(&chain)))
                }
            }
        }
    }
}

/// How often an endpoint whose home relay is gone is made to look for
/// another. iroh looks again by itself only at its periodic re-check (every
/// 20–26 s): for that long nobody reaches the bridge through a relay, a
/// browser not at all (n0-computer/iroh#4319). A relay map change makes it
/// run its report at once, which homes the endpoint on the nearest relay that
/// answers.
pub const REHOME_EVERY: Duration = Duration::from_secs(1);

/// ... doubling while none answers, up to this (offline, iroh's report is not
/// run every second for as long as it lasts).
pub const REHOME_MAX: Duration = Duration::from_secs(30);

/// How often a relay set aside as gone is asked whether it answers again
/// (then it is given back to the endpoint); at once when the home relay is
/// lost and no other is left.
pub const REVIVE_EVERY: Duration = Duration::from_secs(1);

/// Keeps `ep` homed on a relay that answers, while it has relays of its own
/// to choose from. The home relay is asked every [`RELAY_CHECK_EVERY`]
/// whether it answers ([`RelayCheck`]): iroh itself notices a relay that
/// refuses at once but one that went silent only at its ping's timeout. A
/// home relay that is gone either way is set aside: taken off the
/// endpoint's relay map, which makes iroh run its report at once, without
/// waiting for the dead one's probes, and home on one that answers (about
/// 0.2 s). It is given back once it answers again ([`REVIVE_EVERY`]). The
/// last relay is never taken off: when none answers, iroh is made to look
/// again every [`REHOME_EVERY`], doubling to [`REHOME_MAX`]. Runs until the
/// endpoint closes.
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
    let check = RelayCheck::new(&ep);
    let mut statuses = ep.home_relay_status().stream();
    // The home relay iroh holds connected.
    let mut home: Option<RelayUrl> = None;
    // Relays taken off the endpoint's map, and when they are asked again.
    let mut aside: Vec<RelayUrl> = Vec::new();
    let mut revive_at = tokio::time::Instant::now();
    // Homeless since, and when to make iroh look again.
    let mut lost: Option<(RelayUrl, tokio::time::Instant)> = None;
    let mut gap = REHOME_EVERY;
    let mut tick = tokio::time::interval(RELAY_CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // One check of the home relay at a time, and one of those set aside.
    let mut ping: Option<futures::future::BoxFuture<'static, (RelayUrl, Answer)>> = None;
    let mut revive: Option<futures::future::BoxFuture<'static, Vec<(RelayUrl, Answer)>>> = None;
    loop {
        let retry = lost.as_ref().map(|(_, at)| *at);
        // A home relay that is gone, and why.
        let mut gone: Option<(RelayUrl, String)> = None;
        tokio::select! {
            s = statuses.next() => {
                let Some(list) = s else { return };
                match list.first() {
                    Some(now) if now.is_connected() => {
                        gap = REHOME_EVERY;
                        if home.as_ref() != Some(now.url()) {
                            debug!("home relay {}: connected", now.url());
                            home = Some(now.url().clone());
                            ping = None;
                        }
                        if let Some((old, _)) = lost.take() {
                            if old != *now.url() {
                                tracing::info!("relay {old} lost: re-homed on {}", now.url());
                            }
                        }
                    }
                    Some(now) => {
                        if home.take().is_some() {
                            let why = now.last_error().map(|e| format!("{e:#}")).unwrap_or_default();
                            gone = Some((now.url().clone(), why));
                        } else if lost.is_none() {
                            // Not (yet) connected: looked at again if it stays so.
                            lost = Some((now.url().clone(), tokio::time::Instant::now() + gap));
                        }
                    }
                    None => {
                        if let Some(url) = home.take() {
                            gone = Some((url, "no home relay".into()));
                        }
                    }
                }
            }
            _ = tick.tick(), if (ping.is_none() && home.is_some()) || (revive.is_none() && !aside.is_empty()) => {
                if let (None, Some(url)) = (&ping, home.clone()) {
                    let check = check.clone();
                    ping = Some(Box::pin(async move {
                        let answer = check.ping(&url).await;
                        (url, answer)
                    }));
                }
                if revive.is_none() && !aside.is_empty() && tokio::time::Instant::now() >= revive_at {
                    revive_at = tokio::time::Instant::now() + REVIVE_EVERY;
                    revive = Some(ask_again(&check, &aside));
                }
            }
            (url, answer) = async { ping.as_mut().expect("set").await }, if ping.is_some() => {
                ping = None;
                if let Answer::Refused(why) | Answer::Silent(why) = answer {
                    if home.as_ref() == Some(&url) {
                        home = None;
                        gone = Some((url, why));
                    }
                }
            }
            answers = async { revive.as_mut().expect("set").await }, if revive.is_some() => {
                revive = None;
                for (url, answer) in answers {
                    if answer == Answer::Alive && aside.contains(&url) {
                        tracing::info!("relay {url} answers again");
                        aside.retain(|u| *u != url);
                        if let Some(cfg) = map.get(&url) {
                            ep.insert_relay(url, cfg).await;
                        }
                    }
                }
            }
            _ = async { tokio::time::sleep_until(retry.expect("set")).await }, if retry.is_some() => {
                let Some((url, at)) = lost.as_mut() else { continue };
                debug!("home relay {url} lost: looking for another");
                // Re-inserting a relay's own configuration changes nothing but
                // makes iroh report (and choose a home) now.
                let again = urls.iter().find(|u| !aside.contains(u)).unwrap_or(url);
                if let Some(cfg) = map.get(again) {
                    ep.insert_relay(again.clone(), cfg).await;
                }
                *at = tokio::time::Instant::now() + gap;
                gap = (gap * 2).min(REHOME_MAX);
            }
            _ = ep.closed() => return,
        }
        let Some((url, why)) = gone else { continue };
        let others = urls.iter().any(|u| *u != url && !aside.contains(u));
        if others && !aside.contains(&url) {
            debug!("home relay {url} gone ({why}): set aside until it answers again");
            aside.push(url.clone());
            revive_at = tokio::time::Instant::now() + REVIVE_EVERY;
            // Taken off the map: iroh reports at once, without the dead one.
            ep.remove_relay(&url).await;
            lost.get_or_insert((url, tokio::time::Instant::now() + gap));
        } else if !aside.is_empty() {
            // None other left on the map: one set aside may answer again by
            // now (given back, it makes iroh report); else iroh looks again.
            debug!("home relay {url} gone ({why}): asking those set aside again");
            if revive.is_none() {
                revive_at = tokio::time::Instant::now() + REVIVE_EVERY;
                revive = Some(ask_again(&check, &aside));
            }
            lost.get_or_insert((url, tokio::time::Instant::now() + gap));
        } else {
            debug!("home relay {url} gone ({why}): looking for another");
            lost = Some((url, tokio::time::Instant::now()));
        }
    }
}

/// Asks each of `urls` whether it answers.
fn ask_again(
    check: &RelayCheck,
    urls: &[RelayUrl],
) -> futures::future::BoxFuture<'static, Vec<(RelayUrl, Answer)>> {
    let (check, urls) = (check.clone(), urls.to_vec());
    Box::pin(async move {
        // Asked afresh: a refusal another check saw just before it came back is stale.
        let answers = futures::future::join_all(urls.iter().map(|u| check.ask(u))).await;
        urls.into_iter().zip(answers).collect()
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every connection the bridge and `connect` make sends one datagram per
    /// batch ([`SEGMENTATION_OFFLOAD`]): a batch of two loss probes is what
    /// panics noq-proto 1.4.0.
    #[test]
    fn connections_send_no_gso_batches() {
        let config = format!("{:?}", bridge_transport(limits::IDLE_TIMEOUT).unwrap());
        assert!(config.contains("enable_segmentation_offload: false"), "{config}");
    }

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

    /// A relay that answers, one that refuses, and one that takes the
    /// connection and then says nothing (a TCP black hole), as the check
    /// tells them apart.
    #[tokio::test]
    async fn a_relay_check_tells_alive_refused_and_silent_apart() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let check = RelayCheck { client: RelayCheck::client(None) };
        // Answers every request on a connection it keeps.
        let alive = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let alive_url: RelayUrl = format!("http://{}", alive.local_addr().unwrap()).parse().unwrap();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = alive.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = c.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if c.write_all(ok).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        assert_eq!(check.ping(&alive_url).await, Answer::Alive);
        assert_eq!(check.ping(&alive_url).await, Answer::Alive);
        // Nothing listens.
        let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gone_url: RelayUrl = format!("http://{}", gone.local_addr().unwrap()).parse().unwrap();
        drop(gone);
        let answer = check.ping(&gone_url).await;
        assert!(matches!(&answer, Answer::Refused(why) if why.contains("refused")), "{answer:?}");
        // Listens (the kernel takes the connection), never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_url: RelayUrl = format!("http://{}", silent.local_addr().unwrap()).parse().unwrap();
        let t0 = std::time::Instant::now();
        let answer = check.ping(&silent_url).await;
        assert!(matches!(&answer, Answer::Silent(why) if why.contains("does not answer")), "{answer:?}");
        assert!(t0.elapsed() < RELAY_CHECK_TIMEOUT * 3, "{:?}", t0.elapsed());
        drop(silent);
    }
}
