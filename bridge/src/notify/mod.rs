//! Notices to the owner: an agent waits for an answer, or finished its turn,
//! while no client is attached (a resumable session whose client is away, a
//! warm agent between connections), or always, if configured.
//!
//! The bridge already reads every JSON-RPC line it carries; a session's
//! [`session::SessionNotices`] looks at the agent's requests and at the answers
//! to the client's `session/prompt`s as they pass, never holding a byte: a
//! notice is handed to the [`Notifier`]'s queue with `try_send`, and is
//! dropped (and counted) when the queue is full. A session notifies at most
//! [`limit::BURST`] times at once, then once per [`limit::EVERY`]; a device,
//! across its sessions, and the whole bridge have a bucket each too
//! ([`limit::Budgets`]). Each device's notices are delivered by a task of its
//! own, in order; devices in parallel, every request bounded
//! ([`SEND_TIMEOUT`]), so one device's hanging push service delays nobody else.
//!
//! Push endpoints are chosen by the device: [`endpoint`] says where they may
//! point (https to public hosts), at subscribe time and at connect time.
//!
//! Sinks: Web Push to the subscriptions of the device whose session it is
//! (registered over the session's own stream, [`session`]), and `--notify-url`
//! ([`webhook`]). A push says what is asked or done in words ("Run rm -rf
//! build/", "finished: 3 tool calls, 1 file changed"; [`words`]): it is
//! encrypted end to end to the device. `--notify-bare` makes it name the event
//! only ("it asks: session/request_permission", "finished: end_turn"), as the
//! notify URL's notices always do unless `--notify-text`.

pub mod endpoint;
pub mod limit;
pub mod methods;
pub mod push;
pub mod session;
pub mod webhook;
pub mod words;

use std::{collections::HashMap, sync::Arc, time::Duration};

use iroh::EndpointId;
use serde::Serialize;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::{
    devices::{
        scope::{Scope, Verb},
        Devices,
    },
    home::Home,
};
use words::Words;

/// Notices waiting to be handed to their device's delivery. A burst past it
/// (every session of a host at once) drops notices, never the stream.
const QUEUE: usize = 64;

/// Notices of one device waiting for its delivery (which sends them in
/// order, one notice at a time): a device whose push services hang fills
/// only its own queue.
const DEVICE_QUEUE: usize = 8;

/// Requests (pushes and webhook POSTs) in flight at once, of every device:
/// one device holds at most its [`push::MAX_PER_DEVICE`] pushes and the
/// webhook, so others always find room.
const MAX_IN_FLIGHT: usize = 32;

/// One request's bound, connecting and sending and reading the answer: a
/// push service answers in well under a second; an endpoint that never does
/// costs its own device this, and nobody else anything (it was 10 s, one
/// delivery at a time: eight hanging subscriptions delayed another device's
/// notice by 79.7 s).
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Connecting alone (TCP and TLS) gets less: a push service is close by.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A device's delivery task ends after this long without a notice.
const DEVICE_IDLE: Duration = Duration::from_secs(60);

/// How long a push service keeps an undelivered notice: an agent waiting for
/// an answer is still news hours later (a warm agent, a long grace).
const PUSH_TTL: Duration = Duration::from_secs(6 * 3600);

/// How much of a message a push says (the page shows it whole): a lock
/// screen shows a few lines, and a push payload holds about 4 KiB in all.
const MESSAGE_PUSH_CHARS: usize = 1000;

/// The default VAPID `sub` claim when `--notify-contact` is not given.
pub const DEFAULT_CONTACT: &str = "mailto:thunderbolt-iroh@localhost";

/// What notifies, and when.
#[derive(Debug, Clone)]
pub struct NotifyConfig {
    /// Notify while a client is attached too (by default only while none is).
    pub always: bool,
    /// How much each sink's notices say (`--notify-bare`, `--notify-text`).
    pub text: words::Wording,
    /// Web Push for the devices that subscribe (`--no-push` turns it off).
    pub push: bool,
    /// VAPID `sub`: a mailto: or https: contact for push services.
    pub contact: String,
    pub webhook: Option<webhook::Webhook>,
}

impl NotifyConfig {
    /// Whether a notice that is sent says anything in words: then sessions
    /// read what the agent asks, and count their turns' tool calls.
    pub fn worded(&self) -> bool {
        let push = self.push && self.text.push() == Words::Plain;
        let hook = self.webhook.is_some() && self.text.hook() == Words::Plain;
        push || hook
    }
}

/// What happened in a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// The agent sent the client a request (`method`) and waits for its answer.
    NeedsAnswer {
        method: String,
        /// A permission request's options (`optionId`, `name`, `kind`).
        options: Option<serde_json::Value>,
        /// What it asks, in words (`Run rm -rf build/`), when notices say it.
        words: Option<String>,
    },
    /// The answer to a `session/prompt` passed: the turn ended.
    Finished {
        stop_reason: String,
        /// What the turn's tool calls did, when notices say it.
        summary: Option<words::Summary>,
    },
    /// The agent failed: `how` it ended (`agent exited (code 3)`), and
    /// `said`, the same with its last stderr line (masked) in words.
    Stopped { how: String, said: String },
    /// A request that was notified has been answered: its notice is withdrawn.
    Answered,
    /// A session that had notices ended: they are all withdrawn.
    Ended,
    /// A message to the owner from something on the workstation (an agent
    /// through `thunderbolt reach`, a script through `thunderbolt note`),
    /// in the thread of its sender ([`crate::reach`]).
    /// `ask`: it is a question (a permission prompt) answered Allow or Deny.
    Message { thread: String, id: String, text: String, ask: bool },
}

impl Kind {
    /// Whether it withdraws notices already sent (pushed only, never to the
    /// notify URL: there is nothing on screen there to take back).
    pub fn withdraws(&self) -> bool {
        matches!(self, Kind::Answered | Kind::Ended)
    }

    /// Whether the notify URL gets it too: a message is pushed to each of the
    /// owner's devices, one event each, and the URL would get it once per device.
    fn hooked(&self) -> bool {
        !self.withdraws() && !matches!(self, Kind::Message { .. })
    }
}

/// One notice, before it is worded.
#[derive(Debug, Clone)]
pub struct Event {
    pub agent: Arc<str>,
    pub label: Arc<str>,
    pub session: String,
    pub peer: EndpointId,
    pub kind: Kind,
    /// The agent's request, as the JSON text of its JSON-RPC id (a question
    /// and its withdrawal).
    pub request: Option<String>,
    /// A question's one-time answer token (a push carries it; the webhook never).
    pub answer: Option<String>,
    /// The agent endpoint's NodeId (which of several agents a device
    /// remembers the notice is about).
    pub node: Arc<str>,
    /// The agent's protocol.
    pub protocol: Arc<str>,
    /// What the agent asks, in its own words (a tool call's title, an
    /// elicitation's message), masked and bounded; for worded notices only.
    pub text: Option<String>,
    /// Notices of this session the rate limit held back before this one.
    pub more: u64,
    /// Whether `peer` may still use the agent (a revoked device gets nothing,
    /// and loses its subscriptions).
    pub allowed: bool,
}

/// The notice as sinks get it (the Web Push payload, the webhook's JSON).
#[derive(Debug, Clone, Serialize)]
pub struct Notice {
    pub agent: String,
    pub label: String,
    /// `needs_answer`, `finished` or `stopped` (the agent failed); `answered` and `ended` withdraw what
    /// was shown of the session (a request's, or all of it).
    pub event: &'static str,
    /// The request's method, or the turn's stop reason.
    pub detail: String,
    pub title: String,
    /// What is asked or done: in words (`Run rm -rf build/`), or, bare, the
    /// event only (`it asks: session/request_permission`).
    pub body: String,
    pub session: String,
    /// The JSON text of the agent's request id (`needs_answer`, `answered`).
    pub request: Option<String>,
    /// A question's one-time token to answer it from the notice
    /// (`thunderbolt/<p>/answer1`); Web Push only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// A permission request's options (`optionId`, `name`, `kind`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<serde_json::Value>,
    /// The agent endpoint's NodeId.
    pub node: String,
    /// The agent's protocol (`acp`, `mcp`).
    pub protocol: String,
    pub device: Option<String>,
    pub more: u64,
    /// The agent's own words for what it asks (worded notices only).
    pub text: Option<String>,
    /// A message's thread (its sender's name) and id (`message` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub at: String,
}

impl Notice {
    /// The notice of `ev` for a sink whose notices are worded as `style` says.
    pub fn of(ev: &Event, device: Option<String>, style: Words) -> Self {
        let who = if ev.label.is_empty() { "the agent".to_string() } else { ev.label.to_string() };
        let plain = style == Words::Plain;
        let (event, detail, title, mut body) = match &ev.kind {
            Kind::NeedsAnswer { method, words, .. } => (
                "needs_answer",
                method.clone(),
                format!("{who} needs your answer"),
                match words.as_ref().filter(|_| plain) {
                    Some(w) => w.clone(),
                    None => format!("it asks: {method}"),
                },
            ),
            Kind::Finished { stop_reason, summary } => (
                "finished",
                stop_reason.clone(),
                format!("{who} finished"),
                if plain {
                    words::finished(stop_reason, summary.as_ref())
                } else {
                    format!("finished: {stop_reason}")
                },
            ),
            Kind::Stopped { how, said } => (
                "stopped",
                how.clone(),
                format!("{who} stopped"),
                if plain { said.clone() } else { format!("stopped: {how}") },
            ),
            Kind::Answered => ("answered", String::new(), format!("{who}: answered"), "answered".to_string()),
            Kind::Ended => {
                ("ended", String::new(), format!("{who}: the session ended"), "the session ended".to_string())
            }
            Kind::Message { thread, id, text, ask } => (
                "message",
                id.clone(),
                if *ask { format!("{thread} asks") } else { thread.clone() },
                if plain {
                    words::clip(text, MESSAGE_PUSH_CHARS)
                } else {
                    format!("a message from {thread}")
                },
            ),
        };
        if ev.more > 0 {
            body.push_str(&format!(" (and {} more held back)", ev.more));
        }
        Self {
            agent: ev.agent.to_string(),
            label: ev.label.to_string(),
            event,
            detail,
            title,
            body,
            session: ev.session.clone(),
            request: ev.request.clone(),
            answer: ev.answer.clone(),
            options: match &ev.kind {
                Kind::NeedsAnswer { options, .. } => options.clone(),
                // A question's answers, as ACP names its options' kinds (the
                // service worker's Allow and Deny pick them by kind).
                Kind::Message { ask: true, .. } => Some(serde_json::json!([
                    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "deny", "name": "Deny", "kind": "reject_once"},
                ])),
                _ => None,
            },
            node: ev.node.to_string(),
            protocol: ev.protocol.to_string(),
            device,
            more: ev.more,
            text: ev.text.clone().filter(|_| plain),
            thread: match &ev.kind {
                Kind::Message { thread, .. } => Some(thread.clone()),
                _ => None,
            },
            message: match &ev.kind {
                Kind::Message { id, .. } => Some(id.clone()),
                _ => None,
            },
            at: crate::devices::rfc3339(crate::devices::now_ms()),
        }
    }
}

/// A bridge's (or host's) notices: the queue and what delivers it.
#[derive(Debug)]
pub struct Notifier {
    pub config: NotifyConfig,
    /// The VAPID key, when Web Push is on and the key is usable.
    pub vapid: Option<Arc<push::Vapid>>,
    /// Where push endpoints may point (read once at start).
    pub policy: endpoint::Policy,
    pub subscriptions: push::Registry,
    /// The buckets every session shares: its device's and the bridge's.
    budgets: std::sync::Mutex<limit::Budgets>,
    tx: mpsc::Sender<Event>,
    dropped: std::sync::atomic::AtomicU64,
}

impl Notifier {
    /// Starts delivery (a task of the current runtime). A VAPID key that
    /// exists but does not parse switches Web Push off, loudly; it is never
    /// replaced.
    pub fn start(config: NotifyConfig, home: &Home) -> Arc<Self> {
        let policy = endpoint::Policy::from_env();
        let vapid = if config.push {
            match push::Vapid::load_or_create(home, config.contact.clone()) {
                Ok(v) => Some(Arc::new(v)),
                Err(e) => {
                    warn!("web push is off: {e}");
                    None
                }
            }
        } else {
            None
        };
        let subscriptions = push::Registry::load(home, policy);
        let (tx, rx) = mpsc::channel(QUEUE);
        let base = || {
            reqwest::Client::builder()
                .timeout(SEND_TIMEOUT)
                .connect_timeout(CONNECT_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("thunderbolt-iroh/", env!("CARGO_PKG_VERSION")))
        };
        // A device's endpoint: only public addresses, whatever its name
        // resolves to, and never through a proxy (which would resolve it).
        let push_http = base()
            .dns_resolver(Arc::new(endpoint::GuardedResolver::new(policy)))
            .no_proxy()
            .build()
            .unwrap_or_default();
        // The owner's own --notify-url, as given.
        let hook_http = base().build().unwrap_or_default();
        let delivery = Arc::new(Delivery {
            push_http,
            hook_http,
            vapid: vapid.clone(),
            policy,
            subscriptions: subscriptions.clone(),
            webhook: config.webhook.clone(),
            wording: config.text,
            devices: Arc::new(Devices::new(home)),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
        });
        tokio::spawn(delivery.run(rx));
        Arc::new(Self {
            config,
            vapid,
            policy,
            subscriptions,
            budgets: Default::default(),
            tx,
            dropped: 0.into(),
        })
    }

    /// Takes a token of `peer`'s bucket and of the bridge's.
    pub fn budget(&self, peer: &EndpointId) -> Result<(), limit::Held> {
        self.budgets.lock().unwrap_or_else(|p| p.into_inner()).take(peer)
    }

    /// Queues `ev`; never waits.
    pub fn notify(&self, ev: Event) {
        if self.tx.try_send(ev).is_err() {
            let n = self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            warn!("notification queue full: a notice was dropped ({n} so far)");
        }
    }

    /// What the banner says of notices.
    pub fn describe(notifier: Option<&Self>) -> String {
        let Some(n) = notifier else {
            return "off (--no-push, no --notify-url)".to_string();
        };
        let mut sinks = Vec::new();
        if n.vapid.is_some() {
            sinks.push(format!("web push to the browsers that subscribe ({} now)", n.subscriptions.count()));
        } else if n.config.push {
            sinks.push("web push OFF (its key is unusable: see the warning above)".to_string());
        }
        if let Some(h) = &n.config.webhook {
            sinks.push(h.shown());
        }
        let when = if n.config.always { "always" } else { "while no device is attached" };
        format!("{} — when an agent needs an answer or finishes, {when}", sinks.join(" and "))
    }
}

/// The delivery task's side.
struct Delivery {
    push_http: reqwest::Client,
    hook_http: reqwest::Client,
    vapid: Option<Arc<push::Vapid>>,
    policy: endpoint::Policy,
    subscriptions: push::Registry,
    webhook: Option<webhook::Webhook>,
    /// How much each sink's notices say.
    wording: words::Wording,
    devices: Arc<Devices>,
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl Delivery {
    /// Hands each notice to its device's delivery task: a device's notices
    /// go in order, devices in parallel.
    async fn run(self: Arc<Self>, mut rx: mpsc::Receiver<Event>) {
        let mut devices: HashMap<EndpointId, mpsc::Sender<Event>> = HashMap::new();
        while let Some(ev) = rx.recv().await {
            devices.retain(|_, tx| !tx.is_closed());
            let peer = ev.peer;
            let ev = match devices.get(&peer) {
                Some(tx) => match tx.try_send(ev) {
                    Ok(()) => continue,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        warn!(peer = %peer.fmt_short(), "this device's notices are not being taken as fast as they come: one was dropped");
                        continue;
                    }
                    // Its task just ended: a new one takes it.
                    Err(mpsc::error::TrySendError::Closed(ev)) => ev,
                },
                None => ev,
            };
            let (tx, device_rx) = mpsc::channel(DEVICE_QUEUE);
            let _ = tx.try_send(ev);
            devices.insert(peer, tx);
            tokio::spawn(self.clone().device(device_rx));
        }
    }

    /// One device's notices, in order; ends when it has none for a while.
    async fn device(self: Arc<Self>, mut rx: mpsc::Receiver<Event>) {
        while let Ok(Some(ev)) = tokio::time::timeout(DEVICE_IDLE, rx.recv()).await {
            self.deliver(ev).await;
        }
        // What came in meanwhile is still delivered; new ones start a new task.
        rx.close();
        while let Ok(ev) = rx.try_recv() {
            self.deliver(ev).await;
        }
    }

    async fn deliver(&self, ev: Event) {
        let short = ev.peer.fmt_short().to_string();
        let peer = ev.peer;
        if !ev.allowed {
            let n: usize =
                self.subscriptions.forget_where(|o| *o == peer).await.into_iter().map(|(_, n)| n).sum();
            if n > 0 {
                info!(peer = %short, "{n} push subscription(s) of a device no longer allowed removed");
            }
            return;
        }
        let devices = self.devices.clone();
        let (device, scope) =
            tokio::task::spawn_blocking(move || (devices.name_of(&peer), devices.scope_of(&peer)))
                .await
                .unwrap_or_else(|_| (None, Scope::full()));
        let mut notice = Notice::of(&ev, device.clone(), self.wording.push());
        // What its scope lets the device see and answer: a device that may
        // not see sessions gets no notice of one, one scoped to some agents
        // or that may not answer gets no message from the host, and one that
        // may not answer gets a notice without Allow and Deny (nor the token).
        let verbs = scope.verbs;
        let shown = match ev.kind {
            Kind::Message { .. } => scope.reads_messages(),
            _ => verbs.has(Verb::Observe),
        };
        if !shown {
            debug!(peer = %short, "no notice for this device: its scope is {}", scope.describe());
            return;
        }
        if !verbs.has(Verb::Answer) {
            notice.answer = None;
            notice.options = None;
        }
        // Every push of the notice and the webhook at once, each bounded.
        let pushes = async {
            let Some(vapid) = &self.vapid else { return 0 };
            let list = self.subscriptions.of(&peer);
            let sent = futures::future::join_all(
                list.iter().map(|sub| self.push(vapid, &peer, sub, &notice, &short)),
            );
            sent.await.into_iter().filter(|ok| *ok).count()
        };
        let hook = async {
            let hook = self.webhook.as_ref().filter(|_| ev.kind.hooked())?;
            let _permit = self.in_flight.acquire().await.ok()?;
            // Worded as the URL's own, and the answer token is the pushed device's alone.
            let notice = Notice { answer: None, ..Notice::of(&ev, device, self.wording.hook()) };
            match hook.request(&self.hook_http, &notice).send().await {
                Ok(r) if r.status().is_success() => Some(()),
                Ok(r) => {
                    warn!("--notify-url {} answered {}: the notice was not taken", hook.shown(), r.status());
                    None
                }
                Err(e) => {
                    warn!("--notify-url {}: {}", hook.shown(), e.without_url());
                    None
                }
            }
        };
        let (pushed, hooked) = tokio::join!(pushes, hook);
        let mut sent = Vec::new();
        if pushed > 0 {
            sent.push(format!("web push to {pushed} subscription(s)"));
        }
        if hooked.is_some() {
            sent.push("the notify URL".to_string());
        }
        if sent.is_empty() {
            debug!(peer = %short, "notice not sent (no subscription, no notify URL): {}", notice.title);
        } else if ev.kind.withdraws() {
            debug!(peer = %short, "notice withdrawn ({}; {})", notice.event, sent.join(", "));
        } else {
            info!(peer = %short, "notified: {} ({}; {})", notice.title, notice.body, sent.join(", "));
        }
    }

    /// One Web Push; whether the push service took it.
    async fn push(
        &self,
        vapid: &push::Vapid,
        owner: &EndpointId,
        sub: &push::Subscription,
        notice: &Notice,
        short: &str,
    ) -> bool {
        let Ok(url) = reqwest::Url::parse(&sub.endpoint) else { return false };
        let origin = url.origin().ascii_serialization();
        // Again before each push: a literal address never meets the resolver.
        if let Err(e) = endpoint::check_url(&url, self.policy) {
            warn!(peer = %short, "web push to {origin} not sent: {e}");
            return false;
        }
        let payload = serde_json::to_vec(notice).unwrap_or_default();
        let (body, auth) = match (push::encrypt(sub, &payload), vapid.authorization(&url)) {
            (Ok(b), Ok(a)) => (b, a),
            (Err(e), _) | (_, Err(e)) => {
                warn!(peer = %short, "web push not sent: {e}");
                return false;
            }
        };
        let Ok(_permit) = self.in_flight.acquire().await else { return false };
        // A withdrawal is as urgent as the question it takes back, and has its
        // topic: a push service still holding the question replaces it.
        let withdraws = matches!(notice.event, "answered" | "ended");
        let asks = notice.event == "needs_answer" || (notice.event == "message" && notice.options.is_some());
        let urgency = if asks || withdraws { "high" } else { "normal" };
        let topic_event = if withdraws { "needs_answer" } else { notice.event };
        let req = self
            .push_http
            .post(url)
            .header("Content-Encoding", "aes128gcm")
            .header("Content-Type", "application/octet-stream")
            .header("TTL", PUSH_TTL.as_secs().to_string())
            .header("Urgency", urgency)
            // A newer notice of the same session and kind replaces one not yet delivered.
            .header("Topic", topic(notice, topic_event))
            .header("Authorization", auth)
            .body(body);
        match req.send().await {
            Ok(r) if r.status().is_success() => true,
            Ok(r) if matches!(r.status().as_u16(), 404 | 410) => {
                // Only this device's entry: another's of the same endpoint is its own.
                if let Err(e) = self.subscriptions.remove(owner, &sub.endpoint).await {
                    warn!(peer = %short, "a gone push subscription was not removed from the file: {e}");
                }
                info!(peer = %short, "a push subscription is gone ({}): removed", r.status());
                false
            }
            Ok(r) => {
                warn!(peer = %short, "the push service at {origin} answered {}", r.status());
                false
            }
            Err(e) => {
                let why = if e.is_timeout() {
                    "no answer in time".to_string()
                } else {
                    e.without_url().to_string()
                };
                warn!(peer = %short, "web push to {origin}: {why}");
                false
            }
        }
    }
}

/// A push's `Topic` (at most 32 URL-safe characters): a newer notice of the
/// same session and kind replaces one not yet delivered; a message replaces
/// nothing (each one is news), so its topic is its own id.
fn topic(notice: &Notice, event: &str) -> String {
    let t = match &notice.message {
        Some(id) => format!("message-{id}"),
        None => format!("{}-{}", notice.session, event),
    };
    t.replace('_', "-")
}

impl crate::serve::taps::OnRevoked for Notifier {
    /// Drops the push subscriptions of devices no agent admits any more.
    fn revoked(&self, still_admitted: Box<dyn Fn(&iroh::EndpointId) -> bool + Send>) {
        let subs = self.subscriptions.clone();
        let owners = subs.owners();
        if owners.is_empty() {
            return;
        }
        tokio::spawn(async move {
            let gone = tokio::task::spawn_blocking(move || {
                owners.into_iter().filter(|o| !still_admitted(o)).collect::<Vec<_>>()
            })
            .await
            .unwrap_or_default();
            if gone.is_empty() {
                return;
            }
            for (peer, n) in subs.forget_where(|o| gone.contains(o)).await {
                info!(peer = %peer.fmt_short(), "{n} push subscription(s) of a device no longer allowed removed");
            }
        });
    }
}
