//! Answering the agent from a notice (`thunderbolt/<p>/answer1`): a device
//! that was told the agent asks something (a Web Push notice carrying a
//! one-time token) answers that one request without taking the session over
//! (a service worker, with no page open).
//!
//! The device dials the agent's endpoint with its own identity (the one that
//! owns the session), opens one bidirectional stream, writes one ndjson line
//!
//! ```text
//! {"session":"ab12cd34","request":"\"ask-1\"","token":"<32 hex>","result":{…}}
//! ```
//!
//! (`request` is the JSON text of the agent's JSON-RPC id, as the notice gave
//! it; `result` the JSON-RPC result the agent gets, an object), finishes its
//! side, and reads one line back: `{"answered":true}`, or
//! `{"answered":false,"error":"<why>"}` with one of the reasons below. The
//! bridge then closes the connection (code 0).

use serde::{Deserialize, Serialize};

use crate::Protocol;

pub const ANSWER_ALPN_SUFFIX: &[u8] = b"/answer1";

/// `thunderbolt/<p>/answer1`.
pub fn answer_alpn(protocol: &Protocol) -> Vec<u8> {
    protocol.alpn_with_suffix(ANSWER_ALPN_SUFFIX)
}

/// Longest answer line read: a permission's outcome is a hundred bytes, an
/// elicitation's form a few KiB.
pub const MAX_ANSWER_LINE: usize = 64 * 1024;

/// The device's one line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnswerRequest {
    pub session: String,
    pub request: String,
    pub token: String,
    pub result: serde_json::Map<String, serde_json::Value>,
}

/// The bridge's one line back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnswerReply {
    pub answered: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// No session of this device's by that id runs at this agent (it ended, or
/// it is another device's).
pub const REASON_UNKNOWN_SESSION: &str = "unknown session";
/// The request was answered already (by the client, or by another answer),
/// or is not one the bridge notified.
pub const REASON_ALREADY_ANSWERED: &str = "already answered";
/// The token is not the one the notice carried for this request.
pub const REASON_WRONG_TOKEN: &str = "wrong token";
/// The line is not an answer (not JSON, a field missing or over its bound).
pub const REASON_BAD_ANSWER: &str = "bad answer";
/// The agent's input is full right now: try again.
pub const REASON_BUSY: &str = "the agent is busy";
/// The device's scope does not include `answer`.
pub const REASON_NOT_PERMITTED: &str = "this device may not answer the agent";
