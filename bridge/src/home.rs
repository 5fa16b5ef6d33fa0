//! Where thunderbolt keeps its state, and how secrets are written there.
//!
//! `$THUNDERBOLT_HOME` (default `~/.thunderbolt`) holds `iroh/identity`,
//! `iroh/identity-<protocol>` and `iroh/allowlist`. The `iroh` directory is
//! forced to 0700 and every file we write to 0600, because the identity is the
//! bridge's credential and the allow file decides who may run code here.

use std::{
    fs,
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use thunderbolt_shared::Protocol;

/// Mode for the state directory: only the owner may list or enter it.
pub const DIR_MODE: u32 = 0o700;
/// Mode for every file we write: only the owner may read it.
pub const FILE_MODE: u32 = 0o600;

/// Each message ends with its cause (`cause`), which is for that reason not
/// also the error's `source()`: the CLI prints an error with its chain
/// (`{:#}`), and a full disk would read `No space left on device` twice.
#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    #[error("cannot find the home directory: set THUNDERBOLT_HOME or HOME")]
    NoHome,
    #[error("cannot create directory {path}: {cause}")]
    CreateDir { path: PathBuf, cause: std::io::Error },
    #[error("cannot set permissions on {path}: {cause}")]
    Chmod { path: PathBuf, cause: std::io::Error },
    #[error("cannot write {path}: {cause}")]
    Write { path: PathBuf, cause: std::io::Error },
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// `THUNDERBOLT_HOME` if given (CLI flag or env, resolved by clap), else `~/.thunderbolt`.
    /// `--home`, else `$THUNDERBOLT_HOME`, else `~/.thunderbolt`.
    pub fn resolve(explicit: Option<PathBuf>) -> Result<Self, HomeError> {
        let from_env = std::env::var_os("THUNDERBOLT_HOME").map(PathBuf::from);
        if let Some(p) = explicit.or(from_env).filter(|p| !p.as_os_str().is_empty()) {
            return Ok(Self::new(p));
        }
        let home = std::env::var_os("HOME").filter(|h| !h.is_empty()).ok_or(HomeError::NoHome)?;
        Ok(Self::new(PathBuf::from(home).join(".thunderbolt")))
    }

    pub fn root_path(&self) -> &Path {
        &self.root
    }

    pub fn iroh_dir(&self) -> PathBuf {
        self.root.join("iroh")
    }

    pub fn identity_path(&self, protocol: &Protocol) -> PathBuf {
        self.iroh_dir().join(protocol.identity_file_name())
    }

    pub fn allowlist_path(&self) -> PathBuf {
        self.iroh_dir().join("allowlist")
    }

    /// Files devices put on the workstation: `files/` ([`crate::files::store`]).
    pub fn files_dir(&self) -> PathBuf {
        self.root.join("files")
    }

    /// The host's agent manifests: `agents.d/*.json`.
    pub fn agents_dir(&self) -> PathBuf {
        self.root.join("agents.d")
    }

    /// Creates `iroh/` (and the home above it) if missing and forces it to 0700.
    pub fn ensure_iroh_dir(&self) -> Result<PathBuf, HomeError> {
        let dir = self.iroh_dir();
        fs::create_dir_all(&dir).map_err(|cause| HomeError::CreateDir { path: dir.clone(), cause })?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(DIR_MODE))
            .map_err(|cause| HomeError::Chmod { path: dir.clone(), cause })?;
        Ok(dir)
    }
}

/// An exclusive lock serializing edits of a file across processes (a sidecar
/// `.<name>.lock` beside it), held until dropped: concurrent `iroh allow`
/// runs, a pairing the bridge records, never lose one another's change.
pub struct EditLock(#[allow(dead_code)] fs::File);

impl EditLock {
    /// Takes the lock for `path`, waiting for another editor to finish.
    pub fn take(path: &Path) -> std::io::Result<Self> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .open(dir.join(format!(".{name}.lock")))?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor we own; blocks until the other editor is done.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self(f))
    }
}

/// Reads `path` as JSON (`T::default()` when it does not exist), lets `edit`
/// change it, and writes it back atomically at 0600, all under the file's
/// [`EditLock`]. Returns what `edit` returned.
pub fn edit_json<T, R>(path: &Path, edit: impl FnOnce(&mut T) -> R) -> std::io::Result<R>
where
    T: serde::de::DeserializeOwned + serde::Serialize + Default,
{
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let _lock = EditLock::take(path)?;
    let mut value = read_json(path)?;
    let out = edit(&mut value);
    let text = serde_json::to_vec_pretty(&value).map_err(std::io::Error::other)?;
    write_secure_atomic(path, &text).map_err(std::io::Error::other)?;
    Ok(out)
}

/// Reads `path` as JSON; `T::default()` when it does not exist. A file that
/// exists but does not parse is an error naming it (never silently replaced).
pub fn read_json<T: serde::de::DeserializeOwned + Default>(path: &Path) -> std::io::Result<T> {
    match fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} is not valid: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
        Err(e) => Err(e),
    }
}

/// Forces a file to 0600 (we do this on every load: a key copied with `cp`
/// from another machine often arrives world-readable).
/// A change is logged (once: the next load finds 0600), so a user who made the
/// file readable on purpose learns why it is not any more.
pub fn force_file_mode(path: &Path) -> Result<(), HomeError> {
    let chmod_err = |cause| HomeError::Chmod { path: path.to_path_buf(), cause };
    let mode = fs::metadata(path).map_err(chmod_err)?.permissions().mode() & 0o7777;
    if mode == FILE_MODE {
        return Ok(());
    }
    fs::set_permissions(path, fs::Permissions::from_mode(FILE_MODE)).map_err(chmod_err)?;
    tracing::warn!(
        "{} was mode {mode:04o}; set to {FILE_MODE:04o} (it holds a secret: only you may read it)",
        path.display()
    );
    Ok(())
}

/// Replaces `path` with `contents` atomically: written to a 0600 temporary file
/// in the same directory, synced, then renamed over the target. A crash leaves
/// either the old file or the new one, never a torn mix.
pub fn write_secure_atomic(path: &Path, contents: &[u8]) -> Result<(), HomeError> {
    let err = |cause| HomeError::Write { path: path.to_path_buf(), cause };
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f =
            fs::OpenOptions::new().write(true).create(true).truncate(true).mode(FILE_MODE).open(&tmp)?;
        // `mode` only applies on creation; a leftover temp file keeps its old bits.
        f.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
        f.write_all(contents)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(err)
}

/// Creates `path` with `contents` only if it does not exist yet (0600). Used for
/// the identity so two bridges starting at once cannot overwrite each other's key.
pub fn create_new_secure(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    create_new_with(path, |f| {
        f.write_all(contents)?;
        f.sync_all()
    })
}

/// Creates `path` (0600) and fills it with `fill`. A file that could not be
/// filled (a full disk) is removed: left empty or torn, it would read as a
/// corrupt key at the next start, which is never replaced.
fn create_new_with(
    path: &Path,
    fill: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(FILE_MODE).open(path)?;
    let filled = fill(&mut f);
    if filled.is_err() {
        drop(f);
        let _ = fs::remove_file(path);
    }
    filled
}

/// What a file that is not a regular one is, for a refusal or a reason in
/// the log (manifests, journals).
pub fn file_kind(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO (named pipe)"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else {
        "a special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().join("h"));
        let iroh = home.ensure_iroh_dir().unwrap();
        assert_eq!(fs::metadata(&iroh).unwrap().permissions().mode() & 0o777, DIR_MODE);
        let p = home.allowlist_path();
        write_secure_atomic(&p, b"x\n").unwrap();
        write_secure_atomic(&p, b"y\n").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"y\n");
        assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, FILE_MODE);
        // No temp files left behind.
        assert_eq!(fs::read_dir(&iroh).unwrap().count(), 1);
    }

    #[test]
    fn a_new_file_that_could_not_be_filled_is_not_left_behind() {
        const ENOSPC: i32 = 28;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("identity");
        let r = create_new_with(&p, |f| {
            f.write_all(b"12")?;
            Err(std::io::Error::from_raw_os_error(ENOSPC))
        });
        assert_eq!(r.unwrap_err().raw_os_error(), Some(ENOSPC));
        assert!(!p.exists(), "a torn key would be refused at every start");
        create_new_secure(&p, b"k\n").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"k\n");
        assert_eq!(create_new_secure(&p, b"x").unwrap_err().kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&p).unwrap(), b"k\n", "an existing file is never touched");
    }

    #[test]
    fn a_full_disk_is_said_once() {
        const ENOSPC: i32 = 28;
        let e = HomeError::Write {
            path: "/h/iroh/allowlist".into(),
            cause: std::io::Error::from_raw_os_error(ENOSPC),
        };
        let text = format!("{:#}", anyhow::Error::from(e).context("cannot allow the peer"));
        assert_eq!(text.matches("No space left on device").count(), 1, "{text}");
        assert!(
            text.starts_with("cannot allow the peer: cannot write /h/iroh/allowlist: No space"),
            "{text}"
        );
    }
}
