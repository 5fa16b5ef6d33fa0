//! A manifest's content turned into an [`AgentSpec`]: the JSON read into its
//! fields, each checked, the defaults filled in. Separate from reading the
//! file (its kind, owner and size) and from the checks of single values, so
//! that this file is the one place that says what a manifest becomes.

use std::{collections::BTreeMap, path::Path, time::Duration};

use serde::Deserialize;
use serde_json::Value;
use thunderbolt_shared::Protocol;

use super::{
    command::resolve_command,
    refuse,
    registry::registry,
    shape::check_fields,
    values::{accept_from, check_env, check_label, check_name, expand_cwd, files_folder},
    AcceptFrom, AgentSpec, IdentityChoice, Machine, Refused, ResumeChoice, DEFAULT_IDLE_STOP,
};
use crate::limits;

/// Seconds in a manifest: a non-negative number.
pub(super) fn secs(v: f64, field: &str) -> Result<Duration, Refused> {
    Duration::try_from_secs_f64(v)
        .map_err(|_| Refused(format!("\"{field}\" must be a number of seconds, not {v}")))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: String,
    label: Option<String>,
    protocol: Option<String>,
    command: Option<Vec<String>>,
    capture: Option<Vec<String>>,
    webhook: Option<String>,
    relay: Option<String>,
    contract: Option<Value>,
    turn_timeout: Option<f64>,
    commands: Option<Value>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    files: Option<String>,
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

/// The fields that say what the agent is: exactly one per manifest.
const SHAPES: [&str; 4] = ["command", "capture", "webhook", "relay"];

/// What the host runs for the agent: its `command`, or, for another shape,
/// `thunderbolt adapt`, which serves it as ACP ([`crate::shapes`]).
fn shape_argv(f: &File, name: &str, machine: &Machine) -> Result<Vec<std::ffi::OsString>, Refused> {
    if f.command.is_some() || f.relay.is_some() {
        if f.turn_timeout.is_some() {
            return refuse("\"turn_timeout\" is for \"capture\" and \"webhook\" agents");
        }
        if f.contract.is_some() && f.command.is_some() {
            return refuse("\"contract\" is for \"capture\", \"webhook\" and \"relay\" agents");
        }
    }
    if f.commands.is_some() && f.relay.is_none() {
        return refuse("\"commands\" is for \"relay\" agents");
    }
    if let Some(command) = &f.command {
        return resolve_command(command, machine);
    }
    if let Some(v) = &f.contract {
        let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
        if !crate::shapes::contract::VERSIONS.contains(&v.as_str()) {
            return refuse(format!(
                "\"contract\" {v} is not spoken here (this host speaks {})",
                crate::shapes::contract::VERSIONS.join(", ")
            ));
        }
    }
    let timeout = f
        .turn_timeout
        .map(|t| secs(t, "turn_timeout"))
        .transpose()?
        .unwrap_or(crate::shapes::DEFAULT_TURN_TIMEOUT);
    if timeout.is_zero() {
        return refuse("\"turn_timeout\" must be above zero");
    }
    let me = std::env::current_exe().map_err(|e| Refused(format!("cannot name this program: {e}")))?;
    let (shape, target) = match (&f.capture, &f.webhook, &f.relay) {
        (_, _, Some(url)) => ("relay", vec![loopback_url(url, "relay")?.into()]),
        (Some(program), _, _) => (
            "capture",
            resolve_command(program, machine)
                .map_err(|Refused(w)| Refused(w.replace("\"command\"", "\"capture\"")))?,
        ),
        (None, Some(url), _) => ("webhook", vec![loopback_url(url, "webhook")?.into()]),
        (None, None, None) => unreachable!("one shape is there: checked above"),
    };
    let mut argv: Vec<std::ffi::OsString> = vec![me.into(), "adapt".into(), shape.into()];
    argv.extend(["--name".into(), name.into(), "--timeout".into(), timeout.as_secs_f64().to_string().into()]);
    if let Some(c) = &f.commands {
        argv.extend(["--commands".into(), c.to_string().into()]);
    }
    argv.push("--".into());
    argv.extend(target);
    Ok(argv)
}

/// A service's URL: `http://` to a loopback address (this machine only: the
/// host sends it your prompts), with no credentials in it.
fn loopback_url(text: &str, field: &str) -> Result<String, Refused> {
    let url = url::Url::parse(text).map_err(|e| Refused(format!("\"{field}\" is not a URL ({e})")))?;
    if url.scheme() != "http" {
        return refuse(format!(
            "\"{field}\" must be an http:// URL on this machine, not {}://",
            url.scheme()
        ));
    }
    let loopback = match url.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    };
    if !loopback {
        return refuse(format!(
            "\"{field}\" must name a loopback address (127.0.0.1, [::1], localhost), not {}",
            url.host_str().unwrap_or("nothing")
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return refuse(format!("\"{field}\" must not carry credentials"));
    }
    Ok(url.to_string())
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
    if !obj.contains_key("name") {
        return refuse("\"name\" is missing");
    }
    let shapes: Vec<&str> = SHAPES.iter().copied().filter(|k| obj.contains_key(*k)).collect();
    match shapes.as_slice() {
        [] => return refuse("\"command\" is missing (or one of \"capture\", \"webhook\", \"relay\")"),
        [_] => {}
        many => {
            return refuse(format!(
            "{} are exclusive: an agent is exactly one of \"command\", \"capture\", \"webhook\", \"relay\"",
            many.iter().map(|k| format!("\"{k}\"")).collect::<Vec<_>>().join(" and ")
        ))
        }
    }
    let f: File = serde_json::from_value(value).map_err(|e| Refused(e.to_string()))?;
    let name = check_name(&f.name)?;
    let protocol = match f.protocol.as_deref() {
        None => Protocol::acp(),
        Some(p) => Protocol::parse_known(p).map_err(|e| Refused(format!("\"protocol\": {e}")))?,
    };
    let argv = shape_argv(&f, &name, machine)?;
    check_env(&f.env, "env")?;
    let cwd = f.cwd.as_deref().map(|c| expand_cwd(c, machine)).transpose()?;
    let files = match (&f.files, &cwd) {
        (None, _) => None,
        (Some(_), None) => {
            return refuse("\"files\" is a folder inside the agent's workspace: it needs \"cwd\"")
        }
        (Some(dir), Some(cwd)) => Some(cwd.join(files_folder(dir)?)),
    };
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
        files,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::manifest::test_support::{parse_str, with_program};

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
        let inbox = parse_str(r#"{"name":"a","command":["my-agent"],"cwd":"~/","files":"notes/inbox"}"#, &m);
        assert_eq!(inbox.unwrap().files, Some(dir.path().join("notes/inbox")));
        let cap = parse_str(r#"{"name":"a","capture":["my-agent","-v"],"turn_timeout":30,"contract":1}"#, &m)
            .unwrap();
        let words: Vec<String> = cap.argv.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(
            &words[1..],
            [
                "adapt",
                "capture",
                "--name",
                "a",
                "--timeout",
                "30",
                "--",
                &dir.path().join("my-agent").display().to_string(),
                "-v"
            ]
        );
        let hook = parse_str(r#"{"name":"b","webhook":"http://localhost:8700/in"}"#, &m).unwrap();
        assert_eq!(hook.argv.last().unwrap(), "http://localhost:8700/in");
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
            (r#"{"name":"a","command":["my-agent"],"capture":["my-agent"]}"#, "are exclusive"),
            (
                r#"{"name":"a","webhook":"http://127.0.0.1:1/x","relay":"http://127.0.0.1:2/"}"#,
                "are exclusive",
            ),
            (r#"{"name":"a","webhook":"https://127.0.0.1:1/x"}"#, "http:// URL on this machine"),
            (r#"{"name":"a","webhook":"http://example.com/x"}"#, "loopback address"),
            (r#"{"name":"a","webhook":"http://u:p@127.0.0.1/x"}"#, "credentials"),
            (r#"{"name":"a","webhook":"not a url"}"#, "\"webhook\" is not a URL"),
            (
                r#"{"name":"a","capture":["my-agent"],"contract":"2"}"#,
                "\"contract\" 2 is not spoken here (this host speaks 1)",
            ),
            (r#"{"name":"a","capture":["my-agent"],"contract":true}"#, "\"contract\" must be a version"),
            (r#"{"name":"a","capture":"my-agent"}"#, "\"capture\" is a string"),
            (r#"{"name":"a","capture":["no-such-agent"]}"#, "\"capture\": 'no-such-agent' was not found"),
            (r#"{"name":"a","command":["my-agent"],"turn_timeout":5}"#, "\"turn_timeout\" is for"),
            (
                r#"{"name":"a","capture":["my-agent"],"turn_timeout":0}"#,
                "\"turn_timeout\" must be above zero",
            ),
            (
                r#"{"name":"a","relay":"http://10.0.0.1:8700/inbound"}"#,
                "\"relay\" must name a loopback address",
            ),
            (
                r#"{"name":"a","relay":"http://127.0.0.1:8700/inbound","turn_timeout":5}"#,
                "\"turn_timeout\" is for",
            ),
            (
                r#"{"name":"a","relay":"http://127.0.0.1:8700/inbound","contract":2}"#,
                "\"contract\" 2 is not spoken here",
            ),
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
            (r#"{"name":"a","command":["my-agent"],"files":"inbox"}"#, "it needs \"cwd\""),
            (r#"{"name":"a","command":["my-agent"],"cwd":"~/","files":"../x"}"#, "plain relative parts"),
            (r#"{"name":"a","command":["my-agent"],"cwd":"~/","files":"/tmp/x"}"#, "plain relative parts"),
            (r#"{"name":"a","command":["my-agent"],"cwd":"~/","files":".ssh"}"#, "plain relative parts"),
            (r#"{"name":"a","command":["my-agent"],"cwd":"~/","files":""}"#, "plain relative parts"),
            (r#"{"name":"a","command":["my-agent"],"cwd":"~/","files":7}"#, "\"files\" must be a string"),
            (r#"[1]"#, "not a JSON object"),
            (r#"{"name":"a""#, "not valid JSON"),
        ] {
            let err = parse_str(text, &m).unwrap_err().0;
            assert!(err.contains(why), "{text}: {err}");
        }
    }
}
