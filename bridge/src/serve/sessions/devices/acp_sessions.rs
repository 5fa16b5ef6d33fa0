//! The ACP session ids a session's clients name (`"sessionId":"…"`), kept
//! (a few, bounded) for a device's listing of the session.

/// ACP session ids a listing shows of one session, and the longest shown.
const ACP_SESSIONS_LISTED: usize = 8;

/// A run of the client's lines without an `"id"` (no request in it) is read for
/// the ACP sessions it names only when smaller than this. A client names a
/// session first in a request (`session/prompt`, `session/load`), or in a lone
/// notification (`session/cancel`), a run of its own; the runs skipped are a
/// bulk transfer's, where that search was a whole extra pass over every byte
/// (about 1.3 % of the bridge's CPU, `bench --only duplex`).
pub(super) const SESSIONS_READ_BELOW: usize = 16 * 1024;
const ACP_SESSION_ID_MAX: usize = 128;

/// Notes the ACP session ids a client's run names (`"sessionId":"…"`), if it
/// is a run that is read for them (`names_an_id`, see [`SESSIONS_READ_BELOW`]).
pub(crate) fn note_acp_sessions(seen: &mut Vec<String>, run: &[u8], names_an_id: bool) {
    // Built once: this runs over every run a client sends.
    static KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"sessionId\":\""));
    if seen.len() >= ACP_SESSIONS_LISTED || !(names_an_id || run.len() < SESSIONS_READ_BELOW) {
        return;
    }
    for at in KEY.find_iter(run) {
        let rest = &run[at + KEY.needle().len()..];
        let Some(end) = memchr::memchr(b'"', rest) else { continue };
        let id = &rest[..end];
        if id.is_empty() || id.len() > ACP_SESSION_ID_MAX || id.contains(&b'\\') {
            continue;
        }
        let Ok(id) = std::str::from_utf8(id) else { continue };
        if !seen.iter().any(|s| s == id) {
            seen.push(id.to_string());
            if seen.len() >= ACP_SESSIONS_LISTED {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acp_session_ids_are_noted_once_and_bounded() {
        let mut seen = Vec::new();
        note_acp_sessions(
            &mut seen,
            br#"{"params":{"sessionId":"s-1"}} {"sessionId":"s-1"} {"sessionId":"a\"b"}"#,
            false,
        );
        assert_eq!(seen, vec!["s-1".to_string()]);
        for i in 0..20 {
            note_acp_sessions(&mut seen, format!(r#"{{"sessionId":"x{i}"}}"#).as_bytes(), false);
        }
        assert_eq!(seen.len(), ACP_SESSIONS_LISTED);
    }

    #[test]
    fn a_bulk_run_without_an_id_is_not_read_for_session_ids() {
        let cancel = br#"{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"c-1"}}"#;
        let mut bulk = b"\"pad\"\n".repeat(SESSIONS_READ_BELOW / 6);
        bulk.extend_from_slice(cancel);
        bulk.push(b'\n');
        let mut seen = Vec::new();
        // A lone notification is read; a bulk run of them is not, unless it
        // holds a request or an answer.
        note_acp_sessions(&mut seen, &bulk, false);
        assert!(seen.is_empty(), "{seen:?}");
        note_acp_sessions(&mut seen, cancel, false);
        assert_eq!(seen, ["c-1"]);
        let prompt = br#"{"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"sessionId":"p-1"}}"#;
        bulk.extend_from_slice(prompt);
        note_acp_sessions(&mut seen, &bulk, true);
        assert_eq!(seen, ["c-1", "p-1"]);
    }
}
