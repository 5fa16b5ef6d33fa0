//! Protocol names (`acp`, `mcp`, …) and the ALPN each one is served under.

use std::{fmt, str::FromStr};

/// Longest protocol name we accept. ALPNs are at most 255 bytes; names are short
/// words in practice, and a small cap keeps identity file names sane.
pub const MAX_PROTOCOL_NAME_LEN: usize = 32;

/// The protocols this product ships a bridge for. Other syntactically valid names
/// are representable (identity files and ALPNs are defined for any name) but the
/// CLI only serves these.
pub const KNOWN_PROTOCOLS: [&str; 2] = ["acp", "mcp"];

/// The protocol whose identity is the default one (`identity`, not `identity-acp`).
pub const DEFAULT_PROTOCOL: &str = "acp";

/// A validated protocol name: 1–32 chars of `[a-z0-9-]`, starting with a letter.
///
/// The name ends up in a file name (`identity-<name>`) and in the ALPN, so
/// anything that could escape a path or confuse a peer is refused up front.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Protocol(String);

/// Why a protocol name was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("protocol name is empty")]
    Empty,
    #[error("protocol name '{0}' is longer than {MAX_PROTOCOL_NAME_LEN} characters")]
    TooLong(String),
    #[error("protocol name '{0}' must start with a lowercase letter and use only a-z, 0-9 and '-'")]
    BadChars(String),
    #[error("unknown protocol '{0}' (known: {known})", known = KNOWN_PROTOCOLS.join(", "))]
    Unknown(String),
}

impl Protocol {
    /// The ACP protocol (`acp`).
    pub fn acp() -> Self {
        Self("acp".into())
    }

    /// The MCP protocol (`mcp`).
    pub fn mcp() -> Self {
        Self("mcp".into())
    }

    /// Parses a name and also requires it to be one the CLI serves.
    pub fn parse_known(name: &str) -> Result<Self, ProtocolError> {
        let p: Protocol = name.parse()?;
        if KNOWN_PROTOCOLS.contains(&p.as_str()) {
            Ok(p)
        } else {
            Err(ProtocolError::Unknown(p.0))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `an ACP bridge`, `an MCP server`: the name as the initialism it is read
    /// as, letter by letter, after the article its first letter's sound takes.
    pub fn with_article(&self, noun: &str) -> String {
        // Letters whose name starts with a vowel sound: "an ACP", "an MCP", "a TCP".
        const VOWEL_SOUNDING: &str = "aefhilmnorsx";
        let an = self.0.chars().next().is_some_and(|c| VOWEL_SOUNDING.contains(c));
        format!("{} {} {noun}", if an { "an" } else { "a" }, self.0.to_ascii_uppercase())
    }

    /// `thunderbolt/<name>/0` as bytes.
    pub fn alpn(&self) -> Vec<u8> {
        alpn_for(self)
    }

    /// `thunderbolt/<p>` followed by `suffix` (`/r1`, `/pair1`, …): the
    /// ALPNs of the protocols beside the plain one.
    pub fn alpn_with_suffix(&self, suffix: &[u8]) -> Vec<u8> {
        let mut alpn = format!("thunderbolt/{}", self.0).into_bytes();
        alpn.extend_from_slice(suffix);
        alpn
    }

    /// File name of this protocol's identity inside `$THUNDERBOLT_HOME/iroh/`.
    /// ACP keeps the historical plain `identity` so existing pairings survive.
    pub fn identity_file_name(&self) -> String {
        if self.0 == DEFAULT_PROTOCOL {
            "identity".to_string()
        } else {
            format!("identity-{}", self.0)
        }
    }
}

/// The ALPN a bridge for `protocol` accepts: `thunderbolt/<protocol>/0`.
pub fn alpn_for(protocol: &Protocol) -> Vec<u8> {
    format!("thunderbolt/{}/0", protocol.0).into_bytes()
}

impl FromStr for Protocol {
    type Err = ProtocolError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(ProtocolError::Empty);
        }
        if s.len() > MAX_PROTOCOL_NAME_LEN {
            return Err(ProtocolError::TooLong(s.to_string()));
        }
        let mut chars = s.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase());
        let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !(first_ok && rest_ok) {
            return Err(ProtocolError::BadChars(s.to_string()));
        }
        Ok(Self(s.to_string()))
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_take_their_article() {
        assert_eq!(Protocol::acp().with_article("bridge"), "an ACP bridge");
        assert_eq!(Protocol::mcp().with_article("bridge"), "an MCP bridge");
        assert_eq!("tcp".parse::<Protocol>().unwrap().with_article("bridge"), "a TCP bridge");
    }

    #[test]
    fn alpn_matches_contract() {
        assert_eq!(Protocol::acp().alpn(), b"thunderbolt/acp/0".to_vec());
        assert_eq!(Protocol::mcp().alpn(), b"thunderbolt/mcp/0".to_vec());
    }

    #[test]
    fn identity_file_names() {
        assert_eq!(Protocol::acp().identity_file_name(), "identity");
        assert_eq!(Protocol::mcp().identity_file_name(), "identity-mcp");
    }

    #[test]
    fn rejects_bad_names() {
        assert_eq!("".parse::<Protocol>(), Err(ProtocolError::Empty));
        assert!(matches!("../x".parse::<Protocol>(), Err(ProtocolError::BadChars(_))));
        assert!(matches!("ACP".parse::<Protocol>(), Err(ProtocolError::BadChars(_))));
        assert!(matches!("1acp".parse::<Protocol>(), Err(ProtocolError::BadChars(_))));
        assert!(matches!("a".repeat(33).parse::<Protocol>(), Err(ProtocolError::TooLong(_))));
        assert!(matches!(Protocol::parse_known("foo"), Err(ProtocolError::Unknown(_))));
        assert_eq!(Protocol::parse_known("mcp"), Ok(Protocol::mcp()));
    }
}
