//! The command line: identities, the allow file, and bad input. Every error
//! must be one clear line and a non-zero exit, never a panic.

use std::os::unix::fs::PermissionsExt;

use thunderbolt_tests::*;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A failed command: non-zero, an `error:` line, no panic text.
fn assert_clean_error(o: &std::process::Output, needle: &str) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success; stdout: {}", stdout(o));
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
}

#[tokio::test]
async fn identities_are_private_hex_and_stable() {
    let tb = Tb::new(None);
    let acp = tb.node_id("acp").await;
    assert_eq!(tb.node_id("acp").await, acp, "identity must persist");
    let mcp = tb.node_id("mcp").await;
    assert_ne!(acp, mcp);
    for p in ["acp", "mcp"] {
        let path = tb.identity_path(p);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.len(), 65, "64 hex chars + newline");
        assert!(text.trim_end().chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let dir = tb.home().join("iroh");
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    // A key copied in world-readable is tightened on load.
    let path = tb.identity_path("acp");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = tb.run(&["iroh", "id", "--json"]).await;
    assert!(o.status.success());
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    // Said once, when it happened; not on every later load.
    assert!(stderr(&o).contains("was mode 0644; set to 0600"), "stderr: {}", stderr(&o));
    let o = tb.run(&["iroh", "id", "--json"]).await;
    assert!(!stderr(&o).contains("was mode"), "stderr: {}", stderr(&o));
}

#[tokio::test]
async fn id_json_gives_hex_and_base32_and_both_are_accepted() {
    let tb = Tb::new(None);
    let o = tb.run(&["iroh", "id", "--json"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let hex = v["nodeId"].as_str().unwrap().to_string();
    let b32 = v["nodeIdBase32"].as_str().unwrap().to_string();
    assert_eq!(hex, tb.node_id("acp").await.to_string());
    // The form the app's own forms accept: ^[a-z2-7]{52,}$.
    assert_eq!(b32.len(), 52, "{b32}");
    assert!(b32.bytes().all(|c| c.is_ascii_lowercase() || (b'2'..=b'7').contains(&c)), "{b32}");
    // `allow` and `deny` take either form and store hex.
    let other = Tb::new(None);
    let o = other.run(&["iroh", "allow", &b32]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(listed(&other).await, std::slice::from_ref(&hex));
    let o = other.run(&["iroh", "deny", &b32]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&other.run(&["iroh", "list"]).await), "");
}

#[tokio::test]
async fn existing_reference_identity_is_kept() {
    // A key written by the reference tool (hex, trailing newline) gives the same NodeId.
    let tb = Tb::new(None);
    std::fs::create_dir_all(tb.home().join("iroh")).unwrap();
    let secret = [7u8; 32];
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(tb.identity_path("acp"), format!("{hex}\n")).unwrap();
    let expected = iroh::SecretKey::from_bytes(&secret).public();
    assert_eq!(tb.node_id("acp").await, expected);
}

#[tokio::test]
async fn corrupt_identity_is_refused_and_never_replaced() {
    let tb = Tb::new(None);
    std::fs::create_dir_all(tb.home().join("iroh")).unwrap();
    let path = tb.identity_path("acp");
    std::fs::write(&path, "definitely not a key\n").unwrap();
    let o = tb.run(&["iroh", "id"]).await;
    assert_clean_error(&o, &path.display().to_string());
    assert!(stderr(&o).contains("corrupt"));
    let o = tb.run(&["acp", "--transport", "iroh"]).await;
    assert_clean_error(&o, "corrupt");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "definitely not a key\n");
}

#[tokio::test]
async fn allow_deny_list() {
    let tb = Tb::new(None);
    let a = Tb::new(None).node_id("acp").await;
    let b = Tb::new(None).node_id("acp").await;
    let o = tb.run(&["iroh", "allow", &a.to_string(), "--json"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["added"], true);
    let o = tb.run(&["iroh", "allow", &a.to_string(), "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["added"], false, "duplicates collapse");
    // Uppercase input is accepted and stored as lowercase hex.
    tb.run(&["iroh", "allow", &b.to_string().to_uppercase()]).await;
    let allow_path = tb.home().join("iroh/allowlist");
    assert_eq!(std::fs::read_to_string(&allow_path).unwrap(), format!("{a}\n{b}\n"));
    assert_eq!(std::fs::metadata(&allow_path).unwrap().permissions().mode() & 0o777, 0o600);

    let o = tb.run(&["iroh", "list", "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["nodeIds"], serde_json::json!([a.to_string(), b.to_string()]));

    let o = tb.run(&["iroh", "deny", &a.to_string()]).await;
    assert!(o.status.success());
    assert_eq!(listed(&tb).await, [b.to_string()]);

    // A hand-edited bad line is reported with its line number.
    std::fs::write(&allow_path, format!("# mine\n{b}\nnot-a-node-id\n")).unwrap();
    let o = tb.run(&["iroh", "list", "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["badLines"][0]["line"], 3);
    assert!(stderr(&o).contains(":3:"), "{}", stderr(&o));
}

#[tokio::test]
async fn malformed_input_gets_one_clear_line() {
    let tb = Tb::new(None);
    let o = tb.run(&["iroh", "allow", "abc123"]).await;
    assert_clean_error(&o, "'abc123' is neither a ticket nor a NodeId");
    let o = tb.run(&["iroh", "allow", &"z".repeat(64)]).await;
    assert_clean_error(&o, "hex");
    assert!(!tb.home().join("iroh/allowlist").exists(), "nothing written for bad input");
    let o = tb.run(&["iroh", "id", "--protocol", "foo"]).await;
    assert_clean_error(&o, "unknown protocol 'foo'");
    let o = tb.run(&["iroh", "id", "--protocol", "../etc"]).await;
    assert_clean_error(&o, "protocol name");
    let o = tb.run(&["acp", "connect", "endpointnotaticket"]).await;
    assert_clean_error(&o, thunderbolt_shared::words::TICKET_DAMAGED);
    let o = tb.run(&["acp", "connect", "1234"]).await;
    assert_clean_error(&o, "'1234' is neither a ticket nor a NodeId");
    // A bare NodeId with neither discovery nor a relay of our own: say what to use instead.
    let o = tb.run(&["acp", "connect", &Tb::new(None).node_id("acp").await.to_string()]).await;
    assert_clean_error(
        &o,
        "a bare NodeId carries no address and discovery is off (THUNDERBOLT_IROH_DISCOVERY=off): use the \
         ticket from the bridge's banner, or --relay-url with the bridge's relay",
    );
    let o = tb.run(&["acp", "--transport", "iroh", "--", "no-such-agent-xyz"]).await;
    assert_clean_error(&o, "agent command 'no-such-agent-xyz' not found");
    let o = tb.run(&["mcp", "--transport", "iroh"]).await;
    assert_clean_error(&o, "needs the server to run");
    let o = tb.run(&["acp", "--transport", "iroh", "--max-agents", "0"]).await;
    assert_clean_error(&o, "--max-agents must be at least 1");
    // Absurd values are refused before the banner, never a panic after it.
    for flag in ["--max-agents", "--max-handshakes", "--per-remote-max"] {
        let o = tb.run(&["acp", "--transport", "iroh", flag, "2305843009213693952"]).await;
        assert_clean_error(&o, "more than this bridge allows");
        assert!(stdout(&o).is_empty(), "no banner for a refused setting");
    }
    let o = tb.run(&["acp", "--transport", "iroh", "--max-frame", "10"]).await;
    assert!(!o.status.success() && stderr(&o).contains("--max-frame"), "{}", stderr(&o));
    let o = tb.run(&["acp", "--transport", "iroh", "--stream-open-timeout=-1"]).await;
    assert_clean_error(&o, "--stream-open-timeout");
    let o = tb
        .cmd()
        .args(["acp", "--transport", "iroh"])
        .env("THUNDERBOLT_IROH_RELAY_URL", "ftp://x")
        .output()
        .await
        .unwrap();
    assert_clean_error(&o, "relay URL");
    assert_eq!(stderr(&o).lines().filter(|l| l.starts_with("error:")).count(), 1);
}

#[tokio::test]
async fn help_reads_like_a_manual() {
    let tb = Tb::new(None);
    let o = tb.run(&["--help"]).await;
    assert!(o.status.success());
    let h = stdout(&o);
    for word in ["acp", "mcp", "iroh", "THUNDERBOLT_HOME"] {
        assert!(h.contains(word), "--help lacks {word}: {h}");
    }
    let o = tb.run(&["acp", "--help"]).await;
    let h = stdout(&o);
    for word in ["connect", "--transport", "THUNDERBOLT_IROH_RELAY_URL", "--max-agents", "AGENT-CMD"] {
        assert!(h.contains(word), "acp --help lacks {word}: {h}");
    }
}

/// The NodeIds `iroh list` prints (each line starts with one).
async fn listed(tb: &Tb) -> Vec<String> {
    let o = tb.run(&["iroh", "list"]).await;
    stdout(&o).lines().map(|l| l.split_whitespace().next().unwrap_or_default().to_string()).collect()
}

#[tokio::test]
async fn pair_prints_ticket_steps_and_qr() {
    let tb = Tb::new(None);
    let id = tb.node_id("acp").await;
    let o = tb.run(&["iroh", "pair"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains(&id.fmt_short().to_string()), "{out}");
    assert!(out.contains("thunderbolt iroh allow"));
    assert!(out.contains("thunderbolt acp connect --pair "), "{out}");
    assert!(out.contains("No bridge serves this NodeId right now"), "{out}");
    assert!(out.contains('▀') || out.contains('█'), "QR code missing");
    let o = tb.run(&["iroh", "pair", "--json"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let t: thunderbolt_shared::Target = v["ticket"].as_str().unwrap().parse().unwrap();
    assert_eq!(t.id(), id);
}

#[tokio::test]
async fn banner_redacts_secrets_and_never_prints_the_key() {
    let tb = Tb::new(None);
    let mut bridge = tb
        .bridge(
            "acp",
            &[],
            &[&test_agent_bin().display().to_string(), "cat", "--api-key", "sk-SECRET1", "--token=SECRET2"],
        )
        .await;
    let secret_hex = std::fs::read_to_string(tb.identity_path("acp")).unwrap();
    assert!(bridge.banner.contains("--api-key ***"), "{}", bridge.banner);
    assert!(bridge.banner.contains("--token=***"));
    assert!(!bridge.banner.contains("SECRET"));
    assert!(!bridge.banner.contains(secret_hex.trim()));
    assert!(bridge.banner.contains("same-account auto-trust: off"));
    // It says how a device is paired, not only how a NodeId is allowed.
    assert!(bridge.banner.contains("Pair:    run `thunderbolt iroh pair` here"), "{}", bridge.banner);
    bridge.terminate().await;
    assert!(!bridge.log.text().contains(secret_hex.trim()));
}

#[tokio::test]
async fn offline_startup_does_not_hang() {
    // A relay URL nobody listens on: startup waits a bounded time and still
    // prints a ticket with direct addresses.
    let tb = Tb::new(None);
    let mut c = tb.cmd();
    c.args(["acp", "--transport", "iroh"]).env("THUNDERBOLT_IROH_RELAY_URL", "http://127.0.0.1:9");
    let mut bridge = RunningBridge::start(c).await;
    let t: thunderbolt_shared::Target = bridge.ticket.parse().unwrap();
    assert!(t.endpoint_addr().ip_addrs().next().is_some(), "ticket lacks direct addresses");
    bridge.terminate().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_allow_and_deny_lose_nothing() {
    let tb = Tb::new(None);
    let ids: Vec<String> =
        (0..24u8).map(|n| iroh::SecretKey::from_bytes(&[n + 1; 32]).public().to_string()).collect();
    let runs = ids.iter().map(|id| async { tb.run(&["iroh", "allow", id]).await });
    for o in futures::future::join_all(runs).await {
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let listed = stdout(&tb.run(&["iroh", "list"]).await);
    for id in &ids {
        assert!(listed.contains(id.as_str()), "allow of {id} was lost:\n{listed}");
    }
    let runs = ids[..12].iter().map(|id| async { tb.run(&["iroh", "deny", id]).await });
    for o in futures::future::join_all(runs).await {
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let listed = stdout(&tb.run(&["iroh", "list"]).await);
    for id in &ids[..12] {
        assert!(!listed.contains(id.as_str()), "deny of {id} was lost: a revocation that did not happen");
    }
    for id in &ids[12..] {
        assert!(listed.contains(id.as_str()));
    }
}

#[tokio::test]
async fn an_allow_file_that_is_not_a_regular_file_is_refused() {
    let tb = Tb::new(None);
    let iroh = tb.home().join("iroh");
    std::fs::create_dir_all(&iroh).unwrap();
    let path = iroh.join("allowlist");
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: plain syscall on a path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let o = tb.run(&["acp", "--transport", "iroh"]).await;
    assert_clean_error(&o, "not a regular file");
    let o = tb.run(&["iroh", "list"]).await;
    assert_clean_error(&o, "not a regular file");
}

#[tokio::test]
async fn damaged_tickets_and_node_ids_say_what_happened_and_what_to_do() {
    use thunderbolt_shared::{words, EndpointTicket};
    let tb = Tb::new(None);
    let bridge_home = Tb::new(None);
    let b = bridge_home.bridge("acp", &[], &[&test_agent_bin().display().to_string(), "cat"]).await;
    let ticket = b.ticket.clone();
    let damaged = |o: &std::process::Output| {
        assert_clean_error(o, &format!("error: {}", words::TICKET_DAMAGED));
        let err = stderr(o);
        for internals in ["trailing bits", "end of buffer", "expected more data", "postcard", "base32"] {
            assert!(!err.contains(internals), "decoder internals: {err}");
        }
    };
    // Cut short (also to exactly a base32 NodeId's 52 characters), or with a character dropped.
    for cut in [&ticket[..52], &ticket[..ticket.len() - 3], &ticket[..40]] {
        damaged(&tb.run(&["acp", "connect", cut]).await);
        damaged(&tb.run(&["iroh", "allow", cut]).await);
    }
    // A typo in the prefix: neither form, said in those words.
    let typo = ticket.replacen("endpoint", "endpiont", 1);
    let o = tb.run(&["acp", "connect", &typo]).await;
    assert_clean_error(
        &o,
        &format!(
            "is neither a ticket nor a NodeId: a ticket starts with `endpoint`, a NodeId is 64 hex or 52 \
             base32 characters (this is {}): copy it again",
            typo.len()
        ),
    );
    // One character changed inside the NodeId still decodes: to another key at the same
    // addresses. The handshake notices; say so, not "invalid peer certificate".
    let t: EndpointTicket = ticket.parse().unwrap();
    let other = iroh::SecretKey::generate().public();
    let wrong =
        EndpointTicket::new(iroh::EndpointAddr::from_parts(other, t.endpoint_addr().addrs.iter().cloned()));
    let o = tb.run(&["acp", "connect", "--dial-timeout", "10", &wrong.to_string()]).await;
    assert_clean_error(&o, &format!("error: {}", words::OTHER_IDENTITY));
    assert!(!stderr(&o).contains("certificate"), "{}", stderr(&o));
    // A ticket with no address at all.
    let bare = EndpointTicket::new(iroh::EndpointAddr::new(b.node_id)).to_string();
    let o = tb.run(&["acp", "connect", &bare]).await;
    assert_clean_error(&o, &format!("error: {}", words::NO_ADDRESS));
    // And the same `iroh pair` that mints such a ticket warns about it.
    let o = Tb::new(None)
        .with_env("THUNDERBOLT_IROH_RELAY_URL", "disabled")
        .run(&["iroh", "pair", "--no-qr"])
        .await;
    assert!(o.status.success());
    assert!(stderr(&o).contains("warning: this ticket carries no address"), "{}", stderr(&o));
}
