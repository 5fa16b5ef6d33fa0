//! The threads: every message to the owner and every reply, a thread per
//! sender, kept in `reach/threads.json` (0600 in a 0700 folder) and written
//! whole, atomically, at each change (messages come a few a minute at most:
//! the notes' rate limit). Which replies were handed to their thread's sender
//! is kept there too, so a reply is returned once across restarts of the
//! host and of the MCP server that asked.

use std::{
    collections::VecDeque,
    fs, io,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tracing::warn;

use crate::{devices, home};

/// Threads kept: past it, the one quiet longest is dropped. A sender is a
/// name chosen on the machine; this bounds what names made up in a loop cost.
pub const MAX_THREADS: usize = 64;

/// Items (messages and replies) a thread keeps: past it, the oldest go. A
/// reply not yet returned is never dropped for a newer message: see [`Threads::add`].
pub const MAX_ITEMS: usize = 200;

/// Items of each thread a full listing carries: a phone's screenful and more.
pub const LISTED_ITEMS: usize = 50;

/// The most a listing says, in bytes of text: within what a page reads in
/// one answer, whatever the senders wrote.
pub const MAX_LISTING_TEXT: usize = 768 * 1024;

/// Threads a host's listing names (the most recent): a phone's list.
pub const SUMMARY_THREADS: usize = 16;

/// How much of a thread's newest item a listing says.
pub const SUMMARY_CHARS: usize = 160;

/// Who wrote an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Author {
    /// The thread's sender, on the workstation: a message.
    Agent,
    /// One of the owner's devices: a reply.
    Device,
}

/// A message or a reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Item {
    /// Across all threads, one more per item: what a listing's `since` counts.
    pub seq: u64,
    /// `m-<seq>` for a message, `r-<seq>` for a reply.
    pub id: String,
    pub from: Author,
    /// The device's name (or short NodeId) of a reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    pub text: String,
    /// RFC 3339.
    pub at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// A question the sender waits on (an agent's permission prompt), to be
    /// answered Allow or Deny; `q-<seq>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask: Option<Ask>,
    /// A device's answer to a question (`reply_to` names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
}

/// What a question asks (Claude Code's permission prompt, as its channel gives it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ask {
    /// The sender's id for it, handed back with the verdict.
    pub request_id: String,
    pub tool: String,
    /// What the tool would do, in the sender's words or its input (bounded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub preview: String,
}

/// The answer to a question.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Behavior {
    Allow,
    Deny,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub behavior: Behavior,
    /// The question's `request_id`, for the sender.
    pub request_id: String,
}

/// An item before it has its seq, id and time.
struct NewItem<'a> {
    from: Author,
    device: Option<String>,
    text: &'a str,
    reply_to: Option<&'a str>,
    ask: Option<Ask>,
    verdict: Option<Verdict>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Thread {
    name: String,
    items: VecDeque<Item>,
    /// Replies up to this seq were handed to the sender.
    #[serde(default)]
    taken: u64,
}

impl Thread {
    fn last(&self) -> u64 {
        self.items.back().map_or(0, |i| i.seq)
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    seq: u64,
    threads: Vec<Thread>,
}

/// Why a change was refused.
#[derive(Debug, thiserror::Error)]
pub enum ThreadError {
    #[error("unknown thread")]
    UnknownThread,
    #[error("no message {0} in this thread")]
    UnknownItem(String),
    #[error("{0} is not a question")]
    NotAQuestion(String),
    #[error("{0} was answered already")]
    Answered(String),
    #[error("could not save the messages ({path}): {cause}")]
    Save { path: PathBuf, cause: String },
}

/// The threads, in memory and on disk.
#[derive(Debug)]
pub struct Threads {
    path: PathBuf,
    file: File,
}

impl Threads {
    /// The threads kept at `path`. A file that does not parse is moved aside
    /// (named in the log) and a new one started: messages are a convenience,
    /// and the bad file is kept for whoever wants to read it.
    pub fn open(path: &Path) -> Self {
        let file = match home::read_json::<File>(path) {
            Ok(f) => f,
            Err(e) => {
                let aside = path.with_extension(format!("json.bad-{}", devices::now_ms()));
                let moved = fs::rename(path, &aside);
                warn!(
                    "{e}; {} and starting with no messages",
                    match moved {
                        Ok(()) => format!("moved aside to {}", aside.display()),
                        Err(m) => format!("could not move it aside ({m})"),
                    }
                );
                File::default()
            }
        };
        Self { path: path.to_path_buf(), file }
    }

    /// The newest item's seq (0: none yet).
    pub fn seq(&self) -> u64 {
        self.file.seq
    }

    pub fn has(&self, thread: &str) -> bool {
        self.file.threads.iter().any(|t| t.name == thread)
    }

    /// Adds an item to `thread` (a message makes the thread if need be; a
    /// reply needs it to exist) and saves. `reply_to` must name an item of
    /// the thread.
    pub fn add(
        &mut self,
        thread: &str,
        from: Author,
        device: Option<String>,
        text: &str,
        reply_to: Option<&str>,
    ) -> Result<Item, ThreadError> {
        self.add_item(thread, NewItem { from, device, text, reply_to, ask: None, verdict: None })
    }

    /// A question from the sender (made a thread if need be).
    pub fn ask(&mut self, thread: &str, text: &str, ask: Ask) -> Result<Item, ThreadError> {
        let new = NewItem {
            from: Author::Agent,
            device: None,
            text,
            reply_to: None,
            ask: Some(ask),
            verdict: None,
        };
        self.add_item(thread, new)
    }

    /// A device's answer to question `question`: the first one counts.
    pub fn answer(
        &mut self,
        thread: &str,
        question: &str,
        behavior: Behavior,
        device: String,
    ) -> Result<Item, ThreadError> {
        let t = self.file.threads.iter().find(|t| t.name == thread).ok_or(ThreadError::UnknownThread)?;
        let q = t
            .items
            .iter()
            .find(|i| i.id == question)
            .ok_or_else(|| ThreadError::UnknownItem(question.into()))?;
        let ask = q.ask.clone().ok_or_else(|| ThreadError::NotAQuestion(question.into()))?;
        if t.items.iter().any(|i| i.verdict.is_some() && i.reply_to.as_deref() == Some(question)) {
            return Err(ThreadError::Answered(question.into()));
        }
        let text = match behavior {
            Behavior::Allow => format!("Allowed: {}", ask.tool),
            Behavior::Deny => format!("Denied: {}", ask.tool),
        };
        let verdict = Verdict { behavior, request_id: ask.request_id };
        let new = NewItem {
            from: Author::Device,
            device: Some(device),
            text: &text,
            reply_to: Some(question),
            ask: None,
            verdict: Some(verdict),
        };
        self.add_item(thread, new)
    }

    fn add_item(&mut self, thread: &str, new: NewItem<'_>) -> Result<Item, ThreadError> {
        let NewItem { from, device, text, reply_to, ask, verdict } = new;
        let at = self.file.threads.iter().position(|t| t.name == thread);
        let at = match (at, from) {
            (Some(i), _) => i,
            (None, Author::Device) => return Err(ThreadError::UnknownThread),
            (None, Author::Agent) => {
                if self.file.threads.len() >= MAX_THREADS {
                    // The quietest goes (its unreturned replies with it: the
                    // sender has not asked for them in all that time).
                    if let Some(q) = (0..self.file.threads.len()).min_by_key(|&i| self.file.threads[i].last())
                    {
                        self.file.threads.remove(q);
                    }
                }
                self.file.threads.push(Thread { name: thread.to_string(), ..Default::default() });
                self.file.threads.len() - 1
            }
        };
        if let Some(r) = reply_to {
            if !self.file.threads[at].items.iter().any(|i| i.id == r) {
                return Err(ThreadError::UnknownItem(r.to_string()));
            }
        }
        let seq = self.file.seq + 1;
        let kind = match (from, ask.is_some()) {
            (Author::Agent, true) => "q",
            (Author::Agent, false) => "m",
            (Author::Device, _) => "r",
        };
        let item = Item {
            seq,
            id: format!("{kind}-{seq}"),
            from,
            device,
            text: text.to_string(),
            at: devices::rfc3339(devices::now_ms()),
            reply_to: reply_to.map(str::to_string),
            ask,
            verdict,
        };
        let t = &mut self.file.threads[at];
        t.items.push_back(item.clone());
        while t.items.len() > MAX_ITEMS {
            // The oldest item that is not a reply still to be returned.
            let taken = t.taken;
            match t.items.iter().position(|i| i.from == Author::Agent || i.seq <= taken) {
                Some(p) => {
                    t.items.remove(p);
                }
                None => {
                    t.items.pop_front();
                }
            }
        }
        self.file.seq = seq;
        self.save()?;
        Ok(item)
    }

    /// The replies of `thread` not handed out yet, marked handed out (and
    /// saved) before they are returned: each is returned once.
    pub fn take_replies(&mut self, thread: &str) -> Result<Vec<Item>, ThreadError> {
        let Some(t) = self.file.threads.iter_mut().find(|t| t.name == thread) else {
            return Ok(Vec::new());
        };
        let taken = t.taken;
        let new: Vec<Item> =
            t.items.iter().filter(|i| i.from == Author::Device && i.seq > taken).cloned().collect();
        if let Some(last) = new.last() {
            t.taken = last.seq;
            self.save()?;
        }
        Ok(new)
    }

    /// Replies of `thread` not handed out yet.
    pub fn waiting_replies(&self, thread: &str) -> usize {
        self.file
            .threads
            .iter()
            .find(|t| t.name == thread)
            .map_or(0, |t| t.items.iter().filter(|i| i.from == Author::Device && i.seq > t.taken).count())
    }

    /// The threads as a device lists them, most recent first: every item
    /// after `since` (or each thread's last [`LISTED_ITEMS`]), at most
    /// [`MAX_LISTING_TEXT`] bytes of text in all (older items left out first).
    pub fn listing(&self, since: Option<u64>) -> Value {
        let mut order: Vec<&Thread> = self.file.threads.iter().collect();
        order.sort_by_key(|t| std::cmp::Reverse(t.last()));
        let mut budget = MAX_LISTING_TEXT;
        let mut out = Vec::new();
        for t in order {
            let fresh = t.items.iter().filter(|i| since.is_none_or(|s| i.seq > s));
            let mut items: Vec<&Item> = fresh.collect();
            if since.is_none() && items.len() > LISTED_ITEMS {
                items.drain(..items.len() - LISTED_ITEMS);
            }
            // Newest first against the budget, then back in order.
            let mut kept = Vec::new();
            for i in items.into_iter().rev() {
                if i.text.len() > budget {
                    break;
                }
                budget -= i.text.len();
                kept.push(i);
            }
            kept.reverse();
            if kept.is_empty() && since.is_some() {
                continue;
            }
            out.push(json!({"name": t.name, "items": kept}));
        }
        json!({"threads": out, "seq": self.file.seq})
    }

    /// The threads in short, most recent first, as a host's listing carries
    /// them: each one's newest item (its text cut to [`SUMMARY_CHARS`]).
    pub fn summary(&self) -> Value {
        let mut order: Vec<&Thread> = self.file.threads.iter().filter(|t| !t.items.is_empty()).collect();
        order.sort_by_key(|t| std::cmp::Reverse(t.last()));
        let threads: Vec<Value> = order
            .into_iter()
            .take(SUMMARY_THREADS)
            .filter_map(|t| {
                let last = t.items.back()?;
                let text = match last.text.char_indices().nth(SUMMARY_CHARS) {
                    Some((at, _)) => format!("{}…", &last.text[..at]),
                    None => last.text.clone(),
                };
                Some(json!({
                    "name": t.name,
                    "seq": last.seq,
                    "last": {"id": last.id, "from": last.from, "text": text, "at": last.at},
                }))
            })
            .collect();
        json!({"seq": self.file.seq, "threads": threads})
    }

    fn save(&self) -> Result<(), ThreadError> {
        let err = |cause: String| ThreadError::Save { path: self.path.clone(), cause };
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
            let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
        }
        let text = serde_json::to_vec(&self.file).map_err(|e| err(e.to_string()))?;
        home::write_secure_atomic(&self.path, &text).map_err(|e| err(e.to_string()))
    }
}

impl From<ThreadError> for io::Error {
    fn from(e: ThreadError) -> Self {
        io::Error::other(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("reach/threads.json");
        (d, p)
    }

    #[test]
    fn a_reply_is_taken_once_also_after_reopening() {
        let (_d, p) = fresh();
        let mut t = Threads::open(&p);
        let m = t.add("ci", Author::Agent, None, "deploy?", None).unwrap();
        assert_eq!(m.id, "m-1");
        assert!(matches!(t.add("nope", Author::Device, None, "x", None), Err(ThreadError::UnknownThread)));
        assert!(matches!(
            t.add("ci", Author::Device, None, "x", Some("m-9")),
            Err(ThreadError::UnknownItem(_))
        ));
        let r = t.add("ci", Author::Device, Some("phone".into()), "yes", Some("m-1")).unwrap();
        assert_eq!(r.id, "r-2");
        assert_eq!(t.waiting_replies("ci"), 1);
        drop(t);
        let mut t = Threads::open(&p);
        assert_eq!(t.take_replies("ci").unwrap(), vec![r]);
        drop(t);
        let mut t = Threads::open(&p);
        assert!(t.take_replies("ci").unwrap().is_empty(), "returned once, across a restart");
        assert_eq!(t.seq(), 2);
        let mode = fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_question_is_answered_once_and_only_a_question_is() {
        let (_d, p) = fresh();
        let mut t = Threads::open(&p);
        let m = t.add("claude", Author::Agent, None, "hello", None).unwrap();
        let ask = Ask { request_id: "abcde".into(), tool: "Bash".into(), preview: "npm test".into() };
        let q = t.ask("claude", "Bash: run the tests", ask).unwrap();
        assert!(q.id.starts_with("q-"));
        assert!(matches!(
            t.answer("claude", &m.id, Behavior::Allow, "phone".into()),
            Err(ThreadError::NotAQuestion(_))
        ));
        let r = t.add("claude", Author::Device, None, "yes", Some(&q.id)).unwrap();
        assert!(r.verdict.is_none(), "text is never a verdict");
        let v = t.answer("claude", &q.id, Behavior::Allow, "phone".into()).unwrap();
        assert_eq!(v.verdict, Some(Verdict { behavior: Behavior::Allow, request_id: "abcde".into() }));
        assert!(matches!(
            t.answer("claude", &q.id, Behavior::Deny, "laptop".into()),
            Err(ThreadError::Answered(_))
        ));
        let got = t.take_replies("claude").unwrap();
        assert_eq!(got.len(), 2);
        assert!(got[0].verdict.is_none() && got[1].verdict.is_some());
    }

    #[test]
    fn threads_and_items_are_bounded_and_waiting_replies_kept() {
        let (_d, p) = fresh();
        let mut t = Threads::open(&p);
        t.add("a", Author::Agent, None, "first", None).unwrap();
        let r = t.add("a", Author::Device, None, "keep me", None).unwrap();
        for n in 0..MAX_ITEMS + 5 {
            t.add("a", Author::Agent, None, &format!("m{n}"), None).unwrap();
        }
        assert_eq!(t.take_replies("a").unwrap(), vec![r], "an unreturned reply outlives newer messages");
        for n in 0..MAX_THREADS + 3 {
            t.add(&format!("t{n}"), Author::Agent, None, "x", None).unwrap();
        }
        assert_eq!(t.file.threads.len(), MAX_THREADS);
        assert!(!t.has("a"), "the quietest thread went");
        let l = t.listing(Some(t.seq() - 1));
        assert_eq!(l["threads"].as_array().unwrap().len(), 1, "{l}");
    }

    #[test]
    fn a_bad_file_is_moved_aside_not_lost() {
        let (d, p) = fresh();
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, b"{not json").unwrap();
        let mut t = Threads::open(&p);
        t.add("a", Author::Agent, None, "x", None).unwrap();
        let aside: Vec<_> = fs::read_dir(d.path().join("reach"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".bad-"))
            .collect();
        assert_eq!(aside.len(), 1);
        assert_eq!(fs::read(aside[0].path()).unwrap(), b"{not json");
    }
}
