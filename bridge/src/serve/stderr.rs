//! The agent's stderr: logged (never sent to the peer as output), and its last
//! non-empty line kept, so that an agent that fails can be told with why.
//!
//! An agent that gives up says why on stderr (`missing API key
//! ANTHROPIC_API_KEY`) and exits non-zero; the line travels with its exit
//! ([`thunderbolt_shared::close::AgentEnd`]), masked like the banner masks the
//! command ([`crate::redact::redact_line`]) and bounded.

use std::time::Duration;

use thunderbolt_shared::stderr_line::StderrLine;
use tokio::{
    io::{AsyncRead, AsyncReadExt},
    sync::watch,
    time::Instant,
};
use tokio_util::task::AbortOnDropHandle;
use tracing::{info, warn};

use crate::{limits, serve::throttle::LogBudget};

/// What the reader saw so far.
#[derive(Default)]
struct Tail {
    /// The last line with something other than blanks on it, as read (at
    /// most [`limits::MAX_STDERR_LINE`] bytes).
    last: Option<Vec<u8>>,
    /// The pipe closed: nothing more comes.
    closed: bool,
}

/// The agent's stderr, being read.
pub struct Stderr {
    task: AbortOnDropHandle<()>,
    tail: watch::Receiver<Tail>,
}

impl Stderr {
    /// Reads `stderr` to its end on a task of its own, logging it tagged with `peer`.
    pub fn spawn(stderr: impl AsyncRead + Unpin + Send + 'static, peer: String) -> Self {
        let (tx, tail) = watch::channel(Tail::default());
        Self { task: AbortOnDropHandle::new(tokio::spawn(log_stderr(stderr, peer, tx))), tail }
    }

    /// The agent's last non-empty stderr line, masked and bounded, once the
    /// pipe closed: an agent that exited has closed it, normally, so this is at
    /// once; a process it started that holds the pipe is not waited for past
    /// `until` (then the last line so far is it).
    pub async fn last_line(&mut self, until: Instant) -> Option<StderrLine> {
        let _ = tokio::time::timeout_at(until, self.tail.wait_for(|t| t.closed)).await;
        let tail = self.tail.borrow();
        let raw = String::from_utf8_lossy(tail.last.as_deref()?);
        StderrLine::new(&crate::redact::redact_line(&raw))
    }

    /// Waits (at most `wait`) until all of it was logged.
    pub async fn drain(self, wait: Duration) {
        let _ = tokio::time::timeout(wait, self.task).await;
    }
}

/// Agent stderr goes to our log, line by line, tagged with the peer; never to
/// the peer. Lines are cut at [`limits::MAX_STDERR_LINE`] so memory stays
/// bounded, and at most [`limits::STDERR_LOG_BURST`] lines at once and
/// [`limits::STDERR_LOG_PER_SEC`] a second are logged: the rest is read (the
/// agent never blocks on a full pipe) and counted, and the count is logged.
/// Every line, logged or not, may be the last one kept in `tail`.
async fn log_stderr(mut stderr: impl AsyncRead + Unpin, peer: String, tail: watch::Sender<Tail>) {
    let mut buf: Vec<u8> = Vec::with_capacity(limits::MAX_STDERR_LINE);
    let mut chunk = vec![0u8; limits::MAX_STDERR_LINE];
    let mut budget =
        LogBudget::new(limits::STDERR_LOG_BURST, limits::STDERR_LOG_PER_SEC, Instant::now().into_std());
    let report = |n: u64| {
        if n > 0 {
            warn!(peer = %peer, "agent stderr: {n} line(s) not logged (over {} lines/s)", limits::STDERR_LOG_PER_SEC);
        }
    };
    // A line longer than the cap is logged in pieces; only its first piece
    // (where the cause is said) may be kept as the last line.
    let mut mid_line = false;
    let mut emit = |line: &[u8], continued: bool| {
        if !continued && !line.iter().all(u8::is_ascii_whitespace) {
            tail.send_modify(|t| t.last = Some(line.to_vec()));
        }
        if let Some(suppressed) = budget.take(Instant::now().into_std()) {
            report(suppressed);
            let text = String::from_utf8_lossy(line);
            info!(peer = %peer, "agent stderr: {}", text.trim_end());
        }
    };
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                if !buf.is_empty() {
                    emit(&buf, mid_line);
                }
                report(budget.take_suppressed());
                tail.send_modify(|t| t.closed = true);
                return;
            }
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut start = 0;
        while let Some(off) = thunderbolt_shared::ndjson::memchr_newline(&buf[start..]) {
            emit(&buf[start..start + off], mid_line);
            mid_line = false;
            start += off + 1;
        }
        buf.drain(..start);
        if buf.len() >= limits::MAX_STDERR_LINE {
            emit(&buf, mid_line);
            mid_line = true;
            buf.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_last_non_empty_line_is_kept_masked() {
        let (mut w, r) = tokio::io::duplex(64);
        let mut s = Stderr::spawn(r, "p".into());
        use tokio::io::AsyncWriteExt;
        w.write_all(b"starting\nfatal: bad --api-key sk-1\n\n  \n").await.unwrap();
        drop(w);
        let line = s.last_line(Instant::now() + Duration::from_secs(30)).await.unwrap();
        assert_eq!(line.as_str(), "fatal: bad --api-key ***");
    }

    #[tokio::test]
    async fn a_long_line_is_bounded() {
        let (mut w, r) = tokio::io::duplex(64);
        let mut s = Stderr::spawn(r, "p".into());
        use tokio::io::AsyncWriteExt;
        // Longer than the log's cap too: the line's start is what is kept.
        let long = format!("error: {}\n", "x".repeat(3 * limits::MAX_STDERR_LINE + 7));
        w.write_all(long.as_bytes()).await.unwrap();
        drop(w);
        let line = s.last_line(Instant::now() + Duration::from_secs(30)).await.unwrap();
        assert!(line.as_str().len() <= thunderbolt_shared::stderr_line::MAX_STDERR_LINE);
        assert!(line.as_str().starts_with("error: xxx") && line.as_str().ends_with('…'), "{line}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pipe_held_open_is_not_waited_for_past_the_bound() {
        let (mut w, r) = tokio::io::duplex(64);
        let mut s = Stderr::spawn(r, "p".into());
        use tokio::io::AsyncWriteExt;
        w.write_all(b"said before exiting\n").await.unwrap();
        // `w` stays open, as a process the agent started would hold it.
        let line = s.last_line(Instant::now() + Duration::from_millis(500)).await;
        assert_eq!(line.map(|l| l.as_str().to_string()).as_deref(), Some("said before exiting"));
        drop(w);
    }
}
