//! Files between a device and the workstation (`thunderbolt files put|get`,
//! the `/files1` door): a real bridge process, the real CLI as the device,
//! real QUIC on loopback; the path cut with nftables in the test's own
//! network namespace and the bridge restarted mid-transfer; hostile devices
//! speaking the wire by hand.

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::{json, Value};
use thunderbolt_shared::{files as wire, Protocol};
use thunderbolt_tests::*;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// The big transfer's size in MiB (the issue asks for 1 GiB; set lower to
/// iterate on a slow machine).
fn big_mib() -> u64 {
    std::env::var("TB_FILES_TEST_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(1024)
}

/// Writes `size` bytes of seeded noise (BLAKE3's output stream): every byte
/// differs from its neighbours, so a byte out of place changes the hash.
fn noise_file(path: &Path, size: u64, seed: &str) -> String {
    let mut xof = blake3::Hasher::new().update(seed.as_bytes()).finalize_xof();
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut buf = vec![0u8; 1 << 20];
    let mut hasher = blake3::Hasher::new();
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        xof.fill(&mut buf[..n]);
        hasher.update(&buf[..n]);
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    f.flush().unwrap();
    hasher.finalize().to_hex().to_string()
}

fn hash_of(path: &Path) -> String {
    let mut h = blake3::Hasher::new();
    h.update_mmap(path).unwrap();
    h.finalize().to_hex().to_string()
}

/// A bridge home serving a cat agent from `work`, and a device it allows.
struct Rig {
    tb: Tb,
    dev: Tb,
    work: tempfile::TempDir,
    dev_id: String,
}

impl Rig {
    async fn new() -> Self {
        let (tb, dev) = (Tb::new(None), Tb::new(None));
        let id = dev.node_id("acp").await;
        tb.allow(&id).await;
        Self { tb, dev, work: tempfile::tempdir().unwrap(), dev_id: id.to_string() }
    }

    async fn bridge(&self) -> RunningBridge {
        let mut c = self.tb.cmd();
        c.current_dir(self.work.path());
        c.args(["acp", "--transport", "iroh", "--"]).arg(test_agent_bin()).arg("cat");
        RunningBridge::start(c).await
    }

    /// `thunderbolt files <args>` as the device, its stdout and stderr kept.
    fn files(&self, args: &[&str]) -> tokio::process::Child {
        let mut c = self.dev.cmd();
        c.current_dir(self.dev.home());
        c.arg("files").args(args);
        c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        c.spawn().expect("files runs")
    }

    /// Runs `files <args>` to its end: exit success, stdout, stderr.
    async fn files_done(&self, args: &[&str]) -> (bool, String, String) {
        let out = tokio::time::timeout(Duration::from_secs(600), self.files(args).wait_with_output())
            .await
            .expect("files finished in time")
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    }

    fn device_dir(&self) -> PathBuf {
        self.tb.home().join("files/_bridge").join(&self.dev_id)
    }
}

/// Waits until `path` holds at least `bytes` (the transfer is that far).
async fn until_size(path: &Path, bytes: u64) {
    let reached = async {
        loop {
            if std::fs::metadata(path).is_ok_and(|m| m.len() >= bytes) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(300), reached)
        .await
        .unwrap_or_else(|_| panic!("{} never reached {bytes} bytes", path.display()));
}

fn receipt(stdout: &str) -> Value {
    serde_json::from_str(stdout.lines().next().unwrap_or_else(|| panic!("no receipt line: {stdout:?}")))
        .unwrap()
}

/// A gigabyte up, its path cut (nftables) at a third and the bridge restarted
/// at two thirds; then down, the bridge restarted and the path cut the same
/// way. Every run again sends only what was missing (the bytes each run put
/// on the wire are in its receipt), and the hash matches at both ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_gigabyte_goes_up_and_down_through_a_cut_path_and_a_restarted_host_sending_only_what_was_missing() {
    if !Outage::available() {
        eprintln!("skipped: nftables is not usable here (the test needs a network namespace of its own)");
        return;
    }
    let rig = Rig::new().await;
    let size = big_mib() << 20;
    let src = rig.dev.home().join("big.bin");
    let hash = noise_file(&src, size, "up");
    let mut bridge = rig.bridge().await;
    let port = banner_port(&bridge.banner);
    let src_arg = src.display().to_string();
    let partial = rig.device_dir().join(".partial").join(&hash);
    // Allowance for the tree's nodes (64 B per 16 KiB) and one group re-sent.
    let overhead = |bytes: u64| bytes / 200 + 64 * 1024;

    // Up, cut at a third: the device's connection times out, what arrived is kept.
    let mut put = rig.files(&["put", &bridge.ticket, &src_arg]);
    until_size(&partial, size / 3).await;
    let outage = Outage::udp_port(port);
    let out =
        tokio::time::timeout(Duration::from_secs(60), put.wait()).await.expect("put ends once cut").unwrap();
    assert!(!out.success());
    drop(outage);

    // Again, and the bridge restarted at two thirds.
    let put = rig.files(&["put", &bridge.ticket, &src_arg]);
    until_size(&partial, 2 * size / 3).await;
    bridge.terminate().await;
    let out = tokio::time::timeout(Duration::from_secs(60), put.wait_with_output()).await.unwrap().unwrap();
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.is_empty(), "no receipt for a file that did not arrive: {stdout}");
    let bridge = rig.bridge().await;

    // Again: only the last third crosses.
    let (ok, stdout, stderr) = rig.files_done(&["put", &bridge.ticket, &src_arg]).await;
    assert!(ok, "{stderr}\n{}", bridge.log.text());
    let r = receipt(&stdout);
    assert_eq!(
        (r["hash"].as_str(), r["size"].as_u64(), r["name"].as_str()),
        (Some(&*hash), Some(size), Some("big.bin"))
    );
    let resumed = r["resumed_from"].as_u64().unwrap();
    let sent = r["sent"].as_u64().unwrap();
    assert!(resumed >= 2 * size / 3 - 16 * 1024, "resumed from {resumed} of {size}");
    assert!(
        sent <= size - resumed + overhead(size - resumed),
        "sent {sent} for the {} missing",
        size - resumed
    );
    eprintln!("up: resumed from {resumed}, sent {sent} of {size}");
    let landed = rig.device_dir().join("_/big.bin");
    assert_eq!(r["uri"].as_str().unwrap(), format!("file://{}", landed.display()));
    assert_eq!(hash_of(&landed), hash, "the bytes on the workstation are the device's");
    assert!(!partial.exists(), "the partial became the file");

    // Down, with the bridge restarted at a third and the path cut at two thirds.
    let uri = r["uri"].as_str().unwrap().to_string();
    let out = rig.dev.home().join("back.bin");
    let out_arg = out.display().to_string();
    let part = rig.dev.home().join("back.bin.part");
    let mut bridge = bridge;
    let get = rig.files(&["get", &bridge.ticket, &uri, &out_arg]);
    until_size(&part, size / 3).await;
    bridge.terminate().await;
    let o = tokio::time::timeout(Duration::from_secs(60), get.wait_with_output()).await.unwrap().unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("run the same command again"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let bridge = rig.bridge().await;
    let mut get = rig.files(&["get", &bridge.ticket, &uri, &out_arg]);
    until_size(&part, 2 * size / 3).await;
    let outage = Outage::udp_port(port);
    let o =
        tokio::time::timeout(Duration::from_secs(60), get.wait()).await.expect("get ends once cut").unwrap();
    assert!(!o.success());
    drop(outage);
    let (ok, stdout, stderr) = rig.files_done(&["get", &bridge.ticket, &uri, &out_arg]).await;
    assert!(ok, "{stderr}\n{}", bridge.log.text());
    let g = receipt(&stdout);
    let resumed = g["resumed_from"].as_u64().unwrap();
    let received = g["received"].as_u64().unwrap();
    assert!(resumed >= 2 * size / 3 - 16 * 1024, "resumed from {resumed} of {size}");
    assert!(received <= size - resumed + overhead(size - resumed), "received {received}");
    eprintln!("down: resumed from {resumed}, received {received} of {size}");
    assert_eq!(hash_of(&out), hash);
    assert!(!part.exists());

    // Run again once whole: nothing crosses, the same file is named.
    let (ok, stdout, _) = rig.files_done(&["put", &bridge.ticket, &src_arg]).await;
    assert!(ok);
    let again = receipt(&stdout);
    assert_eq!((again["uri"].as_str(), again["sent"].as_u64()), (Some(uri.as_str()), Some(0)));
    std::fs::remove_file(&src).unwrap();
    std::fs::remove_file(&out).unwrap();
    bridge.stop().await;
}

/// The wire by hand: one request on a stream of `conn`, what follows it, and
/// the bridge's lines.
async fn exchange(conn: &iroh::endpoint::Connection, request: Value, body: &[u8]) -> Vec<Value> {
    let (mut send, recv) = conn.open_bi().await.unwrap();
    let mut line = serde_json::to_vec(&request).unwrap();
    line.push(b'\n');
    send.write_all(&line).await.unwrap();
    let mut reader = BufReader::new(recv);
    let mut lines = Vec::new();
    let mut first = String::new();
    tokio::time::timeout(WAIT, reader.read_line(&mut first)).await.unwrap().unwrap();
    lines.push(serde_json::from_str::<Value>(&first).unwrap_or_else(|_| panic!("reply {first:?}")));
    if lines[0].get("have").is_some() {
        send.write_all(body).await.unwrap();
        let _ = send.finish();
        let mut rest = String::new();
        tokio::time::timeout(WAIT, reader.read_to_string(&mut rest)).await.unwrap().unwrap();
        lines.extend(rest.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()));
    }
    lines
}

fn put_line(name: &str, data: &[u8]) -> Value {
    json!({"put": {"name": name, "size": data.len(), "hash": blake3::hash(data).to_hex().as_str()}})
}

fn error_of(lines: &[Value]) -> String {
    lines
        .iter()
        .find_map(|l| l["error"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no error in {lines:?}"))
}

/// Every file under `dir`, links included, as paths relative to it.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.symlink_metadata().unwrap().is_dir() {
                stack.push(p.clone());
            }
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
        }
    }
    out.sort();
    out
}

/// A device that means harm: hostile names, a size claim of 100 GB, a hash
/// that lies, a flood of tiny files, more transfers than its share, links
/// planted in the files folder, and downloads of keys and of links out of the
/// workspace. Each is refused with its reason, and nothing lands outside the
/// device's folder.
#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_device_is_refused_and_nothing_lands_outside_its_folder() {
    let rig = Rig::new().await;
    // The agent works in a folder holding a key and a link out.
    let work = rig.work.path();
    std::fs::create_dir_all(work.join(".ssh")).unwrap();
    std::fs::write(work.join(".ssh/id_ed25519"), b"PRIVATE").unwrap();
    std::fs::write(work.join("report.md"), b"# the agent's report\n").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), b"not yours").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), work.join("link-out")).unwrap();
    // A link planted where a file will be put.
    let folder = rig.device_dir().join("_");
    std::fs::create_dir_all(&folder).unwrap();
    let target = outside.path().join("authorized_keys");
    std::fs::write(&target, b"ssh-ed25519 mine").unwrap();
    std::os::unix::fs::symlink(&target, folder.join("photo.jpg")).unwrap();

    let bridge = rig.bridge().await;
    let ep = client_endpoint(rig.dev.secret_key("acp").await, None, false).await;
    let conn = bridge.dial(&ep, &wire::files_alpn(&Protocol::acp())).await;

    for name in ["../../.ssh/authorized_keys", "/etc/passwd", "a\0b", "line\nbreak", ".bashrc", "..", ""] {
        let lines = exchange(&conn, put_line(name, b"x"), b"x").await;
        assert!(error_of(&lines).starts_with(wire::REASON_BAD_NAME), "{name:?}: {lines:?}");
    }
    let huge = json!({"put": {"name": "big.bin", "size": 100_000_000_000u64, "hash": "0".repeat(64)}});
    assert!(error_of(&exchange(&conn, huge, b"").await).starts_with(wire::REASON_TOO_LARGE));
    let lie =
        json!({"put": {"name": "lie.txt", "size": 5, "hash": blake3::hash(b"other").to_hex().as_str()}});
    let lines = exchange(&conn, lie, b"hello").await;
    assert!(error_of(&lines).starts_with(wire::REASON_HASH_MISMATCH), "{lines:?}");

    // The planted link: the file takes another name, the link's target is untouched.
    let lines = exchange(&conn, put_line("photo.jpg", b"JPEG"), b"JPEG").await;
    let name =
        lines.iter().find_map(|l| l["receipt"]["name"].as_str()).unwrap_or_else(|| panic!("{lines:?}"));
    assert_eq!(name, "photo (2).jpg");
    assert_eq!(std::fs::read(&target).unwrap(), b"ssh-ed25519 mine");

    // More transfers at once than a device's share: the fifth is refused.
    let mut held = Vec::new();
    for i in 0..4 {
        let (mut send, recv) = conn.open_bi().await.unwrap();
        let data = vec![i as u8; 1 << 20];
        let mut line = serde_json::to_vec(&put_line(&format!("held{i}.bin"), &data)).unwrap();
        line.push(b'\n');
        send.write_all(&line).await.unwrap();
        let mut reader = BufReader::new(recv);
        let mut have = String::new();
        reader.read_line(&mut have).await.unwrap();
        assert!(have.contains("have"), "{have}");
        held.push((send, reader));
    }
    let lines = exchange(&conn, put_line("fifth.txt", b"5"), b"5").await;
    assert_eq!(error_of(&lines), wire::REASON_BUSY);
    drop(held);

    // A flood of tiny files (bounded at 100 000): refused once the session's folder is full.
    let mut stored = 0;
    let mut refusal = None;
    for i in 0..100_000u32 {
        let data = format!("tiny {i}");
        let lines = exchange(&conn, put_line(&format!("t{i}.txt"), data.as_bytes()), data.as_bytes()).await;
        match lines.iter().find_map(|l| l["error"].as_str()) {
            None => stored += 1,
            // The transfers dropped above may still be ending: their share comes back.
            Some(e) if e == wire::REASON_BUSY => continue,
            Some(e) => {
                refusal = Some(e.to_string());
                break;
            }
        }
    }
    assert_eq!(refusal.as_deref(), Some(wire::REASON_TOO_MANY_FILES));
    assert!(stored < 300, "stored {stored} before the refusal");

    // Downloads: a key, a link out of the workspace, a file outside, the bridge's own.
    for (uri, why) in [
        (format!("file://{}", work.join(".ssh/id_ed25519").display()), wire::REASON_OUTSIDE),
        (format!("file://{}", work.join("link-out").display()), wire::REASON_OUTSIDE),
        ("file:///etc/passwd".to_string(), wire::REASON_OUTSIDE),
        (format!("file://{}", rig.tb.home().join("iroh/identity").display()), wire::REASON_OUTSIDE),
        (format!("file://{}", work.join("nothing-here").display()), wire::REASON_NOT_FOUND),
        ("https://example.com/x".to_string(), wire::REASON_BAD_REQUEST),
    ] {
        let lines = exchange(&conn, json!({"get": {"uri": uri}}), b"").await;
        assert_eq!(error_of(&lines), why, "{uri}");
    }
    // What the agent wrote is reachable.
    let lines =
        exchange(&conn, json!({"get": {"uri": format!("file://{}", work.join("report.md").display())}}), b"")
            .await;
    assert_eq!(lines[0]["file"]["size"], 21, "{lines:?}");

    // Nothing but the device's own folder changed.
    let mut files = tree(rig.tb.home());
    files.retain(|f| f.starts_with("files"));
    assert!(
        files.iter().all(|f| f.starts_with(&format!("files/_bridge/{}", rig.dev_id))
            || f == "files"
            || f == "files/_bridge"),
        "{files:?}"
    );
    assert_eq!(tree(outside.path()), ["authorized_keys", "secret.txt"]);
    assert!(!rig.device_dir().join("_/lie.txt").exists());
    assert!(
        rig.device_dir().join(".partial").read_dir().map_or(0, |d| d.count()) <= 4,
        "only the held transfers' partials"
    );
    conn.close(0u32.into(), b"");
    ep.close().await;
    bridge.stop().await;
}

/// A device the owner denies loses its transfers at once, mid-file (the
/// device holds the rest back, so the file cannot have arrived first); a
/// device that is not allowed never gets to send a byte.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_device_s_transfer_ends_at_once_and_a_stranger_is_refused() {
    let rig = Rig::new().await;
    let bridge = rig.bridge().await;
    let src = rig.dev.home().join("half.bin");
    let size = 4u64 << 20;
    let hash = noise_file(&src, size, "revoked");
    // The file's verified encoding, made by the library a device uses.
    let file = std::fs::File::open(&src).unwrap();
    let tree = thunderbolt::files::stream::hash_tree(&file, size).unwrap();
    let mut encoded = Vec::new();
    thunderbolt::files::stream::send(&file, &tree, 0, &mut encoded).unwrap();

    let ep = client_endpoint(rig.dev.secret_key("acp").await, None, false).await;
    let conn = bridge.dial(&ep, &wire::files_alpn(&Protocol::acp())).await;
    let (mut send, recv) = conn.open_bi().await.unwrap();
    let line = json!({"put": {"name": "half.bin", "size": size, "hash": hash}});
    send.write_all(format!("{line}\n").as_bytes()).await.unwrap();
    let mut reader = BufReader::new(recv);
    let mut have = String::new();
    reader.read_line(&mut have).await.unwrap();
    assert_eq!(have.trim(), r#"{"have":0}"#);
    send.write_all(&encoded[..encoded.len() / 2]).await.unwrap();
    let partial = rig.device_dir().join(".partial").join(&hash);
    until_size(&partial, size / 4).await;

    let out = rig.tb.run(&["iroh", "deny", &rig.dev_id]).await;
    assert!(out.status.success());
    let (code, reason) =
        tokio::time::timeout(Duration::from_secs(20), closed_with(&conn)).await.expect("ended at once");
    assert_eq!((code, reason.as_str()), (1, "membership revoked"));
    assert!(std::fs::metadata(&partial).unwrap().len() < size);
    assert!(!rig.device_dir().join("_/half.bin").exists());
    ep.close().await;

    let stranger = Tb::new(None);
    let mut c = stranger.cmd();
    let small = stranger.home().join("a.txt");
    std::fs::write(&small, b"hi").unwrap();
    let o = c.args(["files", "put", &bridge.ticket, &small.display().to_string()]).output().await.unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not allowlisted"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::remove_file(&src).unwrap();
    bridge.stop().await;
}

/// A workstation whose disk is full refuses a put with that reason (the
/// files folder on a 4 MiB tmpfs, in a mount namespace of the bridge's own).
#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_is_said_not_written() {
    let probe = std::process::Command::new("unshare").args(["-m", "true"]).status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("skipped: cannot make a mount namespace here (needs root)");
        return;
    }
    let rig = Rig::new().await;
    let files = rig.tb.home().join("files");
    std::fs::create_dir_all(&files).unwrap();
    // `unshare -m sh -c 'mount … "$0" && exec "$@"' FILES thunderbolt acp …`, with the home's environment.
    let base = rig.tb.cmd();
    let mut c = tokio::process::Command::new("unshare");
    for (k, v) in base.as_std().get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.args(["-m", "sh", "-c", "mount -t tmpfs -o size=4m tb-files \"$0\" && exec \"$@\""])
        .arg(&files)
        .arg(thunderbolt_bin())
        .args(["acp", "--transport", "iroh", "--"])
        .arg(test_agent_bin())
        .arg("cat");
    c.current_dir(rig.work.path()).stdin(std::process::Stdio::null()).kill_on_drop(true);
    let bridge = RunningBridge::start(c).await;
    let src = rig.dev.home().join("photo.jpg");
    std::fs::write(&src, vec![7u8; 64 * 1024]).unwrap();
    let (ok, stdout, stderr) = rig.files_done(&["put", &bridge.ticket, &src.display().to_string()]).await;
    assert!(!ok && stdout.is_empty());
    assert!(stderr.contains(wire::REASON_DISK_FULL), "{stderr}");
    bridge.stop().await;
}

/// A photo put on the workstation reaches a real ACP agent (the SDK's, in
/// `client-wasm/e2e/restart-agent.mjs`) as a `resource_link` in the prompt
/// the device sends with it, and the agent reads the very bytes the device
/// has (their SHA-256, computed by each side on its own).
#[tokio::test(flavor = "multi_thread")]
async fn a_put_file_reaches_a_real_acp_agent_as_a_resource_link_it_reads() {
    let Some(agent) = sdk_agent("restart-agent.mjs") else { return };
    let rig = Rig::new().await;
    let store = tempfile::tempdir().unwrap();
    let mut c = rig.tb.cmd();
    c.current_dir(rig.work.path());
    c.args(["acp", "--transport", "iroh", "--", "node"]).arg(&agent).arg("--store").arg(store.path());
    let bridge = RunningBridge::start(c).await;
    let photo = rig.dev.home().join("photo.jpg");
    noise_file(&photo, 300 * 1024, "photo");
    let (ok, stdout, stderr) = rig.files_done(&["put", &bridge.ticket, &photo.display().to_string()]).await;
    assert!(ok, "{stderr}");
    let r = receipt(&stdout);
    assert_eq!(r["mime"], "image/jpeg");

    let mut client = JsonConnect::start(&rig.dev, &[&bridge.ticket]);
    let init = client.request(0, "initialize", json!({"protocolVersion": 1})).await;
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    let new = client.request(1, "session/new", json!({"cwd": "/tmp", "mcpServers": []})).await;
    let sid = new["result"]["sessionId"].as_str().expect("a session").to_string();
    let link = json!({"type": "resource_link", "uri": r["uri"], "name": r["name"], "mimeType": r["mime"], "size": r["size"]});
    let prompt =
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": "what is in this photo?"}, link]});
    let start = client.seen.len();
    let answer = client.request(2, "session/prompt", prompt).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let said: String = client.seen[start..]
        .iter()
        .filter(|v| v["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|v| v["params"]["update"]["content"]["text"].as_str())
        .collect();
    let sha = sha256_hex(&std::fs::read(&photo).unwrap());
    assert!(said.contains(&format!("read photo.jpg: {} bytes, sha256 {sha}", 300 * 1024)), "{said}");
    assert!(client.close().await.success());
    bridge.stop().await;
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A plain (`/0`) session's files go when its connection ends (its agent
/// ends with it): the folders named for the ACP session its client used
/// and for the bridge's id of it. Files of no session stay, and so does
/// another session's folder.
#[tokio::test(flavor = "multi_thread")]
async fn a_plain_session_s_files_go_when_it_ends() {
    let rig = Rig::new().await;
    let bridge = rig.bridge().await;
    let note = rig.dev.home().join("note.txt");
    std::fs::write(&note, b"for the plain session").unwrap();
    let put = |session: Option<&str>| {
        let mut args = vec!["put".to_string(), bridge.ticket.clone(), note.display().to_string()];
        if let Some(s) = session {
            args.extend(["--session".into(), s.into()]);
        }
        args
    };
    for session in [Some("plain-s1"), Some("another-s2"), None] {
        let args = put(session);
        let (ok, _, stderr) = rig.files_done(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
        assert!(ok, "{stderr}");
    }
    let (ours, theirs, none) =
        (rig.device_dir().join("plain-s1"), rig.device_dir().join("another-s2"), rig.device_dir().join("_"));
    for d in [&ours, &theirs, &none] {
        assert!(d.join("note.txt").is_file(), "{} holds the put", d.display());
    }

    // The plain session names its ACP session (the test agent echoes it
    // back: the bridge forwarded it), then its client goes.
    let ep = client_endpoint(rig.dev.secret_key("acp").await, None, false).await;
    let conn = bridge.dial(&ep, &Protocol::acp().alpn()).await;
    let (mut send, recv) = conn.open_bi().await.unwrap();
    let line = json!({"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {"sessionId": "plain-s1", "prompt": []}});
    send.write_all(format!("{line}\n").as_bytes()).await.unwrap();
    let mut echoed = String::new();
    tokio::time::timeout(WAIT, BufReader::new(recv).read_line(&mut echoed))
        .await
        .expect("echo in time")
        .unwrap();
    assert!(echoed.contains("plain-s1"), "{echoed:?}");
    conn.close(0u32.into(), b"done");
    ep.close().await;

    bridge.log.wait_for("session plain-s1 of _bridge is over: its 1 file(s) removed").await;
    assert!(!ours.exists(), "the plain session's folder went with it");
    assert!(theirs.join("note.txt").is_file() && none.join("note.txt").is_file(), "the others stay");
    bridge.stop().await;
}
