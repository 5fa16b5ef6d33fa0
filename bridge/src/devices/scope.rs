//! What an admitted device may do: a set of verbs over a set of agents,
//! until an optional expiry. Trust says *who* gets in; a scope says *what*
//! they may do once in. docs/security.md has the table of verb × path.
//!
//! A device with no scope written (every device paired before scopes, the
//! account's, `iroh allow`'s) holds the owner's: every verb at every agent
//! that admits it, forever. A scope is granted with a pairing code
//! (`iroh pair --scope observe,answer --agent build --for 8h`) and changed
//! with `thunderbolt devices scope`; it lives in `iroh/devices.json` beside
//! the device's name, so the allow file stays the reference tool's format.
//!
//! Some verbs need others to mean anything, and carry them: `prompt` and
//! `answer` act inside a session the device must see (`observe`), and a
//! device that may `start` sessions drives them (`prompt`, `answer`).

use serde::{Deserialize, Serialize};

/// One thing a device may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// See a session (list, join) and its history.
    Observe,
    /// Send the agent requests (a prompt, a cancel, a new ACP session).
    Prompt,
    /// Answer the agent's own requests (permissions, elicitations), in the
    /// session or from a notice.
    Answer,
    /// Open new sessions.
    Start,
    /// Send files to the workstation and fetch files from it.
    Files,
}

impl Verb {
    pub const ALL: [Verb; 5] = [Verb::Observe, Verb::Prompt, Verb::Answer, Verb::Start, Verb::Files];

    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Observe => "observe",
            Verb::Prompt => "prompt",
            Verb::Answer => "answer",
            Verb::Start => "start",
            Verb::Files => "files",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }

    /// The verbs this one cannot go without.
    fn implies(self) -> &'static [Verb] {
        match self {
            Verb::Prompt | Verb::Answer => &[Verb::Observe],
            Verb::Start => &[Verb::Prompt, Verb::Answer, Verb::Observe],
            Verb::Observe | Verb::Files => &[],
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of verbs, a byte: a session's hub keeps its device's in an atomic
/// and reads it on every run of frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Verbs(u8);

impl Verbs {
    /// Everything: the owner's, and every device's with no scope written.
    pub const ALL: Verbs = Verbs(0b1_1111);
    pub const NONE: Verbs = Verbs(0);

    pub fn has(self, v: Verb) -> bool {
        self.0 & v.bit() != 0
    }

    pub fn is_all(self) -> bool {
        self == Verbs::ALL
    }

    /// The set with what each verb in it implies.
    pub fn of(verbs: impl IntoIterator<Item = Verb>) -> Verbs {
        let mut bits = 0;
        for v in verbs {
            bits |= v.bit();
            for w in v.implies() {
                bits |= w.bit();
            }
        }
        Verbs(bits)
    }

    pub fn iter(self) -> impl Iterator<Item = Verb> {
        Verb::ALL.into_iter().filter(move |v| self.has(*v))
    }

    pub fn to_bits(self) -> u8 {
        self.0
    }

    pub fn from_bits(bits: u8) -> Verbs {
        Verbs(bits & Verbs::ALL.0)
    }

    /// Whether every verb of `other` is in this set (a share may carry no
    /// more than its minter holds).
    pub fn covers(self, other: Verbs) -> bool {
        other.0 & !self.0 == 0
    }
}

impl std::fmt::Display for Verbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 == 0 {
            return f.write_str("nothing");
        }
        let words: Vec<&str> = self.iter().map(Verb::as_str).collect();
        f.write_str(&words.join(","))
    }
}

/// `observe,answer` (or `all`) as the verbs it names, with what they imply.
impl std::str::FromStr for Verbs {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut verbs = Vec::new();
        for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            if word.eq_ignore_ascii_case("all") {
                return Ok(Verbs::ALL);
            }
            let v = Verb::ALL.into_iter().find(|v| v.as_str().eq_ignore_ascii_case(word)).ok_or_else(|| {
                format!("'{word}' is not a verb: the verbs are observe, prompt, answer, start, files (or all)")
            })?;
            verbs.push(v);
        }
        if verbs.is_empty() {
            return Err("name at least one verb: observe, prompt, answer, start, files (or all)".into());
        }
        Ok(Verbs::of(verbs))
    }
}

impl Serialize for Verbs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter().map(Verb::as_str))
    }
}

impl<'de> Deserialize<'de> for Verbs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A verb this version does not know grants nothing (a newer bridge's
        // file read by an older one narrows, never widens).
        let words: Vec<String> = Vec::deserialize(d)?;
        Ok(Verbs::of(words.iter().filter_map(|w| Verb::ALL.into_iter().find(|v| v.as_str() == w))))
    }
}

/// What a device may do, as kept in `devices.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Scope {
    pub verbs: Verbs,
    /// The host's agents it may reach, by manifest name (`None`: every agent
    /// that admits it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<String>>,
    /// When it stops being admitted anywhere (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<u64>,
    /// A share's guest (`thunderbolt share`): the one session it may see
    /// and join, by id; no other is listed or joinable, none is started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

impl Scope {
    /// The owner's: everything, everywhere, forever.
    pub fn full() -> Scope {
        Scope { verbs: Verbs::ALL, agents: None, until_ms: None, session: None }
    }

    /// Nothing, nowhere: what a device holds while the devices file cannot
    /// be read (its scope is unknown, so it is taken as the narrowest).
    pub fn none() -> Scope {
        Scope { verbs: Verbs::NONE, agents: Some(Vec::new()), until_ms: None, session: None }
    }

    pub fn is_full(&self) -> bool {
        self.verbs.is_all() && self.agents.is_none() && self.until_ms.is_none() && self.session.is_none()
    }

    /// Whether it has run out at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.until_ms.is_some_and(|u| now_ms >= u)
    }

    /// Whether it reaches the agent named `agent` (a single-agent bridge's
    /// agent is named by its protocol).
    pub fn reaches(&self, agent: &str) -> bool {
        self.agents.as_ref().is_none_or(|a| a.iter().any(|n| n == agent))
    }

    /// Whether it lets a device read the host's messages (`/reach1`, their
    /// notices, a listing's summary): they come from any agent of the host,
    /// so only a scope at every agent that may prompt and answer, and never
    /// a share's guest (its scope names one agent).
    pub fn reads_messages(&self) -> bool {
        self.agents.is_none()
            && self.session.is_none()
            && self.verbs.covers(Verbs::of([Verb::Prompt, Verb::Answer]))
    }

    /// What it lets a device do at `agent` at `now_ms`: nothing once expired
    /// or at an agent it does not name.
    pub fn verbs_at(&self, agent: &str, now_ms: u64) -> Verbs {
        if self.expired(now_ms) || !self.reaches(agent) {
            Verbs::NONE
        } else {
            self.verbs
        }
    }

    /// One line for a person: `observe,answer at build until 2026-12-05T18:00:00Z`.
    pub fn describe(&self) -> String {
        if self.is_full() {
            return "everything".into();
        }
        let mut s = if self.verbs.is_all() { "everything".to_string() } else { self.verbs.to_string() };
        match &self.agents {
            Some(a) if a.is_empty() => s.push_str(" at no agent"),
            Some(a) => s.push_str(&format!(" at {}", a.join(", "))),
            None => {}
        }
        if let Some(id) = &self.session {
            s.push_str(&format!(" on session {id} only (a share)"));
        }
        if let Some(u) = self.until_ms {
            s.push_str(&format!(" until {}", super::rfc3339(u)));
        }
        s
    }
}

/// The longest a scope's `--for` may run: a grant meant to end should end
/// within a season; a device meant to stay is given no expiry at all.
pub const MAX_FOR: std::time::Duration = std::time::Duration::from_secs(366 * 86_400);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_carry_what_they_need_and_unknown_words_are_refused() {
        let v: Verbs = "answer".parse().unwrap();
        assert_eq!(v.to_string(), "observe,answer");
        let v: Verbs = "start".parse().unwrap();
        assert_eq!(v.to_string(), "observe,prompt,answer,start");
        assert!(!v.has(Verb::Files));
        assert_eq!("all".parse::<Verbs>().unwrap(), Verbs::ALL);
        assert_eq!("Observe, FILES".parse::<Verbs>().unwrap().to_string(), "observe,files");
        assert!("watch".parse::<Verbs>().unwrap_err().contains("'watch' is not a verb"));
        assert!("".parse::<Verbs>().is_err());
        assert!(Verbs::ALL.covers("observe".parse().unwrap()));
        assert!(!"observe".parse::<Verbs>().unwrap().covers("prompt".parse().unwrap()));
    }

    #[test]
    fn a_scope_reads_back_and_an_unknown_verb_grants_nothing() {
        let s = Scope {
            verbs: "observe,answer".parse().unwrap(),
            agents: Some(vec!["build".into()]),
            until_ms: Some(5),
            session: None,
        };
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(text, r#"{"verbs":["observe","answer"],"agents":["build"],"untilMs":5}"#);
        assert_eq!(serde_json::from_str::<Scope>(&text).unwrap(), s);
        let newer: Scope = serde_json::from_str(r#"{"verbs":["observe","teleport"]}"#).unwrap();
        assert_eq!(newer.verbs.to_string(), "observe");
        assert_eq!(s.verbs_at("build", 4), s.verbs);
        assert_eq!(s.verbs_at("build", 5), Verbs::NONE, "expired");
        assert_eq!(s.verbs_at("deploy", 4), Verbs::NONE, "another agent");
        assert!(Scope::full().is_full() && Scope::full().verbs_at("any", u64::MAX).is_all());
        assert!(Scope::full().reads_messages());
        assert!(!s.reads_messages(), "some agents only");
        let watch = Scope { verbs: "observe".parse().unwrap(), ..Scope::full() };
        assert!(!watch.reads_messages(), "may not prompt and answer");
        let guest = Scope { session: Some("ab12cd34".into()), ..Scope::full() };
        assert!(!guest.reads_messages(), "a share's guest");
    }
}
