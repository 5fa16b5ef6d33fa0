//! Benchmarks of the bridge against raw iroh, measured side by side in one run.
//!
//! ```text
//! tests/bench.sh --quick                  # builds, then runs this in a loopback-only netns
//! cargo build --release --workspace --bins
//! target/release/bench --quick            # about a minute
//! target/release/bench                    # full run
//! target/release/bench --json out.json    # also machine-readable
//! target/release/bench --quick --only small,bulk   # some sections only
//! BENCH_BRIDGE_WORKERS=2 target/release/bench --quick   # the bridge's TOKIO_WORKER_THREADS, for A/B runs
//! ```
//!
//! Everything runs as separate processes, as in real use: the relay
//! (`thunderbolt-relay --dev`), the bridge (`thunderbolt`) with its agent, a raw
//! iroh echo server (this binary, `echo-server` mode), and the measuring client
//! (this process). Absolute numbers drift on a shared two-core machine; the
//! ratios against the raw baseline, taken in the same run, are what to read.

use std::{
    path::PathBuf,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use iroh::{endpoint::Connection, Endpoint, EndpointAddr, RelayUrl, SecretKey};
use thunderbolt_shared::{EndpointTicket, Protocol};
use thunderbolt_tests::*;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::Command,
};

/// ALPN of the raw echo baseline (not a thunderbolt protocol on purpose).
const ECHO_ALPN: &[u8] = b"thunderbolt-bench/echo/0";

/// Bytes the raw echo asks for per read: the bridge's own read size.
const ECHO_READ: usize = 64 * 1024;

/// Bytes per ndjson line in bulk transfers: a JSON string of this size, like a
/// large tool result.
const BULK_LINE: usize = 16 * 1024;

#[derive(Debug, Clone, Copy)]
struct Plan {
    setup_reps: usize,
    bulk_bytes: usize,
    bulk_reps: usize,
    /// Sequential request/response round trips per measurement.
    rtts: usize,
    /// Bytes each of the 16 concurrent sessions streams.
    per_session_bytes: usize,
}

const QUICK: Plan =
    Plan { setup_reps: 10, bulk_bytes: 64 << 20, bulk_reps: 3, rtts: 2000, per_session_bytes: 4 << 20 };
/// Tiny sizes, for the test that keeps the harness itself working (not a measurement).
const SMOKE: Plan =
    Plan { setup_reps: 2, bulk_bytes: 1 << 20, bulk_reps: 1, rtts: 200, per_session_bytes: 256 << 10 };
const FULL: Plan =
    Plan { setup_reps: 30, bulk_bytes: 256 << 20, bulk_reps: 5, rtts: 10_000, per_session_bytes: 16 << 20 };

/// The parts of a run, in the order they run; `--only` picks some.
const SECTIONS: &[&str] = &["setup", "bulk", "dumbpipe", "small", "many", "memory", "flood"];

/// Round trips are measured in this many blocks, bridge and baseline taking turns,
/// so that drift on a shared machine lands on both alike.
const ROUND_TRIP_BLOCKS: usize = 10;

/// Which sections of [`SECTIONS`] this run measures.
struct Only(Vec<String>);

impl Only {
    fn parse(list: Option<&String>) -> Result<Self> {
        let Some(list) = list else { return Ok(Self(SECTIONS.iter().map(|s| s.to_string()).collect())) };
        let names: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
        if let Some(bad) = names.iter().find(|n| !SECTIONS.contains(&n.as_str())) {
            bail!("unknown section '{bad}' (sections: {})", SECTIONS.join(", "));
        }
        Ok(Self(names))
    }

    fn has(&self, s: &str) -> bool {
        self.0.iter().any(|n| n == s)
    }
}

/// Concurrent sessions in the many-sessions and memory measures: the bridge's agent cap.
const SESSIONS: usize = 16;

/// A ~200-byte JSON-RPC request, as a small ACP message would be.
const SMALL_REQUEST: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"session/prompt\",\"params\":{\"sessionId\":\"sess-1\",\"prompt\":[{\"type\":\"text\",\"text\":\"What does this function do? Please explain briefly, with an example.\"}]}}\n";

#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    name: String,
    unit: String,
    bridge: Stats,
    baseline_name: String,
    baseline: Stats,
    /// bridge median / baseline median.
    ratio: f64,
    higher_is_better: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
struct Stats {
    median: f64,
    min: f64,
    max: f64,
    n: usize,
}

impl Stats {
    fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Self { median, min: v[0], max: v[n - 1], n }
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    if args.first().map(String::as_str) == Some("echo-server") {
        return rt.block_on(echo_server(args.get(1).cloned()));
    }
    if args.first().map(String::as_str) == Some("relay-bulk") {
        // relay-bulk RELAY TICKET SECRET_HEX BYTES: one relay-only bulk transfer, prints MB/s.
        let usage = "relay-bulk RELAY TICKET SECRET_HEX BYTES";
        let relay: RelayUrl = args.get(1).context(usage)?.parse()?;
        let ticket: EndpointTicket = args.get(2).context(usage)?.parse()?;
        let key: [u8; 32] =
            hex_decode(args.get(3).context(usage)?).try_into().map_err(|_| anyhow::anyhow!("secret"))?;
        let bytes: usize = args.get(4).context(usage)?.parse()?;
        return rt.block_on(async move {
            let ep = client(&relay, SecretKey::from_bytes(&key), true).await?;
            let conn = ep.connect(path_addr(ticket.endpoint_addr(), true), &Protocol::acp().alpn()).await?;
            let mbs = bulk(&conn, bytes).await?;
            conn.close(0u32.into(), b"client closed");
            ep.close().await;
            println!("{mbs:.2}");
            Ok(())
        });
    }
    if args.first().map(String::as_str) == Some("flood") {
        let relay = args.get(1).context("flood RELAY TICKET SECS")?.parse()?;
        let ticket: EndpointTicket = args.get(2).context("flood RELAY TICKET SECS")?.parse()?;
        let secs: f64 = args.get(3).context("flood RELAY TICKET SECS")?.parse()?;
        return rt.block_on(flood(relay, ticket, Duration::from_secs_f64(secs)));
    }
    let quick = args.iter().any(|a| a == "--quick");
    let json_out = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).map(PathBuf::from);
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("usage: bench [--quick|--smoke] [--only SECTION,...] [--json PATH]");
        println!("sections: {}", SECTIONS.join(", "));
        return Ok(());
    }
    let only = Only::parse(args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)))?;
    let plan = if args.iter().any(|a| a == "--smoke") {
        SMOKE
    } else if quick {
        QUICK
    } else {
        FULL
    };
    rt.block_on(run(plan, &only, json_out))
}

/// A separate process: relay-only or direct raw iroh echo server, printing its ticket.
async fn echo_server(relay: Option<String>) -> Result<()> {
    let relay_url: Option<RelayUrl> = relay.map(|r| r.parse()).transpose()?;
    let mut b = Endpoint::builder(iroh::endpoint::presets::Minimal)
        .secret_key(SecretKey::generate())
        .alpns(vec![ECHO_ALPN.to_vec()])
        .portmapper_config(iroh::endpoint::PortmapperConfig::Disabled)
        .clear_ip_transports()
        .bind_addr("127.0.0.1:0")?;
    b = b.relay_mode(match &relay_url {
        Some(u) => iroh::RelayMode::custom([u.clone()]),
        None => iroh::RelayMode::Disabled,
    });
    let ep = b.bind().await?;
    if relay_url.is_some() {
        tokio::time::timeout(WAIT, ep.online()).await.context("echo server online")?;
    }
    println!("{}", EndpointTicket::new(ep.addr()));
    while let Some(inc) = ep.accept().await {
        tokio::spawn(async move {
            let Ok(conn) = async { inc.accept()?.await.map_err(anyhow::Error::from) }.await else { return };
            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                tokio::spawn(async move {
                    // Reads of the bridge's own size, so both sides of a ratio move data
                    // the same way. Forwarding each received chunk uncopied was slower
                    // (one small write per packet): 63-66 against 72-76 MB/s via the relay.
                    let mut buf = vec![0u8; ECHO_READ];
                    while let Ok(Some(n)) = recv.read(&mut buf).await {
                        if send.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                    let _ = send.finish();
                    let _ = send.stopped().await;
                });
            }
        });
    }
    Ok(())
}

/// Most dials in flight at once from the flood process, and most in total: the
/// flood is bounded in concurrency, count and time.
const FLOOD_CONCURRENCY: usize = 32;
const FLOOD_MAX_DIALS: usize = 20_000;
/// A flood dial gives up after this (the bridge ignores most of them).
const FLOOD_DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// A separate process: dials `ticket` through the relay with a fresh identity per
/// dial, `FLOOD_CONCURRENCY` at a time, until `dur` has passed.
async fn flood(relay: RelayUrl, ticket: EndpointTicket, dur: Duration) -> Result<()> {
    let deadline = Instant::now() + dur;
    let addr = path_addr(ticket.endpoint_addr(), true);
    let mut tasks = tokio::task::JoinSet::new();
    let mut started = 0usize;
    while Instant::now() < deadline && started < FLOOD_MAX_DIALS {
        while tasks.len() < FLOOD_CONCURRENCY && started < FLOOD_MAX_DIALS {
            started += 1;
            let (relay, addr) = (relay.clone(), addr.clone());
            tasks.spawn(async move {
                let Ok(ep) = client(&relay, SecretKey::generate(), true).await else { return };
                let _ =
                    tokio::time::timeout(FLOOD_DIAL_TIMEOUT, ep.connect(addr, &Protocol::acp().alpn())).await;
                ep.close().await;
            });
        }
        let _ = tokio::time::timeout_at(deadline.into(), tasks.join_next()).await;
    }
    tasks.shutdown().await;
    eprintln!("bench: flood made {started} dials");
    Ok(())
}

async fn start_relay() -> Result<(tokio::process::Child, RelayUrl)> {
    let bin = bin_dir().join("thunderbolt-relay");
    let mut child = Command::new(&bin)
        .args(["--dev", "--bind", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("spawn {}", bin.display()))?;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(WAIT, lines.next_line()).await??.context("relay printed nothing")?;
    let url = line.strip_prefix("relay listening on ").context("relay banner")?.parse()?;
    Ok((child, url))
}

async fn start_echo(relay: Option<&RelayUrl>) -> Result<(tokio::process::Child, EndpointAddr)> {
    let mut c = Command::new(std::env::current_exe()?);
    c.arg("echo-server");
    if let Some(r) = relay {
        c.arg(r.to_string());
    }
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::inherit()).kill_on_drop(true).spawn()?;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line =
        tokio::time::timeout(WAIT, lines.next_line()).await??.context("echo server printed nothing")?;
    let t: EndpointTicket = line.parse()?;
    Ok((child, t.endpoint_addr().clone()))
}

/// Keeps only what the client should use: relay-only drops IP addresses.
fn path_addr(addr: &EndpointAddr, relay_only: bool) -> EndpointAddr {
    if relay_only {
        EndpointAddr::from_parts(addr.id, addr.relay_urls().cloned().map(iroh::TransportAddr::Relay))
    } else {
        EndpointAddr::from_parts(addr.id, addr.ip_addrs().cloned().map(iroh::TransportAddr::Ip))
    }
}

/// Dial → open stream → send one request line → first byte of the answer.
async fn first_response(ep: &Endpoint, addr: &EndpointAddr, alpn: &[u8], line: &[u8]) -> Result<Duration> {
    let t0 = Instant::now();
    let conn = ep.connect(addr.clone(), alpn).await?;
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(line).await?;
    let mut b = [0u8; 1];
    recv.read_exact(&mut b).await.context("first response byte")?;
    let dt = t0.elapsed();
    conn.close(0u32.into(), b"client closed");
    Ok(dt)
}

/// One block of bulk ndjson: 64 lines, each a JSON string of [`BULK_LINE`] bytes.
fn bulk_block() -> Vec<u8> {
    let mut line = vec![b'a'; BULK_LINE];
    line[0] = b'"';
    line[BULK_LINE - 2] = b'"';
    line[BULK_LINE - 1] = b'\n';
    line.iter().copied().cycle().take(BULK_LINE * 64).collect()
}

/// Writes `total` bytes of ndjson to `w` while reading as many back from `r`;
/// returns MB/s (10^6 bytes per second of payload carried each way).
async fn transfer<W, R>(mut w: W, mut r: R, total: usize) -> Result<f64>
where
    W: tokio::io::AsyncWrite + Unpin,
    R: tokio::io::AsyncRead + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let block = bulk_block();
    let t0 = Instant::now();
    let writer = async {
        let mut sent = 0;
        while sent < total {
            let n = block.len().min(total - sent);
            w.write_all(&block[..n]).await?;
            sent += n;
        }
        w.shutdown().await?;
        anyhow::Ok(())
    };
    let reader = async {
        let mut got = 0usize;
        let mut buf = vec![0u8; 256 * 1024];
        while got < total {
            let n = r.read(&mut buf).await?;
            if n == 0 {
                bail!("stream ended after {got} of {total} bytes");
            }
            got += n;
        }
        anyhow::Ok(())
    };
    tokio::try_join!(writer, reader)?;
    Ok(total as f64 / t0.elapsed().as_secs_f64() / 1e6)
}

/// Bulk ndjson over a new stream of `conn`.
async fn bulk(conn: &Connection, total: usize) -> Result<f64> {
    let (send, recv) = conn.open_bi().await?;
    transfer(send, recv, total).await
}

async fn client(relay: &RelayUrl, key: SecretKey, relay_only: bool) -> Result<Endpoint> {
    let mut b = Endpoint::builder(iroh::endpoint::presets::Minimal)
        .secret_key(key)
        .relay_mode(iroh::RelayMode::custom([relay.clone()]))
        .portmapper_config(iroh::endpoint::PortmapperConfig::Disabled)
        .clear_ip_transports();
    if !relay_only {
        b = b.bind_addr("127.0.0.1:0")?;
    }
    let ep = b.bind().await?;
    tokio::time::timeout(WAIT, ep.online()).await.context("client online")?;
    Ok(ep)
}

/// The cat agent on plain pipes, no bridge: what one hop through an agent
/// process costs by itself.
struct PipeAgent {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::process::ChildStdout,
    buf: Vec<u8>,
}

impl PipeAgent {
    fn start() -> Result<Self> {
        let mut child = Command::new(test_agent_bin())
            .arg("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        Ok(Self { child, stdin, stdout, buf: vec![0u8; SMALL_REQUEST.len()] })
    }

    async fn round_trips(&mut self, n: usize) -> Result<Vec<f64>> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let t0 = Instant::now();
            self.stdin.write_all(SMALL_REQUEST).await?;
            self.stdout.read_exact(&mut self.buf).await?;
            out.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        Ok(out)
    }
}

impl Drop for PipeAgent {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Opens the stream round trips run on (one session: the bridge serves one
/// stream per connection) and the buffer answers are read into.
async fn round_trip_stream(
    conn: &Connection,
) -> Result<(Vec<u8>, iroh::endpoint::SendStream, iroh::endpoint::RecvStream)> {
    let (send, recv) = conn.open_bi().await?;
    Ok((vec![0u8; SMALL_REQUEST.len()], send, recv))
}

/// `n` sequential round trips of [`SMALL_REQUEST`]; the latency of each in microseconds.
async fn round_trips(
    send: &mut iroh::endpoint::SendStream,
    recv: &mut iroh::endpoint::RecvStream,
    buf: &mut [u8],
    n: usize,
) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        send.write_all(SMALL_REQUEST).await?;
        recv.read_exact(buf).await?;
        out.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok(out)
}

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[((s.len() - 1) as f64 * p).round() as usize]
}

/// `SESSIONS` connections streaming at once; returns (aggregate MB/s, slowest/fastest).
async fn many_sessions(ep: &Endpoint, addr: &EndpointAddr, alpn: &[u8], per: usize) -> Result<(f64, f64)> {
    let mut conns = Vec::new();
    for _ in 0..SESSIONS {
        conns.push(ep.connect(addr.clone(), alpn).await?);
    }
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in conns.clone() {
        tasks.spawn(async move { bulk(&c, per).await });
    }
    let mut each = Vec::new();
    while let Some(r) = tasks.join_next().await {
        each.push(r??);
    }
    let agg = (per * SESSIONS) as f64 / t0.elapsed().as_secs_f64() / 1e6;
    for c in conns {
        c.close(0u32.into(), b"client closed");
    }
    let max = each.iter().cloned().fold(f64::MIN, f64::max);
    let min = each.iter().cloned().fold(f64::MAX, f64::min);
    Ok((agg, min / max))
}

/// Resident set size of a process, in KiB.
fn rss_kib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS")?;
    Ok(line.split_whitespace().nth(1).context("VmRSS value")?.parse()?)
}

/// Spawns the built-in agent alone and times spawn → first response to `initialize`.
async fn spawn_agent_alone() -> Result<Duration> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t0 = Instant::now();
    let mut child = Command::new(thunderbolt_bin())
        .args(["acp", "serve"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n",
        )
        .await?;
    let mut b = [0u8; 1];
    child.stdout.take().unwrap().read_exact(&mut b).await?;
    let dt = t0.elapsed();
    drop(stdin);
    let _ = child.wait().await;
    Ok(dt)
}

/// Whether loopback is this process's only network interface (a namespace made
/// by `tests/bench.sh`): dumbpipe has no switch for its public relays and DNS.
fn loopback_only() -> bool {
    // /proc/self/net follows our namespace (/sys/class/net follows whoever mounted /sys).
    let Ok(dev) = std::fs::read_to_string("/proc/self/net/dev") else { return false };
    dev.lines().skip(2).filter_map(|l| l.split(':').next()).all(|name| name.trim() == "lo")
}

/// The `dumbpipe` binary: `$DUMBPIPE`, else on `PATH` (`cargo install dumbpipe`).
fn dumbpipe_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DUMBPIPE") {
        return Some(PathBuf::from(p));
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join("dumbpipe")).find(|p| p.is_file())
}

/// The same bulk transfer through dumbpipe (stdio mode) piping the same cat
/// agent: `agent ⇄ dumbpipe listen ⇄ dumbpipe connect ⇄ this process`.
async fn dumbpipe_bulk(dp: &std::path::Path, total: usize) -> Result<f64> {
    let (to_listen_r, to_listen_w) = std::io::pipe()?;
    let (to_agent_r, to_agent_w) = std::io::pipe()?;
    let mut agent = Command::new(test_agent_bin())
        .arg("cat")
        .stdin(Stdio::from(to_agent_r))
        .stdout(Stdio::from(to_listen_w))
        .kill_on_drop(true)
        .spawn()?;
    let mut listen = Command::new(dp)
        .args(["listen", "--ipv4-addr", "127.0.0.1:0"])
        .stdin(Stdio::from(to_listen_r))
        .stdout(Stdio::from(to_agent_w))
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(listen.stderr.take().unwrap()).lines();
    let ticket = tokio::time::timeout(WAIT, async {
        while let Some(l) = lines.next_line().await? {
            if let Some(t) = l.split_whitespace().find(|w| w.starts_with("endpoint")) {
                return anyhow::Ok(t.to_string());
            }
        }
        bail!("dumbpipe listen printed no ticket")
    })
    .await??;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let mut connect = Command::new(dp)
        .args(["connect", &ticket])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let stdin = connect.stdin.take().unwrap();
    let stdout = connect.stdout.take().unwrap();
    let mbs = transfer(stdin, stdout, total).await?;
    let _ = connect.kill().await;
    let _ = listen.kill().await;
    let _ = agent.kill().await;
    Ok(mbs)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn run(plan: Plan, only: &Only, json_out: Option<PathBuf>) -> Result<()> {
    let (relay, relay_url) = start_relay().await?;
    let tb = Tb::new(None);
    let client_key = SecretKey::generate();
    let agent = test_agent_bin().display().to_string();
    let relay_env = relay_url.to_string();
    let start_bridge = |argv: Vec<String>| {
        let mut c = tb.cmd();
        c.env("THUNDERBOLT_IROH_RELAY_URL", &relay_env).env("RUST_LOG", "warn");
        if let Ok(w) = std::env::var("BENCH_BRIDGE_WORKERS") {
            c.env("TOKIO_WORKER_THREADS", w);
        }
        // The per-remote budget (10 per 10 s) would throttle the measuring client itself.
        c.args(["acp", "--transport", "iroh", "--per-remote-max", "1000000"]);
        if !argv.is_empty() {
            c.arg("--").args(argv);
        }
        RunningBridge::start(c)
    };
    let cat_argv = vec![agent.clone(), "cat".into()];
    let addr_of = |b: &RunningBridge, relay_only: bool| -> Result<EndpointAddr> {
        Ok(path_addr(b.ticket.parse::<EndpointTicket>()?.endpoint_addr(), relay_only))
    };
    let init =
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n";
    tb.allow(&client_key.public()).await;
    let mut rows = Vec::new();
    eprintln!("bench: plan {plan:?}");

    for relay_only in [false, true] {
        let path = if relay_only { "relay" } else { "direct" };
        let ep = client(&relay_url, client_key.clone(), relay_only).await?;
        let (mut echo, echo_addr) = start_echo(Some(&relay_url)).await?;
        let echo_addr = path_addr(&echo_addr, relay_only);

        if only.has("setup") {
            // Built-in agent's first response vs raw echo's first byte.
            let mut builtin = start_bridge(vec![]).await;
            let bridge_addr = addr_of(&builtin, relay_only)?;
            let (mut b, mut r, mut rs) = (Vec::new(), Vec::new(), Vec::new());
            // One warm-up each so path discovery and page cache are not measured.
            first_response(&ep, &bridge_addr, &Protocol::acp().alpn(), init).await?;
            first_response(&ep, &echo_addr, ECHO_ALPN, init).await?;
            for _ in 0..plan.setup_reps {
                b.push(ms(first_response(&ep, &bridge_addr, &Protocol::acp().alpn(), init).await?));
                let raw = ms(first_response(&ep, &echo_addr, ECHO_ALPN, init).await?);
                r.push(raw);
                rs.push(raw + ms(spawn_agent_alone().await?));
            }
            let name = format!("dial → first response ({path})");
            rows.push(row(&name, "ms", b.clone(), "raw iroh echo", r, false));
            rows.push(row(&name, "ms", b, "raw echo + spawning the agent alone", rs, false));
            builtin.terminate().await;
        }

        let bulk_name = format!("bulk {} MiB through cat agent ({path})", plan.bulk_bytes >> 20);
        let (mut bridge_bulk, mut raw_bulk) = (Vec::new(), Vec::new());
        if only.has("bulk") || (only.has("dumbpipe") && !relay_only) {
            // Each bridge transfer is its own session (one agent per connection);
            // bridge and raw echo take turns so drift lands on both.
            let mut cat = start_bridge(cat_argv.clone()).await;
            let rconn = ep.connect(echo_addr.clone(), ECHO_ALPN).await?;
            // The direct path also takes turns with the agent on plain pipes, no
            // network: what the agent itself can move.
            let mut pipe_bulk = Vec::new();
            for _ in 0..plan.bulk_reps {
                let conn = ep.connect(addr_of(&cat, relay_only)?, &Protocol::acp().alpn()).await?;
                bridge_bulk.push(bulk(&conn, plan.bulk_bytes).await?);
                conn.close(0u32.into(), b"client closed");
                raw_bulk.push(bulk(&rconn, plan.bulk_bytes).await?);
                if !relay_only {
                    let mut pipe = PipeAgent::start()?;
                    pipe_bulk.push(transfer(&mut pipe.stdin, &mut pipe.stdout, plan.bulk_bytes).await?);
                }
            }
            rconn.close(0u32.into(), b"client closed");
            cat.terminate().await;
            if only.has("bulk") {
                rows.push(row(
                    &bulk_name,
                    "MB/s",
                    bridge_bulk.clone(),
                    "raw iroh echo",
                    raw_bulk.clone(),
                    true,
                ));
                if !relay_only {
                    rows.push(row(
                        &bulk_name,
                        "MB/s",
                        bridge_bulk.clone(),
                        "the agent on plain pipes, no network",
                        pipe_bulk,
                        true,
                    ));
                }
            }
        }
        if only.has("dumbpipe") && !relay_only {
            match dumbpipe_bin() {
                Some(_) if !loopback_only() => eprintln!(
                    "bench: skipping dumbpipe: it would reach public relays from here \
                     (run tests/bench.sh for a loopback-only namespace)"
                ),
                Some(dp) => {
                    let mut d = Vec::new();
                    for _ in 0..plan.bulk_reps {
                        d.push(dumbpipe_bulk(&dp, plan.bulk_bytes).await?);
                    }
                    rows.push(row(
                        &bulk_name,
                        "MB/s",
                        bridge_bulk,
                        "dumbpipe stdio, same agent",
                        d.clone(),
                        true,
                    ));
                    // What the ratio above could be at most: a bridge as fast as raw iroh.
                    rows.push(row(
                        &format!("bulk {} MiB, raw iroh echo (ceiling)", plan.bulk_bytes >> 20),
                        "MB/s",
                        raw_bulk,
                        "dumbpipe stdio, same agent",
                        d,
                        true,
                    ));
                }
                None => eprintln!(
                    "bench: dumbpipe not found (set DUMBPIPE or `cargo install dumbpipe`); skipping"
                ),
            }
        }
        if only.has("small") && !relay_only {
            // Sequential request/response on one session each, in alternating blocks.
            let mut cat = start_bridge(cat_argv.clone()).await;
            let conn = ep.connect(addr_of(&cat, false)?, &Protocol::acp().alpn()).await?;
            let rconn = ep.connect(echo_addr.clone(), ECHO_ALPN).await?;
            let (mut bs, mut bsend, mut brecv) = round_trip_stream(&conn).await?;
            let (mut rs, mut rsend, mut rrecv) = round_trip_stream(&rconn).await?;
            let per = plan.rtts / ROUND_TRIP_BLOCKS;
            round_trips(&mut bsend, &mut brecv, &mut bs, 100).await?;
            round_trips(&mut rsend, &mut rrecv, &mut rs, 100).await?;
            let mut pipe = PipeAgent::start()?;
            pipe.round_trips(100).await?;
            let (mut bl, mut rl, mut bp50, mut rp50) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let mut rpp50 = Vec::new();
            for _ in 0..ROUND_TRIP_BLOCKS {
                let b = round_trips(&mut bsend, &mut brecv, &mut bs, per).await?;
                let r = round_trips(&mut rsend, &mut rrecv, &mut rs, per).await?;
                let p = pipe.round_trips(per).await?;
                bp50.push(percentile(&b, 0.5));
                rp50.push(percentile(&r, 0.5));
                rpp50.push(percentile(&r, 0.5) + percentile(&p, 0.5));
                bl.extend(b);
                rl.extend(r);
            }
            conn.close(0u32.into(), b"client closed");
            rconn.close(0u32.into(), b"client closed");
            cat.terminate().await;
            let rps = |v: &[f64]| v.len() as f64 / (v.iter().sum::<f64>() / 1e6);
            rows.push(row(
                &format!("~200 B request/response p50 (median of {ROUND_TRIP_BLOCKS} blocks)"),
                "µs",
                bp50.clone(),
                "raw iroh echo",
                rp50,
                false,
            ));
            rows.push(row(
                &format!("~200 B request/response p50 (median of {ROUND_TRIP_BLOCKS} blocks)"),
                "µs",
                bp50,
                "raw echo + the agent's own pipe round trip",
                rpp50,
                false,
            ));
            rows.push(row_stats(
                "~200 B request/response p99",
                "µs",
                percentile(&bl, 0.99),
                percentile(&rl, 0.99),
                false,
            ));
            rows.push(row_stats("~200 B round trips per second", "rt/s", rps(&bl), rps(&rl), true));
        }
        if only.has("many") && !relay_only {
            // 16 sessions streaming at once (a fresh bridge: all 16 agent slots free).
            let mut fresh = start_bridge(cat_argv.clone()).await;
            let (bagg, bfair) =
                many_sessions(&ep, &addr_of(&fresh, false)?, &Protocol::acp().alpn(), plan.per_session_bytes)
                    .await?;
            fresh.terminate().await;
            let (ragg, rfair) = many_sessions(&ep, &echo_addr, ECHO_ALPN, plan.per_session_bytes).await?;
            rows.push(row_stats("16 concurrent sessions, aggregate", "MB/s", bagg, ragg, true));
            rows.push(row_stats(
                "16 concurrent sessions, fairness (slowest/fastest)",
                "",
                bfair,
                rfair,
                true,
            ));
        }
        if only.has("memory") && !relay_only {
            // Bridge RSS idle and with 16 idle sessions (agents are separate processes).
            let mut fresh = start_bridge(cat_argv.clone()).await;
            let cat_addr = addr_of(&fresh, false)?;
            let pid = fresh.pid();
            let idle = rss_kib(pid)?;
            let mut held = Vec::new();
            for _ in 0..SESSIONS {
                let c = ep.connect(cat_addr.clone(), &Protocol::acp().alpn()).await?;
                let (mut s, mut r) = c.open_bi().await?;
                s.write_all(b"{}\n").await?;
                let mut b = [0u8; 3];
                r.read_exact(&mut b).await?;
                held.push((c, s, r));
            }
            let loaded = rss_kib(pid)?;
            let per = (loaded - idle) / SESSIONS as f64;
            eprintln!("bench: bridge RSS idle {idle:.0} KiB, with {SESSIONS} sessions {loaded:.0} KiB");
            rows.push(
                row_stats("bridge RSS per idle session", "KiB", per, 256.0, false).named_baseline("target"),
            );
            rows.push(row_stats("bridge RSS, idle", "KiB", idle, idle, false).named_baseline("—"));
            for (c, _, _) in held {
                c.close(0u32.into(), b"client closed");
            }
            fresh.terminate().await;
        }
        let _ = echo.kill().await;
        ep.close().await;
    }
    if only.has("flood") {
        // Admission under attack: an allowed relay peer's setup time, alone and
        // while a separate process floods the bridge with fresh identities.
        let ep = client(&relay_url, client_key.clone(), true).await?;
        let mut builtin = start_bridge(vec![]).await;
        let addr = addr_of(&builtin, true)?;
        first_response(&ep, &addr, &Protocol::acp().alpn(), init).await?;
        let mut calm = Vec::new();
        for _ in 0..plan.setup_reps {
            calm.push(ms(first_response(&ep, &addr, &Protocol::acp().alpn(), init).await?));
        }
        let flood_secs = (plan.setup_reps as f64 * 2.0 + 10.0).to_string();
        let mut flood = Command::new(std::env::current_exe()?)
            .args(["flood", &relay_url.to_string(), &builtin.ticket, &flood_secs])
            .kill_on_drop(true)
            .spawn()?;
        // Let the flood reach full strength (the gate starts dropping) before measuring.
        let hit_cap =
            tokio::time::timeout(Duration::from_secs(5), builtin.log.wait_for("dropping connections"))
                .await
                .is_ok();
        eprintln!("bench: flood {} the handshake cap", if hit_cap { "reached" } else { "did not reach" });
        let mut attacked = Vec::new();
        for _ in 0..plan.setup_reps {
            attacked.push(ms(first_response(&ep, &addr, &Protocol::acp().alpn(), init).await?));
        }
        let _ = flood.kill().await;
        rows.push(row(
            "allowed peer dial → first response under flood (relay)",
            "ms",
            attacked,
            "same, no flood",
            calm,
            false,
        ));
        builtin.terminate().await;
        ep.close().await;
    }
    drop(relay);

    print_table(&rows);
    if let Some(p) = json_out {
        std::fs::write(&p, serde_json::to_vec_pretty(&rows)?)?;
        eprintln!("bench: wrote {}", p.display());
    }
    Ok(())
}

fn row(
    name: &str,
    unit: &str,
    bridge: Vec<f64>,
    baseline_name: &str,
    baseline: Vec<f64>,
    higher: bool,
) -> Row {
    let bridge = Stats::of(bridge);
    let baseline = Stats::of(baseline);
    let ratio = bridge.median / baseline.median;
    let r = Row {
        name: name.into(),
        unit: unit.into(),
        bridge,
        baseline_name: baseline_name.into(),
        baseline,
        ratio,
        higher_is_better: higher,
    };
    eprintln!(
        "bench: {} bridge {:.2} vs {:.2} {} (ratio {:.2})",
        r.name, r.bridge.median, r.baseline.median, unit, ratio
    );
    r
}

/// A row from single figures (percentiles, aggregates).
fn row_stats(name: &str, unit: &str, bridge: f64, baseline: f64, higher: bool) -> Row {
    row(name, unit, vec![bridge], "raw iroh echo", vec![baseline], higher)
}

impl Row {
    fn named_baseline(mut self, name: &str) -> Row {
        self.baseline_name = name.into();
        self
    }
}

fn print_table(rows: &[Row]) {
    println!("| measure | bridge median (min–max) | baseline | baseline median (min–max) | ratio |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {:.2} {} ({:.2}–{:.2}) | {} | {:.2} {} ({:.2}–{:.2}) | {:.2}× |",
            r.name,
            r.bridge.median,
            r.unit,
            r.bridge.min,
            r.bridge.max,
            r.baseline_name,
            r.baseline.median,
            r.unit,
            r.baseline.min,
            r.baseline.max,
            r.ratio
        );
    }
}
