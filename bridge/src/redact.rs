//! Masking secrets in command lines before they are printed.
//!
//! Agents are often started with credentials on the command line
//! (`--api-key sk-…`, `OPENAI_API_KEY=sk-…`). The banner shows the command so
//! the user can check what runs; it must never show those values.

const MASK: &str = "***";

/// Parts of a flag or variable name that mark its value as secret.
const SECRET_WORDS: [&str; 7] = ["key", "token", "secret", "password", "passwd", "auth", "credential"];

fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| n.contains(w))
}

/// `--api-key`, `--token`, `-token`: a flag whose next word is a secret.
fn secret_flag(word: &str) -> bool {
    word.starts_with('-') && !word.contains('=') && is_secret_name(word.trim_start_matches('-'))
}

/// Masks one `NAME=value` / `--name=value` word if the name is secret.
fn redact_assignment(word: &str) -> Option<String> {
    let (name, _value) = word.split_once('=')?;
    let bare = name.trim_start_matches('-');
    let env_style = !name.starts_with('-')
        && !bare.is_empty()
        && bare.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if (name.starts_with('-') || env_style) && is_secret_name(bare) {
        Some(format!("{name}={MASK}"))
    } else {
        None
    }
}

/// An environment variable's value as shown to people: masked when its name
/// says it is a secret.
pub fn env_value(name: &str, value: &str) -> String {
    if is_secret_name(name) {
        MASK.to_string()
    } else {
        value.to_string()
    }
}

/// The command as one line with secret values replaced by `***`. Words with
/// spaces are quoted so the line reads like what was typed.
pub fn redact_command(words: &[String]) -> String {
    let mut out = Vec::with_capacity(words.len());
    let mut mask_next = false;
    for w in words {
        if mask_next {
            out.push(MASK.to_string());
            mask_next = false;
            continue;
        }
        if let Some(r) = redact_assignment(w) {
            out.push(r);
        } else {
            mask_next = secret_flag(w);
            out.push(quote(w));
        }
    }
    out.join(" ")
}

fn quote(w: &str) -> String {
    if w.is_empty() || w.contains(char::is_whitespace) {
        format!("'{}'", w.replace('\'', "'\\''"))
    } else {
        w.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &[&str]) -> String {
        redact_command(&s.iter().map(|x| x.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn masks_secret_words() {
        assert_eq!(r(&["agent", "--api-key", "sk-1", "--model", "m"]), "agent --api-key *** --model m");
        assert_eq!(r(&["agent", "--token", "t"]), "agent --token ***");
        assert_eq!(r(&["agent", "--api-key=sk-1"]), "agent --api-key=***");
        assert_eq!(
            r(&["env", "FOO_TOKEN=abc", "OPENAI_API_KEY=sk", "PATH=/bin", "agent"]),
            "env FOO_TOKEN=*** OPENAI_API_KEY=*** PATH=/bin agent"
        );
        assert_eq!(r(&["echo", "hello world"]), "echo 'hello world'");
        // A lowercase key=value argument is data, not an env assignment.
        assert_eq!(r(&["agent", "mode=token"]), "agent mode=token");
    }
}
