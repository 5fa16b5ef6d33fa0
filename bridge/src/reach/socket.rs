//! The local socket anything on the workstation sends the owner messages on:
//! `$THUNDERBOLT_HOME/reach.sock`, one per home, served by the first host or
//! bridge that takes it (an exclusive lock held for the process's life, so a
//! crashed one's stale socket is simply replaced).
//!
//! Only the owning user reaches it: the socket is 0600 in a 0700 home, and
//! each connection's peer uid is checked (`SO_PEERCRED`). One JSON object per
//! line in, one per line out, any number per connection:
//!
//! ```text
//! {"op":"note","text":"backup done","from":"cron"}   → {"ok":true,"id":"m-7","pushed":2}
//! {"op":"replies","from":"claude","wait_s":30}      → {"ok":true,"replies":[{"id","text","device","at","replyTo"?}]}
//! {"op":"ask","from":"claude","request_id":"abcde","tool_name":"Bash","description":…,"input_preview":…}
//!                                                   → {"ok":true,"id":"q-8","pushed":2}
//! {"op":"status"}                                   → {"ok":true,"host":…,"devices":[…],…}
//! {"op":"turn.delta"|"turn.tool"|"turn.done","turn_id":…}  → {"ok":true} (a relay agent's turn)
//! {"op":"turn.watch",…} / {"op":"chat.watch","agent":…}    → the adapter's watches (shapes::relay)
//! anything refused                                  → {"error":"rate limited: …"}
//! ```
//!
//! `replies` hands back what the owner's devices wrote in the thread of
//! `from` (each item once): replies, and a question's answer, which carries
//! `verdict: {behavior: "allow"|"deny", requestId}` (text never does).
//! `from` is a display name (1–32 characters, one line; `note` when absent)
//! that grants nothing; `device` sends to that device only. A line longer
//! than [`MAX_LINE`] is refused and the connection closed, without reading
//! the rest into memory.

use std::{fs, path::PathBuf, sync::Arc, time::Duration};

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::UnixStream,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Message, Reach};
use crate::home::Home;

/// The longest request line: a message's text (16 KiB) escaped as JSON can
/// take up to six bytes a byte, and a few fields beside it.
pub const MAX_LINE: usize = 128 * 1024;

/// Connections served at once: a few scripts and MCP servers, each waiting
/// for replies; past it one is told `busy` and closed.
pub const MAX_CONNECTIONS: usize = 32;

/// How long a connection may stay silent between lines.
pub const IDLE: Duration = Duration::from_secs(120);

/// The name a note without `from` is sent under.
pub const DEFAULT_FROM: &str = "note";

/// The socket's path.
pub fn socket_path(home: &Home) -> PathBuf {
    home.root_path().join("reach.sock")
}

fn lock_path(home: &Home) -> PathBuf {
    home.root_path().join(".reach.lock")
}

/// One request line.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Request {
    Note {
        text: String,
        #[serde(default)]
        from: Option<String>,
        /// A relay agent's chat: the note goes in that agent's thread.
        #[serde(default)]
        chat: Option<String>,
        #[serde(default)]
        device: Option<String>,
        #[serde(default, alias = "replyTo")]
        reply_to: Option<String>,
    },
    Replies {
        from: String,
        #[serde(default)]
        wait_s: Option<f64>,
    },
    /// A question answered Allow or Deny on a device (a permission prompt).
    Ask {
        from: String,
        request_id: String,
        tool_name: String,
        #[serde(default)]
        description: String,
        #[serde(default)]
        input_preview: String,
    },
    Status,
}

/// The socket, held for the process's life.
#[derive(Debug)]
pub struct ReachSocket {
    socket: crate::control::owned::Owned,
}

impl ReachSocket {
    /// Takes the home's socket; `Ok(None)` when another process has it (that
    /// one delivers the home's messages).
    pub fn bind(home: &Home) -> std::io::Result<Option<Self>> {
        use crate::control::owned::{take, Taken};
        match take(&lock_path(home), socket_path(home))? {
            Taken::Ours(socket) => Ok(Some(Self { socket })),
            Taken::Held { pid } => {
                info!("messages (reach.sock) are served by another process on this home (pid {pid})");
                Ok(None)
            }
        }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.socket.path
    }

    /// Serves until `stop`, then removes the socket.
    pub async fn serve(self, reach: Arc<Reach>, stop: CancellationToken) {
        // SAFETY: getuid cannot fail.
        let me = unsafe { libc::getuid() };
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let tasks = tokio_util::task::TaskTracker::new();
        loop {
            let accepted = tokio::select! {
                a = self.socket.listener.accept() => a,
                _ = stop.cancelled() => break,
            };
            let mut stream = match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    warn!("reach.sock: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                let _ =
                    answer(&mut stream, &err(format!("busy: {MAX_CONNECTIONS} connections are open"))).await;
                continue;
            };
            let reach = reach.clone();
            let stop = stop.clone();
            tasks.spawn(async move {
                tokio::select! {
                    _ = connection(stream, me, &reach, permit) => {}
                    _ = stop.cancelled() => {}
                }
            });
        }
        let _ = fs::remove_file(&self.socket.path);
    }
}

fn err(why: impl ToString) -> Value {
    json!({"error": why.to_string()})
}

async fn answer(stream: &mut (impl AsyncWriteExt + Unpin), v: &Value) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(v).unwrap_or_default();
    line.push(b'\n');
    stream.write_all(&line).await
}

/// One connection's lines, in order. A connection that becomes a watch
/// gives its `slot` back: watches are bounded by [`Reach`]'s own limits.
async fn connection(stream: UnixStream, me: u32, reach: &Reach, slot: tokio::sync::OwnedSemaphorePermit) {
    let mut slot = Some(slot);
    let uid = stream.peer_cred().map(|c| c.uid()).ok();
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::with_capacity(16 * 1024, read);
    let mut line = Vec::with_capacity(1024);
    if uid != Some(me) {
        info!("reach.sock: refused a client of uid {uid:?} (only uid {me} may use it)");
        // Its first line is read (bounded) before the answer: closing on an
        // unread request would reset the connection before it reads why.
        let _ = tokio::time::timeout(Duration::from_secs(2), read_line(&mut read, &mut line, MAX_LINE)).await;
        let _ = answer(&mut write, &err(format!("only uid {me} may use this socket"))).await;
        return;
    }
    loop {
        line.clear();
        match tokio::time::timeout(IDLE, read_line(&mut read, &mut line, MAX_LINE)).await {
            Ok(Ok(Line::Whole)) => {}
            Ok(Ok(Line::End)) | Err(_) | Ok(Err(_)) => return,
            Ok(Ok(Line::TooLong)) => {
                info!("reach.sock: a line over {MAX_LINE} bytes refused; connection closed");
                let _ = answer(&mut write, &err(format!("line too long: at most {MAX_LINE} bytes"))).await;
                return;
            }
        }
        let v: Value = match serde_json::from_slice(&line) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                let reply =
                    err("not a JSON object: send one per line, e.g. {\"op\":\"note\",\"text\":\"…\"}");
                if answer(&mut write, &reply).await.is_err() {
                    return;
                }
                continue;
            }
        };
        let op = v.get("op").and_then(Value::as_str).unwrap_or_default().to_string();
        let reply = match op.as_str() {
            "note" | "replies" | "status" | "ask" => match serde_json::from_value::<Request>(v) {
                Ok(req) => handle(req, reach).await,
                Err(e) => err(format!("{op}: {e}")),
            },
            // A relay agent's turn, from the service: handed to the adapter that watches it.
            "turn.delta" | "turn.tool" | "turn.done" => match reach.turn_event(&v) {
                Ok(()) => json!({"ok": true}),
                Err(e) => err(e),
            },
            // The adapter of a relay agent: this connection now carries the turn's events.
            "turn.watch" => {
                let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                let (turn, chat, agent) = (field("turn_id"), field("chat_id"), field("agent"));
                match reach.watch(&turn, &chat, &agent) {
                    Ok(rx) => {
                        slot.take();
                        if answer(&mut write, &json!({"ok": true})).await.is_ok() {
                            watching(rx, &mut read, &mut write).await;
                        }
                        reach.unwatch(&turn);
                        return;
                    }
                    Err(e) => err(e),
                }
            }
            // A relay agent's adapter: notes to its chats come out of this
            // connection; it names each chat it shows with a `{"chat_id"}` line.
            "chat.watch" => {
                let agent = v.get("agent").and_then(Value::as_str).unwrap_or_default().to_string();
                match thunderbolt_shared::reach::name_problem(&agent) {
                    Some(why) => err(format!("agent: {why}")),
                    None => match reach.watch_chats() {
                        Ok(w) => {
                            slot.take();
                            if answer(&mut write, &json!({"ok": true})).await.is_ok() {
                                chat_watching(w, &agent, reach, &mut read, &mut write).await;
                            }
                            return;
                        }
                        Err(e) => err(e),
                    },
                }
            }
            "" => err("no op: each line is an object with an \"op\""),
            other => err(format!("unknown op: {other}")),
        };
        if answer(&mut write, &reply).await.is_err() {
            return;
        }
    }
}

/// A watched turn's events, written to its adapter until the turn is done
/// or the adapter goes (its side of the connection ends).
async fn watching(
    mut rx: tokio::sync::mpsc::Receiver<Value>,
    read: &mut (impl AsyncBufReadExt + Unpin),
    write: &mut (impl AsyncWriteExt + Unpin),
) {
    let mut sink = Vec::new();
    loop {
        tokio::select! {
            ev = rx.recv() => {
                let Some(ev) = ev else { return };
                let done = ev.get("op").and_then(Value::as_str) == Some("turn.done");
                if answer(write, &ev).await.is_err() || done {
                    return;
                }
            }
            // The adapter says nothing more on this connection; its end is the turn's.
            r = read_line(read, &mut sink, 1024) => {
                if !matches!(r, Ok(Line::Whole)) {
                    return;
                }
                sink.clear();
            }
        }
    }
}

/// The longest line a chat watcher sends: `{"chat_id":"…"}`.
const MAX_CHAT_LINE: usize = 1024;

/// Notes to `agent`'s chats, written to its adapter; the adapter's lines
/// name the chats it shows (remembered, so a note may name them).
async fn chat_watching(
    mut w: super::ChatWatch,
    agent: &str,
    reach: &Reach,
    read: &mut (impl AsyncBufReadExt + Unpin),
    write: &mut (impl AsyncWriteExt + Unpin),
) {
    let mut line = Vec::new();
    loop {
        tokio::select! {
            note = w.notes.recv() => match note {
                Ok(n) if n.agent == agent => {
                    let v = json!({"op": "note", "chat_id": n.chat, "id": n.id, "text": n.text});
                    if answer(write, &v).await.is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    debug!("reach.sock: a chat watcher of '{agent}' missed {n} note(s)");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
            r = read_line(read, &mut line, MAX_CHAT_LINE) => {
                if !matches!(r, Ok(Line::Whole)) {
                    return;
                }
                let chat = serde_json::from_slice::<Value>(&line).ok()
                    .and_then(|v| v.get("chat_id").and_then(Value::as_str).map(str::to_string));
                line.clear();
                if let Some(chat) = chat {
                    if let Err(e) = reach.add_chat(&chat, agent) {
                        debug!("reach.sock: a chat watcher of '{agent}' named a bad chat: {e}");
                    }
                }
            }
        }
    }
}

async fn handle(req: Request, reach: &Reach) -> Value {
    match req {
        Request::Note { text, from, chat, device, reply_to } => {
            let agent = chat.as_deref().and_then(|c| reach.agent_of_chat(c));
            if let (Some(c), None) = (&chat, &agent) {
                return err(format!("no such chat: {c}"));
            }
            let from = from.or(agent.clone()).unwrap_or_else(|| DEFAULT_FROM.to_string());
            let m = Message { from, text: text.clone(), device, reply_to };
            match reach.send(m) {
                Ok(s) => {
                    let mut v = json!({"ok": true, "id": s.id, "pushed": s.pushed});
                    if let (Some(chat), Some(agent)) = (chat, agent) {
                        v["chat_id"] = json!(chat);
                        reach.chat_note(super::ChatNote { agent, chat, id: s.id, text });
                    }
                    v
                }
                Err(e) => err(e),
            }
        }
        Request::Replies { from, wait_s } => {
            let wait = wait_s
                .filter(|w| w.is_finite() && *w > 0.0)
                .map_or(Duration::ZERO, |w| Duration::from_secs_f64(w.min(super::MAX_WAIT.as_secs_f64())));
            match reach.replies(&from, wait).await {
                Ok(r) => json!({"ok": true, "replies": r}),
                Err(e) => err(e),
            }
        }
        Request::Ask { from, request_id, tool_name, description, input_preview } => {
            let ask = super::threads::Ask { request_id, tool: tool_name, preview: input_preview };
            match reach.ask(&from, ask, &description) {
                Ok(s) => json!({"ok": true, "id": s.id, "pushed": s.pushed}),
                Err(e) => err(e),
            }
        }
        Request::Status => {
            let mut v = reach.status();
            v["ok"] = json!(true);
            v
        }
    }
}

pub(crate) enum Line {
    Whole,
    End,
    TooLong,
}

/// Reads one line (without its `\n`) into `out`, never more than `max` bytes.
pub(crate) async fn read_line(
    read: &mut (impl AsyncBufReadExt + Unpin),
    out: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    loop {
        let buf = read.fill_buf().await?;
        if buf.is_empty() {
            return Ok(if out.is_empty() { Line::End } else { Line::Whole });
        }
        match memchr::memchr(b'\n', buf) {
            Some(i) => {
                if out.len() + i > max {
                    return Ok(Line::TooLong);
                }
                out.extend_from_slice(&buf[..i]);
                read.consume(i + 1);
                return Ok(Line::Whole);
            }
            None => {
                let n = buf.len();
                if out.len() + n > max {
                    return Ok(Line::TooLong);
                }
                out.extend_from_slice(buf);
                read.consume(n);
            }
        }
    }
}
