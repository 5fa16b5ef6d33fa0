//! Several devices on one resumable session (docs/protocol.md, "Several
//! devices on one session"; who may see and join which session:
//! docs/security.md).
//!
//! The session's first device is its hub itself; every device that joins
//! later is a *guest*: a hub of its own (its own token, replay log, counters
//! and acknowledgements, so it resumes on its own after its own outage) that
//! has no agent and hangs off the session's hub. The session's hub keeps what
//! is shared ([`Members`]):
//! - every run of the agent's output goes into each device's log (a
//!   reference count each: the bytes are shared) and into a bounded history
//!   ([`SESSION_HISTORY`]) a joining device may start from; the agent waits
//!   while any device's log is full;
//! - the controller's frames go to the agent; an observer's requests are
//!   answered with an error naming its role (a frame to that device only),
//!   its notifications dropped, its answers to the agent's requests let on;
//! - the agent's requests go to every device and the first answer wins: the
//!   others are told who answered
//!   ([`wire::METHOD_ANSWERED`](thunderbolt_shared::devices::METHOD_ANSWERED))
//!   and a later answer to the same request is dropped;
//! - a device that closes leaves; the session goes on while any device is
//!   attached or may come back within its grace, and ends with its last.
//!
//! One job a file:
//! - here: what the devices share ([`Members`]), a guest's [`Seat`], and who
//!   is on the session;
//! - [`feed`](mod@feed): the agent's output into each device's log and the shared
//!   history, and a frame for one device only;
//! - [`routes`]: the agent's answers to the device that asked, and the
//!   turns that ended, told to the others;
//! - [`screen`]: what of a device's input goes to the agent (an observer's
//!   refusals, the first answer wins, whose request is whose);
//! - [`roles`]: who controls the session, and telling each device its role;
//! - [`join`]: a device joining as a guest, and the limits on seats;
//! - [`leave`]: a device leaving or staying away, and who gets control then;
//! - [`listing`]: what `status` and a device's listing show of a session;
//! - [`acp_sessions`]: the ACP session ids a session's clients name.

pub(crate) mod acp_sessions;
mod feed;
mod join;
mod leave;
mod listing;
mod multi;
mod roles;
mod routes;
mod screen;
mod sharing;

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Weak},
    time::SystemTime,
};

use bytes::Bytes;
use thunderbolt_shared::devices::Device;

use super::hub::{Hub, State};
use crate::devices::scope::Verbs;

pub(super) use feed::feed;
pub use join::{JoinAs, JoinError, MAX_DEVICES_PER_SESSION, MAX_JOINS_PER_DEVICE, MAX_SEATS_PER_DEVICE};
pub use listing::MemberView;

/// Bytes of the agent's output a session keeps from its start for a device
/// that joins with the whole history: a coding agent's turn is tens to a few
/// hundred KiB of updates, so a few turns fit; past it the oldest runs go
/// (the joining device is told the history was cut). Shared with the
/// devices' replay logs (reference counted), so it costs memory only for
/// what every device already acknowledged.
pub const SESSION_HISTORY: usize = 1 << 20;

/// The devices' requests in flight remembered with their sender (past it an
/// answer to one not remembered goes to every device, as before sharing).
const ASKED_BY_REMEMBERED: usize = crate::serve::requests::MAX_TRACKED_REQUESTS;

/// No device controls the session (its controller left or stepped down).
const NOBODY: u64 = u64::MAX;

/// What a session's devices share (kept in the session's hub).
///
/// Locks nest in one order: the session's hub's state lock first, then one
/// guest's at a time; never the other way (a guest's lock is let go before
/// the session's is taken). The whole rule, and where both are held: the
/// lock order in [`hub`](super::hub).
#[derive(Debug)]
pub(super) struct Members {
    pub(super) guests: Vec<Arc<Hub>>,
    /// The seat of the device whose frames go to the agent (0: the first).
    pub(super) controller: u64,
    /// The seat of the device control was last taken from ([`NOBODY`]:
    /// none): it gets control back when the device that took it steps down.
    taken_from: u64,
    pub(super) next_seat: u64,
    /// The first device closed while others went on: its log is no longer fed.
    pub(super) left: bool,
    /// Another device joined once: the devices' input is screened.
    pub(super) joined: bool,
    history: VecDeque<Bytes>,
    history_bytes: usize,
    /// The history lost its oldest runs.
    history_cut: bool,
    /// Ids (JSON text) of the agent's requests not answered yet.
    open: HashSet<String>,
    /// Of those, the permission requests' ACP session and tool call (for
    /// the multi-client proposal's `permission_resolved`).
    asked: HashMap<String, thunderbolt_shared::multi_client::Asked>,
    /// Requests answered, and by whom (seat and device).
    answered: VecDeque<(String, u64, Device)>,
    /// The devices' requests to the agent in flight once the session is
    /// shared: id (canonical JSON text) → the seat that sent it. The
    /// agent's answer goes to that device only (two clients number their
    /// requests alike, from 0: another device's answer would be taken for
    /// its own).
    asked_by: HashMap<String, u64>,
    /// Which of those are prompts (ACP `session/prompt`): their answers end
    /// a turn, which the other devices are told of.
    prompts: HashSet<String>,
    /// Each prompt's ACP session (its `turn_complete` names it).
    prompt_sessions: HashMap<String, serde_json::Value>,
    acp_sessions: Vec<String>,
    pub(super) last_activity: SystemTime,
}

impl Default for Members {
    fn default() -> Self {
        Self {
            guests: Vec::new(),
            controller: 0,
            taken_from: NOBODY,
            next_seat: 1,
            left: false,
            joined: false,
            history: VecDeque::new(),
            history_bytes: 0,
            history_cut: false,
            open: HashSet::new(),
            asked: HashMap::new(),
            answered: VecDeque::new(),
            asked_by: HashMap::new(),
            prompts: HashSet::new(),
            prompt_sessions: HashMap::new(),
            acp_sessions: Vec::new(),
            last_activity: SystemTime::now(),
        }
    }
}

impl Members {
    /// The ACP session ids the session's clients named.
    pub(in crate::serve::sessions) fn acp_sessions(&self) -> Vec<String> {
        self.acp_sessions.clone()
    }
}

/// A guest's place: its seat number and the session's hub.
#[derive(Debug)]
pub(super) struct Seat {
    pub(super) number: u64,
    pub(super) session: Weak<Hub>,
}

impl Hub {
    /// The device this hub carries.
    pub fn device(&self) -> Device {
        self.device.get().cloned().unwrap_or_else(|| Device { node: self.owner.to_string(), name: None })
    }

    /// Names the device this hub carries (once).
    pub fn set_device(&self, name: Option<String>) {
        let _ = self.device.set(Device { node: self.owner.to_string(), name });
    }

    /// What this device's scope lets it do on this session.
    pub fn verbs(&self) -> Verbs {
        Verbs::from_bits(self.verbs.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// This device's scope changed (or is known now).
    pub fn set_verbs(&self, verbs: Verbs) {
        self.verbs.store(verbs.to_bits(), std::sync::atomic::Ordering::Relaxed);
    }

    /// This device's scope as a recheck found it: kept, and a controller
    /// that may no longer prompt steps down.
    pub(super) fn refresh_verbs(self: &Arc<Self>, verbs: Verbs) {
        let before = self.verbs();
        self.set_verbs(verbs);
        if before != verbs {
            tracing::info!(peer = %self.peer, session = self.short(), "{}'s scope is {verbs} now", self.device().label());
            let controls = self.session_hub().is_some_and(|s| {
                let st = s.lock();
                st.members.joined && st.members.controller == self.seat_number()
            });
            if controls && !verbs.has(crate::devices::scope::Verb::Prompt) {
                self.ask_role(thunderbolt_shared::devices::Role::Observer);
            }
        }
    }

    /// This device's seat on its session (0: the one that started it).
    pub(super) fn seat_number(&self) -> u64 {
        self.seat.get().map_or(0, |s| s.number)
    }

    /// Whether this hub is a device that joined another's session.
    pub(super) fn is_guest(&self) -> bool {
        self.seat.get().is_some()
    }

    /// Whether this device observes a session others are on.
    pub(super) fn is_observer(self: &Arc<Self>) -> bool {
        let Some(s) = self.session_hub() else { return true };
        let st = s.lock();
        st.members.joined && st.members.controller != self.seat_number()
    }

    /// The session's hub: itself, or the one a guest joined.
    pub(crate) fn session_hub(self: &Arc<Self>) -> Option<Arc<Hub>> {
        match self.seat.get() {
            None => Some(self.clone()),
            Some(s) => s.session.upgrade(),
        }
    }

    /// The device at `seat` of this session (the session's hub's state locked).
    fn member_at(self: &Arc<Self>, st: &State, seat: u64) -> Option<Arc<Hub>> {
        if seat == 0 {
            return (!st.members.left).then(|| self.clone());
        }
        st.members.guests.iter().find(|g| g.seat_number() == seat).cloned()
    }

    /// The devices on this session now but the one at `seat` (its first
    /// while it is on it, then the guests in seat order; [`NOBODY`] for
    /// all of them). The session's hub's state locked.
    fn members_but(self: &Arc<Self>, st: &State, seat: u64) -> Vec<Arc<Hub>> {
        (0..1)
            .chain(st.members.guests.iter().map(|g| g.seat_number()))
            .filter(|s| *s != seat)
            .filter_map(|s| self.member_at(st, s))
            .collect()
    }
}

fn nobody() -> Device {
    Device { node: String::new(), name: Some("nobody".into()) }
}
