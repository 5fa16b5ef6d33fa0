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
pub mod ledger;
pub mod record;

use std::{
    collections::HashSet,
    fs,
    io::{self, Read, Write},
    os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};

use crate::home::{Home, DIR_MODE, FILE_MODE};
pub use behind::WriteBehind;
pub use ledger::{AcpSession, ClientLines, Ledger, Pending};
pub use record::{BadJournal, Folded, Header, Snapshot, JOURNAL_VERSION};

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

/// Read buffer for a journal: records are read through it one by one.
const READ_BUFFER: usize = 256 * 1024;

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

    /// The journals a served agent takes back. `claim` says, from a
    /// journal's header, whether one does, and how much of the agent's
    /// output it keeps (its resume buffer): such a journal is read record
    /// by record, keeping at most that much output, the newest (a client
    /// that lacks older output it did not acknowledge cannot take the session
    /// back: said in the log; its resume is refused as stale). A journal no
    /// served agent claims is read no further than its header: kept while
    /// its agent may still come back, removed once it was last written over
    /// [`LONGEST_GRACE`] ago. One that cannot be read (not a regular file of
    /// ours at 0600, cut short before its header, of another version, a
    /// record that does not read) is reported with its path and set aside
    /// (renamed `….set-aside`, never read again nor deleted). This process's
    /// own journals (live sessions) are left alone. At most
    /// [`MAX_JOURNALS_READ`], the newest first.
    pub fn scan(&self, claim: impl Fn(&Header) -> Option<usize>) -> Vec<Found> {
        let Ok(entries) = fs::read_dir(&self.dir) else { return Vec::new() };
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // Newest first: a bridge that just stopped wrote its journals last.
        let mut paths: Vec<(SystemTime, PathBuf)> = entries
            .flatten()
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(SUFFIX)))
            .map(|e| (e.metadata().and_then(|m| m.modified()).unwrap_or(SystemTime::UNIX_EPOCH), e.path()))
            .filter(|(_, p)| !live.contains(p))
            .collect();
        paths.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let unread = paths.len().saturating_sub(MAX_JOURNALS_READ);
        let now = SystemTime::now();
        let (mut found, mut removed, mut kept) = (Vec::new(), 0usize, 0usize);
        for (_, path) in paths.into_iter().take(MAX_JOURNALS_READ) {
            match read_one(&path, &claim) {
                Ok(Scanned::Claimed(f)) => found.push(*f),
                Ok(Scanned::Orphan { header, written }) => {
                    let age = now.duration_since(written).unwrap_or_default();
                    let grace = header
                        .grace_ms
                        .map_or(LONGEST_GRACE, |ms| Duration::from_millis(ms).min(LONGEST_GRACE));
                    if age > grace {
                        debug!(
                            "removing the session journal {} (bridge {:?}, agent {:?}): no agent served here takes it back and it was last written {}h ago",
                            path.display(),
                            header.node,
                            header.agent,
                            age.as_secs() / 3600
                        );
                        match fs::remove_file(&path) {
                            Ok(()) => removed += 1,
                            Err(e) => warn!("cannot remove the old session journal {}: {e}", path.display()),
                        }
                    } else {
                        kept += 1;
                    }
                }
                Err(why) => set_aside(&path, &why),
            }
        }
        if removed > 0 {
            info!(
                "removed {removed} session journal(s) of other bridges or of agents not served here, last written over {} days ago (longer than any grace)",
                LONGEST_GRACE.as_secs() / 86400
            );
        }
        if kept > 0 {
            debug!("kept {kept} session journal(s) of other bridges or of agents not served here (they may still come back within their grace)");
        }
        if unread > 0 {
            warn!(
                "{unread} session journal(s) in {} not read at this start: at most {MAX_JOURNALS_READ} are read per start, the newest first",
                self.dir.display()
            );
        }
        for f in &found {
            if f.folded.dropped > 0 {
                warn!(
                    "session journal {}: its client had not acknowledged (as far as the journal knows) more of the agent's output \
                     than the resume buffer keeps: the oldest {} frame(s) ({} bytes) are dropped, the newest {} bytes kept; \
                     a client that lacks them cannot take the session back (its resume is refused as stale)",
                    f.path.display(),
                    f.folded.dropped,
                    f.folded.dropped_bytes,
                    f.folded.out_bytes()
                );
            }
        }
        found
    }
}

/// What reading one journal found.
enum Scanned {
    /// A served agent's, read.
    Claimed(Box<Found>),
    /// No served agent's: its header only.
    Orphan { header: Header, written: SystemTime },
}

/// Reads one journal file, refusing anything this bridge did not write.
///
/// Opened first, then checked: the open neither follows a link
/// (`O_NOFOLLOW`) nor waits (`O_NONBLOCK`: a plain open of a FIFO waits for a
/// writer, and would hold the bridge's start-up forever), and what is checked
/// (`fstat`) is what was opened, so nothing swapped in after a look is read.
/// Then its header, and (when `claim` says a served agent takes it back) its
/// records, one by one, within the buffer `claim` gives.
fn read_one(path: &Path, claim: &impl Fn(&Header) -> Option<usize>) -> Result<Scanned, String> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => "a symbolic link (a journal is a file the bridge writes itself)".to_string(),
            _ => e.to_string(),
        })?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err(format!("not a regular file but {}", crate::home::file_kind(meta.file_type())));
    }
    // SAFETY: geteuid has no preconditions.
    if meta.uid() != unsafe { libc::geteuid() } {
        return Err(format!("owned by uid {}, not this user", meta.uid()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "mode {:04o}: others could have written it (the bridge writes 0600)",
            meta.mode() & 0o7777
        ));
    }
    if meta.len() > MAX_JOURNAL_READ {
        return Err(format!("{} bytes, more than any journal holds", meta.len()));
    }
    let written = meta.modified().unwrap_or(SystemTime::now());
    // Read as long as it was when opened (a journal is written by one bridge
    // only, and the control socket's lock keeps a second one away).
    let mut r = io::BufReader::with_capacity(READ_BUFFER, f).take(meta.len());
    let header = record::read_header(&mut r).map_err(|e| e.to_string())?;
    let Some(keep) = claim(&header) else { return Ok(Scanned::Orphan { header, written }) };
    let folded = record::fold(&mut r, keep).map_err(|e| e.to_string())?;
    Ok(Scanned::Claimed(Box::new(Found { path: path.to_path_buf(), header, folded, written })))
}

/// Renames a journal that cannot be used out of the way, and says so.
pub fn set_aside(path: &Path, why: &str) {
    let mut to = path.with_extension("journal.set-aside");
    for n in 1..100 {
        if fs::symlink_metadata(&to).is_err() {
            break;
        }
        to = path.with_extension(format!("journal.set-aside.{n}"));
    }
    match fs::rename(path, &to) {
        Ok(()) => warn!(
            "session journal {} cannot be used ({why}); set aside as {} (its session cannot be taken back)",
            path.display(),
            to.display()
        ),
        Err(e) => warn!("session journal {} cannot be used ({why}), nor set aside: {e}", path.display()),
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

impl Journal {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it still journals (no write failed).
    pub fn is_live(&self) -> bool {
        self.file.is_some()
    }

    /// A run of another device's frames on the way to the agent (a device
    /// that joined the session and controls it): the calls a restart needs
    /// (`initialize`, the ACP sessions it opens and loads) go into the
    /// ledger, so its ACP sessions come back too. Not its frames' count nor
    /// its requests in flight: the journal's client is the session's first
    /// device, and the other joins again after a restart.
    pub fn other_device_run(&mut self, run: &[u8], names_an_id: bool) {
        if self.file.is_none() {
            return;
        }
        let lines = ClientLines::of(run, names_an_id);
        if lines.calls.is_empty() {
            return;
        }
        self.ledger.client_calls(&lines.calls);
        let rec = record::in_record(0, Vec::new(), lines.calls);
        self.append(&[&rec]);
    }

    /// A run of the client's frames, before the agent's queue takes it.
    pub fn client_run(&mut self, run: &[u8], frames: u64, names_an_id: bool) {
        if self.file.is_none() {
            return;
        }
        let lines = ClientLines::of(run, names_an_id);
        self.ledger.client_calls(&lines.calls);
        self.pending.sent(&lines.requests);
        let rec = record::in_record(frames, lines.requests, lines.calls);
        self.append(&[&rec]);
    }

    /// A run of the agent's lines as it passes, written or not: what of it
    /// matters to a restart (the answers to the client's requests and calls)
    /// is written at once.
    pub fn saw_output(&mut self, run: &[u8]) {
        if self.file.is_none() || (self.pending.0.is_empty() && !self.ledger.waiting()) {
            return;
        }
        let (mut ans, mut lines) = (Vec::new(), Vec::new());
        for line in thunderbolt_shared::ndjson::lines(run) {
            if let Some(id) = self.pending.answered_line(line) {
                ans.push(id);
            }
            if self.ledger.agent_line(line) {
                if let Ok(v) = serde_json::from_slice(line) {
                    lines.push(v);
                }
            }
        }
        if !ans.is_empty() || !lines.is_empty() {
            let rec = record::seen_record(ans, lines);
            self.append(&[&rec]);
        }
    }

    /// The agent's frames the journal lacks: from `from` (those before it
    /// and after the last written were acknowledged) to `total`, as `runs`.
    pub fn write_output(&mut self, from: u64, runs: &[Bytes], total: u64) {
        if self.file.is_none() || self.hwm >= total {
            return;
        }
        if from > self.hwm {
            let rec = record::skip_record(from);
            self.append(&[&rec]);
        }
        for run in runs {
            let frames = memchr::memchr_iter(b'\n', run).count() as u64;
            let head = record::out_record(frames, run.len());
            self.append(&[&head, run]);
        }
        self.hwm = total;
    }

    /// The agent's frames before this one are in the journal.
    pub fn written_to(&self) -> u64 {
        self.hwm
    }

    /// Whether the file has grown enough past what it must hold (`live`
    /// bytes of unacknowledged output) to be compacted.
    pub fn compact_due(&self, live: usize) -> bool {
        self.file.is_some() && self.len > COMPACT_ABOVE && self.len > 2 * live as u64
    }

    /// Rewrites the journal as `snap` and the output still held (`live`,
    /// whole runs of frames from `snap.out_base` on), in place of the old
    /// file (renamed over it: a crash of the process leaves one or the other whole).
    pub fn compact(&mut self, snap: &Snapshot, live: &[Bytes]) {
        let tmp = self.path.with_extension("journal.tmp");
        let result = (|| {
            let mut f = create_fresh(&tmp)?;
            let mut w = io::BufWriter::with_capacity(256 * 1024, &mut f);
            let mut len = 0u64;
            for part in [record::header_line(&self.header), record::snap_record(snap)] {
                w.write_all(&part)?;
                len += part.len() as u64;
            }
            for run in live {
                let frames = memchr::memchr_iter(b'\n', run).count() as u64;
                let head = record::out_record(frames, run.len());
                w.write_all(&head)?;
                w.write_all(run)?;
                len += (head.len() + run.len()) as u64;
            }
            w.flush()?;
            drop(w);
            // Not synced here: a compaction comes every few MiB of a bulk
            // transfer, and an fsync each time halved its throughput (bench
            // --only restart). The rename replaces the file whole; the next
            // sync (a stop, a detach) makes it durable.
            fs::rename(&tmp, &self.path)?;
            // Appended to through the descriptor it was written with (never
            // opened again by name: nothing put at the name since is written).
            Ok::<_, io::Error>((f, len))
        })();
        match result {
            Ok((file, len)) => {
                self.file = Some(file);
                self.len = len;
                self.ledger = snap.ledger.clone();
                self.pending = Pending::default();
                self.pending.sent(&snap.pending);
                let frames: u64 = live.iter().map(|r| memchr::memchr_iter(b'\n', r).count() as u64).sum();
                self.hwm = snap.out_base + frames;
            }
            Err(e) => {
                // The name only: unlink neither follows a link nor touches a
                // hard link's other name.
                let _ = fs::remove_file(&tmp);
                self.failed(&e);
            }
        }
    }

    /// The bridge stops: the session is kept for its restart (marked, synced).
    pub fn stop(&mut self) {
        if self.file.is_none() {
            return;
        }
        let rec = record::stop_record(SystemTime::now());
        self.append(&[&rec]);
        self.sync();
        sync_dir(&self.path);
        self.keep = self.file.is_some();
    }

    /// Whether the session is kept for the bridge's restart.
    pub fn kept(&self) -> bool {
        self.keep
    }

    /// Flushes what was written to the disk off the caller's thread (a
    /// session's detach: durability, not ordering, is what it is for, and an
    /// fsync must not hold up the runtime that carries every session).
    pub fn sync_behind(&self) {
        let Some(f) = self.file.as_ref().and_then(|f| f.try_clone().ok()) else { return };
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = f.sync_data() {
                warn!("syncing the session journal {} failed: {e}", path.display());
            }
        });
    }

    /// Flushes what was written to the disk.
    pub fn sync(&mut self) {
        if let Some(f) = &self.file {
            if let Err(e) = f.sync_data() {
                self.failed(&e);
            }
        }
    }

    fn append(&mut self, parts: &[&[u8]]) {
        let Some(f) = self.file.as_mut() else { return };
        let mut slices: Vec<io::IoSlice<'_>> = parts.iter().map(|p| io::IoSlice::new(p)).collect();
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let result = (|| {
            let mut bufs = &mut slices[..];
            while !bufs.is_empty() {
                let n = f.write_vectored(bufs)?;
                if n == 0 {
                    return Err(io::Error::from(io::ErrorKind::WriteZero));
                }
                io::IoSlice::advance_slices(&mut bufs, n);
            }
            Ok(())
        })();
        match result {
            Ok(()) => self.len += total as u64,
            Err(e) => self.failed(&e),
        }
    }

    /// A write failed: the journal would restore a wrong session, so it goes.
    fn failed(&mut self, e: &io::Error) {
        warn!(
            "writing the session journal {} failed ({e}); this session will not survive a restart of the bridge",
            self.path.display()
        );
        self.file = None;
        self.keep = false;
        let _ = fs::remove_file(&self.path);
    }
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

/// A new file at `path` for writing (appending), 0600, that is this
/// bridge's alone. Whatever has the name already (a temporary file a crash left,
/// or something planted: a FIFO would block a plain open for writing until a
/// reader came, a hard link would be written through to its other name, a
/// symbolic link followed) is unlinked first (`unlink` removes the name, never
/// what it links to), then the file is created with `O_CREAT | O_EXCL |
/// O_NOFOLLOW`: should anything be at the name again, the create fails instead
/// of opening it.
fn create_fresh(path: &Path) -> io::Result<fs::File> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    fs::OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

/// Syncs a folder, so a rename in it survives a power loss.
fn sync_dir(file: &Path) {
    if let Some(dir) = file.parent() {
        // O_DIRECTORY: a folder, never anything else put at its name.
        let opened = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(dir);
        if let Ok(d) = opened {
            let _ = d.sync_all();
        }
    }
}

/// Removes a journal found at start-up that will not be taken back.
pub fn discard(path: &Path) {
    let _ = fs::remove_file(path);
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileTypeExt;

    use super::*;

    /// Every journal in the folder, as a bridge starting on it reads them
    /// (this process's live journals included), each taken back whole.
    fn scan_all(js: &Journals) -> Vec<Found> {
        Journals::at(js.dir.clone()).scan(|_| Some(usize::MAX))
    }

    fn header(token: &str) -> Header {
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

    #[test]
    fn a_journal_reads_back_what_was_written_and_compacts() {
        let home = tempfile::tempdir().unwrap();
        let js = Journals::open(&Home::new(home.path().to_path_buf())).unwrap();
        let mut j = js.create(header("t1")).unwrap();
        assert_eq!(fs::metadata(j.path()).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::metadata(js.dir()).unwrap().permissions().mode() & 0o777, 0o700);
        j.client_run(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"session/prompt\"}\n", 1, true);
        j.write_output(0, &[Bytes::from_static(b"{\"a\":1}\n{\"a\":2}\n")], 2);
        let found = scan_all(&js);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].folded.out_total(), 2);
        assert_eq!(found[0].folded.client_frames, 1);
        assert_eq!(found[0].folded.pending.0.len(), 1);

        let snap = Snapshot { out_base: 1, client_frames: 1, ..Snapshot::default() };
        j.compact(&snap, &[Bytes::from_static(b"{\"a\":2}\n")]);
        j.write_output(2, &[Bytes::from_static(b"{\"a\":3}\n")], 3);
        let f = &scan_all(&js)[0].folded;
        assert_eq!((f.out_base, f.out_total()), (1, 3));
        assert_eq!(f.out.concat_bytes(), b"{\"a\":2}\n{\"a\":3}\n");
        assert!(f.pending.0.is_empty(), "the snapshot said none");

        // Written behind: frames acknowledged before they were written are
        // skipped in one record; an answer to a request is kept at once.
        j.client_run(b"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"session/prompt\"}\n", 1, true);
        j.saw_output(b"{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{}}\n");
        j.write_output(7, &[Bytes::from_static(b"{\"a\":7}\n")], 8);
        let f = &scan_all(&js)[0].folded;
        assert_eq!((f.out_base, f.out_total()), (7, 8));
        assert!(f.pending.0.is_empty(), "9 was answered: {:?}", f.pending);

        j.stop();
        let path = j.path().to_path_buf();
        drop(j);
        assert!(path.exists(), "a stopped session's journal is kept");
        assert!(scan_all(&js)[0].folded.stopped.is_some());
        let j = js.adopt(&scan_all(&js)[0], &snap, &[]);
        drop(j);
        assert!(!path.exists(), "an ended session's journal is deleted");
    }

    /// Sets a file's modification time `ago` back.
    fn age(path: &Path, ago: Duration) {
        let f = fs::OpenOptions::new().write(true).open(path).unwrap();
        f.set_modified(SystemTime::now() - ago).unwrap();
    }

    #[test]
    fn a_large_journal_is_read_record_by_record_keeping_the_newest_output_within_the_buffer() {
        let home = tempfile::tempdir().unwrap();
        let js = Journals::open(&Home::new(home.path().to_path_buf())).unwrap();
        let mut j = js.create(header("large")).unwrap();
        // An ACP session opened and a prompt in flight, answered early on.
        j.client_run(
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"session/new\",\"params\":{\"cwd\":\"/w\"}}\n\
              {\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"session/prompt\"}\n",
            2,
            true,
        );
        j.write_output(
            0,
            &[Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"sessionId\":\"s\"}}\n")],
            1,
        );
        // 96 MiB of the agent's output, none of it acknowledged: runs of 64
        // lines of 1 KiB, each line numbered.
        const LINE: usize = 1024;
        const RUNS: u64 = 1536;
        let line = |n: u64| {
            let mut l = format!("{{\"n\":{n:08},\"pad\":\"").into_bytes();
            l.resize(LINE - 3, b'x');
            l.extend_from_slice(b"\"}\n");
            l
        };
        let mut total = 1;
        for _ in 0..RUNS {
            let run: Vec<u8> = (total..total + 64).flat_map(line).collect();
            j.write_output(total, &[Bytes::from(run)], total + 64);
            total += 64;
        }
        j.write_output(
            total,
            &[Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n")],
            total + 1,
        );
        total += 1;
        j.stop();
        drop(j);
        let size =
            fs::metadata(js.dir().join(format!("{}.journal", &token_hash("large")[..16]))).unwrap().len();
        assert!(size > 96 << 20, "the journal holds it all: {size}");

        // Taken back by an agent whose buffer is 4 MiB.
        const BUFFER: usize = 4 << 20;
        let found = Journals::at(js.dir().to_path_buf()).scan(|_| Some(BUFFER));
        assert_eq!(found.len(), 1);
        let f = &found[0].folded;
        assert!(
            f.out_bytes() <= BUFFER,
            "the fold holds {} bytes, past the buffer of {BUFFER}",
            f.out_bytes()
        );
        assert!(f.out_bytes() > BUFFER - 2 * LINE, "the buffer is used: {}", f.out_bytes());
        assert_eq!(f.out_total(), total, "every frame is counted");
        assert_eq!(f.dropped, f.out_base, "all before the kept ones were dropped, none acknowledged");
        let kept: Vec<u8> = f.out.iter().flat_map(|(b, _)| b.to_vec()).collect();
        assert!(kept.ends_with(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n"), "the newest are kept");
        let first = format!("{{\"n\":{:08},", f.out_base);
        assert!(kept.starts_with(first.as_bytes()), "the kept frames follow the dropped ones with no gap");
        assert_eq!(f.ledger.sessions[0].id, "s", "what was dropped was still read");
        assert!(f.pending.0.is_empty(), "the prompt was answered");

        // Taken over, the journal holds what was kept, no more.
        let snap = Snapshot { out_base: f.out_base, client_frames: 2, ..Snapshot::default() };
        let live: Vec<Bytes> = f.out.iter().map(|(b, _)| b.clone()).collect();
        let j = js.adopt(&found[0], &snap, &live);
        assert!(fs::metadata(j.path()).unwrap().len() < (BUFFER + (64 << 10)) as u64);
    }

    #[test]
    fn orphan_journals_are_removed_once_no_grace_can_still_run_and_no_other_is() {
        let home = tempfile::tempdir().unwrap();
        let js = Journals::open(&Home::new(home.path().to_path_buf())).unwrap();
        let other = |token: &str| Header { node: "another bridge".into(), ..header(token) };
        let stopped = |h: Header| {
            let mut j = js.create(h).unwrap();
            j.write_output(0, &[Bytes::from_static(b"{\"a\":1}\n")], 1);
            j.stop();
            j.path().to_path_buf()
        };
        let old = LONGEST_GRACE + Duration::from_secs(3600);
        // Another bridge's, past any grace: removed.
        let gone = stopped(other("gone"));
        age(&gone, old);
        // Another bridge's within it (that bridge may still come back): kept.
        let waits = stopped(other("waits"));
        age(&waits, LONGEST_GRACE - Duration::from_secs(3600));
        // Another bridge's that recorded a grace of an hour, two hours old: removed.
        let short = stopped(Header { grace_ms: Some(3_600_000), ..other("short") });
        age(&short, Duration::from_secs(7200));
        // Served here, as old: read for its agent, whose own grace decides.
        let mine = stopped(header("mine"));
        age(&mine, old);
        // Another bridge's as old, but a live session's of this process: untouched.
        let mut live = js.create(other("live")).unwrap();
        live.write_output(0, &[Bytes::from_static(b"{\"a\":1}\n")], 1);
        age(live.path(), old);

        let found = js.scan(|h| (h.node == "n").then_some(usize::MAX));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, mine);
        assert_eq!(found[0].folded.out_total(), 1);
        assert!(!gone.exists(), "an orphan past any grace is removed");
        assert!(waits.exists(), "an orphan within the longest grace is kept");
        assert!(!short.exists(), "an orphan past the grace it recorded is removed");
        assert!(mine.exists() && live.path().exists());
        assert_eq!(fs::read_dir(js.dir()).unwrap().count(), 3, "nothing else was made");
        // Its session ended: the live one goes as ever.
        let path = live.path().to_path_buf();
        drop(live);
        assert!(!path.exists());
    }

    #[test]
    fn journals_that_cannot_be_used_are_set_aside() {
        let home = tempfile::tempdir().unwrap();
        let js = Journals::open(&Home::new(home.path().to_path_buf())).unwrap();
        let mut good = js.create(header("good")).unwrap();
        good.stop();
        let bad = |name: &str, bytes: &[u8], mode: u32| {
            let p = js.dir().join(name);
            fs::write(&p, bytes).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        };
        bad("truncated.journal", b"{\"journal\":1,\"tok", 0o600);
        bad("version.journal", &record::header_line(&Header { journal: 9, ..header("v") }), 0o600);
        bad("open.journal", &record::header_line(&header("o")), 0o644);
        std::os::unix::fs::symlink(good.path(), js.dir().join("link.journal")).unwrap();
        let found = scan_all(&js);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].header.token_sha256, token_hash("good"));
        let mut names: Vec<String> =
            fs::read_dir(js.dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                format!("{}.journal", &token_hash("good")[..16]),
                "link.journal.set-aside".into(),
                "open.journal.set-aside".into(),
                "truncated.journal.set-aside".into(),
                "version.journal.set-aside".into(),
            ]
        );
    }

    /// Plants a FIFO at `path`.
    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a plain syscall on a NUL-terminated path of ours.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "{}", io::Error::last_os_error());
    }

    /// Runs `f` on another thread: one that blocks fails the test instead of hanging it.
    fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap_or_else(|_| panic!("{what} blocked"))
    }

    /// A journal with one frame of output written, and where it compacts to.
    fn one_frame(js: &Journals, token: &str) -> (Journal, PathBuf) {
        let mut j = js.create(header(token)).unwrap();
        j.write_output(0, &[Bytes::from_static(b"{\"a\":1}\n")], 1);
        let tmp = j.path().with_extension("journal.tmp");
        (j, tmp)
    }

    #[test]
    fn a_fifo_planted_at_the_compaction_file_does_not_block_the_compaction() {
        let home = tempfile::tempdir().unwrap();
        let js = Journals::open(&Home::new(home.path().to_path_buf())).unwrap();
        let (mut j, tmp) = one_frame(&js, "fifo");
        // A plain open for writing would wait for a reader forever.
        mkfifo(&tmp);
        let j = within("compacting over a FIFO", move || {
            j.compact(&Snapshot::default(), &[Bytes::from_static(b"{\"a\":1}\n")]);
            j
        });
        assert!(j.is_live(), "the compaction went through");
        assert_eq!(scan_all(&js)[0].folded.out.concat_bytes(), b"{\"a\":1}\n");
        assert!(fs::symlink_metadata(&tmp).is_err(), "no temporary file is left");
    }

    #[test]
    fn a_hard_link_planted_at_the_compaction_file_is_not_written_through() {
        let home = tempfile::tempdir().unwrap();
        let js = Journals::open(&Home::new(home.path().to_path_buf())).unwrap();
        let (mut j, tmp) = one_frame(&js, "link");
        let elsewhere = home.path().join("precious");
        fs::write(&elsewhere, b"mine\n").unwrap();
        fs::set_permissions(&elsewhere, fs::Permissions::from_mode(0o644)).unwrap();
        fs::hard_link(&elsewhere, &tmp).unwrap();
        j.compact(&Snapshot { out_base: 1, ..Snapshot::default() }, &[]);
        assert!(j.is_live(), "the compaction went through");
        assert_eq!(fs::read(&elsewhere).unwrap(), b"mine\n", "written through the planted link");
        let meta = fs::metadata(&elsewhere).unwrap();
        assert_eq!((meta.permissions().mode() & 0o777, meta.nlink()), (0o644, 1));
        let journal = fs::metadata(j.path()).unwrap();
        assert_ne!(journal.ino(), meta.ino(), "the journal is a file of its own");
        assert_eq!(journal.permissions().mode() & 0o777, 0o600);
        // Appended to after the compaction, through the file it wrote.
        j.write_output(1, &[Bytes::from_static(b"{\"a\":2}\n")], 2);
        let f = &scan_all(&js)[0].folded;
        assert_eq!((f.out_base, f.out_total()), (1, 2));
        assert_eq!(fs::read(&elsewhere).unwrap(), b"mine\n");
    }

    #[test]
    fn a_fifo_planted_at_the_compaction_file_does_not_block_a_restore() {
        let home = tempfile::tempdir().unwrap();
        let js = Journals::open(&Home::new(home.path().to_path_buf())).unwrap();
        let (mut j, tmp) = one_frame(&js, "restore");
        j.stop();
        drop(j);
        mkfifo(&tmp);
        // Taking a journal back at start-up rewrites it (`adopt`).
        let dir = js.dir().to_path_buf();
        let j = within("restoring", move || {
            let js = Journals::at(dir);
            let found = scan_all(&js);
            assert_eq!(found.len(), 1, "the FIFO is no journal: {found:?}");
            js.adopt(&found[0], &Snapshot { out_base: 1, ..Snapshot::default() }, &[])
        });
        assert!(j.is_live(), "taken back");
        assert_eq!(scan_all(&js)[0].folded.out_base, 1);
    }

    #[test]
    fn a_fifo_named_like_a_journal_is_set_aside_unread() {
        let home = tempfile::tempdir().unwrap();
        let js = Journals::open(&Home::new(home.path().to_path_buf())).unwrap();
        let fifo = js.dir().join("planted.journal");
        mkfifo(&fifo);
        let dir = js.dir().to_path_buf();
        let found = within("scanning", move || scan_all(&Journals::at(dir)));
        assert!(found.is_empty(), "{found:?}");
        assert!(fs::symlink_metadata(&fifo).is_err());
        let aside = js.dir().join("planted.journal.set-aside");
        assert!(fs::symlink_metadata(aside).unwrap().file_type().is_fifo(), "set aside, not removed");
        let aside = fifo.with_extension("journal.set-aside");
        assert!(read_one(&aside, &|_| Some(0)).err().unwrap().contains("a FIFO"));
    }

    trait Concat {
        fn concat_bytes(&self) -> Vec<u8>;
    }
    impl Concat for std::collections::VecDeque<(Bytes, u64)> {
        fn concat_bytes(&self) -> Vec<u8> {
            self.iter().flat_map(|(b, _)| b.to_vec()).collect()
        }
    }
}
