//! The bridge's persistent identity: one ed25519 secret key per protocol.
//!
//! The key is the NodeId every pairing was made with, so losing it silently
//! would break all of them. Hence: created once (exclusively, 0600), loaded with
//! its mode forced back to 0600, and a file that exists but does not parse is an
//! error naming the path — never replaced.

use std::{fs, io, path::PathBuf};

use iroh::SecretKey;
use thunderbolt_shared::Protocol;

use crate::home::{self, Home, HomeError};

/// Length of the key in the file: 32 bytes as lowercase hex.
const KEY_HEX_LEN: usize = 64;

/// A message ends with its `cause`, which is not also `source()` (printed as a
/// chain it would read twice: see `HomeError`).
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(transparent)]
    Home(#[from] HomeError),
    #[error("cannot read identity {path}: {cause}")]
    Read { path: PathBuf, cause: io::Error },
    #[error(
        "identity file {path} is corrupt ({why}); refusing to replace it because that would \
         change this bridge's NodeId and break every pairing. Restore it from a backup, or \
         move it away to start over with a new identity"
    )]
    Corrupt { path: PathBuf, why: String },
    #[error("cannot create identity {path}: {cause}")]
    Create { path: PathBuf, cause: io::Error },
}

/// Whether the identity was just created (the banner says so: peers must re-pair).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Loaded,
    Created,
}

/// Loads the protocol's identity, creating it on first use.
pub fn load_or_create(home: &Home, protocol: &Protocol) -> Result<(SecretKey, Origin), IdentityError> {
    load_or_create_named(home, &protocol.identity_file_name())
}

/// Loads the identity in `$THUNDERBOLT_HOME/iroh/<file_name>`, creating it on
/// first use (a hosted agent's own, `identity-agent-<name>`, or a protocol's).
pub fn load_or_create_named(home: &Home, file_name: &str) -> Result<(SecretKey, Origin), IdentityError> {
    home.ensure_iroh_dir()?;
    let path = home.iroh_dir().join(file_name);
    match load_path(&path)? {
        Some(key) => Ok((key, Origin::Loaded)),
        None => {
            let key = SecretKey::generate();
            let text = format!("{}\n", hex::encode(key.to_bytes()));
            match home::create_new_secure(&path, text.as_bytes()) {
                Ok(()) => Ok((key, Origin::Created)),
                // Another process created it between our read and our create: use theirs.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let key = load_path(&path)?.ok_or_else(|| IdentityError::Read {
                        path: path.clone(),
                        cause: io::Error::new(io::ErrorKind::NotFound, "vanished while reading"),
                    })?;
                    Ok((key, Origin::Loaded))
                }
                Err(cause) => Err(IdentityError::Create { path, cause }),
            }
        }
    }
}

/// Loads the protocol's identity if it exists (forcing its mode to 0600).
pub fn load(home: &Home, protocol: &Protocol) -> Result<Option<SecretKey>, IdentityError> {
    load_path(&home.identity_path(protocol))
}

fn load_path(path: &std::path::Path) -> Result<Option<SecretKey>, IdentityError> {
    let path = path.to_path_buf();
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(cause) => return Err(IdentityError::Read { path, cause }),
    };
    home::force_file_mode(&path)?;
    parse_key(&bytes).map(Some).map_err(|why| IdentityError::Corrupt { path, why })
}

/// Parses the file content: 64 hex chars, one trailing newline tolerated.
fn parse_key(bytes: &[u8]) -> Result<SecretKey, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not text".to_string())?;
    let text = text.strip_suffix('\n').unwrap_or(text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    if text.len() != KEY_HEX_LEN {
        return Err(format!("expected {KEY_HEX_LEN} hex characters, found {}", text.len()));
    }
    let raw = hex::decode(text).map_err(|_| "not hex".to_string())?;
    let arr: [u8; 32] = raw.try_into().map_err(|_| "wrong length".to_string())?;
    Ok(SecretKey::from_bytes(&arr))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn create_then_load_same_key_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().to_path_buf());
        let (k1, o1) = load_or_create(&home, &Protocol::acp()).unwrap();
        let (k2, o2) = load_or_create(&home, &Protocol::acp()).unwrap();
        assert_eq!((o1, o2), (Origin::Created, Origin::Loaded));
        assert_eq!(k1.public(), k2.public());
        let p = home.identity_path(&Protocol::acp());
        let text = fs::read_to_string(&p).unwrap();
        assert_eq!(text.len(), 65);
        assert!(text.trim_end().chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        load_or_create(&home, &Protocol::acp()).unwrap();
        assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        let (m, _) = load_or_create(&home, &Protocol::mcp()).unwrap();
        assert_ne!(m.public(), k1.public());
    }

    #[test]
    fn corrupt_identity_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::new(dir.path().to_path_buf());
        home.ensure_iroh_dir().unwrap();
        let p = home.identity_path(&Protocol::acp());
        fs::write(&p, "not a key\n").unwrap();
        let err = load_or_create(&home, &Protocol::acp()).unwrap_err();
        assert!(matches!(err, IdentityError::Corrupt { .. }));
        assert!(err.to_string().contains(&p.display().to_string()));
        assert_eq!(fs::read_to_string(&p).unwrap(), "not a key\n");
    }
}
