//! The agent's answers on a shared session go to the device that asked
//! (two clients number their requests alike: another device's answer would
//! be taken for its own), and the answer to a prompt ends a turn, which the
//! other devices are told of.

use std::sync::Arc;

use bytes::Bytes;
use thunderbolt_shared::{devices as wire, jsonrpc};

use crate::serve::{
    extension::KeptLines,
    sessions::hub::{Hub, State},
};

/// A run of the agent's output with answers in it meant for one device each
/// ([`Hub::route_answers`]).
#[derive(Debug)]
pub(in crate::serve::sessions) struct Routes {
    run: Bytes,
    /// Each line's length, and the seat its answer is for (`None`: everyone's).
    targets: Vec<(usize, Option<u64>)>,
    /// Turns that ended (a prompt's answer): what the devices but the one
    /// that asked are told ([`wire::turn_ended_line`]), once the session's
    /// state is unlocked ([`Routes::tell_turns_ended`]).
    ended: Vec<(Vec<Arc<Hub>>, Vec<u8>)>,
}

impl Routes {
    /// Tells the other devices of each turn that ended (the session's state
    /// unlocked: telling locks each device's).
    pub(in crate::serve::sessions) fn tell_turns_ended(self) {
        for (others, line) in self.ended {
            for o in others {
                o.tell(line.clone());
            }
        }
    }

    /// The run as device `seat` gets it (its own answers, no other's), with
    /// its line count; `None` when nothing of it is that device's.
    pub(in crate::serve::sessions) fn view(&self, seat: u64) -> Option<(Bytes, u64)> {
        let mut kept = KeptLines::new(&self.run);
        let (mut at, mut lines) = (0, 0);
        for (len, target) in &self.targets {
            let keep = target.is_none_or(|t| t == seat);
            kept.line(&self.run[at..at + len], keep);
            lines += u64::from(keep);
            at += len;
        }
        kept.finish().map(|run| (run, lines))
    }
}

impl Hub {
    /// Whose request each of the agent's answers in `run` answers, on a
    /// shared session (`None` when every device gets the run as it is: one
    /// device, no answer in it, or none to a request remembered).
    pub(in crate::serve::sessions) fn route_answers(
        self: &Arc<Self>,
        st: &mut State,
        run: &Bytes,
        names_an_id: bool,
    ) -> Option<Routes> {
        let m = &mut st.members;
        if !m.joined || !names_an_id || m.asked_by.is_empty() {
            return None;
        }
        let mut targets = Vec::new();
        let mut turns = Vec::new();
        let mut any = false;
        for line in thunderbolt_shared::ndjson::lines(run) {
            let id = jsonrpc::response_id(line).and_then(jsonrpc::canonical_id);
            let seat = id.as_ref().and_then(|id| {
                let key = String::from_utf8_lossy(id);
                let seat = m.asked_by.remove(&*key)?;
                if m.prompts.remove(&*key) {
                    let session = m.prompt_sessions.remove(&*key);
                    turns.push((seat, id.to_vec(), line.to_vec(), session));
                }
                Some(seat)
            });
            any |= seat.is_some();
            targets.push((line.len(), seat));
        }
        let mut ended = Vec::new();
        for (seat, id, answer, session) in turns {
            let Some(by) = self.member_at(st, seat).map(|h| h.device()) else { continue };
            let others = self.members_but(st, seat);
            // The multi-client proposal's `turn_complete`, to those of them that asked for it.
            let session = session
                .or_else(|| st.members.acp_sessions.last().map(|s| serde_json::Value::String(s.clone())))
                .unwrap_or_default();
            let complete = thunderbolt_shared::multi_client::turn_complete(&session, &answer);
            let speaking: Vec<Arc<Hub>> =
                others.iter().filter(|h| h.speaks_multi_client()).cloned().collect();
            ended.push((others, wire::turn_ended_line(&answer, &id, &by)));
            if !speaking.is_empty() {
                ended.push((speaking, complete));
            }
        }
        any.then(|| Routes { run: run.clone(), targets, ended })
    }
}
