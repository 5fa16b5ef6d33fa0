//! The client's frames on their way into the agent's queue: counted (for
//! the acks and a resume's position), a frame over the cap reduced to its
//! head once, the warm client's answers crossed off.

use std::sync::Arc;

use bytes::Bytes;
use thunderbolt_shared::{jsonrpc, ndjson::OVERSIZE_PEEK};
use tokio::{sync::mpsc, time::Instant};

use super::hub::{Hub, HubKind};
use crate::serve::pump::Inbound;

impl Hub {
    /// Whether a run of the client's frames has an `"id"` in it, for the
    /// journal and the devices' bookkeeping, which read a run without one (a
    /// bulk transfer's, a client's notifications) no further. Searched once,
    /// as the run is read: by the time the agent's queue has room for it, it
    /// may have left the CPU's caches (the read-ahead), and the first pass
    /// over it pays for that.
    pub(super) fn names_an_id(&self, run: &[u8], frames: u64) -> bool {
        frames > 0 && self.kind == HubKind::Resumable && jsonrpc::names_an_id(run)
    }

    /// Room for one run in the agent's queue; `None` once the agent's input
    /// is closed (frames are then counted and dropped).
    pub(super) async fn reserve(self: &Arc<Self>) -> Option<mpsc::OwnedPermit<Inbound>> {
        // A device that joined feeds the session's agent.
        let session = self.session_hub()?;
        let restoring = session.lock().restart.restoring.is_some();
        if restoring {
            // After a restart the client's frames reach the new agent once it
            // was brought back to where the old one was.
            session.restored().await;
        }
        let inbox = session.lock().io.inbox.clone()?;
        inbox.reserve_owned().await.ok()
    }

    /// Puts one run of the client's frames into the agent's queue and counts
    /// them, together and only while connection `id` is the attached one. A
    /// frame over the cap comes in pieces (`frames` 0 until its end): only its
    /// head goes on, once. `names_an_id`: [`jsonrpc::names_an_id`] of the run,
    /// for a resumable session's (see [`Self::names_an_id`]).
    pub(super) fn deliver(
        self: &Arc<Self>,
        id: u64,
        permit: Option<mpsc::OwnedPermit<Inbound>>,
        bytes: Bytes,
        frames: u64,
        names_an_id: bool,
    ) -> Result<(), String> {
        let len = bytes.len();
        if !self.lock().conn.is_attached(id) {
            return Err("replaced by a newer connection".into());
        }
        // What of it goes on, by the device's role (see `devices`). A run
        // screened here and then not counted (the connection was replaced
        // just now) is resent by the client and let on again.
        // Nor a device's whose scope does not let it prompt and answer (the
        // agent would be told a frame came, which ends its request).
        let verbs = self.verbs();
        let observer = frames == 0
            && (self.kind == HubKind::Resumable && self.is_observer()
                || !verbs.has(crate::devices::scope::Verb::Prompt)
                || !verbs.has(crate::devices::scope::Verb::Answer));
        let forward = match (frames, self.kind) {
            (0, _) => Some(bytes.clone()),
            (_, HubKind::Warm) => self.screen_scope(bytes.clone()),
            _ => self.screen(bytes.clone(), names_an_id),
        };
        // A joined device's calls (its ACP sessions) are journaled in the
        // session's journal, before the agent can have them (the session's
        // lock, not this device's: taken alone).
        if let (true, Some(run)) = (frames > 0 && names_an_id && self.is_guest(), &forward) {
            if let Some(session) = self.session_hub() {
                session.journal_other_device(run, names_an_id);
            }
        }
        let mut st = self.lock();
        if !st.conn.is_attached(id) {
            return Err("replaced by a newer connection".into());
        }
        if self.kind == HubKind::Warm && frames > 0 && !st.warm.pending.is_empty() {
            // The client's answers to the agent's requests.
            for line in thunderbolt_shared::ndjson::lines(&bytes) {
                if let Some(id) = jsonrpc::response_id(line) {
                    st.warm.pending.remove(&*String::from_utf8_lossy(id));
                }
            }
        }
        let at = st.r1.acks.received();
        let item = match (frames, st.io.oversize_at) {
            (0, Some(n)) if n == at => None,
            (0, _) => {
                st.io.oversize_at = Some(at);
                // An observer's frame over the cap is not the agent's to see.
                (!observer).then(|| Inbound::Oversized(bytes.slice(..bytes.len().min(OVERSIZE_PEEK))))
            }
            // The end of the frame being skipped.
            (_, Some(n)) if n == at => {
                st.io.oversize_at = None;
                None
            }
            // A session taken back after a restart: answers to what the old
            // agent asked are not the new agent's.
            _ => match (st.restart.asked.as_mut(), forward) {
                (_, None) => None,
                (Some(asked), Some(run)) => self.drop_stale_answers(asked, &run).map(Inbound::Lines),
                (None, Some(run)) => Some(Inbound::Lines(run)),
            },
        };
        // Frames after the agent's input closed are counted (and dropped)
        // so the client's replay buffer drains.
        let wake_writer = st.r1.took(frames, len, Instant::now());
        // Journaled (with the count) before the agent can have them: a restart
        // knows what it got.
        if frames > 0 {
            st.journal_input(&bytes, frames, names_an_id);
        }
        if let (Some(p), Some(item)) = (permit, item) {
            p.send(item);
        }
        // The writer sends the ack, or sleeps until its deadline.
        if wake_writer {
            drop(st);
            self.output.notify_waiters();
        }
        Ok(())
    }
}

/// Requests of a restored session's new agent remembered, for telling its
/// client's answers to them from answers to the old agent's (the same bound
/// as the client's requests in flight).
pub const MAX_ASKED: usize = crate::serve::requests::MAX_TRACKED_REQUESTS;

impl Hub {
    /// A run of the client's lines without its answers to requests the new
    /// agent never made (the old agent's, asked before the restart): each
    /// dropped is logged. `None` when nothing is left.
    fn drop_stale_answers(
        &self,
        asked: &mut std::collections::HashSet<String>,
        run: &Bytes,
    ) -> Option<Bytes> {
        let mut kept = crate::serve::extension::KeptLines::new(run);
        for line in thunderbolt_shared::ndjson::lines(run) {
            let stale = jsonrpc::response_id(line)
                .map(|id| String::from_utf8_lossy(id).into_owned())
                .filter(|id| !asked.remove(id));
            if let Some(id) = &stale {
                tracing::info!(
                    peer = %self.peer,
                    session = self.short(),
                    "the client's answer to request {id} dropped: the agent that asked it was replaced at the restart"
                );
            }
            kept.line(line, stale.is_none());
        }
        kept.finish()
    }

    /// Notes the requests a restored session's new agent makes.
    pub(super) fn note_asked(asked: &mut std::collections::HashSet<String>, run: &[u8]) {
        for line in thunderbolt_shared::ndjson::lines(run) {
            let head = jsonrpc::peek_head(&line[..line.len().min(OVERSIZE_PEEK)]);
            if let (jsonrpc::Kind::Request, Some(id)) = (head.kind, head.id) {
                if asked.len() < MAX_ASKED {
                    asked.insert(id);
                }
            }
        }
    }
}
