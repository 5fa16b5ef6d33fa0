//! `thunderbolt host`: every agent of `agents.d` in one process. Real host
//! processes, real agents, real QUIC on loopback; clients are `connect` and
//! in-process endpoints.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use iroh::EndpointId;
use serde_json::Value;
use thunderbolt_shared::{close, EndpointTicket, Protocol};
use thunderbolt_tests::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// One agent as the host's banner lists it.
#[derive(Debug, Clone)]
struct Listed {
    name: String,
    id: EndpointId,
    ticket: String,
}

/// A running `thunderbolt host`.
struct RunningHost {
    child: tokio::process::Child,
    banner: String,
    log: Log,
    agents: Vec<Listed>,
}

impl RunningHost {
    async fn start(home: &Tb, extra: &[&str]) -> Self {
        let mut c = home.cmd();
        c.arg("host").args(extra);
        let (child, banner, log) = start_with_banner(c).await;
        Self::parse(child, banner, log)
    }

    /// A host started by the caller, its banner read.
    fn parse(child: tokio::process::Child, banner: String, log: Log) -> Self {
        let mut agents = Vec::new();
        let mut lines = banner.lines().peekable();
        while let Some(line) = lines.next() {
            let t = line.trim();
            let agent_line = lines.peek().is_some_and(|next| next.trim_start().starts_with("NodeId:"));
            if agent_line {
                let name = t.split(' ').next().unwrap().to_string();
                let id = lines.next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
                let ticket = lines.next().unwrap().split_whitespace().nth(1).unwrap().to_string();
                agents.push(Listed { name, id, ticket });
            }
        }
        Self { child, banner, log, agents }
    }

    fn agent(&self, name: &str) -> &Listed {
        self.agents
            .iter()
            .find(|a| a.name == name)
            .unwrap_or_else(|| panic!("{name} not served:\n{}", self.banner))
    }

    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            signal(pid, libc::SIGTERM);
        }
        tokio::time::timeout(WAIT, self.child.wait()).await.expect("host exits").expect("wait");
    }
}

/// The home's `agents.d`, created 0700.
fn agents_dir(home: &Tb) -> PathBuf {
    let d = home.home().join("agents.d");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

fn write_manifest(dir: &Path, file: &str, json: &str, mode: u32) -> PathBuf {
    let p = dir.join(file);
    // Written beside and renamed in, as editors save: the host never reads half a file.
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, json).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    p
}

fn cat(name: &str, extra: &str) -> String {
    format!(r#"{{"name":"{name}","command":["{}","cat"]{extra}}}"#, test_agent_bin().display())
}

/// `thunderbolt <protocol> connect <ticket>` from `client`, one line in, its output.
async fn exchange(client: &Tb, protocol: &str, ticket: &str, line: &str) -> std::process::Output {
    let mut c = client.cmd();
    c.args([protocol, "connect", ticket]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(line.as_bytes()).await.unwrap();
    drop(stdin);
    tokio::time::timeout(WAIT, child.wait_with_output()).await.unwrap().unwrap()
}

/// A host home with a client home allowed in its allow file.
async fn homes() -> (Tb, Tb) {
    init_tracing();
    let host = Tb::new(None);
    let client = Tb::new(None);
    host.allow(&client.node_id("acp").await).await;
    (host, client)
}

#[tokio::test(flavor = "multi_thread")]
async fn manifests_are_read_strictly_each_refusal_names_its_reason_and_the_rest_serve() {
    let (host, client) = homes().await;
    let dir = agents_dir(&host);
    let agent = test_agent_bin().display().to_string();
    let cases: Vec<(&str, String, u32, &str)> = vec![
        ("unknown.json", cat("unknown", r#","colour":"red""#), 0o600, "unknown field `colour`"),
        ("nested.json", cat("nested", r#","resume":{"grace":1,"x":2}"#), 0o600, "unknown field `resume.x`"),
        (
            "shell.json",
            format!(r#"{{"name":"shell","command":"{agent} cat"}}"#),
            0o600,
            "\"command\" is a string",
        ),
        (
            "badname.json",
            format!(r#"{{"name":"Bad_Name","command":["{agent}"]}}"#),
            0o600,
            "\"name\" 'Bad_Name'",
        ),
        (
            "env.json",
            cat("env", r#","env":{"A":1}"#),
            0o600,
            "\"env\" must be an object whose values are strings",
        ),
        (
            "type.json",
            cat("type", r#","max_sessions":"2""#),
            0o600,
            "\"max_sessions\" must be a whole number",
        ),
        (
            "missing.json",
            r#"{"name":"missing","command":["no-such-agent-anywhere"]}"#.into(),
            0o600,
            "not found on PATH",
        ),
        ("loose.json", cat("loose", ""), 0o666, "writable by others"),
        ("group.json", cat("group", ""), 0o620, "writable by its group"),
    ];
    for (file, json, mode, _) in &cases {
        write_manifest(&dir, file, json, *mode);
    }
    // One owned by someone else.
    let foreign = write_manifest(&dir, "foreign.json", &cat("foreign", ""), 0o644);
    let chowned = std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).is_ok();
    write_manifest(&dir, "good.json", &cat("good", r#","label":"Good one""#), 0o600);
    // Secrets readable by others: served, with a warning naming the file.
    write_manifest(&dir, "secret.json", &cat("secret", r#","env":{"MY_TOKEN":"s3cret"}"#), 0o644);

    let h = RunningHost::start(&host, &[]).await;
    assert_eq!(
        h.agents.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(),
        ["good", "secret"],
        "{}",
        h.banner
    );
    for (file, _, _, why) in &cases {
        let line =
            h.banner.lines().find(|l| l.contains(file)).unwrap_or_else(|| panic!("{file}:\n{}", h.banner));
        assert!(line.contains("Refused:") && line.contains(why), "{file}: {line}");
        h.log.wait_for(&format!("skipping {}", dir.join(file).display())).await;
    }
    if chowned {
        assert!(h.banner.contains("foreign.json: it is owned by uid 65534"), "{}", h.banner);
    }
    h.log.wait_for("secret.json sets env values and is readable by others").await;
    let out = exchange(&client, "acp", &h.agent("good").ticket, "{\"good\":1}\n").await;
    assert_eq!(out.stdout, b"{\"good\":1}\n", "{}", String::from_utf8_lossy(&out.stderr));

    // `agents check` says the same, and prints what would run (secrets masked).
    for (file, _, _, why) in &cases {
        let out = host.run(&["agents", "check", &dir.join(file).display().to_string()]).await;
        assert_eq!(out.status.code(), Some(1), "{file}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{file}: {err}");
    }
    let out = host.run(&["agents", "check", &dir.join("secret.json").display().to_string()]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(&format!("runs:  {agent} cat")), "{text}");
    assert!(text.contains("env:   MY_TOKEN=***") && !text.contains("s3cret"), "{text}");
    let out = host.run(&["agents", "list", "--json"]).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> =
        v["agents"].as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["good", "secret"]);
    assert_eq!(v["agents"][0]["label"], "Good one");
    assert_eq!(v["agents"][0]["nodeId"], h.agent("good").id.to_string());
    assert_eq!(v["refused"].as_array().unwrap().len(), cases.len() + chowned as usize);
    // The running host's own ticket (relays are disabled here: the only kind that reaches it),
    // as a new user would take it from the list.
    assert_eq!(v["agents"][0]["ticketFrom"], "the running host");
    let listed = v["agents"][0]["ticket"].as_str().unwrap();
    let out = exchange(&client, "acp", listed, "{\"listed\":1}\n").await;
    assert_eq!(out.stdout, b"{\"listed\":1}\n", "{}", String::from_utf8_lossy(&out.stderr));
    h.stop().await;
    // No host: the ticket from the configuration, and why it cannot reach anything.
    let out = host.run(&["agents", "list"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("this ticket carries no address: relays are disabled and no host serves"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_folder_writable_by_others_refuses_every_manifest() {
    let (host, _client) = homes().await;
    let dir = agents_dir(&host);
    write_manifest(&dir, "good.json", &cat("good", ""), 0o600);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let h = RunningHost::start(&host, &[]).await;
    assert!(h.agents.is_empty(), "{}", h.banner);
    assert!(
        h.banner.contains("its folder is refused") && h.banner.contains("writable by others"),
        "{}",
        h.banner
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_manifest_serves_within_two_seconds_and_a_removed_one_ends_its_sessions() {
    let (host, client) = homes().await;
    let dir = agents_dir(&host);
    let h = RunningHost::start(&host, &[]).await;
    assert!(h.banner.contains("serving 0 agent(s)"), "{}", h.banner);
    let written = Instant::now();
    let file = write_manifest(&dir, "late.json", &cat("late", ""), 0o600);
    h.log.wait_for("now serving late").await;
    let took = written.elapsed();
    assert!(took < Duration::from_secs(2), "served {took:?} after the file appeared");
    let line = h.log.text().lines().find(|l| l.contains("now serving late")).unwrap().to_string();
    let ticket = line.split("ticket ").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
    // A live session, then the file goes: the session ends with a reason of its own.
    let mut c = client.cmd();
    c.args(["acp", "connect", &ticket]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"{\"live\":1}\n").await.unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(
        tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap().as_deref(),
        Some("{\"live\":1}")
    );
    std::fs::remove_file(&file).unwrap();
    h.log.wait_for("manifest removed: no longer serving late").await;
    let out = tokio::time::timeout(WAIT, child.wait_with_output()).await.unwrap().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(close::REASON_AGENT_REMOVED), "{err}");
    drop(stdin);
    // And nothing answers there any more.
    let out = client.run(&["acp", "connect", "--dial-timeout", "3", &ticket]).await;
    assert!(!out.status.success());
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_agents_answer_by_their_tickets_their_node_ids_survive_a_restart_and_old_identities_are_kept() {
    let (host, client) = homes().await;
    let dir = agents_dir(&host);
    // The single-agent bridge's ACP identity, paired before the host existed.
    let paired = host.node_id("acp").await;
    write_manifest(&dir, "a.json", &cat("coder", r#","label":"Coder""#), 0o600);
    write_manifest(&dir, "m.json", &cat("files", r#","protocol":"mcp""#), 0o600);
    write_manifest(&dir, "old.json", &cat("old", r#","identity":"acp""#), 0o600);
    let h = RunningHost::start(&host, &[]).await;
    assert_eq!(h.agent("old").id, paired, "an agent on the old identity keeps its NodeId");
    assert_ne!(h.agent("coder").id, h.agent("files").id);
    let out = exchange(&client, "acp", &h.agent("coder").ticket, "{\"to\":\"coder\"}\n").await;
    assert_eq!(out.stdout, b"{\"to\":\"coder\"}\n", "{}", String::from_utf8_lossy(&out.stderr));
    let out = exchange(&client, "mcp", &h.agent("files").ticket, "{\"to\":\"files\"}\n").await;
    assert_eq!(out.stdout, b"{\"to\":\"files\"}\n", "{}", String::from_utf8_lossy(&out.stderr));
    // The MCP agent does not speak ACP.
    let out = exchange(&client, "acp", &h.agent("files").ticket, "{}\n").await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not serve acp"));
    let ids: Vec<(String, EndpointId)> = h.agents.iter().map(|a| (a.name.clone(), a.id)).collect();
    h.log.wait_for("agent{name=coder}: session ended").await;
    h.stop().await;
    let again = RunningHost::start(&host, &[]).await;
    for (name, id) in ids {
        assert_eq!(again.agent(&name).id, id, "{name}'s NodeId changed across a restart");
    }
    let identity = host.home().join("iroh").join("identity-agent-coder");
    assert_eq!(std::fs::metadata(&identity).unwrap().permissions().mode() & 0o777, 0o600);
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn accept_from_lets_a_peer_reach_one_agent_and_not_another() {
    let (host, _allowed) = homes().await;
    let dir = agents_dir(&host);
    let work = tempfile::tempdir().unwrap();
    let stranger = Tb::new(None);
    let sid = stranger.node_id("acp").await;
    let pid_file = work.path().join("own.pid");
    write_manifest(&dir, "open.json", &cat("open", &format!(r#","accept_from":["{sid}"]"#)), 0o600);
    let own = format!(
        r#"{{"name":"own","command":["{}","--pid-file","{}","cat"]}}"#,
        test_agent_bin().display(),
        pid_file.display()
    );
    write_manifest(&dir, "own.json", &own, 0o600);
    let h = RunningHost::start(&host, &[]).await;
    let out = exchange(&stranger, "acp", &h.agent("open").ticket, "{\"in\":1}\n").await;
    assert_eq!(out.stdout, b"{\"in\":1}\n", "{}", String::from_utf8_lossy(&out.stderr));
    h.log.wait_for("(the agent's accept_from)").await;
    let out = exchange(&stranger, "acp", &h.agent("own").ticket, "{\"in\":1}\n").await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(close::REASON_NOT_ALLOWLISTED));
    h.log.wait_for("agent{name=own}: refused").await;
    assert!(!pid_file.exists(), "nothing was spawned for the refused peer");
    h.stop().await;
}

/// One line from `lines` as JSON (bounded).
async fn next_json(lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> Value {
    let line = tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap().expect("a line");
    serde_json::from_str(&line).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warm_agent_is_one_process_across_connections_ending_by_eof_sigterm_and_sigkill() {
    let (host, client) = homes().await;
    let dir = agents_dir(&host);
    let builtin = format!(
        r#"{{"name":"warm","command":["{}","acp","serve"],"keep_warm":60}}"#,
        thunderbolt_bin().display()
    );
    write_manifest(&dir, "warm.json", &builtin, 0o600);
    let h = RunningHost::start(&host, &[]).await;
    let ticket = h.agent("warm").ticket.clone();
    let connect = |extra: &[&str]| {
        let mut args = extra.to_vec();
        args.push(&ticket);
        let (mut child, log) = client.connect(&args);
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        (child, stdout, log)
    };
    let init =
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n";
    // 1: a session is made; the input ends (as acpx ends it): connect is done by itself.
    let (mut c1, mut out1, log1) = connect(&[]);
    let mut stdin = c1.stdin.take().unwrap();
    stdin.write_all(init.as_bytes()).await.unwrap();
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"session/new\",\"params\":{\"cwd\":\"/\",\"mcpServers\":[]}}\n")
        .await
        .unwrap();
    assert_eq!(next_json(&mut out1).await["id"], 1);
    let sid = next_json(&mut out1).await["result"]["sessionId"].as_str().unwrap().to_string();
    drop(stdin);
    let status = tokio::time::timeout(WAIT, c1.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{}", log1.text());
    assert!(log1.contains("the agent stays warm"), "{}", log1.text());
    let load = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"session/load\",\"params\":{{\"sessionId\":\"{sid}\",\"cwd\":\"/\",\"mcpServers\":[]}}}}\n"
    );
    // 2 (plain protocol) and 3 (resumable): session/load finds it; ended by SIGTERM, then SIGKILL.
    for (extra, sig) in [(&["--no-resume"][..], libc::SIGTERM), (&[][..], libc::SIGKILL)] {
        let (mut c, mut out, log) = connect(extra);
        let mut stdin = c.stdin.take().unwrap();
        stdin.write_all(init.as_bytes()).await.unwrap();
        stdin.write_all(load.as_bytes()).await.unwrap();
        assert_eq!(next_json(&mut out).await["id"], 1);
        let loaded = loop {
            let v = next_json(&mut out).await;
            if v["id"] == 3 {
                break v;
            }
        };
        assert!(loaded.get("error").is_none(), "session/load failed: {loaded}\n{}", log.text());
        let t0 = Instant::now();
        signal(c.id().unwrap(), sig);
        tokio::time::timeout(WAIT, c.wait()).await.unwrap().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(3), "connect took {:?} to go after {sig}", t0.elapsed());
        drop(stdin);
    }
    // One agent for all three.
    let (mut c4, mut out4, _log4) = connect(&[]);
    let mut stdin = c4.stdin.take().unwrap();
    stdin.write_all(init.as_bytes()).await.unwrap();
    stdin.write_all(load.as_bytes()).await.unwrap();
    next_json(&mut out4).await;
    let v = next_json(&mut out4).await;
    assert!(v.get("error").is_none(), "{v}");
    drop(stdin);
    tokio::time::timeout(WAIT, c4.wait()).await.unwrap().unwrap();
    let text = h.log.text();
    assert_eq!(text.matches("agent started").count(), 1, "one agent process:\n{text}");
    // Every line says which agent it is about (docs/host.md), and a client's own
    // close (the SIGTERM'd one) is never called a lost connection.
    let warm_lines: Vec<&str> =
        text.lines().filter(|l| l.contains("stays warm") || l.contains("the client finished")).collect();
    assert!(warm_lines.len() >= 2, "{text}");
    for line in warm_lines {
        assert!(line.contains("agent{name=warm}"), "no agent prefix: {line}");
    }
    assert!(!text.contains("client left (connection lost"), "{text}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_stop_ends_an_agent_nothing_is_attached_to() {
    let (host, client) = homes().await;
    let dir = agents_dir(&host);
    let work = tempfile::tempdir().unwrap();
    let pid_file = work.path().join("agent.pid");
    let m = format!(
        r#"{{"name":"idle","command":["{}","--pid-file","{}","cat"],"keep_warm":60,"idle_stop":1}}"#,
        test_agent_bin().display(),
        pid_file.display()
    );
    write_manifest(&dir, "idle.json", &m, 0o600);
    let h = RunningHost::start(&host, &[]).await;
    // Its input ended: the warm agent answers, then lets the client go.
    let out = exchange(&client, "acp", &h.agent("idle").ticket, "{\"x\":1}\n").await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, b"{\"x\":1}\n");
    let pid = agent_pid(&pid_file.display().to_string()).await;
    h.log.wait_for("nothing attached for 1s (idle_stop)").await;
    assert!(wait_pid_gone(pid).await, "the idle agent was stopped");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_at_one_agent_does_not_keep_another_agents_peer_out() {
    let (host, client) = homes().await;
    let dir = agents_dir(&host);
    write_manifest(&dir, "target.json", &cat("target", ""), 0o600);
    write_manifest(&dir, "other.json", &cat("other", ""), 0o600);
    // Every dial here comes from 127.0.0.1, one address's budget (as for a NAT
    // shared by everyone behind it): lifted, so what is shared is the rest of
    // the gate (the handshake cap) and the agent slots.
    let h = RunningHost::start(&host, &["--per-remote-max", "1000000"]).await;
    let target: EndpointTicket = h.agent("target").ticket.parse().unwrap();
    let other: EndpointTicket = h.agent("other").ticket.parse().unwrap();
    // Fresh identities dialing the target as fast as they can (bounded).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let addr = target.endpoint_addr().clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut dials = 0;
            while dials < 300 && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let ep = client_endpoint(iroh::SecretKey::generate(), None, false).await;
                let _ = tokio::time::timeout(
                    Duration::from_millis(500),
                    ep.connect(addr.clone(), &Protocol::acp().alpn()),
                )
                .await;
                ep.close().await;
                dials += 1;
            }
            dials
        })
    };
    let ep = client_endpoint(client.secret_key("acp").await, None, false).await;
    // The flood is under way before the first dial.
    h.log.wait_for_count("agent{name=target}: refused", 10).await;
    for i in 0..10 {
        let conn =
            tokio::time::timeout(WAIT, ep.connect(other.endpoint_addr().clone(), &Protocol::acp().alpn()))
                .await
                .unwrap_or_else(|_| panic!("dial {i} timed out"))
                .expect("the other agent's peer gets in");
        let (mut s, mut r) = conn.open_bi().await.unwrap();
        s.write_all(b"{}\n").await.unwrap();
        let mut buf = [0u8; 3];
        tokio::time::timeout(WAIT, r.read_exact(&mut buf)).await.unwrap().unwrap();
        conn.close(0u32.into(), b"client closed");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let dials = flood.await.unwrap();
    assert!(dials > 0);
    h.stop().await;
}

/// `iroh pair --json [extra]` in `home`: the code.
async fn mint_code(home: &Tb, extra: &[&str]) -> String {
    let mut args = vec!["iroh", "pair", "--json"];
    args.extend_from_slice(extra);
    let out = home.run(&args).await;
    assert!(out.status.success(), "iroh pair: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("pair JSON");
    v["code"].as_str().expect("a code").to_string()
}

/// `acp connect --pair CODE TICKET` from `device`, one line in: its output.
async fn pair_and_exchange(device: &Tb, code: &str, ticket: &str, line: &str) -> std::process::Output {
    let mut c = device.cmd();
    c.args(["acp", "connect", "--pair", code, ticket])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(line.as_bytes()).await.unwrap();
    drop(stdin);
    tokio::time::timeout(WAIT, child.wait_with_output()).await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_code_grants_exactly_its_agent_and_iroh_pair_pairs_with_the_agent_on_the_bridge_identity() {
    init_tracing();
    let host = Tb::new(None);
    let dir = agents_dir(&host);
    let someone = Tb::new(None).node_id("acp").await;
    // An agent for one guest only, one for your own devices, and one on the old bridge identity.
    write_manifest(&dir, "guest.json", &cat("guest", &format!(r#","accept_from":["{someone}"]"#)), 0o600);
    write_manifest(&dir, "main.json", &cat("main", ""), 0o600);
    write_manifest(&dir, "old.json", &cat("old", r#","identity":"acp""#), 0o600);
    let h = RunningHost::start(&host, &["--per-remote-max", "100"]).await;
    let allow_file = || std::fs::read_to_string(host.home().join("iroh/allowlist")).unwrap_or_default();

    // A code minted for the guest agent lets the device into it, and into nothing else.
    let phone = Tb::new(None);
    let code = mint_code(&host, &["--agent", "guest"]).await;
    let out = pair_and_exchange(&phone, &code, &h.agent("guest").ticket, "{\"to\":\"guest\"}\n").await;
    assert_eq!(out.stdout, b"{\"to\":\"guest\"}\n", "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!allow_file().contains(&phone.node_id("acp").await.to_string()), "paired with that agent only");
    let out = exchange(&phone, "acp", &h.agent("main").ticket, "{}\n").await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not allowlisted"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It keeps the agent it paired with.
    let out = exchange(&phone, "acp", &h.agent("guest").ticket, "{\"again\":1}\n").await;
    assert_eq!(out.stdout, b"{\"again\":1}\n", "{}", String::from_utf8_lossy(&out.stderr));

    // Plain `iroh pair` mints for the acp bridge, whose identity `old` took over: it pairs there,
    // and the device is one of your own (the allow file, as the bridge would have it).
    let laptop = Tb::new(None);
    let code = mint_code(&host, &[]).await;
    let out = pair_and_exchange(&laptop, &code, &h.agent("old").ticket, "{\"to\":\"old\"}\n").await;
    assert_eq!(out.stdout, b"{\"to\":\"old\"}\n", "{}", String::from_utf8_lossy(&out.stderr));
    assert!(allow_file().contains(&laptop.node_id("acp").await.to_string()));
    let out = exchange(&laptop, "acp", &h.agent("main").ticket, "{\"to\":\"main\"}\n").await;
    assert_eq!(out.stdout, b"{\"to\":\"main\"}\n", "{}", String::from_utf8_lossy(&out.stderr));

    // Denying the phone ends its pairing with the guest agent.
    let out = host.run(&["iroh", "deny", &phone.node_id("acp").await.to_string()]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("its pairing with guest"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = exchange(&phone, "acp", &h.agent("guest").ticket, "{}\n").await;
    assert!(!out.status.success(), "denied: {}", String::from_utf8_lossy(&out.stderr));
    h.stop().await;
}

/// `acp connect --pair CODE [--device-name NAME] TICKET` from `device`, one
/// line through the agent: the agent's echo and `connect`'s stderr.
async fn pair_at(device: &Tb, code: &str, name: &str, ticket: &str) -> (String, String) {
    let mut c = device.cmd();
    c.args(["acp", "connect", "--pair", code, "--device-name", name, ticket])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"{\"paired\":1}\n").await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(WAIT, child.wait_with_output()).await.unwrap().unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `iroh list --json`'s entry for `id` in `home`.
async fn listed_device(home: &Tb, id: &EndpointId) -> Value {
    let out = home.run(&["iroh", "list", "--json"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["nodeId"] == id.to_string())
        .unwrap_or_else(|| panic!("{id} not listed: {v}"))
        .clone()
}

/// One bare `iroh pair` while a host runs: one code, redeemed at any of
/// the agents that admit your own devices, lets the device into all of
/// them (and the answer names them all), not into an agent for a guest.
#[tokio::test(flavor = "multi_thread")]
async fn one_code_pairs_a_device_with_every_agent_of_the_host_that_admits_your_own_devices() {
    init_tracing();
    let host = Tb::new(None);
    let dir = agents_dir(&host);
    let someone = Tb::new(None).node_id("acp").await;
    for (name, label) in [("alpha", "Agent Alpha"), ("beta", "Agent Beta"), ("gamma", "Agent Gamma")] {
        write_manifest(&dir, &format!("{name}.json"), &cat(name, &format!(r#","label":"{label}""#)), 0o600);
    }
    write_manifest(&dir, "guest.json", &cat("guest", &format!(r#","accept_from":["{someone}"]"#)), 0o600);
    let h = RunningHost::start(&host, &["--per-remote-max", "100"]).await;

    let out = host.run(&["iroh", "pair", "--json"]).await;
    assert!(out.status.success(), "iroh pair: {}", String::from_utf8_lossy(&out.stderr));
    let minted: Value = serde_json::from_slice(&out.stdout).unwrap();
    let code = minted["code"].as_str().unwrap();
    let names: Vec<&str> =
        minted["agents"].as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["alpha", "beta", "gamma"], "the guest's agent is not in it: {minted}");
    for a in minted["agents"].as_array().unwrap() {
        assert_eq!(a["ticket"], h.agent(a["name"].as_str().unwrap()).ticket, "the running host's tickets");
    }
    assert_eq!(minted["bridgeRunning"], true);

    // Redeemed at the second agent, not the one the printed command dials.
    let phone = Tb::new(None);
    let phone_id = phone.node_id("acp").await;
    let (echo, log) = pair_at(&phone, code, "Phone", &h.agent("beta").ticket).await;
    assert_eq!(echo, "{\"paired\":1}\n", "{log}");
    // The answer told the device every agent, with its label and ticket.
    assert!(log.contains("may now reach 3 agent(s)"), "{log}");
    for (name, label) in [("alpha", "Agent Alpha"), ("beta", "Agent Beta"), ("gamma", "Agent Gamma")] {
        let line = format!("{name} ({label}): thunderbolt acp connect {}", h.agent(name).ticket);
        assert!(log.contains(&line), "want '{line}' in: {log}");
    }
    assert!(!log.contains("guest"), "{log}");

    // All three reached with no code; the guest's agent is not.
    for name in ["alpha", "beta", "gamma"] {
        let line = format!("{{\"to\":\"{name}\"}}\n");
        let out = exchange(&phone, "acp", &h.agent(name).ticket, &line).await;
        assert_eq!(String::from_utf8_lossy(&out.stdout), line, "{}", String::from_utf8_lossy(&out.stderr));
    }
    let out = exchange(&phone, "acp", &h.agent("guest").ticket, "{}\n").await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not allowlisted"));

    // `iroh list` names it, how it came and what it reaches.
    let d = listed_device(&host, &phone_id).await;
    assert_eq!(d["name"], "Phone", "{d}");
    assert_eq!(d["how"], "pairing", "{d}");
    assert_eq!(d["agents"], serde_json::json!(["alpha", "beta", "gamma"]), "{d}");
    let text = host.run(&["iroh", "list"]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    let line =
        text.lines().find(|l| l.starts_with(&phone_id.to_string())).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("Phone") && line.contains("paired with a code"), "{line}");
    assert!(line.contains("reaches alpha, beta, gamma;"), "{line}");

    // One code, one device.
    let (echo, log) = pair_at(&Tb::new(None), code, "Tablet", &h.agent("alpha").ticket).await;
    assert!(echo.is_empty() && log.contains(thunderbolt_shared::pairing::REASON_PAIR_SPENT), "{log}");

    // A code that gives a paired device nothing new (a second scan) leaves it for the next device.
    let again = mint_code(&host, &[]).await;
    let for_alpha = mint_code(&host, &["--agent", "alpha"]).await;
    for (code, at) in [(&again, "gamma"), (&for_alpha, "alpha")] {
        let (echo, log) = pair_at(&phone, code, "Phone", &h.agent(at).ticket).await;
        assert!(!echo.is_empty(), "{log}");
    }
    h.log.wait_for_count("holds all the code grants already", 2).await;
    for code in [&again, &for_alpha] {
        let (echo, log) = pair_at(&Tb::new(None), code, "Tablet", &h.agent("alpha").ticket).await;
        assert!(!echo.is_empty(), "unspent: {log}");
    }
    h.stop().await;
}

/// Pairing again (with other agents) keeps the device's name unless the
/// owner gives a new one; one code for some agents grants those, wherever
/// it is redeemed.
#[tokio::test(flavor = "multi_thread")]
async fn pairing_again_keeps_the_name_unless_a_new_one_is_given() {
    init_tracing();
    let host = Tb::new(None);
    let dir = agents_dir(&host);
    for name in ["one", "two", "three", "four"] {
        write_manifest(&dir, &format!("{name}.json"), &cat(name, ""), 0o600);
    }
    let h = RunningHost::start(&host, &["--per-remote-max", "100"]).await;
    let phone = Tb::new(None);
    let phone_id = phone.node_id("acp").await;
    let reaches = |name: &'static str| {
        let (phone, ticket) = (&phone, h.agent(name).ticket.clone());
        async move { exchange(phone, "acp", &ticket, "{}\n").await.status.success() }
    };

    let code = mint_code(&host, &["--agent", "one"]).await;
    let (echo, log) = pair_at(&phone, &code, "Phone", &h.agent("one").ticket).await;
    assert!(!echo.is_empty(), "{log}");
    assert_eq!(listed_device(&host, &phone_id).await["name"], "Phone");
    assert!(!reaches("two").await, "paired with `one` only");

    // A code for two agents, redeemed at the second, from a device that now calls itself otherwise.
    let code = mint_code(&host, &["--agent", "two", "--agent", "three"]).await;
    let (echo, log) = pair_at(&phone, &code, "Chrome on Linux", &h.agent("three").ticket).await;
    assert!(!echo.is_empty(), "{log}");
    assert!(log.contains("may now reach 3 agent(s)"), "{log}");
    let d = listed_device(&host, &phone_id).await;
    assert_eq!(d["name"], "Phone", "the name it had is kept: {d}");
    assert_eq!(d["agents"], serde_json::json!(["one", "three", "two"]), "by name: {d}");
    assert!(reaches("two").await && reaches("three").await && !reaches("four").await);

    // The owner's name wins.
    let code = mint_code(&host, &["--agent", "four", "--name", "Work phone"]).await;
    let (echo, log) = pair_at(&phone, &code, "Chrome on Linux", &h.agent("four").ticket).await;
    assert!(!echo.is_empty(), "{log}");
    assert_eq!(listed_device(&host, &phone_id).await["name"], "Work phone");
    assert!(reaches("four").await);
    h.stop().await;
}

/// Descriptors the process `pid` holds now.
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Polls (bounded by [`WAIT`]) until `pid` holds at most `max` descriptors; the count last seen.
async fn descriptors_at_most(pid: u32, max: usize) -> usize {
    let deadline = Instant::now() + WAIT;
    loop {
        let n = descriptors(pid);
        if n <= max || Instant::now() > deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls (bounded by [`WAIT`]) until `pid` holds at least `min` descriptors; the count last seen.
async fn descriptors_at_least(pid: u32, min: usize) -> usize {
    let deadline = Instant::now() + WAIT;
    loop {
        let n = descriptors(pid);
        if n >= min || Instant::now() > deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn removed_and_rekeyed_agents_release_their_descriptors_and_new_manifests_still_serve() {
    // What "back where it was" may differ by: iroh's per-process state settling.
    const SLACK: usize = 8;
    const AGENTS: usize = 30;
    const REKEYS: usize = 8;
    let (host, client) = homes().await;
    let dir = agents_dir(&host);
    let mut c = host.cmd();
    c.arg("host");
    // SAFETY: setrlimit only, in the child before exec.
    unsafe {
        c.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: 256, rlim_max: 256 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (child, banner, log) = start_with_banner(c).await;
    let h = RunningHost { child, banner, log, agents: Vec::new() };
    let pid = h.child.id().unwrap();
    let before = descriptors(pid);
    for i in 0..AGENTS {
        write_manifest(&dir, &format!("a{i}.json"), &cat(&format!("a{i}"), ""), 0o600);
    }
    h.log.wait_for_count("now serving a", AGENTS).await;
    // An endpoint's sockets may open a moment after it says it serves.
    let serving = descriptors_at_least(pid, before + AGENTS + 1).await;
    assert!(serving > before + AGENTS, "{AGENTS} endpoints hold descriptors: {before} -> {serving}");
    for i in 0..AGENTS {
        std::fs::remove_file(dir.join(format!("a{i}.json"))).unwrap();
    }
    h.log.wait_for_count("no longer served:", AGENTS).await;
    let after = descriptors_at_most(pid, before + SLACK).await;
    assert!(
        after <= before + SLACK,
        "descriptors: {before} at start, {serving} serving, {after} after removal"
    );
    eprintln!("descriptors: {before} at start, {serving} with {AGENTS} agents, {after} after removal");
    // Identity changes, each a new endpoint: the old one's descriptors go.
    write_manifest(&dir, "rk.json", &cat("rk", ""), 0o600);
    h.log.wait_for("now serving rk").await;
    let one = descriptors(pid);
    for i in 0..REKEYS {
        let identity = if i % 2 == 0 { r#","identity":"acp""# } else { r#","identity":"own""# };
        write_manifest(&dir, "rk.json", &cat("rk", identity), 0o600);
        h.log.wait_for_count("now serving rk", i + 2).await;
    }
    let rekeyed = descriptors_at_most(pid, one + SLACK).await;
    assert!(
        rekeyed <= one + SLACK,
        "descriptors: {one} with one agent, {rekeyed} after {REKEYS} identity changes"
    );
    eprintln!("descriptors: {one} with one agent, {rekeyed} after {REKEYS} identity changes");
    // And a new manifest still serves, and answers.
    write_manifest(&dir, "fresh.json", &cat("fresh", ""), 0o600);
    h.log.wait_for("now serving fresh").await;
    let line = h.log.text().lines().find(|l| l.contains("now serving fresh")).unwrap().to_string();
    let ticket = line.split("ticket ").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
    let out = exchange(&client, "acp", &ticket, "{\"fresh\":1}\n").await;
    assert_eq!(out.stdout, b"{\"fresh\":1}\n", "{}", String::from_utf8_lossy(&out.stderr));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_manifest_on_an_identity_already_used_is_refused_with_its_reason() {
    let (host, _client) = homes().await;
    let dir = agents_dir(&host);
    write_manifest(&dir, "a.json", &cat("first", r#","identity":"acp""#), 0o600);
    write_manifest(&dir, "b.json", &cat("second", r#","identity":"acp""#), 0o600);
    let h = RunningHost::start(&host, &[]).await;
    assert_eq!(h.agents.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["first"], "{}", h.banner);
    let line = h.banner.lines().find(|l| l.contains("b.json")).unwrap_or_else(|| panic!("{}", h.banner));
    assert!(line.contains("Refused:") && line.contains("is already used by"), "{line}");
    assert!(line.contains("one identity per manifest"), "{line}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_folder_renamed_away_and_back_removes_no_agent() {
    let (host, client) = homes().await;
    let dir = agents_dir(&host);
    write_manifest(&dir, "a.json", &cat("coder", ""), 0o600);
    let h = RunningHost::start(&host, &[]).await;
    let away = host.home().join("agents.d.away");
    std::fs::rename(&dir, &away).unwrap();
    h.log.wait_for("cannot be read").await;
    std::fs::rename(&away, &dir).unwrap();
    h.log.wait_for("can be read again").await;
    let out = exchange(&client, "acp", &h.agent("coder").ticket, "{\"still\":1}\n").await;
    assert_eq!(out.stdout, b"{\"still\":1}\n", "{}", String::from_utf8_lossy(&out.stderr));
    let text = h.log.text();
    assert!(!text.contains("manifest removed") && !text.contains("no longer served"), "{text}");
    h.stop().await;
}

/// Plants a FIFO at `path`, as another process (or user) able to write the folder could.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a plain syscall on a NUL-terminated path of ours.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "{}", std::io::Error::last_os_error());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fifo_in_agents_d_is_refused_and_the_host_starts_and_serves_the_others() {
    let (host, client) = homes().await;
    let dir = agents_dir(&host);
    write_manifest(&dir, "good.json", &cat("good", ""), 0o600);
    // A plain open of a FIFO waits for a writer forever: it kept the host from starting.
    let planted = dir.join("planted.json");
    mkfifo(&planted);
    let h = RunningHost::start(&host, &[]).await;
    assert_eq!(h.agents.iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), ["good"], "{}", h.banner);
    let line =
        h.banner.lines().find(|l| l.contains("planted.json")).unwrap_or_else(|| panic!("{}", h.banner));
    assert!(line.contains("Refused:") && line.contains("not a regular file but a FIFO"), "{line}");
    h.log.wait_for(&format!("skipping {}: not a regular file but a FIFO", planted.display())).await;
    let out = exchange(&client, "acp", &h.agent("good").ticket, "{\"good\":1}\n").await;
    assert_eq!(out.stdout, b"{\"good\":1}\n", "{}", String::from_utf8_lossy(&out.stderr));

    // One planted while the host runs: refused on the next look, the others still serve.
    let late = dir.join("late.json");
    mkfifo(&late);
    h.log.wait_for(&format!("skipping {}: not a regular file but a FIFO", late.display())).await;
    let out = exchange(&client, "acp", &h.agent("good").ticket, "{\"still\":1}\n").await;
    assert_eq!(out.stdout, b"{\"still\":1}\n", "{}", String::from_utf8_lossy(&out.stderr));
    // `agents check` says why, without waiting on the FIFO either.
    let out = host.run(&["agents", "check", &planted.display().to_string()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a regular file but a FIFO"));
    h.stop().await;
}

/// A device paired with one agent of the host is one of the owner's own
/// devices at that agent (the owner minted its code for it): it is not held to
/// a guest's share of the slots there, and it reaches no other agent.
#[tokio::test(flavor = "multi_thread")]
async fn a_device_paired_with_one_agent_holds_what_the_owners_devices_hold_there() {
    init_tracing();
    let host = Tb::new(None);
    let dir = agents_dir(&host);
    write_manifest(&dir, "main.json", &cat("main", ""), 0o600);
    let h = RunningHost::start(&host, &["--per-remote-max", "100"]).await;
    let phone = Tb::new(None);
    let code = mint_code(&host, &["--agent", "main"]).await;
    let ticket = h.agent("main").ticket.clone();
    let out = pair_and_exchange(&phone, &code, &ticket, "{\"n\":0}\n").await;
    assert_eq!(out.stdout, b"{\"n\":0}\n", "{}", String::from_utf8_lossy(&out.stderr));
    // More live sessions than a guest's share (the bridge's `MAX_SESSIONS_PER_GUEST`, 4), all at once.
    let mut live = Vec::new();
    for n in 1..=6u64 {
        let mut c = JsonConnect::start(&phone, &[&ticket]);
        c.send(serde_json::json!({ "n": n })).await;
        let back = c.next().await;
        assert_eq!(back["n"], n, "session {n} was not served: {}", c.log.text());
        live.push(c);
    }
    for c in live {
        let log = c.log.clone();
        assert!(c.close().await.success(), "{}", log.text());
    }
    h.stop().await;
}

/// `sessions --host` from `device` at `ticket`: the host's listing.
async fn host_listing(device: &Tb, ticket: &str) -> Value {
    let out = device.run(&["sessions", "--host", ticket, "--json"]).await;
    assert!(out.status.success(), "sessions --host: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Asks the host (at `ticket`) until its listing shows the session of
/// `agent` with `activity`: the wait is for the state asserted, bounded by `WAIT`.
async fn until_activity(device: &Tb, ticket: &str, agent: &str, activity: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let v = host_listing(device, ticket).await;
        let s = v["sessions"].as_array().unwrap().iter().find(|s| s["agent"] == agent).cloned();
        if s.as_ref().is_some_and(|s| s["activity"] == activity) {
            return v;
        }
        assert!(Instant::now() < deadline, "no {agent} session {activity} in time: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A device learns a host in one round trip: one listing at any of its
/// agents names every agent it reaches (labels, tickets, the host's name)
/// and the sessions of all of them it may join, each with what its agent is
/// doing (asking the person, working, idle); the sessions of a device the
/// owner merely listed, and the agents that do not admit it, stay out.
#[tokio::test(flavor = "multi_thread")]
async fn one_listing_names_every_agent_of_the_host_and_what_each_session_is_doing() {
    init_tracing();
    let host = Tb::new(None);
    let dir = agents_dir(&host);
    let someone = Tb::new(None).node_id("acp").await;
    let ask = format!(
        r#"{{"name":"alpha","label":"Agent Alpha","command":["{}","ask"]}}"#,
        test_agent_bin().display()
    );
    write_manifest(&dir, "alpha.json", &ask, 0o600);
    write_manifest(&dir, "beta.json", &cat("beta", r#","label":"Agent Beta""#), 0o600);
    write_manifest(&dir, "guest.json", &cat("guest", &format!(r#","accept_from":["{someone}"]"#)), 0o600);
    let mut c = host.cmd();
    c.arg("host").env("THUNDERBOLT_HOST_NAME", "workstation-T");
    let (child, banner, log) = start_with_banner(c).await;
    let h = RunningHost::parse(child, banner, log);

    // Two of the owner's own devices (one code each), and one the owner
    // only listed in the allow file.
    let (phone, tablet, listed) = (Tb::new(None), Tb::new(None), Tb::new(None));
    for (device, name) in [(&phone, "Phone"), (&tablet, "Tablet")] {
        let code = mint_code(&host, &[]).await;
        let (echo, log) = pair_at(device, &code, name, &h.agent("beta").ticket).await;
        assert!(!echo.is_empty(), "{log}");
    }
    host.allow(&listed.node_id("acp").await).await;

    // The phone at alpha (it asks its client something for each message),
    // the tablet and the listed device at beta.
    let mut on_alpha = JsonConnect::start(&phone, &[&h.agent("alpha").ticket]);
    let mut tablet_beta = JsonConnect::start(&tablet, &[&h.agent("beta").ticket]);
    let mut listed_beta = JsonConnect::start(&listed, &[&h.agent("beta").ticket]);
    for d in [&mut tablet_beta, &mut listed_beta] {
        d.send(serde_json::json!({"jsonrpc": "2.0", "method": "hi"})).await;
        d.until(|v| v["method"] == "hi").await;
    }
    on_alpha.send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "session/prompt"})).await;
    on_alpha.until(|v| v["id"] == "q1").await;

    // Asked at beta: both agents, and alpha's session needs an answer.
    let v = until_activity(&phone, &h.agent("beta").ticket, "alpha", "asking").await;
    assert_eq!(v["host"], "workstation-T", "{v}");
    let agents: Vec<(String, String, String)> = v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["name"].as_str().unwrap().into(),
                a["label"].as_str().unwrap().into(),
                a["ticket"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want: Vec<(String, String, String)> = [("alpha", "Agent Alpha"), ("beta", "Agent Beta")]
        .iter()
        .map(|(n, l)| (n.to_string(), l.to_string(), h.agent(n).ticket.clone()))
        .collect();
    assert_eq!(agents, want, "the guest's agent is not one the phone reaches: {v}");
    let sessions = v["sessions"].as_array().unwrap();
    let who: Vec<(&str, &str)> = sessions
        .iter()
        .map(|s| (s["agent"].as_str().unwrap(), s["startedBy"]["name"].as_str().unwrap_or("?")))
        .collect();
    assert_eq!(who.len(), 2, "the phone's own and the tablet's, not the listed device's: {v}");
    assert!(who.contains(&("alpha", "Phone")) && who.contains(&("beta", "Tablet")), "{v}");
    let beta = sessions.iter().find(|s| s["agent"] == "beta").unwrap();
    assert_eq!(beta["activity"], "idle", "{beta}");

    // Answered: the prompt is still in flight, so alpha's agent is working.
    on_alpha.send(serde_json::json!({"jsonrpc": "2.0", "id": "q1", "result": {}})).await;
    until_activity(&phone, &h.agent("alpha").ticket, "alpha", "working").await;

    // The listing of one agent is as it was: that agent's sessions, no agents.
    let out = phone.run(&["sessions", &h.agent("alpha").ticket, "--json"]).await;
    let one: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(one["sessions"].as_array().unwrap().len(), 1, "{one}");
    assert!(one.get("agents").is_none(), "{one}");
    // And in words.
    let out = phone.run(&["sessions", "--host", &h.agent("alpha").ticket]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("workstation-T: 2 agent(s) you reach"), "{text}");
    assert!(text.lines().any(|l| l.contains("  alpha  ") && l.contains("; working;")), "{text}");

    for d in [on_alpha, tablet_beta, listed_beta] {
        drop(d);
    }
    h.stop().await;
}

/// A manifest's `files` folder: devices' files land in the agent's
/// workspace (`<cwd>/<files>/<device>/<session>/`), 0600 in 0700 folders, not
/// in the home; a link planted where a folder goes is refused, not followed.
#[tokio::test(flavor = "multi_thread")]
async fn files_land_in_the_folder_the_manifest_names_inside_the_workspace() {
    let (host, client) = homes().await;
    let dir = agents_dir(&host);
    let work = tempfile::tempdir().unwrap();
    let m = format!(
        r#"{{"name":"notes","command":["{}","cat"],"cwd":"{}","files":"notes/inbox"}}"#,
        test_agent_bin().display(),
        work.path().display()
    );
    write_manifest(&dir, "notes.json", &m, 0o600);
    let h = RunningHost::start(&host, &[]).await;
    let ticket = h.agent("notes").ticket.clone();
    let photo = client.home().join("photo.jpg");
    std::fs::write(&photo, vec![7u8; 100_000]).unwrap();
    let put = |extra: &'static [&'static str]| {
        let mut c = client.cmd();
        c.args(["files", "put", &ticket]).arg(&photo).args(extra);
        async move { tokio::time::timeout(WAIT, c.output()).await.expect("put ends").unwrap() }
    };
    let device = client.node_id("acp").await.to_string();

    let out = put(&["--session", "s-1"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let landed = work.path().join("notes/inbox").join(&device).join("s-1/photo.jpg");
    assert_eq!(r["uri"].as_str().unwrap(), format!("file://{}", landed.display()));
    assert_eq!(std::fs::read(&landed).unwrap(), vec![7u8; 100_000]);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&landed), 0o600);
    for d in ["notes", "notes/inbox", &format!("notes/inbox/{device}")] {
        assert_eq!(mode(&work.path().join(d)), 0o700, "{d}");
    }
    assert!(!host.home().join("files").join("notes").exists(), "nothing in the home's files folder");

    // A link where a session's folder goes: refused, nothing written through it.
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), work.path().join("notes/inbox").join(&device).join("s-2"))
        .unwrap();
    let out = put(&["--session", "s-2"]).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("could not store the file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    h.stop().await;
}

/// A device of the owner's (the allow file) scoped to agent `build` by
/// `thunderbolt devices scope` reaches `build` only: `deploy` refuses it as
/// a stranger, at once and with no restart; `--all-agents` gives it back.
#[tokio::test(flavor = "multi_thread")]
async fn a_device_scoped_to_one_agent_reaches_no_other() {
    let (host, client) = homes().await;
    let dir = agents_dir(&host);
    write_manifest(&dir, "build.json", &cat("build", ""), 0o600);
    write_manifest(&dir, "deploy.json", &cat("deploy", ""), 0o600);
    let h = RunningHost::start(&host, &[]).await;
    let (build, deploy) = (h.agent("build").ticket.clone(), h.agent("deploy").ticket.clone());
    let out = exchange(&client, "acp", &deploy, "{\"in\":1}\n").await;
    assert_eq!(out.stdout, b"{\"in\":1}\n", "before: every agent: {}", String::from_utf8_lossy(&out.stderr));

    let id = client.node_id("acp").await.to_string();
    let out = host.run(&["devices", "scope", &id, "--agent", "build"]).await;
    assert!(out.status.success(), "devices scope: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("may now do: everything at build"), "{out:?}");
    let out = exchange(&client, "acp", &deploy, "{\"in\":2}\n").await;
    assert!(!out.status.success(), "deploy is out of its scope");
    assert!(String::from_utf8_lossy(&out.stderr).contains(close::REASON_NOT_ALLOWLISTED), "{out:?}");
    let out = exchange(&client, "acp", &build, "{\"in\":3}\n").await;
    assert_eq!(out.stdout, b"{\"in\":3}\n", "build is in it: {}", String::from_utf8_lossy(&out.stderr));
    let listed: Value = serde_json::from_slice(&host.run(&["iroh", "list", "--json"]).await.stdout).unwrap();
    let me =
        listed["devices"].as_array().unwrap().iter().find(|d| d["nodeId"] == id.as_str()).unwrap().clone();
    assert_eq!(me["scope"]["agents"], serde_json::json!(["build"]), "{me}");

    assert!(host.run(&["devices", "scope", &id, "--all-agents"]).await.status.success());
    let out = exchange(&client, "acp", &deploy, "{\"in\":4}\n").await;
    assert_eq!(out.stdout, b"{\"in\":4}\n", "every agent again: {}", String::from_utf8_lossy(&out.stderr));
    // A name that is no device changes nothing and says so.
    let out = host.run(&["devices", "scope", "nobody", "--scope", "observe"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing was changed"), "{out:?}");
    h.stop().await;
}
