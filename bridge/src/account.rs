//! Account trust: the devices of the account this bridge is logged in to are
//! admitted without `iroh allow`.
//!
//! Present only when a credential exists: `THUNDERBOLT_TOKEN` (a personal access
//! token, sent as `x-api-key`) with `THUNDERBOLT_CLOUD_URL`, or the credential
//! stored by `thunderbolt login` (a session token, sent as `Authorization:
//! Bearer`). At start the bridge registers itself (`POST {base}/devices/bridge`)
//! and primes the allowlist (`GET {base}/devices/allowlist`); the heartbeat
//! refreshes it. No failure here ever stops the bridge: account trust is
//! switched off (or keeps its last good list) with a log line saying why, and
//! the manual allow file keeps working.

use std::{collections::HashSet, net::IpAddr, path::PathBuf, sync::RwLock, time::Duration};

use iroh::EndpointId;
use thunderbolt_shared::{
    backend::{Allowlist, RegisterBridge},
    parse_node_id,
};
use tracing::{info, warn};

use crate::{
    home::{self, Home},
    trust::{Grant, TrustPolicy},
};

/// Every backend call gives up after this: the heartbeat must never stall on a
/// hung backend, and 10 s is far above a healthy round trip.
pub const BACKEND_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the allowlist is refreshed and open sessions re-checked. Bounds how
/// long a revoked device keeps its session.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(45);

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
    token: String,
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

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("{0}")]
    Invalid(String),
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a valid credential file ({why}); run `thunderbolt login` again")]
    Corrupt { path: PathBuf, why: String },
    #[error(transparent)]
    Home(#[from] home::HomeError),
}

fn is_loopback_host(url: &reqwest::Url) -> bool {
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
        Err(source) => return Err(CredentialError::Read { path, source }),
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

/// What a backend call can end in. Each names what the user should do.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(
        "this bridge's device was revoked on the account (409); remove it in Settings → Devices \
         to pair it again. Manual allow (`thunderbolt iroh allow`) still works"
    )]
    Revoked,
    #[error(
        "the account refused this bridge (403: device revoked or not permitted); manual allow still works"
    )]
    Forbidden,
    #[error("the account's device limit is reached (422); remove an unused device in Settings → Devices")]
    DeviceLimit,
    #[error("the credential was rejected (401); run `thunderbolt login` again or check THUNDERBOLT_TOKEN")]
    Unauthorized,
    #[error("the backend failed ({0}); will retry at the next heartbeat")]
    Server(u16),
    #[error("the backend answered with unexpected status {0}")]
    Status(u16),
    #[error("the backend did not answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot reach the backend: {0}")]
    Network(String),
    #[error("the backend sent malformed JSON: {0}")]
    Malformed(String),
}

fn status_error(status: u16) -> BackendError {
    match status {
        401 => BackendError::Unauthorized,
        403 => BackendError::Forbidden,
        409 => BackendError::Revoked,
        422 => BackendError::DeviceLimit,
        500..=599 => BackendError::Server(status),
        s => BackendError::Status(s),
    }
}

fn net_error(e: reqwest::Error, timeout: Duration) -> BackendError {
    if e.is_timeout() {
        BackendError::Timeout(timeout)
    } else {
        // Walk the chain for the useful part ("connection refused", DNS, TLS).
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg = format!("{msg}: {s}");
            src = s.source();
        }
        BackendError::Network(msg)
    }
}

/// The account backend's two calls.
#[derive(Debug, Clone)]
pub struct Backend {
    http: reqwest::Client,
    cred: Credential,
    /// Every call's bound, for the error that says it ran out.
    timeout: Duration,
}

impl Backend {
    pub fn new(cred: Credential, timeout: Duration) -> Result<Self, BackendError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            // A redirect could take the credential somewhere else; the contract has none.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("thunderbolt-iroh/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| BackendError::Network(e.to_string()))?;
        Ok(Self { http, cred, timeout })
    }

    pub fn base(&self) -> &reqwest::Url {
        &self.cred.base
    }

    fn url(&self, path: &str) -> reqwest::Url {
        self.cred.base.join(path).expect("static relative path")
    }

    fn auth(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self.cred.scheme {
            AuthScheme::ApiKey => rb.header("x-api-key", &self.cred.token),
            AuthScheme::Bearer => rb.bearer_auth(&self.cred.token),
        }
    }

    /// `POST {base}/devices/bridge`.
    pub async fn register(&self, node_id: &EndpointId, name: &str) -> Result<(), BackendError> {
        let body = RegisterBridge { node_id: node_id.to_string(), name: name.to_string() };
        let resp = self
            .auth(self.http.post(self.url("devices/bridge")))
            .json(&body)
            .send()
            .await
            .map_err(|e| net_error(e, self.timeout))?;
        let status = resp.status().as_u16();
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(status_error(status))
        }
    }

    /// `GET {base}/devices/allowlist` → the NodeIds (null and unparsable ones skipped).
    pub async fn allowlist(&self) -> Result<HashSet<EndpointId>, BackendError> {
        let resp = self
            .auth(self.http.get(self.url("devices/allowlist")))
            .send()
            .await
            .map_err(|e| net_error(e, self.timeout))?;
        let status = resp.status().as_u16();
        if !resp.status().is_success() {
            return Err(status_error(status));
        }
        let bytes = resp.bytes().await.map_err(|e| net_error(e, self.timeout))?;
        let list: Allowlist =
            serde_json::from_slice(&bytes).map_err(|e| BackendError::Malformed(e.to_string()))?;
        let mut ids = HashSet::new();
        for entry in list.node_ids {
            let Some(raw) = entry.node_id else { continue };
            match parse_node_id(&raw) {
                Ok(id) => {
                    ids.insert(id);
                }
                Err(e) => warn!("account allowlist: skipping an entry: {e}"),
            }
        }
        Ok(ids)
    }
}

/// The account layer of trust, as the bridge sees it right now.
#[derive(Debug)]
pub struct AccountTrust {
    state: RwLock<AccountState>,
}

#[derive(Debug, Clone)]
struct AccountState {
    enabled: bool,
    ids: HashSet<EndpointId>,
    /// For the banner and logs: why it is on or off.
    status: String,
}

impl AccountTrust {
    pub fn off(why: impl Into<String>) -> Self {
        Self { state: RwLock::new(AccountState { enabled: false, ids: HashSet::new(), status: why.into() }) }
    }

    pub fn is_enabled(&self) -> bool {
        self.state.read().unwrap_or_else(|p| p.into_inner()).enabled
    }

    pub fn status(&self) -> String {
        let s = self.state.read().unwrap_or_else(|p| p.into_inner());
        if s.enabled {
            format!("on ({}, {} device(s) listed)", s.status, s.ids.len())
        } else {
            format!("off ({})", s.status)
        }
    }

    fn set(&self, f: impl FnOnce(&mut AccountState)) {
        f(&mut self.state.write().unwrap_or_else(|p| p.into_inner()));
    }

    pub fn enable(&self, status: String) {
        self.set(|s| {
            s.enabled = true;
            s.status = status;
        });
    }

    pub fn disable(&self, why: String) {
        self.set(|s| {
            s.enabled = false;
            s.ids.clear();
            s.status = why;
        });
    }

    /// Applies a freshly fetched list. Returns false when the list shows this
    /// bridge was revoked (a non-empty list without our own NodeId): account
    /// trust is then switched off.
    pub fn apply(&self, own: &EndpointId, ids: HashSet<EndpointId>) -> bool {
        if !ids.is_empty() && !ids.contains(own) {
            self.disable("this device was revoked on the account (its NodeId left the account list)".into());
            return false;
        }
        self.set(|s| s.ids = ids);
        true
    }
}

impl TrustPolicy for AccountTrust {
    fn check(&self, peer: &EndpointId) -> Option<Grant> {
        let s = self.state.read().unwrap_or_else(|p| p.into_inner());
        (s.enabled && s.ids.contains(peer)).then_some(Grant::Account)
    }
}

/// The account side of a running bridge: the backend and the trust it feeds.
#[derive(Debug)]
pub struct Account {
    pub backend: Backend,
    pub trust: std::sync::Arc<AccountTrust>,
    pub own: EndpointId,
}

impl Account {
    /// Registers the bridge and primes the list. Never fails: problems switch
    /// account trust off (registration) or leave the list empty until the next
    /// heartbeat (the first fetch), each with a log line.
    pub async fn start(backend: Backend, own: EndpointId, name: &str) -> Self {
        let trust = std::sync::Arc::new(AccountTrust::off("starting"));
        let base = backend.base().to_string();
        match backend.register(&own, name).await {
            Ok(()) => {
                info!("registered this bridge with the account at {base} as '{name}'");
                trust.enable(format!("account at {base}"));
            }
            Err(e) => {
                warn!("account trust is off for this run: registering the bridge failed: {e}");
                trust.disable(format!("registration failed: {e}"));
                return Self { backend, trust, own };
            }
        }
        let me = Self { backend, trust, own };
        me.refresh().await;
        me
    }

    /// One heartbeat refresh. A failure keeps the last good list.
    pub async fn refresh(&self) {
        if !self.trust.is_enabled() {
            return;
        }
        match self.backend.allowlist().await {
            Ok(ids) => {
                let n = ids.len();
                if self.trust.apply(&self.own, ids) {
                    tracing::debug!("account allowlist refreshed: {n} device(s)");
                } else {
                    warn!(
                        "this bridge is no longer on its account's device list: it was revoked. \
                         Account trust is off; account sessions are being closed; peers in the \
                         manual allow file keep working"
                    );
                }
            }
            Err(e) => warn!("account allowlist refresh failed, keeping the last good list: {e}"),
        }
    }
}

/// The name the bridge registers under: the hostname, else "Bridge".
pub fn device_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buffer and length are valid; gethostname NUL-terminates within it on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let name = String::from_utf8_lossy(&buf[..end]).trim().to_string();
        if !name.is_empty() {
            return name;
        }
    }
    "Bridge".to_string()
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
    fn self_revocation() {
        let me = iroh::SecretKey::from_bytes(&[1; 32]).public();
        let peer = iroh::SecretKey::from_bytes(&[2; 32]).public();
        let t = AccountTrust::off("x");
        t.enable("on".into());
        assert!(t.apply(&me, [me, peer].into()));
        assert_eq!(t.check(&peer), Some(Grant::Account));
        // An empty list is not a revocation (new account, or a backend hiccup).
        assert!(t.apply(&me, HashSet::new()));
        assert!(t.is_enabled());
        assert!(t.apply(&me, [me, peer].into()));
        assert!(!t.apply(&me, [peer].into()));
        assert!(!t.is_enabled());
        assert_eq!(t.check(&peer), None);
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
