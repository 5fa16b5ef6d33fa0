//! The stand-in push service (`tests/push/service.mjs`, Node): it decrypts
//! each push with the subscription's private key and verifies its VAPID JWT
//! with its own crypto, independently of the bridge's code.

use std::{path::PathBuf, process::Stdio};

use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::mpsc,
};

use crate::{Log, WAIT};

/// The tests' switch that lets push endpoints on loopback through (the
/// stand-in push service listens there); without it they are refused.
pub const LOOPBACK: &[(&str, &str)] = &[("THUNDERBOLT_TEST_PUSH_LOOPBACK", "1")];

/// The stand-in push service: its port, its two subscriptions, what it got.
pub struct PushService {
    _child: Child,
    pub port: u16,
    pub ok: Value,
    pub gone: Value,
    pub got: mpsc::UnboundedReceiver<Value>,
    /// The bridge's log, shown when a wait runs out.
    pub log: Log,
}

impl PushService {
    pub async fn start() -> Self {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("push/service.mjs");
        let mut child = Command::new("node")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs (the push service stand-in)");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first =
            tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap().expect("service starts");
        let v: Value = serde_json::from_str(&first).unwrap();
        let (tx, got) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = tx.send(serde_json::from_str::<Value>(&line).unwrap());
            }
        });
        Self {
            _child: child,
            port: v["port"].as_u64().unwrap() as u16,
            ok: v["subscriptions"]["ok"].clone(),
            gone: v["subscriptions"]["gone"].clone(),
            got,
            log: Log::default(),
        }
    }

    /// The next request it recorded (bounded by [`WAIT`]); a push or hook that
    /// did not check out fails the test here.
    pub async fn next(&mut self) -> Value {
        let Ok(v) = tokio::time::timeout(WAIT, self.got.recv()).await else {
            panic!("no request in time; the bridge's log:\n{}", self.log.text());
        };
        let v = v.unwrap();
        assert!(v.get("error").is_none(), "the push service refused a request: {v}");
        v
    }

    /// The next push to the working subscription (skipping the gone one's and hooks).
    pub async fn next_push(&mut self) -> Value {
        loop {
            let v = self.next().await;
            if v["path"] == "/push/ok" {
                return v;
            }
        }
    }
}
