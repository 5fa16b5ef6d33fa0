//! Moving ndjson frames between the peer's stream and the agent's stdio.
//!
//! Both directions read in large chunks, find complete lines, check each is one
//! valid UTF-8 JSON value, and write the accepted lines out as slices of the
//! read buffer (no per-line copy, no write or flush per frame).
//!
//! - peer → agent: non-JSON lines are answered with a JSON-RPC parse error
//!   (-32700, id null) on the peer's stream and never reach the agent.
//! - agent → peer: non-JSON lines (an agent printing a banner on stdout) are
//!   dropped with a warning.
//! - A line over the frame cap costs only itself, in either direction: it is
//!   skipped up to its newline without being buffered whole, and whoever would
//!   wait for it gets a JSON-RPC error instead (see `thunderbolt_shared::jsonrpc`
//!   for the table): the sender of a request, the receiver of a response.
//!
//! Blank lines are skipped in both directions.

use bytes::Bytes;
use thunderbolt_shared::{
    jsonrpc::{self, check_line, Kind, PARSE_ERROR_LINE},
    ndjson::{room_for_read, split_lines, Piece, Run, RunSplitter},
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::mpsc,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::{limits::READ_CHUNK, serve::taps::Observers};

/// What a queue-fed session hands the agent's input pump: runs of whole
/// lines, or the head of a line over the cap whose rest the source skipped
/// (a resumable session's frames, a WebSocket's messages arrive whole, so
/// the pump takes them as they are instead of buffering them again).
#[derive(Debug)]
pub enum Inbound {
    Lines(Bytes),
    Oversized(Bytes),
}

/// The agent's input when it comes through queues rather than one stream (a
/// resumable session's connections, a WebSocket's frames).
#[derive(Debug)]
pub struct QueueReader {
    rx: mpsc::Receiver<Inbound>,
    /// Lines the bridge writes itself, ahead of the peer's (answers for a
    /// client that went away).
    first: Option<mpsc::UnboundedReceiver<Bytes>>,
    /// When `rx` closes: end of input, or keep waiting (the session ends
    /// another way).
    eof_at_close: bool,
    max: usize,
}

impl QueueReader {
    pub fn new(
        rx: mpsc::Receiver<Inbound>,
        first: Option<mpsc::UnboundedReceiver<Bytes>>,
        eof_at_close: bool,
        max: usize,
    ) -> Self {
        Self { rx, first, eof_at_close, max }
    }
}

/// Where the peer's lines come from, as [`Piece`]s for the agent's input pump.
pub trait Source: Send + Unpin {
    /// Appends what arrived next to `out`; `Ok(true)` once the input ended.
    /// Cancel-safe: nothing is lost when the future is dropped.
    fn pieces(
        &mut self,
        out: &mut Vec<Piece>,
    ) -> impl std::future::Future<Output = std::io::Result<bool>> + Send;
}

/// A byte stream (a plain session's QUIC stream) cut into lines.
pub struct ByteSource<R> {
    r: R,
    split: LineSplitter,
}

impl<R> ByteSource<R> {
    pub fn new(r: R, max: usize) -> Self {
        Self { r, split: LineSplitter::new(max) }
    }
}

impl<R: AsyncRead + Unpin + Send> Source for ByteSource<R> {
    async fn pieces(&mut self, out: &mut Vec<Piece>) -> std::io::Result<bool> {
        let n = self.split.read_from(&mut self.r).await?;
        out.extend(self.split.pieces(n == 0));
        Ok(n == 0)
    }
}

impl Source for QueueReader {
    async fn pieces(&mut self, out: &mut Vec<Piece>) -> std::io::Result<bool> {
        let next = match self.first.as_mut() {
            // Items are whole lines: switching between the queues keeps lines whole.
            Some(first) => tokio::select! {
                biased;
                Some(b) = first.recv() => Some(Inbound::Lines(b)),
                i = self.rx.recv() => i,
            },
            None => self.rx.recv().await,
        };
        match next {
            Some(Inbound::Lines(b)) => split_lines(&b, self.max, check_line, out),
            Some(Inbound::Oversized(head)) => out.push(Piece::Oversized(head)),
            None if self.eof_at_close => return Ok(true),
            None => std::future::pending().await,
        }
        Ok(false)
    }
}

/// Where the agent's output goes, a run of whole lines at a time. The run is
/// already a `Bytes` (a slice of the pump's read buffer): a sink that keeps
/// what it is given (a resumable session's replay log) takes it as it is
/// instead of copying it, with what the check saw of its lines (their count,
/// whether one has an `id`); a stream copies it into its own buffers.
pub trait RunSink: AsyncWrite + Unpin + Send {
    fn write_run(&mut self, run: Run) -> impl std::future::Future<Output = std::io::Result<()>> + Send {
        async move { self.write_all(&run.bytes).await }
    }
}

impl RunSink for iroh::endpoint::SendStream {}
impl RunSink for Vec<u8> {}
impl RunSink for &mut Vec<u8> {}

/// Why a pump direction stopped early.
#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    #[error("reading from {1}: {0}")]
    Read(std::io::Error, &'static str),
    #[error("writing to {1}: {0}")]
    Write(std::io::Error, &'static str),
}

/// Reads into one buffer and hands out what it holds as [`Piece`]s.
struct LineSplitter {
    split: RunSplitter,
}

impl LineSplitter {
    fn new(max: usize) -> Self {
        Self { split: RunSplitter::new(max, READ_CHUNK) }
    }

    async fn read_from<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> std::io::Result<usize> {
        let buf = self.split.buf_mut();
        room_for_read(buf, READ_CHUNK);
        r.read_buf(buf).await
    }

    /// Everything read so far, checked: runs of JSON lines to forward, rejected
    /// lines, lines over the cap. At EOF the unterminated remainder is the last line.
    fn pieces(&mut self, eof: bool) -> Vec<Piece> {
        let mut out = Vec::new();
        self.split.drain(check_line, &mut out);
        if eof {
            self.split.finish(check_line, &mut out);
        }
        out
    }
}

/// How a dropped message is named in the log: by its id, or as the
/// notification it is when it has none.
fn what(id: Option<&str>) -> String {
    match id {
        Some(id) => format!("a message (id {id})"),
        None => "a notification (no id)".to_string(),
    }
}

/// Writes a line the bridge queued for `w` (its own answers, between whole
/// lines); the queue's end (`None`) clears `open`.
async fn write_queued(
    w: &mut (impl AsyncWrite + Unpin),
    line: Option<Bytes>,
    open: &mut bool,
) -> std::io::Result<()> {
    match line {
        Some(line) => w.write_all(&line).await,
        None => {
            *open = false;
            Ok(())
        }
    }
}

/// Peer → agent. Returns when the peer finished its stream (the agent's stdin is
/// then closed, which is how a stdio agent learns the session is over).
///
/// `replies` carries the bridge's own answers to the peer; `to_agent` brings the
/// bridge's answers to the agent (errors for its requests that were too large
/// to forward), written between whole lines. `observers` sees each run first:
/// it answers the bridge's own extension methods (which go no further) and
/// notes the peer's requests as they pass.
#[allow(clippy::too_many_arguments)]
pub async fn peer_to_agent<S, W>(
    mut peer: S,
    mut agent_stdin: W,
    replies: mpsc::Sender<Bytes>,
    mut to_agent: mpsc::Receiver<Bytes>,
    max_frame: usize,
    peer_name: &str,
    observers: &Observers,
) -> Result<(), PumpError>
where
    S: Source,
    W: AsyncWrite + Unpin,
{
    let mut to_agent_open = true;
    let write_err = |e| PumpError::Write(e, "agent stdin");
    let mut pieces = Vec::new();
    loop {
        let ended = tokio::select! {
            biased;
            line = to_agent.recv(), if to_agent_open => {
                write_queued(&mut agent_stdin, line, &mut to_agent_open).await.map_err(write_err)?;
                continue;
            }
            r = peer.pieces(&mut pieces) => r.map_err(|e| PumpError::Read(e, "peer"))?,
        };
        for piece in pieces.drain(..) {
            match piece {
                Piece::Run(run) => {
                    let out = observers.from_client(run.bytes, run.flagged).await;
                    for reply in out.replies {
                        let _ = replies.send(reply).await;
                    }
                    if let Some(run) = out.forward {
                        agent_stdin.write_all(&run).await.map_err(write_err)?
                    }
                }
                Piece::Rejected => {
                    warn!("peer sent a line that is not UTF-8 JSON; answered with a parse error");
                    // The writer side is gone only when the session is ending anyway.
                    let _ = replies.send(Bytes::from_static(PARSE_ERROR_LINE)).await;
                }
                Piece::Oversized(head) => {
                    let head = jsonrpc::peek_head(&head);
                    let id = head.id.as_deref();
                    match (head.kind, id) {
                        // The agent waits for this response: it gets an error in its place.
                        (Kind::Response, Some(id)) => {
                            warn!(
                                peer = %peer_name,
                                "peer sent a response (id {id}) over the {max_frame}-byte frame limit; \
                                 dropped, the agent gets an error for it"
                            );
                            let line = jsonrpc::too_large_response(id, max_frame);
                            agent_stdin.write_all(&line).await.map_err(write_err)?;
                            let _ = replies.send(jsonrpc::too_large_request(None, max_frame).into()).await;
                        }
                        _ => {
                            warn!(
                                peer = %peer_name,
                                "peer sent {} over the {max_frame}-byte frame limit; dropped{}",
                                what(id),
                                if id.is_some() { " and answered with an error" } else { " (a notification has no answer)" }
                            );
                            let _ = replies.send(jsonrpc::too_large_request(id, max_frame).into()).await;
                        }
                    }
                }
            }
        }
        if ended {
            let _ = agent_stdin.shutdown().await;
            return Ok(());
        }
    }
}

/// Agent → peer, plus the bridge's own replies (parse and size errors). Returns
/// when the agent closed its stdout, or `stop` was cancelled, and everything it
/// wrote in whole lines has been handed to the stream. `observers` sees each
/// run (it never holds it): the agent's answers to the peer's requests are
/// crossed off there.
#[allow(clippy::too_many_arguments)]
pub async fn agent_to_peer<R, W>(
    mut agent_stdout: R,
    mut peer: W,
    mut replies: mpsc::Receiver<Bytes>,
    to_agent: mpsc::Sender<Bytes>,
    max_frame: usize,
    peer_name: &str,
    stop: CancellationToken,
    observers: &Observers,
) -> Result<W, PumpError>
where
    R: AsyncRead + Unpin,
    W: RunSink,
{
    let mut split = LineSplitter::new(max_frame);
    let mut replies_open = true;
    let write_err = |e| PumpError::Write(e, "peer");
    loop {
        let n = tokio::select! {
            biased;
            reply = replies.recv(), if replies_open => {
                write_queued(&mut peer, reply, &mut replies_open).await.map_err(write_err)?;
                continue;
            }
            _ = stop.cancelled() => {
                debug!(peer = %peer_name, "no longer reading the agent's stdout");
                0
            }
            n = split.read_from(&mut agent_stdout) => n.unwrap_or_else(|e| {
                // Nothing more can come from a pipe that fails: end as at EOF.
                warn!(peer = %peer_name, "reading the agent's stdout failed: {e}");
                0
            }),
        };
        let mut dropped = 0usize;
        for piece in split.pieces(n == 0) {
            match piece {
                Piece::Run(run) => {
                    observers.from_agent(&run.bytes, run.flagged);
                    peer.write_run(run).await.map_err(write_err)?
                }
                Piece::Rejected => dropped += 1,
                Piece::Oversized(head) => {
                    let head = jsonrpc::peek_head(&head);
                    match (head.kind, head.id.as_deref()) {
                        (Kind::Response, Some(id)) => {
                            observers.requests.answered_id(id.as_bytes());
                            warn!(peer = %peer_name, "agent sent a response (id {id}) over the {max_frame}-byte frame limit; dropped, the peer gets an error for it");
                            peer.write_all(&jsonrpc::too_large_response(id, max_frame))
                                .await
                                .map_err(write_err)?;
                        }
                        (Kind::Request, Some(id)) => {
                            warn!(peer = %peer_name, "agent sent a request (id {id}) over the {max_frame}-byte frame limit; dropped, the agent gets an error for it");
                            // Never wait on the agent's stdin from here: the agent may be
                            // blocked writing to us. A full queue means the peer is
                            // flooding the agent; the error is then dropped.
                            let _ = to_agent.try_send(jsonrpc::too_large_request(Some(id), max_frame).into());
                        }
                        (_, id) => warn!(
                            peer = %peer_name,
                            "agent sent {} over the {max_frame}-byte frame limit; dropped",
                            what(id)
                        ),
                    }
                }
            }
        }
        if dropped > 0 {
            warn!(peer = %peer_name, "dropped {dropped} non-JSON line(s) from the agent's stdout");
        }
        if n == 0 {
            // Parse errors queued before the agent ended still belong to the peer.
            while let Ok(b) = replies.try_recv() {
                peer.write_all(&b).await.map_err(write_err)?;
            }
            return Ok(peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn lines(b: &[u8]) -> Vec<Value> {
        b.split(|c| *c == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }

    /// `input` from the peer through `peer_to_agent` (1024-byte frames): what
    /// the agent got, and the bridge's replies to the peer.
    async fn into_agent(input: &[u8]) -> (Vec<u8>, mpsc::Receiver<Bytes>) {
        let mut stdin = Vec::new();
        let (tx, rx) = mpsc::channel(8);
        let (_atx, arx) = mpsc::channel(1);
        peer_to_agent(
            ByteSource::new(input, 1024),
            &mut stdin,
            tx,
            arx,
            1024,
            "peer",
            &Observers::new(None, None, None),
        )
        .await
        .unwrap();
        (stdin, rx)
    }

    #[tokio::test]
    async fn peer_lines_are_checked() {
        let input: &[u8] = b"{\"a\":1}\nnot json\n\n{\"s\":\"\xff\"}\n[2]";
        let (stdin, mut rx) = into_agent(input).await;
        assert_eq!(stdin, b"{\"a\":1}\n[2]\n");
        assert_eq!(rx.recv().await.unwrap(), Bytes::from_static(PARSE_ERROR_LINE));
        assert_eq!(rx.recv().await.unwrap(), Bytes::from_static(PARSE_ERROR_LINE), "invalid UTF-8");
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn agent_noise_dropped_and_tail_kept() {
        let stdout: &[u8] = b"Starting agent v1\n{\"id\":1}\n{\"id\":2}";
        let mut peer = Vec::new();
        let (_tx, rx) = mpsc::channel(1);
        let (atx, _arx) = mpsc::channel(1);
        let peer = agent_to_peer(
            stdout,
            &mut peer,
            rx,
            atx,
            1024,
            "p",
            CancellationToken::new(),
            &Observers::new(None, None, None),
        )
        .await
        .unwrap();
        assert_eq!(*peer, b"{\"id\":1}\n{\"id\":2}\n");
    }

    #[tokio::test]
    async fn oversized_request_from_the_peer_is_answered_and_the_rest_flows() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":41,\"method\":\"m\",\"params\":\"{}\"}}\n",
            "x".repeat(5000)
        );
        let input = [big.as_bytes(), b"{\"id\":42}\n"].concat();
        let (stdin, mut rx) = into_agent(&input).await;
        assert_eq!(stdin, b"{\"id\":42}\n", "only the small line reaches the agent");
        let err = lines(&rx.recv().await.unwrap());
        assert_eq!(err[0]["id"], 41);
        assert_eq!(err[0]["error"]["code"], jsonrpc::TOO_LARGE_REQUEST_CODE);
    }

    #[tokio::test]
    async fn oversized_response_from_the_peer_becomes_an_error_for_the_agent() {
        let big = format!("{{\"jsonrpc\":\"2.0\",\"id\":\"a-7\",\"result\":\"{}\"}}\n", "x".repeat(5000));
        let (stdin, mut rx) = into_agent(big.as_bytes()).await;
        let to_agent = lines(&stdin);
        assert_eq!(to_agent[0]["id"], "a-7");
        assert_eq!(to_agent[0]["error"]["code"], jsonrpc::TOO_LARGE_RESPONSE_CODE);
        assert!(
            lines(&rx.recv().await.unwrap())[0]["id"].is_null(),
            "the peer's note carries no id of the agent's"
        );
    }

    #[tokio::test]
    async fn oversized_lines_from_the_agent() {
        let resp = format!("{{\"jsonrpc\":\"2.0\",\"id\":5,\"result\":\"{}\"}}\n", "r".repeat(3000));
        let req = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"fs/write\",\"params\":\"{}\"}}\n",
            "q".repeat(3000)
        );
        let stdout = [resp.as_bytes(), req.as_bytes(), b"{\"after\":1}\n"].concat();
        let (_tx, rx) = mpsc::channel(1);
        let (atx, mut arx) = mpsc::channel(4);
        let peer = agent_to_peer(
            &stdout[..],
            Vec::new(),
            rx,
            atx,
            1024,
            "p",
            CancellationToken::new(),
            &Observers::new(None, None, None),
        )
        .await
        .unwrap();
        let got = lines(&peer);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            (got[0]["id"].as_i64(), got[0]["error"]["code"].as_i64()),
            (Some(5), Some(jsonrpc::TOO_LARGE_RESPONSE_CODE))
        );
        assert_eq!(got[1]["after"], 1);
        let to_agent = lines(&arx.recv().await.unwrap());
        assert_eq!(
            (to_agent[0]["id"].as_i64(), to_agent[0]["error"]["code"].as_i64()),
            (Some(6), Some(jsonrpc::TOO_LARGE_REQUEST_CODE))
        );
    }

    #[tokio::test]
    async fn stop_returns_the_stream_with_whole_lines_only() {
        let (mut w, r) = tokio::io::duplex(1024);
        w.write_all(b"{\"a\":1}\n{\"b\":").await.unwrap();
        let (_tx, rx) = mpsc::channel(1);
        let (atx, _arx) = mpsc::channel(1);
        let stop = CancellationToken::new();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                agent_to_peer(r, Vec::new(), rx, atx, 1024, "p", stop, &Observers::new(None, None, None))
                    .await
            }
        });
        tokio::task::yield_now().await;
        stop.cancel();
        let peer = task.await.unwrap().unwrap();
        assert!(peer.is_empty() || peer == b"{\"a\":1}\n", "only whole lines: {peer:?}");
        drop(w);
    }
}
