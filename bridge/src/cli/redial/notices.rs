//! What `connect` says on stderr of the bridge's own notices on the session: a restart
//! taken back, the devices on a shared session.

use super::*;

/// How many frames after a resume are looked at for the bridge's word that it
/// restarted (it comes right after what the old agent had written and the
/// client lacked: at most the resume buffer's worth, usually a few).
pub(super) const RESTORED_WATCH_FRAMES: u64 = 100_000;

/// Says on stderr what a restarted bridge took back, when `run` holds its
/// notification ([`thunderbolt_shared::restart::METHOD_RESTORED`]). Whether it did.
pub(super) fn say_restored(run: &[u8]) -> bool {
    // Built once: every run is searched for a while after a resume.
    static NEEDLE: std::sync::LazyLock<memchr::memmem::Finder<'static>> = std::sync::LazyLock::new(|| {
        memchr::memmem::Finder::new(thunderbolt_shared::restart::METHOD_RESTORED.as_bytes())
    });
    let Some(at) = NEEDLE.find(run) else { return false };
    let start = memchr::memrchr(b'\n', &run[..at]).map_or(0, |i| i + 1);
    let end = memchr::memchr(b'\n', &run[at..]).map_or(run.len(), |i| at + i);
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&run[start..end]) else { return false };
    if v["method"] != thunderbolt_shared::restart::METHOD_RESTORED {
        return false;
    }
    let p = &v["params"];
    let aborted = p["aborted"].as_array().map_or(0, Vec::len);
    let aborted = match aborted {
        0 => String::new(),
        n => format!("; {n} request(s) in flight answered '{}'", thunderbolt_shared::restart::TURN_ABORTED),
    };
    if let Some(failed) = p["failed"].as_str() {
        warn!("the bridge restarted and cannot continue the session: {failed}{aborted}");
        return true;
    }
    let sessions: Vec<String> = p["sessions"]
        .as_array()
        .map(|s| {
            s.iter()
                .map(|s| {
                    format!(
                        "{} ({})",
                        s["sessionId"].as_str().unwrap_or("?"),
                        s["how"].as_str().unwrap_or("?")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let sessions = if sessions.is_empty() {
        "no ACP session to reload".to_string()
    } else {
        format!("ACP session(s) {}", sessions.join(", "))
    };
    info!("the bridge restarted and took the session back: {sessions}{aborted}");
    true
}

/// Says on stderr what the bridge tells of the other devices on the session
/// (a role that changed, a question another device answered).
pub(super) fn say_devices(run: &[u8]) {
    use thunderbolt_shared::devices::{notice, Notice, Role};
    // Built once: every run from the bridge is searched.
    static NEEDLE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"_thunderbolt/"));
    if NEEDLE.find(run).is_none() {
        return;
    }
    for line in thunderbolt_shared::ndjson::lines(run) {
        match notice(line) {
            Some(Notice::Role { role: Role::Controller, .. }) => {
                info!("this device controls the session: what you send goes to the agent")
            }
            Some(Notice::Role { role: Role::Observer, controller }) => info!(
                "this device observes the session ({} controls it): your requests are refused, your answers to the agent's questions go on",
                controller.label()
            ),
            Some(Notice::Answered { id, by }) => info!("{} answered the agent's request {id}", by.label()),
            Some(Notice::Prompted { id, by }) => info!("{} sent the agent a prompt (its request {id})", by.label()),
            Some(Notice::TurnEnded { id, by, stop_reason }) => info!(
                "the turn {} started (its request {id}) ended: {}",
                by.label(),
                stop_reason.as_deref().unwrap_or("with an error")
            ),
            Some(Notice::Missed { frames, bytes }) => warn!(
                "this device fell behind the session (it stopped reading) and missed {frames} of the agent's \
                 message(s), {bytes} bytes: the agent did not wait for it; to see them, join again with \
                 --history all (the session keeps its last 1 MiB)"
            ),
            None => {}
        }
    }
}
