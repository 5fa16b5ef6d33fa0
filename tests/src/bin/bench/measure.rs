//! What the measuring client does on a connection: first response, bulk
//! transfer, round trips, many sessions.

use super::*;

/// Bytes per ndjson line in bulk transfers: a JSON string of this size, like a
/// large tool result.
pub const BULK_LINE: usize = 16 * 1024;

/// Concurrent sessions in the many-sessions and memory measures: the bridge's agent cap.
pub const SESSIONS: usize = 16;

/// A ~200-byte JSON-RPC request, as a small ACP message would be.
pub const SMALL_REQUEST: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"session/prompt\",\"params\":{\"sessionId\":\"sess-1\",\"prompt\":[{\"type\":\"text\",\"text\":\"What does this function do? Please explain briefly, with an example.\"}]}}\n";

/// The whole machine's CPU time since boot, from `/proc/stat` (every core,
/// every process, the kernel's work for them included): what a transfer
/// costs all its processes together, and how much the hypervisor took.
#[derive(Clone, Copy)]
pub struct MachineCpu {
    busy: u64,
    steal: u64,
    total: u64,
}

impl MachineCpu {
    pub fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal ...
        let (busy, steal) = (v.first()? + v.get(1)? + v.get(2)? + v.get(5)? + v.get(6)?, *v.get(7)?);
        Some(Self { busy, steal, total: v.iter().take(8).sum() })
    }

    /// Busy CPU milliseconds per MB carried since `start`, and the share of
    /// the machine's time the hypervisor stole meanwhile.
    pub fn per_mb_since(start: Option<Self>, mb: f64) -> Option<(f64, f64)> {
        let (a, b) = (start?, Self::now()?);
        let busy_ms = (b.busy - a.busy) as f64 * tick_ms();
        let steal = (b.steal - a.steal) as f64 / (b.total - a.total).max(1) as f64;
        Some((busy_ms / mb, steal))
    }
}

/// CPU milliseconds (user and system) one process has used so far, from
/// `/proc/<pid>/stat`: where a transfer's CPU went, process by process.
pub fn process_cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name in parentheses may hold spaces: the fields counted from after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let v: Vec<&str> = rest.split_whitespace().collect();
    // state ppid ... utime (14th field of the line, 12th after the name) stime.
    let (utime, stime): (u64, u64) = (v.get(11)?.parse().ok()?, v.get(12)?.parse().ok()?);
    Some((utime + stime) as f64 * tick_ms())
}

/// Milliseconds in one clock tick, the unit of `/proc`'s CPU times.
fn tick_ms() -> f64 {
    // SAFETY: sysconf has no preconditions.
    1000.0 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64
}

/// Busy CPU per MB of repeated transfers of one kind, and the most the
/// hypervisor stole during any of them.
#[derive(Default)]
pub struct CpuPerMb {
    pub ms: Vec<f64>,
    pub steal: f64,
}

impl CpuPerMb {
    /// One transfer of `mb` that started at `start`.
    pub fn add(&mut self, start: Option<MachineCpu>, mb: f64) {
        if let Some((ms, steal)) = MachineCpu::per_mb_since(start, mb) {
            self.ms.push(ms);
            self.steal = self.steal.max(steal);
        }
    }

    /// A row of `self` against `baseline` (lower is better), named `what`
    /// with the steal both saw; `None` when either has no figure.
    pub fn row(self, what: &str, baseline_name: &str, baseline: CpuPerMb) -> Option<Row> {
        if self.ms.is_empty() || baseline.ms.is_empty() {
            return None;
        }
        let steal = self.steal.max(baseline.steal) * 100.0;
        let name = format!("CPU ms per MB, every process: {what} (hypervisor took up to {steal:.0} %)");
        Some(row(&name, "ms/MB", self.ms, baseline_name, baseline.ms, false))
    }
}

/// Dial → open stream → send one request line → first byte of the answer.
pub async fn first_response(
    ep: &Endpoint,
    addr: &EndpointAddr,
    alpn: &[u8],
    line: &[u8],
) -> Result<Duration> {
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
pub fn bulk_block() -> Vec<u8> {
    let mut line = vec![b'a'; BULK_LINE];
    line[0] = b'"';
    line[BULK_LINE - 2] = b'"';
    line[BULK_LINE - 1] = b'\n';
    line.iter().copied().cycle().take(BULK_LINE * 64).collect()
}

/// Writes `total` bytes of ndjson to `w` while reading as many back from `r`;
/// returns MB/s (10^6 bytes per second of payload carried each way).
pub async fn transfer<W, R>(w: W, r: R, total: usize) -> Result<f64>
where
    W: tokio::io::AsyncWrite + Unpin,
    R: tokio::io::AsyncRead + Unpin,
{
    transfer_block(w, r, &bulk_block(), total).await
}

/// [`transfer`] of `block` (whole ndjson lines) over and over.
pub async fn transfer_block<W, R>(w: W, r: R, block: &[u8], total: usize) -> Result<f64>
where
    W: tokio::io::AsyncWrite + Unpin,
    R: tokio::io::AsyncRead + Unpin,
{
    Ok(transfer_block_timed(w, r, block, total).await?.0)
}

/// Longest a transfer's reader waits for its next bytes before the transfer
/// fails: the longest wait a healthy one shows here is tens of milliseconds,
/// and a path that lost the data (a line the bridge refused, a hung peer)
/// would otherwise hang the whole bench.
const TRANSFER_STALL: Duration = Duration::from_secs(60);

/// [`transfer_block`], and the longest the reader waited for its next bytes
/// once the first had come (a stall anywhere on the way shows there).
pub async fn transfer_block_timed<W, R>(
    mut w: W,
    mut r: R,
    block: &[u8],
    total: usize,
) -> Result<(f64, Duration)>
where
    W: tokio::io::AsyncWrite + Unpin,
    R: tokio::io::AsyncRead + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t0 = Instant::now();
    let writer = async {
        write_blocks(&mut w, block, total).await?;
        w.shutdown().await?;
        anyhow::Ok(())
    };
    let reader = async {
        let mut got = 0usize;
        let mut buf = vec![0u8; 256 * 1024];
        let (mut last, mut longest) = (None::<Instant>, Duration::ZERO);
        while got < total {
            let Ok(n) = tokio::time::timeout(TRANSFER_STALL, r.read(&mut buf)).await else {
                bail!("nothing came back for {TRANSFER_STALL:?} after {got} of {total} bytes");
            };
            let n = n?;
            if n == 0 {
                bail!("stream ended after {got} of {total} bytes");
            }
            got += n;
            let now = Instant::now();
            if let Some(last) = last {
                longest = longest.max(now - last);
            }
            last = Some(now);
        }
        anyhow::Ok(longest)
    };
    let ((), longest) = tokio::try_join!(writer, reader)?;
    Ok((total as f64 / t0.elapsed().as_secs_f64() / 1e6, longest))
}

/// Bulk ndjson over a new stream of `conn`.
pub async fn bulk(conn: &Connection, total: usize) -> Result<f64> {
    let (send, recv) = conn.open_bi().await?;
    transfer(send, recv, total).await
}

/// Writes `total` bytes of `block` over and over (the last one cut short).
async fn write_blocks<W: tokio::io::AsyncWrite + Unpin>(w: &mut W, block: &[u8], total: usize) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut sent = 0;
    while sent < total {
        let n = block.len().min(total - sent);
        w.write_all(&block[..n]).await?;
        sent += n;
    }
    Ok(())
}

/// `total` bytes of ndjson to an agent that answers one line once it has them
/// all (`test-agent count`); MB/s from the first write to that answer.
pub async fn upload(conn: &Connection, total: usize) -> Result<f64> {
    let (mut send, mut recv) = conn.open_bi().await?;
    let block = bulk_block();
    let t0 = Instant::now();
    write_blocks(&mut send, &block, total).await?;
    let mut b = [0u8; 1];
    recv.read_exact(&mut b).await.context("the count agent's answer")?;
    Ok(total as f64 / t0.elapsed().as_secs_f64() / 1e6)
}

/// What an agent streams (`test-agent stream`), `total` bytes of it; MB/s from
/// its first chunk (not counted) to the last byte.
pub async fn download(conn: &Connection, total: usize) -> Result<f64> {
    let (mut send, mut recv) = conn.open_bi().await?;
    // The bridge opens the agent's session on the client's first bytes.
    send.write_all(b"\n").await?;
    let mut buf = vec![0u8; 256 * 1024];
    let first = recv.read(&mut buf).await?.context("the stream agent sent nothing")?;
    let t0 = Instant::now();
    let mut got = first;
    while got < total {
        got += recv
            .read(&mut buf)
            .await?
            .with_context(|| format!("stream ended after {got} of {total} bytes"))?;
    }
    Ok((got - first) as f64 / t0.elapsed().as_secs_f64() / 1e6)
}

/// Opens the stream round trips run on (one session: the bridge serves one
/// stream per connection) and the buffer answers are read into.
pub async fn round_trip_stream(
    conn: &Connection,
) -> Result<(Vec<u8>, iroh::endpoint::SendStream, iroh::endpoint::RecvStream)> {
    let (send, recv) = conn.open_bi().await?;
    Ok((vec![0u8; SMALL_REQUEST.len()], send, recv))
}

/// `n` sequential round trips of [`SMALL_REQUEST`]; the latency of each in microseconds.
pub async fn round_trips(
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

/// `SESSIONS` connections streaming at once; returns (aggregate MB/s, slowest/fastest).
pub async fn many_sessions(
    ep: &Endpoint,
    addr: &EndpointAddr,
    alpn: &[u8],
    per: usize,
) -> Result<(f64, f64)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// This thread's CPU time, from the kernel's own clock (not /proc).
    fn thread_cpu() -> Duration {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid clock id and a timespec to write into.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    /// A process's own CPU time grows by what it spends (the clock's grain is
    /// a tick, 10 ms): spinning for 200 ms of CPU shows at least 100 of it.
    /// The spin is measured in CPU time, not wall time: on a busy machine 200
    /// ms of wall time may hold 90 ms of CPU.
    #[test]
    fn a_process_cpu_time_is_read_from_proc() {
        let pid = std::process::id();
        let before = process_cpu_ms(pid).expect("our own /proc entry");
        let (t0, cpu0) = (std::time::Instant::now(), thread_cpu());
        let mut x = 0u64;
        // Bounded: a starved machine gives up after a minute (and fails below).
        while thread_cpu() - cpu0 < Duration::from_millis(200) && t0.elapsed() < Duration::from_secs(60) {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        let after = process_cpu_ms(pid).unwrap();
        assert!(after - before >= 100.0, "{before} ms, then {after} ms after spinning 200 ms");
        assert!(process_cpu_ms(u32::MAX).is_none(), "no such process");
    }
}
