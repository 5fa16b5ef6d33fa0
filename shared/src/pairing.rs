//! Pairing a device in one scan: a one-time secret the workstation minted
//! (`thunderbolt iroh pair`) lets a device it does not know yet add itself.
//!
//! # On the wire
//!
//! The device dials the agent's ticket offering only the ALPN
//! `thunderbolt/<p>/pair1` and proves its NodeId in the handshake as always.
//! It opens one bidirectional stream and writes one line:
//!
//! ```text
//! {"pair":"<secret>","name":"<its device name>","agents":1}
//! ```
//!
//! The bridge answers a valid, unspent, unexpired secret meant for this agent
//! with one line and finishes its stream:
//!
//! ```text
//! {"paired":true,"name":"<the name it was saved under>","agents":[{"name":"claude","label":"Claude Code","protocol":"acp","ticket":"endpoint…"}, …]}
//! ```
//!
//! and the device may use what the code granted from then on, connecting as
//! usual, on `/r1` or `/0`: a single-agent bridge puts its NodeId in the
//! allow file; a host's agent, for a code `iroh pair` minted for the whole
//! host, puts it in the allow file too (every agent that admits your own
//! devices then does), and for a code minted for some agents (`--agent`)
//! grants exactly those. `agents` ([`PairedAgent`]) lists every agent of the
//! host the device may reach now, so it learns them all from one scan; it is
//! sent only to a device that asked with `"agents":1` (older clients read at
//! most [`MAX_PAIR_LINE`] of the answer) and never by a single-agent bridge,
//! whose answer is as it always was. Anything else is closed with code 1
//! and one of the `REASON_PAIR_*` reasons; nothing is added, nothing spawned.
//! A pairing connection passes the same gate as every other (per-remote
//! budget, handshake cap) before any work, and the bridge reads at most
//! [`MAX_PAIR_LINE`] of it. Peers that do not offer the pairing ALPN see
//! nothing of any of this.

use serde::{Deserialize, Serialize};

use crate::protocol::Protocol;

/// How the pairing ALPN ends.
pub const PAIR_ALPN_SUFFIX: &[u8] = b"/pair1";

/// `thunderbolt/<p>/pair1`.
pub fn pair_alpn(protocol: &Protocol) -> Vec<u8> {
    protocol.alpn_with_suffix(PAIR_ALPN_SUFFIX)
}

/// Longest request line read (a secret and a name are a hundred bytes);
/// also the longest answer a client before [`MAX_PAIR_ANSWER`] reads.
pub const MAX_PAIR_LINE: usize = 1024;

/// Longest answer a bridge sends a device that asked for the agents (and a
/// client reads): room for a few dozen agents' tickets. A host with more
/// lists those that fit; the device reaches the others all the same.
pub const MAX_PAIR_ANSWER: usize = 64 * 1024;

/// Longest device name kept.
pub const MAX_DEVICE_NAME: usize = 64;

/// The secret is unknown (or was mistyped).
pub const REASON_PAIR_WRONG: &str = "pairing code not recognised";
/// The secret's time ran out before it was used.
pub const REASON_PAIR_EXPIRED: &str = "pairing code expired";
/// The secret was used already (each pairs one device).
pub const REASON_PAIR_SPENT: &str = "pairing code already used";
/// The secret was minted for another agent of the host.
pub const REASON_PAIR_OTHER_AGENT: &str = "pairing code is for another agent";
/// Too many wrong secrets were tried: pending ones were burned. (Bridges
/// before per-device counting burned codes; a code burned then still says so.)
pub const REASON_PAIR_BURNED: &str = "pairing code burned after too many wrong tries";
/// This device tried too many wrong secrets: it must wait before it tries
/// again. Counted per device, so nobody else's code is touched.
pub const REASON_PAIR_BACKOFF: &str = "too many wrong pairing codes from this device: wait and try again";
/// The request was not one line of the shape above.
pub const REASON_PAIR_BAD: &str = "pairing request malformed";

/// The device's request line (with its newline), asking for the agents the
/// pairing lets it reach (a client that sends it reads up to [`MAX_PAIR_ANSWER`]).
pub fn request(secret: &str, name: &str) -> Vec<u8> {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    format!("{{\"pair\":{},\"name\":{},\"agents\":1}}\n", q(secret), q(name)).into_bytes()
}

/// One agent of the host a paired device may reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairedAgent {
    /// The manifest's `name`.
    pub name: String,
    /// The manifest's `label`, shown to people.
    pub label: String,
    /// `acp` or `mcp`.
    pub protocol: String,
    /// Its ticket as the host serves it now (direct addresses included).
    pub ticket: String,
}

/// The bridge's answer to a pairing that succeeded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// Always `true` (a refusal is a close, not an answer).
    pub paired: bool,
    /// The name the device is kept under, if it has one.
    pub name: Option<String>,
    /// Every agent of the host it may reach now (absent from a single-agent
    /// bridge, and for clients that did not ask).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<PairedAgent>,
    /// What the workstation is called (its hostname, or `THUNDERBOLT_HOST_NAME`),
    /// sent with `agents` to a device that asked for them: a page lists every
    /// agent under its host. At most [`MAX_DEVICE_NAME`] characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// What the device may do, when less than everything (`["observe",
    /// "answer"]`): a device that may not start sessions joins one instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Vec<String>>,
    /// A share's guest: the one session it may join (its id, for a join),
    /// and when its access ends (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// Whose session a share's guest joins (the name of the device that
    /// started it), for the guest to be told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub of: Option<String>,
}

impl Answer {
    /// The answer as sent: one line, at most [`MAX_PAIR_ANSWER`] bytes (the
    /// agents that do not fit are left out; a name is at most
    /// [`MAX_DEVICE_NAME`] characters, so the rest always fits).
    pub fn line(mut self) -> Vec<u8> {
        loop {
            let mut line = serde_json::to_vec(&self).unwrap_or_default();
            line.push(b'\n');
            if line.len() <= MAX_PAIR_ANSWER || self.agents.pop().is_none() {
                return line;
            }
        }
    }
}

/// A device name as kept: trimmed, control and invisible formatting
/// characters dropped (a name chosen by a device must not reorder or hide
/// text in a log line or a terminal: `Owner's phone \u{202e}gnp.exe`), at
/// most [`MAX_DEVICE_NAME`] characters; `None` when nothing is left.
pub fn clean_name(name: &str) -> Option<String> {
    let n: String =
        name.chars().filter(|c| !c.is_control() && !is_format(*c)).take(MAX_DEVICE_NAME).collect();
    let n = n.trim();
    (!n.is_empty()).then(|| n.to_string())
}

/// Unicode's invisible format characters that change how text around them
/// shows: bidirectional embeddings, overrides and isolates, zero-width
/// characters and joiners, the soft hyphen, line and paragraph separators,
/// the byte-order mark, interlinear annotation and tag characters.
pub fn is_format(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}' | '\u{E0000}'..='\u{E007F}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_words() {
        assert_eq!(pair_alpn(&Protocol::acp()), b"thunderbolt/acp/pair1");
        let line = request("ab\"c", "Pixel 9");
        assert_eq!(line, b"{\"pair\":\"ab\\\"c\",\"name\":\"Pixel 9\",\"agents\":1}\n");
        assert_eq!(clean_name("  Pixel\n 9 "), Some("Pixel 9".into()));
        assert_eq!(clean_name("\n\t"), None);
        assert_eq!(clean_name(&"x".repeat(100)).unwrap().len(), MAX_DEVICE_NAME);
        assert_eq!(
            clean_name("Owner\u{2019}s phone \u{202e}gnp.exe").as_deref(),
            Some("Owner\u{2019}s phone gnp.exe")
        );
        assert_eq!(clean_name("a\u{200b}b\u{2066}c\u{feff}\u{1b}[31m").as_deref(), Some("abc[31m"));
        assert_eq!(clean_name("\u{200d}\u{200e}"), None);
    }

    #[test]
    fn the_old_answer_stays_as_it_was_and_a_long_one_is_cut_to_fit() {
        let old = Answer {
            paired: true,
            name: Some("Pixel 9".into()),
            agents: vec![],
            host: None,
            scope: None,
            session: None,
            until: None,
            of: None,
        };
        assert_eq!(old.clone().line(), b"{\"paired\":true,\"name\":\"Pixel 9\"}\n");
        let agent = |i: usize| PairedAgent {
            name: format!("a{i}"),
            label: "Agent".into(),
            protocol: "acp".into(),
            ticket: format!("endpoint{}", "x".repeat(2000)),
        };
        let many =
            Answer { agents: (0..100).map(agent).collect(), host: Some("h".repeat(MAX_DEVICE_NAME)), ..old };
        let line = many.line();
        assert!(line.len() <= MAX_PAIR_ANSWER);
        let back: Answer = serde_json::from_slice(&line).unwrap();
        assert!(back.agents.len() > 20 && back.agents.len() < 100, "{}", back.agents.len());
        assert_eq!(back.agents[0].name, "a0", "the first ones are kept");
        assert_eq!(back.host.as_deref(), Some(&*"h".repeat(MAX_DEVICE_NAME)), "the host's name is kept");
    }
}
