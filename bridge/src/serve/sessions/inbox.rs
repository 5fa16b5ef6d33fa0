//! The client's frames on their way into the agent's queue: counted (for
//! the acks and a resume's position), a frame over the cap reduced to its
//! head once, the warm client's answers crossed off.

use std::time::Duration;

use bytes::Bytes;
use thunderbolt_shared::{jsonrpc, ndjson::OVERSIZE_PEEK, resume::ACK_DELAY_MS};
use tokio::{sync::mpsc, time::Instant};

use super::hub::{Hub, HubKind};
use crate::serve::pump::Inbound;

impl Hub {
    /// Room for one run in the agent's queue; `None` once the agent's input
    /// is closed (frames are then counted and dropped).
    pub(super) async fn reserve(&self) -> Option<mpsc::OwnedPermit<Inbound>> {
        let inbox = self.lock().inbox.clone()?;
        inbox.reserve_owned().await.ok()
    }

    /// Puts one run of the client's frames into the agent's queue and counts
    /// them, together and only while connection `id` is the attached one. A
    /// frame over the cap comes in pieces (`frames` 0 until its end): only its
    /// head goes on, once.
    pub(super) fn deliver(
        &self,
        id: u64,
        permit: Option<mpsc::OwnedPermit<Inbound>>,
        bytes: Bytes,
        frames: u64,
    ) -> Result<(), String> {
        let len = bytes.len();
        let mut st = self.lock();
        if !st.is_attached(id) {
            return Err("replaced by a newer connection".into());
        }
        if self.kind == HubKind::Warm && frames > 0 && !st.pending.is_empty() {
            // The client's answers to the agent's requests.
            for line in thunderbolt_shared::ndjson::lines(&bytes) {
                if let Some(id) = jsonrpc::response_id(line) {
                    st.pending.remove(&*String::from_utf8_lossy(id));
                }
            }
        }
        let at = st.ack.received();
        let item = match (frames, st.oversize_at) {
            (0, Some(n)) if n == at => None,
            (0, _) => {
                st.oversize_at = Some(at);
                Some(Inbound::Oversized(bytes.slice(..bytes.len().min(OVERSIZE_PEEK))))
            }
            // The end of the frame being skipped.
            (_, Some(n)) if n == at => {
                st.oversize_at = None;
                None
            }
            _ => Some(Inbound::Lines(bytes)),
        };
        if let (Some(p), Some(item)) = (permit, item) {
            p.send(item);
        }
        // Frames after the agent's input closed are counted (and dropped)
        // so the client's replay buffer drains.
        let was_pending = st.ack.pending();
        if st.ack.took(frames, len) {
            st.ack_due = true;
            drop(st);
            self.output.notify_waiters();
        } else if !was_pending && st.ack.pending() {
            st.ack_at = Some(Instant::now() + Duration::from_millis(ACK_DELAY_MS));
            drop(st);
            self.output.notify_waiters();
        }
        Ok(())
    }
}
