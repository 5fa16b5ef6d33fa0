//! The messages door (`thunderbolt/<p>/reach1`, specified in
//! [`thunderbolt_shared::reach`]): one of the owner's own devices reads the
//! threads of messages sent to it, replies in one or answers a question;
//! any number of lines on one stream (a page keeps one while it shows a
//! thread: a connection per request would spend the device's connection
//! budget at the gate). Reached after the gate,
//! the handshake and trust like every connection; no agent and no slot.

use std::{sync::Arc, time::Duration};

use iroh::{endpoint::Connection, EndpointId};
use serde_json::{json, Value};
use thunderbolt_shared::reach::{self as wire, ReachRequest, MAX_REACH_LINE};
use tracing::{debug, info};

use super::bridge::Shared;
use crate::{
    reach::{
        socket::{read_line, Line},
        threads::{Behavior, ThreadError},
        ReachError,
    },
    trust::Grant,
};

/// How long a connection may stay silent between lines: a page that shows
/// a thread asks every few seconds on one connection; one that stopped lets it go.
const IDLE: Duration = Duration::from_secs(30);

/// Connections served at once, bridge-wide: each of the owner's pages that
/// shows a thread holds one; this bounds what devices that dial in a loop hold.
const MAX_IN_FLIGHT: usize = 32;
static IN_FLIGHT: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_IN_FLIGHT);

/// Requests one connection may make: hours of a thread shown, and a bound.
const MAX_REQUESTS: usize = 4096;

/// Answers `peer`'s lines on `conn`, one by one, admitted by `grant`, until
/// it finishes its side, stays silent for [`IDLE`], or sends a bad line.
pub(super) async fn serve(conn: Connection, peer: EndpointId, grant: Grant, shared: &Arc<Shared>) {
    let short = peer.fmt_short().to_string();
    let Ok(_permit) = IN_FLIGHT.try_acquire() else {
        debug!(peer = %short, "a messages connection refused: {MAX_IN_FLIGHT} are open already");
        conn.close(
            iroh::endpoint::VarInt::from_u32(thunderbolt_shared::close::CLOSE_CODE_REFUSED),
            thunderbolt_shared::close::REASON_AT_CAPACITY.as_bytes(),
        );
        return;
    };
    let stream = tokio::time::timeout(shared.admission.stream_open_timeout, conn.accept_bi()).await;
    let Ok(Ok((mut send, recv))) = stream else {
        debug!(peer = %short, "a messages connection opened no stream");
        conn.close(iroh::endpoint::VarInt::from_u32(0), b"");
        return;
    };
    let mut recv = tokio::io::BufReader::with_capacity(16 * 1024, recv);
    let mut line = Vec::with_capacity(1024);
    for _ in 0..MAX_REQUESTS {
        line.clear();
        let read = tokio::select! {
            r = tokio::time::timeout(IDLE, read_line(&mut recv, &mut line, MAX_REACH_LINE)) => r,
            _ = shared.shutdown.cancelled() => break,
        };
        let (answer, last) = match read {
            Ok(Ok(Line::Whole)) => match serde_json::from_slice::<ReachRequest>(&line) {
                Ok(req) => (handle(req, peer, grant, shared), false),
                Err(_) => (error(wire::REASON_BAD_REQUEST), true),
            },
            Ok(Ok(Line::TooLong)) => (error(wire::REASON_BAD_REQUEST), true),
            Ok(Ok(Line::End)) | Ok(Err(_)) | Err(_) => break,
        };
        if let Some(why) = answer.get("error").and_then(Value::as_str) {
            info!(peer = %short, "a messages request refused: {why}");
        }
        let mut text = serde_json::to_vec(&answer).unwrap_or_default();
        text.push(b'\n');
        if send.write_all(&text).await.is_err() || last {
            break;
        }
    }
    let _ = send.finish();
    let _ = tokio::time::timeout(crate::limits::FINISH_LINGER, send.stopped()).await;
    conn.close(iroh::endpoint::VarInt::from_u32(0), b"");
}

fn error(why: impl ToString) -> Value {
    json!({"error": why.to_string()})
}

fn handle(req: ReachRequest, peer: EndpointId, grant: Grant, shared: &Shared) -> Value {
    // A device named in one agent's manifest is someone's, not necessarily
    // the owner's: messages are for the owner's own devices.
    if grant == Grant::Manifest {
        return error(wire::REASON_NOT_OWN);
    }
    let Some(reach) = shared.reach.get() else {
        return error(wire::REASON_NO_REACH);
    };
    match req {
        ReachRequest::Threads { since, viewing } => {
            let viewing = viewing.filter(|t| wire::name_problem(t).is_none());
            reach.listing(&peer, since, viewing)
        }
        ReachRequest::Reply { thread, text, reply_to } => {
            if wire::name_problem(&thread).is_some() || reply_to.as_ref().is_some_and(|r| r.len() > 32) {
                return error(wire::REASON_BAD_REQUEST);
            }
            match reach.reply(&peer, &thread, &text, reply_to.as_deref()) {
                Ok(item) => json!({"ok": true, "id": item.id, "seq": item.seq}),
                Err(ReachError::Threads(ThreadError::UnknownThread)) => error(wire::REASON_UNKNOWN_THREAD),
                Err(ReachError::Threads(e @ ThreadError::Save { .. })) => {
                    tracing::warn!("{e}");
                    error("the host could not keep the reply (its log says why)")
                }
                Err(e) => error(e),
            }
        }
        ReachRequest::Answer { thread, question, behavior } => {
            if wire::name_problem(&thread).is_some() || question.len() > 32 {
                return error(wire::REASON_BAD_REQUEST);
            }
            let behavior = match behavior {
                wire::Verdict::Allow => Behavior::Allow,
                wire::Verdict::Deny => Behavior::Deny,
            };
            match reach.answer(&peer, &thread, &question, behavior) {
                Ok(item) => json!({"ok": true, "id": item.id, "seq": item.seq}),
                Err(ReachError::Threads(ThreadError::UnknownThread)) => error(wire::REASON_UNKNOWN_THREAD),
                Err(ReachError::Threads(ThreadError::Answered(_))) => error(wire::REASON_ANSWERED),
                Err(ReachError::Threads(e @ ThreadError::Save { .. })) => {
                    tracing::warn!("{e}");
                    error("the host could not keep the answer (its log says why)")
                }
                Err(e) => error(e),
            }
        }
    }
}
