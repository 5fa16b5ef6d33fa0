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
//! Reading folds the records in order into what the session held, one record
//! at a time ([`fold`]): never the whole file, and of the agent's output only
//! the newest within the taker's resume buffer (a journal can hold about
//! twice that, and one planted or left by an older bridge far more). A
//! record cut short at the end (a crash in the middle of a write) ends the
//! fold: what it would have said is lost, nothing before it. Anything else
//! that does not read (a record longer than any the bridge writes among them)
//! is a bad journal.

use std::{
    collections::VecDeque,
    io::{self, BufRead, Read},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

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
    /// The session's id (what `sessions`, `join`, `status` and `kick` name),
    /// random and kept across a restart. Absent in journals written before
    /// it was recorded: those are named by their token hash's first 8 digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The grace it was written with (ms): a journal no agent served here
    /// takes back is removed once that has passed (else [`super::LONGEST_GRACE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_ms: Option<u64>,
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

/// Longest header line read: a header is a few hundred bytes (two NodeIds,
/// a hash, an agent's name); anything longer was not written by the bridge.
pub const MAX_HEADER_LINE: usize = 64 * 1024;

/// Longest control line read (held whole while it is parsed). The largest the
/// bridge writes is a snapshot: its ledger keeps at most 64 ACP sessions and
/// 64 calls of at most [`super::ledger::MAX_CALL_LINE`] each, and the
/// client's `initialize` (about 8.1 MiB at the very worst; real ones are a
/// few KiB), with the ids of the requests in flight. A longer line makes the
/// journal one that does not read (set aside), never a start-up that holds it.
pub const MAX_CONTROL_LINE: usize = 16 << 20;

/// Largest output record: one run of the agent's lines as the bridge took
/// them in, at most one frame (`--max-frame`, at most
/// [`crate::limits::MAX_FRAME`]) and what else the same read brought. Its
/// bytes are never held whole: they are read line by line (see [`fold`]).
pub const MAX_OUT_RECORD: u64 = crate::limits::MAX_FRAME as u64 + (1 << 20);

/// The agent's lines kept by a fold are gathered in runs of about this many
/// bytes (a run is what the restored session's replay log holds and resends).
const RUN_PIECE: usize = 64 * 1024;

/// What a journal held, folded.
#[derive(Debug, Default)]
pub struct Folded {
    pub out_base: u64,
    /// The agent's frames from `out_base` on, as read, with their counts:
    /// the newest of the frames the journal does not know to be
    /// acknowledged, within the fold's `keep` bytes.
    pub out: VecDeque<(Bytes, u64)>,
    pub client_frames: u64,
    pub ledger: Ledger,
    pub pending: Pending,
    pub resumes: u64,
    /// When the bridge stopped, if it stopped cleanly.
    pub stopped: Option<SystemTime>,
    /// The last record was cut short (a crash while writing it).
    pub cut_tail: bool,
    /// Frames not known to be acknowledged that were not kept (older than
    /// what fits in `keep` bytes), and their bytes: a client that lacks
    /// them cannot take the session back.
    pub dropped: u64,
    pub dropped_bytes: u64,
}

impl Folded {
    /// The agent's frames held.
    pub fn out_total(&self) -> u64 {
        self.out_base + self.out.iter().map(|(_, n)| n).sum::<u64>()
    }

    /// Bytes of the agent's output held.
    pub fn out_bytes(&self) -> usize {
        self.out.iter().map(|(b, _)| b.len()).sum()
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
    #[error("record {0} is longer than any the bridge writes ({1} bytes)")]
    TooLong(usize, u64),
    #[error("reading it failed: {0}")]
    Io(String),
}

impl From<io::Error> for BadJournal {
    fn from(e: io::Error) -> Self {
        Self::Io(e.to_string())
    }
}

/// Reads up to and including the next `\n`, at most `max` bytes of it, into
/// `buf`: whether a whole line came (else the input ended, or the line is
/// longer than `max`: `buf` then holds `max + 1` bytes).
fn line_into(r: &mut impl BufRead, max: usize, buf: &mut Vec<u8>) -> io::Result<bool> {
    buf.clear();
    r.take(max as u64 + 1).read_until(b'\n', buf)?;
    Ok(buf.last() == Some(&b'\n'))
}

/// Reads a journal's header line.
pub fn read_header(r: &mut impl BufRead) -> Result<Header, BadJournal> {
    let mut line = Vec::new();
    if !line_into(r, MAX_HEADER_LINE, &mut line)? {
        return Err(match line.len() > MAX_HEADER_LINE {
            true => BadJournal::BadHeader(format!("longer than {MAX_HEADER_LINE} bytes")),
            false => BadJournal::NoHeader,
        });
    }
    let header: Header = serde_json::from_slice(&line).map_err(|e| BadJournal::BadHeader(e.to_string()))?;
    if header.journal != JOURNAL_VERSION {
        return Err(BadJournal::Version(header.journal));
    }
    Ok(header)
}

/// The agent's output a fold keeps: its newest frames, within `keep` bytes.
struct Tail {
    keep: usize,
    runs: VecDeque<(Bytes, u64)>,
    /// Frames before the first held, and pushed over all.
    base: u64,
    total: u64,
    bytes: usize,
    dropped: u64,
    dropped_bytes: u64,
}

impl Tail {
    /// The client acknowledged everything before `at` (a snapshot, a skip).
    fn reset(&mut self, at: u64) {
        self.runs.clear();
        (self.base, self.total, self.bytes, self.dropped, self.dropped_bytes) = (at, at, 0, 0, 0);
    }

    /// A run of `n` whole lines, none longer than `keep`.
    fn push(&mut self, run: Bytes, n: u64) {
        self.total += n;
        self.bytes += run.len();
        self.runs.push_back((run, n));
        // The oldest lines go until the rest fits.
        while self.bytes > self.keep {
            let need = self.bytes - self.keep;
            let (run, n) = self.runs.pop_front().expect("bytes are held");
            let (cut, lines) = if run.len() <= need {
                (run.len(), n)
            } else {
                let mut lines = 0;
                let mut cut = 0;
                for nl in memchr::memchr_iter(b'\n', &run) {
                    (cut, lines) = (nl + 1, lines + 1);
                    if cut >= need {
                        break;
                    }
                }
                if cut < run.len() {
                    self.runs.push_front((run.slice(cut..), n - lines));
                }
                (cut, lines)
            };
            self.base += lines;
            self.bytes -= cut;
            self.dropped += lines;
            self.dropped_bytes += cut as u64;
        }
    }

    /// A frame of `len` bytes that cannot be kept: it and all before it go
    /// (what is kept is the newest frames, with no gap).
    fn lost(&mut self, len: u64) {
        self.dropped += self.total - self.base + 1;
        self.dropped_bytes += self.bytes as u64 + len;
        self.total += 1;
        self.runs.clear();
        (self.base, self.bytes) = (self.total, 0);
    }
}

/// Folds a journal's records (after its header) into what the session held,
/// reading them one by one: what is held at any time is one control line (at
/// most [`MAX_CONTROL_LINE`]), one line of the agent's (at most `keep`, or a
/// call's answer's size, [`super::ledger::MAX_CALL_LINE`], when larger) and
/// the agent's newest frames within `keep` bytes, however large the journal.
/// `r` is limited to the journal's length (an output record that announces
/// more than is left was cut short).
pub fn fold<R: BufRead>(r: &mut io::Take<R>, keep: usize) -> Result<Folded, BadJournal> {
    let mut f = Folded::default();
    let mut tail =
        Tail { keep, runs: VecDeque::new(), base: 0, total: 0, bytes: 0, dropped: 0, dropped_bytes: 0 };
    let mut control = Vec::new();
    let mut n = 0usize;
    loop {
        if !line_into(r, MAX_CONTROL_LINE, &mut control)? {
            if control.len() > MAX_CONTROL_LINE {
                return Err(BadJournal::TooLong(n + 1, control.len() as u64));
            }
            f.cut_tail = !control.is_empty();
            break;
        }
        n += 1;
        let record = control.strip_prefix(b"!").and_then(parse_line).ok_or(BadJournal::BadRecord(n))?;
        match record {
            Line::Snap(s) => {
                tail.reset(s.out_base);
                f.client_frames = s.client_frames;
                f.ledger = s.ledger;
                f.pending = Pending::default();
                f.pending.sent(&s.pending);
                f.resumes = s.resumes;
            }
            Line::Out { out, len } => {
                let len = len as u64;
                if len > MAX_OUT_RECORD {
                    return Err(BadJournal::TooLong(n, len));
                }
                if r.limit() < len {
                    f.cut_tail = true;
                    break;
                }
                let (held, whole) = out_lines(r, len, &mut tail, &mut f)?;
                if held != out || !whole {
                    return Err(BadJournal::FrameCount(n, out, held));
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
                if skip < tail.total {
                    return Err(BadJournal::BadRecord(n));
                }
                tail.reset(skip);
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
    f.out_base = tail.base;
    f.out = tail.runs;
    (f.dropped, f.dropped_bytes) = (tail.dropped, tail.dropped_bytes);
    Ok(f)
}

/// The `len` bytes of an output record (all there: `len` is within what is
/// left), line by line: each line to the ledger and the requests in flight,
/// and kept in `tail` if it fits. The lines it held, and whether its last
/// byte is a newline (as the bridge writes them).
fn out_lines<R: BufRead>(
    r: &mut io::Take<R>,
    len: u64,
    tail: &mut Tail,
    f: &mut Folded,
) -> Result<(u64, bool), BadJournal> {
    // Lines longer than this are not read whole: they are neither kept (over
    // `keep`) nor one of the small answers the ledger looks for.
    let cap = tail.keep.max(super::ledger::MAX_CALL_LINE);
    let mut left = len;
    let (mut run, mut run_lines, mut lines) = (Vec::with_capacity(RUN_PIECE), 0u64, 0u64);
    let flush = |run: &mut Vec<u8>, run_lines: &mut u64, tail: &mut Tail| {
        if *run_lines > 0 {
            let mut done = std::mem::replace(run, Vec::with_capacity(RUN_PIECE));
            if done.capacity() > done.len() + done.len() / 4 {
                done.shrink_to_fit();
            }
            tail.push(Bytes::from(done), std::mem::take(run_lines));
        }
    };
    let ended = |e: io::Error| BadJournal::Io(format!("{e} (it changed while being read)"));
    while left > 0 {
        let start = run.len();
        let limit = left.min((cap as u64).saturating_add(1));
        let got = (&mut *r).take(limit).read_until(b'\n', &mut run)? as u64;
        if got == 0 {
            return Err(ended(io::ErrorKind::UnexpectedEof.into()));
        }
        left -= got;
        if run.last() == Some(&b'\n') {
            lines += 1;
            let line = &run[start..];
            f.ledger.agent_line(line);
            f.pending.answered_line(line);
            if line.len() > tail.keep {
                run.truncate(start);
                flush(&mut run, &mut run_lines, tail);
                tail.lost(got);
            } else {
                run_lines += 1;
                if run.len() >= RUN_PIECE {
                    flush(&mut run, &mut run_lines, tail);
                }
            }
        } else if left == 0 {
            // The record's last line has no newline: not what the bridge writes.
            return Ok((lines, false));
        } else {
            // Longer than any line worth reading: skipped up to its newline.
            run.truncate(start);
            flush(&mut run, &mut run_lines, tail);
            let mut skipped = got;
            loop {
                let buf = r.fill_buf()?;
                if buf.is_empty() {
                    return Err(ended(io::ErrorKind::UnexpectedEof.into()));
                }
                let avail = &buf[..buf.len().min(left as usize)];
                let (take, done) = match memchr::memchr(b'\n', avail) {
                    Some(nl) => (nl + 1, true),
                    None => (avail.len(), false),
                };
                r.consume(take);
                left -= take as u64;
                skipped += take as u64;
                if done {
                    break;
                }
                if left == 0 {
                    return Ok((lines, false));
                }
            }
            lines += 1;
            tail.lost(skipped);
        }
    }
    flush(&mut run, &mut run_lines, tail);
    Ok((lines, true))
}

/// Reads a journal's bytes whole: its header and the fold of its records.
#[cfg(test)]
pub fn read(bytes: &[u8], keep: usize) -> Result<(Header, Folded), BadJournal> {
    let mut r = bytes.take(bytes.len() as u64);
    let header = read_header(&mut r)?;
    Ok((header, fold(&mut r, keep)?))
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
            id: None,
            grace_ms: None,
        }
    }

    fn read_all(bytes: &[u8]) -> Result<(Header, Folded), BadJournal> {
        read(bytes, usize::MAX)
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
        let (h, f) = read_all(&bytes).unwrap();
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
        let (_, f) = read_all(&more).unwrap();
        assert_eq!((f.out_base, f.out_total(), f.client_frames), (7, 8, 9));
        assert!(f.ledger.sessions.is_empty());
    }

    #[test]
    fn the_fold_keeps_the_newest_output_within_its_buffer_and_reads_all_of_it() {
        let line = |n: u32| format!("{{\"n\":{n:03}}}\n").into_bytes(); // 10 bytes
        let run = |from: u32, to: u32| (from..to).flat_map(line).collect::<Vec<u8>>();
        let request =
            serde_json::json!({"jsonrpc":"2.0","id":7,"method":"session/new","params":{"cwd":"/w"}});
        let answer = b"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"sessionId\":\"s\"}}\n";
        let big = [b"{\"big\":\"".to_vec(), vec![b'x'; 100 * 1024], b"\"}\n".to_vec()].concat();
        let r1 = run(0, 5);
        let r2 = run(5, 8);
        let bytes = journal(&[
            &in_record(1, vec![7.into()], vec![request]),
            &out_record(1, answer.len()),
            answer,
            &out_record(5, r1.len()),
            &r1,
            &out_record(3, r2.len()),
            &r2,
        ]);
        // 25 bytes: the two newest lines; the answer, dropped, still counts.
        let (_, f) = read(&bytes, 25).unwrap();
        assert_eq!((f.out_base, f.out_total()), (7, 9));
        assert_eq!(f.out.iter().flat_map(|(b, _)| b.to_vec()).collect::<Vec<u8>>(), run(6, 8));
        assert_eq!((f.dropped, f.dropped_bytes), (7, answer.len() as u64 + 60));
        assert_eq!(f.ledger.sessions[0].id, "s", "the session/new answer was read, not kept");
        assert!(f.pending.0.is_empty(), "the answered request is not in flight");
        let (_, whole) = read(&bytes, usize::MAX).unwrap();
        assert_eq!((whole.out_base, whole.out_total(), whole.dropped), (0, 9, 0));

        // A line longer than the buffer goes, and everything before it (no
        // gap); one longer than any worth reading is skipped unread; a skip
        // says all before was acknowledged: nothing is lost then.
        let after = run(20, 21);
        let mut more = bytes.clone();
        for r in [&r1[..], &big, &after] {
            more.extend(out_record(memchr::memchr_iter(b'\n', r).count() as u64, r.len()));
            more.extend_from_slice(r);
        }
        let (_, f) = read(&more, 25).unwrap();
        assert_eq!((f.out_base, f.out_total()), (15, 16));
        assert_eq!(f.out.iter().flat_map(|(b, _)| b.to_vec()).collect::<Vec<u8>>(), after);
        assert_eq!(f.dropped, 15);
        let mut acked = more.clone();
        acked.extend(skip_record(20));
        acked.extend(out_record(1, 10));
        acked.extend(line(1));
        let (_, f) = read(&acked, 25).unwrap();
        assert_eq!((f.out_base, f.out_total(), f.dropped, f.dropped_bytes), (20, 21, 0, 0));
        // The huge line over a buffer that holds it is kept.
        let (_, f) = read(&more, 200 * 1024).unwrap();
        assert_eq!((f.out_base, f.out_total(), f.dropped), (0, 16, 0));
    }

    #[test]
    fn a_record_longer_than_any_the_bridge_writes_does_not_read() {
        let control = format!("!{{\"in\":1,\"req\":[\"{}\"]}}\n", "x".repeat(MAX_CONTROL_LINE));
        assert_eq!(
            read(&journal(&[control.as_bytes()]), 0).unwrap_err(),
            BadJournal::TooLong(1, MAX_CONTROL_LINE as u64 + 1)
        );
        let huge = out_record(1, MAX_OUT_RECORD as usize + 1);
        assert_eq!(read(&journal(&[&huge]), 0).unwrap_err(), BadJournal::TooLong(1, MAX_OUT_RECORD + 1));
        let mut long_header = header();
        long_header.agent = "a".repeat(MAX_HEADER_LINE);
        assert!(matches!(read(&header_line(&long_header), 0).unwrap_err(), BadJournal::BadHeader(_)));
    }

    #[test]
    fn a_record_cut_short_ends_the_fold_and_anything_else_is_bad() {
        let whole = journal(&[&out_record(1, 3), b"{}\n", &out_record(2, 6), b"{}\n{}\n"]);
        let (_, f) = read_all(&whole).unwrap();
        assert_eq!(f.out_total(), 3);
        for cut in [whole.len() - 1, whole.len() - 7, whole.len() - 8] {
            let (_, f) = read_all(&whole[..cut]).unwrap();
            assert!(f.cut_tail, "cut at {cut}");
            assert_eq!(f.out_total(), 1, "the cut record is lost, the one before kept");
        }
        assert_eq!(read_all(b"").unwrap_err(), BadJournal::NoHeader);
        assert!(matches!(read_all(b"{\"journal\":1}\n").unwrap_err(), BadJournal::BadHeader(_)));
        let mut v2 = header();
        v2.journal = 2;
        assert_eq!(read_all(&header_line(&v2)).unwrap_err(), BadJournal::Version(2));
        assert_eq!(read_all(&journal(&[b"!{\"what\":1}\n"])).unwrap_err(), BadJournal::BadRecord(1));
        assert_eq!(read_all(&journal(&[b"no bang\n"])).unwrap_err(), BadJournal::BadRecord(1));
        assert_eq!(
            read_all(&journal(&[&out_record(2, 3), b"{}\n"])).unwrap_err(),
            BadJournal::FrameCount(1, 2, 1)
        );
    }
}
