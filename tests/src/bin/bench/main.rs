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

mod devices;
mod duplex;
mod failover;
mod files;
mod host;
mod measure;
mod nat;
mod peers;
mod placement;
mod pressure;
mod report;
mod restart;
mod resume;
mod sections;

use devices::*;
use duplex::*;
use failover::*;
use files::*;
use host::*;
use measure::*;
use nat::*;
use peers::*;
use pressure::*;
use report::*;
use restart::*;
use resume::*;
use sections::*;

/// How much each section measures.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    setup_reps: usize,
    pub bulk_bytes: usize,
    pub bulk_reps: usize,
    /// Sequential request/response round trips per measurement.
    pub rtts: usize,
    /// Bytes each of the 16 concurrent sessions streams.
    per_session_bytes: usize,
    /// Requests in the pipelined pressure measure.
    pub pipelined: usize,
    /// Bytes per full-duplex transfer through `connect` (the `duplex` section).
    pub duplex_bytes: usize,
}

/// `--quick`: about a minute on two cores.
const QUICK: Plan = Plan {
    setup_reps: 10,
    bulk_bytes: 64 << 20,
    bulk_reps: 3,
    rtts: 2000,
    per_session_bytes: 4 << 20,
    pipelined: 1000,
    duplex_bytes: 256 << 20,
};

/// Tiny sizes, for the test that keeps the harness itself working (not a measurement).
const SMOKE: Plan = Plan {
    setup_reps: 2,
    bulk_bytes: 1 << 20,
    bulk_reps: 1,
    rtts: 200,
    per_session_bytes: 256 << 10,
    pipelined: 50,
    duplex_bytes: 1 << 20,
};

/// The default: the figures docs/performance.md quotes (about two and a half minutes).
const FULL: Plan = Plan {
    setup_reps: 30,
    bulk_bytes: 256 << 20,
    bulk_reps: 5,
    rtts: 10_000,
    per_session_bytes: 16 << 20,
    pipelined: 1000,
    duplex_bytes: 512 << 20,
};

/// The parts of a run, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Section {
    /// Dial → first response, direct and relay.
    Setup,
    /// 256 MiB through a cat agent, direct and relay.
    Bulk,
    /// The same transfer through dumbpipe (needs it installed and a loopback-only namespace).
    Dumbpipe,
    /// ~200 B request/response round trips.
    Small,
    /// 16 sessions streaming at once.
    Many,
    /// Bridge RSS idle and per idle session.
    Memory,
    /// An allowed peer's setup while fresh identities flood the bridge.
    Flood,
    /// The per-line JSON check (valid UTF-8 JSON) against the check without UTF-8, in-process.
    Check,
    /// An allowed peer's setup while 16 addresses send stalled handshakes (direct).
    Stall,
    /// The resumable protocol against the plain one through `connect`; resume time; detached RSS.
    Resume,
    /// `connect` (stdio, and with a local client) against the bench's own client and
    /// dumbpipe's `connect` (when installed, in a loopback-only namespace).
    Connect,
    /// Two NATs: time until the path is direct; direct against the relay (needs root).
    Nat,
    /// Pipelined requests with large replies, resumable against plain; the bridge's
    /// memory in the worst cases one allowed peer can make.
    Pressure,
    /// `thunderbolt host`: idle RSS with 1, 5 and 20 agents, the 20th agent's setup, a flood at another.
    Host,
    /// ~1 KiB lines echoed full duplex through `connect`, resumable against plain, with
    /// relays disabled and (in a loopback-only namespace) the default relays unreachable;
    /// and ACP `session/update` messages of the same size, relays disabled.
    Duplex,
    /// Two relays of our own, the bridge's home one killed: time to the next message
    /// with the failover and with iroh unaided; a new dial during the outage (needs root).
    Failover,
    /// One session on 1, 2 and 4 devices: aggregate throughput, the controller's p50 with
    /// three observers, memory per device and for the history.
    Devices,
    /// Journaling resumable sessions against `--no-journal` through `connect`; restart →
    /// the session back (the SDK agent's start and session/load) against its cold start.
    Restart,
    /// Files put and got through `/files1`, direct and relayed, against a raw iroh stream
    /// moving the same bytes one way; a put resumed after a cut at half (bytes sent again).
    Files,
}

/// Which sections this run measures.
struct Only(Vec<Section>);

impl Only {
    fn has(&self, s: Section) -> bool {
        self.0.contains(&s)
    }
}

/// Benchmarks of the bridge against raw iroh, dumbpipe and plain pipes, side by
/// side in one run. Prints a markdown table; run it through `tests/bench.sh`.
#[derive(Debug, clap::Parser)]
#[command(name = "bench")]
struct Cli {
    /// About a minute: 64 MiB transfers, fewer repetitions.
    #[arg(long, conflicts_with = "smoke")]
    quick: bool,
    /// Tiny sizes, only to check that the harness works (not a measurement).
    #[arg(long)]
    smoke: bool,
    /// Sections to run, comma-separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Section>,
    /// Also write the rows as JSON to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    #[command(subcommand)]
    helper: Option<Helper>,
}

/// What `relay-bulk` measures.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum RelayMode {
    Bulk,
    Upload,
    Download,
    Rtt,
}

/// The bench's other processes, started by the bench itself.
#[derive(Debug, clap::Subcommand)]
enum Helper {
    /// Raw iroh echo server; prints its ticket.
    #[command(hide = true)]
    EchoServer { relay: Option<RelayUrl> },
    /// One relay-only measure as SECRET_HEX (used by measure.mjs): `bulk` (a cat
    /// agent's echo), `upload` (to `test-agent count`), `download` (from `test-agent
    /// stream`) print MB/s; `rtt` (a cat agent) prints the p50 of BYTES small round
    /// trips in microseconds.
    #[command(hide = true)]
    RelayBulk {
        relay: RelayUrl,
        ticket: EndpointTicket,
        secret_hex: String,
        bytes: usize,
        #[arg(long, value_enum, default_value = "bulk")]
        mode: RelayMode,
    },
    /// Dials TICKET through RELAY with fresh identities for SECS seconds.
    #[command(hide = true)]
    Flood { relay: RelayUrl, ticket: EndpointTicket, secs: f64 },
}

fn main() -> Result<()> {
    let cli = <Cli as clap::Parser>::parse();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cli.helper {
        Some(Helper::EchoServer { relay }) => rt.block_on(echo_server(relay)),
        Some(Helper::RelayBulk { relay, ticket, secret_hex, bytes, mode }) => {
            let key: [u8; 32] =
                hex_decode(&secret_hex).try_into().map_err(|_| anyhow::anyhow!("secret: 64 hex digits"))?;
            rt.block_on(async move {
                let ep = client(&relay, SecretKey::from_bytes(&key), true).await?;
                let conn =
                    ep.connect(path_addr(ticket.endpoint_addr(), true), &Protocol::acp().alpn()).await?;
                let figure = match mode {
                    RelayMode::Bulk => bulk(&conn, bytes).await?,
                    RelayMode::Upload => upload(&conn, bytes).await?,
                    RelayMode::Download => download(&conn, bytes).await?,
                    RelayMode::Rtt => {
                        let (mut buf, mut send, mut recv) = round_trip_stream(&conn).await?;
                        percentile(&round_trips(&mut send, &mut recv, &mut buf, bytes).await?, 0.5)
                    }
                };
                conn.close(0u32.into(), b"client closed");
                ep.close().await;
                println!("{figure:.2}");
                Ok(())
            })
        }
        Some(Helper::Flood { relay, ticket, secs }) => {
            rt.block_on(flood(relay, ticket, Duration::from_secs_f64(secs)))
        }
        None => {
            let plan = match (cli.smoke, cli.quick) {
                (true, _) => SMOKE,
                (_, true) => QUICK,
                _ => FULL,
            };
            let only = if cli.only.is_empty() {
                Only(<Section as clap::ValueEnum>::value_variants().to_vec())
            } else {
                Only(cli.only)
            };
            rt.block_on(run(plan, &only, cli.json))
        }
    }
}
