//! Agent slots: what a new session must hold to start its agent. One of the
//! bridge's `--max-agents`, one of its agent's `max_sessions`, and for a
//! guest (a peer that is not one of your own devices) one of its own few.
//! With every slot taken, a detached session is evicted to make room; never
//! one with a client attached.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use iroh::{endpoint::Connection, EndpointId};
use thunderbolt_shared::close;
use tracing::warn;

use super::standing::Standing;
use super::{
    admit::Admitted,
    bridge::Shared,
    served::{LiveGuard, REASON_AGENT_REMOVED},
    session::refuse,
};

/// How long an eviction may take to free its slot: the evicted agent gets
/// SIGTERM, then SIGKILL after the grace, and is reaped.
const EVICTION_WAIT: Duration =
    Duration::from_millis(crate::limits::AGENT_TERM_GRACE.as_millis() as u64 + 1000);

/// A session's hold on an agent slot (bridge-wide) and on one of its agent's
/// `max_sessions`.
pub(super) struct Slot {
    pub(super) permit: tokio::sync::OwnedSemaphorePermit,
    pub(super) live: LiveGuard,
    /// Dropped with the session, after the agent was reaped.
    _device: DeviceGuard,
}

/// Live sessions of guests (peers that are not your own devices), per NodeId
/// and together, across every agent of the bridge.
#[derive(Debug, Default)]
pub(super) struct PerDevice {
    counts: Mutex<(HashMap<EndpointId, usize>, usize)>,
    /// Told whenever a guest's session ends.
    freed: tokio::sync::Notify,
}

impl PerDevice {
    /// One more session for guest `peer`, unless it holds `each` already or
    /// all guests hold `all`. `Err(true)`: `peer` itself is at its cap.
    fn try_take(self: &Arc<Self>, peer: &EndpointId, each: usize, all: usize) -> Result<DeviceGuard, bool> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let (map, total) = &mut *c;
        let mine = map.get(peer).copied().unwrap_or(0);
        if mine >= each {
            return Err(true);
        }
        if *total >= all {
            return Err(false);
        }
        map.insert(*peer, mine + 1);
        *total += 1;
        Ok(DeviceGuard(Some((self.clone(), *peer))))
    }
}

/// One of a guest's live sessions: counted until dropped (empty for your own devices).
#[derive(Debug)]
struct DeviceGuard(Option<(Arc<PerDevice>, EndpointId)>);

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        let Some((per, peer)) = self.0.take() else { return };
        {
            let mut c = per.counts.lock().unwrap_or_else(|p| p.into_inner());
            let (map, total) = &mut *c;
            *total = total.saturating_sub(1);
            if let Some(n) = map.get_mut(&peer) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    map.remove(&peer);
                }
            }
        }
        per.freed.notify_waiters();
    }
}

/// A guest's hold on one of [`Admission::max_per_device`] (and of the
/// guests' [`Admission::max_guests`]); your own devices need none. A guest at
/// its cap gives up its own longest-detached session for the new one (as the
/// bridge-wide slots do); with none detached it is refused.
async fn device_slot(a: &Admitted) -> Option<DeviceGuard> {
    if !super::standing::of(a, &a.peer).is_none_or(Standing::is_guest) {
        return Some(DeviceGuard(None));
    }
    let per = &a.shared.per_device;
    let (each, all) = (a.shared.admission.max_per_device, a.shared.admission.max_guests);
    // Bounded: each round ends one of its detached sessions.
    for _ in 0..=each {
        let freed = per.freed.notified();
        tokio::pin!(freed);
        freed.as_mut().enable();
        let own_cap = match per.try_take(&a.peer, each, all) {
            Ok(g) => return Some(g),
            Err(own_cap) => own_cap,
        };
        let victim = a.shared.hubs.oldest_detached(Some(&a.peer))?;
        let why = if own_cap {
            format!("guest {} is at its {each} live sessions and opened another", a.short)
        } else {
            format!("guests hold {all} sessions, the most they may, and guest {} opened another", a.short)
        };
        if !victim.evict(&why) {
            continue;
        }
        tokio::select! {
            r = tokio::time::timeout(EVICTION_WAIT, freed) => if r.is_err() { return None },
            _ = a.shared.shutdown.cancelled() => return None,
        }
    }
    None
}

/// An agent slot, or the peer is refused with `bridge at capacity` (the log
/// says what holds the slots).
pub(super) async fn agent_slot(conn: &Connection, a: &Admitted) -> Option<Slot> {
    let Some(device) = device_slot(a).await else {
        if !a.shared.shutdown.is_cancelled() {
            warn!(
                peer = %a.short,
                "refusing: {} (a guest, {}: at most {} live sessions each and {} for all guests, so your own devices always get in; none of its own is detached)",
                close::REASON_AT_CAPACITY,
                a.grant,
                a.shared.admission.max_per_device,
                a.shared.admission.max_guests
            );
        }
        refuse(conn, close::REASON_AT_CAPACITY);
        return None;
    };
    let Some(live) = a.agent.take_session(&a.cfg) else {
        warn!(
            peer = %a.short,
            "refusing: {} (the agent's max_sessions, {}, are all live)",
            close::REASON_AT_CAPACITY,
            a.cfg.max_sessions.unwrap_or(0)
        );
        refuse(conn, close::REASON_AT_CAPACITY);
        return None;
    };
    let permit = take_slot(conn, &a.peer, &a.short, &a.shared).await;
    if permit.is_none() && !a.shared.shutdown.is_cancelled() {
        warn!(
            peer = %a.short,
            "refusing: {} ({} agents running; {}; every other session has a client attached)",
            close::REASON_AT_CAPACITY,
            a.shared.admission.max_agents,
            a.shared.hubs.summary()
        );
        refuse(conn, close::REASON_AT_CAPACITY);
    }
    let permit = permit?;
    // Removed since its admission (a slot may have been awaited): no agent for it.
    if a.agent.stop.is_cancelled() {
        refuse(conn, REASON_AGENT_REMOVED);
        return None;
    }
    Some(Slot { permit, live, _device: device })
}

/// An agent slot. With every slot taken, a detached session is evicted to
/// make room (the requester's own oldest, else the oldest of all; never one
/// with a client attached).
async fn take_slot(
    conn: &Connection,
    peer: &EndpointId,
    short: &str,
    shared: &Shared,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    // Bounded: each round ends one detached session; concurrent newcomers may
    // take the slot it freed, and then the next one goes.
    for _ in 0..shared.admission.max_agents {
        if let Ok(permit) = shared.agents.clone().try_acquire_owned() {
            return Some(permit);
        }
        let victim = shared.hubs.eviction_candidate(peer)?;
        if !victim.evict(&format!("the bridge is at capacity and peer {short} needs a slot")) {
            continue;
        }
        let wait = tokio::time::timeout(EVICTION_WAIT, shared.agents.clone().acquire_owned());
        tokio::select! {
            r = wait => if let Ok(Ok(permit)) = r { return Some(permit) },
            _ = shared.shutdown.cancelled() => {
                refuse(conn, close::REASON_SHUTTING_DOWN);
                return None;
            }
        }
    }
    None
}
