//! `connect --pair <code>`: this device paired with the bridge by a
//! one-time code ([`thunderbolt_shared::pairing`]) before it connects.
//!
//! Apart from the session: its own ALPN, its own connection, and refusals
//! of its own (a wrong or spent code).

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use iroh::endpoint::{ConnectionError, VarInt};
use thunderbolt_shared::{close, pairing as pairing_wire};
use tracing::info;

use super::dial::{dial_one, Dial};

/// How long the bridge may take to answer a pairing request once connected
/// (it writes two small files).
const PAIR_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Pairs this device with the bridge using a one-time code
/// ([`thunderbolt_shared::pairing`]), before connecting as usual.
/// What `connect --pair` does once paired.
pub(super) enum Next {
    /// Its session, as without a code.
    Connect,
    /// Nothing: the device may not start sessions (its scope says so, and
    /// how to join one was said).
    Done,
    /// A share's guest: it joins the shared session (watching unless it may prompt).
    Join { session: String, observe: bool },
}

/// Pairs with `code`, and says what comes next.
pub(super) async fn pair_first(d: Dial<'_>, code: &str, name: &str, dial_timeout: u64) -> Result<Next> {
    let Dial { target, protocol, .. } = d;
    let conn = dial_one(d, &pairing_wire::pair_alpn(protocol), dial_timeout, || {
        anyhow!(
            "{} does not take pairing codes (it predates `iroh pair`, or is not {}): \
             run `thunderbolt iroh id` here and `thunderbolt iroh allow <that-nodeid>` there instead",
            target.id(),
            protocol.with_article("bridge")
        )
    })
    .await?;
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await?;
        send.write_all(&pairing_wire::request(code, name)).await?;
        send.finish()?;
        let answer = recv.read_to_end(pairing_wire::MAX_PAIR_ANSWER).await?;
        anyhow::Ok(answer)
    };
    let answer = tokio::time::timeout(PAIR_ANSWER_TIMEOUT, exchange).await;
    // The bridge's refusal says why; it wins over however the stream ended.
    let refused = || match conn.close_reason() {
        Some(ConnectionError::ApplicationClosed(ac)) => {
            Some(String::from_utf8_lossy(&ac.reason).into_owned())
        }
        _ => None,
    };
    let answer = match answer {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            let why = match refused() {
                Some(r) => r,
                None => match tokio::time::timeout(Duration::from_secs(1), conn.closed()).await {
                    Ok(ConnectionError::ApplicationClosed(ac)) => {
                        String::from_utf8_lossy(&ac.reason).into_owned()
                    }
                    _ => format!("{e:#}"),
                },
            };
            bail!("pairing refused: {why}{}", thunderbolt_shared::words::pairing_hint(&why).unwrap_or(""));
        }
        Err(_) => bail!("the bridge did not answer the pairing request within {PAIR_ANSWER_TIMEOUT:?}"),
    };
    conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_CLIENT_CLOSED.as_bytes());
    let v: serde_json::Value = serde_json::from_slice(answer.trim_ascii())
        .map_err(|_| anyhow!("the bridge's pairing answer is unreadable"))?;
    if v["paired"] != true {
        bail!("the bridge did not pair this device (it answered {v})");
    }
    match v["name"].as_str() {
        Some(n) => info!("paired with {} as \"{n}\"", target.id().fmt_short()),
        None => info!("paired with {}", target.id().fmt_short()),
    }
    crate::cli::pair_cmd::tell_agents(&v, protocol);
    let scope: Vec<&str> =
        v["scope"].as_array().map(|a| a.iter().filter_map(|s| s.as_str()).collect()).unwrap_or_default();
    if !scope.is_empty() {
        info!("this device may do: {}", scope.join(","));
    }
    if let Some(session) = v["session"].as_str() {
        let until = v["until"].as_str().unwrap_or("its end");
        info!("a guest of session {session} until {until}: joining it");
        return Ok(Next::Join { session: session.to_string(), observe: !scope.contains(&"prompt") });
    }
    if !scope.is_empty() && !scope.contains(&"start") {
        info!(
            "it may not start sessions: list those it may join with `thunderbolt sessions {}`, then `thunderbolt {} connect --attach <id> <ticket>`",
            target,
            protocol.as_str()
        );
        return Ok(Next::Done);
    }
    Ok(Next::Connect)
}
