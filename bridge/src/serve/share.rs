//! A share minted from a session (`_thunderbolt/share`, the page's "Share"
//! button): a device on the session asks for a one-time code that lets
//! another person's device into it (see `cli/share_cmd.rs` for the command
//! line's). A device may share what it holds, never more: the verbs within
//! its own, the end no later than its own.

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use iroh::EndpointId;
use serde_json::{json, Value};

use super::{bridge::Shared, served::Served};
use crate::{
    devices::{
        now_ms, rfc3339,
        scope::{Verb, Verbs, MAX_FOR},
    },
    pairing::{CodeScope, Target},
};

/// The method a device calls on its session's stream.
pub const METHOD_SHARE: &str = "_thunderbolt/share";

/// How long a share lasts when the device does not say: an afternoon's
/// pairing session.
const DEFAULT_SHARE: Duration = Duration::from_secs(3600);

/// How long a share's code may wait to be redeemed (the person it is for
/// opens the link now, or never).
const CODE_VALID: Duration = Duration::from_secs(600);

/// Why a share was not minted: a JSON-RPC error's code and message.
pub type Refused = (i64, String);

/// Mints shares of one agent's sessions.
#[derive(Debug)]
pub struct Sharer {
    shared: Weak<Shared>,
    agent: Weak<Served>,
    /// Shares minted of this session so far.
    minted: std::sync::atomic::AtomicU32,
}

/// Shares one session may be given from its devices: a person shows a
/// session to a few people; a device that asks in a loop costs the
/// pairing codes' file no more than this.
const MAX_SHARES_PER_SESSION: u32 = 32;

impl Sharer {
    pub(crate) fn new(shared: &Arc<Shared>, agent: &Arc<Served>) -> Arc<Self> {
        Arc::new(Self { shared: Arc::downgrade(shared), agent: Arc::downgrade(agent), minted: 0.into() })
    }

    /// A share's guest is out for good (ended from a page): nothing admits it.
    pub fn forget(&self, guest: &EndpointId) {
        let Some(stores) = self.shared.upgrade().and_then(|s| s.stores()) else { return };
        if let Err(e) = stores.devices.forget_share(guest) {
            tracing::warn!(peer = %guest.fmt_short(), "could not remove an ended share's guest: {e}");
        }
    }

    /// A code for session `session`, asked by device `minter` with `params`
    /// `{"drive": bool, "forSecs": n}`: `{code, ticket, session, verbs, until}`.
    pub fn mint(&self, session: &str, minter: &EndpointId, params: &Value) -> Result<Value, Refused> {
        let gone = || (-32603, "the bridge is shutting down".to_string());
        let (shared, agent) =
            (self.shared.upgrade().ok_or_else(gone)?, self.agent.upgrade().ok_or_else(gone)?);
        let stores =
            shared.stores().ok_or((-32603, "this bridge keeps no pairing codes (no home)".into()))?;
        let cfg = agent.config();
        let drive = params.get("drive").and_then(Value::as_bool).unwrap_or(false);
        let asked = match params.get("forSecs") {
            None | Some(Value::Null) => DEFAULT_SHARE,
            Some(v) => match v.as_u64().filter(|s| *s > 0) {
                Some(s) => Duration::from_secs(s),
                None => return Err((-32602, "forSecs must be a positive number of seconds".into())),
            },
        };
        if asked > MAX_FOR {
            return Err((-32602, format!("a share lasts at most {} days", MAX_FOR.as_secs() / 86_400)));
        }
        // Never more than the minter holds: its verbs here, its end.
        let held = shared.verbs(&cfg, minter);
        let wanted = if drive { Verbs::of([Verb::Prompt, Verb::Answer]) } else { Verbs::of([Verb::Observe]) };
        if !held.covers(wanted) {
            return Err((
                thunderbolt_shared::devices::SCOPE_REFUSED_CODE,
                format!("this device may not share {wanted}: its scope is {held}"),
            ));
        }
        let mine = stores.devices.scope_of(minter);
        // A guest's share is the owner's to give: a code it minted would
        // outlive its own kick.
        if mine.session.is_some() {
            return Err((
                thunderbolt_shared::devices::SCOPE_REFUSED_CODE,
                "a guest of the session shares nothing of it".into(),
            ));
        }
        if self.minted.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= MAX_SHARES_PER_SESSION {
            return Err((-32000, format!("this session was shared {MAX_SHARES_PER_SESSION} times already")));
        }
        let now = now_ms();
        let until =
            mine.until_ms.map_or(now + asked.as_millis() as u64, |u| u.min(now + asked.as_millis() as u64));
        let scope_agent = cfg.name.scope_name(&cfg.protocol);
        let target = match cfg.name.manifest_name() {
            Some(n) => Target::Agent(n.to_string()),
            None => Target::Bridge(cfg.protocol.clone()),
        };
        let scope = CodeScope {
            verbs: wanted,
            for_ms: None,
            until_ms: Some(until),
            session: Some(session.to_string()),
            agent: Some(scope_agent),
        };
        let valid = CODE_VALID.min(Duration::from_millis(until.saturating_sub(now).max(1)));
        let code = stores
            .pairings
            .mint_scoped(&[target], None, valid, Some(scope))
            .map_err(|e| (-32603, format!("the share could not be kept: {e}")))?;
        tracing::info!(
            peer = %minter.fmt_short(),
            session,
            "a share of the session was minted from a device: {wanted} until {}",
            rfc3339(until)
        );
        Ok(json!({
            "code": code,
            "ticket": agent.ticket().to_string(),
            "session": session,
            "verbs": wanted,
            "until": rfc3339(until),
            "untilMs": until,
        }))
    }
}
