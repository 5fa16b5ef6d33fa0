//! `thunderbolt`: bridge a stdio coding agent (ACP or MCP) over iroh.
//!
//! See `thunderbolt --help` and the README. Logs go to stderr (`RUST_LOG`
//! adjusts them); the banner and command output go to stdout. Everything but
//! the process's set-up (logging, the runtime) lives in the library.

use std::process::ExitCode;

use clap::Parser;
use thunderbolt::{
    cli::{
        self,
        args::{Cli, Command, ProtocolAction, ProtocolCmd},
    },
    limits,
    serve::reaper,
};

/// jemalloc instead of glibc's malloc, with its background thread returning
/// unused pages on time. A flood of strangers allocates tens of MB that live
/// briefly; glibc kept 20 MB of it resident for good (a few live objects per
/// page, which `malloc_trim` cannot return): 2.1–2.4× the idle RSS afterwards,
/// against 1.5× with jemalloc at the same throughput (README, "Performance";
/// `tests/memory-after.sh`). Only the binary chooses; the library leaves the
/// allocator to whoever links it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main` (its weak `malloc_conf`, under the
/// crate's prefix). Freed pages go back to the system after 1 s unused
/// instead of 10 s: memory a transfer used is not counted as a session's for
/// ten seconds after (a session's 4 MiB of output left 2.0× its history bound
/// resident at once, 1.2–1.7× ten seconds later), and a burst of strangers
/// costs its peak for less long. The pages a busy transfer frees are reused
/// long before a second passes, so a transfer pays nothing for it
/// (docs/performance.md, "A session's memory").
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[export_name = "_rjem_malloc_conf"]
pub static JEMALLOC_OPTIONS: &[u8; 20] = b"dirty_decay_ms:1000\0";

/// Default log filter: our own info lines, only warnings from the network stack.
/// iroh's relay transport (the module, not its relay actor, which reports
/// what relay servers say) is silenced: at every exit of a process that had a
/// relay configured but never reached it (a laptop offline, a network that
/// blocks relays), it logged "ERROR relay_recv_channel closed", a race in its
/// own shutdown that says nothing was lost. Its other lines are per-datagram
/// drops, for RUST_LOG when debugging.
const DEFAULT_LOG_FILTER: &str =
    "info,iroh=warn,noq=warn,noq_proto=warn,iroh_relay=warn,portmapper=warn,netwatch=warn,\
     iroh::socket::transports::relay=off,iroh::socket::transports::relay::actor=warn";

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::ReapAgents) {
        return reaper::run_watcher();
    }
    init_logging(&cli);
    // reqwest (account backend) and iroh both use rustls with ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // `connect` runs on one thread: its tasks (the connection's driver, the
    // copies to and from stdio) hand every packet to each other, and on the
    // worker-plus-main-thread runtime each hand-off was a futex wake-up and a
    // context switch, a quarter of `connect`'s CPU (`perf record` of connect
    // moving 512 MiB each way). On one thread: 2.44–2.72 ms per MB against
    // 2.85–3.81; with a read's frames written together (`output`), both
    // paths move 8–20 % more through `connect` for 12 % less CPU per MB
    // (docs/performance.md, "One thread for connect").
    let mut builder = if cli.command.dials() {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if let Some(n) = limits::worker_threads(
            std::env::var_os("TOKIO_WORKER_THREADS").is_some(),
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        ) {
            b.worker_threads(n);
        }
        b
    };
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(cli::run(cli));
    // Do not wait for blocking tasks: a read of our stdin (`connect`) never
    // returns while stdin stays open, and everything we own is already ended.
    rt.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<cli::connect::Interrupted>() {
            // Already logged when it happened; the exit code says it to scripts.
            Some(i) => ExitCode::from(i.exit_code()),
            None => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

fn init_logging(cli: &Cli) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    // `acp serve` speaks JSON-RPC on stdout; logs must stay on stderr everywhere.
    let quiet = matches!(&cli.command, Command::Acp(ProtocolCmd { action: Some(ProtocolAction::Serve), .. }));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    if quiet {
        builder.with_max_level(tracing::Level::WARN).init();
    } else {
        builder.init();
    }
}
