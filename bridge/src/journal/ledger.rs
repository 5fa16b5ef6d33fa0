//! What a session's client opened on its agent, as far as taking the session
//! back after a restart needs it: the client's `initialize` parameters, every
//! ACP session it created, loaded or resumed (id, `cwd`, `mcpServers`), and its
//! requests still waiting for an answer.
//!
//! One fold for both uses: the live session applies each run of lines as it
//! passes (client runs into the agent, agent runs out of it), and a restart
//! applies the journal's records in the same order, so both reach the same
//! ledger.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thunderbolt_shared::{jsonrpc, ndjson};

/// ACP sessions one bridge session remembers: a client opens a handful; a
/// client that opens thousands keeps its newest.
pub const MAX_ACP_SESSIONS: usize = 64;

/// Longest `initialize` or `session/*` line kept for a restart: real ones are
/// a few hundred bytes (a client's capabilities, an MCP server list); a
/// longer one is not kept (a hostile device cannot make the journal hold it).
pub const MAX_CALL_LINE: usize = 64 * 1024;

/// Requests in flight remembered (the same bound as the session's own record
/// of them, [`crate::serve::requests::MAX_TRACKED_REQUESTS`]).
pub const MAX_PENDING: usize = crate::serve::requests::MAX_TRACKED_REQUESTS;

/// The client's methods a restart replays or takes sessions back from.
const KEPT_METHODS: [&[u8]; 4] =
    [b"\"initialize\"", b"\"session/new\"", b"\"session/load\"", b"\"session/resume\""];

/// One ACP session the client opened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AcpSession {
    #[serde(rename = "sessionId")]
    pub id: Value,
    #[serde(default)]
    pub cwd: Value,
    #[serde(rename = "mcpServers", default)]
    pub mcp_servers: Value,
}

/// What the client opened on its agent.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Ledger {
    /// The client's `initialize` params (the last one it sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<Value>,
    /// The ACP sessions, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<AcpSession>,
    /// `session/new|load|resume` calls waiting for the agent's answer, by
    /// the request's id (raw JSON).
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    calls: HashMap<String, Call>,
}

/// A `session/*` call waiting for its answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Call {
    method: String,
    params: Value,
}

/// What a run of the client's lines holds for the journal: its requests' ids
/// and the lines a restart needs in full.
#[derive(Debug, Default)]
pub struct ClientLines {
    pub requests: Vec<Value>,
    pub calls: Vec<Value>,
}

impl ClientLines {
    /// Reads a run of the client's whole lines. Only a request's head is
    /// read, except for the few methods kept whole. `names_an_id` is
    /// [`jsonrpc::names_an_id`] of the run: the bridge searches each of the
    /// client's runs once, for everything that needs to know.
    pub fn of(run: &[u8], names_an_id: bool) -> Self {
        let mut out = Self::default();
        // A run with no `"id"` in it (notifications, lines that are no
        // JSON-RPC) holds no request.
        if !names_an_id {
            return out;
        }
        for line in ndjson::lines(run) {
            let Some((id, method)) = jsonrpc::request_head(line) else { continue };
            if let Ok(id) = serde_json::from_slice::<Value>(id) {
                out.requests.push(id);
            }
            if line.len() <= MAX_CALL_LINE && KEPT_METHODS.contains(&method) {
                if let Ok(v) = serde_json::from_slice::<Value>(line) {
                    out.calls.push(v);
                }
            }
        }
        out
    }
}

impl Ledger {
    /// The client's calls (whole lines, parsed) on their way to the agent.
    pub fn client_calls(&mut self, calls: &[Value]) {
        for call in calls {
            let (Some(method), Some(id)) = (call["method"].as_str(), call.get("id")) else { continue };
            let params = call.get("params").cloned().unwrap_or(Value::Null);
            if method == "initialize" {
                self.init = Some(params);
                continue;
            }
            if self.calls.len() < MAX_ACP_SESSIONS {
                self.calls.insert(id.to_string(), Call { method: method.into(), params });
            }
        }
    }

    /// Whether an agent run needs reading (a call waits for its answer).
    pub fn waiting(&self) -> bool {
        !self.calls.is_empty()
    }

    /// A run of the agent's lines: the answers to the calls waiting.
    pub fn agent_run(&mut self, run: &[u8]) {
        if self.calls.is_empty() {
            return;
        }
        for line in ndjson::lines(run) {
            self.agent_line(line);
        }
    }

    /// One of the agent's lines: whether it answered a call waiting (then
    /// it is worth keeping: it may name a session).
    pub fn agent_line(&mut self, line: &[u8]) -> bool {
        if self.calls.is_empty() {
            return false;
        }
        let Some(key) = response_key(line) else { return false };
        let Some(call) = self.calls.remove(&key) else { return false };
        let Ok(answer) = serde_json::from_slice::<Value>(line) else { return true };
        let Some(result) = answer.get("result") else { return true };
        let id = match call.method.as_str() {
            "session/new" => result.get("sessionId").cloned(),
            _ => call.params.get("sessionId").cloned(),
        };
        if let Some(id) = id.filter(|i| i.is_string()) {
            self.opened(AcpSession {
                id,
                cwd: call.params.get("cwd").cloned().unwrap_or(Value::Null),
                mcp_servers: call.params.get("mcpServers").cloned().unwrap_or(Value::Array(Vec::new())),
            });
        }
        true
    }

    fn opened(&mut self, s: AcpSession) {
        self.sessions.retain(|o| o.id != s.id);
        if self.sessions.len() >= MAX_ACP_SESSIONS {
            self.sessions.remove(0);
        }
        self.sessions.push(s);
    }
}

/// The client's requests still waiting for an answer, as a restart's fold
/// finds them (raw JSON ids).
#[derive(Debug, Clone, Default)]
pub struct Pending(pub BTreeSet<String>);

impl Pending {
    pub fn sent(&mut self, ids: &[Value]) {
        for id in ids {
            if self.0.len() < MAX_PENDING {
                self.0.insert(id.to_string());
            }
        }
    }

    /// The ids, as JSON values (a snapshot's, the aborted answers').
    pub fn ids(&self) -> Vec<Value> {
        self.0.iter().filter_map(|id| serde_json::from_str(id).ok()).collect()
    }

    /// Crosses off the requests an agent run answers.
    pub fn answered(&mut self, run: &[u8]) {
        if self.0.is_empty() {
            return;
        }
        for line in ndjson::lines(run) {
            self.answered_line(line);
        }
    }

    /// Crosses off the request one of the agent's lines answers; its id when it did.
    pub fn answered_line(&mut self, line: &[u8]) -> Option<Value> {
        if self.0.is_empty() {
            return None;
        }
        let key = response_key(line)?;
        self.0.remove(&key).then(|| serde_json::from_str(&key).ok()).flatten()
    }

    /// Crosses off requests by id.
    pub fn answered_ids(&mut self, ids: &[Value]) {
        for id in ids {
            self.0.remove(&id.to_string());
        }
    }
}

/// A response's id in one canonical form (`"a"`, `7`), as ids are kept.
fn response_key(line: &[u8]) -> Option<String> {
    let id = jsonrpc::response_id(line)?;
    let v: Value = serde_json::from_str(std::str::from_utf8(id).ok()?).ok()?;
    Some(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_follows_what_the_client_opened() {
        let client = b"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n\
            {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"session/new\",\"params\":{\"cwd\":\"/w\",\"mcpServers\":[]}}\n\
            {\"jsonrpc\":\"2.0\",\"id\":\"l\",\"method\":\"session/load\",\"params\":{\"sessionId\":\"old\",\"cwd\":\"/o\",\"mcpServers\":[]}}\n\
            {\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"session/prompt\",\"params\":{\"sessionId\":\"s1\"}}\n";
        let lines = ClientLines::of(client, jsonrpc::names_an_id(client));
        assert_eq!(lines.requests.len(), 4);
        assert_eq!(lines.calls.len(), 3, "the prompt is not kept whole");
        let mut l = Ledger::default();
        l.client_calls(&lines.calls);
        assert_eq!(l.init.as_ref().unwrap()["protocolVersion"], 1);
        assert!(l.waiting());
        l.agent_run(
            b"{\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{}}\n\
            {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"sessionId\":\"s1\"}}\n\
            {\"jsonrpc\":\"2.0\",\"id\":\"l\",\"error\":{\"code\":-32002,\"message\":\"gone\"}}\n",
        );
        assert!(!l.waiting());
        assert_eq!(l.sessions.len(), 1, "a failed load opened nothing");
        assert_eq!(l.sessions[0].id, "s1");
        assert_eq!(l.sessions[0].cwd, "/w");
        let mut p = Pending::default();
        p.sent(&lines.requests);
        p.answered(
            b"{\"jsonrpc\":\"2.0\",\"id\":0,\"result\":{}}\n{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n",
        );
        assert_eq!(p.0.iter().map(String::as_str).collect::<Vec<_>>(), ["\"l\"", "2"]);
    }

    #[test]
    fn a_long_call_line_is_not_kept() {
        let pad = "x".repeat(MAX_CALL_LINE);
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{{\"p\":\"{pad}\"}}}}\n"
        );
        let lines = ClientLines::of(line.as_bytes(), jsonrpc::names_an_id(line.as_bytes()));
        assert_eq!(lines.requests.len(), 1);
        assert!(lines.calls.is_empty());
    }
}
