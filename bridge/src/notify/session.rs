//! One session's side of notices: what the pump shows it, as it passes.
//!
//! From the agent: its requests to the client (`session/request_permission`,
//! an elicitation, any request) and the answers to the client's
//! `session/prompt`s (the turn's `stopReason`). A request that passes while
//! the client is attached is remembered until the client answers it: when the
//! session detaches first (a locked phone's connection is found lost seconds
//! later) it is notified then.
//!
//! From the client: the bridge's own extension methods, answered by the
//! bridge and never forwarded to the agent (JSON-RPC methods starting with
//! `_` are extensions; `_thunderbolt/` is ours):
//!
//! - `_thunderbolt/push/key` → `{"applicationServerKey": "<base64url>"}`, the
//!   VAPID public key for `pushManager.subscribe`;
//! - `_thunderbolt/push/subscribe` with `PushSubscription.toJSON()` as params
//!   → `{"subscribed": true}`: the subscription belongs to this session's
//!   device (its NodeId);
//! - `_thunderbolt/push/unsubscribe` `{"endpoint": …}` → `{"removed": true}`:
//!   this device's subscription at that endpoint is gone (whether or not it
//!   was there: the answer says nothing of what a push service answered).
//!
//! With Web Push off they are answered -32601 (method not found), as a bridge
//! that predates them would have its agent do.
//!
//! The fast path is a substring search per run of lines: runs that name
//! neither `"_thunderbolt/` nor `session/prompt` (client) or carry no
//! `"method"` and no awaited prompt answer (agent) pass untouched.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
};

use bytes::{Bytes, BytesMut};
use memchr::memmem;
use serde_json::{json, Value};
use thunderbolt_shared::jsonrpc;
use tracing::{debug, info, warn};

use super::{
    limit::{Held, Limiter},
    push::{AddError, Subscription, MAX_ENDPOINT},
    Event, Kind, Notifier,
};
use crate::{serve::session::SessionInfo, trust::TrustPolicy};

/// The prefix of the bridge's own methods.
pub const EXTENSION_PREFIX: &str = "_thunderbolt/";
pub const METHOD_PUSH_KEY: &str = "_thunderbolt/push/key";
pub const METHOD_PUSH_SUBSCRIBE: &str = "_thunderbolt/push/subscribe";
pub const METHOD_PUSH_UNSUBSCRIBE: &str = "_thunderbolt/push/unsubscribe";

/// Prompts of the client's tracked at once for their turn's end (a client
/// sends one at a time; this bounds one that never waits).
const MAX_PROMPTS: usize = 256;

/// Agent requests remembered while the client is attached, in case it goes
/// before answering (agents ask one thing at a time; this bounds a flood).
const MAX_WAITING: usize = 64;

/// The longest piece of the agent's own words put into a notice
/// (`--notify-text`): a title, not the whole diff.
const MAX_TEXT: usize = 200;

/// What a hosted agent (or the single bridge's agent) notifies with.
#[derive(Debug)]
pub struct AgentNotify {
    pub notifier: Arc<Notifier>,
    /// Its name (the protocol for the single-agent bridge).
    pub agent: Arc<str>,
    /// What people call it.
    pub label: Arc<str>,
    /// Who may still use it: a device no longer allowed gets nothing.
    pub trust: Arc<dyn TrustPolicy>,
}

/// Whether a client is attached to the session now.
pub type Attached = Box<dyn Fn() -> bool + Send + Sync>;

/// A notice not sent yet: what happened, and the agent's words for it.
type Pending = (Kind, Option<String>);

/// One session's notices.
pub struct SessionNotices {
    hook: Option<(Arc<AgentNotify>, Arc<SessionInfo>)>,
    attached: Attached,
    /// Ids (raw JSON) of the client's `session/prompt`s not answered yet.
    prompts: Mutex<HashSet<Box<[u8]>>>,
    prompt_count: AtomicUsize,
    /// The agent's requests that passed while the client was attached and
    /// that it has not answered: id (raw JSON) → the notice it would be.
    waiting: Mutex<HashMap<Box<[u8]>, Pending>>,
    waiting_count: AtomicUsize,
    limit: Mutex<Limiter>,
    /// Whether a notice would reach anyone: a `--notify-url`, or a push
    /// subscription of the session's device. Until it would, the stream is
    /// not looked at.
    reachable: std::sync::atomic::AtomicBool,
    /// The subscriptions' generation `reachable` was worked out at
    /// (`u64::MAX`: never).
    checked: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for SessionNotices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionNotices").field("on", &self.hook.is_some()).finish()
    }
}

/// What becomes of a run of the client's lines.
#[derive(Debug, Default)]
pub struct FromClient {
    /// What goes on to the agent (`None`: nothing).
    pub forward: Option<Bytes>,
    /// The bridge's answers to the client.
    pub replies: Vec<Bytes>,
}

impl SessionNotices {
    /// `hook`: the agent's notices and the session, when notices are on.
    pub fn new(hook: Option<(Arc<AgentNotify>, Arc<SessionInfo>)>, attached: Attached) -> Self {
        Self {
            hook,
            attached,
            prompts: Mutex::default(),
            prompt_count: 0.into(),
            waiting: Mutex::default(),
            waiting_count: 0.into(),
            limit: Mutex::new(Limiter::new(super::limit::BURST, super::limit::EVERY)),
            reachable: false.into(),
            checked: u64::MAX.into(),
        }
    }

    /// Whether a notice of this session would reach anyone: a `--notify-url`,
    /// or a push subscription of its device's (looked up in memory when the
    /// subscriptions changed; else two atomic loads).
    fn reachable(&self) -> bool {
        let Some((hook, info)) = &self.hook else { return false };
        if hook.notifier.config.webhook.is_some() {
            return true;
        }
        let subs = &hook.notifier.subscriptions;
        let now = subs.generation();
        if self.checked.load(Ordering::Acquire) == now {
            return self.reachable.load(Ordering::Acquire);
        }
        let yes = hook.notifier.vapid.is_some() && subs.has(&info.peer);
        self.reachable.store(yes, Ordering::Release);
        self.checked.store(now, Ordering::Release);
        yes
    }

    /// Notices off: only the extension methods are answered (with -32601).
    pub fn off() -> Self {
        Self::new(None, Box::new(|| true))
    }

    /// A run of the client's whole lines, on its way to the agent.
    pub async fn from_client(&self, run: Bytes) -> FromClient {
        let ours = memmem::find(&run, EXTENSION_PREFIX.as_bytes()).is_some();
        let on = self.reachable();
        let prompt = on && memmem::find(&run, b"session/prompt").is_some();
        let answers = self.waiting_count.load(Ordering::Relaxed) > 0;
        if !ours && !prompt && !answers {
            return FromClient { forward: Some(run), replies: Vec::new() };
        }
        let mut out = FromClient::default();
        let mut kept: Option<BytesMut> = None;
        let mut at = 0;
        for line in run.split_inclusive(|b| *b == b'\n') {
            let start = at;
            at += line.len();
            if answers {
                if let Some(id) = jsonrpc::response_id(line) {
                    self.answered_by_client(id);
                }
            }
            if prompt {
                if let Some((id, b"\"session/prompt\"")) = jsonrpc::request_head(line) {
                    self.track_prompt(id);
                }
            }
            if ours && memmem::find(line, EXTENSION_PREFIX.as_bytes()).is_some() {
                if let Some(reply) = self.extension(line).await {
                    // The lines before this one go on as they were; this one stops here.
                    kept.get_or_insert_with(|| BytesMut::from(&run[..start]));
                    out.replies.extend(reply);
                    continue;
                }
            }
            if let Some(k) = kept.as_mut() {
                k.extend_from_slice(line);
            }
        }
        out.forward = match kept {
            None => Some(run),
            Some(k) if k.is_empty() => None,
            Some(k) => Some(k.freeze()),
        };
        out
    }

    /// A run of the agent's whole lines, on its way to the client.
    pub fn from_agent(&self, run: &[u8]) {
        let Some((hook, info)) = &self.hook else { return };
        if !self.reachable() {
            return;
        }
        let requests = memmem::find(run, b"\"method\"").is_some();
        let prompts = self.prompt_count.load(Ordering::Relaxed) > 0;
        if !requests && !prompts {
            return;
        }
        for line in run.split_inclusive(|b| *b == b'\n') {
            if requests {
                if let Some((id, method)) = jsonrpc::request_head(line) {
                    let method = String::from_utf8_lossy(method.get(1..method.len() - 1).unwrap_or_default())
                        .into_owned();
                    let text = hook.notifier.config.text.then(|| asked(line)).flatten();
                    self.agent_asks(hook, info, id, Kind::NeedsAnswer { method }, text);
                    continue;
                }
            }
            if prompts {
                if let Some(id) = jsonrpc::response_id(line) {
                    if self.prompt_answered(id) {
                        let stop_reason = stop_reason(line);
                        let kind = Kind::Finished { stop_reason };
                        if self.wanted() {
                            self.send(hook, info, kind, None);
                        }
                    }
                }
            }
        }
    }

    /// The client went away (the session is detached): what the agent asked
    /// it and it did not answer is notified now.
    pub fn detached(&self) {
        let Some((hook, info)) = &self.hook else { return };
        let left: Vec<_> = {
            let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            self.waiting_count.store(0, Ordering::Relaxed);
            w.drain().map(|(_, v)| v).collect()
        };
        if let Some((kind, text)) = left.into_iter().next() {
            self.send(hook, info, kind, text);
        }
    }

    fn wanted(&self) -> bool {
        self.hook.as_ref().is_some_and(|(h, _)| h.notifier.config.always) || !(self.attached)()
    }

    fn agent_asks(
        &self,
        hook: &AgentNotify,
        info: &SessionInfo,
        id: &[u8],
        kind: Kind,
        text: Option<String>,
    ) {
        if self.wanted() {
            self.send(hook, info, kind, text);
            return;
        }
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = w.get_mut(id) {
            *slot = (kind, text);
        } else if w.len() < MAX_WAITING {
            w.insert(id.into(), (kind, text));
            self.waiting_count.store(w.len(), Ordering::Relaxed);
        }
    }

    fn answered_by_client(&self, id: &[u8]) {
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        w.remove(id);
        self.waiting_count.store(w.len(), Ordering::Relaxed);
    }

    fn track_prompt(&self, id: &[u8]) {
        let mut p = self.prompts.lock().unwrap_or_else(|p| p.into_inner());
        if !p.contains(id) && p.len() < MAX_PROMPTS {
            p.insert(id.into());
            self.prompt_count.store(p.len(), Ordering::Relaxed);
        }
    }

    fn prompt_answered(&self, id: &[u8]) -> bool {
        let mut p = self.prompts.lock().unwrap_or_else(|p| p.into_inner());
        let was = p.remove(id);
        self.prompt_count.store(p.len(), Ordering::Relaxed);
        was
    }

    /// Hands the notice on, within the session's rate limit, its device's
    /// and the bridge's ([`super::limit`]); never waits.
    fn send(&self, hook: &AgentNotify, info: &SessionInfo, kind: Kind, text: Option<String>) {
        let more = {
            let mut limit = self.limit.lock().unwrap_or_else(|p| p.into_inner());
            match limit.take() {
                Some(more) => more,
                None => {
                    let held = limit.held();
                    if held == 1 {
                        info!(
                            session = %info.id,
                            "notices of this session are held back: at most {} at once, then one per {:?} \
                             (the next one says how many were held)",
                            super::limit::BURST,
                            super::limit::EVERY
                        );
                    } else {
                        debug!(session = %info.id, "notice held back ({held} so far)");
                    }
                    return;
                }
            }
        };
        if let Err(held) = hook.notifier.budget(&info.peer) {
            // Counted in the session's, so its next notice says so.
            self.limit.lock().unwrap_or_else(|p| p.into_inner()).hold();
            let peer = info.peer.fmt_short();
            match held {
                Held::Device(1) => info!(
                    %peer,
                    "notices of this device are held back: at most {} at once across its sessions, then one per {:?}",
                    super::limit::DEVICE_BURST,
                    super::limit::DEVICE_EVERY
                ),
                Held::Bridge(1) => info!(
                    "notices of this bridge are held back: at most {} at once, then one per {:?}",
                    super::limit::BRIDGE_BURST,
                    super::limit::BRIDGE_EVERY
                ),
                Held::Device(n) => info!(%peer, "notice of this device held back ({n} so far)"),
                Held::Bridge(n) => debug!("notice held back by the bridge's limit ({n} so far)"),
            }
            return;
        }
        hook.notifier.notify(Event {
            agent: hook.agent.clone(),
            label: hook.label.clone(),
            session: info.id.clone(),
            peer: info.peer,
            kind,
            text,
            more,
            allowed: hook.trust.check(&info.peer).is_some(),
        });
    }

    /// The bridge's answer to one of its extension lines; `None` when the line
    /// is not one (it goes to the agent); `Some(None)` for a notification.
    async fn extension(&self, line: &[u8]) -> Option<Option<Bytes>> {
        let v: Value = serde_json::from_slice(line).ok()?;
        let method = v.get("method")?.as_str()?;
        if !method.starts_with(EXTENSION_PREFIX) {
            return None;
        }
        let id = v.get("id").cloned();
        let result = self.handle(method, v.get("params").cloned().unwrap_or(Value::Null)).await;
        let id = id?;
        let line = match result {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err((code, message)) => {
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
            }
        };
        let mut b = serde_json::to_vec(&line).unwrap_or_default();
        b.push(b'\n');
        Some(Some(b.into()))
    }

    async fn handle(&self, method: &str, params: Value) -> Result<Value, (i64, String)> {
        const NOT_FOUND: i64 = -32601;
        const INVALID: i64 = -32602;
        const FAILED: i64 = -32603;
        // A server error (JSON-RPC's -32000 to -32099): the bridge is full.
        const FULL: i64 = -32001;
        let push =
            self.hook.as_ref().and_then(|(h, i)| h.notifier.vapid.clone().map(|v| (h.clone(), i.clone(), v)));
        let known = [METHOD_PUSH_KEY, METHOD_PUSH_SUBSCRIBE, METHOD_PUSH_UNSUBSCRIBE];
        if !known.contains(&method) {
            return Err((NOT_FOUND, format!("{method}: no such method of this bridge")));
        }
        let Some((hook, info, vapid)) = push else {
            return Err((NOT_FOUND, format!("{method}: web push is off on this bridge")));
        };
        let subs = hook.notifier.subscriptions.clone();
        let peer = info.peer;
        let short = peer.fmt_short().to_string();
        match method {
            METHOD_PUSH_KEY => Ok(json!({"applicationServerKey": vapid.public_b64()})),
            METHOD_PUSH_SUBSCRIBE => {
                let sub = Subscription::from_json(&params, hook.notifier.policy)
                    .map_err(|e| (INVALID, e.to_string()))?;
                let origin = sub.origin();
                match subs.add(&peer, sub).await {
                    Ok(()) => {
                        info!(peer = %short, "push subscription registered (push service {origin})");
                        Ok(json!({"subscribed": true}))
                    }
                    Err(e @ AddError::Full) => {
                        warn!(peer = %short, "push subscription refused: {e}");
                        Err((FULL, e.to_string()))
                    }
                    Err(e @ AddError::Save(_)) => {
                        let why = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
                        warn!(peer = %short, "could not save a push subscription: {why}");
                        Err((FAILED, e.to_string()))
                    }
                }
            }
            _ => {
                let endpoint = params["endpoint"]
                    .as_str()
                    .ok_or_else(|| (INVALID, "params.endpoint (a string) is required".to_string()))?;
                if endpoint.len() > MAX_ENDPOINT {
                    // Never stored: nothing to remove.
                    return Ok(json!({"removed": true}));
                }
                // Stored endpoints are normalised URLs.
                let endpoint =
                    reqwest::Url::parse(endpoint).map(|u| u.to_string()).unwrap_or(endpoint.to_string());
                // The same answer whatever was there: whether a push service
                // said it is gone is not the device's to learn here.
                match subs.remove(&peer, &endpoint).await {
                    Ok(()) => {
                        debug!(peer = %short, "push subscription removed by its device");
                        Ok(json!({"removed": true}))
                    }
                    Err(e) => {
                        warn!(peer = %short, "could not save the push subscriptions: {e}");
                        Err((FAILED, "the bridge could not update its subscriptions".to_string()))
                    }
                }
            }
        }
    }
}

/// What an agent's request asks, in its own words: a permission request's
/// tool call title, an elicitation's message.
fn asked(line: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(line).ok()?;
    let p = v.get("params")?;
    let text = p
        .pointer("/toolCall/title")
        .or_else(|| p.get("message"))
        .or_else(|| p.get("title"))
        .and_then(Value::as_str)?;
    let mut t: String = text.chars().take(MAX_TEXT).collect();
    if t.len() < text.len() {
        t.push('…');
    }
    Some(t)
}

/// A prompt answer's `stopReason`; `error` for an error answer.
fn stop_reason(line: &[u8]) -> String {
    let v: Value = serde_json::from_slice(line).unwrap_or_default();
    if v.get("error").is_some() {
        return "error".to_string();
    }
    v.pointer("/result/stopReason").and_then(Value::as_str).unwrap_or("unknown").chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn extension_lines_never_reach_the_agent_and_others_pass_whole() {
        let n = SessionNotices::off();
        let run = Bytes::from_static(
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}\n\
              {\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"_thunderbolt/push/key\"}\n\
              {\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"x\",\"params\":{\"t\":\"_thunderbolt/ in text\"}}\n",
        );
        let out = n.from_client(run).await;
        let fwd = out.forward.unwrap();
        assert!(fwd.starts_with(b"{\"jsonrpc\":\"2.0\",\"id\":1,"));
        assert!(memmem::find(&fwd, b"push/key").is_none());
        assert!(memmem::find(&fwd, b"in text").is_some(), "a mention in a string is not a call");
        assert_eq!(out.replies.len(), 1);
        let v: Value = serde_json::from_slice(&out.replies[0]).unwrap();
        assert_eq!(v["id"], 2);
        assert_eq!(v["error"]["code"], -32601);

        let plain = Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}\n");
        let out = n.from_client(plain.clone()).await;
        assert_eq!(out.forward.unwrap().as_ptr(), plain.as_ptr(), "untouched, not copied");

        let only = Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"_thunderbolt/nope\"}\n");
        let out = n.from_client(only).await;
        assert!(out.forward.is_none());
        assert_eq!(out.replies.len(), 1);
    }

    #[test]
    fn stop_reasons_and_asked_text() {
        assert_eq!(
            stop_reason(br#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}"#),
            "end_turn"
        );
        assert_eq!(stop_reason(br#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x"}}"#), "error");
        let line = br#"{"jsonrpc":"2.0","id":1,"method":"session/request_permission","params":{"toolCall":{"title":"rm -rf build"}}}"#;
        assert_eq!(asked(line).as_deref(), Some("rm -rf build"));
    }
}
