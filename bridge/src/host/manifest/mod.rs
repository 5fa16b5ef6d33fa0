//! Agent manifests: one JSON file per hosted agent in `$THUNDERBOLT_HOME/agents.d/`.
//!
//! A manifest says what runs as you, so it is read strictly: an unknown field
//! at any level, a wrong type, a shell string where an argv array belongs, a bad
//! name or an `env` that is not a map of strings each refuse the file, with a
//! reason that names the field. A refused file is skipped; every valid one still
//! loads.
//!
//! ```json
//! {
//!   "name": "claude",                       // [a-z][a-z0-9-]*: the agent's id in file names and logs
//!   "label": "Claude Code",                 // optional: shown to people
//!   "protocol": "acp",                      // "acp" (default) or "mcp"
//!   "command": ["claude-code-acp"],         // argv: an absolute path, or a name found on PATH at load
//!   "env": { "ANTHROPIC_API_KEY": "…" },    // optional: added to the agent's environment
//!   "cwd": "~/src/project",                 // optional: the agent's workspace (`~/` expanded)
//!   "files": "inbox",                       // optional: devices' files land in this folder of `cwd`
//!   "accept_from": ["self"],                // optional: who may reach it (see `AcceptFrom`)
//!   "keep_warm": 120,                       // optional: seconds a plain session's agent waits for the next connection
//!   "idle_stop": 300,                       // optional: stop an agent nothing was attached to this long
//!   "resume": { "grace": 300, "buffer": "32M" },  // optional, or `false` for plain sessions only
//!   "max_sessions": 4,                      // optional: live sessions of this agent at once
//!   "identity": "own"                       // optional: "own" (default), or "acp"/"mcp" to keep that bridge's NodeId
//! }
//! ```
//!
//! A file in the ACP agent registry's `agent.json` shape (`id`, `name`,
//! `distribution`) is accepted too when its distribution runs a command this
//! machine has (`npx` or `uvx`): the host does not download binary archives.

mod command;
mod parse;
mod read;
mod registry;
mod shape;
mod values;

use std::{collections::BTreeMap, ffi::OsString, path::PathBuf, time::Duration};

use iroh::EndpointId;
use thunderbolt_shared::Protocol;

use crate::{limits, serve::sessions::ResumeConfig};

pub use parse::parse;
pub use read::{check_owner, load, load_file, NotLoaded};
pub use registry::MAX_PACKAGE_LEN;
pub use values::{check_label, check_name, MAX_ENV_NAME_LEN, MAX_LABEL_CHARS};

/// Longest agent name: it is part of a file name and of every log line.
pub const MAX_NAME_LEN: usize = 32;

/// Largest manifest read: a few hundred bytes in practice; anything near this
/// is not a manifest.
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024;

/// Who may reach a hosted agent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AcceptFrom {
    /// `"self"`: your own devices: the account allowlist and the allow file.
    pub own_devices: bool,
    /// NodeIds listed by id.
    pub ids: Vec<EndpointId>,
}

impl AcceptFrom {
    /// The default: your own devices.
    pub fn own() -> Self {
        Self { own_devices: true, ..Self::default() }
    }
}

/// Which identity (NodeId) a hosted agent is reached at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityChoice {
    /// Its own: `iroh/identity-agent-<name>`, created on first use.
    Own,
    /// The single-agent bridge's for this protocol (`iroh/identity`,
    /// `iroh/identity-mcp`): existing pairings keep working.
    Protocol(Protocol),
}

impl IdentityChoice {
    /// The file name inside `$THUNDERBOLT_HOME/iroh/`.
    pub fn file_name(&self, agent: &str) -> String {
        match self {
            Self::Own => format!("identity-agent-{agent}"),
            Self::Protocol(p) => p.identity_file_name(),
        }
    }
}

/// Resumable sessions for an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeChoice {
    /// The host's settings.
    Default,
    Off,
    On {
        grace: Option<Duration>,
        buffer: Option<usize>,
    },
}

impl ResumeChoice {
    /// The settings sessions of this agent get, from the host's `default`.
    pub fn apply(&self, default: Option<ResumeConfig>) -> Option<ResumeConfig> {
        match *self {
            Self::Default => default,
            Self::Off => None,
            Self::On { grace, buffer } => {
                let base = default
                    .unwrap_or(ResumeConfig { grace: limits::RESUME_GRACE, buffer: limits::RESUME_BUFFER });
                Some(ResumeConfig {
                    grace: grace.unwrap_or(base.grace),
                    buffer: buffer.unwrap_or(base.buffer),
                })
            }
        }
    }
}

/// How long an agent with nothing attached keeps running, unless its manifest
/// says otherwise: long enough for a phone in a pocket to come back to a warm
/// agent, short enough that forgotten agents do not pile up.
pub const DEFAULT_IDLE_STOP: Duration = Duration::from_secs(300);

/// A manifest that passed every check: what the host runs.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSpec {
    pub name: String,
    pub label: String,
    pub protocol: Protocol,
    /// `argv[0]` resolved to an absolute path.
    pub argv: Vec<OsString>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// Where devices' files land: a folder inside `cwd` (else the home's
    /// `files/<agent>/`).
    pub files: Option<PathBuf>,
    pub accept_from: AcceptFrom,
    pub keep_warm: Option<Duration>,
    pub idle_stop: Duration,
    pub resume: ResumeChoice,
    pub max_sessions: Option<usize>,
    pub identity: IdentityChoice,
    /// The file it came from.
    pub source: PathBuf,
    /// Things worth saying that do not refuse the file.
    pub warnings: Vec<String>,
}

/// Why a manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

fn refuse<T>(why: impl Into<String>) -> Result<T, Refused> {
    Err(Refused(why.into()))
}

/// What the checks need of this machine: who we are and where programs are.
#[derive(Debug, Clone)]
pub struct Machine {
    pub uid: u32,
    pub path: Option<OsString>,
    pub home_dir: Option<PathBuf>,
}

impl Machine {
    pub fn this() -> Self {
        Self {
            // SAFETY: getuid cannot fail.
            uid: unsafe { libc::getuid() },
            path: std::env::var_os("PATH"),
            home_dir: std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from),
        }
    }
}

/// What the tests of every part of the manifest share: a machine whose PATH
/// holds one executable, and a manifest parsed from text.
#[cfg(test)]
mod test_support {
    use std::{os::unix::fs::PermissionsExt, path::Path};

    use super::{parse, AgentSpec, Machine, Refused};

    pub(super) fn machine(dir: &Path) -> Machine {
        Machine {
            uid: unsafe { libc::getuid() },
            path: Some(dir.as_os_str().to_owned()),
            home_dir: Some(dir.to_path_buf()),
        }
    }

    pub(super) fn with_program() -> (tempfile::TempDir, Machine) {
        let dir = tempfile::tempdir().unwrap();
        let prog = dir.path().join("my-agent");
        std::fs::write(&prog, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        let m = machine(dir.path());
        (dir, m)
    }

    pub(super) fn parse_str(text: &str, m: &Machine) -> Result<AgentSpec, Refused> {
        parse(text.as_bytes(), Path::new("/x/a.json"), m)
    }
}
