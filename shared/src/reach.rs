//! Messages from the workstation to its owner, and the owner's replies
//! (`thunderbolt/<p>/reach1`): an agent or a script on the machine sends a
//! message (`thunderbolt reach`, `thunderbolt note`, the host's local socket);
//! it is pushed to the owner's devices and kept in a thread per sender; a
//! device reads the threads and replies over this door.
//!
//! The device dials any agent of the host with its own identity (one of the
//! owner's own devices: the account's, the allow file's or one paired by a
//! code), opens one bidirectional stream and writes ndjson lines, reading one
//! line back for each, in order; when it finishes its side (or is silent for
//! 30 s, or sends a line that is not a request) the bridge closes the
//! connection (code 0). No agent is started for it.
//!
//! ```text
//! {"op":"threads"}                         → {"threads":[…],"seq":N}
//! {"op":"threads","since":N,"viewing":"ci"} → only items after N; "viewing": this
//!                                             device shows thread "ci" now (no push
//!                                             of it to this device for a while)
//! {"op":"reply","thread":"ci","text":"ship it","replyTo":"m-12"}
//!                                          → {"ok":true,"id":"r-13","seq":13}
//! {"op":"answer","thread":"claude","question":"q-14","behavior":"allow"}
//!                                          → {"ok":true,"id":"r-15","seq":15}
//! ```
//!
//! Anything refused is `{"error":"<why>"}`. A thread is
//! `{"name","items":[{"seq","id","from","device"?,"text","at","replyTo"?}]}`,
//! `from` is `"agent"` (a message) or `"device"` (a reply, `device` naming
//! which), `at` RFC 3339; threads come most recent first. A question (an
//! agent's permission prompt, id `q-…`) has `ask: {requestId, tool, preview}`;
//! its answer `verdict: {behavior, requestId}` and `replyTo` naming it. Only
//! `answer` makes a verdict: no text does, whatever it says.

use serde::{Deserialize, Serialize};

use crate::Protocol;

pub const REACH_ALPN_SUFFIX: &[u8] = b"/reach1";

/// `thunderbolt/<p>/reach1`.
pub fn reach_alpn(protocol: &Protocol) -> Vec<u8> {
    protocol.alpn_with_suffix(REACH_ALPN_SUFFIX)
}

/// Longest request line read: a reply is at most [`MAX_TEXT`] bytes of text.
pub const MAX_REACH_LINE: usize = 64 * 1024;

/// Longest message or reply text, in bytes: a screenful, and what a push
/// payload could never carry whole anyway (a push says its start).
pub const MAX_TEXT: usize = 16 * 1024;

/// Longest sender (thread) name, in characters: a name on a phone's screen.
pub const MAX_NAME_CHARS: usize = 32;

/// The device's one line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum ReachRequest {
    Threads {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        viewing: Option<String>,
    },
    Reply {
        thread: String,
        text: String,
        #[serde(default, rename = "replyTo", skip_serializing_if = "Option::is_none")]
        reply_to: Option<String>,
    },
    /// Allow or Deny of a question (`q-…`) in the thread: the first answer counts.
    Answer { thread: String, question: String, behavior: Verdict },
}

/// A question's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Deny,
}

/// No thread by that name (never written to, or dropped as the oldest).
pub const REASON_UNKNOWN_THREAD: &str = "unknown thread";
/// The line is not a request (not JSON, an unknown op, a field over its bound).
pub const REASON_BAD_REQUEST: &str = "bad request";
/// This host has no messages (its reach is off, or another process has it).
pub const REASON_NO_REACH: &str = "this host takes no messages";
/// The question was answered already (on this device or another).
pub const REASON_ANSWERED: &str = "answered already";
/// Only the owner's own devices read and answer messages.
pub const REASON_NOT_OWN: &str = "messages are for the owner's own devices";

/// Why a sender's name is refused, or `None` when it is fine: 1 to
/// [`MAX_NAME_CHARS`] characters, one line, no control characters, not blank.
/// It is a display name: it names a thread and grants nothing.
pub fn name_problem(name: &str) -> Option<String> {
    let n = name.chars().count();
    if name.trim().is_empty() {
        return Some("a name must not be empty".into());
    }
    if n > MAX_NAME_CHARS {
        return Some(format!("a name has at most {MAX_NAME_CHARS} characters (this one has {n})"));
    }
    if name.chars().any(char::is_control) {
        return Some("a name is one line, with no control characters".into());
    }
    None
}

/// Why a message's or reply's text is refused, or `None`.
pub fn text_problem(text: &str) -> Option<String> {
    if text.trim().is_empty() {
        return Some("the text is empty".into());
    }
    if text.len() > MAX_TEXT {
        return Some(format!("the text has {} bytes; at most {MAX_TEXT}", text.len()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_strictly() {
        let r: ReachRequest = serde_json::from_str(r#"{"op":"threads"}"#).unwrap();
        assert_eq!(r, ReachRequest::Threads { since: None, viewing: None });
        let r: ReachRequest =
            serde_json::from_str(r#"{"op":"reply","thread":"ci","text":"ok","replyTo":"m-1"}"#).unwrap();
        assert_eq!(
            r,
            ReachRequest::Reply { thread: "ci".into(), text: "ok".into(), reply_to: Some("m-1".into()) }
        );
        assert!(serde_json::from_str::<ReachRequest>(r#"{"op":"delete"}"#).is_err());
        assert!(serde_json::from_str::<ReachRequest>(r#"{"op":"threads","x":1}"#).is_err());
        assert_eq!(reach_alpn(&Protocol::acp()), b"thunderbolt/acp/reach1");
    }

    #[test]
    fn names_and_texts_are_bounded() {
        assert!(name_problem("nightly backup").is_none());
        assert!(name_problem("").is_some());
        assert!(name_problem("  ").is_some());
        assert!(name_problem("a\nb").is_some());
        assert!(name_problem(&"é".repeat(32)).is_none());
        assert!(name_problem(&"é".repeat(33)).is_some());
        assert!(text_problem("hi").is_none());
        assert!(text_problem(" \n").is_some());
        assert!(text_problem(&"x".repeat(MAX_TEXT + 1)).is_some());
    }
}
