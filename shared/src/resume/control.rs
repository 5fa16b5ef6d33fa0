//! Control lines: what each means, how it is written and read, and how far
//! a first line may run before it cannot be one.

use bytes::Bytes;
use serde_json::Value;

use crate::devices::{History, Role};

/// The byte that starts a control line.
pub const CONTROL_PREFIX: u8 = b'!';

/// Longest control line accepted (they are a few dozen bytes): a longer line
/// starting with `!` is carried as a frame.
pub const MAX_CONTROL_LINE: usize = 1024;

/// Where the first line of `buf` ends (the index of its `\n`), if it fits a
/// control line: the hello and the welcome are read with this, so a line is
/// judged the same however the stream split it. `Ok(None)`: no newline yet, and
/// the line may still fit; `Err`: it cannot be a control line.
pub fn control_line_end(buf: &[u8]) -> Result<Option<usize>, LineTooLong> {
    match memchr::memchr(b'\n', buf) {
        Some(nl) if nl < MAX_CONTROL_LINE => Ok(Some(nl)),
        Some(_) => Err(LineTooLong),
        None if buf.len() >= MAX_CONTROL_LINE => Err(LineTooLong),
        None => Ok(None),
    }
}

/// A first line longer than any control line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no line end within {MAX_CONTROL_LINE} bytes")]
pub struct LineTooLong;

/// A control line's meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    Hello {
        session: Option<String>,
        received: u64,
    },
    Welcome {
        session: String,
        received: u64,
        grace_ms: u64,
    },
    Ack(u64),
    Eof(u64),
    End(u64),
    /// A hello that joins another device's session (a new session of this
    /// device's own, on the same agent): see [`crate::devices`].
    Join {
        id: String,
        observe: bool,
        history: History,
    },
    /// A hello that asks which sessions this device may join: of this agent,
    /// or (`host`) of every agent of the host that admits it, with those
    /// agents (one round trip per host for a device's list).
    List {
        host: bool,
    },
    /// A device asks for a role in the session it shares.
    Role(Role),
}

impl Control {
    /// The line, `!` to `\n`.
    pub fn encode(&self) -> Bytes {
        // Written by hand (no JSON tree): the browser client carries every byte of code.
        let text = |t: &str| serde_json::to_string(t).expect("a string serializes");
        let line = match self {
            Self::Hello { session, received } => {
                let session = session.as_deref().map_or_else(|| "null".to_string(), text);
                format!("!{{\"hello\":1,\"session\":{session},\"received\":{received}}}\n")
            }
            Self::Welcome { session, received, grace_ms } => format!(
                "!{{\"session\":{},\"received\":{received},\"grace_ms\":{grace_ms}}}\n",
                text(session)
            ),
            Self::Ack(n) => format!("!{{\"ack\":{n}}}\n"),
            Self::Eof(n) => format!("!{{\"eof\":{n}}}\n"),
            Self::End(n) => format!("!{{\"end\":{n}}}\n"),
            Self::Join { id, observe, history } => format!(
                "!{{\"hello\":1,\"session\":null,\"received\":0,\"join\":{},\"observe\":{observe},\"history\":\"{}\"}}\n",
                text(id),
                history.as_str()
            ),
            // `host` is a key of its own: a bridge that does not know it
            // answers with this agent's sessions (never a new session).
            Self::List { host: false } => "!{\"hello\":1,\"session\":null,\"received\":0,\"list\":1}\n".to_string(),
            Self::List { host: true } => {
                "!{\"hello\":1,\"session\":null,\"received\":0,\"list\":1,\"host\":1}\n".to_string()
            }
            Self::Role(r) => format!("!{{\"role\":\"{}\"}}\n", r.as_str()),
        };
        line.into()
    }

    /// Reads a control line (with or without its `!` and `\n`).
    ///
    /// `Ok(None)` for an object of a kind this version does not know (to be
    /// ignored: room for later versions). `Err` for a line that breaks the
    /// protocol: not one JSON object, a hello of another version, or a known
    /// field whose value is not what it must be (every count is a JSON integer
    /// in `0..=u64::MAX`; `-1`, `5.0` and `99999999999999999999` are refused
    /// alike, never read as something else or ignored).
    pub fn parse(line: &[u8]) -> Result<Option<Self>, BadControl> {
        let line = line.strip_prefix(&[CONTROL_PREFIX]).unwrap_or(line).trim_ascii();
        // Acks are nearly every control line: read them without a JSON tree.
        if let Some(digits) = line.strip_prefix(b"{\"ack\":").and_then(|r| r.strip_suffix(b"}")) {
            if !digits.is_empty()
                && digits.iter().all(u8::is_ascii_digit)
                && (digits.len() == 1 || digits[0] != b'0')
            {
                let text = std::str::from_utf8(digits).map_err(|_| BadControl::NotAnObject)?;
                return text.parse().map(|n| Some(Self::Ack(n))).map_err(|_| BadControl::NotACount("ack"));
            }
        }
        let v: Value = serde_json::from_slice(line).map_err(|_| BadControl::NotAnObject)?;
        let o = v.as_object().ok_or(BadControl::NotAnObject)?;
        // A present count must be a u64; an absent one is `None`.
        let count = |k: &'static str| -> Result<Option<u64>, BadControl> {
            match o.get(k) {
                None => Ok(None),
                Some(v) => v.as_u64().map(Some).ok_or(BadControl::NotACount(k)),
            }
        };
        let required = |k: &'static str| count(k)?.ok_or(BadControl::Missing(k));
        if let Some(version) = o.get("hello") {
            if version.as_u64() != Some(HELLO_VERSION) {
                return Err(BadControl::Version);
            }
            let session = match o.get("session") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(s.clone()),
                Some(_) => return Err(BadControl::NotASession),
            };
            let received = required("received")?;
            let flag = |k: &str| o.get(k).is_some_and(|l| l.as_u64() == Some(1) || l.as_bool() == Some(true));
            if flag("list") {
                return Ok(Some(Self::List { host: flag("host") }));
            }
            if let Some(join) = o.get("join") {
                let id = join.as_str().ok_or(BadControl::NotASession)?.to_string();
                let observe = match o.get("observe") {
                    None | Some(Value::Null) => false,
                    Some(v) => v.as_bool().ok_or(BadControl::NotAFlag("observe"))?,
                };
                let history = match o.get("history") {
                    None | Some(Value::Null) => History::All,
                    Some(v) => v.as_str().and_then(History::parse).ok_or(BadControl::NotAFlag("history"))?,
                };
                return Ok(Some(Self::Join { id, observe, history }));
            }
            return Ok(Some(Self::Hello { session, received }));
        }
        if let Some(n) = count("ack")? {
            return Ok(Some(Self::Ack(n)));
        }
        if let Some(n) = count("eof")? {
            return Ok(Some(Self::Eof(n)));
        }
        if let Some(n) = count("end")? {
            return Ok(Some(Self::End(n)));
        }
        if let Some(r) = o.get("role") {
            return r
                .as_str()
                .and_then(Role::parse)
                .map(|r| Some(Self::Role(r)))
                .ok_or(BadControl::NotAFlag("role"));
        }
        match o.get("session") {
            Some(Value::String(s)) => Ok(Some(Self::Welcome {
                session: s.clone(),
                received: required("received")?,
                grace_ms: count("grace_ms")?.unwrap_or(0),
            })),
            Some(_) => Err(BadControl::NotASession),
            None => Ok(None),
        }
    }
}

/// The hello's version: the only one there is.
pub const HELLO_VERSION: u64 = 1;

/// A control line that breaks the protocol (see [`Control::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadControl {
    #[error("a control line that is not one JSON object")]
    NotAnObject,
    #[error("a hello of a version other than {HELLO_VERSION}")]
    Version,
    #[error("\"{0}\" is not a count (an integer from 0 to 2^64-1)")]
    NotACount(&'static str),
    #[error("\"{0}\" is missing")]
    Missing(&'static str),
    #[error("\"session\" is neither a string nor null")]
    NotASession,
    #[error("\"{0}\" has a value it cannot have")]
    NotAFlag(&'static str),
}
