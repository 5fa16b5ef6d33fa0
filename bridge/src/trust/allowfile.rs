//! The manual allow file: `$THUNDERBOLT_HOME/iroh/allowlist`.
//!
//! One NodeId per line; lines trimmed, blank lines ignored, duplicates collapse.
//! We also accept `#` comments, and report unparsable lines by number instead of
//! silently ignoring them (a typo must not look like a pairing that works).
//! Edits rewrite the file atomically at 0600 and keep comments and unknown lines.
//!
//! Edits from concurrent `iroh allow`/`iroh deny` runs are serialized by an
//! exclusive lock on a sidecar file (`.allowlist.lock` beside it), so no change
//! is lost while each reports success; a symlinked allow file is edited at its
//! target (the link stays). Anything but a regular file is refused with a
//! message, never opened (a FIFO would block the reader forever).

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use iroh::EndpointId;
use tracing::warn;

use crate::home::{self, HomeError};

pub use thunderbolt_shared::allow_file::{LiveAllowFile, ReadError};
pub use thunderbolt_shared::allowlist::{parse, Allowed};
use thunderbolt_shared::{
    allow_file::{self, Reload},
    allowlist::{classify, Line},
};

/// A message ends with its `cause`, which is not also `source()` (printed as a
/// chain it would read twice: see `HomeError`).
#[derive(Debug, thiserror::Error)]
pub enum AllowFileError {
    #[error(transparent)]
    File(#[from] ReadError),
    #[error("cannot lock allow file {path} for editing: {cause}")]
    Lock { path: PathBuf, cause: io::Error },
    #[error(transparent)]
    Home(#[from] HomeError),
}

/// Where edits go: the target of a symlinked allow file (resolved as far as it
/// exists), else the path itself.
fn edit_target(path: &Path) -> PathBuf {
    let mut p = path.to_path_buf();
    // A bounded walk: a symlink loop is left for the write to report.
    for _ in 0..MAX_SYMLINK_HOPS {
        match fs::read_link(&p) {
            Ok(target) => p = p.parent().unwrap_or(Path::new("/")).join(target),
            Err(_) => break,
        }
    }
    p
}

/// Links followed when editing a symlinked allow file; the kernel's own limit
/// for path resolution is 40.
const MAX_SYMLINK_HOPS: usize = 40;

fn lock_for_edit(path: &Path) -> Result<home::EditLock, AllowFileError> {
    home::EditLock::take(path).map_err(|cause| AllowFileError::Lock { path: path.to_path_buf(), cause })
}

/// Reads and parses the file; a missing file is an empty list.
pub fn read(path: &Path) -> Result<Allowed, AllowFileError> {
    Ok(allow_file::read(path)?)
}

/// Adds `id`. Returns false when it was already there (file untouched).
pub fn allow(path: &Path, id: &EndpointId) -> Result<bool, AllowFileError> {
    ensure_parent(path)?;
    let path = &edit_target(path);
    let _lock = lock_for_edit(path)?;
    let text = allow_file::read_text(path)?;
    if parse(&text).contains(id) {
        return Ok(false);
    }
    let mut new = text;
    if !new.is_empty() && !new.ends_with('\n') {
        new.push('\n');
    }
    new.push_str(&format!("{id}\n"));
    home::write_secure_atomic(path, new.as_bytes())?;
    Ok(true)
}

/// Removes every line naming `id`. Returns false when it was not there.
pub fn deny(path: &Path, id: &EndpointId) -> Result<bool, AllowFileError> {
    let path = &edit_target(path);
    if allow_file::regular_metadata(path)?.is_none() {
        return Ok(false);
    }
    let _lock = lock_for_edit(path)?;
    let text = allow_file::read_text(path)?;
    let mut removed = false;
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| match classify(l) {
            Line::Id(x) if x == *id => {
                removed = true;
                false
            }
            _ => true,
        })
        .collect();
    if !removed {
        return Ok(false);
    }
    let mut new = kept.join("\n");
    if !new.is_empty() {
        new.push('\n');
    }
    home::write_secure_atomic(path, new.as_bytes())?;
    Ok(true)
}

fn ensure_parent(path: &Path) -> Result<(), AllowFileError> {
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            crate::home::Home::new(dir.parent().unwrap_or(dir).to_path_buf()).ensure_iroh_dir()?;
        }
    }
    Ok(())
}

/// Bad lines reported one by one per reload; the rest are counted.
const BAD_LINES_REPORTED: usize = 5;

/// The allow file as the bridge sees it, live: `thunderbolt iroh allow` takes
/// effect for the next connection without a restart (see
/// [`thunderbolt_shared::allow_file`] for when it is re-read). Bad lines are
/// logged once per change, the first few by line number and then a count.
pub fn live(path: PathBuf) -> LiveAllowFile {
    let shown = path.display().to_string();
    LiveAllowFile::new(path, move |r| match r {
        Reload::Loaded(parsed) => {
            for bad in parsed.bad_lines.iter().take(BAD_LINES_REPORTED) {
                warn!("{shown}:{}: ignored: {}", bad.line_no, bad.error);
            }
            if parsed.bad_lines.len() > BAD_LINES_REPORTED {
                warn!(
                    "{shown}: {} more unparsable line(s) ignored (run `thunderbolt iroh list` to see them all)",
                    parsed.bad_lines.len() - BAD_LINES_REPORTED
                );
            }
        }
        Reload::Broken(e) => warn!("{e}; treating the manual allow list as empty"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u8) -> EndpointId {
        iroh::SecretKey::from_bytes(&[n; 32]).public()
    }

    #[test]
    fn allow_deny_keep_other_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("iroh").join("allowlist");
        assert!(allow(&path, &id(1)).unwrap());
        assert!(!allow(&path, &id(1)).unwrap());
        let mut text = fs::read_to_string(&path).unwrap();
        text.push_str("# keep me\n");
        fs::write(&path, &text).unwrap();
        assert!(allow(&path, &id(2)).unwrap());
        assert!(deny(&path, &id(1)).unwrap());
        assert!(!deny(&path, &id(1)).unwrap());
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("# keep me\n{}\n", id(2)));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn concurrent_edits_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("iroh").join("allowlist");
        std::thread::scope(|s| {
            for n in 0..32u8 {
                let path = &path;
                s.spawn(move || assert!(allow(path, &id(n)).unwrap()));
            }
        });
        let list = read(&path).unwrap();
        assert_eq!(list.ids.len(), 32, "every allow must land");
        std::thread::scope(|s| {
            for n in 0..16u8 {
                let path = &path;
                s.spawn(move || assert!(deny(path, &id(n)).unwrap()));
            }
        });
        let list = read(&path).unwrap();
        assert_eq!(list.ids.len(), 16);
        assert!((0..16).all(|n| !list.contains(&id(n))), "every deny must land");
    }

    #[test]
    fn symlinked_file_is_edited_at_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let iroh = dir.path().join("iroh");
        fs::create_dir_all(&iroh).unwrap();
        let target = dir.path().join("shared-allowlist");
        fs::write(&target, format!("{}\n", id(1))).unwrap();
        let link = iroh.join("allowlist");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(allow(&link, &id(2)).unwrap());
        assert!(deny(&link, &id(1)).unwrap());
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays a link");
        assert_eq!(fs::read_to_string(&target).unwrap(), format!("{}\n", id(2)));
    }

    #[test]
    fn a_fifo_is_refused_not_opened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("allowlist");
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: plain syscall on a path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("not a regular file") && e.contains("FIFO"), "{e}");
        assert!(allow(&path, &id(1)).is_err());
        let live = live(path);
        assert!(!live.contains(&id(1)), "fail closed");
    }

    #[test]
    fn live_file_sees_edits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("allowlist");
        let live = live(path.clone());
        assert!(!live.contains(&id(1)));
        fs::write(&path, format!("{}\n", id(1))).unwrap();
        assert!(live.contains(&id(1)));
        fs::write(&path, "").unwrap();
        assert!(!live.contains(&id(1)));
    }
}
