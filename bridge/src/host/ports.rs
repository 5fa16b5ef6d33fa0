//! The UDP port each served endpoint last bound, so a restarted bridge is
//! found where the tickets it printed say: with relays disabled (or a peer
//! that reached it directly) a new random port would leave every such ticket
//! pointing at nothing, and a session kept across the restart unreachable.
//!
//! Where the port is left to the system: a bind address `ip:0`
//! (`THUNDERBOLT_IROH_BIND`, as the tests run), or, with relays disabled, the
//! default binding (every interface, both families: a ticket then has only
//! direct addresses to go by). With a relay and the default binding the port
//! is iroh's choice, and such bridges are found through their relay.
//! `iroh/ports.json`: `{"<NodeId hex>": port}` for an `ip:0` binding,
//! `{"<NodeId hex>": {"v4": port, "v6": port}}` for the default one.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Result;
use iroh::{Endpoint, EndpointId, SecretKey};
use serde::{Deserialize, Serialize};
use tracing::debug;

use crate::{
    home::Home,
    net::{DefaultPorts, NetConfig, Relays},
};

fn path(home: &Home) -> std::path::PathBuf {
    home.iroh_dir().join("ports.json")
}

/// What is kept for one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
enum Kept {
    /// The port of an `ip:0` binding.
    Port(u16),
    /// The ports of the default binding's sockets (no IPv6 one: `None`).
    Default { v4: u16, v6: Option<u16> },
}

fn kept(home: &Home, id: &EndpointId) -> Option<Kept> {
    crate::home::read_json::<BTreeMap<String, Kept>>(&path(home)).ok()?.get(&id.to_string()).copied()
}

/// Binds `key`'s endpoint as `net` says, on the port(s) it had last time when
/// they are free and `net` leaves them to the system (see the module's doc).
pub async fn bind(
    home: &Home,
    net: &NetConfig,
    key: SecretKey,
    alpns: Vec<Vec<u8>>,
    idle: Duration,
) -> Result<Endpoint> {
    match net.bind {
        Some(addr) if addr.port() == 0 => bind_addr(home, net, addr, key, alpns, idle).await,
        None if net.relays == Relays::Disabled => bind_default(home, net, key, alpns, idle).await,
        _ => net.bind(key, alpns, idle).await,
    }
}

/// An `ip:0` binding.
async fn bind_addr(
    home: &Home,
    net: &NetConfig,
    addr: std::net::SocketAddr,
    key: SecretKey,
    alpns: Vec<Vec<u8>>,
    idle: Duration,
) -> Result<Endpoint> {
    let id = key.public();
    if let Some(Kept::Port(port)) = kept(home, &id) {
        let mut pinned = net.clone();
        pinned.bind = Some(std::net::SocketAddr::new(addr.ip(), port));
        match pinned.bind(key.clone(), alpns.clone(), idle).await {
            Ok(ep) => return Ok(ep),
            Err(e) => debug!("port {port}, this endpoint's last, is taken ({e:#}); binding another"),
        }
    }
    let ep = net.bind(key, alpns, idle).await?;
    if let Some(port) = ep.bound_sockets().iter().find(|s| s.ip() == addr.ip()).map(|s| s.port()) {
        remember(home, &id, Kept::Port(port));
    }
    Ok(ep)
}

/// The default binding, relays disabled: both ports as last time; else the
/// IPv4 one (a ticket's IPv4 address still reaches it); else new ones.
async fn bind_default(
    home: &Home,
    net: &NetConfig,
    key: SecretKey,
    alpns: Vec<Vec<u8>>,
    idle: Duration,
) -> Result<Endpoint> {
    let id = key.public();
    let mut tries = Vec::new();
    if let Some(Kept::Default { v4, v6 }) = kept(home, &id) {
        if let Some(v6) = v6 {
            tries.push(DefaultPorts { v4, v6, v6_required: true });
        }
        tries.push(DefaultPorts { v4, v6: 0, v6_required: false });
    }
    for ports in tries {
        match net.bind_default_on(ports, key.clone(), alpns.clone(), idle).await {
            Ok(ep) => {
                note_default(home, &id, &ep);
                return Ok(ep);
            }
            Err(e) => debug!("{ports:?}, this endpoint's last, are not free ({e:#}); binding others"),
        }
    }
    let ep = net.bind_default_on(DefaultPorts { v4: 0, v6: 0, v6_required: false }, key, alpns, idle).await?;
    note_default(home, &id, &ep);
    Ok(ep)
}

/// Notes the default binding's ports as bound, when they changed.
fn note_default(home: &Home, id: &EndpointId, ep: &Endpoint) {
    let sockets = ep.bound_sockets();
    let port_of =
        |v6: bool| sockets.iter().find(|s| s.is_ipv6() == v6 && s.ip().is_unspecified()).map(|s| s.port());
    let Some(v4) = port_of(false) else { return };
    let now = Kept::Default { v4, v6: port_of(true) };
    if kept(home, id) != Some(now) {
        remember(home, id, now);
    }
}

/// Notes the port(s) `id` bound (logged, never fatal: only a restart's address depends on it).
fn remember(home: &Home, id: &EndpointId, ports: Kept) {
    let r = crate::home::edit_json(&path(home), |m: &mut BTreeMap<String, Kept>| {
        m.insert(id.to_string(), ports);
    });
    if let Err(e) = r {
        debug!("could not note this endpoint's port in {}: {e}", path(home).display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_read_back_and_the_old_one_is_unchanged() {
        let m: BTreeMap<String, Kept> =
            serde_json::from_str(r#"{"a": 4242, "b": {"v4": 1, "v6": null}}"#).unwrap();
        assert_eq!(m["a"], Kept::Port(4242));
        assert_eq!(m["b"], Kept::Default { v4: 1, v6: None });
        assert_eq!(serde_json::to_string(&Kept::Port(7)).unwrap(), "7");
        assert_eq!(
            serde_json::to_string(&Kept::Default { v4: 1, v6: Some(2) }).unwrap(),
            r#"{"v4":1,"v6":2}"#
        );
    }
}
