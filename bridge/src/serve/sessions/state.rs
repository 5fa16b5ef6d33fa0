//! What a hub's lock guards (`State`), grouped by concern: the journal,
//! what a restart's restore carries, the attached connection, the agent's
//! input and output, a warm agent's client; and the journal itself: where a
//! new session's is created ([`JournalAt`]) and its writing, which reads
//! only this state.
//!
//! Apart from `hub.rs` so that the hub there reads as what a session does
//! (attach, lose, wait) and the state it does it to reads here, field by
//! field. Each group is a plain struct whose fields the rest of the
//! sessions module reaches as `st.group.field` under the hub's one lock
//! (see the lock order in [`hub`](super::hub)); nothing here locks anything.

use std::{collections::HashSet, task::Waker, time::Duration};

use iroh::{endpoint::Connection, EndpointId};
use thunderbolt_shared::resume_bridge::BridgeSession;
use tokio::{sync::mpsc, time::Instant};
use tokio_util::task::AbortOnDropHandle;

use super::{devices::Members, restore::Restoring};
use crate::{
    journal::{self, Journal, Journals},
    serve::{pump::Inbound, AgentName},
};

/// Why a session ended: for the log, and the close a later resume gets.
#[derive(Debug, Clone)]
pub(super) struct Gone {
    pub(super) why: String,
    /// The reason a resume of the ended session is closed with (code 1).
    pub(super) resume_reason: String,
}

impl Gone {
    pub(super) fn new(why: impl Into<String>, resume_reason: impl Into<String>) -> Self {
        Self { why: why.into(), resume_reason: resume_reason.into() }
    }
}

/// One session's state between connections, behind its [`Hub`](super::Hub)'s one lock.
#[derive(Debug)]
pub(super) struct State {
    /// What the client presents to resume. A warm agent's next session gets
    /// a new one (frames are counted per session). Empty for a session taken
    /// back after a restart until its client presents it (the journal keeps
    /// only its hash).
    pub(super) token: String,
    /// The token's SHA-256 (hex): how a resume finds the session.
    pub(super) token_hash: String,
    // The fields are in the order they were declared (and so dropped) in
    // before they were grouped: the journal first, the attachment after the
    // agent's input queue.
    pub(super) journal: Journaling,
    pub(super) restart: AfterRestart,
    /// The `/r1` side of the session for the attached device: the agent's
    /// frames kept for a resend, the device's counted and acknowledged.
    pub(super) r1: BridgeSession<Instant>,
    pub(super) io: AgentIo,
    pub(super) conn: Conn,
    pub(super) gone: Option<Gone>,
    pub(super) warm: WarmClient,
    /// Times a client resumed it.
    pub(super) resumes: u64,
    /// What the session's devices share (the session's hub only).
    pub(super) members: Members,
    /// A device the agent does not wait for (an observer) whose log was
    /// full: the agent's frames and bytes it did not get, told to it in one
    /// [`METHOD_MISSED`](thunderbolt_shared::devices::METHOD_MISSED) notice
    /// once its log has room again.
    pub(super) missed: Option<(u64, u64)>,
    /// This device's input ended while others were on the session: it is
    /// sent what it was sent so far and an end, then let go.
    pub(super) leaving: bool,
}

/// Where a new resumable session is journaled: the folder, and the bridge
/// NodeId and protocol it was reached at (a restart takes back only its own).
pub struct JournalAt<'a> {
    pub journals: &'a Journals,
    pub node: EndpointId,
    pub protocol: &'a str,
}

impl JournalAt<'_> {
    /// The session's journal, or none when it cannot be written (said in the log).
    pub(super) fn create(
        &self,
        token: &str,
        id: &str,
        grace: Duration,
        owner: EndpointId,
        agent: &AgentName,
    ) -> Option<Journal> {
        let header = journal::Header {
            id: Some(id.to_string()),
            grace_ms: Some(grace.as_millis() as u64),
            journal: journal::JOURNAL_VERSION,
            token_sha256: journal::token_hash(token),
            node: self.node.to_string(),
            owner: owner.to_string(),
            agent: agent.as_str().to_string(),
            protocol: self.protocol.to_string(),
            created_ms: journal::record::unix_ms(std::time::SystemTime::now()),
        };
        match self.journals.create(header) {
            Ok(j) => Some(j),
            Err(e) => {
                tracing::warn!(
                    "cannot write a session journal in {} ({e}): this session will not survive a restart of the bridge",
                    self.journals.dir().display()
                );
                None
            }
        }
    }
}

/// The session's journal, when it survives a restart of the bridge.
#[derive(Debug, Default)]
pub(super) struct Journaling {
    pub(super) file: Option<Journal>,
    /// The agent's output by age while a client is attached (its `due()`:
    /// when the journal is next looked at, see [`State::journal_output`]).
    pub(super) behind: journal::WriteBehind,
}

/// What a session taken back after a restart carries until its restore is
/// done and its client is back (all `None` for any other session).
#[derive(Debug, Default)]
pub(super) struct AfterRestart {
    /// Taking the session back: the agent's answers to the bridge's own
    /// calls go to the restore, not to the client.
    pub(super) restoring: Option<Restoring>,
    /// The close the session ends with when its agent ends (a session taken
    /// back whose agent could not reload it), instead of how the agent ended.
    pub(super) close_as: Option<String>,
    /// Ids (raw JSON) of the requests its new agent made and its client has
    /// not answered. The client's answers to any other (the old agent's) are
    /// dropped.
    pub(super) asked: Option<HashSet<String>>,
    /// Until its client first attaches: the agent's frames the journal held
    /// (the new agent's are numbered after them, or after what the client
    /// holds if that is more).
    pub(super) restored_at: Option<u64>,
}

/// The connection attached now, and what the agent's output waits on of it.
#[derive(Debug, Default)]
pub(super) struct Conn {
    pub(super) attached: Option<Attachment>,
    pub(super) detached_since: Option<Instant>,
    /// The id the next connection to attach gets ([`Conn::next_id`]).
    pub(super) next: u64,
    /// A resumable connection was the last attached and did not close: output
    /// is kept for it (else a warm agent's output with nobody attached is dropped).
    pub(super) resumable: bool,
    /// How far (in [`ReplayLog::pushed_bytes`](thunderbolt_shared::resume::ReplayLog::pushed_bytes))
    /// the attached resumable connection's writer has taken the output: what
    /// lies beyond is not on its way yet, and is kept short (see
    /// [`UNSENT_MAX`](super::hub::UNSENT_MAX)).
    pub(super) sent_mark: Option<u64>,
    /// The agent-output side, waiting for room in the log (or for the
    /// attached connection to take what it was given): woken whenever the
    /// attachment changes, since what it waits on does.
    pub(super) writer: Option<Waker>,
}

impl Conn {
    /// The id of the next connection to attach (0 for the session's first).
    pub(super) fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next - 1
    }

    pub(super) fn is_attached(&self, id: u64) -> bool {
        self.attached.as_ref().is_some_and(|a| a.id == id)
    }
}

#[derive(Debug)]
pub(super) struct Attachment {
    pub(super) id: u64,
    pub(super) conn: Connection,
    pub(super) since: Instant,
    /// `thunderbolt/<p>/r1` (else the plain protocol).
    pub(super) r1: bool,
    pub(super) _task: AbortOnDropHandle<()>,
}

/// The agent's input and output: the queue into it, and where each ended.
#[derive(Debug, Default)]
pub(super) struct AgentIo {
    /// The agent's input queue; taken (closing the agent's input) when the
    /// client's input ends, except a warm agent's.
    pub(super) inbox: Option<mpsc::Sender<Inbound>>,
    /// The client's frame over the cap being skipped (its index), once its
    /// head went to the agent's pump; a resend of it after a reconnect is not
    /// announced twice.
    pub(super) oversize_at: Option<u64>,
    /// When the attached client's input ended (a warm agent's stdin stays open).
    pub(super) input_ended: Option<Instant>,
    /// The agent's output ended after this many frames.
    pub(super) end_at: Option<(u64, Instant)>,
    /// When the agent last wrote (a warm agent's finished client is let go
    /// only once it has been quiet a moment: see
    /// [`KEPT_WARM_QUIET`](super::hub::KEPT_WARM_QUIET)).
    pub(super) last_output: Option<Instant>,
}

/// A warm agent's plain client (`--keep-warm`): what it was asked, what it
/// missed, whether it took everything.
#[derive(Debug, Default)]
pub(super) struct WarmClient {
    /// Ids of the agent's requests the attached client has not answered.
    pub(super) pending: HashSet<String>,
    /// The client's output is all delivered (the plain stream finished).
    pub(super) plain_done: bool,
    /// Lines the agent wrote while no client was attached (dropped).
    pub(super) dropped: u64,
}

impl State {
    /// A session's state before anything happened to it: detached since
    /// `now`, the agent's input going to `inbox`.
    pub(super) fn new(inbox: mpsc::Sender<Inbound>, now: Instant) -> Self {
        Self {
            token: String::new(),
            token_hash: String::new(),
            journal: Journaling::default(),
            restart: AfterRestart::default(),
            r1: BridgeSession::default(),
            io: AgentIo { inbox: Some(inbox), ..AgentIo::default() },
            conn: Conn { detached_since: Some(now), ..Conn::default() },
            gone: None,
            warm: WarmClient::default(),
            resumes: 0,
            members: Members::default(),
            missed: None,
            leaving: false,
        }
    }

    /// A run of the agent's output just taken into the replay log. What
    /// matters of it to a restart is journaled at
    /// once; the frames themselves are written at once only while no client
    /// is attached, else once they are [`journal::WRITE_BEHIND`] old and
    /// still unacknowledged (most are acknowledged before, and never
    /// written: see [`crate::journal`]).
    pub(super) fn journal_output(&mut self, run: &[u8]) {
        let Some(j) = self.journal.file.as_mut() else { return };
        j.saw_output(run);
        if self.conn.attached.is_none() {
            self.flush_journal();
            return;
        }
        self.journal.behind.output(Instant::now(), self.r1.out.total());
    }

    /// The write-behind's turn (at `journal.behind.due()`): the agent's frames that
    /// are [`journal::WRITE_BEHIND`] old and still unacknowledged are
    /// written; younger ones wait for their own turn ([`journal::WriteBehind`]).
    pub(super) fn journal_turn(&mut self) {
        let upto = self.journal.behind.turn(Instant::now());
        if let Some(n) = upto {
            self.write_journal_to(n);
        }
    }

    /// Writes the agent's frames the journal lacks and the client has not
    /// acknowledged (those it has are skipped in one record).
    pub(super) fn flush_journal(&mut self) {
        self.journal.behind.clear();
        let total = self.r1.out.total();
        self.write_journal_to(total);
    }

    /// Writes the agent's frames before `upto` that the journal lacks and the
    /// client has not acknowledged.
    fn write_journal_to(&mut self, upto: u64) {
        let Some(j) = self.journal.file.as_mut() else { return };
        let upto = upto.min(self.r1.out.total());
        if j.written_to() >= upto {
            return;
        }
        let from = j.written_to().max(self.r1.out.acked());
        if from < upto {
            let runs = self.r1.out.range(from, upto).unwrap_or_default();
            j.write_output(from, &runs, upto);
        } else {
            // All acknowledged: the journal skips them in one record.
            j.write_output(from, &[], from);
        }
        self.compact_journal();
    }

    /// Journals a run of the client's frames before the agent's queue takes
    /// it (`names_an_id`: [`jsonrpc::names_an_id`](thunderbolt_shared::jsonrpc::names_an_id)
    /// of the run).
    pub(super) fn journal_input(&mut self, run: &[u8], frames: u64, names_an_id: bool) {
        if let Some(j) = self.journal.file.as_mut() {
            j.client_run(run, frames, names_an_id);
            self.compact_journal();
        }
    }

    /// Rewrites the journal as a snapshot and the output still held, once it
    /// grew far past that (either side's records make it grow).
    pub(super) fn compact_journal(&mut self) {
        let due = self.journal.file.as_ref().is_some_and(|j| j.compact_due(self.r1.out.bytes()));
        if due {
            self.rewrite_journal();
        }
    }

    /// Rewrites the journal as a snapshot of the state and the output held.
    pub(super) fn rewrite_journal(&mut self) {
        let Some(j) = self.journal.file.as_mut() else { return };
        let snap = journal::Snapshot {
            out_base: self.r1.out.acked(),
            client_frames: self.r1.acks.received(),
            ledger: j.ledger.clone(),
            pending: j.pending.ids(),
            resumes: self.resumes,
        };
        let live = self.r1.out.since(self.r1.out.acked()).unwrap_or_default();
        j.compact(&snap, &live);
    }
}
