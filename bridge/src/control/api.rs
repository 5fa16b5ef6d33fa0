//! The control API's contract, shared by the daemon (the running bridge or
//! host) and its CLI: the routes, and every request and answer as a type
//! serialised both ways, as tailscale's LocalAPI client shares its daemon's
//! types. [`LocalApi`] is what a running bridge implements; [`super::client`]
//! is the typed client.

use serde::{Deserialize, Serialize};

/// The API's routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `GET /v1/status` → [`Status`].
    Status,
    /// `POST /v1/kick` [`KickRequest`] → [`Ended`].
    Kick,
    /// `POST /v1/recheck` → [`Ended`].
    Recheck,
}

/// Why a request names no route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    /// 404: no such path.
    NotFound(String),
    /// 405: the path, with another method.
    WrongMethod,
}

impl Route {
    pub const ALL: [Route; 3] = [Route::Status, Route::Kick, Route::Recheck];

    pub fn method(self) -> &'static str {
        match self {
            Route::Status => "GET",
            Route::Kick | Route::Recheck => "POST",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Route::Status => "/v1/status",
            Route::Kick => "/v1/kick",
            Route::Recheck => "/v1/recheck",
        }
    }

    /// The route `method path` asks for (a query string is ignored).
    pub fn of(method: &str, path: &str) -> Result<Self, RouteError> {
        let path = path.split('?').next().unwrap_or("");
        let route = Self::ALL
            .into_iter()
            .find(|r| r.path() == path)
            .ok_or_else(|| RouteError::NotFound(path.to_string()))?;
        if route.method() == method {
            Ok(route)
        } else {
            Err(RouteError::WrongMethod)
        }
    }
}

/// What a running bridge answers, and does.
pub trait LocalApi: Send + Sync + 'static {
    fn status(&self) -> Status;
    /// Ends the sessions `target` names now; `Err` says why it names no one
    /// device (a name two devices share).
    fn kick(&self, target: &str) -> Result<usize, String>;
    /// Re-checks every session against trust now.
    fn recheck(&self) -> usize;
}

/// `POST /v1/kick`'s body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KickRequest {
    /// A session id, a NodeId or a device name.
    pub target: String,
}

/// How many sessions a kick or a re-check ended.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Ended {
    pub ended: usize,
}

/// Any refusal's body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
}

/// The whole picture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub pid: u32,
    pub version: String,
    /// `host` or `bridge` (the single-agent commands).
    pub kind: String,
    pub started_ms: u64,
    pub agents: Vec<AgentStatus>,
    pub sessions: Vec<SessionStatus>,
    /// Agent slots in use, and how many there are (`--max-agents`).
    pub slots_used: usize,
    pub slots: usize,
    /// The socket messages and relay agents' replies go to
    /// (`$THUNDERBOLT_HOME/reach.sock`), when this process serves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reach_socket: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// Empty for the single-agent bridge.
    pub name: String,
    pub label: String,
    pub protocol: String,
    pub node_id: String,
    pub node_id_base32: String,
    pub ticket: String,
    pub live_sessions: usize,
    pub relay: RelayStatus,
}

/// [`RelayState`] with times as numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RelayStatus {
    pub url: Option<String>,
    pub connected: bool,
    pub since_ms: Option<u64>,
    pub drops: u64,
    pub last_error: Option<String>,
    /// Every relay configured (the home one is `url`), as last probed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relays: Vec<RelayProbeStatus>,
}

/// One configured relay in `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RelayProbeStatus {
    pub url: String,
    pub home: bool,
    pub reachable: Option<bool>,
    pub latency_ms: Option<f64>,
    pub since_ms: Option<u64>,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionStatus {
    /// What `thunderbolt kick` takes.
    pub id: String,
    pub agent: String,
    pub peer: String,
    pub peer_short: String,
    /// The device's name, where one is known.
    pub device: Option<String>,
    pub since_ms: u64,
    /// `attached`, `detached` (a resumable session waiting for its client) or
    /// `warm` (a warm agent waiting for its peer's next connection).
    pub state: String,
    /// `r1` (resumable) or `0` (plain); `None` with nothing attached.
    pub protocol: Option<String>,
    /// `direct`, `relay`, or `none`.
    pub path: String,
    pub rtt_ms: Option<f64>,
    /// QUIC bytes of the attached connection, each way.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Nothing attached: how long the session still waits.
    pub waits_ms: Option<u64>,
    pub pid: Option<u32>,
    pub resumes: u64,
    /// Taken back from its journal after the bridge restarted.
    #[serde(default)]
    pub restored: bool,
    /// Every device on a resumable session (the one that started it first,
    /// unless it left), its role, and whether it is attached now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceOnSession>,
}

/// One device on a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceOnSession {
    /// What `thunderbolt kick` takes to end this device's attachment only.
    pub id: String,
    pub peer: String,
    pub device: Option<String>,
    /// `controller` or `observer`.
    pub role: String,
    pub attached: bool,
    /// `direct`, `relay`, or `none`.
    pub path: String,
    /// What its scope lets it do, when less than everything (`observe,answer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Someone else's device, on this session by a share (`thunderbolt
    /// share`): when the share ends (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_until: Option<String>,
}
