//! The CLI's side of the control API: one blocking HTTP/1.1 request per call
//! on a bridge's unix socket (the CLI asks once and exits; a local socket
//! answers in microseconds).

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use super::{
    api::{ApiError, Ended, KickRequest, Route, Status},
    http,
};
use crate::home::Home;

/// How long a running bridge gets to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a request got no answer, or was refused.
/// A message ends with its `cause`, which is not also `source()` (printed as a
/// chain it would read twice: see `HomeError`).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach {path}: {cause}")]
    Unreachable { path: PathBuf, cause: std::io::Error },
    #[error("{path} answered something that is not HTTP/1.1 JSON")]
    Garbled { path: PathBuf },
    /// The bridge answered with an error (403 for another user, 409 for a
    /// name two devices share, …).
    #[error("{path}: refused ({status}): {error}")]
    Refused { path: PathBuf, status: u16, error: String },
}

/// A running bridge's control API, typed.
#[derive(Debug, Clone)]
pub struct Client {
    path: PathBuf,
}

impl Client {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What runs there.
    pub fn status(&self) -> Result<Status, ClientError> {
        self.call(Route::Status, None)
    }

    /// Ends the sessions `target` names; how many.
    pub fn kick(&self, target: &str) -> Result<usize, ClientError> {
        let body = serde_json::to_vec(&KickRequest { target: target.to_string() }).unwrap_or_default();
        self.call::<Ended>(Route::Kick, Some(&body)).map(|e| e.ended)
    }

    /// Re-checks every session against trust now; how many ended.
    pub fn recheck(&self) -> Result<usize, ClientError> {
        self.call::<Ended>(Route::Recheck, None).map(|e| e.ended)
    }

    fn call<T: serde::de::DeserializeOwned>(
        &self,
        route: Route,
        body: Option<&[u8]>,
    ) -> Result<T, ClientError> {
        let path = &self.path;
        let unreachable = |cause| ClientError::Unreachable { path: path.clone(), cause };
        let mut s = UnixStream::connect(path).map_err(unreachable)?;
        s.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(unreachable)?;
        s.set_write_timeout(Some(ANSWER_TIMEOUT)).map_err(unreachable)?;
        s.write_all(&http::encode_request(route.method(), route.path(), body.unwrap_or_default()))
            .map_err(unreachable)?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).map_err(unreachable)?;
        let garbled = || ClientError::Garbled { path: path.clone() };
        let (status, body) = http::parse_response(&out).ok_or_else(garbled)?;
        if status != 200 {
            let error = serde_json::from_value::<ApiError>(body).map(|e| e.error).unwrap_or_default();
            return Err(ClientError::Refused { path: path.clone(), status, error });
        }
        serde_json::from_value(body).map_err(|_| garbled())
    }
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

/// What `ask` returns from every bridge running on `home` that answered
/// (refusals included). Sockets nobody answers on are skipped (crashed
/// bridges' leftovers); one this user may not use is reported on stderr.
pub fn each<T>(
    home: &Home,
    ask: impl Fn(&Client) -> Result<T, ClientError>,
) -> Vec<(PathBuf, Result<T, ClientError>)> {
    let mut out = Vec::new();
    for p in sockets(home) {
        let client = Client::new(&p);
        match ask(&client) {
            Err(ClientError::Unreachable { cause, .. })
                if cause.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                eprintln!("cannot use {}: permission denied (it belongs to another user)", p.display());
            }
            Err(e @ (ClientError::Unreachable { .. } | ClientError::Garbled { .. })) => {
                tracing::debug!("{e}")
            }
            r => out.push((p, r)),
        }
    }
    out
}
