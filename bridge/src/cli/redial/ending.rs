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
        let code = ac.error_code.into_inner();
        if code == close::CLOSE_CODE_CLIENT as u64 && &ac.reason[..] == close::REASON_LEFT.as_bytes() {
            return Ok(Finish::Left);
        }
        if let Some(end) = AgentEnd::from_close(code, &ac.reason) {
            return Ok(Finish::AgentEnded(Some(end)));
        }
        if let (Some(Control::Join { id, .. }), Some(Refusal::UnknownSession)) =
            (st.joining(), Refusal::from_close(code, &ac.reason))
        {
            bail!(
                "no session '{id}' this device may join: `thunderbolt sessions <ticket>` lists those it may"
            );
        }
        if let Some(gone) = Refusal::from_close(code, &ac.reason).filter(Refusal::is_session_gone) {
            if st.all_delivered() {
                return Ok(Finish::AgentEnded(None));
            }
            bail!("{}", gone.describe());
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
