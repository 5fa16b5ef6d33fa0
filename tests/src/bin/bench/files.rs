//! The `files` section: files put and got through the bridge's `/files1`
//! door, driven as a device drives it (`thunderbolt::files::device`), direct
//! and through the local relay, against a raw iroh stream moving the same
//! bytes one way (the echo process's sink and source); and a put cut at half
//! and resumed: the bytes the second run sent against the bytes missing.
//!
//! A put is timed from its request to the bridge's receipt (every group
//! checked and written, the file synced and linked into place); a get from
//! its request to the last group checked. The get fetches the file just put,
//! whose hash tree the bridge kept; a second get (direct) fetches a file the
//! bridge never saw, which it hashes before its first byte. The hash tree a device
//! makes before a put (one read of the file) is not timed: it is the same
//! work whatever carries the bytes.

use std::io::Write;

use thunderbolt::files::{device, stream};
use thunderbolt_shared::files::{files_alpn, Get, Put};

use super::*;

/// Writes `size` bytes of seeded noise to `path`.
fn noise(path: &std::path::Path, size: u64) -> Result<()> {
    let mut fill = noise_source(b"bench files");
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        fill(&mut buf[..n]);
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

/// Bytes that differ from block to block (the hash must see all of them):
/// a counter mixed with xorshift, cheap and good enough for a payload.
fn noise_source(seed: &[u8]) -> impl FnMut(&mut [u8]) {
    let mut x =
        seed.iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100_0000_01b3));
    move |buf: &mut [u8]| {
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }
}

/// `total` bytes one way to the sink; MB/s from the first byte to its count.
async fn raw_up(conn: &Connection, total: u64) -> Result<f64> {
    let (mut send, mut recv) = conn.open_bi().await?;
    let block = vec![7u8; 256 * 1024];
    let t0 = Instant::now();
    let mut left = total;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        send.write_all(&block[..n]).await?;
        left -= n as u64;
    }
    send.finish()?;
    let mut count = [0u8; 8];
    recv.read_exact(&mut count).await?;
    anyhow::ensure!(u64::from_be_bytes(count) == total, "the sink read {}", u64::from_be_bytes(count));
    Ok(total as f64 / t0.elapsed().as_secs_f64() / 1e6)
}

/// `total` bytes one way from the source; MB/s from the request to the last byte.
async fn raw_down(conn: &Connection, total: u64) -> Result<f64> {
    let (mut send, mut recv) = conn.open_bi().await?;
    let t0 = Instant::now();
    send.write_all(&total.to_be_bytes()).await?;
    send.finish()?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0u64;
    while let Some(n) = recv.read(&mut buf).await? {
        got += n as u64;
    }
    anyhow::ensure!(got == total, "the source sent {got}");
    Ok(total as f64 / t0.elapsed().as_secs_f64() / 1e6)
}

pub async fn files_rows(b: &Bench) -> Result<Vec<Row>> {
    let home = Tb::new(None);
    home.allow(&b.client_id()).await;
    let relay = b.relay_url.clone();
    let mut bridge = b.bridge_in(&home, &relay, &[], vec![b.agent.clone(), "cat".into()], "warn").await;
    let (_echo, echo_addr) = start_echo(Some(&relay)).await?;
    let total = b.plan.bulk_bytes as u64;
    let dir = tempfile::tempdir()?;
    let src = dir.path().join("bench.bin");
    noise(&src, total)?;
    let file = std::fs::File::open(&src)?;
    let tree = stream::hash_tree(&file, total)?;
    let put =
        Put { name: "bench.bin".into(), size: total, hash: stream::hex(&tree), session: None, mime: None };
    let ticket: EndpointTicket = bridge.ticket.parse()?;
    // The device's files folder (a put of no session lands there).
    let landed_dir = home.home().join("files/_bridge").join(b.client_id().to_string());
    let mut rows = Vec::new();
    for relay_only in [false, true] {
        let path = if relay_only { "relay" } else { "direct" };
        let ep = client(&relay, b.client_key.clone(), relay_only).await?;
        let conn =
            ep.connect(path_addr(ticket.endpoint_addr(), relay_only), &files_alpn(&Protocol::acp())).await?;
        let sink = ep.connect(path_addr(&echo_addr, relay_only), SINK_ALPN).await?;
        let source = ep.connect(path_addr(&echo_addr, relay_only), SOURCE_ALPN).await?;
        let (mut up, mut raw_u, mut down, mut raw_d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut cold = Vec::new();
        for _ in 0..b.plan.bulk_reps {
            let t0 = Instant::now();
            let sent = device::put(&conn, put.clone(), file.try_clone()?, tree.clone(), None).await?;
            up.push(total as f64 / t0.elapsed().as_secs_f64() / 1e6);
            anyhow::ensure!(sent.resumed_from == 0, "the bridge held the file already");
            raw_u.push(raw_up(&sink, total).await?);

            let out = dir.path().join("back.bin");
            let get = Get { uri: sent.receipt.uri.clone(), hash: None, from: 0 };
            let t0 = Instant::now();
            let got = device::get(&conn, get, |_| std::fs::File::create(&out).map(Some)).await?;
            down.push(total as f64 / t0.elapsed().as_secs_f64() / 1e6);
            anyhow::ensure!(got.header.hash == put.hash, "the file came back with another hash");
            raw_d.push(raw_down(&source, total).await?);
            if !relay_only {
                // A file the bridge never saw (the agent's report, say): it
                // is hashed before its first byte is sent. Written just
                // now, so its tree is never kept and each get hashes it.
                let fresh = landed_dir.join("cold.bin");
                std::fs::copy(&src, &fresh)?;
                let get = Get { uri: thunderbolt::files::file_uri(&fresh), hash: None, from: 0 };
                let t0 = Instant::now();
                device::get(&conn, get, |_| std::fs::File::create(&out).map(Some)).await?;
                cold.push(total as f64 / t0.elapsed().as_secs_f64() / 1e6);
                std::fs::remove_file(&fresh)?;
                std::fs::remove_file(&out)?;
            }
            // The next put starts from nothing again.
            let landed = thunderbolt::files::uri_path(&sent.receipt.uri).context("a file:// URI")?;
            std::fs::remove_file(landed)?;
            let _ = std::fs::remove_file(&out);
        }
        let mib = total >> 20;
        rows.push(row(
            &format!("files put {mib} MiB, {path}: request to receipt"),
            "MB/s",
            up,
            "raw iroh stream, the same bytes one way",
            raw_u,
            true,
        ));
        rows.push(row(
            &format!("files get {mib} MiB, {path}: request to the last group checked"),
            "MB/s",
            down,
            "raw iroh stream, the same bytes one way",
            raw_d.clone(),
            true,
        ));
        if !cold.is_empty() {
            rows.push(row(
                &format!("files get {mib} MiB, {path}, a file the bridge never hashed"),
                "MB/s",
                cold,
                "raw iroh stream, the same bytes one way",
                raw_d,
                true,
            ));
        }
        conn.close(0u32.into(), b"");
        ep.close().await;
    }

    // Cut at half the encoding, then run again: what crosses the second time.
    let ep = client(&relay, b.client_key.clone(), false).await?;
    let conn = ep.connect(path_addr(ticket.endpoint_addr(), false), &files_alpn(&Protocol::acp())).await?;
    let cut = device::put(&conn, put.clone(), file.try_clone()?, tree.clone(), Some(total / 2)).await;
    anyhow::ensure!(cut.is_err(), "the cut put arrived whole");
    // The path is cut once the bridge holds what was sent (bytes still in
    // this side's buffers when a connection closes never left it).
    let partial =
        home.home().join("files/_bridge").join(b.client_id().to_string()).join(".partial").join(&put.hash);
    let held = async {
        while std::fs::metadata(&partial).map_or(0, |m| m.len()) < total / 2 - total / 8 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let _ = tokio::time::timeout(WAIT, held).await;
    conn.close(0u32.into(), b"");
    let conn = ep.connect(path_addr(ticket.endpoint_addr(), false), &files_alpn(&Protocol::acp())).await?;
    let again = device::put(&conn, put.clone(), file.try_clone()?, tree.clone(), None).await?;
    let missing = total - again.resumed_from;
    rows.push(
        row_stats(
            &format!(
                "files put {} MiB cut at 50 % and run again: MB sent (resumed from {:.1} %)",
                total >> 20,
                again.resumed_from as f64 * 100.0 / total as f64
            ),
            "MB",
            again.sent as f64 / 1e6,
            missing as f64 / 1e6,
            false,
        )
        .named_baseline("MB missing"),
    );
    conn.close(0u32.into(), b"");
    ep.close().await;
    bridge.terminate().await;
    Ok(rows)
}
