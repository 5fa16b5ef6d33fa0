//! The multi-client shapes of ACP's proposal for several clients on one
//! session (agent-client-protocol PR #533, "multi-client session attach"),
//! spoken beside the bridge's own `_thunderbolt/*` notices
//! ([`crate::devices`]) to the devices that ask for them.
//!
//! A device on a shared session (joined with the `/r1` join hello, e.g.
//! `connect --attach`) sends `session/attach` with `{"sessionId",
//! "clientId"?, "historyPolicy"?, "clientInfo"?}`; the bridge answers it
//! itself (the agent never sees it) with `{"sessionId", "clientId",
//! "historyPolicy", "connectedClients": [{"clientId", "name"?}]}` and from
//! then on sends that device, as `session/update` notifications:
//! `prompt_received` (`prompt`, `sentBy`), `permission_resolved`
//! (`toolCallId`, `chosenOptionId`, `requestId`, `resolvedBy`),
//! `turn_complete` (`stopReason`) and `client_disconnected` (`client`,
//! `timestamp`). Each update names its kind twice: `type`, as the proposal
//! writes it, and `sessionUpdate`, as ACP's other updates do.
//!
//! Where we differ from the proposal: the transport join comes first (the
//! bridge must know which session before any ACP line), so `session/attach`
//! opts a joined device into these events rather than attaching it; the
//! history is the session's own frames replayed by the join (`"history":
//! "all"`), not a `history` array, and it carries the permission requests
//! still open, so a late joiner gets them as the requests they are. Roles
//! stay: a device that observes has its requests refused (the proposal's
//! clients are all equal; ours have a controller so two people never type
//! into one turn at once, and a scope may forbid prompting altogether).

use serde_json::{json, Value};

use crate::jsonrpc::json_line;

/// The request that opts a device into these events.
pub const METHOD_ATTACH: &str = "session/attach";

/// The longest `clientId` a client may choose (an opaque id, a UUID is 36):
/// a longer one is replaced by the bridge's own.
pub const MAX_CLIENT_ID: usize = 128;

/// A client as the others see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    pub client_id: String,
    pub name: Option<String>,
}

impl Client {
    fn value(&self) -> Value {
        let mut v = json!({ "clientId": self.client_id });
        if let Some(n) = &self.name {
            v["name"] = Value::String(n.clone());
        }
        v
    }
}

/// The `clientId` a client asked for, if it is one the bridge keeps: printable,
/// not empty, at most [`MAX_CLIENT_ID`] bytes.
pub fn chosen_client_id(params: &Value) -> Option<String> {
    let id = params.get("clientId")?.as_str()?;
    (!id.is_empty() && id.len() <= MAX_CLIENT_ID && id.chars().all(|c| !c.is_control()))
        .then(|| id.to_string())
}

/// The answer to a `session/attach` request (`id` its id's JSON text).
pub fn attach_result(id: &[u8], params: &Value, client_id: &str, connected: &[Client]) -> Vec<u8> {
    let policy = params
        .get("historyPolicy")
        .and_then(Value::as_str)
        .filter(|p| matches!(*p, "full" | "none" | "pending_only"))
        .unwrap_or("full");
    json_line(&json!({
        "jsonrpc": "2.0",
        "id": serde_json::from_slice::<Value>(id).unwrap_or(Value::Null),
        "result": {
            "sessionId": params.get("sessionId").cloned().unwrap_or(Value::Null),
            "clientId": client_id,
            "historyPolicy": policy,
            "connectedClients": connected.iter().map(Client::value).collect::<Vec<_>>(),
        },
    }))
}

/// One `session/update` of kind `kind` with `fields`.
fn update(session: &Value, kind: &str, mut fields: Value) -> Vec<u8> {
    fields["type"] = Value::String(kind.into());
    fields["sessionUpdate"] = Value::String(kind.into());
    json_line(&json!({
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": { "sessionId": session, "update": fields },
    }))
}

/// Another client sent the agent a prompt: `request` is its `session/prompt`
/// request line (its content is passed on when it is no longer than
/// [`crate::devices::PROMPT_TOLD_MAX`]).
pub fn prompt_received(request: &[u8], by: &Client) -> Option<Vec<u8>> {
    let v: Value = (request.len() <= crate::devices::PROMPT_TOLD_MAX)
        .then(|| serde_json::from_slice(request).ok())
        .flatten()?;
    let p = v.get("params")?;
    let session = p.get("sessionId")?;
    let mut fields =
        json!({ "sentBy": by.value(), "requestId": v.get("id").cloned().unwrap_or(Value::Null) });
    if let Some(prompt) = p.get("prompt") {
        fields["prompt"] = prompt.clone();
    }
    Some(update(session, "prompt_received", fields))
}

/// The ACP session a `session/update` line of ours names (`null` if none).
pub fn session_of(update_line: &[u8]) -> Value {
    serde_json::from_slice::<Value>(update_line)
        .ok()
        .and_then(|v| v.pointer("/params/sessionId").cloned())
        .unwrap_or(Value::Null)
}

/// What the bridge keeps of an agent's permission request, to say which one
/// was resolved: its ACP session and tool call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Asked {
    pub session: Value,
    pub tool_call_id: Option<String>,
}

impl Asked {
    /// From the agent's `session/request_permission` request line.
    pub fn of(request: &[u8]) -> Option<Self> {
        let v: Value = serde_json::from_slice(request).ok()?;
        if v.get("method")?.as_str()? != "session/request_permission" {
            return None;
        }
        let p = v.get("params")?;
        Some(Self {
            session: p.get("sessionId").cloned().unwrap_or(Value::Null),
            tool_call_id: p.pointer("/toolCall/toolCallId").and_then(Value::as_str).map(str::to_string),
        })
    }
}

/// A client answered the agent's permission request `asked` (`id` its id's
/// JSON text) with the response line `answer`.
pub fn permission_resolved(asked: &Asked, id: &[u8], answer: &[u8], by: &Client) -> Vec<u8> {
    let chosen = serde_json::from_slice::<Value>(answer)
        .ok()
        .and_then(|v| v.pointer("/result/outcome/optionId").and_then(Value::as_str).map(str::to_string));
    update(
        &asked.session,
        "permission_resolved",
        json!({
            "toolCallId": asked.tool_call_id,
            "chosenOptionId": chosen,
            "requestId": serde_json::from_slice::<Value>(id).unwrap_or(Value::Null),
            "resolvedBy": by.value(),
        }),
    )
}

/// The agent answered another client's prompt (`answer`, its response line).
pub fn turn_complete(session: &Value, answer: &[u8]) -> Vec<u8> {
    let stop = serde_json::from_slice::<Value>(answer)
        .ok()
        .and_then(|v| v.pointer("/result/stopReason").cloned())
        .unwrap_or(Value::String("error".into()));
    update(session, "turn_complete", json!({ "stopReason": stop }))
}

/// A client left the session (`timestamp` RFC 3339).
pub fn client_disconnected(session: &Value, client: &Client, timestamp: &str) -> Vec<u8> {
    update(session, "client_disconnected", json!({ "client": client.value(), "timestamp": timestamp }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_updates_carry_the_proposals_fields() {
        let by = Client { client_id: "c-1".into(), name: Some("phone".into()) };
        let req = br#"{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":"s1","prompt":[{"type":"text","text":"hi"}]}}"#;
        let v: Value = serde_json::from_slice(&prompt_received(req, &by).unwrap()).unwrap();
        assert_eq!(v["method"], "session/update");
        assert_eq!(v["params"]["sessionId"], "s1");
        let u = &v["params"]["update"];
        assert_eq!(
            (u["type"].as_str(), u["sessionUpdate"].as_str()),
            (Some("prompt_received"), Some("prompt_received"))
        );
        assert_eq!(u["sentBy"], json!({"clientId": "c-1", "name": "phone"}));
        assert_eq!(u["prompt"][0]["text"], "hi");

        let asked = Asked::of(br#"{"jsonrpc":"2.0","id":"q1","method":"session/request_permission","params":{"sessionId":"s1","toolCall":{"toolCallId":"t9"},"options":[]}}"#).unwrap();
        let ans =
            br#"{"jsonrpc":"2.0","id":"q1","result":{"outcome":{"outcome":"selected","optionId":"allow"}}}"#;
        let v: Value = serde_json::from_slice(&permission_resolved(&asked, b"\"q1\"", ans, &by)).unwrap();
        let u = &v["params"]["update"];
        assert_eq!(u["toolCallId"], "t9");
        assert_eq!(u["chosenOptionId"], "allow");
        assert_eq!(u["requestId"], "q1");
        assert_eq!(u["resolvedBy"]["clientId"], "c-1");
        assert!(Asked::of(br#"{"jsonrpc":"2.0","id":1,"method":"fs/read_text_file","params":{}}"#).is_none());
    }

    #[test]
    fn a_chosen_client_id_is_kept_only_when_sane() {
        assert_eq!(chosen_client_id(&json!({"clientId": "d290f1ee"})).as_deref(), Some("d290f1ee"));
        assert_eq!(chosen_client_id(&json!({"clientId": "a\nb"})), None);
        assert_eq!(chosen_client_id(&json!({"clientId": "x".repeat(MAX_CLIENT_ID + 1)})), None);
        assert_eq!(chosen_client_id(&json!({})), None);
        let r: Value = serde_json::from_slice(&attach_result(
            b"5",
            &json!({"sessionId": "s1", "historyPolicy": "weird"}),
            "c-2",
            &[],
        ))
        .unwrap();
        assert_eq!(r["result"]["historyPolicy"], "full");
        assert_eq!(r["result"]["clientId"], "c-2");
    }
}
