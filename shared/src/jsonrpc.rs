//! The few JSON-RPC messages the bridge itself writes, and what it reads of the
//! messages it forwards.
//!
//! The bridge never parses a message it forwards into a value: it checks that
//! the line is exactly one valid UTF-8 JSON value ([`is_json`]) and, for a line
//! over the frame cap that it must drop, reads just enough of the line's first
//! bytes ([`peek_head`]) to answer whoever would otherwise wait for it.
//!
//! Errors the bridge writes (each a whole line, `\n` included):
//!
//! | when | code | to |
//! |---|---|---|
//! | a line that is not one UTF-8 JSON value | -32700 `Parse error`, `id: null` | its sender (peer only; an agent's noise is dropped) |
//! | a request over the frame cap | -32600 [`TOO_LARGE_REQUEST_CODE`], the request's `id` or `null` | its sender |
//! | a response over the frame cap | -32603 [`TOO_LARGE_RESPONSE_CODE`], the response's `id` | the side waiting for it |

use std::borrow::Cow;

/// JSON-RPC 2.0 "Parse error".
pub const PARSE_ERROR_CODE: i64 = -32700;

/// JSON-RPC 2.0 "Invalid Request": what the sender of a request over the frame
/// cap gets back (the request never reached the other side).
pub const TOO_LARGE_REQUEST_CODE: i64 = -32600;

/// JSON-RPC 2.0 "Internal error": what the side waiting for a response gets
/// when the response was over the frame cap and dropped on the way.
pub const TOO_LARGE_RESPONSE_CODE: i64 = -32603;

/// The line (with its `\n`) the bridge answers a non-JSON line from the peer with.
/// The id is `null` because an unparsable request has no id we could echo.
pub const PARSE_ERROR_LINE: &[u8] =
    b"{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,\"message\":\"Parse error\"}}\n";

/// Whether `line` is exactly one JSON value (surrounding whitespace allowed) in
/// valid UTF-8. serde_json skips string contents it is told to ignore without
/// checking their encoding, so UTF-8 is checked first, over the whole line,
/// with SIMD: std's check slows to about 1 GB/s on text with non-ASCII every
/// few words (accents, CJK, symbols in agent replies), which cost 38 % of the
/// check's throughput in `bench --only check`.
pub fn is_json(line: &[u8]) -> bool {
    match simdutf8::basic::from_utf8(line) {
        Ok(text) => serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok(),
        Err(_) => false,
    }
}

/// [`is_json`] as the bridge runs it on every line, and what the check saw
/// on the way (a separate function: the browser module, which checks what it
/// sends with [`is_json`], does not pay for the key reading): `Some(true)` for an object
/// with an `id` key at its top level (a request or a response: what the
/// bridge's bookkeeping reads lines for), `Some(false)` for any other JSON
/// value, `None` for a line that is not one. Only the top level's keys are
/// read; everything else is skipped unread, as before. A top-level key is
/// read as a string, which refuses a lone UTF-16 surrogate escape
/// (`"\ud800"`) that a skipped string lets through.
pub fn check_line(line: &[u8]) -> Option<bool> {
    let text = simdutf8::basic::from_utf8(line).ok()?;
    if text.trim_start().starts_with('{') {
        serde_json::from_str::<TopLevelId>(text).ok().map(|t| t.0)
    } else {
        // Not an object: skipped whole (a number is not parsed into one).
        serde_json::from_str::<serde::de::IgnoredAny>(text).ok().map(|_| false)
    }
}

/// Whether a JSON value is an object with an `id` key (see [`check_line`]).
struct TopLevelId(bool);

impl<'de> serde::Deserialize<'de> for TopLevelId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Objects only (see `check_line`): anything else is the wrong type.
        d.deserialize_map(TopLevelIdVisitor)
    }
}

struct TopLevelIdVisitor;

impl<'de> serde::de::Visitor<'de> for TopLevelIdVisitor {
    type Value = TopLevelId;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut id = false;
        while let Some(IsIdKey(key)) = map.next_key()? {
            map.next_value::<serde::de::IgnoredAny>()?;
            id |= key;
        }
        Ok(TopLevelId(id))
    }
}

/// A map key, as whether it is `id` (escapes decoded: `"\u0069d"` is `id`).
struct IsIdKey(bool);

impl<'de> serde::Deserialize<'de> for IsIdKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Key;
        impl serde::de::Visitor<'_> for Key {
            type Value = IsIdKey;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, key: &str) -> Result<IsIdKey, E> {
                Ok(IsIdKey(key == "id"))
            }
        }
        d.deserialize_str(Key)
    }
}

/// What a message is, as far as its first bytes tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Has `method` and `id`: someone waits for its response.
    Request,
    /// Has `method`, and `id` was not seen.
    Notification,
    /// Has `result` or `error`.
    Response,
    /// None of those keys was seen in the bytes available.
    Unknown,
}

/// The head of a message: its kind and its `id` as raw JSON text, when they can
/// be read from the bytes available.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub kind: Kind,
    /// The `id` value exactly as written (a JSON number or string), if seen.
    pub id: Option<String>,
}

/// Reads the top-level keys of a JSON object from a (possibly cut) prefix of
/// it: `id`, `method`, `result`, `error`. Stops at the first thing it cannot
/// read; never fails. Used for lines too large to keep, so it looks only at the
/// bytes it is given.
pub fn peek_head(prefix: &[u8]) -> Head {
    let (mut id, mut method, mut response) = (None, false, false);
    visit_keys(prefix, |key, value| {
        // The key alone tells the kind: its value may be the part that was cut.
        match key {
            b"method" => method = true,
            b"result" | b"error" => response = true,
            b"id" => id = value.and_then(valid_id),
            _ => {}
        }
        true
    });
    let kind = match (method, response, id.is_some()) {
        (true, _, true) => Kind::Request,
        (true, _, false) => Kind::Notification,
        (false, true, _) => Kind::Response,
        _ => Kind::Unknown,
    };
    Head { kind, id }
}

/// The `id` of a request (a message with `method` and `id`) as raw JSON text,
/// read from at most [`crate::ndjson::OVERSIZE_PEEK`] bytes; `None` for
/// anything else. For every line a client sends, so it stops as soon as it
/// knows and allocates nothing.
pub fn request_id(line: &[u8]) -> Option<&[u8]> {
    let (mut id, mut method) = (None, false);
    visit_keys(cut(line), |key, value| {
        match key {
            b"method" => method = true,
            b"id" => id = value.filter(|v| is_id(v)),
            b"result" | b"error" => return false,
            _ => {}
        }
        !(method && id.is_some())
    });
    id.filter(|_| method)
}

/// A request's `id` and `method`, both as raw JSON text (the method with its
/// quotes), read like [`request_id`]; `None` for anything but a request.
pub fn request_head(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let (mut id, mut method) = (None, None);
    visit_keys(cut(line), |key, value| {
        match key {
            b"method" => method = value.filter(|v| v.first() == Some(&b'"')),
            b"id" => id = value.filter(|v| is_id(v)),
            b"result" | b"error" => return false,
            _ => {}
        }
        !(method.is_some() && id.is_some())
    });
    Some((id?, method?))
}

/// Whether `run` (any number of lines) has an `id` key anywhere, written
/// `"id"`: a run without one holds no request and no response, so its lines
/// need no reading one by one. One vectorised search over the run, where
/// reading each line's keys walks the line a byte at a time (an agent's
/// streamed reply is notifications, and the line's text is most of it).
pub fn names_an_id(run: &[u8]) -> bool {
    static ID_KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"id\""));
    ID_KEY.find(run).is_some()
}

/// The `id` of a response (a message with `result` or `error`, and `id`) as
/// raw JSON text; `None` for anything else. Runs over an agent's output while
/// one of its client's requests is unanswered, so it gives up at the first
/// sign of a request or notification (`method`, usually the second key).
pub fn response_id(line: &[u8]) -> Option<&[u8]> {
    let (mut id, mut response) = (None, false);
    visit_keys(cut(line), |key, value| {
        match key {
            b"method" => {
                response = false;
                id = None;
                return false;
            }
            b"result" | b"error" => response = true,
            b"id" => id = value.filter(|v| is_id(v)),
            _ => {}
        }
        !(response && id.is_some())
    });
    id.filter(|_| response)
}

fn cut(line: &[u8]) -> &[u8] {
    &line[..line.len().min(crate::ndjson::OVERSIZE_PEEK)]
}

/// A raw id JSON-RPC allows (a string or a number), without a JSON tree.
fn is_id(raw: &[u8]) -> bool {
    matches!(raw.first(), Some(b'"' | b'-' | b'0'..=b'9'))
}

/// Calls `f` with each top-level key of the object `prefix` starts (its raw
/// text between the quotes) and its raw value (`None` when the value is
/// cut), until `f` returns false or the bytes stop making sense. True when
/// every key was visited: the object's closing brace was reached.
fn visit_keys<'a>(prefix: &'a [u8], mut f: impl FnMut(&'a [u8], Option<&'a [u8]>) -> bool) -> bool {
    let mut s = Scan { b: prefix, i: 0 };
    (|| -> Option<()> {
        s.ws();
        s.eat(b'{')?;
        s.ws();
        if s.peek()? == b'}' {
            return Some(());
        }
        loop {
            s.ws();
            let key = s.string()?;
            s.ws();
            s.eat(b':')?;
            s.ws();
            let start = s.i;
            let value = s.value().map(|()| &prefix[start..s.i]);
            if !f(key, value) {
                return None;
            }
            value?;
            s.ws();
            match s.peek()? {
                b',' => s.i += 1,
                b'}' => return Some(()),
                _ => return None,
            }
        }
    })()
    .is_some()
}

/// An id worth echoing: a JSON number or string (JSON-RPC allows no other),
/// as its canonical text ([`canonical_id`]), so that ids compare as values.
fn valid_id(raw: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(raw).ok()?;
    if !(v.is_number() || v.is_string()) {
        return None;
    }
    canonical_id(raw).map(|c| String::from_utf8_lossy(&c).into_owned())
}

/// An id (raw JSON text of a string or a number) in the one spelling the
/// bridge compares: a string with escapes is decoded and written again with
/// only the escapes JSON requires, so `"\u0071\u0031"` and `"q\/1"` are `"q1"`
/// and `"q/1"` (a device must not answer a request unseen by spelling its id
/// differently, nor an agent miss the answer to the bridge's own call for
/// escaping a `/`). A string without a backslash is its own canonical text
/// (no copy). Numbers are kept as written (JSON-RPC ids are integers; `1`
/// and `1.0` are two ids here). `None` for anything else, or a string that
/// does not decode (a lone surrogate).
pub fn canonical_id(raw: &[u8]) -> Option<Cow<'_, [u8]>> {
    match raw.first()? {
        b'"' if !raw.contains(&b'\\') => Some(Cow::Borrowed(raw)),
        b'"' => {
            let s: String = serde_json::from_slice(raw).ok()?;
            serde_json::to_vec(&s).ok().map(Cow::Owned)
        }
        b'-' | b'0'..=b'9' => Some(Cow::Borrowed(raw)),
        _ => None,
    }
}

/// What one whole line is, read strictly ([`classify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    /// A `method` (a string) and an `id` (a string or a number, canonical).
    Request(Cow<'a, [u8]>),
    /// A `method` (a string) and no `id`.
    Notification,
    /// An `id` (canonical), exactly one of `result` and `error`, no `method`.
    Response(Cow<'a, [u8]>),
    /// Anything else: a key that decides twice (`id`, `method`, `result`,
    /// `error`), a `method` beside a `result`, no object, a bad id.
    Invalid,
}

/// What `line` is, every top-level key read (escaped keys decoded), for a
/// line whose kind decides where it may go (an observer's line goes to the
/// agent only as an answer). Unlike [`response_id`] and [`request_id`], which
/// stop at the first key that decides and serve bookkeeping, this never takes
/// a request for an answer because an `id` and a `result` came before its
/// `method`.
pub fn classify(line: &[u8]) -> Message<'_> {
    let (mut id, mut ids, mut method, mut answers, mut bad) = (None, 0u8, 0u8, [0u8; 2], false);
    let complete = visit_keys(line, |key, value| {
        let decoded: String;
        let key = if key.contains(&b'\\') {
            let mut quoted = Vec::with_capacity(key.len() + 2);
            quoted.push(b'"');
            quoted.extend_from_slice(key);
            quoted.push(b'"');
            match serde_json::from_slice::<String>(&quoted) {
                Ok(k) => {
                    decoded = k;
                    decoded.as_bytes()
                }
                Err(_) => {
                    bad = true;
                    return false;
                }
            }
        } else {
            key
        };
        match key {
            b"id" => {
                ids += 1;
                id = value.and_then(canonical_id);
            }
            b"method" => {
                method += 1;
                bad |= value.and_then(|v| v.first()) != Some(&b'"');
            }
            b"result" => answers[0] += 1,
            b"error" => answers[1] += 1,
            _ => {}
        }
        true
    });
    if !complete || bad || ids > 1 || method > 1 || answers.iter().any(|n| *n > 1) {
        return Message::Invalid;
    }
    match (method, answers[0] + answers[1], id) {
        (1, 0, None) if ids == 0 => Message::Notification,
        (1, 0, Some(id)) => Message::Request(id),
        (0, 1, Some(id)) => Message::Response(id),
        _ => Message::Invalid,
    }
}

/// A forgiving cursor over JSON bytes: every method returns `None` when the
/// input ends or is not what it expects.
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\r' | b'\n')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// A string; returns its raw content between the quotes. Jumps from
    /// quote or backslash to the next: most of a message's bytes are in its
    /// strings (a streamed reply, a file's text), and this runs over every
    /// line a session carries.
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            self.i += memchr::memchr2(b'"', b'\\', self.b.get(self.i..)?)?;
            match self.b[self.i] {
                b'"' => {
                    self.i += 1;
                    return Some(&self.b[start..self.i - 1]);
                }
                _ => self.i += 2,
            }
        }
    }

    /// Skips one value of any kind (nested containers counted, strings honoured).
    fn value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                return Some(());
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
            }
            _ => {
                // number, true, false, null: up to the next delimiter, which must be there.
                let start = self.i;
                while !matches!(self.peek()?, b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n') {
                    self.i += 1;
                }
                (self.i > start).then_some(())
            }
        }
    }
}

/// `v` as one line (with its `\n`): the bridge's own messages built as JSON values.
pub fn json_line(v: &serde_json::Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(v).expect("a JSON value serializes");
    line.push(b'\n');
    line
}

/// An error response line (with its `\n`): `id` is raw JSON text, `None` for `null`.
pub fn error_line(id: Option<&str>, code: i64, message: &str, limit: usize) -> Vec<u8> {
    let msg = serde_json::to_string(message).unwrap_or_else(|_| "\"error\"".into());
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{},\"error\":{{\"code\":{code},\"message\":{msg},\"data\":{{\"limit\":{limit}}}}}}}\n",
        id.unwrap_or("null")
    )
    .into_bytes()
}

/// JSON-RPC error code (implementation-defined server range) for an agent's
/// request whose client went away before answering it.
pub const CLIENT_GONE_CODE: i64 = -32000;

/// What an agent gets for a request its client can no longer answer (the
/// client's connection ended; see the bridge's `--keep-warm`).
pub fn client_gone(id: &str) -> Vec<u8> {
    let msg = "Client disconnected: the request was not answered";
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{{\"code\":{CLIENT_GONE_CODE},\"message\":\"{msg}\"}}}}\n")
        .into_bytes()
}

/// JSON-RPC error code (implementation-defined server range) for a request the
/// agent never answered because it ended first.
pub const AGENT_ENDED_CODE: i64 = -32000;

/// What a client gets for a request the agent had not answered when it ended
/// (`how`: `agent exited (code 1)`, `agent killed by signal 9 (SIGKILL)`): an
/// answer before the close, so a client never waits for one that cannot come.
/// `stderr`, the agent's last stderr line when it failed, is in the message and
/// in `data.stderr` (`data.agentEnd` stays `how` alone).
pub fn agent_ended(id: &[u8], how: &str, stderr: Option<&str>) -> Vec<u8> {
    let id = String::from_utf8_lossy(id);
    let message = match stderr {
        Some(line) => format!("The agent ended before answering: {how}: {line}"),
        None => format!("The agent ended before answering: {how}"),
    };
    let mut data = serde_json::json!({ "agentEnd": how });
    if let Some(line) = stderr {
        data["stderr"] = line.into();
    }
    let error = serde_json::json!({ "code": AGENT_ENDED_CODE, "message": message, "data": data });
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{error}}}\n").into_bytes()
}

/// What the sender of a request (or of an unreadable line) over the frame cap gets.
pub fn too_large_request(id: Option<&str>, limit: usize) -> Vec<u8> {
    error_line(
        id,
        TOO_LARGE_REQUEST_CODE,
        &format!("Message too large: over the bridge's frame limit of {limit} bytes; it was dropped"),
        limit,
    )
}

/// What the side waiting for a response gets when that response was over the cap.
pub fn too_large_response(id: &str, limit: usize) -> Vec<u8> {
    error_line(
        Some(id),
        TOO_LARGE_RESPONSE_CODE,
        &format!("Response too large: over the bridge's frame limit of {limit} bytes; it was dropped"),
        limit,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_error_is_valid_jsonrpc() {
        let v: serde_json::Value = serde_json::from_slice(PARSE_ERROR_LINE).unwrap();
        assert_eq!(v["error"]["code"], PARSE_ERROR_CODE);
        assert!(v["id"].is_null());
        assert!(PARSE_ERROR_LINE.ends_with(b"\n"));
    }

    #[test]
    fn json_detection() {
        assert!(is_json(br#"{"a":1}"#));
        assert!(is_json(b" [1,2] "));
        assert!(is_json("{\"t\":\"h\u{e9}llo \u{2713}\"}".as_bytes()));
        assert!(!is_json(b"hello"));
        assert!(!is_json(br#"{"a":1} {"b":2}"#));
        assert!(!is_json(b""));
    }

    #[test]
    fn a_line_names_an_id_when_its_object_has_one_at_the_top() {
        // Requests and responses, whatever the key order or the id's type.
        assert_eq!(check_line(br#"{"jsonrpc":"2.0","id":7,"method":"session/prompt"}"#), Some(true));
        assert_eq!(check_line(br#" {"result":{},"jsonrpc":"2.0","id":"a"} "#), Some(true));
        assert_eq!(check_line(br#"{"\u0069d":null,"error":{}}"#), Some(true), "an escaped key is its text");
        // An `id` below the top, in a string, or as a value is not one.
        assert_eq!(check_line(br#"{"method":"n","params":{"id":1,"t":"\"id\":2"}}"#), Some(false));
        assert_eq!(check_line(br#"{"method":"id","params":["id"]}"#), Some(false));
        assert_eq!(check_line(br#"[{"id":1}]"#), Some(false));
        assert_eq!(check_line(b"\"id\""), Some(false));
        // Everything else is what `is_json` said before.
        assert_eq!(check_line(b"1e400"), Some(false), "a number is skipped, not parsed");
        assert_eq!(check_line(br#"{"a":"\ud800"}"#), Some(false), "a lone surrogate in a value is skipped");
        assert_eq!(check_line(br#"{"id":1} {"id":2}"#), None);
        assert_eq!(check_line(br#"{"id":1,}"#), None);
        assert_eq!(check_line(b"{\"id\":\"\x01\"}"), None, "a raw control character");
        assert_eq!(check_line(b"hello"), None);
    }

    #[test]
    fn invalid_utf8_inside_a_string_is_not_json() {
        assert!(!is_json(b"{\"a\":\"\xff\xfe\"}"));
        assert!(!is_json(b"{\"a\":\"\xc3\"}"), "truncated sequence");
        assert!(!is_json(b"{\"a\":\"\xed\xa0\x80\"}"), "surrogate encoded as UTF-8");
    }

    #[test]
    fn heads_of_cut_messages() {
        let h = peek_head(br#"{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"x":"aaaa"#);
        assert_eq!(h, Head { kind: Kind::Request, id: Some("7".into()) });
        let h = peek_head(br#"{"jsonrpc":"2.0","id":"abc-1","result":{"content":"aaa"#);
        assert_eq!(h, Head { kind: Kind::Response, id: Some("\"abc-1\"".into()) });
        // `id` after a value that is cut: a response whose id is unknown.
        let h = peek_head(br#"{"jsonrpc":"2.0","result":{"content":"aaa"#);
        assert_eq!(h, Head { kind: Kind::Response, id: None });
        let h = peek_head(br#"{"jsonrpc":"2.0","params":{"content":"aaa"#);
        assert_eq!(h, Head { kind: Kind::Unknown, id: None });
        let h = peek_head(br#"{"method":"session/update","params":{"a":[1,{"b":"}"#);
        assert_eq!(h.kind, Kind::Notification);
        // Escapes and nesting before the id.
        let h = peek_head(br#"{"params":{"s":"q\"}{[","n":[1,[2]]},"method":"m","id":-3.5e2,"x"#);
        assert_eq!(h, Head { kind: Kind::Request, id: Some("-3.5e2".into()) });
        // A cut number is not an id.
        assert_eq!(peek_head(br#"{"method":"m","id":12"#).id, None);
        // Not an object, or garbage.
        assert_eq!(peek_head(b"[1,2,3"), Head { kind: Kind::Unknown, id: None });
        assert_eq!(peek_head(b"\xff\xfe"), Head { kind: Kind::Unknown, id: None });
        // ids JSON-RPC does not allow are not echoed.
        assert_eq!(peek_head(br#"{"id":{"a":1},"method":"m","#).id, None);
    }

    #[test]
    fn request_and_response_ids_without_a_tree() {
        assert_eq!(
            request_id(br#"{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{}}"#),
            Some(&b"7"[..])
        );
        assert_eq!(request_id(br#"{"method":"m","params":{"a":[1]},"id":"x-1"}"#), Some(&br#""x-1""#[..]));
        assert_eq!(
            request_id(br#"{"jsonrpc":"2.0","method":"session/update","params":{}}"#),
            None,
            "notification"
        );
        assert_eq!(request_id(br#"{"jsonrpc":"2.0","id":7,"result":{}}"#), None, "response");
        assert_eq!(request_id(br#"{"id":null,"method":"m"}"#), None, "null is no id");
        assert_eq!(response_id(br#"{"jsonrpc":"2.0","id":7,"result":{"a":1}}"#), Some(&b"7"[..]));
        assert_eq!(response_id(br#"{"jsonrpc":"2.0","error":{"code":1},"id":"q"}"#), Some(&br#""q""#[..]));
        assert_eq!(response_id(br#"{"jsonrpc":"2.0","id":3,"method":"fs/read_text_file"}"#), None, "request");
        assert_eq!(response_id(br#"{"jsonrpc":"2.0","method":"session/update","params":{"x":1}}"#), None);
        let mut long = br#"{"jsonrpc":"2.0","result":""#.to_vec();
        long.extend(std::iter::repeat_n(b'a', 10_000));
        long.extend(br#"","id":1}"#);
        assert_eq!(response_id(&long), None, "the id past the peek limit is not read");
    }

    #[test]
    fn a_line_is_classified_by_all_of_its_keys() {
        use Message::*;
        let r = |s: &'static [u8]| Response(Cow::Borrowed(s));
        let q = |s: &'static [u8]| Request(Cow::Borrowed(s));
        assert_eq!(classify(br#"{"jsonrpc":"2.0","id":"q1","result":{"a":1}}"#), r(br#""q1""#));
        assert_eq!(classify(br#"{"error":{"code":1},"jsonrpc":"2.0","id":7}"#), r(b"7"));
        assert_eq!(classify(br#"{"jsonrpc":"2.0","id":3,"method":"m","params":{}}"#), q(b"3"));
        assert_eq!(classify(br#"{"jsonrpc":"2.0","method":"m"}"#), Notification);
        // A request dressed as an answer: its `method` comes after what decided before.
        for disguised in [
            &br#"{"jsonrpc":"2.0","id":"x","result":null,"method":"session/prompt","params":{}}"#[..],
            br#"{"id":"x","error":{"code":1},"method":"session/prompt"}"#,
            br#"{"id":"x","result":1,"\u006dethod":"session/prompt"}"#,
            br#"{"id":"x","result":1,"id":"y"}"#,
            br#"{"id":"x","result":1,"result":2}"#,
            br#"{"id":"x","result":1,"error":{}}"#,
            br#"{"method":"m","result":1}"#,
            br#"{"method":"m","id":1,"method":"n"}"#,
            br#"{"method":1,"id":1}"#,
            br#"{"id":null,"result":1}"#,
            br#"{"id":{"a":1},"result":1}"#,
            br#"{"result":1}"#,
            br#"{}"#,
            br#"[{"id":1,"result":1}]"#,
            br#"{"id":1,"result":1"#,
        ] {
            assert_eq!(classify(disguised), Invalid, "{}", String::from_utf8_lossy(disguised));
        }
        // Ids compare as values: escapes decoded, written the one way.
        assert_eq!(classify(br#"{"id":"\u0071\u0031","result":{}}"#), r(br#""q1""#));
        assert_eq!(classify(br#"{"\u0069d":"a\/b","result":{}}"#), r(br#""a/b""#));
        assert_eq!(classify(br#"{"id":"q\"1","result":{}}"#), r(br#""q\"1""#));
        assert_eq!(classify(br#"{"id":"\ud800","result":{}}"#), Invalid, "a lone surrogate is no id");
        let restore = peek_head(br#"{"id":"_thunderbolt\/restore\/1","result":{}}"#);
        assert_eq!(restore.id.as_deref(), Some(r#""_thunderbolt/restore/1""#));
        assert_eq!(peek_head(br#"{"id":"\u0071\u0031","method":"m"}"#).id.as_deref(), Some(r#""q1""#));
    }

    #[test]
    fn agent_ended_answers_are_valid_jsonrpc() {
        let line = agent_ended(b"\"r-1\"", "agent exited (code 3)", None);
        assert!(line.ends_with(b"\n"));
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["id"], "r-1");
        assert_eq!(v["error"]["code"], AGENT_ENDED_CODE);
        assert_eq!(v["error"]["data"]["agentEnd"], "agent exited (code 3)");
        assert!(v["error"]["message"].as_str().unwrap().contains("agent exited (code 3)"));
        assert!(v["error"]["data"].get("stderr").is_none());
        let line = agent_ended(b"7", "agent exited (code 3)", Some("missing \"API\" key"));
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["id"], 7);
        assert_eq!(v["error"]["data"]["agentEnd"], "agent exited (code 3)");
        assert_eq!(v["error"]["data"]["stderr"], "missing \"API\" key");
        assert_eq!(
            v["error"]["message"],
            "The agent ended before answering: agent exited (code 3): missing \"API\" key"
        );
    }

    #[test]
    fn request_heads() {
        let line = br#"{"jsonrpc":"2.0","id":"q1","method":"session/request_permission","params":{}}"#;
        assert_eq!(request_head(line), Some((&b"\"q1\""[..], &b"\"session/request_permission\""[..])));
        assert_eq!(request_head(br#"{"jsonrpc":"2.0","method":"note"}"#), None);
        assert_eq!(request_head(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#), None);
        assert!(names_an_id(
            br#"{"method":"m"}
{"id" : 1}
"#
        ));
        assert!(!names_an_id(
            br#"{"method":"m","params":{"toolCallId":"x","sessionId":"s"}}
"#
        ));
    }

    #[test]
    fn error_lines_are_valid_jsonrpc() {
        let v: serde_json::Value = serde_json::from_slice(&too_large_request(Some("\"r-1\""), 100)).unwrap();
        assert_eq!(v["id"], "r-1");
        assert_eq!(v["error"]["code"], TOO_LARGE_REQUEST_CODE);
        assert_eq!(v["error"]["data"]["limit"], 100);
        let v: serde_json::Value = serde_json::from_slice(&too_large_request(None, 100)).unwrap();
        assert!(v["id"].is_null());
        let line = too_large_response("9", 5);
        assert!(line.ends_with(b"\n") && !line[..line.len() - 1].contains(&b'\n'));
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!((v["id"].as_i64(), v["error"]["code"].as_i64()), (Some(9), Some(TOO_LARGE_RESPONSE_CODE)));
    }
}
