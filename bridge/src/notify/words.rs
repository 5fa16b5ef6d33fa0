//! What a notice says in people's words: what a permission request asks
//! (`Run rm -rf build/`), what an elicitation asks (its message), and what a
//! turn did (`finished: 3 tool calls, 1 file changed`).
//!
//! A Web Push is encrypted end to end to the device (RFC 8291): its words are
//! read by the owner alone, so it says them unless `--notify-bare`. The
//! `--notify-url` is any URL of the owner's, not encrypted to the device: it
//! names the event only unless `--notify-text`. Whatever the agent wrote is
//! masked with the banner's rules ([`crate::redact::redact_line`]) before it is
//! bounded and put in a notice.

use std::{
    collections::{hash_map::DefaultHasher, HashMap, HashSet},
    hash::{Hash, Hasher},
};

use serde::Deserialize;
use serde_json::Value;

/// The longest piece of words a notice carries, in bytes: about what a
/// phone shows in two lines, a title and a command, not the whole diff. It
/// keeps the notice (with its options and the rest) well inside one Web Push
/// record ([`super::push::MAX_PAYLOAD`]).
pub const MAX_WORDS: usize = 200;

/// Ends words that were cut at [`MAX_WORDS`].
const CUT_MARK: &str = "…";

/// What is read of the agent's text before masking: enough for masking to
/// see a whole secret that starts inside [`MAX_WORDS`], while a heredoc of a
/// megabyte is not scanned for a notice.
const MAX_READ: usize = 8 * MAX_WORDS;

/// Paths a permission's words name at the most (an edit of many files says
/// how many more).
const MAX_NAMED_PATHS: usize = 3;

/// How much the notices say, per sink: flattened into the notice flags.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct Wording {
    /// Web Push notices name the event only (`it asks: session/request_permission`,
    /// `finished: end_turn`). By default they say what is asked or done (`Run rm -rf build/`,
    /// `finished: 3 tool calls, 1 file changed`): the push is encrypted end to end to your
    /// device, and secrets are masked.
    #[arg(long, conflicts_with = "notify_text")]
    pub notify_bare: bool,

    /// --notify-url's notices say what is asked or done too (in `body`, and the agent's own
    /// words in `text`; secrets masked). Off by default: that URL is not encrypted to your
    /// device, so its notices name the agent and the event only.
    #[arg(long)]
    pub notify_text: bool,
}

/// How one sink's notice is worded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Words {
    /// What is asked or done, in words.
    Plain,
    /// The agent and the event only (the method, the stop reason).
    Bare,
}

impl Wording {
    /// Web Push's: plain unless `--notify-bare`.
    pub fn push(&self) -> Words {
        if self.notify_bare {
            Words::Bare
        } else {
            Words::Plain
        }
    }

    /// `--notify-url`'s: bare unless `--notify-text`.
    pub fn hook(&self) -> Words {
        if self.notify_text {
            Words::Plain
        } else {
            Words::Bare
        }
    }
}

/// The agent's request in words: `words`, what the body says
/// (`Edit src/main.rs`); `own`, the agent's own words for it (the tool
/// call's title, an elicitation's message) for the notice's `text`. Both
/// masked and bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    pub words: Option<String>,
    pub own: Option<String>,
}

/// What the agent's request `line` asks: a permission request's tool call,
/// an elicitation's message (or any request's `message` or `title`).
pub fn asked(line: &[u8]) -> Asked {
    let Ok(v) = serde_json::from_slice::<Value>(line) else { return Asked::default() };
    let Some(p) = v.get("params") else { return Asked::default() };
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(shown).filter(|s| !s.is_empty());
    if let Some(call) = p.get("toolCall") {
        let own = text(call.get("title"));
        return Asked { words: permission(call, own.as_deref()).map(|w| shown(&w)), own };
    }
    let own = text(p.get("message").or_else(|| p.get("title")));
    Asked { words: own.clone(), own }
}

/// A permission's words: its title, and what it runs or touches when the
/// title does not say it already; with no title, a verb of its kind.
fn permission(call: &Value, title: Option<&str>) -> Option<String> {
    let what = command(call).or_else(|| paths(call));
    match (title, what) {
        (Some(t), Some(w)) if mentions(t, &w) => Some(t.to_string()),
        (Some(t), Some(w)) => Some(format!("{t}: {}", w.text())),
        (Some(t), None) => Some(t.to_string()),
        (None, Some(w)) => Some(match verb(call) {
            Some(v) => format!("{v} {}", w.text()),
            None => w.text(),
        }),
        (None, None) => None,
    }
}

/// What a tool call runs or touches.
enum What {
    Command(String),
    Paths(Vec<String>, usize),
}

impl What {
    fn text(&self) -> String {
        match self {
            What::Command(c) => c.clone(),
            What::Paths(named, 0) => named.join(", "),
            What::Paths(named, more) => format!("{} and {more} more", named.join(", ")),
        }
    }
}

/// Whether a title already says `what` (Claude Code's titles hold the
/// command, or the file's name).
fn mentions(title: &str, what: &What) -> bool {
    match what {
        What::Command(c) => title.contains(c.as_str()),
        What::Paths(named, _) => named.iter().any(|p| {
            let name = std::path::Path::new(p).file_name().and_then(|n| n.to_str()).unwrap_or(p);
            title.contains(name)
        }),
    }
}

/// `rawInput.command`: a string, or a program and its arguments.
fn command(call: &Value) -> Option<What> {
    let c = call.pointer("/rawInput/command")?;
    let text = match c {
        Value::String(s) => s.clone(),
        Value::Array(words) => words.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "),
        _ => return None,
    };
    let text = shown(&text);
    (!text.is_empty()).then_some(What::Command(text))
}

/// `locations[].path`, the first few.
fn paths(call: &Value) -> Option<What> {
    let all: Vec<&str> =
        call.get("locations")?.as_array()?.iter().filter_map(|l| l.get("path")?.as_str()).collect();
    let named: Vec<String> = all.iter().take(MAX_NAMED_PATHS).map(|p| shown(p)).collect();
    (!named.is_empty()).then(|| What::Paths(named, all.len().saturating_sub(MAX_NAMED_PATHS)))
}

/// The verb of an ACP tool call's `kind`, for a call with no title.
fn verb(call: &Value) -> Option<&'static str> {
    Some(match call.get("kind")?.as_str()? {
        "execute" => "Run",
        "edit" => "Edit",
        "delete" => "Delete",
        "move" => "Move",
        "read" => "Read",
        "fetch" => "Fetch",
        "search" => "Search",
        _ => return None,
    })
}

/// The agent's text as a notice shows it: on one line, secrets masked, at
/// most [`MAX_WORDS`] bytes (cut at a character, with `…`).
pub fn shown(text: &str) -> String {
    let read = cut(text, MAX_READ);
    // Control characters (a terminal's colours, a NUL) are blanks here;
    // masking makes every run of blanks one space.
    let flat: String = read.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let masked = crate::redact::redact_line(&flat);
    if masked.len() <= MAX_WORDS {
        return masked;
    }
    format!("{}{CUT_MARK}", cut(&masked, MAX_WORDS - CUT_MARK.len()).trim_end())
}

/// A message as its push says it: whole up to `max` characters, else its
/// start and `…`. Not masked: the sender wrote it for the owner, and the push
/// is encrypted to the owner's device.
pub fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((at, _)) => format!("{}{CUT_MARK}", text[..at].trim_end()),
    }
}

/// `text`'s first `max` bytes at most, cut at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut at = max;
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    &text[..at]
}

/// Tool calls one turn keeps apart (by id) at the most: past it, the turn
/// has "more than" this many and its files are not counted. Bounds what an
/// agent that loops costs the bridge.
const MAX_CALLS: usize = 512;

/// Paths one tool call counts at the most: past it, the turn's files are not
/// counted (an edit of a hundred files is said as a count of tool calls).
const MAX_CALL_PATHS: usize = 32;

/// The `kind`s of tool calls that change files (ACP's `ToolKind`).
const CHANGING_KINDS: [&str; 3] = ["edit", "delete", "move"];

/// What one turn's tool calls did, as the agent's `session/update`s told it.
#[derive(Debug, Default)]
pub struct Tally {
    calls: HashMap<String, Call>,
    /// More tool calls than [`MAX_CALLS`] were seen.
    overflow: bool,
}

/// One tool call, as its `tool_call` and `tool_call_update`s said.
#[derive(Debug, Default)]
struct Call {
    kind: Option<String>,
    status: Option<String>,
    /// Hashes of `locations[].path` (a path may be long; a hash is 8 bytes).
    locations: Vec<u64>,
    /// Hashes of the paths of its `diff` content.
    diffs: Vec<u64>,
    /// More paths than [`MAX_CALL_PATHS`].
    overflow: bool,
}

/// What a turn did, in counts; `files` is `None` when it could not be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub calls: usize,
    /// More than [`MAX_CALLS`] tool calls (`calls` is the bound).
    pub more: bool,
    pub files: Option<usize>,
}

/// The longest ACP session id a turn is counted for: ids are short (a UUID);
/// a longer one is not kept, and its turn not counted.
const MAX_SESSION_ID: usize = 256;

/// A `session/prompt`, as far as its session goes (the prompt itself is skipped).
#[derive(Deserialize)]
struct PromptLine {
    params: PromptParams,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptParams {
    session_id: String,
}

/// The ACP session a client's `session/prompt` line is for.
pub fn prompt_session(line: &[u8]) -> Option<String> {
    let p: PromptLine = serde_json::from_slice(line).ok()?;
    let id = p.params.session_id;
    (id.len() <= MAX_SESSION_ID).then_some(id)
}

/// A `session/update` line, as far as tool calls go.
#[derive(Deserialize)]
struct UpdateLine {
    method: String,
    params: UpdateParams,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateParams {
    session_id: String,
    update: ToolUpdate,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolUpdate {
    session_update: String,
    tool_call_id: Option<String>,
    kind: Option<String>,
    status: Option<String>,
    locations: Option<Vec<PathOf>>,
    content: Option<Vec<ContentOf>>,
}

#[derive(Deserialize)]
struct PathOf {
    path: Option<String>,
}

#[derive(Deserialize)]
struct ContentOf {
    #[serde(rename = "type")]
    kind: Option<String>,
    path: Option<String>,
}

/// The ACP session and tool call update of a `session/update` line that
/// reports a tool call (`tool_call`, `tool_call_update`); `None` otherwise.
pub fn tool_update(line: &[u8]) -> Option<(String, ToolCallSeen)> {
    let u: UpdateLine = serde_json::from_slice(line).ok()?;
    let update = u.params.update;
    let tool = matches!(update.session_update.as_str(), "tool_call" | "tool_call_update");
    if u.method != "session/update" || !tool {
        return None;
    }
    let hashes = |paths: Vec<Option<String>>| paths.into_iter().flatten().map(|p| hash(&p)).collect();
    let diffs = update
        .content
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.kind.as_deref() == Some("diff"))
        .map(|c| c.path)
        .collect();
    let seen = ToolCallSeen {
        id: update.tool_call_id?,
        kind: update.kind,
        status: update.status,
        locations: update.locations.map(|l| hashes(l.into_iter().map(|p| p.path).collect())),
        diffs: hashes(diffs),
    };
    Some((u.params.session_id, seen))
}

/// One tool call update, as a [`Tally`] takes it.
#[derive(Debug)]
pub struct ToolCallSeen {
    id: String,
    kind: Option<String>,
    status: Option<String>,
    /// `None`: the update leaves its locations as they were.
    locations: Option<Vec<u64>>,
    diffs: Vec<u64>,
}

fn hash(path: &str) -> u64 {
    let mut h = DefaultHasher::new();
    path.hash(&mut h);
    h.finish()
}

impl Tally {
    /// Takes one tool call update of the turn.
    pub fn saw(&mut self, seen: ToolCallSeen) {
        if !self.calls.contains_key(&seen.id) && self.calls.len() >= MAX_CALLS {
            self.overflow = true;
            return;
        }
        let call = self.calls.entry(seen.id).or_default();
        call.kind = seen.kind.or(call.kind.take());
        call.status = seen.status.or(call.status.take());
        if let Some(l) = seen.locations {
            call.locations = l;
        }
        for d in seen.diffs {
            if !call.diffs.contains(&d) {
                call.diffs.push(d);
            }
        }
        if call.locations.len() + call.diffs.len() > MAX_CALL_PATHS {
            call.overflow = true;
            call.locations.truncate(MAX_CALL_PATHS);
            call.diffs.truncate(MAX_CALL_PATHS);
        }
    }

    /// The turn's counts.
    pub fn summary(&self) -> Summary {
        Summary { calls: self.calls.len(), more: self.overflow, files: self.files() }
    }

    /// The files the turn's finished edits changed: those its diffs name,
    /// and the locations of its edits, deletions and moves. `None` when it
    /// cannot be told: a call that changes files but names none, one that
    /// has not finished (`completed` or `failed`), or too many to keep.
    fn files(&self) -> Option<usize> {
        if self.overflow {
            return None;
        }
        let mut files: HashSet<u64> = HashSet::new();
        for call in self.calls.values() {
            let changing = call.kind.as_deref().is_some_and(|k| CHANGING_KINDS.contains(&k));
            if !changing && call.diffs.is_empty() {
                continue;
            }
            match call.status.as_deref() {
                Some("failed") => continue,
                Some("completed") => {}
                _ => return None,
            }
            let mut named = call.diffs.iter().chain(call.locations.iter().filter(|_| changing)).peekable();
            if call.overflow || named.peek().is_none() {
                return None;
            }
            files.extend(named);
        }
        Some(files.len())
    }
}

/// A finished turn in words: `finished: 3 tool calls, 1 file changed`, and
/// why it stopped when that was not the end of its turn. A count that could
/// not be told is left out; no files changed is left out too (a command it
/// ran may have changed some that no edit named).
pub fn finished(stop_reason: &str, summary: Option<&Summary>) -> String {
    let mut parts = Vec::new();
    if let Some(s) = summary {
        parts.push(match (s.calls, s.more) {
            (n, true) => format!("more than {n} tool calls"),
            (0, _) => "no tool calls".to_string(),
            (1, _) => "1 tool call".to_string(),
            (n, _) => format!("{n} tool calls"),
        });
        match s.files {
            Some(1) => parts.push("1 file changed".to_string()),
            Some(n) if n > 1 => parts.push(format!("{n} files changed")),
            _ => {}
        }
    }
    let mut out =
        if parts.is_empty() { "finished".to_string() } else { format!("finished: {}", parts.join(", ")) };
    if let Some(why) = stopped(stop_reason) {
        out.push_str(&format!(" ({why})"));
    }
    out
}

/// ACP's `stopReason` in words; `None` for `end_turn` (the turn simply ended).
fn stopped(reason: &str) -> Option<String> {
    Some(match reason {
        "end_turn" => return None,
        "max_tokens" => "stopped at its token limit".to_string(),
        "max_turn_requests" => "stopped at its limit of requests in one turn".to_string(),
        "refusal" => "it refused to go on".to_string(),
        "cancelled" => "cancelled".to_string(),
        "error" => "it ended with an error".to_string(),
        other => format!("stopped: {other}"),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ask(call: Value) -> Asked {
        let params = json!({"sessionId": "s", "toolCall": call, "options": []});
        let line =
            json!({"jsonrpc": "2.0", "id": 1, "method": "session/request_permission", "params": params});
        asked(line.to_string().as_bytes())
    }

    fn words(call: Value) -> String {
        ask(call).words.unwrap_or_default()
    }

    #[test]
    fn a_permission_says_its_title_and_what_it_runs_or_touches() {
        let rm = json!({"command": "rm -rf build/"});
        let call = json!({"title": "Terminal", "kind": "execute", "rawInput": rm});
        assert_eq!(words(call), "Terminal: rm -rf build/");
        assert_eq!(words(json!({"title": "`rm -rf build/`", "rawInput": rm})), "`rm -rf build/`");
        let ls = json!({"kind": "execute", "rawInput": {"command": ["ls", "-l"]}});
        assert_eq!(words(ls), "Run ls -l");
        let edit =
            json!({"title": "Edit `main.rs`", "kind": "edit", "locations": [{"path": "/p/src/main.rs"}]});
        assert_eq!(words(edit), "Edit `main.rs`", "the title names the file already");
        let edit = json!({"kind": "edit", "locations": [{"path": "src/main.rs"}]});
        assert_eq!(words(edit), "Edit src/main.rs");
        let many: Vec<Value> = (0..5).map(|i| json!({"path": format!("f{i}")})).collect();
        assert_eq!(words(json!({"kind": "delete", "locations": many})), "Delete f0, f1, f2 and 2 more");
        assert_eq!(ask(json!({"toolCallId": "t"})), Asked::default());
    }

    #[test]
    fn words_are_masked_flat_and_bounded() {
        let secret = json!({"command": "deploy --api-key sk-ant-api03-abcdefghijklmnop\nnow"});
        let a = ask(json!({"title": "Run", "rawInput": secret}));
        assert_eq!(a.words.as_deref(), Some("Run: deploy --api-key *** now"));
        let w = shown(&format!("echo {}", "é".repeat(300)));
        assert!(w.len() <= MAX_WORDS && w.ends_with(CUT_MARK), "{w}");
        let e = json!({"jsonrpc": "2.0", "id": 2, "method": "elicitation/create",
                       "params": {"message": "which branch?"}});
        assert_eq!(asked(e.to_string().as_bytes()).words.as_deref(), Some("which branch?"));
    }

    fn update(tally: &mut Tally, u: Value) {
        let line = json!({"jsonrpc": "2.0", "method": "session/update",
                          "params": {"sessionId": "s", "update": u}});
        let (session, seen) = tool_update(line.to_string().as_bytes()).expect("a tool call update");
        assert_eq!(session, "s");
        tally.saw(seen);
    }

    fn call(id: &str, kind: &str, status: &str) -> Value {
        json!({"sessionUpdate": "tool_call", "toolCallId": id, "kind": kind, "status": status})
    }

    fn status(id: &str, status: &str) -> Value {
        json!({"sessionUpdate": "tool_call_update", "toolCallId": id, "status": status})
    }

    #[test]
    fn a_turn_counts_its_tool_calls_and_the_files_its_edits_changed() {
        let mut t = Tally::default();
        update(&mut t, call("a", "execute", "pending"));
        let mut edit = call("b", "edit", "pending");
        edit["content"] = json!([{"type": "diff", "path": "/p/a.rs", "oldText": "x", "newText": "y"}]);
        update(&mut t, edit);
        update(&mut t, status("a", "completed"));
        assert_eq!(t.summary(), Summary { calls: 2, more: false, files: None }, "an unfinished edit");
        update(&mut t, status("b", "completed"));
        let mut failed = call("c", "edit", "failed");
        failed["locations"] = json!([{"path": "/p/b.rs"}]);
        update(&mut t, failed);
        let s = t.summary();
        assert_eq!(s, Summary { calls: 3, more: false, files: Some(1) });
        assert_eq!(finished("end_turn", Some(&s)), "finished: 3 tool calls, 1 file changed");
        let none = Summary { calls: 0, more: false, files: Some(0) };
        assert_eq!(finished("cancelled", Some(&none)), "finished: no tool calls (cancelled)");
        assert_eq!(finished("max_tokens", None), "finished (stopped at its token limit)");
        update(&mut t, call("d", "edit", "completed"));
        assert_eq!(t.summary().files, None, "an edit that names no file");
        let chunk =
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "tool_call"}});
        let line = json!({"jsonrpc": "2.0", "method": "session/update",
                          "params": {"sessionId": "s", "update": chunk}});
        assert!(tool_update(line.to_string().as_bytes()).is_none());
    }

    #[test]
    fn a_turn_of_too_many_calls_says_more_than_the_bound_and_no_files() {
        let mut t = Tally::default();
        for i in 0..=MAX_CALLS {
            update(&mut t, call(&format!("c{i}"), "read", "completed"));
        }
        let s = t.summary();
        assert_eq!(s, Summary { calls: MAX_CALLS, more: true, files: None });
        assert_eq!(finished("end_turn", Some(&s)), format!("finished: more than {MAX_CALLS} tool calls"));
    }
}
