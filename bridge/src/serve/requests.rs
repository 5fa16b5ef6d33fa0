//! The client's requests the agent has not answered yet, so that none is left
//! waiting when the agent ends: each gets a JSON-RPC error naming how the
//! agent ended, before the close ([`thunderbolt_shared::jsonrpc::agent_ended`]).
//! Without it a client learns of the end only from the close, and SDK clients
//! then invent an answer of their own ("connection closed") for every request
//! in flight.
//!
//! Ids are kept as the raw JSON text the client wrote (`7`, `"q-1"`); an agent
//! answers with the id it was given, so the same text comes back.

use std::{
    collections::HashSet,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex,
    },
};

use thunderbolt_shared::{close::AgentEnd, jsonrpc};
use tracing::debug;

/// Requests tracked at once. Real clients keep a handful in flight (a prompt,
/// a few tool calls); this bounds what a client that never waits for answers
/// makes the bridge keep. Requests past it are not tracked (and get no answer
/// of ours if the agent ends).
pub const MAX_TRACKED_REQUESTS: usize = 4096;

/// Ids of the client's requests in flight to the agent.
#[derive(Debug, Default)]
pub struct Requests {
    ids: Mutex<HashSet<Box<[u8]>>>,
    /// `ids.len()`, read without the lock on the agent's output path: while no
    /// request waits, the agent's lines are not looked at.
    count: AtomicUsize,
}

impl Requests {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<Box<[u8]>>> {
        self.ids.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes the requests in `run` (whole lines from the client). The pump
    /// skips a run whose check saw no `id` (`jsonrpc::check_line`).
    pub fn sent(&self, run: &[u8]) {
        let mut ids: Option<std::sync::MutexGuard<'_, _>> = None;
        for line in thunderbolt_shared::ndjson::lines(run) {
            if let Some(id) = jsonrpc::request_id(line) {
                let ids = ids.get_or_insert_with(|| self.lock());
                if ids.len() >= MAX_TRACKED_REQUESTS {
                    debug!("{MAX_TRACKED_REQUESTS} requests unanswered: not tracking more");
                    continue;
                }
                ids.insert(id.into());
                self.count.store(ids.len(), Ordering::Relaxed);
            }
        }
    }

    /// Forgets the requests `run` (whole lines from the agent) answers.
    pub fn answered(&self, run: &[u8]) {
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        for line in thunderbolt_shared::ndjson::lines(run) {
            if let Some(id) = jsonrpc::response_id(line) {
                self.answered_id(id);
            }
        }
    }

    /// Forgets one request (answered some other way, e.g. by the bridge).
    pub fn answered_id(&self, id: &[u8]) {
        let mut ids = self.lock();
        ids.remove(id);
        self.count.store(ids.len(), Ordering::Relaxed);
    }

    /// Forgets them all (their client is gone; nobody waits for the answers).
    pub fn clear(&self) {
        let mut ids = self.lock();
        ids.clear();
        self.count.store(0, Ordering::Relaxed);
    }

    /// The answers for every request still waiting, now that the agent ended
    /// (`None`: how is unknown); they are forgotten.
    pub fn answer_all(&self, end: Option<&AgentEnd>) -> Vec<u8> {
        let how = end.map_or_else(|| "agent ended".to_string(), AgentEnd::exit_reason);
        let stderr = end.and_then(|e| e.stderr);
        let stderr = stderr.as_ref().map(|l| l.as_str());
        let mut ids = self.lock();
        self.count.store(0, Ordering::Relaxed);
        let mut sorted: Vec<Box<[u8]>> = ids.drain().collect();
        sorted.sort();
        sorted.iter().flat_map(|id| jsonrpc::agent_ended(id, &how, stderr)).collect()
    }

    /// The ids (raw JSON text) of the requests in flight now.
    pub fn ids(&self) -> Vec<Box<[u8]>> {
        self.lock().iter().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_in_flight_are_answered_once_the_agent_ends() {
        let r = Requests::default();
        r.sent(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}\n{\"jsonrpc\":\"2.0\",\"method\":\"n\"}\n");
        r.sent(b"{\"jsonrpc\":\"2.0\",\"id\":\"p\",\"method\":\"session/prompt\"}\n");
        assert_eq!(r.len(), 2);
        r.answered(b"{\"jsonrpc\":\"2.0\",\"method\":\"session/update\"}\n{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n");
        assert_eq!(r.len(), 1);
        let out = r.answer_all(Some(&AgentEnd::exited(1)));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["id"], "p");
        assert!(r.is_empty());
        assert!(r.answer_all(None).is_empty(), "each answered once");
    }

    #[test]
    fn tracking_is_bounded() {
        let r = Requests::default();
        let mut run = Vec::new();
        for i in 0..MAX_TRACKED_REQUESTS + 10 {
            run.extend(format!("{{\"id\":{i},\"method\":\"m\"}}\n").bytes());
        }
        r.sent(&run);
        assert_eq!(r.len(), MAX_TRACKED_REQUESTS);
    }
}
