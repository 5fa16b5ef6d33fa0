//! Notices to the owner: a real bridge, a raw resumable client, and a stand-in
//! push service (`tests/push/service.mjs`, Node) that decrypts each push with
//! the subscription's private key and verifies its VAPID JWT with its own
//! crypto, independently of the bridge's code.

use std::time::Duration;

use tokio::sync::mpsc;

use iroh::{
    endpoint::{Connection, RecvStream, SendStream},
    Endpoint,
};
use serde_json::{json, Value};
use thunderbolt_tests::{
    push::{PushService, LOOPBACK},
    r1::{agent, lose, next_frame, Setup},
    setup::{call, request},
    Tb, WAIT,
};

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
    let s =
        Setup::with_env(&["--notify-url", &hook, "--resume-grace", "60"], &agent(&["later"]), LOOPBACK).await;
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
    assert_eq!(notice["body"], "delete the build folder", "a push says what is asked: {notice}");
    assert_eq!(notice["text"], "delete the build folder", "and the agent's own words in `text`");
    assert_eq!(push["urgency"], "high");
    assert_eq!(push["ttl"], 6 * 3600);
    assert_eq!(push["vapid"]["k"], server_key.as_str(), "signed with the key the page subscribed with");
    assert_eq!(push["vapid"]["aud"], format!("http://127.0.0.1:{}", svc.port));
    let expires_in = push["vapid"]["expiresIn"].as_i64().unwrap();
    assert!((11 * 3600..=12 * 3600 + 60).contains(&expires_in), "exp {expires_in}s ahead");
    let push = &pushes[1];
    assert_eq!(push["notice"]["event"], "finished", "{push}");
    assert_eq!(push["notice"]["detail"], "end_turn");
    assert_eq!(push["notice"]["body"], "finished: no tool calls");
    assert_eq!(push["urgency"], "normal");

    // The gone subscription got one push, a 410, and is removed; the hook
    // got both notices as JSON.
    assert_eq!(gone, 1, "a gone subscription is not tried again");
    assert!(hooks[0]["contentType"].as_str().unwrap().starts_with("application/json"));
    let body: Value = serde_json::from_str(hooks[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["event"], "needs_answer");
    assert_eq!(body["detail"], "session/request_permission");
    assert_eq!(body["body"], "it asks: session/request_permission", "the URL's notice is bare: {body}");
    assert!(body["text"].is_null(), "no words unless --notify-text");
    assert!(!hooks[0].to_string().contains("delete the build"), "{}", hooks[0]);
    let body: Value = serde_json::from_str(hooks[1]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["event"], "finished");
    assert_eq!(body["body"], "finished: end_turn");
    s.bridge.log.wait_for("a push subscription is gone (410").await;
    let stored = push_file(&s.bridge_home);
    assert!(stored.contains("/push/ok") && !stored.contains("/push/gone"), "{stored}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_questions_is_rate_limited_the_stream_keeps_every_byte_and_revoking_the_device_ends_its_pushes(
) {
    let mut svc = PushService::start().await;
    let s = Setup::with_env(&["--resume-grace", "60"], &agent(&["later"]), LOOPBACK).await;
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
    assert_eq!(body["body"], "rm -rf build", "--notify-text words the URL's notice: {body}");
    assert_eq!(body["text"], "rm -rf build", "--notify-text puts what it asks in");
}

/// A permission request for a tool call (`toolCall`'s fields as ACP has them).
fn permission_for(id: &str, tool_call: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "session/request_permission",
           "params": {"sessionId": "s1", "toolCall": tool_call, "options": []}})
}

/// The agent's `session/update` of `session` reporting a tool call.
fn tool_update(session: &str, update: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": update}})
}

/// The agent's report of a new tool call of `session`: `id`, of `kind`, `status`.
fn tool_call(session: &str, id: &str, kind: &str, status: &str) -> Value {
    tool_update(
        session,
        json!({"sessionUpdate": "tool_call", "toolCallId": id, "title": id, "kind": kind, "status": status}),
    )
}

/// What the test agent says during a turn: three tool calls (a command, an
/// edit of one file with its diff, a read), one of another session's (not
/// counted), then the answer to prompt `id`.
fn a_turn(id: u64) -> Vec<Value> {
    let mut edit = tool_call("s1", "c2", "edit", "pending");
    edit["params"]["update"]["content"] =
        json!([{"type": "diff", "path": "/w/src/main.rs", "oldText": "a", "newText": "b"}]);
    let mut read = tool_call("s1", "c3", "read", "completed");
    read["params"]["update"]["locations"] = json!([{"path": "/w/README.md"}]);
    let mut other = tool_call("s2", "x", "edit", "completed");
    other["params"]["update"]["locations"] = json!([{"path": "/w/other.rs"}]);
    let done = |call: &str| {
        tool_update(
            "s1",
            json!({"sessionUpdate": "tool_call_update", "toolCallId": call, "status": "completed"}),
        )
    };
    vec![
        tool_call("s1", "c1", "execute", "pending"),
        edit,
        done("c1"),
        done("c2"),
        other,
        read,
        json!({"jsonrpc": "2.0", "id": id, "result": {"stopReason": "end_turn"}}),
    ]
}

/// A secret in a command: masked in every notice.
const SECRET: &str = "sk-ant-api03-abcdefghijklmnopqrstuvwxyz";

/// A permission for a command that holds [`SECRET`].
fn risky_permission(id: &str) -> Value {
    permission_for(
        id,
        json!({"toolCallId": "t1", "title": "Terminal", "kind": "execute",
               "rawInput": {"command": format!("rm -rf build/ && deploy --api-key {SECRET}")}}),
    )
}

/// The client sends prompt `id`; the agent says `turn` (read by the client to its end).
async fn prompt_turn(
    send: &mut SendStream,
    recv: &mut RecvStream,
    buf: &mut Vec<u8>,
    id: u64,
    turn: Vec<Value>,
) {
    send.write_all(&request(json!(id), "session/prompt", json!({"sessionId": "s1", "prompt": []})))
        .await
        .unwrap();
    let n = turn.len();
    send.write_all(&later(id + 1, 0, turn)).await.unwrap();
    assert_eq!(frame_json(&next_frame(recv, buf).await)["id"], id + 1);
    for _ in 0..n {
        next_frame(recv, buf).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_push_says_the_permissions_tool_and_command_masked_and_the_turns_tool_calls_while_the_url_stays_bare(
) {
    let mut svc = PushService::start().await;
    let hook = format!("http://127.0.0.1:{}/hook", svc.port);
    let s = Setup::with_env(&["--notify-always", "--notify-url", &hook], &agent(&["later"]), LOOPBACK).await;
    svc.log = s.bridge.log.clone();
    let ep = s.endpoint(&s.client_home).await;
    let (_c, mut send, mut recv, mut buf) = plain(&s, &ep).await;
    let r = call(&mut send, &mut recv, &mut buf, 1, "_thunderbolt/push/subscribe", svc.ok.clone()).await;
    assert_eq!(r["result"]["subscribed"], true, "{r}");

    send.write_all(&later(2, 0, vec![risky_permission("p1")])).await.unwrap();
    assert_eq!(frame_json(&next_frame(&mut recv, &mut buf).await)["id"], 2);
    assert_eq!(frame_json(&next_frame(&mut recv, &mut buf).await)["id"], "p1");
    let (mut push, mut hooked) = (None, None);
    while push.is_none() || hooked.is_none() {
        let v = svc.next().await;
        match v["path"].as_str() {
            Some("/push/ok") => push = Some(v),
            Some("/hook") => hooked = Some(v),
            _ => panic!("{v}"),
        }
    }
    let (push, hooked) = (push.unwrap(), hooked.unwrap());
    let notice = &push["notice"];
    assert_eq!(notice["body"], "Terminal: rm -rf build/ && deploy --api-key ***", "{notice}");
    assert_eq!(notice["text"], "Terminal");
    assert_eq!(notice["detail"], "session/request_permission", "what the service worker reads is kept");
    assert!(!push.to_string().contains(SECRET), "the secret is masked: {push}");
    let body: Value = serde_json::from_str(hooked["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["body"], "it asks: session/request_permission", "the URL's notice is bare: {body}");
    assert!(!hooked.to_string().contains("rm -rf"), "{hooked}");

    // A turn: its notice counts the session's tool calls and the file its edit changed.
    prompt_turn(&mut send, &mut recv, &mut buf, 3, a_turn(3)).await;
    let push = svc.next_push().await;
    assert_eq!(push["notice"]["event"], "finished", "{push}");
    assert_eq!(push["notice"]["detail"], "end_turn");
    assert_eq!(push["notice"]["body"], "finished: 3 tool calls, 1 file changed");
    // The next turn counts from nothing, and says why it stopped.
    let cancelled = json!({"jsonrpc": "2.0", "id": 5, "result": {"stopReason": "cancelled"}});
    prompt_turn(&mut send, &mut recv, &mut buf, 5, vec![cancelled]).await;
    let push = svc.next_push().await;
    assert_eq!(push["notice"]["body"], "finished: no tool calls (cancelled)", "{push}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_notify_bare_a_push_names_the_event_only() {
    let mut svc = PushService::start().await;
    let s = Setup::with_env(&["--notify-always", "--notify-bare"], &agent(&["later"]), LOOPBACK).await;
    svc.log = s.bridge.log.clone();
    let ep = s.endpoint(&s.client_home).await;
    let (_c, mut send, mut recv, mut buf) = plain(&s, &ep).await;
    let r = call(&mut send, &mut recv, &mut buf, 1, "_thunderbolt/push/subscribe", svc.ok.clone()).await;
    assert_eq!(r["result"]["subscribed"], true, "{r}");

    send.write_all(&later(2, 0, vec![risky_permission("p1")])).await.unwrap();
    assert_eq!(frame_json(&next_frame(&mut recv, &mut buf).await)["id"], 2);
    assert_eq!(frame_json(&next_frame(&mut recv, &mut buf).await)["id"], "p1");
    let push = svc.next_push().await;
    assert_eq!(push["notice"]["body"], "it asks: session/request_permission", "{push}");
    assert!(push["notice"]["text"].is_null(), "{push}");
    assert!(!push.to_string().contains("rm -rf"), "{push}");

    prompt_turn(&mut send, &mut recv, &mut buf, 3, a_turn(3)).await;
    let push = svc.next_push().await;
    assert_eq!(push["notice"]["body"], "finished: end_turn", "{push}");
}

/// A plain (`/0`) session of `ep`'s device: its connection and stream.
async fn plain(s: &Setup, ep: &Endpoint) -> (Connection, SendStream, RecvStream, Vec<u8>) {
    let conn = s.bridge.dial(ep, &thunderbolt_shared::Protocol::acp().alpn()).await;
    let (send, recv) = conn.open_bi().await.unwrap();
    (conn, send, recv, Vec::new())
}

/// The agent asks `n` questions; returns once the client has them all (the
/// bridge decides on a notice before it forwards the question).
async fn ask(send: &mut SendStream, recv: &mut RecvStream, buf: &mut Vec<u8>, id: u64, n: usize) {
    let qs: Vec<Value> = (0..n).map(|i| permission(&format!("q{id}-{i}"), "x")).collect();
    send.write_all(&later(id, 0, qs)).await.unwrap();
    assert_eq!(frame_json(&next_frame(recv, buf).await)["id"], id);
    for i in 0..n {
        assert_eq!(frame_json(&next_frame(recv, buf).await)["id"], format!("q{id}-{i}"));
    }
}

/// `sub` (a subscription's JSON) at another endpoint, same keys.
fn at(sub: &Value, endpoint: &str) -> Value {
    let mut v = sub.clone();
    v["endpoint"] = endpoint.into();
    v
}

/// A loopback listener that records every connection made to it and holds
/// it open, never answering (a push target that never replies).
struct Target {
    port: u16,
    got: mpsc::UnboundedReceiver<()>,
}

impl Target {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, got) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
                let _ = tx.send(());
            }
        });
        Self { port, got }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn endpoints_on_this_machine_and_overlong_ones_are_refused_and_nothing_reaches_them() {
    let mut svc = PushService::start().await;
    let mut target = Target::start().await;
    let hook = format!("http://127.0.0.1:{}/hook", svc.port);
    // No tests' switch: as in use.
    let s = Setup::new(&["--notify-always", "--notify-url", &hook], &agent(&["later"])).await;
    svc.log = s.bridge.log.clone();
    let ep = s.endpoint(&s.client_home).await;
    let (_conn, mut send, mut recv, mut buf) = plain(&s, &ep).await;
    let mut id = 0;
    for endpoint in [
        format!("http://127.0.0.1:{}/actuator/shutdown?confirm=yes", target.port),
        format!("https://127.0.0.1:{}/x", target.port),
        format!("http://localhost:{}/x", target.port),
        "https://169.254.169.254/latest/meta-data".to_string(),
        "https://10.0.0.1/x".to_string(),
        "https://[fd00::1]/x".to_string(),
        "https://intranet/x".to_string(),
    ] {
        id += 1;
        let r =
            call(&mut send, &mut recv, &mut buf, id, "_thunderbolt/push/subscribe", at(&svc.ok, &endpoint))
                .await;
        assert_eq!(r["error"]["code"], -32602, "{endpoint} is refused: {r}");
    }
    let long = format!("https://push.example.com/{}", "x".repeat(3000));
    let r = call(&mut send, &mut recv, &mut buf, 99, "_thunderbolt/push/subscribe", at(&svc.ok, &long)).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.contains("more than 2048"), "a clear reason: {msg}");
    assert!(!push_file(&s.bridge_home).contains("127.0.0.1"), "nothing stored");

    // A notice now: the hook gets it, the loopback target nothing.
    ask(&mut send, &mut recv, &mut buf, 100, 1).await;
    assert_eq!(svc.next().await["path"], "/hook");
    s.bridge.log.wait_for("notified:").await;
    let reached = tokio::time::timeout(Duration::from_millis(300), target.got.recv()).await;
    assert!(reached.is_err(), "nothing reached the loopback target");
    assert!(!s.bridge.log.contains("web push to"), "{}", s.bridge.log.text());
}

#[tokio::test(flavor = "multi_thread")]
async fn two_devices_subscribed_to_one_endpoint_each_keep_their_own() {
    let mut svc = PushService::start().await;
    let s = Setup::with_env(&["--notify-always"], &agent(&["later"]), LOOPBACK).await;
    svc.log = s.bridge.log.clone();
    let other = Tb::new(None);
    s.bridge_home.allow(&other.node_id("acp").await).await;
    let (ep_a, ep_b) = (s.endpoint(&s.client_home).await, s.endpoint(&other).await);
    let (_ca, mut send_a, mut recv_a, mut buf_a) = plain(&s, &ep_a).await;
    let (_cb, mut send_b, mut recv_b, mut buf_b) = plain(&s, &ep_b).await;
    let sub = svc.ok.clone();
    let r = call(&mut send_a, &mut recv_a, &mut buf_a, 1, "_thunderbolt/push/subscribe", sub.clone()).await;
    assert_eq!(r["result"]["subscribed"], true, "{r}");
    let r = call(&mut send_b, &mut recv_b, &mut buf_b, 1, "_thunderbolt/push/subscribe", sub.clone()).await;
    assert_eq!(r["result"]["subscribed"], true, "{r}");
    // B unsubscribes: its own entry goes, A's stays.
    let unsubscribe = json!({"endpoint": sub["endpoint"]});
    let r =
        call(&mut send_b, &mut recv_b, &mut buf_b, 2, "_thunderbolt/push/unsubscribe", unsubscribe.clone())
            .await;
    assert_eq!(r["result"]["removed"], true, "{r}");
    ask(&mut send_a, &mut recv_a, &mut buf_a, 3, 1).await;
    let push = svc.next_push().await;
    assert_eq!(push["notice"]["event"], "needs_answer", "A still gets its notice: {push}");
    // Unsubscribing what is not there answers the same.
    let r = call(&mut send_b, &mut recv_b, &mut buf_b, 4, "_thunderbolt/push/unsubscribe", unsubscribe).await;
    assert_eq!(r["result"]["removed"], true, "{r}");
    let stored = push_file(&s.bridge_home);
    assert_eq!(stored.matches("/push/ok").count(), 1, "{stored}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_device_whose_endpoints_never_answer_does_not_delay_another_devices_notice() {
    let mut svc = PushService::start().await;
    let mut hang = Target::start().await;
    let s = Setup::with_env(&["--notify-always"], &agent(&["later"]), LOOPBACK).await;
    svc.log = s.bridge.log.clone();
    let other = Tb::new(None);
    s.bridge_home.allow(&other.node_id("acp").await).await;
    let (ep_h, ep_a) = (s.endpoint(&other).await, s.endpoint(&s.client_home).await);
    // The hostile device: eight subscriptions to a listener that never answers.
    let (_ch, mut send_h, mut recv_h, mut buf_h) = plain(&s, &ep_h).await;
    for i in 0..8 {
        let sub = at(&svc.ok, &format!("http://127.0.0.1:{}/h{i}", hang.port));
        let r = call(&mut send_h, &mut recv_h, &mut buf_h, i, "_thunderbolt/push/subscribe", sub).await;
        assert_eq!(r["result"]["subscribed"], true, "{r}");
    }
    let (_ca, mut send_a, mut recv_a, mut buf_a) = plain(&s, &ep_a).await;
    let r =
        call(&mut send_a, &mut recv_a, &mut buf_a, 1, "_thunderbolt/push/subscribe", svc.ok.clone()).await;
    assert_eq!(r["result"]["subscribed"], true, "{r}");
    // Its notices go first and hang (two, so one waits behind the other).
    ask(&mut send_h, &mut recv_h, &mut buf_h, 10, 2).await;
    tokio::time::timeout(WAIT, hang.got.recv()).await.expect("the hostile endpoints are being tried");
    let t0 = std::time::Instant::now();
    ask(&mut send_a, &mut recv_a, &mut buf_a, 2, 1).await;
    let push = svc.next_push().await;
    let took = t0.elapsed();
    assert_eq!(push["notice"]["event"], "needs_answer");
    // Before: one delivery at a time, 10 s each: 79.7 s for eight.
    assert!(took < Duration::from_secs(3), "the other device's notice took {took:?}");
    eprintln!("the other device's notice took {took:?} while eight endpoints hung");
    // The hanging ones end at the short timeout.
    s.bridge.log.wait_for("no answer in time").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_devices_sessions_share_one_budget_of_notices() {
    let mut svc = PushService::start().await;
    let hook = format!("http://127.0.0.1:{}/hook", svc.port);
    let s = Setup::new(&["--notify-always", "--notify-url", &hook], &agent(&["later"])).await;
    svc.log = s.bridge.log.clone();
    let ep = s.endpoint(&s.client_home).await;
    // Four sessions of one device, three questions each: within each
    // session's own burst (3), twice the device's (6).
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(plain(&s, &ep).await);
    }
    for (n, (_c, send, recv, buf)) in sessions.iter_mut().enumerate() {
        ask(send, recv, buf, n as u64 + 1, 3).await;
    }
    // Every decision is made (the client has every question); 6 were held.
    s.bridge.log.wait_for("notices of this device are held back").await;
    s.bridge.log.wait_for("held back (6 so far)").await;
    let mut hooks = 0;
    while hooks < 6 {
        assert_eq!(svc.next().await["path"], "/hook");
        hooks += 1;
    }
    let more = tokio::time::timeout(Duration::from_millis(500), svc.got.recv()).await;
    assert!(more.is_err(), "at most the device's burst of 6 went out: {more:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_device_removed_from_the_allow_file_loses_its_subscriptions_without_a_notice() {
    let mut svc = PushService::start().await;
    let s = Setup::with_env(&[], &agent(&["later"]), LOOPBACK).await;
    svc.log = s.bridge.log.clone();
    let ep = s.endpoint(&s.client_home).await;
    let (_c, mut send, mut recv, mut buf) = plain(&s, &ep).await;
    let r = call(&mut send, &mut recv, &mut buf, 1, "_thunderbolt/push/subscribe", svc.ok.clone()).await;
    assert_eq!(r["result"]["subscribed"], true, "{r}");
    assert!(push_file(&s.bridge_home).contains("/push/ok"));
    // By hand, not `iroh deny` (which edits push.json itself).
    std::fs::write(s.bridge_home.home().join("iroh/allowlist"), "# nobody\n").unwrap();
    s.bridge.log.wait_for("1 push subscription(s) of a device no longer allowed removed").await;
    assert!(!push_file(&s.bridge_home).contains("/push/ok"), "{}", push_file(&s.bridge_home));
    assert!(!s.bridge.log.contains("notified:"), "no notice was needed");
}

/// One answer line on the answer door (`thunderbolt/acp/answer1`) from `ep`'s
/// device: the bridge's reply.
async fn answer_from_notice(s: &Setup, ep: &Endpoint, line: Value) -> Value {
    let alpn = thunderbolt_shared::answer::answer_alpn(&thunderbolt_shared::Protocol::acp());
    let conn = s.bridge.dial(ep, &alpn).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let mut b = serde_json::to_vec(&line).unwrap();
    b.push(b'\n');
    send.write_all(&b).await.unwrap();
    send.finish().unwrap();
    let reply = tokio::time::timeout(WAIT, recv.read_to_end(4096)).await.unwrap().unwrap();
    serde_json::from_slice(&reply).unwrap_or_else(|e| panic!("a JSON reply ({e}): {reply:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_question_answered_from_its_notice_reaches_the_agent_once_and_its_notice_is_withdrawn() {
    let mut svc = PushService::start().await;
    // `cat`: what the agent is written comes back, so the client sees every
    // line the agent got; a request the client sends comes back as the
    // agent's own question.
    let s = Setup::with_env(&["--resume-grace", "60"], &agent(&["cat"]), LOOPBACK).await;
    svc.log = s.bridge.log.clone();
    let ep = s.endpoint(&s.client_home).await;
    let (conn, mut send, mut recv, token) = s.session(&ep).await;
    let mut buf = Vec::new();
    call(&mut send, &mut recv, &mut buf, 1, "_thunderbolt/push/subscribe", svc.ok.clone()).await;
    let options = json!([
        {"optionId": "allow-once", "name": "Allow", "kind": "allow_once"},
        {"optionId": "reject-once", "name": "Deny", "kind": "reject_once"}
    ]);
    let asked = json!({"jsonrpc": "2.0", "id": "p1", "method": "session/request_permission",
                       "params": {"sessionId": "s1", "toolCall": {"toolCallId": "t1", "title": "rm -rf build"}, "options": options}});
    send.write_all(&[serde_json::to_vec(&asked).unwrap(), b"\n".to_vec()].concat()).await.unwrap();
    assert_eq!(frame_json(&next_frame(&mut recv, &mut buf).await), asked, "the agent asks");
    lose(&conn);

    let push = svc.next_push().await;
    let notice = &push["notice"];
    assert_eq!(notice["event"], "needs_answer", "{push}");
    assert_eq!(notice["request"], "\"p1\"", "the notice names the request as the JSON text of its id");
    assert_eq!(notice["options"], options, "and the permission's options");
    assert_eq!(notice["node"], s.bridge.node_id.to_string());
    assert_eq!(notice["protocol"], "acp", "the door's ALPN is the protocol's");
    let one_time = notice["answer"].as_str().expect("a one-time answer token").to_string();
    assert_eq!(one_time.len(), 32);
    let session = notice["session"].as_str().unwrap().to_string();
    let allow = json!({"outcome": {"outcome": "selected", "optionId": "allow-once"}});
    let line =
        |token: &str| json!({"session": session, "request": "\"p1\"", "token": token, "result": allow});

    // Another device cannot answer it, and a wrong token answers nothing.
    let third = Tb::new(None);
    let third_id = third.node_id("acp").await.to_string();
    assert!(s.bridge_home.run(&["iroh", "allow", &third_id]).await.status.success());
    let stranger = s.endpoint(&third).await;
    let other = answer_from_notice(&s, &stranger, line(&one_time)).await;
    assert_eq!(other, json!({"answered": false, "error": "unknown session"}), "not its session");
    let wrong = answer_from_notice(&s, &ep, line(&"0".repeat(32))).await;
    assert_eq!(wrong, json!({"answered": false, "error": "wrong token"}));
    let bad = answer_from_notice(&s, &ep, json!({"session": session, "request": "\"p1\""})).await;
    assert_eq!(bad, json!({"answered": false, "error": "bad answer"}));
    // A line over the bound is not read past it, and answers nothing.
    let mut huge = line(&one_time);
    huge["result"]["pad"] = json!("x".repeat(thunderbolt_shared::answer::MAX_ANSWER_LINE));
    let refused = answer_from_notice(&s, &ep, huge).await;
    assert_eq!(refused, json!({"answered": false, "error": "bad answer"}), "over the bound");
    // The device's own, with the notice's token: answered, once.
    assert_eq!(answer_from_notice(&s, &ep, line(&one_time)).await, json!({"answered": true}));
    assert_eq!(
        answer_from_notice(&s, &ep, line(&one_time)).await,
        json!({"answered": false, "error": "already answered"})
    );
    // Its notice is withdrawn: a push of the question's topic, at once.
    let withdrawn = svc.next_push().await;
    assert_eq!(withdrawn["notice"]["event"], "answered", "{withdrawn}");
    assert_eq!(withdrawn["notice"]["request"], "\"p1\"");
    assert_eq!(withdrawn["notice"]["session"], session.as_str());
    assert!(withdrawn["notice"].get("answer").is_none(), "a withdrawal carries no token");
    assert_eq!(withdrawn["urgency"], "high");

    // Back on the session: the agent got the answer (cat says so), and the
    // client's own late answer to the same question never reaches it.
    let (_c, mut send2, mut recv2, welcome) = s.resume(&ep, &token, 2).await;
    welcome.expect("resumed");
    let mut buf2 = Vec::new();
    let got = frame_json(&next_frame(&mut recv2, &mut buf2).await);
    assert_eq!(got, json!({"jsonrpc": "2.0", "id": "p1", "result": allow}), "the agent got the answer");
    send2
        .write_all(
            b"{\"jsonrpc\":\"2.0\",\"id\":\"p1\",\"result\":{\"outcome\":{\"outcome\":\"cancelled\"}}}\n",
        )
        .await
        .unwrap();
    send2.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"marker\"}\n").await.unwrap();
    let next = frame_json(&next_frame(&mut recv2, &mut buf2).await);
    assert_eq!(next["method"], "marker", "the client's second answer was dropped, not echoed: {next}");
    s.bridge.log.wait_for("answered from a notice").await;
}

/// An agent that fails says why in a notice: its exit and its last stderr
/// line (what a person needs to fix it: a missing key), worded; bare, the
/// exit only.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_that_fails_is_notified_with_its_last_stderr_line() {
    let failing: Vec<String> =
        ["sh", "-c", "read -r l; echo 'missing API key ANTHROPIC_API_KEY' >&2; exit 3"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    for (worded, flags) in [(true, &["--notify-text"][..]), (false, &[][..])] {
        let mut svc = PushService::start().await;
        let hook = format!("http://127.0.0.1:{}/hook", svc.port);
        let mut args = vec!["--notify-always", "--notify-url", &hook];
        args.extend_from_slice(flags);
        let s = Setup::new(&args, &failing).await;
        svc.log = s.bridge.log.clone();
        let ep = s.endpoint(&s.client_home).await;
        let conn = s.bridge.dial(&ep, &thunderbolt_shared::Protocol::acp().alpn()).await;
        let (mut send, _recv) = conn.open_bi().await.unwrap();
        send.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\"}\n").await.unwrap();
        let v = svc.next().await;
        assert_eq!(v["path"], "/hook");
        let body: Value = serde_json::from_str(v["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["event"], "stopped", "{body}");
        assert_eq!(body["detail"], "agent exited (code 3)", "{body}");
        let expected = if worded {
            "the agent exited with code 3: missing API key ANTHROPIC_API_KEY"
        } else {
            "stopped: agent exited (code 3)"
        };
        assert_eq!(body["body"], expected, "{body}");
    }
}
