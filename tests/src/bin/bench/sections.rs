//! The sections of a run, each measuring the bridge and its baselines side by side.

use super::*;

/// Unmeasured round trips first, so connection set-up and page faults are not timed.
pub const ROUND_TRIP_WARMUP: usize = 100;

/// Round trips are measured in this many blocks, bridge and baseline taking turns,
/// so that drift on a shared machine lands on both alike.
pub const ROUND_TRIP_BLOCKS: usize = 10;

/// What every section shares: the plan, the relay, the bridge's home and the
/// measuring client's identity (allowed in that home).
pub struct Bench {
    pub plan: Plan,
    pub relay_url: RelayUrl,
    pub tb: Tb,
    pub client_key: SecretKey,
    pub agent: String,
}

/// The first request of the setup measures: ACP `initialize`.
pub const INIT: &[u8] =
    b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n";

impl Bench {
    /// The measuring client's NodeId (allowed on every bridge of the bench).
    pub fn client_id(&self) -> iroh::EndpointId {
        self.client_key.public()
    }

    /// A bridge on the local relay running `argv` (the built-in agent when empty).
    async fn bridge(&self, argv: Vec<String>) -> RunningBridge {
        let log = std::env::var("BENCH_BRIDGE_LOG").unwrap_or_else(|_| "warn".into());
        self.bridge_with(&[], argv, &log).await
    }

    /// [`Self::bridge`] with more flags and a log level.
    pub async fn bridge_with(&self, extra: &[&str], argv: Vec<String>, log: &str) -> RunningBridge {
        self.bridge_on(&self.relay_url.clone(), extra, argv, log).await
    }

    /// [`Self::bridge_with`] on another relay.
    pub async fn bridge_on(
        &self,
        relay: &RelayUrl,
        extra: &[&str],
        argv: Vec<String>,
        log: &str,
    ) -> RunningBridge {
        self.bridge_in(&self.tb, relay, extra, argv, log).await
    }

    /// [`Self::bridge_on`] in another home (a second bridge running at once).
    pub async fn bridge_in(
        &self,
        home: &Tb,
        relay: &RelayUrl,
        extra: &[&str],
        argv: Vec<String>,
        log: &str,
    ) -> RunningBridge {
        let mut c = home.cmd();
        c.env("THUNDERBOLT_IROH_RELAY_URL", relay.to_string()).env("RUST_LOG", log);
        if let Ok(w) = std::env::var("BENCH_BRIDGE_WORKERS") {
            c.env("TOKIO_WORKER_THREADS", w);
        }
        // The per-remote budget (10 per 10 s) would throttle the measuring client itself.
        c.args(["acp", "--transport", "iroh", "--per-remote-max", "1000000"]);
        // Heartbeats return freed memory: frequent ones let the flood section
        // read what the bridge keeps for good, not what it has yet to give back.
        c.args(["--heartbeat-interval", "10"]).args(extra);
        if !argv.is_empty() {
            c.arg("--").args(argv);
        }
        RunningBridge::start(c).await
    }

    /// A bridge whose agent is the test agent's `cat`.
    pub async fn cat_bridge(&self) -> RunningBridge {
        self.bridge(vec![self.agent.clone(), "cat".into()]).await
    }
}

/// One path under test: the client endpoint and a raw echo server reached the same way.
pub struct Path {
    pub relay_only: bool,
    pub ep: Endpoint,
    echo: tokio::process::Child,
    echo_addr: EndpointAddr,
}

impl Path {
    async fn open(b: &Bench, relay_only: bool) -> Result<Self> {
        let ep = client(&b.relay_url, b.client_key.clone(), relay_only).await?;
        let (echo, echo_addr) = start_echo(Some(&b.relay_url)).await?;
        Ok(Self { relay_only, ep, echo, echo_addr: path_addr(&echo_addr, relay_only) })
    }

    fn name(&self) -> &'static str {
        if self.relay_only {
            "relay"
        } else {
            "direct"
        }
    }

    /// How this path reaches `bridge`.
    pub fn addr_of(&self, bridge: &RunningBridge) -> Result<EndpointAddr> {
        Ok(path_addr(bridge.ticket.parse::<EndpointTicket>()?.endpoint_addr(), self.relay_only))
    }

    async fn close(mut self) {
        let _ = self.echo.kill().await;
        self.ep.close().await;
    }
}

/// Runs the chosen sections in order and prints the table (and JSON).
pub async fn run(plan: Plan, only: &Only, json_out: Option<PathBuf>) -> Result<()> {
    let (relay, relay_url) = start_relay().await?;
    let b = Bench {
        plan,
        relay_url,
        tb: Tb::new(None),
        client_key: SecretKey::generate(),
        agent: test_agent_bin().display().to_string(),
    };
    b.tb.allow(&b.client_key.public()).await;
    eprintln!("bench: plan {plan:?}");

    let mut rows = Vec::new();
    if only.has(Section::Check) {
        rows.extend(check_rows(&plan));
    }
    for relay_only in [false, true] {
        let p = Path::open(&b, relay_only).await?;
        if only.has(Section::Setup) {
            rows.extend(setup_rows(&b, &p).await?);
        }
        let dumbpipe = only.has(Section::Dumbpipe) && !relay_only;
        if only.has(Section::Bulk) || dumbpipe {
            rows.extend(bulk_rows(&b, &p, only.has(Section::Bulk), dumbpipe).await?);
        }
        if !relay_only {
            if only.has(Section::Small) {
                rows.extend(small_rows(&b, &p).await?);
            }
            if only.has(Section::Many) {
                rows.extend(many_rows(&b, &p).await?);
            }
            if only.has(Section::Memory) {
                rows.extend(memory_rows(&b, &p).await?);
            }
            if only.has(Section::Stall) {
                rows.extend(stall_rows(&b, &p).await?);
            }
            if only.has(Section::Connect) {
                rows.extend(connect_rows(&b, &p).await?);
            }
            if only.has(Section::Resume) {
                rows.extend(resume_rows(&b).await?);
            }
            if only.has(Section::Duplex) {
                rows.extend(duplex_rows(&b).await?);
            }
            if only.has(Section::Failover) {
                rows.extend(failover_rows().await?);
            }
            if only.has(Section::Devices) {
                rows.extend(devices_rows(&b).await?);
            }
            if only.has(Section::Restart) {
                rows.extend(journal_rows(&b).await?);
                rows.extend(restart_rows(&b).await?);
            }
            if only.has(Section::Pressure) {
                rows.extend(pressure_rows(&b, &p).await?);
            }
            if only.has(Section::Host) {
                rows.extend(host_rows(&b, &p).await?);
            }
            if only.has(Section::Files) {
                rows.extend(files_rows(&b).await?);
            }
        }
        p.close().await;
    }
    if only.has(Section::Flood) {
        rows.extend(flood_rows(&b).await?);
    }
    if only.has(Section::Nat) {
        rows.extend(nat_rows(&b).await?);
    }
    drop(relay);

    print_table(&rows);
    if let Some(p) = json_out {
        std::fs::write(&p, serde_json::to_vec_pretty(&rows)?)?;
        eprintln!("bench: wrote {}", p.display());
    }
    Ok(())
}

/// Dial → the built-in agent's first response, against the raw echo's first byte
/// and against that plus spawning the same agent alone.
pub async fn setup_rows(b: &Bench, p: &Path) -> Result<Vec<Row>> {
    let acp = Protocol::acp().alpn();
    let mut builtin = b.bridge(vec![]).await;
    let bridge_addr = p.addr_of(&builtin)?;
    let (mut bridge, mut raw, mut raw_spawn) = (Vec::new(), Vec::new(), Vec::new());
    // One warm-up each so path discovery and page cache are not measured.
    first_response(&p.ep, &bridge_addr, &acp, INIT).await?;
    first_response(&p.ep, &p.echo_addr, ECHO_ALPN, INIT).await?;
    for _ in 0..b.plan.setup_reps {
        bridge.push(ms(first_response(&p.ep, &bridge_addr, &acp, INIT).await?));
        let r = ms(first_response(&p.ep, &p.echo_addr, ECHO_ALPN, INIT).await?);
        raw.push(r);
        raw_spawn.push(r + ms(spawn_agent_alone().await?));
    }
    builtin.terminate().await;
    let name = format!("dial → first response ({})", p.name());
    Ok(vec![
        row(&name, "ms", bridge.clone(), "raw iroh echo", raw, false),
        row(&name, "ms", bridge, "raw echo + spawning the agent alone", raw_spawn, false),
    ])
}

/// Bulk through a cat agent against the raw echo (and, on the direct path, the
/// agent alone on plain pipes); with `dumbpipe`, also against dumbpipe's stdio.
pub async fn bulk_rows(b: &Bench, p: &Path, want_bulk: bool, dumbpipe: bool) -> Result<Vec<Row>> {
    let total = b.plan.bulk_bytes;
    let name = format!("bulk {} MiB through cat agent ({})", total >> 20, p.name());
    let (mut bridge, mut raw, mut pipe) = (Vec::new(), Vec::new(), Vec::new());
    let mut cat = b.cat_bridge().await;
    let rconn = p.ep.connect(p.echo_addr.clone(), ECHO_ALPN).await?;
    // Each bridge transfer is its own session (one agent per connection); the
    // baselines take turns with it so drift lands on all of them.
    for _ in 0..b.plan.bulk_reps {
        let conn = p.ep.connect(p.addr_of(&cat)?, &Protocol::acp().alpn()).await?;
        let got = bulk(&conn, total).await;
        bridge.push(got.with_context(|| format!("bulk through the bridge; its log:\n{}", cat.log.text()))?);
        conn.close(0u32.into(), b"client closed");
        raw.push(bulk(&rconn, total).await?);
        if !p.relay_only {
            let mut agent = PipeAgent::start()?;
            pipe.push(transfer(&mut agent.stdin, &mut agent.stdout, total).await?);
        }
    }
    rconn.close(0u32.into(), b"client closed");
    cat.terminate().await;

    let mut rows = Vec::new();
    if want_bulk {
        rows.push(row(&name, "MB/s", bridge.clone(), "raw iroh echo", raw.clone(), true));
        if !p.relay_only {
            rows.push(row(&name, "MB/s", bridge.clone(), "the agent on plain pipes, no network", pipe, true));
        }
    }
    if dumbpipe {
        match dumbpipe_bin() {
            Some(_) if !loopback_only() => eprintln!(
                "bench: skipping dumbpipe: it would reach public relays from here \
                 (run tests/bench.sh for a loopback-only namespace)"
            ),
            Some(dp) => {
                let mut d = Vec::new();
                for _ in 0..b.plan.bulk_reps {
                    d.push(dumbpipe_bulk(&dp, total).await?);
                }
                rows.push(row(&name, "MB/s", bridge, "dumbpipe stdio, same agent", d.clone(), true));
                // What the ratio above could be at most: a bridge as fast as raw iroh.
                let ceiling = format!("bulk {} MiB, raw iroh echo (ceiling)", total >> 20);
                rows.push(row(&ceiling, "MB/s", raw, "dumbpipe stdio, same agent", d, true));
            }
            None => {
                eprintln!("bench: dumbpipe not found (set DUMBPIPE or `cargo install dumbpipe`); skipping")
            }
        }
    }
    Ok(rows)
}

/// Sequential ~200 B request/response on one session each, in alternating
/// blocks: bridge, raw echo, and the cat agent on plain pipes.
pub async fn small_rows(b: &Bench, p: &Path) -> Result<Vec<Row>> {
    let mut cat = b.cat_bridge().await;
    let conn = p.ep.connect(p.addr_of(&cat)?, &Protocol::acp().alpn()).await?;
    let rconn = p.ep.connect(p.echo_addr.clone(), ECHO_ALPN).await?;
    let (mut bbuf, mut bsend, mut brecv) = round_trip_stream(&conn).await?;
    let (mut rbuf, mut rsend, mut rrecv) = round_trip_stream(&rconn).await?;
    let mut pipe = PipeAgent::start()?;
    round_trips(&mut bsend, &mut brecv, &mut bbuf, ROUND_TRIP_WARMUP).await?;
    round_trips(&mut rsend, &mut rrecv, &mut rbuf, ROUND_TRIP_WARMUP).await?;
    pipe.round_trips(ROUND_TRIP_WARMUP).await?;

    let per = b.plan.rtts / ROUND_TRIP_BLOCKS;
    let (mut all_bridge, mut all_raw) = (Vec::new(), Vec::new());
    let (mut bridge_p50, mut raw_p50, mut floor_p50) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUND_TRIP_BLOCKS {
        let bl = round_trips(&mut bsend, &mut brecv, &mut bbuf, per).await?;
        let rl = round_trips(&mut rsend, &mut rrecv, &mut rbuf, per).await?;
        let pl = pipe.round_trips(per).await?;
        bridge_p50.push(percentile(&bl, 0.5));
        raw_p50.push(percentile(&rl, 0.5));
        floor_p50.push(percentile(&rl, 0.5) + percentile(&pl, 0.5));
        all_bridge.extend(bl);
        all_raw.extend(rl);
    }
    conn.close(0u32.into(), b"client closed");
    rconn.close(0u32.into(), b"client closed");
    cat.terminate().await;

    let p50 = format!("~200 B request/response p50 (median of {ROUND_TRIP_BLOCKS} blocks)");
    let per_second = |v: &[f64]| v.len() as f64 / (v.iter().sum::<f64>() / 1e6);
    Ok(vec![
        row(&p50, "µs", bridge_p50.clone(), "raw iroh echo", raw_p50, false),
        row(&p50, "µs", bridge_p50, "raw echo + the agent's own pipe round trip", floor_p50, false),
        row_stats(
            "~200 B request/response p99",
            "µs",
            percentile(&all_bridge, 0.99),
            percentile(&all_raw, 0.99),
            false,
        ),
        row_stats(
            "~200 B round trips per second",
            "rt/s",
            per_second(&all_bridge),
            per_second(&all_raw),
            true,
        ),
    ])
}

/// [`SESSIONS`] sessions streaming at once (a fresh bridge: every agent slot free).
pub async fn many_rows(b: &Bench, p: &Path) -> Result<Vec<Row>> {
    let mut fresh = b.cat_bridge().await;
    let (bagg, bfair) =
        many_sessions(&p.ep, &p.addr_of(&fresh)?, &Protocol::acp().alpn(), b.plan.per_session_bytes).await?;
    fresh.terminate().await;
    let (ragg, rfair) = many_sessions(&p.ep, &p.echo_addr, ECHO_ALPN, b.plan.per_session_bytes).await?;
    Ok(vec![
        row_stats("16 concurrent sessions, aggregate", "MB/s", bagg, ragg, true),
        row_stats("16 concurrent sessions, fairness (slowest/fastest)", "", bfair, rfair, true),
    ])
}

/// Bridge RSS idle and with [`SESSIONS`] idle sessions (agents are separate
/// processes, so not counted).
pub async fn memory_rows(b: &Bench, p: &Path) -> Result<Vec<Row>> {
    let mut fresh = b.cat_bridge().await;
    let (idle, loaded) =
        idle_sessions_rss(&p.ep, &p.addr_of(&fresh)?, &Protocol::acp().alpn(), fresh.pid()).await?;
    eprintln!("bench: bridge RSS idle {idle:.0} KiB, with {SESSIONS} sessions {loaded:.0} KiB");
    fresh.terminate().await;
    // The same for a raw iroh echo server (same transport settings as iroh's
    // defaults, no agent, no session core): what QUIC and iroh hold per connection.
    let (mut echo, echo_addr) = start_echo(Some(&b.relay_url)).await?;
    let echo_pid = echo.id().context("echo pid")?;
    let (ridle, rloaded) =
        idle_sessions_rss(&p.ep, &path_addr(&echo_addr, p.relay_only), ECHO_ALPN, echo_pid).await?;
    let _ = echo.kill().await;
    let per = (loaded - idle) / SESSIONS as f64;
    let raw_per = (rloaded - ridle) / SESSIONS as f64;
    Ok(vec![
        row_stats("bridge RSS per idle session", "KiB", per, raw_per, false)
            .named_baseline("raw iroh echo, per idle connection"),
        row_stats("bridge RSS per idle session", "KiB", per, 128.0, false).named_baseline("target"),
        row_stats("bridge RSS, idle", "KiB", idle, ridle, false).named_baseline("raw iroh echo, idle"),
    ])
}

/// RSS (KiB) of process `pid` before and after [`SESSIONS`] idle sessions to
/// `addr`, each past one echoed line and held open.
async fn idle_sessions_rss(ep: &Endpoint, addr: &EndpointAddr, alpn: &[u8], pid: u32) -> Result<(f64, f64)> {
    let idle = rss_kib(pid)?;
    let mut held = Vec::new();
    for _ in 0..SESSIONS {
        let c = ep.connect(addr.clone(), alpn).await?;
        let (mut s, mut r) = c.open_bi().await?;
        s.write_all(b"{}\n").await?;
        let mut echoed = [0u8; 3];
        r.read_exact(&mut echoed).await?;
        held.push((c, s, r));
    }
    let loaded = rss_kib(pid)?;
    for (c, _, _) in held {
        c.close(0u32.into(), b"client closed");
    }
    Ok((idle, loaded))
}

/// Admission under attack: an allowed relay peer's setup time, alone and while a
/// separate process floods the bridge with fresh identities.
pub async fn flood_rows(b: &Bench) -> Result<Vec<Row>> {
    let acp = Protocol::acp().alpn();
    let ep = client(&b.relay_url, b.client_key.clone(), true).await?;
    let mut builtin = b.bridge(vec![]).await;
    let ticket: EndpointTicket = builtin.ticket.parse()?;
    let addr = path_addr(ticket.endpoint_addr(), true);
    first_response(&ep, &addr, &acp, INIT).await?;
    let mut calm = Vec::new();
    for _ in 0..b.plan.setup_reps {
        calm.push(ms(first_response(&ep, &addr, &acp, INIT).await?));
    }
    let pid = builtin.pid();
    let before = rss_kib(pid)?;
    let flood_secs = (b.plan.setup_reps as f64 * 2.0 + 10.0).to_string();
    let mut flood = Command::new(std::env::current_exe()?)
        .args(["flood", &b.relay_url.to_string(), &builtin.ticket, &flood_secs])
        .kill_on_drop(true)
        .spawn()?;
    // Let the flood reach full strength (the gate starts dropping) before measuring.
    let hit_cap = tokio::time::timeout(Duration::from_secs(5), builtin.log.wait_for("dropping connections"))
        .await
        .is_ok();
    eprintln!("bench: flood {} the handshake cap", if hit_cap { "reached" } else { "did not reach" });
    let mut attacked = Vec::new();
    for _ in 0..b.plan.setup_reps {
        attacked.push(ms(first_response(&ep, &addr, &acp, INIT).await?));
    }
    let _ = flood.wait().await;
    let during = rss_kib(pid)?;
    // What the bridge keeps once strangers stop: after the per-remote windows
    // and QUIC's draining periods have passed.
    tokio::time::sleep(FLOOD_SETTLE).await;
    let after = rss_kib(pid)?;
    // An agent spawned now costs what it cost before the flood.
    let spawn_after = ms(first_response(&ep, &addr, &acp, INIT).await?);
    eprintln!("bench: bridge RSS before the flood {before:.0} KiB, at its end {during:.0} KiB, {FLOOD_SETTLE:?} later {after:.0} KiB; a dial after it {spawn_after:.2} ms");
    builtin.terminate().await;
    ep.close().await;
    Ok(vec![
        row(
            "allowed peer dial → first response under flood (relay)",
            "ms",
            attacked,
            "same, no flood",
            calm.clone(),
            false,
        ),
        row_stats("bridge RSS at the end of the flood", "KiB", during, before, false)
            .named_baseline("before the flood"),
        row_stats("bridge RSS after the flood", "KiB", after, before, false)
            .named_baseline("before the flood"),
        row(
            "allowed peer dial → first response after the flood (relay)",
            "ms",
            vec![spawn_after],
            "same, before the flood",
            calm,
            false,
        ),
    ])
}

/// How long after a flood the bridge's memory is read again: iroh forgets an
/// unknown remote after 60 s of silence, and a heartbeat (every 10 s here)
/// then returns the memory.
const FLOOD_SETTLE: Duration = Duration::from_secs(75);

/// ACP-shaped ndjson of about `bytes`: streamed reply chunks with non-ASCII
/// text, tool calls, and a file's content per 64 messages (the big lines that
/// dominate bulk traffic).
fn acp_corpus(bytes: usize) -> Vec<u8> {
    // File text as it travels in JSON: escaped quotes and newlines.
    let file = r#"fn main() { println!(\"héllo, wörld ✓\"); }\n"#.repeat(1500);
    let mut out = Vec::with_capacity(bytes + 128 * 1024);
    let mut i = 0u64;
    while out.len() < bytes {
        let line = match i % 64 {
            0 => format!(r#"{{"jsonrpc":"2.0","id":{i},"result":{{"content":"{file}"}}}}"#),
            n if n % 2 == 0 => format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s-1","update":{{"sessionUpdate":"agent_message_chunk","content":{{"type":"text","text":"Réponse n° {i}: 日本語のテキスト — ok ✓"}}}}}}}}"#
            ),
            _ => format!(
                r#"{{"jsonrpc":"2.0","id":{i},"method":"fs/read_text_file","params":{{"sessionId":"s-1","path":"/home/me/src/lib-{i}.rs","line":1,"limit":200}}}}"#
            ),
        };
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
        i += 1;
    }
    out
}

/// MB/s of `check` over every line of `corpus` (all must pass).
fn check_throughput(corpus: &[u8], check: impl Fn(&[u8]) -> bool) -> f64 {
    let started = Instant::now();
    let (mut ok, mut lines) = (0usize, 0usize);
    for line in corpus.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        ok += usize::from(check(std::hint::black_box(line)));
        lines += 1;
    }
    assert!(lines > 0 && ok == lines, "{ok} of {lines} corpus lines pass the check");
    corpus.len() as f64 / started.elapsed().as_secs_f64() / 1e6
}

/// The line check the bridge runs on every message, in both directions: one
/// valid UTF-8 JSON value, its top-level keys read for an `id`
/// (`jsonrpc::check_line`), against the same check without UTF-8 validation
/// of string contents and without the keys. Alternating rounds, one process.
pub fn check_rows(plan: &Plan) -> Vec<Row> {
    let corpus = acp_corpus(plan.bulk_bytes);
    let (mut with_utf8, mut without) = (Vec::new(), Vec::new());
    for _ in 0..plan.bulk_reps.max(3) {
        with_utf8.push(check_throughput(&corpus, |l| thunderbolt_shared::jsonrpc::check_line(l).is_some()));
        without
            .push(check_throughput(&corpus, |l| serde_json::from_slice::<serde::de::IgnoredAny>(l).is_ok()));
    }
    vec![row(
        &format!("JSON line check over {} MiB of ACP ndjson", plan.bulk_bytes >> 20),
        "MB/s",
        with_utf8,
        "the check without UTF-8",
        without,
        true,
    )]
}

/// Stalled handshakes sent per second during the stall section, and from how
/// many source addresses (127.0.0.2 and up): the attack of the hardening report.
const STALL_RATE: u64 = 20;
const STALL_SOURCES: u8 = 16;

/// Admission under stalled handshakes: real first packets of dials that never
/// continue, replayed from 16 loopback addresses at 20/s, while an allowed
/// peer dials; against the same peer's dials with no attack.
pub async fn stall_rows(b: &Bench, p: &Path) -> Result<Vec<Row>> {
    let acp = Protocol::acp().alpn();
    let mut bridge = b.cat_bridge().await;
    let addr = p.addr_of(&bridge)?;
    let target = *addr.ip_addrs().next().context("the bridge has a direct address")?;
    let line = b"{}\n";
    first_response(&p.ep, &addr, &acp, line).await?;
    let mut calm = Vec::new();
    for _ in 0..b.plan.setup_reps {
        calm.push(ms(first_response(&p.ep, &addr, &acp, line).await?));
    }
    // Enough packets to last the measurement and then some.
    let count = (b.plan.setup_reps as u64 * 2 + 4) * STALL_RATE;
    let initials = thunderbolt_tests::hostile::capture_initials(count as usize, bridge.node_id).await;
    let mut sources = Vec::new();
    for n in 0..STALL_SOURCES {
        sources.push(tokio::net::UdpSocket::bind(std::net::SocketAddr::from(([127, 0, 0, n + 2], 0))).await?);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attack = {
        let stop = stop.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(1000 / STALL_RATE));
            for (i, packet) in initials.iter().enumerate() {
                tick.tick().await;
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let _ = sources[i % sources.len()].send_to(packet, target).await;
            }
        }
    };
    let measure = async {
        // Two seconds of attack first: every slot is taken by then.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut attacked = Vec::new();
        let mut failed = 0usize;
        for _ in 0..b.plan.setup_reps {
            match tokio::time::timeout(WAIT, first_response(&p.ep, &addr, &acp, line)).await {
                Ok(Ok(d)) => attacked.push(ms(d)),
                _ => failed += 1,
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (attacked, failed)
    };
    let ((), (attacked, failed)) = tokio::join!(attack, measure);
    bridge.terminate().await;
    eprintln!("bench: stalled handshakes: {failed} of {} allowed dials failed", b.plan.setup_reps);
    if attacked.is_empty() {
        bail!("every allowed dial failed under stalled handshakes");
    }
    Ok(vec![row(
        &format!("allowed peer dial → first response under stalled handshakes (direct, {failed} failed)"),
        "ms",
        attacked,
        "same, no attack",
        calm,
        false,
    )])
}
