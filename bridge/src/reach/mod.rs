//! Your agent reaches you first: messages from anything on the workstation to
//! the owner's devices, and the owner's replies back.
//!
//! A running host (or single-agent bridge) owns it: one [`Reach`] per home,
//! held by whichever process took `reach.sock` first. What it does:
//!
//! - takes messages on the local socket ([`socket`]: `thunderbolt note`, the
//!   MCP server `thunderbolt reach` ([`mcp`]), any script), at most
//!   [`NOTE_BURST`] at once and one per [`NOTE_EVERY`] after that;
//! - keeps them in a thread per sender ([`threads`]) and pushes each to the
//!   owner's devices that subscribed to notices (end to end encrypted, the
//!   notices' own Web Push), except to a device that shows that thread now;
//! - lets the owner's devices read the threads and reply over iroh
//!   (`thunderbolt/<p>/reach1`, served by `serve::reach_door`);
//! - hands each reply to its thread's sender once ([`Reach::replies`]).
//!
//! A sender's name (`--from`, `--agent-name`) is a display name: it picks a
//! thread and grants nothing.

pub mod client;
pub mod mcp;
pub mod socket;
pub mod threads;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use iroh::EndpointId;
use serde_json::{json, Value};
use thunderbolt_shared::reach::{name_problem, text_problem};
use tracing::{info, warn};

use crate::{
    devices::Devices,
    home::Home,
    notify::{limit::Limiter, Event, Kind, Notifier},
};
use threads::{Ask, Author, Behavior, Item, ThreadError, Threads};

/// Messages the socket takes at once: a script's burst of results.
pub const NOTE_BURST: u32 = 10;

/// After the burst, one message per this: 30 in five minutes. The owner's
/// phone is not a log sink; a loop that sends faster is told `rate limited`.
pub const NOTE_EVERY: Duration = Duration::from_secs(10);

/// The longest a `replies` call waits for a reply: an MCP tool call that
/// waits longer keeps its client's request open past what clients allow.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// How long a device that said it shows a thread is taken to show it: the
/// page says so again every few seconds while it does.
pub const VIEW_LEASE: Duration = Duration::from_secs(20);

/// Bounds on a question's fields, as Claude Code's channel gives them: its
/// request ids are a few letters; a tool's name is short; what it would do
/// is cut to a screenful.
pub const MAX_REQUEST_ID: usize = 64;
pub const MAX_TOOL: usize = 128;
pub const MAX_PREVIEW: usize = 2000;

/// `text` cut to at most `max` bytes, at a character.
fn words_cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut at = max;
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    format!("{}…", &text[..at])
}

/// Relay turns open at once: each is a prompt under way at a relay agent.
pub const MAX_OPEN_TURNS: usize = 256;

/// Events of one turn waiting for its adapter: a service that streams
/// faster than the adapter reads is told `busy` and sends again.
const TURN_QUEUE: usize = 256;

/// Relay chats remembered (for notes that name one): past it, forgotten all
/// at once; a chat is remembered again at its next turn.
const MAX_CHATS: usize = 4096;

/// Relay agents' adapters watching for notes to their chats at once: one per
/// client connected to a relay agent, and those are bounded by the host's
/// agent slots long before this.
pub const MAX_CHAT_WATCHES: usize = 64;

/// Notes to relay chats not yet handed to their watchers: a watcher that
/// falls this far behind misses the oldest (the note stays in the thread).
const CHAT_NOTES_QUEUE: usize = 64;

/// A note to a relay agent's chat, for the adapters that show that chat.
#[derive(Debug, Clone)]
pub struct ChatNote {
    pub agent: String,
    pub chat: String,
    pub id: String,
    pub text: String,
}

/// A watch on notes to relay chats; it frees its place when dropped.
pub struct ChatWatch {
    pub notes: tokio::sync::broadcast::Receiver<ChatNote>,
    count: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for ChatWatch {
    fn drop(&mut self) {
        self.count.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Where the threads are kept.
pub fn threads_path(home: &Home) -> std::path::PathBuf {
    home.root_path().join("reach").join("threads.json")
}

/// Why a message or reply was refused, in the words the socket answers.
#[derive(Debug, thiserror::Error)]
pub enum ReachError {
    /// Over [`NOTE_BURST`] at once or one per [`NOTE_EVERY`]: the socket's
    /// answer is exactly `{"error":"rate limited"}`.
    #[error("rate limited")]
    RateLimited,
    #[error("{0}")]
    Bad(String),
    #[error(transparent)]
    Threads(#[from] ThreadError),
    /// A `turn.*` for a turn that is not open (ended, stopped, or never).
    #[error("no such turn")]
    NoSuchTurn,
    #[error("busy: {0}")]
    Busy(&'static str),
}

/// A message to send.
#[derive(Debug, Clone)]
pub struct Message {
    /// The sender: its thread.
    pub from: String,
    pub text: String,
    /// Only to the device of this name (else to every one of the owner's).
    pub device: Option<String>,
    pub reply_to: Option<String>,
}

/// A message taken: its id, and to how many devices it was handed for a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub id: String,
    pub pushed: usize,
}

/// Which agent endpoint a device dials to reply (any of the host's does):
/// a pushed message names it, as a question's notice does.
#[derive(Debug, Clone)]
pub struct Door {
    pub node: String,
    pub protocol: String,
}

/// One home's messages (see the module's docs).
pub struct Reach {
    threads: Mutex<Threads>,
    notes: Mutex<Limiter>,
    /// The newest item's seq: `replies` waits on it.
    changed: tokio::sync::watch::Sender<u64>,
    notifier: Option<Arc<Notifier>>,
    devices: Arc<Devices>,
    /// Device → the thread it shows, and since when it said so.
    viewing: Mutex<HashMap<EndpointId, (String, Instant)>>,
    door: OnceLock<Door>,
    /// What owns it: `host` or `<protocol> bridge`, for `status`.
    owner: String,
    /// Relay agents' open turns: turn id → where its events go (the adapter).
    turns: Mutex<HashMap<String, tokio::sync::mpsc::Sender<Value>>>,
    /// Relay agents' chats seen: chat id → agent (a note names a chat).
    chats: Mutex<HashMap<String, String>>,
    /// Where the socket is (`status` names it).
    socket: std::path::PathBuf,
    /// Notes to relay chats, for the adapters watching them.
    chat_notes: tokio::sync::broadcast::Sender<ChatNote>,
    chat_watches: Arc<std::sync::atomic::AtomicUsize>,
}

impl std::fmt::Debug for Reach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reach").field("owner", &self.owner).finish()
    }
}

impl Reach {
    /// The home's messages, delivered with `notifier`'s pushes (none: kept only).
    pub fn new(home: &Home, notifier: Option<Arc<Notifier>>, owner: &str) -> Arc<Self> {
        let threads = Threads::open(&threads_path(home));
        let (changed, _) = tokio::sync::watch::channel(threads.seq());
        Arc::new(Self {
            threads: Mutex::new(threads),
            notes: Mutex::new(Limiter::new(NOTE_BURST, NOTE_EVERY)),
            changed,
            notifier,
            devices: Arc::new(Devices::new(home)),
            viewing: Mutex::default(),
            door: OnceLock::new(),
            owner: owner.to_string(),
            turns: Mutex::default(),
            chats: Mutex::default(),
            socket: socket::socket_path(home),
            chat_notes: tokio::sync::broadcast::channel(CHAT_NOTES_QUEUE).0,
            chat_watches: Arc::default(),
        })
    }

    /// The socket's path.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// The agent endpoint pushed messages name (the first one served).
    pub fn set_door(&self, door: Door) {
        let _ = self.door.set(door);
    }

    fn threads(&self) -> std::sync::MutexGuard<'_, Threads> {
        self.threads.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a message: checked, kept in its sender's thread, pushed.
    pub fn send(&self, m: Message) -> Result<Sent, ReachError> {
        if let Some(why) = name_problem(&m.from) {
            return Err(ReachError::Bad(format!("from: {why}")));
        }
        if let Some(why) = text_problem(&m.text) {
            return Err(ReachError::Bad(why));
        }
        let only = match &m.device {
            Some(name) => {
                let ids = self.devices.by_name(name);
                if ids.is_empty() {
                    return Err(ReachError::Bad(format!(
                        "no device named '{name}' (thunderbolt iroh list shows their names)"
                    )));
                }
                Some(ids)
            }
            None => None,
        };
        if self.notes.lock().unwrap_or_else(|p| p.into_inner()).take().is_none() {
            return Err(ReachError::RateLimited);
        }
        let item = self.threads().add(&m.from, Author::Agent, None, &m.text, m.reply_to.as_deref())?;
        self.changed.send_replace(item.seq);
        let pushed = self.push(&m.from, &item, only.as_deref());
        info!(
            "message {} from '{}' ({} bytes) kept; pushed to {pushed} device(s)",
            item.id,
            m.from,
            m.text.len()
        );
        Ok(Sent { id: item.id, pushed })
    }

    /// Hands `item` to the delivery of each of the owner's devices with a
    /// push subscription (or of `only`), but a device showing the thread.
    fn push(&self, thread: &str, item: &Item, only: Option<&[EndpointId]>) -> usize {
        let Some(notifier) = &self.notifier else { return 0 };
        let own = self.devices.all();
        let now = Instant::now();
        let viewing = self.viewing.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let door = self.door.get().cloned().unwrap_or(Door { node: String::new(), protocol: "acp".into() });
        let mut n = 0;
        for peer in notifier.subscriptions.owners() {
            if !own.contains_key(&peer) || only.is_some_and(|o| !o.contains(&peer)) {
                continue;
            }
            if viewing.get(&peer).is_some_and(|(t, since)| t == thread && now - *since < VIEW_LEASE) {
                continue;
            }
            notifier.notify(Event {
                agent: thread.into(),
                label: thread.into(),
                session: String::new(),
                peer,
                kind: Kind::Message {
                    thread: thread.to_string(),
                    id: item.id.clone(),
                    text: item.text.clone(),
                    ask: item.ask.is_some(),
                },
                request: None,
                answer: None,
                node: door.node.as_str().into(),
                protocol: door.protocol.as_str().into(),
                text: None,
                more: 0,
                allowed: true,
            });
            n += 1;
        }
        n
    }

    /// A question from the sender (an agent's permission prompt): kept in
    /// its thread and pushed with Allow and Deny. It counts against the same
    /// limit as messages.
    pub fn ask(&self, from: &str, ask: Ask, description: &str) -> Result<Sent, ReachError> {
        if let Some(why) = name_problem(from) {
            return Err(ReachError::Bad(format!("from: {why}")));
        }
        if ask.request_id.is_empty() || ask.request_id.len() > MAX_REQUEST_ID {
            return Err(ReachError::Bad(format!("request_id: 1 to {MAX_REQUEST_ID} bytes")));
        }
        if ask.tool.trim().is_empty() || ask.tool.len() > MAX_TOOL {
            return Err(ReachError::Bad(format!("tool_name: 1 to {MAX_TOOL} bytes")));
        }
        let mut ask = ask;
        ask.preview = words_cut(&ask.preview, MAX_PREVIEW);
        let text = match description.trim() {
            "" => ask.tool.clone(),
            d => format!("{}: {}", ask.tool, words_cut(d, thunderbolt_shared::reach::MAX_TEXT / 2)),
        };
        if self.notes.lock().unwrap_or_else(|p| p.into_inner()).take().is_none() {
            return Err(ReachError::RateLimited);
        }
        let item = self.threads().ask(from, &text, ask)?;
        self.changed.send_replace(item.seq);
        let pushed = self.push(from, &item, None);
        info!("question {} from '{from}' kept; pushed to {pushed} device(s)", item.id);
        Ok(Sent { id: item.id, pushed })
    }

    /// A device's Allow or Deny of a question: the first answer counts.
    pub fn answer(
        &self,
        device: &EndpointId,
        thread: &str,
        question: &str,
        behavior: Behavior,
    ) -> Result<Item, ReachError> {
        let name = self.devices.name_of(device).unwrap_or_else(|| device.fmt_short().to_string());
        let item = self.threads().answer(thread, question, behavior, name.clone())?;
        self.changed.send_replace(item.seq);
        info!("question {question} of '{thread}' answered {behavior:?} by {name}");
        Ok(item)
    }

    /// A reply from one of the owner's devices.
    pub fn reply(
        &self,
        device: &EndpointId,
        thread: &str,
        text: &str,
        reply_to: Option<&str>,
    ) -> Result<Item, ReachError> {
        if let Some(why) = text_problem(text) {
            return Err(ReachError::Bad(why));
        }
        let name = self.devices.name_of(device).unwrap_or_else(|| device.fmt_short().to_string());
        let item = self.threads().add(thread, Author::Device, Some(name.clone()), text, reply_to)?;
        self.changed.send_replace(item.seq);
        info!("reply {} to '{thread}' from {name} ({} bytes) waits for its sender", item.id, text.len());
        Ok(item)
    }

    /// The replies to `from` not returned yet; when there are none, waits up
    /// to `wait` (at most [`MAX_WAIT`]) for one. Each reply is returned once.
    pub async fn replies(&self, from: &str, wait: Duration) -> Result<Vec<Item>, ReachError> {
        if let Some(why) = name_problem(from) {
            return Err(ReachError::Bad(format!("from: {why}")));
        }
        let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
        let mut rx = self.changed.subscribe();
        loop {
            rx.borrow_and_update();
            let got = self.threads().take_replies(from)?;
            if !got.is_empty() {
                return Ok(got);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => return Ok(Vec::new()),
            }
        }
    }

    /// The threads as `device` lists them; `viewing`: it shows that thread now.
    pub fn listing(&self, device: &EndpointId, since: Option<u64>, viewing: Option<String>) -> Value {
        {
            let mut v = self.viewing.lock().unwrap_or_else(|p| p.into_inner());
            match viewing {
                Some(t) => {
                    v.insert(*device, (t, Instant::now()));
                }
                None => {
                    v.remove(device);
                }
            }
            // Bounded by the owner's devices that list; stale ones go.
            v.retain(|_, (_, since)| since.elapsed() < VIEW_LEASE);
        }
        self.threads().listing(since)
    }

    /// A relay agent's adapter watches turn `turn` of `chat`: the turn's
    /// events from its service come out of the receiver until `turn.done`.
    pub fn watch(
        &self,
        turn: &str,
        chat: &str,
        agent: &str,
    ) -> Result<tokio::sync::mpsc::Receiver<Value>, ReachError> {
        if turn.is_empty() || turn.len() > MAX_REQUEST_ID || chat.is_empty() || chat.len() > MAX_REQUEST_ID {
            return Err(ReachError::Bad("turn_id and chat_id: 1 to 64 bytes".into()));
        }
        if let Some(why) = name_problem(agent) {
            return Err(ReachError::Bad(format!("agent: {why}")));
        }
        let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        if turns.len() >= MAX_OPEN_TURNS {
            return Err(ReachError::Busy("too many turns are open"));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(TURN_QUEUE);
        turns.insert(turn.to_string(), tx);
        drop(turns);
        self.add_chat(chat, agent)?;
        Ok(rx)
    }

    /// The turn is over (done, failed, stopped): what comes for it later is refused.
    pub fn unwatch(&self, turn: &str) {
        self.turns.lock().unwrap_or_else(|p| p.into_inner()).remove(turn);
    }

    /// Remembers that `chat` is relay agent `agent`'s (a note may name it).
    pub fn add_chat(&self, chat: &str, agent: &str) -> Result<(), ReachError> {
        if chat.is_empty() || chat.len() > MAX_REQUEST_ID {
            return Err(ReachError::Bad("chat_id: 1 to 64 bytes".into()));
        }
        if let Some(why) = name_problem(agent) {
            return Err(ReachError::Bad(format!("agent: {why}")));
        }
        let mut chats = self.chats.lock().unwrap_or_else(|p| p.into_inner());
        if chats.len() >= MAX_CHATS && !chats.contains_key(chat) {
            chats.clear();
        }
        chats.insert(chat.to_string(), agent.to_string());
        Ok(())
    }

    /// An adapter watches notes to relay chats (each names its agent and chat).
    pub fn watch_chats(&self) -> Result<ChatWatch, ReachError> {
        use std::sync::atomic::Ordering;
        let n = self.chat_watches.fetch_add(1, Ordering::SeqCst);
        if n >= MAX_CHAT_WATCHES {
            self.chat_watches.fetch_sub(1, Ordering::SeqCst);
            return Err(ReachError::Busy("too many chats are watched"));
        }
        Ok(ChatWatch { notes: self.chat_notes.subscribe(), count: self.chat_watches.clone() })
    }

    /// A note taken for a relay chat: to the adapters that show it.
    pub fn chat_note(&self, note: ChatNote) {
        let _ = self.chat_notes.send(note);
    }

    /// The agent a relay chat belongs to.
    pub fn agent_of_chat(&self, chat: &str) -> Option<String> {
        self.chats.lock().unwrap_or_else(|p| p.into_inner()).get(chat).cloned()
    }

    /// A `turn.delta`, `turn.tool` or `turn.done` from a relay service,
    /// handed to its turn's adapter; refused for a turn not open.
    pub fn turn_event(&self, ev: &Value) -> Result<(), ReachError> {
        let turn = ev.get("turn_id").and_then(Value::as_str).unwrap_or_default();
        let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        let tx = turns.get(turn).ok_or(ReachError::NoSuchTurn)?;
        match tx.try_send(ev.clone()) {
            Ok(()) => {}
            Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {
                return Err(ReachError::Busy("the turn's reader is behind: send again"))
            }
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => {
                turns.remove(turn);
                return Err(ReachError::NoSuchTurn);
            }
        }
        if ev.get("op").and_then(Value::as_str) == Some("turn.done") {
            turns.remove(turn);
        }
        Ok(())
    }

    /// The threads in short, for a host's listing.
    pub fn summary(&self) -> Value {
        self.threads().summary()
    }

    /// What `status` on the socket says: who owns it, the owner's devices
    /// and which of them a message reaches.
    pub fn status(&self) -> Value {
        let subscribed: Vec<EndpointId> =
            self.notifier.as_ref().map(|n| n.subscriptions.owners()).unwrap_or_default();
        let devices: Vec<Value> = self
            .devices
            .all()
            .into_iter()
            .map(|(id, d)| {
                json!({
                    "name": d.name,
                    "node": id.fmt_short().to_string(),
                    "how": d.how.to_string(),
                    "lastSeen": d.last_seen_ms.map(crate::devices::rfc3339),
                    "push": subscribed.contains(&id),
                })
            })
            .collect();
        let push = match &self.notifier {
            Some(n) if n.vapid.is_some() => "on",
            Some(_) => "off (its key is unusable: see the host's log)",
            None => "off (--no-push)",
        };
        json!({"host": self.owner, "pid": std::process::id(), "push": push, "devices": devices})
    }

    /// Logged once at start.
    pub fn describe(&self, socket: &std::path::Path) {
        if self.notifier.as_ref().is_none_or(|n| n.vapid.is_none()) {
            warn!("messages on {} are kept but not pushed: web push is off", socket.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn chat_watches_are_bounded_and_a_note_reaches_each_watch_of_its_agent() {
        let dir = tempfile::tempdir().unwrap();
        let reach = Reach::new(&Home::new(dir.path().join("h")), None, "host");
        let mut held: Vec<ChatWatch> = (0..MAX_CHAT_WATCHES).map(|_| reach.watch_chats().unwrap()).collect();
        assert!(matches!(reach.watch_chats(), Err(ReachError::Busy(_))), "one past the bound is refused");
        // A watch that goes frees its place.
        held.pop();
        let mut w = reach.watch_chats().expect("a freed place is taken again");
        reach.add_chat("chat-1", "butler").unwrap();
        assert_eq!(reach.agent_of_chat("chat-1").as_deref(), Some("butler"));
        assert!(reach.add_chat("", "butler").is_err());
        assert!(reach.add_chat(&"c".repeat(MAX_REQUEST_ID + 1), "butler").is_err());
        reach.chat_note(ChatNote {
            agent: "butler".into(),
            chat: "chat-1".into(),
            id: "m-1".into(),
            text: "hi".into(),
        });
        let n = w.notes.recv().await.unwrap();
        assert_eq!((n.agent.as_str(), n.chat.as_str(), n.text.as_str()), ("butler", "chat-1", "hi"));
    }
}
