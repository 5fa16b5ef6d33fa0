//! The bridge's own JSON-RPC methods, answered by the bridge and never
//! forwarded to the agent. Methods starting with `_` are extensions in
//! JSON-RPC as ACP and MCP use it; `_thunderbolt/` is ours:
//!
//! - `_thunderbolt/push/key` → `{"applicationServerKey": "<base64url>"}`, the
//!   VAPID public key for `pushManager.subscribe`;
//! - `_thunderbolt/push/subscribe` with `PushSubscription.toJSON()` as params
//!   → `{"subscribed": true}`: the subscription belongs to this session's
//!   device (its NodeId);
//! - `_thunderbolt/push/unsubscribe` `{"endpoint": …}` → `{"removed": true}`.
//!
//! With nothing to answer them (Web Push off) they are answered -32601
//! (method not found), as a bridge that predates them would have its agent do.
//! The fast path is one substring search per run of lines: a run that does
//! not name `_thunderbolt/` passes untouched, not copied.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use iroh::EndpointId;
use memchr::memmem;
use serde_json::{json, Value};

use super::taps::{FromClient, MethodResult, Methods};

/// The prefix of the bridge's own methods.
pub const EXTENSION_PREFIX: &str = "_thunderbolt/";
pub const METHOD_PUSH_KEY: &str = "_thunderbolt/push/key";
pub const METHOD_PUSH_SUBSCRIBE: &str = "_thunderbolt/push/subscribe";
pub const METHOD_PUSH_UNSUBSCRIBE: &str = "_thunderbolt/push/unsubscribe";

/// The methods a bridge has, answered or not (Web Push off).
const KNOWN: [&str; 3] = [METHOD_PUSH_KEY, METHOD_PUSH_SUBSCRIBE, METHOD_PUSH_UNSUBSCRIBE];

/// A run of whole lines with some taken out, in order: copied only once a
/// line is taken out (a run that loses none is passed on as it came).
pub(super) struct KeptLines<'a> {
    run: &'a Bytes,
    /// The lines kept so far, once one was taken out.
    kept: Option<BytesMut>,
    /// Where the next line starts in `run`.
    at: usize,
}

impl<'a> KeptLines<'a> {
    pub(super) fn new(run: &'a Bytes) -> Self {
        Self { run, kept: None, at: 0 }
    }

    /// The next line of the run, kept or taken out.
    pub(super) fn line(&mut self, line: &[u8], keep: bool) {
        let start = self.at;
        self.at += line.len();
        match (&mut self.kept, keep) {
            // The lines before this one go on as they were; this one stops here.
            (None, false) => self.kept = Some(BytesMut::from(&self.run[..start])),
            (Some(k), true) => k.extend_from_slice(line),
            _ => {}
        }
    }

    /// What goes on: the run itself, the lines kept, or nothing.
    pub(super) fn finish(self) -> Option<Bytes> {
        match self.kept {
            None => Some(self.run.clone()),
            Some(k) if k.is_empty() => None,
            Some(k) => Some(k.freeze()),
        }
    }

    /// [`Self::finish`], in memory of its own: for what is kept long (a
    /// session's history). The run is a slice of the pump's read buffer and
    /// would pin all of it for as long as it is kept.
    pub(super) fn finish_owned(self) -> Option<Bytes> {
        match self.kept {
            None => Some(Bytes::copy_from_slice(self.run)),
            Some(k) if k.is_empty() => None,
            Some(k) => Some(k.freeze()),
        }
    }
}

/// JSON-RPC's "method not found".
pub const NOT_FOUND: i64 = -32601;

/// One session's answerer of the bridge's methods.
pub struct Extension {
    /// The session's device (the methods act for it); `None` for a
    /// transport without one (wss).
    device: Option<EndpointId>,
    methods: Option<Arc<dyn Methods>>,
}

impl Extension {
    pub fn new(device: Option<EndpointId>, methods: Option<Arc<dyn Methods>>) -> Self {
        Self { device, methods }
    }

    /// A run of the client's whole lines: the lines calling one of our
    /// methods are answered and taken out; the others go on, in order.
    pub async fn answer(&self, run: Bytes) -> FromClient {
        if memmem::find(&run, EXTENSION_PREFIX.as_bytes()).is_none() {
            return FromClient { forward: Some(run), replies: Vec::new() };
        }
        let mut out = FromClient::default();
        let mut kept = KeptLines::new(&run);
        for line in thunderbolt_shared::ndjson::lines(&run) {
            let reply = match memmem::find(line, EXTENSION_PREFIX.as_bytes()) {
                Some(_) => self.line(line).await,
                None => None,
            };
            kept.line(line, reply.is_none());
            out.replies.extend(reply.flatten());
        }
        out.forward = kept.finish();
        out
    }

    /// The bridge's answer to one of its extension lines; `None` when the line
    /// is not one (it goes to the agent); `Some(None)` for a notification.
    async fn line(&self, line: &[u8]) -> Option<Option<Bytes>> {
        let v: Value = serde_json::from_slice(line).ok()?;
        let method = v.get("method")?.as_str()?;
        if !method.starts_with(EXTENSION_PREFIX) {
            return None;
        }
        let id = v.get("id").cloned();
        let result = self.call(method, v.get("params").cloned().unwrap_or(Value::Null)).await;
        let id = id?;
        let line = match result {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err((code, message)) => {
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
            }
        };
        let mut b = serde_json::to_vec(&line).unwrap_or_default();
        b.push(b'\n');
        Some(Some(b.into()))
    }

    async fn call(&self, method: &str, params: Value) -> MethodResult {
        if !KNOWN.contains(&method) {
            return Err((NOT_FOUND, format!("{method}: no such method of this bridge")));
        }
        match (&self.methods, self.device) {
            (Some(m), Some(device)) if m.knows(method) => m.call(device, method, params).await,
            _ => Err((NOT_FOUND, format!("{method}: web push is off on this bridge"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn extension_lines_never_reach_the_agent_and_others_pass_whole() {
        let n = Extension::new(None, None);
        let run = Bytes::from_static(
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}\n\
              {\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"_thunderbolt/push/key\"}\n\
              {\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"x\",\"params\":{\"t\":\"_thunderbolt/ in text\"}}\n",
        );
        let out = n.answer(run).await;
        let fwd = out.forward.unwrap();
        assert!(fwd.starts_with(b"{\"jsonrpc\":\"2.0\",\"id\":1,"));
        assert!(memmem::find(&fwd, b"push/key").is_none());
        assert!(memmem::find(&fwd, b"in text").is_some(), "a mention in a string is not a call");
        assert_eq!(out.replies.len(), 1);
        let v: Value = serde_json::from_slice(&out.replies[0]).unwrap();
        assert_eq!(v["id"], 2);
        assert_eq!(v["error"]["code"], -32601);

        let plain = Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}\n");
        let out = n.answer(plain.clone()).await;
        assert_eq!(out.forward.unwrap().as_ptr(), plain.as_ptr(), "untouched, not copied");

        let only = Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"_thunderbolt/nope\"}\n");
        let out = n.answer(only).await;
        assert!(out.forward.is_none());
        assert_eq!(out.replies.len(), 1);
    }
}
