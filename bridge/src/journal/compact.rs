//! Compaction: a journal rewritten as a snapshot and only the output still
//! unacknowledged, in place of the old file, so it stays within about twice
//! the resume buffer. Separate because it is the one place a journal file is
//! created at a name something else may hold (a temporary file left by a
//! crash, or one planted), and that needs its own care.

use std::{
    fs,
    io::{self, Write},
    os::unix::fs::OpenOptionsExt,
    path::Path,
};

use bytes::Bytes;

use super::{record, Journal, Pending, Snapshot, COMPACT_ABOVE};
use crate::home::FILE_MODE;

impl Journal {
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

#[cfg(test)]
mod tests {
    use std::{
        fs,
        os::unix::fs::{MetadataExt, PermissionsExt},
    };

    use bytes::Bytes;

    use crate::{
        home::Home,
        journal::{test_support::*, Journals, Snapshot},
    };

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
}
