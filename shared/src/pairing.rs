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
//! and the device's NodeId is in its allow file from then on (the device then
//! connects as usual, on `/r1` or `/0`). Anything else is closed with code 1
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
/// Too many wrong secrets were tried: pending ones were burned.
pub const REASON_PAIR_BURNED: &str = "pairing code burned after too many wrong tries";
/// The request was not one line of the shape above.
pub const REASON_PAIR_BAD: &str = "pairing request malformed";

/// The device's request line (with its newline).
pub fn request(secret: &str, name: &str) -> Vec<u8> {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    format!("{{\"pair\":{},\"name\":{}}}\n", q(secret), q(name)).into_bytes()
}

/// A device name as kept: trimmed, control characters dropped, at most
/// [`MAX_DEVICE_NAME`] characters; `None` when nothing is left.
pub fn clean_name(name: &str) -> Option<String> {
    let n: String = name.chars().filter(|c| !c.is_control()).take(MAX_DEVICE_NAME).collect();
    let n = n.trim();
    (!n.is_empty()).then(|| n.to_string())
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
    }
}
