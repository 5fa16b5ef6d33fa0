//! Which relays the endpoint uses (`THUNDERBOLT_IROH_RELAY_URL`), and how we
//! speak to one of ours.

use anyhow::{bail, Context, Result};
use iroh::{RelayMode, RelayUrl};

/// Which relays to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Relays {
    /// n0's public relays.
    Default,
    /// Direct addresses only.
    Disabled,
    /// Only these.
    Custom(Vec<RelayUrl>),
}

impl Relays {
    /// Parses `THUNDERBOLT_IROH_RELAY_URL`: unset/`default`, `disabled`, or comma-separated URLs.
    pub fn parse(value: Option<&str>) -> Result<Self> {
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(Self::Default);
        };
        match v {
            "default" => return Ok(Self::Default),
            "disabled" | "off" | "none" => return Ok(Self::Disabled),
            _ => {}
        }
        let mut urls = Vec::new();
        for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let url: RelayUrl = part
                .parse()
                .with_context(|| format!("invalid relay URL '{part}' in THUNDERBOLT_IROH_RELAY_URL"))?;
            if !matches!(url.scheme(), "http" | "https") {
                bail!("invalid relay URL '{part}': scheme must be http or https");
            }
            urls.push(url);
        }
        if urls.is_empty() {
            bail!("THUNDERBOLT_IROH_RELAY_URL has no URL in it");
        }
        Ok(Self::Custom(urls))
    }

    pub(super) fn mode(&self) -> RelayMode {
        match self {
            Self::Default => iroh::endpoint::default_relay_mode(),
            Self::Disabled => RelayMode::Disabled,
            Self::Custom(urls) => RelayMode::Custom(urls.iter().cloned().map(relay_config).collect()),
        }
    }

    /// The relay URLs a peer could reach us through (for offline tickets).
    pub fn urls(&self) -> Vec<RelayUrl> {
        self.mode().relay_map().urls::<Vec<_>>()
    }
}

/// How we speak to a relay of ours. QUIC address discovery (a UDP probe to
/// the relay, iroh's default) only for an `https` relay: QUIC always uses
/// TLS, so a plain `http` relay cannot answer it, and iroh's report of which
/// relay is nearest waits 3 s for the unanswered probe each time it runs,
/// which is when a relay died and another must become home (issue 59).
fn relay_config(url: RelayUrl) -> iroh::RelayConfig {
    let https = url.scheme() == "https";
    let mut cfg = iroh::RelayConfig::from(url);
    if !https {
        cfg.quic = None;
    }
    cfg
}

impl Relays {
    /// The one relay of ours, when exactly one is configured: a browser
    /// reaches the bridge through it alone (said in the banner).
    pub fn only_one(&self) -> Option<&RelayUrl> {
        match self {
            Relays::Custom(urls) if urls.len() == 1 => urls.first(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_setting_forms() {
        assert_eq!(Relays::parse(None).unwrap(), Relays::Default);
        assert_eq!(Relays::parse(Some("disabled")).unwrap(), Relays::Disabled);
        let r = Relays::parse(Some("https://a.example, http://127.0.0.1:3340")).unwrap();
        let Relays::Custom(urls) = &r else { panic!("{r:?}") };
        assert_eq!(urls.len(), 2);
        assert_eq!(r.urls().len(), 2);
        let e = Relays::parse(Some("https://a.example,ftp://b")).unwrap_err().to_string();
        assert!(e.contains("ftp://b"), "{e}");
        assert!(Relays::parse(Some(" , ")).is_err());
    }
}
