//! What `connect` writes to its local side: each message in a write of its
//! own while messages come a few at a time (a request, its progress, its
//! answer: up to [`PER_MESSAGE_WRITES`] in one read), with nothing held back.
//! A read that brings more (a bulk stream) goes out in one write, as the
//! stream delivered it: a write per ~1 KiB line wakes the reader per line and
//! halved bulk through a pipe (56 against 125 MB/s, `bench --quick --only
//! resume`), for read boundaries no reader may rely on anyway.
//!
//! A reader may still find two messages in one read (a pipe holds whatever
//! was written before the reader came back): message order is what a reader
//! can rely on, never read boundaries. But the bridge never merges messages
//! itself: a client that handles a line one step later than the read it came
//! in (the MCP SDK's progress notifications, docs/protocol.md) sees through
//! us what it sees from the agent directly.
//!
//! A standard output that is a pipe or socket is written by the runtime
//! itself ([`super::stdio`]); any other (a terminal, a file, a pipe shared with
//! our log) by a thread of its own ([`Stdout`]): tokio's stdout hands every
//! write to its blocking pool, so a write per ~1 KiB message would cost a
//! hand-off each; the thread costs one `write(2)` each.

use std::{
    io::{self, Write},
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    task::{ready, Context, Poll},
};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio_util::sync::PollSemaphore;

/// Messages in one read up to which each gets a write of its own.
const PER_MESSAGE_WRITES: usize = 16;

/// Writes `lines` (whole lines) to `out`: a write each when they are few, else one.
/// Lines are found with memchr: a few long lines a read (a file's contents,
/// 16 KiB lines in `bench --only connect`) take the line-by-line path, and a
/// byte-at-a-time split there was 7 % of `connect`'s CPU.
async fn write_lines<W: AsyncWrite + Unpin>(out: &mut W, lines: &[u8]) -> io::Result<()> {
    if memchr::memchr_iter(b'\n', lines).nth(PER_MESSAGE_WRITES).is_some() {
        return out.write_all(lines).await;
    }
    for line in thunderbolt_shared::ndjson::lines(lines) {
        out.write_all(line).await?;
    }
    Ok(())
}

/// [`write_lines`] for whole lines that came in one read but in several
/// pieces (a resumable session's frames with its control lines taken out):
/// decided as one read, so a bulk read goes out in one write however many
/// acknowledgements it carried. `joined` is scratch space kept between calls.
async fn write_pieces<W: AsyncWrite + Unpin>(
    out: &mut W,
    pieces: &[Bytes],
    joined: &mut Vec<u8>,
) -> io::Result<()> {
    if let [one] = pieces {
        return write_lines(out, one).await;
    }
    let mut newlines = pieces.iter().flat_map(|p| memchr::memchr_iter(b'\n', p));
    if newlines.nth(PER_MESSAGE_WRITES).is_none() {
        for p in pieces {
            write_lines(out, p).await?;
        }
        return Ok(());
    }
    if out.is_write_vectored() {
        // One `writev(2)` of the pieces where they lie: joining them first
        // copied every byte of a bulk read once more.
        return write_all_vectored(out, pieces).await;
    }
    joined.clear();
    for p in pieces {
        joined.extend_from_slice(p);
    }
    let r = out.write_all(joined).await;
    // A bulk read's worth is kept for the next; more is given back.
    if joined.capacity() > JOINED_KEPT {
        *joined = Vec::new();
    }
    r
}

/// Writes all of `pieces`, in order, in as few vectored writes as `out` takes.
pub(super) async fn write_all_vectored<W: AsyncWrite + Unpin>(
    out: &mut W,
    pieces: &[Bytes],
) -> io::Result<()> {
    let mut slices: Vec<io::IoSlice<'_>> = pieces.iter().map(|p| io::IoSlice::new(p)).collect();
    let mut bufs = &mut slices[..];
    // Leading empty pieces off: a write of only empty buffers takes nothing,
    // which would read as a writer that can take no more.
    io::IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let n = out.write_vectored(bufs).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        io::IoSlice::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// Scratch space [`Messages::pieces`] keeps between reads: one read of the
/// stream's worth (a read that brings more is rare and gives it back).
const JOINED_KEPT: usize = 256 * 1024;

/// Bytes handed to the stdout thread and not yet written: enough to keep it
/// busy while the next run arrives, little enough that a reader that stops
/// reading stops the session (and its acknowledgements) soon.
const STDOUT_AHEAD: usize = 1 << 20;

/// An incomplete last line kept to be written whole with the rest of it
/// (a small message cut by a read); a longer one streams through as it comes.
const MAX_HELD_PARTIAL: usize = 64 * 1024;

/// Writes messages to `out`, each whole line in a write of its own.
pub struct Messages<W> {
    out: W,
    /// The start of a line whose newline has not arrived yet (plain path only).
    partial: BytesMut,
    /// Pieces of one read joined for one write ([`Self::pieces`]).
    joined: Vec<u8>,
}

impl<W: AsyncWrite + Unpin> Messages<W> {
    pub fn new(out: W) -> Self {
        Self { out, partial: BytesMut::new(), joined: Vec::new() }
    }

    /// `pieces`: whole lines, all from one read of the stream (a resumable
    /// session's frames, split where control lines were). A write per message
    /// while the read holds few, else one write for the read: an
    /// acknowledgement between frames does not split a bulk read into writes.
    /// Flushed: on return they are with the writer.
    pub async fn pieces(&mut self, pieces: &[Bytes]) -> io::Result<()> {
        write_pieces(&mut self.out, pieces, &mut self.joined).await?;
        self.out.flush().await
    }

    /// `chunk`: what one read of the stream gave (the plain path), lines cut
    /// anywhere. Whole lines go out one write each; a short incomplete last
    /// line waits for its own rest, a long one goes out as it comes.
    pub async fn chunk(&mut self, mut chunk: &[u8]) -> io::Result<()> {
        if !self.partial.is_empty() {
            match memchr::memchr(b'\n', chunk) {
                Some(i) => {
                    self.partial.extend_from_slice(&chunk[..=i]);
                    let line = self.partial.split().freeze();
                    self.out.write_all(&line).await?;
                    chunk = &chunk[i + 1..];
                }
                None if self.partial.len() + chunk.len() <= MAX_HELD_PARTIAL => {
                    self.partial.extend_from_slice(chunk);
                    return self.out.flush().await;
                }
                None => {
                    let held = self.partial.split().freeze();
                    self.out.write_all(&held).await?;
                    self.out.write_all(chunk).await?;
                    return self.out.flush().await;
                }
            }
        }
        let whole = memchr::memrchr(b'\n', chunk).map_or(0, |i| i + 1);
        let (lines, tail) = chunk.split_at(whole);
        write_lines(&mut self.out, lines).await?;
        if tail.len() <= MAX_HELD_PARTIAL {
            self.partial.extend_from_slice(tail);
        } else {
            self.out.write_all(tail).await?;
        }
        self.out.flush().await
    }

    /// The input ended: an incomplete last line goes out as it is.
    pub async fn finish(&mut self) -> io::Result<()> {
        if !self.partial.is_empty() {
            let held = self.partial.split().freeze();
            self.out.write_all(&held).await?;
        }
        self.out.flush().await
    }
}

/// Our standard output, written by a thread of its own: each `poll_write` is
/// one `write(2)` there (more only when the pipe takes part of it).
/// `poll_flush` is ready once the thread wrote everything handed to it.
pub struct Stdout {
    tx: std::sync::mpsc::Sender<(Bytes, u32)>,
    room: PollSemaphore,
    failed: Arc<AtomicBool>,
}

impl Stdout {
    pub fn new() -> Self {
        let sem = Arc::new(tokio::sync::Semaphore::new(STDOUT_AHEAD));
        let (tx, rx) = std::sync::mpsc::channel::<(Bytes, u32)>();
        let failed = Arc::new(AtomicBool::new(false));
        let (thread_sem, thread_failed) = (sem.clone(), failed.clone());
        let spawned = std::thread::Builder::new().name("stdout".into()).spawn(move || {
            let mut out = io::stdout().lock();
            while let Ok((bytes, permits)) = rx.recv() {
                // Straight to the descriptor: std's stdout buffers nothing of a
                // write that ends in a newline, and flush covers the rest.
                if out.write_all(&bytes).and_then(|()| out.flush()).is_err() {
                    thread_failed.store(true, Ordering::Release);
                    thread_sem.close();
                    return;
                }
                thread_sem.add_permits(permits as usize);
            }
        });
        if spawned.is_err() {
            failed.store(true, Ordering::Release);
            sem.close();
        }
        Self { tx, room: PollSemaphore::new(sem), failed }
    }

    fn broken() -> io::Error {
        io::Error::new(io::ErrorKind::BrokenPipe, "our standard output is closed")
    }
}

impl Default for Stdout {
    fn default() -> Self {
        Self::new()
    }
}

impl AsyncWrite for Stdout {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let need = buf.len().min(STDOUT_AHEAD) as u32;
        let Some(permit) = ready!(self.room.poll_acquire_many(cx, need)) else {
            return Poll::Ready(Err(Self::broken()));
        };
        permit.forget();
        if self.tx.send((Bytes::copy_from_slice(buf), need)).is_err() {
            return Poll::Ready(Err(Self::broken()));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Every permit back means every byte handed over was written.
        match ready!(self.room.poll_acquire_many(cx, STDOUT_AHEAD as u32)) {
            Some(all) => {
                drop(all);
                Poll::Ready(Ok(()))
            }
            None if self.failed.load(Ordering::Acquire) => Poll::Ready(Err(Self::broken())),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Records each write it gets.
    #[derive(Default, Clone)]
    struct Writes(Arc<Mutex<Vec<Vec<u8>>>>);

    impl AsyncWrite for Writes {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            self.0.lock().unwrap().push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn strs(w: &Writes) -> Vec<String> {
        w.0.lock().unwrap().iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect()
    }

    #[tokio::test]
    async fn a_run_of_frames_is_one_write_per_message() {
        let w = Writes::default();
        let mut m = Messages::new(w.clone());
        m.pieces(&[Bytes::from_static(b"{\"progress\":6}\n{\"result\":1}\n")]).await.unwrap();
        assert_eq!(strs(&w), ["{\"progress\":6}\n", "{\"result\":1}\n"]);
        // A bulk run goes out as it came.
        let w = Writes::default();
        let mut m = Messages::new(w.clone());
        let bulk = "{\"x\":1}\n".repeat(PER_MESSAGE_WRITES + 1);
        m.pieces(&[Bytes::from(bulk.clone())]).await.unwrap();
        assert_eq!(strs(&w), [bulk]);
    }

    /// One read's frames split by acknowledgements: judged as the one read.
    #[tokio::test]
    async fn pieces_of_one_read_are_written_as_that_read() {
        let line = "{\"x\":1}\n";
        // Few messages over three pieces: still a write each.
        let w = Writes::default();
        let mut m = Messages::new(w.clone());
        let few = [Bytes::from(line.repeat(2)), Bytes::from(line), Bytes::from(line.repeat(2))];
        m.pieces(&few).await.unwrap();
        assert_eq!(strs(&w), vec![line; 5]);
        // A bulk read cut in pieces smaller than a bulk run: one write, in order.
        let w = Writes::default();
        let mut m = Messages::new(w.clone());
        let half = PER_MESSAGE_WRITES / 2 + 1;
        let bulk = [Bytes::from(line.repeat(half)), Bytes::from("{\"y\":2}\n".repeat(half))];
        m.pieces(&bulk).await.unwrap();
        assert_eq!(strs(&w), [format!("{}{}", line.repeat(half), "{\"y\":2}\n".repeat(half))]);
        m.pieces(&[]).await.unwrap();
        assert_eq!(w.0.lock().unwrap().len(), 1, "nothing to write, no write");
    }

    /// Takes a vectored write as one write, of at most `max` bytes (a pipe
    /// may take part of what it is given).
    #[derive(Clone)]
    struct Vectored {
        writes: Writes,
        max: usize,
    }

    impl AsyncWrite for Vectored {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            let n = buf.len().min(self.max);
            self.writes.0.lock().unwrap().push(buf[..n].to_vec());
            Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).take(self.max).collect();
            let n = all.len();
            self.writes.0.lock().unwrap().push(all);
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A writer that takes vectored writes gets a bulk read's pieces in one,
    /// unjoined, and what it does not take at once follows, in order.
    #[tokio::test]
    async fn a_bulk_reads_pieces_go_out_in_one_vectored_write() {
        let half = PER_MESSAGE_WRITES / 2 + 1;
        let (a, b) = ("{\"x\":1}\n".repeat(half), "{\"y\":2}\n".repeat(half));
        let bulk = [Bytes::from(a.clone()), Bytes::new(), Bytes::from(b.clone())];
        let w = Vectored { writes: Writes::default(), max: usize::MAX };
        let mut m = Messages::new(w.clone());
        m.pieces(&bulk).await.unwrap();
        assert_eq!(strs(&w.writes), [format!("{a}{b}")]);
        assert!(m.joined.capacity() == 0, "nothing was joined");
        // Taken 50 bytes at a time: every byte once, in order.
        let w = Vectored { writes: Writes::default(), max: 50 };
        let mut m = Messages::new(w.clone());
        m.pieces(&bulk).await.unwrap();
        let writes = strs(&w.writes);
        assert_eq!(writes.len(), (a.len() + b.len()).div_ceil(50));
        assert_eq!(writes.concat(), format!("{a}{b}"));
        // Few messages: still a write each, vectored or not.
        let w = Vectored { writes: Writes::default(), max: usize::MAX };
        let mut m = Messages::new(w.clone());
        m.pieces(&[Bytes::from_static(b"{}\n"), Bytes::from_static(b"[]\n")]).await.unwrap();
        assert_eq!(strs(&w.writes), ["{}\n", "[]\n"]);
    }

    #[tokio::test]
    async fn reads_cut_anywhere_still_give_one_write_per_message() {
        let w = Writes::default();
        let mut m = Messages::new(w.clone());
        m.chunk(b"{\"a\":1}\n{\"b\":").await.unwrap();
        m.chunk(b"2}\n{\"c\":3}\n{\"d").await.unwrap();
        m.chunk(b"\":4}").await.unwrap();
        m.finish().await.unwrap();
        assert_eq!(strs(&w), ["{\"a\":1}\n", "{\"b\":2}\n", "{\"c\":3}\n", "{\"d\":4}"]);
        // A long unfinished line is not held: it goes out as it comes.
        let w = Writes::default();
        let mut m = Messages::new(w.clone());
        let big = vec![b'x'; MAX_HELD_PARTIAL + 1];
        m.chunk(&big).await.unwrap();
        assert_eq!(w.0.lock().unwrap().concat().len(), big.len());
        m.chunk(b"y\n").await.unwrap();
        assert_eq!(w.0.lock().unwrap().concat().len(), big.len() + 2);
    }
}
