//! One connection's two directions: our input up (frames kept for a resend, acks,
//! the end of our input) and the bridge's frames down to our output (counted once
//! delivered), and the reader of our local input into whole lines.

use super::*;

pub(super) enum Up {
    Lost(String),
}

/// Our side of the stream: the replay first, then new input, acks and eof.
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
    // Armed at the first frame awaiting its ack and kept across turns of the
    // loop, so the ack goes out ACK_DELAY_MS after that frame at the latest (a
    // timer made afresh each turn would wait as long as frames kept coming).
    let ack_timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(ack_timer);
    let mut ack_armed = false;
    loop {
        let ack = st.borrow_mut().next_ack();
        if let Some(a) = ack {
            send.write_all(&a.encode()).await.map_err(lost)?;
            continue;
        }
        let (has_room, input_open, ack_pending) = {
            let s = st.borrow();
            let held = s.out.bytes();
            let room = match input.held_len() {
                // A run that does not fit waits until it fits, or goes alone.
                Some(n) => held == 0 || held + n <= SEND_BUFFER,
                None => held < SEND_BUFFER,
            };
            (room, s.eof_at().is_none(), s.ack.pending())
        };
        if !ack_pending {
            ack_armed = false;
        } else if !ack_armed {
            ack_timer.as_mut().reset(tokio::time::Instant::now() + Duration::from_millis(ACK_DELAY_MS));
            ack_armed = true;
        }
        tokio::select! {
            biased;
            _ = ack_wake.notified() => {}
            r = input.next_run(), if has_room && input_open => {
                let mut chunks = Vec::with_capacity(2);
                {
                    let mut s = st.borrow_mut();
                    match r {
                        Some((run, lines)) if s.out.bytes() > 0 && s.out.bytes() + run.len() > SEND_BUFFER => {
                            input.hold(run, lines);
                            continue;
                        }
                        Some((run, lines)) => {
                            s.out.push_counted(run.clone(), lines);
                            chunks.push(run);
                        }
                        None => {
                            let eof = s.input_ended();
                            debug!("our input ended after {} frames", s.out.total());
                            chunks.push(eof.encode());
                        }
                    }
                }
                send.write_all_chunks(&mut chunks).await.map_err(lost)?;
            }
            _ = room.notified(), if !has_room => {}
            _ = &mut ack_timer, if ack_armed => {
                ack_armed = false;
                st.borrow_mut().ack_due = true;
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
                Event::Control(Some(Control::Ack(n))) => {
                    st.borrow_mut()
                        .acked(n)
                        .map_err(|e| Down::Protocol(format!("bad ack from the bridge: {e}")))?;
                    room.notify_one();
                }
                Event::Control(Some(Control::End(n))) => {
                    let mut s = st.borrow_mut();
                    debug!("the agent ended after {n} frames");
                    s.end_at = Some(n);
                    if s.all_delivered() {
                        s.ack_due = true;
                        ack_wake.notify_one();
                    }
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
            let was_pending = s.ack.pending();
            if s.ack.took(frames, len) || s.all_delivered() {
                s.ack_due = true;
                ack_wake.notify_one();
            } else if !was_pending {
                // The upload side arms its ack timer for the first frame
                // not yet acknowledged: it may be asleep without one.
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
    /// A run read but not sent yet (it did not fit the send buffer), and its
    /// count of lines.
    held: Option<(Bytes, u64)>,
}

impl LocalInput {
    /// Reads `r` into whole lines.
    pub(super) fn new(r: Box<dyn AsyncRead + Unpin + Send>) -> Self {
        Self { r, buf: BytesMut::new(), done: false, held: None }
    }

    /// Keeps `run` to be returned by the next [`Self::next_run`].
    fn hold(&mut self, run: Bytes, lines: u64) {
        self.held = Some((run, lines));
    }

    fn held_len(&self) -> Option<usize> {
        self.held.as_ref().map(|(run, _)| run.len())
    }

    /// The next run of whole lines, escaped, with its count of lines; `None`
    /// once the input ended. At the end an unterminated last line gets its
    /// newline (as the plain protocol's bridge does).
    async fn next_run(&mut self) -> Option<(Bytes, u64)> {
        if let Some(run) = self.held.take() {
            return Some(run);
        }
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
