//! What a device may do (its scope: `iroh pair --scope … --for …`,
//! `thunderbolt devices scope`), enforced by a real bridge on every path:
//! real `connect` processes paired with one-time codes, the test agent's
//! questions, the answer door, notices through a stand-in push service.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use thunderbolt_shared::{
    close,
    devices::{METHOD_ANSWERED, METHOD_ROLE, SCOPE_REFUSED_CODE},
};
use thunderbolt_tests::{
    push::{PushService, LOOPBACK},
    r1::{agent, lose, next_frame, Setup},
    setup::{call, pair, status},
    *,
};

type Device = JsonConnect;

fn note(n: u64) -> Value {
    json!({"jsonrpc": "2.0", "method": "note", "params": {"sessionId": "s-1", "n": n}})
}

fn prompt(id: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": {"sessionId": "s-1", "prompt": []}})
}

fn answer(who: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": "q1", "result": {"content": format!("from {who}")}})
}

/// A bridge of the test agent in `mode` (every device dials from 127.0.0.1:
/// one remote to the gate).
async fn bridge(mode: &str) -> (Tb, RunningBridge) {
    init_tracing();
    let home = Tb::new(None);
    let agent_bin = test_agent_bin();
    let b = home.bridge("acp", &["--per-remote-max", "100"], &[agent_bin.to_str().unwrap(), mode]).await;
    (home, b)
}

/// `thunderbolt sessions <ticket> --json` from `device`.
async fn sessions(device: &Tb, ticket: &str) -> Vec<Value> {
    let out = device.run(&["sessions", ticket, "--json"]).await;
    assert!(out.status.success(), "sessions: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["sessions"].as_array().unwrap().clone()
}

/// A new session from `device` is refused: `connect` exits unsuccessfully
/// and says `why`.
async fn start_refused(device: &Tb, ticket: &str, why: &str) {
    let mut d = Device::start(device, &[ticket]);
    // A refused connect may be gone before the write: its exit says what happened.
    if let Some(stdin) = d.stdin.as_mut() {
        use tokio::io::AsyncWriteExt;
        let _ = stdin.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"note\",\"params\":{}}\n").await;
    }
    let status = tokio::time::timeout(WAIT, d.child.wait()).await.expect("connect exits").unwrap();
    assert!(!status.success(), "refused: {}", d.log.text());
    d.log.wait_for(why).await;
}

fn role(v: &Value) -> Option<&str> {
    (v["method"] == METHOD_ROLE).then(|| v["params"]["role"].as_str().unwrap())
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// An `observe` device watches (the history, live frames) but cannot start,
/// prompt, take control or answer; an `answer` device answers the agent's
/// question (and wins it) but cannot start or prompt. `status` shows each
/// one's scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_only_watches_and_an_answerer_only_answers() {
    let (home, b) = bridge("ask").await;
    let ticket = b.ticket.as_str();
    let (laptop, watcher, approver) = (Tb::new(None), Tb::new(None), Tb::new(None));
    pair(&home, &laptop, ticket, "laptop", &[]).await;
    let minted = pair(&home, &watcher, ticket, "watcher", &["--scope", "observe"]).await;
    assert_eq!(minted["scope"]["verbs"], json!(["observe"]), "{minted}");
    pair(&home, &approver, ticket, "approver", &["--scope", "answer"]).await;

    start_refused(&watcher, ticket, close::REASON_SCOPE_START).await;
    start_refused(&approver, ticket, close::REASON_SCOPE_START).await;
    b.log.wait_for_count("refused a new session: this device may not start sessions", 2).await;

    let mut l = Device::start(&laptop, &[ticket]);
    l.send(note(0)).await;
    l.until(|v| v["id"] == "q1").await;
    let listed = sessions(&watcher, ticket).await;
    assert_eq!(listed.len(), 1, "an observer lists the owner's session: {listed:?}");
    let id = listed[0]["id"].as_str().unwrap().to_string();

    // Both join asking for control (no --observe): each is made an observer.
    let mut w = Device::start(&watcher, &["--attach", &id, "--history", "all", ticket]);
    w.until(|v| v["id"] == "q1" && v["method"].is_string()).await;
    assert_eq!(role(&w.until(|v| role(v).is_some()).await), Some("observer"));
    let mut a = Device::start(&approver, &["--attach", &id, "--history", "all", ticket]);
    a.until(|v| v["id"] == "q1" && v["method"].is_string()).await;
    assert_eq!(role(&a.until(|v| role(v).is_some()).await), Some("observer"));

    // Neither may prompt: refused naming the scope; the agent never sees it.
    for (d, scope) in [(&mut w, "observe"), (&mut a, "observe,answer")] {
        d.send(prompt("p1")).await;
        let refused = d.until(|v| v["id"] == "p1").await;
        assert_eq!(refused["error"]["code"], SCOPE_REFUSED_CODE, "{refused}");
        assert_eq!(refused["error"]["data"]["scope"], scope, "{refused}");
        assert!(refused["error"]["message"].as_str().unwrap().contains("may not send the agent requests"));
    }

    // The watcher's answer is dropped; the approver's is the one the agent gets.
    w.send(answer("watcher")).await;
    b.log.wait_for("watcher's scope is observe: 0 request(s) refused, 1 line(s) not sent to the agent").await;
    a.send(answer("approver")).await;
    let told = l.until(|v| v["method"] == METHOD_ANSWERED).await;
    assert_eq!(told["params"]["by"]["name"], "approver", "{told}");
    b.log.wait_for("agent stderr: answer:").await;
    let log = b.log.text();
    let answers: Vec<&str> = log.lines().filter(|l| l.contains("agent stderr: answer:")).collect();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(answers[0].contains("from approver"), "{answers:?}");

    // The laptop kept control throughout: its frames go on.
    l.send(note(1)).await;
    l.until(|v| v["id"] == "q2").await;

    let st = status(&home).await;
    let scopes: Vec<(String, Value)> = st["bridges"][0]["sessions"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["device"].as_str().unwrap_or("").to_string(), d["scope"].clone()))
        .collect();
    assert_eq!(
        scopes,
        vec![
            ("laptop".to_string(), Value::Null),
            ("watcher".to_string(), json!("observe")),
            ("approver".to_string(), json!("observe,answer")),
        ],
        "{st}"
    );
}

/// A device paired `--for 3s` is refused once that ran out, and its live
/// session is ended by the timer set to that end, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_past_its_expiry_is_ended_at_once_and_refused() {
    let (home, b) = bridge("cat").await;
    let ticket = b.ticket.as_str();
    let phone = Tb::new(None);
    pair(&home, &phone, ticket, "phone", &["--for", "3s"]).await;
    let mut p = Device::start(&phone, &[ticket]);
    p.send(note(0)).await;
    p.until(|v| v["method"] == "note").await;
    let listed: Value = serde_json::from_slice(&home.run(&["iroh", "list", "--json"]).await.stdout).unwrap();
    let until = listed["devices"][0]["scope"]["untilMs"].as_u64().expect("an expiry in iroh list");
    assert!(until > now_ms(), "the session is live before it");

    let status = tokio::time::timeout(WAIT, p.child.wait()).await.expect("the session ends").unwrap();
    assert!(now_ms() >= until, "ended {} ms before its end", until - now_ms());
    assert!(!status.success());
    p.log.wait_for(close::REASON_SCOPE_EXPIRED).await;
    // Ended by the timer set to the scope's end (at once), not found out by a
    // heartbeat (every 45 s): that is the line the timer's path writes.
    b.log.wait_for("a device's scope ran out: 1 of its session(s) ended").await;
    start_refused(&phone, ticket, close::REASON_SCOPE_EXPIRED).await;

    // Given more time, it is back.
    let out = home.run(&["devices", "scope", "phone", "--no-end"]).await;
    assert!(out.status.success(), "{out:?}");
    let mut p = Device::start(&phone, &[ticket]);
    p.send(note(1)).await;
    p.until(|v| v["method"] == "note").await;
    assert!(p.close().await.success());
}

/// A device's scope narrowed while it drives a session holds from its next
/// frame: it is made an observer and its request refused; widened again, it
/// drives again. No reconnect either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_narrowed_while_a_session_is_live_holds_at_once() {
    let (home, b) = bridge("cat").await;
    let ticket = b.ticket.as_str();
    let (laptop, phone) = (Tb::new(None), Tb::new(None));
    pair(&home, &laptop, ticket, "laptop", &[]).await;
    pair(&home, &phone, ticket, "phone", &[]).await;
    let mut l = Device::start(&laptop, &[ticket]);
    l.send(note(0)).await;
    l.until(|v| v["method"] == "note").await;
    let id = sessions(&phone, ticket).await[0]["id"].as_str().unwrap().to_string();
    let mut p = Device::start(&phone, &["--attach", &id, "--history", "now", ticket]);
    assert_eq!(role(&p.until(|v| role(v).is_some()).await), Some("controller"));
    p.send(json!({"jsonrpc": "2.0", "id": 1, "method": "echo/me", "params": {}})).await;
    p.until(|v| v["method"] == "echo/me").await;

    let out = home.run(&["devices", "scope", "phone", "--scope", "observe"]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("phone may now do: observe"), "{out:?}");
    assert_eq!(role(&p.until(|v| role(v).is_some()).await), Some("observer"), "it stepped down at once");
    p.send(prompt("p2")).await;
    let refused = p.until(|v| v["id"] == "p2").await;
    assert_eq!(refused["error"]["code"], SCOPE_REFUSED_CODE, "{refused}");

    let out = home.run(&["devices", "scope", "phone", "--owner"]).await;
    assert!(out.status.success(), "{out:?}");
    b.log.wait_for("phone's scope is observe,prompt,answer,start,files now").await;
    assert!(l.close().await.success());
}

/// A device that may not answer is notified without Allow and Deny (nor the
/// one-time token), and the answer door refuses it whatever it sends.
#[tokio::test(flavor = "multi_thread")]
async fn a_device_that_may_not_answer_gets_notices_without_actions() {
    let mut svc = PushService::start().await;
    let s = Setup::with_env(&["--resume-grace", "60"], &agent(&["cat"]), LOOPBACK).await;
    svc.log = s.bridge.log.clone();
    let ep = s.endpoint(&s.client_home).await;
    let (conn, mut send, mut recv, _token) = s.session(&ep).await;
    let mut buf = Vec::new();
    call(&mut send, &mut recv, &mut buf, 1, "_thunderbolt/push/subscribe", svc.ok.clone()).await;
    let id = s.client_home.node_id("acp").await.to_string();
    let out = s.bridge_home.run(&["devices", "scope", &id, "--scope", "prompt"]).await;
    assert!(out.status.success(), "{out:?}");
    s.bridge.log.wait_for("scope is observe,prompt now").await;
    // Its request comes back from `cat` as the agent's own question, asked
    // while nothing is attached.
    let asked = json!({"jsonrpc": "2.0", "id": "p1", "method": "session/request_permission",
        "params": {"sessionId": "s1", "toolCall": {"toolCallId": "t1", "title": "rm -rf build"},
                   "options": [{"optionId": "allow-once", "name": "Allow", "kind": "allow_once"}]}});
    send.write_all(&[serde_json::to_vec(&asked).unwrap(), b"\n".to_vec()].concat()).await.unwrap();
    next_frame(&mut recv, &mut buf).await;
    lose(&conn);
    let push = svc.next_push().await;
    let notice = &push["notice"];
    assert_eq!(notice["event"], "needs_answer", "{push}");
    assert!(notice.get("answer").is_none(), "no token: {notice}");
    assert!(notice.get("options").is_none(), "no actions: {notice}");

    let alpn = thunderbolt_shared::answer::answer_alpn(&thunderbolt_shared::Protocol::acp());
    let c = s.bridge.dial(&ep, &alpn).await;
    let (mut tx, mut rx) = c.open_bi().await.unwrap();
    let line = json!({"session": notice["session"], "request": "\"p1\"", "token": "0".repeat(32),
                      "result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}}});
    tx.write_all(&[serde_json::to_vec(&line).unwrap(), b"\n".to_vec()].concat()).await.unwrap();
    tx.finish().unwrap();
    let reply = tokio::time::timeout(WAIT, rx.read_to_end(4096)).await.unwrap().unwrap();
    let reply: Value = serde_json::from_slice(&reply).unwrap();
    assert_eq!(reply, json!({"answered": false, "error": thunderbolt_shared::answer::REASON_NOT_PERMITTED}));
}

/// `thunderbolt share <session> --json` on the bridge's home.
async fn share(home: &Tb, id: &str, extra: &[&str]) -> Value {
    let mut args = vec!["share", id, "--json", "--no-qr"];
    args.extend_from_slice(extra);
    let out = home.run(&args).await;
    assert!(out.status.success(), "share: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("share JSON")
}

/// Another person's device (its own home, never paired) redeems a share's
/// link: it joins exactly that session as an observer with its history,
/// sees live frames, cannot send, lists and joins nothing else (a made-up id
/// and another real session get the same answer), the link works once for
/// one NodeId; the owner sees it in `status` and `kick` ends it for good.
/// A `--drive` share prompts; a share past its end is ended and refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_lets_another_persons_device_into_one_session_only_until_kicked_or_over() {
    let (home, b) = bridge("cat").await;
    let ticket = b.ticket.as_str();
    let laptop = Tb::new(None);
    pair(&home, &laptop, ticket, "laptop", &[]).await;
    let mut l = Device::start(&laptop, &[ticket]);
    l.send(note(0)).await;
    l.until(|v| v["method"] == "note").await;
    let mut other = Device::start(&laptop, &["--relay-url", "disabled", ticket]);
    other.send(note(100)).await;
    other.until(|v| v["method"] == "note").await;
    let st = status(&home).await;
    let ids: Vec<String> = st["bridges"][0]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 2, "{st}");
    let (id, second) = (ids[0].clone(), ids[1].clone());

    let minted = share(&home, &id, &["--observe", "--for", "1h", "--name", "friend"]).await;
    assert_eq!(minted["session"], id.as_str());
    let code = minted["code"].as_str().unwrap().to_string();
    let friend = Tb::new(None);
    let mut f = Device::start(&friend, &["--pair", &code, ticket]);
    f.until(|v| v["method"] == "note" && v["params"]["n"] == 0).await;
    assert_eq!(role(&f.until(|v| role(v).is_some()).await), Some("observer"));
    f.log.wait_for(&format!("a guest of session {id}")).await;
    l.send(note(1)).await;
    f.until(|v| v["method"] == "note" && v["params"]["n"] == 1).await;
    f.send(prompt("f1")).await;
    assert_eq!(f.until(|v| v["id"] == "f1").await["error"]["code"], SCOPE_REFUSED_CODE);
    // Nor may it have the owner's notices (and their answer tokens) sent to
    // it, however it spells the method (an escaped slash reads the same to a
    // JSON parser).
    let subscribe = json!({"jsonrpc": "2.0", "id": "f2", "method": "_thunderbolt/push/subscribe",
                           "params": {"endpoint": "https://push.example/x", "keys": {"p256dh": "x", "auth": "y"}}});
    let escaped = br#"{"jsonrpc":"2.0","id":"f3","method":"_thunderbolt/push\/subscribe","params":{"endpoint":"https://push.example/y"}}"#;
    for (id, line) in [("f2", serde_json::to_vec(&subscribe).unwrap()), ("f3", escaped.to_vec())] {
        f.send_raw(&line).await;
        let refused = f.until(|v| v["id"] == id).await;
        let said = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(said.contains("notices are set up on a session this device started"), "{refused}");
    }
    // Nor may it share what it was shared.
    f.send(json!({"jsonrpc": "2.0", "id": "f4", "method": "_thunderbolt/share", "params": {"drive": false}}))
        .await;
    assert_eq!(f.until(|v| v["id"] == "f4").await["error"]["code"], SCOPE_REFUSED_CODE);

    // It sees its one session, and nothing else is there for it.
    let listed = sessions(&friend, ticket).await;
    assert_eq!(listed.iter().map(|s| s["id"].as_str().unwrap()).collect::<Vec<_>>(), vec![id.as_str()]);
    for other_id in [second.as_str(), "0123456789ab"] {
        let mut g = Device::start(&friend, &["--relay-url", "disabled", "--attach", other_id, ticket]);
        let status = tokio::time::timeout(WAIT, g.child.wait()).await.expect("refused").unwrap();
        assert!(!status.success());
        // The same words for both: ids are not probed.
        g.log.wait_for(&format!("no session '{other_id}' this device may join")).await;
    }
    start_refused(&friend, ticket, close::REASON_SCOPE_START).await;
    // Once, by one NodeId.
    let stranger = Tb::new(None);
    let out = stranger.run(&["acp", "connect", "--pair", &code, ticket]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already used"), "{out:?}");

    // The owner sees it, and ends it at once and for good.
    let st = status(&home).await;
    let session = st["bridges"][0]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id.as_str())
        .unwrap()
        .clone();
    let guest = session["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == "friend")
        .expect("listed")
        .clone();
    assert!(guest["shareUntil"].is_string(), "{guest}");
    assert_eq!(guest["scope"], "observe", "{guest}");
    let out = home.run(&["kick", "friend"]).await;
    assert!(out.status.success(), "{out:?}");
    let ended = tokio::time::timeout(WAIT, f.child.wait()).await.expect("kicked").unwrap();
    assert!(!ended.success());
    f.log.wait_for(close::REASON_KICKED).await;
    let mut again = Device::start(&friend, &["--attach", &id, ticket]);
    let status = tokio::time::timeout(WAIT, again.child.wait()).await.expect("refused").unwrap();
    assert!(!status.success());
    again.log.wait_for(close::REASON_NOT_ALLOWLISTED).await;

    // A share to drive: the guest's request reaches the agent (`cat` echoes it to every device).
    let minted = share(&home, &id, &["--drive", "--name", "driver"]).await;
    let driver = Tb::new(None);
    let mut d = Device::start(&driver, &["--pair", minted["code"].as_str().unwrap(), ticket]);
    assert_eq!(role(&d.until(|v| role(v).is_some()).await), Some("controller"));
    d.send(json!({"jsonrpc": "2.0", "id": "d1", "method": "driven/by", "params": {}})).await;
    l.until(|v| v["method"] == "driven/by").await;
    // And answers the agent's question (`cat` asks what the driver wrote).
    d.send(json!({"jsonrpc": "2.0", "id": "q9", "method": "session/request_permission", "params": {"sessionId": "s-1"}}))
        .await;
    d.until(|v| v["id"] == "q9" && v["method"].is_string()).await;
    d.send(json!({"jsonrpc": "2.0", "id": "q9", "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}))
        .await;
    let told = l.until(|v| v["method"] == thunderbolt_shared::devices::METHOD_ANSWERED).await;
    assert_eq!(told["params"]["by"]["name"], "driver", "{told}");

    // A share past its end: ended on the session, and refused after.
    let minted = share(&home, &id, &["--observe", "--for", "2s", "--name", "brief"]).await;
    let brief = Tb::new(None);
    let mut g = Device::start(&brief, &["--pair", minted["code"].as_str().unwrap(), ticket]);
    g.until(|v| role(v).is_some()).await;
    let status = tokio::time::timeout(WAIT, g.child.wait()).await.expect("ended at its end").unwrap();
    assert!(!status.success());
    g.log.wait_for(close::REASON_SCOPE_EXPIRED).await;
    let mut g = Device::start(&brief, &["--attach", &id, ticket]);
    let status = tokio::time::timeout(WAIT, g.child.wait()).await.expect("refused").unwrap();
    assert!(!status.success());
    g.log.wait_for(close::REASON_SCOPE_EXPIRED).await;
    drop((l, other, d));
}

/// A device on a session mints a share of it (`_thunderbolt/share`, the
/// page's button) within what it holds: a watcher may share watching, not
/// driving; the laptop may share driving. The code lets another person's
/// device into that session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_shares_what_it_holds_and_never_more() {
    let (home, b) = bridge("cat").await;
    let ticket = b.ticket.as_str();
    let (laptop, watcher) = (Tb::new(None), Tb::new(None));
    pair(&home, &laptop, ticket, "laptop", &[]).await;
    pair(&home, &watcher, ticket, "watcher", &["--scope", "observe"]).await;
    let mut l = Device::start(&laptop, &[ticket]);
    l.send(note(0)).await;
    l.until(|v| v["method"] == "note").await;
    let id = sessions(&watcher, ticket).await[0]["id"].as_str().unwrap().to_string();
    let mut w = Device::start(&watcher, &["--attach", &id, ticket]);
    w.until(|v| role(v).is_some()).await;

    let ask = |id: &str, drive: bool| json!({"jsonrpc": "2.0", "id": id, "method": "_thunderbolt/share", "params": {"drive": drive, "forSecs": 600}});
    w.send(ask("s1", true)).await;
    let refused = w.until(|v| v["id"] == "s1").await;
    assert_eq!(refused["error"]["code"], SCOPE_REFUSED_CODE, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("may not share"), "{refused}");
    w.send(ask("s2", false)).await;
    let minted = w.until(|v| v["id"] == "s2").await;
    assert_eq!(minted["result"]["session"], id.as_str(), "{minted}");
    assert_eq!(minted["result"]["verbs"], json!(["observe"]));
    l.send(ask("s3", true)).await;
    let driving = l.until(|v| v["id"] == "s3").await;
    assert_eq!(driving["result"]["verbs"], json!(["observe", "prompt", "answer"]), "{driving}");

    let friend = Tb::new(None);
    let code = minted["result"]["code"].as_str().unwrap();
    let mut f = Device::start(&friend, &["--pair", code, minted["result"]["ticket"].as_str().unwrap()]);
    assert_eq!(role(&f.until(|v| role(v).is_some()).await), Some("observer"));
    l.send(note(1)).await;
    f.until(|v| v["method"] == "note" && v["params"]["n"] == 1).await;

    // The laptop is told who joined (a guest, its seat); the guest may not end
    // anyone's share, the laptop ends the guest's, for good.
    let joined = l.until(|v| v["method"] == "_thunderbolt/joined" && v["params"]["guest"] == true).await;
    let seat = joined["params"]["seat"].as_str().unwrap().to_string();
    assert!(seat.starts_with(&format!("{id}.")), "{joined}");
    assert_eq!(joined["params"]["scope"], "observe", "{joined}");
    f.send(json!({"jsonrpc": "2.0", "id": "k1", "method": "_thunderbolt/kick", "params": {"seat": seat}}))
        .await;
    assert_eq!(f.until(|v| v["id"] == "k1").await["error"]["code"], SCOPE_REFUSED_CODE);
    l.send(json!({"jsonrpc": "2.0", "id": "k2", "method": "_thunderbolt/kick", "params": {"seat": seat}}))
        .await;
    assert_eq!(l.until(|v| v["id"] == "k2").await["result"]["ended"], true);
    let ended = tokio::time::timeout(WAIT, f.child.wait()).await.expect("ended").unwrap();
    assert!(!ended.success());
    f.log.wait_for(close::REASON_KICKED).await;
    let listed: Value = serde_json::from_slice(&home.run(&["iroh", "list", "--json"]).await.stdout).unwrap();
    assert!(!listed.to_string().contains("\"how\":\"share\""), "removed for good: {listed}");
    drop(w);
    assert!(l.close().await.success());
}
