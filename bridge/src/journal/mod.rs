//! Session journals: what a resumable session needs to be taken back after
//! the bridge process is gone (a restart, an upgrade, a crash).
//!
//! One file per session in `$THUNDERBOLT_HOME/iroh/sessions/` (0700, files
//! 0600, written by the bridge only): its token's hash, owner and agent, both
//! frame counters, what the client opened on the agent ([`ledger`]), and the
//! agent's output the client has not acknowledged. The format is in
//! [`record`].
//!
//! Write-ahead, no fsync on the way: each run of the client's frames is written
//! before the agent can see it, one `write` each; the agent's output before the
//! client can while none is attached, else behind the client's acknowledgements
//! ([`behind`]: only what is [`WRITE_BEHIND`] old and still unacknowledged). A process that dies (SIGKILL, a crash) loses
//! nothing it wrote: the kernel holds it. The file is synced at a graceful
//! stop and when its client goes away (the moment a restart matters most), so
//! a power loss loses at most what was written since the last of those, or
//! since the kernel last wrote it back on its own.
//!
//! The file is compacted (rewritten with a snapshot and only the output still
//! unacknowledged) once it is larger than [`COMPACT_ABOVE`] and twice what it
//! must hold: the file stays within about twice the resume buffer.
//!
//! At a start ([`Journals::scan`]) a journal is read record by record, never
//! whole, keeping at most its agent's resume buffer of output (the newest);
//! a journal no agent served here takes back (another bridge's NodeId on
//! this home, an agent no longer served) is read no further than its header,
//! and removed once it is older than any grace ([`LONGEST_GRACE`]). At most
//! [`MAX_JOURNALS_READ`] journals are read per start.

pub mod behind;
mod compact;
pub mod ledger;
pub mod record;
mod scan;
mod write;

use std::{
    collections::HashSet,
    fs, io,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::home::{Home, DIR_MODE, FILE_MODE};
pub use behind::WriteBehind;
pub use ledger::{AcpSession, ClientLines, Ledger, Pending};
pub use record::{BadJournal, Folded, Header, Snapshot, JOURNAL_VERSION};
pub use scan::set_aside;

/// A journal is compacted once it is larger than this and twice what it must
/// hold: below it, rewriting costs more than the disk it saves.
pub const COMPACT_ABOVE: u64 = 4 << 20;

/// Largest journal read back: a journal holds at most the resume buffer
/// twice over (32 MiB by default, at most 1 GiB) and one record before it is
/// compacted; anything larger was not written by this bridge. (It is read
/// record by record, never whole: this bounds a start's reading time, not
/// its memory.)
pub const MAX_JOURNAL_READ: u64 = 4 << 30;

/// Journals one scan (a start, or a host's new agent) reads at most, the
/// newest first; more wait for a later start, said in the log. A start takes
/// back only the sessions that were alive at the stop, at most `--max-agents`
/// (16 by default), each read within its resume buffer; every other journal
/// is an orphan, read no further than its header (a few hundred bytes) to
/// tell whose it is. 1024 is far above any count of sessions a restart takes
/// back and keeps a start's reading to milliseconds, however many journals
/// piled up (3000 orphans were once all read, whole, at every start).
pub const MAX_JOURNALS_READ: usize = 1024;

/// How long a journal no agent served here takes back is kept after its last
/// write (which is at or after its client's stop): another bridge's on this
/// home (another protocol's identity) or an agent not served now may still
/// come back within its grace, and that grace is not known here (the
/// default is 5 minutes; a grace of days keeps an idle agent running for
/// days). Older than this, no grace can still be running: it is removed at a
/// start. (A served agent's journals are judged by that agent's own grace.)
pub const LONGEST_GRACE: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long the agent's output may wait for its client's acknowledgement
/// before it is written to the journal, while a client is attached. Output is
/// acknowledged within a round trip and the ack delay (50 ms): most of it never
/// needs writing, which is what keeps journaling off a bulk transfer's cost
/// (written through, it cost a fifth of the throughput: `bench --only
/// restart`). A crash loses output younger than this that had not reached the
/// client (to within [`behind::AGE_GRAIN`]); what had reached it is kept by the client.
pub const WRITE_BEHIND: std::time::Duration = std::time::Duration::from_millis(250);

/// What a journal's file name ends with; others in the folder are not read.
const SUFFIX: &str = ".journal";

/// The SHA-256 of a session token, hex: what a journal stores and how a
/// restored session is found.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The journals' folder.
#[derive(Debug)]
pub struct Journals {
    dir: PathBuf,
    /// The journals this process has open (its live sessions'): a scan
    /// neither reads nor removes them, whatever their age.
    live: Live,
}

/// Paths of the journals open in this process.
type Live = Arc<Mutex<HashSet<PathBuf>>>;

/// A journal found at start-up.
#[derive(Debug)]
pub struct Found {
    pub path: PathBuf,
    pub header: Header,
    pub folded: Folded,
    /// When the file was last written.
    pub written: SystemTime,
}

impl Journals {
    /// The folder in `home` (made 0700 if missing).
    pub fn open(home: &Home) -> io::Result<Self> {
        let dir = home.iroh_dir().join("sessions");
        fs::create_dir_all(&dir)?;
        let meta = fs::symlink_metadata(&dir)?;
        if !meta.is_dir() {
            return Err(io::Error::other(format!("{} is not a folder", dir.display())));
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(DIR_MODE))?;
        Ok(Self::at(dir))
    }

    fn at(dir: PathBuf) -> Self {
        Self { dir, live: Live::default() }
    }

    /// A journal of this process's, at `path`.
    fn journal(&self, path: PathBuf, header: Header, ledger: Ledger) -> Journal {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).insert(path.clone());
        Journal {
            path,
            header,
            file: None,
            len: 0,
            ledger,
            pending: Pending::default(),
            hwm: 0,
            keep: false,
            live: self.live.clone(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new journal for a session, its header written.
    pub fn create(&self, header: Header) -> io::Result<Journal> {
        let path =
            self.dir.join(format!("{}{SUFFIX}", &header.token_sha256[..16.min(header.token_sha256.len())]));
        let file = fs::OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        let mut j = self.journal(path, header, Ledger::default());
        j.file = Some(file);
        let line = record::header_line(&j.header);
        j.append(&[&line]);
        Ok(j)
    }

    /// Takes a journal found at start-up over: rewritten with `snap` and
    /// `live` (its state now), then appended to.
    pub fn adopt(&self, found: &Found, snap: &Snapshot, live: &[Bytes]) -> Journal {
        let mut j = self.journal(found.path.clone(), found.header.clone(), snap.ledger.clone());
        j.compact(snap, live);
        j
    }
}

/// One session's open journal.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    header: Header,
    /// `None` once a write failed: the session is no longer journaled.
    file: Option<fs::File>,
    /// Bytes in the file.
    len: u64,
    /// What the client opened, kept for compactions.
    pub ledger: Ledger,
    /// The client's requests in flight.
    pub pending: Pending,
    /// The agent's frames before this one are in the journal (or were
    /// acknowledged and skipped).
    hwm: u64,
    /// Kept for the bridge's restart (a graceful stop), not deleted with the session.
    keep: bool,
    /// The journals open in this process, this one among them until dropped.
    live: Live,
}

impl Drop for Journal {
    /// A session that ended is gone from the disk too; one kept for the
    /// bridge's restart stays.
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_file(&self.path);
        }
        self.live.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.path);
    }
}

/// Removes a journal found at start-up that will not be taken back.
pub fn discard(path: &Path) {
    let _ = fs::remove_file(path);
}

/// What the tests of the folder, the writes and the compaction share: a
/// header, a scan as a starting bridge makes it, and files planted or aged.
#[cfg(test)]
mod test_support {
    use std::{
        io,
        path::{Path, PathBuf},
        time::{Duration, SystemTime},
    };

    use bytes::Bytes;

    use super::*;

    /// Every journal in the folder, as a bridge starting on it reads them
    /// (this process's live journals included), each taken back whole.
    pub(super) fn scan_all(js: &Journals) -> Vec<Found> {
        Journals::at(js.dir.clone()).scan(|_| Some(usize::MAX))
    }

    pub(super) fn header(token: &str) -> Header {
        Header {
            journal: JOURNAL_VERSION,
            token_sha256: token_hash(token),
            node: "n".into(),
            owner: "o".into(),
            agent: String::new(),
            protocol: "acp".into(),
            created_ms: 0,
            id: None,
            grace_ms: None,
        }
    }

    /// Sets a file's modification time `ago` back.
    pub(super) fn age(path: &Path, ago: Duration) {
        let f = fs::OpenOptions::new().write(true).open(path).unwrap();
        f.set_modified(SystemTime::now() - ago).unwrap();
    }

    /// Plants a FIFO at `path`.
    pub(super) fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a plain syscall on a NUL-terminated path of ours.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "{}", io::Error::last_os_error());
    }

    /// Runs `f` on another thread: one that blocks fails the test instead of hanging it.
    pub(super) fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap_or_else(|_| panic!("{what} blocked"))
    }

    /// A journal with one frame of output written, and where it compacts to.
    pub(super) fn one_frame(js: &Journals, token: &str) -> (Journal, PathBuf) {
        let mut j = js.create(header(token)).unwrap();
        j.write_output(0, &[Bytes::from_static(b"{\"a\":1}\n")], 1);
        let tmp = j.path().with_extension("journal.tmp");
        (j, tmp)
    }

    pub(super) trait Concat {
        fn concat_bytes(&self) -> Vec<u8>;
    }
    impl Concat for std::collections::VecDeque<(Bytes, u64)> {
        fn concat_bytes(&self) -> Vec<u8> {
            self.iter().flat_map(|(b, _)| b.to_vec()).collect()
        }
    }
}
