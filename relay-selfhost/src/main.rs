//! `thunderbolt-relay`: run your own iroh relay for thunderbolt bridges and clients.
//!
//! `thunderbolt-relay --dev` serves plain http on 127.0.0.1:3340 for local use
//! and tests. Payloads stay end-to-end encrypted between endpoints whatever the
//! relay does; the relay decides availability and sees metadata (who talks to whom).

use std::net::SocketAddr;

use anyhow::{bail, Context, Result};
use clap::Parser;
use iroh_relay::server::{RelayConfig, Server, ServerConfig};
use tracing::info;

/// Where `--dev` listens: loopback only, the port iroh's own dev relay uses.
const DEV_BIND: &str = "127.0.0.1:3340";

#[derive(Debug, Parser)]
#[command(name = "thunderbolt-relay", version, about = "Self-hosted iroh relay for thunderbolt")]
struct Args {
    /// Plain http on 127.0.0.1:3340 (or --bind), for local use and tests. Loopback only.
    #[arg(long)]
    dev: bool,

    /// With --dev: the loopback address to listen on (port 0 picks a free one).
    #[arg(long, value_name = "ADDR")]
    bind: Option<SocketAddr>,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if !args.dev {
        bail!("nothing to run: use --dev (plain http on loopback)");
    }
    let bind: SocketAddr = match args.bind {
        Some(b) => b,
        None => DEV_BIND.parse().expect("valid constant"),
    };
    if !bind.ip().is_loopback() {
        bail!("--dev serves plain http and is loopback-only; {bind} is not a loopback address");
    }
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    rt.block_on(async move {
        let mut cfg: ServerConfig = ServerConfig::default();
        cfg.relay = Some(RelayConfig::new(bind));
        let server = Server::spawn(cfg).await.context("cannot start the relay")?;
        let addr = server.http_addr().context("relay has no http listener")?;
        println!("relay listening on http://{addr}");
        info!("relay listening on http://{addr} (dev mode, plain http, loopback only)");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        info!("shutting down");
        server.shutdown().await.context("relay shutdown")?;
        Ok(())
    })
}
