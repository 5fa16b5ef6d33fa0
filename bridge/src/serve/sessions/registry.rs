//! Every session alive: the plain connections ([`PlainSessions`]) and the
//! hubs ([`Hubs`], attached or waiting for their client), for the heartbeat's
//! re-check, eviction when a slot is needed, `status` and `kick`; and what a
//! late resume of an ended session is told.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use iroh::{endpoint::Connection, EndpointId};
use thunderbolt_shared::close;
use tracing::info;

use super::hub::{Hub, HubKind, ENDED_REMEMBERED, MAX_DETACHED_PER_PEER};
use crate::{
    devices::scope::{Verb, Verbs},
    serve::{
        session::{refuse, SessionInfo},
        AgentName, Served,
    },
};

/// What a recheck asks of each device at an agent: whether the agent still
/// admits it, what its scope lets it do there, and what a device that is
/// out is told (revoked, or its scope ran out).
pub struct Recheck<'a> {
    pub admits: &'a dyn Fn(&AgentName, &EndpointId) -> bool,
    pub verbs: &'a dyn Fn(&AgentName, &EndpointId) -> Verbs,
    pub reason: &'a dyn Fn(&EndpointId) -> &'static str,
    /// A share's guest: the one session it may be on.
    pub share: &'a dyn Fn(&EndpointId) -> Option<String>,
}

/// The resumable and warm sessions alive (attached or not), by token, and
/// what a late resume of an ended one is told.
#[derive(Debug, Default)]
pub struct Hubs {
    map: Mutex<HashMap<String, Arc<Hub>>>,
    /// Recently ended sessions: the token's hash, owner, the close a resume gets.
    ended: Mutex<VecDeque<(String, EndpointId, String)>>,
}

impl Hubs {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Hub>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `hub` until the guard is dropped.
    pub fn insert(&self, hub: &Arc<Hub>) -> HubGuard<'_> {
        self.lock().insert(hub.id.clone(), hub.clone());
        HubGuard { hubs: self, hub: hub.clone() }
    }

    /// The session `token` of agent `agent` if `peer` owns it; else the
    /// reason to close a resume of it with. (A scan: a bridge holds a few
    /// dozen sessions at most, and a token is compared whole.)
    pub fn find(&self, token: &str, peer: &EndpointId, agent: &AgentName) -> Result<Arc<Hub>, String> {
        // By the token's hash: a session taken back after a restart knows no more.
        let hash = crate::journal::token_hash(token);
        let found = self
            .lock()
            .values()
            .filter(|h| h.agent == *agent)
            // A device that joined another's session resumes its own seat there.
            .flat_map(|h| std::iter::once(h.clone()).chain(h.guests()))
            .find(|h| h.owner == *peer && h.lock().token_hash == hash);
        if let Some(h) = found {
            h.adopt_token(token);
            return Ok(h);
        }
        let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        Err(ended
            .iter()
            .rev()
            .find(|(t, owner, _)| *t == hash && owner == peer)
            .map_or_else(|| close::REASON_UNKNOWN_SESSION.to_string(), |(_, _, r)| r.clone()))
    }

    /// The warm agent of `peer`'s at `agent`, with or without a connection
    /// (a newer connection takes it over from an older one).
    pub fn warm_for(&self, peer: &EndpointId, agent: &AgentName) -> Option<Arc<Hub>> {
        self.lock()
            .values()
            .filter(|h| h.kind == HubKind::Warm && h.owner == *peer && h.agent == *agent)
            .find(|h| h.lock().gone.is_none())
            .cloned()
    }

    /// Ends every session of `agent` with `reason` (code 1). Returns how many.
    pub fn end_agent(&self, agent: &AgentName, reason: &str) -> usize {
        let hubs: Vec<Arc<Hub>> = self.lock().values().filter(|h| h.agent == *agent).cloned().collect();
        for h in &hubs {
            info!(peer = %h.peer, session = h.short(), "ending the session: {reason}");
            h.end(close::CLOSE_CODE_REFUSED, reason);
        }
        hubs.len()
    }

    /// The detached session to end when a slot is needed for `requester`:
    /// its own that waited longest, else the one that waited longest of all.
    /// Never one with a connection attached.
    pub fn eviction_candidate(&self, requester: &EndpointId) -> Option<Arc<Hub>> {
        self.oldest_detached(Some(requester)).or_else(|| self.oldest_detached(None))
    }

    /// The detached session that waited longest, of `owner`'s (or of all).
    pub fn oldest_detached(&self, owner: Option<&EndpointId>) -> Option<Arc<Hub>> {
        self.lock()
            .values()
            .filter(|h| owner.is_none_or(|o| h.owner == *o))
            .filter_map(|h| h.detached_for().map(|d| (h.clone(), d)))
            .max_by_key(|(_, d)| *d)
            .map(|(h, _)| h)
    }

    /// A session of `owner`'s detached: beyond [`MAX_DETACHED_PER_PEER`] the
    /// oldest of its detached sessions are ended.
    pub(super) fn on_detach(&self, owner: &EndpointId) {
        let mut theirs: Vec<(Arc<Hub>, Duration)> = self
            .lock()
            .values()
            .filter(|h| h.owner == *owner)
            .filter_map(|h| h.detached_for().map(|d| (h.clone(), d)))
            .collect();
        if theirs.len() <= MAX_DETACHED_PER_PEER {
            return;
        }
        theirs.sort_by_key(|(_, d)| std::cmp::Reverse(*d));
        let excess = theirs.len() - MAX_DETACHED_PER_PEER;
        for (hub, _) in theirs.into_iter().take(excess) {
            hub.evict(&format!(
                "peer {} has more than {MAX_DETACHED_PER_PEER} detached sessions",
                owner.fmt_short()
            ));
        }
    }

    /// Ends every session (attached or not) whose owner its agent's trust
    /// no longer admits, detaches each device that joined and is no longer
    /// admitted, and gives every device the verbs its scope has now (a
    /// device that may no longer see the session leaves it; one that may no
    /// longer prompt gives up control).
    pub fn recheck(&self, r: &Recheck<'_>) -> usize {
        let hubs: Vec<Arc<Hub>> = self.lock().values().cloned().collect();
        let mut ended = 0;
        for hub in hubs {
            // What `who` may do here now (`None`: it is out, and why).
            let standing = |who: &EndpointId| -> Result<Verbs, &'static str> {
                if !(r.admits)(&hub.agent, who) {
                    return Err((r.reason)(who));
                }
                let verbs = (r.verbs)(&hub.agent, who);
                // A guest given another session's share since is not on this one any more.
                let elsewhere = (r.share)(who).is_some_and(|s| s != hub.short());
                if verbs.has(Verb::Observe) && !elsewhere {
                    Ok(verbs)
                } else {
                    Err(close::REASON_SCOPE_CHANGED)
                }
            };
            // A revoked device that joined leaves; the others go on.
            for g in hub.guests() {
                match standing(&g.owner) {
                    Ok(verbs) => g.refresh_verbs(verbs),
                    Err(why) => {
                        info!(peer = %g.peer, session = hub.short(), "detaching a device from the session: {why}");
                        hub.drop_member(&g, why);
                        ended += 1;
                    }
                }
            }
            match standing(&hub.owner) {
                Ok(verbs) => hub.refresh_verbs(verbs),
                Err(why) if hub.view().members.len() > 1 => {
                    info!(peer = %hub.peer, session = hub.short(), "detaching the device that started the session: {why}");
                    hub.drop_member(&hub, why);
                    ended += 1;
                }
                Err(why) if !hub.lock().members.left => {
                    info!(peer = %hub.peer, session = hub.short(), "ending the session: {why}");
                    hub.end(close::CLOSE_CODE_REFUSED, why);
                    ended += 1;
                }
                Err(_) => {}
            }
        }
        ended
    }

    /// Every session now.
    pub fn all(&self) -> Vec<Arc<Hub>> {
        self.lock().values().cloned().collect()
    }

    /// Sessions waiting for their client (resumable) or for a next client (warm).
    pub fn detached(&self) -> usize {
        self.lock().values().filter(|h| h.is_detached()).count()
    }

    /// The detached and warm sessions, named, for the log: `2 detached
    /// (ab12cd34 of 5f3e9a…, 42 s; …), 1 warm (…)`.
    pub fn summary(&self) -> String {
        let mut detached = Vec::new();
        let mut warm = Vec::new();
        for h in self.lock().values() {
            if let Some(d) = h.detached_for() {
                let entry = format!("{} of {}, {}s", h.short(), h.peer, d.as_secs());
                match h.kind {
                    HubKind::Resumable => detached.push(entry),
                    HubKind::Warm => warm.push(entry),
                }
            }
        }
        let list = |v: &[String]| if v.is_empty() { String::new() } else { format!(" ({})", v.join("; ")) };
        format!("{} detached{}, {} warm{}", detached.len(), list(&detached), warm.len(), list(&warm))
    }

    pub(super) fn remember(&self, hub: &Hub) {
        let reason =
            hub.gone().map_or_else(|| close::REASON_UNKNOWN_SESSION.to_string(), |g| g.resume_reason);
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        if ended.len() >= ENDED_REMEMBERED {
            ended.pop_front();
        }
        ended.push_back((hub.lock().token_hash.clone(), hub.owner, reason));
    }
}

pub struct HubGuard<'a> {
    hubs: &'a Hubs,
    hub: Arc<Hub>,
}

impl Drop for HubGuard<'_> {
    fn drop(&mut self) {
        self.hubs.lock().remove(&self.hub.id);
        self.hubs.remember(&self.hub);
    }
}

/// An admitted connection: its peer, the connection, the agent it reached,
/// and for a plain session what `status` shows of it (a hub has its own).
type PlainSession = (EndpointId, Connection, Arc<Served>, Option<Arc<SessionInfo>>);

/// A files connection: its peer, the connection, the agent it reached.
type Transfer = (EndpointId, Connection, Arc<Served>);

/// The admitted plain connections, so the heartbeat can re-check them.
#[derive(Debug, Default)]
pub struct PlainSessions {
    map: Mutex<HashMap<usize, PlainSession>>,
    /// Connections of the files door: no session, re-checked and closed
    /// with the agent all the same.
    transfers: Mutex<HashMap<usize, Transfer>>,
}

impl PlainSessions {
    pub fn insert(
        &self,
        conn: &Connection,
        agent: &Arc<Served>,
        info: Option<&Arc<SessionInfo>>,
    ) -> PlainGuard<'_> {
        let key = conn.stable_id();
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (conn.remote_id(), conn.clone(), agent.clone(), info.cloned()));
        PlainGuard { sessions: self, key }
    }

    /// Registers a files connection, so a revocation or the agent's removal
    /// ends its transfers at once.
    pub fn insert_transfer(&self, conn: &Connection, agent: &Arc<Served>) -> TransferGuard<'_> {
        let key = conn.stable_id();
        self.transfers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (conn.remote_id(), conn.clone(), agent.clone()));
        TransferGuard { sessions: self, key }
    }

    /// The files connections, to look at without holding the lock.
    fn transfers(&self) -> Vec<Transfer> {
        self.transfers.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    /// What `status` shows of each plain session.
    pub fn infos(&self) -> Vec<Arc<SessionInfo>> {
        self.snapshot().into_iter().filter_map(|(_, _, _, info)| info).collect()
    }

    /// A copy of every entry, to look at without holding the lock.
    pub fn snapshot(&self) -> Vec<PlainSession> {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    /// Closes every session whose peer its agent's trust no longer admits
    /// (`membership revoked`, or `device access expired`), or whose scope no
    /// longer lets it drive a session (a plain one cannot be only watched),
    /// and every file transfer of a device no longer let send files.
    /// Returns how many sessions were closed.
    pub fn recheck(&self, r: &Recheck<'_>) -> usize {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let mut closed = 0;
        // A hub's connection is re-checked with its hub (`Hubs::recheck`).
        for (peer, conn, agent, _) in map.values().filter(|(_, _, _, info)| info.is_some()) {
            let name = agent.config().name.clone();
            let why = if !(r.admits)(&name, peer) {
                (r.reason)(peer)
            } else if !(r.verbs)(&name, peer).has(Verb::Start) {
                close::REASON_SCOPE_CHANGED
            } else {
                continue;
            };
            info!(peer = %peer.fmt_short(), "closing {peer}: {why}");
            refuse(conn, why);
            closed += 1;
        }
        drop(map);
        for (peer, conn, agent) in self.transfers() {
            let name = agent.config().name.clone();
            let why = if !(r.admits)(&name, &peer) {
                (r.reason)(&peer)
            } else if !(r.verbs)(&name, &peer).has(Verb::Files) {
                thunderbolt_shared::files::REASON_NOT_PERMITTED
            } else {
                continue;
            };
            info!(peer = %peer.fmt_short(), "closing {peer}'s file transfers: {why}");
            refuse(&conn, why);
        }
        closed
    }

    /// Closes every session of `agent` with `reason`.
    pub fn close_agent(&self, agent: &Arc<Served>, reason: &str) -> usize {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let mut n = 0;
        for (_, conn, a, _) in map.values() {
            if Arc::ptr_eq(a, agent) {
                refuse(conn, reason);
                n += 1;
            }
        }
        for (_, conn, a) in self.transfers() {
            if Arc::ptr_eq(&a, agent) {
                refuse(&conn, reason);
            }
        }
        n
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

pub struct PlainGuard<'a> {
    sessions: &'a PlainSessions,
    key: usize,
}

impl Drop for PlainGuard<'_> {
    fn drop(&mut self) {
        self.sessions.map.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.key);
    }
}

pub struct TransferGuard<'a> {
    sessions: &'a PlainSessions,
    key: usize,
}

impl Drop for TransferGuard<'_> {
    fn drop(&mut self) {
        self.sessions.transfers.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.key);
    }
}
