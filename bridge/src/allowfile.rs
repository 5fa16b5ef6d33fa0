//! The manual allow file: `$THUNDERBOLT_HOME/iroh/allowlist`.
//!
//! One NodeId per line; lines trimmed, blank lines ignored, duplicates collapse.
//! We also accept `#` comments, and report unparsable lines by number instead of
//! silently ignoring them (a typo must not look like a pairing that works).
//! Edits rewrite the file atomically at 0600 and keep comments and unknown lines.

use std::{
    fs, io,
    path::{Path, PathBuf},
    sync::Mutex,
};

use iroh::EndpointId;
use tracing::warn;

use crate::home::{self, HomeError};

use thunderbolt_shared::allowlist::{classify, Line};
pub use thunderbolt_shared::allowlist::{parse, Allowed};

#[derive(Debug, thiserror::Error)]
pub enum AllowFileError {
    #[error("cannot read allow file {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Home(#[from] HomeError),
}

fn read_text(path: &Path) -> Result<String, AllowFileError> {
    match fs::read(path) {
        Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Err(source) => Err(AllowFileError::Read { path: path.to_path_buf(), source }),
    }
}

/// Reads and parses the file; a missing file is an empty list.
pub fn read(path: &Path) -> Result<Allowed, AllowFileError> {
    read_text(path).map(|t| parse(&t))
}

/// Adds `id`. Returns false when it was already there (file untouched).
pub fn allow(path: &Path, id: &EndpointId) -> Result<bool, AllowFileError> {
    let text = read_text(path)?;
    if parse(&text).contains(id) {
        return Ok(false);
    }
    let mut new = text;
    if !new.is_empty() && !new.ends_with('\n') {
        new.push('\n');
    }
    new.push_str(&format!("{id}\n"));
    ensure_parent(path)?;
    home::write_secure_atomic(path, new.as_bytes())?;
    Ok(true)
}

/// Removes every line naming `id`. Returns false when it was not there.
pub fn deny(path: &Path, id: &EndpointId) -> Result<bool, AllowFileError> {
    let text = read_text(path)?;
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

/// Reads the allow file on every check, so `thunderbolt iroh allow` takes effect
/// for the next connection without a restart. Re-parses only when the content
/// changed, and warns about bad lines once per change rather than per peer.
#[derive(Debug)]
pub struct LiveAllowFile {
    path: PathBuf,
    cache: Mutex<Option<(String, Allowed)>>,
}

impl LiveAllowFile {
    pub fn new(path: PathBuf) -> Self {
        Self { path, cache: Mutex::new(None) }
    }

    /// The current list. On a read error, logs it and treats the file as empty
    /// (fail closed: an unreadable allow file admits nobody).
    pub fn current(&self) -> Allowed {
        let text = match read_text(&self.path) {
            Ok(t) => t,
            Err(e) => {
                warn!("{e}; treating the manual allow list as empty");
                return Allowed::default();
            }
        };
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((old, parsed)) = cache.as_ref() {
            if *old == text {
                return parsed.clone();
            }
        }
        let parsed = parse(&text);
        for bad in &parsed.bad_lines {
            warn!("{}:{}: ignored: {}", self.path.display(), bad.line_no, bad.error);
        }
        *cache = Some((text, parsed.clone()));
        parsed
    }

    pub fn contains(&self, id: &EndpointId) -> bool {
        self.current().contains(id)
    }
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
    fn live_file_sees_edits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("allowlist");
        let live = LiveAllowFile::new(path.clone());
        assert!(!live.contains(&id(1)));
        fs::write(&path, format!("{}\n", id(1))).unwrap();
        assert!(live.contains(&id(1)));
        fs::write(&path, "").unwrap();
        assert!(!live.contains(&id(1)));
    }
}
