//! A Unix socket that one process of a home owns (the control API's, the
//! reach socket): an exclusive lock on a file beside it says who, and holds
//! that process's pid for the next one to name. The lock goes with the
//! process however it ends, so a crashed owner's socket is simply replaced.

use std::{
    fs,
    io::{self, Read, Seek, Write},
    os::{
        fd::AsRawFd,
        unix::fs::{OpenOptionsExt, PermissionsExt},
    },
    path::{Path, PathBuf},
};

use tokio::net::UnixListener;
use tracing::debug;

/// The socket, bound and 0600, held for the process's life.
#[derive(Debug)]
pub struct Owned {
    pub listener: UnixListener,
    pub path: PathBuf,
    _lock: fs::File,
}

/// Who has the socket.
#[derive(Debug)]
pub enum Taken {
    Ours(Owned),
    /// Another process: its pid as it wrote it (empty when unknown).
    Held {
        pid: String,
    },
}

/// `e`, saying what was done to which file.
fn named(what: &str, file: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", file.display()))
}

/// Takes `lock_file`'s exclusive lock, writes our pid into it, then binds
/// `path` (whatever is there is a crashed owner's leftover) as 0600.
pub fn take(lock_file: &Path, path: PathBuf) -> io::Result<Taken> {
    let mut lock = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(lock_file)
        .map_err(|e| named("cannot open", lock_file, e))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut pid = String::new();
        let _ = lock.read_to_string(&mut pid);
        return Ok(Taken::Held { pid: pid.trim().to_string() });
    }
    // Our pid, for the next one to name (a full disk says so here, with the file).
    (|| {
        lock.set_len(0)?;
        lock.rewind()?;
        write!(lock, "{}", std::process::id())
    })()
    .map_err(|e| named("cannot write", lock_file, e))?;
    if fs::symlink_metadata(&path).is_ok() {
        debug!("replacing the stale {}", path.display());
        fs::remove_file(&path).map_err(|e| named("cannot remove the stale", &path, e))?;
    }
    let listener = UnixListener::bind(&path).map_err(|e| named("cannot listen on", &path, e))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
        .map_err(|e| named("cannot make private (0600)", &path, e))?;
    Ok(Taken::Ours(Owned { listener, path, _lock: lock }))
}
