//! What the page sees of a resumable session: its messages (each taken once,
//! which is what acknowledgements count), sending, the end of its input, its
//! state for a reload, how it ended. Apart from the driver (resumable.rs),
//! which owns the connections.

use super::*;

impl Resumable {
    pub(super) fn event(&self, kind: &str, detail: Option<&str>) {
        if let Some(f) = &self.on_event {
            let v: JsValue = Object::new().into();
            set(&v, "type", kind.into());
            if let Some(d) = detail {
                set(&v, "detail", d.into());
            }
            let _ = f.call1(&JsValue::NULL, &v);
        }
    }

    /// Resolves once the bridge welcomed the session (a join was accepted);
    /// rejects with the error it ended with otherwise.
    pub async fn welcomed(&self) -> Result<(), JsValue> {
        loop {
            {
                let st = self.st.borrow();
                if st.token().is_some() {
                    return Ok(());
                }
                if st.ended.is_some() {
                    return Err(st
                        .error
                        .clone()
                        .unwrap_or_else(|| js_error(&ErrorKind::SessionGone, "the session has ended")));
                }
            }
            let (tx, rx) = futures::channel::oneshot::channel();
            self.ended_wake.borrow_mut().push(tx);
            let _ = rx.await;
        }
    }

    pub(super) fn wake_waiters(&self) {
        for w in self.ended_wake.borrow_mut().drain(..) {
            let _ = w.send(());
        }
    }

    pub(super) fn push_message(&self, m: Result<JsValue, JsValue>, bytes: usize) {
        self.inbox.borrow_mut().push_back((m, bytes));
        if let Some(w) = self.inbox_wake.borrow_mut().take() {
            let _ = w.send(());
        }
    }

    /// The next message for the page; counts it as taken.
    pub async fn next_message(self: &Rc<Self>) -> Option<Result<JsValue, JsValue>> {
        loop {
            if let Some((m, bytes)) = self.inbox.borrow_mut().pop_front() {
                // The driver writes the ack, or arms its timer.
                if m.is_ok() && self.st.borrow_mut().delivered(1, bytes, n0_future::time::Instant::now()) {
                    let _ = self.poke.unbounded_send(());
                }
                return Some(m);
            }
            if self.st.borrow().ended.is_some() {
                return None;
            }
            let (tx, rx) = futures::channel::oneshot::channel();
            *self.inbox_wake.borrow_mut() = Some(tx);
            let _ = rx.await;
        }
    }

    /// The messages for the page as a `ReadableStream` (taking one counts it as held).
    pub fn readable(self: &Rc<Self>) -> web_sys::ReadableStream {
        let s =
            futures::stream::unfold(self.clone(), |r| async move { r.next_message().await.map(|m| (m, r)) });
        wasm_streams::ReadableStream::from_stream(s).into_raw()
    }

    /// Queues one frame (a whole line); it is delivered exactly once, across reconnects.
    pub fn send(&self, line: Bytes) -> Result<(), JsValue> {
        if self.st.borrow().ended.is_some() {
            return Err(js_error(&ErrorKind::SessionGone, "the session has ended"));
        }
        self.outgoing
            .unbounded_send(Outgoing::Frame(line))
            .map_err(|_| js_error(&ErrorKind::SessionGone, "the session has ended"))
    }

    /// The byte API: whole lines go out as frames; the rest waits for its newline.
    pub fn send_bytes(&self, data: &[u8]) -> Result<(), JsValue> {
        let run = {
            let mut partial = self.partial.borrow_mut();
            partial.extend_from_slice(data);
            match partial.iter().rposition(|b| *b == b'\n') {
                Some(i) => partial.split_to(i + 1).freeze(),
                None => return Ok(()),
            }
        };
        self.send(thunderbolt_shared::resume::escape_run(run))
    }

    pub fn finish(&self) {
        let rest = self.partial.borrow_mut().split();
        if !rest.is_empty() {
            let mut line = rest;
            line.extend_from_slice(b"\n");
            let _ = self.send(thunderbolt_shared::resume::escape_run(line.freeze()));
        }
        let _ = self.outgoing.unbounded_send(Outgoing::Eof);
    }

    /// Ends the session at once (code 0: the bridge ends the agent).
    pub fn close(&self) {
        let mut st = self.st.borrow_mut();
        st.closing = true;
        if let Some(c) = &st.conn {
            c.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_CLIENT_CLOSED.as_bytes());
        }
        drop(st);
        let _ = self.poke.unbounded_send(());
    }

    /// The current connection's path kind (`"none"` between connections).
    pub fn path(&self) -> &'static str {
        self.st.borrow().conn.as_ref().map_or("none", crate::client::path_kind)
    }

    /// `{session, received}` to store, for resuming after a reload.
    pub fn state(&self) -> JsValue {
        let st = self.st.borrow();
        let v: JsValue = Object::new().into();
        if let Some(t) = st.token() {
            set(&v, "session", t.into());
        }
        set(&v, "received", JsValue::from_f64(st.acks.received() as f64));
        v
    }

    /// Resolves with how the session ended (`{kind, code?, reason, …}`).
    pub fn closed(self: &Rc<Self>) -> Promise {
        let me = self.clone();
        future_to_promise(async move {
            loop {
                if let Some(v) = me.st.borrow().ended.clone() {
                    return Ok(v);
                }
                let (tx, rx) = futures::channel::oneshot::channel();
                me.ended_wake.borrow_mut().push(tx);
                let _ = rx.await;
            }
        })
    }

    pub(super) fn end(&self, how: JsValue, error: Option<JsValue>) {
        {
            let mut st = self.st.borrow_mut();
            if st.ended.is_some() {
                return;
            }
            st.ended = Some(how);
            st.conn = None;
            st.error = error.clone();
        }
        if let Some(e) = error {
            self.push_message(Err(e), 0);
        } else if let Some(w) = self.inbox_wake.borrow_mut().take() {
            let _ = w.send(());
        }
        self.wake_waiters();
    }
}
