//! A journal on disk: a header line, then records, each a control line (`!`
//! and one JSON object) and, for the agent's output, the bytes it announces.
//!
//! ```text
//! {"journal":1,"token_sha256":"…","node":"…","owner":"…","agent":"claude","protocol":"acp","created_ms":…}
//! !{"snap":{"out_base":N,"client_frames":M,"ledger":{…},"pending":[…]}}   state at a compaction
//! !{"out":K,"len":L}\n<L bytes: K of the agent's frames>                  output, before the client sees it
//! !{"in":K,"req":[ids],"calls":[lines]}                                  K client frames, before the agent does
//! !{"stop":<unix ms>}                                                    the bridge stopped; the session is kept
//! ```
//!
//! Reading folds the records in order into what the session held. A record
//! cut short at the end (a crash in the middle of a write) ends the fold:
//! what it would have said is lost, nothing before it. Anything else that
//! does not read is a bad journal.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ledger::{Ledger, Pending};

/// The journal format's version: a journal of another is set aside.
pub const JOURNAL_VERSION: u64 = 1;

/// The first line of a journal: whose session it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub journal: u64,
    /// SHA-256 of the session's token, hex: the token itself is never stored.
    pub token_sha256: String,
    /// The bridge endpoint's NodeId the session was reached at.
    pub node: String,
    /// The NodeId that started the session: the only one that may take it back.
    pub owner: String,
    /// The hosted agent's name, empty for the single-agent bridge.
    pub agent: String,
    pub protocol: String,
    pub created_ms: u64,
}

/// The session's state at a compaction (what came before is gone from the file).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// Index of the first of the agent's frames still held (the client acknowledged those before).
    pub out_base: u64,
    /// The client's frames taken into the agent's queue.
    pub client_frames: u64,
    #[serde(default)]
    pub ledger: Ledger,
    /// The client's requests in flight (JSON ids).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<Value>,
    /// Times a client resumed the session, over every process that ran it.
    #[serde(default)]
    pub resumes: u64,
}

/// The control line of a record.
#[derive(Debug)]
enum Line {
    Snap(Snapshot),
    Out {
        out: u64,
        len: usize,
    },
    In {
        frames: u64,
        req: Vec<Value>,
        calls: Vec<Value>,
    },
    Stop {
        stop: u64,
    },
    /// The client acknowledged the agent's frames before this one: they were not written.
    Skip {
        skip: u64,
    },
    /// Of the agent's lines that were not written, the ones that matter: the
    /// ids of the client's requests they answered, and answers to its calls.
    Seen {
        ans: Vec<Value>,
        lines: Vec<Value>,
    },
}

/// An input record as written.
#[derive(Serialize)]
struct InLine {
    #[serde(rename = "in")]
    frames: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    req: Vec<Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    calls: Vec<Value>,
}

/// Records are told apart by their one required key.
fn parse_line(text: &[u8]) -> Option<Line> {
    let v: Value = serde_json::from_slice(text).ok()?;
    let o = v.as_object()?;
    if let Some(s) = o.get("snap") {
        return serde_json::from_value(s.clone()).ok().map(Line::Snap);
    }
    if o.contains_key("out") {
        return Some(Line::Out { out: o["out"].as_u64()?, len: o.get("len")?.as_u64()? as usize });
    }
    // A list field: absent is empty, anything but an array does not read.
    let list = |k: &str| match o.get(k) {
        None => Some(Vec::new()),
        Some(Value::Array(a)) => Some(a.clone()),
        Some(_) => None,
    };
    if o.contains_key("in") {
        return Some(Line::In { frames: o["in"].as_u64()?, req: list("req")?, calls: list("calls")? });
    }
    if let Some(t) = o.get("stop") {
        return Some(Line::Stop { stop: t.as_u64()? });
    }
    if let Some(n) = o.get("skip") {
        return Some(Line::Skip { skip: n.as_u64()? });
    }
    if o.contains_key("ans") || o.contains_key("lines") {
        return Some(Line::Seen { ans: list("ans")?, lines: list("lines")? });
    }
    None
}

/// The header line, `\n` included.
pub fn header_line(h: &Header) -> Vec<u8> {
    let mut v = serde_json::to_vec(h).expect("a header serializes");
    v.push(b'\n');
    v
}

/// A snapshot record.
pub fn snap_record(s: &Snapshot) -> Vec<u8> {
    control(&serde_json::json!({ "snap": s }))
}

/// The control line of an output record (its `len` bytes follow).
pub fn out_record(frames: u64, len: usize) -> Vec<u8> {
    format!("!{{\"out\":{frames},\"len\":{len}}}\n").into_bytes()
}

/// An input record.
pub fn in_record(frames: u64, req: Vec<Value>, calls: Vec<Value>) -> Vec<u8> {
    let mut line = b"!".to_vec();
    serde_json::to_writer(&mut line, &InLine { frames, req, calls }).expect("a record serializes");
    line.push(b'\n');
    line
}

/// The agent's frames before `n` were acknowledged without being written.
pub fn skip_record(n: u64) -> Vec<u8> {
    format!("!{{\"skip\":{n}}}\n").into_bytes()
}

/// What mattered of agent lines that were not written (see [`Line::Seen`]).
pub fn seen_record(ans: Vec<Value>, lines: Vec<Value>) -> Vec<u8> {
    control(&serde_json::json!({ "ans": ans, "lines": lines }))
}

/// The stop marker.
pub fn stop_record(at: SystemTime) -> Vec<u8> {
    format!("!{{\"stop\":{}}}\n", unix_ms(at)).into_bytes()
}

fn control(v: &Value) -> Vec<u8> {
    let mut line = b"!".to_vec();
    serde_json::to_writer(&mut line, v).expect("a record serializes");
    line.push(b'\n');
    line
}

pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub fn from_unix_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// What a journal held, folded.
#[derive(Debug, Default)]
pub struct Folded {
    pub out_base: u64,
    /// The agent's frames from `out_base` on, as written, with their counts.
    pub out: Vec<(Bytes, u64)>,
    pub client_frames: u64,
    pub ledger: Ledger,
    pub pending: Pending,
    pub resumes: u64,
    /// When the bridge stopped, if it stopped cleanly.
    pub stopped: Option<SystemTime>,
    /// The last record was cut short (a crash while writing it).
    pub cut_tail: bool,
}

impl Folded {
    /// The agent's frames held.
    pub fn out_total(&self) -> u64 {
        self.out_base + self.out.iter().map(|(_, n)| n).sum::<u64>()
    }
}

/// Why a journal cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadJournal {
    #[error("no header line")]
    NoHeader,
    #[error("the header is not a journal's ({0})")]
    BadHeader(String),
    #[error("a journal of version {0} (this bridge reads version {JOURNAL_VERSION})")]
    Version(u64),
    #[error("record {0} does not read")]
    BadRecord(usize),
    #[error("record {0} announces {1} frame(s) but holds {2}")]
    FrameCount(usize, u64, u64),
}

/// Reads a journal's bytes: its header and the fold of its records.
pub fn read(bytes: &[u8]) -> Result<(Header, Folded), BadJournal> {
    let bytes = Bytes::copy_from_slice(bytes);
    let nl = memchr::memchr(b'\n', &bytes).ok_or(BadJournal::NoHeader)?;
    let header: Header =
        serde_json::from_slice(&bytes[..nl]).map_err(|e| BadJournal::BadHeader(e.to_string()))?;
    if header.journal != JOURNAL_VERSION {
        return Err(BadJournal::Version(header.journal));
    }
    let mut f = Folded::default();
    let mut at = nl + 1;
    let mut n = 0usize;
    while at < bytes.len() {
        n += 1;
        let Some(end) = memchr::memchr(b'\n', &bytes[at..]).map(|i| at + i) else {
            f.cut_tail = true;
            break;
        };
        let line = &bytes[at..end];
        let record = line.strip_prefix(b"!").and_then(parse_line).ok_or(BadJournal::BadRecord(n))?;
        at = end + 1;
        match record {
            Line::Snap(s) => {
                f.out_base = s.out_base;
                f.out.clear();
                f.client_frames = s.client_frames;
                f.ledger = s.ledger;
                f.pending = Pending::default();
                f.pending.sent(&s.pending);
                f.resumes = s.resumes;
            }
            Line::Out { out, len } => {
                if bytes.len() - at < len {
                    f.cut_tail = true;
                    break;
                }
                let run = bytes.slice(at..at + len);
                at += len;
                let held = memchr::memchr_iter(b'\n', &run).count() as u64;
                if held != out || run.last().is_some_and(|b| *b != b'\n') {
                    return Err(BadJournal::FrameCount(n, out, held));
                }
                f.ledger.agent_run(&run);
                f.pending.answered(&run);
                if out > 0 {
                    f.out.push((run, out));
                }
            }
            Line::In { frames, req, calls } => {
                f.client_frames += frames;
                f.pending.sent(&req);
                f.ledger.client_calls(&calls);
            }
            Line::Stop { stop } => f.stopped = Some(from_unix_ms(stop)),
            // Written only past what was written before (the writer skips
            // from its high-water mark): all held so far was acknowledged.
            Line::Skip { skip } => {
                if skip < f.out_total() {
                    return Err(BadJournal::BadRecord(n));
                }
                f.out.clear();
                f.out_base = skip;
            }
            Line::Seen { ans, lines } => {
                f.pending.answered_ids(&ans);
                for line in lines {
                    if let Ok(bytes) = serde_json::to_vec(&line) {
                        f.ledger.agent_line(&bytes);
                    }
                }
            }
        }
    }
    Ok((header, f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            journal: JOURNAL_VERSION,
            token_sha256: "ab".into(),
            node: "n".into(),
            owner: "o".into(),
            agent: "echo".into(),
            protocol: "acp".into(),
            created_ms: 1,
        }
    }

    fn journal(records: &[&[u8]]) -> Vec<u8> {
        let mut v = header_line(&header());
        for r in records {
            v.extend_from_slice(r);
        }
        v
    }

    #[test]
    fn records_fold_into_the_session_they_describe() {
        let out1 = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"sessionId\":\"s\"}}\n{\"a\":1}\n";
        let calls = vec![
            serde_json::json!({"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}),
        ];
        let bytes = journal(&[
            &in_record(2, vec![1.into(), 2.into()], calls),
            &out_record(2, out1.len()),
            out1,
            &stop_record(from_unix_ms(5000)),
        ]);
        let (h, f) = read(&bytes).unwrap();
        assert_eq!(h, header());
        assert_eq!(f.client_frames, 2);
        assert_eq!(f.out_total(), 2);
        assert_eq!(f.ledger.sessions[0].id, "s");
        assert_eq!(f.pending.0.iter().collect::<Vec<_>>(), ["2"], "1 was answered");
        assert_eq!(f.stopped, Some(from_unix_ms(5000)));
        assert!(!f.cut_tail);

        // A snapshot starts over from what it says.
        let snap = Snapshot { out_base: 7, client_frames: 9, ..Snapshot::default() };
        let mut more = bytes.clone();
        more.extend(snap_record(&snap));
        more.extend(out_record(1, 3));
        more.extend(b"{}\n");
        let (_, f) = read(&more).unwrap();
        assert_eq!((f.out_base, f.out_total(), f.client_frames), (7, 8, 9));
        assert!(f.ledger.sessions.is_empty());
    }

    #[test]
    fn a_record_cut_short_ends_the_fold_and_anything_else_is_bad() {
        let whole = journal(&[&out_record(1, 3), b"{}\n", &out_record(2, 6), b"{}\n{}\n"]);
        let (_, f) = read(&whole).unwrap();
        assert_eq!(f.out_total(), 3);
        for cut in [whole.len() - 1, whole.len() - 7, whole.len() - 8] {
            let (_, f) = read(&whole[..cut]).unwrap();
            assert!(f.cut_tail, "cut at {cut}");
            assert_eq!(f.out_total(), 1, "the cut record is lost, the one before kept");
        }
        assert_eq!(read(b"").unwrap_err(), BadJournal::NoHeader);
        assert!(matches!(read(b"{\"journal\":1}\n").unwrap_err(), BadJournal::BadHeader(_)));
        let mut v2 = header();
        v2.journal = 2;
        assert_eq!(read(&header_line(&v2)).unwrap_err(), BadJournal::Version(2));
        assert_eq!(read(&journal(&[b"!{\"what\":1}\n"])).unwrap_err(), BadJournal::BadRecord(1));
        assert_eq!(read(&journal(&[b"no bang\n"])).unwrap_err(), BadJournal::BadRecord(1));
        assert_eq!(
            read(&journal(&[&out_record(2, 3), b"{}\n"])).unwrap_err(),
            BadJournal::FrameCount(1, 2, 1)
        );
    }
}
