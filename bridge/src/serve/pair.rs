//! A device pairing itself with a one-time code (`thunderbolt/<p>/pair1`,
//! specified in [`thunderbolt_shared::pairing`]). Reached only after the
//! gate (per-remote budget, handshake cap) and the handshake, like every
//! connection; no agent is ever spawned on it.

use std::sync::Arc;

use iroh::{endpoint::Connection, EndpointId};
use serde::Deserialize;
use thunderbolt_shared::pairing as wire;
use tracing::{info, warn};

use crate::{
    devices::How,
    pairing::Redeemed,
    serve::{session::refuse, AgentConfig, AgentName, Shared},
    trust::allowfile,
};

#[derive(Deserialize)]
struct Request {
    pair: String,
    #[serde(default)]
    name: String,
}

/// What a pairing code may have been minted for to pair at this agent: the
/// agent itself, and for a host's agent on the protocol's single-agent
/// bridge identity, that bridge too (`iroh pair` without `--agent` prints
/// its ticket, which is this agent's).
pub fn targets(cfg: &AgentConfig) -> Vec<String> {
    let bridge = crate::pairing::bridge_target(&cfg.protocol);
    let AgentName::Hosted(name) = &cfg.name else { return vec![bridge] };
    let mut v = vec![crate::pairing::agent_target(name)];
    if cfg.bridge_identity {
        v.push(bridge);
    }
    v
}

/// What a redeemed code lets the device use.
enum Grants {
    /// The allow file: the single-agent bridge (as the reference tool does,
    /// so a user who switches back keeps the pairing), or a code minted for
    /// that bridge redeemed at a host's agent on its identity that accepts
    /// your own devices.
    AllowFile,
    /// Exactly this agent of the host (`devices.json`), nothing else.
    Agent,
}

pub(crate) async fn pair(conn: Connection, peer: EndpointId, cfg: &AgentConfig, shared: &Arc<Shared>) {
    let short = peer.fmt_short().to_string();
    let Some(stores) = shared.stores() else {
        refuse(&conn, wire::REASON_PAIR_WRONG);
        return;
    };
    let now = std::time::Instant::now();
    let waiting = stores.pair_throttle.lock().unwrap_or_else(|p| p.into_inner()).waiting(&peer, now);
    if let Some(wait) = waiting {
        info!(peer = %short, "pairing refused for {peer}: too many wrong codes; it may try again in {} s", wait.as_secs().max(1));
        refuse(&conn, wire::REASON_PAIR_BACKOFF);
        return;
    }
    let deadline = shared.admission.stream_open_timeout;
    let line = tokio::time::timeout(deadline, async {
        let (send, mut recv) = conn.accept_bi().await.ok()?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 512];
        while !buf.contains(&b'\n') && buf.len() <= wire::MAX_PAIR_LINE {
            let Some(n) = recv.read(&mut chunk).await.ok()? else { break };
            buf.extend_from_slice(&chunk[..n]);
        }
        Some((send, buf))
    })
    .await;
    let Ok(Some((send, buf))) = line else {
        info!(peer = %short, "pairing: no request in time; closing");
        refuse(&conn, wire::REASON_PAIR_BAD);
        return;
    };
    let line = buf.split(|b| *b == b'\n').next().unwrap_or_default();
    let Ok(req) = serde_json::from_slice::<Request>(line).map_err(|_| ()).and_then(|r| {
        if buf.len() > wire::MAX_PAIR_LINE {
            Err(())
        } else {
            Ok(r)
        }
    }) else {
        info!(peer = %short, "pairing: a malformed request; closing");
        refuse(&conn, wire::REASON_PAIR_BAD);
        return;
    };
    let targets = targets(cfg);
    let given = wire::clean_name(&req.name);
    // An allowed device pairing again (a second scan) is simply told so; its
    // code stays unspent and nothing is written.
    if cfg.trust.check(&peer).is_some() {
        info!(peer = %short, "pairing: {peer} is allowed already");
        answer(&conn, send, stores.devices.name_of(&peer)).await;
        return;
    }
    let verdict = {
        let stores = stores.clone();
        let code = req.pair.clone();
        tokio::task::spawn_blocking(move || stores.pairings.redeem(&targets, &code))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    };
    let (name, grants) = match verdict {
        Ok((Redeemed::Paired { name }, minted_for)) => {
            let name = name.or(given).or_else(|| stores.devices.name_of(&peer));
            let own_devices = cfg.own_devices;
            let for_bridge =
                minted_for.as_deref() == Some(crate::pairing::bridge_target(&cfg.protocol).as_str());
            let grants = if cfg.name == AgentName::Single || (for_bridge && own_devices) {
                Grants::AllowFile
            } else {
                Grants::Agent
            };
            (name, grants)
        }
        Ok((Redeemed::Refused(reason), _)) => {
            if reason == wire::REASON_PAIR_WRONG {
                stores.pair_throttle.lock().unwrap_or_else(|p| p.into_inner()).wrong(&peer, now);
            }
            info!(peer = %short, "pairing refused for {peer}: {reason}");
            refuse(&conn, reason);
            return;
        }
        Err(e) => {
            warn!(peer = %short, "pairing: cannot read the pairing codes: {e}");
            refuse(&conn, wire::REASON_PAIR_WRONG);
            return;
        }
    };
    stores.pair_throttle.lock().unwrap_or_else(|p| p.into_inner()).paired(&peer);
    let recorded = {
        let (stores, name, agent) = (stores.clone(), name.clone(), cfg.name.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<bool> {
            match grants {
                Grants::AllowFile => {
                    let added = allowfile::allow(&stores.allow_file, &peer)?;
                    stores.devices.record(&peer, name, How::Pairing)?;
                    Ok(added)
                }
                Grants::Agent => {
                    stores.devices.grant(&peer, name, agent.as_str())?;
                    Ok(false)
                }
            }
        })
        .await
        .unwrap_or_else(|e| Err(anyhow::anyhow!(e)))
    };
    let named = name.as_deref().map(|n| format!(" as \"{n}\"")).unwrap_or_default();
    match (recorded, cfg.name == AgentName::Single) {
        (Ok(added), true) => info!(
            peer = %short,
            "paired {peer}{named} with a one-time code{}",
            if added { "; it is in the allow file now" } else { " (it was in the allow file already)" }
        ),
        (Ok(true), false) => info!(
            peer = %short,
            "paired {peer}{named} with a one-time code minted for this machine's {} bridge; it is in the allow file now (one of your own devices)",
            cfg.protocol
        ),
        (Ok(false), false) => info!(
            peer = %short,
            "paired {peer}{named} with a one-time code: it may use this agent ({}), and no other",
            cfg.name
        ),
        (Err(e), _) => {
            warn!(peer = %short, "pairing: cannot record {peer}: {e:#}");
            refuse(&conn, wire::REASON_PAIR_WRONG);
            return;
        }
    }
    if cfg.trust.check(&peer).is_none() {
        warn!(peer = %short, "paired {peer}, but this agent does not admit it (its manifest's accept_from)");
    }
    answer(&conn, send, name).await;
}

/// Tells the device it is paired, and waits (briefly) for it to hear it.
async fn answer(conn: &Connection, mut send: iroh::endpoint::SendStream, name: Option<String>) {
    let answer = serde_json::json!({ "paired": true, "name": name });
    let _ = send.write_all(format!("{answer}\n").as_bytes()).await;
    let _ = send.finish();
    let _ = tokio::time::timeout(crate::limits::FINISH_LINGER, send.stopped()).await;
    let _ = tokio::time::timeout(crate::limits::FINISH_LINGER, conn.closed()).await;
}
