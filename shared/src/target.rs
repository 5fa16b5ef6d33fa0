//! What a user may type to name a bridge: an `endpoint…` ticket or a bare NodeId.

use std::{fmt, str::FromStr};

use iroh_base::{EndpointAddr, EndpointId};
use iroh_tickets::endpoint::EndpointTicket;

/// Length of a NodeId written as lowercase hex (32 bytes).
pub const NODE_ID_HEX_LEN: usize = 64;

/// Every iroh endpoint ticket starts with this kind prefix.
pub const TICKET_PREFIX: &str = "endpoint";

/// Why a NodeId or ticket was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetError {
    #[error("empty target: expected a ticket (endpoint…) or a 64-character hex NodeId")]
    Empty,
    #[error("malformed NodeId '{shown}': expected 64 hex characters, got {len}")]
    WrongLength { shown: String, len: usize },
    #[error("malformed NodeId '{shown}': only hex digits 0-9 a-f are allowed")]
    NotHex { shown: String },
    #[error("malformed NodeId '{shown}': not a valid ed25519 public key")]
    NotAKey { shown: String },
    #[error("malformed ticket: {0}")]
    BadTicket(String),
}

/// Shortens user input for error messages so a pasted blob does not flood the terminal.
fn shown(s: &str) -> String {
    const MAX_SHOWN: usize = 80;
    if s.chars().count() > MAX_SHOWN {
        let head: String = s.chars().take(MAX_SHOWN).collect();
        format!("{head}…")
    } else {
        s.to_string()
    }
}

/// Parses a NodeId written as 64 hex characters (case-insensitive; surrounding
/// whitespace ignored).
pub fn parse_node_id(s: &str) -> Result<EndpointId, TargetError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(TargetError::Empty);
    }
    if s.len() != NODE_ID_HEX_LEN {
        return Err(TargetError::WrongLength { shown: shown(s), len: s.chars().count() });
    }
    let mut bytes = [0u8; 32];
    for (i, pair) in s.as_bytes().chunks(2).enumerate() {
        let hi = hex_val(pair[0]);
        let lo = hex_val(pair[1]);
        match (hi, lo) {
            (Some(h), Some(l)) => bytes[i] = (h << 4) | l,
            _ => return Err(TargetError::NotHex { shown: shown(s) }),
        }
    }
    EndpointId::from_bytes(&bytes).map_err(|_| TargetError::NotAKey { shown: shown(s) })
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// A dial target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A ticket: the id plus relay URL and direct addresses.
    Ticket(EndpointTicket),
    /// A bare id; addresses must come from discovery or the default relay.
    NodeId(EndpointId),
}

impl Target {
    pub fn id(&self) -> EndpointId {
        match self {
            Target::Ticket(t) => t.endpoint_addr().id,
            Target::NodeId(id) => *id,
        }
    }

    /// The address to dial. For a bare id it carries no addresses.
    pub fn endpoint_addr(&self) -> EndpointAddr {
        match self {
            Target::Ticket(t) => t.endpoint_addr().clone(),
            Target::NodeId(id) => EndpointAddr::new(*id),
        }
    }
}

impl FromStr for Target {
    type Err = TargetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(TargetError::Empty);
        }
        if s.starts_with(TICKET_PREFIX) {
            return s
                .parse::<EndpointTicket>()
                .map(Target::Ticket)
                .map_err(|e| TargetError::BadTicket(e.to_string()));
        }
        parse_node_id(s).map(Target::NodeId)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Ticket(t) => write!(f, "{t}"),
            Target::NodeId(id) => write!(f, "{id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A fixed valid key: the public key of the all-ones secret.
    fn sample_id() -> EndpointId {
        iroh_base::SecretKey::from_bytes(&[1u8; 32]).public()
    }

    #[test]
    fn node_id_round_trip() {
        let id = sample_id();
        let hex = id.to_string();
        assert_eq!(hex.len(), 64);
        assert_eq!(parse_node_id(&hex).unwrap(), id);
        assert_eq!(parse_node_id(&hex.to_uppercase()).unwrap(), id);
        assert_eq!(parse_node_id(&format!("  {hex}\n")).unwrap(), id);
    }

    #[test]
    fn node_id_errors() {
        assert!(matches!(parse_node_id("abc"), Err(TargetError::WrongLength { len: 3, .. })));
        assert!(matches!(parse_node_id(&"g".repeat(64)), Err(TargetError::NotHex { .. })));
        assert_eq!(parse_node_id("  "), Err(TargetError::Empty));
    }

    #[test]
    fn ticket_or_id() {
        let id = sample_id();
        let addr = EndpointAddr::new(id).with_ip_addr("127.0.0.1:4242".parse().unwrap());
        let ticket = EndpointTicket::new(addr.clone()).to_string();
        assert!(ticket.starts_with(TICKET_PREFIX));
        let t: Target = ticket.parse().unwrap();
        assert_eq!(t.id(), id);
        assert_eq!(t.endpoint_addr(), addr);
        let t: Target = id.to_string().parse().unwrap();
        assert_eq!(t, Target::NodeId(id));
        assert!(matches!("endpointzzzz".parse::<Target>(), Err(TargetError::BadTicket(_))));
    }
}
