//! `iroh/push.json`: the subscriptions as stored, and the one edit made to
//! the file without a running bridge (`thunderbolt iroh deny` forgetting a
//! revoked device's). Separate from the in-memory registry because the file
//! is shared by the bridges of one home and outlives any of them.

use std::path::PathBuf;

use iroh::EndpointId;
use serde::{Deserialize, Serialize};

use super::Subscription;
use crate::home::{self, Home};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Stored {
    pub(super) node_id: String,
    #[serde(flatten)]
    pub(super) sub: Subscription,
    pub(super) added_ms: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct File {
    pub(super) subscriptions: Vec<Stored>,
}

/// The home's subscription file (`iroh/push.json`, 0600) as a file: what
/// `thunderbolt iroh deny` edits when it removes a device. A running bridge
/// holds its own in memory ([`Registry`](super::Registry)) and writes through to it.
#[derive(Debug, Clone)]
pub struct Subscriptions {
    path: PathBuf,
}

impl Subscriptions {
    pub fn new(home: &Home) -> Self {
        Self { path: home.iroh_dir().join("push.json") }
    }

    /// Removes all of `owner`'s (its device was revoked); how many.
    pub fn forget(&self, owner: &EndpointId) -> std::io::Result<usize> {
        if !self.path.exists() {
            return Ok(0);
        }
        let owner = owner.to_string();
        home::edit_json(&self.path, |f: &mut File| {
            let before = f.subscriptions.len();
            f.subscriptions.retain(|s| s.node_id != owner);
            before - f.subscriptions.len()
        })
    }
}
