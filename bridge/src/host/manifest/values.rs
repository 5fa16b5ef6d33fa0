//! Checks of single values of a manifest: the name, the label, `env`, `cwd`
//! and `accept_from`. Separate from parsing because each is a rule of its own
//! (what a name may hold, which characters a label may not), shared by a
//! manifest and a registry `agent.json`, and each names the field it refuses.

use std::{collections::BTreeMap, path::PathBuf};

use thunderbolt_shared::parse_node_id;

use super::{refuse, AcceptFrom, Machine, Refused, MAX_NAME_LEN};

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
pub(super) fn check_env(env: &BTreeMap<String, String>, field: &str) -> Result<(), Refused> {
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

pub(super) fn expand_cwd(cwd: &str, machine: &Machine) -> Result<PathBuf, Refused> {
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

/// Longest `files` folder name: a few words of path.
const MAX_FILES_FOLDER_LEN: usize = 255;

/// `files`: a folder inside the workspace, named relative to it by plain
/// components (no `..`, no root, no `.`-led name): where it points is fixed
/// by the manifest, never by what a device sends.
pub(super) fn files_folder(dir: &str) -> Result<PathBuf, Refused> {
    use std::path::Component;
    let path = std::path::Path::new(dir);
    let plain = !dir.is_empty()
        && dir.len() <= MAX_FILES_FOLDER_LEN
        && !dir.chars().any(char::is_control)
        && path
            .components()
            .all(|c| matches!(c, Component::Normal(n) if !n.to_string_lossy().starts_with('.')));
    if !plain {
        return refuse(format!(
            "\"files\" '{}' must be a folder inside \"cwd\", named by plain relative parts (like \"inbox\" or \"notes/inbox\")",
            dir.escape_debug()
        ));
    }
    Ok(path.to_path_buf())
}

pub(super) fn accept_from(list: &[String]) -> Result<AcceptFrom, Refused> {
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
    use crate::host::manifest::test_support::{parse_str, with_program};

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
}
