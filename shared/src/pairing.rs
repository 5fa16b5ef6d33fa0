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
//! {"pair":"<secret>","name":"<its device name>"}
//! ```
//!
//! The bridge answers a valid, unspent, unexpired secret meant for this agent
//! with one line and finishes its stream:
//!
//! ```text
//! {"paired":true,"name":"<the name it was saved under>"}
//! ```
//!
//! and the device may use that agent from then on (a single-agent bridge
//! puts its NodeId in the allow file; a host's agent grants exactly itself),
//! connecting as usual, on `/r1` or `/0`. Anything else is closed with code 1
//! and one of the `REASON_PAIR_*` reasons; nothing is added, nothing spawned.
//! A pairing connection passes the same gate as every other (per-remote
//! budget, handshake cap) before any work, and the bridge reads at most
//! [`MAX_PAIR_LINE`] of it. Peers that do not offer the pairing ALPN see
//! nothing of any of this.

use crate::protocol::Protocol;

/// How the pairing ALPN ends.
pub const PAIR_ALPN_SUFFIX: &[u8] = b"/pair1";

/// `thunderbolt/<p>/pair1`.
pub fn pair_alpn(protocol: &Protocol) -> Vec<u8> {
    let mut alpn = format!("thunderbolt/{}", protocol.as_str()).into_bytes();
    alpn.extend_from_slice(PAIR_ALPN_SUFFIX);
    alpn
}

/// Longest request line read (a secret and a name are a hundred bytes).
pub const MAX_PAIR_LINE: usize = 1024;

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

/// The device's request line (with its newline).
pub fn request(secret: &str, name: &str) -> Vec<u8> {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    format!("{{\"pair\":{},\"name\":{}}}\n", q(secret), q(name)).into_bytes()
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
        assert_eq!(line, b"{\"pair\":\"ab\\\"c\",\"name\":\"Pixel 9\"}\n");
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
}
