//! Moving ndjson frames between the peer's stream and the agent's stdio.
//!
//! Both directions read in large chunks, split complete lines, check each is a
//! JSON value, and write the accepted lines back out in one batch per read (no
//! write or flush per frame). A line over the frame cap ends the session.
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
    ndjson::{is_blank, take_line, FrameTooLong},
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

/// What to do with each complete line; returns the bytes to forward (if any).
struct LineSplitter {
    buf: BytesMut,
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

    /// Calls `f` with each complete line.
    fn drain(&mut self, mut f: impl FnMut(&[u8])) -> Result<(), FrameTooLong> {
        while let Some(line) = take_line(&mut self.buf, &mut self.scanned, self.max)? {
            if !is_blank(&line) {
                f(&line);
            }
        }
        Ok(())
    }

    /// At EOF: the unterminated remainder, treated as a last line.
    fn finish(&mut self, f: impl FnOnce(&[u8])) {
        let rest = self.buf.split();
        if !is_blank(&rest) {
            f(&rest);
        }
    }
}

fn push_line(out: &mut BytesMut, line: &[u8]) {
    out.reserve(line.len() + 1);
    out.extend_from_slice(line);
    out.extend_from_slice(b"\n");
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
    let mut out = BytesMut::with_capacity(READ_CHUNK);
    let mut parse_errors = 0usize;
    loop {
        let n = split.read_from(&mut peer).await.map_err(|e| PumpError::Read(e, "peer"))?;
        let mut accept = |line: &[u8]| {
            if is_json(line) {
                push_line(&mut out, line);
            } else {
                parse_errors += 1;
            }
        };
        if n == 0 {
            split.finish(&mut accept);
        } else {
            split.drain(&mut accept).map_err(|e| PumpError::TooLong(e, "peer"))?;
        }
        for _ in 0..std::mem::take(&mut parse_errors) {
            warn!("peer sent a line that is not JSON; answered with a parse error");
            // The writer side is gone only when the session is ending anyway.
            let _ = replies.send(Bytes::from_static(PARSE_ERROR_LINE)).await;
        }
        if !out.is_empty() {
            agent_stdin.write_all(&out).await.map_err(|e| PumpError::Write(e, "agent stdin"))?;
            out.clear();
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
    let mut out = BytesMut::with_capacity(READ_CHUNK);
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
                let mut dropped = 0usize;
                let mut accept = |line: &[u8]| {
                    if is_json(line) {
                        push_line(&mut out, line);
                    } else {
                        dropped += 1;
                    }
                };
                if n == 0 {
                    split.finish(&mut accept);
                } else {
                    split.drain(&mut accept).map_err(|e| PumpError::TooLong(e, "agent"))?;
                }
                if dropped > 0 {
                    warn!(peer = %peer_name, "dropped {dropped} non-JSON line(s) from the agent's stdout");
                }
                if !out.is_empty() {
                    peer.write_all(&out).await.map_err(|e| PumpError::Write(e, "peer"))?;
                    out.clear();
                }
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
