//! Newline-delimited JSON framing: one JSON value per line, `\n`-terminated.
//!
//! The framer never holds more than [`MAX_FRAME_LEN`] bytes of an unfinished
//! line: a peer that never sends a newline cannot make us buffer without bound.
//! [`LineFramer`] is the push-based framer of the wasm client; [`RunSplitter`]
//! the bridge's zero-copy one.

use bytes::{BufMut, Bytes, BytesMut};

/// Default largest frame (without its `\n`). ACP messages carry file contents
/// and tool output; 32 MiB is the ACP TypeScript SDK's own limit, so whatever
/// works between an SDK client and an SDK agent without us also works through
/// us. The bridge takes another value with `--max-frame`.
pub const MAX_FRAME_LEN: usize = 32 * 1024 * 1024;

/// Smallest frame cap either side accepts as a setting: an ACP `initialize`
/// exchange must fit.
pub const MIN_FRAME_LEN: usize = 1024;

/// A line exceeded the frame cap.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("frame longer than {max} bytes (limit of the ndjson framing)")]
pub struct FrameTooLong {
    pub max: usize,
}

/// A read into a buffer whose spare room is below `chunk / READ_ROOM_DIVISOR`
/// first reserves a whole `chunk`; above it, the read goes into what is left.
/// Reserving a whole chunk before every read allocates afresh each time
/// while the lines split off earlier still share the old allocation (a 64 KiB
/// buffer, page faults and all, per 200-byte message); with this one a buffer
/// serves a few hundred small messages and a bulk read is still at least a
/// quarter chunk.
pub const READ_ROOM_DIVISOR: usize = 4;

/// Makes room in `buf` for the next read of up to `chunk` bytes (see
/// [`READ_ROOM_DIVISOR`]).
pub fn room_for_read(buf: &mut BytesMut, chunk: usize) {
    if buf.capacity() - buf.len() < chunk / READ_ROOM_DIVISOR {
        buf.reserve(chunk);
    }
}

/// Takes the next complete line out of `buf`, without its `\n` (and a `\r`
/// before it). `scanned` remembers how far `buf` was already searched so a
/// long line arriving in many small reads is scanned once, not quadratically.
pub fn take_line(
    buf: &mut BytesMut,
    scanned: &mut usize,
    max: usize,
) -> Result<Option<BytesMut>, FrameTooLong> {
    let start = (*scanned).min(buf.len());
    match memchr_newline(&buf[start..]) {
        Some(off) => {
            let end = start + off;
            *scanned = 0;
            if end > max {
                return Err(FrameTooLong { max });
            }
            let mut line = buf.split_to(end + 1);
            line.truncate(end);
            if line.last() == Some(&b'\r') {
                line.truncate(end - 1);
            }
            Ok(Some(line))
        }
        None => {
            *scanned = buf.len();
            if buf.len() > max {
                Err(FrameTooLong { max })
            } else {
                Ok(None)
            }
        }
    }
}

/// First `\n` in `hay` (SIMD-accelerated: this runs over every byte a session carries).
pub fn memchr_newline(hay: &[u8]) -> Option<usize> {
    memchr::memchr(b'\n', hay)
}

/// The lines of `run`, each with its newline (a last one without, if `run`
/// does not end with one): `split_inclusive` at memchr's speed, for the scans
/// that run over every byte the bridge carries.
pub fn lines(run: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    let mut ends = memchr::memchr_iter(b'\n', run);
    std::iter::from_fn(move || {
        let end = match ends.next() {
            Some(nl) => nl + 1,
            None if start < run.len() => run.len(),
            None => return None,
        };
        let line = &run[start..end];
        start = end;
        Some(line)
    })
}

/// How many bytes of a line over the cap are kept to tell what it was (its
/// JSON-RPC `id` and kind): message heads are a few dozen bytes, and some
/// serializers put `params` before `id`, so a little more than one read's worth
/// of a small message.
pub const OVERSIZE_PEEK: usize = 4096;

/// Kept lines, contiguous, newlines included, sharing the read buffer's
/// memory, with what the check saw of them on the way: a replay log that keeps
/// the run needs not count its lines again, nor a reader look for what no
/// line was flagged for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub bytes: Bytes,
    /// How many lines.
    pub lines: u64,
    /// Whether the check flagged any of them (the bridge's: a line with a
    /// top-level `id`, see `jsonrpc::check_line`).
    pub flagged: bool,
}

/// A line's verdict from the check a splitter runs: `None` refuses it,
/// `Some(flag)` keeps it, and a `true` flag marks its run ([`Run::flagged`]).
pub type Verdict = Option<bool>;

/// One piece of what [`RunSplitter::drain`] took out of its buffer, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Kept lines, contiguous (see [`Run`]).
    Run(Run),
    /// A line `keep` refused; its bytes are gone.
    Rejected,
    /// A line over the cap: its first bytes (at most [`OVERSIZE_PEEK`]). The
    /// rest of it is skipped up to its newline without being buffered.
    Oversized(Bytes),
}

/// Splits a byte stream into runs of complete lines for forwarding without a
/// copy per line, holding at most the cap plus one read of an unfinished line.
/// A line over the cap costs only itself: it is reported once as
/// [`Piece::Oversized`] and skipped, and the lines after it go on as usual.
#[derive(Debug)]
pub struct RunSplitter {
    buf: BytesMut,
    /// Bytes at the start of `buf` already known to hold no newline.
    scanned: usize,
    max: usize,
    /// Inside a line over the cap: drop everything up to its newline.
    skipping: bool,
    /// The capacity it starts with (one read), and shrinks back to.
    min_capacity: usize,
}

/// A reading buffer larger than this is replaced by a small one as soon as
/// what it holds fits one read (see [`RunSplitter`]).
pub const SHRINK_ABOVE: usize = 1 << 20;

/// Classifies the complete lines of `done` (every one ends in a newline) into
/// runs to forward (sharing `done`'s memory), refused lines and lines over
/// `max`: the same verdicts [`RunSplitter::drain`] gives, for input that
/// arrives as whole lines (a resumable session's frames, a WebSocket's messages).
pub fn split_lines(done: &Bytes, max: usize, mut keep: impl FnMut(&[u8]) -> Verdict, out: &mut Vec<Piece>) {
    // The kept lines since `run_start`: how many, and whether one was flagged.
    let (mut line_start, mut run_start, mut lines, mut flagged) = (0, 0, 0, false);
    let run = |bytes: Bytes, lines: u64, flagged: bool| Piece::Run(Run { bytes, lines, flagged });
    for nl in memchr::memchr_iter(b'\n', done) {
        let line = &done[line_start..nl];
        let verdict = if line.len() > max {
            Some(Some(Piece::Oversized(done.slice(line_start..line_start + line.len().min(OVERSIZE_PEEK)))))
        } else if is_blank(line) {
            // Dropped silently: it only ends the run.
            Some(None)
        } else {
            match keep(line) {
                None => Some(Some(Piece::Rejected)),
                Some(flag) => {
                    flagged |= flag;
                    None
                }
            }
        };
        match verdict {
            Some(v) => {
                if run_start < line_start {
                    out.push(run(done.slice(run_start..line_start), lines, flagged));
                }
                out.extend(v);
                run_start = nl + 1;
                (lines, flagged) = (0, false);
            }
            None => lines += 1,
        }
        line_start = nl + 1;
    }
    if run_start < line_start {
        out.push(run(done.slice(run_start..line_start), lines, flagged));
    }
}

impl RunSplitter {
    pub fn new(max: usize, capacity: usize) -> Self {
        Self {
            buf: BytesMut::with_capacity(capacity),
            scanned: 0,
            max,
            skipping: false,
            min_capacity: capacity,
        }
    }

    /// The buffer to read into (append only).
    pub fn buf_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Bytes held for an unfinished line.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Bytes the buffer holds room for (what a session keeps allocated).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Takes every complete line out of the buffer into `out`. `keep` decides per
    /// line (without its newline); blank lines are dropped silently.
    pub fn drain(&mut self, keep: impl FnMut(&[u8]) -> Verdict, out: &mut Vec<Piece>) {
        if self.skipping {
            match memchr_newline(&self.buf) {
                None => {
                    self.buf.clear();
                    self.scanned = 0;
                    self.shrink();
                    return;
                }
                Some(nl) => {
                    let _ = self.buf.split_to(nl + 1);
                    self.skipping = false;
                    self.scanned = 0;
                }
            }
        }
        // Complete lines end at the last newline; what follows has none (the
        // part before `scanned` was searched already).
        let from = self.scanned.min(self.buf.len());
        let end = memchr::memrchr(b'\n', &self.buf[from..]).map_or(0, |i| from + i + 1);
        let tail = self.buf.len() - end;
        let done = self.buf.split_to(end).freeze();
        split_lines(&done, self.max, keep, out);
        if tail > self.max {
            out.push(Piece::Oversized(Bytes::copy_from_slice(&self.buf[..tail.min(OVERSIZE_PEEK)])));
            self.skipping = true;
            self.buf.clear();
        }
        self.scanned = self.buf.len();
        self.shrink();
    }

    /// Gives back a buffer a long line made large once little of it is in use,
    /// so a session keeps about one read's worth, not its largest line ever.
    fn shrink(&mut self) {
        if self.buf.capacity() > SHRINK_ABOVE && self.buf.len() <= self.min_capacity {
            let mut fresh = BytesMut::with_capacity(self.min_capacity.max(self.buf.len()));
            fresh.extend_from_slice(&self.buf);
            self.buf = fresh;
        }
    }

    /// At end of stream: the unterminated remainder as a last line (a newline
    /// added), unless it is blank, refused, or the tail of a skipped line.
    pub fn finish(&mut self, keep: impl FnOnce(&[u8]) -> Verdict, out: &mut Vec<Piece>) {
        let rest = std::mem::replace(&mut self.buf, BytesMut::with_capacity(self.min_capacity));
        self.scanned = 0;
        if std::mem::take(&mut self.skipping) || is_blank(&rest) {
            return;
        }
        let Some(flagged) = keep(&rest) else {
            out.push(Piece::Rejected);
            return;
        };
        let mut line = BytesMut::with_capacity(rest.len() + 1);
        line.extend_from_slice(&rest);
        line.extend_from_slice(b"\n");
        out.push(Piece::Run(Run { bytes: line.freeze(), lines: 1, flagged }));
    }
}

/// Whether a frame carries nothing but whitespace (blank lines are skipped by
/// both sides rather than treated as malformed JSON).
pub fn is_blank(frame: &[u8]) -> bool {
    frame.iter().all(|b| b.is_ascii_whitespace())
}

/// Appends `frame` plus `\n` to `dst`, refusing frames over the cap or with an
/// embedded newline (which would split into two frames on the other side).
pub fn encode_frame(frame: &[u8], dst: &mut BytesMut, max: usize) -> Result<(), EncodeError> {
    if frame.len() > max {
        return Err(EncodeError::TooLong(FrameTooLong { max }));
    }
    if frame.contains(&b'\n') {
        return Err(EncodeError::EmbeddedNewline);
    }
    dst.reserve(frame.len() + 1);
    dst.put_slice(frame);
    dst.put_u8(b'\n');
    Ok(())
}

/// Why a frame could not be encoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    #[error(transparent)]
    TooLong(#[from] FrameTooLong),
    #[error("frame contains a newline; ndjson frames must be a single line")]
    EmbeddedNewline,
}

/// Push-based framer for callers that receive byte chunks (the browser client).
#[derive(Debug)]
pub struct LineFramer {
    buf: BytesMut,
    scanned: usize,
    max: usize,
}

impl Default for LineFramer {
    fn default() -> Self {
        Self::new(MAX_FRAME_LEN)
    }
}

impl LineFramer {
    pub fn new(max: usize) -> Self {
        Self { buf: BytesMut::new(), scanned: 0, max }
    }

    /// Adds received bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete frame, if any.
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, FrameTooLong> {
        take_line(&mut self.buf, &mut self.scanned, self.max).map(|o| o.map(BytesMut::freeze))
    }

    /// At end of stream: the unterminated remainder, if any (a peer that exits
    /// without a final newline still gets its last message delivered).
    pub fn finish(&mut self) -> Option<Bytes> {
        if self.buf.is_empty() {
            None
        } else {
            self.scanned = 0;
            Some(self.buf.split().freeze())
        }
    }

    /// Bytes held for an unfinished line.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_inclusive_lines() {
        for run in [&b"a\nbb\n"[..], b"a\nbb", b"", b"\n\n", b"x"] {
            let want: Vec<&[u8]> = run.split_inclusive(|b| *b == b'\n').collect();
            assert_eq!(lines(run).collect::<Vec<_>>(), want, "{run:?}");
        }
    }

    #[test]
    fn small_reads_share_one_allocation_and_bulk_reads_keep_room() {
        const CHUNK: usize = 64 * 1024;
        let msg = [b'x'; 200];
        let mut buf = BytesMut::new();
        // Every message split off is kept alive (as the agent's queue and the
        // replay log keep them), so a new allocation shows as a message that
        // does not start where the previous one ended.
        let mut kept: Vec<Bytes> = Vec::new();
        for _ in 0..300 {
            room_for_read(&mut buf, CHUNK);
            assert!(buf.capacity() - buf.len() >= CHUNK / READ_ROOM_DIVISOR, "a read always has room");
            buf.extend_from_slice(&msg);
            kept.push(buf.split().freeze());
        }
        let fresh =
            kept.windows(2).filter(|w| w[0].as_ptr().wrapping_add(w[0].len()) != w[1].as_ptr()).count();
        // 300 × 200 B fit in about one 64 KiB buffer and its last quarter.
        assert!(fresh <= 2, "{fresh} of 300 small messages went into a new allocation");
    }

    #[test]
    fn splits_lines_across_chunks() {
        let mut f = LineFramer::new(100);
        f.push(b"{\"a\":1}\n{\"b\"");
        assert_eq!(f.next_frame().unwrap().unwrap(), &b"{\"a\":1}"[..]);
        assert_eq!(f.next_frame().unwrap(), None);
        f.push(b":2}\r\n");
        assert_eq!(f.next_frame().unwrap().unwrap(), &b"{\"b\":2}"[..]);
        assert_eq!(f.next_frame().unwrap(), None);
        assert_eq!(f.finish(), None);
    }

    #[test]
    fn caps_unterminated_and_terminated_lines() {
        let mut f = LineFramer::new(8);
        f.push(b"123456789");
        assert_eq!(f.next_frame(), Err(FrameTooLong { max: 8 }));
        let mut f = LineFramer::new(8);
        f.push(b"12345678\n");
        assert_eq!(f.next_frame().unwrap().unwrap(), &b"12345678"[..]);
        let mut f = LineFramer::new(8);
        f.push(b"123456789\n");
        assert!(f.next_frame().is_err());
    }

    #[test]
    fn finish_returns_remainder() {
        let mut f = LineFramer::new(100);
        f.push(b"{\"tail\":true}");
        assert_eq!(f.next_frame().unwrap(), None);
        assert_eq!(f.finish().unwrap(), &b"{\"tail\":true}"[..]);
    }

    fn drain_all(s: &mut RunSplitter, mut keep: impl FnMut(&[u8]) -> bool) -> Vec<Piece> {
        let mut out = Vec::new();
        s.drain(|l| keep(l).then_some(false), &mut out);
        out
    }

    fn run(b: &'static [u8]) -> Piece {
        let lines = memchr::memchr_iter(b'\n', b).count() as u64;
        Piece::Run(Run { bytes: Bytes::from_static(b), lines, flagged: false })
    }

    #[test]
    fn runs_share_the_buffer_and_skip_rejects() {
        let mut s = RunSplitter::new(100, 64);
        s.buf_mut().extend_from_slice(b"[1]\n\n[2]\nbad\n[3]\r\n[4");
        let out = drain_all(&mut s, |l| l != b"bad");
        assert_eq!(out, vec![run(b"[1]\n"), run(b"[2]\n"), Piece::Rejected, run(b"[3]\r\n")]);
        assert_eq!(s.buffered(), 2);
        let mut out = Vec::new();
        s.finish(|_| Some(false), &mut out);
        assert_eq!(out, vec![run(b"[4\n")]);
    }

    #[test]
    fn a_run_carries_the_count_of_its_lines_and_its_flag() {
        let mut s = RunSplitter::new(100, 64);
        s.buf_mut().extend_from_slice(b"[1]\n[2]\nid\nbad\n[4]\n[5]\n\nid\n[6]\n[7]");
        let mut out = Vec::new();
        s.drain(|l| (l != b"bad").then_some(l == b"id"), &mut out);
        s.finish(|l| Some(l == b"id"), &mut out);
        let run = |b: &'static [u8], lines, flagged| {
            Piece::Run(Run { bytes: Bytes::from_static(b), lines, flagged })
        };
        // Written out, not computed: a count off by the line a verdict ends
        // the run with, a blank line counted, or a flag that outlives its run
        // fails here.
        assert_eq!(
            out,
            vec![
                run(b"[1]\n[2]\nid\n", 3, true),
                Piece::Rejected,
                run(b"[4]\n[5]\n", 2, false),
                run(b"id\n[6]\n", 2, true),
                run(b"[7]\n", 1, false),
            ]
        );
    }

    #[test]
    fn a_line_over_the_cap_costs_only_itself() {
        let mut s = RunSplitter::new(8, 64);
        // Complete oversized line between two good ones.
        s.buf_mut().extend_from_slice(b"[1]\n123456789\n[2]\n");
        let out = drain_all(&mut s, |_| true);
        assert_eq!(
            out,
            vec![run(b"[1]\n"), Piece::Oversized(Bytes::from_static(b"123456789")), run(b"[2]\n")]
        );
        // An unterminated one arriving in pieces: reported once, never held whole.
        s.buf_mut().extend_from_slice(b"[3]\nabcdefghij");
        let out = drain_all(&mut s, |_| true);
        assert_eq!(out, vec![run(b"[3]\n"), Piece::Oversized(Bytes::from_static(b"abcdefghij"))]);
        assert_eq!(s.buffered(), 0);
        s.buf_mut().extend_from_slice(b"klmnopqrstuvwxyz");
        assert_eq!(drain_all(&mut s, |_| true), vec![]);
        assert_eq!(s.buffered(), 0, "skipped bytes are not kept");
        s.buf_mut().extend_from_slice(b"still the long line\n[4]\n");
        assert_eq!(drain_all(&mut s, |_| true), vec![run(b"[4]\n")]);
        // At EOF inside a skipped line: nothing.
        s.buf_mut().extend_from_slice(b"0123456789abc");
        assert_eq!(drain_all(&mut s, |_| true).len(), 1);
        let mut out = Vec::new();
        s.buf_mut().extend_from_slice(b"tail");
        s.finish(|_| Some(false), &mut out);
        assert!(out.is_empty());
        // Exactly at the cap is fine.
        s.buf_mut().extend_from_slice(b"12345678\n");
        assert_eq!(drain_all(&mut s, |_| true), vec![run(b"12345678\n")]);
    }

    #[test]
    fn a_long_line_does_not_leave_a_large_buffer_behind() {
        for max in [64 << 20, 1 << 20] {
            let mut s = RunSplitter::new(max, 64 * 1024);
            // A 4 MiB line (kept, or over the cap and skipped) arriving in reads.
            for _ in 0..64 {
                s.buf_mut().extend_from_slice(&[b'1'; 64 * 1024]);
                drain_all(&mut s, |_| true);
            }
            s.buf_mut().extend_from_slice(b"\n[2]\n");
            let out = drain_all(&mut s, |_| true);
            assert!(
                matches!(out.last(), Some(Piece::Run(Run { bytes: r, .. })) if r.ends_with(b"\n[2]\n") || &r[..] == b"[2]\n"),
                "{max}"
            );
            assert!(s.capacity() <= SHRINK_ABOVE, "max {max}: {} bytes kept", s.capacity());
        }
    }

    #[test]
    fn oversized_peek_is_bounded() {
        let mut s = RunSplitter::new(10, 64);
        s.buf_mut().extend_from_slice(&vec![b'x'; OVERSIZE_PEEK * 2]);
        let out = drain_all(&mut s, |_| true);
        let [Piece::Oversized(head)] = &out[..] else { panic!("{out:?}") };
        assert_eq!(head.len(), OVERSIZE_PEEK);
    }

    #[test]
    fn encode_rules() {
        let mut dst = BytesMut::new();
        encode_frame(b"{}", &mut dst, 4).unwrap();
        assert_eq!(&dst[..], b"{}\n");
        assert_eq!(encode_frame(b"{\n}", &mut dst, 4), Err(EncodeError::EmbeddedNewline));
        assert!(matches!(encode_frame(b"{ 12 }", &mut dst, 4), Err(EncodeError::TooLong(_))));
    }

    #[test]
    fn blank() {
        assert!(is_blank(b""));
        assert!(is_blank(b" \t\r"));
        assert!(!is_blank(b" {} "));
    }
}
