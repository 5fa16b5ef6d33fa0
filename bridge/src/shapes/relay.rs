//! A relay agent's turn (the relay contract, v1): the adapter first watches
//! the turn on the host's reach socket (`turn.watch`), then POSTs the message
//! to the service, which answers the POST at once (any 2xx) and streams its
//! reply to the reach socket (`turn.delta`, `turn.tool`, `turn.done`), which
//! the host hands to this watch. Silence for the bound since the last
//! activity fails the turn; a turn that ends any other way than `done`
//! (stopped, failed, silent) sends the service one `stop` POST, best effort;
//! once the watch is gone the host answers `no such turn` to whatever comes
//! late.

use std::{path::PathBuf, time::Duration};

use serde_json::{json, Value};
use tokio::{
    io::{AsyncWriteExt, BufReader},
    net::{
        unix::{OwnedReadHalf, OwnedWriteHalf},
        UnixStream,
    },
    sync::mpsc,
};

use super::{contract::Part, TurnEnd, Update};

/// The contract version a message says it is.
pub const VERSION: u64 = 1;

/// Connecting to the service, and its answer to the POST: it answers at once.
const POST_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest event line read from the host (a reach-socket line is at most 128 KiB).
const MAX_EVENT: usize = 256 * 1024;

/// One turn's inputs.
pub struct Turn<'a> {
    pub url: &'a url::Url,
    pub agent: &'a str,
    /// The ACP session id: the relay's `chat_id`, stable for the chat.
    pub chat: &'a str,
    pub text: &'a str,
    pub parts: &'a [Part],
    pub cwd: &'a str,
}

/// The host's reach socket: `THUNDERBOLT_REACH_SOCK`, else the home's.
pub(crate) fn reach_socket() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("THUNDERBOLT_REACH_SOCK") {
        return Some(PathBuf::from(p));
    }
    crate::home::Home::resolve(None).ok().map(|h| crate::reach::socket::socket_path(&h))
}

/// `v` as one line of the reach socket.
fn json_line(v: &Value) -> Vec<u8> {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    b
}

/// A watch on the reach socket at `path` (`turn.watch`, `chat.watch`): the
/// request sent and its `{"ok":true}` read (else the host refused the `what`). The events come out of the
/// reader; the writer keeps the watch open (and names chats to `chat.watch`).
async fn open_watch(
    path: &std::path::Path,
    request: Value,
    what: &str,
) -> Result<(BufReader<OwnedReadHalf>, OwnedWriteHalf), String> {
    let mut stream = UnixStream::connect(path).await.map_err(|e| format!("{}: {e}", path.display()))?;
    stream.write_all(&json_line(&request)).await.map_err(|e| format!("{}: {e}", path.display()))?;
    let (read, write) = stream.into_split();
    let mut events = BufReader::new(read);
    let mut buf = Vec::new();
    let first = crate::reach::socket::read_line(&mut events, &mut buf, MAX_EVENT).await;
    let ok = matches!(first, Ok(crate::reach::socket::Line::Whole))
        && serde_json::from_slice::<Value>(&buf).is_ok_and(|v| v["ok"] == true);
    if !ok {
        return Err(format!("the host refused the {what} ({})", String::from_utf8_lossy(&buf)));
    }
    Ok((events, write))
}

/// Sends the `stop` POST when the turn ends without `done`.
struct StopOnDrop {
    url: url::Url,
    body: Option<Value>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(body) = self.body.take() {
            let url = self.url.clone();
            tokio::spawn(async move {
                let _ = client().post(url).json(&body).send().await;
            });
        }
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(POST_TIMEOUT)
        .build()
        .unwrap_or_default()
}

/// Runs one turn at the relay service; updates go to `updates`.
pub async fn run(t: Turn<'_>, silence: Duration, updates: mpsc::Sender<Update>) -> TurnEnd {
    let agent = t.agent;
    let turn_id = format!("t_{}", crate::ids::random_hex(16));
    let Some(path) = reach_socket() else {
        return TurnEnd::Failed(format!("{agent} could not answer: the host's reach socket is unknown"));
    };
    // Watch first: a service that answers fast finds its turn open.
    let watch = json!({"op": "turn.watch", "turn_id": turn_id, "chat_id": t.chat, "agent": agent});
    let (mut events, _keep_open) = match open_watch(&path, watch, "turn").await {
        Ok(w) => w,
        Err(why) => return TurnEnd::Failed(format!("{agent} could not answer: {why}")),
    };
    let mut buf = Vec::new();
    let images: Vec<Value> = t
        .parts
        .iter()
        .map(|p| {
            use base64::Engine as _;
            json!({"mime": p.mime, "data_b64": base64::engine::general_purpose::STANDARD.encode(&p.bytes)})
        })
        .collect::<Vec<_>>();
    let message = json!({
        "v": VERSION, "type": "message", "chat_id": t.chat, "turn_id": turn_id,
        "text": t.text, "images": images, "cwd": t.cwd, "origin": "user",
    });
    let mut stop = StopOnDrop {
        url: t.url.clone(),
        body: Some(json!({"v": VERSION, "type": "stop", "chat_id": t.chat, "turn_id": turn_id})),
    };
    match client().post(t.url.clone()).json(&message).send().await {
        Ok(r) if r.status().is_success() => {}
        Ok(r) => {
            stop.body = None;
            return TurnEnd::Failed(format!("{agent} could not answer: its service answered {}", r.status()));
        }
        Err(e) => {
            stop.body = None;
            let why = if e.is_connect() {
                "nothing answers there (is the service running?)".to_string()
            } else {
                e.without_url().to_string()
            };
            return TurnEnd::Failed(format!("{agent} could not answer: {}: {why}", t.url));
        }
    }
    loop {
        buf.clear();
        let read =
            tokio::time::timeout(silence, crate::reach::socket::read_line(&mut events, &mut buf, MAX_EVENT));
        let ev: Value = match read.await {
            Ok(Ok(crate::reach::socket::Line::Whole)) => serde_json::from_slice(&buf).unwrap_or_default(),
            Ok(_) => return TurnEnd::Failed(format!("{agent} could not answer: the host ended the turn")),
            Err(_) => {
                return TurnEnd::Failed(format!(
                    "{agent} said nothing for {} s: the turn is given up",
                    silence.as_secs()
                ))
            }
        };
        match ev.get("op").and_then(Value::as_str) {
            Some("turn.delta") => {
                if let Some(text) = ev.get("text").and_then(Value::as_str) {
                    let _ = updates.send(Update::Text(text.to_string())).await;
                }
            }
            Some("turn.tool") => {
                let _ = updates.send(Update::Tool(ev)).await;
            }
            Some("turn.done") => {
                stop.body = None;
                return TurnEnd::Done;
            }
            // Unknown events are ignored (the contract grows by additions).
            _ => {}
        }
    }
}

/// The chats one adapter shows: at most this many are named to the host
/// (a client opens a handful; a hostile one is bounded by its frames).
const MAX_WATCHED_CHATS: usize = 1024;

/// Notes the service sends to a chat between turns (`{"op":"note","chat":…}`
/// on the reach socket), shown in that chat's session as the agent's words.
/// One watch per adapter, started with its first session; the chats it shows
/// are named to the host as sessions start or load.
pub struct NoteWatch {
    chats: mpsc::UnboundedSender<String>,
}

impl NoteWatch {
    /// Watches `agent`'s chats; each note becomes a `session/update` on `out`.
    pub fn start(agent: String, out: mpsc::Sender<Value>) -> Self {
        let (chats, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            if let Err(why) = watch_notes(&agent, rx, out).await {
                tracing::info!("notes from {agent}'s service will not show in its sessions: {why}");
            }
        });
        Self { chats }
    }

    /// `chat` is shown here: its notes come to this adapter.
    pub fn show(&self, chat: &str) {
        let _ = self.chats.send(chat.to_string());
    }
}

async fn watch_notes(
    agent: &str,
    mut chats: mpsc::UnboundedReceiver<String>,
    out: mpsc::Sender<Value>,
) -> Result<(), String> {
    let path = reach_socket().ok_or("the host's reach socket is unknown")?;
    let (mut events, mut write) =
        open_watch(&path, json!({"op": "chat.watch", "agent": agent}), "watch").await?;
    let mut shown = std::collections::HashSet::new();
    let mut buf = Vec::new();
    loop {
        // `buf` keeps a line read in part when a chat comes first.
        tokio::select! {
            chat = chats.recv() => {
                let Some(chat) = chat else { return Ok(()) };
                if shown.len() < MAX_WATCHED_CHATS && shown.insert(chat.clone()) {
                    write.write_all(&json_line(&json!({"chat_id": chat}))).await.map_err(|e| e.to_string())?;
                }
            }
            r = crate::reach::socket::read_line(&mut events, &mut buf, MAX_EVENT) => {
                if !matches!(r, Ok(crate::reach::socket::Line::Whole)) {
                    return Err("the host ended the watch".into());
                }
                let note = serde_json::from_slice::<Value>(&buf).unwrap_or_default();
                buf.clear();
                let (Some(chat), Some(text)) = (note["chat_id"].as_str(), note["text"].as_str()) else { continue };
                if !shown.contains(chat) {
                    continue;
                }
                let update = json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}});
                let v = json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": chat, "update": update}});
                if out.send(v).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
}
