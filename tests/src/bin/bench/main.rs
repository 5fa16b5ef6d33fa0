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
//!
//! `sections` holds one function per section; `peers` the other processes;
//! `measure` what the client does on a connection; `report` the table and JSON.

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

mod measure;
mod peers;
mod report;
mod sections;

use measure::*;
use peers::*;
use report::*;
use sections::*;

/// How much each section measures.
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
