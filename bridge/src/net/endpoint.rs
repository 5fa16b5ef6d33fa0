//! Building an endpoint from the network settings: binding, the QUIC
//! transport every connection gets (limits, keep-alives, no GSO batches), and
//! closing within a budget.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, Result};
use iroh::{
    address_lookup::{DnsAddressLookup, PkarrPublisher, PkarrResolver},
    endpoint::{presets, AckFrequencyConfig, BindOpts, PortmapperConfig, QuicTransportConfig},
    Endpoint, SecretKey,
};
use tracing::debug;

use super::Relays;
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
}
