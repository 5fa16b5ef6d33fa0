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

use std::{
    collections::BTreeMap,
    ffi::OsString,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use iroh::EndpointId;
use serde::Deserialize;
use serde_json::Value;
use thunderbolt_shared::{parse_node_id, Protocol};

use crate::{limits, serve::sessions::ResumeConfig};

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

/// Seconds in a manifest: a non-negative number.
fn secs(v: f64, field: &str) -> Result<Duration, Refused> {
    Duration::try_from_secs_f64(v)
        .map_err(|_| Refused(format!("\"{field}\" must be a number of seconds, not {v}")))
}

/// The JSON type each field must have.
#[derive(Clone, Copy)]
enum Kind {
    Str,
    Words,
    StrMap,
    Secs,
    Count,
    Resume,
}

/// Every field of a manifest and its type: anything else refuses the file.
const FIELDS: &[(&str, Kind)] = &[
    ("name", Kind::Str),
    ("label", Kind::Str),
    ("protocol", Kind::Str),
    ("command", Kind::Words),
    ("env", Kind::StrMap),
    ("cwd", Kind::Str),
    ("accept_from", Kind::Words),
    ("keep_warm", Kind::Secs),
    ("idle_stop", Kind::Secs),
    ("resume", Kind::Resume),
    ("max_sessions", Kind::Count),
    ("identity", Kind::Str),
];

/// Checks every field's type, and that no field is unknown, naming the field.
fn check_fields(obj: &serde_json::Map<String, Value>) -> Result<(), Refused> {
    for (key, v) in obj {
        let Some((_, kind)) = FIELDS.iter().find(|(k, _)| k == key) else {
            let known: Vec<&str> = FIELDS.iter().map(|(k, _)| *k).collect();
            return refuse(format!("unknown field `{key}` (a manifest has: {})", known.join(", ")));
        };
        let strings = |v: &Value| v.as_array().is_some_and(|a| a.iter().all(Value::is_string));
        let ok = match kind {
            Kind::Str => v.is_string(),
            Kind::Words => strings(v),
            Kind::StrMap => v.as_object().is_some_and(|m| m.values().all(Value::is_string)),
            Kind::Secs => v.as_f64().is_some_and(|n| n >= 0.0),
            Kind::Count => v.is_u64(),
            Kind::Resume => match v {
                Value::Bool(_) => true,
                Value::Object(m) => {
                    for (k, v) in m {
                        let ok = match k.as_str() {
                            "grace" => v.as_f64().is_some_and(|n| n >= 0.0),
                            "buffer" => v.is_string() || v.is_u64(),
                            _ => {
                                return refuse(format!("unknown field `resume.{k}` (it has: grace, buffer)"))
                            }
                        };
                        if !ok {
                            return refuse(format!(
                                "\"resume.{k}\" must be {}",
                                if k == "grace" { "a number of seconds" } else { "a size such as \"32M\"" }
                            ));
                        }
                    }
                    true
                }
                _ => false,
            },
        };
        if !ok {
            let must = match (kind, key.as_str()) {
                (Kind::Words, "command") => {
                    "an array of words, e.g. [\"my-agent\", \"--acp\"] (it is run directly, never by a shell)"
                }
                (Kind::Words, _) => "an array of strings",
                (Kind::StrMap, _) => "an object whose values are strings, e.g. {\"KEY\": \"value\"}",
                (Kind::Secs, _) => "a number of seconds",
                (Kind::Count, _) => "a whole number",
                (Kind::Resume, _) => "false, or an object {\"grace\": seconds, \"buffer\": size}",
                (Kind::Str, _) => "a string",
            };
            if v.is_string() && key == "command" {
                return refuse(format!("\"command\" is a string; it must be {must}"));
            }
            return refuse(format!("\"{key}\" must be {must}"));
        }
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: String,
    label: Option<String>,
    protocol: Option<String>,
    command: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    accept_from: Option<Vec<String>>,
    keep_warm: Option<f64>,
    idle_stop: Option<f64>,
    resume: Option<ResumeField>,
    max_sessions: Option<usize>,
    identity: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ResumeField {
    Switch(bool),
    Settings(ResumeSettings),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeSettings {
    grace: Option<f64>,
    buffer: Option<Value>,
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

/// Reads and checks one manifest file (its permissions included).
pub fn load(path: &Path, machine: &Machine) -> Result<AgentSpec, Refused> {
    load_file(path, machine).map_err(|e| match e {
        NotLoaded::Refused(why) => why,
        NotLoaded::Unreadable(e) => Refused(format!("cannot read it: {e}")),
    })
}

/// Why a manifest file did not load.
#[derive(Debug)]
pub enum NotLoaded {
    /// The file itself is refused: its kind, owner, mode, size or content.
    Refused(Refused),
    /// It could not be read now (out of descriptors, a permission taken away
    /// for a moment): nothing is known of its content. Not for a file that is
    /// gone (that is refused: it describes no agent any more).
    Unreadable(std::io::Error),
}

impl From<Refused> for NotLoaded {
    fn from(r: Refused) -> Self {
        NotLoaded::Refused(r)
    }
}

fn not_regular(kind: &str) -> Refused {
    Refused(format!(
        "not a regular file but {kind}: a manifest must be a plain file (not a link, a pipe or a \
         directory); it was not read"
    ))
}

/// [`load`], telling a file that could not be read now from a refused one.
///
/// Anything in the folder may have been put there by whoever can write it, so
/// the file is looked at (`lstat`) before it is opened, and what was opened is
/// checked again (`fstat`) before it is read: a FIFO (whose plain open waits
/// for a writer forever, and stopped `thunderbolt host` from starting), a
/// symbolic link, a device or a directory is refused without being read. The
/// open itself neither follows a link (`O_NOFOLLOW`) nor waits (`O_NONBLOCK`),
/// should the name be swapped between the look and the open.
pub fn load_file(path: &Path, machine: &Machine) -> Result<AgentSpec, NotLoaded> {
    use std::{io::Read, os::unix::fs::OpenOptionsExt};
    let io_error = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::NotFound {
            NotLoaded::Refused(Refused(format!("cannot read it: {e}")))
        } else {
            NotLoaded::Unreadable(e)
        }
    };
    let seen = std::fs::symlink_metadata(path).map_err(io_error)?;
    if !seen.file_type().is_file() {
        return Err(not_regular(crate::home::file_kind(seen.file_type())).into());
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // O_NOFOLLOW: the name became a link after it was looked at.
            Some(libc::ELOOP) => not_regular("a symbolic link").into(),
            _ => io_error(e),
        })?;
    let meta = file.metadata().map_err(NotLoaded::Unreadable)?;
    if !meta.file_type().is_file() {
        return Err(not_regular(crate::home::file_kind(meta.file_type())).into());
    }
    check_owner(&meta, machine, "it")?;
    let too_large = |len: String| {
        NotLoaded::Refused(Refused(format!(
            "{len} bytes: larger than any manifest ({MAX_MANIFEST_BYTES} at most)"
        )))
    };
    if meta.len() > MAX_MANIFEST_BYTES {
        return Err(too_large(meta.len().to_string()));
    }
    let mut text = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut text).map_err(NotLoaded::Unreadable)?;
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        // It grew while being read.
        return Err(too_large(format!("more than {MAX_MANIFEST_BYTES}")));
    }
    let mut spec = parse(&text, path, machine)?;
    let mode = meta.permissions().mode() & 0o777;
    if !spec.env.is_empty() && mode & 0o044 != 0 {
        spec.warnings.push(format!(
            "{} sets env values and is readable by others (mode {mode:04o}): if they are secrets, \
             chmod 600 it",
            path.display()
        ));
    }
    Ok(spec)
}

/// A manifest (or the folder holding them) must be owned by you and writable
/// by nobody else: whoever can write it chooses what runs as you.
pub fn check_owner(meta: &std::fs::Metadata, machine: &Machine, what: &str) -> Result<(), Refused> {
    if meta.uid() != machine.uid {
        return refuse(format!(
            "{what} is owned by uid {}, not by you (uid {}): a manifest says what runs as you",
            meta.uid(),
            machine.uid
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        let who = if mode & 0o002 != 0 { "others" } else { "its group" };
        return refuse(format!(
            "{what} is writable by {who} (mode {mode:04o}): whoever can write it chooses what runs as \
             you; chmod go-w it"
        ));
    }
    Ok(())
}

/// Parses and checks a manifest's content (`path` names it in messages and is
/// where `cwd` is relative to nothing: it must be absolute or start with `~/`).
pub fn parse(text: &[u8], path: &Path, machine: &Machine) -> Result<AgentSpec, Refused> {
    let value: Value = serde_json::from_slice(text).map_err(|e| Refused(format!("not valid JSON: {e}")))?;
    let Some(obj) = value.as_object() else {
        return refuse("not a JSON object");
    };
    if obj.contains_key("distribution") && !obj.contains_key("command") {
        return registry(obj, path, machine);
    }
    check_fields(obj)?;
    for required in ["name", "command"] {
        if !obj.contains_key(required) {
            return refuse(format!("\"{required}\" is missing"));
        }
    }
    let f: File = serde_json::from_value(value).map_err(|e| Refused(e.to_string()))?;
    let name = check_name(&f.name)?;
    let protocol = match f.protocol.as_deref() {
        None => Protocol::acp(),
        Some(p) => Protocol::parse_known(p).map_err(|e| Refused(format!("\"protocol\": {e}")))?,
    };
    let argv = resolve_command(&f.command, machine)?;
    check_env(&f.env, "env")?;
    let cwd = f.cwd.as_deref().map(|c| expand_cwd(c, machine)).transpose()?;
    let accept_from = match &f.accept_from {
        None => AcceptFrom::own(),
        Some(list) => accept_from(list)?,
    };
    let keep_warm = f.keep_warm.map(|s| secs(s, "keep_warm")).transpose()?;
    if keep_warm.is_some_and(|d| d.is_zero()) {
        return refuse("\"keep_warm\" must be above zero (leave it out to switch it off)");
    }
    let idle_stop = f.idle_stop.map(|s| secs(s, "idle_stop")).transpose()?.unwrap_or(DEFAULT_IDLE_STOP);
    if idle_stop.is_zero() {
        return refuse("\"idle_stop\" must be above zero");
    }
    let resume = match f.resume {
        None => ResumeChoice::Default,
        Some(ResumeField::Switch(false)) => ResumeChoice::Off,
        Some(ResumeField::Switch(true)) => ResumeChoice::On { grace: None, buffer: None },
        Some(ResumeField::Settings(s)) => {
            let grace = s.grace.map(|g| secs(g, "resume.grace")).transpose()?;
            if grace.is_some_and(|g| g.is_zero()) {
                return refuse(
                    "\"resume.grace\" must be above zero (use \"resume\": false to switch it off)",
                );
            }
            let buffer = match s.buffer {
                None => None,
                Some(Value::String(b)) => Some(b),
                Some(n) => Some(n.to_string()),
            };
            let buffer = buffer
                .as_deref()
                .map(crate::config::parse_size)
                .transpose()
                .map_err(|e| Refused(format!("\"resume.buffer\": {e}")))?;
            ResumeChoice::On { grace, buffer }
        }
    };
    if let Some(n) = f.max_sessions {
        if n == 0 || n > limits::MAX_COUNT_FLAG {
            return refuse(format!("\"max_sessions\" must be from 1 to {}", limits::MAX_COUNT_FLAG));
        }
    }
    let identity =
        match f.identity.as_deref() {
            None | Some("own") => IdentityChoice::Own,
            Some(p) => IdentityChoice::Protocol(Protocol::parse_known(p).map_err(|_| {
                Refused(format!("\"identity\" must be \"own\", \"acp\" or \"mcp\", not '{p}'"))
            })?),
        };
    let label = match f.label {
        Some(l) => check_label(&l)?,
        None => name.clone(),
    };
    Ok(AgentSpec {
        label,
        name,
        protocol,
        argv,
        env: f.env,
        cwd,
        accept_from,
        keep_warm,
        idle_stop,
        resume,
        max_sessions: f.max_sessions,
        identity,
        source: path.to_path_buf(),
        warnings: Vec::new(),
    })
}

/// A file in the ACP registry's `agent.json` shape: `id`, `name` and an npx
/// or uvx `distribution` become a manifest with the defaults.
fn registry(
    obj: &serde_json::Map<String, Value>,
    path: &Path,
    machine: &Machine,
) -> Result<AgentSpec, Refused> {
    let id = obj
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| Refused("registry agent.json without an \"id\"".into()))?;
    let name = check_name(id)?;
    let dist = obj
        .get("distribution")
        .and_then(Value::as_object)
        .ok_or_else(|| Refused("\"distribution\" must be an object (npx, uvx or binary)".into()))?;
    let runner = ["npx", "uvx"].into_iter().find(|r| dist.contains_key(*r));
    let Some(runner) = runner else {
        return refuse(
            "this registry agent is distributed only as a binary archive, which the host does not \
             download: install it, then write a manifest with its \"command\"",
        );
    };
    #[derive(Deserialize)]
    struct Package {
        package: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
    }
    let p: Package = serde_json::from_value(dist[runner].clone())
        .map_err(|e| Refused(format!("\"distribution.{runner}\": {e}")))?;
    check_env(&p.env, &format!("distribution.{runner}.env"))?;
    check_package(&p.package, runner)?;
    let mut command = vec![runner.to_string()];
    if runner == "npx" {
        command.push("-y".into());
    }
    command.push(p.package);
    command.extend(p.args);
    let argv = resolve_command(&command, machine)?;
    let label = check_label(obj.get("name").and_then(Value::as_str).unwrap_or(id))?;
    Ok(AgentSpec {
        label,
        name,
        protocol: Protocol::acp(),
        argv,
        env: p.env,
        cwd: None,
        accept_from: AcceptFrom::own(),
        keep_warm: None,
        idle_stop: DEFAULT_IDLE_STOP,
        resume: ResumeChoice::Default,
        max_sessions: None,
        identity: IdentityChoice::Own,
        source: path.to_path_buf(),
        warnings: Vec::new(),
    })
}

/// Longest label, in characters: it is printed in the banner, the log and
/// `status`, and is part of the account's device name.
pub const MAX_LABEL_CHARS: usize = 80;

/// Whether `c` could change how a terminal or a bidi-aware viewer shows the
/// text around it: control characters (ANSI escapes start with one) and the
/// invisible format characters (bidi embeddings, overrides and isolates,
/// zero-width ones, the BOM, separators, tags).
fn is_hidden_or_control(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00AD}' | '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}' | '\u{E0000}'..='\u{E007F}')
}

/// A label as it will be shown: refused when it holds a control or format
/// character (named by its code point) or is longer than [`MAX_LABEL_CHARS`].
pub fn check_label(label: &str) -> Result<String, Refused> {
    if let Some(c) = label.chars().find(|c| is_hidden_or_control(*c)) {
        return refuse(format!(
            "\"label\" holds U+{:04X}, a control or invisible formatting character (it could change how \
             the banner and the log read)",
            c as u32
        ));
    }
    if label.chars().count() > MAX_LABEL_CHARS {
        return refuse(format!("\"label\" is longer than {MAX_LABEL_CHARS} characters"));
    }
    Ok(label.to_string())
}

/// Longest environment variable name taken: far above any real one, and it
/// bounds what a refusal message repeats.
pub const MAX_ENV_NAME_LEN: usize = 128;

/// Every `env` key a variable name: `[A-Za-z_][A-Za-z0-9_]*` (what a shell
/// can name; no `=`, which would split it, no NUL, no empty name); values
/// without NUL (an agent could not be given one).
fn check_env(env: &BTreeMap<String, String>, field: &str) -> Result<(), Refused> {
    for (k, v) in env {
        let mut chars = k.chars();
        let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && k.len() <= MAX_ENV_NAME_LEN;
        if !ok {
            let shown: String = k.chars().take(MAX_ENV_NAME_LEN).flat_map(char::escape_default).collect();
            return refuse(format!(
                "\"{field}\": '{shown}' is not a variable name (letters, digits and _, not starting with a \
                 digit, at most {MAX_ENV_NAME_LEN})"
            ));
        }
        if v.contains('\0') {
            return refuse(format!("\"{field}\": the value of {k} contains a NUL character"));
        }
    }
    Ok(())
}

/// Longest registry package spec taken (npm's name limit is 214, plus a version).
pub const MAX_PACKAGE_LEN: usize = 256;

/// A registry `package` is a package spec, never an option of `npx`/`uvx`
/// (`--call=…` would run anything): it must not start with `-`, and it holds
/// only what package names and versions are made of.
fn check_package(package: &str, runner: &str) -> Result<(), Refused> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "@/._-~^+=<>!,[]*".contains(c);
    let ok = !package.is_empty()
        && !package.starts_with('-')
        && package.len() <= MAX_PACKAGE_LEN
        && package.chars().all(allowed);
    if !ok {
        let shown: String = package.chars().take(MAX_PACKAGE_LEN).flat_map(char::escape_default).collect();
        return refuse(format!(
            "\"distribution.{runner}.package\": '{shown}' is not a package spec (e.g. \"@scope/name@1.2.3\"; \
             it must not start with '-', which {runner} would take as an option)"
        ));
    }
    Ok(())
}

/// `[a-z][a-z0-9-]*`, at most [`MAX_NAME_LEN`].
pub fn check_name(name: &str) -> Result<String, Refused> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok || name.len() > MAX_NAME_LEN {
        return refuse(format!(
            "\"name\" '{name}' must be 1 to {MAX_NAME_LEN} characters of a-z, 0-9 and '-', starting with a letter"
        ));
    }
    Ok(name.to_string())
}

/// The command's program: an absolute path that is an executable file, or a
/// bare name found on `PATH` now.
fn resolve_command(command: &[String], machine: &Machine) -> Result<Vec<OsString>, Refused> {
    let Some(program) = command.first() else {
        return refuse(
            "\"command\" is empty: give the program and its arguments, e.g. [\"my-agent\", \"--acp\"]",
        );
    };
    let is_exec = |p: &Path| {
        std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
    };
    let p = Path::new(program);
    let resolved = if p.is_absolute() {
        if !is_exec(p) {
            return refuse(format!("\"command\": {program} is not an executable file"));
        }
        p.to_path_buf()
    } else if program.contains('/') {
        return refuse(format!(
            "\"command\": '{program}' is a relative path: give an absolute path, or a name found on PATH"
        ));
    } else {
        let path = machine.path.clone().unwrap_or_default();
        std::env::split_paths(&path)
            .map(|d| d.join(program))
            .find(|c| c.is_absolute() && is_exec(c))
            .ok_or_else(|| Refused(format!("\"command\": '{program}' was not found on PATH")))?
    };
    check_program(&resolved, machine)?;
    let mut argv = vec![resolved.into_os_string()];
    argv.extend(command[1..].iter().map(OsString::from));
    Ok(argv)
}

/// Whoever can rewrite the program chooses what runs as you, like whoever can
/// write the manifest: the file it resolves to (links followed) is refused when
/// anyone may write it (world-writable, root's included), or when it belongs to
/// another user who is not root (system programs are root's; a group-writable
/// file of yours or root's is taken: user-private groups make that common).
fn check_program(program: &Path, machine: &Machine) -> Result<(), Refused> {
    let meta = std::fs::metadata(program)
        .map_err(|e| Refused(format!("\"command\": cannot read {}: {e}", program.display())))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o002 != 0 {
        return refuse(format!(
            "\"command\": {} is writable by everyone (mode {mode:04o}): anyone could change what runs as \
             you; chmod o-w it",
            program.display()
        ));
    }
    if meta.uid() != machine.uid && meta.uid() != 0 {
        return refuse(format!(
            "\"command\": {} is owned by uid {}, neither you (uid {}) nor root: its owner could change what \
             runs as you",
            program.display(),
            meta.uid(),
            machine.uid
        ));
    }
    Ok(())
}

fn expand_cwd(cwd: &str, machine: &Machine) -> Result<PathBuf, Refused> {
    let path = match cwd.strip_prefix("~/").or((cwd == "~").then_some("")) {
        Some(rest) => match &machine.home_dir {
            Some(h) => h.join(rest),
            None => return refuse("\"cwd\" starts with ~/ but HOME is not set"),
        },
        None => PathBuf::from(cwd),
    };
    if !path.is_absolute() {
        return refuse(format!("\"cwd\" '{cwd}' must be absolute or start with ~/"));
    }
    if !path.is_dir() {
        return refuse(format!("\"cwd\" {} is not a directory", path.display()));
    }
    Ok(path)
}

fn accept_from(list: &[String]) -> Result<AcceptFrom, Refused> {
    if list.is_empty() {
        return refuse(
            "\"accept_from\" is empty: nobody could reach the agent (leave it out for your own devices)",
        );
    }
    let mut a = AcceptFrom::default();
    for entry in list {
        let e = entry.trim();
        if e == "self" {
            a.own_devices = true;
        } else if let Ok(id) = parse_node_id(e) {
            a.ids.push(id);
        } else {
            // A device name or a mistyped NodeId would be shown and never enforced.
            let shown: String = entry.chars().take(80).flat_map(char::escape_default).collect();
            return refuse(format!(
                "\"accept_from\": '{shown}' is neither \"self\" nor a NodeId (device names are not \
                 taken: give the device's NodeId)"
            ));
        }
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(dir: &Path) -> Machine {
        Machine {
            uid: unsafe { libc::getuid() },
            path: Some(dir.as_os_str().to_owned()),
            home_dir: Some(dir.to_path_buf()),
        }
    }

    fn with_program() -> (tempfile::TempDir, Machine) {
        let dir = tempfile::tempdir().unwrap();
        let prog = dir.path().join("my-agent");
        std::fs::write(&prog, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        let m = machine(dir.path());
        (dir, m)
    }

    fn parse_str(text: &str, m: &Machine) -> Result<AgentSpec, Refused> {
        parse(text.as_bytes(), Path::new("/x/a.json"), m)
    }

    #[test]
    fn a_full_manifest() {
        let (dir, m) = with_program();
        let spec = parse_str(
            r#"{"name":"claude","label":"Claude","protocol":"mcp","command":["my-agent","--acp"],
                "env":{"K":"v"},"cwd":"~/","accept_from":["self"],"keep_warm":120,"idle_stop":60,
                "resume":{"grace":30,"buffer":"1M"},"max_sessions":2,"identity":"mcp"}"#,
            &m,
        )
        .unwrap();
        assert_eq!(spec.name, "claude");
        assert_eq!(spec.protocol, Protocol::mcp());
        assert_eq!(spec.argv[0], dir.path().join("my-agent").into_os_string());
        assert_eq!(spec.argv[1], "--acp");
        assert_eq!(spec.cwd.as_deref(), Some(dir.path()));
        assert_eq!(spec.keep_warm, Some(Duration::from_secs(120)));
        assert_eq!(spec.idle_stop, Duration::from_secs(60));
        assert_eq!(
            spec.resume,
            ResumeChoice::On { grace: Some(Duration::from_secs(30)), buffer: Some(1 << 20) }
        );
        assert_eq!(spec.identity.file_name("claude"), "identity-mcp");
        let min = parse_str(r#"{"name":"a","command":["my-agent"]}"#, &m).unwrap();
        assert_eq!((min.label.as_str(), min.protocol.as_str()), ("a", "acp"));
        assert_eq!(min.accept_from, AcceptFrom::own());
        assert_eq!(min.identity.file_name("a"), "identity-agent-a");
        assert_eq!(min.idle_stop, DEFAULT_IDLE_STOP);
    }

    #[test]
    fn every_strictness_rule_has_its_reason() {
        let (_dir, m) = with_program();
        for (text, why) in [
            (r#"{"name":"a","command":["my-agent"],"colour":"red"}"#, "unknown field `colour`"),
            (r#"{"name":"a","command":["my-agent"],"resume":{"grace":3,"x":1}}"#, "unknown field `resume.x`"),
            (r#"{"name":"a","command":["my-agent"],"resume":"on"}"#, "\"resume\" must be"),
            (
                r#"{"name":"a","command":"my-agent --acp"}"#,
                "\"command\" is a string; it must be an array of words",
            ),
            (r#"{"name":"a"}"#, "\"command\" is missing"),
            (r#"{"name":7,"command":["my-agent"]}"#, "\"name\" must be a string"),
            (r#"{"name":"a","command":[]}"#, "\"command\" is empty"),
            (r#"{"name":"a","command":["./my-agent"]}"#, "relative path"),
            (r#"{"name":"a","command":["no-such-agent"]}"#, "not found on PATH"),
            (r#"{"name":"A","command":["my-agent"]}"#, "\"name\" 'A'"),
            (r#"{"name":"a b","command":["my-agent"]}"#, "\"name\""),
            (r#"{"name":"a","command":["my-agent"],"env":{"K":1}}"#, "\"env\" must be an object"),
            (r#"{"name":"a","command":["my-agent"],"env":["K=v"]}"#, "\"env\" must be an object"),
            (r#"{"name":"a","command":["my-agent"],"protocol":"xyz"}"#, "\"protocol\""),
            (r#"{"name":"a","command":["my-agent"],"keep_warm":"2m"}"#, "keep_warm"),
            (r#"{"name":"a","command":["my-agent"],"max_sessions":0}"#, "max_sessions"),
            (
                r#"{"name":"a","command":["my-agent"],"max_sessions":1.5}"#,
                "\"max_sessions\" must be a whole number",
            ),
            (
                r#"{"name":"a","command":["my-agent"],"keep_warm":-1}"#,
                "\"keep_warm\" must be a number of seconds",
            ),
            (r#"{"name":"a","command":["my-agent"],"accept_from":[]}"#, "accept_from"),
            (r#"{"name":"a","command":["my-agent"],"identity":"bob"}"#, "identity"),
            (r#"{"name":"a","command":["my-agent"],"cwd":"rel/dir"}"#, "cwd"),
            (r#"[1]"#, "not a JSON object"),
            (r#"{"name":"a""#, "not valid JSON"),
        ] {
            let err = parse_str(text, &m).unwrap_err().0;
            assert!(err.contains(why), "{text}: {err}");
        }
    }

    #[test]
    fn accept_from_takes_self_and_ids_and_refuses_anything_else() {
        let (_dir, m) = with_program();
        let id = iroh::SecretKey::from_bytes(&[3; 32]).public();
        let spec =
            parse_str(&format!(r#"{{"name":"a","command":["my-agent"],"accept_from":["{id}","self"]}}"#), &m)
                .unwrap();
        assert_eq!(spec.accept_from, AcceptFrom { own_devices: true, ids: vec![id] });
        let typo = &id.to_string()[1..];
        for entry in ["phone", typo] {
            let text = format!(r#"{{"name":"a","command":["my-agent"],"accept_from":["self","{entry}"]}}"#);
            let err = parse_str(&text, &m).unwrap_err().0;
            assert!(err.contains(&format!("'{entry}' is neither \"self\" nor a NodeId")), "{err}");
        }
    }

    #[test]
    fn registry_agent_json_with_npx_is_accepted_binary_only_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let npx = dir.path().join("npx");
        std::fs::write(&npx, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&npx, std::fs::Permissions::from_mode(0o755)).unwrap();
        let m = machine(dir.path());
        let spec = parse_str(
            r#"{"id":"gemini","name":"Gemini CLI","version":"1.0.0","description":"d",
                "distribution":{"npx":{"package":"@google/gemini-cli@1.0.0","args":["--experimental-acp"]}}}"#,
            &m,
        )
        .unwrap();
        assert_eq!(spec.name, "gemini");
        assert_eq!(spec.label, "Gemini CLI");
        let argv: Vec<String> = spec.argv.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(argv[1..], ["-y", "@google/gemini-cli@1.0.0", "--experimental-acp"]);
        let err = parse_str(
            r#"{"id":"x","name":"X","distribution":{"binary":{"linux-x86_64":{"archive":"https://a/x.tgz","cmd":"./x"}}}}"#,
            &m,
        )
        .unwrap_err();
        assert!(err.0.contains("binary archive"), "{err}");
        for (dist, why) in [
            (r#"{"npx":{"package":"--call=touch /tmp/x"}}"#, "must not start with '-'"),
            (r#"{"npx":{"package":"a b"}}"#, "is not a package spec"),
            (r#"{"npx":{"package":"p","env":{"":"x"}}}"#, "is not a variable name"),
            (r#"{"npx":{"package":"p","env":{"A=B":"c"}}}"#, "is not a variable name"),
        ] {
            let text = format!(r#"{{"id":"x","name":"X","distribution":{dist}}}"#);
            let err = parse_str(&text, &m).unwrap_err().0;
            assert!(err.contains(why), "{dist}: {err}");
        }
    }

    #[test]
    fn labels_with_control_or_format_characters_are_refused() {
        let (_dir, m) = with_program();
        for (label, code) in [
            ("\\u001b[31mred", "U+001B"),
            ("a\\u202Eb", "U+202E"),
            ("a\\u2066b", "U+2066"),
            ("a\\u200Bb", "U+200B"),
            ("\\uFEFFa", "U+FEFF"),
            ("a\\nb", "U+000A"),
        ] {
            let text = format!(r#"{{"name":"a","command":["my-agent"],"label":"{label}"}}"#);
            let err = parse_str(&text, &m).unwrap_err().0;
            assert!(err.contains(code) && err.contains("\"label\""), "{label}: {err}");
        }
        let long = "x".repeat(MAX_LABEL_CHARS + 1);
        let text = format!(r#"{{"name":"a","command":["my-agent"],"label":"{long}"}}"#);
        assert!(parse_str(&text, &m).unwrap_err().0.contains("longer than"));
        let ok =
            parse_str(r#"{"name":"a","command":["my-agent"],"label":"Claude Code — ünïcode"}"#, &m).unwrap();
        assert_eq!(ok.label, "Claude Code — ünïcode");
    }

    #[test]
    fn a_command_anyone_may_write_or_another_user_owns_is_refused() {
        let (dir, m) = with_program();
        let prog = dir.path().join("my-agent");
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = parse_str(r#"{"name":"a","command":["my-agent"]}"#, &m).unwrap_err().0;
        assert!(err.contains("writable by everyone"), "{err}");
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o775)).unwrap();
        parse_str(r#"{"name":"a","command":["my-agent"]}"#, &m).expect("group-writable, yours: taken");
        // Owned by someone else (only when this test may chown).
        if std::os::unix::fs::chown(&prog, Some(65534), None).is_ok() {
            let err = parse_str(r#"{"name":"a","command":["my-agent"]}"#, &m).unwrap_err().0;
            assert!(err.contains("owned by uid 65534"), "{err}");
        }
    }

    #[test]
    fn env_keys_are_variable_names() {
        let (_dir, m) = with_program();
        for key in ["", "=empty", "A=B", "1A", "A-B", "A\\u0000"] {
            let text = format!(r#"{{"name":"a","command":["my-agent"],"env":{{"{key}":"v"}}}}"#);
            let err = parse_str(&text, &m).unwrap_err().0;
            assert!(err.contains("is not a variable name"), "{key}: {err}");
        }
        let ok = parse_str(r#"{"name":"a","command":["my-agent"],"env":{"_A1":"v"}}"#, &m).unwrap();
        assert_eq!(ok.env["_A1"], "v");
    }

    #[test]
    fn only_a_regular_file_is_read_and_too_large_is_refused_unread() {
        let (dir, m) = with_program();
        let good = dir.path().join("good.json");
        std::fs::write(&good, r#"{"name":"a","command":["my-agent"]}"#).unwrap();
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load(&good, &m).unwrap().name, "a");
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let fifo = dir.path().join("fifo.json");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a plain syscall on a NUL-terminated path of ours.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let sub = dir.path().join("dir.json");
        std::fs::create_dir(&sub).unwrap();
        for (path, kind) in [(&link, "a symbolic link"), (&fifo, "a FIFO"), (&sub, "a directory")] {
            match load_file(path, &m) {
                Err(NotLoaded::Refused(why)) => {
                    assert!(why.0.contains(&format!("not a regular file but {kind}")), "{why}")
                }
                other => panic!("{}: {other:?}", path.display()),
            }
        }
        let big = dir.path().join("big.json");
        std::fs::write(&big, vec![b' '; MAX_MANIFEST_BYTES as usize + 1]).unwrap();
        std::fs::set_permissions(&big, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load(&big, &m).unwrap_err().0.contains("larger than any manifest"));
        // Gone is refused (it describes no agent any more), not "cannot read it now".
        assert!(matches!(load_file(&dir.path().join("none.json"), &m), Err(NotLoaded::Refused(_))));
    }
}
