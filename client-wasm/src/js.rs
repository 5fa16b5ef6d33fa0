//! JavaScript values made from Rust ones: an `Error` with a `kind` (and the
//! bridge's close code and reason) for every failure, how a connection ended,
//! a frame parsed as JSON, an option read from an object.

use iroh::endpoint::{Connection, ConnectionError};
use js_sys::{Error as JsError, Reflect};
use thunderbolt_shared::{close, words};
use wasm_bindgen::prelude::*;

use crate::errors::{classify_text, client_closed, Ending, ErrorKind};

pub(crate) fn set(obj: &JsValue, key: &str, value: JsValue) {
    let _ = Reflect::set(obj, &JsValue::from_str(key), &value);
}

/// An `Error` with `kind`, `retryable` and, for closes, `code` and `reason`.
pub(crate) fn js_error(kind: &ErrorKind, message: &str) -> JsValue {
    let e = JsError::new(message);
    e.set_name("IrohError");
    let v: JsValue = e.into();
    set(&v, "kind", kind.name().into());
    set(&v, "retryable", kind.retryable().into());
    match kind {
        ErrorKind::Closed { code, reason } => {
            set(&v, "code", JsValue::from_f64(*code as f64));
            set(&v, "reason", reason.as_str().into());
        }
        ErrorKind::Agent(end) => set_agent_end(&v, end),
        _ => {}
    }
    v
}

/// `code` 2, `reason`, `exitCode` or `signal`, and `stderr` (the agent's last
/// stderr line) when the bridge sent one.
pub(crate) fn set_agent_end(v: &JsValue, end: &close::AgentEnd) {
    set(v, "code", JsValue::from_f64(close::CLOSE_CODE_AGENT_ENDED as f64));
    set(v, "reason", end.reason().into());
    match end.exit {
        close::Exit::Code(c) => set(v, "exitCode", JsValue::from_f64(c as f64)),
        close::Exit::Signal(s) => set(v, "signal", JsValue::from_f64(s as f64)),
    }
    if let Some(line) = &end.stderr {
        set(v, "stderr", line.as_str().into());
    }
}

/// How `err` ended the connection.
pub(crate) fn ending(err: &ConnectionError) -> Ending {
    match err {
        ConnectionError::ApplicationClosed(ac) => Ending::app_close(ac.error_code.into_inner(), &ac.reason),
        ConnectionError::LocallyClosed => Ending::Local,
        e => Ending::Lost(e.to_string()),
    }
}

/// `me`: this device's NodeId (a refusal's words name it).
pub(crate) fn conn_error(err: &ConnectionError, me: &str) -> JsValue {
    match ending(err) {
        Ending::Agent(end) => js_error(&ErrorKind::Agent(end), &end.describe()),
        Ending::Closed { code, reason } => {
            let msg = words::closed(code, &reason, me);
            js_error(&ErrorKind::Closed { code, reason }, &msg)
        }
        Ending::Local => js_error(&client_closed(), "the connection was closed by this client"),
        Ending::Lost(text) => js_error(&classify_text(&text), &format!("connection lost: {text}")),
    }
}

/// Prefers the connection's close reason (a refusal often shows up first as a
/// failed write or read) over the operation's own error.
pub(crate) fn op_error(conn: &Connection, me: &str, fallback: impl std::fmt::Display) -> JsValue {
    match conn.close_reason() {
        Some(e) => conn_error(&e, me),
        None => {
            let text = fallback.to_string();
            js_error(&classify_text(&text), &text)
        }
    }
}

pub(crate) fn input_error(msg: impl std::fmt::Display) -> JsValue {
    js_error(&ErrorKind::Input, &msg.to_string())
}

/// `options[k]`, `undefined` when `options` is not an object.
pub(crate) fn opt(options: &JsValue, k: &str) -> JsValue {
    if options.is_object() {
        Reflect::get(options, &JsValue::from_str(k)).unwrap_or(JsValue::UNDEFINED)
    } else {
        JsValue::UNDEFINED
    }
}

pub(crate) fn parse_frame(frame: &[u8]) -> Result<JsValue, JsValue> {
    let text = std::str::from_utf8(frame).map_err(|_| js_error(&ErrorKind::Frame, "frame is not UTF-8"))?;
    js_sys::JSON::parse(text).map_err(|_| js_error(&ErrorKind::Frame, "frame is not JSON"))
}
