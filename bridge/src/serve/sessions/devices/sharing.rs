//! A device on the session asks for a share of it (`_thunderbolt/share`):
//! taken out of its frames here, where the bridge knows which device sent
//! it, and answered with a code or why not ([`crate::serve::share`]).

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};
use thunderbolt_shared::jsonrpc::json_line;

use crate::serve::{sessions::hub::Hub, share::METHOD_SHARE};

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
            let id: Value = serde_json::from_slice(id).unwrap_or(Value::Null);
            json_line(&match minted {
                Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                Err((code, message)) => {
                    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
                }
            })
        })
    }
}
