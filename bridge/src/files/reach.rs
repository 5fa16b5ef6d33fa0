//! Which files a device may get: a file inside the agent's workspace (the
//! folder it runs in) or inside the device's own files folder, resolved with
//! every link followed and then checked to still be inside (a link out of
//! them is refused), never a secret's place, and opened without following a
//! link that appeared since.

use std::{
    fs::{File, OpenOptions},
    io,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Component, Path, PathBuf},
};

/// Folders that hold keys and tokens: refused even inside a workspace (an
/// agent run from the home folder has all of them inside it). The agent
/// itself can read them; a paired device asking for them is not the agent.
const SECRET_PLACES: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".thunderbolt",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".password-store",
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".env",
];

/// Why a get is refused.
#[derive(Debug, thiserror::Error)]
pub enum Unreachable {
    #[error("outside the agent's workspace")]
    Outside,
    #[error("no such file")]
    NotFound,
}

/// A file a device may read, open.
#[derive(Debug)]
pub struct Reached {
    pub file: File,
    pub path: PathBuf,
    pub size: u64,
}

/// Opens `asked` if it lies inside one of `roots` once every link is
/// resolved, names no secret's place, and is a plain file; `bridge_home` (the
/// bridge's own folder) is refused unless `asked` is inside a root within it
/// (the device's files folder).
pub fn open(asked: &Path, roots: &[PathBuf], bridge_home: &Path) -> Result<Reached, Unreachable> {
    if !asked.is_absolute() || asked.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(Unreachable::Outside);
    }
    let real = asked.canonicalize().map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => Unreachable::NotFound,
        _ => Unreachable::Outside,
    })?;
    let home = bridge_home.canonicalize().unwrap_or_else(|_| bridge_home.to_path_buf());
    let inside = roots.iter().filter_map(|r| r.canonicalize().ok()).any(|root| {
        let Ok(rel) = real.strip_prefix(&root) else { return false };
        let in_home_but_not_a_files_root = real.starts_with(&home) && !root.starts_with(&home);
        !in_home_but_not_a_files_root && !rel.components().any(|c| is_secret(c.as_os_str()))
    });
    if !inside {
        return Err(Unreachable::Outside);
    }
    // `real` has no link in it; one that appears there now is not followed.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&real)
        .map_err(|_| Unreachable::NotFound)?;
    let meta = file.metadata().map_err(|_| Unreachable::NotFound)?;
    let now = real.symlink_metadata().map_err(|_| Unreachable::NotFound)?;
    if !meta.file_type().is_file() || (meta.dev(), meta.ino()) != (now.dev(), now.ino()) {
        return Err(Unreachable::NotFound);
    }
    Ok(Reached { file, size: meta.len(), path: real })
}

fn is_secret(part: &std::ffi::OsStr) -> bool {
    let part = part.to_string_lossy();
    SECRET_PLACES.iter().any(|s| part == *s || part.starts_with(&format!("{s}.")))
        || part.starts_with("id_rsa")
        || part.starts_with("id_ed25519")
        || part.starts_with("id_ecdsa")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_inside_and_never_a_secret() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        let work = home.join("project");
        let tb = home.join(".thunderbolt");
        let mine = tb.join("files/_bridge/dev");
        for d in [&work, &mine, &home.join(".ssh")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(work.join("report.md"), b"hi").unwrap();
        std::fs::write(mine.join("photo.jpg"), b"jpg").unwrap();
        std::fs::write(home.join(".ssh/id_ed25519"), b"secret").unwrap();
        std::fs::write(tb.join("allowlist"), b"x").unwrap();
        std::fs::write(home.join("notes.txt"), b"x").unwrap();
        std::os::unix::fs::symlink(home.join("notes.txt"), work.join("out")).unwrap();
        std::os::unix::fs::symlink(work.join("report.md"), work.join("in")).unwrap();

        let roots = [work.clone(), mine.clone()];
        assert_eq!(open(&work.join("report.md"), &roots, &tb).unwrap().size, 2);
        assert_eq!(open(&mine.join("photo.jpg"), &roots, &tb).unwrap().size, 3);
        assert!(open(&work.join("in"), &roots, &tb).is_ok(), "a link that stays inside");
        for bad in [
            work.join("out"),
            home.join(".ssh/id_ed25519"),
            tb.join("allowlist"),
            work.join("../notes.txt"),
            PathBuf::from("/etc/passwd"),
        ] {
            assert!(matches!(open(&bad, &roots, &tb), Err(Unreachable::Outside)), "{}", bad.display());
        }
        assert!(matches!(open(&work.join("nope"), &roots, &tb), Err(Unreachable::NotFound)));
        assert!(matches!(open(&work, &roots, &tb), Err(Unreachable::NotFound)), "a folder");

        // An agent run from the home folder: its keys stay out of reach.
        let roots = [home.clone()];
        assert!(open(&home.join("notes.txt"), &roots, &tb).is_ok());
        assert!(matches!(open(&home.join(".ssh/id_ed25519"), &roots, &tb), Err(Unreachable::Outside)));
        assert!(matches!(open(&tb.join("allowlist"), &roots, &tb), Err(Unreachable::Outside)));
    }
}
