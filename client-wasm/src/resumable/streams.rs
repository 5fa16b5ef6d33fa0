//! One connection's two directions: the page's messages up (kept until the
//! bridge acknowledges them, within the send buffer), with our acks and the role
//! asked for; and the bridge's frames down to the page (each queued once).

use super::*;

impl Resumable {
    /// Our side of the stream: control lines (acks, a role asked for), then the
    /// page's messages and the end of its input. Returns once the stream fails.
    pub(super) async fn upload(
        &self,
        send: &mut SendStream,
        out_rx: &mut mpsc::UnboundedReceiver<Outgoing>,
        poke_rx: &mut mpsc::UnboundedReceiver<()>,
    ) {
        // Armed when a frame awaits its ack and kept across turns of the
        // loop (one JS timer per ack, not one per message): the ack goes
        // out ACK_DELAY_MS after the first frame it covers at the latest.
        let mut ack_timer = futures::future::Fuse::terminated();
        loop {
            // Control lines first: an ack, a role asked for.
            let ack = {
                let mut st = self.st.borrow_mut();
                match st.next_ack() {
                    Some(a) => Some(a),
                    None if st.role_due => {
                        st.role_due = false;
                        st.want.map(Control::Role)
                    }
                    None => None,
                }
            };
            if let Some(a) = ack {
                if send.write_all(&a.encode()).await.is_err() {
                    return;
                }
                continue;
            }
            let (room, pending, eof, held) = {
                let st = self.st.borrow();
                let n = st.out.bytes();
                let room = match &st.held {
                    Some(h) => n == 0 || n + h.len() <= SEND_BUFFER,
                    None => n < SEND_BUFFER,
                };
                (room, st.ack.pending(), st.eof_at().is_some(), st.held.is_some())
            };
            if !pending {
                ack_timer = futures::future::Fuse::terminated();
            } else if futures::future::FusedFuture::is_terminated(&ack_timer) {
                ack_timer = Box::pin(n0_future::time::sleep(Duration::from_millis(ACK_DELAY_MS))).fuse();
            }
            // `None`: the held message's turn; else the page's next one.
            let mut next = if room && held {
                futures::future::Either::Left(futures::future::ready(None)).fuse()
            } else if room && !eof {
                futures::future::Either::Right(out_rx.next().map(Some)).fuse()
            } else {
                futures::future::Fuse::terminated()
            };
            futures::select_biased! {
                _ = poke_rx.next().fuse() => {}
                o = next => {
                    let o = match o {
                        Some(o) => o,
                        None => self.st.borrow_mut().held.take().map(Outgoing::Frame),
                    };
                    let line = match o {
                        Some(Outgoing::Frame(b)) => {
                            let mut st = self.st.borrow_mut();
                            let n = st.out.bytes();
                            if n > 0 && n + b.len() > SEND_BUFFER {
                                st.held = Some(b);
                                continue;
                            }
                            st.out.push(b.clone());
                            b
                        }
                        Some(Outgoing::Eof) | None => {
                            self.st.borrow_mut().input_ended().encode()
                        }
                    };
                    if send.write_chunk(line).await.is_err() {
                        return;
                    }
                }
                _ = ack_timer => self.st.borrow_mut().ack_due = true,
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
                                    self.st.borrow_mut().ack.took(1, 0);
                                }
                                self.st.borrow_mut().queued += 1;
                            }
                            index += 1;
                        }
                    }
                    Event::Control(Some(Control::Ack(n))) => {
                        if let Err(e) = self.st.borrow_mut().acked(n) {
                            // The protocol is broken: the session ends (as the CLI's does).
                            self.st.borrow_mut().broken = Some(format!("bad ack from the bridge: {e}"));
                            return;
                        }
                        let _ = self.poke.unbounded_send(());
                    }
                    Event::Control(Some(Control::End(n))) => {
                        let mut st = self.st.borrow_mut();
                        st.end_at = Some(n);
                        st.ack_due = true;
                        drop(st);
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
