//! The `devices` section: one agent's session carried by 1, 2 and 4 devices
//! at once (the controller and observers, each its own `connect`): the
//! aggregate throughput delivered, the controller's ~200 B p50 with three
//! observers against the same session alone, and the bridge's memory per
//! attached device and for the session's history.

use super::*;
use tokio::io::AsyncReadExt;

/// Observers attached for the memory row (a session's cap is 8 devices).
const MEMORY_OBSERVERS: usize = 7;

/// Devices the aggregate is measured with.
const DEVICE_COUNTS: [usize; 3] = [1, 2, 4];

/// An observer `connect` of the session `id`, its output read and thrown away
/// (as a device that keeps up would); counts what it received.
async fn observer(
    client: &Tb,
    ticket: &str,
    id: &str,
) -> Result<(ConnectProc, tokio::task::JoinHandle<usize>)> {
    let mut o =
        ConnectProc::start(client, ticket, &["--attach", id, "--observe", "--history", "now"]).await?;
    let mut out = std::mem::replace(&mut o.stdout, dummy_stdout()?);
    let sink = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut n = 0;
        while let Ok(k) = out.read(&mut buf).await {
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    });
    // Joined once the bridge says so (its role is its first frame).
    o.log.wait_for("this device observes the session").await;
    Ok((o, sink))
}

/// Observers leave, one after the other (each its input's end): the session
/// goes on with the others, and ends with the last when the controller left.
/// The bytes each received (an observer that fell behind gets less than the
/// controller: the agent does not wait for it).
async fn close_all(observers: Vec<(ConnectProc, tokio::task::JoinHandle<usize>)>) -> Vec<usize> {
    let mut got = Vec::new();
    for (mut o, sink) in observers {
        drop(o.stdin);
        let _ = tokio::time::timeout(WAIT, o.child.wait()).await;
        // Its stdout ends with it: what it wrote is all counted.
        match tokio::time::timeout(WAIT, sink).await {
            Ok(Ok(n)) => got.push(n),
            _ => got.push(0),
        }
    }
    got
}

/// The controller's p50 per block alone, and with three observers attached.
async fn controller_p50(
    watchers: &[Tb],
    ticket: &str,
    id: &str,
    c: &mut ConnectProc,
    rtts: usize,
    niced: bool,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let per = rtts / ROUND_TRIP_BLOCKS;
    let (mut alone, mut watched) = (Vec::new(), Vec::new());
    for _ in 0..ROUND_TRIP_BLOCKS {
        alone.push(percentile(&c.round_trips(per).await?, 0.5));
        let mut observers = Vec::new();
        for w in watchers.iter().take(3) {
            let o = observer(w, ticket, id).await?;
            if niced {
                if let Some(pid) = o.0.child.id() {
                    // SAFETY: plain syscall on our own child.
                    unsafe { libc::setpriority(libc::PRIO_PROCESS, pid, 19) };
                }
            }
            observers.push(o);
        }
        c.round_trips(ROUND_TRIP_WARMUP).await?;
        watched.push(percentile(&c.round_trips(per).await?, 0.5));
        close_all(observers).await;
    }
    Ok((alone, watched))
}

/// A stdout of a process that ended (a placeholder once the real one is taken).
pub fn dummy_stdout() -> Result<tokio::process::ChildStdout> {
    let mut c = tokio::process::Command::new("true");
    c.stdout(Stdio::piped());
    let mut child = c.spawn()?;
    child.stdout.take().context("stdout")
}

/// The newest session this client's `connect` started (the listing also
/// shows those of the owner's other devices).
async fn session_id(client: &Tb, ticket: &str) -> Result<String> {
    let out = client.run(&["sessions", ticket, "--json"]).await;
    if !out.status.success() {
        bail!("sessions: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let me = client.node_id("acp").await.to_string();
    let mut mine = v["sessions"]
        .as_array()
        .context("a listing")?
        .iter()
        .filter(|s| s["startedBy"]["node"] == me.as_str());
    Ok(mine.next_back().and_then(|s| s["id"].as_str()).context("a session")?.to_string())
}

/// Devices of the owner's own, each paired with a one-time code (a device
/// holds at most 3 seats on one session: every observer is a device of its own).
async fn own_devices(b: &Bench, ticket: &str, n: usize) -> Result<Vec<Tb>> {
    let mut devices = Vec::new();
    for i in 0..n {
        let d = Tb::new(None);
        let out = b.tb.run(&["iroh", "pair", "--json"]).await;
        if !out.status.success() {
            bail!("iroh pair: {}", String::from_utf8_lossy(&out.stderr));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let code = v["code"].as_str().context("a pairing code")?;
        let name = format!("device {i}");
        let out = d.run(&["acp", "connect", "--pair", code, "--device-name", &name, ticket]).await;
        if !out.status.success() {
            bail!("connect --pair: {}", String::from_utf8_lossy(&out.stderr));
        }
        devices.push(d);
    }
    Ok(devices)
}

pub async fn devices_rows(b: &Bench) -> Result<Vec<Row>> {
    let relay = b.relay_url.clone();
    let mut bridge = b.bridge_in(&b.tb, &relay, &[], vec![b.agent.clone(), "cat".into()], "info").await;
    let ticket = bridge.ticket.clone();
    // The controller, and an observer device each.
    let devices = own_devices(b, &ticket, MEMORY_OBSERVERS + 1).await?;
    let (client, watchers) = (&devices[0], &devices[1..]);
    let total = b.plan.bulk_bytes;
    let mut rows = Vec::new();

    // Memory first, on the fresh bridge (later, freed transfer buffers hide growth):
    // observers attached to an idle session, then a session's history filled.
    {
        let c = ConnectProc::start(client, &ticket, &[]).await?;
        let mut c = c;
        c.round_trips(ROUND_TRIP_WARMUP).await?;
        let id = session_id(client, &ticket).await?;
        let idle = rss_kib(bridge.pid())?;
        let mut observers = Vec::new();
        for w in watchers.iter().take(MEMORY_OBSERVERS) {
            observers.push(observer(w, &ticket, &id).await?);
        }
        c.round_trips(ROUND_TRIP_WARMUP).await?;
        let attached = rss_kib(bridge.pid())?;
        rows.push(row(
            &format!("bridge RSS per attached observer ({MEMORY_OBSERVERS} attached to an idle session)"),
            "KiB",
            vec![(attached - idle) / MEMORY_OBSERVERS as f64],
            "target",
            vec![256.0],
            false,
        ));
        close_all(observers).await;
        // The history: 4 MiB through the session (all acknowledged): what stays is
        // the history (1 MiB at most), plus what the allocator kept of the rest.
        let before = rss_kib(bridge.pid())?;
        let before_settled = lowest_rss_over(bridge.pid(), ALLOCATOR_DECAY).await?;
        let mut line = Vec::with_capacity((64 << 10) + 64);
        line.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":\"n\",\"params\":\"");
        line.extend(std::iter::repeat_n(b'x', 64 << 10));
        line.extend_from_slice(b"\"}\n");
        let mut echo = vec![0u8; line.len()];
        for _ in 0..64 {
            use tokio::io::AsyncWriteExt;
            c.stdin.write_all(&line).await?;
            c.stdout.read_exact(&mut echo).await?;
        }
        let after = rss_kib(bridge.pid())?;
        rows.push(row(
            &format!("bridge RSS growth of a session after 4 MiB of output (its history bound: {SESSION_HISTORY_KIB} KiB)"),
            "KiB",
            vec![after - before],
            "the bound",
            vec![SESSION_HISTORY_KIB as f64],
            false,
        ));
        // What the session keeps, not what the allocator has yet to hand back:
        // the lowest RSS over jemalloc's decay (freed pages go back within it),
        // before and after.
        let settled = lowest_rss_over(bridge.pid(), ALLOCATOR_DECAY).await?;
        rows.push(row(
            &format!(
                "the same, once the allocator has returned freed pages (lowest RSS over {}s)",
                ALLOCATOR_DECAY.as_secs()
            ),
            "KiB",
            vec![settled - before_settled],
            "the bound",
            vec![SESSION_HISTORY_KIB as f64],
            false,
        ));
        c.finish().await?;
    }

    // Aggregate throughput: the controller's bulk echo, every observer receiving the same bytes.
    let mut single = Vec::new();
    let mut single_cpu = Vec::new();
    for devices in DEVICE_COUNTS {
        let mut runs = Vec::new();
        // CPU seconds of the bridge (its agent's not counted) and of each
        // observer's connect, per run: on two cores they share the machine.
        let (mut bridge_cpu, mut observer_cpu) = (Vec::new(), Vec::new());
        for _ in 0..b.plan.bulk_reps {
            let mut c = ConnectProc::start(client, &ticket, &[]).await?;
            c.round_trips(1).await?;
            let id = session_id(client, &ticket).await?;
            let mut observers = Vec::new();
            for w in watchers.iter().take(devices - 1) {
                observers.push(observer(w, &ticket, &id).await?);
            }
            let pids: Vec<u32> = observers.iter().filter_map(|(o, _)| o.child.id()).collect();
            let observers_cpu = || pids.iter().map(|p| cpu_secs(*p)).sum::<Result<f64>>();
            let before = (cpu_secs(bridge.pid())?, observers_cpu()?);
            let mbs = c.bulk(total).await?;
            // The controller's connect has ended with its transfer (its CPU is not read).
            let after = (cpu_secs(bridge.pid())?, observers_cpu()?);
            bridge_cpu.push(after.0 - before.0);
            if !pids.is_empty() {
                observer_cpu.push((after.1 - before.1) / pids.len() as f64);
            }
            // What was delivered: the controller's echo and what each observer got.
            let observed: usize = close_all(observers).await.iter().sum();
            runs.push(mbs * (1.0 + observed as f64 / total as f64));
        }
        if devices == 1 {
            single = runs.clone();
            single_cpu = bridge_cpu.clone();
        }
        let streaming = format!("streaming {} MiB to {devices} device(s)", total >> 20);
        let bridge_row = format!("bridge CPU (its agent's not counted) {streaming}");
        rows.push(row(&bridge_row, "s", bridge_cpu.clone(), "one device", single_cpu.clone(), false));
        if !observer_cpu.is_empty() {
            let observer_row = format!("each observer's connect CPU {streaming}");
            rows.push(row(&observer_row, "s", observer_cpu, "the bridge's", bridge_cpu, false));
        }
        rows.push(row(
            &format!(
                "aggregate delivered, one agent streaming {} MiB to {devices} device(s) (direct)",
                total >> 20
            ),
            "MB/s",
            runs,
            "one device",
            single.clone(),
            true,
        ));
    }

    // The controller's p50, alone and with three observers attached, in alternating
    // blocks: the observers as they are, then niced (as if on machines of their own:
    // on 2 cores their processes otherwise take the CPU the controller waits for).
    let mut c = ConnectProc::start(client, &ticket, &[]).await?;
    c.round_trips(ROUND_TRIP_WARMUP).await?;
    let id = session_id(client, &ticket).await?;
    for niced in [false, true] {
        let (alone, watched) = controller_p50(watchers, &ticket, &id, &mut c, b.plan.rtts, niced).await?;
        rows.push(row(
            &format!(
                "~200 B request/response p50 of the controller, three observers attached{} (median of {ROUND_TRIP_BLOCKS} blocks)",
                if niced { ", their processes niced" } else { "" }
            ),
            "µs",
            watched,
            "the same session, one device",
            alone,
            false,
        ));
    }
    c.finish().await?;
    bridge.terminate().await;
    Ok(rows)
}

/// `SESSION_HISTORY` in KiB (the bridge's constant).
const SESSION_HISTORY_KIB: usize = 1024;

/// How long freed memory may stay resident in the bridge: its jemalloc's
/// `dirty_decay_ms` (1 s, `JEMALLOC_OPTIONS` in the bridge's `main.rs`),
/// after which a background thread returns it, and as long again for that
/// thread's own wake-ups.
const ALLOCATOR_DECAY: Duration = Duration::from_secs(3);

/// How often [`lowest_rss_over`] reads the RSS.
const RSS_POLL: Duration = Duration::from_millis(250);

/// The lowest resident set of `pid` seen over `span`, in KiB.
async fn lowest_rss_over(pid: u32, span: Duration) -> Result<f64> {
    let end = Instant::now() + span;
    let mut lowest = rss_kib(pid)?;
    while Instant::now() < end {
        tokio::time::sleep(RSS_POLL).await;
        lowest = lowest.min(rss_kib(pid)?);
    }
    Ok(lowest)
}

/// CPU seconds (user and system) process `pid` has used so far.
fn cpu_secs(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // After the command's name in parentheses (which may hold spaces): fields
    // 14 and 15 of proc(5), utime and stime, are the 12th and 13th.
    let rest = stat.rsplit_once(')').context("a stat line")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 =
        f.get(11).context("utime")?.parse::<f64>()? + f.get(12).context("stime")?.parse::<f64>()?;
    // SAFETY: a plain libc query.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}
