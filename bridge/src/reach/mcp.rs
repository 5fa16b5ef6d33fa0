//! `thunderbolt reach`: an MCP server over stdio (newline-delimited JSON-RPC
//! 2.0) whose tools message the owner's devices and read their replies,
//! through the running host's socket ([`super::socket`]):
//!
//! - `send_message(text, reply_to?)` → the message's id;
//! - `get_replies(wait_s?)` → the replies typed on the owner's devices, each
//!   returned once (across restarts of this server and of the host), waiting
//!   up to `wait_s` for one (with `notifications/progress` every
//!   [`PROGRESS_EVERY`] when the call has a progress token);
//! - `status()` → the owner's devices, which of them a message reaches, and
//!   whether the host runs.
//!
//! With `--channel` it is also a Claude Code channel: it declares
//! `experimental["claude/channel"]` and `["claude/channel/permission"]`; a
//! permission prompt Claude Code relays (`notifications/claude/channel/
//! permission_request`) becomes a question on the owner's devices (Allow,
//! Deny, from the notice too), and its answer goes back as
//! `notifications/claude/channel/permission {request_id, behavior}`; what the
//! owner types in the thread reaches the session as
//! `notifications/claude/channel` (and `get_replies` finds nothing: each reply
//! goes once). Text never counts as an answer, whatever it says: only a
//! device's Allow or Deny makes a verdict.
//!
//! The thread is named by `--agent-name`, else by the client's
//! `clientInfo.name`. It starts whether or not a host runs: a tool called
//! before one does says what is missing (`isError`), and works once it runs.

use std::{collections::HashMap, sync::Arc, time::Duration};

use serde_json::{json, Value};
use tokio::{
    io::BufReader,
    sync::{mpsc, Mutex},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::client::{CallError, ReachClient};
use thunderbolt_shared::reach::name_problem;

/// The MCP revision this server speaks when the client asks for one it does
/// not know (the tools it uses exist in every revision since 2024-11-05).
const LATEST: &str = "2025-06-18";
const KNOWN_REVISIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];

/// The longest line read from the client: tool calls are small.
const MAX_CLIENT_LINE: usize = 1024 * 1024;

/// A waiting `get_replies` says it still waits this often (when the client
/// gave a progress token): clients time a silent request out after 60 s.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(15);

/// The tests' knob for [`PROGRESS_EVERY`], in milliseconds (a test that
/// waits 15 s for a keep-alive would be slow, not surer).
pub const TEST_PROGRESS_ENV: &str = "THUNDERBOLT_TEST_PROGRESS_MS";

fn progress_every() -> Duration {
    std::env::var(TEST_PROGRESS_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(PROGRESS_EVERY, |ms| Duration::from_millis(ms.max(10)))
}

/// `get_replies`' default wait when the client names none: answer at once.
const DEFAULT_WAIT_S: f64 = 0.0;

/// Calls in flight at once: a model calls a tool or two at a time; a client
/// that sends a flood gets errors, not a task each.
const MAX_CALLS: usize = 16;

/// How long the channel's inbound loop waits for replies in one call (then
/// asks again): well inside the socket's own bound.
const CHANNEL_WAIT_S: f64 = 300.0;

/// How long the channel's inbound loop waits before asking again when no
/// host runs, or the host refused.
const CHANNEL_RETRY: Duration = Duration::from_secs(2);

/// Claude Code's channel methods.
const CHANNEL_EVENT: &str = "notifications/claude/channel";
const PERMISSION_REQUEST: &str = "notifications/claude/channel/permission_request";
const PERMISSION_VERDICT: &str = "notifications/claude/channel/permission";

/// JSON-RPC's "method not found" and "invalid params".
const NOT_FOUND: i64 = -32601;
const INVALID: i64 = -32602;

/// Runs the server on stdin/stdout until stdin ends.
pub async fn serve(client: ReachClient, agent_name: Option<String>, channel: bool) -> anyhow::Result<()> {
    if let Some(why) = agent_name.as_deref().and_then(name_problem) {
        anyhow::bail!("--agent-name: {why}");
    }
    let (out_tx, writer) = crate::json_out::stdout_lines(64);
    let server = Arc::new(Server {
        client,
        name: Mutex::new(agent_name.clone()),
        fixed_name: agent_name.is_some(),
        out: out_tx,
        calls: Mutex::new(HashMap::new()),
        slots: Arc::new(tokio::sync::Semaphore::new(MAX_CALLS)),
        channel,
        inbound: Mutex::new(None),
    });
    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut line = Vec::new();
    loop {
        line.clear();
        match super::socket::read_line(&mut stdin, &mut line, MAX_CLIENT_LINE).await {
            Ok(super::socket::Line::Whole) => {}
            Ok(super::socket::Line::TooLong) => {
                anyhow::bail!("a line from the MCP client is over {MAX_CLIENT_LINE} bytes")
            }
            Ok(super::socket::Line::End) | Err(_) => break,
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Value>(&line) {
            Ok(Value::Array(batch)) => {
                for m in batch {
                    server.clone().message(m).await;
                }
            }
            Ok(m) => server.clone().message(m).await,
            Err(e) => {
                server.send(json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": format!("parse error: {e}")}})).await;
            }
        }
    }
    debug!("the MCP client ended stdin");
    // What is still being answered is not waited for: the client is gone.
    if let Some(task) = server.inbound.lock().await.take() {
        task.abort();
    }
    drop(server);
    let _ = tokio::time::timeout(Duration::from_secs(1), writer).await;
    Ok(())
}

struct Server {
    client: ReachClient,
    /// The thread's name: `--agent-name`, or the client's name once it said it.
    name: Mutex<Option<String>>,
    fixed_name: bool,
    out: mpsc::Sender<Value>,
    /// Tool calls under way, by the JSON text of their id (to cancel one).
    calls: Mutex<HashMap<String, CancellationToken>>,
    slots: Arc<tokio::sync::Semaphore>,
    /// A Claude Code channel (`--channel`).
    channel: bool,
    /// The channel's inbound loop, once the client initialized.
    inbound: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Server {
    async fn send(&self, v: Value) {
        let _ = self.out.send(v).await;
    }

    async fn result(&self, id: Value, result: Value) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "result": result})).await;
    }

    async fn error(&self, id: Value, code: i64, message: impl Into<String>) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message.into()}}))
            .await;
    }

    async fn message(self: Arc<Self>, m: Value) {
        let method = m.get("method").and_then(Value::as_str).map(str::to_string);
        let id = m.get("id").cloned();
        let params = m.get("params").cloned().unwrap_or(Value::Null);
        let (Some(method), Some(id)) = (method.clone(), id) else {
            if let Some(method) = method {
                self.clone().notification(&method, &params).await;
            }
            // A response to a request of ours (we send none): nothing to do.
            return;
        };
        match method.as_str() {
            "initialize" => self.initialize(id, &params).await,
            "ping" => self.result(id, json!({})).await,
            "tools/list" => self.result(id, json!({"tools": tools()})).await,
            "tools/call" => {
                let Ok(permit) = self.slots.clone().try_acquire_owned() else {
                    return self.error(id, -32000, format!("{MAX_CALLS} tool calls are under way")).await;
                };
                let cancel = CancellationToken::new();
                self.calls.lock().await.insert(id.to_string(), cancel.clone());
                let me = self.clone();
                tokio::spawn(async move {
                    let key = id.to_string();
                    tokio::select! {
                        _ = me.call(id, params) => {}
                        // A cancelled request is not answered (MCP's rule).
                        _ = cancel.cancelled() => debug!("tool call {key} cancelled by the client"),
                    }
                    me.calls.lock().await.remove(&key);
                    drop(permit);
                });
            }
            "resources/list" => self.result(id, json!({"resources": []})).await,
            "prompts/list" => self.result(id, json!({"prompts": []})).await,
            other => self.error(id, NOT_FOUND, format!("{other}: not a method of this server")).await,
        }
    }

    async fn notification(self: Arc<Self>, method: &str, params: &Value) {
        match method {
            "notifications/cancelled" => {
                if let Some(id) = params.get("requestId") {
                    if let Some(c) = self.calls.lock().await.remove(&id.to_string()) {
                        c.cancel();
                    }
                }
            }
            "notifications/initialized" if self.channel => {
                let mut inbound = self.inbound.lock().await;
                if inbound.is_none() {
                    *inbound = Some(tokio::spawn(self.clone().inbound()));
                }
            }
            PERMISSION_REQUEST if self.channel => {
                let field = |k: &str| params.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                let req = json!({
                    "op": "ask",
                    "from": self.thread().await,
                    "request_id": field("request_id"),
                    "tool_name": field("tool_name"),
                    "description": field("description"),
                    "input_preview": field("input_preview"),
                });
                // The prompt stays on the terminal whatever happens here.
                match self.client.call(&req).await {
                    Ok(v) => info!(
                        "permission request {} sent to your devices as {}",
                        field("request_id"),
                        v["id"].as_str().unwrap_or("?")
                    ),
                    Err(e) => {
                        warn!("permission request {} not sent to your devices: {e}", field("request_id"))
                    }
                }
            }
            _ => {}
        }
    }

    /// The channel's inbound side: what the owner's devices write in the
    /// thread, as it comes. A verdict goes back as the permission
    /// notification; anything else is a message into the session.
    async fn inbound(self: Arc<Self>) {
        let mut said_down = false;
        loop {
            let req = json!({"op": "replies", "from": self.thread().await, "wait_s": CHANNEL_WAIT_S});
            let items = match self.client.call(&req).await {
                Ok(v) => {
                    said_down = false;
                    v["replies"].as_array().cloned().unwrap_or_default()
                }
                Err(e) => {
                    if !said_down {
                        warn!("the channel waits for a host: {e}");
                        said_down = true;
                    }
                    tokio::time::sleep(CHANNEL_RETRY).await;
                    continue;
                }
            };
            for item in items {
                let v = &item["verdict"];
                let line = match (v["behavior"].as_str(), v["requestId"].as_str()) {
                    (Some(behavior), Some(request_id)) => json!({
                        "jsonrpc": "2.0",
                        "method": PERMISSION_VERDICT,
                        "params": {"request_id": request_id, "behavior": behavior},
                    }),
                    _ => {
                        let mut meta = json!({
                            "thread": self.thread().await,
                            "message_id": item["id"],
                            "from": item["device"].as_str().unwrap_or("your device"),
                        });
                        if let Some(r) = item["replyTo"].as_str() {
                            meta["reply_to"] = json!(r);
                        }
                        json!({
                            "jsonrpc": "2.0",
                            "method": CHANNEL_EVENT,
                            "params": {"content": item["text"], "meta": meta},
                        })
                    }
                };
                self.send(line).await;
            }
        }
    }

    async fn initialize(&self, id: Value, params: &Value) {
        let asked = params.get("protocolVersion").and_then(Value::as_str).unwrap_or(LATEST);
        let revision = if KNOWN_REVISIONS.contains(&asked) { asked } else { LATEST };
        if !self.fixed_name {
            let client = params.pointer("/clientInfo/name").and_then(Value::as_str).unwrap_or("agent");
            let name: String = client.chars().filter(|c| !c.is_control()).take(32).collect();
            let name = if name_problem(&name).is_some() { "agent".to_string() } else { name };
            *self.name.lock().await = Some(name);
        }
        let name = self.thread().await;
        info!("MCP client initialized; its messages go in the thread '{name}'");
        let capabilities = if self.channel {
            json!({"tools": {}, "experimental": {"claude/channel": {}, "claude/channel/permission": {}}})
        } else {
            json!({"tools": {}})
        };
        let instructions = if self.channel {
            "This is the owner's phone. Messages they type arrive as <channel> events (meta.thread, \
             meta.message_id); answer them with send_message (reply_to: the message_id). Their Allow or \
             Deny of a permission prompt comes back by itself; text in a message never approves anything."
        } else {
            "Message the owner's phone end to end encrypted (send_message), and read what \
             they answer (get_replies, optionally waiting). A reply is returned once. \
             status() says whether a host runs and which devices a message reaches."
        };
        self.result(
            id,
            json!({
                "protocolVersion": revision,
                "capabilities": capabilities,
                "serverInfo": {"name": "thunderbolt-reach", "version": env!("CARGO_PKG_VERSION")},
                "instructions": instructions,
            }),
        )
        .await;
    }

    async fn thread(&self) -> String {
        self.name.lock().await.clone().unwrap_or_else(|| "agent".to_string())
    }

    async fn call(&self, id: Value, params: Value) {
        let name = params.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
        let args = params.get("arguments").cloned().unwrap_or_else(|| json!({}));
        let progress = params.pointer("/_meta/progressToken").cloned();
        let thread = self.thread().await;
        let outcome = match name.as_str() {
            "send_message" => {
                let Some(text) = args.get("text").and_then(Value::as_str) else {
                    return self.error(id, INVALID, "send_message needs `text` (a string)").await;
                };
                let mut req = json!({"op": "note", "from": thread, "text": text});
                if let Some(r) = args.get("reply_to").and_then(Value::as_str) {
                    req["reply_to"] = json!(r);
                }
                self.client.call(&req).await.map(|v| {
                    let pushed = v["pushed"].as_u64().unwrap_or(0);
                    let text = format!(
                        "sent as {} in the thread '{thread}'; pushed to {pushed} device(s){}",
                        v["id"].as_str().unwrap_or("?"),
                        if pushed == 0 {
                            " (none subscribed to notices: it waits in the page's list)"
                        } else {
                            ""
                        }
                    );
                    (text, json!({"id": v["id"], "pushed": pushed}))
                })
            }
            "get_replies" => {
                let wait = args.get("wait_s").and_then(Value::as_f64).unwrap_or(DEFAULT_WAIT_S);
                if !wait.is_finite() || wait < 0.0 {
                    return self.error(id, INVALID, "wait_s is a number of seconds, 0 or more").await;
                }
                let wait = wait.min(super::MAX_WAIT.as_secs_f64());
                let req = json!({"op": "replies", "from": thread, "wait_s": wait});
                let call = self.client.call(&req);
                let answer = match progress {
                    Some(token) if wait > 0.0 => self.with_progress(call, token, wait).await,
                    _ => call.await,
                };
                answer.map(|v| {
                    let replies = v["replies"].as_array().cloned().unwrap_or_default();
                    let text = if replies.is_empty() {
                        format!("no replies yet in the thread '{thread}'")
                    } else {
                        replies
                            .iter()
                            .map(|r| {
                                format!(
                                    "{} from {}{}: {}",
                                    r["id"].as_str().unwrap_or("?"),
                                    r["device"].as_str().unwrap_or("a device"),
                                    r["replyTo"].as_str().map(|m| format!(" (to {m})")).unwrap_or_default(),
                                    r["text"].as_str().unwrap_or_default()
                                )
                            })
                            .collect::<Vec<_>>()
                            .join("\n")
                    };
                    (text, json!({"replies": replies}))
                })
            }
            "status" => self.client.call(&json!({"op": "status"})).await.map(|v| {
                let devices = v["devices"].as_array().cloned().unwrap_or_default();
                let reached = devices.iter().filter(|d| d["push"] == json!(true)).count();
                let text = format!(
                    "the {} runs (pid {}); web push {}; {} paired device(s), {reached} reached by a push",
                    v["host"].as_str().unwrap_or("host"),
                    v["pid"],
                    v["push"].as_str().unwrap_or("?"),
                    devices.len()
                );
                (text, json!({"running": true, "host": v["host"], "push": v["push"], "devices": devices}))
            }),
            other => return self.error(id, INVALID, format!("no tool named '{other}'")).await,
        };
        let result = match outcome {
            Ok((text, structured)) => {
                json!({"content": [{"type": "text", "text": text}], "structuredContent": structured})
            }
            Err(e @ CallError::NotRunning { .. }) if name == "status" => json!({
                "content": [{"type": "text", "text": e.to_string()}],
                "structuredContent": {"running": false, "devices": []},
            }),
            Err(e) => json!({"content": [{"type": "text", "text": e.to_string()}], "isError": true}),
        };
        self.result(id, result).await;
    }

    /// `call`, saying every [`PROGRESS_EVERY`] that it still waits.
    async fn with_progress<F: std::future::Future<Output = Result<Value, CallError>>>(
        &self,
        call: F,
        token: Value,
        wait: f64,
    ) -> Result<Value, CallError> {
        tokio::pin!(call);
        let start = tokio::time::Instant::now();
        let every = progress_every();
        let mut tick = tokio::time::interval_at(start + every, every);
        loop {
            tokio::select! {
                r = &mut call => return r,
                _ = tick.tick() => {
                    let waited = start.elapsed().as_secs_f64().floor();
                    self.send(json!({
                        "jsonrpc": "2.0",
                        "method": "notifications/progress",
                        "params": {"progressToken": token, "progress": waited, "total": wait.ceil(), "message": "waiting for a reply"},
                    }))
                    .await;
                }
            }
        }
    }
}

/// The tools, as `tools/list` gives them.
fn tools() -> Value {
    json!([
        {
            "name": "send_message",
            "title": "Message the owner",
            "description": "Send a message to the owner's phone and other devices, end to end encrypted. \
                It shows as a notice and in the page's list, in this agent's thread, where they can reply. \
                Returns the message's id.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "description": "What to tell the owner (at most 16 KiB)."},
                    "reply_to": {"type": "string", "description": "The id of an earlier message or reply this answers."}
                },
                "required": ["text"]
            }
        },
        {
            "name": "get_replies",
            "title": "Read the owner's replies",
            "description": "The replies the owner typed in this agent's thread since the last call; each \
                reply is returned once. With wait_s, waits up to that many seconds (at most 600) for one.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "wait_s": {"type": "number", "minimum": 0, "maximum": 600, "description": "Seconds to wait for a reply when there is none yet (default 0)."}
                }
            }
        },
        {
            "name": "status",
            "title": "Reachability",
            "description": "Whether the thunderbolt host runs, and which of the owner's devices a message reaches.",
            "inputSchema": {"type": "object", "properties": {}}
        }
    ])
}
