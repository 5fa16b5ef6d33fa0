//! Every limit and timeout of the bridge, with why it has that value: every
//! default a flag can change, and every bound on a session's lifecycle.
//! Constants private to one mechanism (a queue depth, a wire code, a redial
//! backoff) are named where that mechanism lives.

use std::time::Duration;

/// Most agent processes alive at once. Each is a full coding agent (hundreds of
/// MiB); 16 is the reference bridge's cap and more than one person ever needs.
pub const MAX_LIVE_AGENTS: usize = 16;

/// Most live sessions (agents running, attached or not) one guest holds at
/// once across every agent: a peer a manifest's `accept_from` names, or a
/// device paired with one agent only. Without it one guest (or a paired
/// device gone hostile) could take every slot and leave the owner's devices
/// with `bridge at capacity`. Your own devices (the account, the allow file)
/// are bounded by `--max-agents` alone, as the reference bridge's are.
pub const MAX_SESSIONS_PER_GUEST: usize = 4;

/// The per-guest cap with `max_agents` slots: [`MAX_SESSIONS_PER_GUEST`],
/// and never every slot while there are two or more.
pub fn per_device_cap(max_agents: usize) -> usize {
    MAX_SESSIONS_PER_GUEST.min(guests_cap(max_agents))
}

/// Live sessions all guests together may hold: every slot but one, so one
/// is always there for the owner's own devices (with a single slot, that
/// one: a bridge of one slot has nothing to share).
pub fn guests_cap(max_agents: usize) -> usize {
    max_agents.saturating_sub(1).max(1)
}

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
/// kill it (it has nothing left to say to the peer). Also how long an agent
/// that closed its stdin (it cannot hear the peer any more) may keep talking.
pub const AGENT_EXIT_AFTER_EOF: Duration = Duration::from_secs(5);

/// After the agent process exits, how long we keep reading its stdout. Output
/// still in the pipe drains in microseconds; only a process the agent started
/// (`cmd & exit`) can hold the pipe open longer, and it must not hold the
/// session (the reference ends a session when the agent process exits).
pub const STDOUT_DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// After a session ended, how long its agent's stderr may still be logged;
/// and after a failed agent exited, how long its last stderr line is waited
/// for (it goes with the exit to the client). Normally the pipe is closed
/// already; this bounds a process that left the agent's group (or that the
/// agent started) and keeps stderr open.
pub const STDERR_DRAIN: Duration = Duration::from_millis(500);

/// Largest value a count flag (`--max-agents`, `--max-handshakes`,
/// `--per-remote-max`) takes. Far above any real use (each agent is a process),
/// far below what would overflow the semaphores and tables they size.
pub const MAX_COUNT_FLAG: usize = 1 << 20;

/// Smallest `--max-frame`: an ACP `initialize` exchange must fit.
pub const MIN_FRAME: usize = thunderbolt_shared::ndjson::MIN_FRAME_LEN;

/// Largest `--max-frame`: a session may hold this per direction, so 1 GiB
/// already lets 16 sessions ask for 32 GiB; anything above is a mistake.
pub const MAX_FRAME: usize = 1 << 30;

/// Bytes a peer may send on its stream before we read them: QUIC's own
/// default, sized for 100 Mbit/s at 100 ms round trip (the bulk figures were
/// measured with it); more buys nothing on the paths we serve.
pub const STREAM_RECEIVE_WINDOW: u32 = 1_250_000;

/// Bytes a peer may have in flight to us over the whole connection: the one
/// stream's window plus room for the handshake's crypto frames. With one
/// stream allowed this bounds what an admitted peer makes the bridge hold.
pub const CONNECTION_RECEIVE_WINDOW: u32 = 1_500_000;

/// How long a session's peer may be silent before the bridge takes it for
/// gone (QUIC idle timeout; the smaller of both sides' values applies). A
/// client killed without a close, or whose network vanished, frees its agent
/// after this instead of QUIC's default 30 s. Three keep-alive intervals: a
/// live path that loses two keep-alives in a row is not dropped.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a resumable session (`thunderbolt/<p>/r1`) whose connection was
/// lost keeps its agent for the client to come back: a phone's locked screen,
/// a laptop's short sleep, a network switch or a relay restart all fit in 5
/// minutes; an abandoned agent is not kept much longer than that.
pub const RESUME_GRACE: Duration = Duration::from_secs(300);

/// Most bytes of agent output a resumable session holds for its client
/// (unacknowledged, or written while it was away): one largest frame fits
/// (32 MiB, the default `--max-frame`). With 16 agents that bounds the
/// bridge's held output at 512 MiB; what an agent writes while nobody reads is
/// usually far less (a reply in progress).
pub const RESUME_BUFFER: usize = 32 << 20;

/// Shortest `--idle-timeout`: a few round trips on a slow path (shorter would
/// drop live connections).
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_millis(300);

/// Keep-alive period on the bridge's connections (iroh's default is 5 s; a
/// shorter one lets [`IDLE_TIMEOUT`] be short without false alarms). A
/// shorter idle timeout gets keep-alives every third of it.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(3);

/// How soon each side of a connection asks the other to acknowledge what it
/// received (QUIC's ACK frequency extension, which iroh's QUIC speaks; 1 ms
/// is the least it accepts, its timer's grain). QUIC's own delay is 25 ms,
/// and a sender whose congestion window is full waits for that
/// acknowledgement: a full-duplex transfer through `connect` stopped for
/// 24–30 ms several times a second, on both protocols, and those stops were
/// most of the spread between runs (asked for 8 ms, they lasted 9–12 ms; for
/// 1 ms, they were gone). Acknowledgements that data is waiting on go out
/// sooner; a busy stream is still acknowledged every other packet, as
/// before. A peer that does not speak the extension keeps its own delay.
pub const ACK_DELAY_ASKED: Duration = Duration::from_millis(1);

/// Bytes asked for per read from the stream or the agent. 64 KiB amortises
/// syscalls and QUIC chunking without holding much per session.
pub const READ_CHUNK: usize = 64 * 1024;

/// Longest agent stderr line we log as one record; the rest is cut. Keeps a
/// runaway agent from writing megabyte log lines.
pub const MAX_STDERR_LINE: usize = 4096;

/// Agent stderr lines logged at once before the rate below applies: a start-up
/// banner or a stack trace gets through whole.
pub const STDERR_LOG_BURST: u32 = 200;

/// Agent stderr lines logged per second after the burst: a chatty agent stays
/// readable; one writing hundreds of MiB cannot grow the log or slow the other
/// sessions (measured before this bound: 200 MiB of stderr made a 402 MB log and
/// other sessions' dials 17× slower).
pub const STDERR_LOG_PER_SEC: f64 = 50.0;

/// Refusals (`not allowlisted`) logged at once: a user pairing a new device
/// sees each of its first attempts.
pub const REFUSAL_LOG_BURST: u32 = 20;

/// Refusals logged per second after the burst (one per 5 s, like the gate's
/// drop reports); the rest are counted in the next line. Measured before this
/// bound: 58 000 refusals in 150 s, one log line each.
pub const REFUSAL_LOG_PER_SEC: f64 = 0.2;

/// How long startup waits for a relay connection before printing a ticket with
/// direct addresses only (the reference waits forever and hangs offline).
pub const RELAY_ONLINE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long startup waits for the first local (direct) address.
pub const DIRECT_ADDR_TIMEOUT: Duration = Duration::from_secs(3);

/// On shutdown, how long we give the endpoint to send close frames.
pub const ENDPOINT_CLOSE_TIMEOUT: Duration = Duration::from_secs(3);

/// Worker threads for the bridge's runtime: half the cores, at least one, unless
/// `TOKIO_WORKER_THREADS` is set (then tokio reads it and this returns `None`).
///
/// Why not tokio's one per core: the agents are the workload and need cores of
/// their own, and a QUIC connection is driven by one task, so one session never
/// uses more than one core of ours; extra workers only help when several
/// sessions stream at once, while every small message pays for the cross-thread
/// wake-ups they cause. Measured on 2 cores, four alternating A/B rounds of
/// `bench --quick --only bulk,small,many` (`BENCH_BRIDGE_WORKERS=2` for tokio's
/// default): small-message p50 1.06× raw iroh with one worker against 1.43×
/// with two, bulk direct 0.89× against 0.75×, the 16-session aggregate 0.60×
/// against 0.59× (medians of the rounds).
pub fn worker_threads(env_set: bool, cores: usize) -> Option<usize> {
    (!env_set).then_some((cores / 2).max(1))
}

// Admission gate (before any crypto is spent).

/// Connections one remote may start per window: a client that reconnects after
/// a drop, plus a few tabs, fits easily; a loop does not.
pub const PER_REMOTE_MAX: usize = 10;
/// The sliding window for [`PER_REMOTE_MAX`] and [`PER_DEVICE_MAX`].
pub const PER_REMOTE_WINDOW: Duration = Duration::from_secs(10);
/// Connections one allowed device (its handshake-proven NodeId) may have
/// admitted per window, whatever path or address it dials from: its dials are
/// charged here, and given back to its address's budget, which is left for
/// the strangers it is there against. acpx and scripts dial once per prompt;
/// thirty prompts in ten seconds is more than a person or a script that waits
/// for its answers sends, while a loop is refused (`bridge at capacity`)
/// before it churns agents. Without it an allowed device had no bound at all
/// (48 handshakes in 1.0 s, every one admitted).
pub const PER_DEVICE_MAX: usize = 30;
/// How long an address stays open past its budget after an allowed device's
/// handshake came from it (see `serve/gate.rs`): a day covers a laptop asleep
/// overnight behind the same home NAT. What it lends strangers behind that
/// address is bounded by the handshake cap, as for a stranger minting a fresh
/// NodeId per dial, so a long memory costs little.
pub const PROVEN_ADDRESS_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Addresses remembered as an allowed device's (least recently proven
/// forgotten). Only an allowed device's handshake adds one, so strangers
/// cannot push them out; far more than one person's devices ever use in a day.
pub const MAX_PROVEN_ADDRESSES: usize = 1024;
/// Remotes remembered at once. Each entry is ~200 bytes, so the table stays
/// under a megabyte while covering far more remotes than a bridge ever serves.
pub const MAX_KEYS: usize = 4096;
/// Handshakes in flight at once. A handshake costs a few signature operations;
/// 16 keeps a flood from taking more than a small share of two cores.
pub const MAX_HANDSHAKES: usize = 16;
/// A handshake younger than this is never evicted for a newcomer. A QUIC
/// handshake takes one to two round trips: on a relayed mobile path well under
/// half a second, so an honest peer finishes before it can be evicted, while
/// an attacker must spend a fresh dial per slot every half second to hold them.
pub const EVICT_MIN_AGE: Duration = Duration::from_millis(500);

/// At most one "dropped" log line per this interval (with a count of the rest),
/// so a flood cannot flood the log too.
pub const DROP_LOG_INTERVAL: Duration = Duration::from_secs(5);

// Account trust.

/// Every backend call gives up after this: the heartbeat must never stall on a
/// hung backend, and 10 s is far above a healthy round trip.
pub const BACKEND_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the allowlist is refreshed and open sessions re-checked. Bounds how
/// long a revoked device keeps its session.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(45);

// `connect`.

/// How long a dial may take by default: covers relay fallback and discovery on
/// a slow link; a user waiting longer than this wants an error.
pub const DEFAULT_DIAL_TIMEOUT_SECS: u64 = 30;

#[cfg(test)]
mod tests {
    use super::worker_threads;

    #[test]
    fn half_the_cores_at_least_one_unless_the_env_decides() {
        assert_eq!(worker_threads(false, 1), Some(1));
        assert_eq!(worker_threads(false, 2), Some(1));
        assert_eq!(worker_threads(false, 3), Some(1));
        assert_eq!(worker_threads(false, 16), Some(8));
        assert_eq!(worker_threads(true, 16), None);
    }
}
