//! Test harness: real `thunderbolt` processes, a real local iroh relay, real
//! QUIC on loopback. Nothing here talks beyond 127.0.0.1: every process and
//! endpoint gets the network knobs switched off (design §5), and `.ci/run` adds
//! a network namespace with only loopback on top.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use iroh::{
    endpoint::{presets, Connection, ConnectionError},
    Endpoint, EndpointId, RelayMode, RelayUrl, SecretKey,
};
use iroh_tickets::endpoint::EndpointTicket;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::{Child, Command},
    sync::Notify,
};

pub mod backend;
pub mod hostile;
pub mod nat;
pub mod push;
pub mod r1;
pub mod setup;

/// Upper bound for anything a test waits on. Generous because two-core CI
/// machines run several test binaries at once; a passing test never waits it out.
pub const WAIT: Duration = Duration::from_secs(30);

/// Directory holding the workspace's binaries (next to `deps/` of this test).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("exe dir");
    if dir.ends_with("deps") {
        dir.parent().expect("target profile dir").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

fn workspace_bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: build the workspace binaries first (`cargo build --workspace --bins`, \
         which tests/run-all.sh does)",
        p.display()
    );
    p
}

pub fn thunderbolt_bin() -> PathBuf {
    workspace_bin("thunderbolt")
}

pub fn test_agent_bin() -> PathBuf {
    workspace_bin("test-agent")
}

/// `wrong-welcome`: a bridge that welcomes a resumption as another session.
pub fn wrong_welcome_bin() -> PathBuf {
    workspace_bin("wrong-welcome")
}

/// An in-process iroh relay on 127.0.0.1, plain http (what `iroh-relay --dev` does).
pub struct LocalRelay {
    server: Option<iroh_relay::server::Server>,
    pub url: RelayUrl,
}

impl LocalRelay {
    pub async fn start() -> Self {
        use iroh_relay::server::{RelayConfig, Server, ServerConfig};
        let mut cfg: ServerConfig = ServerConfig::default();
        cfg.relay = Some(RelayConfig::new(([127, 0, 0, 1], 0)));
        let server = Server::spawn(cfg).await.expect("relay starts");
        let addr = server.http_addr().expect("relay listens on http");
        let url: RelayUrl = format!("http://{addr}").parse().expect("relay url");
        Self { server: Some(server), url }
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.server.take() {
            let _ = s.shutdown().await;
        }
    }
}

/// Environment for every `thunderbolt` process: knobs off, local relay or none.
pub fn net_env(relay: Option<&RelayUrl>) -> Vec<(&'static str, String)> {
    vec![
        ("THUNDERBOLT_IROH_RELAY_URL", relay.map(|u| u.to_string()).unwrap_or_else(|| "disabled".into())),
        ("THUNDERBOLT_IROH_DISCOVERY", "off".into()),
        ("THUNDERBOLT_IROH_PORTMAPPER", "off".into()),
        ("THUNDERBOLT_IROH_BIND", "127.0.0.1:0".into()),
        ("RUST_LOG", "info,iroh=warn,noq=warn,noq_proto=warn,iroh_relay=warn".into()),
    ]
}

/// `client-wasm/e2e/<script>`, an ACP agent built on the official SDK, or
/// `None` (and a note) where its npm packages are not installed.
pub fn sdk_agent(script: &str) -> Option<PathBuf> {
    let root = bin_dir().join("../../client-wasm/e2e");
    let root = root.canonicalize().unwrap_or(root);
    if !root.join("node_modules/@agentclientprotocol/sdk").is_dir() {
        eprintln!(
            "skipped: the ACP SDK is not installed (`npm ci` in client-wasm/e2e; tests/run-all.sh does it)"
        );
        return None;
    }
    Some(root.join(script))
}

/// One `THUNDERBOLT_HOME` (a machine, as far as thunderbolt can tell).
pub struct Tb {
    dir: tempfile::TempDir,
    relay: Option<RelayUrl>,
    /// Set after the defaults (e.g. another bind address, a relay CA).
    env: Vec<(&'static str, String)>,
}

impl Tb {
    pub fn new(relay: Option<&LocalRelay>) -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
            relay: relay.map(|r| r.url.clone()),
            env: Vec::new(),
        }
    }

    /// A home whose processes use the relay at `url` (e.g. a relay process).
    pub fn with_relay_url(url: &RelayUrl) -> Self {
        Self { dir: tempfile::tempdir().expect("tempdir"), relay: Some(url.clone()), env: Vec::new() }
    }

    /// This home's processes get `key=value` (after the test defaults).
    pub fn with_env(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.env.push((key, value.into()));
        self
    }

    pub fn home(&self) -> &Path {
        self.dir.path()
    }

    /// A `thunderbolt` command with this home and the test network settings.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(thunderbolt_bin());
        for (k, _) in std::env::vars() {
            if k.starts_with("THUNDERBOLT_") {
                c.env_remove(k);
            }
        }
        c.env("THUNDERBOLT_HOME", self.home());
        for (k, v) in net_env(self.relay.as_ref()).into_iter().chain(self.env.iter().cloned()) {
            c.env(k, v);
        }
        c.stdin(Stdio::null()).kill_on_drop(true);
        c
    }

    /// Runs `thunderbolt <args>` to completion.
    pub async fn run(&self, args: &[&str]) -> std::process::Output {
        let out = tokio::time::timeout(WAIT, self.cmd().args(args).output())
            .await
            .expect("thunderbolt command finished in time")
            .expect("thunderbolt runs");
        out
    }

    /// `thunderbolt acp connect <args…>` with piped stdio; its stderr goes to the returned log.
    pub fn connect(&self, args: &[&str]) -> (Child, Log) {
        let mut c = self.cmd();
        c.args(["acp", "connect"]).args(args);
        c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().expect("connect spawns");
        let log = Log::default();
        log.capture_stderr(child.stderr.take().expect("stderr"));
        (child, log)
    }

    /// `thunderbolt iroh id --protocol P --json` → NodeId.
    pub async fn node_id(&self, protocol: &str) -> EndpointId {
        let out = self.run(&["iroh", "id", "--protocol", protocol, "--json"]).await;
        assert!(out.status.success(), "iroh id failed: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        v["nodeId"].as_str().expect("nodeId").parse().expect("valid id")
    }

    /// `thunderbolt iroh allow <id>`.
    pub async fn allow(&self, id: &EndpointId) {
        let out = self.run(&["iroh", "allow", &id.to_string()]).await;
        assert!(out.status.success(), "iroh allow failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn identity_path(&self, protocol: &str) -> PathBuf {
        let name = if protocol == "acp" { "identity".to_string() } else { format!("identity-{protocol}") };
        self.home().join("iroh").join(name)
    }

    /// The secret key of a protocol's identity (to dial in-process as this home).
    pub async fn secret_key(&self, protocol: &str) -> SecretKey {
        self.node_id(protocol).await;
        let text = std::fs::read_to_string(self.identity_path(protocol)).expect("identity file");
        let bytes: [u8; 32] = hex_decode(text.trim()).try_into().expect("32 bytes");
        SecretKey::from_bytes(&bytes)
    }

    /// Starts `thunderbolt <protocol> --transport iroh [extra] [-- agent…]` and
    /// waits for its banner.
    pub async fn bridge(&self, protocol: &str, extra: &[&str], agent: &[&str]) -> RunningBridge {
        let mut c = self.cmd();
        c.arg(protocol).args(["--transport", "iroh"]).args(extra);
        if !agent.is_empty() {
            c.arg("--").args(agent);
        }
        RunningBridge::start(c).await
    }
}

pub fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

/// Collected stderr of a process, with a way to wait for a line.
#[derive(Clone, Default)]
pub struct Log {
    text: Arc<Mutex<String>>,
    changed: Arc<Notify>,
    /// The reader reached its end (the process and all holding its stderr exited).
    ended: Arc<std::sync::atomic::AtomicBool>,
}

impl Log {
    /// Collects a process's stderr (or any reader) line by line.
    pub fn capture_stderr<R: tokio::io::AsyncRead + Unpin + Send + 'static>(&self, r: R) {
        self.capture(r)
    }

    fn capture<R: tokio::io::AsyncRead + Unpin + Send + 'static>(&self, r: R) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(r).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                {
                    let mut t = this.text.lock().unwrap();
                    t.push_str(&line);
                    t.push('\n');
                }
                this.changed.notify_waiters();
            }
            this.ended.store(true, std::sync::atomic::Ordering::SeqCst);
            this.changed.notify_waiters();
        });
    }

    /// Everything the process wrote, once its stderr has ended (bounded by
    /// [`WAIT`]): a process that has exited may still have lines in the pipe
    /// that [`Log::text`] has not seen yet.
    pub async fn finished(&self) -> String {
        let res = tokio::time::timeout(WAIT, async {
            loop {
                let notified = self.changed.notified();
                if self.ended.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                notified.await;
            }
        })
        .await;
        assert!(res.is_ok(), "stderr never ended; log so far:\n{}", self.text());
        self.text()
    }

    pub fn text(&self) -> String {
        self.text.lock().unwrap().clone()
    }

    pub fn contains(&self, needle: &str) -> bool {
        self.text.lock().unwrap().contains(needle)
    }

    /// Waits until the log contains `needle` at least `n` times (event-driven; bounded by [`WAIT`]).
    pub async fn wait_for_count(&self, needle: &str, n: usize) {
        let res = tokio::time::timeout(WAIT, async {
            loop {
                let notified = self.changed.notified();
                if self.text.lock().unwrap().matches(needle).count() >= n {
                    return;
                }
                notified.await;
            }
        })
        .await;
        assert!(res.is_ok(), "log never showed {needle:?} {n} times; log was:\n{}", self.text());
    }

    /// Waits until the log contains `needle` (event-driven; bounded by [`WAIT`]).
    pub async fn wait_for(&self, needle: &str) {
        self.wait_for_count(needle, 1).await;
    }
}

/// A running bridge process.
pub struct RunningBridge {
    pub child: Child,
    pub node_id: EndpointId,
    pub ticket: String,
    pub banner: String,
    pub log: Log,
}

/// Starts `c` and reads its banner (up to the `Allow a peer:` line): the
/// child, the banner, and its stderr as a [`Log`].
pub async fn start_with_banner(mut c: Command) -> (Child, String, Log) {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("bridge spawns");
    let log = Log::default();
    log.capture(child.stderr.take().expect("stderr"));
    let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut banner = String::new();
    let read_banner = async {
        while let Some(line) = out.next_line().await.expect("read stdout") {
            banner.push_str(&line);
            banner.push('\n');
            if line.trim_start().starts_with("Allow a peer:") {
                return true;
            }
        }
        false
    };
    let ok = tokio::time::timeout(WAIT, read_banner).await;
    assert!(matches!(ok, Ok(true)), "bridge printed no banner; stderr:\n{}", log.text());
    // Keep draining stdout so the bridge never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
    (child, banner, log)
}

impl RunningBridge {
    pub async fn start(c: Command) -> Self {
        let (child, banner, log) = start_with_banner(c).await;
        let field = |name: &str| {
            banner
                .lines()
                .find_map(|l| {
                    l.trim_start()
                        .strip_prefix(name)
                        .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
                })
                .unwrap_or_else(|| panic!("banner has no {name}:\n{banner}"))
        };
        let node_id = field("NodeId:").parse().expect("banner NodeId parses");
        let ticket = field("Ticket:");
        Self { child, node_id, ticket, banner, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Dials the bridge by its ticket with `alpn`; must succeed within [`WAIT`].
    pub async fn dial(&self, ep: &Endpoint, alpn: &[u8]) -> Connection {
        let ticket: EndpointTicket = self.ticket.parse().expect("banner ticket parses");
        tokio::time::timeout(WAIT, ep.connect(ticket.endpoint_addr().clone(), alpn))
            .await
            .expect("dial in time")
            .expect("dial succeeds")
    }

    /// SIGTERM and wait for exit.
    pub async fn stop(mut self) -> std::process::ExitStatus {
        self.terminate().await
    }

    /// SIGTERM and wait for exit, keeping the handle (and its log).
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        if let Some(pid) = self.child.id() {
            signal(pid, libc::SIGTERM);
        }
        tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("bridge exits after SIGTERM")
            .expect("wait")
    }
}

pub fn signal(pid: u32, sig: i32) {
    // SAFETY: plain syscall.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Whether a process exists (zombies count as gone: they hold no resources but
/// a table slot; the bridge reaps its agents, so a zombie would show as alive
/// in /proc only until reaped).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.split_whitespace().nth(2).is_none_or(|s| s != "Z"),
        Err(_) => false,
    }
}

/// Waits until `pid` is gone. There is no event for "a process I did not spawn
/// exited", so this polls /proc, bounded by [`WAIT`].
pub async fn wait_pid_gone(pid: u32) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if !pid_alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Waits until a file exists and returns its content (polling; bounded by [`WAIT`]).
pub async fn wait_file(path: &Path) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if !s.is_empty() {
                return s;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "{} never appeared", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An in-process client endpoint with everything public switched off.
/// `relay_only` removes IP transports so the only path is the relay.
pub async fn client_endpoint(key: SecretKey, relay: Option<&LocalRelay>, relay_only: bool) -> Endpoint {
    loopback_endpoint(key, relay.map(|r| &r.url), relay_only, Vec::new())
        .await
        .expect("client endpoint binds and reaches the local relay")
}

/// An endpoint that can reach nothing but loopback: `relay` as its only relay (or
/// none), 127.0.0.1 unless `relay_only`, no portmapper, no discovery. With a relay
/// it is returned once connected to it. Shared by the tests and the bench.
pub async fn loopback_endpoint(
    key: SecretKey,
    relay: Option<&RelayUrl>,
    relay_only: bool,
    alpns: Vec<Vec<u8>>,
) -> anyhow::Result<Endpoint> {
    // One datagram per batch, as the bridge sends (`thunderbolt::net::
    // SEGMENTATION_OFFLOAD`: GSO batches of loss probes panic noq-proto
    // 1.4.0). A measuring client or echo with GSO would die of that panic
    // now and then, and measure against a different send path.
    let transport = iroh::endpoint::QuicTransportConfig::builder().enable_segmentation_offload(false).build();
    let mut b = Endpoint::builder(presets::Minimal)
        .secret_key(key)
        .alpns(alpns)
        .transport_config(transport)
        .relay_mode(match relay {
            Some(url) => RelayMode::custom([url.clone()]),
            None => RelayMode::Disabled,
        })
        .portmapper_config(iroh::endpoint::PortmapperConfig::Disabled)
        .clear_ip_transports();
    if !relay_only {
        b = b.bind_addr("127.0.0.1:0")?;
    }
    let ep = b.bind().await?;
    if relay.is_some() {
        tokio::time::timeout(WAIT, ep.online())
            .await
            .map_err(|_| anyhow::anyhow!("relay not reached in {WAIT:?}"))?;
    }
    Ok(ep)
}

/// Installs a test log subscriber once (RUST_LOG controls it).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A path outage made with nftables in this process's network namespace
/// (the tests and the bench run in one of their own); lifted when dropped.
pub struct Outage {
    table: String,
}

impl Outage {
    /// All UDP to and from `port` dropped (a bridge's direct path).
    pub fn udp_port(port: u16) -> Self {
        Self::rules(&[format!("udp dport {port} drop"), format!("udp sport {port} drop")])
    }

    /// All TCP to and from `port` dropped (a relay).
    pub fn tcp_port(port: u16) -> Self {
        Self::rules(&[format!("tcp dport {port} drop"), format!("tcp sport {port} drop")])
    }

    fn rules(rules: &[String]) -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let table = format!("tb_outage_{}_{n}", std::process::id());
        let mut script = format!(
            "add table inet {table}\nadd chain inet {table} out {{ type filter hook output priority 0; }}\n"
        );
        for r in rules {
            script.push_str(&format!("add rule inet {table} out {r}\n"));
        }
        nft(&script);
        Self { table }
    }

    /// Whether outages can be made here (nft present and allowed).
    pub fn available() -> bool {
        std::process::Command::new("nft")
            .args(["list", "tables"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Outage {
    fn drop(&mut self) {
        nft(&format!("delete table inet {}\n", self.table));
    }
}

fn nft(script: &str) {
    use std::io::Write;
    let mut c = std::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nft runs (install nftables; outages need root in a network namespace of their own)");
    c.stdin.take().expect("stdin").write_all(script.as_bytes()).expect("nft reads its script");
    let out = c.wait_with_output().expect("nft finishes");
    assert!(out.status.success(), "nft failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// The first direct UDP port in a bridge's banner (`Reach: direct 127.0.0.1:PORT`).
pub fn banner_port(banner: &str) -> u16 {
    let reach = banner.lines().find(|l| l.contains("Reach:")).expect("banner has Reach");
    let addr = reach.split("direct ").nth(1).expect("direct").split([' ', ',']).next().expect("addr");
    addr.rsplit(':').next().expect("port").parse().expect("numeric port")
}

/// `thunderbolt-relay --dev` as a process on `bind` (port 0 for any), and its URL.
pub async fn relay_process(bind: &str) -> (Child, RelayUrl) {
    let mut child = Command::new(bin_dir().join("thunderbolt-relay"))
        .args(["--dev", "--bind", bind])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("thunderbolt-relay runs");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("relay banner in time")
        .expect("read relay stdout")
        .expect("relay printed its address");
    let url = line.strip_prefix("relay listening on ").expect("relay banner").parse().expect("relay url");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, url)
}

/// An application close's code and reason; `None` for any other end.
pub fn app_close(err: &ConnectionError) -> Option<(u64, String)> {
    match err {
        ConnectionError::ApplicationClosed(ac) => {
            Some((ac.error_code.into_inner(), String::from_utf8_lossy(&ac.reason).into_owned()))
        }
        _ => None,
    }
}

/// Waits (bounded) for `conn` to be closed by the peer; its code and reason.
pub async fn closed_with(conn: &Connection) -> (u64, String) {
    let err = tokio::time::timeout(WAIT, conn.closed()).await.expect("closed in time");
    app_close(&err).unwrap_or_else(|| panic!("expected an application close, got {err:?}"))
}

/// The pid an agent started with `--pid-file` wrote.
pub async fn agent_pid(pid_file: &str) -> u32 {
    wait_file(pid_file.as_ref()).await.trim().parse().expect("pid file holds a pid")
}

/// A private CA (`ca.pem`) and a certificate for `names` (DNS names or IP
/// addresses) signed by it (`relay.pem`, `relay.key`), written to `dir`.
pub fn private_ca(dir: &Path, names: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "thunderbolt test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
    let key = KeyPair::generate().expect("key");
    let params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).expect("cert params");
    let issuer = Issuer::new(ca_params, ca_key);
    let cert = params.signed_by(&key, &issuer).expect("certificate");
    let (ca, crt, k) = (dir.join("ca.pem"), dir.join("relay.pem"), dir.join("relay.key"));
    std::fs::write(&ca, ca_cert.pem()).expect("write CA");
    std::fs::write(&crt, cert.pem()).expect("write certificate");
    std::fs::write(&k, key.serialize_pem()).expect("write key");
    (ca, crt, k)
}

/// One `thunderbolt acp connect`'s stdio as JSON lines: what a local client
/// sends and reads. Every line read is kept in `seen`, in order.
pub struct JsonConnect {
    pub child: Child,
    /// `None` once its input was ended.
    pub stdin: Option<tokio::process::ChildStdin>,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    pub log: Log,
    pub seen: Vec<serde_json::Value>,
}

impl JsonConnect {
    /// `connect <args…>` as `home`'s device.
    pub fn start(home: &Tb, args: &[&str]) -> Self {
        let (mut child, log) = home.connect(args);
        let stdin = child.stdin.take();
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Self { child, stdin, lines, log, seen: Vec::new() }
    }

    pub async fn send(&mut self, v: serde_json::Value) {
        use tokio::io::AsyncWriteExt;
        let mut line = serde_json::to_vec(&v).expect("JSON");
        line.push(b'\n');
        self.stdin.as_mut().expect("input open").write_all(&line).await.expect("connect reads its input");
    }

    /// Sends `line` as it is (a `\n` is added): what a hostile client writes,
    /// in a key order or spelling a JSON value would not keep.
    pub async fn send_raw(&mut self, line: &[u8]) {
        use tokio::io::AsyncWriteExt;
        let mut line = line.to_vec();
        line.push(b'\n');
        self.stdin.as_mut().expect("input open").write_all(&line).await.expect("connect reads its input");
    }

    /// The next line, within [`WAIT`].
    pub async fn next(&mut self) -> serde_json::Value {
        let line = tokio::time::timeout(WAIT, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("no line from connect in time; its log:\n{}", self.log.text()))
            .expect("read connect's output")
            .unwrap_or_else(|| panic!("connect's output ended; its log:\n{}", self.log.text()));
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        self.seen.push(v.clone());
        v
    }

    /// Reads until a line `pick` accepts, returning it.
    pub async fn until(&mut self, pick: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        loop {
            let v = self.next().await;
            if pick(&v) {
                return v;
            }
        }
    }

    /// Reads until the response to `id`, returning it.
    pub async fn response(&mut self, id: &serde_json::Value) -> serde_json::Value {
        self.until(|v| v.get("id") == Some(id) && v.get("method").is_none()).await
    }

    /// Sends a request and reads until its response.
    pub async fn request(&mut self, id: u64, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.send(serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        self.response(&serde_json::json!(id)).await
    }

    /// Ends its input and waits for it to exit.
    pub async fn close(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        tokio::time::timeout(WAIT, self.child.wait()).await.expect("connect exits").expect("wait")
    }
}
