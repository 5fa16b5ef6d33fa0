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

pub mod client;
pub mod readiness;
pub mod service;

use std::{
    fs,
    io::{Read, Seek, Write},
    os::{
        fd::AsRawFd,
        unix::fs::{OpenOptionsExt, PermissionsExt},
    },
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{UnixListener, UnixStream},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{home::Home, serve::status::BridgeHandle};

/// Longest request read: the API's requests are a few hundred bytes.
const MAX_REQUEST: usize = 64 * 1024;

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
    listener: UnixListener,
    path: PathBuf,
    /// The exclusive lock that says this process owns the socket.
    _lock: fs::File,
}

impl Control {
    /// Takes the socket for `name`, or says which process has it.
    pub fn bind(home: &Home, name: &str) -> Result<Self> {
        let root = home.root_path();
        fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
        let mode = fs::metadata(root)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            fs::set_permissions(root, fs::Permissions::from_mode(0o700))
                .with_context(|| format!("cannot make {} private (0700)", root.display()))?;
            warn!(
                "{} was mode {mode:04o}; set to 0700 (it holds the control socket and secrets)",
                root.display()
            );
        }
        let lock_file = lock_path(home, name);
        let mut lock = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_file)
            .with_context(|| format!("cannot open {}", lock_file.display()))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let mut pid = String::new();
            let _ = lock.read_to_string(&mut pid);
            let pid = pid.trim();
            let which = if name == "host" { "a host".to_string() } else { format!("a {name} bridge") };
            bail!(
                "{which} is already running on {} (pid {}): `thunderbolt status` shows it; stop it first, \
                 or use another THUNDERBOLT_HOME",
                root.display(),
                if pid.is_empty() { "unknown" } else { pid }
            );
        }
        lock.set_len(0)?;
        lock.rewind()?;
        write!(lock, "{}", std::process::id())?;
        let path = socket_path(home, name);
        // Ours now: whatever is there is a crashed process's leftover.
        if fs::symlink_metadata(&path).is_ok() {
            debug!("replacing the stale control socket {}", path.display());
            fs::remove_file(&path).with_context(|| format!("cannot remove the stale {}", path.display()))?;
        }
        let listener =
            UnixListener::bind(&path).with_context(|| format!("cannot listen on {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
        Ok(Self { listener, path, _lock: lock })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Answers requests until `stop`, then removes the socket.
    pub async fn serve(self, handle: BridgeHandle, stop: CancellationToken) {
        // SAFETY: getuid cannot fail.
        let me = unsafe { libc::getuid() };
        loop {
            let accepted = tokio::select! {
                a = self.listener.accept() => a,
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
            let handle = handle.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, me, &handle)).await;
            });
        }
        let _ = fs::remove_file(&self.path);
    }
}

/// One request on one connection.
async fn answer(mut stream: UnixStream, me: u32, handle: &BridgeHandle) -> std::io::Result<()> {
    let uid = stream.peer_cred().map(|c| c.uid()).ok();
    let mut buf = Vec::with_capacity(1024);
    let (method, path, body) = loop {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST {
            return respond(&mut stream, 413, &json!({"error": "request too large"})).await;
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(head)) => {
                let len = req
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if len > MAX_REQUEST {
                    return respond(&mut stream, 413, &json!({"error": "request too large"})).await;
                }
                if buf.len() < head + len {
                    continue;
                }
                let method = req.method.unwrap_or("").to_string();
                let path = req.path.unwrap_or("").to_string();
                break (method, path, buf[head..head + len].to_vec());
            }
            Ok(httparse::Status::Partial) => continue,
            Err(e) => return respond(&mut stream, 400, &json!({"error": format!("bad request: {e}")})).await,
        }
    };
    // Read whole first: closing on an unread request would reset the
    // connection before the client reads why.
    if uid != Some(me) {
        info!("control socket: refused a client of uid {uid:?} (only uid {me} may use it)");
        return respond(
            &mut stream,
            403,
            &json!({"error": "only the user running the bridge may use this socket"}),
        )
        .await;
    }
    let route = path.split('?').next().unwrap_or("");
    let (status, body) = match (method.as_str(), route) {
        ("GET", "/v1/status") => (200, serde_json::to_value(handle.status()).unwrap_or_default()),
        ("POST", "/v1/kick") => {
            let target = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("target").and_then(|t| t.as_str()).map(str::to_string));
            match target {
                Some(t) => match handle.kick(&t) {
                    Ok(n) => (200, json!({"ended": n})),
                    Err(e) => (409, json!({"error": format!("'{t}' names no one device: {e}")})),
                },
                None => (400, json!({"error": "send {\"target\": \"<session id, NodeId or device name>\"}"})),
            }
        }
        ("POST", "/v1/recheck") => (200, json!({"ended": handle.recheck()})),
        (_, "/v1/status" | "/v1/kick" | "/v1/recheck") => (405, json!({"error": "method not allowed"})),
        _ => (
            404,
            json!({"error": format!("no such endpoint {route} (see /v1/status, /v1/kick, /v1/recheck)")}),
        ),
    };
    respond(&mut stream, status, &body).await
}

async fn respond(stream: &mut UnixStream, status: u16, body: &serde_json::Value) -> std::io::Result<()> {
    let text = match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Payload Too Large",
    };
    let body = format!("{body}\n");
    let head = format!(
        "HTTP/1.1 {status} {text}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}
