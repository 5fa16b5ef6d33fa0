//! Sessions that survive a restart of the bridge: a real bridge process
//! stopped (SIGTERM) or killed (SIGKILL) in the middle of a streamed reply and
//! started again on the same home, a real ACP agent built with the SDK that
//! keeps its sessions on disk (`client-wasm/e2e/restart-agent.mjs`), and the
//! same `thunderbolt acp connect` process throughout (never restarted), through
//! a real local relay (the restarted bridge has a new port; the ticket's relay
//! still reaches it).

use std::{path::PathBuf, process::Stdio};

use serde_json::{json, Value};
use thunderbolt_shared::restart;
use thunderbolt_tests::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// One `connect`'s stdio (the harness's [`JsonConnect`]), with the ACP prompt.
type Client = JsonConnect;

/// A prompt and what the agent said while answering it.
async fn prompt(c: &mut Client, id: u64, session: &str, text: &str) -> (Value, String) {
    let start = c.seen.len();
    let params = json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]});
    let r = c.request(id, "session/prompt", params).await;
    (r, said_since(c, start))
}

/// The agent's message chunks among the lines seen from `start` on.
fn said_since(c: &Client, start: usize) -> String {
    c.seen[start..].iter().filter_map(chunk_text).collect()
}

fn chunk_text(v: &Value) -> Option<&str> {
    let u = &v["params"]["update"];
    (v["method"] == "session/update" && u["sessionUpdate"] == "agent_message_chunk")
        .then(|| u["content"]["text"].as_str())
        .flatten()
}

/// A bridge home with the SDK agent, a device paired with it, and both on one relay.
struct Rig {
    relay: LocalRelay,
    tb: Tb,
    dev: Tb,
    store: tempfile::TempDir,
    agent: PathBuf,
    caps: &'static str,
}

impl Rig {
    async fn new(caps: &'static str) -> Option<Self> {
        let agent = sdk_agent("restart-agent.mjs")?;
        let relay = LocalRelay::start().await;
        let tb = Tb::new(Some(&relay));
        let dev = Tb::new(Some(&relay));
        tb.allow(&dev.node_id("acp").await).await;
        Some(Self { relay, tb, dev, store: tempfile::tempdir().unwrap(), agent, caps })
    }

    async fn bridge(&self) -> RunningBridge {
        let store = self.store.path().display().to_string();
        let agent = self.agent.display().to_string();
        let cmd = ["node", &agent, "--store", &store, "--caps", self.caps, "--chunk-ms", "20"];
        self.tb.bridge("acp", &[], &cmd).await
    }

    fn journals(&self) -> Vec<String> {
        let dir = self.tb.home().join("iroh/sessions");
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    fn calls(&self) -> String {
        std::fs::read_to_string(self.store.path().join("calls.log")).unwrap_or_default()
    }
}

/// initialize, session/new and two turns: the session id.
async fn converse(c: &mut Client) -> String {
    let init = c
        .request(
            0,
            "initialize",
            json!({"protocolVersion": 1, "clientInfo": {"name": "restart-test", "version": "7"}}),
        )
        .await;
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    let new = c.request(1, "session/new", json!({"cwd": "/tmp", "mcpServers": []})).await;
    let sid = new["result"]["sessionId"].as_str().expect("a session id").to_string();
    let (r, said) = prompt(c, 2, &sid, "first").await;
    assert_eq!(r["result"]["stopReason"], "end_turn");
    assert_eq!(said, "turn 1: first (history: none)");
    let (_, said) = prompt(c, 3, &sid, "second").await;
    assert_eq!(said, "turn 2: second (history: first)");
    sid
}

/// Starts the streamed third turn (request 4) and reads `n` of its chunks.
async fn stream_until(c: &mut Client, sid: &str, n: usize) {
    let params = json!({"sessionId": sid, "prompt": [{"type": "text", "text": "stream 400"}]});
    c.send(json!({"jsonrpc": "2.0", "id": 4, "method": "session/prompt", "params": params})).await;
    let mut got = 0;
    while got < n {
        if chunk_text(&c.next().await).is_some() {
            got += 1;
        }
    }
}

/// After the restart: the rest of the streamed turn's chunks, exactly once and
/// in order, then request 4 answered `turn aborted`, then the restored
/// notification (returned). No history the agent streamed while loading reaches
/// the client.
async fn taken_back(c: &mut Client) -> Value {
    let aborted = c.response(&json!(4)).await;
    assert_eq!(aborted["error"]["message"], restart::TURN_ABORTED, "{aborted}");
    let note = c.next().await;
    assert_eq!(note["method"], restart::METHOD_RESTORED, "{note}");
    assert_eq!(note["params"]["aborted"], json!([4]), "{note}");
    // Every chunk of the cut turn once, numbered from 1 without a gap or a repeat.
    let chunks: Vec<u32> = c
        .seen
        .iter()
        .filter_map(chunk_text)
        .filter_map(|t| t.strip_prefix("chunk ")?.split('/').next()?.parse().ok())
        .collect();
    assert!(chunks.len() >= 10 && chunks.len() < 400, "{} chunks", chunks.len());
    assert_eq!(chunks, (1..=chunks.len() as u32).collect::<Vec<_>>(), "chunks lost, repeated or reordered");
    assert!(
        !c.seen.iter().any(|v| v["params"]["update"]["sessionUpdate"] == "user_message_chunk"),
        "the history the agent streamed while loading reached the client"
    );
    note
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_survives_sigterm_of_the_bridge_and_resumes_its_acp_session() {
    let Some(rig) = Rig::new("resume").await else { return };
    let mut bridge = rig.bridge().await;
    assert!(
        bridge.banner.contains("Resume:  a lost connection or a restart of the bridge keeps its session"),
        "{}",
        bridge.banner
    );
    let mut c = Client::start(&rig.dev, &[&bridge.ticket]);
    let sid = converse(&mut c).await;
    stream_until(&mut c, &sid, 10).await;
    assert_eq!(rig.journals().len(), 1, "a resumable session is journaled");

    let status = bridge.terminate().await;
    assert!(status.success(), "the bridge exits cleanly: {status:?}");
    let log = bridge.log.finished().await;
    assert!(log.contains("session kept for the bridge's restart"), "{log}");
    c.log.wait_for("the bridge is restarting and keeps the session").await;

    let bridge = rig.bridge().await;
    let note = taken_back(&mut c).await;
    assert_eq!(note["params"]["sessions"], json!([{"sessionId": sid, "how": "resume"}]), "{note}");
    c.log.wait_for(&format!("the bridge restarted and took the session back: ACP session(s) {sid} (resume); 1 request(s) in flight answered 'turn aborted: the host restarted'")).await;
    bridge.log.wait_for("session taken back after the restart").await;
    assert!(bridge.log.contains("(session/resume)"), "{}", bridge.log.text());

    // The same ACP session, its history intact (the cut turn was never saved).
    let (r, said) = prompt(&mut c, 5, &sid, "fourth").await;
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert_eq!(said, "turn 3: fourth (history: first|second)");
    // An answer to something the old agent asked never reaches the new one.
    c.send(json!({"jsonrpc": "2.0", "id": "old-ask", "result": {"outcome": {"outcome": "cancelled"}}})).await;
    bridge.log.wait_for("the client's answer to request \"old-ask\" dropped").await;
    let calls = rig.calls();
    assert_eq!(
        calls.matches("initialize {\"name\":\"restart-test\",\"version\":\"7\"}").count(),
        2,
        "{calls}"
    );
    assert!(calls.contains(&format!("resume {sid}")) && !calls.contains("load "), "{calls}");

    // `status` marks it.
    let out = rig.tb.run(&["status", "--json"]).await;
    let status: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{out:?}"));
    assert!(status.to_string().contains("\"restored\":true"), "{status}");

    // The session ends as any other: its journal goes with it.
    drop(c.stdin.take());
    let exit = tokio::time::timeout(WAIT, c.child.wait()).await.unwrap().unwrap();
    assert!(exit.success(), "connect: {exit:?}\n{}", c.log.text());
    bridge.log.wait_for("session ended").await;
    assert_eq!(rig.journals(), Vec::<String>::new());
    bridge.stop().await;
    rig.relay.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_survives_sigkill_of_the_bridge_and_loads_its_acp_session() {
    let Some(rig) = Rig::new("load").await else { return };
    let mut bridge = rig.bridge().await;
    let mut c = Client::start(&rig.dev, &[&bridge.ticket]);
    let sid = converse(&mut c).await;
    stream_until(&mut c, &sid, 10).await;

    // SIGKILL: the agent dies with the bridge (its death signal). What the
    // agent had written that the bridge had not read yet is lost; nothing the
    // bridge read is, and nothing is delivered twice (asserted in taken_back).
    signal(bridge.pid(), libc::SIGKILL);
    let _ = bridge.child.wait().await;
    c.log.wait_for("reconnecting").await;

    let bridge = rig.bridge().await;
    let note = taken_back(&mut c).await;
    assert_eq!(note["params"]["sessions"], json!([{"sessionId": sid, "how": "load"}]), "{note}");
    let (_, said) = prompt(&mut c, 5, &sid, "fourth").await;
    assert_eq!(said, "turn 3: fourth (history: first|second)");
    assert!(rig.calls().contains(&format!("load {sid}")), "{}", rig.calls());
    bridge.log.wait_for("history update(s) not shown again").await;
    // The journal writes the agent's output behind the client's acknowledgements:
    // the client held frames the killed bridge had not written, and the new
    // agent's were numbered after them (no gap, no repeat: taken_back).
    assert!(bridge.log.contains("past what the journal kept"), "{}", bridge.log.text());
    drop(c.stdin.take());
    let _ = tokio::time::timeout(WAIT, c.child.wait()).await;
    bridge.stop().await;
    rig.relay.stop().await;
}

/// A bridge killed mid-turn (a crash, an OOM kill) and started again at once:
/// the new bridge does not know the old connection and cannot say so, and
/// `connect` must not wait for its idle timeout (a minute here) to find out.
/// It notices the silence, dials afresh beside, and resumes over the fresh
/// connection: the turn in flight is answered, every frame once and in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_bridge_killed_and_started_again_at_once_is_noticed_without_waiting_for_the_idle_timeout() {
    let Some(rig) = Rig::new("load").await else { return };
    let mut bridge = rig.bridge().await;
    let mut c = Client::start(&rig.dev, &["--idle-timeout", "60", &bridge.ticket]);
    let sid = converse(&mut c).await;
    stream_until(&mut c, &sid, 10).await;

    signal(bridge.pid(), libc::SIGKILL);
    let _ = bridge.child.wait().await;
    let restarting = tokio::time::Instant::now();
    let bridge = rig.bridge().await;
    let ready = restarting.elapsed();
    let note = taken_back(&mut c).await;
    let answered = restarting.elapsed();
    eprintln!(
        "the turn in flight was answered {:.2} s after the restart began ({:.2} s after the new bridge was ready)",
        answered.as_secs_f64(),
        (answered - ready).as_secs_f64()
    );
    assert_eq!(note["params"]["sessions"], json!([{"sessionId": sid, "how": "load"}]), "{note}");
    let log = c.log.text();
    assert!(log.contains("the bridge answers a new connection but nothing on this one"), "{log}");
    assert!(!log.contains("timed out"), "the idle timeout noticed it, not the silence: {log}");
    let (_, said) = prompt(&mut c, 5, &sid, "fourth").await;
    assert_eq!(said, "turn 3: fourth (history: first|second)");
    drop(c.stdin.take());
    let _ = tokio::time::timeout(WAIT, c.child.wait()).await;
    bridge.stop().await;
    rig.relay.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_that_cannot_reload_ends_the_session_with_a_reason_of_its_own() {
    let Some(rig) = Rig::new("none").await else { return };
    let mut bridge = rig.bridge().await;
    let mut c = Client::start(&rig.dev, &[&bridge.ticket]);
    let sid = converse(&mut c).await;
    stream_until(&mut c, &sid, 10).await;
    bridge.terminate().await;

    let bridge = rig.bridge().await;
    let note = taken_back(&mut c).await;
    assert_eq!(note["params"]["failed"], thunderbolt_shared::close::REASON_CANNOT_RELOAD, "{note}");
    let exit = tokio::time::timeout(WAIT, c.child.wait()).await.unwrap().unwrap();
    assert!(!exit.success());
    let log = c.log.finished().await;
    assert!(log.contains("cannot reload sessions"), "{log}");
    assert!(log.contains("the bridge restarted and cannot continue the session"), "{log}");
    assert!(!log.contains("unknown session"), "{log}");
    bridge.log.wait_for("session ended").await;
    assert_eq!(rig.journals(), Vec::<String>::new(), "the ended session's journal is gone");
    bridge.stop().await;
    rig.relay.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_journals_are_set_aside_and_a_token_is_not_enough_to_take_another_owners_session() {
    let Some(rig) = Rig::new("resume").await else { return };
    let mut bridge = rig.bridge().await;
    let mut c = Client::start(&rig.dev, &[&bridge.ticket]);
    converse(&mut c).await;
    bridge.terminate().await;
    let names = rig.journals();
    assert_eq!(names.len(), 1);
    let dir = rig.tb.home().join("iroh/sessions");
    let journal = dir.join(&names[0]);

    // The journal now names another owner: this device presents the right
    // token, and is still not given the session.
    let text = std::fs::read_to_string(&journal).unwrap();
    let me = rig.dev.node_id("acp").await.to_string();
    let other = iroh::SecretKey::from_bytes(&[7u8; 32]).public();
    rig.tb.allow(&other).await;
    std::fs::write(&journal, text.replacen(&me, &other.to_string(), 1)).unwrap();
    // And journals the bridge must not use.
    use std::os::unix::fs::PermissionsExt;
    let bad = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    };
    bad("truncated.journal", &text.as_bytes()[..40]);
    bad("version.journal", text.replacen("{\"journal\":1,", "{\"journal\":9,", 1).as_bytes());
    std::os::unix::fs::symlink(&journal, dir.join("link.journal")).unwrap();
    // A session of an owner no longer allowed: deleted, not taken back.
    let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let token = header["token_sha256"].as_str().unwrap();
    let stranger = iroh::SecretKey::from_bytes(&[9u8; 32]).public().to_string();
    bad("revoked.journal", text.replacen(&me, &stranger, 1).replacen(token, &"ab".repeat(32), 1).as_bytes());

    let bridge = rig.bridge().await;
    for name in ["truncated", "version", "link"] {
        bridge.log.wait_for(&format!("{name}.journal cannot be used")).await;
    }
    bridge.log.wait_for("revoked.journal: its owner is no longer allowed").await;
    let exit = tokio::time::timeout(WAIT, c.child.wait()).await.unwrap().unwrap();
    assert!(!exit.success());
    let log = c.log.finished().await;
    assert!(log.contains("the session is gone"), "{log}");
    let mut left = rig.journals();
    left.retain(|n| !n.ends_with(".set-aside"));
    assert_eq!(left, [names[0].clone()], "the other owner's journal waits for its owner");

    // The bridge still serves.
    let mut c2 = Client::start(&rig.dev, &[&bridge.ticket]);
    converse(&mut c2).await;
    drop(c2.stdin);
    let _ = tokio::time::timeout(WAIT, c2.child.wait()).await;
    bridge.stop().await;
    rig.relay.stop().await;
}

/// `systemctl --user restart thunderbolt-host`: the unit's own command line and
/// environment (from `thunderbolt service install --dry-run`), run, stopped
/// with SIGTERM as systemd stops it (`KillMode=mixed`), and run again.
#[tokio::test(flavor = "multi_thread")]
async fn the_user_services_restart_keeps_the_session() {
    let Some(rig) = Rig::new("resume").await else { return };
    use std::os::unix::fs::PermissionsExt;
    let agents = rig.tb.home().join("agents.d");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::set_permissions(&agents, std::fs::Permissions::from_mode(0o700)).unwrap();
    let manifest = json!({"name": "sdk", "command": ["node", rig.agent, "--store", rig.store.path(), "--caps", "resume"]});
    let path = agents.join("sdk.json");
    std::fs::write(&path, manifest.to_string()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

    let out = rig.tb.run(&["service", "install", "--dry-run", "--for", "systemd"]).await;
    assert!(out.status.success(), "{out:?}");
    let unit = String::from_utf8(out.stdout).unwrap();
    let field = |key: &'static str| unit.lines().filter_map(move |l| l.strip_prefix(key)).map(str::to_string);
    let exec = field("ExecStart=").next().expect("an ExecStart line");
    // `"/path/to/thunderbolt" host`: a quoted program and its words.
    let (program, args) = exec.strip_prefix('"').and_then(|r| r.split_once("\" ")).expect("a quoted program");
    let env: Vec<(String, String)> = field("Environment=")
        .map(|v| {
            let (k, v) = v.trim_matches('"').split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect();
    assert!(env.iter().any(|(k, _)| k == "THUNDERBOLT_HOME"), "{unit}");
    let service = || {
        // Only what the unit says (and a PATH to find the agent's interpreter).
        let mut c = tokio::process::Command::new(program);
        c.args(args.split(' ')).env_clear().env("PATH", std::env::var("PATH").unwrap()).envs(env.clone());
        c.stdin(Stdio::null()).kill_on_drop(true);
        c
    };
    let ticket_of = |banner: &str| {
        let line = banner.lines().find(|l| l.trim_start().starts_with("Ticket:")).expect("a ticket");
        line.split_whitespace().nth(1).unwrap().to_string()
    };
    let (mut host, banner, log) = start_with_banner(service()).await;
    let ticket = ticket_of(&banner);
    let mut c = Client::start(&rig.dev, &[&ticket]);
    let sid = converse(&mut c).await;
    stream_until(&mut c, &sid, 10).await;
    signal(host.id().unwrap(), libc::SIGTERM);
    assert!(tokio::time::timeout(WAIT, host.wait()).await.unwrap().unwrap().success());
    assert!(log.finished().await.contains("session kept for the bridge's restart"));

    let (_again, banner, log) = start_with_banner(service()).await;
    assert_eq!(ticket_of(&banner), ticket, "the same identity and port, the same ticket");
    let note = taken_back(&mut c).await;
    assert_eq!(note["params"]["sessions"], json!([{"sessionId": sid, "how": "resume"}]), "{note}");
    let (_, said) = prompt(&mut c, 5, &sid, "fourth").await;
    assert_eq!(said, "turn 3: fourth (history: first|second)");
    log.wait_for("session taken back after the restart").await;
    assert!(log.contains("agent{name=sdk}"), "the host's log names the agent:\n{}", log.text());
}

/// 16 000 lines of ~1 KiB through a `cat` agent and `connect`, the bridge
/// stopped and started again halfway (its journals compacted many times over
/// by then, and lines sent while it is down): every line arrives once and in
/// order, and the client is told of the restart once, between the halves.
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_of_lines_survives_a_restart_of_the_bridge_exactly_once() {
    const HALF: usize = 8000;
    let relay = LocalRelay::start().await;
    let tb = Tb::new(Some(&relay));
    let dev = Tb::new(Some(&relay));
    tb.allow(&dev.node_id("acp").await).await;
    let agent = [test_agent_bin().display().to_string(), "cat".into()];
    let agent: Vec<&str> = agent.iter().map(String::as_str).collect();
    let mut bridge = tb.bridge("acp", &[], &agent).await;
    let (mut child, log) = dev.connect(&[&bridge.ticket]);
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let batch = |from: usize| -> Vec<u8> {
        let pad = "x".repeat(1000);
        (from..from + HALF)
            .flat_map(|n| {
                format!(
                    "{{\"jsonrpc\":\"2.0\",\"method\":\"n\",\"params\":{{\"n\":{n},\"pad\":\"{pad}\"}}}}\n"
                )
                .into_bytes()
            })
            .collect()
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
    let reader = tokio::spawn(async move {
        let (mut next, mut restored) = (0usize, 0usize);
        while let Some(line) = lines.next_line().await.unwrap() {
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["method"] == restart::METHOD_RESTORED {
                assert_eq!(next, HALF, "told of the restart between the halves");
                restored += 1;
                continue;
            }
            assert_eq!(v["params"]["n"], next, "line {next} lost, repeated or out of order");
            next += 1;
            let _ = tx.send(next);
        }
        (next, restored)
    });
    stdin.write_all(&batch(0)).await.unwrap();
    while tokio::time::timeout(WAIT, rx.recv()).await.unwrap().unwrap() < HALF {}
    bridge.terminate().await;
    let journal = tb.home().join("iroh/sessions");
    let kept: Vec<_> = std::fs::read_dir(&journal).unwrap().flatten().collect();
    assert_eq!(kept.len(), 1, "one journal kept");
    // 8.5 MB went through it each way: compacted, it holds what the client had not acknowledged.
    let len = kept[0].metadata().unwrap().len();
    assert!(len < 5 << 20, "the journal was not compacted: {len} bytes");
    // Written while the bridge is away: held by connect, delivered after the restart.
    let rest = batch(HALF);
    let second = tokio::spawn(async move {
        stdin.write_all(&rest).await.unwrap();
        stdin
    });
    let bridge = tb.bridge("acp", &[], &agent).await;
    let stdin = tokio::time::timeout(WAIT, second).await.unwrap().unwrap();
    while tokio::time::timeout(WAIT, rx.recv()).await.unwrap().unwrap() < 2 * HALF {}
    drop(stdin);
    let (n, restored) = tokio::time::timeout(WAIT, reader).await.unwrap().unwrap();
    assert_eq!((n, restored), (2 * HALF, 1));
    assert!(tokio::time::timeout(WAIT, child.wait()).await.unwrap().unwrap().success(), "{}", log.text());
    bridge.log.wait_for("session ended").await;
    assert_eq!(std::fs::read_dir(&journal).unwrap().count(), 0, "the ended session's journal is gone");
    bridge.stop().await;
    relay.stop().await;
}

/// With relays disabled a ticket carries only direct addresses: the restarted
/// bridge binds the port it had, so the ticket it printed before (and the
/// client holding it) reaches it again.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_bridge_keeps_its_port_so_the_old_ticket_reaches_it_without_a_relay() {
    let tb = Tb::new(None);
    let dev = Tb::new(None);
    tb.allow(&dev.node_id("acp").await).await;
    let agent = [test_agent_bin().display().to_string(), "cat".into()];
    let agent: Vec<&str> = agent.iter().map(String::as_str).collect();
    let mut bridge = tb.bridge("acp", &[], &agent).await;
    let mut c = Client::start(&dev, &[&bridge.ticket]);
    c.send(json!({"jsonrpc": "2.0", "method": "n", "params": {"n": 1}})).await;
    assert_eq!(c.next().await["params"]["n"], 1);
    bridge.terminate().await;
    let again = tb.bridge("acp", &[], &agent).await;
    assert_eq!(again.ticket, bridge.ticket, "the same port, the same ticket");
    c.send(json!({"jsonrpc": "2.0", "method": "n", "params": {"n": 2}})).await;
    assert_eq!(c.next().await["method"], restart::METHOD_RESTORED);
    assert_eq!(c.next().await["params"]["n"], 2, "the same session, through the old ticket's direct address");
    drop(c.stdin.take());
    assert!(tokio::time::timeout(WAIT, c.child.wait()).await.unwrap().unwrap().success());
    again.stop().await;
}

/// The same with the default binding (every interface, as a user runs it;
/// no `THUNDERBOLT_IROH_BIND`): with relays disabled the ports are kept too,
/// so a ticket saved before the restart still reaches the bridge.
#[tokio::test(flavor = "multi_thread")]
async fn a_relay_free_bridge_on_the_default_binding_keeps_its_ports_so_a_saved_ticket_connects() {
    let tb = Tb::new(None);
    let dev = Tb::new(None);
    tb.allow(&dev.node_id("acp").await).await;
    let start = || {
        let mut c = tb.cmd();
        c.env_remove("THUNDERBOLT_IROH_BIND");
        c.args(["acp", "--transport", "iroh", "--"]).arg(test_agent_bin()).arg("cat");
        RunningBridge::start(c)
    };
    let first = start().await;
    let saved = first.ticket.clone();
    let ports = std::fs::read_to_string(tb.home().join("iroh/ports.json")).unwrap();
    assert!(ports.contains(&first.node_id.to_string()) && ports.contains("\"v4\""), "{ports}");
    first.stop().await;
    let again = start().await;
    assert_eq!(again.ticket, saved, "the same ports, the same ticket");
    let mut c = Client::start(&dev, &[&saved]);
    c.send(json!({"jsonrpc": "2.0", "method": "n", "params": {"n": 1}})).await;
    assert_eq!(c.next().await["params"]["n"], 1, "the saved ticket reached the restarted bridge");
    drop(c.stdin.take());
    assert!(tokio::time::timeout(WAIT, c.child.wait()).await.unwrap().unwrap().success());
    again.stop().await;
}

/// A journal as the bridge writes it (`bridge/src/journal/record.rs`): its
/// header, then `runs` output records of the agent's lines, then a stop.
fn planted_journal(path: &std::path::Path, node: &str, owner: &str, runs: &[Vec<u8>]) {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let name = path.file_stem().unwrap().to_string_lossy();
    let header = json!({
        "journal": 1, "token_sha256": format!("{name:0>64}"), "node": node, "owner": owner,
        "agent": "", "protocol": "acp", "created_ms": 0,
    });
    let file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).unwrap();
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    writeln!(w, "{header}").unwrap();
    for run in runs {
        let frames = run.iter().filter(|b| **b == b'\n').count();
        writeln!(w, "!{{\"out\":{frames},\"len\":{}}}", run.len()).unwrap();
        w.write_all(run).unwrap();
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    writeln!(w, "!{{\"stop\":{now}}}").unwrap();
    w.flush().unwrap();
}

/// The bridge's home's journals folder, made as the bridge makes it.
fn sessions_dir(tb: &Tb) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = tb.home().join("iroh/sessions");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// Journals no agent served here takes back (another bridge's NodeId, as
/// another protocol's bridge on the same home leaves them) are removed once no
/// grace can still run, and kept while one may: a start no longer reads a
/// pile of them forever.
#[tokio::test(flavor = "multi_thread")]
async fn a_start_removes_orphan_journals_past_any_grace_and_keeps_those_within_it() {
    let tb = Tb::new(None);
    let dir = sessions_dir(&tb);
    let other = iroh::SecretKey::from_bytes(&[3u8; 32]).public().to_string();
    let owner = iroh::SecretKey::from_bytes(&[4u8; 32]).public().to_string();
    let run = vec![b"{\"a\":1}\n".to_vec()];
    let day = std::time::Duration::from_secs(24 * 3600);
    let mut planted = Vec::new();
    for (name, ago) in [("0a", 8 * day), ("0b", 8 * day), ("0c", day / 24)] {
        let path = dir.join(format!("{name}.journal"));
        planted_journal(&path, &other, &owner, &run);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_modified(std::time::SystemTime::now() - ago).unwrap();
        planted.push(path);
    }
    let agent = [test_agent_bin().display().to_string(), "cat".into()];
    let agent: Vec<&str> = agent.iter().map(String::as_str).collect();
    let bridge = tb.bridge("acp", &[], &agent).await;
    bridge.log.wait_for("removed 2 session journal(s) of other bridges or of agents not served here").await;
    assert!(!planted[0].exists() && !planted[1].exists(), "week-old orphans are removed");
    assert!(planted[2].exists(), "an hour-old orphan waits for its bridge");
    bridge.stop().await;
}

/// A journal far larger than the resume buffer (a client away while its agent
/// wrote 200 MiB) is read record by record at the start, keeping the newest
/// output within `--resume-buffer`: before, it was read whole (the bridge's
/// peak memory was twice the file) and all of its output kept.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_journal_is_taken_back_within_the_resume_buffer_and_never_read_whole() {
    let tb = Tb::new(None);
    let owner = iroh::SecretKey::from_bytes(&[5u8; 32]).public();
    tb.allow(&owner).await;
    let node = tb.node_id("acp").await.to_string();
    // 200 runs of 1 MiB, 1 KiB lines, numbered.
    let line = |n: usize| {
        let mut l = format!("{{\"n\":{n:08},\"pad\":\"").into_bytes();
        l.resize(1021, b'x');
        l.extend_from_slice(b"\"}\n");
        l
    };
    let runs: Vec<Vec<u8>> = (0..200).map(|r| (r * 1024..(r + 1) * 1024).flat_map(line).collect()).collect();
    let path = sessions_dir(&tb).join("0d.journal");
    planted_journal(&path, &node, &owner.to_string(), &runs);
    drop(runs);
    assert!(std::fs::metadata(&path).unwrap().len() > 200 << 20);

    let agent = [test_agent_bin().display().to_string(), "cat".into()];
    let agent: Vec<&str> = agent.iter().map(String::as_str).collect();
    let bridge = tb.bridge("acp", &["--resume-buffer", "8M"], &agent).await;
    bridge.log.wait_for("taking back a session after the restart").await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", bridge.pid())).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(
        peak_kib < 96 * 1024,
        "the bridge's peak memory was {} MiB reading a 200 MiB journal",
        peak_kib / 1024
    );
    // Frames kept: at most the buffer's worth of 1 KiB lines, and the log says what was not.
    let log = bridge.log.text();
    let kept: u64 = log
        .split("taking back a session after the restart: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(kept > 0 && kept <= 8 * 1024, "{kept} frames kept: {log}");
    assert!(log.contains("cannot take the session back (its resume is refused as stale)"), "{log}");
    bridge.stop().await;
}

/// A session keeps its id across a restart of the bridge: a device joins or
/// kicks it by the id it listed before. The id is random, not the first
/// digits of the session's secret token (nor of its hash, the journal's name).
#[tokio::test(flavor = "multi_thread")]
async fn a_session_keeps_its_random_id_across_a_restart_of_the_bridge() {
    let relay = LocalRelay::start().await;
    let tb = Tb::new(Some(&relay));
    let dev = Tb::new(Some(&relay));
    let agent = [test_agent_bin().display().to_string(), "cat".into()];
    let agent: Vec<&str> = agent.iter().map(String::as_str).collect();
    let mut bridge = tb.bridge("acp", &[], &agent).await;
    // Paired with a name: the session is listed by it, before and after.
    let out = tb.run(&["iroh", "pair", "--json", "--name", "Phone"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let code: Value = serde_json::from_slice(&out.stdout).unwrap();
    let out = dev.run(&["acp", "connect", "--pair", code["code"].as_str().unwrap(), &bridge.ticket]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed = |bridge: &RunningBridge| {
        let ticket = bridge.ticket.clone();
        let dev = &dev;
        async move {
            let out = dev.run(&["sessions", &ticket, "--json"]).await;
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            v["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    format!(
                        "{} by {}",
                        s["id"].as_str().unwrap(),
                        s["startedBy"]["name"].as_str().unwrap_or("?")
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    let mut c = JsonConnect::start(&dev, &[&bridge.ticket]);
    c.send(json!({"jsonrpc": "2.0", "method": "note", "params": {"n": 1}})).await;
    c.until(|v| v["params"]["n"] == 1).await;
    let before = listed(&bridge).await;
    assert_eq!(before.len(), 1, "{before:?}");
    assert!(before[0].ends_with(" by Phone"), "{before:?}");
    bridge.terminate().await;
    let journals: Vec<String> = std::fs::read_dir(tb.home().join("iroh/sessions"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(journals.len(), 1);
    let id = before[0].split(' ').next().unwrap();
    assert!(!journals[0].starts_with(id), "the id is the journal's name: {journals:?} {before:?}");

    let bridge = tb.bridge("acp", &[], &agent).await;
    c.log.wait_for("the bridge restarted and took the session back").await;
    c.send(json!({"jsonrpc": "2.0", "method": "note", "params": {"n": 2}})).await;
    c.until(|v| v["params"]["n"] == 2).await;
    assert_eq!(listed(&bridge).await, before, "the same session, the same id, its device named");
    drop(c);
    bridge.stop().await;
}

/// A device that joined the session and controls it opens an ACP session of
/// its own: the session's journal keeps it with the first device's, and
/// after a restart of the bridge both are taken back.
#[tokio::test(flavor = "multi_thread")]
async fn an_acp_session_a_joined_controller_opened_is_taken_back_after_a_restart() {
    let Some(rig) = Rig::new("resume").await else { return };
    let mut bridge = rig.bridge().await;
    let mut c = Client::start(&rig.dev, &[&bridge.ticket]);
    let sid = converse(&mut c).await;
    // A second connection of the device joins the session and takes control.
    let out = rig.dev.run(&["sessions", &bridge.ticket, "--json"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = listed["sessions"][0]["id"].as_str().unwrap().to_string();
    let mut j = Client::start(&rig.dev, &["--attach", &id, "--history", "now", &bridge.ticket]);
    j.until(|v| v["method"] == thunderbolt_shared::devices::METHOD_ROLE).await;
    let new = j.request(100, "session/new", json!({"cwd": "/tmp", "mcpServers": []})).await;
    let sid2 = new["result"]["sessionId"].as_str().expect("a session id").to_string();
    assert_ne!(sid, sid2);

    bridge.terminate().await;
    c.log.wait_for("the bridge is restarting and keeps the session").await;
    drop(j);
    let bridge = rig.bridge().await;
    let note = c.until(|v| v["method"] == restart::METHOD_RESTORED).await;
    let taken: Vec<&str> = note["params"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["sessionId"].as_str())
        .collect();
    assert!(taken.contains(&sid.as_str()) && taken.contains(&sid2.as_str()), "{note}");
    assert!(rig.calls().contains(&format!("resume {sid2}")), "{}", rig.calls());
    drop(c);
    bridge.stop().await;
    rig.relay.stop().await;
}

/// A request the device's scope refused never reached the agent: after a
/// restart it is not one "in flight" (answered a second time: the journal
/// saw the refusal go out as its answer), nor replayed, and the session is
/// taken back as it was.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_its_scope_refused_is_not_answered_again_after_a_restart() {
    let Some(rig) = Rig::new("resume").await else { return };
    let mut bridge = rig.bridge().await;
    let mut c = Client::start(&rig.dev, &[&bridge.ticket]);
    let sid = converse(&mut c).await;
    let id = rig.dev.node_id("acp").await.to_string();
    let out = rig.tb.run(&["devices", "scope", &id, "--scope", "observe"]).await;
    assert!(out.status.success(), "{out:?}");
    bridge.log.wait_for("scope is observe now").await;
    let params = json!({"sessionId": sid, "prompt": [{"type": "text", "text": "not yours to ask"}]});
    c.send(json!({"jsonrpc": "2.0", "id": 9, "method": "session/prompt", "params": params})).await;
    let refused = c.response(&json!(9)).await;
    assert_eq!(refused["error"]["code"], -32005, "{refused}");

    let status = bridge.terminate().await;
    assert!(status.success(), "the bridge exits cleanly: {status:?}");
    c.log.wait_for("the bridge is restarting and keeps the session").await;
    let bridge = rig.bridge().await;
    let note = loop {
        let v = c.next().await;
        assert_ne!(v["id"], json!(9), "request 9 answered a second time: {v}");
        if v["method"] == restart::METHOD_RESTORED {
            break v;
        }
    };
    assert_eq!(note["params"]["aborted"], json!([]), "{note}");
    assert_eq!(note["params"]["sessions"], json!([{"sessionId": sid, "how": "resume"}]), "{note}");
    assert!(!rig.calls().contains("not yours to ask"), "the refused prompt reached an agent");
    bridge.stop().await;
    rig.relay.stop().await;
}
