//! What observes a session without being part of it: `thunderbolt status`
//! (through the session's [`SessionInfo`]) and the owner's notices (a
//! [`Tap`] each session opens from its agent's [`TapSource`]). The pump shows
//! a tap each run of lines as it passes, the link tells it when the client
//! went away; a tap never holds, changes or delays a run.
//!
//! The serving core knows these traits only: what implements them
//! ([`crate::notify`]) depends on the core, never the other way.

use std::{
    collections::HashSet,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, OnceLock,
    },
};

use bytes::Bytes;
use iroh::EndpointId;
use serde_json::Value;
use thunderbolt_shared::{answer as wire, jsonrpc};
use tokio::sync::mpsc;
use tracing::info;

use super::{
    extension::{Extension, KeptLines},
    requests::Requests,
    session::SessionInfo,
};

/// Whether a client is attached to the session now, asked when the agent
/// needs one (a plain connection is attached for as long as its session lives).
pub type Presence = Box<dyn Fn() -> bool + Send + Sync>;

/// One session's observer.
pub trait Tap: Send + Sync + std::fmt::Debug {
    /// A run of the client's whole lines, on its way to the agent.
    fn client_run(&self, _run: &[u8]) {}
    /// A run of the agent's whole lines, on its way to the client.
    fn agent_run(&self, _run: &[u8]) {}
    /// The client went away; the session waits for it (resumable, warm).
    fn detached(&self) {}
    /// The agent ended, as `end` says (with its last stderr line when it
    /// failed and said why).
    fn agent_ended(&self, _end: &thunderbolt_shared::close::AgentEnd) {}
    /// Takes the one-time token a notice gave for the agent's `request`
    /// (the JSON text of its id): whether it may be answered with it.
    fn redeem(&self, _request: &[u8], _token: &str) -> Redeem {
        Redeem::NotAsked
    }
}

/// What a notice's token is worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redeem {
    /// The right token for a request still waiting: spent now.
    Spent,
    /// A request still waiting, another token.
    Wrong,
    /// No notified request of that id waits (answered, or never asked).
    NotAsked,
}

/// The agent's requests the bridge answered for the client (from a notice)
/// that one session remembers, so the client's own answer to one is dropped
/// (the agent hears exactly one); agents ask one thing at a time.
const MAX_ANSWERED_HERE: usize = 64;

/// An agent's observers: opens each of its sessions' [`Tap`], and answers
/// the bridge's own methods for it, when it has any.
pub trait TapSource: Send + Sync + std::fmt::Debug {
    fn open(&self, session: &Arc<SessionInfo>, presence: Presence) -> Arc<dyn Tap>;
    /// What answers the `_thunderbolt/` methods of this agent's sessions.
    fn methods(&self) -> Option<Arc<dyn Methods>> {
        None
    }
}

/// A method's answer: its result, or a JSON-RPC error code and message.
pub type MethodResult = Result<Value, (i64, String)>;

/// The bridge's own JSON-RPC methods (see [`super::extension`]), for one
/// session's device.
pub trait Methods: Send + Sync {
    /// Whether `method` is one of these.
    fn knows(&self, method: &str) -> bool;
    fn call<'a>(
        &'a self,
        device: EndpointId,
        method: &'a str,
        params: Value,
    ) -> Pin<Box<dyn Future<Output = MethodResult> + Send + 'a>>;
}

/// Told after every re-check of trust (the heartbeat, an allow-file edit,
/// `iroh deny`): what a device no agent admits any more left behind (its
/// push subscriptions) can go.
pub trait OnRevoked: Send + Sync + std::fmt::Debug {
    fn revoked(&self, still_admitted: Box<dyn Fn(&EndpointId) -> bool + Send>);
}

/// What looks at one session's lines as the pump passes them: the record of
/// the client's requests in flight (the core's own), the bridge's methods,
/// and the session's tap.
pub struct Observers {
    pub requests: Arc<Requests>,
    /// The agent's requests its client has not answered yet (a permission,
    /// a question): a session that needs a person, in a device's list.
    pub asks: Requests,
    extension: Extension,
    tap: Option<Arc<dyn Tap>>,
    /// The agent's input, for an answer from a notice.
    to_agent: OnceLock<mpsc::Sender<Bytes>>,
    /// Ids (raw JSON) of the agent's requests answered from a notice.
    answered_here: Mutex<HashSet<Box<[u8]>>>,
    answered_count: AtomicUsize,
    /// The session told which ACP sessions its client names.
    names_into: OnceLock<Arc<SessionInfo>>,
}

/// What becomes of a run of the client's lines.
#[derive(Debug, Default)]
pub struct FromClient {
    /// What goes on to the agent (`None`: nothing).
    pub forward: Option<Bytes>,
    /// The bridge's answers to the client.
    pub replies: Vec<Bytes>,
}

impl Observers {
    pub fn new(
        device: Option<EndpointId>,
        methods: Option<Arc<dyn Methods>>,
        tap: Option<Arc<dyn Tap>>,
    ) -> Self {
        Self {
            requests: Arc::default(),
            asks: Requests::default(),
            extension: Extension::new(device, methods),
            tap,
            to_agent: OnceLock::new(),
            answered_here: Mutex::default(),
            answered_count: 0.into(),
            names_into: OnceLock::new(),
        }
    }

    /// Where the ACP session ids the client names are noted.
    pub fn names_into(&self, info: Arc<SessionInfo>) {
        let _ = self.names_into.set(info);
    }

    /// Where an answer from a notice is written: the queue of the bridge's
    /// own lines to the agent (written between whole lines of the client's).
    pub fn answer_into(&self, to_agent: mpsc::Sender<Bytes>) {
        let _ = self.to_agent.set(to_agent);
    }

    /// Answers the agent's `request` (the JSON text of its id) for the client,
    /// with `result`, if `token` is the one its notice carried. The client's
    /// own answer to it, should it come later, is dropped.
    pub fn answer(
        &self,
        request: &str,
        token: &str,
        result: &serde_json::Map<String, Value>,
    ) -> Result<(), &'static str> {
        let id: Value = serde_json::from_str(request).map_err(|_| wire::REASON_BAD_ANSWER)?;
        if !(id.is_string() || id.is_number()) {
            return Err(wire::REASON_BAD_ANSWER);
        }
        let tap = self.tap.as_ref().ok_or(wire::REASON_ALREADY_ANSWERED)?;
        let to_agent = self.to_agent.get().ok_or(wire::REASON_UNKNOWN_SESSION)?;
        let permit = to_agent.try_reserve().map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => wire::REASON_BUSY,
            mpsc::error::TrySendError::Closed(_) => wire::REASON_UNKNOWN_SESSION,
        })?;
        match tap.redeem(request.as_bytes(), token) {
            Redeem::Spent => {}
            Redeem::Wrong => return Err(wire::REASON_WRONG_TOKEN),
            Redeem::NotAsked => return Err(wire::REASON_ALREADY_ANSWERED),
        }
        let mut line = serde_json::to_vec(&serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}))
            .unwrap_or_default();
        line.push(b'\n');
        {
            let mut here = self.answered_here.lock().unwrap_or_else(|p| p.into_inner());
            if here.len() < MAX_ANSWERED_HERE {
                here.insert(request.as_bytes().into());
                self.answered_count.store(here.len(), Ordering::Relaxed);
            }
        }
        // The notices see it as the client's answer: its notice is withdrawn.
        tap.client_run(&line);
        self.asks.answered_id(request.as_bytes());
        permit.send(line.into());
        Ok(())
    }

    /// Drops the client's answers to requests answered from a notice.
    fn drop_answered_here(&self, run: Bytes) -> Option<Bytes> {
        if self.answered_count.load(Ordering::Relaxed) == 0 {
            return Some(run);
        }
        let mut here = self.answered_here.lock().unwrap_or_else(|p| p.into_inner());
        let mut kept = KeptLines::new(&run);
        for line in thunderbolt_shared::ndjson::lines(&run) {
            let answered_here = jsonrpc::response_id(line).filter(|id| here.remove(*id));
            if let Some(id) = answered_here {
                info!(
                    "the client's answer to the agent's request {} dropped: it was answered from a notice",
                    String::from_utf8_lossy(id)
                );
            }
            kept.line(line, answered_here.is_none());
        }
        self.answered_count.store(here.len(), Ordering::Relaxed);
        kept.finish()
    }

    /// The session's tap, if it has one.
    pub fn tap(&self) -> Option<&Arc<dyn Tap>> {
        self.tap.as_ref()
    }

    /// A run of the client's whole lines: the bridge's own methods are
    /// answered here and go no further; the rest goes on to the agent.
    pub async fn from_client(&self, run: Bytes, names_an_id: bool) -> FromClient {
        let mut out = self.extension.answer(run).await;
        out.forward = out.forward.and_then(|run| self.drop_answered_here(run));
        if let Some(run) = &out.forward {
            if let Some(t) = &self.tap {
                t.client_run(run);
            }
            if let Some(info) = self.names_into.get() {
                info.note_acp_sessions(run, names_an_id);
            }
            if names_an_id {
                self.requests.sent(run);
                self.asks.answered(run);
            }
        }
        out
    }

    /// A run of the agent's whole lines, on its way to the client.
    pub fn from_agent(&self, run: &[u8], names_an_id: bool) {
        if names_an_id {
            self.requests.answered(run);
            self.asks.sent(run);
        }
        if let Some(t) = &self.tap {
            t.agent_run(run);
        }
    }
}
