//! Every limit and timeout of the bridge, with why it has that value.

use std::time::Duration;

/// Most agent processes alive at once. Each is a full coding agent (hundreds of
/// MiB); 16 is the reference bridge's cap and more than one person ever needs.
pub const MAX_LIVE_AGENTS: usize = 16;

/// An admitted peer must open its bidirectional stream within this. A client
/// opens it right after connecting; a peer that does not is holding a slot.
pub const STREAM_OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// A QUIC handshake takes one or two round trips; 10 s covers a relay path on a
/// bad mobile link and bounds how long a stalled handshake holds a slot.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// After SIGTERM, how long an agent gets to exit before SIGKILL. Long enough to
/// flush a log, short enough that a dropped peer frees its slot promptly.
pub const AGENT_TERM_GRACE: Duration = Duration::from_secs(2);

/// After the agent exits and our send side is finished, how long we wait for the
/// client to acknowledge the data and close. Past that we drop the connection.
pub const FINISH_LINGER: Duration = Duration::from_secs(10);

/// After the agent closes its stdout, how long it may keep running before we
/// kill it (it has nothing left to say to the peer).
pub const AGENT_EXIT_AFTER_EOF: Duration = Duration::from_secs(5);

/// Bytes asked for per read from the stream or the agent. 64 KiB amortises
/// syscalls and QUIC chunking without holding much per session.
pub const READ_CHUNK: usize = 64 * 1024;

/// Longest agent stderr line we log as one record; the rest is cut. Keeps a
/// runaway agent from writing megabyte log lines.
pub const MAX_STDERR_LINE: usize = 4096;

/// How long startup waits for a relay connection before printing a ticket with
/// direct addresses only (the reference waits forever and hangs offline).
pub const RELAY_ONLINE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long startup waits for the first local (direct) address.
pub const DIRECT_ADDR_TIMEOUT: Duration = Duration::from_secs(3);

/// On shutdown, how long we give the endpoint to send close frames.
pub const ENDPOINT_CLOSE_TIMEOUT: Duration = Duration::from_secs(3);
