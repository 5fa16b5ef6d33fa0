//! A webhook agent's turn: one POST of the capture (its images inline as
//! base64) to a URL on this machine; the answer is the contract's objects (an
//! array, one, or `{"text": …}`). A refused POST fails the turn with words;
//! the next turn tries again.

use std::time::Duration;

use tokio::sync::mpsc;

use super::{
    contract::{self, Part},
    TurnEnd,
};

/// The longest answer read: replies are text.
const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// Connecting to a service on this machine: it is there or it is not.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// POSTs capture `cid` to `url`; each reply goes to `replies`.
pub async fn run(
    url: &url::Url,
    cid: &str,
    agent: &str,
    text: &str,
    parts: &[Part],
    replies: mpsc::Sender<super::Update>,
) -> TurnEnd {
    // Never through a proxy, never redirected off the loopback address the manifest names.
    let http = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .unwrap_or_default();
    let body = contract::capture(cid, agent, text, parts, true);
    let mut answer = match http.post(url.clone()).json(&body).send().await {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            return TurnEnd::Failed(format!("{agent} could not answer: its webhook answered {}", r.status()))
        }
        Err(e) => {
            let why = if e.is_connect() {
                "nothing answers there (is the service running?)".to_string()
            } else {
                e.without_url().to_string()
            };
            return TurnEnd::Failed(format!("{agent} could not answer: {url}: {why}"));
        }
    };
    let mut bytes = Vec::new();
    loop {
        match answer.chunk().await {
            Ok(Some(c)) if bytes.len() + c.len() <= MAX_ANSWER => bytes.extend_from_slice(&c),
            Ok(Some(_)) => {
                return TurnEnd::Failed(format!("{agent}'s answer is over {} MiB", MAX_ANSWER >> 20))
            }
            Ok(None) => break,
            Err(e) => return TurnEnd::Failed(format!("{agent} could not answer: {}", e.without_url())),
        }
    }
    match contract::webhook_answer(&bytes, cid) {
        Some(texts) if texts.is_empty() => TurnEnd::Failed(format!("{agent} finished without a reply")),
        Some(texts) => {
            for t in texts {
                let _ = replies.send(super::Update::Text(t)).await;
            }
            TurnEnd::Done
        }
        None => TurnEnd::Failed(format!(
            "{agent} could not answer: its webhook's answer is not the contract's JSON"
        )),
    }
}
