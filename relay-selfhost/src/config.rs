//! The operator's `relay.toml`, strict: an unknown key or a bad value stops the
//! relay at start with the key and the reason (a typo in an access setting must
//! never silently open the relay to everyone).
//!
//! Key names follow iroh-relay's own config where they exist, so an operator's
//! existing file mostly carries over; `access.allow_file` is ours.

use std::{net::SocketAddr, path::PathBuf};

use iroh_base::EndpointId;
use serde::Deserialize;

/// Plain http: the captive-portal probe, and the relay itself when TLS is off.
pub const DEFAULT_HTTP_BIND: &str = "[::]:80";
/// https relay.
pub const DEFAULT_HTTPS_BIND: &str = "[::]:443";
/// QUIC address discovery (iroh's default port).
pub const DEFAULT_QUIC_BIND: &str = "[::]:7842";
/// Metrics, loopback only unless the operator says otherwise.
pub const DEFAULT_METRICS_BIND: &str = "127.0.0.1:9090";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Serve the relay protocol (turning it off leaves only QUIC address discovery).
    #[serde(default = "yes")]
    pub enable_relay: bool,
    pub http_bind_addr: Option<SocketAddr>,
    pub tls: Option<Tls>,
    /// Answer QUIC address discovery probes (needs `[tls]`; UDP port `quic_bind_addr`).
    #[serde(default)]
    pub enable_quic_addr_discovery: bool,
    pub limits: Option<Limits>,
    #[serde(default)]
    pub enable_metrics: bool,
    pub metrics_bind_addr: Option<SocketAddr>,
    pub key_cache_capacity: Option<usize>,
    #[serde(default)]
    pub access: AccessConfig,
    /// Also serve the phone app from this directory (its `www/` and `pkg/`)
    /// under `/app/`, so the relay's https origin is the app's origin too.
    pub app_dir: Option<PathBuf>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub enum CertMode {
    Manual,
    LetsEncrypt,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    pub https_bind_addr: Option<SocketAddr>,
    pub quic_bind_addr: Option<SocketAddr>,
    /// The relay's DNS name(s); the first is the one clients use.
    #[serde(deserialize_with = "one_or_many")]
    pub hostname: Vec<String>,
    pub cert_mode: CertMode,
    /// LetsEncrypt: where certificates and the account key are cached.
    pub cert_dir: Option<PathBuf>,
    /// Manual: PEM certificate chain.
    pub manual_cert_path: Option<PathBuf>,
    /// Manual: PEM private key.
    pub manual_key_path: Option<PathBuf>,
    /// LetsEncrypt: production (true) or staging directory.
    #[serde(default = "yes")]
    pub prod_tls: bool,
    /// LetsEncrypt: contact e-mail for the ACME account.
    pub contact: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub accept_conn_limit: Option<f64>,
    pub accept_conn_burst: Option<usize>,
    pub client: Option<ClientLimits>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientLimits {
    pub rx: Option<RateLimit>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub bytes_per_second: Option<u32>,
    pub max_burst_bytes: Option<u32>,
}

/// Who may use the relay.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AccessConfig {
    /// Anyone (the relay only forwards encrypted packets, but pays their bandwidth).
    #[default]
    Everyone,
    /// Clients presenting one of these tokens (`?token=` on the relay URL, or
    /// `Authorization: Bearer`).
    SharedToken(Vec<String>),
    /// Only NodeIds in this thunderbolt allow file (reloaded when it changes).
    AllowFile(PathBuf),
    /// Only these NodeIds.
    Allowlist(Vec<EndpointId>),
    /// Everyone but these NodeIds.
    Denylist(Vec<EndpointId>),
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// A config that cannot be used, with the key it is about.
/// Each message ends with its cause (`cause`), which is for that reason not
/// also the error's `source()`: the CLI prints an error with its chain
/// (`{:#}`), and a full disk would read `No space left on device` twice.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {cause}")]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: `{key}`: {reason}")]
    Invalid { path: PathBuf, key: &'static str, reason: String },
}

impl Config {
    /// Reads and validates the file.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|cause| ConfigError::Read { path: path.into(), cause })?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &std::path::Path) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: e.to_string().trim().to_string(),
        })?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    fn validate(&self, path: &std::path::Path) -> Result<(), ConfigError> {
        let bad = |key: &'static str, reason: &str| {
            Err(ConfigError::Invalid { path: path.into(), key, reason: reason.to_string() })
        };
        if self.enable_quic_addr_discovery && self.tls.is_none() {
            return bad("enable_quic_addr_discovery", "needs a [tls] section (QUIC always uses TLS)");
        }
        if !self.enable_relay && !self.enable_quic_addr_discovery {
            return bad("enable_relay", "with QUIC address discovery also off there is nothing to serve");
        }
        if let Some(tls) = &self.tls {
            if tls.hostname.is_empty() || tls.hostname.iter().any(|h| h.trim().is_empty()) {
                return bad("tls.hostname", "must name the relay's DNS name");
            }
            match tls.cert_mode {
                CertMode::Manual => {
                    for (key, p) in [
                        ("tls.manual_cert_path", &tls.manual_cert_path),
                        ("tls.manual_key_path", &tls.manual_key_path),
                    ] {
                        match p {
                            None => return bad(key, "required with cert_mode = \"Manual\""),
                            Some(p) if !p.is_file() => {
                                return bad(key, &format!("{} does not exist or is not a file", p.display()))
                            }
                            _ => {}
                        }
                    }
                }
                CertMode::LetsEncrypt => {
                    if tls.contact.as_deref().is_none_or(|c| !c.contains('@')) {
                        return bad("tls.contact", "LetsEncrypt needs a contact e-mail address");
                    }
                    if tls.cert_dir.is_none() {
                        return bad("tls.cert_dir", "LetsEncrypt needs a directory to cache certificates in");
                    }
                }
            }
        }
        if let Some(rx) = self.limits.as_ref().and_then(|l| l.client.as_ref()).and_then(|c| c.rx.as_ref()) {
            if rx.bytes_per_second == Some(0) {
                return bad("limits.client.rx.bytes_per_second", "must be above zero");
            }
            if rx.max_burst_bytes.is_some() && rx.bytes_per_second.is_none() {
                return bad("limits.client.rx.max_burst_bytes", "needs bytes_per_second too");
            }
        }
        if let Some(dir) = &self.app_dir {
            if !self.enable_relay {
                return bad("app_dir", "is served by the relay's listener: needs enable_relay = true");
            }
            if !dir.join("www/index.html").is_file() {
                return bad(
                    "app_dir",
                    &format!(
                        "{} has no www/index.html (give the directory holding www/ and pkg/)",
                        dir.display()
                    ),
                );
            }
            if self.tls.as_ref().is_some_and(|t| t.cert_mode == CertMode::LetsEncrypt) {
                // iroh-relay keeps its ACME acceptor private, and the app's routes
                // need a listener of our own (see app_relay.rs).
                return bad("app_dir", "needs cert_mode = \"Manual\" (LetsEncrypt cannot serve the app yet)");
            }
        }
        match &self.access {
            AccessConfig::SharedToken(tokens) if tokens.is_empty() => {
                return bad("access.shared_token", "needs at least one token")
            }
            AccessConfig::SharedToken(tokens) if tokens.iter().any(|t| t.trim().is_empty()) => {
                return bad("access.shared_token", "tokens must not be empty")
            }
            AccessConfig::AllowFile(p) if !p.is_file() => {
                return bad("access.allow_file", &format!("{} does not exist or is not a file", p.display()))
            }
            AccessConfig::Allowlist(ids) if ids.is_empty() => {
                return bad("access.allowlist", "an empty allowlist would refuse everyone")
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(s, Path::new("relay.toml"))
    }

    #[test]
    fn minimal_and_access_forms() {
        let c = parse("http_bind_addr = \"127.0.0.1:3340\"\n").unwrap();
        assert_eq!(c.access, AccessConfig::Everyone);
        let c = parse("access = \"everyone\"\n").unwrap();
        assert_eq!(c.access, AccessConfig::Everyone);
        let c = parse("[access]\nshared_token = [\"a\", \"b\"]\n").unwrap();
        assert_eq!(c.access, AccessConfig::SharedToken(vec!["a".into(), "b".into()]));
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let e = parse("http_bind_adr = \"127.0.0.1:1\"\n").unwrap_err().to_string();
        assert!(e.contains("http_bind_adr"), "{e}");
        let e = parse("http_bind_addr = \"not an address\"\n").unwrap_err().to_string();
        assert!(e.contains("http_bind_addr"), "{e}");
        let e = parse("[access]\nshared_tokens = [\"a\"]\n").unwrap_err().to_string();
        assert!(e.contains("shared_tokens"), "{e}");
        let e = parse("[access]\nshared_token = []\n").unwrap_err().to_string();
        assert!(e.contains("access.shared_token"), "{e}");
        let e = parse("enable_quic_addr_discovery = true\n").unwrap_err().to_string();
        assert!(e.contains("enable_quic_addr_discovery"), "{e}");
        let e = parse("[tls]\nhostname = \"r.example\"\ncert_mode = \"Manual\"\n").unwrap_err().to_string();
        assert!(e.contains("tls.manual_cert_path"), "{e}");
        let e =
            parse("[tls]\nhostname = \"r.example\"\ncert_mode = \"Sometimes\"\n").unwrap_err().to_string();
        assert!(e.contains("cert_mode") || e.contains("Sometimes"), "{e}");
        let e = parse("[limits.client.rx]\nbytes_per_second = 0\n").unwrap_err().to_string();
        assert!(e.contains("bytes_per_second"), "{e}");
        let e = parse("app_dir = \"/nonexistent/app\"\n").unwrap_err().to_string();
        assert!(e.contains("app_dir") && e.contains("www/index.html"), "{e}");
    }

    #[test]
    fn app_dir_needs_a_manual_certificate() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("www")).unwrap();
        std::fs::write(t.path().join("www/index.html"), "<html>").unwrap();
        let dir = t.path().display().to_string();
        let c = parse(&format!("app_dir = {dir:?}\n")).unwrap();
        assert_eq!(c.app_dir.as_deref(), Some(t.path()));
        let e = parse(&format!(
            "app_dir = {dir:?}\n[tls]\nhostname = \"r.example\"\ncert_mode = \"LetsEncrypt\"\n\
             contact = \"a@b.c\"\ncert_dir = {dir:?}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("app_dir") && e.contains("Manual"), "{e}");
    }
}
