//! The manifest's shape: every field it may have and the JSON type each must
//! be, checked before anything is deserialized. Separate from parsing so that
//! a wrong field is refused with a reason that names it (and what it must
//! be), which serde's own errors do not say in people's words.

use serde_json::Value;

use super::{refuse, Refused};

/// The JSON type each field must have.
#[derive(Clone, Copy)]
enum Kind {
    Str,
    Words,
    StrMap,
    Secs,
    Count,
    Resume,
    /// A contract version: a string or a whole number.
    Version,
    /// A relay agent's slash commands: `[{"name","description","argHint"?}]`.
    Commands,
}

/// Every field of a manifest and its type: anything else refuses the file.
const FIELDS: &[(&str, Kind)] = &[
    ("name", Kind::Str),
    ("label", Kind::Str),
    ("protocol", Kind::Str),
    ("command", Kind::Words),
    ("env", Kind::StrMap),
    ("cwd", Kind::Str),
    ("files", Kind::Str),
    ("accept_from", Kind::Words),
    ("keep_warm", Kind::Secs),
    ("idle_stop", Kind::Secs),
    ("resume", Kind::Resume),
    ("max_sessions", Kind::Count),
    ("identity", Kind::Str),
    ("capture", Kind::Words),
    ("webhook", Kind::Str),
    ("relay", Kind::Str),
    ("contract", Kind::Version),
    ("turn_timeout", Kind::Secs),
    ("commands", Kind::Commands),
];

/// Checks every field's type, and that no field is unknown, naming the field.
pub(super) fn check_fields(obj: &serde_json::Map<String, Value>) -> Result<(), Refused> {
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
            Kind::Version => v.is_string() || v.is_u64(),
            Kind::Commands => match v.as_array() {
                Some(list) => {
                    for c in list {
                        let Some(m) = c.as_object() else {
                            return refuse("\"commands\" must be an array of objects");
                        };
                        for (k, v) in m {
                            if !["name", "description", "argHint"].contains(&k.as_str()) {
                                return refuse(format!("unknown field `commands.{k}` (a command has: name, description, argHint)"));
                            }
                            if !v.is_string() {
                                return refuse(format!("\"commands.{k}\" must be a string"));
                            }
                        }
                        let name = m.get("name").and_then(Value::as_str).unwrap_or_default();
                        if name.is_empty()
                            || name.len() > 64
                            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                        {
                            return refuse(format!(
                                "\"commands.name\" '{name}' must be 1 to 64 letters, digits, '-' or '_'"
                            ));
                        }
                        if !m.contains_key("description") {
                            return refuse(format!("\"commands\": '{name}' has no \"description\""));
                        }
                    }
                    list.len() <= 64
                }
                None => false,
            },
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
                (Kind::Words, "command" | "capture") => {
                    "an array of words, e.g. [\"my-agent\", \"--acp\"] (it is run directly, never by a shell)"
                }
                (Kind::Words, _) => "an array of strings",
                (Kind::StrMap, _) => "an object whose values are strings, e.g. {\"KEY\": \"value\"}",
                (Kind::Secs, _) => "a number of seconds",
                (Kind::Count, _) => "a whole number",
                (Kind::Version, _) => "a version, e.g. \"1\"",
                (Kind::Commands, _) => "an array of at most 64 {\"name\", \"description\", \"argHint\"}",
                (Kind::Resume, _) => "false, or an object {\"grace\": seconds, \"buffer\": size}",
                (Kind::Str, _) => "a string",
            };
            if v.is_string() && (key == "command" || key == "capture") {
                return refuse(format!("\"{key}\" is a string; it must be {must}"));
            }
            return refuse(format!("\"{key}\" must be {must}"));
        }
    }
    Ok(())
}
