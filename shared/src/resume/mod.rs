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

mod ack;
mod control;
mod framing;
mod replay;
#[cfg(test)]
mod tests;

pub use ack::{AckPolicy, Acks, Moment};
pub use control::{
    control_line_end, BadControl, Control, LineTooLong, CONTROL_PREFIX, HELLO_VERSION, MAX_CONTROL_LINE,
};
pub use framing::{escape_counted, escape_run, Event, Receiver};
pub use replay::{BadPosition, ReplayLog};

use crate::protocol::Protocol;

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
    protocol.alpn_with_suffix(RESUME_ALPN_SUFFIX)
}
