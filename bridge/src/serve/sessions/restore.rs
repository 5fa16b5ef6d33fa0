//! Taking sessions back after the bridge restarted: each journal of an agent
//! (see [`crate::journal`]) becomes a detached session again, its agent
//! started anew and brought back to where the client left it.
//!
//! In order, for each session:
//! 1. the hub is rebuilt from the journal: the agent's frames the client had
//!    not acknowledged, both counters, the remaining grace; it waits for its
//!    client like any detached session (the client may attach at once and get
//!    those frames; its own frames wait until the restore is done);
//! 2. a new agent is started in a slot, the client's `initialize` replayed,
//!    then each ACP session taken back with `session/resume` where the agent
//!    advertises it, else `session/load` (the history it streams while
//!    loading is not shown to the client again);
//! 3. each request of the client's that was in flight is answered
//!    [`TURN_ABORTED`](thunderbolt_shared::restart::TURN_ABORTED), then one
//!    [`METHOD_RESTORED`](thunderbolt_shared::restart::METHOD_RESTORED)
//!    notification says what was taken back; the agent's output follows.
//!
//! An agent that can reload none of the sessions (it advertises neither) ends
//! the session with [`close::REASON_CANNOT_RELOAD`] once the client has what
//! was kept; never a hang, never `unknown session`.

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use iroh::EndpointId;
use serde_json::{json, Value};
use thunderbolt_shared::{
    close, jsonrpc, ndjson,
    restart::{self, Taken},
    resume::ReplayLog,
    resume_bridge::BridgeSession,
};
use tokio::{sync::mpsc, time::Instant};
use tracing::{info, warn, Instrument};

use super::{
    hub::{Hub, HubKind, State, Step, Wake},
    HubLink, HubTiming,
};
use crate::{
    journal::{self, Found, Journals, Snapshot},
    serve::{
        bridge::Shared,
        extension::KeptLines,
        served::{AgentName, Served},
        session,
    },
};

/// How long the new agent may take over one step of the restore (its start
/// and `initialize`, or taking one session back): agents that load a long
/// history from disk take seconds; one that takes this long is not coming.
pub const RESTORE_STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a whole restore may take, however many ACP sessions it takes
/// back (up to the ledger's 64): the client's frames wait for it, so an
/// agent slow on every `session/load` must not hold them for an hour.
pub const RESTORE_TOTAL_TIMEOUT: Duration = Duration::from_secs(180);

/// The prefix of the ids of the bridge's own calls to a restored agent
/// (strings no client uses: its ids are its own numbers or strings, and an
/// answer to one of these never reaches it).
const CALL_ID_PREFIX: &str = "_thunderbolt/restore/";

/// A session being taken back: the agent's answers to the bridge's own calls
/// go to the restore, the history it streams while loading is dropped.
#[derive(Debug)]
pub(crate) struct Restoring {
    /// Ids (raw JSON) of the bridge's calls waiting for the agent's answer.
    calls: HashSet<String>,
    answers: mpsc::UnboundedSender<Value>,
    /// The agent's notifications dropped (its history, shown to the client before).
    pub(super) dropped: u64,
}

impl Restoring {
    /// What of a run of the agent's lines goes on to the client: the answers
    /// to the bridge's calls and the agent's notifications are taken out.
    pub(super) fn filter(&mut self, run: Bytes) -> Option<Bytes> {
        let mut kept = KeptLines::new(&run);
        for line in ndjson::lines(&run) {
            let head = jsonrpc::peek_head(&line[..line.len().min(ndjson::OVERSIZE_PEEK)]);
            let keep = match (head.kind, head.id) {
                (jsonrpc::Kind::Response, Some(id)) if self.calls.remove(&id) => {
                    if let Ok(v) = serde_json::from_slice::<Value>(line) {
                        let _ = self.answers.send(v);
                    }
                    false
                }
                (jsonrpc::Kind::Notification, _) => {
                    self.dropped += 1;
                    false
                }
                // The agent's own requests (and anything else) go on.
                _ => true,
            };
            kept.line(line, keep);
        }
        kept.finish()
    }
}

/// Why a restore could not bring the sessions back.
enum Failed {
    /// The agent supports neither way of taking a session back.
    CannotReload,
    /// The agent ended, or answered with an error.
    Agent(String),
    /// The agent did not answer in time: the sessions after this one are
    /// not tried (an agent hung on one load is not coming back for the next).
    Silent(String),
}

/// Takes back every session journaled for `agents` (on start-up, and when a
/// host starts serving an agent), the folder read once. Each runs as one of
/// the bridge's tasks.
pub(crate) fn spawn_all(shared: &Arc<Shared>, agents: &[Arc<Served>]) {
    let Some(journals) = shared.journals.get().cloned() else { return };
    let mut seen = HashSet::new();
    let taker = |h: &journal::Header| {
        agents.iter().find(|a| {
            let cfg = a.config();
            h.node == a.endpoint.id().to_string()
                && h.agent == cfg.name.as_str()
                && h.protocol == cfg.protocol
        })
    };
    // Read within the taker's resume buffer; the others' are orphans (the scan keeps or removes them).
    for found in journals.scan(|h| taker(h).map(|a| a.config().session.resume.map_or(0, |r| r.buffer))) {
        let h = &found.header;
        let Some(agent) = taker(h) else {
            continue; // another bridge's, or an agent not served now
        };
        let cfg = agent.config();
        if !seen.insert(h.token_sha256.clone()) {
            journal::set_aside(&found.path, "a second journal of the same session");
            continue;
        }
        if shared.hubs.all().iter().any(|hub| hub.lock().token_hash == h.token_sha256) {
            continue; // a live session's own journal
        }
        let (shared, agent, journals) = (shared.clone(), agent.clone(), journals.clone());
        let span = match &cfg.name {
            AgentName::Single => tracing::Span::none(),
            AgentName::Hosted(n) => tracing::info_span!("agent", name = %n),
        };
        shared
            .tasks
            .clone()
            .spawn(async move { restore_one(found, &shared, &agent, &journals).await }.instrument(span));
    }
}

/// Takes one session back, then runs it to its end.
async fn restore_one(found: Found, shared: &Arc<Shared>, agent: &Arc<Served>, journals: &Journals) {
    let cfg = agent.config();
    let path = found.path.display().to_string();
    let Ok(owner) = found.header.owner.parse::<EndpointId>() else {
        journal::set_aside(&found.path, "its owner is not a NodeId");
        return;
    };
    let short = owner.fmt_short().to_string();
    let Some(resume) = cfg.session.resume else {
        journal::discard(&found.path);
        info!(peer = %short, "not taking back the session of {path}: resumable sessions are off now");
        return;
    };
    let since = found.folded.stopped.unwrap_or(found.written);
    let away = SystemTime::now().duration_since(since).unwrap_or_default();
    if away >= resume.grace {
        journal::discard(&found.path);
        info!(peer = %short, "not taking back the session of {path}: its client has been away {away:?}, past the grace of {:?}", resume.grace);
        return;
    }
    // Trust first, whatever its sources: a device revoked while the bridge
    // was down gets no agent started for it. An account whose device list
    // has not been fetched yet (its backend slow or down at the start) is
    // waited for, within the grace, rather than taken for a "no".
    if cfg.trust.check(&owner).is_none() {
        let unknown = cfg.account.as_ref().filter(|a| a.trust.is_enabled() && !a.trust.is_primed());
        let allowed_later = match unknown {
            Some(a) => {
                info!(peer = %short, "waiting for the account's device list before taking back the session of {path}");
                let left = resume.grace.saturating_sub(away);
                tokio::time::timeout(left, a.trust.primed()).await.is_ok()
                    && cfg.trust.check(&owner).is_some()
            }
            None => false,
        };
        if !allowed_later {
            // Here, as in the other refusals, the journal goes before the line that says so.
            journal::discard(&found.path);
            info!(peer = %short, "not taking back the session of {path}: its owner is no longer allowed");
            return;
        }
    }
    // A slot, as any new session; never by evicting one (nobody asked for this one yet).
    let (Ok(permit), Some(live)) = (shared.agents.clone().try_acquire_owned(), agent.take_session(&cfg))
    else {
        journal::discard(&found.path);
        warn!(peer = %short, "cannot take back the session of {path}: every agent slot is taken");
        return;
    };

    let timing = HubTiming { warm: None, idle_stop: cfg.session.idle_stop, ..HubTiming::resume(resume) };
    let (hub, inbox, outbox, answers) =
        rebuild(&found, owner, &cfg.name, timing, cfg.session.max_frame, shared, journals, away);
    let _registered = shared.hubs.insert(&hub);
    hub.info.set_restored();
    // Named as before the restart (`sessions`, `status`), not by its NodeId.
    hub.set_device(shared.stores().and_then(|s| s.devices.name_of(&owner)));
    hub.set_verbs(shared.verbs(&cfg, &owner));
    let _ = hub.sharer.set(crate::serve::share::Sharer::new(shared, agent));
    info!(
        peer = %short,
        session = hub.short(),
        "taking back a session after the restart: {} of the agent's frame(s) its client had not acknowledged, \
         {} ACP session(s), {} request(s) in flight{}",
        found.folded.out_total() - found.folded.out_base,
        found.folded.ledger.sessions.len(),
        found.folded.pending.0.len(),
        if found.folded.cut_tail { " (its last record was cut short by a crash and dropped)" } else { "" }
    );
    let link = HubLink(hub.clone());
    let run =
        session::run_on(link, outbox, inbox, &short, cfg.session.clone(), permit, shared.shutdown.clone());
    let restore = drive(&hub, &found, &cfg.protocol, answers);
    tokio::pin!(run);
    tokio::select! {
        _ = &mut run => {}
        () = restore => { run.await; }
    }
    crate::serve::files::hub_done(&hub, shared, &cfg);
    drop(live);
}

/// The hub of a journaled session, as it was when its bridge went away.
#[allow(clippy::too_many_arguments)]
fn rebuild(
    found: &Found,
    owner: EndpointId,
    agent: &AgentName,
    timing: HubTiming,
    max_frame: usize,
    shared: &Arc<Shared>,
    journals: &Journals,
    away: Duration,
) -> (Arc<Hub>, super::Inbox, super::Outbox, mpsc::UnboundedReceiver<Value>) {
    let f = &found.folded;
    let (tx, rx) = mpsc::unbounded_channel();
    let mut out = ReplayLog::starting_at(f.out_base);
    let mut live = Vec::new();
    for (run, _) in &f.out {
        out.push(run.clone());
        live.push(run.clone());
    }
    let snap = Snapshot {
        out_base: f.out_base,
        client_frames: f.client_frames,
        ledger: f.ledger.clone(),
        pending: f.pending.ids(),
        resumes: f.resumes,
    };
    let journal = journals.adopt(found, &snap, &live);
    // The id it had before the restart (journals written before it was
    // recorded: their token hash's first digits, as they were named then).
    let id = found.header.id.clone().unwrap_or_else(|| found.header.token_sha256[..8].to_string());
    let (hub, inbox, outbox) = Hub::with_state(
        HubKind::Resumable,
        id,
        owner,
        agent.clone(),
        timing,
        max_frame,
        Arc::downgrade(&shared.hubs),
        |st: &mut State| {
            st.token_hash = found.header.token_sha256.clone();
            st.r1 = BridgeSession::restored(out, f.client_frames);
            st.conn.resumable = true;
            st.resumes = f.resumes;
            st.conn.detached_since = Some(Instant::now().checked_sub(away).unwrap_or_else(Instant::now));
            st.journal.file = journal.is_live().then_some(journal);
            st.restart.restoring = Some(Restoring { calls: HashSet::new(), answers: tx, dropped: 0 });
            st.restart.asked = Some(HashSet::new());
            st.restart.restored_at = Some(f.out_total());
        },
    );
    (hub, inbox, outbox, rx)
}

/// Brings the new agent to where the client left the old one, then lets the
/// client's frames through.
async fn drive(hub: &Arc<Hub>, found: &Found, protocol: &str, mut answers: mpsc::UnboundedReceiver<Value>) {
    let ledger = &found.folded.ledger;
    let aborted: Vec<Value> = found.folded.pending.ids();
    let deadline = Instant::now() + RESTORE_TOTAL_TIMEOUT;
    let mut calls = Calls { hub, answers: &mut answers, next: 0, deadline };
    let outcome = async {
        let Some(init) = &ledger.init else { return Ok(Vec::new()) };
        let caps = calls.call("initialize", init.clone()).await?;
        if protocol == "mcp" {
            calls.notify("notifications/initialized");
        }
        let caps = &caps["agentCapabilities"];
        let resume = caps["sessionCapabilities"]["resume"].is_object();
        let load = caps["loadSession"].as_bool() == Some(true);
        if !ledger.sessions.is_empty() && !resume && !load {
            return Err(Failed::CannotReload);
        }
        let mut taken = Vec::new();
        let mut silent: Option<String> = None;
        for s in &ledger.sessions {
            if let Some(why) = &silent {
                taken.push((s.id.clone(), Taken::Failed(format!("not tried: {why}"))));
                continue;
            }
            let (method, how) =
                if resume { ("session/resume", Taken::Resume) } else { ("session/load", Taken::Load) };
            let params = json!({ "sessionId": s.id, "cwd": s.cwd, "mcpServers": s.mcp_servers });
            match calls.call(method, params).await {
                Ok(_) => taken.push((s.id.clone(), how)),
                Err(Failed::Agent(e)) => taken.push((s.id.clone(), Taken::Failed(e))),
                Err(Failed::Silent(e)) => {
                    taken.push((s.id.clone(), Taken::Failed(e.clone())));
                    silent = Some(e);
                }
                Err(f) => return Err(f),
            }
        }
        Ok(taken)
    }
    .await;
    let mut st = hub.lock();
    let dropped = st.restart.restoring.take().map_or(0, |r| r.dropped);
    let mut lines: Vec<u8> = aborted.iter().flat_map(restart::turn_aborted).collect();
    match &outcome {
        Ok(taken) => {
            lines.extend(restart::restored(taken, &aborted, None));
            let list: Vec<String> = taken
                .iter()
                .map(|(id, how)| match how {
                    Taken::Resume => format!("{id} (session/resume)"),
                    Taken::Load => {
                        format!("{id} (session/load, {dropped} history update(s) not shown again)")
                    }
                    Taken::Failed(e) => format!("{id} (FAILED: {e})"),
                })
                .collect();
            info!(
                peer = %hub.peer,
                session = hub.short(),
                "session taken back after the restart: {}{}",
                if list.is_empty() { "no ACP session to reload".to_string() } else { list.join(", ") },
                if aborted.is_empty() { String::new() } else { format!("; {} request(s) in flight answered '{}'", aborted.len(), restart::TURN_ABORTED) }
            );
        }
        Err(f) => {
            let why = match f {
                Failed::CannotReload => close::REASON_CANNOT_RELOAD.to_string(),
                Failed::Agent(e) | Failed::Silent(e) => format!("{}: {e}", close::REASON_CANNOT_RELOAD),
            };
            lines.extend(restart::restored(&[], &aborted, Some(&why)));
            warn!(peer = %hub.peer, session = hub.short(), "cannot take the session back: {why}; it ends once its client has what was kept");
            st.restart.close_as = Some(close::REASON_CANNOT_RELOAD.to_string());
            // The agent's input ends: it exits, and the session ends as after
            // any agent's end, its last frames delivered first.
            st.io.inbox = None;
        }
    }
    hub.emit(&mut st, Bytes::from(lines));
    drop(st);
    hub.wake(None);
}

/// The bridge's own calls to the agent during a restore.
struct Calls<'a> {
    hub: &'a Arc<Hub>,
    answers: &'a mut mpsc::UnboundedReceiver<Value>,
    next: u64,
    /// The whole restore's end ([`RESTORE_TOTAL_TIMEOUT`]).
    deadline: Instant,
}

impl Calls<'_> {
    /// Calls `method` and waits (bounded) for its result.
    async fn call(&mut self, method: &str, params: Value) -> Result<Value, Failed> {
        self.next += 1;
        let id = Value::String(format!("{CALL_ID_PREFIX}{}", self.next));
        if let Some(r) = self.hub.lock().restart.restoring.as_mut() {
            r.calls.insert(id.to_string());
        }
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        let until = (Instant::now() + RESTORE_STEP_TIMEOUT).min(self.deadline);
        let answer = tokio::time::timeout_at(until, self.answers.recv()).await;
        match answer {
            Err(_) if until == self.deadline => Err(Failed::Silent(format!(
                "the restore did not finish within {RESTORE_TOTAL_TIMEOUT:?} (the agent had not answered {method})"
            ))),
            Err(_) => Err(Failed::Silent(format!(
                "the agent did not answer {method} within {RESTORE_STEP_TIMEOUT:?}"
            ))),
            Ok(None) => Err(Failed::Agent("the agent ended".into())),
            Ok(Some(a)) => match a.get("error") {
                Some(e) => Err(Failed::Agent(format!(
                    "{method} failed: {}",
                    e["message"].as_str().unwrap_or("an error without a message")
                ))),
                None => Ok(a.get("result").cloned().unwrap_or(Value::Null)),
            },
        }
    }

    fn notify(&mut self, method: &str) {
        self.send(json!({ "jsonrpc": "2.0", "method": method }));
    }

    fn send(&self, msg: Value) {
        let mut line = serde_json::to_vec(&msg).expect("a JSON value serializes");
        line.push(b'\n');
        let _ = self.hub.inject.send(line.into());
    }
}

impl Hub {
    /// Waits until the session is not being taken back any more (client
    /// frames wait for it: they must reach the agent after the restore).
    pub(super) async fn restored(&self) {
        // A session that ended meanwhile waits for nothing.
        self.until(Wake::Changed, |st| match st.restart.restoring.is_some() && st.gone.is_none() {
            true => Step::Wait(None),
            false => Step::Ready(()),
        })
        .await
    }

    /// The bridge's own lines to the client, after the agent's output so far
    /// (journaled like it).
    pub(super) fn emit(&self, st: &mut State, run: Bytes) {
        if run.is_empty() {
            return;
        }
        st.r1.out.push(run.clone());
        st.journal_output(&run);
        self.output.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A journal of a session with `n` ACP sessions and a client that had
    /// initialized (nothing on disk: `drive` reads only what is folded).
    fn found(n: usize) -> Found {
        let mut folded = journal::record::Folded::default();
        folded.ledger.init = Some(json!({"protocolVersion": 1}));
        for i in 0..n {
            folded.ledger.sessions.push(journal::ledger::AcpSession {
                id: json!(format!("s{i}")),
                cwd: json!("/tmp"),
                mcp_servers: json!([]),
            });
        }
        Found {
            path: "unused.journal".into(),
            header: journal::Header {
                journal: journal::JOURNAL_VERSION,
                token_sha256: "ab".repeat(32),
                node: String::new(),
                owner: String::new(),
                agent: String::new(),
                protocol: "acp".into(),
                created_ms: 0,
                id: None,
                grace_ms: None,
            },
            folded,
            written: SystemTime::now(),
        }
    }

    /// An agent that answers `initialize` and then never a `session/load`:
    /// the restore gives up after one step's timeout, not one per ACP
    /// session (three here, 64 at most), and says which were not tried.
    /// Paused time: the minutes pass at once, and exactly.
    #[tokio::test(start_paused = true)]
    async fn an_agent_silent_on_one_load_is_not_asked_for_the_next() {
        let (tx, rx) = mpsc::unbounded_channel();
        let owner = iroh::SecretKey::from_bytes(&[3; 32]).public();
        let timing = HubTiming::resume(crate::serve::sessions::timing::ResumeConfig {
            grace: Duration::from_secs(600),
            buffer: 1 << 20,
        });
        let (hub, _inbox, _outbox) = Hub::with_state(
            HubKind::Resumable,
            "r".into(),
            owner,
            AgentName::Single,
            timing,
            1 << 20,
            std::sync::Weak::new(),
            |st| {
                st.restart.restoring = Some(Restoring {
                    calls: HashSet::new(),
                    answers: mpsc::unbounded_channel().0,
                    dropped: 0,
                });
            },
        );
        tx.send(json!({"result": {"agentCapabilities": {"loadSession": true}}})).unwrap();
        let started = Instant::now();
        drive(&hub, &found(3), "acp", rx).await;
        let took = started.elapsed();
        assert!(took >= RESTORE_STEP_TIMEOUT && took < RESTORE_STEP_TIMEOUT * 2, "{took:?}");
        let st = hub.lock();
        let told = st.r1.out.since(0).unwrap().concat();
        let note: Value = serde_json::from_slice(&told).unwrap();
        let sessions = note["params"]["sessions"].as_array().unwrap();
        assert_eq!(sessions.len(), 3, "{note}");
        assert!(sessions[0]["error"].as_str().unwrap().contains("did not answer session/load"), "{note}");
        for s in &sessions[1..] {
            assert!(s["error"].as_str().unwrap().starts_with("not tried:"), "{note}");
        }
        assert!(st.restart.restoring.is_none(), "the client's frames flow again");
        drop(tx);
    }

    /// An agent that escapes the `/` in the id of the bridge's own call
    /// answers that call: ids compare as values. The answer goes to the
    /// restore, never on to the client (the restore would else never end).
    #[test]
    fn an_answer_to_the_bridges_call_is_known_however_its_id_is_escaped() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut r = Restoring { calls: HashSet::new(), answers: tx, dropped: 0 };
        r.calls.insert(Value::String(format!("{CALL_ID_PREFIX}1")).to_string());
        let run = Bytes::from_static(
            b"{\"jsonrpc\":\"2.0\",\"id\":\"_thunderbolt\\/restore\\/1\",\"result\":{\"ok\":true}}\n\
              {\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"fs/read_text_file\"}\n",
        );
        let kept = r.filter(run).expect("the agent's own request goes on");
        assert_eq!(&kept[..], b"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"fs/read_text_file\"}\n");
        assert_eq!(rx.try_recv().unwrap()["result"]["ok"], true);
        assert!(r.calls.is_empty());
    }
}
