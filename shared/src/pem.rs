//! PEM files, read the same way wherever we take them: the self-hosted relay's
//! certificate chain and key, and the extra CA clients trust for a relay
//! (`THUNDERBOLT_IROH_RELAY_CA`). Unix only (not in the browser build).

use std::path::{Path, PathBuf};

use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

/// Why a PEM file gave nothing usable. `what` names the file for the user.
/// Each message ends with its cause (`cause`), which is for that reason not
/// also the error's `source()`: the CLI prints an error with its chain
/// (`{:#}`), and a full disk would read `No space left on device` twice.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error("cannot read {what} {path}: {cause}")]
    Read { what: String, path: PathBuf, cause: rustls_pki_types::pem::Error },
    #[error("{what} {path}: no certificate in it")]
    NoCertificate { what: String, path: PathBuf },
}

/// Every certificate in the file (a chain or a CA bundle holds several); at
/// least one.
pub fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let read = |cause| PemError::Read { what: what.to_string(), path: path.to_path_buf(), cause };
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(path).map_err(read)?.collect::<Result<_, _>>().map_err(read)?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate { what: what.to_string(), path: path.to_path_buf() });
    }
    Ok(certs)
}

/// The first private key in the file.
pub fn private_key(path: &Path, what: &str) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_file(path).map_err(|cause| PemError::Read {
        what: what.to_string(),
        path: path.to_path_buf(),
        cause,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_file() {
        let dir = std::env::temp_dir().join(format!("tb-pem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        let e = certs(&missing, "THUNDERBOLT_IROH_RELAY_CA").unwrap_err().to_string();
        assert!(e.starts_with("cannot read THUNDERBOLT_IROH_RELAY_CA ") && e.contains("missing.pem"), "{e}");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not pem at all\n").unwrap();
        let e = certs(&empty, "certificate").unwrap_err().to_string();
        assert!(e.ends_with("no certificate in it"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
