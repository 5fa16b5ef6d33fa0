//! Who controls a shared session (its frames go to the agent; the others
//! observe): a device takes control or steps down ([`Hub::ask_role`]), and
//! each device is told its role and who controls.

use std::sync::Arc;

use thunderbolt_shared::devices::{self as wire, Device, Role};
use tracing::info;

use super::{nobody, NOBODY};
use crate::devices::scope::Verb;
use crate::serve::sessions::hub::{Hub, State};

impl Hub {
    /// This device asks for `role`: control moves to it (the device that had
    /// it becomes an observer and is told), or it steps down.
    pub(in crate::serve::sessions) fn ask_role(self: &Arc<Self>, role: Role) {
        let Some(session) = self.session_hub() else { return };
        // A device that may not prompt cannot take control: it is told its
        // role (observer) as if control had not moved, and why in the log.
        let role = if role == Role::Controller && !self.verbs().has(Verb::Prompt) {
            info!(
                session = session.short(),
                "{} may not take control: its scope is {}",
                self.device().label(),
                self.verbs()
            );
            Role::Observer
        } else {
            role
        };
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
                    !st.members.left && !st.leaving && st.conn.attached.is_some()
                } else {
                    let g = h.lock();
                    g.conn.attached.is_some() && !g.leaving
                }
        };
        let back = self.member_at(st, st.members.taken_from).filter(&attached);
        back.or_else(|| self.member_at(st, 0).filter(&attached))
            .or_else(|| st.members.guests.iter().find(|g| attached(g)).cloned())
    }

    /// Control moved from `old` (if any) because `by` asked for `role`.
    pub(super) fn announce_control(self: &Arc<Self>, old: Option<Arc<Hub>>, by: &Arc<Hub>, role: Role) {
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
    pub(in crate::serve::sessions) fn refresh_roles(&self, st: &State) {
        use std::sync::atomic::Ordering::Relaxed;
        let c = st.members.controller;
        self.observing.store(st.members.joined && c != 0, Relaxed);
        for g in &st.members.guests {
            g.observing.store(c != g.seat_number(), Relaxed);
        }
    }

    /// Tells this device its role, when it shares its session.
    pub(in crate::serve::sessions) fn tell_role(self: &Arc<Self>) {
        let Some(session) = self.session_hub() else { return };
        let leaving = self.lock().leaving;
        let mut st = session.lock();
        if !st.members.joined {
            return;
        }
        if st.members.controller == NOBODY && !leaving && self.verbs().has(Verb::Prompt) {
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
    pub(super) fn controller_device(self: &Arc<Self>) -> Option<Device> {
        let st = self.lock();
        self.member_at(&st, st.members.controller).map(|h| h.device())
    }
}
