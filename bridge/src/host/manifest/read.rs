//! Reading a manifest file off the disk: what kind of file it is, who owns
//! it, how large it is, and only then its content. Separate from parsing
//! because these checks are about the file (anyone who can write the folder
//! may have put anything at a name), not about what the JSON says.

use std::{os::unix::fs::MetadataExt, os::unix::fs::PermissionsExt, path::Path};

use super::{parse, refuse, AgentSpec, Machine, Refused, MAX_MANIFEST_BYTES};

/// Reads and checks one manifest file (its permissions included).
pub fn load(path: &Path, machine: &Machine) -> Result<AgentSpec, Refused> {
    load_file(path, machine).map_err(|e| match e {
        NotLoaded::Refused(why) => why,
        NotLoaded::Unreadable(e) => Refused(format!("cannot read it: {e}")),
    })
}

/// Why a manifest file did not load.
#[derive(Debug)]
pub enum NotLoaded {
    /// The file itself is refused: its kind, owner, mode, size or content.
    Refused(Refused),
    /// It could not be read now (out of descriptors, a permission taken away
    /// for a moment): nothing is known of its content. Not for a file that is
    /// gone (that is refused: it describes no agent any more).
    Unreadable(std::io::Error),
}

impl From<Refused> for NotLoaded {
    fn from(r: Refused) -> Self {
        NotLoaded::Refused(r)
    }
}

fn not_regular(kind: &str) -> Refused {
    Refused(format!(
        "not a regular file but {kind}: a manifest must be a plain file (not a link, a pipe or a \
         directory); it was not read"
    ))
}

/// [`load`], telling a file that could not be read now from a refused one.
///
/// Anything in the folder may have been put there by whoever can write it, so
/// the file is looked at (`lstat`) before it is opened, and what was opened is
/// checked again (`fstat`) before it is read: a FIFO (whose plain open waits
/// for a writer forever, and stopped `thunderbolt host` from starting), a
/// symbolic link, a device or a directory is refused without being read. The
/// open itself neither follows a link (`O_NOFOLLOW`) nor waits (`O_NONBLOCK`),
/// should the name be swapped between the look and the open.
pub fn load_file(path: &Path, machine: &Machine) -> Result<AgentSpec, NotLoaded> {
    use std::{io::Read, os::unix::fs::OpenOptionsExt};
    let io_error = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::NotFound {
            NotLoaded::Refused(Refused(format!("cannot read it: {e}")))
        } else {
            NotLoaded::Unreadable(e)
        }
    };
    let seen = std::fs::symlink_metadata(path).map_err(io_error)?;
    if !seen.file_type().is_file() {
        return Err(not_regular(crate::home::file_kind(seen.file_type())).into());
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // O_NOFOLLOW: the name became a link after it was looked at.
            Some(libc::ELOOP) => not_regular("a symbolic link").into(),
            _ => io_error(e),
        })?;
    let meta = file.metadata().map_err(NotLoaded::Unreadable)?;
    if !meta.file_type().is_file() {
        return Err(not_regular(crate::home::file_kind(meta.file_type())).into());
    }
    check_owner(&meta, machine, "it")?;
    let too_large = |len: String| {
        NotLoaded::Refused(Refused(format!(
            "{len} bytes: larger than any manifest ({MAX_MANIFEST_BYTES} at most)"
        )))
    };
    if meta.len() > MAX_MANIFEST_BYTES {
        return Err(too_large(meta.len().to_string()));
    }
    let mut text = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut text).map_err(NotLoaded::Unreadable)?;
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        // It grew while being read.
        return Err(too_large(format!("more than {MAX_MANIFEST_BYTES}")));
    }
    let mut spec = parse(&text, path, machine)?;
    let mode = meta.permissions().mode() & 0o777;
    if !spec.env.is_empty() && mode & 0o044 != 0 {
        spec.warnings.push(format!(
            "{} sets env values and is readable by others (mode {mode:04o}): if they are secrets, \
             chmod 600 it",
            path.display()
        ));
    }
    Ok(spec)
}

/// A manifest (or the folder holding them) must be owned by you and writable
/// by nobody else: whoever can write it chooses what runs as you.
pub fn check_owner(meta: &std::fs::Metadata, machine: &Machine, what: &str) -> Result<(), Refused> {
    if meta.uid() != machine.uid {
        return refuse(format!(
            "{what} is owned by uid {}, not by you (uid {}): a manifest says what runs as you",
            meta.uid(),
            machine.uid
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        let who = if mode & 0o002 != 0 { "others" } else { "its group" };
        return refuse(format!(
            "{what} is writable by {who} (mode {mode:04o}): whoever can write it chooses what runs as \
             you; chmod go-w it"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::host::manifest::test_support::with_program;

    #[test]
    fn only_a_regular_file_is_read_and_too_large_is_refused_unread() {
        let (dir, m) = with_program();
        let good = dir.path().join("good.json");
        std::fs::write(&good, r#"{"name":"a","command":["my-agent"]}"#).unwrap();
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load(&good, &m).unwrap().name, "a");
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let fifo = dir.path().join("fifo.json");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a plain syscall on a NUL-terminated path of ours.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let sub = dir.path().join("dir.json");
        std::fs::create_dir(&sub).unwrap();
        for (path, kind) in [(&link, "a symbolic link"), (&fifo, "a FIFO"), (&sub, "a directory")] {
            match load_file(path, &m) {
                Err(NotLoaded::Refused(why)) => {
                    assert!(why.0.contains(&format!("not a regular file but {kind}")), "{why}")
                }
                other => panic!("{}: {other:?}", path.display()),
            }
        }
        let big = dir.path().join("big.json");
        std::fs::write(&big, vec![b' '; MAX_MANIFEST_BYTES as usize + 1]).unwrap();
        std::fs::set_permissions(&big, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load(&big, &m).unwrap_err().0.contains("larger than any manifest"));
        // Gone is refused (it describes no agent any more), not "cannot read it now".
        assert!(matches!(load_file(&dir.path().join("none.json"), &m), Err(NotLoaded::Refused(_))));
    }
}
