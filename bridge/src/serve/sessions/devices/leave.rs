//! A device leaving its session for good (it closed, stayed away past its
//! grace, was kicked or revoked) or staying away: control passes to the
//! earliest device attached, and the session ends with its last device.

use std::sync::Arc;

use thunderbolt_shared::{
    close,
    devices::{self as wire, Role},
    resume::ReplayLog,
};
use tokio::time::Instant;
use tracing::info;

use super::NOBODY;
use crate::serve::sessions::hub::{Gone, Hub, State};

impl Hub {
    /// A device of this session left for good (it closed, its grace ran
    /// out, it was kicked or revoked): it is no longer fed, and control
    /// passes to the earliest attached device if it had it. The session ends
    /// when no device is left.
    pub(in crate::serve::sessions) fn member_left(self: &Arc<Self>, member: &Arc<Hub>, why: &str) {
        let seat = member.seat_number();
        let mut st = self.lock();
        if seat == 0 {
            st.members.left = true;
            st.r1.out = ReplayLog::starting_at(st.r1.out.total());
            st.conn.sent_mark = None;
            st.journal.behind.clear();
            // Its journal goes (dropped: deleted); the others' are not journaled.
            drop(st.journal.file.take());
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
        // The multi-client proposal's `client_disconnected`, to the devices that asked for it.
        // (It is off the session already: the others are everyone on it.)
        let others = self.members_but(&st, seat);
        let speaking: Vec<Arc<Hub>> = others.iter().filter(|h| h.speaks_multi_client()).cloned().collect();
        // Told once the lock is let go (telling a device takes its lock, this session's among them).
        let disconnected = (!speaking.is_empty()).then(|| {
            let session = st
                .members
                .acp_sessions
                .last()
                .map(|s| serde_json::Value::String(s.clone()))
                .unwrap_or_default();
            let now = crate::devices::rfc3339(crate::devices::now_ms());
            thunderbolt_shared::multi_client::client_disconnected(&session, &member.client(), &now)
        });
        if st.members.left && remaining == 0 {
            st.gone.get_or_insert_with(|| {
                Gone::new(format!("its last device left ({why})"), close::REASON_UNKNOWN_SESSION)
            });
            let writer = st.conn.writer.take();
            drop(st);
            self.wake(writer);
            return;
        }
        // The devices still on it are told who left (a page's list of who
        // watches), once the lock is let go.
        let left = wire::left_line(&member.device(), &format!("{}.{seat}", self.short()), why);
        let mut promoted = None;
        if st.members.controller == seat {
            // The earliest device attached now: the first (seat 0) while it
            // is on the session and attached, then the guests in seat order.
            let first = (!st.members.left && !st.leaving && st.conn.attached.is_some()).then(|| self.clone());
            let next = first.or_else(|| {
                st.members
                    .guests
                    .iter()
                    .find(|g| g.lock().conn.attached.is_some() && !g.lock().leaving)
                    .cloned()
            });
            st.members.controller = next.as_ref().map_or(NOBODY, |g| g.seat_number());
            promoted = next;
        }
        self.refresh_roles(&st);
        let writer = st.conn.writer.take();
        drop(st);
        self.wake(writer);
        if let Some(line) = disconnected {
            super::multi::tell_multi(&speaking, &line);
        }
        for o in others {
            o.tell(left.clone());
        }
        if let Some(p) = promoted {
            info!(session = self.short(), "{} controls the session now", p.device().label());
            p.tell(wire::role_line(Role::Controller, &p.device()));
        }
    }

    /// Whether other devices than this one are on its session.
    pub(in crate::serve::sessions) fn others_on(self: &Arc<Self>) -> bool {
        let Some(s) = self.session_hub() else { return false };
        let st = s.lock();
        let me = self.seat_number();
        let first = !st.members.left && me != 0;
        first || st.members.guests.iter().any(|g| g.seat_number() != me)
    }

    /// This device's input ended while others are on the session: it gets
    /// what it was sent and an end, and once it acknowledged that it is let
    /// go ([`close::REASON_LEFT`]); the others go on.
    pub(in crate::serve::sessions) fn leave_after_eof(&self, st: &mut State) {
        st.leaving = true;
        st.io.end_at = Some((st.r1.out.total(), Instant::now()));
        info!(peer = %self.peer, session = self.short(), "{}'s input ended: it leaves the session once it has what it was sent", self.device().label());
        // It may hold everything already: no acknowledgement would come.
        self.left_if_done(st);
    }

    /// A leaving device acknowledged its end: its connection is closed.
    pub(in crate::serve::sessions) fn left_if_done(&self, st: &State) {
        if st.leaving && st.io.end_at.is_some_and(|(n, _)| st.r1.out.acked() >= n) {
            if let Some(a) = &st.conn.attached {
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
        st.conn.attached.is_some() || st.members.guests.iter().any(|g| g.lock().conn.attached.is_some())
    }

    /// Since when no device of this session has been attached (`None` while
    /// one is, or once it ended).
    pub(in crate::serve::sessions) fn away_since(&self, st: &State) -> Option<Instant> {
        if st.gone.is_some() || st.conn.attached.is_some() {
            return None;
        }
        let mut latest = if st.members.left { None } else { st.conn.detached_since };
        for g in &st.members.guests {
            let gs = g.lock();
            if gs.conn.attached.is_some() {
                return None;
            }
            latest = latest.max(gs.conn.detached_since);
        }
        latest
    }

    /// The devices of this session that stayed away past their grace `wait`
    /// while others went on, and when the next one would have (the session's
    /// hub's state locked). Only while more than one device is on it: the
    /// last one's absence is the session's own.
    pub(in crate::serve::sessions) fn members_away(
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
        if !st.members.left && st.conn.attached.is_none() {
            away.extend(st.conn.detached_since.map(|d| (self.clone(), d)));
        }
        for g in &st.members.guests {
            let gs = g.lock();
            if gs.conn.attached.is_none() && gs.gone.is_none() {
                away.extend(gs.conn.detached_since.map(|d| (g.clone(), d)));
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
    pub(in crate::serve::sessions) fn expire_members(self: &Arc<Self>) {
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
        let attached = self.lock().conn.attached.take();
        self.attached_now.store(false, std::sync::atomic::Ordering::Relaxed);
        if let Some(a) = &attached {
            a.conn.close(iroh::endpoint::VarInt::from_u32(close::CLOSE_CODE_REFUSED), reason.as_bytes());
        }
        self.member_left(self, reason);
        drop(attached);
    }
}
