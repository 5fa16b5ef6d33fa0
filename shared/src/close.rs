//! How a bridge ends a connection, and how a client reads that back.
//!
//! Every active refusal is a QUIC application close with code
//! [`CLOSE_CODE_REFUSED`] and one of the reasons below, byte for byte: clients
//! (including apps written against the reference bridge) match on these strings.
//!
//! When the agent ends, the bridge finishes its stream (the peer gets every
//! byte), waits until the peer has acknowledged all of it, and then closes with
//! [`CLOSE_CODE_AGENT_ENDED`] and a reason saying how the agent ended
//! ([`AgentEnd`]): `agent exited (code N)` or `agent killed by signal N (SIGNAME)`,
//! followed for an agent that failed by ` — ` and its last stderr line.
//! A client that ignores close reasons sees exactly the bytes it saw before.

use crate::stderr_line::StderrLine;

/// Application close code for every refusal by the bridge.
pub const CLOSE_CODE_REFUSED: u32 = 1;
/// Application close code a client uses to end a session normally.
pub const CLOSE_CODE_CLIENT: u32 = 0;
/// Application close code the bridge uses after the agent ended and the peer
/// has all of its output; the reason is an [`AgentEnd`].
pub const CLOSE_CODE_AGENT_ENDED: u32 = 2;
/// Application close code the bridge uses when a warm agent's client is done
/// (its input ended and every request it sent was answered): the connection
/// ends, the agent does not (the peer's next connection takes it over).
pub const CLOSE_CODE_KEPT_WARM: u32 = 3;
pub const REASON_KEPT_WARM: &str = "agent kept warm";

pub const REASON_NOT_ALLOWLISTED: &str = "not allowlisted";
pub const REASON_IDLE: &str = "idle: no data stream opened";
pub const REASON_AT_CAPACITY: &str = "bridge at capacity";
pub const REASON_MEMBERSHIP_REVOKED: &str = "membership revoked";
pub const REASON_HANDSHAKE_TIMEOUT: &str = "handshake timed out";
/// Sent by clients on a normal close.
pub const REASON_CLIENT_CLOSED: &str = "client closed";
/// Sent by bridges before 2026-11 when a peer sent a line longer than the frame
/// cap; today such a line costs only itself (a JSON-RPC error), but clients
/// still recognise the reason.
pub const REASON_FRAME_TOO_LARGE: &str = "frame too large";
/// Ours: the bridge is shutting down (Ctrl-C / SIGTERM).
pub const REASON_SHUTTING_DOWN: &str = "bridge shutting down";
/// Ours, resumable sessions only: the bridge is stopping (a restart, an
/// upgrade, SIGTERM) and keeps the session on disk for its next run: a
/// resumable client keeps redialing for its grace, as after a lost path. A
/// plain (`/0`) session still gets [`REASON_SHUTTING_DOWN`].
pub const REASON_SESSION_KEPT: &str = "bridge restarting: session kept";
/// Ours: a session taken back after the bridge restarted could not be
/// reloaded into its new agent, which supports neither `session/resume` nor
/// `session/load` (what was kept of the old one was delivered first).
pub const REASON_CANNOT_RELOAD: &str = "host restarted: the agent cannot reload sessions";
/// A resume (`thunderbolt/<p>/r1`) named a session the bridge does not hold for
/// this peer: it ended (grace over, agent gone) or never was.
pub const REASON_UNKNOWN_SESSION: &str = "unknown session";
/// Ours: the host stopped serving the agent (its manifest was removed, or
/// changed its identity or protocol).
pub const REASON_AGENT_REMOVED: &str = "agent removed from the host";
/// Ours: the host's operator ended the session (`thunderbolt kick`).
pub const REASON_KICKED: &str = "ended by the host";
/// A resumable stream broke the protocol (a malformed or out-of-place
/// control line); the connection is closed, the session waits as after a loss.
pub const REASON_RESUME_PROTOCOL: &str = "resume protocol error";
/// A resume found its session ended because its client did not come back
/// within the grace the welcome announced.
pub const REASON_SESSION_EXPIRED: &str = "session expired";
/// A resume found its session ended to make room: it waited detached the
/// longest when the bridge was at capacity, or its device kept too many
/// detached sessions (pages that never resume their own).
pub const REASON_SESSION_EVICTED: &str = "session evicted";
/// A resume claimed to hold fewer of the bridge's frames than the client had
/// already acknowledged (a stale copy of its saved state): what it lacks is
/// gone, so the session is ended rather than resumed with a gap.
pub const REASON_STALE_RESUME: &str = "stale resume";
/// A device asked to join a session that has as many devices as it may, or
/// it joined as many sessions as one device may ([`crate::devices`]).
pub const REASON_TOO_MANY_DEVICES: &str = "too many devices";
/// A device's input ended while other devices were on its session: it left
/// (code 0, after it acknowledged the `end` it was sent); the session goes on.
pub const REASON_LEFT: &str = "left the session";
/// The bridge answered a device's listing and waited long enough for it to
/// close (code 0: nothing went wrong).
pub const REASON_LISTED: &str = "sessions listed";
/// A new session from a device whose scope does not include `start` (ours).
pub const REASON_SCOPE_START: &str = "this device may not start sessions";
/// A device whose scope ran out: refused, and its live sessions ended (ours).
pub const REASON_SCOPE_EXPIRED: &str = "device access expired";
/// A plain session whose device's scope no longer lets it drive one (ours:
/// a plain session cannot be watched only, so it ends).
pub const REASON_SCOPE_CHANGED: &str = "device scope changed";

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

/// How the agent process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exited on its own with this code.
    Code(i32),
    /// Killed by this signal number.
    Signal(i32),
}

/// How the agent ended, as carried in the close reason after its last byte:
/// its exit, and for an agent that failed, the last line it wrote on stderr
/// (where an agent says why it gave up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentEnd {
    pub exit: Exit,
    pub stderr: Option<StderrLine>,
}

const EXITED_PREFIX: &str = "agent exited (code ";
const SIGNALED_PREFIX: &str = "agent killed by signal ";
/// Between the exit and the stderr line in the reason: `agent exited (code 3)
/// — missing API key`. The exit part is the reference's reason unchanged; the
/// app's client never reads reasons, and a reader of ours splits here first.
const STDERR_SEPARATOR: &str = " — ";

impl AgentEnd {
    pub const fn exited(code: i32) -> Self {
        Self { exit: Exit::Code(code), stderr: None }
    }

    pub const fn signaled(sig: i32) -> Self {
        Self { exit: Exit::Signal(sig), stderr: None }
    }

    /// The same end, told with the agent's last stderr line.
    pub fn with_stderr(self, stderr: Option<StderrLine>) -> Self {
        Self { stderr, ..self }
    }

    /// Reads a close back: `None` unless `code` is [`CLOSE_CODE_AGENT_ENDED`]
    /// with a reason of this form.
    pub fn from_close(code: u64, reason: &[u8]) -> Option<Self> {
        if code != CLOSE_CODE_AGENT_ENDED as u64 {
            return None;
        }
        let reason = std::str::from_utf8(reason).ok()?;
        let (exit, stderr) = match reason.split_once(STDERR_SEPARATOR) {
            Some((exit, line)) => (exit, StderrLine::new(line)),
            None => (reason, None),
        };
        let exit = if let Some(rest) = exit.strip_prefix(EXITED_PREFIX) {
            Exit::Code(rest.strip_suffix(')')?.parse().ok()?)
        } else {
            let rest = exit.strip_prefix(SIGNALED_PREFIX)?;
            Exit::Signal(rest.split(' ').next()?.parse().ok()?)
        };
        Some(Self { exit, stderr })
    }

    /// Whether the agent finished cleanly (exit code 0).
    pub fn is_success(&self) -> bool {
        self.exit == Exit::Code(0)
    }

    pub fn exit_code(&self) -> Option<i32> {
        match self.exit {
            Exit::Code(c) => Some(c),
            Exit::Signal(_) => None,
        }
    }

    pub fn signal(&self) -> Option<i32> {
        match self.exit {
            Exit::Signal(s) => Some(s),
            Exit::Code(_) => None,
        }
    }

    /// The reason string as sent on the wire: the exit, then the stderr line
    /// if there is one.
    pub fn reason(&self) -> String {
        match &self.stderr {
            Some(line) => format!("{}{STDERR_SEPARATOR}{line}", self.exit_reason()),
            None => self.exit_reason(),
        }
    }

    /// The reason without the stderr line: `agent exited (code N)` or
    /// `agent killed by signal N (NAME)`, as the reference says it (its
    /// WebSocket transport, whose close reasons are at most 123 bytes).
    pub fn exit_reason(&self) -> String {
        match self.exit {
            Exit::Code(code) => format!("{EXITED_PREFIX}{code})"),
            Exit::Signal(sig) => format!("{SIGNALED_PREFIX}{}", signal_text(sig)),
        }
    }

    /// One line for a person, naming the code or the signal, then what the
    /// agent last said: `the agent exited with code 3: missing API key`.
    pub fn describe(&self) -> String {
        let exit = match self.exit {
            Exit::Code(code) => format!("the agent exited with code {code}"),
            Exit::Signal(sig) => format!("the agent was killed by signal {}", signal_text(sig)),
        };
        match &self.stderr {
            Some(line) => format!("{exit}: {line}"),
            None => exit,
        }
    }
}

/// `9 (SIGKILL)`, or just the number for a signal without a common name.
fn signal_text(sig: i32) -> String {
    match signal_name(sig) {
        Some(name) => format!("{sig} ({name})"),
        None => sig.to_string(),
    }
}

impl std::fmt::Display for AgentEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason())
    }
}

/// Names of the signals an agent is commonly ended by (Linux numbering, which
/// is also what every bridge host we support uses for these).
pub fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        _ => return None,
    })
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
    UnknownSession,
    SessionExpired,
    SessionEvicted,
    StaleResume,
    AgentRemoved,
    Kicked,
    SessionKept,
    CannotReload,
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
            REASON_UNKNOWN_SESSION => Self::UnknownSession,
            REASON_SESSION_EXPIRED => Self::SessionExpired,
            REASON_SESSION_EVICTED => Self::SessionEvicted,
            REASON_STALE_RESUME => Self::StaleResume,
            REASON_AGENT_REMOVED => Self::AgentRemoved,
            REASON_KICKED => Self::Kicked,
            REASON_SESSION_KEPT => Self::SessionKept,
            REASON_CANNOT_RELOAD => Self::CannotReload,
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

    /// Whether the bridge went away keeping the session for its next run: a
    /// resumable client redials as after a lost path.
    pub fn is_session_kept(&self) -> bool {
        matches!(self, Self::SessionKept)
    }

    /// Whether the bridge turned the connection away before any session ran
    /// (the others end a session that was admitted).
    pub fn is_admission(&self) -> bool {
        matches!(
            self,
            Self::NotAllowlisted
                | Self::Idle
                | Self::AtCapacity
                | Self::HandshakeTimeout
                | Self::FailedToSpawn(_)
        )
    }

    /// Whether this closes a resume because the session is no longer held:
    /// redialing cannot bring it back, a new session can start.
    pub fn is_session_gone(&self) -> bool {
        matches!(self, Self::UnknownSession | Self::SessionExpired | Self::SessionEvicted | Self::StaleResume)
    }

    /// One line for a person: "refused" only for refusals.
    pub fn describe(&self) -> String {
        match self {
            Self::UnknownSession => {
                "the session is gone: the bridge does not hold it (the bridge restarted, \
                                     or the session ended a while ago)"
                    .into()
            }
            Self::SessionExpired => {
                "the session is gone: it waited for this client longer than the bridge's \
                                     grace and was ended"
                    .into()
            }
            Self::SessionEvicted => "the session is gone: the bridge ended it to make room (it had waited \
                                     detached the longest, or this device left too many detached sessions)"
                .into(),
            Self::CannotReload => "the session is gone: the host restarted and its agent cannot reload \
                                   sessions (it supports neither session/resume nor session/load); what \
                                   the old agent had said was delivered"
                .into(),
            Self::StaleResume => "the session is gone: the resume used an older copy of the session state \
                                  than this client had already confirmed, so the bridge ended it"
                .into(),
            Self::ShuttingDown => "the bridge shut down: connect again once it runs".into(),
            Self::Kicked => {
                "the bridge ended the session: ended by the host (`thunderbolt kick` on its machine)".into()
            }
            r if r.is_admission() => format!("the bridge refused the connection: {r}"),
            Self::FrameTooLarge => {
                format!("the bridge ended the session: {} (a message over its frame limit)", self.reason())
            }
            Self::Other(r) => format!("the bridge closed the connection: {r}"),
            r => format!("the bridge ended the session: {r}"),
        }
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
            Self::UnknownSession => REASON_UNKNOWN_SESSION.into(),
            Self::SessionExpired => REASON_SESSION_EXPIRED.into(),
            Self::SessionEvicted => REASON_SESSION_EVICTED.into(),
            Self::StaleResume => REASON_STALE_RESUME.into(),
            Self::AgentRemoved => REASON_AGENT_REMOVED.into(),
            Self::Kicked => REASON_KICKED.into(),
            Self::SessionKept => REASON_SESSION_KEPT.into(),
            Self::CannotReload => REASON_CANNOT_RELOAD.into(),
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
            Refusal::UnknownSession,
            Refusal::SessionExpired,
            Refusal::SessionEvicted,
            Refusal::StaleResume,
            Refusal::AgentRemoved,
            Refusal::Kicked,
            Refusal::SessionKept,
            Refusal::CannotReload,
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
    fn agent_end_round_trips() {
        let said = StderrLine::new("missing API key ANTHROPIC_API_KEY");
        for end in [
            AgentEnd::exited(0),
            AgentEnd::exited(3),
            AgentEnd::exited(-1),
            AgentEnd::signaled(9),
            AgentEnd::signaled(64),
            AgentEnd::exited(3).with_stderr(said),
            AgentEnd::signaled(9).with_stderr(StderrLine::new("a — b (c)")),
            AgentEnd::signaled(64).with_stderr(said),
        ] {
            assert_eq!(AgentEnd::from_close(2, end.reason().as_bytes()), Some(end));
        }
        assert_eq!(AgentEnd::exited(3).reason(), "agent exited (code 3)");
        assert_eq!(AgentEnd::signaled(9).reason(), "agent killed by signal 9 (SIGKILL)");
        assert_eq!(AgentEnd::from_close(1, b"agent exited (code 3)"), None);
        assert_eq!(AgentEnd::from_close(2, b"something else"), None);
        assert!(AgentEnd::exited(0).is_success() && !AgentEnd::signaled(15).is_success());
        assert_eq!(Refusal::from_close(2, b"agent exited (code 0)"), None);
    }

    #[test]
    fn descriptions_say_refused_only_for_refusals() {
        assert_eq!(Refusal::NotAllowlisted.describe(), "the bridge refused the connection: not allowlisted");
        assert!(!Refusal::ShuttingDown.describe().contains("refused"));
        assert!(!Refusal::MembershipRevoked.describe().contains("refused"));
        assert!(!Refusal::FrameTooLarge.describe().contains("refused"));
        assert_eq!(AgentEnd::signaled(9).describe(), "the agent was killed by signal 9 (SIGKILL)");
    }

    #[test]
    fn the_stderr_line_follows_the_exit_the_reference_says() {
        let end = AgentEnd::exited(3).with_stderr(StderrLine::new("missing API key ANTHROPIC_API_KEY"));
        assert_eq!(end.reason(), "agent exited (code 3) — missing API key ANTHROPIC_API_KEY");
        assert_eq!(end.exit_reason(), "agent exited (code 3)");
        assert_eq!(end.describe(), "the agent exited with code 3: missing API key ANTHROPIC_API_KEY");
        assert_eq!((end.exit_code(), end.signal()), (Some(3), None));
        // A bridge may send a longer line than ours would: it is cut on reading.
        let long = format!("agent exited (code 1) — {}", "x".repeat(5000));
        let read = AgentEnd::from_close(2, long.as_bytes()).unwrap();
        assert!(read.stderr.unwrap().as_str().len() <= crate::stderr_line::MAX_STDERR_LINE);
        // Nothing printable after the separator: no line.
        assert_eq!(
            AgentEnd::from_close(2, "agent exited (code 1) — \u{7}".as_bytes()),
            Some(AgentEnd::exited(1))
        );
    }

    #[test]
    fn exact_wire_strings() {
        assert_eq!(failed_to_spawn("x"), "failed to spawn 'x'");
        assert_eq!(REASON_IDLE, "idle: no data stream opened");
        assert_eq!(Refusal::from_close(0, b"client closed"), None);
    }
}
