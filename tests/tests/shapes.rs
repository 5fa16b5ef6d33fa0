//! Agents of other shapes behind one ticket: a contract program run for each
//! turn and a webhook on this machine, each written from the capture contract
//! (the test agent's `capture` mode, a raw HTTP server here), served by a real
//! `thunderbolt host` as ACP and reached by `thunderbolt acp connect`.

use std::{os::unix::fs::PermissionsExt, process::Stdio};

use serde_json::{json, Value};
use thunderbolt_tests::{init_tracing, start_with_banner, test_agent_bin, Tb, WAIT};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpListener,
    sync::mpsc,
};

/// A webhook agent written from the contract: answers each POST with its
/// reply (and one for another cid), and tells the test the body it got.
async fn webhook() -> (u16, mpsc::UnboundedReceiver<Value>) {
    webhook_on(TcpListener::bind("127.0.0.1:0").await.unwrap())
}

fn webhook_on(listener: TcpListener) -> (u16, mpsc::UnboundedReceiver<Value>) {
    http_on(listener, |body| {
        let cid = body["cid"].clone();
        let text = format!("hook got: {}", body["text"].as_str().unwrap_or_default());
        json!([
            {"type": "reply", "cid": "c_other", "text": "not yours"},
            {"type": "reply", "cid": cid, "text": text},
            {"type": "done", "cid": cid},
        ])
        .to_string()
    })
}

/// A bare HTTP/1.1 server on `listener`: each POST's JSON body goes to the
/// test and to `answer`, whose string is the 200 answer's body.
fn http_on(
    listener: TcpListener,
    answer: impl Fn(&Value) -> String + Send + Sync + 'static,
) -> (u16, mpsc::UnboundedReceiver<Value>) {
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (tx, answer) = (tx.clone(), answer.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let (head_end, length) = loop {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        break (i + 4, len);
                    }
                };
                while buf.len() < head_end + length {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body: Value =
                    serde_json::from_slice(&buf[head_end..head_end + length]).unwrap_or_default();
                let out = answer(&body);
                let _ = tx.send(body);
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{out}",
                    out.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    (port, rx)
}

/// One request on a home's reach socket, its answer.
async fn reach(sock: &std::path::Path, req: Value) -> Value {
    let mut s = tokio::net::UnixStream::connect(sock).await.expect("reach.sock");
    s.write_all(format!("{req}\n").as_bytes()).await.unwrap();
    let mut line = String::new();
    tokio::time::timeout(WAIT, BufReader::new(s).read_line(&mut line)).await.unwrap().unwrap();
    serde_json::from_str(&line).unwrap()
}

/// A relay agent written from the relay contract: each message is accepted
/// at once (an empty 200) and answered from a task over the reach socket:
/// a delta, a tool card (input, then output), a delta, done. A message with
/// "slow" in it gets one delta, then nothing.
fn relay_on(listener: TcpListener, sock: std::path::PathBuf) -> (u16, mpsc::UnboundedReceiver<Value>) {
    http_on(listener, move |msg| {
        if msg["type"] != "message" {
            return String::new();
        }
        let (turn, text, sock) =
            (msg["turn_id"].clone(), msg["text"].as_str().unwrap_or_default().to_string(), sock.clone());
        tokio::spawn(async move {
            // After the POST's answer: the turn is the service's from here.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            let ok = json!({"ok": true});
            assert_eq!(
                reach(&sock, json!({"op": "turn.delta", "turn_id": turn, "text": "You said: "})).await,
                ok
            );
            if text.contains("slow") {
                return;
            }
            let input = json!({"file_path": "report.pdf"});
            let tool = json!({"op": "turn.tool", "turn_id": turn, "id": "1", "kind": "read", "title": "report.pdf", "input": input});
            assert_eq!(reach(&sock, tool).await, ok);
            let out = json!({"op": "turn.tool", "turn_id": turn, "id": "1", "title": "report.pdf", "output": "42 pages"});
            assert_eq!(reach(&sock, out).await, ok);
            assert_eq!(reach(&sock, json!({"op": "turn.delta", "turn_id": turn, "text": text})).await, ok);
            assert_eq!(reach(&sock, json!({"op": "turn.done", "turn_id": turn})).await, ok);
        });
        String::new()
    })
}

/// A host serving `manifests` (file name, JSON) and a client home it allows:
/// the host process, its banner and log.
async fn host_with(
    manifests: &[(&str, Value)],
) -> (Tb, Tb, tokio::process::Child, String, thunderbolt_tests::Log) {
    init_tracing();
    let host = Tb::new(None);
    let client = Tb::new(None);
    host.allow(&client.node_id("acp").await).await;
    let dir = host.home().join("agents.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    for (file, json) in manifests {
        std::fs::write(dir.join(file), json.to_string()).unwrap();
        std::fs::set_permissions(dir.join(file), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let mut c = host.cmd();
    c.arg("host");
    let (child, banner, log) = start_with_banner(c).await;
    (host, client, child, banner, log)
}

/// The ticket of agent `name` in a host's banner.
fn ticket_of(banner: &str, name: &str) -> String {
    let mut lines = banner.lines();
    lines.find(|l| l.trim().starts_with(name)).unwrap_or_else(|| panic!("{name} not served:\n{banner}"));
    lines.nth(1).unwrap().split_whitespace().nth(1).unwrap().to_string()
}

/// A client's conversation with the agent at `ticket`: initialize,
/// session/new, one prompt; the prompt's answer and the texts streamed before it.
async fn prompt(client: &Tb, ticket: &str, blocks: Value) -> (Value, Vec<String>) {
    let mut c = client.cmd();
    c.args(["acp", "connect", ticket]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || -> Value {
        let line =
            tokio::time::timeout(WAIT, lines.next_line()).await.expect("in time").unwrap().expect("a line");
        serde_json::from_str(&line).unwrap()
    };
    let send = |v: Value| format!("{v}\n");
    stdin.write_all(send(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}})).as_bytes()).await.unwrap();
    let init = next().await;
    assert_eq!(init["result"]["agentCapabilities"]["promptCapabilities"]["image"], true, "{init}");
    stdin
        .write_all(
            send(json!({"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}))
                .as_bytes(),
        )
        .await
        .unwrap();
    let sid = next().await["result"]["sessionId"].as_str().unwrap().to_string();
    stdin
        .write_all(send(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":sid,"prompt":blocks}})).as_bytes())
        .await
        .unwrap();
    let mut texts = Vec::new();
    loop {
        let v = next().await;
        if v["id"] == 3 {
            drop(stdin);
            let _ = child.kill().await;
            return (v, texts);
        }
        if v["params"]["update"]["sessionUpdate"] == "agent_message_chunk" {
            texts.push(v["params"]["update"]["content"]["text"].as_str().unwrap_or_default().to_string());
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_contract_program_and_a_webhook_each_answer_a_prompt_as_acp_and_a_late_program_leaves_nothing_behind(
) {
    let (port, mut posted) = webhook().await;
    let agent = test_agent_bin().display().to_string();
    let pid_file = std::env::temp_dir().join(format!("tb-capture-{}.pid", std::process::id()));
    let (_host, client, mut child, banner, log) = host_with(&[
        ("receipts.json", json!({"name": "receipts", "capture": [agent, "capture"], "turn_timeout": 30})),
        (
            "slow.json",
            json!({"name": "slow", "capture": [agent, "--pid-file", pid_file, "capture"], "turn_timeout": 2}),
        ),
        (
            "triage.json",
            json!({"name": "triage", "webhook": format!("http://127.0.0.1:{port}/inbound"), "contract": "1"}),
        ),
        // Refused with its reason; the rest still serve.
        ("hosted.json", json!({"name": "hosted", "webhook": "http://example.com/inbound"})),
    ])
    .await;
    let ticket = |name: &str| ticket_of(&banner, name);
    assert!(
        log.text().contains("must name a loopback address")
            || banner.contains("must name a loopback address"),
        "{banner}\n{}",
        log.text()
    );

    // The contract program: a text and an image (a file it reads), replies streamed, end_turn.
    let (answer, texts) = prompt(
        &client,
        &ticket("receipts"),
        json!([{"type": "text", "text": "file this receipt"}, {"type": "image", "mimeType": "image/png", "data": "AQID"}]),
    )
    .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(
        texts,
        ["got: file this receipt; parts: [image/png 3 on disk Some(3)]"],
        "another cid's reply and the junk line are ignored"
    );

    // The webhook: one POST (the image inline), its answer streamed.
    let (answer, texts) = prompt(
        &client,
        &ticket("triage"),
        json!([{"type": "text", "text": "what is this?"}, {"type": "image", "mimeType": "image/jpeg", "data": "AQID"}]),
    )
    .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(texts, ["hook got: what is this?"]);
    let body = posted.recv().await.unwrap();
    assert_eq!(body["type"], "capture");
    assert_eq!(body["agent"], "triage");
    assert_eq!(body["parts"][0]["data"], "AQID", "{body}");
    assert!(body["cid"].as_str().unwrap().starts_with("c_"));

    // A program past its turn's timeout: the turn fails in words; the program is gone.
    let (answer, _) = prompt(&client, &ticket("slow"), json!([{"type": "text", "text": "hang on"}])).await;
    let why = answer["error"]["message"].as_str().unwrap_or_else(|| panic!("{answer}"));
    assert!(why.contains("slow did not finish its turn within 2 s"), "{answer}");
    let pid: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    assert!(thunderbolt_tests::wait_pid_gone(pid).await, "the late program {pid} is still running");

    if let Some(pid) = child.id() {
        thunderbolt_tests::signal(pid, libc::SIGTERM);
    }
    let _ = tokio::time::timeout(WAIT, child.wait()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_that_is_down_fails_the_turn_in_words_and_the_next_turn_tries_again() {
    // A port nothing listens on yet.
    let port = { TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port() };
    let hook = json!({"name": "hook", "webhook": format!("http://127.0.0.1:{port}/in")});
    let (_host, client, mut child, banner, _log) = host_with(&[("hook.json", hook)]).await;
    let ticket = ticket_of(&banner, "hook");
    let (answer, _) = prompt(&client, &ticket, json!([{"type": "text", "text": "hello"}])).await;
    let why = answer["error"]["message"].as_str().unwrap_or_else(|| panic!("{answer}"));
    assert!(why.contains("hook could not answer") && why.contains("nothing answers there"), "{answer}");
    // The service comes up: the next turn reaches it.
    let (_, mut posted) =
        webhook_on(TcpListener::bind(("127.0.0.1", port)).await.expect("the port is free again"));
    let (answer, texts) = prompt(&client, &ticket, json!([{"type": "text", "text": "hello again"}])).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    assert_eq!(texts, ["hook got: hello again"]);
    assert_eq!(posted.recv().await.unwrap()["text"], "hello again");
    let _ = child.kill().await;
}

/// A live conversation through `thunderbolt acp connect`: JSON lines in, every line out.
struct Conversation {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    seen: Vec<Value>,
}

impl Conversation {
    async fn open(client: &Tb, ticket: &str) -> (Self, String) {
        let mut c = client.cmd();
        c.args(["acp", "connect", ticket])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut me = Self { child, stdin, lines, seen: Vec::new() };
        me.send(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}})).await;
        me.until(1).await;
        me.send(json!({"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/srv/work","mcpServers":[]}})).await;
        let sid = me.until(2).await["result"]["sessionId"].as_str().unwrap().to_string();
        (me, sid)
    }

    async fn send(&mut self, v: Value) {
        self.stdin.write_all(format!("{v}\n").as_bytes()).await.unwrap();
    }

    /// Lines until the answer to `id` (the others kept in `seen`).
    async fn until(&mut self, id: u64) -> Value {
        loop {
            let line = tokio::time::timeout(WAIT, self.lines.next_line())
                .await
                .expect("in time")
                .unwrap()
                .expect("a line");
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id {
                return v;
            }
            self.seen.push(v);
        }
    }

    /// The updates seen, as `sessionUpdate` kinds and what each says.
    fn updates(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.seen).into_iter().map(|v| v["params"]["update"].clone()).collect()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_agent_converses_with_tool_cards_is_stopped_refuses_late_deltas_and_sends_notes() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let commands = json!([{"name": "status", "description": "What the butler is working on"},
                          {"name": "remind", "description": "Set a reminder", "argHint": "<when> <what>"}]);
    let relay = format!("http://127.0.0.1:{port}/inbound");
    let manifest = json!({"name": "butler", "label": "Butler", "relay": relay, "commands": commands});
    let (host, client, mut child, banner, _log) = host_with(&[("butler.json", manifest)]).await;
    let sock = host.home().join("reach.sock");
    let (_, mut posted) = relay_on(listener, sock.clone());
    let (mut c, sid) = Conversation::open(&client, &ticket_of(&banner, "butler")).await;

    // Its commands, as ACP's available commands, once the session started (waited for: it follows the answer).
    let listed = loop {
        let line =
            tokio::time::timeout(WAIT, c.lines.next_line()).await.expect("in time").unwrap().expect("a line");
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["params"]["update"]["sessionUpdate"] == "available_commands_update" {
            break v["params"]["update"].clone();
        }
    };
    assert_eq!(
        listed["availableCommands"][1],
        json!({"name": "remind", "description": "Set a reminder", "input": {"hint": "<when> <what>"}})
    );

    // A turn: the message as the contract says, deltas and a tool card, end_turn.
    c.send(json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":sid,"prompt":[{"type":"text","text":"summarise the report"}]}})).await;
    let answer = c.until(3).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let msg = posted.recv().await.unwrap();
    assert_eq!(
        (msg["v"].clone(), msg["type"].clone(), msg["chat_id"].clone()),
        (json!(1), json!("message"), json!(sid))
    );
    assert_eq!(msg["text"], "summarise the report");
    assert_eq!(msg["cwd"], "/srv/work");
    assert_eq!(msg["origin"], "user");
    assert!(msg["turn_id"].as_str().unwrap().starts_with("t_"), "{msg}");
    let ups = c.updates();
    let kinds: Vec<&str> = ups.iter().map(|u| u["sessionUpdate"].as_str().unwrap_or("?")).collect();
    assert_eq!(
        kinds,
        ["agent_message_chunk", "tool_call", "tool_call_update", "agent_message_chunk"],
        "{ups:?}"
    );
    assert_eq!(ups[0]["content"]["text"], "You said: ");
    assert_eq!(ups[1]["kind"], "read");
    assert_eq!(ups[1]["title"], "report.pdf");
    assert_eq!(ups[1]["rawInput"], json!({"file_path": "report.pdf"}));
    assert_eq!(ups[2]["status"], "completed");
    assert_eq!(ups[2]["rawOutput"], "42 pages");
    assert_eq!(ups[3]["content"]["text"], "summarise the report");

    // A turn stopped: the service is told, and what it sends late is refused.
    c.send(json!({"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"sessionId":sid,"prompt":[{"type":"text","text":"a slow one"}]}})).await;
    let slow = posted.recv().await.unwrap();
    let turn = slow["turn_id"].clone();
    loop {
        let line = tokio::time::timeout(WAIT, c.lines.next_line()).await.unwrap().unwrap().unwrap();
        if line.contains("agent_message_chunk") {
            break;
        }
    }
    c.send(json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":sid}})).await;
    assert_eq!(c.until(4).await["result"]["stopReason"], "cancelled");
    let stop = posted.recv().await.unwrap();
    assert_eq!(stop, json!({"v": 1, "type": "stop", "chat_id": sid, "turn_id": turn}));
    let late = reach(&sock, json!({"op": "turn.delta", "turn_id": turn, "text": "too late"})).await;
    assert_eq!(late, json!({"error": "no such turn"}));
    let unknown = reach(&sock, json!({"op": "turn.rewind", "turn_id": turn})).await;
    assert_eq!(unknown, json!({"error": "unknown op: turn.rewind"}));

    // A note between turns: in the agent's thread, for its chat.
    let note = reach(
        &sock,
        json!({"op": "note", "text": "Your 8am summary is ready.", "source": "agent", "chat": sid}),
    )
    .await;
    assert_eq!(note["ok"], true, "{note}");
    assert_eq!(note["chat_id"], json!(sid));
    let threads = std::fs::read_to_string(host.home().join("reach/threads.json")).unwrap();
    assert!(threads.contains("\"name\":\"butler\"") && threads.contains("8am summary"), "{threads}");
    let nowhere = reach(&sock, json!({"op": "note", "text": "x", "chat": "no-such-chat"})).await;
    assert_eq!(nowhere, json!({"error": "no such chat: no-such-chat"}));
    // And in the chat's session, as the agent's words, outside any turn.
    let shown = loop {
        let line = tokio::time::timeout(WAIT, c.lines.next_line())
            .await
            .expect("the note in time")
            .unwrap()
            .unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["method"] == "session/update" && v["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
        {
            break v;
        }
    };
    assert_eq!(shown["params"]["sessionId"], json!(sid));
    assert_eq!(shown["params"]["update"]["content"]["text"], "Your 8am summary is ready.");

    // `status --json` names the socket the service replies on.
    let status: Value = serde_json::from_slice(&host.run(&["status", "--json"]).await.stdout).unwrap();
    assert_eq!(status["bridges"][0]["reachSocket"], json!(sock.display().to_string()), "{status}");

    let _ = c.child.kill().await;
    let _ = child.kill().await;
}
