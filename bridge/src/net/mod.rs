//! Turning the network knobs into an iroh endpoint.
//!
//! Defaults reach the internet (public relays, n0 DNS discovery, portmapper,
//! all interfaces). Tests and offline setups switch each of those off; every
//! wait on the network is bounded so an offline machine still starts and still
//! prints a ticket with direct addresses.
//!
//! One job a file: `endpoint` (the settings, binding, the QUIC transport,
//! closing), `relays` (which relays), `ticket` (the address a ticket
//! carries), `relay_problem` (why a relay is not reached, in words),
//! `relay_check` (asking a relay whether it lives), `rehome` (keeping a
//! home relay that answers), `client` (`connect`'s renewable endpoint).

mod client;
mod endpoint;
mod rehome;
mod relay_check;
mod relay_problem;
mod relays;
mod ticket;

pub use self::{
    client::ClientEndpoint,
    endpoint::{
        bridge_transport, close_endpoint, keep_alive, load_ca, DefaultPorts, Discovery, NetConfig, OnOff,
        SEGMENTATION_OFFLOAD,
    },
    rehome::{failover_off, keep_a_home_relay, REHOME_EVERY, REHOME_MAX, REVIVE_EVERY},
    relay_check::{
        Answer, RelayCheck, RELAY_CHECK_EVERY, RELAY_CHECK_MIN_TIMEOUT, RELAY_CHECK_RTTS, RELAY_CHECK_TIMEOUT,
    },
    relay_problem::{describe_relay_failure, relay_denied, relay_problem, relay_refusal},
    relays::Relays,
    ticket::{reachable_addr, ticket_addr},
};
