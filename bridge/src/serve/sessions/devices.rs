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
//!   others are told who answered ([`wire::METHOD_ANSWERED`]) and a later
//!   answer to the same request is dropped;
//! - a device that closes leaves; the session goes on while any device is
//!   attached or may come back within its grace, and ends with its last.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Weak},
    time::SystemTime,
};

use bytes::Bytes;
use iroh::{
    endpoint::{Connection, RecvStream, SendStream},
    EndpointId,
};
use thunderbolt_shared::{
    close,
    devices::{self as wire, Activity, Attached, Device, History, Listed, Role},
    jsonrpc,
    ndjson::OVERSIZE_PEEK,
    resume::ReplayLog,
};
use tokio::time::Instant;
use tracing::{debug, info};

use super::hub::{AttachError, Gone, Hub, HubKind, State};
use crate::{ids, serve::extension::KeptLines};

/// Bytes of the agent's output a session keeps from its start for a device
/// that joins with the whole history: a coding agent's turn is tens to a few
/// hundred KiB of updates, so a few turns fit; past it the oldest runs go
/// (the joining device is told the history was cut). Shared with the
/// devices' replay logs (reference counted), so it costs memory only for
/// what every device already acknowledged.
pub const SESSION_HISTORY: usize = 1 << 20;

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

/// Answered requests remembered, to drop a later answer to the same one
/// (agents ask one thing at a time; a few dozen covers any backlog).
const ANSWERED_REMEMBERED: usize = 64;

/// The agent's requests in flight remembered (past it an answer to one not
/// remembered still goes on: only a second answer to a remembered one is dropped).
const OPEN_REMEMBERED: usize = crate::serve::requests::MAX_TRACKED_REQUESTS;

/// The devices' requests in flight remembered with their sender (past it an
/// answer to one not remembered goes to every device, as before sharing).
const ASKED_BY_REMEMBERED: usize = crate::serve::requests::MAX_TRACKED_REQUESTS;

/// The ACP method whose answer ends a turn ([`wire::METHOD_TURN_ENDED`]), as
/// raw JSON text ([`jsonrpc::request_head`]).
const PROMPT_METHOD: &[u8] = b"\"session/prompt\"";

/// ACP session ids a listing shows of one session, and the longest shown.
const ACP_SESSIONS_LISTED: usize = 8;

/// A run of the client's lines without an `"id"` (no request in it) is read for
/// the ACP sessions it names only when smaller than this. A client names a
/// session first in a request (`session/prompt`, `session/load`), or in a lone
/// notification (`session/cancel`), a run of its own; the runs skipped are a
/// bulk transfer's, where that search was a whole extra pass over every byte
/// (about 1.3 % of the bridge's CPU, `bench --only duplex`).
const SESSIONS_READ_BELOW: usize = 16 * 1024;
const ACP_SESSION_ID_MAX: usize = 128;

/// No device controls the session (its controller left or stepped down).
const NOBODY: u64 = u64::MAX;

/// What a session's devices share (kept in the session's hub).
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
            answered: VecDeque::new(),
            asked_by: HashMap::new(),
            prompts: HashSet::new(),
            acp_sessions: Vec::new(),
            last_activity: SystemTime::now(),
        }
    }
}

/// Puts a run of the agent's output (`lines` frames) into one device's log
/// (its hub's state locked). The agent waits for room in the log of the
/// device it `waited` for (the controller; see [`Hub::held`]); any other
/// device's log takes what fits within `buffer`, and past it counts what
/// the device missed: once it has read down to half the buffer it is told
/// ([`wire::missed_line`]) and gets the agent's output again. A phone that
/// locks its screen while watching never stops the agent for the others.
pub(super) fn feed(st: &mut State, buffer: usize, run: &Bytes, lines: u64, waited: bool) {
    let held = st.out.bytes();
    let len = run.len() as u64;
    match st.missed {
        Some((frames, bytes)) if !waited && held > 0 && held + run.len() > buffer / 2 => {
            st.missed = Some((frames + lines, bytes + len));
            return;
        }
        Some(_) => tell_missed(st),
        None if !waited && held > 0 && held + run.len() > buffer => {
            st.missed = Some((lines, len));
            return;
        }
        None => {}
    }
    st.out.push_counted(run.clone(), lines);
}

/// Puts what the device missed ([`wire::missed_line`]) into its log, and
/// starts counting afresh.
fn tell_missed(st: &mut State) {
    if let Some((frames, bytes)) = st.missed.take() {
        st.out.push(Bytes::from(wire::missed_line(frames, bytes)));
    }
}

/// A run of the agent's output with answers in it meant for one device each
/// ([`Hub::route_answers`]).
#[derive(Debug)]
pub(super) struct Routes {
    run: Bytes,
    /// Each line's length, and the seat its answer is for (`None`: everyone's).
    targets: Vec<(usize, Option<u64>)>,
    /// Turns that ended (a prompt's answer): what the devices but the one
    /// that asked are told ([`wire::turn_ended_line`]), once the session's
    /// state is unlocked ([`Routes::tell_turns_ended`]).
    ended: Vec<(Vec<Arc<Hub>>, Vec<u8>)>,
}

impl Routes {
    /// Tells the other devices of each turn that ended (the session's state
    /// unlocked: telling locks each device's).
    pub(super) fn tell_turns_ended(self) {
        for (others, line) in self.ended {
            for o in others {
                o.tell(line.clone());
            }
        }
    }

    /// The run as device `seat` gets it (its own answers, no other's), with
    /// its line count; `None` when nothing of it is that device's.
    pub(super) fn view(&self, seat: u64) -> Option<(Bytes, u64)> {
        let mut kept = KeptLines::new(&self.run);
        let (mut at, mut lines) = (0, 0);
        for (len, target) in &self.targets {
            let keep = target.is_none_or(|t| t == seat);
            kept.line(&self.run[at..at + len], keep);
            lines += u64::from(keep);
            at += len;
        }
        kept.finish().map(|run| (run, lines))
    }
}

/// A guest's place: its seat number and the session's hub.
#[derive(Debug)]
pub(super) struct Seat {
    pub(super) number: u64,
    pub(super) session: Weak<Hub>,
}

/// What a device joining asks for.
#[derive(Debug, Clone, Copy)]
pub struct JoinAs {
    pub observe: bool,
    pub history: History,
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
    /// The device this hub carries.
    pub fn device(&self) -> Device {
        self.device.get().cloned().unwrap_or_else(|| Device { node: self.owner.to_string(), name: None })
    }

    /// Names the device this hub carries (once).
    pub fn set_device(&self, name: Option<String>) {
        let _ = self.device.set(Device { node: self.owner.to_string(), name });
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
    pub(super) fn session_hub(self: &Arc<Self>) -> Option<Arc<Hub>> {
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

    /// A run of the agent's output for everyone but the first device (whose
    /// log took it already): the history, each guest's log, the requests it
    /// makes (`lines`: how many lines the run holds; `names_an_id`: whether
    /// one may have an `id`). The session's hub's state is locked; the guests'
    /// writers are woken by the caller, after the first device's.
    pub(super) fn share_output(
        &self,
        st: &mut State,
        run: &Bytes,
        lines: u64,
        names_an_id: bool,
        routes: Option<&Routes>,
    ) {
        let m = &mut st.members;
        m.last_activity = SystemTime::now();
        // Nearly all an agent writes is notifications (its streamed reply):
        // such a run holds no request to remember, nor an answer. The
        // history is for devices that join later: answers to requests are
        // never theirs (a client takes another's answer for one to its own
        // request of that id), so they are left out of it.
        let mut history = KeptLines::new(run);
        let requests = if names_an_id { &run[..] } else { &[] };
        for line in thunderbolt_shared::ndjson::lines(requests) {
            let head = jsonrpc::peek_head(&line[..line.len().min(OVERSIZE_PEEK)]);
            history.line(line, head.kind != jsonrpc::Kind::Response);
            if let (jsonrpc::Kind::Request, Some(id)) = (head.kind, head.id) {
                m.answered.retain(|(a, _, _)| *a != id);
                if m.open.len() < OPEN_REMEMBERED {
                    m.open.insert(id);
                }
            }
        }
        if let Some(run) = history.finish_owned() {
            m.history_bytes += run.len();
            m.history.push_back(run);
        }
        while m.history_bytes > SESSION_HISTORY && m.history.len() > 1 {
            let old = m.history.pop_front().expect("more than one");
            m.history_bytes -= old.len();
            m.history_cut = true;
        }
        for g in &m.guests {
            let mut gs = g.lock();
            if gs.gone.is_none() && !gs.leaving {
                let seat = g.seat_number();
                let view = match routes {
                    None => Some((run.clone(), lines)),
                    Some(r) => r.view(seat),
                };
                if let Some((run, lines)) = view {
                    feed(&mut gs, g.cfg.buffer, &run, lines, seat == m.controller);
                }
            }
        }
    }

    /// Whose request each of the agent's answers in `run` answers, on a
    /// shared session (`None` when every device gets the run as it is: one
    /// device, no answer in it, or none to a request remembered).
    pub(super) fn route_answers(
        self: &Arc<Self>,
        st: &mut State,
        run: &Bytes,
        names_an_id: bool,
    ) -> Option<Routes> {
        let m = &mut st.members;
        if !m.joined || !names_an_id || m.asked_by.is_empty() {
            return None;
        }
        let mut targets = Vec::new();
        let mut turns = Vec::new();
        let mut any = false;
        for line in thunderbolt_shared::ndjson::lines(run) {
            let id = jsonrpc::response_id(line).and_then(jsonrpc::canonical_id);
            let seat = id.as_ref().and_then(|id| {
                let key = String::from_utf8_lossy(id);
                let seat = m.asked_by.remove(&*key)?;
                if m.prompts.remove(&*key) {
                    turns.push((seat, id.to_vec(), line.to_vec()));
                }
                Some(seat)
            });
            any |= seat.is_some();
            targets.push((line.len(), seat));
        }
        let mut ended = Vec::new();
        for (seat, id, answer) in turns {
            let Some(by) = self.member_at(st, seat).map(|h| h.device()) else { continue };
            let others: Vec<Arc<Hub>> = (0..1)
                .chain(st.members.guests.iter().map(|g| g.seat_number()))
                .filter(|s| *s != seat)
                .filter_map(|s| self.member_at(st, s))
                .collect();
            ended.push((others, wire::turn_ended_line(&answer, &id, &by)));
        }
        any.then(|| Routes { run: run.clone(), targets, ended })
    }

    /// What the agent's output waits on: the controller's log (the first
    /// device's while it is the only one). A device that only watches never
    /// holds the agent, however long it is stopped or away: its log skips
    /// what does not fit and tells it so ([`feed`]).
    pub(super) fn held(&self, st: &State) -> usize {
        match st.members.controller {
            0 if st.members.left => 0,
            0 => st.out.bytes(),
            seat => {
                st.members.guests.iter().find(|g| g.seat_number() == seat).map_or(0, |g| g.lock().out.bytes())
            }
        }
    }

    /// Whether the first device's log is one the agent waits for.
    pub(super) fn first_is_waited_for(st: &State) -> bool {
        st.members.controller == 0
    }

    /// A device's log has room again after it acknowledged: what it missed
    /// is told now, not with the agent's next output (which may be long in
    /// coming). True when a notice was put in the log.
    pub(super) fn tell_missed_if_room(&self, st: &mut State) -> bool {
        let room = st.missed.is_some() && st.out.bytes() <= self.cfg.buffer / 2;
        if room {
            tell_missed(st);
        }
        room
    }

    /// A frame for this device only (a refusal, a role, who answered). Never
    /// past the resume buffer: a device that asks and asks (for a role, with
    /// requests it may not send) and never acknowledges stops being told.
    pub(super) fn tell(self: &Arc<Self>, line: Vec<u8>) {
        let mut st = self.lock();
        if st.gone.is_some() || st.members.left || st.leaving {
            return;
        }
        if st.out.bytes() + line.len() > self.cfg.buffer {
            debug!(peer = %self.peer, session = self.short(), "a frame for this device dropped: its log is full");
            return;
        }
        let run = Bytes::from(line);
        st.out.push(run.clone());
        if !self.is_guest() {
            self.journal_output(&mut st, &run);
        }
        drop(st);
        self.output.notify_waiters();
    }

    /// What of a run of this device's frames goes to the agent: everything
    /// of the controller's (but a second answer to one request), only answers
    /// of an observer's. Refusals and "answered" notices are sent here too.
    /// `None` when nothing goes on.
    ///
    /// `names_an_id` is [`jsonrpc::names_an_id`] of the run. The ACP sessions
    /// the device names are read from a run that has one, or is small (see
    /// [`SESSIONS_READ_BELOW`]).
    pub(super) fn screen(self: &Arc<Self>, run: Bytes, names_an_id: bool) -> Option<Bytes> {
        let Some(session) = self.session_hub() else { return Some(run) };
        let me = self.seat_number();
        let mut st = session.lock();
        let m = &mut st.members;
        m.last_activity = SystemTime::now();
        note_acp_sessions(&mut m.acp_sessions, &run, names_an_id);
        let controller = m.controller == me;
        if !m.joined || (controller && !names_an_id) {
            // One device: nothing is screened; its answers close what is open.
            // Nor are the controller's lines when none is a request or an answer.
            if names_an_id && !m.open.is_empty() {
                for line in thunderbolt_shared::ndjson::lines(&run) {
                    if let Some(id) = jsonrpc::response_id(line).and_then(jsonrpc::canonical_id) {
                        m.open.remove(&*String::from_utf8_lossy(&id));
                    }
                }
            }
            return Some(run);
        }
        let mut kept = KeptLines::new(&run);
        let mut refusals = Vec::new();
        let mut answered = Vec::new();
        let mut in_use = Vec::new();
        let mut prompted = Vec::new();
        // Each line read whole (`classify`): what decides where it goes is
        // every key it has, not the first that looks like an answer.
        for line in thunderbolt_shared::ndjson::lines(&run) {
            let message = jsonrpc::classify(line);
            if let jsonrpc::Message::Response(id) = &message {
                let key = String::from_utf8_lossy(id).into_owned();
                if m.open.remove(&key) {
                    let mine = self.device();
                    if m.answered.len() >= ANSWERED_REMEMBERED {
                        m.answered.pop_front();
                    }
                    m.answered.push_back((key, me, mine.clone()));
                    answered.push(wire::answered_line(id, &mine));
                    kept.line(line, true);
                } else if let Some((_, _, by)) =
                    m.answered.iter().find(|(a, seat, _)| *a == key && *seat != me)
                {
                    info!(
                        peer = %self.peer,
                        session = session.short(),
                        "{}'s answer to the agent's request {key} dropped: {} answered it first",
                        self.device().label(),
                        by.label()
                    );
                    kept.line(line, false);
                } else {
                    kept.line(line, true);
                }
            } else if controller {
                let mut keep = true;
                if let jsonrpc::Message::Request(id) = &message {
                    let key = String::from_utf8_lossy(id).into_owned();
                    match m.asked_by.get(&key) {
                        Some(seat) if *seat != me => {
                            keep = false;
                            in_use.push(id.to_vec());
                        }
                        _ if m.asked_by.len() < ASKED_BY_REMEMBERED => {
                            let prompt = jsonrpc::request_head(line).is_some_and(|(_, m)| m == PROMPT_METHOD);
                            if prompt && m.prompts.len() < ASKED_BY_REMEMBERED {
                                m.prompts.insert(key.clone());
                                prompted.push(wire::prompted_line(line, id, &self.device()));
                            }
                            m.asked_by.insert(key, me);
                        }
                        _ => {}
                    }
                }
                kept.line(line, keep);
            } else {
                // An observer's request is refused; anything else of its
                // (a notification, a line that is no one thing) is dropped.
                kept.line(line, false);
                if let jsonrpc::Message::Request(id) = message {
                    refusals.push(id.into_owned());
                }
            }
        }
        if refusals.is_empty() && answered.is_empty() && in_use.is_empty() && prompted.is_empty() {
            // The common case, on every run of the controller's: nothing to tell.
            return kept.finish();
        }
        let controller_device = session.member_at(&st, st.members.controller).map(|h| h.device());
        let others: Vec<Arc<Hub>> = (0..1)
            .chain(st.members.guests.iter().map(|g| g.seat_number()))
            .filter(|s| *s != me)
            .filter_map(|s| session.member_at(&st, s))
            .collect();
        drop(st);
        if !refusals.is_empty() {
            let by = controller_device.unwrap_or(Device { node: String::new(), name: Some("nobody".into()) });
            info!(
                peer = %self.peer,
                session = session.short(),
                "refused {} request(s) of {}: it observes the session",
                refusals.len(),
                self.device().label()
            );
            for id in refusals {
                self.tell(wire::observer_refused(&id, &by));
            }
        }
        for line in answered.into_iter().chain(prompted) {
            for o in &others {
                o.tell(line.clone());
            }
        }
        for id in in_use {
            info!(
                peer = %self.peer,
                session = session.short(),
                "refused a request of {}: its id {} is another device's request in flight",
                self.device().label(),
                String::from_utf8_lossy(&id)
            );
            self.tell(wire::id_in_use(&id));
        }
        kept.finish()
    }

    /// This device asks for `role`: control moves to it (the device that had
    /// it becomes an observer and is told), or it steps down.
    pub(super) fn ask_role(self: &Arc<Self>, role: Role) {
        let Some(session) = self.session_hub() else { return };
        let me = self.seat_number();
        let mut st = session.lock();
        let before = st.members.controller;
        let after = match role {
            Role::Controller => me,
            // Stepping down hands control on (a session is not left with
            // nobody in control while a device is attached): to the device
            // it was taken from, else the earliest attached.
            Role::Observer if before == me => {
                session.next_controller(&st, me).map_or(NOBODY, |h| h.seat_number())
            }
            Role::Observer => before,
        };
        if role == Role::Controller && before != me {
            st.members.taken_from = before;
        }
        if before == after {
            drop(st);
            let controller = session.controller_device().unwrap_or_else(nobody);
            self.tell(wire::role_line(
                if after == me { Role::Controller } else { Role::Observer },
                &controller,
            ));
            return;
        }
        st.members.controller = after;
        session.refresh_roles(&st);
        let old = session.member_at(&st, before);
        let new = (role == Role::Observer).then(|| session.member_at(&st, after)).flatten();
        drop(st);
        session.announce_control(old, self, role);
        if let Some(new) = new {
            new.tell(wire::role_line(Role::Controller, &new.device()));
        }
    }

    /// Who gets control when the device at `seat` gives it up: the device it
    /// was taken from while that one is attached, else the earliest attached
    /// (the first device, then the guests in seat order); never `seat`.
    fn next_controller(self: &Arc<Self>, st: &State, seat: u64) -> Option<Arc<Hub>> {
        let attached = |h: &Arc<Hub>| {
            h.seat_number() != seat
                && if Arc::ptr_eq(h, self) {
                    !st.members.left && !st.leaving && st.attached.is_some()
                } else {
                    let g = h.lock();
                    g.attached.is_some() && !g.leaving
                }
        };
        let back = self.member_at(st, st.members.taken_from).filter(&attached);
        back.or_else(|| self.member_at(st, 0).filter(&attached))
            .or_else(|| st.members.guests.iter().find(|g| attached(g)).cloned())
    }

    /// Control moved from `old` (if any) because `by` asked for `role`.
    fn announce_control(self: &Arc<Self>, old: Option<Arc<Hub>>, by: &Arc<Hub>, role: Role) {
        let controller = self.controller_device().unwrap_or_else(nobody);
        info!(
            session = self.short(),
            "{} {}",
            by.device().label(),
            match role {
                Role::Controller => "took control of the session".to_string(),
                Role::Observer if controller.node.is_empty() =>
                    "stepped down: nobody controls the session".into(),
                Role::Observer => format!("stepped down: {} controls the session", controller.label()),
            }
        );
        if let Some(old) = old.filter(|o| !Arc::ptr_eq(o, by)) {
            old.tell(wire::role_line(Role::Observer, &controller));
        }
        by.tell(wire::role_line(role, &controller));
    }

    /// Tells each device's writer whether it observes (the session's hub's
    /// state locked, the controller set).
    pub(super) fn refresh_roles(&self, st: &State) {
        use std::sync::atomic::Ordering::Relaxed;
        let c = st.members.controller;
        self.observing.store(st.members.joined && c != 0, Relaxed);
        for g in &st.members.guests {
            g.observing.store(c != g.seat_number(), Relaxed);
        }
    }

    /// Tells this device its role, when it shares its session.
    pub(super) fn tell_role(self: &Arc<Self>) {
        let Some(session) = self.session_hub() else { return };
        let leaving = self.lock().leaving;
        let mut st = session.lock();
        if !st.members.joined {
            return;
        }
        if st.members.controller == NOBODY && !leaving {
            // Nobody controls the session (its controller left while no
            // other device was attached): the device that comes back takes
            // control, rather than find every request of its refused.
            st.members.controller = self.seat_number();
            session.refresh_roles(&st);
            info!(
                session = session.short(),
                "{} controls the session now: nobody did",
                self.device().label()
            );
        }
        let role =
            if st.members.controller == self.seat_number() { Role::Controller } else { Role::Observer };
        drop(st);
        let controller = session.controller_device().unwrap_or_else(nobody);
        self.tell(wire::role_line(role, &controller));
    }

    /// The device in control now.
    fn controller_device(self: &Arc<Self>) -> Option<Device> {
        let st = self.lock();
        self.member_at(&st, st.members.controller).map(|h| h.device())
    }

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
        if st.end_at.is_some() && !st.leaving && !st.members.left {
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
        let history = match how.history {
            History::All => st.members.history.iter().cloned().collect(),
            History::Now => Vec::new(),
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
                g.inbox = None;
                g.out = ReplayLog::new();
                for run in history {
                    g.out.push(run);
                }
            },
        );
        let _ = guest.seat.set(Seat { number: seat, session: Arc::downgrade(self) });
        guest.set_device(name);
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
            let detached = mine.iter().find(|g| g.lock().attached.is_none()).map(|g| (*g).clone());
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

    /// A device of this session left for good (it closed, its grace ran
    /// out, it was kicked or revoked): it is no longer fed, and control
    /// passes to the earliest attached device if it had it. The session ends
    /// when no device is left.
    pub(super) fn member_left(self: &Arc<Self>, member: &Arc<Hub>, why: &str) {
        let seat = member.seat_number();
        let mut st = self.lock();
        if seat == 0 {
            st.members.left = true;
            st.out = ReplayLog::starting_at(st.out.total());
            st.sent_mark = None;
            st.journal_behind.clear();
            // Its journal goes (dropped: deleted); the others' are not journaled.
            drop(st.journal.take());
        } else {
            st.members.guests.retain(|g| !Arc::ptr_eq(g, member));
        }
        let remaining = st.members.guests.len();
        info!(
            peer = %member.peer,
            session = self.short(),
            "{} left the session ({why}); {remaining} other device(s) on it",
            member.device().label(),
        );
        if st.members.left && remaining == 0 {
            st.gone.get_or_insert_with(|| {
                Gone::new(format!("its last device left ({why})"), close::REASON_UNKNOWN_SESSION)
            });
            let writer = st.writer.take();
            drop(st);
            self.wake(writer);
            return;
        }
        let mut promoted = None;
        if st.members.controller == seat {
            // The earliest device attached now: the first (seat 0) while it
            // is on the session and attached, then the guests in seat order.
            let first = (!st.members.left && !st.leaving && st.attached.is_some()).then(|| self.clone());
            let next = first.or_else(|| {
                st.members.guests.iter().find(|g| g.lock().attached.is_some() && !g.lock().leaving).cloned()
            });
            st.members.controller = next.as_ref().map_or(NOBODY, |g| g.seat_number());
            promoted = next;
        }
        self.refresh_roles(&st);
        let writer = st.writer.take();
        drop(st);
        self.wake(writer);
        if let Some(p) = promoted {
            info!(session = self.short(), "{} controls the session now", p.device().label());
            p.tell(wire::role_line(Role::Controller, &p.device()));
        }
    }

    /// Whether other devices than this one are on its session.
    pub(super) fn others_on(self: &Arc<Self>) -> bool {
        let Some(s) = self.session_hub() else { return false };
        let st = s.lock();
        let me = self.seat_number();
        let first = !st.members.left && me != 0;
        first || st.members.guests.iter().any(|g| g.seat_number() != me)
    }

    /// This device's input ended while others are on the session: it gets
    /// what it was sent and an end, and once it acknowledged that it is let
    /// go ([`close::REASON_LEFT`]); the others go on.
    pub(super) fn leave_after_eof(&self, st: &mut State) {
        st.leaving = true;
        st.end_at = Some((st.out.total(), Instant::now()));
        info!(peer = %self.peer, session = self.short(), "{}'s input ended: it leaves the session once it has what it was sent", self.device().label());
        // It may hold everything already: no acknowledgement would come.
        self.left_if_done(st);
    }

    /// A leaving device acknowledged its end: its connection is closed.
    pub(super) fn left_if_done(&self, st: &State) {
        if st.leaving && st.end_at.is_some_and(|(n, _)| st.out.acked() >= n) {
            if let Some(a) = &st.attached {
                a.conn.close(
                    iroh::endpoint::VarInt::from_u32(close::CLOSE_CODE_CLIENT),
                    close::REASON_LEFT.as_bytes(),
                );
            }
        }
    }

    /// Whether any device of this session is attached now.
    pub fn any_attached(&self) -> bool {
        let st = self.lock();
        st.attached.is_some() || st.members.guests.iter().any(|g| g.lock().attached.is_some())
    }

    /// Since when no device of this session has been attached (`None` while
    /// one is, or once it ended).
    pub(super) fn away_since(&self, st: &State) -> Option<Instant> {
        if st.gone.is_some() || st.attached.is_some() {
            return None;
        }
        let mut latest = if st.members.left { None } else { st.detached_since };
        for g in &st.members.guests {
            let gs = g.lock();
            if gs.attached.is_some() {
                return None;
            }
            latest = latest.max(gs.detached_since);
        }
        latest
    }

    /// The devices of this session that stayed away past their grace `wait`
    /// while others went on, and when the next one would have (the session's
    /// hub's state locked). Only while more than one device is on it: the
    /// last one's absence is the session's own.
    pub(super) fn members_away(
        self: &Arc<Self>,
        st: &State,
        wait: std::time::Duration,
    ) -> (Vec<Arc<Hub>>, Option<Instant>) {
        let now = Instant::now();
        let (mut due, mut next) = (Vec::new(), None::<Instant>);
        if !st.members.joined || self.away_since(st).is_some() {
            return (due, next);
        }
        let mut away: Vec<(Arc<Hub>, Instant)> = Vec::new();
        if !st.members.left && st.attached.is_none() {
            away.extend(st.detached_since.map(|d| (self.clone(), d)));
        }
        for g in &st.members.guests {
            let gs = g.lock();
            if gs.attached.is_none() && gs.gone.is_none() {
                away.extend(gs.detached_since.map(|d| (g.clone(), d)));
            }
        }
        for (h, since) in away {
            if since + wait <= now {
                due.push(h);
            } else {
                next = Some(next.map_or(since + wait, |n: Instant| n.min(since + wait)));
            }
        }
        (due, next)
    }

    /// Devices of this session that stayed away past their grace while others
    /// went on leave it.
    pub(super) fn expire_members(self: &Arc<Self>) {
        let (due, wait) = {
            let st = self.lock();
            let wait = self.cfg.wait(true).0;
            (self.members_away(&st, wait).0, wait)
        };
        for h in due {
            let why = format!("it did not come back within {wait:?}");
            if h.is_guest() {
                h.end_with(close::CLOSE_CODE_REFUSED, Gone::new(why.clone(), close::REASON_SESSION_EXPIRED));
            }
            self.member_left(&h, &why);
        }
    }

    /// Every device of this session and its role, for `status` and listings.
    pub fn members(&self) -> Vec<MemberView> {
        let st = self.lock();
        let controller = st.members.controller;
        let mut all = Vec::new();
        if !st.members.left {
            all.push(MemberView {
                device: self.device(),
                seat: 0,
                role: if controller == 0 { Role::Controller } else { Role::Observer },
                attached: st.attached.as_ref().map(|a| a.conn.clone()),
            });
        }
        for g in &st.members.guests {
            let gs = g.lock();
            all.push(MemberView {
                device: g.device(),
                seat: g.seat_number(),
                role: if controller == g.seat_number() { Role::Controller } else { Role::Observer },
                attached: gs.attached.as_ref().map(|a| a.conn.clone()),
            });
        }
        all
    }

    /// Guests of the session by seat, for `kick` and revocation.
    pub fn guests(&self) -> Vec<Arc<Hub>> {
        self.lock().members.guests.clone()
    }

    /// Ends one device's attachment for good (`kick`, revocation): the
    /// session goes on with the others (or ends, if it was the last).
    pub fn drop_member(self: &Arc<Self>, member: &Arc<Hub>, reason: &str) {
        if member.is_guest() {
            member.end_with(close::CLOSE_CODE_REFUSED, Gone::new(reason, reason));
            self.member_left(member, reason);
            return;
        }
        let others = !self.lock().members.guests.is_empty();
        if !others {
            self.end_with(close::CLOSE_CODE_REFUSED, Gone::new(reason, reason));
            return;
        }
        let attached = self.lock().attached.take();
        self.attached_now.store(false, std::sync::atomic::Ordering::Relaxed);
        if let Some(a) = &attached {
            a.conn.close(iroh::endpoint::VarInt::from_u32(close::CLOSE_CODE_REFUSED), reason.as_bytes());
        }
        self.member_left(self, reason);
        drop(attached);
    }

    /// What a device's listing shows of this session.
    pub fn listed(&self) -> Listed {
        let members = self.members();
        let st = self.lock();
        let state = if members.iter().any(|m| m.attached.is_some()) {
            "attached"
        } else if self.kind == HubKind::Warm {
            "warm"
        } else {
            "detached"
        };
        Listed {
            id: self.id.clone(),
            agent: self.agent.as_str().to_string(),
            started_by: self.device(),
            since_ms: crate::devices::now_ms().saturating_sub(self.created.elapsed().as_millis() as u64),
            state: state.into(),
            attached: members
                .into_iter()
                .filter(|m| m.attached.is_some())
                .map(|m| Attached { device: m.device, role: m.role })
                .collect(),
            acp_sessions: st.members.acp_sessions.clone(),
            last_activity_ms: st
                .members
                .last_activity
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            activity: self.info().observers().map(|o| {
                if !o.asks.is_empty() {
                    Activity::Asking
                } else if !o.requests.is_empty() {
                    Activity::Working
                } else {
                    Activity::Idle
                }
            }),
        }
    }
}

/// One device of a session, as `status` shows it.
#[derive(Debug, Clone)]
pub struct MemberView {
    pub device: Device,
    pub seat: u64,
    pub role: Role,
    pub attached: Option<Connection>,
}

fn nobody() -> Device {
    Device { node: String::new(), name: Some("nobody".into()) }
}

/// Notes the ACP session ids a client's run names (`"sessionId":"…"`), if it
/// is a run that is read for them (`names_an_id`, see [`SESSIONS_READ_BELOW`]).
fn note_acp_sessions(seen: &mut Vec<String>, run: &[u8], names_an_id: bool) {
    // Built once: this runs over every run a client sends.
    static KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"sessionId\":\""));
    if seen.len() >= ACP_SESSIONS_LISTED || !(names_an_id || run.len() < SESSIONS_READ_BELOW) {
        return;
    }
    for at in KEY.find_iter(run) {
        let rest = &run[at + KEY.needle().len()..];
        let Some(end) = memchr::memchr(b'"', rest) else { continue };
        let id = &rest[..end];
        if id.is_empty() || id.len() > ACP_SESSION_ID_MAX || id.contains(&b'\\') {
            continue;
        }
        let Ok(id) = std::str::from_utf8(id) else { continue };
        if !seen.iter().any(|s| s == id) {
            seen.push(id.to_string());
            if seen.len() >= ACP_SESSIONS_LISTED {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acp_session_ids_are_noted_once_and_bounded() {
        let mut seen = Vec::new();
        note_acp_sessions(
            &mut seen,
            br#"{"params":{"sessionId":"s-1"}} {"sessionId":"s-1"} {"sessionId":"a\"b"}"#,
            false,
        );
        assert_eq!(seen, vec!["s-1".to_string()]);
        for i in 0..20 {
            note_acp_sessions(&mut seen, format!(r#"{{"sessionId":"x{i}"}}"#).as_bytes(), false);
        }
        assert_eq!(seen.len(), ACP_SESSIONS_LISTED);
    }

    #[test]
    fn a_bulk_run_without_an_id_is_not_read_for_session_ids() {
        let cancel = br#"{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"c-1"}}"#;
        let mut bulk = b"\"pad\"\n".repeat(SESSIONS_READ_BELOW / 6);
        bulk.extend_from_slice(cancel);
        bulk.push(b'\n');
        let mut seen = Vec::new();
        // A lone notification is read; a bulk run of them is not, unless it
        // holds a request or an answer.
        note_acp_sessions(&mut seen, &bulk, false);
        assert!(seen.is_empty(), "{seen:?}");
        note_acp_sessions(&mut seen, cancel, false);
        assert_eq!(seen, ["c-1"]);
        let prompt = br#"{"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"sessionId":"p-1"}}"#;
        bulk.extend_from_slice(prompt);
        note_acp_sessions(&mut seen, &bulk, true);
        assert_eq!(seen, ["c-1", "p-1"]);
    }
}
