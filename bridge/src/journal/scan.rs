//! Reading the folder at a start: which journals a served agent takes back
//! (each read record by record within its buffer), which are orphans to keep
//! or remove, and which cannot be used and are set aside. Separate from
//! writing because it runs once per start on files anyone may have planted,
//! so every file is checked before a byte of it is read.

use std::{
    fs,
    io::{self, Read},
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use tracing::{debug, info, warn};

use super::{record, Found, Header, Journals, LONGEST_GRACE, MAX_JOURNALS_READ, MAX_JOURNAL_READ, SUFFIX};

/// Read buffer for a journal: records are read through it one by one.
const READ_BUFFER: usize = 256 * 1024;

impl Journals {
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

#[cfg(test)]
mod tests {
    use std::{
        fs,
        os::unix::fs::{FileTypeExt, PermissionsExt},
        time::Duration,
    };

    use bytes::Bytes;

    use super::*;
    use crate::{
        home::Home,
        journal::{test_support::*, token_hash, Header, Snapshot},
    };

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
}
