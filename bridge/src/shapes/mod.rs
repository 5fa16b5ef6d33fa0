//! Agents of other shapes, served as ACP: a contract program started for
//! each turn (`capture` in a manifest) or a webhook on this machine
//! (`webhook`), both speaking the capture contract ([`contract`]).
//!
//! The host runs `thunderbolt adapt capture|webhook …` as the agent's
//! command: a stdio ACP agent like any other, so every client (the CLI, the
//! page, the app's shipped client) and everything the bridge does for an
//! agent (resume, journal, files, notices) serves these too. It answers
//! `initialize`, `session/new` and `session/load` itself (a session id is
//! any the client names: the same one after a host restart); each
//! `session/prompt` becomes one capture, its replies `agent_message_chunk`s,
//! its `done` the `end_turn`; a failure or a turn past its timeout is an
//! error the client reads in words; `session/cancel` stops the turn.

pub mod capture;
pub mod contract;
pub mod relay;
pub mod webhook;

use std::{collections::HashMap, ffi::OsString, sync::Arc, time::Duration};

use anyhow::Result;
use serde_json::{json, Value};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    sync::{mpsc, Mutex},
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use contract::Part;

/// A relay turn fails after this long without a word from its service (the
/// relay contract's rule: a task may run for hours if something comes).
pub const RELAY_SILENCE: Duration = Duration::from_secs(300);

/// A turn's default bound (a manifest's `turn_timeout`).
pub const DEFAULT_TURN_TIMEOUT: Duration = Duration::from_secs(300);

/// The most files one prompt hands over (inline images): a few photos.
const MAX_PARTS_BYTES: usize = 32 * 1024 * 1024;

/// What serves the turns.
#[derive(Debug, Clone)]
pub enum Shape {
    /// A program run for each turn (argv, its program resolved).
    Capture(Vec<OsString>),
    /// A POST to a loopback URL for each turn.
    Webhook(url::Url),
    /// A relay-contract service (v1): a POST per turn, the reply on the host's reach socket.
    Relay(url::Url),
}

/// What a turn says as it goes.
#[derive(Debug, Clone)]
pub enum Update {
    Text(String),
    /// A tool card: the relay contract's `turn.tool` (its `id`, `kind`,
    /// `title`, `input`, then `output`).
    Tool(Value),
}

/// How one turn ended.
#[derive(Debug)]
pub enum TurnEnd {
    Done,
    Cancelled,
    /// In words, for the client.
    Failed(String),
}

/// Serves ACP on stdin/stdout for agent `name` until stdin ends.
/// `commands`: a relay agent's, shown to clients as ACP's
/// `available_commands_update` when a session starts or loads.
pub async fn serve(shape: Shape, name: String, timeout: Duration, commands: Option<Value>) -> Result<()> {
    let (out_tx, writer) = crate::json_out::stdout_lines(256);
    let agent = Arc::new(Adapter {
        shape,
        name,
        timeout,
        out: out_tx,
        turns: Mutex::new(HashMap::new()),
        cwds: std::sync::Mutex::new(HashMap::new()),
        tools: std::sync::Mutex::new(std::collections::HashSet::new()),
        commands: commands.map(acp_commands),
        notes: std::sync::OnceLock::new(),
    });
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.len() > thunderbolt_shared::ndjson::MAX_FRAME_LEN {
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
        agent.clone().message(v).await;
    }
    // stdin ended: every turn under way stops (its program with it).
    for (_, t) in agent.turns.lock().await.drain() {
        t.cancel();
    }
    drop(agent);
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    Ok(())
}

struct Adapter {
    shape: Shape,
    name: String,
    timeout: Duration,
    out: mpsc::Sender<Value>,
    /// The turn under way per session, to cancel it.
    turns: Mutex<HashMap<String, CancellationToken>>,
    /// Each session's working folder (a relay message says it).
    cwds: std::sync::Mutex<HashMap<String, String>>,
    /// Tool cards shown, by session and id (the first `turn.tool` of an id
    /// opens its card; later ones update it).
    tools: std::sync::Mutex<std::collections::HashSet<(String, String)>>,
    /// ACP's `availableCommands`, when the agent has any.
    commands: Option<Value>,
    /// A relay agent's notes between turns, shown in the sessions here.
    notes: std::sync::OnceLock<relay::NoteWatch>,
}

impl Adapter {
    async fn send(&self, v: Value) {
        let _ = self.out.send(v).await;
    }

    async fn message(self: Arc<Self>, m: Value) {
        let method = m.get("method").and_then(Value::as_str).unwrap_or_default().to_string();
        let params = m.get("params").cloned().unwrap_or(Value::Null);
        let Some(id) = m.get("id").cloned() else {
            if method == "session/cancel" {
                if let Some(s) = params.get("sessionId").and_then(Value::as_str) {
                    if let Some(t) = self.turns.lock().await.get(s) {
                        t.cancel();
                    }
                }
            }
            return;
        };
        let answer = {
            let id = id.clone();
            move |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result})
        };
        let error = {
            let id = id.clone();
            move |code: i64, msg: String| json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": msg}})
        };
        match method.as_str() {
            "initialize" => {
                let image = true;
                self.send(answer(json!({
                    "protocolVersion": 1,
                    "agentCapabilities": {"loadSession": true, "promptCapabilities": {"image": image}},
                    "agentInfo": {"name": self.name, "version": env!("CARGO_PKG_VERSION")},
                    "authMethods": [],
                })))
                .await
            }
            "session/new" => {
                let sid = format!("chat-{}", crate::ids::random_hex(8));
                if let Some(cwd) = params.get("cwd").and_then(Value::as_str) {
                    self.cwds.lock().unwrap_or_else(|p| p.into_inner()).insert(sid.clone(), cwd.to_string());
                }
                self.send(answer(json!({"sessionId": sid}))).await;
                self.started(&sid).await;
            }
            // A session id is the client's to keep: after a restart it loads the same one.
            "session/load" => {
                self.send(answer(Value::Null)).await;
                if let Some(sid) = params.get("sessionId").and_then(Value::as_str) {
                    self.started(sid).await;
                }
            }
            "session/prompt" => {
                let Some(sid) = params.get("sessionId").and_then(Value::as_str).map(str::to_string) else {
                    return self.send(error(-32602, "session/prompt needs a sessionId".into())).await;
                };
                let blocks = params.get("prompt").and_then(Value::as_array).cloned().unwrap_or_default();
                let cancel = CancellationToken::new();
                {
                    let mut turns = self.turns.lock().await;
                    if turns.contains_key(&sid) {
                        drop(turns);
                        return self
                            .send(error(-32000, "a turn is already under way in this session".into()))
                            .await;
                    }
                    turns.insert(sid.clone(), cancel.clone());
                }
                let me = self.clone();
                tokio::spawn(async move {
                    let end = me.turn(&sid, &blocks, cancel).await;
                    me.turns.lock().await.remove(&sid);
                    let v = match end {
                        TurnEnd::Done => answer(json!({"stopReason": "end_turn"})),
                        TurnEnd::Cancelled => answer(json!({"stopReason": "cancelled"})),
                        TurnEnd::Failed(why) => {
                            warn!("{why}");
                            error(-32000, why)
                        }
                    };
                    me.send(v).await;
                });
            }
            other => self.send(error(-32601, format!("{other}: not a method of this agent"))).await,
        }
    }

    /// One prompt as one capture.
    async fn turn(&self, sid: &str, blocks: &[Value], cancel: CancellationToken) -> TurnEnd {
        let (text, parts) = match prompt(blocks) {
            Ok(p) => p,
            Err(why) => return TurnEnd::Failed(why),
        };
        let cid = format!("c_{}", crate::ids::random_hex(8));
        info!("turn {cid} of session {sid}: {} bytes of text, {} file(s)", text.len(), parts.len());
        let (tx, mut rx) = mpsc::channel::<Update>(64);
        let cwd = self.cwds.lock().unwrap_or_else(|p| p.into_inner()).get(sid).cloned().unwrap_or_default();
        let run = async {
            match &self.shape {
                Shape::Capture(argv) => capture::run(argv, &cid, &self.name, &text, parts, tx).await,
                Shape::Webhook(url) => webhook::run(url, &cid, &self.name, &text, &parts, tx).await,
                Shape::Relay(url) => {
                    let turn = relay::Turn {
                        url,
                        agent: &self.name,
                        chat: sid,
                        text: &text,
                        parts: &parts,
                        cwd: &cwd,
                    };
                    relay::run(turn, self.timeout, tx).await
                }
            }
        };
        let forward = async {
            while let Some(u) = rx.recv().await {
                for update in self.acp_updates(sid, u) {
                    self.send(json!({
                        "jsonrpc": "2.0",
                        "method": "session/update",
                        "params": {"sessionId": sid, "update": update},
                    }))
                    .await;
                }
            }
        };
        let both = async { tokio::join!(run, forward).0 };
        // A relay turn's bound is its silence, which it keeps itself.
        let bound = if matches!(self.shape, Shape::Relay(_)) { Duration::MAX } else { self.timeout };
        tokio::select! {
            r = timeout_or_not(bound, both) => match r {
                Some(end) => end,
                None => TurnEnd::Failed(format!("{} did not finish its turn within {} s", self.name, self.timeout.as_secs())),
            },
            _ = cancel.cancelled() => TurnEnd::Cancelled,
        }
    }

    /// A session started or loaded: a relay agent's notes to its chat show
    /// here from now on, and the agent's commands are listed.
    async fn started(&self, sid: &str) {
        if matches!(self.shape, Shape::Relay(_)) {
            let notes =
                self.notes.get_or_init(|| relay::NoteWatch::start(self.name.clone(), self.out.clone()));
            notes.show(sid);
        }
        self.commands_for(sid).await;
    }

    /// The agent's commands, to a session that starts or loads.
    async fn commands_for(&self, sid: &str) {
        if let Some(list) = &self.commands {
            let update = json!({"sessionUpdate": "available_commands_update", "availableCommands": list});
            self.send(json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": update}}))
                .await;
        }
    }

    /// ACP's `session/update`s for one update of a turn.
    fn acp_updates(&self, sid: &str, u: Update) -> Vec<Value> {
        match u {
            Update::Text(t) => {
                vec![json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": t}})]
            }
            Update::Tool(t) => {
                let id = t
                    .get("id")
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                    .unwrap_or_default();
                let first = self
                    .tools
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert((sid.to_string(), id.clone()));
                let mut out = Vec::new();
                let title = t.get("title").and_then(Value::as_str).unwrap_or("tool");
                if first {
                    let mut card = json!({"sessionUpdate": "tool_call", "toolCallId": id, "title": title,
                                          "kind": acp_kind(t.get("kind").and_then(Value::as_str)), "status": "in_progress"});
                    if let Some(input) = t.get("input") {
                        card["rawInput"] = input.clone();
                    }
                    out.push(card);
                }
                if let Some(output) = t.get("output") {
                    let text = output.as_str().map_or_else(|| output.to_string(), str::to_string);
                    let mut update = json!({"sessionUpdate": "tool_call_update", "toolCallId": id, "status": "completed",
                                            "rawOutput": output, "content": [{"type": "content", "content": {"type": "text", "text": text}}]});
                    // Only a title the service gave: an update without one keeps the card's.
                    if let Some(title) = t.get("title").and_then(Value::as_str) {
                        update["title"] = json!(title);
                    }
                    out.push(update);
                }
                out
            }
        }
    }
}

/// A manifest's `commands` (`name`, `description`, `argHint`) as ACP's
/// available commands (`input.hint` for the argument).
fn acp_commands(list: Value) -> Value {
    let list = list.as_array().cloned().unwrap_or_default();
    Value::Array(
        list.iter()
            .map(|c| {
                let mut a = json!({"name": c["name"], "description": c["description"]});
                if let Some(h) = c.get("argHint") {
                    a["input"] = json!({"hint": h});
                }
                a
            })
            .collect(),
    )
}

/// ACP's tool kinds; anything else is `other`.
fn acp_kind(kind: Option<&str>) -> &'static str {
    const KINDS: [&str; 10] =
        ["read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"];
    KINDS.iter().copied().find(|k| Some(*k) == kind).unwrap_or("other")
}

/// `fut` within `bound`, or with none when the bound is `Duration::MAX`.
async fn timeout_or_not<F: std::future::Future>(bound: Duration, fut: F) -> Option<F::Output> {
    if bound == Duration::MAX {
        Some(fut.await)
    } else {
        tokio::time::timeout(bound, fut).await.ok()
    }
}

/// A prompt's text, and its images as files.
fn prompt(blocks: &[Value]) -> Result<(String, Vec<Part>), String> {
    let mut text = Vec::new();
    let mut parts = Vec::new();
    let mut bytes = 0usize;
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push(b.get("text").and_then(Value::as_str).unwrap_or_default().to_string()),
            Some("image") => {
                use base64::Engine as _;
                let data = b.get("data").and_then(Value::as_str).unwrap_or_default();
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .map_err(|_| "an image of the prompt is not base64".to_string())?;
                bytes += decoded.len();
                if bytes > MAX_PARTS_BYTES {
                    return Err(format!("the prompt's images are over {} MiB", MAX_PARTS_BYTES >> 20));
                }
                let mime = b.get("mimeType").and_then(Value::as_str).unwrap_or("application/octet-stream");
                parts.push(Part { mime: mime.to_string(), bytes: decoded, path: None });
            }
            Some("resource_link") => {
                let name = b.get("name").and_then(Value::as_str).unwrap_or("a file");
                let uri = b.get("uri").and_then(Value::as_str).unwrap_or_default();
                text.push(format!("[{name}: {uri}]"));
            }
            _ => {}
        }
    }
    Ok((text.join("\n"), parts))
}
