//! The resumable session protocol, `thunderbolt/<protocol>/r1`: one session
//! carried over any number of connections, every frame delivered exactly once
//! and in order in both directions.
//!
//! # Negotiation
//!
//! A client that can resume offers the ALPN `thunderbolt/<p>/r1` ahead of
//! `thunderbolt/<p>/0`. A bridge that knows `r1` picks it; one that does not
//! picks `/0`, and the client then speaks the plain protocol (one connection,
//! one session, no control lines) exactly as a `/0`-only client would. A client
//! that offers only `/0` gets the plain protocol from every bridge.
//!
//! # On the stream
//!
//! As in the plain protocol, each connection carries one bidirectional stream
//! (the client opens it) of `\n`-terminated lines. A line that starts with `!`
//! is a *control line*: `!` followed by one JSON object. Every other line is a
//! *frame* (the JSON-RPC message, unchanged). A JSON value never starts with
//! `!`; a client relaying a local line that does (not JSON anyway) sends it
//! with one space in front. Frames are counted per direction from 0 over the
//! whole session; both sides count every frame line, valid or not.
//!
//! ```text
//! client → bridge   !{"hello":1,"session":null,"received":0}        new session
//!                   !{"hello":1,"session":"<token>","received":N}  resume: I hold your first N frames
//! bridge → client   !{"session":"<token>","received":M,"grace_ms":G}
//!                   I hold your first M frames; resend from M. A session is kept G ms after
//!                   a connection is lost without a close.
//! either way        !{"ack":N}     I hold your first N frames: drop them from your replay buffer
//! client → bridge   !{"eof":N}     my input ended after N frames (the agent's stdin is closed)
//! bridge → client   !{"end":N}     the agent ended after N frames; ack N and the bridge closes
//!                                  with code 2 and how the agent ended
//! ```
//!
//! The hello is the client's first line and the welcome the bridge's first
//! line; after the welcome each side first resends what the other does not
//! hold, then carries on. Unknown control lines and unknown fields are ignored
//! (room for later versions). A resume the bridge cannot honour (no such
//! session, another NodeId's, or it ended) is closed with code 1 and
//! [`crate::close::REASON_UNKNOWN_SESSION`]. The client's close (code 0,
//! `client closed`) ends the session at once; any other loss detaches it for
//! the grace period, during which the agent runs on and its output is kept.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use crate::devices::{History, Role};
use crate::protocol::Protocol;

/// The byte that starts a control line.
pub const CONTROL_PREFIX: u8 = b'!';

/// Longest control line accepted (they are a few dozen bytes): a longer line
/// starting with `!` is carried as a frame.
pub const MAX_CONTROL_LINE: usize = 1024;

/// Where the first line of `buf` ends (the index of its `\n`), if it fits a
/// control line: the hello and the welcome are read with this, so a line is
/// judged the same however the stream split it. `Ok(None)`: no newline yet, and
/// the line may still fit; `Err`: it cannot be a control line.
pub fn control_line_end(buf: &[u8]) -> Result<Option<usize>, LineTooLong> {
    match memchr::memchr(b'\n', buf) {
        Some(nl) if nl < MAX_CONTROL_LINE => Ok(Some(nl)),
        Some(_) => Err(LineTooLong),
        None if buf.len() >= MAX_CONTROL_LINE => Err(LineTooLong),
        None => Ok(None),
    }
}

/// A first line longer than any control line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no line end within {MAX_CONTROL_LINE} bytes")]
pub struct LineTooLong;

/// Most bytes of its own frames a client keeps unacknowledged: past it, it
/// sends nothing new until acks make room, except that a single run of
/// frames larger than this goes out alone once everything before it was
/// acknowledged. Together with [`BRIDGE_READ_AHEAD`] this is what keeps a
/// session free of deadlock: the bridge always reads far enough to reach the
/// client's acks, even while the agent reads nothing (see there).
///
/// 2 MiB fills a 100 ms path at 20 MB/s, above what a client uploads to an
/// agent; QUIC's own stream window (1.25 MB) is the tighter limit anyway.
pub const CLIENT_SEND_BUFFER: usize = 2 << 20;

/// Most bytes of a client's frames the bridge reads ahead of the agent's
/// input (beyond one run). The client's acks share the stream with its
/// frames, so they can only be read once the frames before them are; if the
/// bridge stopped reading while its agent blocks on output that waits for
/// those very acks, neither side would move. A client never has more than
/// [`CLIENT_SEND_BUFFER`] unacknowledged (or a single larger run), and the
/// bridge acknowledges frames only once the agent's queue took them, so
/// reading twice that ahead always reaches the acks; a client that breaks the
/// rule only stalls its own session, and costs at most this plus one run.
pub const BRIDGE_READ_AHEAD: usize = 2 * CLIENT_SEND_BUFFER;

/// A receiver acknowledges after this many frames at the latest: with small
/// messages, one ack per this many keeps the replay buffer short at the cost
/// of a few bytes per hundred frames.
pub const ACK_EVERY_FRAMES: u64 = 128;

/// ... or after this many bytes: bulk transfers ack a few times per receive
/// window, so the sender's buffer never holds much more than what is in flight.
pub const ACK_EVERY_BYTES: u64 = 256 * 1024;

/// ... or this long after the first frame not yet acknowledged, so a quiet
/// session's buffer empties too (milliseconds: not on any reply's path).
pub const ACK_DELAY_MS: u64 = 50;

/// How the resumable ALPN ends (the plain one ends in `/0`).
pub const RESUME_ALPN_SUFFIX: &[u8] = b"/r1";

/// `thunderbolt/<p>/r1`.
pub fn resume_alpn(protocol: &Protocol) -> Vec<u8> {
    let mut alpn = format!("thunderbolt/{}", protocol.as_str()).into_bytes();
    alpn.extend_from_slice(RESUME_ALPN_SUFFIX);
    alpn
}

/// A control line's meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    Hello {
        session: Option<String>,
        received: u64,
    },
    Welcome {
        session: String,
        received: u64,
        grace_ms: u64,
    },
    Ack(u64),
    Eof(u64),
    End(u64),
    /// A hello that joins another device's session (a new session of this
    /// device's own, on the same agent): see [`crate::devices`].
    Join {
        id: String,
        observe: bool,
        history: History,
    },
    /// A hello that asks which sessions this device may join: of this agent,
    /// or (`host`) of every agent of the host that admits it, with those
    /// agents (one round trip per host for a device's list).
    List {
        host: bool,
    },
    /// A device asks for a role in the session it shares.
    Role(Role),
}

impl Control {
    /// The line, `!` to `\n`.
    pub fn encode(&self) -> Bytes {
        // Written by hand (no JSON tree): the browser client carries every byte of code.
        let text = |t: &str| serde_json::to_string(t).expect("a string serializes");
        let line = match self {
            Self::Hello { session, received } => {
                let session = session.as_deref().map_or_else(|| "null".to_string(), text);
                format!("!{{\"hello\":1,\"session\":{session},\"received\":{received}}}\n")
            }
            Self::Welcome { session, received, grace_ms } => format!(
                "!{{\"session\":{},\"received\":{received},\"grace_ms\":{grace_ms}}}\n",
                text(session)
            ),
            Self::Ack(n) => format!("!{{\"ack\":{n}}}\n"),
            Self::Eof(n) => format!("!{{\"eof\":{n}}}\n"),
            Self::End(n) => format!("!{{\"end\":{n}}}\n"),
            Self::Join { id, observe, history } => format!(
                "!{{\"hello\":1,\"session\":null,\"received\":0,\"join\":{},\"observe\":{observe},\"history\":\"{}\"}}\n",
                text(id),
                history.as_str()
            ),
            // `host` is a key of its own: a bridge that does not know it
            // answers with this agent's sessions (never a new session).
            Self::List { host: false } => "!{\"hello\":1,\"session\":null,\"received\":0,\"list\":1}\n".to_string(),
            Self::List { host: true } => {
                "!{\"hello\":1,\"session\":null,\"received\":0,\"list\":1,\"host\":1}\n".to_string()
            }
            Self::Role(r) => format!("!{{\"role\":\"{}\"}}\n", r.as_str()),
        };
        line.into()
    }

    /// Reads a control line (with or without its `!` and `\n`).
    ///
    /// `Ok(None)` for an object of a kind this version does not know (to be
    /// ignored: room for later versions). `Err` for a line that breaks the
    /// protocol: not one JSON object, a hello of another version, or a known
    /// field whose value is not what it must be (every count is a JSON integer
    /// in `0..=u64::MAX`; `-1`, `5.0` and `99999999999999999999` are refused
    /// alike, never read as something else or ignored).
    pub fn parse(line: &[u8]) -> Result<Option<Self>, BadControl> {
        let line = line.strip_prefix(&[CONTROL_PREFIX]).unwrap_or(line).trim_ascii();
        // Acks are nearly every control line: read them without a JSON tree.
        if let Some(digits) = line.strip_prefix(b"{\"ack\":").and_then(|r| r.strip_suffix(b"}")) {
            if !digits.is_empty()
                && digits.iter().all(u8::is_ascii_digit)
                && (digits.len() == 1 || digits[0] != b'0')
            {
                let text = std::str::from_utf8(digits).map_err(|_| BadControl::NotAnObject)?;
                return text.parse().map(|n| Some(Self::Ack(n))).map_err(|_| BadControl::NotACount("ack"));
            }
        }
        let v: Value = serde_json::from_slice(line).map_err(|_| BadControl::NotAnObject)?;
        let o = v.as_object().ok_or(BadControl::NotAnObject)?;
        // A present count must be a u64; an absent one is `None`.
        let count = |k: &'static str| -> Result<Option<u64>, BadControl> {
            match o.get(k) {
                None => Ok(None),
                Some(v) => v.as_u64().map(Some).ok_or(BadControl::NotACount(k)),
            }
        };
        let required = |k: &'static str| count(k)?.ok_or(BadControl::Missing(k));
        if let Some(version) = o.get("hello") {
            if version.as_u64() != Some(HELLO_VERSION) {
                return Err(BadControl::Version);
            }
            let session = match o.get("session") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(_) => return Err(BadControl::NotASession),
            };
            let received = required("received")?;
            let flag = |k: &str| o.get(k).is_some_and(|l| l.as_u64() == Some(1) || l.as_bool() == Some(true));
            if flag("list") {
                return Ok(Some(Self::List { host: flag("host") }));
            }
            if let Some(join) = o.get("join") {
                let id = join.as_str().ok_or(BadControl::NotASession)?.to_string();
                let observe = match o.get("observe") {
                    None | Some(Value::Null) => false,
                    Some(v) => v.as_bool().ok_or(BadControl::NotAFlag("observe"))?,
                };
                let history = match o.get("history") {
                    None | Some(Value::Null) => History::All,
                    Some(v) => v.as_str().and_then(History::parse).ok_or(BadControl::NotAFlag("history"))?,
                };
                return Ok(Some(Self::Join { id, observe, history }));
            }
            return Ok(Some(Self::Hello { session, received }));
        }
        if let Some(n) = count("ack")? {
            return Ok(Some(Self::Ack(n)));
        }
        if let Some(n) = count("eof")? {
            return Ok(Some(Self::Eof(n)));
        }
        if let Some(n) = count("end")? {
            return Ok(Some(Self::End(n)));
        }
        if let Some(r) = o.get("role") {
            return r
                .as_str()
                .and_then(Role::parse)
                .map(|r| Some(Self::Role(r)))
                .ok_or(BadControl::NotAFlag("role"));
        }
        match o.get("session") {
            Some(Value::String(s)) => Ok(Some(Self::Welcome {
                session: s.clone(),
                received: required("received")?,
                grace_ms: count("grace_ms")?.unwrap_or(0),
            })),
            Some(_) => Err(BadControl::NotASession),
            None => Ok(None),
        }
    }
}

/// The hello's version: the only one there is.
pub const HELLO_VERSION: u64 = 1;

/// A control line that breaks the protocol (see [`Control::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadControl {
    #[error("a control line that is not one JSON object")]
    NotAnObject,
    #[error("a hello of a version other than {HELLO_VERSION}")]
    Version,
    #[error("\"{0}\" is not a count (an integer from 0 to 2^64-1)")]
    NotACount(&'static str),
    #[error("\"{0}\" is missing")]
    Missing(&'static str),
    #[error("\"session\" is neither a string nor null")]
    NotASession,
    #[error("\"{0}\" has a value it cannot have")]
    NotAFlag(&'static str),
}

/// Frames sent and not yet acknowledged, to resend after a reconnect. Holds
/// the chunks as written (runs of whole lines), so pushing costs one
/// reference count and a newline count.
#[derive(Debug, Default)]
pub struct ReplayLog {
    /// Runs of whole lines, with how many lines each holds.
    chunks: VecDeque<(Bytes, u64)>,
    /// Index of the first frame still held.
    base: u64,
    /// Frames pushed over the session.
    total: u64,
    bytes: usize,
    /// Bytes pushed over the session (a sender's mark of how far it wrote).
    pushed: u64,
}

/// An acknowledgement or resume point outside what was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("peer claims frame {claimed}, but frames {base}..{total} are the ones held")]
pub struct BadPosition {
    pub claimed: u64,
    pub base: u64,
    pub total: u64,
}

impl ReplayLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty log whose next frame is number `n` (a client restored from
    /// stored state: the frames before were sent by an earlier instance).
    pub fn starting_at(n: u64) -> Self {
        Self { base: n, total: n, ..Self::default() }
    }

    /// Appends a run of whole lines; returns how many frames it held.
    pub fn push(&mut self, run: Bytes) -> u64 {
        let n = memchr::memchr_iter(b'\n', &run).count() as u64;
        self.push_counted(run, n)
    }

    /// [`Self::push`] of a run whose `n` lines were counted already (the
    /// bridge's line splitter counts them as it checks them).
    pub fn push_counted(&mut self, run: Bytes, n: u64) -> u64 {
        debug_assert!(run.last() == Some(&b'\n'), "runs are whole lines");
        debug_assert_eq!(n, memchr::memchr_iter(b'\n', &run).count() as u64, "the count is the run's");
        if n == 0 {
            return 0;
        }
        self.total += n;
        self.bytes += run.len();
        self.pushed += run.len() as u64;
        self.chunks.push_back((run, n));
        n
    }

    /// Frames pushed so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Index of the oldest frame still held (everything before was acknowledged).
    pub fn acked(&self) -> u64 {
        self.base
    }

    /// Bytes held for a possible resend.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes pushed over the session (see [`Self::pushed_before`]).
    pub fn pushed_bytes(&self) -> u64 {
        self.pushed
    }

    /// Drops everything before frame `n`.
    pub fn ack(&mut self, n: u64) -> Result<(), BadPosition> {
        self.check(n)?;
        while self.base < n {
            let (run, lines) = self.chunks.pop_front().expect("base < n <= total");
            if self.base + lines <= n {
                self.base += lines;
                self.bytes -= run.len();
            } else {
                let rest = skip_lines(&run, n - self.base);
                self.bytes -= run.len() - rest.len();
                self.chunks.push_front((rest, self.base + lines - n));
                self.base = n;
            }
        }
        Ok(())
    }

    /// Drops everything before frame `from` and numbers what follows from
    /// `to` on (`to >= from`): a session taken back after a restart whose
    /// client already holds more of the old agent's frames than were kept
    /// (up to `to`) gets the new frames numbered where it stands.
    pub fn rebase(&mut self, from: u64, to: u64) -> Result<(), BadPosition> {
        self.ack(from)?;
        let shift = to.checked_sub(from).filter(|s| self.total.checked_add(*s).is_some());
        let shift = shift.ok_or(BadPosition { claimed: to, base: self.base, total: self.total })?;
        self.base += shift;
        self.total += shift;
        Ok(())
    }

    /// Everything from frame `n` on, as runs to write in order.
    pub fn since(&self, n: u64) -> Result<Vec<Bytes>, BadPosition> {
        self.range(n, self.total)
    }

    /// Frames from `from` on, whole runs, until they hold `max_bytes` (at
    /// least one run): what a sender writes in one turn, so an ack it puts
    /// between turns waits behind at most this much. Returns the runs and the
    /// frame they end at (the next turn's `from`).
    pub fn next_runs(&self, from: u64, max_bytes: usize) -> Result<(Vec<Bytes>, u64), BadPosition> {
        self.check(from)?;
        let (mut out, mut next, mut bytes) = (Vec::new(), from, 0);
        for (_, end, run) in self.runs_from(from) {
            bytes += run.len();
            out.push(run);
            next = end;
            if bytes >= max_bytes {
                break;
            }
        }
        Ok((out, next))
    }

    /// Frames `from..to` (`to` at the end of a run pushed, or the end), as runs to write in order.
    pub fn range(&self, from: u64, to: u64) -> Result<Vec<Bytes>, BadPosition> {
        self.check(from)?;
        self.check(to)?;
        let runs = self.runs_from(from).take_while(|(start, _, _)| *start < to);
        // A run that goes past `to` is cut at it.
        Ok(runs.map(|(start, end, run)| if end > to { keep_lines(&run, to - start) } else { run }).collect())
    }

    /// Bytes pushed before frame `n` (a sender that has written up to `n`
    /// has written this much of [`Self::pushed_bytes`]).
    pub fn pushed_before(&self, n: u64) -> Result<u64, BadPosition> {
        self.check(n)?;
        let after: usize = self.runs_from(n).map(|(_, _, run)| run.len()).sum();
        Ok(self.pushed - after as u64)
    }

    /// The runs held from frame `from` on (`from` checked), the first cut to
    /// start there, each with the frames it starts and ends at.
    fn runs_from(&self, from: u64) -> impl Iterator<Item = (u64, u64, Bytes)> + '_ {
        let mut at = self.base;
        self.chunks.iter().filter_map(move |(run, lines)| {
            let start = at;
            at += lines;
            if at <= from {
                return None;
            }
            let run = if start < from { skip_lines(run, from - start) } else { run.clone() };
            Some((start.max(from), at, run))
        })
    }

    fn check(&self, n: u64) -> Result<(), BadPosition> {
        if n < self.base || n > self.total {
            return Err(BadPosition { claimed: n, base: self.base, total: self.total });
        }
        Ok(())
    }
}

/// The first `n` lines of `run`.
fn keep_lines(run: &Bytes, n: u64) -> Bytes {
    if n == 0 {
        return Bytes::new();
    }
    let cut = memchr::memchr_iter(b'\n', run).nth(n as usize - 1).map_or(run.len(), |i| i + 1);
    run.slice(..cut)
}

/// `run` without its first `n` lines.
fn skip_lines(run: &Bytes, n: u64) -> Bytes {
    let cut = memchr::memchr_iter(b'\n', run).nth(n as usize - 1).map_or(run.len(), |i| i + 1);
    run.slice(cut..)
}

/// What a receiver got.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// Frame bytes to pass on, and how many frames they complete. A frame over
    /// the receiver's cap is passed on in pieces (`frames` 0 until its end);
    /// all others arrive whole.
    Data { bytes: Bytes, frames: u64 },
    /// A control line (`None`: one this version does not understand).
    Control(Option<Control>),
    /// A control line that breaks the protocol.
    BadControl(BadControl),
}

/// Splits what arrives on a resumable stream into frames and control lines.
#[derive(Debug)]
pub struct Receiver {
    buf: BytesMut,
    max: usize,
    /// Inside a frame over `max`, already partly passed on.
    passing: bool,
    /// No control lines (the plain protocol): every line is a frame.
    plain: bool,
}

impl Receiver {
    /// `max`: the longest frame held back whole (an unfinished frame is never
    /// passed on, so a lost connection cannot leave half of one behind).
    pub fn new(max: usize) -> Self {
        Self { buf: BytesMut::new(), max: max.max(MAX_CONTROL_LINE), passing: false, plain: false }
    }

    /// A receiver for the plain protocol: whole lines only, no control lines.
    pub fn plain(max: usize) -> Self {
        Self { plain: true, ..Self::new(max) }
    }

    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Where the next read should go (saves a copy).
    pub fn buf_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Drops an unfinished line: the connection carrying it is gone and the
    /// sender resends it whole.
    pub fn reset(&mut self) {
        self.buf.clear();
        self.passing = false;
    }

    /// Bytes held of an unfinished line.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Everything complete so far, in order.
    pub fn drain(&mut self, out: &mut Vec<Event>) {
        if self.passing {
            match memchr::memchr(b'\n', &self.buf) {
                Some(i) => {
                    self.passing = false;
                    out.push(Event::Data { bytes: self.buf.split_to(i + 1).freeze(), frames: 1 });
                }
                None => {
                    if !self.buf.is_empty() {
                        out.push(Event::Data { bytes: self.buf.split().freeze(), frames: 0 });
                    }
                    return;
                }
            }
        }
        // One pass: runs of frame lines end at a control line or at the last newline.
        let mut spans: Vec<(usize, usize, Option<u64>)> = Vec::new();
        let (mut run_start, mut run_frames, mut line_start) = (0, 0u64, 0);
        for nl in memchr::memchr_iter(b'\n', &self.buf) {
            if !self.plain && self.buf[line_start] == CONTROL_PREFIX && nl - line_start < MAX_CONTROL_LINE {
                if run_frames > 0 {
                    spans.push((run_start, line_start, Some(run_frames)));
                }
                spans.push((line_start, nl + 1, None));
                run_start = nl + 1;
                run_frames = 0;
            } else {
                run_frames += 1;
            }
            line_start = nl + 1;
        }
        if run_frames > 0 {
            spans.push((run_start, line_start, Some(run_frames)));
        }
        if line_start > 0 {
            let done = self.buf.split_to(line_start).freeze();
            for (s, e, frames) in spans {
                out.push(match frames {
                    Some(frames) => Event::Data { bytes: done.slice(s..e), frames },
                    None => match Control::parse(&done[s..e]) {
                        Ok(c) => Event::Control(c),
                        Err(bad) => Event::BadControl(bad),
                    },
                });
            }
        }
        if self.buf.len() > self.max {
            self.passing = true;
            out.push(Event::Data { bytes: self.buf.split().freeze(), frames: 0 });
        }
        // A long frame made the buffer large: give it back once it is little
        // used (what remains is at most a partial line of one read).
        if self.buf.capacity() > crate::ndjson::SHRINK_ABOVE && self.buf.len() <= SHRINK_KEEP {
            let mut fresh = BytesMut::with_capacity(SHRINK_KEEP.max(self.buf.len()));
            fresh.extend_from_slice(&self.buf);
            self.buf = fresh;
        }
    }
}

/// What a [`Receiver`]'s buffer shrinks back to: one read's worth.
const SHRINK_KEEP: usize = 64 * 1024;

/// When a receiver should acknowledge (see [`ACK_EVERY_FRAMES`],
/// [`ACK_EVERY_BYTES`], [`ACK_DELAY_MS`]). Time is the caller's.
#[derive(Debug, Default)]
pub struct AckPolicy {
    received: u64,
    acked: u64,
    bytes_since: u64,
}

impl AckPolicy {
    /// Starts at a resume point (what the welcome or hello said was held).
    pub fn at(received: u64) -> Self {
        Self { received, acked: received, bytes_since: 0 }
    }

    /// Records frames taken; true when an ack is due now.
    pub fn took(&mut self, frames: u64, bytes: usize) -> bool {
        self.received += frames;
        self.bytes_since += bytes as u64;
        self.received - self.acked >= ACK_EVERY_FRAMES || self.bytes_since >= ACK_EVERY_BYTES
    }

    /// Frames held.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Whether anything is unacknowledged (then ack within [`ACK_DELAY_MS`]).
    pub fn pending(&self) -> bool {
        self.received > self.acked
    }

    /// The ack to send now, if any.
    pub fn ack(&mut self) -> Option<Control> {
        self.bytes_since = 0;
        if self.received > self.acked {
            self.acked = self.received;
            Some(Control::Ack(self.received))
        } else {
            None
        }
    }

    /// After a reconnect everything held is acknowledged again by the hello or welcome.
    pub fn resumed(&mut self) {
        self.acked = self.received;
        self.bytes_since = 0;
    }
}

/// A local line that would read as a control line gets one space in front.
pub fn escape_run(run: Bytes) -> Bytes {
    let starts_control = |i: usize| run.get(i) == Some(&CONTROL_PREFIX);
    let need = starts_control(0) || memchr::memchr_iter(b'\n', &run).any(|i| starts_control(i + 1));
    if need {
        escaped(&run)
    } else {
        run
    }
}

/// [`escape_run`], and how many lines the run holds: the one pass over the
/// run that looks for lines to escape counts them for the replay log too
/// ([`ReplayLog::push_counted`]), so a sender reads each byte it sends once.
/// (The browser's client keeps [`escape_run`]: the count would cost it bytes.)
pub fn escape_counted(run: Bytes) -> (Bytes, u64) {
    let starts_control = |i: usize| run.get(i) == Some(&CONTROL_PREFIX);
    let (mut need, mut lines) = (starts_control(0), 0u64);
    for i in memchr::memchr_iter(b'\n', &run) {
        lines += 1;
        need |= starts_control(i + 1);
    }
    // A space in front of a line adds no line.
    (if need { escaped(&run) } else { run }, lines)
}

/// `run` with a space in front of each line that starts like a control line.
#[inline(always)]
fn escaped(run: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(run.len() + 8);
    let mut at_start = true;
    for &b in run {
        if at_start && b == CONTROL_PREFIX {
            out.push(b' ');
        }
        out.push(b);
        at_start = b == b'\n';
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(r: &mut Receiver, data: &[u8]) -> Vec<Event> {
        r.push(data);
        let mut out = Vec::new();
        r.drain(&mut out);
        out
    }

    #[test]
    fn control_lines_round_trip() {
        for c in [
            Control::Hello { session: None, received: 0 },
            Control::Hello { session: Some("ab12".into()), received: 7 },
            Control::Welcome { session: "ab12".into(), received: 3, grace_ms: 300_000 },
            Control::Ack(128),
            Control::Eof(9),
            Control::End(10),
        ] {
            let line = c.encode();
            assert_eq!(line[0], b'!');
            assert_eq!(*line.last().unwrap(), b'\n');
            assert_eq!(Control::parse(&line), Ok(Some(c)));
        }
        assert_eq!(Control::parse(b"!{\"future\":1}"), Ok(None), "unknown kinds are ignored");
        assert_eq!(
            Control::parse(b"!{\"ack\":3,\"extra\":true}"),
            Ok(Some(Control::Ack(3))),
            "unknown fields too"
        );
    }

    #[test]
    fn control_lines_that_break_the_protocol_are_refused_alike() {
        let bad = |l: &[u8]| Control::parse(l).unwrap_err();
        assert_eq!(bad(b"!not json"), BadControl::NotAnObject);
        assert_eq!(bad(b"![1]"), BadControl::NotAnObject);
        assert_eq!(bad(b"!{\"hello\":99,\"session\":null,\"received\":0}"), BadControl::Version);
        assert_eq!(bad(b"!{\"hello\":\"1\",\"session\":null,\"received\":0}"), BadControl::Version);
        assert_eq!(bad(b"!{\"hello\":1,\"session\":7,\"received\":0}"), BadControl::NotASession);
        assert_eq!(bad(b"!{\"hello\":1,\"session\":null}"), BadControl::Missing("received"));
        // Every number that is not a u64 is refused the same way, on the fast path and off it.
        for n in ["18446744073709551616", "99999999999999999999", "-1", "5.0", "1e3", "\"5\"", "null", "007"]
        {
            for line in [format!("!{{\"ack\":{n}}}"), format!("!{{ \"ack\": {n} }}")] {
                let got = Control::parse(line.as_bytes());
                assert!(
                    matches!(got, Err(BadControl::NotACount("ack")) | Err(BadControl::NotAnObject)),
                    "{line}: {got:?}"
                );
            }
            assert!(Control::parse(format!("!{{\"eof\":{n}}}").as_bytes()).is_err(), "eof {n}");
        }
        assert_eq!(Control::parse(b"!{\"ack\":18446744073709551615}"), Ok(Some(Control::Ack(u64::MAX))));
        assert_eq!(Control::parse(b"!{\"ack\":0}"), Ok(Some(Control::Ack(0))));
        assert_eq!(bad(b"!{\"end\":-1}"), BadControl::NotACount("end"));
        assert_eq!(bad(b"!{\"session\":\"ab\",\"received\":1.5}"), BadControl::NotACount("received"));
    }

    #[test]
    fn control_lines_end_within_the_limit_however_they_arrive() {
        assert_eq!(control_line_end(b"!{}\nmore"), Ok(Some(3)));
        assert_eq!(control_line_end(b"!{\"hello\""), Ok(None));
        let long = vec![b' '; MAX_CONTROL_LINE];
        assert_eq!(control_line_end(&long), Err(LineTooLong), "no room left for a line end");
        let mut one_write = vec![b' '; 1549];
        one_write.push(b'\n');
        assert_eq!(control_line_end(&one_write), Err(LineTooLong), "a long line in one piece");
        assert_eq!(control_line_end(&one_write[..700]), Ok(None));
        let mut fits = vec![b' '; MAX_CONTROL_LINE - 1];
        fits.push(b'\n');
        assert_eq!(control_line_end(&fits), Ok(Some(MAX_CONTROL_LINE - 1)));
    }

    #[test]
    fn receiver_separates_frames_and_controls() {
        let mut r = Receiver::new(1024);
        let got = events(&mut r, b"{\"a\":1}\n{\"b\":2}\n!{\"ack\":5}\n{\"c\":");
        assert_eq!(
            got,
            vec![
                Event::Data { bytes: Bytes::from_static(b"{\"a\":1}\n{\"b\":2}\n"), frames: 2 },
                Event::Control(Some(Control::Ack(5))),
            ]
        );
        assert_eq!(r.buffered(), 5, "the unfinished frame is held back");
        let got = events(&mut r, b"3}\n");
        assert_eq!(got, vec![Event::Data { bytes: Bytes::from_static(b"{\"c\":3}\n"), frames: 1 }]);
        r.push(b"{\"d\":");
        r.reset();
        assert_eq!(events(&mut r, b"!{\"end\":3}\n"), vec![Event::Control(Some(Control::End(3)))]);
        assert_eq!(events(&mut r, b"!{\"ack\":-1}\n"), vec![Event::BadControl(BadControl::NotACount("ack"))]);
    }

    #[test]
    fn control_lines_are_told_from_frames_by_where_the_prefix_is() {
        let mut r = Receiver::new(4096);
        let long_bang = format!("!{}\n", "x".repeat(MAX_CONTROL_LINE));
        let input = [
            &b"!{\"ack\":1}\n{\"t\":\"wow!\"}\n{\"u\":\"!!\"}\n!{\"ack\":2}\n!{\"ack\":3}\n"[..],
            long_bang.as_bytes(),
            b"{\"v\":1}\n!{\"ack\":4}\n!{\"ack\"",
        ]
        .concat();
        let got = events(&mut r, &input);
        let frames = |b: &[u8], n| Event::Data { bytes: Bytes::copy_from_slice(b), frames: n };
        assert_eq!(
            got,
            vec![
                Event::Control(Some(Control::Ack(1))),
                frames(b"{\"t\":\"wow!\"}\n{\"u\":\"!!\"}\n", 2),
                Event::Control(Some(Control::Ack(2))),
                Event::Control(Some(Control::Ack(3))),
                frames(&[long_bang.as_bytes(), b"{\"v\":1}\n"].concat(), 2),
                Event::Control(Some(Control::Ack(4))),
            ]
        );
        assert_eq!(r.buffered(), 7, "the unfinished control line is held back");
        let mut p = Receiver::plain(4096);
        assert_eq!(events(&mut p, b"!{\"ack\":1}\n"), vec![frames(b"!{\"ack\":1}\n", 1)]);
    }

    #[test]
    fn a_frame_over_the_cap_passes_in_pieces_and_counts_once() {
        let mut r = Receiver::new(1024);
        let big = vec![b'x'; 3000];
        let got = events(&mut r, &big);
        assert!(matches!(&got[..], [Event::Data { frames: 0, .. }]));
        let got = events(&mut r, b"x\n{}\n");
        assert_eq!(
            got,
            vec![
                Event::Data { bytes: Bytes::from_static(b"x\n"), frames: 1 },
                Event::Data { bytes: Bytes::from_static(b"{}\n"), frames: 1 }
            ]
        );
    }

    #[test]
    fn replay_log_resends_from_any_point_and_acks_free_memory() {
        let mut log = ReplayLog::new();
        assert_eq!(log.push(Bytes::from_static(b"0\n1\n2\n")), 3);
        assert_eq!(log.push(Bytes::from_static(b"3\n")), 1);
        assert_eq!(log.push(Bytes::from_static(b"4\n5\n")), 2);
        assert_eq!(log.total(), 6);
        assert_eq!(log.since(2).unwrap().concat(), b"2\n3\n4\n5\n");
        log.ack(1).unwrap();
        assert_eq!(log.bytes(), 10);
        assert_eq!(log.since(1).unwrap().concat(), b"1\n2\n3\n4\n5\n");
        log.ack(4).unwrap();
        assert_eq!(log.since(4).unwrap().concat(), b"4\n5\n");
        assert_eq!(log.since(6).unwrap(), Vec::<Bytes>::new());
        assert!(log.since(3).is_err(), "acked frames are gone");
        assert!(log.ack(7).is_err(), "never sent");
        log.ack(6).unwrap();
        assert_eq!(log.bytes(), 0);
    }

    #[test]
    fn a_range_of_the_log_is_cut_at_both_ends() {
        let mut log = ReplayLog::new();
        log.push(Bytes::from_static(b"0\n1\n2\n"));
        log.push(Bytes::from_static(b"3\n"));
        log.push(Bytes::from_static(b"4\n5\n"));
        assert_eq!(log.range(0, 6).unwrap().concat(), b"0\n1\n2\n3\n4\n5\n");
        assert_eq!(log.range(1, 2).unwrap().concat(), b"1\n");
        assert_eq!(log.range(2, 5).unwrap().concat(), b"2\n3\n4\n");
        assert_eq!(log.range(0, 4).unwrap().concat(), b"0\n1\n2\n3\n");
        assert_eq!(log.range(3, 3).unwrap(), Vec::<Bytes>::new());
        assert!(log.range(0, 7).is_err(), "never sent");
        log.ack(2).unwrap();
        assert_eq!(log.range(2, 4).unwrap().concat(), b"2\n3\n");
        assert!(log.range(1, 4).is_err(), "acked frames are gone");
    }

    #[test]
    fn a_turn_takes_whole_runs_up_to_its_bytes() {
        let mut log = ReplayLog::new();
        log.push(Bytes::from_static(b"0\n1\n2\n"));
        log.push(Bytes::from_static(b"3\n"));
        log.push(Bytes::from_static(b"4\n5\n"));
        let (runs, next) = log.next_runs(0, 1).unwrap();
        assert_eq!((runs.concat(), next), (b"0\n1\n2\n".to_vec(), 3), "at least one run");
        let (runs, next) = log.next_runs(1, 5).unwrap();
        assert_eq!((runs.concat(), next), (b"1\n2\n3\n".to_vec(), 4), "from mid-run, until the bytes");
        let (runs, next) = log.next_runs(4, 100).unwrap();
        assert_eq!((runs.concat(), next), (b"4\n5\n".to_vec(), 6));
        let (runs, next) = log.next_runs(6, 100).unwrap();
        assert_eq!((runs, next), (Vec::new(), 6), "nothing after the end");
        log.ack(5).unwrap();
        assert_eq!(log.next_runs(5, 1).unwrap().0.concat(), b"5\n");
        assert!(log.next_runs(4, 1).is_err(), "acked frames are gone");
        // Bytes pushed before a frame: 12 pushed in all, "5\n" after frame 5.
        assert_eq!(
            (log.pushed_bytes(), log.pushed_before(5).unwrap(), log.pushed_before(6).unwrap()),
            (12, 10, 12)
        );
    }

    #[test]
    fn a_log_is_renumbered_where_its_client_stands() {
        let mut log = ReplayLog::starting_at(10);
        log.push(Bytes::from_static(b"old\n"));
        log.push(Bytes::from_static(b"new1\nnew2\n"));
        log.rebase(11, 40).unwrap();
        assert_eq!((log.acked(), log.total()), (40, 42));
        assert_eq!(log.since(40).unwrap().concat(), b"new1\nnew2\n");
        assert!(log.rebase(41, 40).is_err(), "never backwards");
        assert!(log.rebase(40, u64::MAX).is_err(), "no overflow");
    }

    #[test]
    fn local_lines_never_read_as_control() {
        assert_eq!(escape_run(Bytes::from_static(b"{}\n")), Bytes::from_static(b"{}\n"));
        assert_eq!(escape_run(Bytes::from_static(b"!x\n{}\n!y\n")), Bytes::from_static(b" !x\n{}\n !y\n"));
        assert_eq!(escape_counted(Bytes::from_static(b"{}\n{}\n")), (Bytes::from_static(b"{}\n{}\n"), 2));
        assert_eq!(
            escape_counted(Bytes::from_static(b"!x\n{}\n!y\n")),
            (Bytes::from_static(b" !x\n{}\n !y\n"), 3)
        );
        // The last line's newline is its own: nothing after it is a line.
        assert_eq!(escape_counted(Bytes::from_static(b"{}\n!")).1, 1);
    }

    #[test]
    fn acks_are_due_by_count_or_bytes() {
        let mut p = AckPolicy::at(10);
        assert!(!p.took(1, 10));
        assert!(p.pending());
        assert_eq!(p.ack(), Some(Control::Ack(11)));
        assert!(p.took(ACK_EVERY_FRAMES, 10));
        assert!(p.ack().is_some());
        assert!(p.took(1, ACK_EVERY_BYTES as usize));
        assert_eq!(p.ack(), Some(Control::Ack(10 + 2 + ACK_EVERY_FRAMES)));
        assert_eq!(p.ack(), None);
    }
}

#[cfg(test)]
mod devices_tests {
    use super::*;

    #[test]
    fn join_list_and_role_lines_read_back() {
        for c in [
            Control::Join { id: "ab12cd34".into(), observe: true, history: History::Now },
            Control::Join { id: "x".into(), observe: false, history: History::All },
            Control::List { host: false },
            Control::List { host: true },
            Control::Role(Role::Controller),
            Control::Role(Role::Observer),
        ] {
            assert_eq!(Control::parse(&c.encode()), Ok(Some(c.clone())), "{c:?}");
        }
        // A plain hello stays one.
        let h = Control::Hello { session: None, received: 0 };
        assert_eq!(Control::parse(&h.encode()), Ok(Some(h)));
        // Bad values are refused, never guessed.
        assert!(Control::parse(br#"!{"hello":1,"session":null,"received":0,"join":5}"#).is_err());
        assert!(Control::parse(br#"!{"hello":1,"session":null,"received":0,"join":"a","history":"some"}"#)
            .is_err());
        assert!(Control::parse(br#"!{"role":"king"}"#).is_err());
    }
}
