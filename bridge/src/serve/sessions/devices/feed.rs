//! The agent's output into each device's log: the first device's log takes
//! it as the agent writes it, the guests' logs and the shared history here
//! ([`Hub::share_output`]); a device that only watches skips what does not
//! fit its log and is told what it missed ([`feed`]), so it never holds the
//! agent. And a frame for one device only ([`Hub::tell`]).

use std::{sync::Arc, time::SystemTime};

use bytes::Bytes;
use thunderbolt_shared::{devices as wire, jsonrpc, ndjson::OVERSIZE_PEEK};
use tracing::debug;

use super::{routes::Routes, SESSION_HISTORY};
use crate::serve::{
    extension::KeptLines,
    sessions::hub::{Hub, State},
};

/// The agent's requests in flight remembered (past it an answer to one not
/// remembered still goes on: only a second answer to a remembered one is dropped).
const OPEN_REMEMBERED: usize = crate::serve::requests::MAX_TRACKED_REQUESTS;

/// Puts a run of the agent's output (`lines` frames) into one device's log
/// (its hub's state locked). The agent waits for room in the log of the
/// device it `waited` for (the controller; see [`Hub::held`]); any other
/// device's log takes what fits within `buffer`, and past it counts what
/// the device missed: once it has read down to half the buffer it is told
/// ([`wire::missed_line`]) and gets the agent's output again. A phone that
/// locks its screen while watching never stops the agent for the others.
pub(in crate::serve::sessions) fn feed(st: &mut State, buffer: usize, run: &Bytes, lines: u64, waited: bool) {
    let held = st.r1.out.bytes();
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
    st.r1.out.push_counted(run.clone(), lines);
}

/// Puts what the device missed ([`wire::missed_line`]) into its log, and
/// starts counting afresh.
fn tell_missed(st: &mut State) {
    if let Some((frames, bytes)) = st.missed.take() {
        st.r1.out.push(Bytes::from(wire::missed_line(frames, bytes)));
    }
}

impl Hub {
    /// A run of the agent's output for everyone but the first device (whose
    /// log took it already): the history, each guest's log, the requests it
    /// makes (`lines`: how many lines the run holds; `names_an_id`: whether
    /// one may have an `id`). The session's hub's state is locked; the guests'
    /// writers are woken by the caller, after the first device's.
    pub(in crate::serve::sessions) fn share_output(
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
                    if let Some(asked) = thunderbolt_shared::multi_client::Asked::of(line) {
                        m.asked.insert(id.clone(), asked);
                    }
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

    /// What the agent's output waits on: the controller's log (the first
    /// device's while it is the only one). A device that only watches never
    /// holds the agent, however long it is stopped or away: its log skips
    /// what does not fit and tells it so ([`feed`]).
    pub(in crate::serve::sessions) fn held(&self, st: &State) -> usize {
        match st.members.controller {
            0 if st.members.left => 0,
            0 => st.r1.out.bytes(),
            seat => st
                .members
                .guests
                .iter()
                .find(|g| g.seat_number() == seat)
                .map_or(0, |g| g.lock().r1.out.bytes()),
        }
    }

    /// Whether the first device's log is one the agent waits for.
    pub(in crate::serve::sessions) fn first_is_waited_for(st: &State) -> bool {
        st.members.controller == 0
    }

    /// A device's log has room again after it acknowledged: what it missed
    /// is told now, not with the agent's next output (which may be long in
    /// coming). True when a notice was put in the log.
    pub(in crate::serve::sessions) fn tell_missed_if_room(&self, st: &mut State) -> bool {
        let room = st.missed.is_some() && st.r1.out.bytes() <= self.cfg.buffer / 2;
        if room {
            tell_missed(st);
        }
        room
    }

    /// A frame for this device only (a refusal, a role, who answered). Never
    /// past the resume buffer: a device that asks and asks (for a role, with
    /// requests it may not send) and never acknowledges stops being told.
    pub(in crate::serve::sessions) fn tell(self: &Arc<Self>, line: Vec<u8>) {
        let mut st = self.lock();
        if st.gone.is_some() || st.members.left || st.leaving {
            return;
        }
        if st.r1.out.bytes() + line.len() > self.cfg.buffer {
            debug!(peer = %self.peer, session = self.short(), "a frame for this device dropped: its log is full");
            return;
        }
        let run = Bytes::from(line);
        st.r1.out.push(run.clone());
        if !self.is_guest() {
            st.journal_output(&run);
        }
        drop(st);
        self.output.notify_waiters();
    }
}
