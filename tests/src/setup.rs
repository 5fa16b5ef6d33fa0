//! What most integration tests start from: a running bridge, its home and a
//! client home allowed on it ([`Setup`]), the test agent's argv, and the
//! JSON-RPC helpers every file used to carry a copy of.

use iroh::{
    endpoint::{Connection, RecvStream, SendStream},
    Endpoint,
};
use serde_json::Value;

use crate::{
    banner_port, client_endpoint, init_tracing, r1::hello, r1::next_frame, test_agent_bin, LocalRelay, Log,
    RunningBridge, Tb,
};

/// The test agent's argv with `args`.
pub fn agent(args: &[&str]) -> Vec<String> {
    let mut v = vec![test_agent_bin().display().to_string()];
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

/// A running bridge with its home, and a client home: with no relay (direct
/// loopback only, so one port carries it all; [`Setup::new`]) or with a
/// local relay ([`Setup::with_relay`]).
pub struct Setup {
    /// The local relay both homes use, if any.
    pub relay: Option<LocalRelay>,
    pub bridge_home: Tb,
    pub client_home: Tb,
    pub bridge: RunningBridge,
    pub work: tempfile::TempDir,
}

impl Setup {
    pub async fn new(extra: &[&str], agent_argv: &[String]) -> Self {
        Self::with_env(extra, agent_argv, &[]).await
    }

    /// Like [`Setup::new`], the bridge's processes getting `env` too.
    pub async fn with_env(extra: &[&str], agent_argv: &[String], env: &[(&'static str, &str)]) -> Self {
        init_tracing();
        let mut bridge_home = Tb::new(None);
        for (k, v) in env {
            bridge_home = bridge_home.with_env(k, *v);
        }
        let client_home = Tb::new(None);
        bridge_home.allow(&client_home.node_id("acp").await).await;
        let argv: Vec<&str> = agent_argv.iter().map(String::as_str).collect();
        let bridge = bridge_home.bridge("acp", extra, &argv).await;
        Self { relay: None, bridge_home, client_home, bridge, work: tempfile::tempdir().unwrap() }
    }

    /// A bridge of `protocol` on a local relay, the client home allowed in
    /// its allow file when `allow_client`.
    pub async fn with_relay(
        protocol: &str,
        extra: &[&str],
        agent_argv: &[String],
        allow_client: bool,
    ) -> Self {
        init_tracing();
        let relay = LocalRelay::start().await;
        let bridge_home = Tb::new(Some(&relay));
        let client_home = Tb::new(Some(&relay));
        if allow_client {
            bridge_home.allow(&client_home.node_id("acp").await).await;
        }
        let argv: Vec<&str> = agent_argv.iter().map(String::as_str).collect();
        let bridge = bridge_home.bridge(protocol, extra, &argv).await;
        Self { relay: Some(relay), bridge_home, client_home, bridge, work: tempfile::tempdir().unwrap() }
    }

    /// Dials the running bridge's plain ALPN, opens the session's stream and
    /// sends `line` (the bridge sees the stream, and spawns the agent, once
    /// data arrives on it).
    pub async fn open_session(&self, ep: &Endpoint, line: &[u8]) -> (Connection, SendStream, RecvStream) {
        let conn = self.bridge.dial(ep, &thunderbolt_shared::Protocol::acp().alpn()).await;
        let (mut send, recv) = conn.open_bi().await.unwrap();
        send.write_all(line).await.expect("write");
        (conn, send, recv)
    }

    /// Stops the running bridge and starts another with `agent_argv` (same
    /// home, so same identity: two at once would share a NodeId).
    pub async fn restart(&mut self, agent_argv: &[String]) {
        self.restart_with(&[], agent_argv).await;
    }

    pub async fn restart_with(&mut self, extra: &[&str], agent_argv: &[String]) {
        self.bridge.terminate().await;
        let argv: Vec<&str> = agent_argv.iter().map(String::as_str).collect();
        self.bridge = self.bridge_home.bridge("acp", extra, &argv).await;
    }

    /// An in-process client dialing as the client home's ACP identity,
    /// through the relay only when `relay_only`.
    pub async fn client(&self, relay_only: bool) -> Endpoint {
        client_endpoint(self.client_home.secret_key("acp").await, self.relay.as_ref(), relay_only).await
    }

    pub fn path(&self, name: &str) -> String {
        self.work.path().join(name).display().to_string()
    }

    pub fn port(&self) -> u16 {
        banner_port(&self.bridge.banner)
    }

    /// `thunderbolt acp connect` with piped stdio; its stderr goes to the returned log.
    pub fn connect(&self, extra: &[&str]) -> (tokio::process::Child, Log) {
        let mut args = extra.to_vec();
        args.push(&self.bridge.ticket);
        self.client_home.connect(&args)
    }

    /// An in-process endpoint dialing as `home`.
    pub async fn endpoint(&self, home: &Tb) -> Endpoint {
        client_endpoint(home.secret_key("acp").await, None, false).await
    }

    /// A new resumable session from `home`: its connection, stream and token.
    pub async fn session(&self, ep: &Endpoint) -> (Connection, SendStream, RecvStream, String) {
        let conn = self
            .bridge
            .dial(ep, &thunderbolt_shared::resume::resume_alpn(&thunderbolt_shared::Protocol::acp()))
            .await;
        let (send, recv, welcome) = hello(&conn, None, 0).await;
        let (token, _) = welcome.unwrap_or_else(|c| panic!("a new session is welcomed, got {c:?}"));
        (conn, send, recv, token)
    }

    /// Resumes `token` holding `received` frames: the connection and the
    /// welcome, or how it was closed.
    pub async fn resume(
        &self,
        ep: &Endpoint,
        token: &str,
        received: u64,
    ) -> (Connection, SendStream, RecvStream, Result<(String, u64), (u64, String)>) {
        let conn = self
            .bridge
            .dial(ep, &thunderbolt_shared::resume::resume_alpn(&thunderbolt_shared::Protocol::acp()))
            .await;
        let (send, recv, welcome) = hello(&conn, Some(token), received).await;
        (conn, send, recv, welcome)
    }
}

/// One JSON-RPC request as a line (`params` left out when `Null`).
pub fn request(id: impl Into<Value>, method: &str, params: Value) -> Vec<u8> {
    let mut v = serde_json::json!({"jsonrpc": "2.0", "id": id.into(), "method": method});
    if !params.is_null() {
        v["params"] = params;
    }
    let mut line = serde_json::to_vec(&v).expect("a request serializes");
    line.push(b'\n');
    line
}

/// Sends one JSON-RPC request on a session's stream and reads frames until
/// its response (frames before it, the agent's notifications, are skipped).
pub async fn call(
    send: &mut SendStream,
    recv: &mut RecvStream,
    buf: &mut Vec<u8>,
    id: u64,
    method: &str,
    params: Value,
) -> Value {
    send.write_all(&request(id, method, params)).await.unwrap();
    loop {
        let line = next_frame(recv, buf).await;
        let v: Value = serde_json::from_slice(&line).unwrap();
        if v["id"] == id {
            return v;
        }
    }
}

/// `thunderbolt status --json` in `home`: `{"bridges": [ … ]}`.
pub async fn status(home: &Tb) -> Value {
    let out = home.run(&["status", "--json"]).await;
    assert!(out.status.success(), "status failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

/// `iroh pair --json [extra]` on the bridge's `home`, `connect --pair` on the
/// device's: the device is one of the owner's own (or what `extra`'s scope
/// says), named `name`. The minted code's JSON.
pub async fn pair(home: &Tb, device: &Tb, ticket: &str, name: &str, extra: &[&str]) -> Value {
    let mut args = vec!["iroh", "pair", "--json"];
    args.extend_from_slice(extra);
    let out = home.run(&args).await;
    assert!(out.status.success(), "iroh pair: {}", String::from_utf8_lossy(&out.stderr));
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    let code = p["code"].as_str().unwrap();
    let out = device.run(&["acp", "connect", "--pair", code, "--device-name", name, ticket]).await;
    assert!(out.status.success(), "connect --pair: {}", String::from_utf8_lossy(&out.stderr));
    p
}
