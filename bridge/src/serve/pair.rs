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
    serve::{session::refuse, AgentConfig, Shared},
    trust::allowfile,
};

#[derive(Deserialize)]
struct Request {
    pair: String,
    #[serde(default)]
    name: String,
}

/// What a pairing code must have been minted for at this agent.
pub fn target(cfg: &AgentConfig) -> String {
    if cfg.name.is_empty() {
        crate::pairing::bridge_target(&cfg.protocol)
    } else {
        crate::pairing::agent_target(&cfg.name)
    }
}

pub(crate) async fn pair(conn: Connection, peer: EndpointId, cfg: &AgentConfig, shared: &Arc<Shared>) {
    let short = peer.fmt_short().to_string();
    let Some(stores) = shared.stores() else {
        refuse(&conn, wire::REASON_PAIR_WRONG);
        return;
    };
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
    let target = target(cfg);
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
        let t = target.clone();
        tokio::task::spawn_blocking(move || stores.pairings.redeem(&t, &code))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    };
    let name = match verdict {
        Ok(Redeemed::Paired { name }) => name.or(given).or_else(|| stores.devices.name_of(&peer)),
        Ok(Redeemed::Refused(reason)) => {
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
    let recorded = {
        let (stores, name) = (stores.clone(), name.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<bool> {
            let added = allowfile::allow(&stores.allow_file, &peer)?;
            stores.devices.record(&peer, name, How::Pairing)?;
            Ok(added)
        })
        .await
        .unwrap_or_else(|e| Err(anyhow::anyhow!(e)))
    };
    match recorded {
        Ok(added) => info!(
            peer = %short,
            "paired {peer}{} with a one-time code{}",
            name.as_deref().map(|n| format!(" as \"{n}\"")).unwrap_or_default(),
            if added { "; it is in the allow file now" } else { " (it was in the allow file already)" }
        ),
        Err(e) => {
            warn!(peer = %short, "pairing: cannot add {peer} to the allow file: {e:#}");
            refuse(&conn, wire::REASON_PAIR_WRONG);
            return;
        }
    }
    if cfg.trust.check(&peer).is_none() {
        warn!(
            peer = %short,
            "paired {peer}, but this agent does not accept the allow file's devices (its manifest's accept_from)"
        );
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
