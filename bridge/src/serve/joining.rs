//! A device asks which sessions of an agent it may join, and joins one
//! (see [`crate::serve::sessions::devices`] for what a shared session is).
//!
//! Who may see and join which session is decided by the device's standing
//! ([`super::standing`]): a device always its own; one of the owner's own
//! devices also those another of the owner's own devices started. A session a
//! device may not see is, to it, a session that does not exist.

use std::{collections::HashMap, sync::Arc, time::Duration};

use bytes::Bytes;
use iroh::{
    endpoint::{Connection, RecvStream, SendStream, VarInt},
    EndpointId,
};
use thunderbolt_shared::{close, devices::Listing};
use tracing::info;

use crate::devices::scope::{Verb, Verbs};

use super::{
    admit::Admitted,
    served::{AgentConfig, AgentName},
    session::refuse,
    sessions::{AttachError, Hub, HubKind, JoinAs, JoinError},
    standing::{self, Standing},
};

/// How long a listing's connection waits for the device to close it after
/// the answer (a client closes at once; one that does not costs this).
const LISTING_LINGER: Duration = Duration::from_secs(10);

/// The device's name on this bridge (the devices file), if it has one.
pub(super) fn device_name(a: &Admitted, node: &EndpointId) -> Option<String> {
    a.shared.stores().and_then(|s| s.devices.name_of(node))
}

/// Whether the device `peer` may see (and join) a session `owner` started,
/// by their standings at the session's agent (`standing`): its own, and, for
/// one of the owner's own devices, those another of the owner's own devices
/// started. A device the agent does not admit sees none of its sessions.
fn sees(peer: &EndpointId, owner: &EndpointId, standing: impl Fn(&EndpointId) -> Option<Standing>) -> bool {
    match standing(peer) {
        None => false,
        Some(_) if owner == peer => true,
        Some(mine) => mine == Standing::Own && standing(owner) == Some(Standing::Own),
    }
}

/// The resumable sessions alive that `keep` keeps, oldest first.
fn joinable(a: &Admitted, keep: impl Fn(&Arc<Hub>) -> bool) -> Vec<Arc<Hub>> {
    let mut hubs: Vec<Arc<Hub>> = a
        .shared
        .hubs
        .all()
        .into_iter()
        .filter(|h| h.kind() == HubKind::Resumable && !h.view().gone)
        .filter(keep)
        .collect();
    hubs.sort_by_key(|h| h.info().started);
    hubs
}

/// The sessions of every agent of the host the device may join: this
/// agent's as [`visible`], another's by the device's standing there.
fn visible_on_host(a: &Admitted) -> Vec<Arc<Hub>> {
    let configs: HashMap<AgentName, Arc<AgentConfig>> =
        a.shared.served().into_iter().map(|(name, s)| (name, s.config())).collect();
    if a.share.is_some() {
        return visible(a);
    }
    joinable(a, |h| {
        if *h.agent() == a.cfg.name {
            return observes(a.verbs) && sees(&a.peer, &h.owner(), |n| standing::of(a, n));
        }
        configs.get(h.agent()).is_some_and(|cfg| {
            observes(a.shared.verbs(cfg, &a.peer))
                && sees(&a.peer, &h.owner(), |n| standing::at(&a.shared, cfg, n))
        })
    })
}

/// Whether a device's scope lets it see sessions at all (one that may only
/// send files sees none, not even its own: it could not have started one).
fn observes(verbs: Verbs) -> bool {
    verbs.has(Verb::Observe)
}

/// The sessions of this agent the device may join (a share's guest: its
/// one session, nothing else).
fn visible(a: &Admitted) -> Vec<Arc<Hub>> {
    joinable(a, |h| {
        *h.agent() == a.cfg.name
            && observes(a.verbs)
            && match &a.share {
                Some(id) => h.short() == id,
                None => sees(&a.peer, &h.owner(), |n| standing::of(a, n)),
            }
    })
}

/// Answers a listing (of this agent, or of the `host`): one line, then the
/// stream's end; the device closes.
pub(super) async fn list(conn: Connection, mut send: SendStream, a: &Admitted, host: bool) {
    let listing = if host && a.cfg.name.manifest_name().is_some() {
        let sessions: Vec<_> = visible_on_host(a).iter().map(|h| h.listed()).collect();
        let agents = super::pair::reachable(&a.shared, &a.peer);
        info!(peer = %a.short, "listed {} session(s) of the host's {} agent(s) it may reach", sessions.len(), agents.len());
        let host = thunderbolt_shared::pairing::clean_name(&crate::trust::account::device_name());
        Listing { sessions, agents: Some(agents), host, messages: None, scope: None }
    } else {
        let sessions: Vec<_> = visible(a).iter().map(|h| h.listed()).collect();
        info!(peer = %a.short, "listed {} session(s) of {} it may join", sessions.len(), a.cfg.name);
        Listing { sessions, ..Listing::default() }
    };
    // The owner's own devices see the host's messages in short beside its sessions.
    let mut listing = listing;
    // Not to a share's guest, nor a device scoped narrower than the messages door lets in.
    let reads = a.shared.stores().is_none_or(|s| s.devices.scope_of(&a.peer).reads_messages());
    if a.grant != crate::trust::Grant::Manifest && reads {
        listing.messages = a.shared.reach.get().map(|r| r.summary());
    }
    listing.scope = (!a.verbs.is_all()).then(|| a.verbs.iter().map(|v| v.to_string()).collect());
    let mut line = serde_json::to_vec(&listing).expect("a listing serializes");
    line.push(b'\n');
    if send.write_all(&line).await.is_err() || send.finish().is_err() {
        return;
    }
    tokio::select! {
        _ = conn.closed() => {}
        _ = tokio::time::sleep(LISTING_LINGER) => {
            conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_LISTED.as_bytes());
        }
        _ = a.shared.shutdown.cancelled() => refuse(&conn, close::REASON_SHUTTING_DOWN),
    }
}

/// Joins the device to session `id` on its own streams.
pub(super) fn join(
    conn: &Connection,
    id: &str,
    how: JoinAs,
    (send, recv): (SendStream, RecvStream),
    leftover: Bytes,
    a: &Admitted,
) {
    let Some(hub) = visible(a).into_iter().find(|h| h.short() == id) else {
        info!(peer = %a.short, "refusing a join of session '{}': none it may see", id.chars().take(16).collect::<String>());
        refuse(conn, close::REASON_UNKNOWN_SESSION);
        return;
    };
    let joined: usize =
        a.shared.hubs.all().iter().map(|h| h.guests().iter().filter(|g| g.owner() == a.peer).count()).sum();
    let name = device_name(a, &a.peer);
    match hub.join(a.peer, name, how, joined, (conn.clone(), send, recv), leftover) {
        Ok(()) => {}
        Err(JoinError::Unknown) => refuse(conn, close::REASON_UNKNOWN_SESSION),
        Err(JoinError::Gone(reason)) => refuse(conn, &reason),
        Err(JoinError::Full(why)) => {
            info!(peer = %a.short, session = hub.short(), "refusing a join: {why}");
            refuse(conn, close::REASON_TOO_MANY_DEVICES);
        }
        Err(JoinError::Attach(AttachError::Gone(reason))) => refuse(conn, &reason),
        Err(JoinError::Attach(e)) => {
            info!(peer = %a.short, session = hub.short(), "could not join: {e:?}");
            refuse(conn, close::REASON_RESUME_PROTOCOL);
        }
    }
}
