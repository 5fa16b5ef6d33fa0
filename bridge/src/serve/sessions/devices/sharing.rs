//! A device on the session asks for a share of it (`_thunderbolt/share`):
//! taken out of its frames here, where the bridge knows which device sent
//! it, and answered with a code or why not ([`crate::serve::share`]).

use std::sync::{atomic::Ordering, Arc};

use bytes::Bytes;
use serde_json::{json, Value};
use thunderbolt_shared::{close, devices::SCOPE_REFUSED_CODE, jsonrpc::json_line};

use crate::{
    devices::scope::Verb,
    serve::{sessions::hub::Hub, share::METHOD_SHARE},
};

/// `_thunderbolt/kick` as raw JSON text.
const KICK_METHOD: &[u8] = b"\"_thunderbolt/kick\"";

/// [`METHOD_SHARE`] as raw JSON text (`jsonrpc::request_head`'s).
const SHARE_METHOD: &[u8] = b"\"_thunderbolt/share\"";

impl Hub {
    /// Takes this device's share requests out of a run and answers each.
    /// `None` when nothing else was in the run.
    pub(in crate::serve::sessions) fn take_share(self: &Arc<Self>, run: Bytes) -> Option<Bytes> {
        debug_assert_eq!(SHARE_METHOD, format!("\"{METHOD_SHARE}\"").as_bytes());
        self.take_calls(run, SHARE_METHOD, |id, params| {
            let session = self.session_hub();
            let minted = match session.as_ref().and_then(|s| s.sharer.get().cloned().map(|m| (s.clone(), m)))
            {
                Some((s, sharer)) => sharer.mint(s.short(), &self.owner, params),
                None => Err((-32601, format!("{METHOD_SHARE}: this session cannot be shared"))),
            };
            reply(id, minted)
        })
    }

    /// Takes this device's `_thunderbolt/kick` requests out of a run and
    /// answers each: a share's guest on this session, by its seat, is ended
    /// and removed for good. Only the owner's devices that may prompt may.
    pub(in crate::serve::sessions) fn take_kick(self: &Arc<Self>, run: Bytes) -> Option<Bytes> {
        self.take_calls(run, KICK_METHOD, |id, params| reply(id, self.kick_guest(params)))
    }

    fn kick_guest(self: &Arc<Self>, params: &Value) -> Result<Value, (i64, String)> {
        if self.share_guest.load(Ordering::Relaxed) || !self.verbs().has(Verb::Prompt) {
            return Err((
                SCOPE_REFUSED_CODE,
                "only the owner's devices that may prompt end a guest's share".into(),
            ));
        }
        let seat = params
            .get("seat")
            .and_then(Value::as_str)
            .ok_or((-32602, "name the guest's seat".to_string()))?;
        let session = self.session_hub().ok_or((-32602, "this session ended".to_string()))?;
        let guest = session
            .guests()
            .into_iter()
            .find(|g| g.short() == seat && g.share_guest.load(Ordering::Relaxed))
            .ok_or((-32602, format!("no share's guest of this session at {seat}")))?;
        if let Some(sharer) = session.sharer.get() {
            sharer.forget(&guest.owner);
        }
        tracing::info!(peer = %guest.peer, session = session.short(), "{} ended a share's guest, {}: {}", self.device().label(), guest.device().label(), close::REASON_KICKED);
        session.drop_member(&guest, close::REASON_KICKED);
        Ok(json!({ "ended": true }))
    }
}

/// The answer to request `id` (its JSON text): its result, or the error's code and message.
fn reply(id: &[u8], r: Result<Value, (i64, String)>) -> Vec<u8> {
    let id: Value = serde_json::from_slice(id).unwrap_or(Value::Null);
    json_line(&match r {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
    })
}
