//! The account credential: from the environment (`THUNDERBOLT_TOKEN` with
//! `THUNDERBOLT_CLOUD_URL`, sent as `x-api-key`) or the file `thunderbolt
//! login` stores (a session token, sent as `Authorization: Bearer`).

use std::{net::IpAddr, path::PathBuf};

use crate::home::{self, Home};

/// Where `thunderbolt login` stores the credential, inside `$THUNDERBOLT_HOME`.
pub const CREDENTIAL_FILE: &str = "credentials.json";

/// How a credential is presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthScheme {
    /// `x-api-key: <token>` (a personal access token from `THUNDERBOLT_TOKEN`).
    ApiKey,
    /// `Authorization: Bearer <token>` (a stored session token).
    Bearer,
}

/// A backend credential. The token is never printed (Debug masks it).
#[derive(Clone)]
pub struct Credential {
    pub base: reqwest::Url,
    pub(super) token: String,
    pub scheme: AuthScheme,
    pub source: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("base", &self.base.as_str())
            .field("token", &"***")
            .field("scheme", &self.scheme)
            .field("source", &self.source)
            .finish()
    }
}

/// The stored credential file.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredCredential {
    cloud_url: String,
    token: String,
}

/// A message ends with its `cause`, which is not also `source()` (printed as a
/// chain it would read twice: see `HomeError`).
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("{0}")]
    Invalid(String),
    #[error("cannot read {path}: {cause}")]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("{path} is not a valid credential file ({why}); run `thunderbolt login` again")]
    Corrupt { path: PathBuf, why: String },
    #[error(transparent)]
    Home(#[from] home::HomeError),
}

pub(crate) fn is_loopback_host(url: &reqwest::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// Parses and vets a backend base URL: https, or plain http only to loopback
/// (a credential must never cross a network in the clear).
pub fn parse_base_url(raw: &str) -> Result<reqwest::Url, CredentialError> {
    let raw = raw.trim();
    let mut url = reqwest::Url::parse(raw)
        .map_err(|e| CredentialError::Invalid(format!("invalid cloud URL '{raw}': {e}")))?;
    match url.scheme() {
        "https" => {}
        "http" if is_loopback_host(&url) => {}
        "http" => {
            return Err(CredentialError::Invalid(format!(
                "refusing to send the credential over plain http to {}: use https (http is only \
                 allowed for a loopback backend)",
                url.host_str().unwrap_or("?")
            )))
        }
        s => {
            return Err(CredentialError::Invalid(format!(
                "invalid cloud URL '{raw}': scheme {s} is not https"
            )))
        }
    }
    // Join relative paths onto the base: it must end in '/'.
    if !url.path().ends_with('/') {
        let p = format!("{}/", url.path());
        url.set_path(&p);
    }
    Ok(url)
}

/// The environment and stored file, resolved into a credential (if any).
pub fn load_credential(
    home: &Home,
    env_token: Option<String>,
    env_url: Option<String>,
) -> Result<Option<Credential>, CredentialError> {
    let env_token = env_token.filter(|t| !t.trim().is_empty());
    let env_url = env_url.filter(|u| !u.trim().is_empty());
    match (env_token, env_url) {
        (Some(token), Some(url)) => {
            return Ok(Some(Credential {
                base: parse_base_url(&url)?,
                token: token.trim().to_string(),
                scheme: AuthScheme::ApiKey,
                source: "THUNDERBOLT_TOKEN".into(),
            }))
        }
        (Some(_), None) => {
            return Err(CredentialError::Invalid(
                "THUNDERBOLT_TOKEN is set but THUNDERBOLT_CLOUD_URL is not: set both".into(),
            ))
        }
        _ => {}
    }
    let path = credential_path(home);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(cause) => return Err(CredentialError::Read { path, cause }),
    };
    home::force_file_mode(&path)?;
    let stored: StoredCredential = serde_json::from_slice(&bytes)
        .map_err(|e| CredentialError::Corrupt { path: path.clone(), why: e.to_string() })?;
    Ok(Some(Credential {
        base: parse_base_url(&stored.cloud_url)?,
        token: stored.token,
        scheme: AuthScheme::Bearer,
        source: path.display().to_string(),
    }))
}

pub fn credential_path(home: &Home) -> PathBuf {
    home.root_path().join(CREDENTIAL_FILE)
}

/// `thunderbolt login`: stores the credential (0600, atomically).
pub fn store_credential(home: &Home, cloud_url: &str, token: &str) -> Result<PathBuf, CredentialError> {
    let base = parse_base_url(cloud_url)?;
    if token.trim().is_empty() {
        return Err(CredentialError::Invalid("the token is empty".into()));
    }
    home.ensure_iroh_dir()?;
    let path = credential_path(home);
    let body = serde_json::to_vec_pretty(&StoredCredential {
        cloud_url: base.as_str().trim_end_matches('/').to_string(),
        token: token.trim().to_string(),
    })
    .expect("serializable");
    home::write_secure_atomic(&path, &body)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_to_loopback() {
        assert!(parse_base_url("https://api.example.com/v1").is_ok());
        assert!(parse_base_url("http://127.0.0.1:8080/v1").is_ok());
        assert!(parse_base_url("http://localhost/v1").is_ok());
        assert!(parse_base_url("http://[::1]:9/v1").is_ok());
        let e = parse_base_url("http://api.example.com/v1").unwrap_err().to_string();
        assert!(e.contains("plain http"), "{e}");
        assert!(parse_base_url("ftp://x/v1").is_err());
        assert_eq!(
            parse_base_url("https://a.example/v1").unwrap().join("devices/bridge").unwrap().as_str(),
            "https://a.example/v1/devices/bridge"
        );
    }

    #[test]
    fn credential_debug_masks_token() {
        let c = Credential {
            base: parse_base_url("https://a.example/v1").unwrap(),
            token: "tok-SECRET".into(),
            scheme: AuthScheme::ApiKey,
            source: "env".into(),
        };
        assert!(!format!("{c:?}").contains("SECRET"));
    }
}
