//! One connection's two directions: the page's messages up (kept until the
//! bridge acknowledges them, within the send buffer), with our acks and the role
//! asked for; and the bridge's frames down to the page (each queued once).

use n0_future::time::Instant;

use super::*;

impl Resumable {
    /// Our side of the stream: what the session hands out (acks, a role
    /// asked for, the page's messages within its send window, the end of its
    /// input), and its ack deadline kept. Returns once the stream fails.
    pub(super) async fn upload(
        &self,
        send: &mut SendStream,
        out_rx: &mut mpsc::UnboundedReceiver<Outgoing>,
        poke_rx: &mut mpsc::UnboundedReceiver<()>,
    ) {
        // One JS timer per deadline, not one per message.
        let mut ack_timer = futures::future::Fuse::terminated();
        let mut armed = None;
        loop {
            // Control lines first: an ack, a role asked for; then a held message.
            let line = {
                let mut st = self.st.borrow_mut();
                match st.poll_transmit() {
                    Some(a) => Some(a.encode()),
                    None if st.role_due => {
                        st.role_due = false;
                        st.want.map(|r| Control::Role(r).encode())
                    }
                    None => st.take_held(),
                }
            };
            if let Some(line) = line {
                if send.write_chunk(line).await.is_err() {
                    return;
                }
                continue;
            }
            let (room, eof, deadline) = {
                let st = self.st.borrow();
                (st.has_room() && !st.holds_run(), st.eof_at().is_some(), st.poll_timeout())
            };
            if deadline != armed {
                armed = deadline;
                ack_timer = match deadline {
                    Some(at) => {
                        Box::pin(n0_future::time::sleep(at.saturating_duration_since(Instant::now()))).fuse()
                    }
                    None => futures::future::Fuse::terminated(),
                };
            }
            let mut next = if room && !eof {
                futures::future::Either::Right(out_rx.next()).fuse()
            } else {
                futures::future::Either::Left(futures::future::pending()).fuse()
            };
            futures::select_biased! {
                _ = poke_rx.next().fuse() => {}
                o = next => {
                    let line = {
                        let mut st = self.st.borrow_mut();
                        match o {
                            Some(Outgoing::Frame(b)) => st.offer(b, None),
                            Some(Outgoing::Eof) | None => Some(st.input_ended().encode()),
                        }
                    };
                    if let Some(line) = line {
                        if send.write_chunk(line).await.is_err() {
                            return;
                        }
                    }
                }
                _ = ack_timer => self.st.borrow_mut().handle_timeout(Instant::now()),
            }
        }
    }

    /// The bridge's side: frames counted from `index` (the page's count; those
    /// already queued for it are skipped), acks and the end it announces.
    /// Returns once the stream ends or the bridge broke the protocol.
    pub(super) async fn download(&self, recv: &mut RecvStream, rx: &mut Receiver, mut index: u64) {
        let mut events = Vec::new();
        // Everything the stream holds per wake-up (see `READ_CHUNK`).
        let mut buf = vec![0u8; crate::client::READ_CHUNK];
        loop {
            rx.drain(&mut events);
            for ev in events.drain(..) {
                match ev {
                    Event::Data { bytes, frames } => {
                        if frames == 0 {
                            continue;
                        }
                        for line in bytes.split_inclusive(|b| *b == b'\n') {
                            let queued = self.st.borrow().queued;
                            if index >= queued {
                                let text = line.strip_suffix(b"\n").unwrap_or(line);
                                let notice = may_be_notice(text);
                                if self.raw {
                                    if notice {
                                        if let Ok(m) = crate::js::parse_frame(text) {
                                            self.notice(&m);
                                        }
                                    }
                                    self.push_message(Ok(js_sys::Uint8Array::from(line).into()), line.len());
                                } else if !text.iter().all(u8::is_ascii_whitespace) {
                                    let m = crate::js::parse_frame(text);
                                    if let (true, Ok(m)) = (notice, &m) {
                                        self.notice(m);
                                    }
                                    self.push_message(m, line.len());
                                } else {
                                    // Never shown, so never taken: count it as taken now.
                                    self.st.borrow_mut().delivered(1, 0, Instant::now());
                                }
                                self.st.borrow_mut().queued += 1;
                            }
                            index += 1;
                        }
                    }
                    Event::Control(Some(c @ (Control::Ack(_) | Control::End(_)))) => {
                        let bad = self.st.borrow_mut().handle_control(&c);
                        if let Err(e) = bad {
                            // The protocol is broken: the session ends (as the CLI's does).
                            self.st.borrow_mut().broken = Some(format!("bad ack from the bridge: {e}"));
                            return;
                        }
                        let _ = self.poke.unbounded_send(());
                    }
                    _ => {}
                }
            }
            match recv.read(&mut buf).await {
                Ok(Some(n)) => rx.push(&buf[..n]),
                _ => return,
            }
        }
    }
}
