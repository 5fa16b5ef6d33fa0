//! The local control API: HTTP/1.1 + JSON on a unix socket in
//! `$THUNDERBOLT_HOME`, served by every running bridge and host, and used by
//! its own CLI (`thunderbolt status`, `kick`, `iroh deny`), as `tailscale`
//! talks to `tailscaled`. Usable by hand too:
//!
//! ```text
//! curl --unix-socket ~/.thunderbolt/control-host.sock http://localhost/v1/status
//! curl --unix-socket ~/.thunderbolt/control-host.sock -d '{"target":"ab12cd34"}' http://localhost/v1/kick
//! ```
//!
//! | request | answer |
//! |---|---|
//! | `GET /v1/status` | what runs: agents (NodeId, ticket, relay health), sessions, slots |
//! | `POST /v1/kick` `{"target": "<session id, NodeId or device name>"}` | `{"ended": N}`: those sessions end now, code 1 `ended by the host` |
//! | `POST /v1/recheck` | `{"ended": N}`: every session re-checked against trust now (after `iroh deny`) |
//!
//! Only the owning user reaches it: the socket is 0600 in a 0700 home, and
//! every connection's peer uid is checked (`SO_PEERCRED`); any other uid gets
//! 403. One process per socket: `control-host.sock` for `thunderbolt host`,
//! `control-<protocol>.sock` for a single-agent bridge (so an ACP and an MCP
//! bridge still run side by side on one home). A second process for the same
//! socket is refused at start, naming the pid of the first (an exclusive lock
//! held for the process's life, so a crashed bridge's stale socket is simply
//! replaced).

pub mod api;
pub mod client;
pub mod http;
pub mod owned;
pub mod readiness;
pub mod service;

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use api::{ApiError, Ended, KickRequest, LocalApi, Route, RouteError};
use http::RequestError;

use crate::home::Home;

/// How long one API connection may take: a local client answers at once.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The socket a process serving `name` (`host`, or a protocol) listens on.
pub fn socket_path(home: &Home, name: &str) -> PathBuf {
    home.root_path().join(format!("control-{name}.sock"))
}

fn lock_path(home: &Home, name: &str) -> PathBuf {
    home.root_path().join(format!(".control-{name}.lock"))
}

/// The API's socket, held for the process's life.
#[derive(Debug)]
pub struct Control {
    socket: owned::Owned,
}

impl Control {
    /// Takes the socket for `name`, or says which process has it.
    pub fn bind(home: &Home, name: &str) -> Result<Self> {
        let root = home.root_path();
        fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
        let mode = fs::metadata(root)
            .with_context(|| format!("cannot read {}", root.display()))?
            .permissions()
            .mode()
            & 0o777;
        if mode & 0o077 != 0 {
            fs::set_permissions(root, fs::Permissions::from_mode(0o700))
                .with_context(|| format!("cannot make {} private (0700)", root.display()))?;
            warn!(
                "{} was mode {mode:04o}; set to 0700 (it holds the control socket and secrets)",
                root.display()
            );
        }
        let pid = match owned::take(&lock_path(home, name), socket_path(home, name))? {
            owned::Taken::Ours(socket) => return Ok(Self { socket }),
            owned::Taken::Held { pid } => pid,
        };
        let which = match name.parse::<thunderbolt_shared::Protocol>() {
            Ok(p) if name != "host" => p.with_article("bridge"),
            _ => format!("a {name}"),
        };
        bail!(
            "{which} is already running on {} (pid {}): `thunderbolt status` shows it; stop it first, \
             or use another THUNDERBOLT_HOME",
            root.display(),
            if pid.is_empty() { "unknown" } else { &pid }
        );
    }

    pub fn path(&self) -> &Path {
        &self.socket.path
    }

    /// Answers requests until `stop`, then removes the socket.
    pub async fn serve(self, api: std::sync::Arc<dyn LocalApi>, stop: CancellationToken) {
        // SAFETY: getuid cannot fail.
        let me = unsafe { libc::getuid() };
        loop {
            let accepted = tokio::select! {
                a = self.socket.listener.accept() => a,
                _ = stop.cancelled() => break,
            };
            let stream = match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    warn!("control socket: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let api = api.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, me, &*api)).await;
            });
        }
        let _ = fs::remove_file(&self.socket.path);
    }
}

/// One request on one connection.
async fn answer(mut stream: UnixStream, me: u32, api: &dyn LocalApi) -> std::io::Result<()> {
    let uid = stream.peer_cred().map(|c| c.uid()).ok();
    let mut buf = Vec::with_capacity(1024);
    let req = loop {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        match http::parse_request(&buf) {
            Ok(Some(req)) => break req,
            Ok(None) => continue,
            Err(e @ RequestError::TooLarge) => return respond(&mut stream, 413, error(e)).await,
            Err(e @ RequestError::Bad(_)) => return respond(&mut stream, 400, error(e)).await,
        }
    };
    // Read whole first: closing on an unread request would reset the
    // connection before the client reads why.
    if uid != Some(me) {
        info!("control socket: refused a client of uid {uid:?} (only uid {me} may use it)");
        return respond(&mut stream, 403, error("only the user running the bridge may use this socket"))
            .await;
    }
    let (status, body) = match Route::of(&req.method, &req.path) {
        Ok(Route::Status) => (200, json(api.status())),
        Ok(Route::Kick) => match serde_json::from_slice::<KickRequest>(&req.body) {
            Ok(KickRequest { target }) => match api.kick(&target) {
                Ok(ended) => (200, json(Ended { ended })),
                Err(why) => (409, error(why)),
            },
            Err(_) => (400, error("send {\"target\": \"<session id, NodeId or device name>\"}")),
        },
        Ok(Route::Recheck) => (200, json(Ended { ended: api.recheck() })),
        Err(RouteError::WrongMethod) => (405, error("method not allowed")),
        Err(RouteError::NotFound(route)) => {
            let known: Vec<&str> = Route::ALL.iter().map(|r| r.path()).collect();
            (404, error(format!("no such endpoint {route} (see {})", known.join(", "))))
        }
    };
    respond(&mut stream, status, body).await
}

fn json(v: impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}

fn error(why: impl ToString) -> serde_json::Value {
    json(ApiError { error: why.to_string() })
}

async fn respond(stream: &mut UnixStream, status: u16, body: serde_json::Value) -> std::io::Result<()> {
    stream.write_all(&http::encode_response(status, &body)).await?;
    stream.shutdown().await
}
