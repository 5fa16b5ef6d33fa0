//! Notices to the owner: an agent waits for an answer, or finished its turn,
//! while no client is attached (a resumable session whose client is away, a
//! warm agent between connections), or always, if configured.
//!
//! The bridge already reads every JSON-RPC line it carries; a session's
//! [`session::SessionNotices`] looks at the agent's requests and at the answers
//! to the client's `session/prompt`s as they pass, never holding a byte: a
//! notice is handed to the [`Notifier`]'s queue with `try_send`, and is
//! dropped (and counted) when the queue is full. A session notifies at most
//! [`limit::BURST`] times at once, then once per [`limit::EVERY`].
//!
//! Sinks: Web Push to the subscriptions of the device whose session it is
//! (registered over the session's own stream, [`session`]), and `--notify-url`
//! ([`webhook`]). The default notice names the agent and the event only
//! ("needs your answer", "finished: end_turn"); the text of what it asks is in
//! it only with `--notify-text`.

pub mod limit;
pub mod push;
pub mod session;
pub mod webhook;

use std::{sync::Arc, time::Duration};

use iroh::EndpointId;
use serde::Serialize;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::{devices::Devices, home::Home};

/// Notices waiting to be delivered. A burst past it (every session of a
/// host at once, a push service that hangs) drops notices, never the stream.
const QUEUE: usize = 64;

/// One delivery's bound (push service or webhook).
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a push service keeps an undelivered notice: an agent waiting for
/// an answer is still news hours later (a warm agent, a long grace).
const PUSH_TTL: Duration = Duration::from_secs(6 * 3600);

/// The default VAPID `sub` claim when `--notify-contact` is not given.
pub const DEFAULT_CONTACT: &str = "mailto:thunderbolt-iroh@localhost";

/// What notifies, and when.
#[derive(Debug, Clone)]
pub struct NotifyConfig {
    /// Notify while a client is attached too (by default only while none is).
    pub always: bool,
    /// Put the text of what the agent asks into the notice (off: names only).
    pub text: bool,
    /// Web Push for the devices that subscribe (`--no-push` turns it off).
    pub push: bool,
    /// VAPID `sub`: a mailto: or https: contact for push services.
    pub contact: String,
    pub webhook: Option<webhook::Webhook>,
}

/// What happened in a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// The agent sent the client a request (`method`) and waits for its answer.
    NeedsAnswer { method: String },
    /// The answer to a `session/prompt` passed: the turn ended.
    Finished { stop_reason: String },
}

/// One notice, before it is worded.
#[derive(Debug, Clone)]
pub struct Event {
    pub agent: Arc<str>,
    pub label: Arc<str>,
    pub session: String,
    pub peer: EndpointId,
    pub kind: Kind,
    /// What the agent asks, in its words (only with `--notify-text`).
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
    /// `needs_answer` or `finished`.
    pub event: &'static str,
    /// The request's method, or the turn's stop reason.
    pub detail: String,
    pub title: String,
    pub body: String,
    pub session: String,
    pub device: Option<String>,
    pub more: u64,
    pub text: Option<String>,
    pub at: String,
}

impl Notice {
    pub fn of(ev: &Event, device: Option<String>) -> Self {
        let who = if ev.label.is_empty() { "the agent".to_string() } else { ev.label.to_string() };
        let (event, detail, title, mut body) = match &ev.kind {
            Kind::NeedsAnswer { method } => (
                "needs_answer",
                method.clone(),
                format!("{who} needs your answer"),
                format!("it asks: {method}"),
            ),
            Kind::Finished { stop_reason } => (
                "finished",
                stop_reason.clone(),
                format!("{who} finished"),
                format!("finished: {stop_reason}"),
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
            device,
            more: ev.more,
            text: ev.text.clone(),
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
    pub subscriptions: push::Subscriptions,
    tx: mpsc::Sender<Event>,
    dropped: std::sync::atomic::AtomicU64,
}

impl Notifier {
    /// Starts delivery (a task of the current runtime). A VAPID key that
    /// exists but does not parse switches Web Push off, loudly; it is never
    /// replaced.
    pub fn start(config: NotifyConfig, home: &Home) -> Arc<Self> {
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
        let subscriptions = push::Subscriptions::new(home);
        let (tx, rx) = mpsc::channel(QUEUE);
        let http = reqwest::Client::builder()
            .timeout(SEND_TIMEOUT)
            .connect_timeout(SEND_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("thunderbolt-iroh/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        let delivery = Delivery {
            http,
            vapid: vapid.clone(),
            subscriptions: subscriptions.clone(),
            webhook: config.webhook.clone(),
            devices: Arc::new(Devices::new(home)),
        };
        tokio::spawn(delivery.run(rx));
        Arc::new(Self { config, vapid, subscriptions, tx, dropped: 0.into() })
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
    http: reqwest::Client,
    vapid: Option<Arc<push::Vapid>>,
    subscriptions: push::Subscriptions,
    webhook: Option<webhook::Webhook>,
    devices: Arc<Devices>,
}

impl Delivery {
    async fn run(self, mut rx: mpsc::Receiver<Event>) {
        while let Some(ev) = rx.recv().await {
            self.deliver(ev).await;
        }
    }

    async fn deliver(&self, ev: Event) {
        let short = ev.peer.fmt_short().to_string();
        if !ev.allowed {
            let subs = self.subscriptions.clone();
            let peer = ev.peer;
            if let Ok(Ok(n)) = tokio::task::spawn_blocking(move || subs.forget(&peer)).await {
                if n > 0 {
                    info!(peer = %short, "{n} push subscription(s) of a device no longer allowed removed");
                }
            }
            return;
        }
        let devices = self.devices.clone();
        let peer = ev.peer;
        let device = tokio::task::spawn_blocking(move || devices.name_of(&peer)).await.ok().flatten();
        let notice = Notice::of(&ev, device);
        let mut sent = Vec::new();
        if let Some(vapid) = &self.vapid {
            let subs = self.subscriptions.clone();
            let list = tokio::task::spawn_blocking(move || subs.of(&peer)).await.unwrap_or_default();
            let mut pushed = 0;
            for sub in list {
                if self.push(vapid, &sub, &notice, &short).await {
                    pushed += 1;
                }
            }
            if pushed > 0 {
                sent.push(format!("web push to {pushed} subscription(s)"));
            }
        }
        if let Some(hook) = &self.webhook {
            match hook.request(&self.http, &notice).send().await {
                Ok(r) if r.status().is_success() => sent.push("the notify URL".to_string()),
                Ok(r) => {
                    warn!("--notify-url {} answered {}: the notice was not taken", hook.shown(), r.status())
                }
                Err(e) => warn!("--notify-url {}: {}", hook.shown(), e.without_url()),
            }
        }
        if sent.is_empty() {
            debug!(peer = %short, "notice not sent (no subscription, no notify URL): {}", notice.title);
        } else {
            info!(peer = %short, "notified: {} ({}; {})", notice.title, notice.body, sent.join(", "));
        }
    }

    /// One Web Push; whether the push service took it.
    async fn push(
        &self,
        vapid: &push::Vapid,
        sub: &push::Subscription,
        notice: &Notice,
        short: &str,
    ) -> bool {
        let Ok(url) = reqwest::Url::parse(&sub.endpoint) else { return false };
        let payload = serde_json::to_vec(notice).unwrap_or_default();
        let (body, auth) = match (push::encrypt(sub, &payload), vapid.authorization(&url)) {
            (Ok(b), Ok(a)) => (b, a),
            (Err(e), _) | (_, Err(e)) => {
                warn!(peer = %short, "web push not sent: {e}");
                return false;
            }
        };
        let urgency = if notice.event == "needs_answer" { "high" } else { "normal" };
        let req = self
            .http
            .post(url.clone())
            .header("Content-Encoding", "aes128gcm")
            .header("Content-Type", "application/octet-stream")
            .header("TTL", PUSH_TTL.as_secs().to_string())
            .header("Urgency", urgency)
            // A newer notice of the same session and kind replaces one not yet delivered.
            .header("Topic", format!("{}-{}", notice.session, notice.event).replace('_', "-"))
            .header("Authorization", auth)
            .body(body);
        match req.send().await {
            Ok(r) if r.status().is_success() => true,
            Ok(r) if matches!(r.status().as_u16(), 404 | 410) => {
                let subs = self.subscriptions.clone();
                let endpoint = sub.endpoint.clone();
                let _ = tokio::task::spawn_blocking(move || subs.drop_endpoint(&endpoint)).await;
                info!(peer = %short, "a push subscription is gone ({}): removed", r.status());
                false
            }
            Ok(r) => {
                warn!(peer = %short, "the push service at {} answered {}", url.origin().ascii_serialization(), r.status());
                false
            }
            Err(e) => {
                warn!(peer = %short, "web push to {}: {}", url.origin().ascii_serialization(), e.without_url());
                false
            }
        }
    }
}
