//! `thunderbolt-relay`: run your own iroh relay for thunderbolt bridges and clients.
//!
//! ```text
//! thunderbolt-relay --dev                     plain http on 127.0.0.1:3340 (local use, tests)
//! thunderbolt-relay --config relay.toml       the operator's setup (TLS, access, limits)
//! ```
//!
//! Payloads stay end-to-end encrypted between endpoints whatever the relay does;
//! the relay decides availability and sees metadata (which NodeIds talk, when,
//! how much). `access.allow_file` locks it to your own devices. See
//! `relay-selfhost/deploy/GUIDE.md`.
//!
//! With `app_dir` (or `--app-dir`) it also serves the phone app's files under
//! `/app/` on the same origin ([`app_files`], [`app_relay`]).

mod access;
mod app_files;
mod app_relay;
mod config;

use std::{net::SocketAddr, num::NonZeroU32, path::PathBuf, sync::Arc};

use anyhow::{bail, Context, Result};
use clap::Parser;
use iroh_relay::server::{
    AcmeConfig, CertConfig, ClientRateLimit, Limits, QuicConfig, RelayConfig, Server, ServerConfig, TlsConfig,
};
use tracing::{info, warn};

use crate::{
    access::{live_allow_file, Gatekeeper, RelayAccess},
    app_files::AppFiles,
    app_relay::AppRelay,
    config::{AccessConfig, CertMode, Config},
};

/// Where `--dev` listens: loopback only, the port iroh's own dev relay uses.
const DEV_BIND: &str = "127.0.0.1:3340";

/// How often the allow file is checked for endpoints to disconnect: a `stat`
/// per second is nothing, and a removed device loses the relay within a second.
const ALLOW_FILE_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Debug, Parser)]
#[command(
    name = "thunderbolt-relay",
    version,
    about = "Self-hosted iroh relay for thunderbolt bridges and browser clients",
    long_about = "Self-hosted iroh relay for thunderbolt bridges and browser clients.\n\n\
        The relay forwards end-to-end encrypted QUIC packets between endpoints that cannot reach \
        each other directly (browsers always go through a relay). It never sees payloads; it does \
        see which NodeIds talk. Point bridges and clients at it with \
        THUNDERBOLT_IROH_RELAY_URL=https://<hostname>.\n\n\
        Examples:\n  thunderbolt-relay --dev\n  thunderbolt-relay --config /etc/thunderbolt-relay/relay.toml"
)]
struct Args {
    /// Plain http on 127.0.0.1:3340 (or --bind), for local use and tests. Loopback only.
    #[arg(long, conflicts_with = "config")]
    dev: bool,

    /// With --dev: the loopback address to listen on (port 0 picks a free one).
    #[arg(long, value_name = "ADDR", requires = "dev")]
    bind: Option<SocketAddr>,

    /// With --dev: also serve metrics on this address.
    #[arg(long, value_name = "ADDR", requires = "dev")]
    metrics: Option<SocketAddr>,

    /// With --dev: also serve the app in DIR (its www/ and pkg/) under /app/ (as `app_dir`).
    #[arg(long, value_name = "DIR", requires = "dev")]
    app_dir: Option<PathBuf>,

    /// The operator's config file (TOML; unknown keys are refused).
    #[arg(long, short, value_name = "FILE")]
    config: Option<PathBuf>,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,iroh_relay=warn")),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, never into a log file or journal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    let (server_config, summary, gatekeeper, app_dir) = if args.dev {
        let (c, s) = dev_config(args.bind, args.metrics)?;
        (c, s, None, args.app_dir)
    } else if let Some(path) = &args.config {
        let mut cfg = Config::load(path)?;
        let app_dir = cfg.app_dir.take();
        let (c, s, g) = operator_config(cfg)?;
        (c, s, g, app_dir)
    } else {
        bail!("nothing to run: give --dev (local, plain http) or --config relay.toml (see --help)");
    };
    let app = match &app_dir {
        Some(dir) => {
            let app = AppFiles::load(dir).with_context(|| format!("app_dir {}", dir.display()))?;
            for (path, why) in &app.skipped {
                warn!("app_dir: not serving {}: {why}", path.display());
            }
            Some(app)
        }
        None => None,
    };
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    rt.block_on(async move {
        // Installed before the relay announces itself, so an early SIGTERM is graceful too.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let running = match app {
            None => Running::Relay(Server::spawn(server_config).await.context("cannot start the relay")?),
            Some(app) => spawn_with_app(server_config, &app).await?,
        };
        running.announce();
        info!("{summary}");
        if let Some(gk) = gatekeeper {
            tokio::spawn(drop_revoked(gk, running.clients()));
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => info!("Ctrl-C: shutting down"),
            _ = term.recv() => info!("SIGTERM: shutting down"),
        }
        running.shutdown().await?;
        info!("relay stopped");
        Ok(())
    })
}

/// The relay as it runs: iroh-relay's server alone, or, with the app, the
/// listener of [`app_relay`] beside iroh-relay's server for QUIC and metrics.
enum Running {
    Relay(Server),
    App {
        relay: AppRelay,
        captive_http: Option<(SocketAddr, tokio::task::JoinHandle<()>)>,
        aux: Option<Server>,
    },
}

impl Running {
    fn announce(&self) {
        let (https, http, quic) = match self {
            Running::Relay(s) => (s.https_addr(), s.http_addr(), s.quic_addr()),
            Running::App { relay, captive_http: Some((http, _)), aux } => {
                (Some(relay.addr), Some(*http), aux.as_ref().and_then(|s| s.quic_addr()))
            }
            Running::App { relay, captive_http: None, aux } => {
                (None, Some(relay.addr), aux.as_ref().and_then(|s| s.quic_addr()))
            }
        };
        if let Some(addr) = https {
            println!("relay listening on https://{addr}");
        }
        if let Some(addr) = http {
            println!("relay listening on http://{addr}");
        }
        if let Some(addr) = quic {
            println!("quic address discovery on {addr}");
        }
        if let Running::App { relay, captive_http, .. } = self {
            let scheme = if captive_http.is_some() { "https" } else { "http" };
            println!("app at {scheme}://{}{}", relay.addr, app_files::PAGE);
        }
    }

    fn clients(&self) -> Option<iroh_relay::server::clients::Clients> {
        match self {
            Running::Relay(s) => s.relay_service().map(|s| s.clients().clone()),
            Running::App { relay, .. } => Some(relay.service.clients().clone()),
        }
    }

    async fn shutdown(self) -> Result<()> {
        match self {
            Running::Relay(s) => s.shutdown().await.context("relay shutdown")?,
            Running::App { relay, captive_http, aux } => {
                relay.shutdown().await;
                if let Some((_, task)) = captive_http {
                    task.abort();
                }
                if let Some(s) = aux {
                    // With metrics only (no QUIC) its supervisor has nothing to
                    // supervise and has already ended; that is not a failure here.
                    if let Err(e) = s.shutdown().await {
                        tracing::debug!("quic/metrics server: {e}");
                    }
                }
            }
        }
        Ok(())
    }
}

/// Starts the relay with the app: the relay's http(s) listener is ours (iroh-relay
/// takes no extra routes), QUIC address discovery and metrics stay iroh-relay's.
async fn spawn_with_app(mut cfg: ServerConfig, app: &AppFiles) -> Result<Running> {
    let relay = cfg.relay.take().context("app_dir needs the relay on")?;
    let (bind, tls) = match relay.tls {
        None => (relay.http_bind_addr, None),
        Some(t) => match t.cert {
            CertConfig::Manual { server_config } => (t.https_bind_addr, Some(server_config)),
            _ => bail!("app_dir needs cert_mode = \"Manual\""),
        },
    };
    if let (Some(q), Some(tls)) = (cfg.quic.as_mut(), &tls) {
        q.server_config.get_or_insert_with(|| tls.clone());
    }
    let aux = if cfg.quic.is_some() || cfg.metrics_addr.is_some() {
        Some(Server::spawn(cfg).await.context("cannot start QUIC address discovery or metrics")?)
    } else {
        None
    };
    let metrics = aux.as_ref().map(|s| s.metrics().server.clone()).unwrap_or_default();
    let captive_http = match &tls {
        Some(_) => Some(
            app_relay::spawn_captive_portal(relay.http_bind_addr)
                .await
                .with_context(|| format!("cannot listen on {}", relay.http_bind_addr))?,
        ),
        None => None,
    };
    let options = app_relay::Options {
        bind,
        // The listener speaks HTTP/1.1 only (iroh-relay's connection handler):
        // a browser offered h2 would pick it for the page and be cut off.
        tls: tls.map(|mut t| {
            t.alpn_protocols = vec![b"http/1.1".to_vec()];
            Arc::new(t)
        }),
        client_rx: relay.limits.client_rx,
        key_cache_capacity: relay
            .key_cache_capacity
            .unwrap_or(iroh_relay::defaults::DEFAULT_KEY_CACHE_CAPACITY),
        access: relay.access,
        metrics,
    };
    let relay = AppRelay::spawn(app, options).await.with_context(|| format!("cannot listen on {bind}"))?;
    Ok(Running::App { relay, captive_http, aux })
}

fn dev_config(bind: Option<SocketAddr>, metrics: Option<SocketAddr>) -> Result<(ServerConfig, String)> {
    let bind: SocketAddr = bind.unwrap_or_else(|| DEV_BIND.parse().expect("valid constant"));
    if !bind.ip().is_loopback() {
        bail!("--dev serves plain http and is loopback-only; {bind} is not a loopback address");
    }
    let mut cfg = ServerConfig::default();
    cfg.relay = Some(RelayConfig::new(bind));
    cfg.metrics_addr = metrics;
    Ok((cfg, "dev mode: plain http, loopback only, access: everyone".into()))
}

fn load_tls(cert: &std::path::Path, key: &std::path::Path) -> Result<rustls::ServerConfig> {
    let certs = thunderbolt_shared::pem::certs(cert, "certificate")?;
    let key = thunderbolt_shared::pem::private_key(key, "private key")?;
    let mut cfg =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .context("certificate and key do not match")?;
    // HTTP/1.1 only: iroh-relay's server speaks nothing else, and a browser
    // offered h2 takes it (a page's fetch of the relay, e.g. its /ping) and is
    // cut off. Relay clients upgrade an HTTP/1.1 request to a WebSocket.
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Ends the live connections of endpoints removed from the allow file (new
/// connections are checked on arrival; these were admitted before the edit).
async fn drop_revoked(gk: Arc<Gatekeeper>, clients: Option<iroh_relay::server::clients::Clients>) {
    let Some(clients) = clients else { return };
    let mut tick = tokio::time::interval(ALLOW_FILE_RECHECK);
    loop {
        tick.tick().await;
        for id in gk.revoked() {
            if clients.disconnect(id, None) {
                info!(endpoint = %id.fmt_short(), "disconnected {id}: removed from the allow file");
            }
        }
    }
}

fn operator_config(cfg: Config) -> Result<(ServerConfig, String, Option<Arc<Gatekeeper>>)> {
    let access = match cfg.access.clone() {
        AccessConfig::Everyone => RelayAccess::Everyone,
        AccessConfig::SharedToken(t) => RelayAccess::SharedToken(t),
        AccessConfig::AllowFile(p) => RelayAccess::AllowFile(live_allow_file(p)),
        AccessConfig::Allowlist(ids) => RelayAccess::Allowlist(ids.into_iter().collect()),
        AccessConfig::Denylist(ids) => RelayAccess::Denylist(ids.into_iter().collect()),
    };
    let summary = format!("access: {}", access.describe());
    let gatekeeper = Arc::new(Gatekeeper::new(access));
    let http_bind =
        cfg.http_bind_addr.unwrap_or_else(|| config::DEFAULT_HTTP_BIND.parse().expect("constant"));

    let tls = match &cfg.tls {
        None => None,
        Some(t) => {
            let https_bind =
                t.https_bind_addr.unwrap_or_else(|| config::DEFAULT_HTTPS_BIND.parse().expect("constant"));
            let cert = match t.cert_mode {
                CertMode::Manual => CertConfig::Manual {
                    server_config: load_tls(
                        t.manual_cert_path.as_deref().expect("validated"),
                        t.manual_key_path.as_deref().expect("validated"),
                    )?,
                },
                CertMode::LetsEncrypt => {
                    let acme = AcmeConfig::letsencrypt(t.prod_tls)
                        .domains(t.hostname.clone())
                        .contact(vec![format!("mailto:{}", t.contact.as_deref().expect("validated"))])
                        .cache_path(t.cert_dir.clone().expect("validated"));
                    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(
                        rustls::crypto::ring::default_provider(),
                    ))
                    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
                    .with_no_client_auth();
                    CertConfig::LetsEncrypt { acme_config: acme, server_config_builder: builder }
                }
            };
            Some((TlsConfig::new(https_bind, cert), t.quic_bind_addr))
        }
    };

    let mut limits = Limits::default();
    if let Some(l) = &cfg.limits {
        limits.accept_conn_limit = l.accept_conn_limit;
        limits.accept_conn_burst = l.accept_conn_burst;
        if let Some(rx) = l.client.as_ref().and_then(|c| c.rx.as_ref()) {
            if let Some(bps) = rx.bytes_per_second.and_then(NonZeroU32::new) {
                let mut r = ClientRateLimit::new(bps);
                r.max_burst_bytes = rx.max_burst_bytes.and_then(NonZeroU32::new);
                limits.client_rx = Some(r);
            }
        }
    }

    let mut server = ServerConfig::default();
    let mut quic_bind = None;
    if cfg.enable_relay {
        let mut relay = RelayConfig::new(http_bind);
        relay.limits = limits;
        relay.key_cache_capacity = cfg.key_cache_capacity;
        relay.access = gatekeeper.clone();
        if let Some((tls, q)) = tls {
            relay.tls = Some(tls);
            quic_bind = q;
        }
        server.relay = Some(relay);
    }
    if cfg.enable_quic_addr_discovery {
        let bind = quic_bind.unwrap_or_else(|| config::DEFAULT_QUIC_BIND.parse().expect("constant"));
        server.quic = Some(QuicConfig::new(bind));
    }
    if cfg.enable_metrics {
        server.metrics_addr = Some(
            cfg.metrics_bind_addr.unwrap_or_else(|| config::DEFAULT_METRICS_BIND.parse().expect("constant")),
        );
    }
    Ok((server, summary, Some(gatekeeper)))
}
