//! Sessions that outlive a connection: resumable sessions (`thunderbolt/<p>/r1`; the wire is specified in
//! [`thunderbolt_shared::resume`]): one agent that outlives the connections
//! that drive it.
//!
//! A [`Hub`] stands between the session core ([`crate::serve::session`], which sees
//! it as its [`Link`]) and whichever connection is attached right now:
//! - the agent's output goes into the hub's replay log ([`Outbox`]); the
//!   attached connection's writer sends it on, and an acknowledgement from the
//!   client frees it. The log holds at most the resume buffer: past that the
//!   agent waits (its stdout blocks) until acks make room, whether a client is
//!   attached or not. A client that is away holds its agent still, never ends
//!   its session early;
//! - the client's frames come off the attached connection into one queue the
//!   agent's input pump reads ([`Inbox`]), counted so a resuming client knows
//!   what to resend. The connection is read ahead of that queue (up to
//!   [`BRIDGE_READ_AHEAD`]), so the client's acks are always read, even while
//!   the agent reads nothing because it waits for those very acks;
//! - a connection lost without the client's close detaches the session: the
//!   agent runs on, and the session ends only if nobody re-attaches within
//!   the grace period. Only the NodeId that started the session can attach.
//!
//! Detached sessions cannot pin the bridge: [`Hubs`] evicts them, the oldest
//! first, when a slot is needed, and keeps at most [`MAX_DETACHED_PER_PEER`]
//! per NodeId. A later resume of an ended session learns why it ended
//! (expired, evicted, revoked, …) from the close reason.
//!
//! With `--keep-warm` plain (`thunderbolt/<p>/0`) sessions run through a hub
//! too ([`HubKind::Warm`]): a connection's end, whatever it was, detaches the
//! session, and the next plain connection from the same NodeId attaches to the
//! running agent instead of spawning one (so `session/load` of an in-memory
//! session works). Nothing is replayed there: output the agent writes while no
//! client is attached is dropped (it answers requests of a connection that is
//! gone, and must never be read as answers to the next one's), and every
//! request the agent sent that the vanished client did not answer, or sends
//! while none is attached, is answered for it with a JSON-RPC error
//! ([`thunderbolt_shared::jsonrpc::client_gone`]) so the agent never hangs.
//!
//! The hub never holds a connection's tasks past its detach: each attached
//! connection runs in one task the hub owns (aborted when it is replaced or
//! the session ends).

//!
//! The rooms, one job each:
//! - [`hub`]: one session's state between connections, and the one place a
//!   connection is installed into it ([`Hub::install`]) or lost from it;
//!   the order its locks nest in;
//! - [`state`]: what a hub's lock guards, in groups by concern, and the
//!   journal's writing;
//! - [`devices`]: several devices on one session (guests, roles, the
//!   first answer wins, the history a joining device starts from);
//! - [`ending`]: how a session ends (kick, eviction, the agent's end);
//! - [`inbox`]: the client's frames into the agent's queue, counted;
//! - [`resumable`]: the `r1` path (hello, welcome, replay, acks);
//! - [`warm`]: the plain path of a warm agent (`--keep-warm`);
//! - [`link`]: the session core's view of a hub ([`HubLink`], its
//!   [`Outbox`] and [`Inbox`]);
//! - [`registry`]: every session alive, plain and hub, for the heartbeat,
//!   eviction and `status`;
//! - [`timing`]: how long a session waits with nothing attached;
//! - [`restore`]: sessions taken back from their journals after the bridge
//!   restarted ([`crate::journal`]).

pub mod devices;
pub mod ending;
pub mod hub;
pub mod inbox;
pub mod link;
pub mod registry;
pub mod restore;
pub mod resumable;
pub mod state;
pub mod timing;
pub mod warm;

pub use devices::{
    JoinAs, JoinError, MemberView, MAX_DEVICES_PER_SESSION, MAX_JOINS_PER_DEVICE, MAX_SEATS_PER_DEVICE,
    SESSION_HISTORY,
};
pub use hub::{
    AttachError, Hub, HubKind, HubView, JournalAt, CLOSE_CODE_KEPT_WARM, ENDED_REMEMBERED, KEPT_WARM_QUIET,
    MAX_DETACHED_PER_PEER, REASON_KEPT_WARM, REASON_PROTOCOL, REASON_SUPERSEDED,
};
pub use link::{HubLink, Inbox, Outbox};
pub use registry::{HubGuard, Hubs, PlainSessions, Recheck};
pub use resumable::{read_hello, read_line};
pub use timing::{HubTiming, ResumeConfig};
