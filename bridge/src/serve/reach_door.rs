//! The messages door (`thunderbolt/<p>/reach1`, specified in
//! [`thunderbolt_shared::reach`]): one of the owner's own devices reads the
//! threads of messages sent to it, or replies in one. Reached after the gate,
//! the handshake and trust like every connection; no agent and no slot.

use std::{sync::Arc, time::Duration};

use iroh::{endpoint::Connection, EndpointId};
use serde_json::{json, Value};
use thunderbolt_shared::reach::{self as wire, ReachRequest, MAX_REACH_LINE};
use tokio::io::AsyncReadExt;
use tracing::{debug, info};

use super::bridge::Shared;
use crate::{
    reach::{threads::ThreadError, ReachError},
    trust::Grant,
};

/// How long the device has to send its line once the stream is open: it
/// has it ready when it dials.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Requests read at once, bridge-wide: a page lists every few seconds while
/// it shows a thread; this bounds what devices that dial in a loop hold.
const MAX_IN_FLIGHT: usize = 16;
static IN_FLIGHT: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_IN_FLIGHT);

/// Answers one line on `conn` from `peer`, admitted by `grant`.
pub(super) async fn serve(conn: Connection, peer: EndpointId, grant: Grant, shared: &Arc<Shared>) {
    let short = peer.fmt_short().to_string();
    let Ok(_permit) = IN_FLIGHT.try_acquire() else {
        debug!(peer = %short, "a messages request refused: {MAX_IN_FLIGHT} are being read already");
        conn.close(
            iroh::endpoint::VarInt::from_u32(thunderbolt_shared::close::CLOSE_CODE_REFUSED),
            thunderbolt_shared::close::REASON_AT_CAPACITY.as_bytes(),
        );
        return;
    };
    let stream = tokio::time::timeout(shared.admission.stream_open_timeout, conn.accept_bi()).await;
    let Ok(Ok((mut send, mut recv))) = stream else {
        debug!(peer = %short, "a messages connection opened no stream");
        conn.close(iroh::endpoint::VarInt::from_u32(0), b"");
        return;
    };
    let mut buf = Vec::with_capacity(1024);
    let read = tokio::time::timeout(READ_TIMEOUT, async {
        // One line, bounded: the rest of the stream is never read.
        let mut limited = (&mut recv).take(MAX_REACH_LINE as u64 + 1);
        limited.read_to_end(&mut buf).await
    })
    .await;
    let answer = match read {
        Ok(Ok(_)) if buf.len() <= MAX_REACH_LINE => match serde_json::from_slice::<ReachRequest>(&buf) {
            Ok(req) => handle(req, peer, grant, shared),
            Err(_) => error(wire::REASON_BAD_REQUEST),
        },
        _ => error(wire::REASON_BAD_REQUEST),
    };
    if let Some(why) = answer.get("error").and_then(Value::as_str) {
        info!(peer = %short, "a messages request refused: {why}");
    }
    let mut text = serde_json::to_vec(&answer).unwrap_or_default();
    text.push(b'\n');
    let _ = send.write_all(&text).await;
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
    }
}
