//! The Web Push methods of the bridge's own (`_thunderbolt/push/*`, listed in
//! [`crate::serve::extension`]), answered for the session's device: the
//! VAPID key, subscribing and unsubscribing its push endpoints.

use std::{future::Future, pin::Pin, sync::Arc};

use iroh::EndpointId;
use serde_json::{json, Value};
use tracing::{debug, info, warn};

use super::{
    push::{AddError, Subscription, Vapid, MAX_ENDPOINT},
    Notifier,
};
use crate::serve::{
    extension::{METHOD_PUSH_KEY, METHOD_PUSH_SUBSCRIBE, METHOD_PUSH_UNSUBSCRIBE},
    taps::{MethodResult, Methods},
};

/// JSON-RPC's "invalid params".
const INVALID: i64 = -32602;
/// JSON-RPC's "internal error".
const FAILED: i64 = -32603;
/// A server error (JSON-RPC's -32000 to -32099): the bridge is full.
const FULL: i64 = -32001;

/// The push methods of a bridge whose Web Push is on.
pub struct PushMethods {
    notifier: Arc<Notifier>,
    vapid: Arc<Vapid>,
}

impl PushMethods {
    /// `None` with Web Push off: the methods are then answered "method not found".
    pub fn of(notifier: &Arc<Notifier>) -> Option<Self> {
        Some(Self { notifier: notifier.clone(), vapid: notifier.vapid.clone()? })
    }

    async fn handle(&self, peer: EndpointId, method: &str, params: Value) -> MethodResult {
        let subs = self.notifier.subscriptions.clone();
        let short = peer.fmt_short().to_string();
        match method {
            METHOD_PUSH_KEY => Ok(json!({"applicationServerKey": self.vapid.public_b64()})),
            METHOD_PUSH_SUBSCRIBE => {
                let sub = Subscription::from_json(&params, self.notifier.policy)
                    .map_err(|e| (INVALID, e.to_string()))?;
                let origin = sub.origin();
                match subs.add(&peer, sub).await {
                    Ok(()) => {
                        info!(peer = %short, "push subscription registered (push service {origin})");
                        Ok(json!({"subscribed": true}))
                    }
                    Err(e @ AddError::Full) => {
                        warn!(peer = %short, "push subscription refused: {e}");
                        Err((FULL, e.to_string()))
                    }
                    Err(e @ AddError::Save(_)) => {
                        let why = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
                        warn!(peer = %short, "could not save a push subscription: {why}");
                        Err((FAILED, e.to_string()))
                    }
                }
            }
            _ => {
                let endpoint = params["endpoint"]
                    .as_str()
                    .ok_or_else(|| (INVALID, "params.endpoint (a string) is required".to_string()))?;
                if endpoint.len() > MAX_ENDPOINT {
                    // Never stored: nothing to remove.
                    return Ok(json!({"removed": true}));
                }
                // Stored endpoints are normalised URLs.
                let endpoint =
                    reqwest::Url::parse(endpoint).map(|u| u.to_string()).unwrap_or(endpoint.to_string());
                // The same answer whatever was there: whether a push service
                // said it is gone is not the device's to learn here.
                match subs.remove(&peer, &endpoint).await {
                    Ok(()) => {
                        debug!(peer = %short, "push subscription removed by its device");
                        Ok(json!({"removed": true}))
                    }
                    Err(e) => {
                        warn!(peer = %short, "could not save the push subscriptions: {e}");
                        Err((FAILED, "the bridge could not update its subscriptions".to_string()))
                    }
                }
            }
        }
    }
}

impl Methods for PushMethods {
    fn knows(&self, method: &str) -> bool {
        [METHOD_PUSH_KEY, METHOD_PUSH_SUBSCRIBE, METHOD_PUSH_UNSUBSCRIBE].contains(&method)
    }

    fn call<'a>(
        &'a self,
        device: EndpointId,
        method: &'a str,
        params: Value,
    ) -> Pin<Box<dyn Future<Output = MethodResult> + Send + 'a>> {
        Box::pin(self.handle(device, method, params))
    }
}
