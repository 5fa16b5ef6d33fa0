//! One session's side of notices: what the pump shows it, as it passes.
//!
//! From the agent: its requests to the client (`session/request_permission`,
//! an elicitation, any request), the answers to the client's
//! `session/prompt`s (the turn's `stopReason`) and, when notices say things in
//! words, the tool calls its `session/update`s report during a turn. A request
//! that passes while the client is attached is remembered until the client
//! answers it: when the session detaches first (a locked phone's connection is
//! found lost seconds later) it is notified then.
//!
//! From the client: the answers to those requests, and its `session/prompt`s.
//!
//! It is the session's [`Tap`]: it sees each run of lines as the pump passes
//! it and never holds one. Runs that carry no `"method"` and no awaited answer
//! pass with a substring search or two.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
};

use memchr::memmem;
use serde_json::Value;
use thunderbolt_shared::jsonrpc;
use tracing::{debug, info};

use super::{
    limit::{Held, Limiter},
    words::{self, Tally},
    Event, Kind, Notifier,
};
use crate::{
    serve::{
        session::SessionInfo,
        taps::{Methods, Presence, Redeem, Tap, TapSource},
    },
    trust::TrustPolicy,
};

/// Prompts of the client's tracked at once for their turn's end (a client
/// sends one at a time; this bounds one that never waits).
const MAX_PROMPTS: usize = 256;

/// Agent requests remembered while the client is attached, in case it goes
/// before answering (agents ask one thing at a time; this bounds a flood).
const MAX_WAITING: usize = 64;

/// What a hosted agent (or the single bridge's agent) notifies with.
#[derive(Debug, Clone)]
pub struct AgentNotify {
    pub notifier: Arc<Notifier>,
    /// Its name (the protocol for the single-agent bridge).
    pub agent: Arc<str>,
    /// What people call it.
    pub label: Arc<str>,
    /// Who may still use it: a device no longer allowed gets nothing.
    pub trust: Arc<dyn TrustPolicy>,
    /// Its endpoint's NodeId, named in every notice.
    pub node: Arc<str>,
    /// Its protocol (`acp`, `mcp`): the answer door's ALPN is `thunderbolt/<p>/answer1`.
    pub protocol: Arc<str>,
}

/// A notice not sent yet: what happened, and the agent's words for it.
type Pending = (Kind, Option<String>);

/// Requests of the agent's that were notified and not answered yet, kept so
/// that their notices are withdrawn once they are (a bound like
/// [`MAX_WAITING`]'s: agents ask one thing at a time).
const MAX_NOTIFIED: usize = 64;

/// One session's notices.
pub struct SessionNotices {
    hook: Option<(Arc<AgentNotify>, Arc<SessionInfo>)>,
    attached: Presence,
    /// Ids (raw JSON) of the client's `session/prompt`s not answered yet →
    /// the ACP session each is for, when its turn's tool calls are counted.
    prompts: Mutex<HashMap<Box<[u8]>, Option<String>>>,
    prompt_count: AtomicUsize,
    /// The tool calls of each ACP session's turn under way (one per prompt
    /// in `prompts`, so as bounded), when notices say things in words.
    turns: Mutex<HashMap<String, Tally>>,
    /// The agent's requests that passed while the client was attached and
    /// that it has not answered: id (raw JSON) → the notice it would be.
    waiting: Mutex<HashMap<Box<[u8]>, Pending>>,
    waiting_count: AtomicUsize,
    /// The agent's requests a notice was sent for, not answered yet: id (raw
    /// JSON) → the SHA-256 of the one-time token its notice carried.
    notified: Mutex<HashMap<Box<[u8]>, [u8; 32]>>,
    notified_count: AtomicUsize,
    /// A notice of this session was sent: its end withdraws what is shown.
    sent_any: std::sync::atomic::AtomicBool,
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

impl TapSource for AgentNotify {
    fn open(&self, session: &Arc<SessionInfo>, presence: Presence) -> Arc<dyn Tap> {
        Arc::new(SessionNotices::new(Some((Arc::new(self.clone()), session.clone())), presence))
    }

    fn methods(&self) -> Option<Arc<dyn Methods>> {
        super::methods::PushMethods::of(&self.notifier).map(|m| Arc::new(m) as Arc<dyn Methods>)
    }
}

impl Drop for SessionNotices {
    /// The session is over: what it showed is taken back.
    fn drop(&mut self) {
        if self.sent_any.load(Ordering::Relaxed) {
            self.withdraw(Kind::Ended, None);
        }
    }
}

impl Tap for SessionNotices {
    fn client_run(&self, run: &[u8]) {
        self.from_client(run)
    }

    fn agent_run(&self, run: &[u8]) {
        self.from_agent(run)
    }

    fn detached(&self) {
        SessionNotices::detached(self)
    }

    fn agent_ended(&self, end: &thunderbolt_shared::close::AgentEnd) {
        self.agent_stopped(end)
    }

    fn redeem(&self, request: &[u8], token: &str) -> Redeem {
        SessionNotices::redeem(self, request, token)
    }
}

impl SessionNotices {
    /// `hook`: the agent's notices and the session, when notices are on.
    pub fn new(hook: Option<(Arc<AgentNotify>, Arc<SessionInfo>)>, attached: Presence) -> Self {
        Self {
            hook,
            attached,
            prompts: Mutex::default(),
            prompt_count: 0.into(),
            turns: Mutex::default(),
            waiting: Mutex::default(),
            waiting_count: 0.into(),
            notified: Mutex::default(),
            notified_count: 0.into(),
            sent_any: false.into(),
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

    /// A run of the client's whole lines, on its way to the agent: its
    /// answers to what the agent asked, its prompts.
    pub fn from_client(&self, run: &[u8]) {
        let prompt = self.reachable() && memmem::find(run, b"session/prompt").is_some();
        let answers =
            self.waiting_count.load(Ordering::Relaxed) > 0 || self.notified_count.load(Ordering::Relaxed) > 0;
        if !prompt && !answers {
            return;
        }
        for line in thunderbolt_shared::ndjson::lines(run) {
            if answers {
                if let Some(id) = jsonrpc::response_id(line) {
                    self.answered_by_client(id);
                }
            }
            if prompt {
                if let Some((id, b"\"session/prompt\"")) = jsonrpc::request_head(line) {
                    self.track_prompt(id, line);
                }
            }
        }
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
        let worded = hook.notifier.config.worded();
        for line in thunderbolt_shared::ndjson::lines(run) {
            if requests {
                if let Some((id, method)) = jsonrpc::request_head(line) {
                    let method = String::from_utf8_lossy(method.get(1..method.len() - 1).unwrap_or_default())
                        .into_owned();
                    let asked = if worded { words::asked(line) } else { Default::default() };
                    let options = permission_options(line);
                    let kind = Kind::NeedsAnswer { method, options, words: asked.words };
                    self.agent_asks(hook, info, id, kind, asked.own);
                    continue;
                }
            }
            if prompts {
                if worded && memmem::find(line, b"tool_call").is_some() {
                    self.tool_call_seen(line);
                }
                if let Some(id) = jsonrpc::response_id(line) {
                    if let Some(summary) = self.prompt_answered(id) {
                        let stop_reason = stop_reason(line);
                        let kind = Kind::Finished { stop_reason, summary };
                        if self.wanted() {
                            self.send(hook, info, kind, None, None);
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
            w.drain().collect()
        };
        if let Some((id, (kind, text))) = left.into_iter().next() {
            self.send(hook, info, kind, text, Some(&id));
        }
    }

    /// The agent failed (a non-zero exit, a signal): the device is told,
    /// with the agent's last stderr line when notices say things in words
    /// (it says why: a missing key, a crash). A clean exit is no news.
    pub fn agent_stopped(&self, end: &thunderbolt_shared::close::AgentEnd) {
        let Some((hook, info)) = &self.hook else { return };
        if end.is_success() || !self.reachable() || !self.wanted() {
            return;
        }
        let kind = Kind::Stopped { how: end.exit_reason(), said: end.describe() };
        self.send(hook, info, kind, None, None);
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
            self.send(hook, info, kind, text, Some(id));
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
        {
            let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            w.remove(id);
            self.waiting_count.store(w.len(), Ordering::Relaxed);
        }
        let was_notified = {
            let mut n = self.notified.lock().unwrap_or_else(|p| p.into_inner());
            let was = n.remove(id).is_some();
            self.notified_count.store(n.len(), Ordering::Relaxed);
            was
        };
        if was_notified {
            self.withdraw(Kind::Answered, Some(id));
        }
    }

    /// Takes back what was shown of a question (or, at the session's end, of
    /// the session): outside the rate limits, which bound the notices it
    /// withdraws (one withdrawal per notified question, one per session).
    fn withdraw(&self, kind: Kind, request: Option<&[u8]>) {
        if let Some((hook, event)) = self.event(kind, request, 0, None) {
            hook.notifier.notify(event);
        }
    }

    /// Whether `token` answers the notified `request` (and it is spent).
    fn redeem(&self, request: &[u8], token: &str) -> Redeem {
        {
            let mut n = self.notified.lock().unwrap_or_else(|p| p.into_inner());
            match n.get(request) {
                None => return Redeem::NotAsked,
                Some(h) if *h != token_hash(token) => return Redeem::Wrong,
                Some(_) => {}
            }
            n.remove(request);
            self.notified_count.store(n.len(), Ordering::Relaxed);
        }
        self.withdraw(Kind::Answered, Some(request));
        Redeem::Spent
    }

    /// The notice `kind` of this session, and the agent's hook that sends it.
    fn event(
        &self,
        kind: Kind,
        request: Option<&[u8]>,
        more: u64,
        text: Option<String>,
    ) -> Option<(&AgentNotify, Event)> {
        let (hook, info) = self.hook.as_ref()?;
        let event = Event {
            agent: hook.agent.clone(),
            label: hook.label.clone(),
            session: info.id.clone(),
            peer: info.peer,
            kind,
            request: request.map(|r| String::from_utf8_lossy(r).into_owned()),
            answer: None,
            node: hook.node.clone(),
            protocol: hook.protocol.clone(),
            text,
            more,
            allowed: hook.trust.check(&info.peer).is_some(),
        };
        Some((hook, event))
    }

    /// Remembers the client's prompt `line` (of JSON-RPC id `id`) until its
    /// answer ends the turn; when notices say things in words, the turn's
    /// tool calls are counted from now on.
    fn track_prompt(&self, id: &[u8], line: &[u8]) {
        let worded = self.hook.as_ref().is_some_and(|(h, _)| h.notifier.config.worded());
        let session = if worded { words::prompt_session(line) } else { None };
        let mut p = self.prompts.lock().unwrap_or_else(|p| p.into_inner());
        if !p.contains_key(id) && p.len() < MAX_PROMPTS {
            if let Some(s) = &session {
                // A new turn of the session counts from nothing.
                self.turns.lock().unwrap_or_else(|p| p.into_inner()).insert(s.clone(), Tally::default());
            }
            p.insert(id.into(), session);
            self.prompt_count.store(p.len(), Ordering::Relaxed);
        }
    }

    /// A tool call update of the agent's, counted in its session's turn
    /// (of a session with no turn under way, or not a tool call: nothing).
    fn tool_call_seen(&self, line: &[u8]) {
        let Some((session, seen)) = words::tool_update(line) else { return };
        if let Some(turn) = self.turns.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&session) {
            turn.saw(seen);
        }
    }

    /// Whether `id` answers a prompt of the client's (the turn ended): then
    /// `Some`, with what its tool calls did when they were counted.
    fn prompt_answered(&self, id: &[u8]) -> Option<Option<words::Summary>> {
        let session = {
            let mut p = self.prompts.lock().unwrap_or_else(|p| p.into_inner());
            let was = p.remove(id);
            self.prompt_count.store(p.len(), Ordering::Relaxed);
            was?
        };
        let turn = session.and_then(|s| self.turns.lock().unwrap_or_else(|p| p.into_inner()).remove(&s));
        Some(turn.map(|t| t.summary()))
    }

    /// Hands the notice on, within the session's rate limit, its device's
    /// and the bridge's ([`super::limit`]); never waits.
    fn send(
        &self,
        hook: &AgentNotify,
        info: &SessionInfo,
        kind: Kind,
        text: Option<String>,
        request: Option<&[u8]>,
    ) {
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
        let question = matches!(kind, Kind::NeedsAnswer { .. });
        let request = request.filter(|_| question);
        let Some((_, mut event)) = self.event(kind, request, more, text) else { return };
        if let Some(id) = request {
            // The notice's one-time token: the device may answer this request
            // with it, from the notice (`thunderbolt/<p>/answer1`).
            let mut n = self.notified.lock().unwrap_or_else(|p| p.into_inner());
            if n.len() < MAX_NOTIFIED || n.contains_key(id) {
                let token = crate::ids::random_hex(16);
                n.insert(id.into(), token_hash(&token));
                self.notified_count.store(n.len(), Ordering::Relaxed);
                event.answer = Some(token);
            }
        }
        hook.notifier.notify(event);
        self.sent_any.store(true, Ordering::Relaxed);
    }
}

/// The SHA-256 of a notice's answer token (the token itself is kept nowhere).
fn token_hash(token: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(token.as_bytes()).into()
}

/// Options a permission notice names at the most (ACP's are two to four),
/// and how long their ids and names may be there: with the rest, a notice
/// stays well inside one Web Push record (3993 bytes).
const MAX_OPTIONS: usize = 8;
const MAX_OPTION_ID: usize = 64;
const MAX_OPTION_NAME: usize = 80;

/// A permission request's options (`params.options`: `optionId`, `name`,
/// `kind`), bounded, for the notice's actions; `None` for other requests.
fn permission_options(line: &[u8]) -> Option<Value> {
    memmem::find(line, b"\"options\"")?;
    let v: Value = serde_json::from_slice(line).ok()?;
    let clip = |v: &Value, n: usize| v.as_str().map(|s| s.chars().take(n).collect::<String>());
    let options: Vec<Value> = v
        .pointer("/params/options")?
        .as_array()?
        .iter()
        .take(MAX_OPTIONS)
        .filter_map(|o| {
            Some(serde_json::json!({
                "optionId": clip(o.get("optionId")?, MAX_OPTION_ID)?,
                "name": clip(o.get("name")?, MAX_OPTION_NAME).unwrap_or_default(),
                "kind": clip(o.get("kind")?, 32).unwrap_or_default(),
            }))
        })
        .collect();
    (!options.is_empty()).then_some(Value::Array(options))
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

    #[test]
    fn stop_reasons() {
        assert_eq!(
            stop_reason(br#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}"#),
            "end_turn"
        );
        assert_eq!(stop_reason(br#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x"}}"#), "error");
    }
}
