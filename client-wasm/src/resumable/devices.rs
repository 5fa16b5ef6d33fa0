//! This device's role in a session it shares: the role the page asks for, and
//! the bridge's notices about the session's devices (its role, a request answered).

use super::*;

impl Resumable {
    /// A message from the bridge that may be one of its notices about the
    /// session's devices (`msg` parsed): notes a role, and tells `onEvent`
    /// (`{type: "role", role, controller}`, `{type: "answered", id, by}`).
    pub(super) fn notice(&self, msg: &JsValue) {
        let get = |o: &JsValue, k: &str| js_sys::Reflect::get(o, &k.into()).unwrap_or_default();
        let params = get(msg, "params");
        let kind = match get(msg, "method").as_string().as_deref() {
            Some(METHOD_ROLE) => {
                let Some(role) = get(&params, "role").as_string().and_then(|r| Role::parse(&r)) else {
                    return;
                };
                let mut st = self.st.borrow_mut();
                st.role = Some(role);
                if st.want == Some(role) {
                    st.want = None;
                }
                "role"
            }
            Some(METHOD_ANSWERED) => "answered",
            _ => return,
        };
        if let (Some(f), Some(p)) = (&self.on_event, params.dyn_ref::<Object>()) {
            let v = Object::assign(&Object::new(), p);
            set(&v, "type", kind.into());
            let _ = f.call1(&JsValue::NULL, &v);
        }
    }

    /// Asks the bridge for `role` in the session this device shares (sent
    /// now, and again after a reconnect until the bridge says it is so).
    pub fn set_role(&self, role: Role) -> Result<(), JsValue> {
        let mut st = self.st.borrow_mut();
        if st.ended.is_some() {
            return Err(js_error(&ErrorKind::SessionGone, "the session has ended"));
        }
        st.want = Some(role);
        st.role_due = true;
        drop(st);
        let _ = self.poke.unbounded_send(());
        Ok(())
    }

    /// This device's role as the bridge last said it.
    pub fn role(&self) -> Option<String> {
        self.st.borrow().role.map(|r| r.as_str().into())
    }
}

/// Whether a line from the bridge may be one of its notices about devices
/// (`"_thunderbolt/` in it): only those are looked at further.
pub(super) fn may_be_notice(line: &[u8]) -> bool {
    const MARK: &[u8] = b"\"_thunderbolt/";
    line.iter().enumerate().any(|(i, b)| *b == b'"' && line[i..].starts_with(MARK))
}
