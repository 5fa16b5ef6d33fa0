//! Newline-delimited JSON framing: one JSON value per line, `\n`-terminated.
//!
//! The framer never holds more than [`MAX_FRAME_LEN`] bytes of an unfinished
//! line: a peer that never sends a newline cannot make us buffer without bound.
//! [`LineFramer`] is the runtime-free core (used by the wasm client);
//! [`NdjsonCodec`] wraps the same logic as a `tokio-util` codec.

#[cfg(feature = "codec")]
use bytes::Buf;
use bytes::{BufMut, Bytes, BytesMut};

/// Largest frame (without its `\n`) either side accepts. ACP messages carry file
/// contents and tool output; 16 MiB fits any realistic one while bounding memory.
pub const MAX_FRAME_LEN: usize = 16 * 1024 * 1024;

/// A line exceeded the frame cap.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("frame longer than {max} bytes (limit of the ndjson framing)")]
pub struct FrameTooLong {
    pub max: usize,
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

/// Takes every complete line out of `buf` at once, for forwarding without
/// copying line by line. `keep` decides per line (without its newline); kept
/// lines come back as runs of contiguous bytes, newlines included, sharing the
/// buffer's memory. Blank lines are dropped. The unfinished tail stays in `buf`
/// (`scanned` remembers how much of it holds no newline).
pub fn take_kept_runs(
    buf: &mut BytesMut,
    scanned: &mut usize,
    max: usize,
    mut keep: impl FnMut(&[u8]) -> bool,
) -> Result<Vec<Bytes>, FrameTooLong> {
    let mut runs = Vec::new();
    let mut line_start = 0;
    let mut run_start = 0;
    let mut pos = (*scanned).min(buf.len());
    while let Some(off) = memchr_newline(&buf[pos..]) {
        let nl = pos + off;
        if nl - line_start > max {
            return Err(FrameTooLong { max });
        }
        let line = &buf[line_start..nl];
        if is_blank(line) || !keep(line) {
            if run_start < line_start {
                runs.push(run_start..line_start);
            }
            run_start = nl + 1;
        }
        line_start = nl + 1;
        pos = nl + 1;
    }
    if run_start < line_start {
        runs.push(run_start..line_start);
    }
    let done = buf.split_to(line_start).freeze();
    *scanned = buf.len();
    if buf.len() > max {
        return Err(FrameTooLong { max });
    }
    Ok(runs.into_iter().map(|r| done.slice(r)).collect())
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

/// `tokio-util` codec for ndjson frames with the frame cap.
#[cfg(feature = "codec")]
#[derive(Debug, Clone)]
pub struct NdjsonCodec {
    scanned: usize,
    max: usize,
}

#[cfg(feature = "codec")]
impl Default for NdjsonCodec {
    fn default() -> Self {
        Self::new(MAX_FRAME_LEN)
    }
}

#[cfg(feature = "codec")]
impl NdjsonCodec {
    pub fn new(max: usize) -> Self {
        Self { scanned: 0, max }
    }
}

/// Codec errors: I/O or a frame over the cap.
#[cfg(feature = "codec")]
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    TooLong(#[from] FrameTooLong),
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

#[cfg(feature = "codec")]
impl tokio_util::codec::Decoder for NdjsonCodec {
    type Item = BytesMut;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, CodecError> {
        Ok(take_line(src, &mut self.scanned, self.max)?)
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<BytesMut>, CodecError> {
        if let Some(line) = self.decode(src)? {
            return Ok(Some(line));
        }
        if src.is_empty() {
            Ok(None)
        } else {
            self.scanned = 0;
            let rest = src.split();
            Ok(Some(rest))
        }
    }
}

#[cfg(feature = "codec")]
impl<T: Buf> tokio_util::codec::Encoder<T> for NdjsonCodec {
    type Error = CodecError;

    fn encode(&mut self, item: T, dst: &mut BytesMut) -> Result<(), CodecError> {
        let chunk = item.chunk();
        if chunk.len() == item.remaining() {
            encode_frame(chunk, dst, self.max)?;
        } else {
            let mut item = item;
            let v = item.copy_to_bytes(item.remaining());
            encode_frame(&v, dst, self.max)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn kept_runs_share_the_buffer_and_skip_rejects() {
        let mut buf = BytesMut::from(&b"[1]\n\n[2]\nbad\n[3]\r\n[4"[..]);
        let mut scanned = 0;
        let runs = take_kept_runs(&mut buf, &mut scanned, 100, |l| l != b"bad").unwrap();
        let runs: Vec<&[u8]> = runs.iter().map(|r| &r[..]).collect();
        assert_eq!(runs, vec![&b"[1]\n"[..], &b"[2]\n"[..], &b"[3]\r\n"[..]]);
        assert_eq!(&buf[..], b"[4");
        assert_eq!(scanned, 2);
        let mut long = BytesMut::from(&b"123456789"[..]);
        let mut scanned = 0;
        assert!(take_kept_runs(&mut long, &mut scanned, 8, |_| true).is_err());
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

    #[cfg(feature = "codec")]
    #[test]
    fn codec_decodes_and_flushes_eof() {
        use tokio_util::codec::Decoder;
        let mut c = NdjsonCodec::new(100);
        let mut src = BytesMut::from(&b"[1]\n[2"[..]);
        assert_eq!(c.decode(&mut src).unwrap().unwrap(), &b"[1]"[..]);
        assert_eq!(c.decode(&mut src).unwrap(), None);
        assert_eq!(c.decode_eof(&mut src).unwrap().unwrap(), &b"[2"[..]);
    }
}
