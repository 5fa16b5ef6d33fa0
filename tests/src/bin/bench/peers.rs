//! The other processes of a run: the relay, the raw echo server, the flood,
//! dumbpipe, and the agent on plain pipes.

use super::*;

/// ALPN of the raw echo baseline (not a thunderbolt protocol on purpose).
pub const ECHO_ALPN: &[u8] = b"thunderbolt-bench/echo/0";

/// Bytes the raw echo asks for per read: the bridge's own read size.
pub const ECHO_READ: usize = 64 * 1024;

/// The raw one-way baselines beside the echo: the sink reads a stream to its
/// end and answers how many bytes it read (8 bytes, big-endian); the source
/// reads a count (the same) and sends that many bytes.
pub const SINK_ALPN: &[u8] = b"thunderbolt-bench/sink/0";
pub const SOURCE_ALPN: &[u8] = b"thunderbolt-bench/source/0";

/// A separate process: relay-only or direct raw iroh echo server, printing its ticket.
pub async fn echo_server(relay: Option<RelayUrl>) -> Result<()> {
    let alpns = vec![ECHO_ALPN.to_vec(), SINK_ALPN.to_vec(), SOURCE_ALPN.to_vec()];
    let ep = loopback_endpoint(SecretKey::generate(), relay.as_ref(), false, alpns)
        .await
        .context("echo server endpoint")?;
    println!("{}", EndpointTicket::new(ep.addr()));
    while let Some(inc) = ep.accept().await {
        tokio::spawn(async move {
            let Ok(conn) = async { inc.accept()?.await.map_err(anyhow::Error::from) }.await else { return };
            if conn.alpn() != ECHO_ALPN {
                return one_way(conn).await;
            }
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

/// The sink's or the source's side of `conn`, a stream at a time.
async fn one_way(conn: Connection) {
    let sink = conn.alpn() == SINK_ALPN;
    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
        let mut buf = vec![0u8; ECHO_READ];
        if sink {
            let mut n = 0u64;
            while let Ok(Some(k)) = recv.read(&mut buf).await {
                n += k as u64;
            }
            let _ = send.write_all(&n.to_be_bytes()).await;
        } else {
            let mut count = [0u8; 8];
            if recv.read_exact(&mut count).await.is_err() {
                return;
            }
            let mut left = u64::from_be_bytes(count);
            while left > 0 {
                let k = left.min(buf.len() as u64) as usize;
                if send.write_all(&buf[..k]).await.is_err() {
                    return;
                }
                left -= k as u64;
            }
        }
        let _ = send.finish();
        let _ = send.stopped().await;
    }
}

/// Most dials in flight at once from the flood process; with the two below, the
/// flood is bounded in concurrency, count and time.
pub const FLOOD_CONCURRENCY: usize = 32;

/// Most dials the flood process makes in all.
pub const FLOOD_MAX_DIALS: usize = 20_000;

/// A flood dial gives up after this (the bridge ignores most of them).
pub const FLOOD_DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// A separate process: dials `ticket` through the relay with a fresh identity per
/// dial, `FLOOD_CONCURRENCY` at a time, until `dur` has passed.
pub async fn flood(relay: RelayUrl, ticket: EndpointTicket, dur: Duration) -> Result<()> {
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

/// `thunderbolt-relay --dev` on a free loopback port, and its URL.
pub async fn start_relay() -> Result<(tokio::process::Child, RelayUrl)> {
    start_relay_at("127.0.0.1:0").await
}

/// `thunderbolt-relay --dev` on `bind`, and its URL.
pub async fn start_relay_at(bind: &str) -> Result<(tokio::process::Child, RelayUrl)> {
    let bin = bin_dir().join("thunderbolt-relay");
    let mut child = Command::new(&bin)
        .args(["--dev", "--bind", bind])
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

/// The raw echo server (this binary, `echo-server`) and its address.
pub async fn start_echo(relay: Option<&RelayUrl>) -> Result<(tokio::process::Child, EndpointAddr)> {
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
pub fn path_addr(addr: &EndpointAddr, relay_only: bool) -> EndpointAddr {
    if relay_only {
        EndpointAddr::from_parts(addr.id, addr.relay_urls().cloned().map(iroh::TransportAddr::Relay))
    } else {
        EndpointAddr::from_parts(addr.id, addr.ip_addrs().cloned().map(iroh::TransportAddr::Ip))
    }
}

/// The measuring client's endpoint: the local relay only, plus 127.0.0.1 unless
/// `relay_only`; returned once online.
pub async fn client(relay: &RelayUrl, key: SecretKey, relay_only: bool) -> Result<Endpoint> {
    loopback_endpoint(key, Some(relay), relay_only, Vec::new()).await.context("client endpoint")
}

/// The cat agent on plain pipes, no bridge: what one hop through an agent
/// process costs by itself.
pub struct PipeAgent {
    child: tokio::process::Child,
    pub stdin: tokio::process::ChildStdin,
    pub stdout: tokio::process::ChildStdout,
    buf: Vec<u8>,
}

impl PipeAgent {
    pub fn start() -> Result<Self> {
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

    pub async fn round_trips(&mut self, n: usize) -> Result<Vec<f64>> {
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

/// Resident set size of a process, in KiB.
pub fn rss_kib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS")?;
    Ok(line.split_whitespace().nth(1).context("VmRSS value")?.parse()?)
}

/// Spawns the built-in agent alone and times spawn → first response to `initialize`.
pub async fn spawn_agent_alone() -> Result<Duration> {
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
pub fn loopback_only() -> bool {
    // /proc/self/net follows our namespace (/sys/class/net follows whoever mounted /sys).
    let Ok(dev) = std::fs::read_to_string("/proc/self/net/dev") else { return false };
    dev.lines().skip(2).filter_map(|l| l.split(':').next()).all(|name| name.trim() == "lo")
}

/// The `dumbpipe` binary: `$DUMBPIPE`, else on `PATH` (`cargo install dumbpipe`).
pub fn dumbpipe_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DUMBPIPE") {
        return Some(PathBuf::from(p));
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join("dumbpipe")).find(|p| p.is_file())
}

/// The same bulk transfer through dumbpipe (stdio mode) piping the same cat
/// agent: `agent ⇄ dumbpipe listen ⇄ dumbpipe connect ⇄ this process`.
pub async fn dumbpipe_bulk(dp: &std::path::Path, total: usize) -> Result<f64> {
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
