//! The `resume` section: what the resumable protocol (`thunderbolt/<p>/r1`)
//! costs against the plain one, through the same client (`thunderbolt acp
//! connect`, with and without `--no-resume`) in the same run; how long a
//! resume takes once the path is back; what a detached session holds.

use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Outages measured per path: each is a few seconds (the client's idle timeout
/// to notice, then the resume).
const RESUME_REPS: usize = 5;

/// The connect client's idle timeout in the resume measure: the loss is
/// noticed after this; the measure starts when the path is back.
const CLIENT_IDLE: &str = "1";

/// Detached sessions held for the memory row (the bridge's agent cap).
const DETACHED: usize = SESSIONS;

/// A `thunderbolt acp connect` process with piped stdio.
pub struct ConnectProc {
    pub child: tokio::process::Child,
    pub stdin: tokio::process::ChildStdin,
    pub stdout: tokio::process::ChildStdout,
    pub log: Log,
}

impl ConnectProc {
    /// `connect` for `target` as `tb`'s machine.
    pub fn command(tb: &Tb, target: &str, extra: &[&str]) -> tokio::process::Command {
        let mut c = tb.cmd();
        c.env("RUST_LOG", "info").args(["acp", "connect"]).args(extra).arg(target);
        c
    }

    pub async fn start(tb: &Tb, target: &str, extra: &[&str]) -> Result<Self> {
        Self::spawn(Self::command(tb, target, extra))
    }

    /// Starts `c` (a [`ConnectProc::command`], perhaps wrapped) with piped stdio.
    pub fn spawn(mut c: tokio::process::Command) -> Result<Self> {
        c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn()?;
        let log = Log::default();
        log.capture_stderr(child.stderr.take().context("stderr")?);
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        Ok(Self { child, stdin, stdout, log })
    }

    async fn round_trip(&mut self, buf: &mut [u8]) -> Result<Duration> {
        let t0 = Instant::now();
        self.stdin.write_all(SMALL_REQUEST).await?;
        self.stdout.read_exact(buf).await?;
        Ok(t0.elapsed())
    }

    pub async fn round_trips(&mut self, n: usize) -> Result<Vec<f64>> {
        let mut buf = vec![0u8; SMALL_REQUEST.len()];
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.round_trip(&mut buf).await?.as_secs_f64() * 1e6);
        }
        Ok(out)
    }

    /// `total` bytes echoed through this `connect` (MB/s), then its exit awaited.
    pub async fn bulk(mut self, total: usize) -> Result<f64> {
        let mbs = transfer(&mut self.stdin, &mut self.stdout, total).await?;
        self.finish().await?;
        Ok(mbs)
    }

    /// p50 round trip of each of [`ROUND_TRIP_BLOCKS`] blocks of `rtts` in all,
    /// taking turns with `other` (so drift lands on both): `(self's, other's)`.
    pub async fn alternating_p50(&mut self, other: &mut Self, rtts: usize) -> Result<(Vec<f64>, Vec<f64>)> {
        let per = rtts / ROUND_TRIP_BLOCKS;
        let (mut mine, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..ROUND_TRIP_BLOCKS {
            mine.push(percentile(&self.round_trips(per).await?, 0.5));
            theirs.push(percentile(&other.round_trips(per).await?, 0.5));
        }
        Ok((mine, theirs))
    }

    pub async fn finish(mut self) -> Result<()> {
        drop(self.stdin);
        let status = tokio::time::timeout(WAIT, self.child.wait()).await??;
        if !status.success() {
            bail!("connect failed: {}", self.log.text());
        }
        Ok(())
    }
}

/// Two `connect` sessions of `client` open at once (`(target, flags)` each),
/// warmed up, then their p50 round trips in alternating blocks of `rtts` in all.
pub async fn p50_pair(
    client: &Tb,
    a: (&str, &[&str]),
    b: (&str, &[&str]),
    rtts: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut x = ConnectProc::start(client, a.0, a.1).await?;
    let mut y = ConnectProc::start(client, b.0, b.1).await?;
    x.round_trips(ROUND_TRIP_WARMUP).await?;
    y.round_trips(ROUND_TRIP_WARMUP).await?;
    let out = x.alternating_p50(&mut y, rtts).await?;
    x.finish().await?;
    y.finish().await?;
    Ok(out)
}

/// Bulk and round trips through `connect` with and without resume, a resume's
/// time after an outage (direct, and relay when outages can be made), and the
/// bridge's RSS per detached session.
pub async fn resume_rows(b: &Bench) -> Result<Vec<Row>> {
    let client = Tb::new(None);
    b.tb.allow(&client.node_id("acp").await).await;
    let mut rows = Vec::new();
    let mut cat = b.bridge_with(&["--idle-timeout", "2"], vec![b.agent.clone(), "cat".into()], "info").await;

    // Bulk: one session per transfer, r1 and plain taking turns.
    let total = b.plan.bulk_bytes;
    let (mut r1, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..b.plan.bulk_reps {
        for (resume, out) in [(true, &mut r1), (false, &mut plain)] {
            let extra: &[&str] = if resume { &[] } else { &["--no-resume"] };
            out.push(ConnectProc::start(&client, &cat.ticket, extra).await?.bulk(total).await?);
        }
    }
    let name = format!("bulk {} MiB through connect, resumable (direct)", total >> 20);
    rows.push(row(&name, "MB/s", r1, "connect --no-resume (plain ALPN)", plain, true));

    // Round trips: both sessions open, alternating blocks.
    let (a50, p50) =
        p50_pair(&client, (&cat.ticket, &[]), (&cat.ticket, &["--no-resume"]), b.plan.rtts).await?;
    let name = format!(
        "~200 B request/response p50 through connect, resumable (median of {ROUND_TRIP_BLOCKS} blocks)"
    );
    rows.push(row(&name, "µs", a50, "connect --no-resume (plain ALPN)", p50, false));

    cat.terminate().await;

    // Notices: the same round trips with notifications on against off, two
    // bridges at once (two homes), alternating blocks. The worst case: every
    // message the agent writes is a request (the echoed `session/prompt`),
    // so every one is looked at, and with --notify-always each is a notice
    // (the rate limit holds all but a few; the hook is unreachable).
    let off_home = Tb::new(None);
    off_home.allow(&client.node_id("acp").await).await;
    let echo = vec![b.agent.clone(), "cat".into()];
    let relay = b.relay_url.clone();
    let on_flags = ["--notify-always", "--notify-url", "http://127.0.0.1:9/hook"];
    let mut on = b.bridge_in(&b.tb, &relay, &on_flags, echo.clone(), "info").await;
    let mut off = b.bridge_in(&off_home, &relay, &["--no-push"], echo, "info").await;
    let (n50, f50) = p50_pair(&client, (&on.ticket, &[]), (&off.ticket, &[]), b.plan.rtts).await?;
    let name = format!(
        "~200 B request/response p50, notifications on, every reply a notice (median of {ROUND_TRIP_BLOCKS} blocks)"
    );
    rows.push(row(&name, "µs", n50, "--no-push (notifications off)", f50, false));
    on.terminate().await;
    off.terminate().await;

    // What a detached session costs the bridge (a fresh one: nothing freed to reuse).
    let mut cat = b.bridge_with(&["--idle-timeout", "1"], vec![b.agent.clone(), "cat".into()], "info").await;
    let pid = cat.pid();
    let before = rss_kib(pid)?;
    let mut held = Vec::new();
    for _ in 0..DETACHED {
        let mut c = ConnectProc::start(&client, &cat.ticket, &[]).await?;
        c.round_trips(1).await?;
        held.push(c);
    }
    for c in &mut held {
        let _ = c.child.start_kill();
    }
    cat.log.wait_for_count("the agent keeps running", DETACHED).await;
    let after = rss_kib(pid)?;
    eprintln!("bench: bridge RSS {before:.0} KiB, with {DETACHED} detached sessions {after:.0} KiB");
    rows.push(
        row_stats("bridge RSS per detached session", "KiB", (after - before) / DETACHED as f64, 256.0, false)
            .named_baseline("target"),
    );
    cat.terminate().await;

    if !Outage::available() {
        eprintln!("bench: skipping resume times: nftables is not usable here (tests/bench.sh runs as root in a namespace)");
        return Ok(rows);
    }
    // Direct: all UDP to the bridge dropped until the client noticed; then lifted.
    let cat = b.bridge_with(&[], vec![b.agent.clone(), "cat".into()], "info").await;
    let port = banner_port(&cat.banner);
    let mut times = Vec::new();
    let mut c = ConnectProc::start(&client, &cat.ticket, &["--idle-timeout", CLIENT_IDLE]).await?;
    c.round_trips(1).await?;
    let mut buf = vec![0u8; SMALL_REQUEST.len()];
    for n in 1..=RESUME_REPS {
        let outage = Outage::udp_port(port);
        c.stdin.write_all(SMALL_REQUEST).await?;
        c.log.wait_for_count("; reconnecting", n).await;
        let t0 = Instant::now();
        drop(outage);
        c.stdout.read_exact(&mut buf).await?;
        times.push(ms(t0.elapsed()));
    }
    c.finish().await?;
    drop(cat);
    rows.push(
        row("path back → first resumed frame (direct)", "ms", times.clone(), "—", times, false)
            .named_baseline("—"),
    );

    // Relay: a relay of its own, killed and started again on its port; UDP between
    // the client and the bridge dropped throughout, so the relay is the only path.
    // The time includes both ends reconnecting to the relay.
    let (mut relay, url) = start_relay().await?;
    let relay_bind = format!("127.0.0.1:{}", url.port().context("relay port")?);
    let client = Tb::with_relay_url(&url);
    b.tb.allow(&client.node_id("acp").await).await;
    let cat = b.bridge_on(&url, &[], vec![b.agent.clone(), "cat".into()], "info").await;
    let _direct_off = Outage::udp_port(banner_port(&cat.banner));
    let mut times = Vec::new();
    let mut c = ConnectProc::start(&client, &cat.ticket, &["--idle-timeout", CLIENT_IDLE]).await?;
    c.round_trips(1).await?;
    for n in 1..=RESUME_REPS {
        relay.kill().await?;
        c.stdin.write_all(SMALL_REQUEST).await?;
        c.log.wait_for_count("; reconnecting", n).await;
        let t0 = Instant::now();
        relay = start_relay_at(&relay_bind).await?.0;
        c.stdout.read_exact(&mut buf).await?;
        times.push(ms(t0.elapsed()));
    }
    c.finish().await?;
    drop(cat);
    rows.push(
        row("relay back → first resumed frame (relay only)", "ms", times.clone(), "—", times, false)
            .named_baseline("—"),
    );
    Ok(rows)
}

/// `connect` as users run it, against the bench's own client on the same
/// bridge: bulk with `connect`'s stdio, and with a local client it spawns.
pub async fn connect_rows(b: &Bench, p: &Path) -> Result<Vec<Row>> {
    let client = Tb::new(None);
    b.tb.allow(&client.node_id("acp").await).await;
    let mut cat = b.cat_bridge().await;
    let total = b.plan.bulk_bytes;
    // dumbpipe's `connect` on the same agent, taking turns with ours (only in a
    // loopback-only namespace: dumbpipe cannot be kept off its public relays).
    let dumbpipe = dumbpipe_bin().filter(|_| loopback_only());
    let (mut stdio, mut local, mut inproc, mut dp) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // The machine's busy CPU per MB (every process) for the stdio and in-process runs.
    let (mut stdio_cpu, mut inproc_cpu) = (CpuPerMb::default(), CpuPerMb::default());
    let mb = total as f64 / 1e6;
    for _ in 0..b.plan.bulk_reps {
        let proc = ConnectProc::start(&client, &cat.ticket, &["--no-resume"]).await?;
        let cpu0 = MachineCpu::now();
        stdio.push(proc.bulk(total).await?);
        stdio_cpu.add(cpu0, mb);

        let t0 = Instant::now();
        let mut c = client.cmd();
        c.args(["acp", "connect", "--no-resume", &cat.ticket, "--"]);
        c.arg(test_agent_bin()).args(["bulk-client", &total.to_string()]);
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        let out = tokio::time::timeout(WAIT * 4, c.output()).await??;
        if !out.status.success() {
            bail!("connect -- bulk-client failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        local.push(total as f64 / t0.elapsed().as_secs_f64() / 1e6);

        let conn = p.ep.connect(p.addr_of(&cat)?, &Protocol::acp().alpn()).await?;
        let cpu0 = MachineCpu::now();
        inproc.push(bulk(&conn, total).await?);
        inproc_cpu.add(cpu0, mb);
        conn.close(0u32.into(), b"client closed");

        if let Some(bin) = &dumbpipe {
            dp.push(dumbpipe_bulk(bin, total).await?);
        }
    }
    cat.terminate().await;
    let name = format!("bulk {} MiB through connect's stdio (direct)", total >> 20);
    let lname = format!("bulk {} MiB through connect -- local client (direct)", total >> 20);
    let mut rows = vec![
        row(&name, "MB/s", stdio.clone(), "the bench's in-process client, same bridge", inproc.clone(), true),
        row(&lname, "MB/s", local, "the bench's in-process client, same bridge", inproc.clone(), true),
    ];
    // Why the hop costs what it does on a machine whose cores are all busy:
    // the same bytes take this much more CPU, all processes together.
    let what = format!("bulk {} MiB through connect's stdio", total >> 20);
    rows.extend(stdio_cpu.row(&what, "the bench's in-process client, same bridge", inproc_cpu));
    if dumbpipe.is_some() {
        const DP: &str = "dumbpipe connect ⇄ dumbpipe listen, same agent";
        rows.push(row(&name, "MB/s", stdio, DP, dp.clone(), true));
        // What that ratio could be at most: `connect` as fast as the in-process client.
        let ceiling = format!("bulk {} MiB, the bench's in-process client (ceiling)", total >> 20);
        rows.push(row(&ceiling, "MB/s", inproc, DP, dp, true));
    } else {
        eprintln!("bench: no dumbpipe rows for connect (needs dumbpipe and a loopback-only namespace)");
    }
    Ok(rows)
}
