//! The client's side of a resumable session (`/r1`), with no I/O: what a
//! client keeps across its connections, the hello it opens each one with,
//! and how it takes the bridge's welcome. The native client (`thunderbolt
//! connect`, `bridge/src/cli/redial.rs`) and the browser client
//! (`client-wasm/src/resumable.rs`) each drive one: they dial, read and
//! write, and ask this what to say and what a welcome means, so that both
//! answer the same welcome the same way.
//!
//! The rules (docs/protocol.md, "Resumable sessions"):
//! - A hello names the session's token once the bridge gave one (with the
//!   frames received), else it starts a session, or joins another device's.
//! - A welcome for another session than the one named is never taken for a
//!   resumption: the session is over ([`WelcomeError::OtherSession`]).
//! - The welcome's `received` acknowledges our frames up to it; what we sent
//!   after is sent again ([`Welcomed::replay`]), and so is the end of our
//!   input once it ended. A position outside what we hold breaks the
//!   protocol ([`WelcomeError::Position`]).
//! - A client restored from stored state (a reloaded page: its token, no
//!   frames of its own) numbers its next frame from the bridge's count.
//! - At most [`CLIENT_SEND_BUFFER`] of our frames are unacknowledged: a run
//!   that does not fit waits ([`ClientSession::offer`]), unless nothing is
//!   unacknowledged (then it goes alone).
//! - Acks follow [`Acks`]; the bridge's end is acknowledged once every
//!   frame before it was delivered.
//!
//! Sans-IO, as `quinn-proto`: the driver passes in what arrived and the
//! time (`T`, its clock's instant), writes what [`ClientSession::poll_transmit`]
//! and [`ClientSession::offer`] hand out, and sleeps until
//! [`ClientSession::poll_timeout`].

use std::time::Duration;

use bytes::Bytes;

use crate::{
    close::{AgentEnd, Refusal, CLOSE_CODE_CLIENT, REASON_LEFT},
    resume::{Acks, BadPosition, Control, Moment, ReplayLog, CLIENT_SEND_BUFFER},
};

/// How long a client dials again for its first welcome, after losing the
/// connection that carried its hello: the bridge's grace is not known until
/// a welcome says it, and a relay that died between the hello and the
/// welcome must not end a session the client already queued frames on.
/// Long enough for a relay to come back or a path through another; short,
/// because the bridge may hold the half-made session (it drops it within its
/// own grace).
pub const FIRST_WELCOME_BUDGET: Duration = Duration::from_secs(15);

/// What a client keeps of its session across connections; `T` is the
/// driver's clock's instant.
#[derive(Debug)]
pub struct ClientSession<T> {
    /// Our frames, kept until the bridge acknowledged them.
    pub out: ReplayLog,
    /// The bridge's frames delivered; what acks and hellos say.
    pub acks: Acks<T>,
    /// A run of our frames that did not fit the send window, and its count
    /// of lines if the driver counted them.
    held: Option<(Bytes, Option<u64>)>,
    /// The agent ended after this many of the bridge's frames.
    end_at: Option<u64>,
    token: Option<String>,
    /// The hello that joins another device's session, until it is joined.
    join: Option<Control>,
    /// How long the bridge keeps the session for us (its welcome said).
    grace: Duration,
    /// Our input ended after this many frames.
    eof_at: Option<u64>,
}

/// Makes a client's own session state (`$state`, the protocol's side in its
/// field `$field`) read as its [`ClientSession`] (`Deref`, `DerefMut`): the
/// two clients keep their own fields beside it and use the protocol's as
/// their own.
#[macro_export]
macro_rules! holds_client_session {
    ($state:ty, $field:ident, $time:ty) => {
        impl ::std::ops::Deref for $state {
            type Target = $crate::resume_client::ClientSession<$time>;
            fn deref(&self) -> &Self::Target {
                &self.$field
            }
        }
        impl ::std::ops::DerefMut for $state {
            fn deref_mut(&mut self) -> &mut Self::Target {
                &mut self.$field
            }
        }
    };
}

/// A welcome taken: what to send first on the new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcomed {
    /// Our frames the bridge has not got, then the end of our input if it
    /// ended: written before anything new.
    pub replay: Vec<Bytes>,
    /// Whether this welcome started the session (or joined one): the first.
    pub first: bool,
}

/// What the bridge's close of a connection means for the session: dial
/// again, or the end and why. Both clients present these in their own words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterClose {
    /// The bridge is restarting and keeps the session: dial again, as after
    /// a loss.
    Redial,
    /// The agent ended, as the close says.
    AgentEnded(AgentEnd),
    /// The session this client was welcomed to is gone (expired, evicted,
    /// unknown); `delivered`: everything the agent said had arrived before
    /// it, so nothing was lost but the word on how the agent ended.
    Gone { refusal: Refusal, delivered: bool },
    /// A join named no session this device may join.
    NoSuchJoin { id: String },
    /// This device left a session others go on with.
    Left,
    /// Any other close: the session ends with it.
    Closed,
}

/// A welcome the client cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WelcomeError {
    /// The first line is not a welcome: the bridge does not speak `/r1`.
    #[error("the bridge answered our hello with something other than a welcome")]
    NotAWelcome,
    /// The bridge welcomed another session than ours: ours is not resumed,
    /// and a new one must not be taken for it.
    #[error("the bridge welcomed another session than ours (ours was not resumed)")]
    OtherSession,
    /// The bridge's resume point is not among our frames.
    #[error("the bridge's resume point is wrong: {0}")]
    Position(BadPosition),
}

impl<T> Default for ClientSession<T> {
    fn default() -> Self {
        Self {
            out: ReplayLog::default(),
            acks: Acks::default(),
            held: None,
            end_at: None,
            token: None,
            join: None,
            grace: Duration::ZERO,
            eof_at: None,
        }
    }
}

impl<T: Moment> ClientSession<T> {
    /// A new session; with `join`, the hello that joins another device's.
    pub fn new(join: Option<Control>) -> Self {
        Self { join, ..Self::default() }
    }

    /// A session restored from stored state: its token and how many of the
    /// bridge's frames were taken before.
    pub fn restored(token: String, received: u64) -> Self {
        Self { token: Some(token), acks: Acks::at(received), ..Self::default() }
    }

    /// The session's token, once a welcome gave it.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Whether this client joins another device's session (not welcomed yet).
    pub fn joining(&self) -> Option<&Control> {
        self.join.as_ref().filter(|_| self.token.is_none())
    }

    /// How long the bridge keeps the session while no connection carries it.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// How long to keep dialing after a lost connection: the grace the
    /// bridge's welcome announced, or, before any welcome,
    /// [`FIRST_WELCOME_BUDGET`] (the next hello starts the session afresh).
    pub fn redial_budget(&self) -> Duration {
        if self.token.is_some() {
            self.grace
        } else {
            FIRST_WELCOME_BUDGET
        }
    }

    /// After how many of our frames our input ended, if it did.
    pub fn eof_at(&self) -> Option<u64> {
        self.eof_at
    }

    /// The hello that opens a connection.
    pub fn hello(&self) -> Control {
        match (&self.token, &self.join) {
            (None, Some(join)) => join.clone(),
            _ => Control::Hello { session: self.token.clone(), received: self.acks.received() },
        }
    }

    /// Takes the bridge's answer to our hello (its first line).
    pub fn welcome(&mut self, line: &[u8]) -> Result<Welcomed, WelcomeError> {
        let Ok(Some(Control::Welcome { session, received, grace_ms })) = Control::parse(line) else {
            return Err(WelcomeError::NotAWelcome);
        };
        if self.token.as_ref().is_some_and(|t| *t != session) {
            return Err(WelcomeError::OtherSession);
        }
        // Restored with none of its old frames: number new ones from the bridge's count.
        if self.token.is_some() && self.out.total() == 0 && self.out.acked() == 0 && received > 0 {
            self.out = ReplayLog::starting_at(received);
            if let Some(n) = self.eof_at.as_mut() {
                *n = (*n).max(received);
            }
        }
        self.out.ack(received).map_err(WelcomeError::Position)?;
        let first = self.token.is_none();
        self.token = Some(session);
        self.grace = Duration::from_millis(grace_ms);
        self.acks.resumed();
        let mut replay = self.out.since(received).map_err(WelcomeError::Position)?;
        if let Some(n) = self.eof_at {
            replay.push(Control::Eof(n).encode());
        }
        Ok(Welcomed { replay, first })
    }

    /// The bridge acknowledged our frames up to `n`: they are dropped. An
    /// acknowledgement outside what we sent breaks the protocol: the
    /// session must end (both clients end it, saying so).
    pub fn acked(&mut self, n: u64) -> Result<(), BadPosition> {
        self.out.ack(n)
    }

    /// Our input ended: the control line that says so (and a welcome from
    /// now on replays it).
    pub fn input_ended(&mut self) -> Control {
        let n = self.out.total();
        self.eof_at = Some(n);
        Control::Eof(n)
    }

    /// The bridge acknowledged our frames up to `n`, or announced its end
    /// after `n` frames; other control lines mean nothing to this side. A
    /// wrong acknowledgement breaks the protocol: the session must end (both
    /// clients end it, saying so).
    pub fn handle_control(&mut self, c: &Control) -> Result<(), BadPosition> {
        match *c {
            Control::Ack(n) => self.acked(n)?,
            Control::End(n) => {
                self.end_at = Some(n);
                if self.all_delivered() {
                    self.acks.ack_now();
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// `frames` of the bridge's (`bytes` long) were delivered at `now`. True
    /// when the writer must look again ([`Acks::took`]; the agent's end
    /// acknowledged once everything before it was delivered).
    pub fn delivered(&mut self, frames: u64, bytes: usize, now: T) -> bool {
        let wake = self.acks.took(frames, bytes, now);
        if self.all_delivered() && !self.acks.is_due() {
            self.acks.ack_now();
            return true;
        }
        wake
    }

    /// What the bridge's close (`code`, `reason`) means for the session.
    pub fn after_close(&self, code: u64, reason: &[u8]) -> AfterClose {
        if let Some(end) = AgentEnd::from_close(code, reason) {
            return AfterClose::AgentEnded(end);
        }
        if code == CLOSE_CODE_CLIENT as u64 && reason == REASON_LEFT.as_bytes() {
            return AfterClose::Left;
        }
        match Refusal::from_close(code, reason) {
            Some(r) if r.is_session_kept() => AfterClose::Redial,
            Some(Refusal::UnknownSession) if self.joining().is_some() => match self.joining() {
                Some(Control::Join { id, .. }) => AfterClose::NoSuchJoin { id: id.clone() },
                _ => AfterClose::Closed,
            },
            // Before its first welcome a session cannot be gone: the refusal says why as it is.
            Some(refusal) if refusal.is_session_gone() && self.token.is_some() => {
                AfterClose::Gone { refusal, delivered: self.all_delivered() }
            }
            _ => AfterClose::Closed,
        }
    }

    /// After how many of the bridge's frames the agent ended, if it did.
    pub fn end_at(&self) -> Option<u64> {
        self.end_at
    }

    /// The agent ended and every frame before its end was delivered.
    pub fn all_delivered(&self) -> bool {
        self.end_at == Some(self.acks.received())
    }

    /// The bridge was silent: the next ack repeats the last as a probe.
    pub fn probe(&mut self) {
        self.acks.probe();
    }

    /// The control line to write now, if any: an ack, or the last one
    /// repeated as a probe.
    pub fn poll_transmit(&mut self) -> Option<Control> {
        self.acks.poll_transmit()
    }

    /// When [`Self::handle_timeout`] is due next (a pending ack's deadline).
    pub fn poll_timeout(&self) -> Option<T> {
        self.acks.poll_timeout()
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: T) {
        self.acks.handle_timeout(now);
    }

    /// Whether the send window takes a run now: the held one if it fits (or
    /// nothing is unacknowledged), else a new one while below the window.
    pub fn has_room(&self) -> bool {
        let n = self.out.bytes();
        match &self.held {
            Some((run, _)) => n == 0 || n + run.len() <= CLIENT_SEND_BUFFER,
            None => n < CLIENT_SEND_BUFFER,
        }
    }

    /// Whether a run waits for room ([`Self::take_held`] once there is).
    pub fn holds_run(&self) -> bool {
        self.held.is_some()
    }

    /// Offers a run of whole lines (escaped; with its count of lines if the
    /// driver counted them): the bytes to write if the window takes it, else
    /// `None` and it is held for [`Self::take_held`].
    pub fn offer(&mut self, run: Bytes, lines: Option<u64>) -> Option<Bytes> {
        let n = self.out.bytes();
        if n > 0 && n + run.len() > CLIENT_SEND_BUFFER {
            self.held = Some((run, lines));
            return None;
        }
        match lines {
            Some(lines) => self.out.push_counted(run.clone(), lines),
            None => self.out.push(run.clone()),
        };
        Some(run)
    }

    /// The held run, kept for a resend, to write now if it fits.
    pub fn take_held(&mut self) -> Option<Bytes> {
        if !self.has_room() {
            return None;
        }
        let (run, lines) = self.held.take()?;
        self.offer(run, lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Time in tests: a `Duration` since zero.
    type C = ClientSession<Duration>;
    const MS: Duration = Duration::from_millis(1);

    fn welcome(session: &str, received: u64) -> Vec<u8> {
        Control::Welcome { session: session.into(), received, grace_ms: 5000 }.encode().to_vec()
    }

    #[test]
    fn a_new_session_is_welcomed_then_resumed_with_what_the_bridge_missed() {
        let mut c = C::new(None);
        assert_eq!(c.hello(), Control::Hello { session: None, received: 0 });
        let w = c.welcome(&welcome("tok", 0)).unwrap();
        assert_eq!(w, Welcomed { replay: vec![], first: true });
        assert_eq!((c.token(), c.grace()), (Some("tok"), Duration::from_secs(5)));
        c.out.push(Bytes::from_static(b"a\n"));
        c.out.push(Bytes::from_static(b"b\n"));
        c.delivered(3, 30, MS);
        assert_eq!(c.input_ended(), Control::Eof(2));
        // The next connection names the session and what we took.
        assert_eq!(c.hello(), Control::Hello { session: Some("tok".into()), received: 3 });
        let w = c.welcome(&welcome("tok", 1)).unwrap();
        assert_eq!(w.replay, vec![Bytes::from_static(b"b\n"), Control::Eof(2).encode()]);
        assert!(!w.first);
        assert!(!c.acks.pending(), "the hello acknowledged what we took");
    }

    #[test]
    fn a_welcome_for_another_session_or_a_wrong_position_is_refused_and_changes_nothing() {
        let mut c = C::new(None);
        c.welcome(&welcome("tok", 0)).unwrap();
        c.out.push(Bytes::from_static(b"a\n"));
        assert_eq!(c.welcome(&welcome("other", 0)), Err(WelcomeError::OtherSession));
        assert_eq!(c.token(), Some("tok"));
        assert!(matches!(c.welcome(&welcome("tok", 5)), Err(WelcomeError::Position(_))));
        assert_eq!(c.welcome(b"{\"jsonrpc\":\"2.0\"}\n"), Err(WelcomeError::NotAWelcome));
        assert_eq!(c.welcome(&Control::Ack(0).encode()), Err(WelcomeError::NotAWelcome));
        // Still the same session, its frame still held.
        assert_eq!(c.welcome(&welcome("tok", 0)).unwrap().replay, vec![Bytes::from_static(b"a\n")]);
    }

    #[test]
    fn a_restored_client_numbers_its_frames_from_the_bridges_count() {
        let mut c = C::restored("tok".into(), 7);
        assert_eq!(c.hello(), Control::Hello { session: Some("tok".into()), received: 7 });
        let w = c.welcome(&welcome("tok", 4)).unwrap();
        assert!(w.replay.is_empty());
        c.out.push(Bytes::from_static(b"x\n"));
        assert_eq!(c.out.total(), 5);
        // A fresh client is not restored: a bridge claiming frames it never got is wrong.
        let mut fresh = C::new(None);
        assert!(matches!(fresh.welcome(&welcome("tok", 4)), Err(WelcomeError::Position(_))));
    }

    #[test]
    fn a_connection_lost_before_the_first_welcome_is_dialed_again_for_a_while() {
        let mut c = C::new(None);
        assert_eq!(c.redial_budget(), FIRST_WELCOME_BUDGET, "no grace known yet");
        assert_eq!(c.hello(), Control::Hello { session: None, received: 0 }, "the next hello starts it");
        c.welcome(&welcome("tok", 0)).unwrap();
        assert_eq!(c.redial_budget(), Duration::from_secs(5), "the bridge's grace from then on");
    }

    #[test]
    fn a_join_says_its_hello_until_welcomed() {
        let join = Control::Join { id: "ab12".into(), observe: true, history: crate::devices::History::All };
        let mut c = C::new(Some(join.clone()));
        assert_eq!(c.hello(), join);
        assert!(c.joining().is_some());
        assert!(c.welcome(&welcome("mine", 0)).unwrap().first);
        assert_eq!(c.hello(), Control::Hello { session: Some("mine".into()), received: 0 });
        assert!(c.joining().is_none());
    }

    #[test]
    fn acks_go_out_when_due_and_a_probe_repeats_the_last() {
        let mut c = C::new(None);
        assert_eq!((c.poll_transmit(), c.poll_timeout()), (None, None));
        assert!(c.delivered(2, 10, MS), "a deadline set: the writer must arm its timer");
        // Not due yet: by ACK_DELAY_MS after the first frame it covers.
        let at = MS + Duration::from_millis(crate::resume::ACK_DELAY_MS);
        assert_eq!((c.poll_transmit(), c.poll_timeout()), (None, Some(at)));
        assert!(!c.delivered(1, 10, at - MS), "nothing new for the writer");
        assert_eq!(c.poll_timeout(), Some(at), "kept from the first frame, not moved by later ones");
        c.handle_timeout(at - MS);
        assert_eq!(c.poll_transmit(), None);
        c.handle_timeout(at);
        assert_eq!(c.poll_timeout(), None);
        assert_eq!(c.poll_transmit(), Some(Control::Ack(3)));
        assert_eq!((c.poll_transmit(), c.poll_timeout()), (None, None));
        c.probe();
        assert_eq!(c.poll_transmit(), Some(Control::Ack(3)), "a probe repeats it");
        assert_eq!(c.poll_transmit(), None);
        // Past the count, due at once; a probe with it sends one ack.
        assert!(c.delivered(crate::resume::ACK_EVERY_FRAMES, 5, at), "due at once");
        c.probe();
        assert_eq!(c.poll_transmit(), Some(Control::Ack(3 + crate::resume::ACK_EVERY_FRAMES)));
        assert_eq!(c.poll_transmit(), None);
    }

    #[test]
    fn the_bridges_end_is_acknowledged_once_everything_before_it_was_delivered() {
        let mut c = C::new(None);
        c.welcome(&welcome("tok", 0)).unwrap();
        c.delivered(1, 10, MS);
        c.handle_control(&Control::End(3)).unwrap();
        assert_eq!((c.end_at(), c.all_delivered()), (Some(3), false));
        assert_eq!(c.poll_transmit(), None, "two frames are still on their way");
        assert!(c.delivered(2, 10, MS), "the end is due to be acknowledged");
        assert!(c.all_delivered());
        assert_eq!(c.poll_transmit(), Some(Control::Ack(3)));
        // An acknowledgement of frames we never sent breaks the protocol.
        assert!(c.handle_control(&Control::Ack(1)).is_err());
        assert!(c.handle_control(&Control::Ack(0)).is_ok());
    }

    #[test]
    fn the_send_window_holds_a_run_that_does_not_fit_until_acks_make_room() {
        let mut c = C::new(None);
        c.welcome(&welcome("tok", 0)).unwrap();
        let lines = |n: usize| {
            let mut v = vec![b'x'; n - 1];
            v.push(b'\n');
            Bytes::from(v)
        };
        let (first, big) = (lines(CLIENT_SEND_BUFFER - 2), lines(CLIENT_SEND_BUFFER + 10));
        assert_eq!(c.offer(first, Some(1)).map(|b| b.len()), Some(CLIENT_SEND_BUFFER - 2));
        assert!(c.has_room(), "below the window");
        let line = Bytes::from_static(b"a\n");
        assert_eq!(c.offer(line.clone(), None), Some(line.clone()), "the window is not full yet");
        assert!(!c.has_room(), "at the window");
        assert_eq!(c.offer(line.clone(), None), None, "held");
        assert!(c.holds_run() && !c.has_room());
        assert_eq!(c.take_held(), None, "no room yet");
        c.handle_control(&Control::Ack(1)).unwrap();
        assert!(c.has_room());
        assert_eq!(c.take_held(), Some(line));
        assert!(!c.holds_run());
        assert_eq!(c.out.total(), 3);
        // A run larger than the window waits until nothing is unacknowledged.
        assert_eq!(c.offer(big.clone(), None), None);
        c.handle_control(&Control::Ack(2)).unwrap();
        assert_eq!(c.take_held(), None, "one line still unacknowledged");
        c.handle_control(&Control::Ack(3)).unwrap();
        assert_eq!(c.take_held().map(|b| b.len()), Some(big.len()));
    }

    #[test]
    fn a_close_means_a_redial_or_the_end_and_why() {
        use crate::close::{
            CLOSE_CODE_REFUSED, REASON_SESSION_EXPIRED, REASON_SESSION_KEPT, REASON_UNKNOWN_SESSION,
        };
        let refused = CLOSE_CODE_REFUSED as u64;
        let mut c = C::new(None);
        assert_eq!(c.after_close(refused, REASON_SESSION_KEPT.as_bytes()), AfterClose::Redial);
        assert_eq!(
            c.after_close(refused, REASON_SESSION_EXPIRED.as_bytes()),
            AfterClose::Closed,
            "not welcomed yet"
        );
        c.welcome(&welcome("tok", 0)).unwrap();
        assert_eq!(
            c.after_close(refused, REASON_SESSION_EXPIRED.as_bytes()),
            AfterClose::Gone { refusal: Refusal::SessionExpired, delivered: false }
        );
        c.handle_control(&Control::End(0)).unwrap();
        assert!(matches!(
            c.after_close(refused, REASON_UNKNOWN_SESSION.as_bytes()),
            AfterClose::Gone { delivered: true, .. }
        ));
        assert_eq!(c.after_close(0, REASON_LEFT.as_bytes()), AfterClose::Left);
        assert_eq!(c.after_close(0, b"client closed"), AfterClose::Closed);
        let end = AgentEnd::exited(3);
        assert_eq!(c.after_close(2, end.reason().as_bytes()), AfterClose::AgentEnded(end));
        let join = Control::Join { id: "ab12".into(), observe: false, history: crate::devices::History::Now };
        let j = C::new(Some(join));
        assert_eq!(
            j.after_close(refused, REASON_UNKNOWN_SESSION.as_bytes()),
            AfterClose::NoSuchJoin { id: "ab12".into() }
        );
    }
}
