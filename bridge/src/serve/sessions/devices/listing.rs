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
                share_guest: false,
                since_ms: since(self.created),
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
                share_guest: g.share_guest.load(std::sync::atomic::Ordering::Relaxed),
                since_ms: since(g.created),
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
                .map(|m| m.attached_view(&self.id))
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

impl MemberView {
    /// As a listing shows an attached device of session `session`.
    pub fn attached_view(&self, session: &str) -> Attached {
        Attached {
            device: self.device.clone(),
            role: self.role,
            seat: Some(format!("{session}.{}", self.seat)),
            guest: self.share_guest,
            scope: (!self.verbs.is_all()).then(|| self.verbs.to_string()),
            since_ms: Some(self.since_ms),
        }
    }
}

/// One device of a session, as `status` shows it.
#[derive(Debug, Clone)]
pub struct MemberView {
    pub device: Device,
    /// What its scope lets it do here.
    pub verbs: crate::devices::scope::Verbs,
    /// Someone else's device, by a share.
    pub share_guest: bool,
    /// Since when it is on the session (ms since the epoch).
    pub since_ms: u64,
    pub seat: u64,
    pub role: Role,
    pub attached: Option<Connection>,
}

/// A moment of this process (tokio's `Instant`, paused in tests) as milliseconds since the epoch.
fn since(at: tokio::time::Instant) -> u64 {
    crate::devices::now_ms().saturating_sub(at.elapsed().as_millis() as u64)
}
