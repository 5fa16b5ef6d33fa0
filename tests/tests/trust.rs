//! Account trust against a backend speaking the contract, the heartbeat that
//! re-checks open sessions, and admission control (capacity, per-remote budget,
//! handshake cap).

use std::time::Duration;

use iroh::{endpoint::Connection, Endpoint, EndpointId, SecretKey};
use thunderbolt_shared::{close, EndpointTicket, Protocol};
use thunderbolt_tests::{backend::*, *};

const TOKEN: &str = "tok-test-0123";

/// Heartbeat used by these tests: short so revocation shows quickly.
const BEAT: &str = "0.2";

fn cat_agent(pid_file: Option<&str>) -> Vec<String> {
    let mut v = vec![test_agent_bin().display().to_string()];
    if let Some(p) = pid_file {
        v.extend(["--pid-file".to_string(), p.to_string()]);
    }
    v.push("cat".into());
    v
}

struct World {
    relay: LocalRelay,
    backend: ContractBackend,
    home: Tb,
    own: EndpointId,
    work: tempfile::TempDir,
}

impl World {
    async fn new() -> Self {
        init_tracing();
        let relay = LocalRelay::start().await;
        let backend = ContractBackend::start().await;
        let home = Tb::new(Some(&relay));
        let own = home.node_id("acp").await;
        Self { relay, backend, home, own, work: tempfile::tempdir().unwrap() }
    }

    fn path(&self, name: &str) -> String {
        self.work.path().join(name).display().to_string()
    }

    /// Starts a bridge with the account credential in the environment.
    async fn bridge(&self, extra: &[&str], agent: &[String], env: &[(&str, &str)]) -> RunningBridge {
        let mut c = self.home.cmd();
        c.env("THUNDERBOLT_TOKEN", TOKEN).env("THUNDERBOLT_CLOUD_URL", &self.backend.url);
        for (k, v) in env {
            c.env(k, v);
        }
        c.args(["acp", "--transport", "iroh", "--heartbeat-interval", BEAT])
            .args(extra)
            .arg("--")
            .args(agent);
        RunningBridge::start(c).await
    }

    async fn client(&self, key: &SecretKey, relay_only: bool) -> Endpoint {
        client_endpoint(key.clone(), Some(&self.relay), relay_only).await
    }
}

/// Opens the stream and checks one echoed line: the session works.
async fn echo(conn: &Connection) -> (iroh::endpoint::SendStream, iroh::endpoint::RecvStream) {
    let (mut send, mut recv) = conn.open_bi().await.expect("open stream");
    send.write_all(b"{\"ping\":1}\n").await.expect("write");
    let mut buf = [0u8; 11];
    tokio::time::timeout(WAIT, recv.read_exact(&mut buf)).await.expect("echo in time").expect("echo");
    assert_eq!(&buf, b"{\"ping\":1}\n");
    (send, recv)
}

/// Whether a connection is still open right now (no close seen).
fn still_open(conn: &Connection) -> bool {
    conn.close_reason().is_none()
}

#[tokio::test(flavor = "multi_thread")]
async fn account_peer_admitted_then_revoked_mid_session() {
    let w = World::new().await;
    let peer = SecretKey::generate();
    w.backend.set_node_ids(vec![Some(w.own.to_string()), Some(peer.public().to_string()), None]);
    let pid_file = w.path("agent.pid");
    let bridge = w.bridge(&[], &cat_agent(Some(&pid_file)), &[]).await;
    assert!(bridge.banner.contains("same-account auto-trust: on"), "{}", bridge.banner);

    // The contract calls, with the credential as x-api-key.
    let reqs = w.backend.requests();
    let reg = reqs.iter().find(|r| r.method == "POST" && r.path == "/v1/devices/bridge").expect("registered");
    assert_eq!(reg.headers.get("x-api-key").map(String::as_str), Some(TOKEN));
    assert_eq!(reg.headers.get("content-type").map(String::as_str), Some("application/json"));
    let body: serde_json::Value = serde_json::from_str(&reg.body).unwrap();
    assert_eq!(body["nodeId"], w.own.to_string());
    assert!(!body["name"].as_str().unwrap().is_empty());
    let list = reqs.iter().find(|r| r.path == "/v1/devices/allowlist").expect("allowlist fetched");
    assert_eq!(list.method, "GET");
    assert_eq!(list.headers.get("x-api-key").map(String::as_str), Some(TOKEN));
    assert!(!bridge.log.contains(TOKEN), "the token must never be logged");

    // Admitted without any `iroh allow`.
    let ep = w.client(&peer, false).await;
    let conn = bridge.dial(&ep, &Protocol::acp().alpn()).await;
    let _stream = echo(&conn).await;
    let pid: u32 = wait_file(pid_file.as_ref()).await.trim().parse().unwrap();

    // Removed from the account: closed within a heartbeat, agent gone.
    w.backend.set_node_ids(vec![Some(w.own.to_string())]);
    let (code, reason) = closed_with(&conn).await;
    assert_eq!((code, reason.as_str()), (1, close::REASON_MEMBERSHIP_REVOKED));
    assert!(wait_pid_gone(pid).await, "revoked peer's agent survived");
    // And it cannot come back.
    let conn = bridge.dial(&ep, &Protocol::acp().alpn()).await;
    assert_eq!(closed_with(&conn).await, (1, close::REASON_NOT_ALLOWLISTED.to_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn self_revocation_closes_account_sessions_but_not_manual_ones() {
    let w = World::new().await;
    let account_peer = SecretKey::generate();
    let manual_peer = SecretKey::generate();
    w.home.allow(&manual_peer.public()).await;
    w.backend.set_node_ids(vec![Some(w.own.to_string()), Some(account_peer.public().to_string())]);
    let bridge = w.bridge(&[], &cat_agent(None), &[]).await;

    let ep_a = w.client(&account_peer, false).await;
    let ep_m = w.client(&manual_peer, false).await;
    let conn_a = bridge.dial(&ep_a, &Protocol::acp().alpn()).await;
    let conn_m = bridge.dial(&ep_m, &Protocol::acp().alpn()).await;
    let _sa = echo(&conn_a).await;
    let (mut send_m, mut recv_m) = echo(&conn_m).await;

    // The account drops this bridge (our own NodeId leaves a non-empty list).
    w.backend.set_node_ids(vec![Some(account_peer.public().to_string())]);
    assert_eq!(closed_with(&conn_a).await, (1, close::REASON_MEMBERSHIP_REVOKED.to_string()));
    bridge.log.wait_for("revoked").await;
    // The manual peer's session is untouched and still works.
    assert!(still_open(&conn_m));
    send_m.write_all(b"{\"still\":true}\n").await.unwrap();
    let mut buf = [0u8; 15];
    recv_m.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"{\"still\":true}\n");
    // Account trust stays off even though the peer is still on the account list.
    let again = bridge.dial(&ep_a, &Protocol::acp().alpn()).await;
    assert_eq!(closed_with(&again).await, (1, close::REASON_NOT_ALLOWLISTED.to_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_refreshes_keep_the_last_good_list() {
    let w = World::new().await;
    let peer = SecretKey::generate();
    w.backend.set_node_ids(vec![Some(w.own.to_string()), Some(peer.public().to_string())]);
    let bridge = w.bridge(&[], &cat_agent(None), &[("THUNDERBOLT_BACKEND_TIMEOUT_SECS", "0.3")]).await;
    let ep = w.client(&peer, false).await;
    let conn = bridge.dial(&ep, &Protocol::acp().alpn()).await;
    let _s = echo(&conn).await;

    for (reply, log) in [
        (Reply::Status(500), "failed (500)"),
        (Reply::Status(401), "credential was rejected (401)"),
        (Reply::Garbage, "malformed JSON"),
        (Reply::Slow(Duration::from_secs(2)), "did not answer within 300ms"),
    ] {
        let before = w.backend.count("GET", "/v1/devices/allowlist");
        w.backend.set_allowlist(reply.clone());
        // Two more refreshes under the failure, so at least one full heartbeat ran with it.
        w.backend.wait_requests("GET", "/v1/devices/allowlist", before + 2).await;
        bridge.log.wait_for(log).await;
        assert!(still_open(&conn), "session closed during {reply:?}");
        // New connections from the account peer are still admitted.
        let c2 = bridge.dial(&ep, &Protocol::acp().alpn()).await;
        let _ = echo(&c2).await;
        c2.close(0u32.into(), b"client closed");
    }
    // Backend down altogether.
    w.backend.set_allowlist(Reply::Ok);
    assert!(still_open(&conn));
    bridge.log.wait_for("keeping the last good list").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn registration_failures_switch_account_trust_off_with_a_clear_reason() {
    let w = World::new().await;
    let peer = SecretKey::generate();
    let manual = SecretKey::generate();
    w.home.allow(&manual.public()).await;
    w.backend.set_node_ids(vec![Some(w.own.to_string()), Some(peer.public().to_string())]);
    for (status, says) in [
        (409, "Settings → Devices"),
        (403, "403"),
        (422, "device limit"),
        (401, "credential was rejected"),
        (503, "backend failed (503)"),
    ] {
        w.backend.set_register(Reply::Status(status));
        let bridge = w.bridge(&[], &cat_agent(None), &[]).await;
        assert!(bridge.banner.contains("same-account auto-trust: off"), "{status}: {}", bridge.banner);
        assert!(bridge.banner.contains(says), "{status}: banner lacks {says:?}: {}", bridge.banner);
        bridge.log.wait_for(says).await;
        // Account peers are not trusted; the manual file still is.
        let ep = w.client(&peer, false).await;
        let conn = bridge.dial(&ep, &Protocol::acp().alpn()).await;
        assert_eq!(closed_with(&conn).await, (1, close::REASON_NOT_ALLOWLISTED.to_string()));
        let ep_m = w.client(&manual, false).await;
        let conn_m = bridge.dial(&ep_m, &Protocol::acp().alpn()).await;
        let _ = echo(&conn_m).await;
        conn_m.close(0u32.into(), b"client closed");
        bridge.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn credential_is_never_sent_in_clear_to_a_remote_host() {
    let w = World::new().await;
    let mut c = w.home.cmd();
    c.env("THUNDERBOLT_TOKEN", TOKEN).env("THUNDERBOLT_CLOUD_URL", "http://backend.example/v1").args([
        "acp",
        "--transport",
        "iroh",
        "--",
        &test_agent_bin().display().to_string(),
        "cat",
    ]);
    let bridge = RunningBridge::start(c).await;
    assert!(bridge.banner.contains("same-account auto-trust: off"));
    assert!(bridge.banner.contains("plain http"), "{}", bridge.banner);
}

#[tokio::test(flavor = "multi_thread")]
async fn stored_login_credential_is_private_and_sent_as_bearer() {
    let w = World::new().await;
    let mut c = w.home.cmd();
    c.args(["login", "--cloud-url", &w.backend.url, "--token", "-"]).stdin(std::process::Stdio::piped());
    c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    use tokio::io::AsyncWriteExt;
    child.stdin.take().unwrap().write_all(b"session-tok-9\n").await.unwrap();
    let out = child.wait_with_output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("session-tok-9"));
    let path = w.home.home().join("credentials.json");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);

    w.backend.set_node_ids(vec![Some(w.own.to_string())]);
    let mut c = w.home.cmd();
    c.args(["acp", "--transport", "iroh", "--", &test_agent_bin().display().to_string(), "cat"]);
    let bridge = RunningBridge::start(c).await;
    assert!(bridge.banner.contains("same-account auto-trust: on"), "{}", bridge.banner);
    let reg = w.backend.requests().into_iter().find(|r| r.path == "/v1/devices/bridge").unwrap();
    assert_eq!(reg.headers.get("authorization").map(String::as_str), Some("Bearer session-tok-9"));
    assert!(!reg.headers.contains_key("x-api-key"));

    let o = w.home.run(&["login", "--cloud-url", "http://backend.example/v1", "--token", "x"]).await;
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("plain http"));
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_a_manual_peer_ends_its_session_at_the_next_heartbeat() {
    let w = World::new().await;
    let peer = SecretKey::generate();
    w.home.allow(&peer.public()).await;
    let mut c = w.home.cmd();
    c.args(["acp", "--transport", "iroh", "--heartbeat-interval", BEAT, "--"]).args(cat_agent(None));
    let bridge = RunningBridge::start(c).await;
    assert!(bridge.banner.contains("same-account auto-trust: off (no credential"));
    let ep = w.client(&peer, false).await;
    let conn = bridge.dial(&ep, &Protocol::acp().alpn()).await;
    let _s = echo(&conn).await;
    let o = w.home.run(&["iroh", "deny", &peer.public().to_string()]).await;
    assert!(o.status.success());
    assert_eq!(closed_with(&conn).await, (1, close::REASON_MEMBERSHIP_REVOKED.to_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn seventeenth_session_is_refused_at_capacity_and_spawns_nothing() {
    let w = World::new().await;
    let peer = SecretKey::generate();
    w.home.allow(&peer.public()).await;
    let pid_dir = w.path("pids");
    std::fs::create_dir_all(&pid_dir).unwrap();
    // Each agent writes its pid to a file of its own (the shell expands $$).
    let script = format!("exec {} --pid-file {}/$$ cat", test_agent_bin().display(), pid_dir);
    let mut c = w.home.cmd();
    c.args(["acp", "--transport", "iroh", "--per-remote-max", "100", "--", "sh", "-c", &script]);
    let bridge = RunningBridge::start(c).await;
    let ep = w.client(&peer, false).await;
    let mut live = Vec::new();
    for _ in 0..16 {
        let conn = bridge.dial(&ep, &Protocol::acp().alpn()).await;
        let s = echo(&conn).await;
        live.push((conn, s));
    }
    assert_eq!(std::fs::read_dir(&pid_dir).unwrap().count(), 16);
    let conn = bridge.dial(&ep, &Protocol::acp().alpn()).await;
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    send.write_all(b"{}\n").await.unwrap();
    assert_eq!(closed_with(&conn).await, (1, close::REASON_AT_CAPACITY.to_string()));
    assert_eq!(std::fs::read_dir(&pid_dir).unwrap().count(), 16, "an agent was spawned over capacity");
    // A slot frees when a session ends.
    let (first, _) = live.remove(0);
    first.close(0u32.into(), b"client closed");
    bridge.log.wait_for("session ended").await;
    let conn = bridge.dial(&ep, &Protocol::acp().alpn()).await;
    let _ = echo(&conn).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn eleventh_connection_in_the_window_is_dropped_but_others_get_in() {
    let w = World::new().await;
    let noisy = SecretKey::generate();
    let other = SecretKey::generate();
    w.home.allow(&noisy.public()).await;
    w.home.allow(&other.public()).await;
    let mut c = w.home.cmd();
    // A long window so the test cannot race it on a slow machine.
    c.args(["acp", "--transport", "iroh", "--per-remote-window", "600", "--"]).args(cat_agent(None));
    let bridge = RunningBridge::start(c).await;
    // Relay-only clients: the bridge keys them by their claimed EndpointId.
    let ep = w.client(&noisy, true).await;
    for _ in 0..10 {
        let conn = bridge.dial(&ep, &Protocol::acp().alpn()).await;
        let _ = echo(&conn).await;
        conn.close(0u32.into(), b"client closed");
    }
    let t: EndpointTicket = bridge.ticket.parse().unwrap();
    let alpn = Protocol::acp().alpn();
    let eleventh = ep.connect(t.endpoint_addr().clone(), &alpn);
    tokio::pin!(eleventh);
    tokio::select! {
        r = &mut eleventh => panic!("the 11th connection got an answer: {r:?}"),
        _ = bridge.log.wait_for("over its connection budget") => {}
    }
    bridge.log.wait_for(&format!("endpoint {}", noisy.public().fmt_short())).await;
    // Another identity on the same relay is not affected.
    let ep2 = w.client(&other, true).await;
    let conn = bridge.dial(&ep2, &Protocol::acp().alpn()).await;
    let _ = echo(&conn).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn flood_of_fresh_identities_is_capped_and_an_allowed_peer_still_gets_in() {
    const CAP: usize = 2;
    const FLOOD: usize = 40;
    let w = World::new().await;
    let friend = SecretKey::generate();
    w.home.allow(&friend.public()).await;
    let mut c = w.home.cmd();
    c.env("RUST_LOG", "info,thunderbolt=debug,iroh=warn")
        .args([
            "acp",
            "--transport",
            "iroh",
            "--max-handshakes",
            &CAP.to_string(),
            "--per-remote-max",
            "100000",
            "--",
        ])
        .args(cat_agent(None));
    let bridge = RunningBridge::start(c).await;
    let t: EndpointTicket = bridge.ticket.parse().unwrap();
    let addr = t.endpoint_addr().clone();

    // Fresh identities, all dialing at once (bounded: FLOOD endpoints, one dial each).
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..FLOOD {
        let addr = addr.clone();
        flood.spawn(async move {
            let ep = client_endpoint(SecretKey::generate(), None, false).await;
            let r = tokio::time::timeout(Duration::from_secs(10), ep.connect(addr, &Protocol::acp().alpn()))
                .await;
            if let Ok(Ok(conn)) = r {
                let _ = conn.closed().await;
            }
            ep.close().await;
        });
    }
    // The friend dials during the flood and gets in.
    let ep = client_endpoint(friend.clone(), None, false).await;
    let conn = bridge.dial(&ep, &Protocol::acp().alpn()).await;
    let _ = echo(&conn).await;
    while flood.join_next().await.is_some() {}

    let log = bridge.log.text();
    let in_flight: Vec<usize> = log
        .lines()
        .filter(|l| l.contains("handshake started"))
        .filter_map(|l| l.split("in_flight=").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(in_flight.len() >= FLOOD / 2, "too few handshakes logged: {}", in_flight.len());
    let max = *in_flight.iter().max().unwrap();
    assert!(max <= CAP, "{max} handshakes in flight, cap is {CAP}");
    assert!(log.contains("too many handshakes in flight"), "the flood never hit the cap");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_backend_neither_stacks_refreshes_nor_delays_shutdown() {
    let w = World::new().await;
    w.backend.set_node_ids(vec![Some(w.own.to_string())]);
    // Backend timeout (20 s) far longer than the heartbeat (0.2 s).
    let mut bridge = w.bridge(&[], &cat_agent(None), &[("THUNDERBOLT_BACKEND_TIMEOUT_SECS", "20")]).await;
    let before = w.backend.count("GET", "/v1/devices/allowlist");
    w.backend.set_allowlist(Reply::Slow(Duration::from_secs(60)));
    w.backend.wait_requests("GET", "/v1/devices/allowlist", before + 1).await;
    let hung = w.backend.count("GET", "/v1/devices/allowlist");
    // Ten heartbeats pass while that refresh hangs: none starts another (an
    // older list could otherwise land after a newer one).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(w.backend.count("GET", "/v1/devices/allowlist"), hung, "refreshes overlapped");
    // SIGTERM does not wait for the hung request.
    let started = std::time::Instant::now();
    assert!(bridge.terminate().await.success());
    let took = started.elapsed();
    assert!(took < Duration::from_secs(8), "shutdown waited {took:?} on the backend");
}

/// A device removed from the account while the bridge was down: its session's
/// journal is not taken back (no agent is started, nothing is sent to one for
/// it), although the bridge has an account to ask. Trust is checked before a
/// journal is used, whatever the sources of trust.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_devices_journal_is_not_taken_back_when_an_account_is_configured() {
    let w = World::new().await;
    let dev = Tb::new(Some(&w.relay));
    let dev_id = dev.node_id("acp").await;
    w.backend.set_node_ids(vec![Some(w.own.to_string()), Some(dev_id.to_string())]);
    let mut bridge = w.bridge(&[], &cat_agent(None), &[]).await;
    let mut c = JsonConnect::start(&dev, &[&bridge.ticket]);
    c.send(serde_json::json!({"jsonrpc": "2.0", "method": "note", "params": {"n": 1}})).await;
    c.until(|v| v["method"] == "note").await;
    bridge.terminate().await;
    let journals = w.home.home().join("iroh/sessions");
    let kept = std::fs::read_dir(&journals).unwrap().count();
    assert_eq!(kept, 1, "the session was journaled at the shutdown");

    // Revoked while the bridge was down.
    w.backend.set_node_ids(vec![Some(w.own.to_string())]);
    let bridge = w.bridge(&[], &cat_agent(None), &[]).await;
    bridge.log.wait_for("its owner is no longer allowed").await;
    let log = bridge.log.text();
    assert!(!log.contains("taking back a session"), "{log}");
    assert!(!log.contains("agent started"), "{log}");
    assert_eq!(std::fs::read_dir(&journals).unwrap().count(), 0, "the journal was removed");
    drop(c);
}

/// `thunderbolt::limits::PER_DEVICE_MAX`: connections one allowed device may
/// have admitted per window.
const PER_DEVICE_MAX: usize = 30;

/// A bridge on loopback only (no relay): every dial comes direct from
/// 127.0.0.1, one address for everyone (as behind one NAT). A long window so
/// no test here can race it on a slow machine; the gate's debug lines on.
async fn loopback_bridge(home: &Tb, extra: &[&str]) -> RunningBridge {
    let mut c = home.cmd();
    c.env(
        "RUST_LOG",
        "info,thunderbolt::serve::admit=debug,iroh=warn,noq=warn,noq_proto=warn,iroh_relay=warn",
    )
    .args(["acp", "--transport", "iroh", "--per-remote-window", "600"])
    .args(extra)
    .arg("--")
    .args(cat_agent(None));
    RunningBridge::start(c).await
}

/// An allowed device's dials are not charged to its address (that budget is
/// given back) but to the device itself: past its own budget it is refused
/// after the handshake, with a reason (before: admitted every time, however
/// fast it dialed).
#[tokio::test(flavor = "multi_thread")]
async fn an_allowed_device_dialing_in_a_loop_is_refused_past_its_own_budget() {
    init_tracing();
    let home = Tb::new(None);
    let device = SecretKey::generate();
    home.allow(&device.public()).await;
    let bridge = loopback_bridge(&home, &[]).await;
    let admitted = format!("admitted {}", device.public());
    let ep = client_endpoint(device, None, false).await;
    // Its whole budget, from one address whose own budget is a third of it:
    // each dial admitted (the log says so before the next), then closed
    // before it opens a stream (no agent is started).
    for i in 0..PER_DEVICE_MAX {
        let conn = bridge.dial(&ep, &Protocol::acp().alpn()).await;
        bridge.log.wait_for_count(&admitted, i + 1).await;
        conn.close(0u32.into(), b"client closed");
    }
    // One more: refused after its handshake, and the log says why.
    let conn = bridge.dial(&ep, &Protocol::acp().alpn()).await;
    assert_eq!(closed_with(&conn).await, (1, close::REASON_AT_CAPACITY.to_string()));
    bridge.log.wait_for("over its device budget of 30 connections per 600s").await;
    assert_eq!(bridge.log.text().matches(&admitted).count(), PER_DEVICE_MAX);
}

/// A stranger behind the device's address (loopback here; a NAT, another
/// local user) spends that address's whole budget before the device dials
/// again: the device still gets in (before: its dials were dropped unanswered
/// until the stranger's left the window).
#[tokio::test(flavor = "multi_thread")]
async fn a_stranger_spending_the_address_budget_does_not_keep_an_allowed_device_out() {
    const BUDGET: usize = 3;
    init_tracing();
    let home = Tb::new(None);
    let device = SecretKey::generate();
    home.allow(&device.public()).await;
    let bridge = loopback_bridge(&home, &["--per-remote-max", &BUDGET.to_string()]).await;
    let alpn = Protocol::acp().alpn();
    // The device works from its address.
    let dev = client_endpoint(device, None, false).await;
    let conn = bridge.dial(&dev, &alpn).await;
    let _ = echo(&conn).await;
    conn.close(0u32.into(), b"client closed");
    // A stranger at the same address spends its budget: handshakes that
    // prove nobody allowed.
    let stranger = client_endpoint(SecretKey::generate(), None, false).await;
    for _ in 0..BUDGET {
        let conn = bridge.dial(&stranger, &alpn).await;
        assert_eq!(closed_with(&conn).await, (1, close::REASON_NOT_ALLOWLISTED.to_string()));
    }
    // The device dials again: asked to validate its address, then let
    // through to its handshake past the spent budget, and admitted.
    let conn = bridge.dial(&dev, &alpn).await;
    let _ = echo(&conn).await;
    let log = bridge.log.text();
    assert!(
        log.contains("handshake past the address's budget"),
        "the address's budget was not spent:\n{log}"
    );
    assert!(!log.contains("over its connection budget"), "a dial was dropped:\n{log}");
}
