//! Several devices on one resumable session (docs/protocol.md, "Several
//! devices on one session"): the listing a device asks for, how it joins,
//! and the bridge's own notifications about roles and answers.
//!
//! A device lists the sessions of an agent it may join with a hello that
//! says `"list":1`; the bridge answers with one line (no `!`),
//! `{"sessions":[…]}` ([`Listed`]), finishes its stream and waits for the
//! client's close. With `"host":1` as well it lists the sessions of every
//! agent of the host that admits the device, and names those agents
//! (`"agents":[…]`, `"host"`): a device's list learns a host in one round
//! trip. It joins one with a hello that names it:
//!
//! ```text
//! !{"hello":1,"session":null,"received":0,"join":"ab12cd34","observe":true,"history":"all"}
//! ```
//!
//! and from the welcome on it is a resumable session of its own (its own
//! token, counters and acknowledgements; it resumes with its own token). Its
//! first frames are the session's history when it asked for `all`, then a
//! [`METHOD_ROLE`] notification saying its role, then the session's frames as
//! they come. A device asks for a role with the control line
//! `!{"role":"controller"}` (or `"observer"`).

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::jsonrpc::json_line;

/// A device's part in a session it shares with others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Its frames go to the agent.
    Controller,
    /// It sees every frame; of what it sends only answers to the agent's own
    /// requests go on.
    Observer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Controller => "controller",
            Role::Observer => "observer",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "controller" => Some(Role::Controller),
            "observer" => Some(Role::Observer),
            _ => None,
        }
    }
}

/// What a joining device is sent of the session's past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum History {
    /// The session's frames from its start (as far as the bridge's bounded
    /// history reaches), then what comes.
    #[default]
    All,
    /// Only what comes from now on.
    Now,
}

impl History {
    pub fn as_str(self) -> &'static str {
        match self {
            History::All => "all",
            History::Now => "now",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "all" => Some(History::All),
            "now" => Some(History::Now),
            _ => None,
        }
    }
}

/// A device's role, told to it: when it joins, when it takes control, when
/// another device takes control from it, and when it resumes.
pub const METHOD_ROLE: &str = "_thunderbolt/role";

/// One of the agent's requests was answered by another device: the others
/// are told who, and drop their own question.
pub const METHOD_ANSWERED: &str = "_thunderbolt/answered";

/// A device the agent does not wait for (an observer) stopped reading until
/// its log was full: the agent went on, and the device is told how much of
/// its output it missed (`{"frames":N,"bytes":B,"message":…}`) when it reads
/// again, in place of that output.
pub const METHOD_MISSED: &str = "_thunderbolt/missed";

/// The JSON-RPC error code of a request an observer sent (a server error).
pub const OBSERVER_REFUSED_CODE: i64 = -32003;

/// The JSON-RPC error code of a request its device's scope does not allow
/// (a server error; beside [`OBSERVER_REFUSED_CODE`]: taking control does
/// not help).
pub const SCOPE_REFUSED_CODE: i64 = -32005;

/// A device on a session, as others see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// Its NodeId.
    pub node: String,
    /// Its name on the bridge (the devices file, the account), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Device {
    /// Its name, else its NodeId's first characters.
    pub fn label(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.node.chars().take(10).collect())
    }
}

/// A device attached to a session now, and its role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attached {
    #[serde(flatten)]
    pub device: Device,
    pub role: Role,
    /// Its seat's id (`<session>.<n>`): what `kick` and `_thunderbolt/kick` take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seat: Option<String>,
    /// Someone else's device, on this session by a share.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub guest: bool,
    /// What it may do, when less than everything (`observe`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Since when it is on the session (milliseconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<u64>,
}

/// One session a device may join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Listed {
    /// What `join` takes (and `thunderbolt status` and `kick` show).
    pub id: String,
    pub agent: String,
    /// The device that started it.
    pub started_by: Device,
    /// When it started (milliseconds since the epoch).
    pub since_ms: u64,
    /// `attached` (some device is), `detached` (it waits for one within its
    /// grace) or `warm`.
    pub state: String,
    pub attached: Vec<Attached>,
    /// The ACP session ids its client used.
    pub acp_sessions: Vec<String>,
    /// When a frame last went either way (milliseconds since the epoch).
    pub last_activity_ms: u64,
    /// What its agent is doing now (absent from older bridges).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<Activity>,
}

/// What a session's agent is doing, for a device's list: the sessions that
/// need a person go first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activity {
    /// It asked its client something (a permission, a question) that no
    /// device has answered yet.
    Asking,
    /// A request of its client's is in flight (a prompt's turn).
    Working,
    /// Nothing in flight: it waits for a prompt.
    Idle,
}

/// The bridge's answer to a listing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    pub sessions: Vec<Listed>,
    /// For a listing of the host (`"host":1`): every agent of the host the
    /// device may reach, with its ticket; absent otherwise (and from older
    /// bridges, which answer with the one agent's sessions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<crate::pairing::PairedAgent>>,
    /// For a listing of the host: what the workstation is called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// For one of the owner's own devices, when the host takes messages: its
    /// threads in short (`{"seq", "threads": [{"name", "seq", "last"}]}`,
    /// see [`crate::reach`]); read whole over `thunderbolt/<p>/reach1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Value>,
    /// What the asking device may do at this agent, when less than
    /// everything (`["observe", "answer"]`): a page hides what it may not do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Vec<String>>,
}

/// A request id given as its JSON text, as a value (`null` if it is not JSON).
fn id_value(id: &[u8]) -> Value {
    serde_json::from_slice(id).unwrap_or(Value::Null)
}

/// The [`METHOD_ROLE`] line: `role` is this device's; `controller` the device
/// in control now.
pub fn role_line(role: Role, controller: &Device) -> Vec<u8> {
    json_line(&json!({
        "jsonrpc": "2.0",
        "method": METHOD_ROLE,
        "params": { "role": role, "controller": controller },
    }))
}

/// The [`METHOD_ANSWERED`] line: request `id` (its JSON text) was answered by `by`.
pub fn answered_line(id: &[u8], by: &Device) -> Vec<u8> {
    json_line(&json!({
        "jsonrpc": "2.0",
        "method": METHOD_ANSWERED,
        "params": { "id": id_value(id), "by": by },
    }))
}

/// The error an observer's request is answered with (`id` its JSON text).
pub fn observer_refused(id: &[u8], controller: &Device) -> Vec<u8> {
    json_line(&json!({
        "jsonrpc": "2.0",
        "id": id_value(id),
        "error": {
            "code": OBSERVER_REFUSED_CODE,
            "message": format!(
                "this device is an observer of the session: only its controller ({}) sends requests; take control to send",
                controller.label()
            ),
        },
    }))
}

/// The error a request is answered with when the device's scope does not
/// let it prompt (`id` its JSON text; `verbs` what the scope does allow, as
/// `observe,answer`).
pub fn scope_refused(id: &[u8], verbs: &str) -> Vec<u8> {
    json_line(&json!({
        "jsonrpc": "2.0",
        "id": id_value(id),
        "error": {
            "code": SCOPE_REFUSED_CODE,
            "message": format!(
                "this device may not send the agent requests: its scope is {verbs} (the owner changes it with thunderbolt devices scope)"
            ),
            "data": { "scope": verbs },
        },
    }))
}

/// The [`METHOD_MISSED`] line: this device's log was full (it stopped
/// reading: a locked phone, a stopped process) and it did not get `frames`
/// of the agent's frames (`bytes` bytes); the agent did not wait for it.
pub fn missed_line(frames: u64, bytes: u64) -> Vec<u8> {
    json_line(&json!({
        "jsonrpc": "2.0",
        "method": METHOD_MISSED,
        "params": {
            "frames": frames,
            "bytes": bytes,
            "message": format!(
                "this device fell behind the session and missed {frames} of the agent's message(s) ({bytes} bytes); \
                 join again with the history to see them"
            ),
        },
    }))
}

/// Another device of the session sent the agent a prompt (ACP
/// `session/prompt`): the others are told who, and what it asked (`prompt`,
/// the request's content blocks, unless the request was longer than
/// [`PROMPT_TOLD_MAX`]: then `truncated`), so each shows the whole turn.
pub const METHOD_PROMPTED: &str = "_thunderbolt/prompted";

/// The agent answered another device's prompt: the turn it started is over
/// (`stopReason`, or `error` with the error's message). The answer itself
/// goes to the device that asked, only.
pub const METHOD_TURN_ENDED: &str = "_thunderbolt/turn_ended";

/// Longest prompt request whose content is passed on to the other devices
/// in [`METHOD_PROMPTED`]: a prompt with an image or a pasted file is told
/// without it, so a device's prompt costs each other device a bounded frame.
pub const PROMPT_TOLD_MAX: usize = 16 * 1024;

/// The [`METHOD_PROMPTED`] line for `request` (a `session/prompt` request
/// line, `id` its id's JSON text) sent by `by`.
pub fn prompted_line(request: &[u8], id: &[u8], by: &Device) -> Vec<u8> {
    let mut params = json!({ "id": id_value(id), "by": by });
    let content = (request.len() <= PROMPT_TOLD_MAX)
        .then(|| serde_json::from_slice::<Value>(request).ok())
        .flatten()
        .and_then(|v| v.get("params").cloned())
        .map(|p| (p.get("sessionId").cloned(), p.get("prompt").cloned()));
    match content {
        Some((session, prompt)) => {
            if let Some(s) = session {
                params["sessionId"] = s;
            }
            if let Some(p) = prompt {
                params["prompt"] = p;
            }
        }
        None => params["truncated"] = Value::Bool(true),
    }
    json_line(&json!({ "jsonrpc": "2.0", "method": METHOD_PROMPTED, "params": params }))
}

/// The [`METHOD_TURN_ENDED`] line for the agent's `answer` (its line) to
/// the prompt `id` (its JSON text) `by` sent.
pub fn turn_ended_line(answer: &[u8], id: &[u8], by: &Device) -> Vec<u8> {
    let mut params = json!({ "id": id_value(id), "by": by });
    if let Ok(v) = serde_json::from_slice::<Value>(answer) {
        if let Some(r) = v.pointer("/result/stopReason") {
            params["stopReason"] = r.clone();
        }
        if let Some(m) = v.pointer("/error/message") {
            params["error"] = m.clone();
        }
    }
    json_line(&json!({ "jsonrpc": "2.0", "method": METHOD_TURN_ENDED, "params": params }))
}

/// Another device joined the session: the others are told who (`device`,
/// `role`, `seat`, and `guest` for a share's guest), so a page lists who is
/// watching at once rather than at its next listing.
pub const METHOD_JOINED: &str = "_thunderbolt/joined";

/// The [`METHOD_JOINED`] line for `who`.
pub fn joined_line(who: &Attached) -> Vec<u8> {
    json_line(&json!({ "jsonrpc": "2.0", "method": METHOD_JOINED, "params": who }))
}

/// A device left the session for good (it closed, was kicked or revoked,
/// or stayed away past its grace): the others are told who (`node`, `name`),
/// its `seat` and the `reason`, so a page drops it from who is watching at
/// once rather than at its next listing.
pub const METHOD_LEFT: &str = "_thunderbolt/left";

/// The [`METHOD_LEFT`] line for `device`, which sat at `seat`.
pub fn left_line(device: &Device, seat: &str, reason: &str) -> Vec<u8> {
    let mut params = serde_json::to_value(device).unwrap_or_default();
    params["seat"] = seat.into();
    params["reason"] = reason.into();
    json_line(&json!({ "jsonrpc": "2.0", "method": METHOD_LEFT, "params": params }))
}

/// The JSON-RPC error code of a request whose id is another device's
/// request in flight on the same session (a server error).
pub const ID_IN_USE_CODE: i64 = -32004;

/// The error a controller's request is answered with when another device of
/// the session has a request with the same `id` (its JSON text) in flight:
/// the agent's answers could not be told apart.
pub fn id_in_use(id: &[u8]) -> Vec<u8> {
    json_line(&json!({
        "jsonrpc": "2.0",
        "id": id_value(id),
        "error": {
            "code": ID_IN_USE_CODE,
            "message": "another device of this session has a request with this id in flight: send it with another id",
        },
    }))
}

/// What a [`METHOD_ROLE`], [`METHOD_ANSWERED`] or [`METHOD_MISSED`] line
/// says, for clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    Role { role: Role, controller: Device },
    Answered { id: Value, by: Device },
    Missed { frames: u64, bytes: u64 },
    Prompted { id: Value, by: Device },
    TurnEnded { id: Value, by: Device, stop_reason: Option<String> },
}

/// Reads a line as one of the bridge's notifications about devices (cheap
/// for every other line: it looks for the method's name first).
pub fn notice(line: &[u8]) -> Option<Notice> {
    memchr::memmem::find(line, b"\"_thunderbolt/")?;
    let v: Value = serde_json::from_slice(line).ok()?;
    let params = v.get("params")?;
    match v.get("method")?.as_str()? {
        METHOD_ROLE => Some(Notice::Role {
            role: Role::parse(params.get("role")?.as_str()?)?,
            controller: serde_json::from_value(params.get("controller")?.clone()).ok()?,
        }),
        METHOD_ANSWERED => Some(Notice::Answered {
            id: params.get("id")?.clone(),
            by: serde_json::from_value(params.get("by")?.clone()).ok()?,
        }),
        METHOD_MISSED => Some(Notice::Missed {
            frames: params.get("frames")?.as_u64()?,
            bytes: params.get("bytes")?.as_u64()?,
        }),
        METHOD_PROMPTED => Some(Notice::Prompted {
            id: params.get("id")?.clone(),
            by: serde_json::from_value(params.get("by")?.clone()).ok()?,
        }),
        METHOD_TURN_ENDED => Some(Notice::TurnEnded {
            id: params.get("id")?.clone(),
            by: serde_json::from_value(params.get("by")?.clone()).ok()?,
            stop_reason: params.get("stopReason").and_then(Value::as_str).map(str::to_string),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_has_its_own_error_code() {
        // A client tells an observer's refusal, an id in use and a scope's apart by the code.
        let codes = [OBSERVER_REFUSED_CODE, ID_IN_USE_CODE, SCOPE_REFUSED_CODE];
        let distinct: std::collections::HashSet<_> = codes.iter().collect();
        assert_eq!(distinct.len(), codes.len(), "{codes:?}");
    }

    #[test]
    fn notices_read_back() {
        let d = Device { node: "abc".into(), name: Some("phone".into()) };
        let l = role_line(Role::Observer, &d);
        assert_eq!(notice(&l), Some(Notice::Role { role: Role::Observer, controller: d.clone() }));
        let a = answered_line(b"7", &d);
        assert_eq!(notice(&a), Some(Notice::Answered { id: json!(7), by: d.clone() }));
        let r = observer_refused(b"\"x\"", &d);
        let v: Value = serde_json::from_slice(&r).unwrap();
        assert_eq!(v["id"], "x");
        assert_eq!(v["error"]["code"], OBSERVER_REFUSED_CODE);
        assert!(v["error"]["message"].as_str().unwrap().contains("observer"));
        assert_eq!(notice(b"{\"jsonrpc\":\"2.0\",\"method\":\"x\"}"), None);
    }
    #[test]
    fn a_prompt_and_its_end_are_told_with_what_was_asked_and_how_it_ended() {
        let d = Device { node: "abc".into(), name: Some("laptop".into()) };
        let req = br#"{"jsonrpc":"2.0","id":0,"method":"session/prompt","params":{"sessionId":"s-1","prompt":[{"type":"text","text":"hi"}]}}"#;
        let l = prompted_line(req, b"0", &d);
        assert_eq!(notice(&l), Some(Notice::Prompted { id: json!(0), by: d.clone() }));
        let v: Value = serde_json::from_slice(&l).unwrap();
        assert_eq!(v["params"]["prompt"][0]["text"], "hi");
        assert_eq!(v["params"]["sessionId"], "s-1");
        // A long prompt is told without its content.
        let big = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{{"sessionId":"s-1","prompt":[{{"type":"text","text":"{}"}}]}}}}"#,
            "x".repeat(PROMPT_TOLD_MAX)
        );
        let v: Value = serde_json::from_slice(&prompted_line(big.as_bytes(), b"1", &d)).unwrap();
        assert_eq!(v["params"]["truncated"], true);
        assert!(v["params"].get("prompt").is_none() && v.to_string().len() < 300, "{v}");

        let ok = br#"{"jsonrpc":"2.0","id":0,"result":{"stopReason":"end_turn"}}"#;
        let l = turn_ended_line(ok, b"0", &d);
        assert_eq!(
            notice(&l),
            Some(Notice::TurnEnded { id: json!(0), by: d.clone(), stop_reason: Some("end_turn".into()) })
        );
        let err = br#"{"jsonrpc":"2.0","id":0,"error":{"code":-32000,"message":"boom"}}"#;
        let v: Value = serde_json::from_slice(&turn_ended_line(err, b"0", &d)).unwrap();
        assert_eq!(v["params"]["error"], "boom");
        assert!(v["params"].get("stopReason").is_none());
    }
}
