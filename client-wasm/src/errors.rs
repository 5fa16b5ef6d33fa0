//! How a failure is reported to JavaScript: a kind the app can switch on, plus
//! the bridge's close code and reason when the bridge closed the connection.

use thunderbolt_shared::close::{self, is_alpn_refusal, AgentEnd, Refusal};

/// Default bound on a dial: covers a cold relay connection on a slow link.
pub const DEFAULT_DIAL_TIMEOUT_MS: u32 = 30_000;

/// What went wrong, as JavaScript sees it (`err.kind`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// The bridge (or the client) closed the connection with a code and reason.
    Closed { code: u64, reason: String },
    /// The agent ended other than with exit code 0; the bridge said how (close
    /// code 2, after the agent's last byte was delivered).
    Agent(AgentEnd),
    /// The dial did not complete within its timeout.
    Timeout,
    /// The peer does not speak the requested ALPN (e.g. an MCP bridge dialed as ACP).
    Alpn,
    /// A frame broke the ndjson rules (too long, not JSON, embedded newline).
    Frame,
    /// Bad input from the caller (malformed ticket, NodeId, protocol, secret).
    Input,
    /// Anything else on the network path.
    Network,
    /// A resumable session ended while its client was away: the bridge no
    /// longer holds it (its grace ran out, or it restarted). A new session
    /// starts a new agent.
    SessionGone,
}

impl ErrorKind {
    pub fn name(&self) -> &'static str {
        match self {
            ErrorKind::Closed { .. } => "closed",
            ErrorKind::Agent(_) => "agent",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Alpn => "alpn",
            ErrorKind::Frame => "frame",
            ErrorKind::Input => "input",
            ErrorKind::Network => "network",
            ErrorKind::SessionGone => "session_gone",
        }
    }

    /// Whether redialing can help without a human changing something first.
    pub fn retryable(&self) -> bool {
        match self {
            ErrorKind::Closed { code, reason } => {
                Refusal::from_close(*code, reason.as_bytes()).is_none_or(|r| r.is_retryable())
            }
            // A new session starts a new agent.
            ErrorKind::Agent(_) | ErrorKind::Timeout | ErrorKind::Network | ErrorKind::SessionGone => true,
            ErrorKind::Alpn | ErrorKind::Frame | ErrorKind::Input => false,
        }
    }
}

/// Classifies a connection error's text when no structured close is available.
pub fn classify_text(text: &str) -> ErrorKind {
    let t = text.to_ascii_lowercase();
    if is_alpn_refusal(&t) {
        ErrorKind::Alpn
    } else if t.contains("timed out") || t.contains("timeout") {
        ErrorKind::Timeout
    } else {
        ErrorKind::Network
    }
}

/// How a connection ended, classified once for every API that reports it
/// (errors, `closed()`, the resumable session's end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The bridge closed it after the agent's last byte (code 2): how the agent ended.
    Agent(AgentEnd),
    /// The bridge closed it with another code (a refusal is code 1).
    Closed { code: u64, reason: String },
    /// This client closed it.
    Local,
    /// Lost on the network path, in iroh's words.
    Lost(String),
}

impl Ending {
    /// The bridge's application close.
    pub fn app_close(code: u64, reason: &[u8]) -> Self {
        match AgentEnd::from_close(code, reason) {
            Some(end) => Self::Agent(end),
            None => Self::Closed { code, reason: String::from_utf8_lossy(reason).into_owned() },
        }
    }

    /// The refusal, when the bridge refused.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Self::Closed { code, reason } => Refusal::from_close(*code, reason.as_bytes()),
            _ => None,
        }
    }
}

/// The code and reason this client closes with.
pub fn client_closed() -> ErrorKind {
    ErrorKind::Closed { code: close::CLOSE_CODE_CLIENT as u64, reason: close::REASON_CLIENT_CLOSED.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_retry() {
        let na = ErrorKind::Closed { code: 1, reason: "not allowlisted".into() };
        assert_eq!(na.name(), "closed");
        assert!(!na.retryable());
        assert!(ErrorKind::Closed { code: 1, reason: "bridge at capacity".into() }.retryable());
        assert_eq!(classify_text("peer doesn't support any known protocol"), ErrorKind::Alpn);
        assert!(ErrorKind::Timeout.retryable());
        assert_eq!(ErrorKind::Agent(AgentEnd::signaled(9)).name(), "agent");
    }

    #[test]
    fn endings() {
        assert_eq!(Ending::app_close(2, b"agent exited (code 3)"), Ending::Agent(AgentEnd::exited(3)));
        // The agent's last stderr line is part of what the page is told.
        let Ending::Agent(end) = Ending::app_close(2, "agent exited (code 3) — missing API key X".as_bytes())
        else {
            panic!("an agent's end")
        };
        assert_eq!(end.describe(), "the agent exited with code 3: missing API key X");
        let gone = Ending::app_close(1, b"unknown session");
        assert_eq!(gone.refusal(), Some(Refusal::UnknownSession));
        assert_eq!(Ending::app_close(0, b"client closed").refusal(), None);
    }
}
