//! The multi-client proposal's shapes ([`thunderbolt_shared::multi_client`],
//! ACP PR #533) on a shared session: a device's `session/attach` answered
//! here (it opts that device into them), and each event told to the devices
//! that opted in, beside the bridge's own `_thunderbolt/*` notices.

use std::sync::{atomic::Ordering, Arc};

use bytes::Bytes;
use thunderbolt_shared::multi_client as mc;
use tracing::info;

use crate::serve::sessions::hub::Hub;

/// [`mc::METHOD_ATTACH`] as raw JSON text (`jsonrpc::request_head`'s).
const ATTACH_METHOD: &[u8] = b"\"session/attach\"";

impl Hub {
    /// This device as the proposal's clients see it: the `clientId` it chose
    /// in its `session/attach`, else its seat's id (`<session>.<seat>`, as
    /// `status` and `kick` name it), and its name.
    pub(in crate::serve::sessions) fn client(&self) -> mc::Client {
        let chosen = self.client_id.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let seat = if self.is_guest() { self.id.clone() } else { format!("{}.0", self.id) };
        mc::Client { client_id: chosen.unwrap_or(seat), name: self.device().name }
    }

    /// Whether this device asked for the proposal's events.
    pub(in crate::serve::sessions) fn speaks_multi_client(&self) -> bool {
        self.multi_client.load(Ordering::Relaxed)
    }

    /// Takes this device's `session/attach` requests out of a run and answers
    /// them: the device gets the proposal's events from now on. `None` when
    /// nothing else was in the run.
    pub(in crate::serve::sessions) fn take_attach(self: &Arc<Self>, run: Bytes) -> Option<Bytes> {
        self.take_calls(run, ATTACH_METHOD, |id, params| {
            // Not one that reads as another device's seat id here (`<session>.<n>`).
            let theirs = |c: &String| self.session_hub().is_some_and(|s| c.starts_with(s.short()));
            if let Some(chosen) = mc::chosen_client_id(params).filter(|c| !theirs(c)) {
                *self.client_id.lock().unwrap_or_else(|p| p.into_inner()) = Some(chosen);
            }
            self.multi_client.store(true, Ordering::Relaxed);
            let me = self.client();
            let connected: Vec<mc::Client> = match self.session_hub() {
                Some(s) => {
                    let everyone = s.members_but(&s.lock(), super::NOBODY);
                    everyone.iter().map(|h| h.client()).collect()
                }
                None => vec![me.clone()],
            };
            info!(peer = %self.peer, session = self.short(), "{} speaks ACP's multi-client proposal as client {}", self.device().label(), me.client_id);
            mc::attach_result(id, params, &me.client_id, &connected)
        })
    }
}

/// Tells each of `to` that opted in the proposal's event `line`.
pub(super) fn tell_multi(to: &[Arc<Hub>], line: &[u8]) {
    for h in to.iter().filter(|h| h.speaks_multi_client()) {
        h.tell(line.to_vec());
    }
}
