//! Frames and control lines on one stream: splitting what arrives into the
//! two, and escaping a local line that would read as a control line.

use bytes::{Bytes, BytesMut};

use super::{BadControl, Control, CONTROL_PREFIX, MAX_CONTROL_LINE};

/// What a receiver got.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// Frame bytes to pass on, and how many frames they complete. A frame over
    /// the receiver's cap is passed on in pieces (`frames` 0 until its end);
    /// all others arrive whole.
    Data { bytes: Bytes, frames: u64 },
    /// A control line (`None`: one this version does not understand).
    Control(Option<Control>),
    /// A control line that breaks the protocol.
    BadControl(BadControl),
}

/// Splits what arrives on a resumable stream into frames and control lines.
#[derive(Debug)]
pub struct Receiver {
    buf: BytesMut,
    max: usize,
    /// Inside a frame over `max`, already partly passed on.
    passing: bool,
    /// No control lines (the plain protocol): every line is a frame.
    plain: bool,
}

impl Receiver {
    /// `max`: the longest frame held back whole (an unfinished frame is never
    /// passed on, so a lost connection cannot leave half of one behind).
    pub fn new(max: usize) -> Self {
        Self { buf: BytesMut::new(), max: max.max(MAX_CONTROL_LINE), passing: false, plain: false }
    }

    /// A receiver for the plain protocol: whole lines only, no control lines.
    pub fn plain(max: usize) -> Self {
        Self { plain: true, ..Self::new(max) }
    }

    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Where the next read should go (saves a copy).
    pub fn buf_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Drops an unfinished line: the connection carrying it is gone and the
    /// sender resends it whole.
    pub fn reset(&mut self) {
        self.buf.clear();
        self.passing = false;
    }

    /// Bytes held of an unfinished line.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Everything complete so far, in order.
    pub fn drain(&mut self, out: &mut Vec<Event>) {
        if self.passing {
            match memchr::memchr(b'\n', &self.buf) {
                Some(i) => {
                    self.passing = false;
                    out.push(Event::Data { bytes: self.buf.split_to(i + 1).freeze(), frames: 1 });
                }
                None => {
                    if !self.buf.is_empty() {
                        out.push(Event::Data { bytes: self.buf.split().freeze(), frames: 0 });
                    }
                    return;
                }
            }
        }
        // One pass: runs of frame lines end at a control line or at the last newline.
        let mut spans: Vec<(usize, usize, Option<u64>)> = Vec::new();
        let (mut run_start, mut run_frames, mut line_start) = (0, 0u64, 0);
        for nl in memchr::memchr_iter(b'\n', &self.buf) {
            if !self.plain && self.buf[line_start] == CONTROL_PREFIX && nl - line_start < MAX_CONTROL_LINE {
                if run_frames > 0 {
                    spans.push((run_start, line_start, Some(run_frames)));
                }
                spans.push((line_start, nl + 1, None));
                run_start = nl + 1;
                run_frames = 0;
            } else {
                run_frames += 1;
            }
            line_start = nl + 1;
        }
        if run_frames > 0 {
            spans.push((run_start, line_start, Some(run_frames)));
        }
        if line_start > 0 {
            let done = self.buf.split_to(line_start).freeze();
            for (s, e, frames) in spans {
                out.push(match frames {
                    Some(frames) => Event::Data { bytes: done.slice(s..e), frames },
                    None => match Control::parse(&done[s..e]) {
                        Ok(c) => Event::Control(c),
                        Err(bad) => Event::BadControl(bad),
                    },
                });
            }
        }
        if self.buf.len() > self.max {
            self.passing = true;
            out.push(Event::Data { bytes: self.buf.split().freeze(), frames: 0 });
        }
        // A long frame made the buffer large: give it back once it is little
        // used (what remains is at most a partial line of one read).
        if self.buf.capacity() > crate::ndjson::SHRINK_ABOVE && self.buf.len() <= SHRINK_KEEP {
            let mut fresh = BytesMut::with_capacity(SHRINK_KEEP.max(self.buf.len()));
            fresh.extend_from_slice(&self.buf);
            self.buf = fresh;
        }
    }
}

/// What a [`Receiver`]'s buffer shrinks back to: one read's worth.
const SHRINK_KEEP: usize = 64 * 1024;

/// A local line that would read as a control line gets one space in front.
pub fn escape_run(run: Bytes) -> Bytes {
    let starts_control = |i: usize| run.get(i) == Some(&CONTROL_PREFIX);
    let need = starts_control(0) || memchr::memchr_iter(b'\n', &run).any(|i| starts_control(i + 1));
    if need {
        escaped(&run)
    } else {
        run
    }
}

/// [`escape_run`], and how many lines the run holds: the one pass over the
/// run that looks for lines to escape counts them for the replay log too
/// ([`ReplayLog::push_counted`]), so a sender reads each byte it sends once.
/// (The browser's client keeps [`escape_run`]: the count would cost it bytes.)
pub fn escape_counted(run: Bytes) -> (Bytes, u64) {
    let starts_control = |i: usize| run.get(i) == Some(&CONTROL_PREFIX);
    let (mut need, mut lines) = (starts_control(0), 0u64);
    for i in memchr::memchr_iter(b'\n', &run) {
        lines += 1;
        need |= starts_control(i + 1);
    }
    // A space in front of a line adds no line.
    (if need { escaped(&run) } else { run }, lines)
}

/// `run` with a space in front of each line that starts like a control line.
#[inline(always)]
fn escaped(run: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(run.len() + 8);
    let mut at_start = true;
    for &b in run {
        if at_start && b == CONTROL_PREFIX {
            out.push(b' ');
        }
        out.push(b);
        at_start = b == b'\n';
    }
    out.into()
}
