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
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let tx = tx.clone();
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
                let cid = body["cid"].clone();
                let text = format!("hook got: {}", body["text"].as_str().unwrap_or_default());
                let answer = json!([
                    {"type": "reply", "cid": "c_other", "text": "not yours"},
                    {"type": "reply", "cid": cid, "text": text},
                    {"type": "done", "cid": cid},
                ])
                .to_string();
                let _ = tx.send(body);
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                    answer.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    (port, rx)
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
