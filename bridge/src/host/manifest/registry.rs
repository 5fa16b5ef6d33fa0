//! A file in the ACP agent registry's `agent.json` shape, taken as a
//! manifest when its distribution runs a command this machine has (`npx` or
//! `uvx`). Separate because it is a second input format with its own risk:
//! the package spec becomes an argument of `npx`/`uvx`, so it is checked
//! never to be taken as one of their options.

use std::{collections::BTreeMap, path::Path};

use serde::Deserialize;
use serde_json::Value;
use thunderbolt_shared::Protocol;

use super::{
    command::resolve_command,
    refuse,
    values::{check_env, check_label, check_name},
    AcceptFrom, AgentSpec, IdentityChoice, Machine, Refused, ResumeChoice, DEFAULT_IDLE_STOP,
};

/// A file in the ACP registry's `agent.json` shape: `id`, `name` and an npx
/// or uvx `distribution` become a manifest with the defaults.
pub(super) fn registry(
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
        files: None,
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use crate::host::manifest::test_support::{machine, parse_str};

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
}
