//! The UDP port each served endpoint last bound, so a restarted bridge is
//! found where the tickets it printed say: with relays disabled (or a peer
//! that reached it directly) a new random port would leave every such ticket
//! pointing at nothing, and a session kept across the restart unreachable.
//!
//! Only where the bind address leaves the port to the system
//! (`THUNDERBOLT_IROH_BIND=ip:0`, as the tests run); the default binding
//! (every interface, both families) is iroh's own, and such bridges are
//! found through their relay. `iroh/ports.json`: `{"<NodeId hex>": port}`.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Result;
use iroh::{Endpoint, EndpointId, SecretKey};
use tracing::debug;

use crate::{home::Home, net::NetConfig};

fn path(home: &Home) -> std::path::PathBuf {
    home.iroh_dir().join("ports.json")
}

/// Binds `key`'s endpoint as `net` says, on the port it had last time when
/// that port is free and the configured one is `0`.
pub async fn bind(
    home: &Home,
    net: &NetConfig,
    key: SecretKey,
    alpns: Vec<Vec<u8>>,
    idle: Duration,
) -> Result<Endpoint> {
    let id = key.public();
    let Some(addr) = net.bind.filter(|a| a.port() == 0) else {
        return net.bind(key, alpns, idle).await;
    };
    let last = crate::home::read_json::<BTreeMap<String, u16>>(&path(home))
        .ok()
        .and_then(|m| m.get(&id.to_string()).copied());
    if let Some(port) = last {
        let mut pinned = net.clone();
        pinned.bind = Some(std::net::SocketAddr::new(addr.ip(), port));
        match pinned.bind(key.clone(), alpns.clone(), idle).await {
            Ok(ep) => return Ok(ep),
            Err(e) => debug!("port {port}, this endpoint's last, is taken ({e:#}); binding another"),
        }
    }
    let ep = net.bind(key, alpns, idle).await?;
    if let Some(port) = ep.bound_sockets().iter().find(|s| s.ip() == addr.ip()).map(|s| s.port()) {
        remember(home, &id, port);
    }
    Ok(ep)
}

/// Notes the port `id` bound (logged, never fatal: only a restart's address depends on it).
fn remember(home: &Home, id: &EndpointId, port: u16) {
    let r = crate::home::edit_json(&path(home), |m: &mut BTreeMap<String, u16>| {
        m.insert(id.to_string(), port);
    });
    if let Err(e) = r {
        debug!("could not note this endpoint's port in {}: {e}", path(home).display());
    }
}
