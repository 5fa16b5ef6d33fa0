//! What a user may type to name a bridge: an `endpoint…` ticket or a bare NodeId.

use std::{fmt, str::FromStr};

use iroh_base::{EndpointAddr, EndpointId};
use iroh_tickets::endpoint::EndpointTicket;

/// Length of a NodeId written as lowercase hex (32 bytes).
pub const NODE_ID_HEX_LEN: usize = 64;

/// Length of a NodeId written as unpadded RFC 4648 base32 (the form the
/// Thunderbolt app's own forms take: `^[a-z2-7]{52,}$`).
pub const NODE_ID_BASE32_LEN: usize = 52;

/// Every iroh endpoint ticket starts with this kind prefix.
pub const TICKET_PREFIX: &str = "endpoint";

/// Why a NodeId or ticket was refused (in [`crate::words`]' terms: what
/// happened, and what to do).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetError {
    #[error("no bridge named: give its ticket (endpoint…) or its NodeId (64 hex characters)")]
    Empty,
    #[error("{}", crate::words::not_a_peer(shown, *len))]
    WrongLength { shown: String, len: usize },
    #[error("'{shown}' is not a NodeId: 64 characters, but not all hex (0-9, a-f): copy it again")]
    NotHex { shown: String },
    #[error("'{shown}' is not a NodeId: 52 characters, but not base32 (a-z, 2-7): copy it again")]
    NotBase32 { shown: String },
    #[error(
        "'{shown}' is not a NodeId: no ed25519 key is written that way (a character changed?): copy it again"
    )]
    NotAKey { shown: String },
    #[error("{}", crate::words::TICKET_DAMAGED)]
    BadTicket,
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

/// Parses a NodeId written as 64 hex characters, or as 52 characters of
/// unpadded base32 (case-insensitive; surrounding whitespace ignored). We print
/// hex, as the reference does; base32 is accepted because the app's forms
/// produce it.
pub fn parse_node_id(s: &str) -> Result<EndpointId, TargetError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(TargetError::Empty);
    }
    if s.len() == NODE_ID_BASE32_LEN {
        let bytes = base32_key(s).ok_or_else(|| TargetError::NotBase32 { shown: shown(s) })?;
        return EndpointId::from_bytes(&bytes).map_err(|_| TargetError::NotAKey { shown: shown(s) });
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

/// A NodeId as unpadded lowercase RFC 4648 base32 (52 characters of a-z2-7):
/// the form the app's own forms take. We print hex first, as the reference
/// does; this is offered next to it (`iroh id --json`).
pub fn node_id_base32(id: &EndpointId) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
    let (mut out, mut acc, mut bits) = (String::with_capacity(NODE_ID_BASE32_LEN), 0u32, 0u32);
    for &b in id.as_bytes() {
        acc = (acc << 8) | b as u32;
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((acc >> bits) & 31) as usize] as char);
        }
        acc &= (1 << bits) - 1;
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// 52 base32 characters → 32 bytes; the 4 bits left over must be zero (one
/// key, one spelling).
fn base32_key(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    let (mut acc, mut bits, mut n) = (0u32, 0u32, 0usize);
    for c in s.bytes() {
        let v = match c.to_ascii_lowercase() {
            c @ b'a'..=b'z' => c - b'a',
            c @ b'2'..=b'7' => c - b'2' + 26,
            _ => return None,
        };
        acc = (acc << 5) | v as u32;
        bits += 5;
        if bits >= 8 {
            bits -= 8;
            *out.get_mut(n)? = (acc >> bits) as u8;
            n += 1;
            acc &= (1 << bits) - 1;
        }
    }
    (n == 32 && acc == 0).then_some(out)
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
        // Whatever starts like a ticket is one: a ticket cut to 52 characters
        // is a damaged ticket, not a base32 NodeId (one of those starting with
        // `endpoint` is a 1 in 2^40 chance).
        if s.starts_with(TICKET_PREFIX) {
            return s.parse::<EndpointTicket>().map(Target::Ticket).map_err(|_| TargetError::BadTicket);
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
    fn base32_node_ids_as_the_app_writes_them() {
        let id = sample_id();
        let b32 = node_id_base32(&id);
        assert_eq!(b32.len(), NODE_ID_BASE32_LEN);
        assert!(b32.bytes().all(|c| c.is_ascii_lowercase() || (b'2'..=b'7').contains(&c)));
        assert_eq!(parse_node_id(&b32).unwrap(), id);
        assert_eq!(parse_node_id(&b32.to_uppercase()).unwrap(), id);
        assert_eq!(b32.parse::<Target>().unwrap(), Target::NodeId(id));
        // Wrong alphabet, and non-zero leftover bits (a second spelling of the same key).
        let mut bad = b32.clone();
        bad.replace_range(0..1, "1");
        assert!(matches!(parse_node_id(&bad), Err(TargetError::NotBase32 { .. })));
        // The last character carries one bit of the key and four zero bits: 'a' or 'q'.
        let last = b32.as_bytes()[51];
        assert!(last == b'a' || last == b'q');
        let padded = format!("{}{}", &b32[..51], (last + 1) as char);
        assert!(matches!(parse_node_id(&padded), Err(TargetError::NotBase32 { .. })));
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
        assert_eq!("endpointzzzz".parse::<Target>(), Err(TargetError::BadTicket));
        // Cut short (even to a base32 NodeId's length), or with a character dropped.
        assert_eq!(ticket[..52].parse::<Target>(), Err(TargetError::BadTicket));
        assert_eq!(ticket[..ticket.len() - 1].parse::<Target>(), Err(TargetError::BadTicket));
        let e =
            "endpiontadm27aurvlyarcjnirljac6v2juirorcdhqqebvtafzx6u7armmg2aa".parse::<Target>().unwrap_err();
        assert!(e.to_string().contains("is neither a ticket nor a NodeId"), "{e}");
    }
}
