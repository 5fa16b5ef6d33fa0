//! Notices to the owner: a real bridge, a raw resumable client, and a stand-in
//! push service (`tests/push/service.mjs`, Node) that decrypts each push with
//! the subscription's private key and verifies its VAPID JWT with its own
//! crypto, independently of the bridge's code.

use std::{path::PathBuf, process::Stdio, time::Duration};

use serde_json::{json, Value};
use thunderbolt_tests::{
    r1::{agent, lose, next_frame, Setup},
    Log, Tb, WAIT,
};
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::mpsc,
};

/// The stand-in push service: its port, its two subscriptions, what it got.
struct PushService {
    _child: Child,
    port: u16,
    ok: Value,
    gone: Value,
    got: mpsc::UnboundedReceiver<Value>,
    /// The bridge's log, shown when a wait runs out.
    log: Log,
}

impl PushService {
    async fn start() -> Self {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("push/service.mjs");
        let mut child = Command::new("node")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs (the push service stand-in)");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first =
            tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap().expect("service starts");
        let v: Value = serde_json::from_str(&first).unwrap();
        let (tx, got) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = tx.send(serde_json::from_str::<Value>(&line).unwrap());
            }
        });
        Self {
            _child: child,
            port: v["port"].as_u64().unwrap() as u16,
            ok: v["subscriptions"]["ok"].clone(),
            gone: v["subscriptions"]["gone"].clone(),
            got,
            log: Log::default(),
        }
    }

    /// The next request it recorded (bounded by [`WAIT`]); a push or hook that
    /// did not check out fails the test here.
    async fn next(&mut self) -> Value {
        let Ok(v) = tokio::time::timeout(WAIT, self.got.recv()).await else {
            panic!("no request in time; the bridge's log:\n{}", self.log.text());
        };
        let v = v.unwrap();
        assert!(v.get("error").is_none(), "the push service refused a request: {v}");
        v
    }

    /// The next push to the working subscription (skipping the gone one's and hooks).
    async fn next_push(&mut self) -> Value {
        loop {
            let v = self.next().await;
            if v["path"] == "/push/ok" {
                return v;
            }
        }
    }
}

fn request(id: Value, method: &str, params: Value) -> Vec<u8> {
    let mut b =
        serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).unwrap();
    b.push(b'\n');
    b
}

/// The test agent's `later`: it writes `send` after `ms`.
fn later(id: u64, ms: u64, send: Vec<Value>) -> Vec<u8> {
    request(json!(id), "later", json!({"ms": ms, "send": send}))
}

fn permission(id: &str, title: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "session/request_permission",
           "params": {"sessionId": "s1", "toolCall": {"toolCallId": "t1", "title": title}, "options": []}})
}

fn frame_json(b: &[u8]) -> Value {
    serde_json::from_slice(b)
        .unwrap_or_else(|e| panic!("frame is JSON ({e}): {}", String::from_utf8_lossy(b)))
}

fn push_file(home: &Tb) -> String {
    std::fs::read_to_string(home.home().join("iroh/push.json")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_detached_sessions_question_is_pushed_once_end_to_end_encrypted_and_an_attached_ones_is_not() {
    let mut svc = PushService::start().await;
    let hook = format!("http://127.0.0.1:{}/hook", svc.port);
    let s = Setup::new(&["--notify-url", &hook, "--resume-grace", "60"], &agent(&["later"])).await;
    svc.log = s.bridge.log.clone();
    let ep = s.endpoint(&s.client_home).await;
    let (conn, mut send, mut recv, _token) = s.session(&ep).await;
    let mut buf = Vec::new();

    // The page's side: the key for pushManager.subscribe, then the subscriptions.
    send.write_all(&request(json!(1), "_thunderbolt/push/key", json!({}))).await.unwrap();
    let key = frame_json(&next_frame(&mut recv, &mut buf).await);
    assert_eq!(key["id"], 1);
    let server_key = key["result"]["applicationServerKey"].as_str().expect("a VAPID key").to_string();
    for (id, sub) in [(2, &svc.ok), (3, &svc.gone)] {
        send.write_all(&request(json!(id), "_thunderbolt/push/subscribe", sub.clone())).await.unwrap();
        let r = frame_json(&next_frame(&mut recv, &mut buf).await);
        assert_eq!(r, json!({"jsonrpc": "2.0", "id": id, "result": {"subscribed": true}}));
    }
    // A bad subscription is refused with a reason, not stored.
    send.write_all(&request(
        json!(4),
        "_thunderbolt/push/subscribe",
        json!({"endpoint": "http://push.example/x"}),
    ))
    .await
    .unwrap();
    let r = frame_json(&next_frame(&mut recv, &mut buf).await);
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let stored = push_file(&s.bridge_home);
    assert!(stored.contains("/push/ok") && stored.contains("/push/gone") && !stored.contains("push.example"));

    // Attached: the agent asks, the client sees it and answers. No notice.
    let asked =
        json!({"jsonrpc": "2.0", "id": "a1", "method": "fs/read_text_file", "params": {"path": "/x"}});
    send.write_all(&later(5, 0, vec![asked.clone()])).await.unwrap();
    assert_eq!(frame_json(&next_frame(&mut recv, &mut buf).await)["id"], 5);
    assert_eq!(frame_json(&next_frame(&mut recv, &mut buf).await), asked);
    send.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":\"a1\",\"result\":{\"content\":\"\"}}\n").await.unwrap();

    // A prompt turn starts while attached (the test agent leaves it to `later`).
    send.write_all(&request(json!(6), "session/prompt", json!({"sessionId": "s1", "prompt": []})))
        .await
        .unwrap();
    // Detached: the agent asks, then ends the turn, while the client is away.
    let ended = json!({"jsonrpc": "2.0", "id": 6, "result": {"stopReason": "end_turn"}});
    send.write_all(&later(7, 300, vec![permission("p1", "delete the build folder"), ended])).await.unwrap();
    assert_eq!(frame_json(&next_frame(&mut recv, &mut buf).await)["id"], 7);
    lose(&conn);
    s.bridge.log.wait_for("the agent keeps running").await;

    // Everything the service got for the two notices (pushes to both
    // subscriptions, the hook's POSTs), in order.
    let (mut pushes, mut hooks, mut gone) = (Vec::new(), Vec::new(), 0);
    while pushes.len() < 2 || hooks.len() < 2 {
        let v = svc.next().await;
        match v["path"].as_str() {
            Some("/push/ok") => pushes.push(v),
            Some("/hook") => hooks.push(v),
            Some("/push/gone") => gone += 1,
            _ => panic!("{v}"),
        }
    }

    // Deliveries go in order: the first push is the detached question's,
    // so the attached one was never sent.
    let push = &pushes[0];
    let notice = &push["notice"];
    assert_eq!(notice["event"], "needs_answer", "{push}");
    assert_eq!(notice["detail"], "session/request_permission");
    assert!(notice["title"].as_str().unwrap().contains("needs your answer"), "{notice}");
    assert!(notice["text"].is_null(), "no message text unless --notify-text");
    assert!(!push.to_string().contains("delete the build"), "the default notice names the event only");
    assert_eq!(push["urgency"], "high");
    assert_eq!(push["ttl"], 6 * 3600);
    assert_eq!(push["vapid"]["k"], server_key.as_str(), "signed with the key the page subscribed with");
    assert_eq!(push["vapid"]["aud"], format!("http://127.0.0.1:{}", svc.port));
    let expires_in = push["vapid"]["expiresIn"].as_i64().unwrap();
    assert!((11 * 3600..=12 * 3600 + 60).contains(&expires_in), "exp {expires_in}s ahead");
    let push = &pushes[1];
    assert_eq!(push["notice"]["event"], "finished", "{push}");
    assert_eq!(push["notice"]["detail"], "end_turn");
    assert_eq!(push["notice"]["body"], "finished: end_turn");
    assert_eq!(push["urgency"], "normal");

    // The gone subscription got one push, a 410, and is removed; the hook
    // got both notices as JSON.
    assert_eq!(gone, 1, "a gone subscription is not tried again");
    assert!(hooks[0]["contentType"].as_str().unwrap().starts_with("application/json"));
    let body: Value = serde_json::from_str(hooks[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["event"], "needs_answer");
    assert_eq!(body["detail"], "session/request_permission");
    let body: Value = serde_json::from_str(hooks[1]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["event"], "finished");
    s.bridge.log.wait_for("a push subscription is gone (410").await;
    let stored = push_file(&s.bridge_home);
    assert!(stored.contains("/push/ok") && !stored.contains("/push/gone"), "{stored}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_questions_is_rate_limited_the_stream_keeps_every_byte_and_revoking_the_device_ends_its_pushes(
) {
    let mut svc = PushService::start().await;
    let s = Setup::new(&["--resume-grace", "60"], &agent(&["later"])).await;
    svc.log = s.bridge.log.clone();
    let ep = s.endpoint(&s.client_home).await;
    let (conn, mut send, mut recv, token) = s.session(&ep).await;
    let mut buf = Vec::new();
    send.write_all(&request(json!(1), "_thunderbolt/push/subscribe", svc.ok.clone())).await.unwrap();
    assert_eq!(frame_json(&next_frame(&mut recv, &mut buf).await)["result"]["subscribed"], true);

    // 100 questions while the client is away.
    let burst: Vec<Value> = (0..100).map(|i| permission(&format!("r{i}"), "x")).collect();
    send.write_all(&later(2, 300, burst)).await.unwrap();
    assert_eq!(frame_json(&next_frame(&mut recv, &mut buf).await)["id"], 2);
    lose(&conn);
    s.bridge.log.wait_for("notices of this session are held back").await;
    let first = svc.next_push().await;
    let session1 = first["notice"]["session"].as_str().unwrap().to_string();

    // A second session of the same device: the agent asks while it is
    // attached, and the connection is lost before it answers: notified on the
    // loss. Deliveries go in order, so once its push is here every push of
    // the first session has been sent.
    let (conn2, mut send2, mut recv2, _) = s.session(&ep).await;
    let mut buf2 = Vec::new();
    let ask = json!({"jsonrpc": "2.0", "id": "z", "method": "elicitation/create", "params": {"message": "which one?"}});
    send2.write_all(&later(1, 0, vec![ask.clone()])).await.unwrap();
    assert_eq!(frame_json(&next_frame(&mut recv2, &mut buf2).await)["id"], 1);
    assert_eq!(frame_json(&next_frame(&mut recv2, &mut buf2).await), ask);
    lose(&conn2);
    let mut of_first = 1;
    loop {
        let p = svc.next_push().await;
        if p["notice"]["session"] == session1.as_str() {
            of_first += 1;
            continue;
        }
        assert_eq!(p["notice"]["detail"], "elicitation/create", "{p}");
        break;
    }
    assert_eq!(of_first, 3, "a burst of 3, then one per 30 s");

    // The stream lost nothing: resuming replays the 100 questions in order.
    let (_c, _s, mut recv3, welcome) = s.resume(&ep, &token, 2).await;
    welcome.expect("resumed");
    let mut buf3 = Vec::new();
    for i in 0..100 {
        let v = frame_json(&next_frame(&mut recv3, &mut buf3).await);
        assert_eq!(v["id"], format!("r{i}"));
    }

    // Revoking the device removes its subscriptions.
    assert!(push_file(&s.bridge_home).contains("/push/ok"));
    let id = s.client_home.node_id("acp").await.to_string();
    let out = s.bridge_home.run(&["iroh", "deny", &id]).await;
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("1 push subscription(s) removed"), "{said}");
    assert!(!push_file(&s.bridge_home).contains("/push/ok"));
}

#[tokio::test]
async fn a_plain_http_notify_url_off_this_machine_is_refused_at_start() {
    let tb = Tb::new(None);
    let bin = thunderbolt_tests::test_agent_bin().display().to_string();
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tb.cmd().args(["acp", "--notify-url", "http://example.com/hook", "--", &bin, "cat"]).output(),
    )
    .await
    .expect("refused at once")
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("plain http is only allowed to this machine"), "{err}");
    let out = tb.run(&["acp", "--notify-contact", "bob", "--", &bin, "cat"]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--notify-contact"));
}

#[tokio::test(flavor = "multi_thread")]
async fn with_notify_always_an_attached_plain_session_notifies_too() {
    let mut svc = PushService::start().await;
    let hook = format!("http://127.0.0.1:{}/hook", svc.port);
    let s =
        Setup::new(&["--notify-always", "--notify-url", &hook, "--notify-text"], &agent(&["later"])).await;
    svc.log = s.bridge.log.clone();
    let ep = s.endpoint(&s.client_home).await;
    // The plain protocol, as the app's shipped client speaks it.
    let conn = s.bridge.dial(&ep, &thunderbolt_shared::Protocol::acp().alpn()).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&later(1, 0, vec![permission("p1", "rm -rf build")])).await.unwrap();
    let mut buf = Vec::new();
    assert_eq!(frame_json(&next_frame(&mut recv, &mut buf).await)["id"], 1);
    assert_eq!(frame_json(&next_frame(&mut recv, &mut buf).await)["id"], "p1", "the client got the question");
    let v = svc.next().await;
    assert_eq!(v["path"], "/hook");
    let body: Value = serde_json::from_str(v["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["event"], "needs_answer");
    assert_eq!(body["text"], "rm -rf build", "--notify-text puts what it asks in");
}
