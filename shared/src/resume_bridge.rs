//! The bridge's side of one resumable session (`/r1`), with no I/O: the
//! agent's frames kept for a resend, the client's frames counted and
//! acknowledged, how a hello resumes the session and what the client's
//! control lines mean. The bridge (`bridge/src/serve/sessions/`) keeps one per
//! device attached to a session and drives it; the client's side is
//! [`crate::resume_client::ClientSession`], the same rules seen from the other
//! end, and `shared/tests/r1_sessions.rs` runs the two against each other.
//!
//! The rules (docs/protocol.md, "Resumable sessions"):
//! - A hello's `received` acknowledges the agent's frames up to it; what
//!   follows is sent again. A client that claims fewer than it already
//!   acknowledged holds a stale copy of its state: the session cannot be
//!   resumed ([`ResumeError::Stale`]); one that claims frames never sent
//!   breaks the protocol ([`ResumeError::Position`]).
//! - The welcome says how many of the client's frames the bridge holds and
//!   how long it keeps the session for a client that went away.
//! - The client's `eof` must count exactly the frames that arrived.
//!
//! Time is the driver's (`T`), as in [`Acks`].

use std::time::Duration;

use crate::resume::{Acks, BadPosition, Control, Moment, ReplayLog};

/// What the bridge keeps of one device's `/r1` session across connections.
#[derive(Debug)]
pub struct BridgeSession<T> {
    /// The agent's frames (as this device gets them), kept until acknowledged.
    pub out: ReplayLog,
    /// The device's frames taken, and when to acknowledge them.
    pub acks: Acks<T>,
}

impl<T> Default for BridgeSession<T> {
    fn default() -> Self {
        Self { out: ReplayLog::new(), acks: Acks::default() }
    }
}

/// A hello the bridge cannot resume from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    /// The client holds fewer of the agent's frames than it acknowledged.
    #[error(
        "a resume claimed {claimed} of the agent's frames, but the client had acknowledged {acked} \
         (a stale copy of its session state): those are gone"
    )]
    Stale { claimed: u64, acked: u64 },
    /// The client claims frames that were never sent.
    #[error("{0}")]
    Position(BadPosition),
}

/// What a control line from the device asks of the bridge, beyond what
/// [`BridgeSession::handle_control`] did itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromDevice {
    /// Nothing more (an ack taken, or a line that means nothing here).
    Nothing,
    /// The device acknowledged the agent's frames up to here: room was made.
    Acked(u64),
    /// The device's input ended, every frame of it arrived.
    Eof(u64),
    /// The device asks for this role in a shared session.
    Role(crate::devices::Role),
}

/// A control line from the device that breaks the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokenByDevice {
    #[error("ack {0}")]
    Ack(BadPosition),
    #[error("eof after {said} frames, but {arrived} arrived")]
    Eof { said: u64, arrived: u64 },
}

impl<T: Moment> BridgeSession<T> {
    /// A session taken back from its journal: the agent's frames it kept and
    /// how many of the client's had arrived.
    pub fn restored(out: ReplayLog, client_frames: u64) -> Self {
        Self { out, acks: Acks::at(client_frames) }
    }

    /// A connection opened with a hello that holds the agent's first
    /// `received` frames: the welcome to answer with (naming `token`, with
    /// `grace`); the frames from `received` on are to be sent after it.
    pub fn resume(&mut self, token: &str, received: u64, grace: Duration) -> Result<Control, ResumeError> {
        if let Some(stale) = self.stale(received) {
            return Err(stale);
        }
        self.out.ack(received).map_err(ResumeError::Position)?;
        self.acks.resumed();
        Ok(Control::Welcome {
            session: token.to_owned(),
            received: self.acks.received(),
            grace_ms: grace.as_millis() as u64,
        })
    }

    /// A hello claiming `received` of the agent's frames holds a stale copy
    /// of the client's state (fewer than it acknowledged): the session
    /// cannot be resumed, and the bridge ends it.
    pub fn stale(&self, received: u64) -> Option<ResumeError> {
        let acked = self.out.acked();
        (received < acked).then_some(ResumeError::Stale { claimed: received, acked })
    }

    /// Takes a control line from the device.
    pub fn handle_control(&mut self, c: &Control) -> Result<FromDevice, BrokenByDevice> {
        Ok(match *c {
            Control::Ack(n) => {
                self.out.ack(n).map_err(BrokenByDevice::Ack)?;
                FromDevice::Acked(n)
            }
            Control::Eof(n) => {
                let arrived = self.acks.received();
                if arrived != n {
                    return Err(BrokenByDevice::Eof { said: n, arrived });
                }
                FromDevice::Eof(n)
            }
            Control::Role(r) => FromDevice::Role(r),
            // Hellos mid-stream, welcomes, ends and unknown kinds mean nothing here.
            _ => FromDevice::Nothing,
        })
    }

    /// `frames` of the device's (`bytes` long) were taken at `now`; true when
    /// the writer must look again ([`Acks::took`]).
    pub fn took(&mut self, frames: u64, bytes: usize, now: T) -> bool {
        self.acks.took(frames, bytes, now)
    }

    /// The ack to write now, if any (ahead of the agent's frames: the
    /// device's sending waits on it).
    pub fn poll_transmit(&mut self, now: T) -> Option<Control> {
        self.acks.handle_timeout(now);
        self.acks.poll_transmit()
    }

    /// When a pending ack is due at the latest.
    pub fn poll_timeout(&self) -> Option<T> {
        self.acks.poll_timeout()
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    type B = BridgeSession<Duration>;

    #[test]
    fn a_hello_resumes_from_what_the_client_holds_and_a_stale_one_is_refused() {
        let mut b = B::default();
        for f in [&b"a\n"[..], b"b\n", b"c\n"] {
            b.out.push(Bytes::copy_from_slice(f));
        }
        b.took(2, 20, Duration::ZERO);
        let w = b.resume("tok", 1, Duration::from_secs(5)).unwrap();
        assert_eq!(w, Control::Welcome { session: "tok".into(), received: 2, grace_ms: 5000 });
        assert!(!b.acks.pending(), "the welcome acknowledged the client's frames");
        assert_eq!(b.out.since(1).unwrap().concat(), b"b\nc\n");
        assert_eq!(b.resume("tok", 0, Duration::ZERO), Err(ResumeError::Stale { claimed: 0, acked: 1 }));
        assert!(matches!(b.resume("tok", 9, Duration::ZERO), Err(ResumeError::Position(_))));
    }

    #[test]
    fn the_devices_control_lines_are_checked() {
        let mut b = B::default();
        b.out.push(Bytes::from_static(b"a\n"));
        assert_eq!(b.handle_control(&Control::Ack(1)), Ok(FromDevice::Acked(1)));
        assert!(matches!(b.handle_control(&Control::Ack(2)), Err(BrokenByDevice::Ack(_))));
        b.took(3, 30, Duration::ZERO);
        assert_eq!(b.handle_control(&Control::Eof(2)), Err(BrokenByDevice::Eof { said: 2, arrived: 3 }));
        assert_eq!(b.handle_control(&Control::Eof(3)), Ok(FromDevice::Eof(3)));
        assert_eq!(b.handle_control(&Control::End(3)), Ok(FromDevice::Nothing));
        // The ack goes out by its deadline.
        let at = b.poll_timeout().expect("a pending ack has a deadline");
        assert_eq!(b.poll_transmit(at - Duration::from_millis(1)), None);
        assert_eq!(b.poll_transmit(at), Some(Control::Ack(3)));
    }
}
