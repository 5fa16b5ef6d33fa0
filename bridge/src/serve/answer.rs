//! The answer door (`thunderbolt/<p>/answer1`, specified in
//! [`thunderbolt_shared::answer`]): a device answers one request of the
//! agent's, named by a notice it was pushed, without taking the session over
//! (a service worker, with no page open). Reached after the gate, the
//! handshake and trust like every connection; no agent and no slot.

use std::{sync::Arc, time::Duration};

use iroh::{endpoint::Connection, EndpointId};
use thunderbolt_shared::answer::{self as wire, AnswerReply, AnswerRequest, MAX_ANSWER_LINE};
use tokio::io::AsyncReadExt;
use tracing::{debug, info};

use super::{bridge::Shared, served::AgentConfig, session::SessionInfo};
use crate::devices::scope::Verb;

/// How long the device has to send its line once the stream is open: it
/// has it ready when it dials.
const ANSWER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Answers read at once, bridge-wide: a person taps one notice at a time;
/// this bounds what devices that dial in a loop hold (a line each, 64 KiB).
const MAX_ANSWERS_IN_FLIGHT: usize = 16;
static IN_FLIGHT: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_ANSWERS_IN_FLIGHT);

/// Answers one line on `conn` from `peer`, an admitted device.
pub(super) async fn answer(conn: Connection, peer: EndpointId, cfg: &AgentConfig, shared: &Arc<Shared>) {
    let short = peer.fmt_short().to_string();
    let Ok(_permit) = IN_FLIGHT.try_acquire() else {
        info!(peer = %short, "an answer from a notice refused: {MAX_ANSWERS_IN_FLIGHT} are being read already");
        conn.close(
            iroh::endpoint::VarInt::from_u32(thunderbolt_shared::close::CLOSE_CODE_REFUSED),
            wire::REASON_BUSY.as_bytes(),
        );
        return;
    };
    let stream = tokio::time::timeout(shared.admission.stream_open_timeout, conn.accept_bi()).await;
    let Ok(Ok((mut send, mut recv))) = stream else {
        debug!(peer = %short, "an answer connection opened no stream");
        conn.close(iroh::endpoint::VarInt::from_u32(0), b"");
        return;
    };
    let mut buf = Vec::with_capacity(1024);
    let read = tokio::time::timeout(ANSWER_READ_TIMEOUT, async {
        // One line, bounded: the rest of the stream is never read.
        let mut limited = (&mut recv).take(MAX_ANSWER_LINE as u64 + 1);
        limited.read_to_end(&mut buf).await
    })
    .await;
    let reply = match read {
        Ok(Ok(_)) if buf.len() <= MAX_ANSWER_LINE => match serde_json::from_slice::<AnswerRequest>(&buf) {
            Ok(_) if !shared.verbs(cfg, &peer).has(Verb::Answer) => Err(wire::REASON_NOT_PERMITTED),
            Ok(req) => take(&req, peer, cfg, shared).map(str::to_string),
            Err(_) => Err(wire::REASON_BAD_ANSWER),
        },
        Ok(Ok(_)) => Err(wire::REASON_BAD_ANSWER),
        _ => Err(wire::REASON_BAD_ANSWER),
    };
    match &reply {
        Ok(request) => info!(peer = %short, "the agent's request {request} answered from a notice"),
        Err(why) => info!(peer = %short, "an answer from a notice refused: {why}"),
    }
    let line = match reply {
        Ok(_) => AnswerReply { answered: true, error: None },
        Err(why) => AnswerReply { answered: false, error: Some(why.to_string()) },
    };
    let mut text = serde_json::to_vec(&line).unwrap_or_default();
    text.push(b'\n');
    let _ = send.write_all(&text).await;
    let _ = send.finish();
    let _ = tokio::time::timeout(crate::limits::FINISH_LINGER, send.stopped()).await;
    conn.close(iroh::endpoint::VarInt::from_u32(0), b"");
}

/// Hands the answer to the session it names, if it is this device's and runs
/// at this agent. Returns the request it answered.
fn take<'a>(
    req: &'a AnswerRequest,
    peer: EndpointId,
    cfg: &AgentConfig,
    shared: &Shared,
) -> Result<&'a str, &'static str> {
    // Bounds on what a device names: ids are short, tokens 32 hex.
    if req.session.len() > 64 || req.request.len() > 256 || req.token.len() != 32 {
        return Err(wire::REASON_BAD_ANSWER);
    }
    let mine = |i: &SessionInfo| i.id == req.session && i.peer == peer && i.agent == cfg.name;
    let info = shared
        .hubs
        .all()
        .into_iter()
        .map(|h| h.info().clone())
        .chain(shared.sessions.infos())
        .find(|i| mine(i))
        .ok_or(wire::REASON_UNKNOWN_SESSION)?;
    let observers = info.observers().ok_or(wire::REASON_UNKNOWN_SESSION)?;
    observers.answer(&req.request, &req.token, &req.result)?;
    Ok(&req.request)
}
