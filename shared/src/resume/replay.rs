//! What a sender keeps of its frames until the other side acknowledges them,
//! to send again on the next connection.

use std::collections::VecDeque;

use bytes::Bytes;

/// Frames sent and not yet acknowledged, to resend after a reconnect. Holds
/// the chunks as written (runs of whole lines), so pushing costs one
/// reference count and a newline count.
#[derive(Debug, Default)]
pub struct ReplayLog {
    /// Runs of whole lines, with how many lines each holds.
    chunks: VecDeque<(Bytes, u64)>,
    /// Index of the first frame still held.
    base: u64,
    /// Frames pushed over the session.
    total: u64,
    bytes: usize,
    /// Bytes pushed over the session (a sender's mark of how far it wrote).
    pushed: u64,
}

/// An acknowledgement or resume point outside what was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("peer claims frame {claimed}, but frames {base}..{total} are the ones held")]
pub struct BadPosition {
    pub claimed: u64,
    pub base: u64,
    pub total: u64,
}

impl ReplayLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty log whose next frame is number `n` (a client restored from
    /// stored state: the frames before were sent by an earlier instance).
    pub fn starting_at(n: u64) -> Self {
        Self { base: n, total: n, ..Self::default() }
    }

    /// Appends a run of whole lines; returns how many frames it held.
    pub fn push(&mut self, run: Bytes) -> u64 {
        let n = memchr::memchr_iter(b'\n', &run).count() as u64;
        self.push_counted(run, n)
    }

    /// [`Self::push`] of a run whose `n` lines were counted already (the
    /// bridge's line splitter counts them as it checks them).
    pub fn push_counted(&mut self, run: Bytes, n: u64) -> u64 {
        debug_assert!(run.last() == Some(&b'\n'), "runs are whole lines");
        debug_assert_eq!(n, memchr::memchr_iter(b'\n', &run).count() as u64, "the count is the run's");
        if n == 0 {
            return 0;
        }
        self.total += n;
        self.bytes += run.len();
        self.pushed += run.len() as u64;
        self.chunks.push_back((run, n));
        n
    }

    /// Frames pushed so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Index of the oldest frame still held (everything before was acknowledged).
    pub fn acked(&self) -> u64 {
        self.base
    }

    /// Bytes held for a possible resend.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes pushed over the session (see [`Self::pushed_before`]).
    pub fn pushed_bytes(&self) -> u64 {
        self.pushed
    }

    /// Drops everything before frame `n`.
    pub fn ack(&mut self, n: u64) -> Result<(), BadPosition> {
        self.check(n)?;
        while self.base < n {
            let (run, lines) = self.chunks.pop_front().expect("base < n <= total");
            if self.base + lines <= n {
                self.base += lines;
                self.bytes -= run.len();
            } else {
                let rest = skip_lines(&run, n - self.base);
                self.bytes -= run.len() - rest.len();
                self.chunks.push_front((rest, self.base + lines - n));
                self.base = n;
            }
        }
        Ok(())
    }

    /// Drops everything before frame `from` and numbers what follows from
    /// `to` on (`to >= from`): a session taken back after a restart whose
    /// client already holds more of the old agent's frames than were kept
    /// (up to `to`) gets the new frames numbered where it stands.
    pub fn rebase(&mut self, from: u64, to: u64) -> Result<(), BadPosition> {
        self.ack(from)?;
        let shift = to.checked_sub(from).filter(|s| self.total.checked_add(*s).is_some());
        let shift = shift.ok_or(BadPosition { claimed: to, base: self.base, total: self.total })?;
        self.base += shift;
        self.total += shift;
        Ok(())
    }

    /// Everything from frame `n` on, as runs to write in order.
    pub fn since(&self, n: u64) -> Result<Vec<Bytes>, BadPosition> {
        self.range(n, self.total)
    }

    /// Frames from `from` on, whole runs, until they hold `max_bytes` (at
    /// least one run): what a sender writes in one turn, so an ack it puts
    /// between turns waits behind at most this much. Returns the runs and the
    /// frame they end at (the next turn's `from`).
    pub fn next_runs(&self, from: u64, max_bytes: usize) -> Result<(Vec<Bytes>, u64), BadPosition> {
        self.check(from)?;
        let (mut out, mut next, mut bytes) = (Vec::new(), from, 0);
        for (_, end, run) in self.runs_from(from) {
            bytes += run.len();
            out.push(run);
            next = end;
            if bytes >= max_bytes {
                break;
            }
        }
        Ok((out, next))
    }

    /// Frames `from..to` (`to` at the end of a run pushed, or the end), as runs to write in order.
    pub fn range(&self, from: u64, to: u64) -> Result<Vec<Bytes>, BadPosition> {
        self.check(from)?;
        self.check(to)?;
        let runs = self.runs_from(from).take_while(|(start, _, _)| *start < to);
        // A run that goes past `to` is cut at it.
        Ok(runs.map(|(start, end, run)| if end > to { keep_lines(&run, to - start) } else { run }).collect())
    }

    /// Bytes pushed before frame `n` (a sender that has written up to `n`
    /// has written this much of [`Self::pushed_bytes`]).
    pub fn pushed_before(&self, n: u64) -> Result<u64, BadPosition> {
        self.check(n)?;
        let after: usize = self.runs_from(n).map(|(_, _, run)| run.len()).sum();
        Ok(self.pushed - after as u64)
    }

    /// The runs held from frame `from` on (`from` checked), the first cut to
    /// start there, each with the frames it starts and ends at.
    fn runs_from(&self, from: u64) -> impl Iterator<Item = (u64, u64, Bytes)> + '_ {
        let mut at = self.base;
        self.chunks.iter().filter_map(move |(run, lines)| {
            let start = at;
            at += lines;
            if at <= from {
                return None;
            }
            let run = if start < from { skip_lines(run, from - start) } else { run.clone() };
            Some((start.max(from), at, run))
        })
    }

    fn check(&self, n: u64) -> Result<(), BadPosition> {
        if n < self.base || n > self.total {
            return Err(BadPosition { claimed: n, base: self.base, total: self.total });
        }
        Ok(())
    }
}

/// The first `n` lines of `run`.
fn keep_lines(run: &Bytes, n: u64) -> Bytes {
    if n == 0 {
        return Bytes::new();
    }
    let cut = memchr::memchr_iter(b'\n', run).nth(n as usize - 1).map_or(run.len(), |i| i + 1);
    run.slice(..cut)
}

/// `run` without its first `n` lines.
fn skip_lines(run: &Bytes, n: u64) -> Bytes {
    let cut = memchr::memchr_iter(b'\n', run).nth(n as usize - 1).map_or(run.len(), |i| i + 1);
    run.slice(cut..)
}
