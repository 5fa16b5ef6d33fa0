//! What a resumable session's client is told when the bridge restarted under
//! it and took the session back from its journal (docs/protocol.md, "Sessions
//! that survive a restart").
//!
//! After the frames the old agent wrote that the client had not acknowledged,
//! and before anything of the new agent's, the client gets:
//! - for each of its requests that was in flight when the bridge went down (a
//!   prompt mid-turn), a JSON-RPC error with [`TURN_ABORTED`], so nothing waits
//!   for an answer that cannot come;
//! - one notification, [`METHOD_RESTORED`], saying what was taken back:
//!
//! ```json
//! {"jsonrpc":"2.0","method":"_thunderbolt/restored","params":{
//!   "reason":"host restarted",
//!   "sessions":[{"sessionId":"s-1","how":"resume"},{"sessionId":"s-2","how":"load"},
//!               {"sessionId":"s-3","how":"failed","error":"…"}],
//!   "aborted":[7]}}
//! ```
//!
//! `how` is `resume` (`session/resume`), `load` (`session/load`; the history the
//! agent streams while loading is not shown again) or `failed`. When the new
//! agent can reload none (it advertises neither), `params.failed` carries
//! [`crate::close::REASON_CANNOT_RELOAD`] and the session then ends with that
//! reason.

use serde_json::{json, Value};

use crate::jsonrpc::json_line;

/// The notification that tells a client its session was taken back.
pub const METHOD_RESTORED: &str = "_thunderbolt/restored";

/// The error message of a request that was in flight when the bridge went down.
pub const TURN_ABORTED: &str = "turn aborted: the host restarted";

/// The JSON-RPC error code of [`TURN_ABORTED`] (a server error, like the
/// bridge's other answers for an agent that cannot answer).
pub const TURN_ABORTED_CODE: i64 = -32000;

/// The error line for the request whose id is `id` (a JSON value).
pub fn turn_aborted(id: &Value) -> Vec<u8> {
    json_line(&json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": TURN_ABORTED_CODE, "message": TURN_ABORTED },
    }))
}

/// How one ACP session was taken back.
#[derive(Debug, Clone, PartialEq)]
pub enum Taken {
    Resume,
    Load,
    Failed(String),
}

/// The [`METHOD_RESTORED`] line.
pub fn restored(sessions: &[(Value, Taken)], aborted: &[Value], failed: Option<&str>) -> Vec<u8> {
    let sessions: Vec<Value> = sessions
        .iter()
        .map(|(id, how)| match how {
            Taken::Resume => json!({ "sessionId": id, "how": "resume" }),
            Taken::Load => json!({ "sessionId": id, "how": "load" }),
            Taken::Failed(e) => json!({ "sessionId": id, "how": "failed", "error": e }),
        })
        .collect();
    let mut params = json!({ "reason": "host restarted", "sessions": sessions, "aborted": aborted });
    if let Some(f) = failed {
        params["failed"] = json!(f);
    }
    json_line(&json!({ "jsonrpc": "2.0", "method": METHOD_RESTORED, "params": params }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lines_a_client_gets() {
        let e: Value = serde_json::from_slice(&turn_aborted(&json!(7))).unwrap();
        assert_eq!(e["id"], 7);
        assert_eq!(e["error"]["message"], TURN_ABORTED);
        let n = restored(&[(json!("s"), Taken::Load)], &[json!("p")], None);
        assert_eq!(*n.last().unwrap(), b'\n');
        let n: Value = serde_json::from_slice(&n).unwrap();
        assert_eq!(n["method"], METHOD_RESTORED);
        assert_eq!(n["params"]["sessions"][0]["how"], "load");
        assert_eq!(n["params"]["aborted"][0], "p");
        assert!(n["params"].get("failed").is_none());
    }
}
