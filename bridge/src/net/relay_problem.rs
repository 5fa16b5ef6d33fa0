//! Why a relay is not reached (or refused this device), in words a person
//! can act on.

use std::time::Duration;

use iroh::{Endpoint, RelayUrl, Watcher};

use super::{NetConfig, Relays};

/// Why the home relay is not connected, in words (its cause first), if it
/// is not (and relays are configured at all). When iroh has nothing to say
/// (no relay chosen yet, no error recorded: how a relay with an untrusted
/// certificate looks from outside), the relays are asked over HTTPS
/// ourselves, so the cause is still named.
pub async fn relay_problem(ep: &Endpoint, net: &NetConfig) -> Option<String> {
    if net.relays == Relays::Disabled {
        return None;
    }
    if let Some(s) = ep.home_relay_status().get().first() {
        if s.is_connected() {
            return None;
        }
        if let Some(r) = s.auth_denied_reason() {
            return Some(format!("{} refused this device: {r}", s.url()));
        }
        if let Some(e) = s.last_error() {
            return Some(format!("{} {}", s.url(), describe_relay_failure(&format!("{e:#}"))));
        }
    }
    let probes = net.relays.urls().into_iter().map(|url| async move {
        let why = probe_relay(&url, &net.relay_ca).await;
        format!("{url} {why}")
    });
    Some(futures::future::join_all(probes).await.join("; "))
}

/// How long asking a silent relay ourselves may take.
const RELAY_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// One HTTPS request to `url`, trusting what the endpoint trusts: the cause
/// (certificate, refused, no such name, no answer) when it fails.
async fn probe_relay(url: &RelayUrl, ca: &[rustls_pki_types::CertificateDer<'static>]) -> String {
    let mut b = reqwest::Client::builder()
        .timeout(RELAY_PROBE_TIMEOUT)
        .connect_timeout(RELAY_PROBE_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none());
    for c in ca {
        if let Ok(cert) = reqwest::Certificate::from_der(c) {
            b = b.add_root_certificate(cert);
        }
    }
    let client = match b.build() {
        Ok(c) => c,
        Err(e) => return format!("did not answer (and could not be asked: {e})"),
    };
    match client.get(url.as_str()).send().await {
        Ok(r) => format!("answers over HTTP ({}), but no relay connection was made yet", r.status()),
        Err(e) => {
            // The URL leads the line already: reqwest's own words would say it again.
            let e = e.without_url();
            let mut chain = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                // A wrapper that quotes its cause already: the cause once.
                let text = s.to_string();
                if !chain.contains(&text) {
                    chain.push_str(&format!(": {text}"));
                }
                source = s.source();
            }
            if e.is_timeout() && !chain.contains("timed out") {
                chain.push_str(": timed out");
            }
            describe_relay_failure(&chain)
        }
    }
}

/// The home relay's refusal of this endpoint (its access list), in words.
pub fn relay_refusal(ep: &Endpoint) -> Option<String> {
    ep.home_relay_status().get().iter().find_map(|s| {
        s.auth_denied_reason().map(|r| format!("the relay {} refused this device: {r}", s.url()))
    })
}

/// Resolves once the home relay has refused this endpoint (never, if it does
/// not): a dial that only the relay could carry need not wait for its timeout.
pub async fn relay_denied(ep: &Endpoint) {
    use iroh::Watcher;
    let mut w = ep.home_relay_status();
    loop {
        if w.get().iter().any(|s| s.auth_denied_reason().is_some()) {
            return;
        }
        if w.updated().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// A relay failure in words a person can act on: the certificate, a refusal,
/// or the network, first; iroh's own chain after.
pub fn describe_relay_failure(chain: &str) -> String {
    let lower = chain.to_ascii_lowercase();
    let cause = if lower.contains("unknownissuer")
        || lower.contains("unknown issuer")
        || lower.contains("certificate")
    {
        "its TLS certificate is not trusted (a private CA? give it with THUNDERBOLT_IROH_RELAY_CA)"
    } else if lower.contains("connection refused") {
        "nothing listens there (connection refused)"
    } else if lower.contains("dns") || lower.contains("resolve") || lower.contains("lookup") {
        "its name does not resolve"
    } else if lower.contains("timed out") || lower.contains("timeout") {
        "no answer (timed out)"
    } else if lower.contains("401")
        || lower.contains("403")
        || lower.contains("denied")
        || lower.contains("unauthorized")
    {
        "the relay refused this endpoint (its access list)"
    } else {
        ""
    };
    if cause.is_empty() {
        chain.to_string()
    } else {
        format!("{cause} ({chain})")
    }
}
