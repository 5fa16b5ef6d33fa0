//! How a connection stopped carrying the session (a loss to redial from, or
//! the bridge's close), and how the session ended: read from the close code
//! and reason the bridge sent (`thunderbolt_shared::close`).

use super::*;

/// Why one connection stopped carrying the session.
pub(super) enum ConnEnd {
    Lost(String),
    /// The bridge lost the connection but answered a fresh one (this one).
    Moved(Connection, String),
    /// The relay its path went through died (it was closed by us).
    RelayGone(String),
    Protocol(String),
    Closed(ConnectionError),
    Stopped(&'static str),
    LocalOutputClosed,
}

/// The bridge closed the connection: how the session ended.
pub(super) fn closed(err: &ConnectionError, st: &State, protocol: &Protocol) -> Result<Finish> {
    if crate::cli::connect::kept_warm(err) {
        info!("done: the agent stays warm for the next connection");
        return Ok(Finish::KeptWarm);
    }
    if let ConnectionError::ApplicationClosed(ac) = err {
        match st.after_close(ac.error_code.into_inner(), &ac.reason) {
            AfterClose::Left => return Ok(Finish::Left),
            AfterClose::AgentEnded(end) => return Ok(Finish::AgentEnded(Some(end))),
            AfterClose::NoSuchJoin { id } => bail!(
                "no session '{id}' this device may join: `thunderbolt sessions <ticket>` lists those it may"
            ),
            // Everything arrived; only the bridge's word on how the agent ended was lost.
            AfterClose::Gone { delivered: true, .. } => return Ok(Finish::AgentEnded(None)),
            AfterClose::Gone { refusal, .. } => bail!("{}", refusal.describe()),
            // A restart that keeps the session is redialed before it gets here.
            AfterClose::Redial | AfterClose::Closed => {}
        }
    }
    Err(anyhow!(describe_close(err, protocol)))
}

pub(super) fn down_end(conn: &Connection, r: Result<std::convert::Infallible, Down>) -> ConnEnd {
    match r {
        Err(Down::LocalClosed) => ConnEnd::LocalOutputClosed,
        Err(Down::Protocol(e)) => {
            warn!("{e}; closing the session");
            ConnEnd::Protocol(e)
        }
        Err(Down::Lost(e)) => lost_or_closed(conn, e),
    }
}

/// The bridge's close ends the session; anything else (a timeout, a reset,
/// a path gone) is a loss to recover from.
pub(super) fn classify(err: ConnectionError) -> ConnEnd {
    match err {
        ConnectionError::ApplicationClosed(_) => bridge_closed(err),
        e => ConnEnd::Lost(e.to_string()),
    }
}

/// A connection error that came with the bridge's close is a close; any
/// other is a loss.
pub(super) fn lost_or_closed(conn: &Connection, why: String) -> ConnEnd {
    match conn.close_reason() {
        Some(err @ ConnectionError::ApplicationClosed(_)) => bridge_closed(err),
        _ => ConnEnd::Lost(why),
    }
}

/// The bridge closed the connection: the end of the session, unless it is
/// restarting and keeps the session (then it is redialed like a lost path).
pub(super) fn bridge_closed(err: ConnectionError) -> ConnEnd {
    if let ConnectionError::ApplicationClosed(ac) = &err {
        let kept =
            Refusal::from_close(ac.error_code.into_inner(), &ac.reason).is_some_and(|r| r.is_session_kept());
        if kept {
            return ConnEnd::Lost("the bridge is restarting and keeps the session".into());
        }
    }
    ConnEnd::Closed(err)
}
