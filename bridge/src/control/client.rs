//! The CLI's side of the control API: one blocking HTTP/1.1 request per call
//! on a bridge's unix socket (the CLI asks once and exits; a local socket
//! answers in microseconds).

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::Value;

use crate::home::Home;

/// How long a running bridge gets to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// A bridge's answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach {path}: {source}")]
    Unreachable { path: PathBuf, source: std::io::Error },
    #[error("{path} answered something that is not HTTP/1.1 JSON")]
    Garbled { path: PathBuf },
}

/// The control sockets in `home`, one per running bridge or host (and
/// leftovers of crashed ones, which refuse connections).
pub fn sockets(home: &Home) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(home.root_path()) else { return Vec::new() };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            n.starts_with("control-") && n.ends_with(".sock")
        })
        .collect();
    v.sort();
    v
}

/// `method route` with an optional JSON body on the socket at `path`.
pub fn request(path: &Path, method: &str, route: &str, body: Option<&Value>) -> Result<Reply, ClientError> {
    let unreachable = |source| ClientError::Unreachable { path: path.to_path_buf(), source };
    let mut s = UnixStream::connect(path).map_err(unreachable)?;
    s.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(unreachable)?;
    s.set_write_timeout(Some(ANSWER_TIMEOUT)).map_err(unreachable)?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {route} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(unreachable)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).map_err(unreachable)?;
    let garbled = || ClientError::Garbled { path: path.to_path_buf() };
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(&out) {
        Ok(httparse::Status::Complete(n)) => n,
        _ => return Err(garbled()),
    };
    let status = resp.code.ok_or_else(garbled)?;
    let body = serde_json::from_slice(&out[head..]).map_err(|_| garbled())?;
    Ok(Reply { status, body })
}

/// The answers of every bridge running on `home` to the same request.
/// Sockets nobody answers on are skipped (crashed bridges' leftovers); one
/// this user may not use is reported on stderr.
pub fn ask_all(home: &Home, method: &str, route: &str, body: Option<&Value>) -> Vec<(PathBuf, Reply)> {
    let mut out = Vec::new();
    for p in sockets(home) {
        match request(&p, method, route, body) {
            Ok(r) => out.push((p, r)),
            Err(ClientError::Unreachable { source, .. })
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                eprintln!("cannot use {}: permission denied (it belongs to another user)", p.display());
            }
            Err(e) => tracing::debug!("{e}"),
        }
    }
    out
}
