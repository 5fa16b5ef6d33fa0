//! Resumable sessions under pressure, each case found by an adversarial pass
//! against `thunderbolt/<p>/r1`: abandoned sessions that would pin every slot,
//! acknowledgements stuck behind frames, a full replay log at the moment of a
//! loss, stale and sloppy resumes, a client that never takes the end, and
//! requests left waiting when the agent dies. Real bridges and agents; the
//! client is written by hand (`thunderbolt_tests::r1`) or is `connect`.

use std::time::Duration;

use iroh::endpoint::VarInt;
use serde_json::Value;
use thunderbolt_shared::{
    close,
    jsonrpc::AGENT_ENDED_CODE,
    resume::{resume_alpn, Control},
    Protocol,
};
use thunderbolt_tests::{
    r1::{agent, closed, hello_raw, lose, next_any, next_frame, Setup},
    *,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A second device, allowed on the bridge.
async fn other_device(s: &Setup) -> Tb {
    let other = Tb::new(None);
    s.bridge_home.allow(&other.node_id("acp").await).await;
    other
}

#[tokio::test(flavor = "multi_thread")]
async fn a_device_keeps_at_most_four_detached_sessions() {
    // Twelve dials from one device in a few seconds: above the default budget.
    let s = Setup::new(&["--max-agents", "8", "--per-remote-max", "50"], &agent(&["cat"])).await;
    let ep = s.endpoint(&s.client_home).await;
    let mut tokens = Vec::new();
    // A page reloaded six times, never keeping its session state: each
    // session is left behind without a close.
    for i in 1..=6 {
        let (conn, _send, _recv, token) = s.session(&ep).await;
        lose(&conn);
        s.bridge.log.wait_for_count("the agent keeps running", i).await;
        tokens.push(token);
    }
    s.bridge.log.wait_for_count("evicting a detached session", 2).await;
    let text = s.bridge.log.text();
    assert!(text.contains("has more than 4 detached sessions"), "{text}");
    // The two oldest are gone and say so; the four newest still resume.
    for (i, token) in tokens.iter().enumerate() {
        let (_c, _s, _r, welcome) = s.resume(&ep, token, 0).await;
        if i < 2 {
            assert_eq!(welcome, Err((1, close::REASON_SESSION_EVICTED.to_string())), "session {i}");
        } else {
            assert!(welcome.is_ok(), "session {i}: {welcome:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn abandoned_sessions_make_room_for_another_device_the_requesters_own_first() {
    let s = Setup::new(&["--max-agents", "4"], &agent(&["cat"])).await;
    let phone_home = other_device(&s).await;
    let (laptop, phone) = (s.endpoint(&s.client_home).await, s.endpoint(&phone_home).await);
    // The phone leaves one session behind first (the oldest), then the laptop three.
    let (conn, _s0, _r0, phone_token) = s.session(&phone).await;
    lose(&conn);
    s.bridge.log.wait_for_count("the agent keeps running", 1).await;
    let mut laptop_tokens = Vec::new();
    for i in 2..=4 {
        let (conn, _s, _r, token) = s.session(&laptop).await;
        lose(&conn);
        s.bridge.log.wait_for_count("the agent keeps running", i).await;
        laptop_tokens.push(token);
    }
    // Every slot is held by a detached session. The laptop asks: its own
    // oldest goes, not the phone's older one.
    let (_laptop_conn, mut send, mut recv, _) = s.session(&laptop).await;
    s.bridge.log.wait_for("needs a slot").await;
    send.write_all(b"{\"laptop\":1}\n").await.unwrap();
    assert_eq!(next_frame(&mut recv, &mut Vec::new()).await, b"{\"laptop\":1}\n");
    let (_c, _s, _r, welcome) = s.resume(&laptop, &laptop_tokens[0], 0).await;
    assert_eq!(welcome, Err((1, close::REASON_SESSION_EVICTED.to_string())));
    // A third device finds the phone's session the oldest of all and gets its slot.
    let third_home = other_device(&s).await;
    let third = s.endpoint(&third_home).await;
    let (_third_conn, mut send, mut recv, _) = s.session(&third).await;
    send.write_all(b"{\"third\":1}\n").await.unwrap();
    assert_eq!(next_frame(&mut recv, &mut Vec::new()).await, b"{\"third\":1}\n");
    let (_c, _s, _r, welcome) = s.resume(&phone, &phone_token, 0).await;
    assert_eq!(welcome, Err((1, close::REASON_SESSION_EVICTED.to_string())));
    let text = s.bridge.log.text();
    assert_eq!(text.matches("evicting a detached session").count(), 2, "{text}");
    assert!(!text.contains(close::REASON_AT_CAPACITY), "nobody was refused:\n{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refusal_at_capacity_names_what_holds_the_slots() {
    let s = Setup::new(&["--max-agents", "1"], &agent(&["cat"])).await;
    let ep = s.endpoint(&s.client_home).await;
    let (_conn, _send, _recv, _) = s.session(&ep).await;
    let other = other_device(&s).await;
    let ep2 = s.endpoint(&other).await;
    let conn = s.bridge.dial(&ep2, &resume_alpn(&Protocol::acp())).await;
    let (_send, _recv, welcome) = thunderbolt_tests::r1::hello(&conn, None, 0).await;
    assert_eq!(welcome, Err((1, close::REASON_AT_CAPACITY.to_string())));
    s.bridge.log.wait_for("0 detached, 0 warm; every other session has a client attached").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_pipelined_requests_with_large_replies_complete_over_r1() {
    const REQUESTS: usize = 1000;
    let s = Setup::new(&[], &agent(&["respond", "262144"])).await;
    let (mut child, log) = s.connect(&[]);
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    // ~8 KiB requests written as fast as connect takes them, while replies of
    // 256 KiB each are read back: the replay log fills long before the last
    // request is read, and only the client's acks empty it.
    let pad = "r".repeat(8 * 1024);
    let writer = tokio::spawn(async move {
        for i in 0..REQUESTS {
            let req = format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"big\",\"params\":{{\"pad\":\"{pad}\"}}}}\n"
            );
            stdin.write_all(req.as_bytes()).await.unwrap();
        }
        stdin
    });
    let reader = tokio::spawn(async move {
        let mut lines = BufReader::with_capacity(1 << 20, stdout).lines();
        let mut n = 0;
        while n < REQUESTS {
            let Some(line) = lines.next_line().await.unwrap() else { break };
            let v: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["id"], n, "replies in order");
            n += 1;
        }
        n
    });
    // Bounded well above the few seconds it takes; before, it stopped for good
    // after ~127 replies.
    let got = tokio::time::timeout(Duration::from_secs(180), reader).await;
    let got =
        got.unwrap_or_else(|_| panic!("replies stopped coming; connect said:\n{}", log.text())).unwrap();
    assert_eq!(got, REQUESTS);
    drop(writer.await.unwrap());
    let status = tokio::time::timeout(WAIT, child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{}", log.text());
    log.finished().await;
    assert!(log.contains("connected (resumable session)"), "{}", log.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stale_resume_ends_its_session_with_a_reason_of_its_own() {
    let work = tempfile::tempdir().unwrap();
    let pid_file = work.path().join("agent.pid").display().to_string();
    let s = Setup::new(&[], &agent(&["--pid-file", &pid_file, "cat"])).await;
    let ep = s.endpoint(&s.client_home).await;
    let (conn, mut send, mut recv, token) = s.session(&ep).await;
    let mut buf = Vec::new();
    for i in 0..10 {
        send.write_all(format!("{{\"n\":{i}}}\n").as_bytes()).await.unwrap();
        next_frame(&mut recv, &mut buf).await;
    }
    // The page stores that it holds all ten and says so; one more frame's echo
    // shows the bridge read the ack (it reads in order).
    send.write_all(&Control::Ack(10).encode()).await.unwrap();
    send.write_all(b"{\"n\":10}\n").await.unwrap();
    next_frame(&mut recv, &mut buf).await;
    let pid = agent_pid(&pid_file).await;
    lose(&conn);
    s.bridge.log.wait_for("the agent keeps running").await;
    // An older copy of the page's state comes back: it holds only five.
    let (_c, _s, _r, welcome) = s.resume(&ep, &token, 5).await;
    assert_eq!(welcome, Err((1, close::REASON_STALE_RESUME.to_string())));
    assert!(wait_pid_gone(pid).await, "the stale session's agent is ended, its slot freed");
    // Asked again, even with the right count, the session is gone for the same reason.
    let (_c, _s, _r, welcome) = s.resume(&ep, &token, 11).await;
    assert_eq!(welcome, Err((1, close::REASON_STALE_RESUME.to_string())));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_end_the_client_never_acknowledges_frees_the_slot_after_the_plain_linger() {
    let s = Setup::new(&["--max-agents", "1", "--resume-grace", "120"], &agent(&["reply-once"])).await;
    let ep = s.endpoint(&s.client_home).await;
    let (_conn, mut send, mut recv, _) = s.session(&ep).await;
    send.write_all(b"{\"q\":1}\n").await.unwrap();
    let mut buf = Vec::new();
    assert_eq!(next_frame(&mut recv, &mut buf).await, b"{\"echo\":{\"q\":1}}\n");
    // The agent ended; the bridge says so, and this client never acknowledges.
    loop {
        let line = next_any(&mut recv, &mut buf).await;
        if line.starts_with(b"!{\"end\"") {
            break;
        }
    }
    let took = std::time::Instant::now();
    // The slot comes back after the plain protocol's 10 s linger, not the grace.
    s.bridge.log.wait_for("session ended: agent exited (code 0)").await;
    assert!(took.elapsed() < Duration::from_secs(30), "held for {:?}", took.elapsed());
    let other = other_device(&s).await;
    let ep2 = s.endpoint(&other).await;
    let (_c, _s, _r, _token) = s.session(&ep2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_connection_object_is_a_loss_not_the_clients_close() {
    let s = Setup::new(&[], &agent(&["cat"])).await;
    let ep = s.endpoint(&s.client_home).await;
    let (conn, mut send, mut recv, token) = s.session(&ep).await;
    send.write_all(b"{\"a\":1}\n").await.unwrap();
    next_frame(&mut recv, &mut Vec::new()).await;
    // What dropping the connection object sends: code 0 with no reason.
    conn.close(VarInt::from_u32(0), b"");
    s.bridge.log.wait_for("the agent keeps running").await;
    let (_c, mut send, mut recv, welcome) = s.resume(&ep, &token, 1).await;
    assert_eq!(welcome.expect("resumed").0, token);
    send.write_all(b"{\"b\":2}\n").await.unwrap();
    assert_eq!(next_frame(&mut recv, &mut Vec::new()).await, b"{\"b\":2}\n");
    // Only code 0 with exactly `client closed` ends it.
    let (c, _s, _r, _) = s.resume(&ep, &token, 2).await;
    c.close(VarInt::from_u32(0), close::REASON_CLIENT_CLOSED.as_bytes());
    s.bridge.log.wait_for("session ended: peer gone (client closed)").await;
}

/// The answer a request left waiting got: its id and how the agent ended.
fn agent_ended_answer(line: &[u8]) -> (Value, String) {
    let v: Value = serde_json::from_slice(line).unwrap();
    assert_eq!(v["error"]["code"], AGENT_ENDED_CODE, "{v}");
    (v["id"].clone(), v["error"]["data"]["agentEnd"].as_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_in_flight_when_the_agent_dies_are_answered_over_r1_and_plain() {
    // Reads two requests, answers neither, exits 5.
    let s = Setup::new(&[], &agent(&["exit-after", "2", "5"])).await;
    let reqs = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}\n{\"jsonrpc\":\"2.0\",\"id\":\"p\",\"method\":\"session/prompt\"}\n";
    for no_resume in [false, true] {
        let extra: &[&str] = if no_resume { &["--no-resume"] } else { &[] };
        let (mut child, log) = s.connect(extra);
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(reqs).await.unwrap();
        let out = tokio::time::timeout(WAIT, async {
            let mut out = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(child.stdout.as_mut().unwrap(), &mut out).await.unwrap();
            out
        })
        .await
        .unwrap();
        let status = child.wait().await.unwrap();
        assert!(!status.success());
        // connect's stderr is read by a task of the test's: its last lines may
        // still be on their way when the process is reaped.
        log.wait_for("the agent exited with code 5").await;
        let answers: Vec<(Value, String)> =
            out.split_inclusive(|b| *b == b'\n').map(agent_ended_answer).collect();
        assert_eq!(answers.len(), 2, "no_resume={no_resume}: {}", String::from_utf8_lossy(&out));
        assert!(answers.iter().all(|(_, how)| how == "agent exited (code 5)"));
        let ids: Vec<&Value> = answers.iter().map(|(id, _)| id).collect();
        assert!(ids.contains(&&Value::from(1)) && ids.contains(&&Value::from("p")), "{ids:?}");
        drop(stdin);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn control_lines_are_read_strictly_and_alike_however_they_arrive() {
    let s = Setup::new(&[], &agent(&["cat"])).await;
    let ep = s.endpoint(&s.client_home).await;
    let alpn = resume_alpn(&Protocol::acp());
    let protocol_error = Err((1, close::REASON_RESUME_PROTOCOL.to_string()));
    // Another version of the hello.
    let conn = s.bridge.dial(&ep, &alpn).await;
    let (_s, _r, w) = hello_raw(&conn, b"!{\"hello\":99,\"session\":null,\"received\":0}\n").await;
    assert_eq!(w, protocol_error, "hello 99");
    // A hello past the control-line limit: refused in one write and in two.
    let long = format!("!{{\"hello\":1,\"session\":null,\"received\":0,\"pad\":\"{}\"}}\n", "x".repeat(1500));
    let conn = s.bridge.dial(&ep, &alpn).await;
    let (_s, _r, w) = hello_raw(&conn, long.as_bytes()).await;
    assert_eq!(w, protocol_error, "a long hello in one write");
    let conn = s.bridge.dial(&ep, &alpn).await;
    let (mut send, recv) = conn.open_bi().await.unwrap();
    send.write_all(&long.as_bytes()[..700]).await.unwrap();
    send.flush().await.unwrap();
    send.write_all(&long.as_bytes()[700..]).await.unwrap();
    let (_s, _r, w) = thunderbolt_tests::r1::welcome(&conn, send, recv).await;
    assert_eq!(w, protocol_error, "a long hello in two writes");
    // Counts that are not u64, each refused the same way as one too large.
    for bad in ["99999999999999999999", "-1", "5.0", "18446744073709551616"] {
        let (conn, mut send, _recv, _) = s.session(&ep).await;
        send.write_all(format!("!{{\"ack\":{bad}}}\n").as_bytes()).await.unwrap();
        assert_eq!(closed(&conn).await, (1, close::REASON_RESUME_PROTOCOL.to_string()), "ack {bad}");
    }
}
