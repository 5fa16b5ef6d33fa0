//! Your agent reaches you: `thunderbolt note` and the host's socket
//! (`reach.sock`) against a real bridge; the push decrypted by the stand-in
//! push service's own code; a device reading and answering over
//! `thunderbolt/acp/reach1`; replies returned once, across restarts.

use std::{os::unix::fs::PermissionsExt, path::Path};

use iroh::Endpoint;
use serde_json::{json, Value};
use thunderbolt_tests::{
    push::{PushService, LOOPBACK},
    r1::{agent, Setup},
    setup::call,
    WAIT,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::UnixStream,
};

/// One request on the home's socket, its one answer.
async fn socket(home: &Path, req: Value) -> Value {
    let mut s = UnixStream::connect(home.join("reach.sock")).await.expect("reach.sock listens");
    let mut line = serde_json::to_vec(&req).unwrap();
    line.push(b'\n');
    s.write_all(&line).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(WAIT, BufReader::new(s).read_line(&mut answer))
        .await
        .expect("an answer in time")
        .unwrap();
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

/// One request on the messages door, as a device; its one answer.
async fn door(s: &Setup, ep: &Endpoint, req: Value) -> Value {
    let conn = s.bridge.dial(ep, b"thunderbolt/acp/reach1").await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let mut line = serde_json::to_vec(&req).unwrap();
    line.push(b'\n');
    send.write_all(&line).await.unwrap();
    send.finish().unwrap();
    let answer = tokio::time::timeout(WAIT, recv.read_to_end(1 << 20)).await.expect("in time").unwrap();
    serde_json::from_slice(&answer).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&answer)))
}

/// The stand-in push service, a bridge, and a device subscribed to notices on
/// a session of its own, as the page does (the session is kept open).
async fn subscribed() -> (PushService, Setup, Endpoint, iroh::endpoint::Connection) {
    let mut svc = PushService::start().await;
    let s = Setup::with_env(&[], &agent(&[]), LOOPBACK).await;
    svc.log = s.bridge.log.clone();
    let ep = s.endpoint(&s.client_home).await;
    let (conn, mut send, mut recv, _) = s.session(&ep).await;
    let mut buf = Vec::new();
    let r = call(&mut send, &mut recv, &mut buf, 1, "_thunderbolt/push/subscribe", svc.ok.clone()).await;
    assert_eq!(r["result"]["subscribed"], true, "{r}");
    s.bridge.log.wait_for("admitted").await;
    (svc, s, ep, conn)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_note_is_pushed_encrypted_answered_from_the_device_and_its_reply_returned_once_across_restarts() {
    let (mut svc, mut s, ep, _session) = subscribed().await;
    let home = s.bridge_home.home().to_path_buf();

    // The socket is the owner's alone.
    let mode = std::fs::metadata(home.join("reach.sock")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // A script's note: taken, and pushed end to end encrypted.
    let out = s.bridge_home.run(&["note", "--from", "nightly", "backup done: 3.2 GB"]).await;
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("sent m-1") && said.contains("pushed to 1 device"), "{said}");
    let push = svc.next_push().await;
    let notice = &push["notice"];
    assert_eq!(notice["event"], "message", "{push}");
    assert_eq!(notice["thread"], "nightly");
    assert_eq!(notice["message"], "m-1");
    assert_eq!(notice["body"], "backup done: 3.2 GB", "the decrypted payload holds the text: {notice}");
    assert_eq!(notice["node"], s.bridge.node_id.to_string(), "and the agent to reply through");

    // The device reads the thread and replies over /reach1; no agent is started for it.
    let list = door(&s, &ep, json!({"op": "threads"})).await;
    assert_eq!(list["threads"][0]["name"], "nightly", "{list}");
    assert_eq!(list["threads"][0]["items"][0]["text"], "backup done: 3.2 GB");
    assert_eq!(list["threads"][0]["items"][0]["from"], "agent");
    let r = door(&s, &ep, json!({"op": "reply", "thread": "nope", "text": "x"})).await;
    assert_eq!(r, json!({"error": "unknown thread"}));
    let r = door(&s, &ep, json!({"op": "delete", "thread": "nightly"})).await;
    assert_eq!(r, json!({"error": "bad request"}));

    // A sender waiting for a reply gets it when it is typed, once.
    let waiting = {
        let home = home.clone();
        tokio::spawn(
            async move { socket(&home, json!({"op": "replies", "from": "nightly", "wait_s": 25})).await },
        )
    };
    s.bridge.log.wait_for("message m-1").await;
    let r =
        door(&s, &ep, json!({"op": "reply", "thread": "nightly", "text": "thanks", "replyTo": "m-1"})).await;
    assert_eq!(r["ok"], true, "{r}");
    let got = tokio::time::timeout(WAIT, waiting).await.expect("the wait ends with the reply").unwrap();
    let replies = got["replies"].as_array().unwrap_or_else(|| panic!("{got}"));
    assert_eq!(replies.len(), 1, "{got}");
    assert_eq!(replies[0]["text"], "thanks");
    assert_eq!(replies[0]["replyTo"], "m-1");
    assert_eq!(replies[0]["from"], "device");
    assert_eq!(
        socket(&home, json!({"op": "replies", "from": "nightly"})).await,
        json!({"ok": true, "replies": []})
    );

    // While the device shows the thread, nothing of it is pushed to it; once it left, it is.
    door(&s, &ep, json!({"op": "threads", "viewing": "nightly"})).await;
    let out = s.bridge_home.run(&["note", "--from", "nightly", "read while shown"]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("pushed to 0 device"), "{out:?}");
    door(&s, &ep, json!({"op": "threads", "since": 0})).await;
    let out = s.bridge_home.run(&["note", "--from", "nightly", "read later"]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("pushed to 1 device"), "{out:?}");
    assert_eq!(svc.next_push().await["notice"]["body"], "read later");

    // A reply typed before a restart is returned after it, once, and never again after another.
    let r = door(&s, &ep, json!({"op": "reply", "thread": "nightly", "text": "and the logs?"})).await;
    assert_eq!(r["ok"], true, "{r}");
    s.restart(&agent(&[])).await;
    let got = socket(&home, json!({"op": "replies", "from": "nightly"})).await;
    assert_eq!(got["replies"].as_array().map(Vec::len), Some(1), "{got}");
    assert_eq!(got["replies"][0]["text"], "and the logs?");
    s.restart(&agent(&[])).await;
    assert_eq!(
        socket(&home, json!({"op": "replies", "from": "nightly"})).await,
        json!({"ok": true, "replies": []})
    );
    // The thread is still there for the device, with its five items.
    let ep = s.endpoint(&s.client_home).await;
    let list = door(&s, &ep, json!({"op": "threads"})).await;
    assert_eq!(list["threads"][0]["items"].as_array().map(Vec::len), Some(5), "{list}");
}

#[tokio::test(flavor = "multi_thread")]
async fn notes_are_rate_limited_a_huge_line_is_refused_and_another_user_is_refused() {
    let s = Setup::new(&[], &agent(&[])).await;
    let home = s.bridge_home.home().to_path_buf();

    // Ten at once; the eleventh is refused, with the rule, and `note` exits 1.
    for n in 0..10 {
        let r = socket(&home, json!({"op": "note", "text": format!("step {n}"), "from": "build"})).await;
        assert_eq!(r["ok"], true, "note {n}: {r}");
    }
    let r = socket(&home, json!({"op": "note", "text": "one too many", "from": "build"})).await;
    assert_eq!(r, json!({"error": "rate limited"}));
    let out = s.bridge_home.run(&["note", "--from", "build", "one too many"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("rate limited"), "{out:?}");

    // Bad input: a name that is not one line, an empty text, a line that is not JSON.
    let r = socket(&home, json!({"op": "note", "text": "x", "from": "a\nb"})).await;
    assert!(r["error"].as_str().unwrap().contains("one line"), "{r}");
    let r = socket(&home, json!({"op": "note", "text": "  "})).await;
    assert!(r["error"].as_str().unwrap().contains("empty"), "{r}");

    // A hostile 10 MB line: refused after 128 KiB, the connection closed, the host unharmed.
    let mut c = UnixStream::connect(home.join("reach.sock")).await.unwrap();
    let junk = vec![b'x'; 10 * 1024 * 1024];
    let _ = c.write_all(&junk).await; // the host closes before taking it all
    let mut answer = String::new();
    tokio::time::timeout(WAIT, BufReader::new(c).read_line(&mut answer)).await.unwrap().unwrap();
    assert!(answer.contains("line too long"), "{answer}");
    let status = socket(&home, json!({"op": "status"})).await;
    assert_eq!(status["ok"], true, "{status}");

    // Another user: the socket's mode keeps them out; were it opened up, its
    // peer-uid check would. (Root runs the tests in CI; as another user this
    // part cannot switch uid and checks the mode only.)
    let sock = home.join("reach.sock");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: the other-user part is skipped (the mode is checked)");
        return;
    }
    // `thunderbolt note` as user nobody.
    let as_nobody = || {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(thunderbolt_tests::thunderbolt_bin())
            .args(["note", "from another user"])
            .env("THUNDERBOLT_HOME", &home)
            .output()
            .expect("setpriv runs")
    };
    // The home is 0700: let the other user reach the socket's folder, as a careless chmod would.
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = as_nobody();
    assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"), "{out:?}");
    assert_eq!(out.status.code(), Some(1));
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_nobody();
    assert!(String::from_utf8_lossy(&out.stderr).contains("only uid 0 may use this socket"), "{out:?}");
    assert_eq!(out.status.code(), Some(1));
    s.bridge.log.wait_for("refused a client of uid Some(65534)").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_question_is_pushed_with_allow_and_deny_and_only_a_devices_answer_is_a_verdict() {
    let (mut svc, s, ep, _session) = subscribed().await;
    let home = s.bridge_home.home().to_path_buf();

    // Claude Code's permission prompt, as `thunderbolt reach --channel` hands it over.
    let asked = socket(
        &home,
        json!({"op": "ask", "from": "claude", "request_id": "tbxkq", "tool_name": "Bash",
               "description": "run the test suite", "input_preview": "{\"command\":\"npm test\"}"}),
    )
    .await;
    assert_eq!(asked["ok"], true, "{asked}");
    let q = asked["id"].as_str().unwrap().to_string();
    assert!(q.starts_with("q-"), "{asked}");
    let push = svc.next_push().await;
    assert_eq!(push["notice"]["title"], "claude asks", "{push}");
    assert_eq!(push["notice"]["body"], "Bash: run the test suite");
    assert_eq!(push["notice"]["options"][0]["kind"], "allow_once", "Allow and Deny on the notice: {push}");
    assert_eq!(push["notice"]["options"][1]["kind"], "reject_once");
    assert_eq!(push["urgency"], "high");

    // The device: a text that says yes is a reply, never a verdict.
    let r = door(&s, &ep, json!({"op": "reply", "thread": "claude", "text": "yes", "replyTo": q})).await;
    assert_eq!(r["ok"], true, "{r}");
    let got = socket(&home, json!({"op": "replies", "from": "claude"})).await;
    assert_eq!(got["replies"][0]["text"], "yes", "{got}");
    assert!(got["replies"][0].get("verdict").is_none(), "{got}");

    // Deny: the verdict, with the request's id; a second answer is refused.
    let r =
        door(&s, &ep, json!({"op": "answer", "thread": "claude", "question": q, "behavior": "deny"})).await;
    assert_eq!(r["ok"], true, "{r}");
    let r =
        door(&s, &ep, json!({"op": "answer", "thread": "claude", "question": q, "behavior": "allow"})).await;
    assert_eq!(r, json!({"error": "answered already"}));
    let r =
        door(&s, &ep, json!({"op": "answer", "thread": "claude", "question": "r-2", "behavior": "allow"}))
            .await;
    assert!(r["error"].as_str().unwrap().contains("not a question"), "{r}");
    let got = socket(&home, json!({"op": "replies", "from": "claude"})).await;
    let replies = got["replies"].as_array().unwrap();
    assert_eq!(replies.len(), 1, "{got}");
    assert_eq!(replies[0]["verdict"], json!({"behavior": "deny", "requestId": "tbxkq"}));

    // Several requests on one connection, in order (a page keeps one while it shows a thread).
    let conn = s.bridge.dial(&ep, b"thunderbolt/acp/reach1").await;
    let (mut tx, rx) = conn.open_bi().await.unwrap();
    let mut lines = BufReader::new(rx).lines();
    for since in [0, 1, 2] {
        tx.write_all(format!("{{\"op\":\"threads\",\"since\":{since},\"viewing\":\"claude\"}}\n").as_bytes())
            .await
            .unwrap();
        let line = tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap().unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["seq"], 3, "{v}");
        let items = v["threads"][0]["items"].as_array().map_or(0, Vec::len);
        assert_eq!(items, 3 - since as usize, "after {since}: {v}");
    }
}

/// `thunderbolt reach` on `home`: JSON-RPC lines in, every line it writes out.
struct Mcp {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Mcp {
    fn start(home: &thunderbolt_tests::Tb) -> Self {
        let mut c = home.cmd();
        c.args(["reach", "--agent-name", "ci"])
            .env("THUNDERBOLT_TEST_PROGRESS_MS", "100")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        let mut child = c.spawn().expect("thunderbolt reach starts");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, stdin, lines }
    }

    async fn send(&mut self, v: Value) {
        let mut line = serde_json::to_vec(&v).unwrap();
        line.push(b'\n');
        self.stdin.write_all(&line).await.unwrap();
    }

    /// Lines until the answer to `id`, and those before it.
    async fn answer(&mut self, id: u64) -> (Value, Vec<Value>) {
        let mut before = Vec::new();
        loop {
            let line = tokio::time::timeout(WAIT, self.lines.next_line()).await.expect("in time").unwrap();
            let v: Value = serde_json::from_str(&line.expect("the server is still there")).unwrap();
            if v["id"] == id {
                return (v, before);
            }
            before.push(v);
        }
    }

    async fn tool(&mut self, id: u64, name: &str, args: Value, meta: Option<Value>) -> (Value, Vec<Value>) {
        let mut params = json!({"name": name, "arguments": args});
        if let Some(m) = meta {
            params["_meta"] = m;
        }
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})).await;
        self.answer(id).await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_mcp_server_says_what_is_missing_before_a_host_runs_and_keeps_a_long_wait_alive() {
    let s = Setup::new(&[], &agent(&[])).await;
    let empty = thunderbolt_tests::Tb::new(None);

    // No host on this home: it starts, lists its tools, and each says what is missing.
    let mut m = Mcp::start(&empty);
    m.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "1"}}}))
        .await;
    let (init, _) = m.answer(1).await;
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
    assert!(init["result"]["capabilities"].get("experimental").is_none(), "a channel only with --channel");
    m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    let (sent, _) = m.tool(2, "send_message", json!({"text": "hello"}), None).await;
    assert_eq!(sent["result"]["isError"], true, "{sent}");
    assert!(sent["result"]["content"][0]["text"].as_str().unwrap().contains("no host runs"), "{sent}");
    let (status, _) = m.tool(3, "status", json!({}), None).await;
    assert_eq!(status["result"]["structuredContent"]["running"], false, "{status}");
    let (bad, _) = m.tool(4, "send_message", json!({}), None).await;
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    drop(m);

    // With a host: a wait with a progress token is kept alive until it ends.
    let mut m = Mcp::start(&s.bridge_home);
    let (got, before) =
        m.tool(5, "get_replies", json!({"wait_s": 1}), Some(json!({"progressToken": "p1"}))).await;
    assert_eq!(got["result"]["structuredContent"]["replies"], json!([]), "{got}");
    let progress: Vec<&Value> = before.iter().filter(|v| v["method"] == "notifications/progress").collect();
    assert!(!progress.is_empty(), "progress while it waits: {before:?}");
    assert_eq!(progress[0]["params"]["progressToken"], "p1");

    // A device named that is not one: refused, with where the names are.
    let out = s.bridge_home.run(&["note", "--device", "nope", "hi"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no device named 'nope'"), "{out:?}");
    let _ = m.child.start_kill();
}
