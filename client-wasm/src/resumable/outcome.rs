//! How a connection ended, classified: a loss the session is resumed from, or
//! the session's end (and what `closed()` resolves with).

use thunderbolt_shared::resume_client::AfterClose;

use super::*;

impl Resumable {
    /// The connection ended: the bridge's close ends the session; anything
    /// else is a loss to resume from.
    pub(super) fn conn_end(&self, err: ConnectionError) -> Result<String, (JsValue, Option<JsValue>)> {
        match ending(&err) {
            Ending::Agent(end) => {
                let v = closed_obj("agent", None, &end.reason());
                set_agent_end(&v, &end);
                let e = (!end.is_success()).then(|| js_error(&ErrorKind::Agent(end), &end.describe()));
                Err((v, e))
            }
            Ending::Closed { code, reason } => match self.st.borrow().after_close(code, reason.as_bytes()) {
                // The bridge is restarting and keeps the session: redial as after a loss.
                AfterClose::Redial => Ok(reason),
                AfterClose::Gone { refusal, .. } => {
                    let msg = refusal.describe();
                    self.event("gone", Some(&msg));
                    Err((
                        closed_obj("session_gone", Some(code), &reason),
                        Some(js_error(&ErrorKind::SessionGone, &msg)),
                    ))
                }
                // Nothing went wrong: this device left a session others go on with.
                _ if code == 0 => Err((closed_obj("closed", Some(0), &reason), None)),
                // A join refused, or any other close, says why as it is.
                _ => {
                    let msg = thunderbolt_shared::words::closed(code, &reason, &self.me);
                    Err((
                        closed_obj("closed", Some(code), &reason),
                        Some(js_error(&ErrorKind::Closed { code, reason: reason.clone() }, &msg)),
                    ))
                }
            },
            // Ended or moved: `drive` tells which (the endpoint's generation).
            Ending::Local => Ok(LOCALLY_CLOSED.into()),
            Ending::Lost(text) => Ok(text),
        }
    }
}

pub(super) fn closed_obj(kind: &str, code: Option<u64>, reason: &str) -> JsValue {
    let v: JsValue = Object::new().into();
    set(&v, "kind", kind.into());
    if let Some(c) = code {
        set(&v, "code", JsValue::from_f64(c as f64));
    }
    set(&v, "reason", reason.into());
    v
}
