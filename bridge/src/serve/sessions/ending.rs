//! How a session ends: the operator's kick, an eviction to make room, the
//! agent's end or a refusal, told to the attached connection and remembered
//! for a later resume.

use iroh::{endpoint::VarInt, EndpointId};
use thunderbolt_shared::close;
use tracing::info;

use super::hub::{Gone, Hub};

/// A session over for good, for what goes with it.
#[derive(Debug)]
pub struct Over {
    /// The devices on it when it ended: its owner and its guests.
    pub devices: Vec<EndpointId>,
    /// The ids it was known by: its own short id and the ACP session ids
    /// its clients named.
    pub ids: Vec<String>,
}

impl Hub {
    /// Ends the session now: the host's operator asked (`thunderbolt kick`).
    /// A later resume finds no such session.
    pub fn kick(&self, reason: &str) {
        self.end_closing(close::CLOSE_CODE_REFUSED, reason, Gone::new(reason, close::REASON_UNKNOWN_SESSION));
    }

    /// Ends a detached session to make room; `why` says for what.
    pub fn evict(&self, why: &str) -> bool {
        let Some(waited) = self.detached_for() else { return false };
        info!(
            peer = %self.peer,
            session = self.short(),
            "evicting a detached session (started {}s ago, detached for {}s): {why}",
            self.created.elapsed().as_secs(),
            waited.as_secs()
        );
        self.end_with(
            close::CLOSE_CODE_REFUSED,
            Gone::new(format!("evicted: {why}"), close::REASON_SESSION_EVICTED),
        );
        true
    }

    /// Ends the session towards its client (if one is attached).
    pub(super) fn end(&self, code: u32, reason: &str) {
        // A resume after an agent's end, or after the client's own close, finds
        // a session that is simply over; the bridge's other closes say why.
        let resume_reason =
            if code == close::CLOSE_CODE_REFUSED { reason } else { close::REASON_UNKNOWN_SESSION };
        self.end_with(code, Gone::new(reason, resume_reason));
    }

    /// Ends the session: the attached connection is closed with `code` and,
    /// for a refusal, the reason a later resume gets too (else `why`, e.g.
    /// how the agent ended).
    pub(super) fn end_with(&self, code: u32, gone: Gone) {
        let text = if code == close::CLOSE_CODE_REFUSED { &gone.resume_reason } else { &gone.why }.clone();
        self.end_closing(code, &text, gone);
    }

    /// Ends the session, closing the attached connection with `code` and `text`.
    pub(super) fn end_closing(&self, code: u32, text: &str, gone: Gone) {
        let mut st = self.lock();
        st.gone.get_or_insert(gone.clone());
        let attached = st.conn.attached.take();
        self.attached_now.store(false, std::sync::atomic::Ordering::Relaxed);
        let writer = st.conn.writer.take();
        // Every device on the session hears the same end.
        let guests = st.members.guests.clone();
        drop(st);
        if let Some(a) = &attached {
            a.conn.close(VarInt::from_u32(code), text.as_bytes());
        }
        self.wake(writer);
        for g in guests {
            g.end_closing(code, text, gone.clone());
        }
    }

    /// Releases the attached connection's task (the session is over).
    pub fn release(&self) {
        let attached = self.lock().conn.attached.take();
        self.attached_now.store(false, std::sync::atomic::Ordering::Relaxed);
        drop(attached);
    }

    /// A session taken back after a restart learns its token from the
    /// client that presents it (its journal kept only the hash).
    pub(super) fn adopt_token(&self, token: &str) {
        let mut st = self.lock();
        if st.token.is_empty() {
            st.token = token.to_string();
        }
    }

    /// The session is over: its journal goes with it, unless it was kept
    /// for the bridge's restart. Returns what it was when it is over for
    /// good (`None` when kept).
    pub fn retire_journal(&self) -> Option<Over> {
        let mut st = self.lock();
        let journal = st.journal.file.take();
        if let Some(j) = journal {
            if j.kept() {
                drop(st);
                info!(peer = %self.peer, session = self.short(), "session kept for the bridge's restart ({})", j.path().display());
                return None;
            }
        }
        let devices = std::iter::once(self.owner).chain(st.members.guests.iter().map(|g| g.owner)).collect();
        let mut ids = st.members.acp_sessions();
        ids.push(self.short().to_string());
        Some(Over { devices, ids })
    }

    /// The bridge is stopping: a journaled session is kept for its restart
    /// (the journal marked and synced) and its client told so with
    /// [`close::REASON_SESSION_KEPT`], a reason a resumable client redials
    /// after. Returns false when the session has no journal to keep.
    pub(super) fn keep_for_restart(&self) -> bool {
        let mut st = self.lock();
        st.flush_journal();
        let Some(j) = st.journal.file.as_mut().filter(|j| j.is_live()) else { return false };
        j.stop();
        if !j.kept() {
            return false;
        }
        drop(st);
        self.end_closing(
            close::CLOSE_CODE_REFUSED,
            close::REASON_SESSION_KEPT,
            Gone::new(close::REASON_SHUTTING_DOWN, close::REASON_SESSION_KEPT),
        );
        true
    }

    /// Why the session ended and what a resume of it is told, once it did.
    pub(super) fn gone(&self) -> Option<Gone> {
        self.lock().gone.clone()
    }
}
