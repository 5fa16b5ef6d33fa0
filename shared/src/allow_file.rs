//! Reading an allow file from disk, live: the bridge's manual allow file and
//! the self-hosted relay's `allow_file` use the same reader, so both see an
//! edit at the same moment and refuse the same broken files.
//!
//! Each check costs one `stat`; the file is re-read and re-parsed only when its
//! identity, size or times changed (an atomic rewrite is a new inode, so a
//! same-size rewrite within one timestamp tick is still seen). Anything but a
//! regular file is refused, never opened: a FIFO would block the reader forever.
//! An unreadable file is an empty list (fail closed), reported once per
//! breakage. Unix only (not in the browser build).

use std::{
    fs, io,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use crate::allowlist::{parse, Allowed};

/// Why an allow file cannot be read.
/// Each message ends with its cause (`cause`), which is for that reason not
/// also the error's `source()`: the CLI prints an error with its chain
/// (`{:#}`), and a full disk would read `No space left on device` twice.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read allow file {path}: {cause}")]
    Read { path: PathBuf, cause: io::Error },
    #[error("allow file {path} is not a regular file (a {kind}); replace it with a plain text file")]
    NotRegular { path: PathBuf, kind: &'static str },
}

fn kind_of(ft: fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "directory"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_socket() {
        "socket"
    } else if ft.is_char_device() || ft.is_block_device() {
        "device"
    } else {
        "special file"
    }
}

/// Refuses anything but a regular file (following symlinks); `Ok(None)` when
/// there is nothing at `path`.
pub fn regular_metadata(path: &Path) -> Result<Option<fs::Metadata>, ReadError> {
    match fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(Some(m)),
        Ok(m) => Err(ReadError::NotRegular { path: path.to_path_buf(), kind: kind_of(m.file_type()) }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(cause) => Err(ReadError::Read { path: path.to_path_buf(), cause }),
    }
}

/// The file's text; a missing file is empty.
pub fn read_text(path: &Path) -> Result<String, ReadError> {
    if regular_metadata(path)?.is_none() {
        return Ok(String::new());
    }
    // O_NONBLOCK: should the file be swapped for a FIFO after the check, the
    // open still does not wait for a writer.
    let read =
        fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).and_then(|mut f| {
            let mut b = Vec::new();
            io::Read::read_to_end(&mut f, &mut b).map(|_| b)
        });
    match read {
        Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Err(cause) => Err(ReadError::Read { path: path.to_path_buf(), cause }),
    }
}

/// Reads and parses the file; a missing file is an empty list.
pub fn read(path: &Path) -> Result<Allowed, ReadError> {
    read_text(path).map(|t| parse(&t))
}

/// What a [`LiveAllowFile`] tells its owner, for the log.
#[derive(Debug)]
pub enum Reload<'a> {
    /// The file changed and was read again.
    Loaded(&'a Allowed),
    /// The file cannot be read (said once per breakage): treated as empty.
    Broken(&'a ReadError),
}

/// An allow file, re-read when it changes. See the module docs.
pub struct LiveAllowFile {
    path: PathBuf,
    cache: Mutex<Option<(Stamp, Arc<Allowed>)>>,
    report: Box<dyn Fn(Reload<'_>) + Send + Sync>,
}

impl std::fmt::Debug for LiveAllowFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveAllowFile").field("path", &self.path).finish_non_exhaustive()
    }
}

/// What identifies one version of the file without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stamp {
    Missing,
    File {
        dev: u64,
        ino: u64,
        len: u64,
        mtime: (i64, i64),
        ctime: (i64, i64),
    },
    /// Unreadable or not a regular file: checked again on every call.
    Broken,
}

impl LiveAllowFile {
    /// `report` hears every reload (to log it).
    pub fn new(path: PathBuf, report: impl Fn(Reload<'_>) + Send + Sync + 'static) -> Self {
        Self { path, cache: Mutex::new(None), report: Box::new(report) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn stamp(&self) -> Result<Stamp, ReadError> {
        Ok(match regular_metadata(&self.path)? {
            None => Stamp::Missing,
            Some(m) => Stamp::File {
                dev: m.dev(),
                ino: m.ino(),
                len: m.len(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
            },
        })
    }

    /// The current list (empty while the file cannot be read).
    pub fn current(&self) -> Arc<Allowed> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let stamp = self.stamp().unwrap_or(Stamp::Broken);
        if let Some((old, parsed)) = cache.as_ref() {
            if *old == stamp && stamp != Stamp::Broken {
                return parsed.clone();
            }
        }
        let parsed = match read_text(&self.path) {
            Ok(text) => Arc::new(parse(&text)),
            Err(e) => {
                if !matches!(cache.as_ref(), Some((Stamp::Broken, _))) {
                    (self.report)(Reload::Broken(&e));
                }
                let empty = Arc::new(Allowed::default());
                *cache = Some((Stamp::Broken, empty.clone()));
                return empty;
            }
        };
        (self.report)(Reload::Loaded(&parsed));
        *cache = Some((stamp, parsed.clone()));
        parsed
    }

    pub fn contains(&self, id: &iroh_base::EndpointId) -> bool {
        self.current().contains(id)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn id(n: u8) -> iroh_base::EndpointId {
        iroh_base::SecretKey::from_bytes(&[n; 32]).public()
    }

    #[test]
    fn rereads_only_on_change_and_sees_a_same_size_rewrite() {
        let dir = std::env::temp_dir().join(format!("tb-allow-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("allowlist");
        let reloads = Arc::new(AtomicUsize::new(0));
        let r = reloads.clone();
        let live = LiveAllowFile::new(path.clone(), move |_| {
            r.fetch_add(1, Ordering::SeqCst);
        });
        assert!(!live.contains(&id(1)), "a missing file admits nobody");
        fs::write(&path, format!("{}\n", id(1))).unwrap();
        assert!(live.contains(&id(1)));
        let after_first = reloads.load(Ordering::SeqCst);
        assert!(live.contains(&id(1)));
        assert_eq!(reloads.load(Ordering::SeqCst), after_first, "unchanged file re-read");
        // Same length, written as a new file and renamed over (what our editors do).
        let tmp = dir.join("allowlist.tmp");
        fs::write(&tmp, format!("{}\n", id(2))).unwrap();
        fs::rename(&tmp, &path).unwrap();
        assert!(live.contains(&id(2)) && !live.contains(&id(1)));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_is_refused_and_reported_once() {
        let dir = std::env::temp_dir().join(format!("tb-allow-dir-{}", std::process::id()));
        fs::create_dir_all(dir.join("allowlist")).unwrap();
        let broken = Arc::new(AtomicUsize::new(0));
        let b = broken.clone();
        let live = LiveAllowFile::new(dir.join("allowlist"), move |r| {
            if matches!(r, Reload::Broken(ReadError::NotRegular { kind: "directory", .. })) {
                b.fetch_add(1, Ordering::SeqCst);
            }
        });
        assert!(!live.contains(&id(1)));
        assert!(!live.contains(&id(1)));
        assert_eq!(broken.load(Ordering::SeqCst), 1);
        fs::remove_dir_all(&dir).unwrap();
    }
}
