//! A device pairing itself with a one-time code (`thunderbolt/<p>/pair1`,
//! specified in [`thunderbolt_shared::pairing`]). Reached only after the
//! gate (per-remote budget, handshake cap) and the handshake, like every
//! connection; no agent is ever spawned on it.

use std::{collections::HashSet, sync::Arc};

use iroh::{endpoint::Connection, EndpointId};
use serde::Deserialize;
use thunderbolt_shared::pairing as wire;
use tracing::{info, warn};

use crate::{
    devices::{scope::Scope, How},
    pairing::{Redeemed, Target},
    serve::{session::refuse, AgentConfig, AgentName, Shared, Stores},
    trust::{allowfile, Grant},
};

#[derive(Deserialize)]
struct Request {
    pair: String,
    #[serde(default)]
    name: String,
    /// `1`: the device reads the agents it may reach in the answer.
    #[serde(default)]
    agents: serde_json::Value,
}

impl Request {
    fn wants_agents(&self) -> bool {
        self.agents.as_u64() == Some(1) || self.agents.as_bool() == Some(true)
    }
}

/// What the pairing door needs to know of the agent it opens on.
#[derive(Debug, Clone)]
struct Door {
    name: AgentName,
    protocol: String,
    /// On the protocol's single-agent bridge identity (a host's agent).
    bridge_identity: bool,
    /// It admits your own devices (the allow file, the account).
    own_devices: bool,
}

/// What a redeemed code lets the device use.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Grants {
    /// The allow file: the device is one of your own devices, so every agent
    /// that admits them (and the single-agent bridge, as the reference tool
    /// does, so a user who switches back keeps the pairing) lets it in.
    AllowFile,
    /// Exactly these agents of the host (`devices.json`), nothing else.
    Agents(Vec<String>),
}

impl Door {
    fn of(cfg: &AgentConfig) -> Self {
        Self {
            name: cfg.name.clone(),
            protocol: cfg.protocol.clone(),
            bridge_identity: cfg.bridge_identity,
            own_devices: cfg.own_devices,
        }
    }

    /// Where a code may have been minted for to pair here: the agent
    /// itself; for a host's agent on the protocol's single-agent bridge
    /// identity, that bridge too; for one that admits your own devices, a
    /// code for them (a bare `iroh pair`).
    fn accepts(&self) -> Vec<Target> {
        let bridge = Target::Bridge(self.protocol.clone());
        let AgentName::Hosted(name) = &self.name else { return vec![bridge] };
        let mut v = vec![Target::Agent(name.to_string())];
        if self.bridge_identity {
            v.push(bridge);
        }
        if self.own_devices {
            v.push(Target::OwnDevices);
        }
        v
    }

    /// What a code minted for `minted_for` grants when redeemed here.
    fn grants(&self, minted_for: &[Target]) -> Grants {
        let AgentName::Hosted(me) = &self.name else { return Grants::AllowFile };
        let bridge = Target::Bridge(self.protocol.clone());
        let for_own = minted_for.iter().any(|t| *t == Target::OwnDevices || *t == bridge);
        if for_own && self.own_devices {
            return Grants::AllowFile;
        }
        let agents: Vec<String> = minted_for
            .iter()
            .filter_map(|t| match t {
                Target::Agent(n) => Some(n.clone()),
                _ => None,
            })
            .collect();
        // A code for the bridge redeemed at a host's agent on its identity
        // that does not admit your own devices: that agent, and no other.
        Grants::Agents(if agents.is_empty() { vec![me.to_string()] } else { agents })
    }
}

/// What a device holds already as one of your own devices: whether it is
/// one (the account, the allow file), and the host's agents it reaches as one.
#[derive(Debug, Default)]
struct Held {
    own: bool,
    agents: HashSet<String>,
}

impl Held {
    /// What `peer` holds now at the agents `shared` serves.
    fn of(shared: &Shared, peer: &EndpointId) -> Self {
        let mut held = Held::default();
        for a in shared.served().values() {
            let cfg = a.config();
            let grant = cfg.trust.check(peer);
            held.own |= matches!(grant, Some(Grant::Account | Grant::Manual));
            if let (Some(name), Some(Grant::Account | Grant::Manual | Grant::Paired)) =
                (cfg.name.manifest_name(), grant)
            {
                held.agents.insert(name.to_string());
            }
        }
        held
    }

    /// Whether `g` would give `peer` nothing it does not hold (a guest let
    /// in by a manifest's NodeId does not hold what a code grants: it
    /// becomes one of your own devices there).
    fn covers(&self, stores: &Stores, peer: &EndpointId, g: &Grants) -> bool {
        match g {
            Grants::AllowFile => {
                self.own || allowfile::read(&stores.allow_file).is_ok_and(|a| a.ids.contains(peer))
            }
            Grants::Agents(agents) => {
                agents.iter().all(|a| self.agents.contains(a) || stores.devices.granted(peer, a))
            }
        }
    }
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
    // A single-agent bridge answers as it always did.
    let list = req.wants_agents() && cfg.name != AgentName::Single;
    let door = Door::of(cfg);
    // An allowed device pairing again (a second scan) is simply told so when
    // the code gives it nothing new: the code stays unspent, nothing is written.
    let allowed = cfg.trust.check(&peer).is_some();
    let held = Held::of(shared, &peer);
    let verdict = {
        let (stores, door, code) = (stores.clone(), door.clone(), req.pair.clone());
        tokio::task::spawn_blocking(move || {
            stores.pairings.redeem(&door.accepts(), &code, |minted_for| {
                !allowed || !held.covers(&stores, &peer, &door.grants(minted_for))
            })
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
    };
    let (minted_name, grants, scope) = match verdict {
        Ok(Redeemed::Paired { name, minted_for, scope }) => (name, door.grants(&minted_for), scope),
        Ok(Redeemed::Refused(reason)) if !allowed => {
            if reason == wire::REASON_PAIR_WRONG {
                stores.pair_throttle.lock().unwrap_or_else(|p| p.into_inner()).wrong(&peer, now);
            }
            info!(peer = %short, "pairing refused for {peer}: {reason}");
            refuse(&conn, reason);
            return;
        }
        // A code it needs nothing of, or any code to a device allowed already.
        Ok(other) => {
            if matches!(other, Redeemed::Unneeded) {
                info!(peer = %short, "pairing: {peer} holds all the code grants already; the code stays unspent");
            } else {
                info!(peer = %short, "pairing: {peer} is allowed already");
            }
            // As it stands here: its name, what it reaches, what it may do.
            let (name, scope) = (stores.devices.name_of(&peer), Some(stores.devices.scope_of(&peer)));
            answer(&conn, send, name, list.then(|| reachable(shared, &peer)), scope, shared).await;
            return;
        }
        Err(e) => {
            warn!(peer = %short, "pairing: cannot read the pairing codes: {e}");
            refuse(&conn, wire::REASON_PAIR_WRONG);
            return;
        }
    };
    stores.pair_throttle.lock().unwrap_or_else(|p| p.into_inner()).paired(&peer);
    // The name minted with the code, else the one the device has here
    // already (pairing again does not rename it), else the one it sent.
    let name = minted_name.or_else(|| stores.devices.name_of(&peer)).or_else(|| wire::clean_name(&req.name));
    let recorded = {
        let (stores, name, grants, scope) = (stores.clone(), name.clone(), grants.clone(), scope.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<bool> {
            // A share's guest: its scope names its one session and agent,
            // and that is all that admits it (no allow line, no grant).
            if let Some(scope) = scope.clone().filter(|s| s.session.is_some()) {
                stores.devices.record(&peer, name, How::Share)?;
                stores.devices.set_scope(&peer, Some(scope))?;
                return Ok(false);
            }
            // The scope first: the device is admitted the moment the allow
            // file or its grant names it, and must never be wider meanwhile.
            if let Some(scope) = scope {
                stores.devices.record(&peer, None, How::Pairing)?;
                stores.devices.set_scope(&peer, Some(scope))?;
            }
            match &grants {
                Grants::AllowFile => {
                    let added = allowfile::allow(&stores.allow_file, &peer)?;
                    stores.devices.record(&peer, name, How::Pairing)?;
                    Ok(added)
                }
                Grants::Agents(agents) => {
                    stores.devices.grant(&peer, name, agents)?;
                    Ok(false)
                }
            }
        })
        .await
        .unwrap_or_else(|e| Err(anyhow::anyhow!(e)))
    };
    let named = name.as_deref().map(|n| format!(" as \"{n}\"")).unwrap_or_default();
    if let Some(s) = &scope {
        info!(peer = %short, "{peer}'s scope: {}", s.describe());
    }
    let single = cfg.name == AgentName::Single;
    let share = scope.as_ref().filter(|s| s.session.is_some());
    match (&recorded, &grants) {
        (Ok(_), _) if share.is_some() => info!(
            peer = %short,
            "{peer}{named} redeemed a share: {}; it is not one of your own devices",
            share.map(|s| s.describe()).unwrap_or_default()
        ),
        (Ok(added), Grants::AllowFile) if single => info!(
            peer = %short,
            "paired {peer}{named} with a one-time code{}",
            if *added { "; it is in the allow file now" } else { " (it was in the allow file already)" }
        ),
        (Ok(_), Grants::AllowFile) => info!(
            peer = %short,
            "paired {peer}{named} with a one-time code: one of your own devices now (the allow file), it may use every agent that admits them"
        ),
        (Ok(_), Grants::Agents(agents)) => info!(
            peer = %short,
            "paired {peer}{named} with a one-time code: it may use {} ({}), and no other agent",
            if agents.len() == 1 { "this agent" } else { "these agents" },
            agents.join(", ")
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
    answer(&conn, send, name, list.then(|| reachable(shared, &peer)), scope, shared).await;
}

/// Every agent of the host `peer` may reach now, by name.
pub(super) fn reachable(shared: &Shared, peer: &EndpointId) -> Vec<wire::PairedAgent> {
    let mut agents: Vec<wire::PairedAgent> = shared
        .served()
        .values()
        .filter_map(|a| {
            let cfg = a.config();
            let name = cfg.name.manifest_name()?.to_string();
            cfg.trust.check(peer)?;
            Some(wire::PairedAgent {
                name,
                label: cfg.label.to_string(),
                protocol: cfg.protocol.clone(),
                ticket: a.ticket().to_string(),
            })
        })
        .collect();
    agents.sort_by(|a, b| a.name.cmp(&b.name));
    agents
}

/// Tells the device it is paired (and, when it asked, what it may reach),
/// and waits (briefly) for it to hear it.
async fn answer(
    conn: &Connection,
    mut send: iroh::endpoint::SendStream,
    name: Option<String>,
    agents: Option<Vec<wire::PairedAgent>>,
    scope: Option<Scope>,
    shared: &Shared,
) {
    // The host's name goes with the agents (a device that asked for them);
    // an old client's answer stays byte for byte as it was.
    let host = agents.as_ref().and_then(|_| wire::clean_name(&crate::trust::account::device_name()));
    let session = scope.as_ref().and_then(|s| s.session.clone());
    // Whose session a share's guest joins: the name of the device that started it.
    let of = session.as_ref().and_then(|id| {
        let hub = shared.hubs.all().into_iter().find(|h| h.short() == id)?;
        Some(hub.device().label())
    });
    let until = scope.as_ref().and_then(|s| s.until_ms).map(crate::devices::rfc3339);
    let scope = scope.filter(|s| !s.verbs.is_all()).map(|s| s.verbs.iter().map(|v| v.to_string()).collect());
    let line = wire::Answer {
        paired: true,
        name,
        agents: agents.unwrap_or_default(),
        host,
        scope,
        session,
        until,
        of,
    }
    .line();
    let _ = send.write_all(&line).await;
    let _ = send.finish();
    let _ = tokio::time::timeout(crate::limits::FINISH_LINGER, send.stopped()).await;
    let _ = tokio::time::timeout(crate::limits::FINISH_LINGER, conn.closed()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn door(name: Option<&str>, bridge_identity: bool, own_devices: bool) -> Door {
        Door {
            name: name.map_or(AgentName::Single, AgentName::hosted),
            protocol: "acp".into(),
            bridge_identity,
            own_devices,
        }
    }

    #[test]
    fn what_a_code_grants_where_it_is_redeemed() {
        let (own, bridge) = (Target::OwnDevices, Target::Bridge("acp".into()));
        let agent = |n: &str| Target::Agent(n.into());
        // The single-agent bridge: its own codes only, into the allow file.
        let single = door(None, false, true);
        assert_eq!(single.accepts(), vec![bridge.clone()]);
        assert_eq!(single.grants(&[bridge.clone(), own.clone()]), Grants::AllowFile);
        // A host's agent for your own devices: a whole host's code makes one of them.
        let main = door(Some("main"), false, true);
        assert_eq!(main.accepts(), vec![agent("main"), own.clone()]);
        assert_eq!(main.grants(&[bridge.clone(), own.clone()]), Grants::AllowFile);
        // Codes for some agents grant those, wherever redeemed.
        assert_eq!(
            main.grants(&[agent("a"), agent("main")]),
            Grants::Agents(vec!["a".into(), "main".into()])
        );
        // An agent for a guest only, on the bridge's identity: that agent alone.
        let guest = door(Some("guest"), true, false);
        assert_eq!(guest.accepts(), vec![agent("guest"), bridge.clone()]);
        assert_eq!(guest.grants(&[bridge]), Grants::Agents(vec!["guest".into()]));
    }
}
