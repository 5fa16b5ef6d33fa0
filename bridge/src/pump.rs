//! Moving ndjson frames between the peer's stream and the agent's stdio.
//!
//! Both directions read in large chunks, find complete lines, check each is a
//! JSON value, and write the accepted lines out as slices of the read buffer
//! (no per-line copy, no write or flush per frame). A line over the frame cap
//! ends the session.
//!
//! - peer → agent: non-JSON lines are answered with a JSON-RPC parse error
//!   (-32700, id null) on the peer's stream and never reach the agent.
//! - agent → peer: non-JSON lines (an agent printing a banner on stdout) are
//!   dropped with a warning.
//!
//! Blank lines are skipped in both directions.

use bytes::{Bytes, BytesMut};
use thunderbolt_shared::{
    jsonrpc::{is_json, PARSE_ERROR_LINE},
    ndjson::{is_blank, take_kept_runs, FrameTooLong},
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::mpsc,
};
use tracing::warn;

use crate::limits::READ_CHUNK;

/// Why a pump direction stopped early.
#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    #[error("{side} sent a {0}", side = .1)]
    TooLong(FrameTooLong, &'static str),
    #[error("reading from {1}: {0}")]
    Read(std::io::Error, &'static str),
    #[error("writing to {1}: {0}")]
    Write(std::io::Error, &'static str),
}

/// Reads into one buffer and hands out the complete lines that pass a check as
/// slices of that buffer: valid lines are forwarded byte for byte without being
/// copied one by one; only a rejected line splits the output into two runs.
struct LineSplitter {
    buf: BytesMut,
    /// Bytes at the start of `buf` already known to hold no newline.
    scanned: usize,
    max: usize,
}

impl LineSplitter {
    fn new(max: usize) -> Self {
        Self { buf: BytesMut::with_capacity(READ_CHUNK), scanned: 0, max }
    }

    async fn read_from<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> std::io::Result<usize> {
        self.buf.reserve(READ_CHUNK);
        r.read_buf(&mut self.buf).await
    }

    /// The JSON lines read so far, as runs to forward, and how many lines were
    /// not JSON (left out). At EOF the unterminated remainder is the last line.
    fn json_runs(&mut self, eof: bool) -> Result<(Vec<Bytes>, usize), FrameTooLong> {
        let mut rejected = 0usize;
        let mut check = |line: &[u8]| {
            let ok = is_json(line);
            rejected += usize::from(!ok);
            ok
        };
        let runs = if eof { self.finish(&mut check).into_iter().collect() } else { self.drain(&mut check)? };
        Ok((runs, rejected))
    }

    /// Takes every complete line out of the buffer. `keep` decides per line
    /// (without its newline); kept lines come back as runs of contiguous
    /// bytes, newlines included. Blank lines are dropped silently.
    fn drain(&mut self, keep: impl FnMut(&[u8]) -> bool) -> Result<Vec<Bytes>, FrameTooLong> {
        take_kept_runs(&mut self.buf, &mut self.scanned, self.max, keep)
    }

    /// At EOF: the unterminated remainder as a last line (with a newline added).
    fn finish(&mut self, keep: impl FnOnce(&[u8]) -> bool) -> Option<Bytes> {
        let rest = self.buf.split();
        self.scanned = 0;
        if is_blank(&rest) || !keep(&rest) {
            return None;
        }
        let mut line = BytesMut::with_capacity(rest.len() + 1);
        line.extend_from_slice(&rest);
        line.extend_from_slice(b"\n");
        Some(line.freeze())
    }
}

async fn write_runs<W: AsyncWrite + Unpin>(w: &mut W, runs: &[Bytes]) -> std::io::Result<()> {
    for r in runs {
        w.write_all(r).await?;
    }
    Ok(())
}

/// Peer → agent. Returns when the peer finished its stream (the agent's stdin is
/// then closed, which is how a stdio agent learns the session is over).
pub async fn peer_to_agent<R, W>(
    mut peer: R,
    mut agent_stdin: W,
    replies: mpsc::Sender<Bytes>,
    max_frame: usize,
) -> Result<(), PumpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut split = LineSplitter::new(max_frame);
    loop {
        let n = split.read_from(&mut peer).await.map_err(|e| PumpError::Read(e, "peer"))?;
        let (runs, parse_errors) = split.json_runs(n == 0).map_err(|e| PumpError::TooLong(e, "peer"))?;
        write_runs(&mut agent_stdin, &runs).await.map_err(|e| PumpError::Write(e, "agent stdin"))?;
        for _ in 0..parse_errors {
            warn!("peer sent a line that is not JSON; answered with a parse error");
            // The writer side is gone only when the session is ending anyway.
            let _ = replies.send(Bytes::from_static(PARSE_ERROR_LINE)).await;
        }
        if n == 0 {
            let _ = agent_stdin.shutdown().await;
            return Ok(());
        }
    }
}

/// Agent → peer, plus the bridge's own replies (parse errors). Returns when the
/// agent closed its stdout and everything it wrote has been handed to the stream.
pub async fn agent_to_peer<R, W>(
    mut agent_stdout: R,
    mut peer: W,
    mut replies: mpsc::Receiver<Bytes>,
    max_frame: usize,
    peer_name: &str,
) -> Result<W, PumpError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut split = LineSplitter::new(max_frame);
    let mut replies_open = true;
    loop {
        tokio::select! {
            biased;
            reply = replies.recv(), if replies_open => match reply {
                Some(b) => peer.write_all(&b).await.map_err(|e| PumpError::Write(e, "peer"))?,
                None => replies_open = false,
            },
            n = split.read_from(&mut agent_stdout) => {
                let n = n.map_err(|e| PumpError::Read(e, "agent stdout"))?;
                let (runs, dropped) = split.json_runs(n == 0).map_err(|e| PumpError::TooLong(e, "agent"))?;
                if dropped > 0 {
                    warn!(peer = %peer_name, "dropped {dropped} non-JSON line(s) from the agent's stdout");
                }
                write_runs(&mut peer, &runs).await.map_err(|e| PumpError::Write(e, "peer"))?;
                if n == 0 {
                    // Parse errors queued before the agent ended still belong to the peer.
                    while let Ok(b) = replies.try_recv() {
                        peer.write_all(&b).await.map_err(|e| PumpError::Write(e, "peer"))?;
                    }
                    return Ok(peer);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn peer_lines_are_checked() {
        let input: &[u8] = b"{\"a\":1}\nnot json\n\n[2]";
        let mut stdin = Vec::new();
        let (tx, mut rx) = mpsc::channel(8);
        peer_to_agent(input, &mut stdin, tx, 1024).await.unwrap();
        assert_eq!(stdin, b"{\"a\":1}\n[2]\n");
        assert_eq!(rx.recv().await.unwrap(), Bytes::from_static(PARSE_ERROR_LINE));
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn agent_noise_dropped_and_tail_kept() {
        let stdout: &[u8] = b"Starting agent v1\n{\"id\":1}\n{\"id\":2}";
        let mut peer = Vec::new();
        let (_tx, rx) = mpsc::channel(1);
        let peer = agent_to_peer(stdout, &mut peer, rx, 1024, "p").await.unwrap();
        assert_eq!(*peer, b"{\"id\":1}\n{\"id\":2}\n");
    }

    #[tokio::test]
    async fn oversized_frame_is_an_error() {
        let big = vec![b'1'; 2000];
        let (tx, _rx) = mpsc::channel(1);
        let err = peer_to_agent(&big[..], Vec::new(), tx, 1024).await.unwrap_err();
        assert!(matches!(err, PumpError::TooLong(..)));
    }
}
