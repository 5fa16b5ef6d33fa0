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

/// Words that start a well-known credential (OpenAI and Anthropic `sk-`,
/// Stripe `sk_`/`rk_`, GitHub, GitLab, Slack, AWS access key ids, Google API
/// keys): masked wherever they appear in free text, whatever precedes them.
const SECRET_PREFIXES: [&str; 12] =
    ["sk-", "sk_", "rk_", "ghp_", "gho_", "ghs_", "ghu_", "github_pat_", "glpat-", "xox", "AKIA", "AIza"];

/// A secret's shortest length for [`SECRET_PREFIXES`] to apply: `sk-` alone,
/// or a word like `xoxo`, is no credential.
const MIN_PREFIXED_SECRET: usize = 16;

/// Authorization schemes, between a secret label and the credential
/// (`Authorization: Basic x`). `Bearer` is a credential's herald on its own too;
/// `basic` is too common a word to be.
const AUTH_SCHEMES: [&str; 2] = ["bearer", "basic"];

fn looks_like_credential(word: &str) -> bool {
    let w = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_' && c != '-');
    w.len() >= MIN_PREFIXED_SECRET && SECRET_PREFIXES.iter().any(|p| w.starts_with(p))
}

/// `api_key=x`, `"token":"x"`: a name that says secret, then its value in the same word.
fn redact_pair(word: &str) -> Option<String> {
    let at = word.find(['=', ':'])?;
    let (name, value) = (&word[..at], &word[at + 1..]);
    let bare = name.trim_matches(|c: char| c == '-' || c == '"' || c == '\'');
    let value = value.trim_matches(|c: char| c == '"' || c == '\'' || c == ',');
    (!value.is_empty() && is_secret_name(bare)).then(|| format!("{}{MASK}", &word[..=at]))
}

/// One line of an agent's output (its stderr) with secret values masked: the
/// command line's rules (`--api-key x`, `FOO_TOKEN=x`), plus what free text
/// holds: `api_key=x`, `token: x`, `Authorization: Bearer x`, and words
/// shaped like a well-known credential. Blanks between words become one space.
pub fn redact_line(line: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut mask_next = false;
    for w in line.split_whitespace() {
        let lower = w.to_ascii_lowercase();
        let scheme = AUTH_SCHEMES.contains(&lower.as_str());
        if mask_next && !scheme {
            out.push(MASK.to_string());
            mask_next = false;
            continue;
        }
        let label = w.strip_suffix(':').is_some_and(|n| is_secret_name(n.trim_matches('"')));
        mask_next = secret_flag(w) || label || (scheme && mask_next) || lower == "bearer";
        if looks_like_credential(w) {
            out.push(MASK.to_string());
        } else if let Some(r) = redact_assignment(w).or_else(|| redact_pair(w)) {
            out.push(r);
        } else {
            out.push(w.to_string());
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

    #[test]
    fn masks_secrets_in_an_agent_line() {
        // Naming the missing variable is no secret: it is kept as it is.
        assert_eq!(redact_line("missing API key ANTHROPIC_API_KEY"), "missing API key ANTHROPIC_API_KEY");
        assert_eq!(
            redact_line("error: invalid x-api-key sk-ant-api03-abcdefghijklmnop (401)"),
            "error: invalid x-api-key *** (401)"
        );
        assert_eq!(redact_line("OPENAI_API_KEY=sk-1 rejected"), "OPENAI_API_KEY=*** rejected");
        assert_eq!(redact_line("config: api_key=hunter2, model=m"), "config: api_key=*** model=m");
        assert_eq!(redact_line(r#"{"token":"abc","mode":"x"}"#), r#"{"token":***"#);
        assert_eq!(
            redact_line("sent Authorization: Bearer eyJhbGciOi.x.y"),
            "sent Authorization: Bearer ***"
        );
        assert_eq!(redact_line("retrying with --token t2 now"), "retrying with --token *** now");
        assert_eq!(redact_line("password: swordfish"), "password: ***");
        assert_eq!(redact_line("auth: Basic dXNlcjpwYXNz"), "auth: Basic ***");
        // Words that merely start like a credential, or name one, are not masked.
        assert_eq!(redact_line("the xoxo sk- task"), "the xoxo sk- task");
        assert_eq!(
            redact_line("the token expired: basic setup needed"),
            "the token expired: basic setup needed"
        );
    }
}
