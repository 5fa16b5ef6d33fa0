//! What observes a session without being part of it: `thunderbolt status`
//! (through the session's [`SessionInfo`]) and the owner's notices (a
//! [`Tap`] each session opens from its agent's [`TapSource`]). The pump shows
//! a tap each run of lines as it passes, the link tells it when the client
//! went away; a tap never holds, changes or delays a run.
//!
//! The serving core knows these traits only: what implements them
//! ([`crate::notify`]) depends on the core, never the other way.

use std::{future::Future, pin::Pin, sync::Arc};

use bytes::Bytes;
use iroh::EndpointId;
use serde_json::Value;

use super::{extension::Extension, requests::Requests, session::SessionInfo};

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
}

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
    extension: Extension,
    tap: Option<Arc<dyn Tap>>,
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
        Self { requests: Arc::default(), extension: Extension::new(device, methods), tap }
    }

    /// The session's tap, if it has one.
    pub fn tap(&self) -> Option<&Arc<dyn Tap>> {
        self.tap.as_ref()
    }

    /// A run of the client's whole lines: the bridge's own methods are
    /// answered here and go no further; the rest goes on to the agent.
    pub async fn from_client(&self, run: Bytes) -> FromClient {
        let out = self.extension.answer(run).await;
        if let Some(run) = &out.forward {
            if let Some(t) = &self.tap {
                t.client_run(run);
            }
            self.requests.sent(run);
        }
        out
    }

    /// A run of the agent's whole lines, on its way to the client.
    pub fn from_agent(&self, run: &[u8]) {
        self.requests.answered(run);
        if let Some(t) = &self.tap {
            t.agent_run(run);
        }
    }
}
