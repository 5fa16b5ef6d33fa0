//! How a session ended, in words and in our exit: the bridge's close (a
//! refusal, a warm agent keeping on, the agent's end with its code or
//! signal), a peer that does not serve the protocol, a signal that stopped
//! us.
//!
//! Apart from the pump: `redial` (the resumable path) tells its ends with
//! the same words ([`describe_close`], [`kept_warm`]), and `main` exits by
//! [`Interrupted`].

use anyhow::{anyhow, Result};
use iroh::endpoint::ConnectionError;
use thunderbolt_shared::{
    close::{self, is_alpn_refusal},
    Protocol,
};
use tracing::debug;

/// Whether `err` is a warm agent's bridge ending our connection because we
/// are done (our input ended, all we asked was answered): the agent runs on.
pub fn kept_warm(err: &ConnectionError) -> bool {
    matches!(err, ConnectionError::ApplicationClosed(ac) if ac.error_code.into_inner() == close::CLOSE_CODE_KEPT_WARM as u64)
}

/// How the agent ended, when `err` is the bridge's close after the agent's last byte.
pub(super) fn agent_end(err: &ConnectionError) -> Option<close::AgentEnd> {
    match err {
        ConnectionError::ApplicationClosed(ac) => {
            close::AgentEnd::from_close(ac.error_code.into_inner(), &ac.reason)
        }
        _ => None,
    }
}

/// Human text for a connection that ended with an error.
pub fn describe_close(err: &ConnectionError, protocol: &Protocol) -> String {
    match err {
        ConnectionError::ApplicationClosed(ac) => {
            let code = ac.error_code.into_inner();
            if let Some(end) = close::AgentEnd::from_close(code, &ac.reason) {
                return end.describe();
            }
            match close::Refusal::from_close(code, &ac.reason) {
                Some(r) => r.describe(),
                None => format!(
                    "the bridge closed the connection (code {}: {})",
                    ac.error_code,
                    String::from_utf8_lossy(&ac.reason)
                ),
            }
        }
        ConnectionError::ConnectionClosed(cc) if is_alpn_refusal(&cc.to_string()) => format!(
            "the peer does not serve {protocol} (ALPN {} was refused): is it {}?",
            String::from_utf8_lossy(&protocol.alpn()),
            protocol.with_article("bridge")
        ),
        ConnectionError::TimedOut => "the connection timed out (the bridge stopped answering)".into(),
        e => format!("connection lost: {e}"),
    }
}

/// `connect` was stopped by a signal: it exits 130 (Ctrl-C) or 143 (SIGTERM),
/// as a shell reports a process ended by one, never 0 (0 means the agent's
/// work ended well).
#[derive(Debug, thiserror::Error)]
#[error("stopped by {0}")]
pub struct Interrupted(pub &'static str);

impl Interrupted {
    pub fn exit_code(&self) -> u8 {
        if self.0 == "SIGTERM" {
            128 + 15
        } else {
            128 + 2
        }
    }
}

/// Our exit for how the agent ended: success only for exit code 0 (or an
/// end the bridge did not describe, as older bridges' is).
pub(super) fn agent_result(ended: Option<close::AgentEnd>) -> Result<()> {
    match ended {
        Some(end) if !end.is_success() => Err(anyhow!(end.describe())),
        Some(end) => {
            debug!("{}", end.describe());
            Ok(())
        }
        None => Ok(()),
    }
}
