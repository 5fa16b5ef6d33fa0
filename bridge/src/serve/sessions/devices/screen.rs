//! What of a device's input goes to the agent once the session is shared:
//! the controller's frames (but a second answer to one request, or a request
//! whose id another device's request in flight holds), only the answers of an
//! observer's (its requests are refused, naming its role). The first answer
//! to an agent's request wins, and the other devices are told who gave it.

use std::{sync::Arc, time::SystemTime};

use bytes::Bytes;
use thunderbolt_shared::multi_client as mc;
use thunderbolt_shared::{
    devices::{self as wire, Device},
    jsonrpc,
};
use tracing::info;

use super::{acp_sessions::note_acp_sessions, ASKED_BY_REMEMBERED};
use crate::{
    devices::scope::Verb,
    serve::{extension::KeptLines, sessions::hub::Hub},
};

/// Answered requests remembered, to drop a later answer to the same one
/// (agents ask one thing at a time; a few dozen covers any backlog).
const ANSWERED_REMEMBERED: usize = 64;

/// The ACP method whose answer ends a turn ([`wire::METHOD_TURN_ENDED`]), as
/// raw JSON text ([`jsonrpc::request_head`]).
const PROMPT_METHOD: &[u8] = b"\"session/prompt\"";

impl Hub {
    /// What of a run of this device's frames goes to the agent: everything
    /// of the controller's (but a second answer to one request), only answers
    /// of an observer's. Refusals and "answered" notices are sent here too.
    /// `None` when nothing goes on.
    ///
    /// `names_an_id` is [`jsonrpc::names_an_id`] of the run. The ACP sessions
    /// the device names are read from a run that has one, or is small (see
    /// [`SESSIONS_READ_BELOW`](super::acp_sessions::SESSIONS_READ_BELOW)).
    pub(in crate::serve::sessions) fn screen(
        self: &Arc<Self>,
        run: Bytes,
        names_an_id: bool,
    ) -> Option<Bytes> {
        let run = if names_an_id { self.take_bridge_calls(run)? } else { run };
        let run = if self.is_guest() { self.refuse_guest_push(run)? } else { run };
        let run = self.screen_scope(run)?;
        let Some(session) = self.session_hub() else { return Some(run) };
        let me = self.seat_number();
        let mut st = session.lock();
        let m = &mut st.members;
        m.last_activity = SystemTime::now();
        note_acp_sessions(&mut m.acp_sessions, &run, names_an_id);
        let controller = m.controller == me;
        if !m.joined || (controller && !names_an_id) {
            // One device: nothing is screened; its answers close what is open.
            // Nor are the controller's lines when none is a request or an answer.
            if names_an_id && !m.open.is_empty() {
                for line in thunderbolt_shared::ndjson::lines(&run) {
                    if let Some(id) = jsonrpc::response_id(line).and_then(jsonrpc::canonical_id) {
                        let key = String::from_utf8_lossy(&id);
                        m.open.remove(&*key);
                        m.asked.remove(&*key);
                    }
                }
            }
            return Some(run);
        }
        let mut kept = KeptLines::new(&run);
        let mut refusals = Vec::new();
        let mut answered = Vec::new();
        let mut in_use = Vec::new();
        let mut prompted = Vec::new();
        // The multi-client proposal's events, for the devices that asked.
        let mut multi = Vec::new();
        // Each line read whole (`classify`): what decides where it goes is
        // every key it has, not the first that looks like an answer.
        for line in thunderbolt_shared::ndjson::lines(&run) {
            let message = jsonrpc::classify(line);
            if let jsonrpc::Message::Response(id) = &message {
                let key = String::from_utf8_lossy(id).into_owned();
                if m.open.remove(&key) {
                    if let Some(asked) = m.asked.remove(&key) {
                        multi.push(mc::permission_resolved(&asked, id, line, &self.client()));
                    }
                    let mine = self.device();
                    if m.answered.len() >= ANSWERED_REMEMBERED {
                        m.answered.pop_front();
                    }
                    m.answered.push_back((key, me, mine.clone()));
                    answered.push(wire::answered_line(id, &mine));
                    kept.line(line, true);
                } else if let Some((_, _, by)) =
                    m.answered.iter().find(|(a, seat, _)| *a == key && *seat != me)
                {
                    info!(
                        peer = %self.peer,
                        session = session.short(),
                        "{}'s answer to the agent's request {key} dropped: {} answered it first",
                        self.device().label(),
                        by.label()
                    );
                    kept.line(line, false);
                } else {
                    kept.line(line, true);
                }
            } else if controller {
                let mut keep = true;
                if let jsonrpc::Message::Request(id) = &message {
                    let key = String::from_utf8_lossy(id).into_owned();
                    match m.asked_by.get(&key) {
                        Some(seat) if *seat != me => {
                            keep = false;
                            in_use.push(id.to_vec());
                        }
                        _ if m.asked_by.len() < ASKED_BY_REMEMBERED => {
                            let prompt = jsonrpc::request_head(line).is_some_and(|(_, m)| m == PROMPT_METHOD);
                            if prompt && m.prompts.len() < ASKED_BY_REMEMBERED {
                                m.prompts.insert(key.clone());
                                prompted.push(wire::prompted_line(line, id, &self.device()));
                                if let Some(told) = mc::prompt_received(line, &self.client()) {
                                    let session_id = mc::session_of(&told);
                                    m.prompt_sessions.insert(key.clone(), session_id);
                                    multi.push(told);
                                }
                            }
                            m.asked_by.insert(key, me);
                        }
                        _ => {}
                    }
                }
                kept.line(line, keep);
            } else {
                // An observer's request is refused; anything else of its
                // (a notification, a line that is no one thing) is dropped.
                kept.line(line, false);
                if let jsonrpc::Message::Request(id) = message {
                    refusals.push(id.into_owned());
                }
            }
        }
        if refusals.is_empty()
            && answered.is_empty()
            && in_use.is_empty()
            && prompted.is_empty()
            && multi.is_empty()
        {
            // The common case, on every run of the controller's: nothing to tell.
            return kept.finish();
        }
        let controller_device = session.member_at(&st, st.members.controller).map(|h| h.device());
        let others = session.members_but(&st, me);
        drop(st);
        if !refusals.is_empty() {
            let by = controller_device.unwrap_or(Device { node: String::new(), name: Some("nobody".into()) });
            info!(
                peer = %self.peer,
                session = session.short(),
                "refused {} request(s) of {}: it observes the session",
                refusals.len(),
                self.device().label()
            );
            for id in refusals {
                self.tell(wire::observer_refused(&id, &by));
            }
        }
        for line in answered.into_iter().chain(prompted) {
            for o in &others {
                o.tell(line.clone());
            }
        }
        for line in multi {
            super::multi::tell_multi(&others, &line);
        }
        for id in in_use {
            info!(
                peer = %self.peer,
                session = session.short(),
                "refused a request of {}: its id {} is another device's request in flight",
                self.device().label(),
                String::from_utf8_lossy(&id)
            );
            self.tell(wire::id_in_use(&id));
        }
        kept.finish()
    }

    /// The requests the session's bridge answers for the device that sent
    /// them, taken out of a run of its (one substring search each when
    /// there is none): ACP's `session/attach`, `_thunderbolt/share` and
    /// `_thunderbolt/kick`, and a joined device's push subscriptions, refused.
    fn take_bridge_calls(self: &Arc<Self>, run: Bytes) -> Option<Bytes> {
        use memchr::memmem::find;
        let run = if find(&run, b"session/attach").is_some() { self.take_attach(run)? } else { run };
        if find(&run, b"_thunderbolt/").is_none() {
            return Some(run);
        }
        let run = if find(&run, b"_thunderbolt/share").is_some() { self.take_share(run)? } else { run };
        let run = if find(&run, b"_thunderbolt/kick").is_some() { self.take_kick(run)? } else { run };
        Some(run)
    }

    /// Notices belong to the device that started the session: one that
    /// joined it (a share's guest among them) cannot subscribe through it,
    /// or it would get that device's notices and their answer tokens. Its
    /// lines that could name a push method, however spelled (an escape, a
    /// notification), are read as the bridge's methods read them (whole
    /// JSON), and those that do are refused (a request) or dropped.
    fn refuse_guest_push(self: &Arc<Self>, run: Bytes) -> Option<Bytes> {
        use memchr::memmem::find;
        if find(&run, b"thunderbolt").is_none()
            && find(&run, b"\\u").is_none()
            && find(&run, b"\\/").is_none()
        {
            return Some(run);
        }
        let mut kept = KeptLines::new(&run);
        let mut refused = Vec::new();
        for line in thunderbolt_shared::ndjson::lines(&run) {
            let suspect = find(line, b"thunderbolt").is_some()
                || find(line, b"\\u").is_some()
                || find(line, b"\\/").is_some();
            let v = suspect.then(|| serde_json::from_slice::<serde_json::Value>(line).ok()).flatten();
            let push = v
                .as_ref()
                .and_then(|v| v.get("method")?.as_str())
                .is_some_and(|m| m.starts_with("_thunderbolt/push/"));
            kept.line(line, !push);
            if let Some(id) = v.as_ref().filter(|_| push).and_then(|v| v.get("id")) {
                refused.push(thunderbolt_shared::jsonrpc::json_line(&serde_json::json!({
                    "jsonrpc": "2.0",
                    "id": id,
                    "error": {"code": thunderbolt_shared::devices::SCOPE_REFUSED_CODE,
                              "message": "notices are set up on a session this device started, not on one it joined"},
                })));
            }
        }
        for r in refused {
            self.tell(r);
        }
        kept.finish()
    }

    /// Takes this device's requests of `method` (raw JSON text, with its
    /// quotes) out of a run, the bridge's to answer: each gets `answer(id,
    /// params)`'s line, told to this device. `None` when nothing else was
    /// in the run.
    pub(in crate::serve::sessions) fn take_calls(
        self: &Arc<Self>,
        run: Bytes,
        method: &[u8],
        mut answer: impl FnMut(&[u8], &serde_json::Value) -> Vec<u8>,
    ) -> Option<Bytes> {
        let mut kept = KeptLines::new(&run);
        let mut replies = Vec::new();
        for line in thunderbolt_shared::ndjson::lines(&run) {
            let Some(id) =
                jsonrpc::request_head(line).filter(|(_, m)| *m == method).map(|(id, _)| id.to_vec())
            else {
                kept.line(line, true);
                continue;
            };
            kept.line(line, false);
            let params = serde_json::from_slice::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v.get("params").cloned())
                .unwrap_or(serde_json::Value::Null);
            replies.push(answer(&id, &params));
        }
        for r in replies {
            self.tell(r);
        }
        kept.finish()
    }

    /// What of a run this device's scope lets go to the agent, whatever its
    /// role: without `prompt` its requests are refused (an error naming its
    /// scope) and its notifications dropped; without `answer` its answers to
    /// the agent's requests are dropped. One atomic load when it may do both.
    pub(in crate::serve::sessions) fn screen_scope(self: &Arc<Self>, run: Bytes) -> Option<Bytes> {
        let verbs = self.verbs();
        let (prompt, answer) = (verbs.has(Verb::Prompt), verbs.has(Verb::Answer));
        if prompt && answer {
            return Some(run);
        }
        let mut kept = KeptLines::new(&run);
        let (mut refused, mut dropped) = (Vec::new(), 0usize);
        // Each line read whole: a line that is no one thing (an answer
        // dressed as something else) goes nowhere, as an agent may read it
        // as an answer.
        for line in thunderbolt_shared::ndjson::lines(&run) {
            let keep = match jsonrpc::classify(line) {
                jsonrpc::Message::Response(_) => answer,
                jsonrpc::Message::Request(id) if !prompt => {
                    refused.push(id.into_owned());
                    false
                }
                jsonrpc::Message::Request(_) | jsonrpc::Message::Notification => prompt,
                jsonrpc::Message::Invalid => false,
            };
            kept.line(line, keep);
            dropped += usize::from(!keep);
        }
        if !refused.is_empty() || dropped > 0 {
            info!(
                peer = %self.peer,
                session = self.short(),
                "{}'s scope is {verbs}: {} request(s) refused, {} line(s) not sent to the agent",
                self.device().label(),
                refused.len(),
                dropped - refused.len()
            );
        }
        let scope = verbs.to_string();
        for id in refused {
            self.tell(wire::scope_refused(&id, &scope));
        }
        kept.finish()
    }
}
