//! Where files from devices land, and what each device holds.
//!
//! ```text
//! <home>/files/<agent>/<device>/<session>/<name>     a file that arrived whole
//! <home>/files/<agent>/<device>/.partial/<hash>      a transfer that was cut
//! ```
//!
//! An agent whose manifest names a `files` folder inside its workspace has a
//! store of its own there, the same below the agent level:
//! `<workspace>/<files>/<device>/<session>/<name>`.
//!
//! `<agent>` is a hosted agent's name (`_bridge` for the single agent),
//! `<device>` the device's endpoint id in hex, `<session>` the session id
//! the device named (`_` for none). Folders are 0700 and files 0600, every
//! folder is checked to be a folder (not a link planted to lead elsewhere),
//! files are opened without following a link, and a finished file is linked
//! into place under a name nothing holds yet, never over one.

use std::{
    fs::{self, File, OpenOptions},
    io,
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use iroh::EndpointId;
use thunderbolt_shared::files::BLOCK_SIZE;

use super::{MAX_BYTES_PER_DEVICE, MAX_FILES_PER_DEVICE, MAX_FILES_PER_SESSION};

const DIR_MODE: u32 = 0o700;
const FILE_MODE: u32 = 0o600;
/// The folder of a device's files that belong to no session.
const NO_SESSION: &str = "_";
/// The folder of a device's cut transfers.
const PARTIAL: &str = ".partial";
/// Longest session id a device may name (the bridge's are 8 to 32 characters).
const MAX_SESSION_ID: usize = 64;
/// Names tried for a file whose name is taken (`a (2).txt` … `a (99).txt`).
const MAX_NAME_TRIES: u32 = 99;

/// Why a put is refused before any byte is read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("too many files: {MAX_FILES_PER_SESSION} in one session, {MAX_FILES_PER_DEVICE} in all")]
    TooManyFiles,
    #[error("over the device's disk quota ({} GiB)", MAX_BYTES_PER_DEVICE >> 30)]
    Quota,
    #[error("the workstation's disk is full")]
    DiskFull,
    #[error("bad session id")]
    BadSession,
}

/// The files folder of a bridge's home, or one agent's in its workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Store {
    root: PathBuf,
    /// Where the check that no folder is a link starts: the root (the
    /// home's store), or the workspace holding one agent's store.
    base: PathBuf,
    /// One agent's store: no agent level under the root.
    one_agent: bool,
}

/// What a device holds on the workstation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub files: usize,
    pub bytes: u64,
}

impl Usage {
    pub fn plus(self, other: Usage) -> Usage {
        Usage { files: self.files + other.files, bytes: self.bytes.saturating_add(other.bytes) }
    }
}

impl Store {
    /// The store under `root` (`<home>/files`); nothing is created until a
    /// file arrives.
    pub fn new(root: PathBuf) -> Self {
        Self { base: root.clone(), root, one_agent: false }
    }

    /// One agent's store in `root`, a folder inside its `workspace` that its
    /// manifest names: devices' folders right under it. The workspace is the
    /// owner's choice (it may be a link); every folder below it is checked.
    pub fn for_one_agent(workspace: PathBuf, root: PathBuf) -> Self {
        Self { root, base: workspace, one_agent: true }
    }

    /// The folder holding an agent's devices' folders.
    fn agent_root(&self, agent: &str) -> PathBuf {
        if self.one_agent {
            self.root.clone()
        } else {
            self.root.join(agent)
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/<agent>/<device>`: everything `device` put at `agent`.
    pub fn device_dir(&self, agent: &str, device: &EndpointId) -> PathBuf {
        self.agent_root(agent).join(device.to_string())
    }

    /// The folder a put for `session` lands in.
    pub fn folder(
        &self,
        agent: &str,
        device: &EndpointId,
        session: Option<&str>,
    ) -> Result<PathBuf, Refusal> {
        let dir = match session {
            None => NO_SESSION,
            Some(s) if is_session_id(s) => s,
            Some(_) => return Err(Refusal::BadSession),
        };
        Ok(self.device_dir(agent, device).join(dir))
    }

    /// Where a cut transfer of `hash` by `device` is kept.
    pub fn partial_path(&self, agent: &str, device: &EndpointId, hash: &str) -> PathBuf {
        self.device_dir(agent, device).join(PARTIAL).join(hash)
    }

    /// Creates `dir` and the folders between it and the root (0700), each
    /// checked to be a folder and not a link: a link planted there could lead
    /// a file anywhere the bridge may write.
    pub fn ensure_dir(&self, dir: &Path) -> io::Result<()> {
        if !dir.starts_with(&self.root) {
            return Err(io::Error::other("not under the files folder"));
        }
        let rel = dir.strip_prefix(&self.base).map_err(|_| io::Error::other("not under the files folder"))?;
        let mut at = self.base.clone();
        if !self.one_agent {
            make_dir(&at)?;
        }
        for part in rel.components() {
            at.push(part);
            make_dir(&at)?;
        }
        Ok(())
    }

    /// What `device` holds here, across every agent: files and partial transfers.
    pub fn usage(&self, device: &EndpointId) -> Usage {
        let mut u = Usage::default();
        let agents: Vec<PathBuf> = if self.one_agent {
            vec![self.root.clone()]
        } else {
            let Ok(agents) = fs::read_dir(&self.root) else { return u };
            agents.flatten().map(|a| a.path()).collect()
        };
        let id = device.to_string();
        for agent in agents {
            let Ok(folders) = fs::read_dir(agent.join(&id)) else { continue };
            for folder in folders.flatten() {
                let is_partial = folder.file_name() == PARTIAL;
                let Ok(files) = fs::read_dir(folder.path()) else { continue };
                for f in files.flatten() {
                    let Ok(meta) = f.path().symlink_metadata() else { continue };
                    u.bytes += meta.len();
                    u.files += usize::from(!is_partial);
                }
            }
        }
        u
    }

    /// Whether a device holding `usage` (in every store) may start keeping
    /// `more` bytes in `folder`: its files and bytes, and the disk's free space.
    pub fn admit(&self, usage: Usage, folder: &Path, more: u64) -> Result<(), Refusal> {
        let in_folder = fs::read_dir(folder).map(|d| d.count()).unwrap_or(0);
        if in_folder >= MAX_FILES_PER_SESSION || usage.files >= MAX_FILES_PER_DEVICE {
            return Err(Refusal::TooManyFiles);
        }
        if usage.bytes.saturating_add(more) > MAX_BYTES_PER_DEVICE {
            return Err(Refusal::Quota);
        }
        let free = free_bytes(&self.root).or_else(|_| free_bytes(self.root.parent().unwrap_or(&self.root)));
        match free {
            Ok(free) if free >= more.saturating_add(super::DISK_RESERVE) => Ok(()),
            Ok(_) => Err(Refusal::DiskFull),
            // A disk that cannot say: a write that fails says it instead.
            Err(_) => Ok(()),
        }
    }

    /// Removes `device`'s folder for `session` at `agent` (the session is
    /// over); returns how many files went. A name that is not a session id,
    /// and a link where a folder belongs, are left alone.
    pub fn remove_session(&self, agent: &str, device: &EndpointId, session: &str) -> io::Result<usize> {
        if !is_session_id(session) {
            return Ok(0);
        }
        let device_dir = self.device_dir(agent, device);
        let folder = device_dir.join(session);
        let is_dir = |p: &Path| p.symlink_metadata().is_ok_and(|m| m.file_type().is_dir());
        if !is_dir(&device_dir) || !is_dir(&folder) {
            return Ok(0);
        }
        let removed = fs::read_dir(&folder).map(|d| d.count()).unwrap_or(0);
        // Links inside are removed, not followed.
        fs::remove_dir_all(&folder)?;
        Ok(removed)
    }
}

/// Whether `s` may name a session's folder.
pub fn is_session_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SESSION_ID && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

fn make_dir(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new().mode(DIR_MODE).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = dir.symlink_metadata()?;
            if meta.file_type().is_dir() {
                Ok(())
            } else {
                Err(io::Error::other(format!(
                    "{} is {}, not a folder",
                    dir.display(),
                    crate::home::file_kind(meta.file_type())
                )))
            }
        }
        Err(e) => Err(e),
    }
}

/// Opens (or creates, 0600) a partial transfer without following a link,
/// and says how much of it is usable: whole groups of [`BLOCK_SIZE`] (a
/// group cut mid-write is sent again), or all of it once it is `size`.
pub fn open_partial(path: &Path, size: u64) -> io::Result<(File, u64)> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.file_type().is_file() || meta.nlink() > 1 {
        return Err(io::Error::other(format!("{} is not a plain file", path.display())));
    }
    // `mode` applies only to a file this call created.
    if meta.mode() & 0o777 != FILE_MODE {
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(FILE_MODE))?;
    }
    let len = meta.len();
    let have = if len == size { size } else { (len.min(size) / BLOCK_SIZE) * BLOCK_SIZE };
    if have != len {
        f.set_len(have)?;
    }
    Ok((f, have))
}

/// Bytes a put writes before the kernel is asked to start putting them on
/// the disk: the sync before the receipt then waits for the last few
/// megabytes only, not the whole file (a 64 MiB put's sync took 36 ms at
/// the end, 4 ms this way: an eighth of the transfer's time on loopback).
pub const WRITEBACK_STEP: u64 = 8 << 20;

/// A partial file's writing to disk, started as it fills (Linux's
/// `sync_file_range`, which only starts the writing: the receipt still
/// waits for `sync_data`). Elsewhere it does nothing.
pub struct Writeback<'a> {
    file: &'a File,
    started: u64,
}

impl<'a> Writeback<'a> {
    /// For `file`, written from byte `from` on.
    pub fn new(file: &'a File, from: u64) -> Self {
        Self { file, started: from }
    }

    /// The file holds what arrived up to byte `at`.
    pub fn reached(&mut self, at: u64) {
        if at.saturating_sub(self.started) < WRITEBACK_STEP {
            return;
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let (from, len) = (self.started as libc::off64_t, (at - self.started) as libc::off64_t);
            // SAFETY: a plain call on a descriptor this borrow keeps open;
            // a failure only means the final sync does all the writing.
            unsafe { libc::sync_file_range(self.file.as_raw_fd(), from, len, libc::SYNC_FILE_RANGE_WRITE) };
        }
        self.started = at;
    }
}

/// Puts a finished transfer in `folder` as `name`, or as `name (2)`… when
/// a different file holds that name; the same content under that name is
/// kept as it is. Returns the file's path.
pub fn settle(partial: &Path, folder: &Path, name: &str, size: u64, hash: &str) -> io::Result<PathBuf> {
    for n in 1..=MAX_NAME_TRIES {
        let candidate = folder.join(numbered(name, n));
        match fs::hard_link(partial, &candidate) {
            Ok(()) => {
                fs::remove_file(partial)?;
                return Ok(candidate);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if same_content(&candidate, size, hash) {
                    fs::remove_file(partial)?;
                    return Ok(candidate);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(format!("{MAX_NAME_TRIES} files named like {name} already")))
}

/// A file already in `folder` under `name` (or a numbered name) with this
/// content: a put run again after it completed.
pub fn find_settled(folder: &Path, name: &str, size: u64, hash: &str) -> Option<PathBuf> {
    (1..=MAX_NAME_TRIES)
        .map(|n| folder.join(numbered(name, n)))
        .take_while(|p| p.symlink_metadata().is_ok())
        .find(|p| same_content(p, size, hash))
}

/// `name`, or `stem (n).ext` for n > 1.
fn numbered(name: &str, n: u32) -> String {
    if n == 1 {
        return name.to_string();
    }
    match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => format!("{stem} ({n}).{ext}"),
        _ => format!("{name} ({n})"),
    }
}

/// Whether `path` is a plain file (not a link) of `size` bytes hashing to `hash`.
fn same_content(path: &Path, size: u64, hash: &str) -> bool {
    let Ok(f) = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path) else {
        return false;
    };
    match f.metadata() {
        Ok(m) if m.file_type().is_file() && m.len() == size => {}
        _ => return false,
    }
    let mut hasher = blake3::Hasher::new();
    hasher.update_reader(f).is_ok() && hasher.finalize().to_hex().as_str() == hash
}

/// Free bytes for an unprivileged writer on the disk holding `path`.
fn free_bytes(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> EndpointId {
        iroh::SecretKey::from_bytes(&[7; 32]).public()
    }

    #[test]
    fn a_planted_link_is_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().join("files"));
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        // A link where a device's folder goes.
        let dev_dir = store.device_dir("_bridge", &device());
        fs::create_dir_all(dev_dir.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&outside, &dev_dir).unwrap();
        let folder = store.folder("_bridge", &device(), None).unwrap();
        assert!(store.ensure_dir(&folder).is_err());
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);

        // A link where a finished file would go: the file takes another name.
        fs::remove_file(&dev_dir).unwrap();
        store.ensure_dir(&folder).unwrap();
        let target = outside.join("authorized_keys");
        fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, folder.join("a.txt")).unwrap();
        let partial = store.partial_path("_bridge", &device(), "h");
        store.ensure_dir(partial.parent().unwrap()).unwrap();
        fs::write(&partial, b"new").unwrap();
        let hash = blake3::hash(b"new").to_hex().to_string();
        let placed = settle(&partial, &folder, "a.txt", 3, &hash).unwrap();
        assert_eq!(placed, folder.join("a (2).txt"));
        assert_eq!(fs::read(&target).unwrap(), b"keep");
        // Run again: the same content is found, not stored twice.
        assert_eq!(find_settled(&folder, "a.txt", 3, &hash), Some(placed));

        // A link where a partial goes: refused, not followed.
        std::os::unix::fs::symlink(&target, &partial).unwrap();
        assert!(open_partial(&partial, 10).is_err());
        assert_eq!(fs::read(&target).unwrap(), b"keep");
    }

    #[test]
    fn a_sessions_files_go_with_it_and_nothing_else_does() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().join("files"));
        let other = iroh::SecretKey::from_bytes(&[8; 32]).public();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("keep.txt"), b"keep").unwrap();
        for (dev, session) in
            [(device(), Some("s-1")), (other, Some("s-1")), (device(), Some("s-2")), (device(), None)]
        {
            let folder = store.folder("a", &dev, session).unwrap();
            store.ensure_dir(&folder).unwrap();
            fs::write(folder.join("f.txt"), b"x").unwrap();
        }
        // A link in the folder: removed, its target kept.
        let s1 = store.folder("a", &device(), Some("s-1")).unwrap();
        std::os::unix::fs::symlink(&outside, s1.join("link")).unwrap();
        assert_eq!(store.remove_session("a", &device(), "s-1").unwrap(), 2);
        assert!(!s1.exists());
        // Another device's folder of the same name is its own: it goes only
        // when that device was on the session.
        let others = store.folder("a", &other, Some("s-1")).unwrap();
        assert!(others.join("f.txt").exists());
        assert_eq!(store.remove_session("a", &other, "s-1").unwrap(), 1);
        assert!(!others.exists());
        assert!(store.folder("a", &device(), Some("s-2")).unwrap().join("f.txt").exists());
        assert!(store.folder("a", &device(), None).unwrap().join("f.txt").exists());
        assert_eq!(fs::read(outside.join("keep.txt")).unwrap(), b"keep");
        // Not a session id: nothing is touched; an agent with no files: nothing to do.
        assert_eq!(store.remove_session("a", &device(), "..").unwrap(), 0);
        assert_eq!(store.remove_session("a", &device(), "_").unwrap(), 0);
        assert_eq!(store.remove_session("b", &device(), "s-2").unwrap(), 0);
        // A link where the device's folder belongs is not gone through.
        let third = iroh::SecretKey::from_bytes(&[9; 32]).public();
        let planted = outside.join("s-2");
        fs::create_dir(&planted).unwrap();
        fs::write(planted.join("mine.txt"), b"mine").unwrap();
        std::os::unix::fs::symlink(&outside, store.device_dir("a", &third)).unwrap();
        assert_eq!(store.remove_session("a", &third, "s-2").unwrap(), 0);
        assert_eq!(fs::read(planted.join("mine.txt")).unwrap(), b"mine");
    }

    #[test]
    fn one_agents_store_in_its_workspace_checks_every_folder_below_it() {
        let tmp = tempfile::tempdir().unwrap();
        let work = tmp.path().join("work");
        fs::create_dir(&work).unwrap();
        let store = Store::for_one_agent(work.clone(), work.join("notes/inbox"));
        let folder = store.folder("ignored", &device(), Some("s-1")).unwrap();
        assert_eq!(folder, work.join("notes/inbox").join(device().to_string()).join("s-1"));
        store.ensure_dir(&folder).unwrap();
        fs::write(folder.join("f.txt"), b"abc").unwrap();
        assert_eq!(store.usage(&device()), Usage { files: 1, bytes: 3 });
        assert!(store.ensure_dir(&tmp.path().join("elsewhere")).is_err());
        // A link planted between the workspace and the folder: refused.
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let store2 = Store::for_one_agent(work.clone(), work.join("other/inbox"));
        std::os::unix::fs::symlink(&outside, work.join("other")).unwrap();
        assert!(store2.ensure_dir(&store2.folder("x", &device(), None).unwrap()).is_err());
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
        assert_eq!(store.remove_session("ignored", &device(), "s-1").unwrap(), 1);
        assert!(!folder.exists());
    }

    #[test]
    fn a_partial_resumes_at_a_whole_group() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("p");
        fs::write(&p, vec![1u8; BLOCK_SIZE as usize * 2 + 100]).unwrap();
        let (_, have) = open_partial(&p, BLOCK_SIZE * 10).unwrap();
        assert_eq!(have, BLOCK_SIZE * 2);
        assert_eq!(fs::metadata(&p).unwrap().len(), BLOCK_SIZE * 2);
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
    }

    #[test]
    fn numbered_names_keep_the_extension() {
        assert_eq!(numbered("a.txt", 2), "a (2).txt");
        assert_eq!(numbered("Makefile", 3), "Makefile (3)");
        assert_eq!(numbered("x.tar.gz", 2), "x.tar (2).gz");
        assert!(is_session_id("ab12cd34") && !is_session_id("../x") && !is_session_id(""));
    }
}
