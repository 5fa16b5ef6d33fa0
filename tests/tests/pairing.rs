//! Pairing a device in one step (`iroh pair` → `connect --pair`), named
//! devices (`iroh allow --name`, `iroh list --json`, `iroh deny <name>`), and
//! every way a pairing code is refused: real bridge processes, real
//! `connect` processes, the real allow file.

use std::{os::unix::fs::PermissionsExt, time::Duration};

use serde_json::Value;
use thunderbolt_shared::{close, pairing as wire, resume::resume_alpn, Protocol};
use thunderbolt_tests::{
    r1::{agent, closed, hello},
    *,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A bridge (direct loopback only) whose home allows nobody yet.
async fn bridge() -> (Tb, RunningBridge) {
    // Every device of these tests dials from 127.0.0.1: one remote to the gate.
    bridge_with(&["--per-remote-max", "100"]).await
}

async fn bridge_with(extra: &[&str]) -> (Tb, RunningBridge) {
    init_tracing();
    let home = Tb::new(None);
    let argv = agent(&["cat"]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let b = home.bridge("acp", extra, &argv).await;
    (home, b)
}

/// `iroh pair --json [extra]` in `home`.
async fn mint(home: &Tb, extra: &[&str]) -> Value {
    let mut args = vec!["iroh", "pair", "--json"];
    args.extend_from_slice(extra);
    let out = home.run(&args).await;
    assert!(out.status.success(), "iroh pair: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("pair JSON")
}

fn allow_file(home: &Tb) -> Option<String> {
    std::fs::read_to_string(home.home().join("iroh/allowlist")).ok()
}

/// `connect [extra] <ticket>` in `device`, one line through the agent and
/// back, then end of input: its exit status and stderr.
async fn exchange(device: &Tb, ticket: &str, extra: &[&str]) -> (bool, String) {
    let mut args = extra.to_vec();
    args.push(ticket);
    let (mut child, log) = device.connect(&args);
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // A refused connect may be gone before the write: its exit says what happened.
    let _ = stdin.write_all(b"{\"hello\":1}\n").await;
    let line = tokio::time::timeout(WAIT, lines.next_line()).await.expect("an answer or an end in time");
    if let Ok(Some(l)) = &line {
        assert_eq!(l, "{\"hello\":1}", "the agent echoes");
    }
    drop(stdin);
    let status = tokio::time::timeout(WAIT, child.wait()).await.expect("connect exits").unwrap();
    let text = log.finished().await;
    let echoed = matches!(line, Ok(Some(_)));
    assert_eq!(echoed, status.success(), "an echo exactly when connect succeeds: {text}");
    (status.success(), text)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_device_pairs_once_and_then_connects_like_any_allowed_peer() {
    let (home, b) = bridge().await;
    let device = Tb::new(None);
    let device_id = device.node_id("acp").await;
    let before = allow_file(&home);

    let p = mint(&home, &["--name", "Work laptop", "--app-url", "https://app.example/"]).await;
    let code = p["code"].as_str().unwrap();
    assert!(code.len() >= 32, "at least 128 bits: {code}");
    assert_eq!(p["bridgeRunning"], true);
    assert_eq!(p["ticket"], b.ticket, "the running bridge's ticket, with its direct addresses");
    assert_eq!(p["command"], format!("thunderbolt acp connect --pair {code} {}", b.ticket));
    assert_eq!(p["link"], format!("https://app.example/settings/agents#ticket={}&pair={code}", b.ticket));
    // Only a hash of the code is kept, in a 0600 file.
    let store = home.home().join("iroh/pairings.json");
    assert!(!std::fs::read_to_string(&store).unwrap().contains(code));
    assert_eq!(std::fs::metadata(&store).unwrap().permissions().mode() & 0o777, 0o600);

    let (ok, log) = exchange(&device, &b.ticket, &["--pair", code]).await;
    assert!(ok, "{log}");
    assert!(log.contains("paired with"), "{log}");
    b.log.wait_for("paired ").await;
    // And then without a code, like any allowed peer.
    let (ok, log) = exchange(&device, &b.ticket, &[]).await;
    assert!(ok, "{log}");

    // Exactly one line more, in the reference's format (the NodeId in hex).
    let after = allow_file(&home).unwrap();
    let old = before.unwrap_or_default();
    assert_eq!(after, format!("{old}{device_id}\n"));
    let out = home.run(&["iroh", "list", "--json"]).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &v["devices"][0];
    assert_eq!(d["nodeId"], device_id.to_string());
    assert_eq!(d["name"], "Work laptop", "the name minted with the code wins: {v}");
    assert_eq!(d["how"], "pairing");
    assert!(d["added"].as_str().is_some_and(|t| t.ends_with('Z')), "{d}");
    assert!(d["lastSeen"].as_str().is_some(), "the bridge noted the visit: {d}");
    let text = home.run(&["iroh", "list"]).await;
    assert!(String::from_utf8_lossy(&text.stdout).contains("Work laptop"));

    // The code is spent: a second device is refused with it.
    let other = Tb::new(None);
    let (ok, log) = exchange(&other, &b.ticket, &["--pair", code]).await;
    assert!(!ok);
    assert!(log.contains(wire::REASON_PAIR_SPENT), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_spent_wrong_and_foreign_codes_are_refused_and_change_nothing() {
    let (home, b) = bridge().await;
    let first = Tb::new(None);
    let spent = mint(&home, &[]).await["code"].as_str().unwrap().to_string();
    assert!(exchange(&first, &b.ticket, &["--pair", &spent]).await.0);
    b.log.wait_for("agent started").await;
    let spawned = || b.log.text().matches("agent started").count();
    let started = spawned();
    let allowed = allow_file(&home);

    let stranger = Tb::new(None);
    let refused = |reason: &'static str, code: String| {
        let (stranger, b) = (&stranger, &b);
        async move {
            let (ok, log) = exchange(stranger, &b.ticket, &["--pair", &code]).await;
            assert!(!ok, "{reason}: connect must fail");
            assert!(log.contains(reason), "want '{reason}' in: {log}");
        }
    };
    // Expired: valid for one second, used after it.
    let expired = mint(&home, &["--expires", "1s"]).await["code"].as_str().unwrap().to_string();
    // Its second, and a margin for two processes' clocks: expiry is a time, not an event.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    refused(wire::REASON_PAIR_EXPIRED, expired).await;
    refused(wire::REASON_PAIR_SPENT, spent).await;
    // Minted for the MCP bridge, tried at the ACP one.
    let foreign = mint(&home, &["--protocol", "mcp"]).await["code"].as_str().unwrap().to_string();
    refused(wire::REASON_PAIR_OTHER_AGENT, foreign).await;
    // Five wrong ones count against the stranger, and only it: it must wait
    // now, and even a right code from it is not looked at.
    let right = mint(&home, &[]).await["code"].as_str().unwrap().to_string();
    for i in 0..5 {
        refused(wire::REASON_PAIR_WRONG, format!("{:032x}", i)).await;
    }
    refused(wire::REASON_PAIR_BACKOFF, right.clone()).await;

    assert_eq!(allow_file(&home), allowed, "nothing was added");
    assert_eq!(spawned(), started, "no agent was spawned for a refused pairing");
    let out = home.run(&["iroh", "list", "--json"]).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["devices"].as_array().unwrap().len(), 1, "{v}");
    // A peer speaking only the plain protocol sees what it always saw.
    let ep = client_endpoint(stranger.secret_key("acp").await, None, false).await;
    let conn = b.dial(&ep, &Protocol::acp().alpn()).await;
    let _ = conn.open_bi().await;
    assert_eq!(closed(&conn).await, (1, close::REASON_NOT_ALLOWLISTED.to_string()));
    // The stranger's guesses burned nothing: the device the code was for pairs with it.
    let device = Tb::new(None);
    let (ok, log) = exchange(&device, &b.ticket, &["--pair", &right]).await;
    assert!(ok, "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn deny_by_name_ends_a_paired_devices_sessions_at_once() {
    let (home, b) = bridge().await;
    let device = Tb::new(None);
    let code = mint(&home, &[]).await["code"].as_str().unwrap().to_string();
    // The device's own name this time (no --name at minting).
    let (ok, log) = exchange(&device, &b.ticket, &["--pair", &code, "--device-name", "Pixel 9"]).await;
    assert!(ok, "{log}");
    let out = home.run(&["iroh", "list", "--json"]).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["devices"][0]["name"], "Pixel 9");

    // Live: a resumable session and a plain one through connect.
    let ep = client_endpoint(device.secret_key("acp").await, None, false).await;
    let conn = b.dial(&ep, &resume_alpn(&Protocol::acp())).await;
    let (_send, _recv, welcome) = hello(&conn, None, 0).await;
    let (token, _) = welcome.unwrap();
    let (mut child, log) = device.connect(&["--no-resume", &b.ticket]);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"{\"x\":1}\n").await.unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap();
    // `status` names the device.
    let st = home.run(&["status", "--json"]).await;
    let st: Value = serde_json::from_slice(&st.stdout).unwrap();
    let names: Vec<&Value> =
        st["bridges"][0]["sessions"].as_array().unwrap().iter().map(|s| &s["device"]).collect();
    assert_eq!(names, [&Value::from("Pixel 9"), &Value::from("Pixel 9")], "{st}");

    let t0 = std::time::Instant::now();
    let out = home.run(&["iroh", "deny", "pixel 9"]).await;
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("\"Pixel 9\"") && said.contains("2 live session(s) ended"), "{said}");
    assert_eq!(closed(&conn).await.1, close::REASON_MEMBERSHIP_REVOKED);
    let status = tokio::time::timeout(WAIT, child.wait()).await.unwrap().unwrap();
    let took = t0.elapsed();
    assert!(!status.success());
    assert!(took < Duration::from_secs(1), "took {took:?}");
    log.finished().await;
    assert!(log.contains(close::REASON_MEMBERSHIP_REVOKED), "{}", log.text());
    // Resuming is refused, and so is pairing back in without a new code.
    // (Refused right after the handshake: the hello with the token may not even be sent.)
    let conn = b.dial(&ep, &resume_alpn(&Protocol::acp())).await;
    if let Ok((mut send, _recv)) = conn.open_bi().await {
        let hello = thunderbolt_shared::resume::Control::Hello { session: Some(token), received: 0 };
        let _ = send.write_all(&hello.encode()).await;
    }
    assert_eq!(closed(&conn).await, (1, close::REASON_NOT_ALLOWLISTED.to_string()));
    let (ok, log) = exchange(&device, &b.ticket, &["--pair", &code]).await;
    assert!(!ok && log.contains(wire::REASON_PAIR_SPENT), "{log}");
    let out = home.run(&["iroh", "list", "--json"]).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["devices"].as_array().unwrap().is_empty(), "{v}");
    drop(stdin);
}

#[tokio::test(flavor = "multi_thread")]
async fn iroh_allow_names_a_device_and_deny_takes_the_name() {
    let home = Tb::new(None);
    let device = Tb::new(None);
    let id = device.node_id("acp").await;
    // A ticket works as well as a NodeId.
    let ticket = {
        let out = device.run(&["iroh", "id", "--json"]).await;
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["ticket"].as_str().unwrap().to_string()
    };
    let out = home.run(&["iroh", "allow", &ticket, "--name", "tablet"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(allow_file(&home).unwrap(), format!("{id}\n"));
    let out = home.run(&["iroh", "list", "--json"]).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((&v["devices"][0]["name"], &v["devices"][0]["how"]), (&"tablet".into(), &"allow".into()));
    assert_eq!(v["devices"][0]["lastSeen"], Value::Null);
    let out = home.run(&["iroh", "deny", "nobody-by-this-name"]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("iroh list"));
    let out = home.run(&["iroh", "deny", "tablet"]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(allow_file(&home).unwrap(), "");
}

#[tokio::test(flavor = "multi_thread")]
async fn pairing_attempts_pass_the_gate_before_any_work() {
    let (home, b) = bridge_with(&["--per-remote-max", "2", "--per-remote-window", "60"]).await;
    let code = mint(&home, &[]).await["code"].as_str().unwrap().to_string();
    let stranger = Tb::new(None);
    for _ in 0..2 {
        let (ok, log) = exchange(&stranger, &b.ticket, &["--pair", "0123456789abcdef"]).await;
        assert!(!ok && log.contains(wire::REASON_PAIR_WRONG), "{log}");
    }
    // Over the budget: no answer at all, so the code is never even looked at.
    let (ok, log) =
        exchange(&stranger, &b.ticket, &["--pair", "0123456789abcdef", "--dial-timeout", "2"]).await;
    assert!(!ok && log.contains("could not reach"), "{log}");
    assert_eq!(b.log.text().matches(wire::REASON_PAIR_WRONG).count(), 2, "{}", b.log.text());
    let store = std::fs::read_to_string(home.home().join("iroh/pairings.json")).unwrap();
    let v: Value = serde_json::from_str(&store).unwrap();
    assert!(v.get("wrong").is_none(), "a wrong code writes nothing: {v}");
    assert_eq!(v["codes"][0]["burned"], false);
    drop(code);
}
