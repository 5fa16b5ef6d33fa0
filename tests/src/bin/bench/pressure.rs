//! The `pressure` section: resumable sessions where they are hardest. Pipelined
//! requests whose replies fill the replay log long before the last request is
//! read (the resumable protocol against the plain one through the same
//! `connect`), and the bridge's memory in the worst cases one allowed peer can
//! make: sessions that never acknowledge against agents that flood, and lines
//! that never end.

use super::*;
use thunderbolt_shared::resume::{resume_alpn, Control};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Size of each pipelined request, and of each reply.
const REQUEST_PAD: usize = 8 * 1024;
const REPLY: usize = 256 * 1024;

/// How long the bridge's RSS must stay flat to count as settled, and the most
/// a case is given to get there.
const SETTLED: Duration = Duration::from_secs(2);
const SETTLE_MAX: Duration = Duration::from_secs(30);

/// `n` pipelined requests through `connect` (resumable unless `--no-resume`
/// is in `extra`): MB/s of replies.
async fn pipelined(client: &Tb, ticket: &str, extra: &[&str], n: usize) -> Result<f64> {
    let c = ConnectProc::spawn(ConnectProc::command(client, ticket, extra))?;
    let (mut child, mut stdout, log) = (c.child, c.stdout, c.log);
    let pad = "r".repeat(REQUEST_PAD);
    let mut stdin = c.stdin;
    let writer = tokio::spawn(async move {
        for i in 0..n {
            let req = format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"big\",\"params\":{{\"pad\":\"{pad}\"}}}}\n"
            );
            stdin.write_all(req.as_bytes()).await?;
        }
        anyhow::Ok(stdin)
    });
    let t0 = Instant::now();
    let mut lines = BufReader::with_capacity(1 << 20, &mut stdout).lines();
    let mut bytes = 0usize;
    for _ in 0..n {
        let line = tokio::time::timeout(WAIT * 4, lines.next_line())
            .await
            .context("replies stopped coming")??
            .context("connect ended early")?;
        bytes += line.len() + 1;
    }
    let secs = t0.elapsed().as_secs_f64();
    drop(writer.await??);
    let status = tokio::time::timeout(WAIT, child.wait()).await??;
    if !status.success() {
        bail!("connect failed: {}", log.text());
    }
    Ok(bytes as f64 / secs / 1e6)
}

/// Peak RSS (KiB) of `pid` since it started.
fn peak_kib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).context("no VmHWM")?;
    Ok(line.split_whitespace().nth(1).context("VmHWM value")?.parse()?)
}

/// Waits until `pid`'s RSS has grown by less than 1 MiB over the last
/// [`SETTLED`] (at most [`SETTLE_MAX`]).
async fn settle(pid: u32) -> Result<()> {
    const STEP: Duration = Duration::from_millis(250);
    let deadline = Instant::now() + SETTLE_MAX;
    let window = (SETTLED.as_millis() / STEP.as_millis()) as usize;
    let mut samples = std::collections::VecDeque::from([rss_kib(pid)?]);
    while Instant::now() < deadline {
        tokio::time::sleep(STEP).await;
        samples.push_back(rss_kib(pid)?);
        if samples.len() > window {
            samples.pop_front();
            if samples.back().unwrap() - samples.front().unwrap() < 1024.0 {
                break;
            }
        }
    }
    Ok(())
}

/// A raw resumable session that never acknowledges and never reads (but
/// keeps its stream open): what a phone does whose app was frozen mid-reply.
async fn silent_session(
    ep: &Endpoint,
    addr: EndpointAddr,
) -> Result<(Connection, iroh::endpoint::SendStream, iroh::endpoint::RecvStream)> {
    let conn = ep.connect(addr, &resume_alpn(&Protocol::acp())).await?;
    let (mut send, recv) = conn.open_bi().await?;
    send.write_all(&Control::Hello { session: None, received: 0 }.encode()).await?;
    Ok((conn, send, recv))
}

/// One worst case: `sessions` silent sessions against a bridge running
/// `agent`, each also sending `line` (bytes of a line that never ends) when
/// given. Peak RSS above idle, per session, in KiB.
async fn worst_case(
    b: &Bench,
    p: &Path,
    agent: &[&str],
    sessions: usize,
    line: Option<usize>,
) -> Result<f64> {
    let mut argv = vec![b.agent.clone()];
    argv.extend(agent.iter().map(|a| a.to_string()));
    let mut bridge = b.bridge_with(&["--max-agents", &sessions.max(16).to_string()], argv, "warn").await;
    let pid = bridge.pid();
    let idle = rss_kib(pid)?;
    let mut held = Vec::new();
    for _ in 0..sessions {
        let (conn, mut send, recv) = silent_session(&p.ep, p.addr_of(&bridge)?).await?;
        if let Some(n) = line {
            let chunk = vec![b'x'; 1 << 20];
            let mut sent = 0;
            send.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"params\":\"").await?;
            // Bounded: the line's size; the bridge's flow control paces it.
            while sent < n {
                let k = chunk.len().min(n - sent);
                tokio::time::timeout(WAIT, send.write_all(&chunk[..k])).await??;
                sent += k;
            }
        }
        held.push((conn, send, recv));
    }
    settle(pid).await?;
    let peak = peak_kib(pid)?;
    eprintln!("bench: pressure {agent:?} ×{sessions} line {line:?}: idle {idle:.0} KiB, peak {peak:.0} KiB");
    for (c, _, _) in held {
        c.close(0u32.into(), b"client closed");
    }
    bridge.terminate().await;
    Ok((peak - idle) / sessions as f64)
}

/// Pipelined requests, r1 against plain; the memory worst cases against the
/// bound docs/performance.md states (replay buffer plus about `--max-frame` per direction).
pub async fn pressure_rows(b: &Bench, p: &Path) -> Result<Vec<Row>> {
    let client = Tb::new(None);
    b.tb.allow(&client.node_id("acp").await).await;
    let mut rows = Vec::new();
    let n = b.plan.pipelined;
    let mut respond =
        b.bridge_with(&[], vec![b.agent.clone(), "respond".into(), REPLY.to_string()], "warn").await;
    let (mut r1, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..b.plan.bulk_reps {
        r1.push(pipelined(&client, &respond.ticket, &[], n).await?);
        plain.push(pipelined(&client, &respond.ticket, &["--no-resume"], n).await?);
    }
    respond.terminate().await;
    let name = format!(
        "{n} pipelined {} KiB requests, {} KiB replies, through connect, resumable",
        REQUEST_PAD >> 10,
        REPLY >> 10
    );
    rows.push(row(&name, "MB/s", r1, "connect --no-resume (plain ALPN)", plain, true));

    // The bound for one session: the replay buffer, plus a frame in each
    // direction (defaults: 32 MiB each).
    let bound = (3 * 32 * 1024) as f64;
    let stream = ["stream", "400000000"];
    let one = worst_case(b, p, &stream, 1, None).await?;
    rows.push(
        row_stats(
            "bridge RSS peak above idle: a never-acking session, flooding agent",
            "KiB",
            one,
            bound,
            false,
        )
        .named_baseline("bound: buffer + 2 × max frame"),
    );
    let many = worst_case(b, p, &stream, 16, None).await?;
    rows.push(
        row_stats("… per session, 16 such sessions at once", "KiB", many, bound, false)
            .named_baseline("bound: buffer + 2 × max frame"),
    );
    let line = worst_case(b, p, &stream, 1, Some(100 << 20)).await?;
    rows.push(
        row_stats("… with a 100 MiB client line that never ends", "KiB", line, bound, false)
            .named_baseline("bound: buffer + 2 × max frame"),
    );
    Ok(rows)
}
