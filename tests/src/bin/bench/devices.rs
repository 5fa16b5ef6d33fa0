//! The `devices` section: one agent's session carried by 1, 2 and 4 devices
//! at once (the controller and observers, each its own `connect`): the
//! aggregate throughput delivered, the controller's ~200 B p50 with three
//! observers against the same session alone, and the bridge's memory per
//! attached device and for the session's history.

use super::*;
use tokio::io::AsyncReadExt;

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
async fn close_all(observers: Vec<(ConnectProc, tokio::task::JoinHandle<usize>)>) {
    for (mut o, sink) in observers {
        drop(o.stdin);
        let _ = tokio::time::timeout(WAIT, o.child.wait()).await;
        sink.abort();
    }
}

/// A stdout of a process that ended (a placeholder once the real one is taken).
fn dummy_stdout() -> Result<tokio::process::ChildStdout> {
    let mut c = tokio::process::Command::new("true");
    c.stdout(Stdio::piped());
    let mut child = c.spawn()?;
    child.stdout.take().context("stdout")
}

/// The session this client's `connect` started (the only one it may see).
async fn session_id(client: &Tb, ticket: &str) -> Result<String> {
    let out = client.run(&["sessions", ticket, "--json"]).await;
    if !out.status.success() {
        bail!("sessions: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(v["sessions"][0]["id"].as_str().context("a session")?.to_string())
}

pub async fn devices_rows(b: &Bench) -> Result<Vec<Row>> {
    let client = Tb::new(None);
    b.tb.allow(&client.node_id("acp").await).await;
    let relay = b.relay_url.clone();
    let mut bridge = b.bridge_in(&b.tb, &relay, &[], vec![b.agent.clone(), "cat".into()], "info").await;
    let ticket = bridge.ticket.clone();
    let total = b.plan.bulk_bytes;
    let mut rows = Vec::new();

    // Aggregate throughput: the controller's bulk echo, every observer receiving the same bytes.
    let mut single = Vec::new();
    for devices in DEVICE_COUNTS {
        let mut runs = Vec::new();
        for _ in 0..b.plan.bulk_reps {
            let mut c = ConnectProc::start(&client, &ticket, &[]).await?;
            c.round_trips(1).await?;
            let id = session_id(&client, &ticket).await?;
            let mut observers = Vec::new();
            for _ in 1..devices {
                observers.push(observer(&client, &ticket, &id).await?);
            }
            let mbs = c.bulk(total).await?;
            close_all(observers).await;
            runs.push(mbs * devices as f64);
        }
        if devices == 1 {
            single = runs.clone();
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

    // The controller's p50, alone and with three observers attached, in alternating blocks.
    let mut c = ConnectProc::start(&client, &ticket, &[]).await?;
    c.round_trips(ROUND_TRIP_WARMUP).await?;
    let id = session_id(&client, &ticket).await?;
    let per = b.plan.rtts / ROUND_TRIP_BLOCKS;
    let rss_one = rss_kib(bridge.pid())?;
    let (mut alone, mut watched) = (Vec::new(), Vec::new());
    let mut rss_four: f64 = 0.0;
    for _ in 0..ROUND_TRIP_BLOCKS {
        alone.push(percentile(&c.round_trips(per).await?, 0.5));
        let mut observers = Vec::new();
        for _ in 0..3 {
            observers.push(observer(&client, &ticket, &id).await?);
        }
        c.round_trips(ROUND_TRIP_WARMUP).await?;
        watched.push(percentile(&c.round_trips(per).await?, 0.5));
        rss_four = rss_four.max(rss_kib(bridge.pid())?);
        close_all(observers).await;
    }
    rows.push(row(
        &format!("~200 B request/response p50 of the controller, three observers attached (median of {ROUND_TRIP_BLOCKS} blocks)"),
        "µs",
        watched,
        "the same session, one device",
        alone,
        false,
    ));
    rows.push(row(
        "bridge RSS per attached observer (3 attached, idle)",
        "KiB",
        vec![((rss_four - rss_one) / 3.0).max(0.0)],
        "target",
        vec![256.0],
        false,
    ));
    // The history: a session that streamed well past it, all acknowledged,
    // against one that streamed nothing.
    let before = rss_kib(bridge.pid())?;
    let fresh = ConnectProc::start(&client, &ticket, &[]).await?;
    let mut streamed = ConnectProc::start(&client, &ticket, &[]).await?;
    streamed.round_trips(1).await?;
    let block = vec![b'x'; 1 << 20];
    let mut line = Vec::with_capacity(block.len() + 32);
    line.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":\"n\",\"params\":\"");
    line.extend_from_slice(&block[..(64 << 10)]);
    line.extend_from_slice(b"\"}\n");
    let mut echo = vec![0u8; line.len()];
    for _ in 0..64 {
        use tokio::io::AsyncWriteExt;
        streamed.stdin.write_all(&line).await?;
        streamed.stdout.read_exact(&mut echo).await?;
    }
    let after = rss_kib(bridge.pid())?;
    rows.push(row(
        &format!(
            "bridge RSS of a session whose history is full ({} KiB bound), less an empty session's",
            SESSION_HISTORY_KIB
        ),
        "KiB",
        vec![(after - before).max(0.0)],
        "the bound",
        vec![SESSION_HISTORY_KIB as f64],
        false,
    ));
    streamed.finish().await?;
    fresh.finish().await?;
    c.finish().await?;
    bridge.terminate().await;
    Ok(rows)
}

/// `SESSION_HISTORY` in KiB (the bridge's constant).
const SESSION_HISTORY_KIB: usize = 1024;
