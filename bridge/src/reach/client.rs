//! The socket's typed client: what `thunderbolt note` and the MCP server
//! `thunderbolt reach` send, a connection per call.

use std::path::PathBuf;

use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::UnixStream,
};

use crate::home::Home;

/// The longest answer read: a status of every device, a few replies.
const MAX_ANSWER: u64 = 4 * 1024 * 1024;

/// Why a call got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Nothing listens: no host or bridge runs on this home.
    #[error(
        "no host runs on {home} (no {socket}): start one with `thunderbolt host` or \
         `thunderbolt acp --transport iroh -- <agent>`, and pair your phone with `thunderbolt iroh pair`"
    )]
    NotRunning { home: String, socket: String },
    /// The host refused it, in its words.
    #[error("{0}")]
    Refused(String),
    #[error("reach.sock: {0}")]
    Io(#[from] std::io::Error),
    #[error("reach.sock answered something unreadable")]
    Unreadable,
}

/// A client of one home's socket.
#[derive(Debug, Clone)]
pub struct ReachClient {
    home: PathBuf,
    socket: PathBuf,
}

impl ReachClient {
    pub fn new(home: &Home) -> Self {
        Self { home: home.root_path().to_path_buf(), socket: super::socket::socket_path(home) }
    }

    /// Sends one request object; its answer (`ok` true), or why not.
    pub async fn call(&self, request: &Value) -> Result<Value, CallError> {
        let mut stream = match UnixStream::connect(&self.socket).await {
            Ok(s) => s,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) =>
            {
                return Err(CallError::NotRunning {
                    home: self.home.display().to_string(),
                    socket: self.socket.display().to_string(),
                })
            }
            Err(e) => return Err(e.into()),
        };
        let mut line = serde_json::to_vec(request).map_err(|_| CallError::Unreadable)?;
        line.push(b'\n');
        // A host that refuses answers at once and closes: its answer is read
        // even when it did not take the whole line.
        let wrote = stream.write_all(&line).await;
        let mut answer = Vec::new();
        BufReader::new((&mut stream).take(MAX_ANSWER)).read_until(b'\n', &mut answer).await?;
        if answer.is_empty() {
            wrote?;
        }
        let v: Value = serde_json::from_slice(&answer).map_err(|_| CallError::Unreadable)?;
        match v.get("error").and_then(Value::as_str) {
            Some(why) => Err(CallError::Refused(why.to_string())),
            None => Ok(v),
        }
    }
}
