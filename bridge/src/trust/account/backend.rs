//! The account backend's HTTP contract: register this bridge, fetch the
//! account's allowlist. Every call is bounded by the configured timeout, and
//! every status code the contract names maps to an error saying what to do.

use std::{collections::HashSet, time::Duration};

use iroh::EndpointId;
use thunderbolt_shared::{
    backend::{Allowlist, RegisterBridge},
    parse_node_id,
};
use tracing::warn;

use super::credential::{AuthScheme, Credential};

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
