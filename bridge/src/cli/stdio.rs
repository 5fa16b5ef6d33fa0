//! `connect`'s own standard input and output, read and written by the
//! runtime itself when they are pipes or sockets (what a client that spawns
//! `connect` gives it): the descriptor is made non-blocking and driven by
//! epoll, so each read or write is one system call on the thread that asked
//! for it.
//!
//! The alternatives cost a thread hand-off per read or write: tokio's stdin
//! reads on its blocking pool, and our stdout thread ([`super::output::Stdout`])
//! writes what it is handed. Measured full duplex through a pipe, that was a
//! third more CPU per MB for all processes together than the bench's
//! in-process client (`bench --quick --only connect`), on a machine where the
//! CPU is what runs out.
//!
//! A terminal, a file or `/dev/null` keeps the blocking path (epoll cannot
//! wait on files, and a terminal is shared with the shell). So does a
//! standard output that is also our standard error (`2>&1` into one pipe):
//! the log's writes would then see a full pipe as an error. Nor one socket
//! that is both our input and our output (one of them done would put the
//! other back to blocking). The flag is put back as it was when we are done
//! with the descriptor.

use std::{
    io,
    os::fd::{AsRawFd, RawFd},
    pin::Pin,
    task::{ready, Context, Poll},
};

use tokio::io::{unix::AsyncFd, AsyncRead, AsyncWrite, Interest, ReadBuf};

/// Our standard input: non-blocking when it is a pipe or socket, else tokio's.
pub fn stdin() -> Box<dyn AsyncRead + Unpin + Send> {
    let shared = same_file(libc::STDIN_FILENO, libc::STDOUT_FILENO);
    match (!shared).then(|| Pipe::take(libc::STDIN_FILENO, Interest::READABLE)).flatten() {
        Some(p) => Box::new(p),
        None => Box::new(tokio::io::stdin()),
    }
}

/// Our standard output: non-blocking when it is a pipe or socket of its own,
/// else written by a thread ([`super::output::Stdout`]).
pub fn stdout() -> Box<dyn AsyncWrite + Unpin + Send> {
    let shared = same_file(libc::STDOUT_FILENO, libc::STDERR_FILENO)
        || same_file(libc::STDIN_FILENO, libc::STDOUT_FILENO);
    match (!shared).then(|| Pipe::take(libc::STDOUT_FILENO, Interest::WRITABLE)).flatten() {
        Some(p) => Box::new(p),
        None => Box::new(super::output::Stdout::new()),
    }
}

/// A descriptor we do not own (0 or 1): never closed here.
struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// One of our standard descriptors, non-blocking and registered with the runtime.
struct Pipe {
    fd: AsyncFd<Fd>,
    /// The descriptor's flags before we set `O_NONBLOCK`, put back on drop
    /// (`None`: it was non-blocking already).
    restore: Option<libc::c_int>,
}

impl Pipe {
    /// `fd` as a [`Pipe`] waited on for `interest`, when it is a pipe or a
    /// socket and the runtime can wait on it; `None` leaves it untouched.
    fn take(fd: RawFd, interest: Interest) -> Option<Self> {
        let kind = file_type(fd)?;
        if kind != libc::S_IFIFO && kind != libc::S_IFSOCK {
            return None;
        }
        // SAFETY: F_GETFL on a descriptor that fstat just saw open.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return None;
        }
        let restore = (flags & libc::O_NONBLOCK == 0).then_some(flags);
        if restore.is_some() {
            // SAFETY: F_SETFL with the flags read above plus O_NONBLOCK.
            if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
                return None;
            }
        }
        // SAFETY: our standard input and output stay open, and the same
        // descriptors, for the whole process: nothing here closes 0 or 1.
        match unsafe { AsyncFd::register_with_interest(Fd(fd), interest) } {
            Ok(fd) => Some(Self { fd, restore }),
            Err(_) => {
                put_back(fd, restore);
                None
            }
        }
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        put_back(self.fd.get_ref().0, self.restore);
    }
}

fn put_back(fd: RawFd, restore: Option<libc::c_int>) {
    if let Some(flags) = restore {
        // SAFETY: F_SETFL with flags this descriptor had.
        unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
    }
}

/// `fd`'s file type (`S_IFIFO`, `S_IFSOCK`, ...), if it is open.
fn file_type(fd: RawFd) -> Option<libc::mode_t> {
    fstat(fd).map(|st| st.st_mode & libc::S_IFMT)
}

fn fstat(fd: RawFd) -> Option<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a whole `stat` on success, and only then is it read.
    (unsafe { libc::fstat(fd, st.as_mut_ptr()) } == 0).then(|| unsafe { st.assume_init() })
}

/// Whether `a` and `b` are the same pipe, socket or file.
fn same_file(a: RawFd, b: RawFd) -> bool {
    match (fstat(a), fstat(b)) {
        (Some(x), Some(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
        _ => false,
    }
}

/// Most buffers one `writev(2)` takes (Linux's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// One system call, retried when a signal interrupted it.
fn syscall(mut f: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let n = f();
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl AsyncRead for Pipe {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            // SAFETY: read(2) only writes into the unfilled part, and only the
            // `n` bytes it reports are then marked initialized.
            let dst = unsafe { buf.unfilled_mut() };
            let read = guard.try_io(|fd| {
                syscall(|| unsafe { libc::read(fd.as_raw_fd(), dst.as_mut_ptr().cast(), dst.len()) })
            });
            match read {
                Ok(Ok(n)) => {
                    // SAFETY: the kernel wrote these `n` bytes.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Pipe {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            let wrote = guard.try_io(|fd| {
                // SAFETY: `buf` is valid for reads of its length.
                syscall(|| unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) })
            });
            match wrote {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    /// One `writev(2)`: the pieces of a read go out in one write without
    /// being joined first ([`super::output`]).
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // Past the kernel's limit the rest goes in the next call.
        let n = bufs.len().min(IOV_MAX);
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            let wrote = guard.try_io(|fd| {
                // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix, and
                // each is valid for reads of its length.
                syscall(|| unsafe { libc::writev(fd.as_raw_fd(), bufs.as_ptr().cast(), n as libc::c_int) })
            });
            match wrote {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Nothing is held here: what `poll_write` took is in the pipe.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn pipe() -> (OwnedFd, OwnedFd) {
        let (r, w) = std::io::pipe().unwrap();
        (r.into(), w.into())
    }

    fn flags(fd: RawFd) -> libc::c_int {
        unsafe { libc::fcntl(fd, libc::F_GETFL) }
    }

    #[tokio::test]
    async fn a_pipe_is_read_and_written_without_blocking_and_its_flag_put_back() {
        let (r, w) = pipe();
        let (rfd, wfd) = (r.as_raw_fd(), w.as_raw_fd());
        {
            let mut reader = Pipe::take(rfd, Interest::READABLE).expect("a pipe");
            let mut writer = Pipe::take(wfd, Interest::WRITABLE).expect("a pipe");
            assert_ne!(flags(rfd) & libc::O_NONBLOCK, 0);
            // More than the pipe holds: the writer waits for the reader, neither blocks the thread.
            let data: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
            let send = async {
                writer.write_all(&data).await.unwrap();
                writer.flush().await.unwrap();
                drop(writer);
            };
            let ((), got) = tokio::join!(send, read_n(&mut reader, data.len()));
            assert_eq!(got, data);
        }
        assert_eq!(flags(rfd) & libc::O_NONBLOCK, 0, "blocking again once dropped");
        assert_eq!(flags(wfd) & libc::O_NONBLOCK, 0);
        // The writer end closed: the reader sees the end.
        drop(w);
        let mut reader = Pipe::take(rfd, Interest::READABLE).unwrap();
        assert_eq!(reader.read(&mut [0u8; 16]).await.unwrap(), 0);
    }

    /// Vectored writes: several buffers in one `writev(2)`, more than the pipe
    /// holds, taken in part and continued; every byte arrives once, in order.
    #[tokio::test]
    async fn a_pipe_takes_vectored_writes() {
        let (r, w) = pipe();
        let mut reader = Pipe::take(r.as_raw_fd(), Interest::READABLE).expect("a pipe");
        let mut writer = Pipe::take(w.as_raw_fd(), Interest::WRITABLE).expect("a pipe");
        assert!(writer.is_write_vectored());
        let pieces: Vec<Vec<u8>> = (0..3u8).map(|k| vec![b'a' + k; (1 << 20) + 7 * k as usize]).collect();
        let want = pieces.concat();
        let pieces: Vec<bytes::Bytes> = pieces.into_iter().map(Into::into).collect();
        let send = async {
            super::super::output::write_all_vectored(&mut writer, &pieces).await.unwrap();
            drop(writer);
        };
        let ((), got) = tokio::join!(send, read_n(&mut reader, want.len()));
        assert_eq!(got, want);
    }

    /// Reads `n` bytes from `reader`, as many reads as it takes.
    async fn read_n(reader: &mut Pipe, n: usize) -> Vec<u8> {
        let (mut got, mut buf) = (Vec::new(), vec![0u8; 64 * 1024]);
        while got.len() < n {
            let k = reader.read(&mut buf).await.unwrap();
            assert!(k > 0, "the pipe ended after {} of {n} bytes", got.len());
            got.extend_from_slice(&buf[..k]);
        }
        got
    }

    #[tokio::test]
    async fn a_file_is_left_alone() {
        let f = tempfile::tempfile().unwrap();
        let fd = f.into_raw_fd();
        assert!(Pipe::take(fd, Interest::READABLE).is_none());
        assert_eq!(flags(fd) & libc::O_NONBLOCK, 0);
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
    }

    #[test]
    fn one_pipe_on_two_descriptors_is_seen_as_one() {
        let (r, w) = pipe();
        let dup = unsafe { libc::dup(w.as_raw_fd()) };
        assert!(same_file(w.as_raw_fd(), dup));
        assert!(!same_file(r.as_raw_fd(), tempfile::tempfile().unwrap().as_raw_fd()));
        unsafe { libc::close(dup) };
    }
}
