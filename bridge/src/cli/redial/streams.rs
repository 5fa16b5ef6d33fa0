//! One connection's two directions: our input up (frames kept for a resend, acks,
//! the end of our input) and the bridge's frames down to our output (counted once
//! delivered), and the reader of our local input into whole lines.

use super::*;

pub(super) enum Up {
    Lost(String),
}

/// Our side of the stream: the replay first, then what the session hands
/// out (acks, our input within its send window, the end of our input), and
/// its ack deadline kept.
pub(super) async fn upload(
    send: &mut SendStream,
    st: &RefCell<State>,
    input: &mut LocalInput,
    mut replay: Vec<Bytes>,
    ack_wake: &Notify,
    room: &Notify,
) -> Result<std::convert::Infallible, Up> {
    let lost = |e: iroh::endpoint::WriteError| Up::Lost(e.to_string());
    send.write_all_chunks(&mut replay).await.map_err(lost)?;
    // Armed at the session's deadline for the pending ack, and re-armed only
    // when that deadline changes (once per ack, not once per run sent).
    let ack_timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(ack_timer);
    let mut armed = None;
    loop {
        let ack = st.borrow_mut().poll_transmit();
        if let Some(a) = ack {
            send.write_all(&a.encode()).await.map_err(lost)?;
            continue;
        }
        let held = st.borrow_mut().take_held();
        if let Some(run) = held {
            send.write_all_chunks(&mut [run]).await.map_err(lost)?;
            continue;
        }
        let (has_room, input_open, deadline) = {
            let s = st.borrow();
            (s.has_room() && !s.holds_run(), s.eof_at().is_none(), s.poll_timeout())
        };
        if deadline != armed {
            armed = deadline;
            if let Some(at) = deadline {
                ack_timer.as_mut().reset(at);
            }
        }
        tokio::select! {
            biased;
            _ = ack_wake.notified() => {}
            r = input.next_run(), if has_room && input_open => {
                let line = {
                    let mut s = st.borrow_mut();
                    match r {
                        Some((run, lines)) => s.offer(run, Some(lines)),
                        None => {
                            debug!("our input ended after {} frames", s.out.total());
                            Some(s.input_ended().encode())
                        }
                    }
                };
                if let Some(line) = line {
                    send.write_all_chunks(&mut [line]).await.map_err(lost)?;
                }
            }
            _ = room.notified(), if !has_room => {}
            _ = &mut ack_timer, if deadline.is_some() => {
                // Fired: the next deadline (if any) arms it afresh.
                armed = None;
                st.borrow_mut().handle_timeout(Instant::now());
            }
        }
    }
}

pub(super) enum Down {
    Lost(String),
    LocalClosed,
    Protocol(String),
}

/// The bridge's side: frames to our output (counted once delivered to the
/// writer), acks, the agent's end.
#[allow(clippy::too_many_arguments)]
pub(super) async fn download(
    recv: &mut RecvStream,
    leftover: Bytes,
    st: &RefCell<State>,
    output: &mut (dyn AsyncWrite + Unpin + Send),
    ack_wake: &Notify,
    room: &Notify,
    stop: &CancellationToken,
    resumed: bool,
) -> Result<std::convert::Infallible, Down> {
    let mut rx = Receiver::new(limits::MAX_FRAME);
    rx.push(&leftover);
    let mut events = Vec::new();
    // After a resume the bridge may have restarted: its word on that is said here too.
    let mut watch = if resumed { RESTORED_WATCH_FRAMES } else { 0 };
    // A write per message (a bulk run in one): see `output`.
    let mut output = crate::cli::output::Messages::new(output);
    // The frames of one read, between the control lines it held: written as
    // one read, after its control lines are seen (acks are for our upload).
    let mut pieces: Vec<Bytes> = Vec::new();
    loop {
        rx.drain(&mut events);
        let (mut frames, mut len) = (0, 0);
        for ev in events.drain(..) {
            match ev {
                Event::Data { bytes, frames: n } => {
                    say_devices(&bytes);
                    if watch > 0 {
                        watch = watch.saturating_sub(n);
                        if say_restored(&bytes) {
                            watch = 0;
                        }
                    }
                    frames += n;
                    len += bytes.len();
                    pieces.push(bytes);
                }
                Event::Control(Some(c @ (Control::Ack(_) | Control::End(_)))) => {
                    if let Control::End(n) = c {
                        debug!("the agent ended after {n} frames");
                    }
                    st.borrow_mut()
                        .handle_control(&c)
                        .map_err(|e| Down::Protocol(format!("bad ack from the bridge: {e}")))?;
                    room.notify_one();
                    ack_wake.notify_one();
                }
                Event::Control(_) => {}
                Event::BadControl(bad) => {
                    // What came before it is delivered, as it always was.
                    let _ = output.pieces(&pieces).await;
                    return Err(Down::Protocol(format!("the bridge sent {bad}")));
                }
            }
        }
        if !pieces.is_empty() {
            output.pieces(&pieces).await.map_err(|_| Down::LocalClosed)?;
            pieces.clear();
            let mut s = st.borrow_mut();
            // The upload side writes the ack, or arms its timer for the first
            // frame not yet acknowledged: it may be asleep without either.
            if s.delivered(frames, len, Instant::now()) {
                ack_wake.notify_one();
            }
        }
        let buf = rx.buf_mut();
        // A whole chunk of room for every read (the bridge keeps a quarter
        // chunk, for its many small sessions: `room_for_read`): a backlog
        // comes in reads as large as the plain path's and goes to our output
        // in as few writes (with a quarter, 14 against 21 KB a write).
        if buf.capacity() - buf.len() < limits::READ_CHUNK {
            buf.reserve(limits::READ_CHUNK);
        }
        let read = tokio::select! {
            r = recv.read_buf(buf) => r,
            _ = stop.cancelled() => return Err(Down::Lost("stopped".into())),
        };
        match read {
            // The bridge never finishes its stream mid-session: wait for the close.
            Ok(0) => {
                stop.cancelled().await;
                return Err(Down::Lost("stopped".into()));
            }
            Ok(_) => {}
            Err(e) => return Err(Down::Lost(e.to_string())),
        }
    }
}

/// Local input, cut into runs of whole lines. Outlives connections: its
/// buffer keeps a line read in part, and reading is cancel-safe.
pub(super) struct LocalInput {
    r: Box<dyn AsyncRead + Unpin + Send>,
    buf: BytesMut,
    done: bool,
}

impl LocalInput {
    /// Reads `r` into whole lines.
    pub(super) fn new(r: Box<dyn AsyncRead + Unpin + Send>) -> Self {
        Self { r, buf: BytesMut::new(), done: false }
    }

    /// The next run of whole lines, escaped, with its count of lines; `None`
    /// once the input ended. At the end an unterminated last line gets its
    /// newline (as the plain protocol's bridge does).
    async fn next_run(&mut self) -> Option<(Bytes, u64)> {
        loop {
            if self.done {
                return None;
            }
            if let Some(i) = memchr::memrchr(b'\n', &self.buf) {
                return Some(escape_counted(self.buf.split_to(i + 1).freeze()));
            }
            room_for_read(&mut self.buf, limits::READ_CHUNK);
            let n = match self.r.read_buf(&mut self.buf).await {
                Ok(n) => n,
                Err(e) => {
                    warn!("reading our input failed: {e}; ending it");
                    0
                }
            };
            if n == 0 {
                self.done = true;
                if !self.buf.is_empty() {
                    self.buf.extend_from_slice(b"\n");
                    return Some(escape_counted(self.buf.split().freeze()));
                }
            }
        }
    }
}
