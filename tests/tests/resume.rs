//! Sessions that outlive their connection (`thunderbolt/<p>/r1`): real
//! bridges, real agents, `thunderbolt acp connect` and in-process clients, and
//! real outages (all UDP to the bridge dropped with nftables in the test's own
//! network namespace).

use iroh::endpoint::VarInt;
use serde_json::Value;
use thunderbolt_shared::{
    close,
    resume::{resume_alpn, Control},
    EndpointTicket, Protocol,
};
use thunderbolt_tests::{
    r1::{agent, hello, lose, next_frame, Setup},
    setup::call,
    *,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_messages_each_way_survive_twenty_outages() {
    const ROUNDS: usize = 20;
    const PER_ROUND: usize = 500;
    const TOTAL: usize = ROUNDS * PER_ROUND;
    let work = tempfile::tempdir().unwrap();
    let pid_file = work.path().join("agent.pid").display().to_string();
    let s = Setup::new(&["--idle-timeout", "0.6"], &agent(&["--pid-file", &pid_file, "cat"])).await;
    let port = s.port();
    let (mut child, log) = s.connect(&["--idle-timeout", "0.6"]);
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        let mut n = 0usize;
        while let Some(line) = lines.next_line().await.unwrap() {
            let v: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("line {n} is not JSON ({e}): {line}"));
            assert_eq!(v["n"].as_u64(), Some(n as u64), "message {n} out of order, lost or repeated");
            n += 1;
        }
        n
    });
    log.wait_for("connected (resumable session)").await;
    let pid = agent_pid(&pid_file).await;
    let mut next = 0usize;
    let mut write = |k: usize| {
        let mut buf = String::new();
        for _ in 0..k {
            buf.push_str(&format!("{{\"jsonrpc\":\"2.0\",\"method\":\"note\",\"n\":{next}}}\n"));
            next += 1;
        }
        buf
    };
    for round in 1..=ROUNDS {
        stdin.write_all(write(PER_ROUND / 2).as_bytes()).await.unwrap();
        let outage = Outage::udp_port(port);
        // Written while the path is down: held and delivered after the resume.
        stdin.write_all(write(PER_ROUND / 2).as_bytes()).await.unwrap();
        log.wait_for_count("; reconnecting", round).await;
        drop(outage);
        log.wait_for_count("reconnected: session resumed", round).await;
    }
    drop(stdin);
    let status = tokio::time::timeout(WAIT, child.wait()).await.expect("connect ends").unwrap();
    let received = reader.await.unwrap();
    assert_eq!(received, TOTAL, "every message came back once");
    assert!(status.success(), "connect failed: {}", log.text());
    s.bridge.log.wait_for("session ended: agent exited (code 0)").await;
    let text = s.bridge.log.text();
    assert_eq!(text.matches("agent started").count(), 1, "one agent for the whole session:\n{text}");
    assert!(text.contains(&format!("pid={pid}")), "{text}");
    assert!(text.matches("session resumed").count() >= ROUNDS, "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_client_leaves_its_agent_running_until_the_grace_ends() {
    let work = tempfile::tempdir().unwrap();
    let pid_file = work.path().join("agent.pid").display().to_string();
    let s = Setup::new(
        &["--idle-timeout", "0.6", "--resume-grace", "3", "--max-agents", "1"],
        &agent(&["--pid-file", &pid_file, "cat"]),
    )
    .await;
    let (mut child, log) = s.connect(&[]);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"{\"hello\":1}\n").await.unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let echoed = tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap();
    assert_eq!(echoed.as_deref(), Some("{\"hello\":1}"));
    log.wait_for("resumable").await;
    let pid = agent_pid(&pid_file).await;
    signal(child.id().unwrap(), libc::SIGKILL);
    s.bridge.log.wait_for("the agent keeps running").await;
    assert!(pid_alive(pid), "the agent must outlive the lost connection");

    // Nobody comes back: the grace ends the session and frees the slot.
    assert!(wait_pid_gone(pid).await, "agent {pid} outlived the grace");
    s.bridge.log.wait_for("did not come back within").await;
    let (mut c2, log2) = s.connect(&[]);
    let mut stdin2 = c2.stdin.take().unwrap();
    stdin2.write_all(b"{\"again\":1}\n").await.unwrap();
    drop(stdin2);
    let out = tokio::time::timeout(WAIT, c2.wait_with_output()).await.unwrap().unwrap();
    assert!(out.status.success(), "{}", log2.text());
    assert_eq!(out.stdout, b"{\"again\":1}\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_sessions_own_node_can_attach() {
    let s = Setup::new(&[], &agent(&["cat"])).await;
    let other = Tb::new(None);
    s.bridge_home.allow(&other.node_id("acp").await).await;
    let alpn = resume_alpn(&Protocol::acp());

    let ep = s.endpoint(&s.client_home).await;
    let conn = s.bridge.dial(&ep, &alpn).await;
    let (mut send, mut recv, welcome) = hello(&conn, None, 0).await;
    let (token, received) = welcome.expect("a new session is welcomed");
    assert_eq!(received, 0);
    assert_eq!(token.len(), 32, "128-bit token");
    send.write_all(b"{\"a\":1}\n").await.unwrap();
    let mut buf = Vec::new();
    assert_eq!(next_frame(&mut recv, &mut buf).await, b"{\"a\":1}\n");
    lose(&conn);
    s.bridge.log.wait_for("the agent keeps running").await;

    // Another allowed node with the right token: refused, and the session survives.
    let ep_b = s.endpoint(&other).await;
    let conn_b = s.bridge.dial(&ep_b, &alpn).await;
    let (_s, _r, res) = hello(&conn_b, Some(&token), 1).await;
    assert_eq!(res, Err((close::CLOSE_CODE_REFUSED as u64, close::REASON_UNKNOWN_SESSION.to_string())));
    // A made-up token from the owner: refused too.
    let conn_c = s.bridge.dial(&ep, &alpn).await;
    let (_s, _r, res) = hello(&conn_c, Some("00000000000000000000000000000000"), 0).await;
    assert_eq!(res, Err((close::CLOSE_CODE_REFUSED as u64, close::REASON_UNKNOWN_SESSION.to_string())));

    // The owner resumes: it holds the echo (1 frame) and the bridge holds its 1 frame.
    let conn2 = s.bridge.dial(&ep, &alpn).await;
    let (mut send, mut recv, res) = hello(&conn2, Some(&token), 1).await;
    assert_eq!(res, Ok((token.clone(), 1)));
    send.write_all(b"{\"b\":2}\n").await.unwrap();
    let mut buf = Vec::new();
    assert_eq!(
        next_frame(&mut recv, &mut buf).await,
        b"{\"b\":2}\n",
        "same agent, next message, nothing replayed twice"
    );
    assert_eq!(s.bridge.log.text().matches("agent started").count(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn output_past_the_buffer_while_away_holds_the_agent_until_the_client_is_back() {
    let work = tempfile::tempdir().unwrap();
    let pid_file = work.path().join("agent.pid").display().to_string();
    let s = Setup::new(
        &["--resume-buffer", "1M", "--resume-grace", "60"],
        &agent(&["--pid-file", &pid_file, "respond", "65536"]),
    )
    .await;
    let ep = s.endpoint(&s.client_home).await;
    let conn = s.bridge.dial(&ep, &resume_alpn(&Protocol::acp())).await;
    let (mut send, mut recv, welcome) = hello(&conn, None, 0).await;
    let (token, _) = welcome.expect("welcomed");
    // 40 replies of 64 KiB, never acknowledged: 2.5 MiB against a 1 MiB buffer
    // (a phone that locked mid-reply).
    let mut reqs = String::new();
    for i in 0..40 {
        reqs.push_str(&format!("{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"big\"}}\n"));
    }
    send.write_all(reqs.as_bytes()).await.unwrap();
    let pid = agent_pid(&pid_file).await;
    // The agent is answering (so the bridge has the requests); then the path goes.
    let first: Value = serde_json::from_slice(&next_frame(&mut recv, &mut Vec::new()).await).unwrap();
    assert_eq!(first["id"], 0);
    lose(&conn);
    s.bridge.log.wait_for("the agent keeps running").await;
    // Back: every reply arrives, from the same agent that waited meanwhile.
    let conn = s.bridge.dial(&ep, &resume_alpn(&Protocol::acp())).await;
    let (mut send, mut recv, welcome) = hello(&conn, Some(&token), 1).await;
    assert_eq!(welcome.expect("resumed").0, token);
    let mut buf = Vec::new();
    for i in 1..40 {
        let v: Value = serde_json::from_slice(&next_frame(&mut recv, &mut buf).await).unwrap();
        assert_eq!(v["id"], i, "reply {i} in order, once");
        // Acknowledged as they come: the held agent writes the rest.
        send.write_all(&Control::Ack(i + 1).encode()).await.unwrap();
    }
    assert!(pid_alive(pid), "one agent throughout");
    let text = s.bridge.log.text();
    assert_eq!(text.matches("agent started").count(), 1, "{text}");
    assert!(!text.contains("session ended"), "{text}");
}

/// A client that is there but reads slower than its agent writes slows the
/// agent, as the plain path's flow control does: the resume buffer is for a
/// client that is away, not a queue ahead of one that is attached.
#[tokio::test(flavor = "multi_thread")]
async fn an_attached_client_that_reads_nothing_holds_its_agent_not_the_resume_buffer() {
    let work = tempfile::tempdir().unwrap();
    let pid_file = work.path().join("agent.pid").display().to_string();
    let s =
        Setup::new(&["--resume-grace", "60"], &agent(&["--pid-file", &pid_file, "respond", "65536"])).await;
    let ep = s.endpoint(&s.client_home).await;
    let conn = s.bridge.dial(&ep, &resume_alpn(&Protocol::acp())).await;
    let (mut send, recv, welcome) = hello(&conn, None, 0).await;
    let (token, _) = welcome.expect("welcomed");
    // 200 replies of 64 KiB: 12.5 MiB, well inside the default 32 MiB resume buffer.
    const REPLIES: u64 = 200;
    let mut reqs = String::new();
    for i in 0..REPLIES {
        reqs.push_str(&format!("{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"big\"}}\n"));
    }
    send.write_all(reqs.as_bytes()).await.unwrap();
    let pid = agent_pid(&pid_file).await;
    // Nothing is read: the agent ends up waiting on its output, and stays there
    // (had the bridge taken it all, the agent would be done and wait on its input).
    let stuck = tokio::time::timeout(WAIT, async {
        let mut in_a_row = 0;
        while in_a_row < 20 {
            let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
            in_a_row = if wchan.contains("pipe_write") { in_a_row + 1 } else { 0 };
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(stuck.is_ok(), "the agent never waited on its output: the bridge queued it all");
    drop(recv);
    lose(&conn);
    s.bridge.log.wait_for("byte(s) of output held").await;
    let text = s.bridge.log.text();
    let held: u64 = text
        .split("byte(s) of output held")
        .next()
        .and_then(|before| before.rsplit('(').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no held count in {text}"));
    // What the connection had not taken (1 MiB) and what its QUIC window and
    // the agent's pipe held: a few MiB, against the 12.5 MiB written unbounded.
    assert!(held <= 4 << 20, "{held} bytes of output held for an attached client that read nothing");
    // Nothing was lost: every reply arrives after the resume, in order, once.
    let conn = s.bridge.dial(&ep, &resume_alpn(&Protocol::acp())).await;
    let (mut send, mut recv, welcome) = hello(&conn, Some(&token), 0).await;
    assert_eq!(welcome.expect("resumed").0, token);
    let mut buf = Vec::new();
    for i in 0..REPLIES {
        let v: Value = serde_json::from_slice(&next_frame(&mut recv, &mut buf).await).unwrap();
        assert_eq!(v["id"], i, "reply {i} in order, once");
        send.write_all(&Control::Ack(i + 1).encode()).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_peers_detached_session_ends_at_the_next_heartbeat() {
    let work = tempfile::tempdir().unwrap();
    let pid_file = work.path().join("agent.pid").display().to_string();
    let s = Setup::new(&["--heartbeat-interval", "0.5"], &agent(&["--pid-file", &pid_file, "cat"])).await;
    let ep = s.endpoint(&s.client_home).await;
    let conn = s.bridge.dial(&ep, &resume_alpn(&Protocol::acp())).await;
    let (_send, _recv, welcome) = hello(&conn, None, 0).await;
    welcome.expect("welcomed");
    let pid = agent_pid(&pid_file).await;
    lose(&conn);
    s.bridge.log.wait_for("the agent keeps running").await;
    let id = s.client_home.node_id("acp").await.to_string();
    let out = s.bridge_home.run(&["iroh", "deny", &id]).await;
    assert!(out.status.success());
    s.bridge.log.wait_for(&format!("ending the session: {}", close::REASON_MEMBERSHIP_REVOKED)).await;
    assert!(wait_pid_gone(pid).await, "the revoked peer's agent outlived the heartbeat");
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_alpn_sessions_end_with_their_connection_as_before() {
    let work = tempfile::tempdir().unwrap();
    let pid_file = work.path().join("agent.pid").display().to_string();
    let s = Setup::new(&[], &agent(&["--pid-file", &pid_file, "cat"])).await;
    let ep = s.endpoint(&s.client_home).await;
    let conn = s.bridge.dial(&ep, &Protocol::acp().alpn()).await;
    assert_eq!(conn.alpn(), Protocol::acp().alpn().as_slice());
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(b"{\"a\":1}\n").await.unwrap();
    let mut buf = vec![0u8; 64];
    let n = tokio::time::timeout(WAIT, recv.read(&mut buf)).await.unwrap().unwrap().unwrap();
    assert_eq!(&buf[..n], b"{\"a\":1}\n", "no control lines on the plain protocol");
    let pid = agent_pid(&pid_file).await;
    lose(&conn);
    assert!(wait_pid_gone(pid).await, "a plain session's agent ends with its connection");
    assert!(!s.bridge.log.contains("keeps running"));
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_speaks_the_plain_protocol_to_a_bridge_without_resume() {
    let s = Setup::new(&["--no-resume"], &agent(&["cat"])).await;
    assert!(s.bridge.banner.contains("Resume:  off"), "{}", s.bridge.banner);
    let (mut child, log) = s.connect(&[]);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"{\"a\":1}\n{\"b\":2}").await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(WAIT, child.wait_with_output()).await.unwrap().unwrap();
    assert!(out.status.success(), "{}", log.text());
    assert_eq!(out.stdout, b"{\"a\":1}\n{\"b\":2}\n");
    log.wait_for("connected (the bridge answered)").await;
    assert!(!log.contains("resumable"), "{}", log.text());
    // The endpoint does not even offer r1.
    let ep = s.endpoint(&s.client_home).await;
    let ticket: EndpointTicket = s.bridge.ticket.parse().unwrap();
    let r = tokio::time::timeout(
        WAIT,
        ep.connect(ticket.endpoint_addr().clone(), &resume_alpn(&Protocol::acp())),
    )
    .await
    .unwrap();
    assert!(r.is_err(), "r1 refused by a --no-resume bridge");
    let _ = s.path("unused");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_killed_and_restarted_mid_session_loses_nothing() {
    init_tracing();
    let (mut relay, url) = relay_process("127.0.0.1:0").await;
    let relay_addr = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
    let bridge_home = Tb::with_relay_url(&url);
    let client_home = Tb::with_relay_url(&url);
    bridge_home.allow(&client_home.node_id("acp").await).await;
    let work = tempfile::tempdir().unwrap();
    let pid_file = work.path().join("agent.pid").display().to_string();
    let argv = agent(&["--pid-file", &pid_file, "cat"]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let bridge = bridge_home.bridge("acp", &[], &argv).await;
    assert!(bridge.banner.contains(url.as_str().trim_end_matches('/')), "{}", bridge.banner);
    // The relay is the only path: no UDP between the client and the bridge.
    let _direct_off = Outage::udp_port(banner_port(&bridge.banner));

    let (mut child, log) = client_home.connect(&["--idle-timeout", "1", &bridge.ticket]);
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut expect = 0u64;
    let mut next = 0u64;
    let mut send = |k: u64| {
        let mut b = String::new();
        for _ in 0..k {
            b.push_str(&format!("{{\"n\":{next}}}\n"));
            next += 1;
        }
        b
    };
    stdin.write_all(send(100).as_bytes()).await.unwrap();
    for _ in 0..100 {
        let l = tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap().unwrap();
        assert_eq!(serde_json::from_str::<Value>(&l).unwrap()["n"], expect);
        expect += 1;
    }
    let pid = agent_pid(&pid_file).await;
    assert!(!log.contains("; reconnecting"), "the path held until the relay went: {}", log.text());

    relay.kill().await.unwrap();
    // Written while the relay is down.
    stdin.write_all(send(100).as_bytes()).await.unwrap();
    log.wait_for("; reconnecting").await;
    let (_relay2, url2) = relay_process(&relay_addr).await;
    assert_eq!(url2, url, "the relay came back at the same address");
    log.wait_for("reconnected: session resumed").await;
    stdin.write_all(send(100).as_bytes()).await.unwrap();
    drop(stdin);
    while let Some(l) = tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap() {
        assert_eq!(serde_json::from_str::<Value>(&l).unwrap()["n"], expect, "in order, once");
        expect += 1;
    }
    assert_eq!(expect, 300, "every message came back");
    let status = tokio::time::timeout(WAIT, child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{}", log.text());
    assert!(!pid_alive(pid) || wait_pid_gone(pid).await);
    assert_eq!(bridge.log.text().matches("agent started").count(), 1, "{}", bridge.log.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn keep_warm_lets_a_plain_client_load_its_session_after_reconnecting() {
    // The built-in agent keeps sessions in memory and supports session/load.
    let s = Setup::new(&["--keep-warm", "30"], &[]).await;
    assert!(s.bridge.banner.contains("Warm:"), "{}", s.bridge.banner);
    let ep = s.endpoint(&s.client_home).await;
    let acp = Protocol::acp().alpn();

    let conn = s.bridge.dial(&ep, &acp).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let mut buf = Vec::new();
    call(&mut send, &mut recv, &mut buf, 1, "initialize", serde_json::json!({"protocolVersion": 1})).await;
    let new = call(
        &mut send,
        &mut recv,
        &mut buf,
        2,
        "session/new",
        serde_json::json!({"cwd": "/", "mcpServers": []}),
    )
    .await;
    let sid = new["result"]["sessionId"].as_str().unwrap().to_string();
    let prompt = serde_json::json!({"sessionId": sid, "prompt": [{"type": "text", "text": "remember me"}]});
    let r = call(&mut send, &mut recv, &mut buf, 3, "session/prompt", prompt).await;
    assert_eq!(r["result"]["stopReason"], "end_turn");
    // The app's client closes as it always does.
    conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_CLIENT_CLOSED.as_bytes());
    s.bridge.log.wait_for("the agent stays warm").await;

    let conn = s.bridge.dial(&ep, &acp).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let mut buf = Vec::new();
    // Ids start over, as a fresh client's do: nothing from before answers them.
    let init =
        call(&mut send, &mut recv, &mut buf, 1, "initialize", serde_json::json!({"protocolVersion": 1}))
            .await;
    assert!(init["result"]["agentCapabilities"]["loadSession"].as_bool().unwrap());
    let load = serde_json::json!({"sessionId": sid, "cwd": "/", "mcpServers": []});
    let loaded = call(&mut send, &mut recv, &mut buf, 2, "session/load", load).await;
    assert!(loaded.get("error").is_none(), "session/load after reconnecting: {loaded}");
    assert_eq!(s.bridge.log.text().matches("agent started").count(), 1, "{}", s.bridge.log.text());
    s.bridge.log.wait_for("attached to the warm agent").await;
    conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), close::REASON_CLIENT_CLOSED.as_bytes());

    // Another peer never gets this agent.
    let other = Tb::new(None);
    s.bridge_home.allow(&other.node_id("acp").await).await;
    s.bridge.log.wait_for_count("the agent stays warm", 2).await;
    let ep_b = s.endpoint(&other).await;
    let conn = s.bridge.dial(&ep_b, &acp).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let mut buf = Vec::new();
    call(&mut send, &mut recv, &mut buf, 1, "initialize", serde_json::json!({"protocolVersion": 1})).await;
    let load = serde_json::json!({"sessionId": sid, "cwd": "/", "mcpServers": []});
    let refused = call(&mut send, &mut recv, &mut buf, 2, "session/load", load).await;
    assert!(refused.get("error").is_some(), "another peer's fresh agent knows nothing: {refused}");
    s.bridge.log.wait_for_count("agent started", 2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn keep_warm_answers_the_vanished_clients_requests_and_ends_after_its_window() {
    let work = tempfile::tempdir().unwrap();
    let pid_file = work.path().join("agent.pid").display().to_string();
    let s = Setup::new(&["--keep-warm", "2"], &agent(&["--pid-file", &pid_file, "ask"])).await;
    let ep = s.endpoint(&s.client_home).await;
    let conn = s.bridge.dial(&ep, &Protocol::acp().alpn()).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"hello\"}\n").await.unwrap();
    let mut buf = Vec::new();
    let q: Value = serde_json::from_slice(&next_frame(&mut recv, &mut buf).await).unwrap();
    assert_eq!(q["id"], "q1");
    let pid = agent_pid(&pid_file).await;
    // Gone without answering the agent's request.
    lose(&conn);
    s.bridge.log.wait_for("answer: ").await;
    let text = s.bridge.log.text();
    let answer = text.lines().find(|l| l.contains("answer: ")).unwrap();
    assert!(answer.contains("\"q1\"") && answer.contains("-32000"), "{answer}");
    assert!(pid_alive(pid), "the agent stays warm");
    // Nobody comes: the window ends it.
    assert!(wait_pid_gone(pid).await, "the warm agent outlived its window");
    s.bridge.log.wait_for("no client for").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sigkilled_plain_client_started_again_gets_the_same_warm_agent() {
    let work = tempfile::tempdir().unwrap();
    let pid_file = work.path().join("agent.pid").display().to_string();
    let s =
        Setup::new(&["--keep-warm", "30", "--idle-timeout", "1"], &agent(&["--pid-file", &pid_file, "cat"]))
            .await;
    let s = &s;
    let round = |n: u32| async move {
        let (mut child, log) = s.connect(&["--no-resume"]);
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(format!("{{\"round\":{n}}}\n").as_bytes()).await.unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let echoed = tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap();
        assert_eq!(echoed, Some(format!("{{\"round\":{n}}}")), "{}", log.text());
        (child, stdin)
    };
    let (child, _stdin) = round(1).await;
    let pid = agent_pid(&pid_file).await;
    signal(child.id().unwrap(), libc::SIGKILL);
    s.bridge.log.wait_for("the agent stays warm").await;
    // Started again with the same identity: the same agent answers.
    let (mut child, stdin) = round(2).await;
    assert!(pid_alive(pid));
    assert_eq!(s.bridge.log.text().matches("agent started").count(), 1, "{}", s.bridge.log.text());
    drop(stdin);
    let _ = tokio::time::timeout(WAIT, child.wait()).await;
}

/// `connect` acknowledges the bridge's frames at most ACK_DELAY_MS after the
/// first one it has not acknowledged, also while frames keep coming and its own
/// input keeps it busy: a timer made afresh on every turn of its sending loop
/// would wait for the 128th frame (ACK_EVERY_FRAMES) or for a quiet moment.
/// The bridge here is written by hand (r1 only) to see exactly when acks come.
#[tokio::test(flavor = "multi_thread")]
async fn connect_acks_a_steady_trickle_within_the_ack_delay() {
    use thunderbolt_shared::resume::{ACK_DELAY_MS, ACK_EVERY_FRAMES};
    /// A frame every this many ms: well under the ack delay.
    const EVERY_MS: u64 = 5;
    /// Frames sent: fewer than ACK_EVERY_FRAMES, so only the delay can ack them.
    const FRAMES: u64 = 100;
    const _: () = assert!(FRAMES < ACK_EVERY_FRAMES && EVERY_MS * 4 < ACK_DELAY_MS);
    init_tracing();
    let alpn = resume_alpn(&Protocol::acp());
    let bridge = loopback_endpoint(iroh::SecretKey::generate(), None, false, vec![alpn]).await.unwrap();
    let ticket = EndpointTicket::new(bridge.addr()).to_string();
    let client_home = Tb::new(None);
    let (mut child, log) = client_home.connect(&[&ticket]);
    let mut stdin = child.stdin.take().unwrap();

    let incoming = tokio::time::timeout(WAIT, bridge.accept()).await.unwrap().expect("connect dials");
    let conn = incoming.await.expect("handshake");
    let (mut send, mut recv) = tokio::time::timeout(WAIT, conn.accept_bi()).await.unwrap().unwrap();
    // The hello: the client's first line.
    let mut rest: Vec<u8> = Vec::new();
    let hello = loop {
        if let Some(nl) = rest.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = rest.drain(..=nl).collect();
            break Control::parse(&line);
        }
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(WAIT, recv.read(&mut buf)).await.unwrap().unwrap().expect("a hello");
        rest.extend_from_slice(&buf[..n]);
    };
    assert!(matches!(hello, Ok(Some(Control::Hello { session: None, received: 0 }))), "{hello:?}");
    let welcome = Control::Welcome { session: "s1".into(), received: 0, grace_ms: 10_000 };
    send.write_all(&welcome.encode()).await.unwrap();

    // The client's acks, as they arrive, with the time since the first frame.
    let t0 = tokio::time::Instant::now();
    let acks = tokio::spawn(async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = rest.drain(..=nl).collect();
                if let Ok(Some(Control::Ack(n))) = Control::parse(&line) {
                    got.push((n, t0.elapsed()));
                    if n == FRAMES {
                        return got;
                    }
                }
            }
            match recv.read(&mut buf).await {
                Ok(Some(n)) => rest.extend_from_slice(&buf[..n]),
                _ => return got,
            }
        }
    });
    // Both ways, as in a busy session: each turn of the client's sending loop
    // must not put its pending ack off.
    for i in 0..FRAMES {
        send.write_all(format!("{{\"n\":{i}}}\n").as_bytes()).await.unwrap();
        stdin.write_all(format!("{{\"m\":{i}}}\n").as_bytes()).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(EVERY_MS)).await;
    }
    let sent_for = t0.elapsed();
    assert!(
        sent_for.as_millis() as u64 >= 4 * ACK_DELAY_MS,
        "the trickle lasted several ack delays: {sent_for:?}"
    );
    // Until the ack of the last frame (or the stream's end).
    let got = tokio::time::timeout(WAIT, acks).await.unwrap().unwrap();
    conn.close(VarInt::from_u32(close::CLOSE_CODE_CLIENT), b"test over");
    drop(stdin);
    let _ = child.kill().await;
    assert!(!got.is_empty(), "no ack at all; {}", log.text());
    // Acks while the trickle ran (it lasted at least four ack delays): with
    // the delay put off on every turn, none come before it stops.
    let during = got.iter().filter(|(_, at)| *at < sent_for).count();
    assert!(during >= 2, "{during} acks while frames kept coming for {sent_for:?}: {got:?}");
    assert_eq!(got.last().unwrap().0, FRAMES, "every frame acked in the end: {got:?}");
}

/// A bridge that answers a resumption with another session's welcome (the
/// `wrong-welcome` binary; the browser's client meets the same one in
/// `client-wasm/e2e/e2e.test.mjs`): `connect` ends the session saying so,
/// after a second hello that named its own session, and never carries on
/// with the other one.
#[tokio::test(flavor = "multi_thread")]
async fn a_resumption_welcomed_as_another_session_ends_the_session_saying_so() {
    let relay = LocalRelay::start().await;
    let mut fake = tokio::process::Command::new(wrong_welcome_bin())
        .args(["--relay-url", &relay.url.to_string()])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("wrong-welcome spawns");
    let mut out = BufReader::new(fake.stdout.take().unwrap()).lines();
    let mut next = async || {
        tokio::time::timeout(WAIT, out.next_line()).await.expect("wrong-welcome said more").unwrap().unwrap()
    };
    let ticket = next().await.strip_prefix("Ticket: ").expect("the ticket first").to_string();
    let home = Tb::new(Some(&relay));
    let (mut child, log) = home.connect(&[&ticket]);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}\n").await.unwrap();
    let status = tokio::time::timeout(WAIT, child.wait()).await.expect("connect ends").unwrap();
    assert!(!status.success(), "connect must fail; stderr:\n{}", log.text());
    assert!(
        log.contains("the bridge welcomed another session than ours"),
        "connect must say why; stderr:\n{}",
        log.text()
    );
    let mut said = Vec::new();
    while let Ok(Some(line)) = tokio::time::timeout(WAIT, out.next_line()).await.expect("wrong-welcome ends")
    {
        said.push(line);
    }
    assert!(said[0].starts_with("Allow a peer"), "{said:?}");
    let hellos: Vec<&String> = said.iter().filter(|l| l.starts_with("hello: ")).collect();
    assert_eq!(hellos.len(), 2, "{said:?}");
    assert!(hellos[0].contains(r#""session":null"#), "a new session first: {said:?}");
    assert!(hellos[1].contains(r#""session":"the-first-session""#), "then a resumption of it: {said:?}");
    assert!(said.iter().any(|l| l.starts_with("closed: ")), "connect closed the lying connection: {said:?}");
}
