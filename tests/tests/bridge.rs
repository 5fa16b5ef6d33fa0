//! The bridge end to end: real `thunderbolt` processes, real agents, real QUIC
//! on loopback, a real local relay.

use std::{process::Stdio, time::Duration};

use iroh::{
    endpoint::{RecvStream, SendStream},
    SecretKey,
};
use serde_json::{json, Value};
use thunderbolt_shared::{close, EndpointTicket, Protocol};
use thunderbolt_tests::{
    setup::{agent, request, Setup},
    *,
};
use tokio::io::AsyncWriteExt;

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

async fn read_all(recv: &mut RecvStream) -> Vec<u8> {
    tokio::time::timeout(WAIT, recv.read_to_end(64 * 1024 * 1024))
        .await
        .expect("read in time")
        .expect("read ok")
}

/// Reads ndjson messages until one satisfies `stop`.
async fn read_until(recv: &mut RecvStream, buf: &mut Vec<u8>, stop: impl Fn(&Value) -> bool) -> Vec<Value> {
    let mut out = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let v: Value = serde_json::from_slice(&line).expect("bridge sent valid JSON");
            let done = stop(&v);
            out.push(v);
            if done {
                return out;
            }
        }
        let n = tokio::time::timeout(WAIT, recv.read(&mut chunk))
            .await
            .expect("message in time")
            .expect("read ok")
            .expect("stream still open");
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn write_all(send: &mut SendStream, data: &[u8]) {
    send.write_all(data).await.expect("write");
}

/// Dials the bridge of `s` (a `cat` agent), writes `input` as it is, finishes
/// the stream and returns every line that came back, parsed, and the raw bytes.
async fn exchange_raw(s: &Setup, input: &[u8]) -> (Vec<Value>, Vec<u8>) {
    let ep = s.client(false).await;
    let conn = s.bridge.dial(&ep, &Protocol::acp().alpn()).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    write_all(&mut send, input).await;
    send.finish().unwrap();
    let out = read_all(&mut recv).await;
    let lines = out
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("the bridge sent valid JSON"))
        .collect();
    (lines, out)
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_round_trip_is_byte_identical() {
    let s = Setup::with_relay("acp", &[], &agent(&["cat"]), true).await;
    // Canonical ndjson with unicode, escapes, a 1 MiB line and many small ones
    // (notifications: a request the cat agent only echoes would get the
    // bridge's answer when the agent ends, see `requests_left_unanswered…`).
    let mut input = Vec::new();
    for i in 0..2000 {
        input.extend_from_slice(
            format!("{{\"jsonrpc\":\"2.0\",\"method\":\"x\",\"params\":{{\"i\":{i},\"t\":\"héllo ✓ \\n {i}\"}}}}\n").as_bytes(),
        );
    }
    input.extend_from_slice(format!("{{\"big\":\"{}\"}}\n", "y".repeat(1 << 20)).as_bytes());
    let in_path = s.path("in.ndjson");
    std::fs::write(&in_path, &input).unwrap();
    let mut c = s.client_home.cmd();
    c.args(["acp", "connect", &s.bridge.ticket]).stdin(std::fs::File::open(&in_path).unwrap());
    let out = tokio::time::timeout(WAIT, c.output()).await.unwrap().unwrap();
    assert!(out.status.success(), "connect failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout.len(), input.len());
    assert!(out.stdout == input, "output differs from input");
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_dials_a_bare_node_id_in_hex_and_base32_through_its_relay() {
    let s = Setup::with_relay("acp", &[], &agent(&["cat"]), true).await;
    let id = s.bridge.node_id;
    for target in [id.to_string(), thunderbolt_shared::node_id_base32(&id)] {
        let out = connect_to(&s, &target, b"{\"a\":1}\n").await;
        assert!(out.status.success(), "connect {target}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.stdout, b"{\"a\":1}\n", "connect {target}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_peer_spawns_nothing_then_allow_admits_without_restart() {
    let mut s = Setup::with_relay("acp", &[], &[], false).await;
    // Re-start with a pid-file agent so we can tell whether anything was spawned.
    let pid_file = s.path("agent.pid");
    s.restart(&agent(&["--pid-file", &pid_file, "cat"])).await;
    let bridge = &s.bridge;
    let line = b"{\"jsonrpc\":\"2.0\",\"method\":\"ping\"}\n";

    let mut c = s.client_home.cmd();
    c.args(["acp", "connect", &bridge.ticket])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child.stdin.take().unwrap().write_all(line).await.unwrap();
    let out = tokio::time::timeout(WAIT, child.wait_with_output()).await.unwrap().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused connect must exit non-zero");
    let own = s.client_home.node_id("acp").await;
    assert!(
        err.contains(&format!(
            "error: the bridge refused the connection: not allowlisted: on the bridge's machine run \
             `thunderbolt iroh allow {own}` (or `thunderbolt iroh pair` there, and pair this device with the code or \
             link it prints)"
        )),
        "stderr: {err}"
    );
    assert!(!err.contains("connected"), "a refused client must not say it connected: {err}");
    assert!(out.stdout.is_empty());
    bridge.log.wait_for("not allowlisted").await;
    assert!(!std::path::Path::new(&pid_file).exists(), "an agent was spawned for a refused peer");

    // Allow it: the very next connection is admitted, no restart.
    s.bridge_home.allow(&s.client_home.node_id("acp").await).await;
    let mut c = s.client_home.cmd();
    c.args(["acp", "connect", &bridge.ticket])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(line).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(WAIT, child.wait_with_output()).await.unwrap().unwrap();
    assert!(out.status.success(), "allowed connect failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, line);
    assert!(std::path::Path::new(&pid_file).exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn acp_and_mcp_have_distinct_identities_and_alpns() {
    let s = Setup::with_relay("mcp", &[], &agent(&["cat"]), true).await;
    let acp_id = s.bridge_home.node_id("acp").await;
    let mcp_id = s.bridge_home.node_id("mcp").await;
    assert_ne!(acp_id, mcp_id);
    assert_eq!(s.bridge.node_id, mcp_id, "the MCP bridge serves the MCP identity");
    assert!(s.bridge.banner.contains("thunderbolt/mcp/0"));

    // An ACP client cannot reach the MCP bridge: the handshake fails on ALPN.
    let ep = s.client(false).await;
    let ticket: EndpointTicket = s.bridge.ticket.parse().unwrap();
    let res = tokio::time::timeout(WAIT, ep.connect(ticket.endpoint_addr().clone(), &Protocol::acp().alpn()))
        .await
        .unwrap();
    assert!(res.is_err(), "ACP ALPN must not reach an MCP bridge");
    let out = s.client_home.run(&["acp", "connect", &s.bridge.ticket]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ALPN") && err.contains("acp"), "stderr: {err}");

    // The MCP client gets through.
    let conn = s.bridge.dial(&ep, &Protocol::mcp().alpn()).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    write_all(&mut send, b"{\"id\":1}\n").await;
    send.finish().unwrap();
    assert_eq!(read_all(&mut recv).await, b"{\"id\":1}\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_exit_delivers_the_final_line() {
    let s = Setup::with_relay("acp", &[], &agent(&["final"]), true).await;
    let ep = s.client(false).await;
    let conn = s.bridge.dial(&ep, &Protocol::acp().alpn()).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    write_all(&mut send, b"{\"hello\":1}\n").await;
    let got = read_all(&mut recv).await;
    let expected = format!("{{\"final\":true,\"payload\":\"{}\"}}\n", "x".repeat(256 * 1024));
    assert_eq!(got.len(), expected.len());
    assert!(got == expected.as_bytes());
    // After the last byte: how the agent ended, never a refusal.
    assert_eq!(closed_with(&conn).await, (2, "agent exited (code 0)".to_string()));
}

/// The bridge asks its peer to acknowledge within 1 ms (QUIC's ACK frequency
/// extension): with QUIC's own 25 ms a full-duplex transfer through
/// `connect` stopped for an acknowledgement several times a second
/// (`limits::ACK_DELAY_ASKED`). The ask is an ACK_FREQUENCY frame, sent once
/// the handshake is done.
#[tokio::test(flavor = "multi_thread")]
async fn the_bridge_asks_its_peer_to_acknowledge_promptly() {
    let s = Setup::with_relay("acp", &[], &agent(&["cat"]), true).await;
    let ep = s.client(false).await;
    let line = b"{\"jsonrpc\":\"2.0\",\"method\":\"n\"}\n";
    let (conn, mut send, mut recv) = s.open_session(&ep, line).await;
    let mut buf = Vec::new();
    // Echoes go both ways until the frame has arrived (bounded: it comes with
    // the bridge's first packets after the handshake).
    let mut asked = conn.stats().frame_rx.ack_frequency;
    for _ in 0..50 {
        if asked > 0 {
            break;
        }
        let echoed = read_until(&mut recv, &mut buf, |v| v["method"] == "n").await;
        assert_eq!(echoed.len(), 1, "the cat agent echoes the line");
        write_all(&mut send, line).await;
        asked = conn.stats().frame_rx.ack_frequency;
    }
    assert!(asked > 0, "the bridge never asked for prompt acknowledgements: {:?}", conn.stats().frame_rx);
    conn.close(0u32.into(), b"done");
}

#[tokio::test(flavor = "multi_thread")]
async fn client_close_kills_the_agent() {
    let mut s = Setup::with_relay("acp", &[], &[], true).await;
    for mode in ["cat", "hang"] {
        let pid_file = s.path(&format!("{mode}.pid"));
        s.restart(&agent(&["--pid-file", &pid_file, mode])).await;
        let bridge = &s.bridge;
        let ep = s.client(false).await;
        let (conn, _send, _recv) = s.open_session(&ep, b"{\"x\":1}\n").await;
        let pid = agent_pid(&pid_file).await;
        assert!(pid_alive(pid));
        conn.close(0u32.into(), b"client closed");
        assert!(wait_pid_gone(pid).await, "{mode} agent {pid} survived the client's close");
        bridge.log.wait_for("session ended").await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_json_gets_parse_error_and_never_reaches_agent() {
    let s = Setup::with_relay("acp", &[], &agent(&["cat"]), true).await;
    let (lines, out) = exchange_raw(&s, b"this is not json\n{\"ok\":true}\n").await;
    assert_eq!(lines.len(), 2, "expected a parse error and the echoed valid line: {lines:?}");
    let err = lines.iter().find(|v| v.get("error").is_some()).expect("parse error present");
    assert_eq!(err["error"]["code"], -32700);
    assert!(err["id"].is_null());
    assert_eq!(err["jsonrpc"], "2.0");
    assert!(lines.contains(&json!({"ok": true})));
    assert!(!String::from_utf8_lossy(&out).contains("this is not json"));
}

/// Writes `len` bytes of one JSON-RPC request line with `id`, without building it in memory.
async fn write_big_request(send: &mut SendStream, id: u64, len: usize) {
    let head = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"big\",\"params\":{{\"pad\":\"");
    let tail = b"\"}}\n";
    write_all(send, head.as_bytes()).await;
    let chunk = vec![b'z'; 1 << 20];
    let mut left = len - head.len() - tail.len();
    while left > 0 {
        let n = left.min(chunk.len());
        write_all(send, &chunk[..n]).await;
        left -= n;
    }
    write_all(send, tail).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_request_costs_only_itself() {
    let mut s = Setup::with_relay("acp", &[], &[], true).await;
    let pid_file = s.path("agent.pid");
    s.restart_with(&["--max-frame", "1M"], &agent(&["--pid-file", &pid_file, "respond", "10"])).await;
    let ep = s.client(false).await;
    let (conn, mut send, mut recv) = s.open_session(&ep, &request(1, "ping", Value::Null)).await;
    let mut buf = Vec::new();
    read_until(&mut recv, &mut buf, |v| v["id"] == 1).await;
    let pid = agent_pid(&pid_file).await;
    // 3 MiB: over the 1 MiB cap. The peer gets an error carrying the request's id.
    write_big_request(&mut send, 2, 3 << 20).await;
    let got = read_until(&mut recv, &mut buf, |v| v["id"] == 2).await;
    let err = got.last().unwrap();
    assert_eq!(err["error"]["code"], -32600, "{err}");
    assert_eq!(err["error"]["data"]["limit"], 1 << 20);
    // Unreadable head: the error says id null.
    write_all(&mut send, &vec![b'['; 2 << 20]).await;
    write_all(&mut send, b"\n").await;
    let got = read_until(&mut recv, &mut buf, |v| v.get("error").is_some()).await;
    assert!(got.last().unwrap()["id"].is_null());
    // The session goes on with the same agent.
    write_all(&mut send, &request(3, "ping", Value::Null)).await;
    let got = read_until(&mut recv, &mut buf, |v| v["id"] == 3).await;
    assert_eq!(got.last().unwrap()["result"]["ok"], true);
    assert!(pid_alive(pid), "the agent must survive a peer's oversized message");
    assert!(conn.close_reason().is_none());
    s.bridge.log.wait_for("over the 1048576-byte frame limit").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn default_frame_limit_carries_a_20_mib_message() {
    let s = Setup::with_relay("acp", &[], &agent(&["respond", "10"]), true).await;
    let ep = s.client(false).await;
    let (_conn, mut send, mut recv) = s.open_session(&ep, &request(1, "ping", Value::Null)).await;
    write_big_request(&mut send, 2, 20 << 20).await;
    let mut buf = Vec::new();
    let got = read_until(&mut recv, &mut buf, |v| v["id"] == 2).await;
    assert_eq!(got.last().unwrap()["result"]["pad"], "p".repeat(10), "the agent answered the 20 MiB request");
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_agent_response_becomes_an_error_for_its_id() {
    let s = Setup::with_relay("acp", &["--max-frame", "64K"], &agent(&["respond", "200000"]), true).await;
    let ep = s.client(false).await;
    let (_conn, mut send, mut recv) = s.open_session(&ep, &request(7, "big", Value::Null)).await;
    let mut buf = Vec::new();
    let got = read_until(&mut recv, &mut buf, |v| v["id"] == 7).await;
    let err = got.last().unwrap();
    assert_eq!(err["error"]["code"], -32603, "{err}");
    write_all(&mut send, &request(8, "ping", Value::Null)).await;
    let got = read_until(&mut recv, &mut buf, |v| v["id"] == 8).await;
    assert_eq!(got.last().unwrap()["result"]["ok"], true);
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_utf8_never_reaches_the_agent() {
    let s = Setup::with_relay("acp", &[], &agent(&["cat"]), true).await;
    let (lines, out) = exchange_raw(&s, b"{\"s\":\"\xff\xfe bad\"}\n{\"ok\":true}\n").await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines.contains(&json!({"ok": true})));
    assert!(lines.iter().any(|v| v["error"]["code"] == -32700));
    assert!(!out.windows(3).any(|w| w == b"bad"));
}

#[tokio::test(flavor = "multi_thread")]
async fn full_acp_exchange_with_the_builtin_agent_over_the_relay() {
    let s = Setup::with_relay("acp", &[], &[], true).await;
    // Relay only: the client has no IP transport at all.
    let ep = s.client(true).await;
    let conn = s.bridge.dial(&ep, &Protocol::acp().alpn()).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let mut buf = Vec::new();
    let req = |id: u64, method: &str, params: Value| {
        let mut v =
            serde_json::to_vec(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params})).unwrap();
        v.push(b'\n');
        v
    };
    write_all(&mut send, &req(1, "initialize", json!({"protocolVersion":1,"clientCapabilities":{}}))).await;
    let init = read_until(&mut recv, &mut buf, |v| v["id"] == 1).await;
    assert_eq!(init.last().unwrap()["result"]["protocolVersion"], 1);

    write_all(&mut send, &req(2, "session/new", json!({"cwd":"/tmp","mcpServers":[]}))).await;
    let new = read_until(&mut recv, &mut buf, |v| v["id"] == 2).await;
    let sid = new.last().unwrap()["result"]["sessionId"].as_str().expect("sessionId").to_string();

    write_all(
        &mut send,
        &req(
            3,
            "session/prompt",
            json!({"sessionId":sid,"prompt":[{"type":"text","text":"hello over iroh"}]}),
        ),
    )
    .await;
    let msgs = read_until(&mut recv, &mut buf, |v| v["id"] == 3).await;
    let updates: Vec<&Value> = msgs.iter().filter(|v| v["method"] == "session/update").collect();
    assert!(updates.len() >= 2, "reply should stream as several chunks: {msgs:?}");
    let text: String = updates
        .iter()
        .inspect(|u| {
            assert_eq!(u["params"]["sessionId"], sid.as_str());
            assert_eq!(u["params"]["update"]["sessionUpdate"], "agent_message_chunk");
        })
        .map(|u| u["params"]["update"]["content"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "You said: hello over iroh");
    assert_eq!(msgs.last().unwrap()["result"]["stopReason"], "end_turn");

    // The path really was the relay.
    let paths: Vec<String> = conn.paths().iter().map(|p| format!("{:?}", p.remote_addr())).collect();
    assert!(paths.iter().all(|p| p.contains("Relay")), "paths: {paths:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn spawn_failure_is_reported_to_the_peer() {
    let mut s = Setup::with_relay("acp", &[], &[], true).await;
    // A script that exists at startup and is gone when the peer arrives.
    let script = s.path("vanishing-agent");
    std::fs::write(&script, "#!/bin/sh\nexec cat\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    s.restart(std::slice::from_ref(&script)).await;
    std::fs::remove_file(&script).unwrap();
    let ep = s.client(false).await;
    let (conn, _send, _recv) = s.open_session(&ep, b"{}\n").await;
    let (code, reason) = closed_with(&conn).await;
    assert_eq!(code, 1);
    assert_eq!(reason, format!("failed to spawn '{script}'"));
}

#[tokio::test(flavor = "multi_thread")]
async fn peer_that_opens_no_stream_is_closed_idle() {
    let s = Setup::with_relay("acp", &["--stream-open-timeout", "0.3"], &agent(&["cat"]), true).await;
    let ep = s.client(false).await;
    let conn = s.bridge.dial(&ep, &Protocol::acp().alpn()).await;
    let (code, reason) = closed_with(&conn).await;
    assert_eq!((code, reason.as_str()), (1, close::REASON_IDLE));
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_ends_the_bridge_and_its_agents() {
    let mut s = Setup::with_relay("acp", &[], &[], true).await;
    let pid_file = s.path("agent.pid");
    s.restart(&agent(&["--pid-file", &pid_file, "hang"])).await;
    let ep = s.client(false).await;
    let (conn, _send, _recv) = s.open_session(&ep, b"{}\n").await;
    let pid = agent_pid(&pid_file).await;
    let status = s.bridge.terminate().await;
    assert!(status.success(), "bridge exit status after SIGTERM: {status:?}");
    assert!(!pid_alive(pid), "agent {pid} outlived the bridge");
    // The log counts the sessions it ends (not its own tasks).
    s.bridge.log.wait_for("shutting down: ending 1 session(s)").await;
    let (code, reason) = closed_with(&conn).await;
    assert_eq!((code, reason.as_str()), (1, close::REASON_SHUTTING_DOWN));
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_stderr_goes_to_the_log_and_stdout_noise_is_dropped() {
    let mut s = Setup::with_relay("acp", &[], &agent(&["stderr"]), true).await;
    let ep = s.client(false).await;
    let conn = s.bridge.dial(&ep, &Protocol::acp().alpn()).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    write_all(&mut send, b"{\"a\":1}\n").await;
    send.finish().unwrap();
    assert_eq!(read_all(&mut recv).await, b"{\"a\":1}\n", "stderr must never reach the peer");
    s.bridge.log.wait_for("test-agent says hello on stderr").await;
    let short = s.client_home.node_id("acp").await.fmt_short().to_string();
    let line = s.bridge.log.text().lines().find(|l| l.contains("says hello")).unwrap().to_string();
    assert!(line.contains(&short), "stderr line not tagged with the peer: {line}");

    s.restart(&agent(&["noise"])).await;
    let noisy = &s.bridge;
    let (_conn, mut send, mut recv) = s.open_session(&ep, b"{\"b\":2}\n").await;
    send.finish().unwrap();
    assert_eq!(read_all(&mut recv).await, b"{\"b\":2}\n");
    noisy.log.wait_for("non-JSON line").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_key_dialing_directly_is_refused() {
    // A stranger with a fresh key, dialing the direct address (no relay involved).
    let s = Setup::with_relay("acp", &[], &agent(&["cat"]), true).await;
    let stranger = client_endpoint(SecretKey::generate(), None, false).await;
    let conn = s.bridge.dial(&stranger, &Protocol::acp().alpn()).await;
    let (code, reason) = closed_with(&conn).await;
    assert_eq!((code, reason.as_str()), (1, close::REASON_NOT_ALLOWLISTED));
    let _ = Duration::ZERO;
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_runs_a_local_client_against_the_remote_agent() {
    let s = Setup::with_relay("acp", &[], &[], true).await;
    // A local "client": sends initialize, reads one reply line, saves it.
    let out = s.path("reply.json");
    let script = format!(
        "echo '{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{{\"protocolVersion\":1}}}}'; \
         read -r line; printf '%s' \"$line\" > {out}"
    );
    let o = tokio::time::timeout(
        WAIT,
        s.client_home.cmd().args(["acp", "connect", &s.bridge.ticket, "--", "sh", "-c", &script]).output(),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(o.status.success(), "connect failed: {}", String::from_utf8_lossy(&o.stderr));
    let reply: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(reply["id"], 1);
    assert_eq!(reply["result"]["agentInfo"]["name"], "thunderbolt-echo");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_the_bridge_leaves_no_orphan_agent() {
    let mut s = Setup::with_relay("acp", &[], &[], true).await;
    let pid_file = s.path("agent.pid");
    s.restart(&agent(&["--pid-file", &pid_file, "hang"])).await;
    let ep = s.client(false).await;
    let (_conn, _send, _recv) = s.open_session(&ep, b"{}\n").await;
    let pid = agent_pid(&pid_file).await;
    // No chance to clean up: the kernel's parent-death signal must end the agent.
    signal(s.bridge.pid(), libc::SIGKILL);
    let _ = s.bridge.child.wait().await;
    assert!(wait_pid_gone(pid).await, "agent {pid} outlived a SIGKILLed bridge");
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_or_sigterm_on_connect_closes_the_session_cleanly_and_exits_like_a_signal() {
    use tokio::io::AsyncBufReadExt;
    let s = Setup::with_relay("acp", &[], &agent(&["cat"]), true).await;
    // Resumable and plain; 128 + the signal, as a shell reports it (0 is for the agent's success).
    for (extra, sig, code) in [(&[][..], libc::SIGINT, 130), (&["--no-resume"][..], libc::SIGTERM, 143)] {
        let closes = s.bridge.log.text().matches("client closed").count();
        let mut args = extra.to_vec();
        args.push(&s.bridge.ticket);
        let (mut child, log) = s.client_home.connect(&args);
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"{\"hello\":1}\n").await.unwrap();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let echoed = tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap();
        assert_eq!(echoed.as_deref(), Some("{\"hello\":1}"));
        signal(child.id().unwrap(), sig);
        let status = tokio::time::timeout(WAIT, child.wait()).await.unwrap().unwrap();
        let text = log.finished().await;
        assert_eq!(status.code(), Some(code), "connect {extra:?} after signal {sig}: {text}");
        assert!(!text.contains("error:"), "a signal is not an error: {text}");
        s.bridge.log.wait_for_count("client closed", closes + 1).await;
        drop(stdin);
    }
}

/// Runs `acp connect` as the client home, writes `input`, closes stdin, and
/// returns its output.
/// The pipes a client gives `connect` are read and written without blocking
/// while it runs and are blocking again once it is done (a parent that shares
/// one is left as it was); an output shared with the log (`2>&1`) loses
/// nothing of either.
#[tokio::test(flavor = "multi_thread")]
async fn connect_on_pipes_puts_them_back_as_they_were_and_shares_its_output_with_its_log() {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    let s = Setup::with_relay("acp", &[], &agent(&["cat"]), true).await;
    let (in_r, mut in_w) = std::io::pipe().unwrap();
    let (mut out_r, out_w) = std::io::pipe().unwrap();
    // The same description as the child's stdin: what its flags are, we see.
    let in_shared = in_r.try_clone().unwrap();
    let nonblocking = || unsafe { libc::fcntl(in_shared.as_raw_fd(), libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    let mut c = s.client_home.cmd();
    c.args(["acp", "connect", &s.bridge.ticket]).stdin(in_r).stdout(out_w.try_clone().unwrap()).stderr(out_w);
    let mut child = c.spawn().unwrap();
    drop(c);
    let output = std::thread::spawn(move || {
        let mut all = Vec::new();
        out_r.read_to_end(&mut all).unwrap();
        all
    });
    tokio::time::timeout(WAIT, async {
        while !nonblocking() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("connect reads its stdin pipe without blocking");
    let mut input = Vec::new();
    for i in 0..2000 {
        input.extend_from_slice(
            format!("{{\"jsonrpc\":\"2.0\",\"method\":\"x\",\"params\":{{\"i\":{i}}}}}\n").as_bytes(),
        );
    }
    input.extend_from_slice(format!("{{\"big\":\"{}\"}}\n", "y".repeat(1 << 20)).as_bytes());
    let writer = std::thread::spawn(move || {
        in_w.write_all(&input).unwrap();
        input
    });
    let status = tokio::time::timeout(WAIT, child.wait()).await.expect("connect ends").unwrap();
    let input = writer.join().unwrap();
    let all = output.join().unwrap();
    let text = String::from_utf8_lossy(&all);
    assert!(status.success(), "{text}");
    assert!(
        all.windows(input.len()).any(|w| w == input),
        "the echo is whole and in order within the shared output: {}",
        &text[..text.len().min(2000)]
    );
    assert!(text.contains("connected"), "the log went to the same pipe: {}", &text[..text.len().min(2000)]);
    assert!(!nonblocking(), "the pipe is blocking again once connect is done");
}

/// A client whose relay cannot be reached (offline, or relays blocked) ends
/// a session that went well without an error in its log: with the default
/// log filter, iroh's relay transport logged "ERROR relay_recv_channel
/// closed" at every exit (a race in its own shutdown).
#[tokio::test(flavor = "multi_thread")]
async fn connect_with_an_unreachable_relay_ends_without_an_error_line() {
    let s = Setup::with_relay("acp", &[], &agent(&["cat"]), true).await;
    let line = b"{\"jsonrpc\":\"2.0\",\"method\":\"n\"}\n";
    // The race is won most of the time by a release build, a third of the
    // time by a debug one: ten sessions, so that a regression shows.
    for _ in 0..10 {
        let mut c = s.client_home.cmd();
        // Nothing listens there: the relay is configured and never reached.
        c.env("THUNDERBOLT_IROH_RELAY_URL", "http://127.0.0.1:1").env_remove("RUST_LOG");
        c.args(["acp", "connect", &s.bridge.ticket]);
        let out = run_with_input(c, line).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert_eq!(out.stdout, line, "the echo arrived; log: {err}");
        assert!(err.contains("connected"), "the default filter shows our own lines: {err}");
        assert!(!err.contains("ERROR"), "a session that went well logs no error: {err}");
    }
}

async fn connect_with(s: &Setup, input: &[u8]) -> std::process::Output {
    connect_to(s, &s.bridge.ticket, input).await
}

/// `connect TARGET` as the client home, `input` on its stdin, until it exits.
async fn connect_to(s: &Setup, target: &str, input: &[u8]) -> std::process::Output {
    connect_from(&s.client_home, target, input).await
}

/// `connect TARGET` as `home`, `input` on its stdin, until it exits.
async fn connect_from(home: &Tb, target: &str, input: &[u8]) -> std::process::Output {
    let mut c = home.cmd();
    c.args(["acp", "connect", target]);
    run_with_input(c, input).await
}

/// Runs `c` with `input` on its stdin (then closed), until it exits.
async fn run_with_input(mut c: tokio::process::Command, input: &[u8]) -> std::process::Output {
    c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).await.unwrap();
    drop(stdin);
    tokio::time::timeout(WAIT, child.wait_with_output()).await.expect("connect ends in time").unwrap()
}

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

#[tokio::test(flavor = "multi_thread")]
async fn how_the_agent_ended_reaches_connect() {
    let mut s = Setup::with_relay("acp", &[], &agent(&["exit", "0"]), true).await;
    let out = connect_with(&s, b"{\"a\":1}\n").await;
    assert!(out.status.success(), "agent exit 0 → connect exit 0: {}", String::from_utf8_lossy(&out.stderr));

    s.restart(&agent(&["exit", "3"])).await;
    let out = connect_with(&s, b"{\"a\":1}\n").await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "agent exit 3 → connect must fail; stderr: {err}\nbridge: {}",
        s.bridge.log.text()
    );
    assert!(err.contains("the agent exited with code 3"), "stderr: {err}");
    s.bridge.log.wait_for("session ended: agent exited (code 3)").await;

    // Answers, then dies of SIGKILL: the answer arrives, and so does the signal.
    s.restart(&sh("read -r l; echo \"$l\"; kill -9 $$")).await;
    let out = connect_with(&s, b"{\"last\":1}\n").await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.stdout, b"{\"last\":1}\n");
    assert!(!out.status.success());
    assert!(err.contains("killed by signal 9 (SIGKILL)"), "stderr: {err}");
    assert_eq!(err.lines().filter(|l| l.contains("error")).count(), 1, "one line naming it: {err}");
}

/// An agent that gives up says why on stderr and exits non-zero: that line
/// reaches the client with its exit, masked like the banner masks secrets.
#[tokio::test(flavor = "multi_thread")]
async fn why_the_agent_ended_reaches_the_client() {
    let script = "echo 'starting up' >&2; echo 'missing API key ANTHROPIC_API_KEY' >&2; echo >&2; exit 3";
    let mut s = Setup::with_relay("acp", &[], &sh(script), true).await;
    let out = connect_with(&s, b"{\"a\":1}\n").await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "stderr: {err}");
    assert!(
        err.contains("the agent exited with code 3: missing API key ANTHROPIC_API_KEY"),
        "stderr: {err}\nbridge: {}",
        s.bridge.log.text()
    );

    // On the plain protocol the close reason carries it; a secret is masked.
    s.restart(&sh("echo 'fatal: rejected --api-key hunter2-secret' >&2; exit 3")).await;
    let ep = s.client(false).await;
    let (conn, _send, _recv) = s.open_session(&ep, b"{\"x\":1}\n").await;
    let (code, reason) = closed_with(&conn).await;
    assert_eq!((code, reason.as_str()), (2, "agent exited (code 3) — fatal: rejected --api-key ***"));
    // connect on the plain protocol says it the same way (the first one was resumable).
    let mut c = s.client_home.cmd();
    c.args(["acp", "connect", "--no-resume", &s.bridge.ticket]);
    let out = run_with_input(c, b"{\"a\":1}\n").await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the agent exited with code 3: fatal: rejected --api-key ***"), "stderr: {err}");
    assert!(!err.contains("hunter2"), "stderr: {err}");
    // An agent that ended well is told as before, whatever it wrote.
    s.restart(&sh("echo 'bye' >&2; exit 0")).await;
    let (conn, _send, _recv) = s.open_session(&ep, b"{\"x\":1}\n").await;
    assert_eq!(closed_with(&conn).await, (2, "agent exited (code 0)".to_string()));
}

/// `connect` run in the bridge's own home would dial with the bridge's own
/// identity: it says so, and what to do, before any dial (not iroh's
/// `Connecting to ourself is not supported`).
#[tokio::test(flavor = "multi_thread")]
async fn connect_from_the_bridges_own_home_says_it_would_dial_itself() {
    let s = Setup::with_relay("acp", &[], &agent(&["cat"]), true).await;
    let out = connect_from(&s.bridge_home, &s.bridge.ticket, b"{\"a\":1}\n").await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("this is the bridge of this very home"), "{err}");
    assert!(err.contains("THUNDERBOLT_HOME=<another folder> thunderbolt acp connect"), "{err}");
    assert!(!err.contains("ourself"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_ends_even_when_a_grandchild_holds_stdout() {
    let mut s = Setup::with_relay("acp", &[], &[], true).await;
    let child_pid = s.path("grandchild.pid");
    // The agent exits at once, leaving a background child holding its stdout.
    let script = format!("sleep 1004 </dev/null & echo $! > {child_pid}; exit 0");
    s.restart_with(&["--max-agents", "1"], &sh(&script)).await;
    let ep = s.client(false).await;
    for round in 0..2 {
        let (conn, mut send, _recv) = s.open_session(&ep, b"{\"x\":1}\n").await;
        let pid: u32 = wait_file(child_pid.as_ref()).await.trim().parse().unwrap();
        std::fs::remove_file(&child_pid).unwrap();
        // Writing to the gone agent's stdin fails; the session must still end.
        let _ = send.write_all(b"{\"y\":2}\n").await;
        let (code, reason) = closed_with(&conn).await;
        assert_eq!((code, reason.as_str()), (2, "agent exited (code 0)"), "round {round}");
        assert!(wait_pid_gone(pid).await, "grandchild {pid} outlived its session");
    }
    // The second round got the only slot: the first one's was freed.
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_that_stops_listening_cannot_hold_its_slot() {
    let mut s = Setup::with_relay("acp", &[], &[], true).await;
    let pid_file = s.path("agent.pid");
    // Closes stdin, keeps stdout open, runs on.
    let script = format!("echo $$ > {pid_file}; exec 0<&-; exec sleep 1004");
    s.restart_with(&["--max-agents", "1"], &sh(&script)).await;
    let ep = s.client(false).await;
    let (conn, mut send, _recv) = s.open_session(&ep, b"{\"x\":1}\n").await;
    let pid = agent_pid(&pid_file).await;
    let _ = send.write_all(b"{\"y\":2}\n").await;
    // The peer leaves: the agent goes and the slot is free for the next peer.
    conn.close(0u32.into(), b"client closed");
    assert!(wait_pid_gone(pid).await, "agent {pid} survived its peer");
    std::fs::remove_file(&pid_file).unwrap();
    let (_conn, mut send, _recv) = s.open_session(&ep, b"{\"x\":1}\n").await;
    let pid = agent_pid(&pid_file).await;
    let _ = send.write_all(b"{\"y\":2}\n").await;
    // And SIGTERM ends the bridge promptly even with such a session open.
    let started = std::time::Instant::now();
    assert!(s.bridge.terminate().await.success());
    assert!(started.elapsed() < Duration::from_secs(5), "SIGTERM took {:?}", started.elapsed());
    assert!(!pid_alive(pid));
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_the_bridge_leaves_no_grandchild() {
    let mut s = Setup::with_relay("acp", &[], &[], true).await;
    let child_pid = s.path("grandchild.pid");
    let cat = test_agent_bin().display().to_string();
    s.restart(&sh(&format!("sleep 1004 </dev/null & echo $! > {child_pid}; exec {cat} cat"))).await;
    let ep = s.client(false).await;
    let (_conn, _send, _recv) = s.open_session(&ep, b"{}\n").await;
    let pid: u32 = wait_file(child_pid.as_ref()).await.trim().parse().unwrap();
    signal(s.bridge.pid(), libc::SIGKILL);
    let _ = s.bridge.child.wait().await;
    assert!(wait_pid_gone(pid).await, "grandchild {pid} outlived a SIGKILLed bridge");
}

#[tokio::test(flavor = "multi_thread")]
async fn dial_timeout_is_kept_and_the_exit_is_clean() {
    let mut s = Setup::with_relay("acp", &[], &agent(&["cat"]), true).await;
    s.bridge.terminate().await;
    let started = std::time::Instant::now();
    let out = s.client_home.run(&["acp", "connect", "--dial-timeout", "1", &s.bridge.ticket]).await;
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("within 1s"), "stderr: {err}");
    assert!(!err.contains("ERROR") && !err.contains("Endpoint dropped"), "no shutdown noise: {err}");
    assert!(!err.contains("connected"), "nothing was connected: {err}");
    // The dial's own bound plus start-up, not plus seconds of draining (before: 1 s + 2 s).
    assert!(took < Duration::from_millis(2500), "--dial-timeout 1 took {took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_gets_one_stream_and_nothing_else() {
    use futures::FutureExt;
    let s = Setup::with_relay("acp", &[], &agent(&["cat"]), true).await;
    let ep = s.client(false).await;
    let (conn, _send, mut recv) = s.open_session(&ep, b"{\"a\":1}\n").await;
    let mut buf = Vec::new();
    // The session runs: the bridge's transport parameters are known to us now.
    read_until(&mut recv, &mut buf, |v| v["a"] == 1).await;
    assert!(conn.open_uni().now_or_never().is_none(), "no unidirectional stream may be opened");
    assert!(conn.open_bi().now_or_never().is_none(), "no second bidirectional stream may be opened");
    assert_eq!(conn.max_datagram_size(), None, "the bridge takes no datagrams");
    // A default endpoint would have granted all of these (the check can fail).
    let other = client_endpoint(SecretKey::generate(), None, false).await;
    let echo_alpn = b"test/echo".to_vec();
    let server =
        loopback_endpoint(SecretKey::generate(), None, false, vec![echo_alpn.clone()]).await.unwrap();
    let addr = server.addr();
    let accept = tokio::spawn(async move {
        let c = server.accept().await.unwrap().await.unwrap();
        let _ = c.closed().await;
    });
    let c = other.connect(addr, &echo_alpn).await.unwrap();
    assert!(c.open_uni().await.is_ok());
    assert!(c.max_datagram_size().is_some());
    c.close(0u32.into(), b"done");
    let _ = accept.await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_on_agent_stderr_is_counted_not_logged() {
    let cat = test_agent_bin().display().to_string();
    let s = Setup::with_relay(
        "acp",
        &[],
        &sh(&format!("yes noise-line | head -n 20000 >&2; exec {cat} cat")),
        true,
    )
    .await;
    let ep = s.client(false).await;
    let (_conn, mut send, mut recv) = s.open_session(&ep, b"{\"a\":1}\n").await;
    send.finish().unwrap();
    assert_eq!(read_all(&mut recv).await, b"{\"a\":1}\n", "the session works through the flood");
    s.bridge.log.wait_for("line(s) not logged").await;
    let logged = s.bridge.log.text().lines().filter(|l| l.contains("agent stderr: noise-line")).count();
    assert!((1..=250).contains(&logged), "{logged} of 20000 stderr lines logged");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_killed_without_a_close_frees_its_agent_after_the_idle_timeout() {
    use tokio::io::AsyncBufReadExt;
    let mut s = Setup::with_relay("acp", &[], &[], true).await;
    let pid_file = s.path("agent.pid");
    s.restart_with(&["--idle-timeout", "4"], &agent(&["--pid-file", &pid_file, "cat"])).await;
    let mut c = s.client_home.cmd();
    // The plain protocol: a resumable session would wait for the client (tests/tests/resume.rs).
    c.args(["acp", "connect", "--no-resume", &s.bridge.ticket]).stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"{\"hello\":1}\n").await.unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let echoed = tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap();
    assert_eq!(echoed.as_deref(), Some("{\"hello\":1}"));
    let pid = agent_pid(&pid_file).await;
    // No close frame, no more packets: only the silence tells.
    signal(child.id().unwrap(), libc::SIGKILL);
    let killed = std::time::Instant::now();
    assert!(wait_pid_gone(pid).await, "agent {pid} outlived its vanished client");
    let took = killed.elapsed();
    // The idle timeout (4 s) plus the agent's termination, not QUIC's default 30 s.
    assert!(took < Duration::from_secs(9), "the agent was freed after {took:?}");
    s.bridge.log.wait_for("peer gone").await;
    drop(stdin);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_bridges_secrets_never_reach_the_agent() {
    init_tracing();
    let relay = LocalRelay::start().await;
    let bridge_home = Tb::new(Some(&relay))
        .with_env("THUNDERBOLT_NOTIFY_URL", "http://127.0.0.1:9/hook?key=s3cret-in-the-url")
        .with_env("THUNDERBOLT_SOME_FUTURE_SECRET", "s3cret-of-the-bridge")
        .with_env("NOTIFY_SOCKET", "/nonexistent/s3cret-socket")
        .with_env("AGENT_SETTING", "kept");
    let client_home = Tb::new(Some(&relay));
    bridge_home.allow(&client_home.node_id("acp").await).await;
    // The agent tells what of its environment names the secrets, and what else it got.
    let script = "read -r l; printf '{\"leaked\":%s,\"setting\":\"%s\",\"path\":%s}\\n' \
        \"$(env | grep -c s3cret)\" \"$AGENT_SETTING\" \"$([ -n \"$PATH\" ] && echo true || echo false)\"";
    let bridge = bridge_home.bridge("acp", &[], &strs(&sh(script))).await;
    let s =
        Setup { relay: Some(relay), bridge_home, client_home, bridge, work: tempfile::tempdir().unwrap() };
    let out = connect_with(&s, b"{\"a\":1}\n").await;
    let reply: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("one JSON line: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(reply, serde_json::json!({"leaked": 0, "setting": "kept", "path": true}));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_dials_once_per_prompt_is_never_held_back() {
    // acpx and scripts run `connect` once per prompt: twenty in a few seconds
    // from one allowed device at one address, against a budget of ten per
    // ten seconds that is there for strangers (and under the device's own
    // budget, PER_DEVICE_MAX, with room to spare: a slow run never meets it).
    init_tracing();
    let bridge_home = Tb::new(None);
    let client_home = Tb::new(None);
    bridge_home.allow(&client_home.node_id("acp").await).await;
    let bridge = bridge_home.bridge("acp", &[], &strs(&agent(&["cat"]))).await;
    const PROMPTS: usize = 20;
    let started = std::time::Instant::now();
    for i in 0..PROMPTS {
        let out =
            connect_from(&client_home, &bridge.ticket, format!("{{\"prompt\":{i}}}\n").as_bytes()).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.stdout, format!("{{\"prompt\":{i}}}\n").as_bytes(), "prompt {i}: {err}");
        assert!(!err.contains("retry") && !err.contains("again"), "prompt {i} had to dial again: {err}");
    }
    let took = started.elapsed();
    let log = bridge.log.text();
    assert!(!log.contains("over its connection budget"), "an allowed device was held back:\n{log}");
    assert_eq!(log.matches("admitted").count(), PROMPTS, "{log}");
    eprintln!("{PROMPTS} sequential connects took {took:?}");
}
