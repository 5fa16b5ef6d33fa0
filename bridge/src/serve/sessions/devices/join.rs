//! A device joining a session as a guest (a hub of its own, with no agent,
//! hanging off the session's hub): the limits on devices and seats, the
//! history it starts from, and its role.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use iroh::{
    endpoint::{Connection, RecvStream, SendStream},
    EndpointId,
};
use thunderbolt_shared::{
    close,
    devices::{self as wire, History, Role},
    jsonrpc,
    resume::ReplayLog,
};
use tracing::info;

use crate::devices::scope::Verbs;

use super::{nobody, Seat, ASKED_BY_REMEMBERED};
use crate::{
    ids,
    serve::sessions::hub::{AttachError, Gone, Hub, HubKind},
};

/// Devices attached to (or expected back at) one session at once: a person's
/// laptop, phone and a tab or two. Each costs its own replay log, up to the
/// resume buffer.
pub const MAX_DEVICES_PER_SESSION: usize = 8;

/// Seats one device (one NodeId) may hold on one session: a couple of tabs
/// and a terminal. The session's seats ([`MAX_DEVICES_PER_SESSION`]) are
/// shared by the owner's devices: one device's abandoned joins must not take
/// them all. Past it, the device's oldest seat that waits detached gives way
/// to its new join (a reloaded page, a killed `connect`); with none, the
/// join is refused.
pub const MAX_SEATS_PER_DEVICE: usize = 3;

/// Sessions one device may have joined at once (its own started sessions are
/// capped apart, by the agent slots): a hostile device cannot hold the
/// bridge's memory with joins it never uses.
pub const MAX_JOINS_PER_DEVICE: usize = 8;

/// What a device joining asks for.
#[derive(Debug, Clone, Copy)]
pub struct JoinAs {
    pub observe: bool,
    pub history: History,
    /// What the device's scope lets it do here.
    pub verbs: Verbs,
    /// It is someone else's device, here by a share.
    pub share: bool,
}

/// Why a device may not join.
#[derive(Debug)]
pub enum JoinError {
    /// No session of that id it may see (the same answer for one that does
    /// not exist and one it may not see: ids are not probed).
    Unknown,
    /// The session ended.
    Gone(String),
    /// Too many devices on it, or this device joined too many.
    Full(String),
    Attach(AttachError),
}

impl Hub {
    /// Joins device `owner` (named `name`) to this session as a guest on
    /// its own streams: the welcome, the history it asked for, its role.
    #[allow(clippy::too_many_arguments)]
    pub fn join(
        self: &Arc<Self>,
        owner: EndpointId,
        name: Option<String>,
        how: JoinAs,
        joined_elsewhere: usize,
        (conn, send, recv): (Connection, SendStream, RecvStream),
        leftover: Bytes,
    ) -> Result<(), JoinError> {
        if self.kind != HubKind::Resumable || self.is_guest() {
            return Err(JoinError::Unknown);
        }
        self.make_seat_for(&owner)?;
        let mut st = self.lock();
        if let Some(g) = &st.gone {
            return Err(JoinError::Gone(g.resume_reason.clone()));
        }
        // The agent's output ended (the session is ending). Not the first
        // device's own end of input: the session goes on without it, and
        // stays joinable, by that device too.
        if st.io.end_at.is_some() && !st.leaving && !st.members.left {
            return Err(JoinError::Gone(close::REASON_UNKNOWN_SESSION.into()));
        }
        let live = st.members.guests.len() + usize::from(!st.members.left);
        if live >= MAX_DEVICES_PER_SESSION {
            return Err(JoinError::Full(format!(
                "{MAX_DEVICES_PER_SESSION} devices are on this session already"
            )));
        }
        if joined_elsewhere >= MAX_JOINS_PER_DEVICE {
            return Err(JoinError::Full(format!(
                "this device joined {MAX_JOINS_PER_DEVICE} sessions already"
            )));
        }
        let seat = st.members.next_seat;
        st.members.next_seat += 1;
        let history: Vec<Bytes> = match how.history {
            History::All => st.members.history.iter().cloned().collect(),
            // From now on, but with the agent's questions still open: a
            // device that joins mid-question can see it and answer it.
            History::Now => open_requests(&st.members.history, &st.members.open).into_iter().collect(),
        };
        let cut = how.history == History::All && st.members.history_cut;
        let (guest, _, _) = Hub::with_state(
            HubKind::Resumable,
            format!("{}.{seat}", self.id),
            owner,
            self.agent.clone(),
            self.cfg,
            self.max_frame,
            Weak::new(),
            |g| {
                g.token = ids::token();
                // Its frames go to the session's agent (see `Hub::reserve`).
                g.io.inbox = None;
                g.r1.out = ReplayLog::new();
                for run in history {
                    g.r1.out.push(run);
                }
            },
        );
        let _ = guest.seat.set(Seat { number: seat, session: Arc::downgrade(self) });
        guest.set_device(name);
        guest.set_verbs(how.verbs);
        guest.share_guest.store(how.share, std::sync::atomic::Ordering::Relaxed);
        st.members.guests.push(guest.clone());
        if !st.members.joined {
            // Requests sent while the session had one device are that
            // device's: their answers go to it only.
            if let Some(r) = self.requests.get() {
                for id in r.ids().iter().filter_map(|id| jsonrpc::canonical_id(id)) {
                    if st.members.asked_by.len() < ASKED_BY_REMEMBERED {
                        st.members.asked_by.insert(String::from_utf8_lossy(&id).into_owned(), 0);
                    }
                }
            }
        }
        st.members.joined = true;
        let old = if how.observe {
            None
        } else {
            let before = st.members.controller;
            st.members.controller = seat;
            Some(self.member_at(&st, before))
        };
        self.refresh_roles(&st);
        drop(st);
        info!(
            peer = %guest.peer,
            session = self.short(),
            "{} joined the session as {}{}",
            guest.device().label(),
            if how.observe { "observer" } else { "controller" },
            match (how.history, cut) {
                (History::Now, _) => " (from now on)",
                (History::All, false) => " (with its whole history)",
                (History::All, true) => " (with the history kept: its start was cut)",
            }
        );
        match old {
            Some(old) => self.announce_control(old, &guest, Role::Controller),
            None => {
                let controller = self.controller_device().unwrap_or_else(nobody);
                guest.tell(wire::role_line(Role::Observer, &controller));
            }
        }
        guest.attach(conn, send, recv, 0, leftover).map_err(JoinError::Attach)?;
        // The others are told who joined (a page lists who watches at once).
        let Some(view) = self.members().into_iter().find(|m| m.seat == seat) else { return Ok(()) };
        let others = self.members_but(&self.lock(), seat);
        let line = wire::joined_line(&view.attached_view(self.short()));
        for o in others {
            o.tell(line.clone());
        }
        self.changed.notify_waiters();
        Ok(())
    }

    /// Room for one more seat of device `owner` ([`MAX_SEATS_PER_DEVICE`]):
    /// its oldest detached seat leaves, or the join is refused.
    fn make_seat_for(self: &Arc<Self>, owner: &EndpointId) -> Result<(), JoinError> {
        let (held, detached) = {
            let st = self.lock();
            let mine: Vec<&Arc<Hub>> = st.members.guests.iter().filter(|g| g.owner == *owner).collect();
            let first = usize::from(!st.members.left && self.owner == *owner);
            let detached = mine.iter().find(|g| g.lock().conn.attached.is_none()).map(|g| (*g).clone());
            (mine.len() + first, detached)
        };
        if held < MAX_SEATS_PER_DEVICE {
            return Ok(());
        }
        let Some(old) = detached else {
            return Err(JoinError::Full(format!(
                "this device holds {MAX_SEATS_PER_DEVICE} seats on this session already, all attached"
            )));
        };
        let why = "its device joined again: a newer seat of the same device replaces it";
        info!(peer = %old.peer, session = self.short(), "{} (seat {}) leaves the session: {why}", old.device().label(), old.seat_number());
        old.end_with(close::CLOSE_CODE_REFUSED, Gone::new(why, close::REASON_SESSION_EVICTED));
        self.member_left(&old, why);
        Ok(())
    }
}

/// The agent's requests still open, as the history kept them, in one run.
fn open_requests(
    history: &std::collections::VecDeque<Bytes>,
    open: &std::collections::HashSet<String>,
) -> Option<Bytes> {
    if open.is_empty() {
        return None;
    }
    let mut run = Vec::new();
    for line in history.iter().flat_map(|r| thunderbolt_shared::ndjson::lines(r)) {
        let head = jsonrpc::peek_head(&line[..line.len().min(thunderbolt_shared::ndjson::OVERSIZE_PEEK)]);
        if head.kind == jsonrpc::Kind::Request && head.id.is_some_and(|id| open.contains(&id)) {
            run.extend_from_slice(line);
            if !line.ends_with(b"\n") {
                run.push(b'\n');
            }
        }
    }
    (!run.is_empty()).then(|| Bytes::from(run))
}
