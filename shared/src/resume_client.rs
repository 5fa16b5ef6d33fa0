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

use std::time::Duration;

use bytes::Bytes;

use crate::resume::{AckPolicy, BadPosition, Control, ReplayLog};

/// How long a client dials again for its first welcome, after losing the
/// connection that carried its hello: the bridge's grace is not known until
/// a welcome says it, and a relay that died between the hello and the
/// welcome must not end a session the client already queued frames on.
/// Long enough for a relay to come back or a path through another; short,
/// because the bridge may hold the half-made session (it drops it within its
/// own grace).
pub const FIRST_WELCOME_BUDGET: Duration = Duration::from_secs(15);

/// What a client keeps of its session across connections.
#[derive(Debug, Default)]
pub struct ClientSession {
    /// Our frames, kept until the bridge acknowledged them.
    pub out: ReplayLog,
    /// The bridge's frames delivered; what acks and hellos say.
    pub ack: AckPolicy,
    /// An ack is to go out now.
    pub ack_due: bool,
    /// A repeated ack is to go out: the bridge was silent (`crate::silence`).
    pub probe_due: bool,
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
    ($state:ty, $field:ident) => {
        impl ::std::ops::Deref for $state {
            type Target = $crate::resume_client::ClientSession;
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

impl ClientSession {
    /// A new session; with `join`, the hello that joins another device's.
    pub fn new(join: Option<Control>) -> Self {
        Self { join, ..Self::default() }
    }

    /// A session restored from stored state: its token and how many of the
    /// bridge's frames were taken before.
    pub fn restored(token: String, received: u64) -> Self {
        Self { token: Some(token), ack: AckPolicy::at(received), ..Self::default() }
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
            _ => Control::Hello { session: self.token.clone(), received: self.ack.received() },
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
        self.ack.resumed();
        self.ack_due = false;
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

    /// The control line due now, if any: an ack (or, after a silence, the
    /// same ack repeated as a probe).
    pub fn next_ack(&mut self) -> Option<Control> {
        let probe = std::mem::take(&mut self.probe_due);
        let due = std::mem::take(&mut self.ack_due);
        if !(due || probe) {
            return None;
        }
        match self.ack.ack() {
            None if probe => Some(Control::Ack(self.ack.received())),
            ack => ack,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn welcome(session: &str, received: u64) -> Vec<u8> {
        Control::Welcome { session: session.into(), received, grace_ms: 5000 }.encode().to_vec()
    }

    #[test]
    fn a_new_session_is_welcomed_then_resumed_with_what_the_bridge_missed() {
        let mut c = ClientSession::new(None);
        assert_eq!(c.hello(), Control::Hello { session: None, received: 0 });
        let w = c.welcome(&welcome("tok", 0)).unwrap();
        assert_eq!(w, Welcomed { replay: vec![], first: true });
        assert_eq!((c.token(), c.grace()), (Some("tok"), Duration::from_secs(5)));
        c.out.push(Bytes::from_static(b"a\n"));
        c.out.push(Bytes::from_static(b"b\n"));
        c.ack.took(3, 30);
        assert_eq!(c.input_ended(), Control::Eof(2));
        // The next connection names the session and what we took.
        assert_eq!(c.hello(), Control::Hello { session: Some("tok".into()), received: 3 });
        let w = c.welcome(&welcome("tok", 1)).unwrap();
        assert_eq!(w.replay, vec![Bytes::from_static(b"b\n"), Control::Eof(2).encode()]);
        assert!(!w.first);
        assert!(!c.ack.pending(), "the hello acknowledged what we took");
    }

    #[test]
    fn a_welcome_for_another_session_or_a_wrong_position_is_refused_and_changes_nothing() {
        let mut c = ClientSession::new(None);
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
        let mut c = ClientSession::restored("tok".into(), 7);
        assert_eq!(c.hello(), Control::Hello { session: Some("tok".into()), received: 7 });
        let w = c.welcome(&welcome("tok", 4)).unwrap();
        assert!(w.replay.is_empty());
        c.out.push(Bytes::from_static(b"x\n"));
        assert_eq!(c.out.total(), 5);
        // A fresh client is not restored: a bridge claiming frames it never got is wrong.
        let mut fresh = ClientSession::new(None);
        assert!(matches!(fresh.welcome(&welcome("tok", 4)), Err(WelcomeError::Position(_))));
    }

    #[test]
    fn a_connection_lost_before_the_first_welcome_is_dialed_again_for_a_while() {
        let mut c = ClientSession::new(None);
        assert_eq!(c.redial_budget(), FIRST_WELCOME_BUDGET, "no grace known yet");
        assert_eq!(c.hello(), Control::Hello { session: None, received: 0 }, "the next hello starts it");
        c.welcome(&welcome("tok", 0)).unwrap();
        assert_eq!(c.redial_budget(), Duration::from_secs(5), "the bridge's grace from then on");
    }

    #[test]
    fn a_join_says_its_hello_until_welcomed() {
        let join = Control::Join { id: "ab12".into(), observe: true, history: crate::devices::History::All };
        let mut c = ClientSession::new(Some(join.clone()));
        assert_eq!(c.hello(), join);
        assert!(c.joining().is_some());
        assert!(c.welcome(&welcome("mine", 0)).unwrap().first);
        assert_eq!(c.hello(), Control::Hello { session: Some("mine".into()), received: 0 });
        assert!(c.joining().is_none());
    }

    #[test]
    fn acks_go_out_when_due_and_a_probe_repeats_the_last() {
        let mut c = ClientSession::new(None);
        assert_eq!(c.next_ack(), None);
        c.ack.took(2, 10);
        c.ack_due = true;
        assert_eq!(c.next_ack(), Some(Control::Ack(2)));
        assert_eq!(c.next_ack(), None);
        c.probe_due = true;
        assert_eq!(c.next_ack(), Some(Control::Ack(2)), "a probe repeats it");
        assert_eq!(c.next_ack(), None);
        // Due and a probe at once: one ack, the new one when there is one.
        c.ack.took(1, 5);
        (c.ack_due, c.probe_due) = (true, true);
        assert_eq!(c.next_ack(), Some(Control::Ack(3)));
        (c.ack_due, c.probe_due) = (true, true);
        assert_eq!(c.next_ack(), Some(Control::Ack(3)), "nothing new: the probe repeats it");
        assert_eq!(c.next_ack(), None);
    }
}
