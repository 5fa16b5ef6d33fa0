//! One session's journal as it is written: the client's runs, what the agent
//! answered, its output behind the acknowledgements, the stop and the syncs.
//! Separate from the folder's scan and from compaction because this is the
//! hot path, called on every run of frames of a live session.

use std::{
    fs,
    io::{self, Write},
    os::unix::fs::OpenOptionsExt,
    path::Path,
    time::SystemTime,
};

use bytes::Bytes;
use tracing::warn;

use super::{record, ClientLines, Journal};

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

    pub(super) fn append(&mut self, parts: &[&[u8]]) {
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
    pub(super) fn failed(&mut self, e: &io::Error) {
        warn!(
            "writing the session journal {} failed ({e}); this session will not survive a restart of the bridge",
            self.path.display()
        );
        self.file = None;
        self.keep = false;
        let _ = fs::remove_file(&self.path);
    }
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

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::PermissionsExt};

    use bytes::Bytes;

    use crate::{
        home::Home,
        journal::{test_support::*, Journals, Snapshot},
    };

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
}
