//! What `status` and a device's listing show of a session: its devices, their
//! roles and attachments, the ACP sessions named on it, its last activity.

use std::{sync::Arc, time::SystemTime};

use iroh::endpoint::Connection;
use thunderbolt_shared::devices::{Activity, Attached, Device, Listed, Role};

use crate::serve::sessions::hub::{Hub, HubKind};

impl Hub {
    /// Every device of this session and its role, for `status` and listings.
    pub fn members(&self) -> Vec<MemberView> {
        let st = self.lock();
        let controller = st.members.controller;
        let mut all = Vec::new();
        if !st.members.left {
            all.push(MemberView {
                device: self.device(),
                verbs: self.verbs(),
                seat: 0,
                role: if controller == 0 { Role::Controller } else { Role::Observer },
                attached: st.conn.attached.as_ref().map(|a| a.conn.clone()),
            });
        }
        for g in &st.members.guests {
            let gs = g.lock();
            all.push(MemberView {
                device: g.device(),
                verbs: g.verbs(),
                seat: g.seat_number(),
                role: if controller == g.seat_number() { Role::Controller } else { Role::Observer },
                attached: gs.conn.attached.as_ref().map(|a| a.conn.clone()),
            });
        }
        all
    }

    /// Guests of the session by seat, for `kick` and revocation.
    pub fn guests(&self) -> Vec<Arc<Hub>> {
        self.lock().members.guests.clone()
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
    /// What its scope lets it do here.
    pub verbs: crate::devices::scope::Verbs,
    pub seat: u64,
    pub role: Role,
    pub attached: Option<Connection>,
}
