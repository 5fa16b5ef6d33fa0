//! How a bridge ends a connection it refuses, and how a client reads that back.
//!
//! Every active refusal is a QUIC application close with code
//! [`CLOSE_CODE_REFUSED`] and one of the reasons below, byte for byte: clients
//! (including apps written against the reference bridge) match on these strings.

/// Application close code for every refusal by the bridge.
pub const CLOSE_CODE_REFUSED: u32 = 1;
/// Application close code a client uses to end a session normally.
pub const CLOSE_CODE_CLIENT: u32 = 0;

pub const REASON_NOT_ALLOWLISTED: &str = "not allowlisted";
pub const REASON_IDLE: &str = "idle: no data stream opened";
pub const REASON_AT_CAPACITY: &str = "bridge at capacity";
pub const REASON_MEMBERSHIP_REVOKED: &str = "membership revoked";
pub const REASON_HANDSHAKE_TIMEOUT: &str = "handshake timed out";
/// Sent by clients on a normal close.
pub const REASON_CLIENT_CLOSED: &str = "client closed";
/// Ours, not in the reference: a peer sent a line longer than the frame cap.
pub const REASON_FRAME_TOO_LARGE: &str = "frame too large";
/// Ours: the bridge is shutting down (Ctrl-C / SIGTERM).
pub const REASON_SHUTTING_DOWN: &str = "bridge shutting down";

const SPAWN_PREFIX: &str = "failed to spawn '";

/// `failed to spawn '<argv0>'`.
pub fn failed_to_spawn(argv0: &str) -> String {
    format!("{SPAWN_PREFIX}{argv0}'")
}

/// Whether a handshake error's text says the peer refused our ALPN (TLS alert
/// 120, `no_application_protocol`): how a bridge of another protocol answers.
/// iroh reports it only as text, so both the native and the browser client
/// recognise it here.
pub fn is_alpn_refusal(error_text: &str) -> bool {
    let t = error_text.to_ascii_lowercase();
    t.contains("alpn")
        || t.contains("known protocol")
        || t.contains("error 120")
        || t.contains("no_application_protocol")
}

/// A bridge's refusal as a client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    NotAllowlisted,
    Idle,
    AtCapacity,
    MembershipRevoked,
    HandshakeTimeout,
    FailedToSpawn(String),
    FrameTooLarge,
    ShuttingDown,
    /// Code 1 with a reason this version does not know.
    Other(String),
}

impl Refusal {
    /// Classifies an application close. `None` when the close was not a refusal
    /// (any code other than [`CLOSE_CODE_REFUSED`]).
    pub fn from_close(code: u64, reason: &[u8]) -> Option<Self> {
        if code != CLOSE_CODE_REFUSED as u64 {
            return None;
        }
        let reason = String::from_utf8_lossy(reason);
        Some(match reason.as_ref() {
            REASON_NOT_ALLOWLISTED => Self::NotAllowlisted,
            REASON_IDLE => Self::Idle,
            REASON_AT_CAPACITY => Self::AtCapacity,
            REASON_MEMBERSHIP_REVOKED => Self::MembershipRevoked,
            REASON_HANDSHAKE_TIMEOUT => Self::HandshakeTimeout,
            REASON_FRAME_TOO_LARGE => Self::FrameTooLarge,
            REASON_SHUTTING_DOWN => Self::ShuttingDown,
            r => match r.strip_prefix(SPAWN_PREFIX).and_then(|r| r.strip_suffix('\'')) {
                Some(argv0) => Self::FailedToSpawn(argv0.to_string()),
                None => Self::Other(r.to_string()),
            },
        })
    }

    /// Whether redialing the same bridge can succeed without someone changing
    /// something first (an allow entry, the command line).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Idle | Self::AtCapacity | Self::HandshakeTimeout | Self::ShuttingDown)
    }

    /// The reason string as sent on the wire.
    pub fn reason(&self) -> String {
        match self {
            Self::NotAllowlisted => REASON_NOT_ALLOWLISTED.into(),
            Self::Idle => REASON_IDLE.into(),
            Self::AtCapacity => REASON_AT_CAPACITY.into(),
            Self::MembershipRevoked => REASON_MEMBERSHIP_REVOKED.into(),
            Self::HandshakeTimeout => REASON_HANDSHAKE_TIMEOUT.into(),
            Self::FailedToSpawn(a) => failed_to_spawn(a),
            Self::FrameTooLarge => REASON_FRAME_TOO_LARGE.into(),
            Self::ShuttingDown => REASON_SHUTTING_DOWN.into(),
            Self::Other(r) => r.clone(),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_reason() {
        for r in [
            Refusal::NotAllowlisted,
            Refusal::Idle,
            Refusal::AtCapacity,
            Refusal::MembershipRevoked,
            Refusal::HandshakeTimeout,
            Refusal::FailedToSpawn("claude-code".into()),
            Refusal::FrameTooLarge,
            Refusal::ShuttingDown,
            Refusal::Other("something new".into()),
        ] {
            assert_eq!(Refusal::from_close(1, r.reason().as_bytes()), Some(r));
        }
    }

    #[test]
    fn alpn_refusal_text() {
        assert!(is_alpn_refusal(
            "the cryptographic handshake failed: error 120: peer doesn't support any known protocol"
        ));
        assert!(!is_alpn_refusal("connection timed out"));
    }

    #[test]
    fn exact_wire_strings() {
        assert_eq!(failed_to_spawn("x"), "failed to spawn 'x'");
        assert_eq!(REASON_IDLE, "idle: no data stream opened");
        assert_eq!(Refusal::from_close(0, b"client closed"), None);
    }
}
