//! The local control API (`thunderbolt status`, `kick`, `iroh deny` on a
//! running bridge), the user service's unit files, and the readiness
//! protocol: real bridge processes, real sessions, real unix sockets.

use std::{os::unix::fs::PermissionsExt, process::Stdio, time::Duration};

use serde_json::Value;
use thunderbolt_shared::{close, resume::resume_alpn, Protocol};
use thunderbolt_tests::{
    r1::{agent, closed, hello, lose, next_frame, Setup},
    *,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// `thunderbolt status --json` in `home`: the first bridge's status.
async fn status(home: &Tb) -> Value {
    thunderbolt_tests::setup::status(home).await["bridges"][0].clone()
}

fn session<'a>(st: &'a Value, state: &str) -> &'a Value {
    st["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["state"] == state)
        .unwrap_or_else(|| panic!("no {state} session in {st}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn status_shows_every_session_with_its_path_bytes_grace_and_pid() {
    let s = Setup::new(&["--idle-timeout", "0.6"], &agent(&["cat"])).await;
    // One detached: a resumable session whose connection was lost.
    let ep = s.endpoint(&s.client_home).await;
    let (conn, _send, _recv, _token) = s.session(&ep).await;
    lose(&conn);
    s.bridge.log.wait_for("the agent keeps running").await;
    // One attached: `connect` with a live stream.
    let (mut child, log) = s.connect(&["--no-resume"]);
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    stdin.write_all(b"{\"n\":1}\n").await.unwrap();
    assert!(
        tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap().is_some(),
        "{}",
        log.text()
    );

    let first = status(&s.bridge_home).await;
    assert_eq!(first["kind"], "bridge");
    assert_eq!(first["pid"], s.bridge.pid());
    assert_eq!(first["agents"][0]["protocol"], "acp");
    assert_eq!(first["agents"][0]["nodeId"], s.bridge.node_id.to_string());
    let attached = session(&first, "attached");
    assert_eq!(attached["path"], "direct");
    assert!(attached["rttMs"].as_f64().is_some(), "{attached}");
    assert!(attached["pid"].as_u64().is_some_and(pid_alive_u64), "{attached}");
    assert_eq!(attached["peer"], s.client_home.node_id("acp").await.to_string());
    let detached = session(&first, "detached");
    let waits = detached["waitsMs"].as_u64().expect("the grace left");
    assert!(waits > 0 && waits <= 300_000, "{detached}");
    assert!(detached["pid"].as_u64().is_some(), "its agent runs on");
    // Traffic on the attached one: its byte counts grow; the grace counts down.
    let sent_before = attached["bytesSent"].as_u64().unwrap();
    for i in 0..50 {
        stdin
            .write_all(format!("{{\"more\":{i},\"pad\":\"{}\"}}\n", "x".repeat(1000)).as_bytes())
            .await
            .unwrap();
        lines.next_line().await.unwrap();
    }
    let second = status(&s.bridge_home).await;
    assert!(session(&second, "attached")["bytesSent"].as_u64().unwrap() > sent_before + 40_000);
    assert!(session(&second, "detached")["waitsMs"].as_u64().unwrap() < waits);
    // The same in words.
    let out = s.bridge_home.run(&["status"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("thunderbolt bridge (pid")
            && text.contains("attached")
            && text.contains("detached, waits"),
        "{text}"
    );
    drop(stdin);
    let _ = child.wait().await;
}

fn pid_alive_u64(p: u64) -> bool {
    pid_alive(p as u32)
}

#[tokio::test(flavor = "multi_thread")]
async fn status_with_no_bridge_says_so_and_exits_3() {
    let home = Tb::new(None);
    let out = home.run(&["status"]).await;
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no bridge is running on"), "{err}");
    let out = home.run(&["kick", "abc"]).await;
    assert_eq!(out.status.code(), Some(3));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_socket_is_the_owners_alone_a_second_bridge_is_refused_and_a_stale_socket_replaced() {
    init_tracing();
    let home = Tb::new(None);
    // A crashed bridge's leftover socket.
    std::fs::create_dir_all(home.home()).unwrap();
    let sock = home.home().join("control-acp.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let b = home.bridge("acp", &[], &[&test_agent_bin().display().to_string(), "cat"]).await;
    let meta = std::fs::metadata(&sock).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "socket mode");
    assert_eq!(std::fs::metadata(home.home()).unwrap().permissions().mode() & 0o777, 0o700, "home mode");
    assert_eq!(status(&home).await["pid"], b.pid(), "the stale socket was replaced");

    // A second one on the same home names the first.
    let out = home.run(&["acp", "--transport", "iroh"]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "an ACP bridge is already running on {} (pid {})",
            home.home().display(),
            b.pid()
        )),
        "{err}"
    );

    // Another user: the home keeps them out; with it opened up, the peer check does.
    let as_nobody = || {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(thunderbolt_bin())
            .arg("status")
            .env("THUNDERBOLT_HOME", home.home())
            .output()
            .expect("setpriv runs")
    };
    let out = as_nobody();
    assert_eq!(
        out.status.code(),
        Some(3),
        "nobody cannot even reach it: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::set_permissions(home.home(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_nobody();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refused (403): only the user running the bridge may use this socket"), "{err}");
    b.log.wait_for("refused a client of uid Some(65534)").await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kick_ends_a_resumable_session_for_good_and_frees_its_slot() {
    let work = tempfile::tempdir().unwrap();
    let pid_file = work.path().join("agent.pid").display().to_string();
    let s = Setup::new(&["--max-agents", "1"], &agent(&["--pid-file", &pid_file, "cat"])).await;
    let ep = s.endpoint(&s.client_home).await;
    let (conn, mut send, mut recv, token) = s.session(&ep).await;
    send.write_all(b"{\"a\":1}\n").await.unwrap();
    next_frame(&mut recv, &mut Vec::new()).await;
    let pid = agent_pid(&pid_file).await;
    let st = status(&s.bridge_home).await;
    let id = session(&st, "attached")["id"].as_str().unwrap().to_string();
    let out = s.bridge_home.run(&["kick", &id]).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(closed(&conn).await, (1, close::REASON_KICKED.to_string()));
    assert!(wait_pid_gone(pid).await, "the kicked session's agent was reaped");
    // No resume afterwards, and the slot is free for a new session.
    let (_c, _s, _r, welcome) = s.resume(&ep, &token, 1).await;
    assert_eq!(welcome, Err((1, close::REASON_UNKNOWN_SESSION.to_string())));
    let (_c2, mut send, mut recv, _) = s.session(&ep).await;
    send.write_all(b"{\"b\":2}\n").await.unwrap();
    assert_eq!(next_frame(&mut recv, &mut Vec::new()).await, b"{\"b\":2}\n");
    // By NodeId too.
    let peer = s.client_home.node_id("acp").await.to_string();
    let out = s.bridge_home.run(&["kick", &peer]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("ended 1 session(s)"));
}

#[tokio::test(flavor = "multi_thread")]
async fn iroh_deny_on_a_running_bridge_ends_the_peers_sessions_at_once() {
    let s = Setup::new(&[], &agent(&["cat"])).await;
    let ep = s.endpoint(&s.client_home).await;
    // A resumable session, and a plain one through connect.
    let conn = s.bridge.dial(&ep, &resume_alpn(&Protocol::acp())).await;
    let (_send, _recv, welcome) = hello(&conn, None, 0).await;
    let (token, _) = welcome.unwrap();
    let (mut child, log) = s.connect(&["--no-resume"]);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"{\"x\":1}\n").await.unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::timeout(WAIT, lines.next_line()).await.unwrap().unwrap();
    let t0 = std::time::Instant::now();
    let peer = s.client_home.node_id("acp").await.to_string();
    let out = s.bridge_home.run(&["iroh", "deny", &peer]).await;
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("2 live session(s) ended"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(closed(&conn).await, (1, close::REASON_MEMBERSHIP_REVOKED.to_string()));
    let status = tokio::time::timeout(WAIT, child.wait()).await.unwrap().unwrap();
    assert!(!status.success());
    assert!(t0.elapsed() < Duration::from_secs(1), "took {:?}", t0.elapsed());
    // Its stderr is read to its end before it is looked at.
    log.finished().await;
    assert!(log.contains(close::REASON_MEMBERSHIP_REVOKED), "{}", log.text());
    // A revoked peer cannot resume: refused at the handshake now.
    let conn = s.bridge.dial(&ep, &resume_alpn(&Protocol::acp())).await;
    let _ = (token, conn.open_bi().await);
    assert_eq!(closed(&conn).await, (1, close::REASON_NOT_ALLOWLISTED.to_string()));
    drop(stdin);
}

/// `agents list` while a single-agent bridge (not a host) runs: agents.d is
/// empty, and the list says what that folder is for and what does run.
#[tokio::test(flavor = "multi_thread")]
async fn agents_list_names_a_running_single_bridge_and_what_agents_d_is_for() {
    let home = Tb::new(None);
    let b = home.bridge("acp", &[], &[&test_agent_bin().display().to_string(), "cat"]).await;
    let out = home.run(&["agents", "list"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("that folder is what `thunderbolt host` serves"), "{text}");
    assert!(
        text.contains(&format!("an ACP bridge runs here apart from agents.d (pid {}", b.pid())),
        "{text}"
    );
    assert!(text.contains(&format!("Ticket: {}", b.ticket)), "{text}");
    let out = home.run(&["agents", "list", "--json"]).await;
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["bridges"][0]["pid"], b.pid(), "{v}");
    b.stop().await;
}

/// `service install --dry-run` on a home whose agents.d serves nothing says
/// so (the service would run a host with no agent); with a manifest, it does not.
#[tokio::test(flavor = "multi_thread")]
async fn service_install_warns_when_agents_d_would_serve_nothing() {
    let home = Tb::new(None);
    let out = home.run(&["service", "install", "--dry-run", "--for", "systemd"]).await;
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("warning: no agent loads from"), "{err}");
    assert!(err.contains("it would serve nothing"), "{err}");
    let agents = home.home().join("agents.d");
    std::fs::create_dir_all(&agents).unwrap();
    let manifest = serde_json::json!({"name": "echo", "command": [test_agent_bin(), "cat"]});
    std::fs::write(agents.join("echo.json"), manifest.to_string()).unwrap();
    let out = home.run(&["service", "install", "--dry-run", "--for", "systemd"]).await;
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn the_service_units_pass_their_own_tools() {
    let dir = tempfile::tempdir().unwrap();
    let run = |manager: &str| {
        let out = std::process::Command::new(thunderbolt_bin())
            .args(["service", "install", "--dry-run", "--for", manager])
            .env("THUNDERBOLT_HOME", dir.path())
            .env("THUNDERBOLT_TOKEN", "must-not-appear")
            .env("THUNDERBOLT_IROH_RELAY_URL", "https://relay.example")
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(!text.contains("must-not-appear"), "a secret in the unit:\n{text}");
        // The first line names the path; the rest is the file.
        text.split_once('\n').unwrap().1.to_string()
    };
    let unit = run("systemd");
    assert!(
        unit.contains(&format!("ExecStart=\"{}\" host", thunderbolt_bin().canonicalize().unwrap().display()))
    );
    assert!(unit.contains(&format!("Environment=\"THUNDERBOLT_HOME={}\"", dir.path().display())));
    assert!(unit.contains("Environment=\"THUNDERBOLT_IROH_RELAY_URL=https://relay.example\""));
    let path = dir.path().join("thunderbolt-host.service");
    std::fs::write(&path, &unit).unwrap();
    // System mode: a user manager needs a login session that CI does not have.
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze runs (Debian's systemd package; .ci/run installs it)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plist = run("launchd");
    let out = std::process::Command::new("python3")
        .args(["-c", "import plistlib,sys; p=plistlib.loads(sys.stdin.buffer.read()); print(p['ProgramArguments'][1], p['RunAtLoad'], p['KeepAlive'])"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(plist.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "host True True");
}

#[tokio::test(flavor = "multi_thread")]
async fn ready_and_stopping_reach_the_service_manager() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let sock = tokio::net::UnixDatagram::bind(&path).unwrap();
    let home = Tb::new(None).with_env("NOTIFY_SOCKET", path.display().to_string());
    let mut b = home.bridge("acp", &[], &[&test_agent_bin().display().to_string(), "cat"]).await;
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(WAIT, sock.recv(&mut buf)).await.unwrap().unwrap();
    let ready = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(ready.starts_with("READY=1\n") && ready.contains(&format!("MAINPID={}", b.pid())), "{ready}");
    b.terminate().await;
    let n = tokio::time::timeout(WAIT, sock.recv(&mut buf)).await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("STOPPING=1"));
}

#[tokio::test(flavor = "multi_thread")]
async fn status_tells_the_truth_about_the_relay() {
    init_tracing();
    let (mut relay, url) = relay_process("127.0.0.1:0").await;
    let home = Tb::with_relay_url(&url);
    let b = home.bridge("acp", &[], &[&test_agent_bin().display().to_string(), "cat"]).await;
    b.log.wait_for(": connected").await;
    let relay_of = |st: &Value| st["agents"][0]["relay"].clone();
    let r = relay_of(&status(&home).await);
    assert_eq!(r["connected"], true, "{r}");
    assert_eq!(r["url"], url.to_string());
    // Gone: within a few seconds, status says so, with the cause.
    relay.kill().await.unwrap();
    b.log.wait_for("connection lost").await;
    let r = relay_of(&status(&home).await);
    assert_eq!(r["connected"], false, "{r}");
    assert_eq!(r["drops"], 1);
    // Back on its port: reachable again.
    let bind = format!("127.0.0.1:{}", url.port().unwrap());
    let (_relay, _) = relay_process(&bind).await;
    b.log.wait_for_count(": connected", 2).await;
    let r = relay_of(&status(&home).await);
    assert_eq!(r["connected"], true, "{r}");
    let out = home.run(&["status"]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("(1 drop(s) before)"));
}
